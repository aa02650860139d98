//! Classifying provider errors (in-stream events and HTTP error bodies) into
//! transient, permanent or unknown, keeping only allowlisted codes.

use super::kind::ProtocolKind;
use crate::json::{JsonKind, JsonView, Lazy};
use crate::progress::{ProviderError, Transience};
use crate::safe::{CONTEXT_LENGTH_EXCEEDED, allowlisted_code};

/// Codes and types that say the prompt is longer than the model's context
/// window: OpenAI's (and the OpenAI-compatible servers that copy it),
/// llama.cpp's server.
const CONTEXT_CODES: &[&str] = &[
    "context_length_exceeded",
    "exceed_context_size_error",
    "model_context_window_exceeded",
];

/// Whether a provider error says the prompt does not fit the model's
/// context window: by its code or type, or by the words of its message
/// (read as a bounded, case-folded prefix, never kept): Anthropic's
/// "prompt is too long: N tokens > M maximum", Gemini's "The input token
/// count (N) exceeds the maximum number of tokens allowed", vLLM's,
/// DeepSeek's and OpenRouter's "maximum context length is N tokens",
/// Mistral's "too large for model with N maximum context length",
/// llama.cpp's "exceeds the available context size".
pub(super) fn says_context_overflow<'t>(
    codes: impl IntoIterator<Item = &'t str>,
    message: Option<&str>,
) -> bool {
    if codes.into_iter().any(|c| CONTEXT_CODES.contains(&c)) {
        return true;
    }
    let Some(message) = message else {
        return false;
    };
    let m = message.as_bytes();
    let m = m.get(..512).unwrap_or(m);
    let has = |needle: &str| crate::text::contains_ignore_ascii_case(m, needle.as_bytes());
    has("prompt is too long")
        || has("maximum context length")
        || has("exceeds the available context size")
        || (has("context length") && has("exceed"))
        || (has("context window") && has("exceed"))
        || (has("input token count") && has("exceeds the maximum"))
}

/// What a provider error code or type says about retrying, when it says
/// anything: the codes OpenAI, Anthropic, Gemini and Ollama document for
/// overload, rate limits and server errors are transient; authentication,
/// quota and invalid-request codes are permanent.
pub(super) fn transience_for_token(token: &str) -> Option<Transience> {
    match token {
        "server_error"
        | "rate_limit_exceeded"
        | "overloaded_error"
        | "api_error"
        | "timeout_error"
        | "rate_limit_error"
        | "network_error"
        | "insufficient_system_resource"
        | "UNAVAILABLE"
        | "INTERNAL"
        | "DEADLINE_EXCEEDED"
        | "RESOURCE_EXHAUSTED" => Some(Transience::Transient),
        "insufficient_quota"
        | "invalid_request_error"
        | "invalid_api_key"
        | "model_not_found"
        | "authentication_error"
        | "billing_error"
        | "permission_error"
        | "not_found_error"
        | "request_too_large"
        | "invalid_prompt"
        | "data_residency_mismatch"
        | "bio_policy"
        | "INVALID_ARGUMENT"
        | "FAILED_PRECONDITION"
        | "PERMISSION_DENIED"
        | "NOT_FOUND"
        | "UNAUTHENTICATED" => Some(Transience::Permanent),
        t if t.starts_with("invalid_image") || t.starts_with("image_") => {
            Some(Transience::Permanent)
        }
        _ => None,
    }
}

/// What an HTTP-like status code says about retrying: 408, 409, 429 and 5xx
/// are transient, other 4xx permanent, anything else unknown.
pub(super) fn transience_for_status(status: u64) -> Transience {
    match status {
        408 | 409 | 429 | 500..=599 => Transience::Transient,
        400..=499 => Transience::Permanent,
        _ => Transience::Unknown,
    }
}

/// Classifies an error value: an object with `code` / `type` / `status`, or
/// a bare string (Ollama). `status_hint` is the HTTP status, when known.
pub(crate) fn classify_error_value<'a, V: JsonView<'a>>(
    err: V,
    status_hint: Option<u16>,
) -> ProviderError {
    let by_hint =
        || status_hint.map_or(Transience::Unknown, |s| transience_for_status(u64::from(s)));
    if err.kind() != JsonKind::Object {
        return ProviderError {
            code: None,
            status: status_hint,
            transience: by_hint(),
        };
    }
    let [code, kind, status, message] = err.fields(["code", "type", "status", "message"]);
    let code_text = code.and_then(JsonView::text);
    let type_text = kind.and_then(JsonView::text);
    let status_text = status.and_then(JsonView::text);
    if says_context_overflow(
        [&code_text, &type_text]
            .into_iter()
            .flatten()
            .map(AsRef::as_ref),
        message.and_then(JsonView::text).as_deref(),
    ) {
        return ProviderError {
            code: allowlisted_code(CONTEXT_LENGTH_EXCEEDED),
            status: status_hint,
            transience: Transience::Permanent,
        };
    }
    let numeric = code
        .and_then(JsonView::as_u64)
        .and_then(|n| u16::try_from(n).ok());
    let by_token = [&code_text, &type_text, &status_text]
        .into_iter()
        .flatten()
        .find_map(|t| transience_for_token(t));
    let transience = by_token
        .or_else(|| numeric.map(|n| transience_for_status(u64::from(n))))
        .unwrap_or_else(by_hint);
    let safe = code_text
        .as_deref()
        .and_then(allowlisted_code)
        .or_else(|| type_text.as_deref().and_then(allowlisted_code));
    ProviderError {
        code: safe,
        status: numeric.or(status_hint),
        transience,
    }
}

/// Classifies a complete error body (a non-2xx response, or a JSON error
/// answered where a stream was expected) into a provider error.
///
/// Reads the error shapes providers send: OpenAI / OpenRouter / Gemini
/// `{"error":{…}}`, Anthropic `{"type":"error","error":{…}}`, Ollama
/// `{"error":"…"}`, vLLM `{"object":"error",…}`. Returns `None` when the body
/// is not one of them. A 429 whose body says `insufficient_quota` is
/// permanent: a quota does not come back by waiting.
pub(crate) fn classify_error_body(
    kind: &ProtocolKind,
    http_status: Option<u16>,
    body: &[u8],
) -> Option<ProviderError> {
    let root = Lazy::parse(body).ok()?;
    let [error, object] = root.fields(["error", "object"]);
    if let Some(err) = error.filter(|e| !e.is_null()) {
        let mut classified = classify_error_value(err, http_status);
        if kind.is_ndjson() && err.kind() == JsonKind::String && http_status.is_none() {
            classified.transience = Transience::Unknown;
        }
        return Some(classified);
    }
    if object.is_some_and(|o| o.str_eq("error")) {
        return Some(classify_error_value(root, http_status));
    }
    None
}
