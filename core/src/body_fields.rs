//! The top-level fields of a JSON request body that the machine and its
//! drivers read: `model`, `stream`, `background`.
//!
//! A prompt may be megabytes, and the SDKs write `messages` before
//! `model`, so every reader of one field walks all of it. These fields are
//! taken in the one pass that validates the body, once per request (and
//! once per alternate's rewritten body); the cooldown key, the resume plan
//! and the GenAI attributes read them here.

use crate::json::{JsonKind, JsonView, Lazy};

/// The names read, in the order of [`BodyFields`]'s slots.
const NAMES: [&str; 3] = ["model", "stream", "background"];

/// The top-level `model`, `stream` and `background` of a request body,
/// when it is one valid JSON document (all absent otherwise).
#[derive(Debug, Clone, Copy, Default)]
pub struct BodyFields<'a> {
    fields: [Option<Lazy<'a>>; 3],
}

impl<'a> BodyFields<'a> {
    /// Reads `body` once: valid JSON or not, and its three fields.
    pub fn read(body: &'a [u8]) -> Self {
        let mut fields = [None; 3];
        // A body that does not parse has none: `parse_fields` clears them.
        let _ = Lazy::parse_fields(body, &NAMES, &mut fields);
        BodyFields { fields }
    }

    /// The `model` string's literal, quotes and escapes as written.
    pub(crate) fn model(&self) -> Option<Lazy<'a>> {
        self.fields[0].filter(|m| m.kind() == JsonKind::String)
    }

    /// `stream`, when it is a boolean.
    pub(crate) fn stream(&self) -> Option<bool> {
        self.fields[1].and_then(JsonView::as_bool)
    }

    /// Whether the request asked for `background: true` and
    /// `stream: true`: an OpenAI Responses request that can be resumed.
    pub(crate) fn background_stream(&self) -> bool {
        self.fields[2].and_then(JsonView::as_bool) == Some(true) && self.stream() == Some(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Request bodies with the fields at the root, nested, escaped,
    /// repeated and of other types.
    const BASES: &[&str] = &[
        r#"{"messages":[{"role":"user","content":"hi \"model\""}],"model":"gpt-4o","stream":true}"#,
        r#"{"model":"m","input":"x","stream":true,"background":true}"#,
        r#"{"a":{"model":"inner","stream":true},"b":[{"background":true}],"model":"outer"}"#,
        r#"{"mod\u0065l":"esc\u00e9","stream":false,"model":"later","stream":true}"#,
        r#" { "model" : null , "stream" : 1 , "background" : "true" } "#,
        r#"["model","stream"]"#,
    ];

    /// Bytes that change the meaning of JSON when put anywhere.
    const BYTES: &[u8] = b"\"\\{}[],: 0-1etrufanl\x01\xff";

    fn reference(doc: &[u8]) -> (Option<String>, Option<bool>, bool) {
        let Ok(serde_json::Value::Object(root)) = serde_json::from_slice(doc) else {
            return (None, None, false);
        };
        let model = root
            .get("model")
            .and_then(|m| m.as_str())
            .map(str::to_owned);
        let stream = root.get("stream").and_then(serde_json::Value::as_bool);
        let background = root.get("background").and_then(serde_json::Value::as_bool);
        (
            model,
            stream,
            background == Some(true) && stream == Some(true),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// One pass reads what `serde_json` reads at the root, of any
        /// document one byte away from a request body.
        #[test]
        fn one_pass_agrees_with_serde_json(
            base in 0..BASES.len(),
            at in any::<usize>(),
            byte in prop::sample::select(BYTES),
            op in 0..3u8,
        ) {
            let mut doc = BASES[base].as_bytes().to_vec();
            let at = at % (doc.len() + 1);
            match op {
                0 if at < doc.len() => doc[at] = byte,
                1 => doc.insert(at, byte),
                _ if at < doc.len() => { doc.remove(at); }
                _ => {}
            }
            let f = BodyFields::read(&doc);
            let model = f.model().and_then(JsonView::text).map(std::borrow::Cow::into_owned);
            prop_assert_eq!((model, f.stream(), f.background_stream()), reference(&doc));
        }
    }

    #[test]
    fn the_fields_of_the_root_after_a_long_prompt() {
        let body =
            br#"{"messages":[{"role":"user","content":"a \"model\": {\"x\":1}","model":"inner"}],
            "model" : "gpt-4o", "stream":true, "background":true, "n":{"model":"deeper"}}"#;
        let f = BodyFields::read(body);
        assert_eq!(f.model().unwrap().as_bytes(), br#""gpt-4o""#);
        assert_eq!(f.stream(), Some(true));
        assert!(f.background_stream());
    }

    #[test]
    fn a_later_member_replaces_an_earlier_one_and_escaped_keys_count() {
        let f = BodyFields::read(br#"{"model":"a","stream":true,"mod\u0065l":"b","stream":false}"#);
        assert_eq!(f.model().unwrap().as_bytes(), br#""b""#);
        assert_eq!(f.stream(), Some(false));
        assert!(!f.background_stream());
    }

    #[test]
    fn a_body_that_does_not_parse_has_no_fields() {
        for body in [
            &br#"{"model":"m","stream":true,"background":true"#[..],
            br#"{"model":"m","stream":true} trailing"#,
            br#"["model","m"]"#,
            b"\xff{}",
            b"",
        ] {
            let f = BodyFields::read(body);
            assert!(f.model().is_none(), "{body:?}");
            assert_eq!(f.stream(), None, "{body:?}");
            assert!(!f.background_stream(), "{body:?}");
        }
    }

    #[test]
    fn a_model_that_is_not_a_string_is_none() {
        let f = BodyFields::read(br#"{"model":7,"stream":"yes"}"#);
        assert!(f.model().is_none());
        assert_eq!(f.stream(), None);
    }
}
