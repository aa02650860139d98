//! The shared conformance vectors (`tests/conformance/engine/*.json`) run
//! through the tower driver: a scripted inner service plays each vector's
//! attempts, tokio's paused clock drives the waits, and the lifecycle, the
//! outcome, the sends and the waits must equal the vector's (G13, LC3).

use std::collections::VecDeque;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use recovery_core::call::{Cancellation, RecoveryCall};
use recovery_core::conformance::{AttemptSpec, Vector, WALL_CLOCK};
use recovery_core::decision::AdmissionAnswer;
use recovery_core::failure::{Phase, TransportKind};
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::outcome::CancelPhase;
use recovery_core::progress::Proof;
use recovery_core::protocol::ProtocolKind;
use recovery_core::timing::{Fraction, Instant, Timing};
use tower_layer::Layer;
use tower_recovery::recovery::AdmissionHook;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};
use tower_service::Service;

const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const HELLO: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n";
const STOP: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

/// tokio's (paused) clock with every jitter draw pinned, and a wall clock
/// starting where the vectors say.
#[derive(Clone)]
struct PinnedTiming {
    origin: tokio::time::Instant,
    jitter: Fraction,
}

impl Timing for PinnedTiming {
    type Sleep = tokio::time::Sleep;
    fn now(&self) -> Instant {
        Instant::from_origin(self.origin.elapsed())
    }
    fn wall_now(&self) -> SystemTime {
        SystemTime::UNIX_EPOCH + WALL_CLOCK + self.origin.elapsed()
    }
    fn sleep(&self, d: Duration) -> tokio::time::Sleep {
        tokio::time::sleep(d)
    }
    fn jitter(&self) -> Fraction {
        self.jitter
    }
}

enum Piece {
    Data(&'static str),
    Error(std::io::ErrorKind),
    Pending,
}

struct PlayedBody(VecDeque<Piece>);

impl Body for PlayedBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.0.pop_front() {
            None => Poll::Ready(None),
            Some(Piece::Data(d)) => {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(d.as_bytes())))))
            }
            Some(Piece::Error(kind)) => Poll::Ready(Some(Err(kind.into()))),
            Some(Piece::Pending) => {
                self.0.push_front(Piece::Pending);
                Poll::Pending
            }
        }
    }
}

fn io_kind(kind: TransportKind) -> std::io::ErrorKind {
    match kind {
        TransportKind::Refused => std::io::ErrorKind::ConnectionRefused,
        TransportKind::Reset => std::io::ErrorKind::ConnectionReset,
        TransportKind::Closed => std::io::ErrorKind::UnexpectedEof,
        _ => std::io::ErrorKind::Other,
    }
}

type Played = Result<Response<PlayedBody>, std::io::Error>;

/// Plays the vector's attempts in order.
#[derive(Clone)]
struct Player {
    attempts: Arc<Vec<AttemptSpec>>,
    sends: Arc<AtomicUsize>,
}

impl Service<Request<ReplayBody>> for Player {
    type Response = Response<PlayedBody>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Played> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: Request<ReplayBody>) -> Self::Future {
        let n = self.sends.fetch_add(1, Ordering::SeqCst);
        let spec = self.attempts[n.min(self.attempts.len() - 1)].clone();
        Box::pin(async move {
            let stream = |pieces: Vec<Piece>| {
                Ok(Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(PlayedBody(pieces.into()))
                    .unwrap())
            };
            match (spec.fail, spec.succeed, spec.cancel) {
                (Some(f), None, None) => match (f.status, f.transport) {
                    (Some(status), _) => {
                        let mut b = Response::builder().status(status);
                        if let Some(ra) = &f.retry_after {
                            b = b.header("retry-after", ra.as_str());
                        }
                        if let Some(sr) = f.should_retry {
                            b = b.header("x-should-retry", if sr { "true" } else { "false" });
                        }
                        Ok(b.body(PlayedBody(VecDeque::from([Piece::Data("{}")])))
                            .unwrap())
                    }
                    (None, Some(kind)) => {
                        let err = Piece::Error(io_kind(kind));
                        match f.phase {
                            Some(Phase::Streaming) if spec.semantic => {
                                stream(vec![Piece::Data(ROLE), Piece::Data(HELLO), err])
                            }
                            Some(Phase::Streaming) => stream(vec![Piece::Data(ROLE), err]),
                            _ => Err(io_kind(kind).into()),
                        }
                    }
                    _ => panic!("a failure is a status or a transport error"),
                },
                (None, Some(proof), None) => {
                    let mut pieces = vec![Piece::Data(ROLE), Piece::Data(HELLO), Piece::Data(STOP)];
                    if proof == Proof::Strong {
                        pieces.push(Piece::Data(DONE));
                    }
                    stream(pieces)
                }
                (None, None, Some(CancelPhase::Streaming)) => {
                    let mut pieces = vec![Piece::Data(ROLE)];
                    if spec.semantic {
                        pieces.push(Piece::Data(HELLO));
                    }
                    pieces.push(Piece::Pending);
                    stream(pieces)
                }
                (None, None, Some(_)) => std::future::pending::<Played>().await,
                _ => panic!("an attempt is exactly one of fail, succeed, cancel"),
            }
        })
    }
}

fn hook(answers: Vec<String>, cancel: Cancellation) -> AdmissionHook {
    let answers = Arc::new(Mutex::new(VecDeque::from(answers)));
    Arc::new(move |_ctx| {
        let answer = answers
            .lock()
            .unwrap()
            .pop_front()
            .expect("an answer per ask");
        let cancel = cancel.clone();
        Box::pin(async move {
            match answer.as_str() {
                "allow" => AdmissionAnswer::Allow,
                "reject" => AdmissionAnswer::Reject,
                "unresolved" => AdmissionAnswer::Unresolved,
                "cancel" => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    cancel.cancel();
                    std::future::pending().await
                }
                other => panic!("unknown admission answer {other}"),
            }
        })
    })
}

async fn run_vector(v: &Vector) {
    let timing = PinnedTiming {
        origin: tokio::time::Instant::now(),
        jitter: Fraction::new(v.jitter),
    };
    let cancel = Cancellation::new();
    let events: Arc<Mutex<Vec<LifecycleEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let waits = Arc::new(AtomicUsize::new(0));
    let cancel_wait = v.cancel_during_wait;
    let on_cancel = cancel.clone();
    let mut layer = RecoveryLayer::new(v.policy.policy().expect("valid policy"))
        .with_timing(timing)
        .on_event(move |e| {
            if e.kind.name() == "delay_scheduled" {
                let k = waits.fetch_add(1, Ordering::SeqCst);
                if let Some(c) = cancel_wait.filter(|c| c.wait == k) {
                    let cancel = on_cancel.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(c.after_ms)).await;
                        cancel.cancel();
                    });
                }
            }
            sink.lock().unwrap().push(e.clone());
        });
    if let Some(answers) = &v.admission {
        layer = layer.with_admission(hook(answers.clone(), cancel.clone()));
    }
    let player = Player {
        attempts: Arc::new(v.attempts.clone()),
        sends: Arc::default(),
    };
    let mut svc = layer.layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(player.clone()));
    let mut req = Request::post("http://vector/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    req.extensions_mut()
        .insert(RecoveryCall::new().with_cancellation(cancel.clone()));
    // The consumer cancels while awaiting a head that never comes.
    let awaiting_cancel = v.attempts.iter().any(|a| {
        matches!(
            a.cancel,
            Some(CancelPhase::AwaitingHead | CancelPhase::Sending)
        )
    });
    if awaiting_cancel {
        let c = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            c.cancel();
        });
    }
    let outcome = match svc.call(req).await {
        Ok(resp) => {
            let report = resp.extensions().get::<ReportHandle>().cloned().unwrap();
            let cancel_streaming = v
                .attempts
                .iter()
                .any(|a| a.cancel == Some(CancelPhase::Streaming));
            let mut body = resp.into_body();
            if !cancel_streaming {
                while let Some(frame) = body.frame().await {
                    if frame.is_err() {
                        break;
                    }
                }
            }
            drop(body);
            report.report().outcome.expect("ended").name().to_owned()
        }
        Err(e) => e.outcome().name().to_owned(),
    };
    let names: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name().to_owned())
        .filter(|n| n != "committed")
        .collect();
    assert_eq!(names, v.expected.events, "{}: events", v.name);
    assert_eq!(outcome, v.expected.outcome, "{}: outcome", v.name);
    assert_eq!(
        player.sends.load(Ordering::SeqCst),
        v.expected.sends,
        "{}: sends",
        v.name
    );
    let delays: Vec<u64> = events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match &e.kind {
            recovery_core::lifecycle::EventKind::DelayScheduled { delay_ms, .. } => {
                Some(delay_ms.as_millis() as u64)
            }
            _ => None,
        })
        .collect();
    assert_eq!(delays, v.expected.delays_ms, "{}: delays", v.name);
}

#[tokio::test(start_paused = true)]
async fn every_engine_vector_runs_through_the_tower_driver() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance/engine");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 10, "found {} vectors", files.len());
    for path in files {
        let v: Vector = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        run_vector(&v).await;
    }
}
