//! The resumable downstream over real sockets: a client that leaves and
//! comes back gets the rest of the stream from the log, without gap or
//! duplicate, while the upstream generation went on once.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_core::report::SeamStrategy;
use recovery_tests::fault::{FaultProvider, Script, Write};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower_layer::Layer;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReportHandle};
use tower_service::Service;

const NAME: &str = "openai-chat/happy-usage.sse";

/// The chat fixture with a stall after its 4th event: the gateway has
/// sent events 1–4 and waits for the test to release the rest.
fn stalled_after_4() -> (Script, Vec<u8>) {
    let full = fixture(NAME);
    let at = after_event(&full, 4);
    let script = Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::fixture(NAME).range(0, at))
        .write(Write::stall())
        .write(Write::fixture(NAME).range(at, full.len()));
    (script, full)
}

fn reconnect(url: String, last_event_id: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", AUTH)
        .header("last-event-id", last_event_id)
        .body(Full::new(Bytes::from_static(CHAT_BODY.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn a_client_that_left_resumes_with_last_event_id_without_gap_or_duplicate() {
    let (script, full) = stalled_after_4();
    let provider = FaultProvider::start(vec![script]).await.unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;

    let mut live = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(live.status, 200);
    let sid = live.stream_id();
    assert!(sid.len() >= 16, "at least 96 random bits: {sid}");
    let first = live.events(3).await;
    let ids: Vec<_> = first.iter().filter_map(|e| event_id(e)).collect();
    assert_eq!(ids, [1, 2, 3].map(|n| format!("{sid}:{n}")));
    drop(live);

    // Nobody is connected now: the rest of the generation still happens.
    provider.wait_for_stalls(1).await;
    provider.release(1);
    tokio::time::timeout(LIMIT, gw.wait_streams_idle())
        .await
        .expect("the generation finished with nobody reading");

    let rest = send(reconnect(gw.url(CHAT), &format!("{sid}:3"))).await;
    assert_eq!(rest.status, 200);
    assert_eq!(rest.stream_id(), sid);
    assert_eq!(rest.headers["content-type"], "text/event-stream");
    let rest_events = events(&rest.text());
    assert_eq!(
        event_id(&rest_events[0]),
        Some(format!("{sid}:4")),
        "no gap"
    );
    let whole = first.concat() + &rest.text();
    assert_eq!(
        without_ids(&whole).as_bytes(),
        &full[..],
        "the two halves are the uninterrupted stream"
    );
    assert_eq!(provider.count(), 1, "the upstream made exactly one request");
    assert_eq!(gw.metrics().downstream_reconnects, 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn streams_after_n_serves_the_same_rest_and_unknown_ids_are_404() {
    let provider = FaultProvider::start(vec![
        Script::ok()
            .header("content-type", "text/event-stream")
            .write(Write::fixture(NAME)),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(CHAT), CHAT_BODY)).await;
    let sid = a.stream_id();
    let all = events(&a.text());

    let rest = send(get(gw.url(&format!("/streams/{sid}?after=2")))).await;
    assert_eq!(rest.status, 200);
    assert_eq!(rest.stream_id(), sid);
    assert_eq!(rest.text(), all[2..].concat(), "exactly the events after 2");
    let whole = send(get(gw.url(&format!("/streams/{sid}")))).await;
    assert_eq!(whole.text(), a.text(), "after=0 is the whole stream");

    let unknown = recovery_gateway::new_stream_id();
    for req in [
        get(gw.url(&format!("/streams/{unknown}?after=1"))),
        reconnect(gw.url(CHAT), &format!("{unknown}:1")),
    ] {
        let r = send(req).await;
        assert_eq!(r.status, 404);
        assert_eq!(r.json()["error"]["type"], "stream_not_found");
    }
    assert_eq!(provider.count(), 1, "a reconnect never goes upstream");
    gw.shutdown().await;
}

#[tokio::test]
async fn nobody_reading_past_the_keep_generating_window_cancels_the_upstream_read() {
    let (script, _) = stalled_after_4();
    let provider = FaultProvider::start(vec![script]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.keep_generating = Duration::from_millis(100);
    let gw = gateway(config).await;

    let mut live = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    let sid = live.stream_id();
    live.events(3).await;
    provider.wait_for_stalls(1).await;
    assert_eq!(provider.open_connections(), 1);
    drop(live);

    // The stall is never released: only the gateway can end the read.
    tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .expect("the upstream connection was closed by the gateway");
    tokio::time::timeout(LIMIT, gw.wait_streams_idle())
        .await
        .unwrap();
    assert_eq!(gw.metrics().cancelled, 1);

    // A late reader is told, in the protocol's words, that it was cut.
    let rest = send(reconnect(gw.url(CHAT), &format!("{sid}:3"))).await;
    let evs = events(&rest.text());
    let last = evs.last().unwrap();
    let message = data(last)["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("keep-generating"), "{message}");
    assert_eq!(event_id(&evs[0]), Some(format!("{sid}:4")));
    gw.shutdown().await;
}

#[tokio::test]
async fn while_a_reconnected_client_reads_the_generation_goes_to_its_end() {
    let (script, full) = stalled_after_4();
    let provider = FaultProvider::start(vec![script]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.keep_generating = Duration::from_millis(50);
    let gw = gateway(config).await;
    let mut live = Live::open(post(gw.url(CHAT), CHAT_BODY)).await;
    let sid = live.stream_id();
    let first = live.events(4).await;
    // The second reader joins before the first leaves: someone always reads.
    let mut second = Live::open(reconnect(gw.url(CHAT), &format!("{sid}:4"))).await;
    drop(live);
    provider.wait_for_stalls(1).await;
    // Well past the window: the reader on the log keeps the stream alive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(provider.open_connections(), 1, "still generating");
    provider.release(1);
    let rest = second.events(2).await;
    assert_eq!(
        without_ids(&(first.concat() + &rest.concat())).as_bytes(),
        &full[..]
    );
    gw.shutdown().await;
}

/// A TCP proxy that forwards one connection until the response passed the
/// end of the event with id `<stream>:3`, then cuts both sides; later
/// connections pass whole.
async fn cutting_proxy(target: std::net::SocketAddr) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut client, _)) = listener.accept().await {
            let cut = std::mem::take(&mut first);
            tokio::spawn(async move {
                let mut upstream = TcpStream::connect(target).await.unwrap();
                let (mut cr, mut cw) = client.split();
                let (mut ur, mut uw) = upstream.split();
                let up = async {
                    let _ = tokio::io::copy(&mut cr, &mut uw).await;
                    let _ = uw.shutdown().await;
                };
                let down = async {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = match ur.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let start = seen.len();
                        seen.extend_from_slice(&buf[..n]);
                        let end = if cut { cut_point(&seen) } else { None };
                        let upto = end.map_or(seen.len(), |e| e);
                        if cw.write_all(&seen[start..upto.max(start)]).await.is_err() {
                            return;
                        }
                        if end.is_some() {
                            return;
                        }
                    }
                };
                tokio::select! {
                    () = up => {}
                    () = down => {}
                }
                // Dropping both sockets here is the cut.
            });
        }
    });
    addr
}

/// Where the event carrying id `…:3` ends in `seen`, once it arrived.
fn cut_point(seen: &[u8]) -> Option<usize> {
    let text = String::from_utf8_lossy(seen);
    let at = text.find(":3\n")?;
    text[at..].find("\n\n").map(|i| at + i + 2)
}

#[tokio::test]
async fn the_projects_tower_client_resumes_through_a_cut_with_last_event_id() {
    let provider = FaultProvider::start(vec![
        Script::ok()
            .header("content-type", "text/event-stream")
            .write(Write::fixture(NAME).split_lines()),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let proxy = cutting_proxy(gw.local_addr()).await;

    let client = client_for_replay();
    let events_seen: Arc<Mutex<Vec<&'static str>>> = Arc::default();
    let sink = Arc::clone(&events_seen);
    let policy = RecoveryPolicy::builder()
        .max_attempts(std::num::NonZeroU32::new(3).unwrap())
        .backoff(Duration::from_millis(2), Duration::from_millis(10))
        .build()
        .unwrap();
    let mut svc = RecoveryLayer::new(policy)
        .with_resumable_sse(true)
        .on_event(move |e| sink.lock().unwrap().push(e.kind.name()))
        // The client reads the gateway's answer as what it is, OpenAI Chat.
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let req = Request::post(format!("http://{proxy}{CHAT}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(CHAT_BODY.as_bytes())))
        .unwrap();
    let (bytes, report) = tokio::time::timeout(LIMIT, async {
        let resp = svc.call(req).await.expect("committed");
        let report = resp.extensions().get::<ReportHandle>().cloned().unwrap();
        let body = resp.into_body().collect().await.expect("whole").to_bytes();
        (body, report.report())
    })
    .await
    .expect("hung");
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    assert_eq!(
        without_ids(&text).as_bytes(),
        &fixture(NAME)[..],
        "the whole answer through the cut"
    );
    assert!(
        report
            .outcome
            .as_ref()
            .is_some_and(recovery_core::outcome::Outcome::is_completed),
        "{:?}",
        report.outcome
    );
    assert_eq!(report.seams.len(), 1, "{:?}", report.seams);
    assert_eq!(report.seams[0].strategy, SeamStrategy::LastEventId);
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["seams"][0]["strategy"], "last_event_id");
    assert_eq!(provider.count(), 1, "the resume was served from the log");
    assert_eq!(gw.metrics().downstream_reconnects, 1);
    gw.shutdown().await;
}

fn client_for_replay() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    tower_recovery::ReplayBody,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}
