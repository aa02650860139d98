//! `RecoveryLayer` + `ObserveLayer` over a hyper-util client speaking HTTP/2
//! with prior knowledge (h2c) to a loopback h2 server that refuses streams:
//! reliability matrix CN5.
//!
//! The server is the `h2` crate's, except for the one connection that answers
//! with `GOAWAY` below the request's stream: that one is written frame by
//! frame, so the `GOAWAY` provably follows the request's `HEADERS` and names
//! last-stream-id 0 (the `h2` server counts a stream as processed as soon as
//! its `HEADERS` arrive, so it cannot send that frame after them).
//!
//! Every test checks the invariants that apply to it, as
//! `tower_loopback.rs` does: the delivered bytes equal the fixture exactly
//! once, the server saw as many streams as the report counts attempts, every
//! resend carries the same bytes, exactly one terminal lifecycle event, and
//! no connection left open.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::error::RecoveryError;
use recovery_core::failure::{Acceptance, Category, Phase};
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::outcome::{FailureReason, Outcome};
use recovery_core::policy::{Endpoint, RecoveryPolicy};
use recovery_core::protocol::ProtocolKind;
use recovery_core::report::{AttemptResult, RecoveryReport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower_layer::Layer;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody};
use tower_service::Service;

const LIMIT: Duration = Duration::from_secs(20);
const PATH: &str = "/v1/chat/completions";
const FIXTURE: &str = "openai-chat/happy-usage.sse";
const PROMPT: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"canary-prompt"}]}"#;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(recovery_tests::fault::default_fixtures_dir().join(name)).expect("fixture")
}

/// How the server turns the first request away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// `RST_STREAM(REFUSED_STREAM)` on the first stream; later streams on the
    /// same connection are served.
    RefusedStream,
    /// The first connection reads the request's `HEADERS`, answers
    /// `GOAWAY(last_stream_id = 0, NO_ERROR)` and closes; later connections
    /// are served.
    GoAwayBelow,
    /// `RST_STREAM(INTERNAL_ERROR)` on the first stream: a reset that does
    /// not say whether the application saw the request.
    InternalError,
}

/// One stream as the server saw it.
#[derive(Debug, Clone)]
struct SeenStream {
    /// Which accepted connection (0-based).
    connection: u32,
    /// The HTTP/2 stream id.
    stream_id: u32,
    /// Turned away unprocessed (refused, or above the `GOAWAY`'s last id).
    refused: bool,
    /// Reset with a reason that does not say so.
    reset: bool,
    /// The request body, for a stream that was served.
    body: Option<Bytes>,
}

#[derive(Default)]
struct Log {
    connections: u32,
    streams: Vec<SeenStream>,
}

/// A loopback HTTP/2 (h2c) server on `127.0.0.1:0` that turns the first
/// request away as `refusal` says and serves the fixture on every later one.
struct H2Server {
    addr: std::net::SocketAddr,
    log: Arc<Mutex<Log>>,
    open: watch::Receiver<u32>,
    accept: tokio::task::JoinHandle<()>,
}

impl H2Server {
    async fn start(refusal: Refusal) -> H2Server {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log: Arc<Mutex<Log>> = Arc::default();
        let (open_tx, open) = watch::channel(0u32);
        let open_tx = Arc::new(open_tx);
        let accept = tokio::spawn({
            let log = Arc::clone(&log);
            async move {
                loop {
                    let Ok((socket, _)) = listener.accept().await else {
                        return;
                    };
                    let connection = {
                        let mut log = log.lock().unwrap();
                        log.connections += 1;
                        log.connections - 1
                    };
                    open_tx.send_modify(|n| *n += 1);
                    let (log, open_tx) = (Arc::clone(&log), Arc::clone(&open_tx));
                    tokio::spawn(async move {
                        if refusal == Refusal::GoAwayBelow && connection == 0 {
                            go_away_below(socket, connection, &log).await;
                        } else {
                            let first = match refusal {
                                Refusal::RefusedStream => Some(h2::Reason::REFUSED_STREAM),
                                Refusal::InternalError => Some(h2::Reason::INTERNAL_ERROR),
                                Refusal::GoAwayBelow => None,
                            };
                            serve(socket, connection, &log, first).await;
                        }
                        open_tx.send_modify(|n| *n -= 1);
                    });
                }
            }
        });
        H2Server {
            addr,
            log,
            open,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("http://{}{PATH}", self.addr)
    }

    fn streams(&self) -> Vec<SeenStream> {
        self.log.lock().unwrap().streams.clone()
    }

    fn connections(&self) -> u32 {
        self.log.lock().unwrap().connections
    }

    /// Waits until every accepted connection is closed.
    async fn wait_idle(&mut self) {
        self.open.wait_for(|n| *n == 0).await.unwrap();
    }
}

impl Drop for H2Server {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Serves a connection with the `h2` crate: resets the server's first stream
/// with `reset_first` when set, answers every other one with the fixture.
async fn serve(
    socket: TcpStream,
    connection: u32,
    log: &Arc<Mutex<Log>>,
    reset_first: Option<h2::Reason>,
) {
    let Ok(mut conn) = h2::server::handshake(socket).await else {
        return;
    };
    while let Some(next) = conn.accept().await {
        let Ok((request, mut respond)) = next else {
            break;
        };
        let stream_id = u32::from(respond.stream_id());
        let reset = {
            let mut log = log.lock().unwrap();
            let reset = reset_first.filter(|_| log.streams.is_empty());
            if let Some(reason) = reset {
                let refused = reason == h2::Reason::REFUSED_STREAM;
                log.streams.push(SeenStream {
                    connection,
                    stream_id,
                    refused,
                    reset: !refused,
                    body: None,
                });
            }
            reset
        };
        if let Some(reason) = reset {
            respond.send_reset(reason);
            continue;
        }
        let log = Arc::clone(log);
        tokio::spawn(async move {
            let mut body = request.into_body();
            let mut bytes = Vec::new();
            while let Some(chunk) = body.data().await {
                let Ok(chunk) = chunk else { return };
                let _ = body.flow_control().release_capacity(chunk.len());
                bytes.extend_from_slice(&chunk);
            }
            log.lock().unwrap().streams.push(SeenStream {
                connection,
                stream_id,
                refused: false,
                reset: false,
                body: Some(Bytes::from(bytes)),
            });
            let head = http::Response::builder()
                .status(200)
                .header("content-type", "text/event-stream")
                .body(())
                .unwrap();
            let Ok(mut send) = respond.send_response(head, false) else {
                return;
            };
            let answer = fixture(FIXTURE);
            // One DATA frame per line group, as a provider flushes events.
            let text = String::from_utf8(answer).unwrap();
            for event in text.split_inclusive("\n\n") {
                if send
                    .send_data(Bytes::copy_from_slice(event.as_bytes()), false)
                    .is_err()
                {
                    return;
                }
            }
            let _ = send.send_data(Bytes::new(), true);
        });
    }
}

/// HTTP/2 frame types and flags used by the hand-written connection.
const FRAME_HEADERS: u8 = 0x1;
const FRAME_SETTINGS: u8 = 0x4;
const FRAME_GOAWAY: u8 = 0x7;
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads the client preface and frames until the first `HEADERS`, then
/// answers `GOAWAY(last_stream_id = 0, NO_ERROR)`: the request's stream is
/// above the last one the server will process. Closes its side and drains
/// until the client closes.
async fn go_away_below(mut socket: TcpStream, connection: u32, log: &Arc<Mutex<Log>>) {
    if socket
        .write_all(&frame(FRAME_SETTINGS, 0, 0, &[]))
        .await
        .is_err()
    {
        return;
    }
    let mut preface = [0u8; 24];
    if socket.read_exact(&mut preface).await.is_err() || preface != PREFACE {
        return;
    }
    let stream_id = loop {
        let mut head = [0u8; 9];
        if socket.read_exact(&mut head).await.is_err() {
            return;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        if socket.read_exact(&mut payload).await.is_err() {
            return;
        }
        if head[3] == FRAME_HEADERS {
            break u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        }
    };
    log.lock().unwrap().streams.push(SeenStream {
        connection,
        stream_id,
        refused: true,
        reset: false,
        body: None,
    });
    let mut payload = Vec::with_capacity(8);
    payload.extend_from_slice(&0u32.to_be_bytes());
    payload.extend_from_slice(&u32::from(h2::Reason::NO_ERROR).to_be_bytes());
    if socket
        .write_all(&frame(FRAME_GOAWAY, 0, 0, &payload))
        .await
        .is_err()
    {
        return;
    }
    let _ = socket.shutdown().await;
    let mut sink = [0u8; 4096];
    while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
}

type Events = Arc<Mutex<Vec<LifecycleEvent>>>;

struct Run {
    status: u16,
    body: Vec<u8>,
    body_error: Option<RecoveryError>,
    /// The response future's error, when no response came back.
    error: Option<RecoveryError>,
    report: RecoveryReport,
    events: Vec<String>,
}

/// Sends the prompt through `RecoveryLayer` over `ObserveLayer` over an
/// HTTP/2-only hyper-util client, reads the whole body, and checks the
/// invariants every row shares.
async fn run(server: &mut H2Server, policy: RecoveryPolicy) -> Run {
    let events: Events = Arc::default();
    let sink = Arc::clone(&events);
    let client: Client<HttpConnector, ReplayBody> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let mut svc = RecoveryLayer::new(policy)
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let req = Request::post(server.url())
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-canary-secret")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let mut run = tokio::time::timeout(LIMIT, async {
        let resp = match svc.call(req).await {
            Ok(resp) => resp,
            Err(e) => {
                return Run {
                    status: 0,
                    body: Vec::new(),
                    body_error: None,
                    report: e.report().clone(),
                    error: Some(e),
                    events: Vec::new(),
                };
            }
        };
        let d = support::read_to_end(resp).await;
        Run {
            status: d.status,
            body: d.bytes,
            body_error: d.body_error,
            error: None,
            report: d.report.expect("report"),
            events: Vec::new(),
        }
    })
    .await
    .expect("hung");
    drop(svc);
    tokio::time::timeout(LIMIT, server.wait_idle())
        .await
        .expect("connections left open");
    run.events = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name().to_owned())
        .collect();
    let terminal = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind.is_terminal())
        .count();
    assert_eq!(terminal, 1, "exactly one terminal event: {:?}", run.events);
    // G2: the server saw one stream per reported attempt, within the
    // allowance; every served stream carried the same bytes.
    let streams = server.streams();
    assert!(streams.len() <= 3);
    assert_eq!(
        streams.len() as u32,
        run.report.attempt_count(),
        "{streams:?}"
    );
    for s in streams.iter().filter_map(|s| s.body.as_ref()) {
        assert_eq!(s, PROMPT.as_bytes(), "resends carry the same bytes");
    }
    let rendered = serde_json::to_string(&run.report).unwrap();
    assert!(!rendered.contains("canary"), "redacted: {rendered}");
    run
}

/// A strict policy: a local endpoint, where a resend whose first send may
/// have reached the application needs admission, and no hook is installed.
/// Only a failure the server provably did not process is resent.
fn strict() -> RecoveryPolicy {
    recovery_tests::policy::loopback()
        .endpoint(Endpoint::Local)
        .build()
        .unwrap()
}

/// What CN5 expects of a request whose first stream was turned away.
fn assert_refused_then_completed(run: &Run, server: &H2Server) {
    let happy = fixture(FIXTURE);
    assert!(run.error.is_none(), "{:?}", run.error);
    assert_eq!(run.status, 200);
    assert!(run.body_error.is_none(), "{:?}", run.body_error);
    assert_eq!(run.body, happy, "the fixture, exactly once");
    let streams = server.streams();
    assert_eq!(streams.len(), 2, "{streams:?}");
    assert!(
        streams[0].refused,
        "the server turned the first stream away"
    );
    assert!(!streams[1].refused);
    let report = &run.report;
    assert_eq!(report.attempt_count(), 2, "the refused send is debited");
    assert_eq!(report.resend_count, 1);
    assert!(
        matches!(report.outcome, Some(Outcome::Completed { .. })),
        "{:?}",
        report.outcome
    );
    let first = &report.attempts[0];
    assert_eq!(
        first.result,
        AttemptResult::Failed {
            category: Category::Transport,
            phase: Phase::AwaitingHeaders,
            reason: FailureReason::Transient,
        }
    );
    assert_eq!(first.acceptance, Some(Acceptance::No));
    assert_eq!(report.attempts[1].acceptance, None);
    assert_eq!(
        run.events,
        [
            "attempt_started",
            "attempt_failed",
            "delay_scheduled",
            "retry_started",
            "attempt_started",
            "committed",
            "attempt_succeeded",
            "completed"
        ]
    );
}

#[tokio::test]
async fn cn5_refused_stream_is_retried_under_a_strict_policy_and_counted() {
    let mut server = H2Server::start(Refusal::RefusedStream).await;
    let run = run(&mut server, strict()).await;
    assert_refused_then_completed(&run, &server);
    let streams = server.streams();
    assert_eq!(
        streams[0].connection, streams[1].connection,
        "the refused stream leaves the connection usable"
    );
    assert!(streams[1].stream_id > streams[0].stream_id);
}

#[tokio::test]
async fn cn5_goaway_below_our_stream_is_retried_under_a_strict_policy_and_counted() {
    let mut server = H2Server::start(Refusal::GoAwayBelow).await;
    let run = run(&mut server, strict()).await;
    assert_refused_then_completed(&run, &server);
    let streams = server.streams();
    assert_eq!(streams[0].connection, 0);
    assert_eq!(
        streams[1].connection, 1,
        "the answer came on a new connection"
    );
    assert_eq!(server.connections(), 2);
}

#[tokio::test]
async fn cn5_contrast_other_resets_are_not_proof_and_need_admission_when_strict() {
    let mut server = H2Server::start(Refusal::InternalError).await;
    let run = run(&mut server, strict()).await;
    let err = run.error.expect("no resend without admission");
    assert_eq!(err.outcome(), &Outcome::AdmissionRequired);
    let streams = server.streams();
    assert_eq!(streams.len(), 1, "sent once: {streams:?}");
    assert!(streams[0].reset);
    let first = &run.report.attempts[0];
    assert_eq!(first.acceptance, Some(Acceptance::Unknown));
    assert!(matches!(
        first.result,
        AttemptResult::Failed {
            category: Category::Transport,
            ..
        }
    ));
    assert_eq!(
        run.events,
        [
            "attempt_started",
            "attempt_failed",
            "admission_required",
            "exhausted"
        ]
    );
}
