//! A reqwest client with recovery, on the loopback fault provider.
//!
//! ```sh
//! cargo run -p reqwest-recovery --example reqwest_middleware
//! ```
//!
//! The provider (the project's test server, embedded here) plays an
//! OpenAI-compatible endpoint. The first request meets a `503` with
//! `retry-after-ms`, then a connection reset before any response head,
//! then the stream: it arrives whole, once. The second request's stream is
//! cut by a reset after its first words: the body ends with a typed
//! `interrupted` error instead of a silent truncation. Both go through a
//! `reqwest_middleware::ClientWithMiddleware` with `RecoveryMiddleware`,
//! and each prints its text as it streams, then its report.

use std::io::Write as _;
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_core::report::{AttemptResult, RecoveryReport};
use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Write};
use reqwest_recovery::{
    RecoveryError, RecoveryMiddleware, client_builder, middleware_error, recovery_error,
};
use tower_recovery::{ObserveLayer, RecoveryLayer, ReportHandle};

const PATH: &str = "/v1/chat/completions";
const CUT_PATH: &str = "/cut/v1/chat/completions";
const PROMPT: &str = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Why do streams need recovery?"}]}"#;
const CUT: &[&str] = &[
    "This", " answer", " is", " cut", " by", " a", " reset", " after", " its", " first", " words.",
];
const WORDS: &[&str] = &[
    "Two",
    " failures",
    " happened",
    " before",
    " the",
    " first",
    " token,",
    " so",
    " the",
    " request",
    " was",
    " replayed",
    " and",
    " this",
    " text",
    " arrived",
    " whole.",
];

/// One OpenAI Chat Completions event.
fn event(delta: &str, finish: &str) -> String {
    format!(
        "data: {{\"id\":\"chatcmpl-r\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
    )
}

fn content(word: &str) -> String {
    event(&serde_json::json!({ "content": word }).to_string(), "null")
}

/// The stream of `words`, one event at a time; cut by a reset after
/// `cut_after` words when given.
fn stream(words: &[&str], cut_after: Option<usize>) -> Script {
    let mut script = Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::text(event(
            r#"{"role":"assistant","content":""}"#,
            "null",
        )));
    for (i, word) in words.iter().enumerate() {
        if cut_after == Some(i) {
            return script.ending(Ending::Rst);
        }
        script = script.write(Write::text(content(word)).delay_ms(40));
    }
    script
        .write(Write::text(event("{}", "\"stop\"")))
        .write(Write::text("data: [DONE]\n\n"))
}

fn scripts() -> ScriptSet {
    ScriptSet::new(vec![])
        .path(
            PATH,
            vec![
                Script::status(503)
                    .header("retry-after-ms", "300")
                    .write(Write::text(r#"{"error":{"message":"overloaded"}}"#)),
                Script::just(Ending::ResetBeforeHead),
                stream(WORDS, None),
            ],
        )
        .path(CUT_PATH, vec![stream(CUT, Some(4))])
}

/// Sends `PROMPT` to `url`, prints the text as it arrives and the report.
async fn ask(
    client: &reqwest_middleware::ClientWithMiddleware,
    url: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut response = match client
        .post(url)
        .header("content-type", "application/json")
        .body(PROMPT)
        .send()
        .await
    {
        Ok(response) => response,
        Err(e) => {
            eprintln!(
                "no answer: {:?}",
                middleware_error(&e).map(RecoveryError::outcome)
            );
            return Err(e.into());
        }
    };
    let report = response.extensions().get::<ReportHandle>().cloned();
    let mut decoder = Text::default();
    let mut out = std::io::stdout();
    loop {
        match response.chunk().await {
            Ok(Some(bytes)) => {
                write!(out, "{}", decoder.feed(&bytes))?;
                out.flush()?;
            }
            Ok(None) => break,
            Err(e) => {
                writeln!(out)?;
                match recovery_error(&e) {
                    Some(err) => println!("body ended with a typed error: {err}"),
                    None => println!("body error: {e}"),
                }
                break;
            }
        }
    }
    println!();
    if let Some(report) = report {
        summarize(&report.report());
    }
    Ok(())
}

/// The report in a few lines (it serializes whole with serde too).
fn summarize(report: &RecoveryReport) {
    let outcome = report
        .outcome
        .as_ref()
        .map_or_else(|| "none".to_owned(), |o| format!("{o:?}"));
    println!(
        "report: {} send(s), outcome {outcome}",
        report.attempt_count()
    );
    for a in &report.attempts {
        let status = a
            .status
            .map_or_else(|| "no head".to_owned(), |s| s.to_string());
        let result = match &a.result {
            AttemptResult::Failed { phase, reason, .. } => format!("failed {phase:?}, {reason:?}"),
            AttemptResult::Succeeded { proof } => format!("succeeded, proof {proof:?}"),
            other => format!("{other:?}"),
        };
        println!("  attempt {}: {status}, {result}", a.wire_attempt);
    }
}

/// The `content` deltas of complete events, however the bytes were split.
#[derive(Default)]
struct Text {
    pending: Vec<u8>,
}

impl Text {
    fn feed(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        while let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            let Some(data) = event.strip_prefix(b"data: ") else {
                continue;
            };
            if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data.trim_ascii())
                && let Some(s) = value["choices"][0]["delta"]["content"].as_str()
            {
                text.push_str(s);
            }
        }
        text
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let provider = match FaultProvider::start(scripts()).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannot start the loopback provider: {e}");
            return ExitCode::FAILURE;
        }
    };
    let policy = match RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(4).unwrap_or(NonZeroU32::MIN))
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .build()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("policy: {e}");
            return ExitCode::FAILURE;
        }
    };
    let layer = RecoveryLayer::new(policy).on_event(|e| eprintln!("  · {e}"));
    let reqwest = match client_builder().build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("client: {e}");
            return ExitCode::FAILURE;
        }
    };
    let client = reqwest_middleware::ClientBuilder::new(reqwest)
        .with(RecoveryMiddleware::new(layer).observe(ObserveLayer::new(ProtocolKind::OpenAiChat)))
        .build();

    println!("1. 503, then a reset before the head, then the stream:");
    if ask(&client, &provider.url(PATH)).await.is_err() {
        return ExitCode::FAILURE;
    }
    println!("\n2. a reset after the first words:");
    if ask(&client, &provider.url(CUT_PATH)).await.is_err() {
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
