//! HTTP/2 upstream: a route with `http2 = true` sends over one pooled h2c
//! connection (prior knowledge) to a loopback HTTP/2-only server, 100
//! concurrent streams on it; the default upstream stays on HTTP/1.1.
//! Streams past `http2_streams_per_connection` open another connection
//! instead of waiting behind the server's concurrent-stream limit.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use futures_util::StreamExt;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use recovery_gateway::config::{Http2, Route, RouteProtocol};
use recovery_tests::fault::FaultProvider;
use recovery_tests::relay::SilentRelay;
use support::*;

const HAPPY: &str = "openai-chat/happy-usage.sse";

/// An HTTP/2-only server (prior knowledge) that takes `max` streams at
/// once on a connection and answers every request with `answer()`; counts
/// the connections it accepted.
async fn h2_server<B>(
    max: u32,
    answer: impl Fn() -> Response<B> + Clone + Send + Sync + 'static,
) -> (String, Arc<AtomicUsize>)
where
    B: hyper::body::Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::SeqCst);
            let answer = answer.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let answer = answer();
                    async move { Ok::<_, Infallible>(answer) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(max)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, connections)
}

/// A route to `upstream` at `/h2`, HTTP/2 only.
fn h2_route(upstream: &str) -> Route {
    Route {
        prefix: "/h2".into(),
        upstream: upstream.parse().unwrap(),
        strip_prefix: true,
        protocol: RouteProtocol::Auto,
        resumable: true,
        headers: http::HeaderMap::new(),
        credential_header: None,
        http2: Http2::Always,
        declared: recovery_gateway::config::Declared::default(),
    }
}

#[tokio::test]
async fn a_route_with_http2_carries_100_streams_on_one_connection() {
    let body = Bytes::from(fixture(HAPPY));
    let (h2_url, connections) = h2_server(200, move || {
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Full::new(body.clone()))
            .unwrap()
    })
    .await;
    // The default upstream (HTTP/1.1) is never used here.
    let provider = FaultProvider::start(vec![]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.max_streams = 256;
    config.routes = vec![h2_route(&h2_url)];
    let gw = gateway(config).await;
    let url = gw.url(&format!("/h2{CHAT}"));
    let answers =
        futures_util::future::join_all((0..100).map(|_| send(post(url.clone(), CHAT_BODY)))).await;
    for a in &answers {
        assert_eq!(a.status, 200);
        assert_eq!(without_ids(&a.text()).as_bytes(), &fixture(HAPPY)[..]);
    }
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "every stream on one HTTP/2 connection"
    );
    assert_eq!(provider.count(), 0);
    gw.shutdown().await;
}

#[test]
fn http2_is_read_from_the_config_file() {
    let text = "http2 = \"auto\"\n\
        [[routes]]\nprefix = \"/a\"\nupstream = \"https://api.anthropic.com\"\nhttp2 = true\n\
        [[routes]]\nprefix = \"/b\"\nupstream = \"https://api.openai.com\"\n";
    let c = recovery_gateway::config::from_toml(text).unwrap();
    assert_eq!(c.upstream_http2, Http2::Auto);
    let mode = |p: &str| c.routes.iter().find(|r| r.prefix == p).unwrap().http2;
    assert_eq!(mode("/a"), Http2::Always);
    assert_eq!(mode("/b"), Http2::Off);
    let err = recovery_gateway::config::from_toml("http2 = \"maybe\"\n").unwrap_err();
    assert!(err.to_string().contains("http2"), "{err}");
    assert_eq!(c.http2_streams_per_connection, 100);
    let c = recovery_gateway::config::from_toml("http2_streams_per_connection = 8\n").unwrap();
    assert_eq!(c.http2_streams_per_connection, 8);
    for bad in [0, 65_537] {
        let err =
            recovery_gateway::config::from_toml(&format!("http2_streams_per_connection = {bad}\n"))
                .unwrap_err();
        assert!(
            err.to_string()
                .contains("http2_streams_per_connection must be from 1 to 65536"),
            "{err}"
        );
    }
}

#[test]
fn http2_keep_alive_ms_sets_the_ping_after_silence_or_turns_it_off() {
    let c = recovery_gateway::config::from_toml("").unwrap();
    assert_eq!(c.http2_keep_alive, Some(std::time::Duration::from_secs(30)));
    let c = recovery_gateway::config::from_toml("http2_keep_alive_ms = 5000\n").unwrap();
    assert_eq!(c.http2_keep_alive, Some(std::time::Duration::from_secs(5)));
    let c = recovery_gateway::config::from_toml("http2_keep_alive_ms = \"off\"\n").unwrap();
    assert_eq!(c.http2_keep_alive, None);
    for (bad, says) in [
        (
            "0",
            "http2_keep_alive_ms: 0 is not a duration; use \"off\" to turn it off",
        ),
        (
            "\"soon\"",
            "http2_keep_alive_ms: \"soon\" is not a number of milliseconds or \"off\"",
        ),
    ] {
        let err = recovery_gateway::config::from_toml(&format!("http2_keep_alive_ms = {bad}\n"))
            .unwrap_err();
        assert!(err.to_string().contains(says), "{err}");
    }
}

/// An answer of one text event, then held until `release` moves past the
/// value it had when the request came, then the finish and `[DONE]`.
fn held_answer(
    release: &tokio::sync::watch::Receiver<u32>,
) -> Response<impl hyper::body::Body<Data = Bytes, Error = Infallible> + use<>> {
    let mut release = release.clone();
    let seen = *release.borrow();
    let chunk = |s: &str| Ok::<_, Infallible>(hyper::body::Frame::data(Bytes::from(s.to_owned())));
    let first = chunk(concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",",
        "\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n"
    ));
    let last = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,",
        "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},",
        "\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n"
    );
    let rest = futures_util::stream::once(async move {
        let _ = release.wait_for(|v| *v > seen).await;
        chunk(last)
    });
    let body = futures_util::stream::once(async move { first }).chain(rest);
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(http_body_util::StreamBody::new(body))
        .unwrap()
}

#[tokio::test]
async fn streams_past_a_connections_bound_open_another_connection() {
    let (release, held) = tokio::sync::watch::channel(0);
    let (h2_url, connections) = h2_server(10, move || held_answer(&held)).await;
    let provider = FaultProvider::start(vec![]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.http2_streams_per_connection = 10;
    config.routes = vec![h2_route(&h2_url)];
    let gw = gateway(config).await;
    let url = gw.url(&format!("/h2{CHAT}"));
    // 25 streams held open at once: each gets its first text while all
    // are held, which a stream queued behind the server's limit of 10
    // would not.
    let mut live = futures_util::future::join_all((0..25).map(|_| async {
        let mut l = Live::open(post(url.clone(), CHAT_BODY)).await;
        assert_eq!(l.status, 200);
        let first = l.events(1).await;
        assert!(first[0].contains("Hello"), "{first:?}");
        l
    }))
    .await;
    assert_eq!(
        connections.load(Ordering::SeqCst),
        3,
        "25 streams at 10 per connection"
    );
    release.send_replace(1);
    for l in &mut live {
        let rest = l.events(2).await;
        assert!(rest[1].contains("[DONE]"), "{rest:?}");
    }
    // The places were freed: the next streams go over the connections
    // there are.
    let again = futures_util::future::join_all((0..10).map(|_| async {
        let mut l = Live::open(post(url.clone(), CHAT_BODY)).await;
        l.events(1).await;
        l
    }))
    .await;
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    release.send_replace(2);
    drop(again);
    assert_eq!(provider.count(), 0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_silent_upstream_connection_is_found_by_its_ping_and_its_stream_ends_typed() {
    let (release, held) = tokio::sync::watch::channel(0);
    let (h2_url, _) = h2_server(100, move || held_answer(&held)).await;
    let relay = SilentRelay::start(h2_url.trim_start_matches("http://").to_owned())
        .await
        .unwrap();
    let provider = FaultProvider::start(vec![]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.http2_keep_alive = Some(std::time::Duration::from_millis(100));
    config.routes = vec![h2_route(relay.url())];
    let gw = gateway(config).await;
    let url = gw.url(&format!("/h2{CHAT}"));

    let mut live = Live::open(post(url.clone(), CHAT_BODY)).await;
    assert_eq!(live.status, 200);
    assert!(live.events(1).await[0].contains("Hello"));
    relay.go_silent();
    // The idle timeout is 5 min: within `LIMIT`, only the unanswered ping
    // ends the stream.
    let end = live.events(1).await;
    assert!(
        end[0].contains("interrupted after commit"),
        "a typed interruption: {end:?}"
    );

    // The next stream does not go to the silent connection.
    let mut next = Live::open(post(url, CHAT_BODY)).await;
    assert!(next.events(1).await[0].contains("Hello"));
    assert_eq!(relay.connections(), 2);
    release.send_replace(1);
    assert!(next.events(2).await[1].contains("[DONE]"));
    gw.shutdown().await;
}
