//! With the `tracing` feature, every logical request gets a
//! `recovery.request` span and every attempt a `recovery.attempt` span; a
//! resend carries the OpenTelemetry attribute `http.request.resend_count`;
//! the request span carries the GenAI conventions' name and attributes.
#![cfg(feature = "tracing")]

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_tests::spans::Spans;
use tower::{Layer, Service, ServiceExt};
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody};
use tracing_subscriber::layer::SubscriberExt;

#[derive(Clone)]
struct FailOnce(Arc<AtomicU32>);

impl Service<Request<ReplayBody>> for FailOnce {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<ReplayBody>) -> Self::Future {
        let n = self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Ok(if n == 0 {
                Response::builder()
                    .status(503)
                    .body(Full::default())
                    .unwrap()
            } else {
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(Full::new(Bytes::from_static(
                        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
                    )))
                    .unwrap()
            })
        })
    }
}

#[tokio::test(start_paused = true)]
async fn request_and_attempt_spans_carry_the_resend_count() {
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let svc = RecoveryLayer::new(RecoveryPolicy::default())
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(FailOnce(Arc::default())));
    let resp = svc
        .oneshot(
            Request::post("http://mock/")
                .body(Full::new(Bytes::from_static(
                    br#"{"model":"gpt-4o-mini","stream":true,"messages":[]}"#,
                )))
                .unwrap(),
        )
        .await
        .unwrap();
    resp.into_body().collect().await.unwrap();
    let spans = spans.all();
    let names: Vec<&str> = spans.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["recovery.request", "recovery.attempt", "recovery.attempt"]
    );
    let field = |i: usize, key: &str| {
        spans[i]
            .1
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    assert!(field(0, "recovery.logical_id").is_some(), "{spans:?}");
    assert_eq!(
        field(1, "http.request.resend_count"),
        None,
        "not on the first send"
    );
    assert_eq!(field(2, "http.request.resend_count").as_deref(), Some("1"));
    assert_eq!(field(2, "recovery.attempt").as_deref(), Some("2"));
    // The request span, as the OpenTelemetry GenAI conventions name and
    // describe it, with what the request ended with.
    assert_eq!(
        field(0, "otel.name").as_deref(),
        Some("\"chat gpt-4o-mini\"")
    );
    assert_eq!(
        field(0, "gen_ai.operation.name").as_deref(),
        Some("\"chat\"")
    );
    assert_eq!(
        field(0, "gen_ai.provider.name").as_deref(),
        Some("\"openai\"")
    );
    assert_eq!(
        field(0, "gen_ai.request.model").as_deref(),
        Some("\"gpt-4o-mini\"")
    );
    assert_eq!(field(0, "gen_ai.request.stream").as_deref(), Some("true"));
    assert_eq!(field(0, "http.request.resend_count").as_deref(), Some("1"));
    assert_eq!(field(0, "recovery.resends").as_deref(), Some("1"));
    assert_eq!(field(0, "recovery.committed").as_deref(), Some("true"));
    assert_eq!(
        field(0, "recovery.outcome").as_deref(),
        Some("\"completed\"")
    );
    assert_eq!(field(0, "error.type"), None);
}
