//! `tower_recovery::https`'s HTTP/2 connections against a loopback h2c
//! server that takes one stream at a time on a connection:
//!
//! - lanes: a stream past a connection's bound goes over a new connection
//!   instead of waiting for the first to end, and a stream's place is freed
//!   when its body ends, even while the body is still held;
//! - keep-alive: behind a relay that goes silent (no FIN, no RST, as when a
//!   NAT forgets the flow), the held stream fails at the unanswered ping
//!   instead of waiting for bytes that never come, and the next stream
//!   goes over a new connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::BodyExt;
use recovery_tests::relay::SilentRelay;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower_recovery::ReplayBody;
use tower_recovery::https::{Http2, Http2Settings, HttpsClient, client_with};
use tower_service::Service;

const LIMIT: Duration = Duration::from_secs(20);

/// An HTTP/2-only server taking one stream at once per connection. A
/// request for `/hold` gets its head and a first chunk, then waits until
/// `release` is set; any other gets one chunk and its end. Counts the
/// connections it accepted.
async fn server(release: watch::Receiver<bool>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let release = release.clone();
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::Builder::new()
                    .max_concurrent_streams(1)
                    .handshake::<_, Bytes>(socket)
                    .await
                else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let mut release = release.clone();
                    tokio::spawn(async move {
                        let hold = request.uri().path() == "/hold";
                        let head = http::Response::builder().status(200).body(()).unwrap();
                        let Ok(mut send) = respond.send_response(head, false) else {
                            return;
                        };
                        let _ = send.send_data(Bytes::from_static(b"first\n"), !hold);
                        if hold {
                            let _ = release.wait_for(|r| *r).await;
                            let _ = send.send_data(Bytes::from_static(b"last\n"), true);
                        }
                    });
                }
            });
        }
    });
    (url, connections)
}

fn get(url: &str, path: &str) -> Request<ReplayBody> {
    let mut req = Request::get(format!("{url}{path}"))
        .body(ReplayBody::full(Bytes::new()))
        .unwrap();
    req.extensions_mut().insert(Http2::Always);
    req
}

async fn send(
    client: &mut HttpsClient,
    req: Request<ReplayBody>,
) -> http::Response<tower_recovery::https::ResponseBody> {
    tokio::time::timeout(LIMIT, client.call(req))
        .await
        .expect("a stream queued behind another")
        .expect("a response")
}

#[tokio::test]
async fn a_stream_past_the_bound_opens_another_connection() {
    let (release, held) = watch::channel(false);
    let (url, connections) = server(held).await;
    let mut client = client_with(Http2Settings {
        streams_per_connection: 1,
        ..Http2Settings::default()
    });
    let mut first = send(&mut client, get(&url, "/hold")).await;
    let chunk = first.body_mut().frame().await.unwrap().unwrap();
    assert_eq!(chunk.into_data().unwrap(), "first\n");
    // The server takes one stream per connection: a second stream on the
    // first connection would wait for the held one to end.
    let second = send(&mut client, get(&url, "/quick")).await;
    let body = tokio::time::timeout(LIMIT, second.into_body().collect())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body.to_bytes(), "first\n");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    release.send_replace(true);
    let rest = tokio::time::timeout(LIMIT, first.into_body().collect())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest.to_bytes(), "last\n");
}

#[tokio::test]
async fn a_body_at_its_end_frees_its_place_while_it_is_still_held() {
    let (_release, held) = watch::channel(false);
    let (url, connections) = server(held).await;
    let mut client = client_with(Http2Settings {
        streams_per_connection: 1,
        ..Http2Settings::default()
    });
    let mut first = send(&mut client, get(&url, "/quick")).await;
    while let Some(frame) = first.body_mut().frame().await {
        frame.unwrap();
    }
    // `first` is still alive, its stream ended: the next stream goes over
    // the same connection.
    let second = send(&mut client, get(&url, "/quick")).await;
    tokio::time::timeout(LIMIT, second.into_body().collect())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    drop(first);
}

#[tokio::test]
async fn a_connection_gone_silent_fails_its_stream_at_the_unanswered_ping_and_the_next_opens_another()
 {
    let (_release, held) = watch::channel(false);
    let (addr, _) = server(held).await;
    let relay = SilentRelay::start(addr.trim_start_matches("http://").to_owned())
        .await
        .unwrap();
    let mut client = client_with(Http2Settings {
        keep_alive_interval: Some(Duration::from_millis(100)),
        keep_alive_timeout: Duration::from_millis(100),
        ..Http2Settings::default()
    });

    let held = send(&mut client, get(relay.url(), "/hold")).await;
    let mut body = held.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, Bytes::from_static(b"first\n"));

    relay.go_silent();
    // Far past the ping's interval and timeout: reached only when nothing
    // finds the silent connection.
    let next = tokio::time::timeout(LIMIT, body.frame())
        .await
        .expect("a stream on a silent connection waited for bytes that never come");
    // hyper closes the connection at the unanswered ping: its streams
    // fail as a broken pipe.
    assert!(
        matches!(next, Some(Err(_))),
        "the stream must fail as a broken connection, got {next:?}"
    );

    let answer = send(&mut client, get(relay.url(), "/once")).await;
    let text = tokio::time::timeout(LIMIT, answer.into_body().collect())
        .await
        .unwrap()
        .unwrap()
        .to_bytes();
    assert_eq!(text, Bytes::from_static(b"first\n"));
    assert_eq!(
        relay.connections(),
        2,
        "the next stream opens a connection of its own"
    );
}
