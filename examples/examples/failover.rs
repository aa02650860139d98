//! Failover before the first token, and a cooldown that sends the next
//! request straight to the alternate.
//!
//! ```sh
//! cargo run --release --example failover
//! ```
//!
//! A loopback fault provider (the project's test server, embedded here)
//! plays two OpenAI-compatible endpoints: the primary answers
//! `529 overloaded` with `Retry-After: 30`, the backup streams. The first
//! request fails over at once (no output had reached the consumer, and the
//! request will not wait 30 s); the primary's `Retry-After` is now a
//! cooldown every request through the layer shares, so the second request
//! goes to the backup without sending to the primary at all. The backup
//! gets its own model and key; the report names the target of each attempt
//! and the one that served.

use std::process::ExitCode;

use bytes::Bytes;
use http::Request;
use http::header::AUTHORIZATION;
use http_body_util::Full;
use recovery_core::call::{Cancellation, RecoveryCall};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_examples::client::{exchange, https_client};
use recovery_examples::show::{self, BOLD, DIM, Style};
use recovery_examples::text::DeltaText;
use recovery_tests::fault::{FaultProvider, Script, ScriptSet, Transfer, Write};
use tower::ServiceBuilder;
use tower_recovery::{Alternate, ObserveLayer, RecoveryLayer};

const PRIMARY: &str = "/v1/chat/completions";
const BACKUP: &str = "/backup/v1/chat/completions";
const PROMPT: &str = r#"{"model":"big-model","stream":true,"messages":[{"role":"user","content":"Where did this answer come from?"}]}"#;

fn scripts() -> ScriptSet {
    let chunk = |content: &str, finish: &str| {
        let delta = serde_json::json!({ "content": content }).to_string();
        format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":{finish}}}]}}\n\n"
        )
    };
    let answer = || {
        let mut s = Script::ok().header("content-type", "text/event-stream");
        for word in [
            "From",
            " the",
            " backup:",
            " the",
            " primary",
            " was",
            " overloaded.",
        ] {
            s = s.write(Write::text(chunk(word, "null")).delay_ms(40));
        }
        s.write(Write::text(chunk("", "\"stop\"")))
            .write(Write::text("data: [DONE]\n\n"))
    };
    ScriptSet::new(vec![])
        .path(
            PRIMARY,
            vec![
                Script::status(529)
                    .header("content-type", "application/json")
                    .header("retry-after", "30")
                    .transfer(Transfer::ContentLength)
                    .write(Write::text(
                        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                    )),
            ],
        )
        .path(BACKUP, vec![answer(), answer()])
}

#[tokio::main]
async fn main() -> ExitCode {
    let style = Style::for_stdout();
    let provider = match FaultProvider::start(scripts()).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("failover: cannot start the loopback provider: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{}",
        style.paint(BOLD, "Recovery failover: an overloaded primary, a backup")
    );
    println!(
        "{}",
        style.paint(
            DIM,
            &format!(
                "primary {} answers 529 (Retry-After: 30); backup {} streams\n",
                provider.url(PRIMARY),
                provider.url(BACKUP)
            )
        )
    );
    let backup = Alternate::new("backup")
        .and_then(|a| a.url(provider.url(BACKUP)))
        .and_then(|a| a.model("small-model"))
        .map(|a| {
            a.header(
                AUTHORIZATION,
                "Bearer sk-backup-demo".parse().expect("a header value"),
            )
        })
        .expect("a valid alternate");
    let layer = RecoveryLayer::new(RecoveryPolicy::default())
        .with_alternate(backup)
        .on_event(move |e| println!("{}", show::describe(e, style)));
    let mut svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
        .service(https_client());

    let mut served = Vec::new();
    for n in 1..=2 {
        println!("{}", style.paint(BOLD, &format!("request {n}")));
        let cancel = Cancellation::new();
        let mut request = Request::post(provider.url(PRIMARY))
            .header("content-type", "application/json")
            .header(AUTHORIZATION, "Bearer sk-primary-demo")
            .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
            .expect("a valid request");
        request
            .extensions_mut()
            .insert(RecoveryCall::new().with_cancellation(cancel.clone()));
        let mut deltas = DeltaText::new(ProtocolKind::OpenAiChat);
        let mut text = String::new();
        let result = exchange(&mut svc, request, &cancel, |chunk| {
            text.push_str(&deltas.push(chunk));
            Ok(())
        })
        .await;
        println!("{}", style.paint(DIM, &format!("           │ {text}")));
        println!("{}", show::summary(&result.report, style));
        served.push((result.completed(), result.report.served_by.clone()));
    }
    drop(svc);

    let primary = provider.requests_for(PRIMARY).len();
    let backup = provider.requests_for(BACKUP);
    let models_ok = backup.iter().all(|r| {
        serde_json::from_slice::<serde_json::Value>(&r.body)
            .is_ok_and(|v| v["model"] == "small-model")
    });
    println!(
        "{}",
        style.paint(
            DIM,
            &format!(
                "  {:<20}primary {primary} request(s), backup {} request(s), backup model small-model: {models_ok}",
                "provider saw",
                backup.len()
            )
        )
    );
    let all_backup = served
        .iter()
        .all(|(done, by)| *done && by.as_deref() == Some("backup"));
    if all_backup && primary == 1 && backup.len() == 2 && models_ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("failover: the requests were not served as expected: {served:?}");
        ExitCode::FAILURE
    }
}
