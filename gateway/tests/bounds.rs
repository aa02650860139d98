//! Bounded against whoever connects: paths and methods that are never
//! forwarded, a trickled body that loses its slot at its deadline, the
//! request bodies held at once under one budget, reconnecting readers and
//! generations kept for absent clients capped.

mod support;

use std::time::Duration;

use recovery_tests::fault::FaultProvider;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `head` on a new connection and reads the answer to its end.
async fn raw(addr: std::net::SocketAddr, head: &str) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
        .await
        .expect("the gateway answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn dot_segments_empty_segments_and_backslashes_never_go_upstream() {
    let provider = FaultProvider::start(vec![stalled()]).await.unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    for path in [
        "/v1/../admin/chat/completions",
        "/v1/%2e%2e/admin",
        "/v1/%2E%2E/admin",
        "/v1/.%2e/admin",
        "/v1/./chat/completions",
        "/v1//chat/completions",
        "/v1/a%2f..%2fb",
    ] {
        let r = send(post(gw.url(path), CHAT_BODY)).await;
        assert_eq!(r.status, 400, "{path}");
        assert_eq!(r.json()["error"]["type"], "invalid_path", "{path}");
    }
    // A literal backslash and literal dot segments are sent raw: a client
    // library would normalise them first.
    for target in ["/v1/..\\admin", "/v1/../x", "/v1\\chat"] {
        let answer = raw(
            gw.local_addr(),
            &format!(
                "POST {target} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
            ),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{target}: {answer}");
    }
    assert_eq!(provider.count(), 0, "nothing was sent upstream");
    gw.shutdown().await;
}

#[tokio::test]
async fn connect_trace_and_foreign_absolute_targets_are_refused() {
    let provider = FaultProvider::start(vec![stalled()]).await.unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let addr = gw.local_addr();
    let connect = raw(
        addr,
        "CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(connect.starts_with("HTTP/1.1 405"), "{connect}");
    let trace = raw(
        addr,
        "TRACE /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(trace.starts_with("HTTP/1.1 405"), "{trace}");
    let foreign = raw(
        addr,
        "POST http://example.com/v1/chat/completions HTTP/1.1\r\nhost: example.com\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}",
    )
    .await;
    assert!(foreign.starts_with("HTTP/1.1 400"), "{foreign}");
    assert_eq!(provider.count(), 0);
    let own = raw(
        addr,
        &format!("GET http://{addr}/healthz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"),
    )
    .await;
    assert!(own.starts_with("HTTP/1.1 200"), "{own}");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_trickled_body_frees_its_slot_at_its_deadline() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.max_streams = 1;
    config.body_read_timeout = Duration::from_millis(300);
    let gw = gateway(config).await;
    let mut s = TcpStream::connect(gw.local_addr()).await.unwrap();
    // The head, then one byte of a 50-byte body, then nothing.
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{")
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(LIMIT, s.read(&mut answer))
        .await
        .expect("the gateway answers the trickle at its deadline")
        .unwrap();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    // The slot is free again: the next request is served.
    let ok = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(
        provider.count(),
        1,
        "the trickled request never went upstream"
    );
    assert!(gw.metrics().body_timeouts >= 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn reconnecting_readers_are_capped_per_stream_and_in_all() {
    let provider = FaultProvider::start(vec![stalled(), stalled()])
        .await
        .unwrap();
    let (mut config, _) = config(&provider);
    config.max_readers_per_stream = 1;
    config.max_readers = 2;
    let gw = gateway(config).await;
    let mut a = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    a.events(1).await;
    let mut b = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    b.events(1).await;
    let (sa, sb) = (a.stream_id(), b.stream_id());
    let mut ra = Live::open(get(gw.url(&format!("/streams/{sa}")))).await;
    assert_eq!(ra.status, 200);
    ra.events(1).await;
    let again = send(get(gw.url(&format!("/streams/{sa}")))).await;
    assert_eq!(again.status, 503, "one reconnect per stream");
    assert_eq!(again.json()["error"]["type"], "too_many_readers");
    assert_eq!(again.headers["retry-after"], "1");
    let mut rb = Live::open(get(gw.url(&format!("/streams/{sb}")))).await;
    assert_eq!(rb.status, 200);
    rb.events(1).await;
    let third = send(get(gw.url(&format!("/streams/{sb}")))).await;
    assert_eq!(third.status, 503, "two reconnects in all");
    // The first clients still read their streams to the end.
    provider.release_all();
    let rest = a.events(1).await;
    assert!(rest[0].contains("[DONE]"), "{rest:?}");
    gw.shutdown().await;
}

#[tokio::test]
async fn generations_kept_for_absent_clients_have_their_own_bounded_pool() {
    let provider = FaultProvider::start(vec![stalled(), stalled()])
        .await
        .unwrap();
    let (mut config, _) = config(&provider);
    config.max_kept_streams = 1;
    let gw = gateway(config).await;
    let mut a = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    a.events(1).await;
    let mut b = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    b.events(1).await;
    assert_eq!(gw.metrics().streams_active, 2);
    drop(a);
    drop(b);
    // One generation keeps its place; the other is cancelled at once, so
    // one upstream connection is left.
    tokio::time::timeout(LIMIT, provider.wait_until(|s| s.open_connections == 1))
        .await
        .expect("one generation was cancelled");
    provider.release_all();
    tokio::time::timeout(LIMIT, gw.wait_streams_idle())
        .await
        .expect("the kept one finished");
    gw.shutdown().await;
}

#[tokio::test]
async fn request_bodies_held_at_once_share_one_budget() {
    let provider = FaultProvider::start(vec![stalled(), happy()])
        .await
        .unwrap();
    let (mut config, _) = config(&provider);
    config.max_body_bytes = 3 << 20;
    config.max_held_body_bytes = 4 << 20;
    let gw = gateway(config).await;
    let body = vision_body(2);
    // The first request's body is held while its answer streams (for a
    // replay): 2 of the 4 MiB.
    let mut first = Live::open(post(gw.url(CHAT), &body)).await;
    assert_eq!(first.status, 200);
    first.events(1).await;
    provider.wait_for_stalls(1).await;
    // A second as large does not fit: shed at once, nothing forwarded.
    let shed = send(post(gw.url(CHAT), &body)).await;
    assert_eq!(shed.status, 503);
    assert_eq!(shed.headers["retry-after"], "1");
    assert_eq!(shed.json()["error"]["type"], "too_many_request_bytes");
    assert_eq!(provider.count(), 1);
    let metrics = send(get(gw.url("/metrics"))).await.text();
    assert!(
        metrics.contains("recovery_gateway_bound{name=\"max_held_body_bytes\"} 4194304"),
        "{metrics}"
    );
    provider.release(1);
    first.events(2).await;
    drop(first);
    tokio::time::timeout(LIMIT, gw.wait_streams_idle())
        .await
        .unwrap();
    // The first request's end gave its share back.
    let r = send(post(gw.url(CHAT), &body)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    gw.shutdown().await;
}
