//! A streamed Anthropic Messages response, recovered.
//!
//! ```sh
//! ANTHROPIC_API_KEY=sk-ant-... cargo run --release --example anthropic -- "Write a haiku about TCP"
//! ```
//!
//! Needs `ANTHROPIC_API_KEY`. `ANTHROPIC_BASE_URL` (default
//! `https://api.anthropic.com`) points it elsewhere, and `ANTHROPIC_MODEL`
//! picks the model (default `claude-3-5-haiku-latest`). The text goes to
//! stdout, the lifecycle and the report to stderr. Exit status 0 completed,
//! 1 recovery failed, 2 configuration missing, 130 Ctrl-C.

use std::process::ExitCode;

use http::{HeaderName, HeaderValue};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_examples::provider::{self, Call};

const EXAMPLE: &str = "anthropic";

#[tokio::main]
async fn main() -> ExitCode {
    let Some(key) = provider::var("ANTHROPIC_API_KEY") else {
        return provider::needs(
            EXAMPLE,
            "needs ANTHROPIC_API_KEY (an Anthropic API key); optional: ANTHROPIC_BASE_URL \
             (default https://api.anthropic.com), ANTHROPIC_MODEL (default claude-3-5-haiku-latest)",
        );
    };
    let base = provider::var("ANTHROPIC_BASE_URL")
        .unwrap_or_else(|| String::from("https://api.anthropic.com"));
    let url = match provider::endpoint(&base, "/v1/messages") {
        Ok(url) => url,
        Err(e) => return provider::needs(EXAMPLE, &format!("ANTHROPIC_BASE_URL is {e}")),
    };
    let Ok(key) = HeaderValue::from_str(&key) else {
        return provider::needs(
            EXAMPLE,
            "ANTHROPIC_API_KEY contains characters a header cannot carry",
        );
    };
    let model =
        provider::var("ANTHROPIC_MODEL").unwrap_or_else(|| String::from("claude-3-5-haiku-latest"));
    let body = serde_json::json!({
        "model": model,
        "max_tokens": 1024,
        "stream": true,
        "messages": [{
            "role": "user",
            "content": provider::prompt("In two sentences: why can a dropped HTTP stream not simply be retried?"),
        }],
    });
    provider::run(Call {
        example: EXAMPLE,
        protocol: ProtocolKind::Anthropic,
        url,
        headers: vec![
            (HeaderName::from_static("x-api-key"), key),
            (
                HeaderName::from_static("anthropic-version"),
                HeaderValue::from_static("2023-06-01"),
            ),
        ],
        body,
        policy: RecoveryPolicy::default(),
        admission: None,
    })
    .await
}
