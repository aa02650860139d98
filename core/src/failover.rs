//! Failover before the first token: the places a request may be served
//! from besides the one it names.
//!
//! A provider that answers `529 overloaded` (or resets, or asks for a wait
//! longer than the request may give) says nothing about another provider or
//! model. While no semantic output was observed, the request can go there
//! instead, and the consumer never sees the difference; once output began,
//! a switch would splice two different answers, so it never happens.
//!
//! A [`Target`] says how a request is rewritten for one alternate: its URL
//! (absolute, or a path on the request's own origin), the `"model"` of its
//! JSON body, and the protocol its answers speak. Headers (an alternate's
//! own API key) are the driver's business: they are secrets, and nothing in
//! core holds them. The label is the safe name reports and events carry.
//!
//! What the machine decides (the decision function): a pre-commit
//! failure the policy retries moves to the next target once the current one
//! has used its share of sends ([`RecoveryPolicy::attempts_per_target`]), or
//! at once when its `Retry-After` is beyond what the request may wait; a
//! cooldown in force for the current target switches instead of waiting.
//! The switch is immediate (the old target's hint is not the new one's) and
//! bounded like any resend: the attempt allowance, the retry budget, the
//! recovery budget and the deadline. When every target used its share, the
//! request fails [`Outcome::AlternatesExhausted`] naming each one.
//!
//! [`RecoveryPolicy::attempts_per_target`]: crate::policy::RecoveryPolicy::attempts_per_target
//! [`Outcome::AlternatesExhausted`]: crate::outcome::Outcome::AlternatesExhausted

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;

use crate::continuation::Prefill;
use crate::json::{Edits, JsonKind, JsonView, Lazy, write_json_string};
use crate::protocol::ProtocolChoice;

/// The label of the target a request names itself, when alternates are set.
pub const PRIMARY: &str = "primary";

/// Longest label, in bytes.
pub const MAX_LABEL: usize = 64;

/// Longest model name, in bytes.
pub const MAX_MODEL: usize = 256;

/// Request headers that carry credentials. A send to an alternate on
/// another origin goes without the request's own (a key for one provider
/// is never shown to another, as fetch drops `Authorization` on a
/// cross-origin redirect); the alternate's own headers are set after.
pub const CREDENTIAL_HEADERS: &[&str] = &[
    "authorization",
    "proxy-authorization",
    "cookie",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
];

/// Why a target cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetError {
    /// A label must be 1 to 64 of `A-Z a-z 0-9 . _ -`: it is written into
    /// reports and events, which carry safe evidence only.
    Label,
    /// A URL must be absolute `http(s)://...` or a path starting with `/`,
    /// without whitespace or control characters.
    Url,
    /// A model name must be 1 to 256 bytes, none of them a control
    /// character.
    Model,
}

impl fmt::Display for TargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetError::Label => "an alternate's label must be 1 to 64 of A-Z a-z 0-9 . _ -",
            TargetError::Url => {
                "an alternate's url must be absolute http(s)://... or a path starting with /"
            }
            TargetError::Model => {
                "an alternate's model must be 1 to 256 bytes without control characters"
            }
        })
    }
}

impl std::error::Error for TargetError {}

/// One alternate: how the request is rewritten to be served elsewhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    label: String,
    url: Option<String>,
    model: Option<String>,
    protocol: Option<ProtocolChoice>,
    body: Option<Bytes>,
    context_window: Option<u64>,
    prefill: Option<Prefill>,
}

impl Target {
    /// An alternate named `label` that, until told otherwise, sends the
    /// request unchanged (to the same URL, with the same body).
    pub fn new(label: impl Into<String>) -> Result<Self, TargetError> {
        let label = label.into();
        let safe = (1..=MAX_LABEL).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !safe {
            return Err(TargetError::Label);
        }
        Ok(Target {
            label,
            url: None,
            model: None,
            protocol: None,
            body: None,
            context_window: None,
            prefill: None,
        })
    }

    /// Sends to `url` instead: absolute (`https://host/v1/chat/completions`)
    /// or a path on the request's own origin (`/v2/chat`).
    pub fn with_url(mut self, url: impl Into<String>) -> Result<Self, TargetError> {
        let url = url.into();
        let shaped = url.starts_with('/')
            || ["http://", "https://"].iter().any(|s| {
                url.len() > s.len()
                    && url
                        .get(..s.len())
                        .is_some_and(|p| p.eq_ignore_ascii_case(s))
            });
        // Spaces and control bytes never belong in a URL (a non-ASCII one is
        // refused by the HTTP stack when the request is built).
        if !shaped || url.bytes().any(|b| b <= b' ' || b == 0x7f) {
            return Err(TargetError::Url);
        }
        self.url = Some(url);
        Ok(self)
    }

    /// Asks for `model` instead: the top-level `"model"` of a JSON object
    /// body is replaced (or added when the body names none). A body that is
    /// not a JSON object is sent as it is.
    pub fn with_model(mut self, model: impl Into<String>) -> Result<Self, TargetError> {
        let model = model.into();
        if model.is_empty()
            || model.len() > MAX_MODEL
            || model.bytes().any(|b| b < b' ' || b == 0x7f)
        {
            return Err(TargetError::Model);
        }
        self.model = Some(model);
        Ok(self)
    }

    /// Sends `body` instead of the request's (its `"model"` still set by
    /// [`Target::with_model`]): an alternate that speaks another protocol
    /// needs the request in its own shape, which the caller writes.
    #[must_use]
    pub fn with_body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// The protocol this target's answers speak (by default the request's
    /// own).
    #[must_use]
    pub fn with_protocol(mut self, protocol: ProtocolChoice) -> Self {
        self.protocol = Some(protocol);
        self
    }

    /// Declares the model's context window, in tokens: a prompt too long
    /// for a target moves to the next one whose window is larger (or, when
    /// none after it declares one, to the next one).
    #[must_use]
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// The declared context window, in tokens.
    pub fn context_window(&self) -> Option<u64> {
        self.context_window
    }

    /// Declares that this target continues an assistant message it is
    /// given, in the form `prefill` ([`crate::continuation`]): a committed
    /// answer that was cut, text only, is sent here again with the
    /// delivered text as that message, when the serving target declares
    /// no prefill of its own, and the continuation is spliced after it.
    #[must_use]
    pub fn with_prefill(mut self, prefill: Prefill) -> Self {
        self.prefill = Some(prefill);
        self
    }

    /// The declared prefill form, if any.
    pub fn prefill(&self) -> Option<Prefill> {
        self.prefill
    }

    /// The safe name reports and events carry.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The URL this target was given, if any.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The model this target asks for, if any.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The protocol this target's answers speak, if it differs.
    pub fn protocol(&self) -> Option<&ProtocolChoice> {
        self.protocol.as_ref()
    }

    /// Where a request for `url` (absolute, or a path with its query) goes
    /// on this target.
    pub fn rewrite_url<'a>(&'a self, url: &'a str) -> Cow<'a, str> {
        match self.url.as_deref() {
            None => Cow::Borrowed(url),
            Some(path) if path.starts_with('/') => {
                let origin = origin_end(url);
                Cow::Owned(crate::text::joined(&[
                    url.get(..origin).unwrap_or_default(),
                    path,
                ]))
            }
            Some(absolute) => Cow::Borrowed(absolute),
        }
    }

    /// The body a request with `body` carries on this target.
    pub fn rewrite_body<'a>(&'a self, body: &'a [u8]) -> Cow<'a, [u8]> {
        let body = self.body.as_deref().unwrap_or(body);
        match &self.model {
            Some(model) => with_model(body, model),
            None => Cow::Borrowed(body),
        }
    }

    /// Whether a request header named `name` (lowercase) goes with a send of
    /// a request to `url` on this target: the [`CREDENTIAL_HEADERS`] and the
    /// `Host` stay behind when the target is on another origin.
    pub fn keeps_header(&self, url: &str, name: &str) -> bool {
        !(self.crosses_origin(url) && (name == "host" || CREDENTIAL_HEADERS.contains(&name)))
    }

    /// Whether a send of a request to `url` goes to another origin on this
    /// target: then it goes without the [`CREDENTIAL_HEADERS`] (and the
    /// `Host`) of the request.
    pub fn crosses_origin(&self, url: &str) -> bool {
        match self.url.as_deref() {
            Some(target) if !target.starts_with('/') => {
                let (a, b) = (origin(target), origin(url));
                !a.eq_ignore_ascii_case(b)
            }
            _ => false,
        }
    }
}

/// The origin (`scheme://authority`) of `url`; empty for a path.
fn origin(url: &str) -> &str {
    // An ASCII boundary: `get` never misses, and keeps str slicing's panic
    // path (and its `Debug` formatting) out of the wasm module.
    url.get(..origin_end(url)).unwrap_or_default()
}

/// Where the origin (`scheme://authority`) of `url` ends; 0 for a path.
pub(crate) fn origin_end(url: &str) -> usize {
    let u = url.as_bytes();
    let Some(scheme) = u.windows(3).position(|w| w == b"://") else {
        return 0;
    };
    let from = scheme + 3;
    u[from..]
        .iter()
        .position(|b| matches!(b, b'/' | b'?' | b'#'))
        .map_or(u.len(), |i| from + i)
}

/// `body` with its top-level `"model"` set to `model`.
fn with_model<'a>(body: &'a [u8], model: &str) -> Cow<'a, [u8]> {
    let Ok(root) = Lazy::parse(body) else {
        return Cow::Borrowed(body);
    };
    if root.kind() != JsonKind::Object {
        return Cow::Borrowed(body);
    }
    let mut literal = Vec::with_capacity(model.len() + 2);
    write_json_string(&mut literal, model);
    let mut edits = Edits::new(body);
    edits.set(root, "model", &literal);
    Cow::Owned(edits.apply())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target::new("alt-1").unwrap()
    }

    #[test]
    fn a_url_with_a_multibyte_char_where_the_scheme_ends_is_refused_not_a_panic() {
        for url in [
            "http:/\u{e4}x",
            "https:/\u{1f600}",
            "htt\u{e9}://a",
            "\u{e9}",
        ] {
            assert_eq!(
                Target::new("a").unwrap().with_url(url).err(),
                Some(TargetError::Url),
                "{url}"
            );
        }
        let t = Target::new("a")
            .unwrap()
            .with_url("https://b.example/v1")
            .unwrap();
        assert!(t.crosses_origin("https://\u{e9}.example/v1"));
        assert_eq!(t.rewrite_url("/x"), "https://b.example/v1");
    }

    #[test]
    fn labels_are_safe_names() {
        assert!(Target::new("anthropic.claude_fallback-2").is_ok());
        for bad in ["", "a b", "key=sk-123/x", "é", &"x".repeat(65)] {
            assert_eq!(Target::new(bad).unwrap_err(), TargetError::Label, "{bad}");
        }
    }

    #[test]
    fn urls_are_absolute_or_paths() {
        for bad in [
            "",
            "ftp://x",
            "http://",
            "api.example.com/v1",
            "/a b",
            "/a\nb",
        ] {
            assert_eq!(
                target().with_url(bad).unwrap_err(),
                TargetError::Url,
                "{bad}"
            );
        }
        let t = target().with_url("HTTPS://alt.example/v1/chat").unwrap();
        assert_eq!(
            t.rewrite_url("http://p.example/v1/x?y=1"),
            "HTTPS://alt.example/v1/chat"
        );
    }

    #[test]
    fn a_path_keeps_the_request_origin() {
        let t = target().with_url("/alt/v1/chat/completions").unwrap();
        assert_eq!(
            t.rewrite_url("http://127.0.0.1:8080/v1/chat/completions?x=1"),
            "http://127.0.0.1:8080/alt/v1/chat/completions"
        );
        assert_eq!(
            t.rewrite_url("/v1/chat/completions"),
            "/alt/v1/chat/completions"
        );
        assert_eq!(target().rewrite_url("/v1/x"), "/v1/x");
    }

    #[test]
    fn the_model_is_replaced_in_place() {
        let t = target().with_model("claude-\"3\"").unwrap();
        let body = br#"{"messages":[{"model":"inner"}], "model" : "gpt-4o","stream":true}"#;
        let out = t.rewrite_body(body);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"messages":[{"model":"inner"}], "model" : "claude-\"3\"","stream":true}"#
        );
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "claude-\"3\"");
    }

    #[test]
    fn a_missing_model_is_added() {
        let t = target().with_model("m").unwrap();
        assert_eq!(&*t.rewrite_body(br#" {"a":1}"#), br#" {"model":"m","a":1}"#);
        assert_eq!(&*t.rewrite_body(b"{ }"), br#"{"model":"m" }"#);
        assert_eq!(&*t.rewrite_body(b"{}"), br#"{"model":"m"}"#);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_kept() {
        let t = target().with_model("m").unwrap();
        for body in [&b"[1]"[..], b"not json", b"", b"\"s\""] {
            assert!(matches!(t.rewrite_body(body), Cow::Borrowed(b) if b == body));
        }
        assert_eq!(
            Target::new("x").unwrap().with_model("\u{7}").unwrap_err(),
            TargetError::Model
        );
    }

    #[test]
    fn a_given_body_replaces_the_request_and_takes_the_model() {
        let t = target()
            .with_body(&br#"{"max_tokens":9}"#[..])
            .with_model("c")
            .unwrap();
        assert_eq!(
            &*t.rewrite_body(br#"{"model":"a"}"#),
            br#"{"model":"c","max_tokens":9}"#
        );
    }

    #[test]
    fn only_another_origin_is_crossed() {
        let url = "https://api.openai.com/v1/chat/completions";
        assert!(!target().crosses_origin(url));
        assert!(!target().with_url("/v2/x").unwrap().crosses_origin(url));
        let same = target()
            .with_url("HTTPS://API.openai.com/v1/other")
            .unwrap();
        assert!(!same.crosses_origin(url));
        let other = target()
            .with_url("https://api.anthropic.com/v1/messages")
            .unwrap();
        assert!(other.crosses_origin(url));
        let port = target()
            .with_url("https://api.openai.com:8443/v1/x")
            .unwrap();
        assert!(port.crosses_origin(url));
        assert!(!other.keeps_header(url, "authorization"));
        assert!(!other.keeps_header(url, "host"));
        assert!(other.keeps_header(url, "content-type"));
        assert!(same.keeps_header(url, "authorization"));
    }

    #[test]
    fn control_characters_are_escaped() {
        let mut out = Vec::new();
        write_json_string(&mut out, "a\u{1}\\");
        assert_eq!(out, br#""a\u0001\\""#);
    }
}
