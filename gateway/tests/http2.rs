//! HTTP/2 upstream: a route with `http2 = true` sends over one pooled h2c
//! connection (prior knowledge) to a loopback HTTP/2-only server, 100
//! concurrent streams on it; the default upstream stays on HTTP/1.1.

mod support;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use recovery_gateway::config::{Http2, Route, RouteProtocol};
use recovery_tests::fault::FaultProvider;
use support::*;

const HAPPY: &str = "openai-chat/happy-usage.sse";

/// An HTTP/2-only server (prior knowledge) answering every request with
/// the fixture as SSE; counts the connections it accepted.
async fn h2_server() -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    let body = Bytes::from(fixture(HAPPY));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let body = body.clone();
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(Full::new(body))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, connections)
}

#[tokio::test]
async fn a_route_with_http2_carries_100_streams_on_one_connection() {
    let (h2_url, connections) = h2_server().await;
    // The default upstream (HTTP/1.1) is never used here.
    let provider = FaultProvider::start(vec![]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.max_streams = 256;
    config.routes = vec![Route {
        prefix: "/h2".into(),
        upstream: h2_url.parse().unwrap(),
        strip_prefix: true,
        protocol: RouteProtocol::Auto,
        resumable: true,
        headers: http::HeaderMap::new(),
        credential_header: None,
        http2: Http2::Always,
        declared: recovery_gateway::config::Declared::default(),
    }];
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
}
