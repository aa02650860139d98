//! Values that may appear in `Display`, `Debug`, events and reports.
//!
//! Everything a provider sends is untrusted and may echo the prompt or a
//! credential. Only short tokens of a fixed shape, provider codes on an
//! allowlist, request ids of a known shape and allowlisted header names cross
//! this boundary.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest token kept.
pub const MAX_TOKEN_LEN: usize = 64;

/// A short identifier-like string (`[A-Za-z0-9_.:-]`, at most 64 bytes).
///
/// Such a token cannot carry prose, so it cannot leak prompt or body text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SafeToken(String);

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
pub const PROVIDER_CODE_ALLOWLIST: &[&str] = &[
    "rate_limit_exceeded",
    "server_error",
    "invalid_request_error",
    "invalid_api_key",
    "model_not_found",
    "insufficient_quota",
    "overloaded_error",
];

/// The provider code, when it is on [`PROVIDER_CODE_ALLOWLIST`].
pub fn allowlisted_code(raw: &str) -> Option<SafeToken> {
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
pub fn safe_request_id(raw: &str) -> Option<SafeToken> {
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
pub fn request_id_with(get: impl Fn(&str) -> Option<String>) -> Option<SafeToken> {
    REQUEST_ID_HEADERS
        .iter()
        .find_map(|name| get(name).as_deref().and_then(safe_request_id))
}

#[cfg(test)]
mod tests {
    use super::*;

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
