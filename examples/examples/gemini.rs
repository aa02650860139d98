//! A streamed Gemini answer (`streamGenerateContent`, SSE), recovered.
//!
//! ```sh
//! GEMINI_API_KEY=... cargo run --release --example gemini -- "Write a haiku about TCP"
//! ```
//!
//! Needs `GEMINI_API_KEY`. `GEMINI_BASE_URL` (default
//! `https://generativelanguage.googleapis.com/v1beta`) points it elsewhere
//! and `GEMINI_MODEL` picks the model (default `gemini-2.0-flash`). The
//! stream is finished only when every candidate has a `finishReason`; a
//! `503 UNAVAILABLE` or a reset before the first text is replayed. Exit
//! status 0 completed, 1 recovery failed, 2 configuration missing, 130
//! Ctrl-C.

use std::process::ExitCode;

use http::{HeaderName, HeaderValue};
use recovery_core::{ProtocolKind, RecoveryPolicy};
use recovery_examples::provider::{self, Call};

const EXAMPLE: &str = "gemini";

#[tokio::main]
async fn main() -> ExitCode {
    let Some(key) = provider::var("GEMINI_API_KEY") else {
        return provider::needs(
            EXAMPLE,
            "needs GEMINI_API_KEY (a Gemini API key); optional: GEMINI_BASE_URL \
             (default https://generativelanguage.googleapis.com/v1beta), GEMINI_MODEL \
             (default gemini-2.0-flash)",
        );
    };
    let base = provider::var("GEMINI_BASE_URL")
        .unwrap_or_else(|| String::from("https://generativelanguage.googleapis.com/v1beta"));
    let model = provider::var("GEMINI_MODEL").unwrap_or_else(|| String::from("gemini-2.0-flash"));
    let path = format!("/models/{model}:streamGenerateContent?alt=sse");
    let url = match provider::endpoint(&base, &path) {
        Ok(url) => url,
        Err(e) => {
            return provider::needs(EXAMPLE, &format!("GEMINI_BASE_URL or GEMINI_MODEL: {e}"));
        }
    };
    let Ok(key) = HeaderValue::from_str(&key) else {
        return provider::needs(
            EXAMPLE,
            "GEMINI_API_KEY contains characters a header cannot carry",
        );
    };
    let body = serde_json::json!({
        "contents": [{
            "role": "user",
            "parts": [{ "text": provider::prompt("In two sentences: why can a dropped HTTP stream not simply be retried?") }],
        }],
    });
    provider::run(Call {
        example: EXAMPLE,
        protocol: ProtocolKind::Gemini,
        url,
        headers: vec![(HeaderName::from_static("x-goog-api-key"), key)],
        body,
        policy: RecoveryPolicy::default(),
        admission: None,
    })
    .await
}
