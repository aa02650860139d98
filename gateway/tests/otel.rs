//! OpenTelemetry export from the binary: a loopback OTLP/HTTP receiver
//! decodes what the gateway sends with the protocol's own message types,
//! for a stream recovered by one replay before its first token.
#![cfg(feature = "otel")]

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{HistogramDataPoint, metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use recovery_tests::fault::{FaultProvider, ScriptSet, Write};
use support::*;
use tokio::net::TcpListener;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_recovery-gateway");

/// The client's trace and span ids, as its `traceparent` names them.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// What the receiver got: each POST's path and body.
type Received = Arc<Mutex<Vec<(String, Bytes)>>>;

/// An OTLP/HTTP receiver on 127.0.0.1: every export is kept and answered
/// with an empty (full-success) protobuf reply.
async fn receiver() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got: Received = Arc::default();
    let kept = Arc::clone(&got);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let kept = Arc::clone(&kept);
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let kept = Arc::clone(&kept);
                    async move {
                        let path = req.uri().path().to_owned();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        kept.lock().unwrap().push((path, body));
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (url, got)
}

fn text(v: &AnyValue) -> Option<&str> {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn int(v: &AnyValue) -> Option<i64> {
    match &v.value {
        Some(any_value::Value::IntValue(n)) => Some(*n),
        _ => None,
    }
}

fn boolean(v: &AnyValue) -> Option<bool> {
    match &v.value {
        Some(any_value::Value::BoolValue(b)) => Some(*b),
        _ => None,
    }
}

fn attrs(kv: &[KeyValue]) -> HashMap<&str, &AnyValue> {
    kv.iter()
        .filter_map(|a| Some((a.key.as_str(), a.value.as_ref()?)))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The one data point of the histogram `name` among `metrics`.
fn histogram<'a>(
    metrics: &'a [ExportMetricsServiceRequest],
    name: &str,
) -> Vec<&'a HistogramDataPoint> {
    metrics
        .iter()
        .flat_map(|r| &r.resource_metrics)
        .flat_map(|r| &r.scope_metrics)
        .flat_map(|s| &s.metrics)
        .filter(|m| m.name == name)
        .flat_map(|m| match &m.data {
            Some(metric::Data::Histogram(h)) => h.data_points.iter().collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect()
}

#[tokio::test]
async fn a_replayed_stream_exports_its_spans_and_metrics_in_one_trace() {
    let (otlp, received) = receiver().await;
    // The first answer's role chunk arrives at once and is held back; the
    // stream ends without a token, is replayed, and the second answer's
    // body starts 300 ms after its head, its first token with it; the rest
    // follows a second later.
    let happy = "openai-chat/happy-usage.sse";
    let whole = fixture(happy);
    let second_event_ends = whole
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w == b"\n\n")
        .nth(1)
        .map(|(i, _)| i + 2)
        .unwrap();
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        CHAT,
        vec![
            sse(Write::fixture("openai-chat/role-only-then-cut.sse")),
            sse(Write::fixture(happy)
                .range(0, second_event_ends)
                .delay_ms(300))
            .write(Write::fixture(happy)
                .range(second_event_ends, whole.len())
                .delay_ms(1000)),
        ],
    ))
    .await
    .unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["--listen", "127.0.0.1:0", "--otlp-endpoint", &otlp])
        .env("RECOVERY_GATEWAY_UPSTREAM", provider.base_url())
        .env_remove("RECOVERY_GATEWAY_CONFIG")
        // Exported at shutdown, all in one batch.
        .env("OTEL_METRIC_EXPORT_INTERVAL", "600000")
        .stderr(Stdio::null());
    let (mut child, addr) = listening::listening(command, LIMIT).await.unwrap();

    let mut req = post(format!("http://{addr}{CHAT}"), CHAT_BODY);
    req.headers_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CLIENT_SPAN}-01").parse().unwrap(),
    );
    let a = send(req).await;
    assert_eq!(a.status, 200);
    assert_eq!(without_ids(&a.text()).as_bytes(), &whole[..]);
    // A request the gateway refuses before the proxy has its span too.
    let refused = send(post(format!("http://{addr}{CHAT}"), "{not json")).await;
    assert_eq!(refused.status, 400);

    // Each upstream send carries its own span as the parent, in the
    // client's trace.
    let sent = provider.requests();
    assert_eq!(sent.len(), 2);
    let parents: Vec<String> = sent
        .iter()
        .map(|r| {
            let tp = std::str::from_utf8(r.header("traceparent").expect("traceparent upstream"))
                .unwrap()
                .to_owned();
            let parts: Vec<&str> = tp.split('-').collect();
            assert_eq!(parts.len(), 4, "{tp}");
            assert_eq!(parts[1], TRACE_ID, "{tp}");
            assert_ne!(parts[2], CLIENT_SPAN, "{tp}");
            parts[2].to_owned()
        })
        .collect();
    assert_ne!(parents[0], parents[1], "one span per send");

    let pid = child.id().expect("running").to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));

    let got = received.lock().unwrap().clone();
    let spans: Vec<Span> = got
        .iter()
        .filter(|(p, _)| p == "/v1/traces")
        .map(|(_, b)| ExportTraceServiceRequest::decode(b.clone()).expect("an OTLP trace export"))
        .flat_map(|r| r.resource_spans)
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans)
        .collect();
    let metrics: Vec<ExportMetricsServiceRequest> = got
        .iter()
        .filter(|(p, _)| p == "/v1/metrics")
        .map(|(_, b)| {
            ExportMetricsServiceRequest::decode(b.clone()).expect("an OTLP metrics export")
        })
        .collect();

    // The spans: server ← client's, GenAI request ← server, sends ← request.
    // A server span is named by its method (a path may hold a stream id).
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let servers = named("POST");
    assert_eq!(
        servers.len(),
        2,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let (server, refused): (Vec<&Span>, Vec<&Span>) = servers
        .into_iter()
        .partition(|s| hex(&s.trace_id) == TRACE_ID);
    let (server, refused) = (server[0], refused[0]);
    assert_eq!(hex(&server.parent_span_id), CLIENT_SPAN);
    let served = attrs(&server.attributes);
    assert_eq!(int(served["http.response.status_code"]), Some(200));
    assert_eq!(text(served["url.path"]), Some(CHAT));
    assert!(!served.contains_key("error.type"));
    let refusal = attrs(&refused.attributes);
    assert_eq!(int(refusal["http.response.status_code"]), Some(400));
    assert!(refused.parent_span_id.is_empty(), "a trace of its own");
    assert!(
        !refusal.contains_key("error.type"),
        "a client error is not the server's"
    );
    let chat = named("chat m");
    assert_eq!(chat.len(), 1);
    let chat = chat[0];
    // The server span covers the stream it served, to its last byte, not
    // only the head that went out with the first token (a second before).
    let ms = |ns: u64| ns / 1_000_000;
    assert!(
        ms(server.end_time_unix_nano) + 100 >= ms(chat.end_time_unix_nano),
        "server span [{}, {}] ms, GenAI span [{}, {}] ms",
        ms(server.start_time_unix_nano),
        ms(server.end_time_unix_nano),
        ms(chat.start_time_unix_nano),
        ms(chat.end_time_unix_nano),
    );
    assert_eq!(hex(&chat.trace_id), TRACE_ID);
    assert_eq!(chat.parent_span_id, server.span_id);
    let a = attrs(&chat.attributes);
    assert_eq!(text(a["gen_ai.operation.name"]), Some("chat"));
    assert_eq!(text(a["gen_ai.provider.name"]), Some("openai"));
    assert_eq!(text(a["gen_ai.request.model"]), Some("m"));
    assert_eq!(boolean(a["gen_ai.request.stream"]), Some(true));
    assert_eq!(int(a["http.request.resend_count"]), Some(1));
    assert_eq!(int(a["recovery.resends"]), Some(1));
    assert_eq!(int(a["recovery.resumes"]), Some(0));
    assert_eq!(boolean(a["recovery.committed"]), Some(true));
    assert_eq!(text(a["recovery.outcome"]), Some("completed"));
    assert_eq!(text(a["gen_ai.response.model"]), Some("m"));
    let reasons: Vec<&str> = match &a["gen_ai.response.finish_reasons"].value {
        Some(any_value::Value::ArrayValue(list)) => list.values.iter().filter_map(text).collect(),
        other => panic!("a string array: {other:?}"),
    };
    assert_eq!(reasons, ["stop"]);
    assert_eq!(int(a["gen_ai.usage.input_tokens"]), Some(9));
    assert_eq!(int(a["gen_ai.usage.output_tokens"]), Some(2));
    assert!(!a.contains_key("error.type"));
    let waited = int(a["recovery.time_to_first_chunk_ms"]).unwrap();
    assert!(waited >= 300, "measured after hold-back: {waited} ms");
    let sends = named("recovery.attempt");
    assert_eq!(sends.len(), 2);
    let mut ids: Vec<String> = sends.iter().map(|s| hex(&s.span_id)).collect();
    ids.sort();
    let mut upstream = parents.clone();
    upstream.sort();
    assert_eq!(ids, upstream, "each send's traceparent names its span");
    for s in &sends {
        assert_eq!(s.parent_span_id, chat.span_id);
    }
    let resends: Vec<Option<i64>> = sends
        .iter()
        .map(|s| {
            attrs(&s.attributes)
                .get("http.request.resend_count")
                .and_then(|v| int(v))
        })
        .collect();
    assert!(
        resends.contains(&Some(1)) && resends.contains(&None),
        "{resends:?}"
    );

    // The metrics: one request, its first chunk after hold-back, its usage.
    let ttfc = histogram(&metrics, "gen_ai.client.inference.time_to_first_chunk");
    assert_eq!(ttfc.len(), 1);
    assert_eq!(ttfc[0].count, 1);
    let first = ttfc[0].sum.unwrap();
    assert!(first >= 0.3, "time to first chunk after hold-back: {first}");
    let p = attrs(&ttfc[0].attributes);
    assert_eq!(text(p["gen_ai.request.model"]), Some("m"));
    assert_eq!(text(p["gen_ai.provider.name"]), Some("openai"));
    let duration = histogram(&metrics, "gen_ai.client.inference.duration");
    assert_eq!(duration.len(), 1);
    assert_eq!(duration[0].count, 1);
    assert!(duration[0].sum.unwrap() >= first);
    let d = attrs(&duration[0].attributes);
    assert!(!d.contains_key("error.type"));
    assert_eq!(
        text(d["gen_ai.response.model"]),
        Some("m"),
        "the answering model"
    );
    let tokens = histogram(&metrics, "gen_ai.client.token.usage");
    let by_type: HashMap<&str, f64> = tokens
        .iter()
        .map(|d| {
            let a = attrs(&d.attributes);
            assert_eq!(text(a["gen_ai.response.model"]), Some("m"));
            let kind = text(a["gen_ai.token.type"]).unwrap();
            (kind, d.sum.unwrap())
        })
        .collect();
    assert_eq!(by_type.get("input"), Some(&9.0));
    assert_eq!(by_type.get("output"), Some(&2.0));
}
