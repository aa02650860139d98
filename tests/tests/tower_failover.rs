//! Failover before the first token over real sockets: `RecoveryLayer`
//! with alternates over `ObserveLayer` over a hyper-util client, against
//! loopback fault providers that record what each target received.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::header::AUTHORIZATION;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::lifecycle::{EventKind, LifecycleEvent};
use recovery_core::outcome::Outcome;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_tests::fault::{FaultProvider, Script, ScriptSet, Write};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_recovery::{Alternate, ObserveLayer, RecoveryLayer, ReplayBody};

const LIMIT: Duration = Duration::from_secs(20);
const CHAT: &str = "/v1/chat/completions";
const PROMPT: &str =
    r#"{"model":"main-model","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(recovery_tests::fault::default_fixtures_dir().join(name)).expect("fixture")
}

fn sse(fixture: &str) -> Script {
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::fixture(fixture))
}

fn overloaded() -> Script {
    Script::status(529)
        .header("content-type", "application/json")
        .write(Write::text(r#"{"error":{"type":"overloaded_error"}}"#))
}

type Events = Arc<Mutex<Vec<LifecycleEvent>>>;

async fn call(layer: RecoveryLayer, url: String) -> (support::Delivered, Events) {
    let events: Events = Arc::default();
    let sink = Arc::clone(&events);
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let svc = layer
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let req = Request::post(url)
        .header("content-type", "application/json")
        .header(AUTHORIZATION, "Bearer sk-primary-secret")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let delivered = tokio::time::timeout(LIMIT, async {
        support::read_to_end(svc.oneshot(req).await.expect("a response")).await
    })
    .await
    .expect("no hang");
    (delivered, events)
}

fn header<'a>(r: &'a recovery_tests::fault::ReceivedRequest, name: &str) -> Option<&'a [u8]> {
    r.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_ref())
}

/// The primary answers 529; the alternate on another origin, with its own
/// model, key, body shape and protocol (Anthropic Messages), serves the
/// whole answer, byte for byte, once, and never sees the primary's key;
/// the report and the events name each target.
#[tokio::test]
async fn fo_primary_overloaded_another_provider_serves() {
    let primary = FaultProvider::start(ScriptSet::new(vec![]).path(CHAT, vec![overloaded()]))
        .await
        .unwrap();
    let claude = FaultProvider::start(
        ScriptSet::new(vec![]).path("/v1/messages", vec![sse("anthropic/happy.sse")]),
    )
    .await
    .unwrap();
    let alternate = Alternate::new("anthropic")
        .unwrap()
        .url(claude.url("/v1/messages"))
        .unwrap()
        .model("claude-sonnet")
        .unwrap()
        .protocol(ProtocolKind::Anthropic)
        .header("x-api-key".parse().unwrap(), "sk-ant-alt".parse().unwrap())
        // Anthropic wants `max_tokens`: the caller writes its shape.
        .map_body(|body| {
            let mut v: serde_json::Value = serde_json::from_slice(body).unwrap();
            v["max_tokens"] = 1024.into();
            serde_json::to_vec(&v).unwrap()
        });
    let layer = RecoveryLayer::new(RecoveryPolicy::default()).with_alternate(alternate);
    assert!(
        !format!("{layer:?}").contains("sk-ant-alt"),
        "no credential in Debug"
    );
    let (d, events) = call(layer, primary.url(CHAT)).await;

    assert_eq!(d.status, 200);
    assert!(d.body_error.is_none(), "{:?}", d.body_error);
    assert_eq!(d.bytes, fixture("anthropic/happy.sse"));
    assert_eq!(primary.count(), 1);
    let sent = claude.requests();
    assert_eq!(sent.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body["model"], "claude-sonnet");
    assert_eq!(body["max_tokens"], 1024);
    assert_eq!(body["messages"][0]["content"], "hi");
    assert_eq!(header(&sent[0], "x-api-key"), Some(&b"sk-ant-alt"[..]));
    assert_eq!(
        header(&sent[0], "authorization"),
        None,
        "the primary's key never goes to another origin"
    );
    assert_eq!(
        header(&sent[0], "content-type"),
        Some(&b"application/json"[..])
    );
    let host = claude.addr().to_string();
    assert_eq!(header(&sent[0], "host"), Some(host.as_bytes()));

    let report = d.report.expect("report");
    assert!(matches!(report.outcome, Some(Outcome::Completed { .. })));
    assert_eq!(report.served_by.as_deref(), Some("anthropic"));
    let targets: Vec<_> = report
        .attempts
        .iter()
        .map(|a| a.target.as_deref())
        .collect();
    assert_eq!(targets, [Some("primary"), Some("anthropic")]);
    let switched = events.lock().unwrap().iter().any(|e| {
        matches!(&e.kind, EventKind::Failover { from, to, .. } if from == "primary" && to == "anthropic")
    });
    assert!(switched, "a failover event names both targets");
}

/// Output began on the primary, then its connection reset: the request is
/// interrupted and the alternate never receives a request.
#[tokio::test]
async fn fo_committed_then_reset_never_switches() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![
            Script::ok()
                .header("content-type", "text/event-stream")
                .write(Write::text(
                    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n",
                ))
                .ending(recovery_tests::fault::Ending::Rst),
        ],
            )
            .path(
                "/alt/v1/chat/completions",
                vec![sse("openai-chat/happy-usage.sse")],
            ),
    )
    .await
    .unwrap();
    let alternate = Alternate::new("alt")
        .unwrap()
        .url("/alt/v1/chat/completions")
        .unwrap();
    let layer = RecoveryLayer::new(RecoveryPolicy::default()).with_alternate(alternate);
    let (d, _) = call(layer, provider.url(CHAT)).await;
    let error = d.body_error.expect("a typed failure after commit");
    assert!(
        matches!(error.outcome(), Outcome::Interrupted { .. }),
        "{error}"
    );
    assert_eq!(provider.count_path(CHAT), 1);
    assert_eq!(provider.count_path("/alt/v1/chat/completions"), 0);
}

/// Every target fails before output: the request fails typed, naming each
/// target, after one send to each.
#[tokio::test]
async fn fo_every_target_overloaded_fails_naming_each() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(CHAT, vec![overloaded()])
            .path("/b/v1/chat/completions", vec![overloaded()])
            .path("/c/v1/chat/completions", vec![overloaded()]),
    )
    .await
    .unwrap();
    let mut layer = RecoveryLayer::new(RecoveryPolicy::default());
    for label in ["b", "c"] {
        let alt = Alternate::new(label)
            .unwrap()
            .url(format!("/{label}/v1/chat/completions"))
            .unwrap();
        layer = layer.with_alternate(alt);
    }
    let (d, _) = call(layer, provider.url(CHAT)).await;
    assert_eq!(d.status, 529, "the last target's error response");
    let report = d.report.expect("report");
    assert_eq!(
        report.outcome,
        Some(Outcome::AlternatesExhausted {
            attempts: 3,
            targets: vec!["primary".into(), "b".into(), "c".into()],
        })
    );
    for path in [CHAT, "/b/v1/chat/completions", "/c/v1/chat/completions"] {
        assert_eq!(provider.count_path(path), 1, "{path}");
    }
}

/// One layer in front of two protocols (a gateway's upstream leg): each
/// call names its protocol, and each alternate serves only the requests
/// of its own. An Anthropic call whose primary is overloaded goes to the
/// Anthropic alternate, decoded as Anthropic, never to the OpenAI one.
#[tokio::test]
async fn fo_a_call_names_its_protocol_and_only_its_alternates_serve_it() {
    const MESSAGES: &str = "/v1/messages";
    let primary = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(MESSAGES, vec![overloaded()])
            .path(CHAT, vec![overloaded()]),
    )
    .await
    .unwrap();
    let claude = FaultProvider::start(
        ScriptSet::new(vec![]).path(MESSAGES, vec![sse("anthropic/happy.sse")]),
    )
    .await
    .unwrap();
    let openai = FaultProvider::start(
        ScriptSet::new(vec![]).path(CHAT, vec![sse("openai-chat/happy-usage.sse")]),
    )
    .await
    .unwrap();
    let layer = RecoveryLayer::new(RecoveryPolicy::default())
        .with_alternate(
            Alternate::new("openai-b")
                .unwrap()
                .url(openai.url(CHAT))
                .unwrap()
                .serving(ProtocolKind::OpenAiChat),
        )
        .with_alternate(
            Alternate::new("anthropic-b")
                .unwrap()
                .url(claude.url(MESSAGES))
                .unwrap()
                .serving(ProtocolKind::Anthropic),
        );
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    // The layer's own protocol (and the observer's) is OpenAI Chat.
    let svc = layer
        .with_protocol(ProtocolKind::OpenAiChat)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let mut req = Request::post(primary.url(MESSAGES))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    req.extensions_mut()
        .insert(recovery_core::call::RecoveryCall::new().with_protocol(ProtocolKind::Anthropic));
    let d = tokio::time::timeout(LIMIT, async {
        support::read_to_end(svc.clone().oneshot(req).await.expect("a response")).await
    })
    .await
    .expect("no hang");
    assert_eq!(d.status, 200);
    assert!(d.body_error.is_none(), "{:?}", d.body_error);
    assert_eq!(d.bytes, fixture("anthropic/happy.sse"));
    let report = d.report.expect("report");
    assert!(
        matches!(report.outcome, Some(Outcome::Completed { .. })),
        "decoded as Anthropic: {:?}",
        report.outcome
    );
    assert_eq!(report.served_by.as_deref(), Some("anthropic-b"));
    assert_eq!(openai.count(), 0, "the OpenAI alternate never serves it");
    assert_eq!(claude.count(), 1);

    // A call of the layer's own protocol uses the OpenAI alternate only.
    let req = Request::post(primary.url(CHAT))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let d = tokio::time::timeout(LIMIT, async {
        support::read_to_end(svc.oneshot(req).await.expect("a response")).await
    })
    .await
    .expect("no hang");
    assert_eq!(d.bytes, fixture("openai-chat/happy-usage.sse"));
    assert_eq!(d.report.unwrap().served_by.as_deref(), Some("openai-b"));
    assert_eq!(claude.count(), 1);
}
