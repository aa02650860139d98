//! Hedging the first token over real sockets: `RecoveryLayer` +
//! `ObserveLayer` over a hyper-util client, against the loopback fault
//! provider, which notes when it wrote each body piece and when each
//! connection ended. The race is the machine's (vectors `hg*`); these tests
//! show that the driver runs two sends at once where the machine asks and
//! closes the loser's connection at once.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_core::report::{RecoveryReport, Role};
use recovery_tests::fault::{FaultProvider, Script, ScriptSet, Write};
use tower_layer::Layer;
use tower_recovery::{Alternate, ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};
use tower_service::Service;

const PATH: &str = "/v1/chat/completions";
const ALT: &str = "/alt/v1/chat/completions";
const PROMPT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
const LIMIT: Duration = Duration::from_secs(20);

fn chunk(id: &str, delta: &str) -> String {
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{delta},\"finish_reason\":null}}]}}\n\n"
    )
}

fn end(id: &str) -> String {
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n"
    )
}

/// A streamed answer `id`: its head and role chunk at once, its text after
/// `token_ms`, then its end 1 s later (so that a loser left open until the
/// request ends would show). Pieces: 0 the role chunk, 1 the text, 2 the
/// end.
fn answer(id: &str, token_ms: u64) -> Script {
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::text(chunk(
            id,
            r#"{"role":"assistant","content":""}"#,
        )))
        .write(Write::text(chunk(id, &format!(r#"{{"content":"from {id}"}}"#))).delay_ms(token_ms))
        .write(Write::text(end(id)).delay_ms(1000))
}

fn hedging() -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).unwrap())
        .hedge_after(Some(Duration::from_secs(1)))
        .build()
        .unwrap()
}

struct Raced {
    body: String,
    took: Duration,
    report: RecoveryReport,
    events: Vec<String>,
}

/// One request through the stack (with `alternate`, if any), read to its
/// end.
async fn race(provider: &FaultProvider, alternate: Option<Alternate>) -> Raced {
    let events: Arc<Mutex<Vec<LifecycleEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let mut layer =
        RecoveryLayer::new(hedging()).on_event(move |e| sink.lock().unwrap().push(e.clone()));
    if let Some(alt) = alternate {
        layer = layer.with_alternate(alt);
    }
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut svc = layer.layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let req = Request::post(provider.url(PATH))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let started = Instant::now();
    let (body, report) = tokio::time::timeout(LIMIT, async {
        let resp = svc.call(req).await.expect("an answer");
        let handle = resp.extensions().get::<ReportHandle>().cloned().unwrap();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("a whole body")
            .to_bytes();
        (body, handle.report())
    })
    .await
    .expect("hung");
    let events = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name().to_owned())
        .collect();
    Raced {
        body: String::from_utf8(body.to_vec()).unwrap(),
        took: started.elapsed(),
        report,
        events,
    }
}

/// The request the provider received on `path` (the only one), with its
/// connection.
fn received(provider: &FaultProvider, path: &str) -> (u64, u64) {
    let requests = provider.requests_for(path);
    assert_eq!(requests.len(), 1, "one send to {path}");
    (requests[0].seq, requests[0].connection)
}

/// How long after `at` the connection was closed (it must be).
async fn closed_after(provider: &FaultProvider, connection: u64, at: Instant) -> Duration {
    for _ in 0..100 {
        if let Some(closed) = provider.closed_at(connection) {
            return closed.saturating_duration_since(at);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("connection {connection} was never closed");
}

#[tokio::test]
async fn a_slow_primary_loses_to_a_fast_alternate_and_is_closed_at_once() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(PATH, vec![answer("primary", 8000)])
            .path(ALT, vec![answer("alt", 200)]),
    )
    .await
    .unwrap();
    let alt = Alternate::new("alt")
        .unwrap()
        .url(provider.url(ALT))
        .unwrap();
    let run = race(&provider, Some(alt)).await;
    assert!(run.body.contains("from alt"), "{}", run.body);
    assert!(!run.body.contains("primary"), "{}", run.body);
    assert!(run.took < Duration::from_secs(4), "took {:?}", run.took);
    assert_eq!(
        run.events,
        [
            "attempt_started",
            "hedge_started",
            "attempt_started",
            "committed",
            "hedge_cancelled",
            "attempt_succeeded",
            "completed"
        ]
    );
    let roles: Vec<_> = run.report.attempts.iter().map(|a| a.role).collect();
    assert_eq!(roles, [Some(Role::First), Some(Role::Hedge)]);
    assert_eq!(run.report.served_by.as_deref(), Some("alt"));
    let hedges = run.report.hedges();
    assert_eq!((hedges.started, hedges.won, hedges.cancelled), (1, 1, 1));
    // The primary's connection is closed within 100 ms of the alternate's
    // first token, not when its own would have come (8 s).
    let (alt_seq, _) = received(&provider, ALT);
    let (_, primary) = received(&provider, PATH);
    let token = provider.pieces_at(alt_seq)[1];
    let after = closed_after(&provider, primary, token).await;
    assert!(
        after < Duration::from_millis(100),
        "closed {after:?} after the token"
    );
}

#[tokio::test]
async fn the_primary_wins_when_its_token_comes_first_and_the_hedge_is_closed() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(PATH, vec![answer("primary", 1500)])
            .path(ALT, vec![answer("alt", 1500)]),
    )
    .await
    .unwrap();
    let alt = Alternate::new("alt")
        .unwrap()
        .url(provider.url(ALT))
        .unwrap();
    let run = race(&provider, Some(alt)).await;
    assert!(run.body.contains("from primary"), "{}", run.body);
    assert!(!run.body.contains("from alt"), "{}", run.body);
    assert_eq!(run.report.served_by.as_deref(), Some("primary"));
    let (primary_seq, _) = received(&provider, PATH);
    let (alt_seq, alt) = received(&provider, ALT);
    let token = provider.pieces_at(primary_seq)[1];
    let after = closed_after(&provider, alt, token).await;
    assert!(
        after < Duration::from_millis(100),
        "closed {after:?} after the token"
    );
    // The hedge's own token (due at 2.5 s) was never written.
    assert_eq!(provider.pieces_at(alt_seq).len(), 1);
}

#[tokio::test]
async fn without_alternates_the_hedge_goes_to_the_same_target() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![answer("slow", 8000), answer("fast", 100)]),
    )
    .await
    .unwrap();
    let run = race(&provider, None).await;
    assert!(run.body.contains("from fast"), "{}", run.body);
    assert!(run.took < Duration::from_secs(4), "took {:?}", run.took);
    let requests = provider.requests_for(PATH);
    assert_eq!(requests.len(), 2);
    assert_ne!(
        requests[0].connection, requests[1].connection,
        "two connections at once"
    );
    let token = provider.pieces_at(requests[1].seq)[1];
    let after = closed_after(&provider, requests[0].connection, token).await;
    assert!(
        after < Duration::from_millis(100),
        "closed {after:?} after the token"
    );
}
