//! A streamed chat from a local Ollama, recovered.
//!
//! ```sh
//! ollama serve & ollama pull llama3.2
//! cargo run --release --example ollama -- "Write a haiku about TCP"
//! ```
//!
//! Needs a running Ollama at `OLLAMA_HOST` (default `http://127.0.0.1:11434`;
//! `host:port` without a scheme is accepted, as the Ollama CLI does).
//! `OLLAMA_MODEL` picks the model (default `llama3.2`). The text goes to
//! stdout, the lifecycle and the report to stderr. Exit status 0 completed,
//! 1 recovery failed, 2 no Ollama found, 130 Ctrl-C.
//!
//! A local runner is `Endpoint::Local`: a resend after the request may have
//! reached the server could start a second, overlapping generation on the
//! same machine, so such resends go through an admission hook. This one
//! allows them and says so; a real application could check the runner's
//! load first.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use recovery_core::exchange::AdmissionAnswer;
use recovery_core::policy::{Endpoint, RecoveryPolicy};
use recovery_core::protocol::ProtocolKind;
use recovery_examples::provider::{self, Call};
use tower_recovery::recovery::{AdmissionContext, AdmissionHook};

const EXAMPLE: &str = "ollama";

#[tokio::main]
async fn main() -> ExitCode {
    let host =
        provider::var("OLLAMA_HOST").unwrap_or_else(|| String::from("http://127.0.0.1:11434"));
    let base = if host.contains("://") {
        host
    } else {
        format!("http://{host}")
    };
    let url = match provider::endpoint(&base, "/api/chat") {
        Ok(url) => url,
        Err(e) => return provider::needs(EXAMPLE, &format!("OLLAMA_HOST is {e}")),
    };
    let authority = url.authority().map(ToString::to_string).unwrap_or_default();
    let port = url
        .port_u16()
        .unwrap_or(if url.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    let host = url
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_owned();
    let reachable = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect((host.as_str(), port)),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    if !reachable {
        return provider::needs(
            EXAMPLE,
            &format!(
                "needs a running Ollama at {authority} (start it with `ollama serve` and pull a \
                 model with `ollama pull llama3.2`), or OLLAMA_HOST pointing at one"
            ),
        );
    }
    let model = provider::var("OLLAMA_MODEL").unwrap_or_else(|| String::from("llama3.2"));
    let body = serde_json::json!({
        "model": model,
        "stream": true,
        "messages": [{
            "role": "user",
            "content": provider::prompt("In two sentences: why can a dropped HTTP stream not simply be retried?"),
        }],
    });
    let policy = RecoveryPolicy::builder()
        .endpoint(Endpoint::Local)
        .build()
        .expect("a valid policy");
    let admission: AdmissionHook = Arc::new(|ctx: AdmissionContext| {
        eprintln!(
            "{EXAMPLE}: allowing resend {} although the runner may still be busy with the last one",
            ctx.next_attempt
        );
        Box::pin(async { AdmissionAnswer::Allow })
    });
    provider::run(Call {
        example: EXAMPLE,
        protocol: ProtocolKind::Ollama,
        url,
        headers: Vec::new(),
        body,
        policy,
        admission: Some(admission),
    })
    .await
}
