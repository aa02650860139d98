//! A streamed OpenAI Chat Completion, recovered.
//!
//! ```sh
//! OPENAI_API_KEY=sk-... cargo run --release --example openai_chat -- "Write a haiku about TCP"
//! ```
//!
//! Needs `OPENAI_API_KEY`. `OPENAI_BASE_URL` (default
//! `https://api.openai.com/v1`) points it at any compatible server
//! (OpenRouter: `https://openrouter.ai/api/v1`; vLLM:
//! `http://127.0.0.1:8000/v1`; the llama.cpp server:
//! `http://127.0.0.1:8080/v1`), and
//! `OPENAI_MODEL` picks the model (default `gpt-4o-mini`). The text goes to
//! stdout, the lifecycle and the report to stderr. Exit status 0 completed,
//! 1 recovery failed, 2 configuration missing, 130 Ctrl-C.

use std::process::ExitCode;

use http::{HeaderName, HeaderValue};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_examples::provider::{self, Call};

const EXAMPLE: &str = "openai_chat";

#[tokio::main]
async fn main() -> ExitCode {
    let Some(key) = provider::var("OPENAI_API_KEY") else {
        return provider::needs(
            EXAMPLE,
            "needs OPENAI_API_KEY (an OpenAI API key); optional: OPENAI_BASE_URL \
             (default https://api.openai.com/v1), OPENAI_MODEL (default gpt-4o-mini)",
        );
    };
    let base = provider::var("OPENAI_BASE_URL")
        .unwrap_or_else(|| String::from("https://api.openai.com/v1"));
    let url = match provider::endpoint(&base, "/chat/completions") {
        Ok(url) => url,
        Err(e) => return provider::needs(EXAMPLE, &format!("OPENAI_BASE_URL is {e}")),
    };
    let Ok(auth) = HeaderValue::from_str(&format!("Bearer {key}")) else {
        return provider::needs(
            EXAMPLE,
            "OPENAI_API_KEY contains characters a header cannot carry",
        );
    };
    let model = provider::var("OPENAI_MODEL").unwrap_or_else(|| String::from("gpt-4o-mini"));
    let body = serde_json::json!({
        "model": model,
        "stream": true,
        "stream_options": { "include_usage": true },
        "messages": [{
            "role": "user",
            "content": provider::prompt("In two sentences: why can a dropped HTTP stream not simply be retried?"),
        }],
    });
    provider::run(Call {
        example: EXAMPLE,
        protocol: ProtocolKind::OpenAiChat,
        url,
        headers: vec![(HeaderName::from_static("authorization"), auth)],
        body,
        policy: RecoveryPolicy::default(),
        admission: None,
    })
    .await
}
