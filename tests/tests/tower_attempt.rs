//! One attempt judged the same way however it ended (reliability matrix
//! AT), over real sockets: the tower driver, a hyper-util client and the
//! loopback fault provider's byte-exact endings (close-delimited FIN,
//! chunked FIN, RST, stalls).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::error::RecoveryError;
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::outcome::{InterruptCause, Outcome};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_core::report::RecoveryReport;
use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Transfer, Write};
use tower_layer::Layer;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};
use tower_service::Service;

const LIMIT: Duration = Duration::from_secs(20);
const PATH: &str = "/v1/chat/completions";
const PROMPT: &str = r#"{"model":"m","stream":true,"messages":[]}"#;
const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(recovery_tests::fault::default_fixtures_dir().join(name)).expect("fixture")
}

fn sse(text: &str) -> Script {
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::text(text))
}

fn happy() -> Script {
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::fixture("openai-chat/happy-usage.sse"))
}

fn policy() -> RecoveryPolicy {
    recovery_tests::policy::loopback().build().unwrap()
}

/// What one request came to.
struct Ended {
    /// The committed (or final) response's status; 0 without one.
    status: u16,
    /// The response future's error, when nothing was committed.
    error: Option<RecoveryError>,
    body: Vec<u8>,
    report: RecoveryReport,
    events: Vec<&'static str>,
}

/// Sends one request through `layer` (with an `ObserveLayer` when
/// `observe`) and reads the answer to its end.
async fn send(provider: &FaultProvider, layer: RecoveryLayer, observe: bool) -> Ended {
    send_within(provider, layer, observe, LIMIT).await
}

/// [`send`], giving up after `limit`.
async fn send_within(
    provider: &FaultProvider,
    layer: RecoveryLayer,
    observe: bool,
    limit: Duration,
) -> Ended {
    let events: Arc<Mutex<Vec<LifecycleEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let layer = layer.on_event(move |e| sink.lock().unwrap().push(e.clone()));
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let req = Request::post(provider.url(PATH))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let answer = tokio::time::timeout(limit, async {
        if observe {
            let mut svc = layer.layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
            match svc.call(req).await {
                Ok(resp) => Ok(support::read_to_end(resp).await),
                Err(e) => Err(e),
            }
        } else {
            let mut svc = layer.layer(client);
            match svc.call(req).await {
                Ok(resp) => Ok(support::read_to_end(resp).await),
                Err(e) => Err(e),
            }
        }
    })
    .await
    .expect("hung");
    tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .expect("connections left open");
    let events: Vec<&'static str> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name())
        .collect();
    match answer {
        Ok(d) => Ended {
            status: d.status,
            error: d.body_error,
            body: d.bytes,
            report: d.report.expect("a report"),
            events,
        },
        Err(e) => Ended {
            status: 0,
            report: e.report().clone(),
            error: Some(e),
            body: Vec::new(),
            events,
        },
    }
}

/// The ways an attempt can end inside a frame: a close-delimited body's
/// clean end (FIN), a chunked body cut by FIN before its last chunk, and a
/// reset.
fn endings() -> [(Transfer, Ending); 3] {
    [
        (Transfer::CloseDelimited, Ending::Clean),
        (Transfer::Chunked, Ending::Fin),
        (Transfer::Chunked, Ending::Rst),
    ]
}

#[tokio::test]
async fn at3_a_frame_cut_before_any_output_is_replayed_however_it_ended() {
    for (transfer, ending) in endings() {
        let cut = sse(&format!("{ROLE}data: {{\"choices\":[")).transfer(transfer);
        let provider = FaultProvider::start(
            ScriptSet::new(vec![]).path(PATH, vec![cut.ending(ending), happy()]),
        )
        .await
        .unwrap();
        let run = send(&provider, RecoveryLayer::new(policy()), true).await;
        assert!(
            run.error.is_none(),
            "{transfer:?}/{ending:?}: {:?}",
            run.error
        );
        assert_eq!(run.status, 200);
        assert_eq!(
            run.body,
            fixture("openai-chat/happy-usage.sse"),
            "{transfer:?}/{ending:?}: nothing of the first attempt is delivered"
        );
        assert_eq!(provider.count_path(PATH), 2, "{transfer:?}/{ending:?}");
        assert!(
            run.report
                .outcome
                .as_ref()
                .is_some_and(Outcome::is_completed)
        );
    }
}

#[tokio::test]
async fn at3_a_frame_cut_inside_output_is_not_replayed_and_says_before_commit() {
    for (transfer, ending) in endings() {
        let cut = sse(&format!(
            "{ROLE}data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hel"
        ))
        .transfer(transfer);
        let provider = FaultProvider::start(
            ScriptSet::new(vec![]).path(PATH, vec![cut.ending(ending), happy()]),
        )
        .await
        .unwrap();
        let run = send(&provider, RecoveryLayer::new(policy()), true).await;
        let error = run
            .error
            .expect("the response future fails: nothing committed");
        assert_eq!(
            error.outcome(),
            &Outcome::Interrupted {
                cause: InterruptCause::PartialFrame,
                stall: None,
                committed: false,
            },
            "{transfer:?}/{ending:?}"
        );
        let shown = error.to_string();
        assert!(!shown.contains("after commit"), "{shown}");
        assert!(shown.contains("before commit"), "{shown}");
        assert_eq!(
            provider.count_path(PATH),
            1,
            "{transfer:?}/{ending:?}: never replayed"
        );
        assert_eq!(run.report.committed_attempt, None);
        assert_eq!(run.events.last(), Some(&"interrupted"));
    }
}

#[tokio::test]
async fn at6_json_media_types_are_whole_answers_over_a_socket() {
    let body = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}"#;
    for content_type in ["text/json", "Application/JSON; charset=utf-8"] {
        let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
            PATH,
            vec![Script::ok().header("content-type", content_type).write(Write::text(body))],
        ))
        .await
        .unwrap();
        for observe in [true, false] {
            let run = send(&provider, RecoveryLayer::new(policy()), observe).await;
            assert!(run.error.is_none(), "{content_type}: {:?}", run.error);
            assert_eq!(run.body, body.as_bytes());
            assert!(
                run.report
                    .outcome
                    .as_ref()
                    .is_some_and(Outcome::is_completed)
            );
        }
        assert_eq!(provider.count_path(PATH), 2, "one send per run");
    }
}

#[tokio::test]
async fn at8_a_stall_after_done_completes_and_ends_the_body() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![happy().ending(Ending::Stall)]),
    )
    .await
    .unwrap();
    let run = send(&provider, RecoveryLayer::new(policy()), true).await;
    assert!(run.error.is_none(), "{:?}", run.error);
    assert_eq!(run.body, fixture("openai-chat/happy-usage.sse"));
    assert!(
        run.report
            .outcome
            .as_ref()
            .is_some_and(Outcome::is_completed)
    );
    assert!(!run.events.contains(&"attempt_failed"), "{:?}", run.events);
}

#[tokio::test]
async fn at2_a_consumer_that_stops_at_done_completes_the_request() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![happy().ending(Ending::Stall)]),
    )
    .await
    .unwrap();
    let events: Arc<Mutex<Vec<LifecycleEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut svc = RecoveryLayer::new(policy())
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let req = Request::post(provider.url(PATH))
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let resp = tokio::time::timeout(LIMIT, svc.call(req))
        .await
        .unwrap()
        .unwrap();
    let report = resp.extensions().get::<ReportHandle>().cloned().unwrap();
    let mut body = resp.into_body();
    let mut read = Vec::new();
    // Read up to and including `data: [DONE]`, as an SDK does, then drop.
    while !read.ends_with(b"data: [DONE]\n\n") {
        let frame = tokio::time::timeout(LIMIT, body.frame())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        read.extend_from_slice(frame.data_ref().unwrap());
    }
    drop(body);
    assert!(
        report
            .report()
            .outcome
            .as_ref()
            .is_some_and(Outcome::is_completed)
    );
    let terminals: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind.is_terminal())
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(terminals, ["completed"]);
    drop(svc);
    let stats = tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .unwrap();
    assert_eq!(stats.open_connections, 0, "the connection is released");
}

#[tokio::test]
async fn at7_without_an_observe_layer_the_recovery_layer_decodes_by_itself() {
    // A whole stream completes, and a truncated one fails typed as a
    // truncation (not for lack of an observer).
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            happy(),
            sse(&format!(
                "{ROLE}data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"Hi\"}}}}]}}\n\n"
            ))
            .transfer(Transfer::CloseDelimited),
        ],
    ))
    .await
    .unwrap();
    let run = send(&provider, RecoveryLayer::new(policy()), false).await;
    assert!(run.error.is_none(), "{:?}", run.error);
    assert_eq!(run.body, fixture("openai-chat/happy-usage.sse"));
    let run = send(&provider, RecoveryLayer::new(policy()), false).await;
    assert_eq!(
        run.error.expect("typed").outcome(),
        &Outcome::Interrupted {
            cause: InterruptCause::UnexpectedEof,
            stall: None,
            committed: true,
        }
    );
}

#[tokio::test(start_paused = true)]
async fn at9_the_default_head_timeout_bounds_a_server_that_never_answers() {
    // Default policy: no timeout configured. tokio's clock is paused, so
    // the 300 s head timeout passes as soon as everything waits on it.
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![Script::just(Ending::NeverAnswer), happy()]),
    )
    .await
    .unwrap();
    let started = tokio::time::Instant::now();
    let layer = RecoveryLayer::new(RecoveryPolicy::default());
    let run = send_within(&provider, layer, true, Duration::from_hours(1)).await;
    assert!(run.error.is_none(), "{:?}", run.error);
    assert_eq!(run.body, fixture("openai-chat/happy-usage.sse"));
    assert_eq!(provider.count_path(PATH), 2);
    assert!(started.elapsed() >= Duration::from_mins(5));
    assert!(matches!(
        run.report.attempts[0].result,
        recovery_core::report::AttemptResult::Failed {
            category: recovery_core::failure::Category::ClientTimeout,
            ..
        }
    ));
}
