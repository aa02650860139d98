//! Quickstart: one streamed completion kept whole through two failures.
//!
//! ```sh
//! cargo run --release --example quickstart
//! ```
//!
//! A loopback fault provider (the project's test server, embedded here) plays
//! an OpenAI-compatible endpoint that first answers `503` with
//! `Retry-After: 1`, then resets the connection before sending a response
//! head, then serves the stream. The request goes through
//! `RecoveryLayer` → `ObserveLayer` → a hyper-util client, exactly as it
//! would against a real provider. The lifecycle events print as they
//! happen, the text prints as it streams, and the report closes the run.

use std::io::{self, Write as _};
use std::num::NonZeroU32;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use recovery_core::call::{Cancellation, RecoveryCall};
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_examples::client::{exchange, https_client};
use recovery_examples::show::{self, BOLD, DIM, Style};
use recovery_examples::text::DeltaText;
use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Transfer, Write};
use tower::ServiceBuilder;
use tower_recovery::{ObserveLayer, RecoveryLayer};

const PATH: &str = "/v1/chat/completions";
const PROMPT: &str = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Why do streams need recovery?"}]}"#;
const ANSWER: &[&str] = &[
    "A",
    " dropped",
    " connection",
    " mid-answer",
    " used",
    " to",
    " mean",
    " a",
    " lost",
    " reply.",
    " Here",
    " two",
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
    " invisibly",
    " and",
    " this",
    " text",
    " arrived",
    " whole.",
];

/// The provider's script: 503 with `Retry-After: 1`, a reset before the
/// head, then an OpenAI Chat Completions stream one delta at a time.
fn scripts() -> ScriptSet {
    let chunk = |delta: &str, finish: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-q\",\"object\":\"chat.completion.chunk\",\"model\":\"gpt-4o-mini\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let mut stream = Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::text(chunk(
            r#"{"role":"assistant","content":""}"#,
            "null",
        )));
    for word in ANSWER {
        let delta = serde_json::json!({ "content": word }).to_string();
        stream = stream.write(Write::text(chunk(&delta, "null")).delay_ms(60));
    }
    stream = stream
        .write(Write::text(chunk("{}", "\"stop\"")).delay_ms(60))
        .write(Write::text("data: [DONE]\n\n"));
    ScriptSet::new(vec![]).path(
        PATH,
        vec![
            Script::status(503)
                .header("content-type", "application/json")
                .header("retry-after", "1")
                .transfer(Transfer::ContentLength)
                .write(Write::text(
                    r#"{"error":{"message":"The server is overloaded","type":"server_error"}}"#,
                )),
            Script::just(Ending::ResetBeforeHead),
            stream,
        ],
    )
}

/// Interleaves event lines and streamed text on stdout.
struct Screen {
    style: Style,
    mid_line: bool,
}

impl Screen {
    fn event(&mut self, event: &LifecycleEvent) {
        let mut out = io::stdout().lock();
        if self.mid_line {
            let _ = writeln!(out);
            self.mid_line = false;
        }
        let _ = writeln!(out, "{}", show::describe(event, self.style));
        let _ = out.flush();
    }

    fn text(&mut self, text: &str) {
        let mut out = io::stdout().lock();
        for (i, piece) in text.split('\n').enumerate() {
            if i > 0 {
                let _ = writeln!(out);
                self.mid_line = false;
            }
            if piece.is_empty() {
                continue;
            }
            if !self.mid_line {
                let _ = write!(out, "{}", self.style.paint(DIM, "           │ "));
                self.mid_line = true;
            }
            let _ = write!(out, "{}", self.style.paint(BOLD, piece));
        }
        let _ = out.flush();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let style = Style::for_stdout();
    let provider = match FaultProvider::start(scripts()).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("quickstart: cannot start the loopback provider: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{}",
        style.paint(
            BOLD,
            "Recovery quickstart: one streamed completion, two failures"
        )
    );
    println!(
        "{}",
        style.paint(
            DIM,
            &format!(
                "provider {} answers 503 (Retry-After: 1), then resets before the head, then streams\n",
                provider.url(PATH)
            )
        )
    );

    let policy = RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(4).expect("non-zero"))
        .backoff(Duration::from_millis(200), Duration::from_secs(2))
        .build()
        .expect("a valid policy");

    let screen = Arc::new(Mutex::new(Screen {
        style,
        mid_line: false,
    }));
    let events = Arc::clone(&screen);
    // RecoveryLayer outermost, the observer inside it, the client last.
    let mut svc = ServiceBuilder::new()
        .layer(RecoveryLayer::new(policy).on_event(move |e| {
            events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .event(e);
        }))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
        .service(https_client());

    let cancel = Cancellation::new();
    let mut request = Request::post(provider.url(PATH))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-loopback-demo")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .expect("a valid request");
    request
        .extensions_mut()
        .insert(RecoveryCall::new().with_cancellation(cancel.clone()));

    let mut deltas = DeltaText::new(ProtocolKind::OpenAiChat);
    let text = Arc::clone(&screen);
    let result = exchange(&mut svc, request, &cancel, |chunk| {
        let t = deltas.push(chunk);
        if !t.is_empty() {
            text.lock().unwrap_or_else(PoisonError::into_inner).text(&t);
        }
        Ok(())
    })
    .await;
    drop(svc);

    let sent = provider.requests_for(PATH);
    let identical = sent.iter().all(|r| r.body == sent[0].body);
    println!();
    println!("{}", show::summary(&result.report, style));
    println!(
        "{}",
        style.paint(
            DIM,
            &format!(
                "  {:<20}{} request(s), every resend byte-identical: {identical}",
                "provider saw",
                sent.len()
            )
        )
    );
    if result.completed() && identical {
        ExitCode::SUCCESS
    } else {
        eprintln!("quickstart: {}", show::failure_line(&result.report));
        ExitCode::FAILURE
    }
}
