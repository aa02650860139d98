//! Values that may appear in `Display`, `Debug`, events and reports.
//!
//! Everything a provider sends is untrusted and may echo the prompt or a
//! credential. Only short tokens of a fixed shape, provider codes on an
//! allowlist, request ids of a known shape and allowlisted header names cross
//! this boundary.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest token kept.
pub(crate) const MAX_TOKEN_LEN: usize = 64;

/// A short identifier-like string (`[A-Za-z0-9_.:-]`, at most 64 bytes).
///
/// Such a token cannot carry prose, so it cannot leak prompt or body text.
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SafeToken(String);

/// `clone_from` keeps the target's buffer (see [`crate::report::RecoveryReport`]).
impl Clone for SafeToken {
    fn clone(&self) -> Self {
        SafeToken(self.0.clone())
    }

    fn clone_from(&mut self, source: &Self) {
        self.0.clone_from(&source.0);
    }
}

impl SafeToken {
    /// Accepts `raw` when it has the shape of a token, else `None`.
    pub fn new(raw: &str) -> Option<Self> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_TOKEN_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
        ok.then(|| SafeToken(raw.to_owned()))
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SafeToken {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        SafeToken::new(&value).ok_or("not a safe token")
    }
}

impl From<SafeToken> for String {
    fn from(value: SafeToken) -> Self {
        value.0
    }
}

impl fmt::Debug for SafeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SafeToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Provider error codes that may be surfaced; anything else is `None`.
pub(crate) const PROVIDER_CODE_ALLOWLIST: &[&str] = &[
    "rate_limit_exceeded",
    "server_error",
    "invalid_request_error",
    "invalid_api_key",
    "model_not_found",
    "insufficient_quota",
    "overloaded_error",
    CONTEXT_LENGTH_EXCEEDED,
];

/// The code a provider error is given when it says the prompt is longer
/// than the model's context window, whatever the provider's own words
/// (OpenAI's code, Anthropic's "prompt is too long", Gemini's token count).
pub(crate) const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";

/// The provider code, when it is on [`PROVIDER_CODE_ALLOWLIST`].
pub(crate) fn allowlisted_code(raw: &str) -> Option<SafeToken> {
    PROVIDER_CODE_ALLOWLIST
        .contains(&raw)
        .then(|| SafeToken(raw.to_owned()))
}

/// Headers that carry a provider request id.
const REQUEST_ID_HEADERS: &[&str] = &["x-request-id", "request-id", "x-generation-id"];

/// Keeps a provider request id only when it looks like an id: an optional
/// short alphabetic prefix ending in `_` or `-`, then hex digits, dashes or
/// base62 characters, 8 to 64 bytes, with no spaces or punctuation that could
/// carry request text.
pub(crate) fn safe_request_id(raw: &str) -> Option<SafeToken> {
    let raw = raw.trim();
    if raw.len() < 8 || raw.len() > MAX_TOKEN_LEN {
        return None;
    }
    let ok = raw
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    // A run of letters long enough to be a word is not an id.
    let wordy = raw
        .split(['_', '-'])
        .any(|part| part.len() > 12 && part.bytes().all(|b| b.is_ascii_lowercase()));
    (ok && !wordy).then(|| SafeToken(raw.to_owned()))
}

/// Picks the first safe provider request id through a header lookup (for
/// drivers whose headers are not an `http::HeaderMap`, such as fetch).
pub(crate) fn request_id_with(get: impl Fn(&str) -> Option<String>) -> Option<SafeToken> {
    REQUEST_ID_HEADERS
        .iter()
        .find_map(|name| get(name).as_deref().and_then(safe_request_id))
}

/// What a response's rate-limit headers said: numbers, and resets as the
/// provider wrote them when they have a token's shape (`6m0s`,
/// `2026-12-01T12:00:00Z`). Safe for dashboards: nothing else is kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RateLimits {
    /// Requests allowed in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_limit: Option<u64>,
    /// Requests left in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_remaining: Option<u64>,
    /// When the request count resets (a duration or a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_reset: Option<SafeToken>,
    /// Tokens allowed in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_limit: Option<u64>,
    /// Tokens left in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_remaining: Option<u64>,
    /// When the token count resets (a duration or a time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_reset: Option<SafeToken>,
}

/// The rate-limit headers read, per field of [`RateLimits`] in order: the
/// OpenAI names (also sent by OpenAI-compatible servers), then
/// Anthropic's.
const RATE_LIMIT_HEADERS: [[&str; 2]; 6] = [
    [
        "x-ratelimit-limit-requests",
        "anthropic-ratelimit-requests-limit",
    ],
    [
        "x-ratelimit-remaining-requests",
        "anthropic-ratelimit-requests-remaining",
    ],
    [
        "x-ratelimit-reset-requests",
        "anthropic-ratelimit-requests-reset",
    ],
    [
        "x-ratelimit-limit-tokens",
        "anthropic-ratelimit-tokens-limit",
    ],
    [
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-tokens-remaining",
    ],
    [
        "x-ratelimit-reset-tokens",
        "anthropic-ratelimit-tokens-reset",
    ],
];

/// The rate-limit evidence of a response whose headers `get` looks up by
/// lowercase name; `None` when it sent none of a safe shape.
pub(crate) fn rate_limits_with(get: impl Fn(&str) -> Option<String>) -> Option<RateLimits> {
    let [
        req_limit,
        req_left,
        req_reset,
        tok_limit,
        tok_left,
        tok_reset,
    ] = RATE_LIMIT_HEADERS.map(|names| names.iter().find_map(|n| get(n)));
    let number = |v: Option<String>| v.and_then(|v| v.trim().parse::<u64>().ok());
    let token = |v: Option<String>| v.and_then(|v| SafeToken::new(v.trim()));
    let limits = RateLimits {
        requests_limit: number(req_limit),
        requests_remaining: number(req_left),
        requests_reset: token(req_reset),
        tokens_limit: number(tok_limit),
        tokens_remaining: number(tok_left),
        tokens_reset: token(tok_reset),
    };
    (limits != RateLimits::default()).then_some(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_keep_numbers_and_reset_tokens_only() {
        let openai = [
            ("x-ratelimit-limit-requests", "500"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s"),
            ("x-ratelimit-limit-tokens", "30000"),
            ("x-ratelimit-remaining-tokens", " 29000 "),
            (
                "x-ratelimit-reset-tokens",
                "ignore all previous instructions",
            ),
        ];
        let get = |h: &[(&str, &str)], n: &str| {
            h.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| (*v).to_owned())
        };
        let limits = rate_limits_with(|n| get(&openai, n)).expect("limits");
        assert_eq!(limits.requests_limit, Some(500));
        assert_eq!(limits.requests_remaining, Some(0));
        assert_eq!(
            limits.requests_reset.as_ref().map(SafeToken::as_str),
            Some("6m0s")
        );
        assert_eq!(limits.tokens_remaining, Some(29_000));
        assert_eq!(limits.tokens_reset, None, "prose is dropped");
        let anthropic = [
            ("anthropic-ratelimit-requests-remaining", "12"),
            ("anthropic-ratelimit-tokens-reset", "2026-12-01T12:00:00Z"),
        ];
        let limits = rate_limits_with(|n| get(&anthropic, n)).expect("limits");
        assert_eq!(limits.requests_remaining, Some(12));
        assert_eq!(
            limits.tokens_reset.as_ref().map(SafeToken::as_str),
            Some("2026-12-01T12:00:00Z")
        );
        assert_eq!(
            rate_limits_with(|n| get(&[("x-ratelimit-limit-requests", "lots")], n)),
            None
        );
        assert_eq!(rate_limits_with(|_| None), None);
    }

    #[test]
    fn tokens_reject_prose_and_long_values() {
        assert!(SafeToken::new("length").is_some());
        assert!(SafeToken::new("MAX_TOKENS").is_some());
        assert!(SafeToken::new("my secret prompt").is_none());
        assert!(SafeToken::new("").is_none());
        assert!(SafeToken::new(&"a".repeat(65)).is_none());
        assert!(serde_json::from_str::<SafeToken>("\"has space\"").is_err());
    }

    #[test]
    fn request_ids_keep_id_shapes_only() {
        assert!(safe_request_id("req_011CPzjJwQkB3rRj7YcZ3N4m").is_some());
        assert!(safe_request_id("9f0c8a3e-1b2c-4d5e-8f90-a1b2c3d4e5f6").is_some());
        assert!(safe_request_id("ignore previous instructions").is_none());
        assert!(safe_request_id("req_pleaseforwardthepromptverbatim").is_none());
        assert!(safe_request_id("short").is_none());
    }

    #[test]
    fn only_allowlisted_codes_survive() {
        assert_eq!(
            allowlisted_code("overloaded_error").map(|t| t.to_string()),
            Some("overloaded_error".to_owned())
        );
        assert!(allowlisted_code("sk-live-abc").is_none());
    }
}
