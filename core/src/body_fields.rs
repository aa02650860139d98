//! The top-level fields of a JSON request body that the machine and its
//! drivers read: `model`, `stream`, `background`.
//!
//! A prompt may be megabytes, and the SDKs write `messages` before
//! `model`, so every reader of one field walks all of it. These fields are
//! taken in the one pass that validates the body, once per request (and
//! once per alternate's rewritten body); the cooldown key, the resume plan
//! and the GenAI attributes read them here.
//!
//! A front end that validates a body before the recovery layer sees it (a
//! gateway refuses a body that is not JSON) keeps what it read as a
//! [`ReadFields`], and the layer takes the fields from it instead of reading
//! the same bytes again.

use std::ops::Range;

use bytes::Bytes;

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
        Self::read_checked(body).0
    }

    /// [`BodyFields::read`], and whether `body` is one valid JSON document.
    fn read_checked(body: &'a [u8]) -> (Self, bool) {
        let mut fields = [None; 3];
        // A body that does not parse has none: `parse_fields` clears them.
        let json = Lazy::parse_fields(body, &NAMES, &mut fields).is_ok();
        (BodyFields { fields }, json)
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

/// A request body as one reader read it: whether it is one valid JSON
/// document as `serde_json` reads a value (UTF-8, nested at most 127 deep),
/// and where its fields are.
///
/// A front end that must validate a body before it goes anywhere puts this
/// in the request's extensions; the recovery layer after it, given the
/// very same bytes ([`ReadFields::fields_of`]), takes the fields from it and
/// does not read a prompt of megabytes a second time. Bytes that are not
/// these (a layer between them rewrote the body) are read again.
#[derive(Debug, Clone)]
pub struct ReadFields {
    body: Bytes,
    json: bool,
    spans: [Option<Range<usize>>; 3],
}

impl ReadFields {
    /// Reads `body` once.
    pub fn read(body: Bytes) -> Self {
        let (fields, json) = BodyFields::read_checked(&body);
        let spans = fields
            .fields
            .map(|f| f.map(|v| offset_in(&body, v.as_bytes())));
        ReadFields { body, json, spans }
    }

    /// Whether the body is one valid JSON document.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// The body's fields when `body` is the body read (the same bytes in
    /// memory, not only the same content); `None` for any other bytes.
    pub fn fields_of<'a>(&self, body: &'a [u8]) -> Option<BodyFields<'a>> {
        let same = std::ptr::eq(body.as_ptr(), self.body.as_ptr()) && body.len() == self.body.len();
        if !same {
            return None;
        }
        let fields = self
            .spans
            .clone()
            .map(|span| span.and_then(|span| body.get(span)).map(Lazy::validated));
        Some(BodyFields { fields })
    }
}

/// Where `part`, a slice of `whole`, starts and ends in it.
fn offset_in(whole: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - whole.as_ptr() as usize;
    start..start + part.len()
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
            // Valid JSON where `serde_json` reads a value.
            let read = ReadFields::read(Bytes::from(doc.clone()));
            let serde = serde_json::from_slice::<serde_json::Value>(&doc).is_ok();
            prop_assert_eq!(read.is_json(), serde);
        }
    }

    #[test]
    fn a_read_body_gives_its_fields_for_its_own_bytes_only() {
        let body = Bytes::from_static(
            br#"{"messages":[],"model":"gpt-4o","stream":true,"background":true}"#,
        );
        let read = ReadFields::read(body.clone());
        assert!(read.is_json());
        let f = read.fields_of(&body).expect("the same bytes");
        assert_eq!(f.model().unwrap().as_bytes(), br#""gpt-4o""#);
        assert_eq!(f.stream(), Some(true));
        assert!(f.background_stream());
        // The same content elsewhere in memory, or a part of it, is read again.
        let copy = body.to_vec();
        assert!(read.fields_of(&copy).is_none());
        assert!(read.fields_of(&body[..body.len() - 1]).is_none());
    }

    #[test]
    fn a_body_is_json_as_deep_as_serde_json_reads_a_value() {
        for depth in [126, 127, 128, 129] {
            for inner in ["", "1"] {
                let body = format!("{}{inner}{}", "[".repeat(depth), "]".repeat(depth));
                let serde = serde_json::from_str::<serde_json::Value>(&body).is_ok();
                let read = ReadFields::read(Bytes::from(body));
                assert_eq!(read.is_json(), serde, "{depth} deep, {inner:?} inside");
                assert_eq!(
                    read.is_json(),
                    depth <= 127,
                    "{depth} deep, {inner:?} inside"
                );
            }
        }
    }

    #[test]
    fn a_read_body_that_is_not_json_says_so_and_has_no_fields() {
        for body in [&b"{\"model\":\"m\""[..], b"\"a\xff\"", b"", b"[1] 2"] {
            let body = Bytes::copy_from_slice(body);
            let read = ReadFields::read(body.clone());
            assert!(!read.is_json(), "{body:?}");
            let f = read.fields_of(&body).expect("the same bytes");
            assert!(f.model().is_none() && f.stream().is_none());
        }
        assert!(ReadFields::read(Bytes::from_static(b" [1, {}] ")).is_json());
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
