//! An OpenAI Responses background stream, resumed instead of failed.
//!
//! ```sh
//! OPENAI_API_KEY=sk-... cargo run --release --example openai_responses -- "Explain TCP slow start"
//! ```
//!
//! The request asks for `"background": true` and `"stream": true`: the
//! response keeps generating on the provider's side whatever happens to
//! the connection, and every event carries a `sequence_number`. When the
//! stream breaks after output began, the layer does not fail (a replay
//! would duplicate what was shown) and does not give up: it sends
//! `GET …/responses/{id}?stream=true&starting_after={last sequence_number}`
//! and stitches the rest on, dropping events the server repeats, so the text
//! on stdout is the uninterrupted answer. The lifecycle on stderr shows
//! `resume_started` and the report a seam.
//!
//! Needs `OPENAI_API_KEY`. `OPENAI_BASE_URL` (default
//! `https://api.openai.com/v1`) and `OPENAI_MODEL` (default `gpt-4o-mini`)
//! as for `openai_chat`. Exit status 0 completed, 1 recovery failed, 2
//! configuration missing, 130 Ctrl-C.

use std::process::ExitCode;

use http::{HeaderName, HeaderValue};
use recovery_core::{ProtocolKind, RecoveryPolicy};
use recovery_examples::provider::{self, Call};

const EXAMPLE: &str = "openai_responses";

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
    let url = match provider::endpoint(&base, "/responses") {
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
        // What makes the stream resumable: the generation outlives the
        // connection, and each event has a sequence number to resume after.
        "background": true,
        "stream": true,
        "input": provider::prompt("In three short paragraphs: how does TCP slow start work?"),
    });
    provider::run(Call {
        example: EXAMPLE,
        protocol: ProtocolKind::OpenAiResponses,
        url,
        headers: vec![(HeaderName::from_static("authorization"), auth)],
        body,
        policy: RecoveryPolicy::default(),
        admission: None,
    })
    .await
}
