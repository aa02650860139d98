//! Operations over real sockets: health, metrics, limits, bad input,
//! slow clients and credentials.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use recovery_tests::fault::{FaultProvider, Script, Write};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn healthz_and_metrics_move() {
    let provider = FaultProvider::start(vec![Script::status(503), happy()])
        .await
        .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let h = send(get(gw.url("/healthz"))).await;
    assert_eq!(h.status, 200);
    assert_eq!(h.json(), serde_json::json!({"status": "ok"}));
    let before = send(get(gw.url("/metrics"))).await;
    assert!(before.text().contains("recovery_gateway_requests_total 0"));
    send(post(gw.url(CHAT), CHAT_BODY)).await;
    let after = send(get(gw.url("/metrics"))).await;
    assert_eq!(after.status, 200);
    assert!(
        after.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = after.text();
    for line in [
        "recovery_gateway_requests_total 1",
        "recovery_gateway_attempts_total 2",
        "recovery_gateway_resends_total 1",
        "recovery_gateway_commits_total 1",
        "recovery_gateway_outcomes_total{outcome=\"completed\"} 1",
        "recovery_gateway_resumes_total 0",
        "recovery_gateway_downstream_reconnects_total 0",
        "recovery_gateway_streams_active 0",
        "gen_ai_client_inference_duration_seconds_count 1",
        "gen_ai_client_inference_duration_seconds_bucket{le=\"+Inf\"} 1",
        "gen_ai_client_inference_duration_seconds_count{error_type=\"exhausted\"} 0",
        "gen_ai_client_inference_time_to_first_chunk_seconds_count 1",
        // Six events: five gaps between them.
        "gen_ai_client_inference_time_per_output_chunk_seconds_count 5",
        "gen_ai_client_inference_time_per_output_chunk_seconds_bucket{le=\"+Inf\"} 5",
        "gen_ai_client_token_usage_count{gen_ai_token_type=\"input\"} 1",
        "gen_ai_client_token_usage_sum{gen_ai_token_type=\"input\"} 9",
        "gen_ai_client_token_usage_sum{gen_ai_token_type=\"output\"} 2",
        "gen_ai_client_token_usage_bucket{gen_ai_token_type=\"output\",le=\"1\"} 0",
        "gen_ai_client_token_usage_bucket{gen_ai_token_type=\"output\",le=\"4\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    // The first chunk came after the replay, and before the end.
    let sum = |name: &str| -> f64 {
        let prefix = format!("{name}_sum ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap()
            .parse()
            .unwrap()
    };
    let first = sum("gen_ai_client_inference_time_to_first_chunk_seconds");
    let total = sum("gen_ai_client_inference_duration_seconds");
    assert!(
        first > 0.0 && first <= total,
        "first {first} s, total {total} s"
    );
    let wrong = send(post(gw.url("/healthz"), "{}")).await;
    assert_eq!(wrong.status, 405);
    gw.shutdown().await;
}

#[tokio::test]
async fn oversized_and_invalid_bodies_are_refused_before_the_upstream() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.max_body_bytes = 64;
    let gw = gateway(config).await;
    let big = format!(r#"{{"pad":"{}"}}"#, "x".repeat(100));
    let r = send(post(gw.url(CHAT), &big)).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["type"], "request_too_large");
    let r = send(post(gw.url(CHAT), "{not json")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_json");
    // JSON is UTF-8, inside a string too.
    let mut latin1 = post(gw.url(CHAT), "");
    *latin1.body_mut() = Full::new(Bytes::from_static(b"{\"model\":\"caf\xe9\"}"));
    let r = send(latin1).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_json");
    assert_eq!(provider.count(), 0, "nothing was forwarded");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_as_large_as_providers_take_is_forwarded_by_default() {
    // 24 MiB: over the 8 MiB this gateway once refused, under the 32 MB
    // Anthropic's Messages API takes and the 50 MB of OpenAI's images.
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    let defaults = recovery_gateway::Config::default();
    config.max_body_bytes = defaults.max_body_bytes;
    config.max_held_body_bytes = defaults.max_held_body_bytes;
    let gw = gateway(config).await;
    let body = vision_body(24);
    let r = send(post(gw.url(CHAT), &body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        provider.requests()[0].body == body.as_bytes(),
        "the body as sent"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_batch_declared_over_the_body_cap_streams_as_an_upload() {
    let provider = FaultProvider::start(vec![
        Script::ok()
            .header("content-type", "application/json")
            .write(Write::text(r#"{"id":"msgbatch_1","type":"message_batch"}"#)),
    ])
    .await
    .unwrap();
    let (mut config, _) = config(&provider);
    config.max_body_bytes = 1 << 20;
    let gw = gateway(config).await;
    // A batch of requests in one JSON body (Anthropic takes 256 MB): not a
    // generation, so it is sent once as it arrives, under the upload cap.
    let batch = format!(
        r#"{{"requests":[{{"custom_id":"a","params":{{"model":"m","max_tokens":8,"messages":[{{"role":"user","content":"{}"}}]}}}}]}}"#,
        "x".repeat(3 << 20)
    );
    let r = send(post(gw.url("/v1/messages/batches"), &batch)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "msgbatch_1");
    assert!(
        provider.requests()[0].body == batch.as_bytes(),
        "the batch as sent"
    );
    // A generation as large is still refused whole.
    let refused = send(post(gw.url(CHAT), &vision_body(3))).await;
    assert_eq!(refused.status, 413);
    gw.shutdown().await;
}

#[tokio::test]
async fn no_route_without_an_upstream_is_a_json_404() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.upstream = None;
    let gw = gateway(config).await;
    let r = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "no_route");
    gw.shutdown().await;
}

#[tokio::test]
async fn beyond_max_streams_is_503_with_retry_after() {
    let provider = FaultProvider::start(vec![
        Script::ok()
            .header("content-type", "text/event-stream")
            .write(Write::text(
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
            ))
            .write(Write::stall())
            .write(Write::text("data: [DONE]\n\n")),
    ])
    .await
    .unwrap();
    let (mut config, _) = config(&provider);
    config.max_streams = 1;
    let gw = gateway(config).await;
    let mut first = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    first.events(1).await;
    let second = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(second.status, 503);
    assert_eq!(second.headers["retry-after"], "1");
    assert_eq!(second.json()["error"]["type"], "too_many_streams");
    assert_eq!(provider.count(), 1);
    provider.release_all();
    drop(first);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_slow_loris_connection_is_closed() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.header_read_timeout = Duration::from_millis(200);
    let gw = gateway(config).await;
    let mut s = TcpStream::connect(gw.local_addr()).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    // The head is never finished: only the gateway can end this read.
    let read = tokio::time::timeout(LIMIT, s.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the gateway closed the connection");
    assert_eq!(provider.count(), 0);
    gw.shutdown().await;
}

#[tokio::test]
async fn credentials_reach_the_upstream_untouched_and_never_the_logs() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (config, lines) = config(&provider);
    let gw = gateway(config).await;
    let req = Request::post(gw.url(&format!("{CHAT}?api-version=1")))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-live-SECRET-4242")
        .header("x-api-key", "anthropic-SECRET-77")
        .header("connection", "keep-alive")
        .body(Full::new(Bytes::from_static(CHAT_BODY.as_bytes())))
        .unwrap();
    let a = send(req).await;
    assert_eq!(a.status, 200);
    let got = &provider.requests()[0];
    assert_eq!(got.target, format!("{CHAT}?api-version=1"), "query kept");
    assert_eq!(
        got.header("authorization"),
        Some(&b"Bearer sk-live-SECRET-4242"[..])
    );
    assert_eq!(got.header("x-api-key"), Some(&b"anthropic-SECRET-77"[..]));
    assert_eq!(&got.body[..], CHAT_BODY.as_bytes());
    gw.shutdown().await;
    let lines = lines.lock().unwrap();
    assert!(lines.len() >= 3, "{lines:?}");
    for line in lines.iter() {
        assert!(!line.contains("SECRET"), "{line}");
        assert!(!line.contains("api-version"), "no query in logs: {line}");
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v["ts"].is_string() && v["level"].is_string() && v["msg"].is_string());
    }
    // A stream is named by a short digest, never by its id: whoever
    // reads the logs cannot reconnect to it.
    let id = a.stream_id();
    assert!(lines.iter().any(|l| l.contains("\"stream\"")));
    for line in lines.iter() {
        assert!(!line.contains(&id), "the stream id in a log line: {line}");
        assert!(!line.contains(&id[..8]), "a prefix of the id: {line}");
    }
    assert!(lines.iter().any(|l| l.contains("\"logical_id\"")));
}

/// A stream the gateway passes through (Ollama's NDJSON is never
/// numbered; an SSE stream whose client turned resumption off) counts in
/// `/metrics` too: its token use at its end, and the time between its
/// events, event by event as for a numbered stream, though each arrives
/// in one write here.
#[tokio::test]
async fn a_passed_through_stream_counts_its_tokens_and_each_event() {
    let provider = FaultProvider::start(vec![
        Script::ok()
            .header("content-type", "application/x-ndjson")
            .write(Write::fixture("ollama/chat-happy.ndjson")),
        happy(),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(
        gw.url("/api/chat"),
        r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}]}"#,
    ))
    .await;
    assert_eq!(a.status, 200);
    let ndjson = fixture("ollama/chat-happy.ndjson");
    assert_eq!(a.text().as_bytes(), &ndjson[..]);
    let text = send(get(gw.url("/metrics"))).await.text();
    let lines = ndjson
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count();
    assert!(lines > 2);
    for line in [
        "gen_ai_client_token_usage_count{gen_ai_token_type=\"input\"} 1".to_owned(),
        "gen_ai_client_token_usage_sum{gen_ai_token_type=\"input\"} 9".to_owned(),
        "gen_ai_client_token_usage_sum{gen_ai_token_type=\"output\"} 2".to_owned(),
        format!(
            "gen_ai_client_inference_time_per_output_chunk_seconds_count {}",
            lines - 1
        ),
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }

    let mut req = post(gw.url(CHAT), CHAT_BODY);
    req.headers_mut()
        .insert("x-recovery-resumable", "off".parse().unwrap());
    let b = send(req).await;
    assert_eq!(b.status, 200);
    assert_eq!(
        b.text().as_bytes(),
        &fixture("openai-chat/happy-usage.sse")[..],
        "passed through as it came"
    );
    let text = send(get(gw.url("/metrics"))).await.text();
    // Six more events: five more gaps.
    let line = format!(
        "gen_ai_client_inference_time_per_output_chunk_seconds_count {}",
        lines - 1 + 5
    );
    assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    gw.shutdown().await;
}
