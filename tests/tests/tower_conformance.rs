//! The shared conformance vectors (`tests/conformance/engine/*.json`) run
//! through the tower driver: a scripted inner service plays each vector's
//! sends byte for byte, tokio's paused clock drives the waits and the
//! timeouts, and what comes out (events, outcome, sends, delays, delivered
//! bytes, requests, end time) must equal the vector's (G13).
//!
//! Every vector runs twice: with an `ObserveLayer` inside the
//! `RecoveryLayer` (one decode, shared through its handle) and without one
//! (the recovery layer decodes by itself): the same decisions either way
//! (reliability matrix AT7).

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
use recovery_core::conformance::{Observed, Played, PlayedHead, Vector, WALL_CLOCK, WireEnd};
use recovery_core::cooldown::{self, CooldownStore, Cooldowns};
use recovery_core::exchange::AdmissionAnswer;
use recovery_core::failure::TransportKind;
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::timing::{Fraction, Instant, JitterSource, ScriptedConnectivity, Timing};
use tokio::sync::Notify;
use tower_layer::Layer;
use tower_recovery::recovery::{AdmissionHook, ContinuationHook};
use tower_recovery::{Alternate, ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};
use tower_service::Service;

const ORIGIN: &str = "http://vector.invalid";

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
    fn jitter_source(&self) -> JitterSource {
        JitterSource::pinned(self.jitter)
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

/// What the consumer is told when the played body has nothing more for it.
#[derive(Default)]
struct Stop {
    notify: Notify,
}

/// A played body: the chunks (each at its time after the send), then
/// keepalives, then its end.
struct PlayedBody {
    chunks: VecDeque<(tokio::time::Instant, Bytes)>,
    /// The wait for the next chunk's time.
    due: Option<Pin<Box<tokio::time::Sleep>>>,
    keepalive: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
    end: WireEnd,
    offline: Option<ScriptedConnectivity>,
    stop: Arc<Stop>,
}

impl Body for PlayedBody {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(&(at, _)) = self.chunks.front() {
            if at > tokio::time::Instant::now() {
                let due = self
                    .due
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                if due.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
            }
            self.due = None;
            let (_, chunk) = self.chunks.pop_front().expect("a chunk");
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if let Some((every, sleep)) = self.keepalive.as_mut() {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let every = *every;
            sleep.as_mut().reset(tokio::time::Instant::now() + every);
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                b": keepalive\n\n",
            )))));
        }
        if let Some(net) = self.offline.take() {
            net.set_online(false);
        }
        match self.end {
            WireEnd::Eof => Poll::Ready(None),
            WireEnd::Reset => Poll::Ready(Some(Err(std::io::ErrorKind::ConnectionReset.into()))),
            WireEnd::Hang => Poll::Pending,
            WireEnd::ConsumerDrop | WireEnd::ConsumerCancel => {
                self.stop.notify.notify_one();
                Poll::Pending
            }
        }
    }
}

type Answer = Result<Response<PlayedBody>, std::io::Error>;

/// Plays the vector's sends in order and records each request.
#[derive(Clone)]
struct Player {
    played: Arc<Vec<Played>>,
    sends: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    bodies: Arc<Mutex<Vec<String>>>,
    net: ScriptedConnectivity,
    stop: Arc<Stop>,
    cancel: Cancellation,
}

impl Service<Request<ReplayBody>> for Player {
    type Response = Response<PlayedBody>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<ReplayBody>) -> Self::Future {
        let n = self.sends.fetch_add(1, Ordering::SeqCst);
        let mut line = format!("{} {}", req.method(), req.uri().path_and_query().unwrap());
        if let Some(id) = req.headers().get("last-event-id") {
            line = format!("{line} last-event-id={}", id.to_str().unwrap());
        }
        if let Some(key) = req.headers().get("idempotency-key") {
            line = format!("{line} idempotency-key={}", key.to_str().unwrap());
        }
        self.requests.lock().unwrap().push(line);
        // A buffered body is ready at once.
        let mut body = Vec::new();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(req.body_mut()).poll_frame(&mut cx) {
            body.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..]));
        }
        self.bodies
            .lock()
            .unwrap()
            .push(String::from_utf8_lossy(&body).into_owned());
        let p = self.played[n.min(self.played.len() - 1)].clone();
        let (net, stop, cancel) = (
            self.net.clone(),
            Arc::clone(&self.stop),
            self.cancel.clone(),
        );
        Box::pin(async move {
            let sent = tokio::time::Instant::now();
            let after = |ms: u64| sent + Duration::from_millis(ms);
            match p.head {
                PlayedHead::Status { status, headers } => {
                    tokio::time::sleep_until(after(p.head_at_ms)).await;
                    let mut b = Response::builder().status(status);
                    for (name, value) in headers {
                        b = b.header(name, value);
                    }
                    let body = PlayedBody {
                        chunks: p
                            .chunks
                            .into_iter()
                            .zip(p.chunks_at_ms)
                            .map(|(c, at)| (after(at), Bytes::from(c)))
                            .collect(),
                        due: None,
                        keepalive: p.keepalive_every_ms.map(|ms| {
                            let every = Duration::from_millis(ms);
                            (every, Box::pin(tokio::time::sleep(every)))
                        }),
                        end: p.end,
                        offline: p.offline.then_some(net),
                        stop,
                    };
                    Ok(b.body(body).unwrap())
                }
                PlayedHead::Fails { transport, .. } => {
                    if p.offline {
                        net.set_online(false);
                    }
                    Err(io_kind(transport).into())
                }
                PlayedHead::Never => {
                    if p.offline {
                        net.set_online(false);
                    }
                    if p.cancel_awaiting {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        cancel.cancel();
                    }
                    std::future::pending::<Answer>().await
                }
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
                "never" => std::future::pending().await,
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

async fn run_vector(v: &Vector, observe: bool) -> Result<(), String> {
    let played = v
        .attempts
        .iter()
        .map(recovery_core::conformance::AttemptSpec::played)
        .collect::<Result<Vec<_>, _>>()?;
    let protocol = v.protocol()?;
    let started = tokio::time::Instant::now();
    let timing = PinnedTiming {
        origin: started,
        jitter: Fraction::new(v.jitter),
    };
    let net = ScriptedConnectivity::new(true);
    let cancel = Cancellation::new();
    let events: Arc<Mutex<Vec<LifecycleEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let waits = Arc::new(AtomicUsize::new(0));
    let cancel_wait = v.cancel_during_wait;
    let on_cancel = cancel.clone();
    let request = v.request();
    let url = format!("{ORIGIN}{}", request.path);
    // The layer's cooldown store, seeded as the vector says.
    let cooldowns = Arc::new(Cooldowns::new());
    let key = cooldown::key_for(&url, request.body.as_bytes());
    if let Some(wait) = v.cooldown_ms {
        cooldowns.note(&key, timing.now(), Duration::from_millis(wait));
    }
    let clock = timing.clone();
    let mut layer = RecoveryLayer::with_timing(v.policy.build().expect("valid policy"), timing)
        .with_cooldowns(cooldowns.clone())
        .with_connectivity(net.clone())
        .with_resumable_sse(v.resumable_sse)
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
    if !observe {
        layer = layer.with_protocol(protocol.clone());
    }
    if let Some(answers) = &v.admission {
        layer = layer.with_admission(hook(answers.clone(), cancel.clone()));
    }
    if let Some(budget) = &v.retry_budget {
        layer = layer.with_retry_budget(budget.budget());
    }
    for a in &v.alternates {
        let mut alt = Alternate::new(&a.label).map_err(|e| e.to_string())?;
        if let Some(url) = &a.url {
            alt = alt.url(url).map_err(|e| e.to_string())?;
        }
        if let Some(model) = &a.model {
            alt = alt.model(model).map_err(|e| e.to_string())?;
        }
        if let Some(p) = &a.protocol {
            alt = alt.protocol(p.parse().map_err(|_| format!("unknown protocol {p}"))?);
        }
        if let Some(tokens) = a.context_window {
            alt = alt.context_window(tokens);
        }
        if let Some(p) = &a.prefill {
            alt = alt.prefill(p.parse().map_err(|e| format!("{e}"))?);
        }
        layer = layer.with_alternate(alt);
    }
    if let Some(c) = v.continuation.clone() {
        let continuation: ContinuationHook = Arc::new(move |_ctx| {
            Some(
                Request::builder()
                    .method(c.method.as_str())
                    .uri(format!("{ORIGIN}{}", c.path))
                    .body(Bytes::from(c.body.clone()))
                    .unwrap(),
            )
        });
        layer = layer.with_continuation(continuation);
    }
    let stop = Arc::new(Stop::default());
    let player = Player {
        played: Arc::new(played),
        sends: Arc::default(),
        requests: Arc::default(),
        bodies: Arc::default(),
        net,
        stop: Arc::clone(&stop),
        cancel: cancel.clone(),
    };
    let mut req = Request::builder()
        .method(request.method.as_str())
        .uri(url)
        .body(Full::new(Bytes::from(request.body)))
        .unwrap();
    let mut call = RecoveryCall::new().with_cancellation(cancel.clone());
    if let Some(tokens) = v.context_window {
        call = call.with_context_window(tokens);
    }
    if let Some(p) = v.own_prefill()? {
        call = call.with_prefill(p);
    }
    req.extensions_mut().insert(call);
    let mut delivered = Vec::new();
    let report = if observe {
        let mut svc = layer.layer(ObserveLayer::new(protocol).layer(player.clone()));
        consume(svc.call(req).await, &stop, &mut delivered).await
    } else {
        let mut svc = layer.layer(player.clone());
        consume(svc.call(req).await, &stop, &mut delivered).await
    };
    let mut observed = Observed {
        events: events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.kind.name().to_owned())
            .filter(|n| n != "committed")
            .collect(),
        sends: player.sends.load(Ordering::SeqCst),
        delivered,
        // The logical id written `{id}`: each runner draws its own.
        requests: player
            .requests
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.replace(&report.logical_id, "{id}"))
            .collect(),
        bodies: player.bodies.lock().unwrap().clone(),
        cooldown_left_ms: cooldowns
            .remaining(&key, clock.now())
            .map_or(0, |d| d.as_millis() as u64),
        ..Observed::default()
    };
    observed.from_report(&report);
    let name = format!(
        "{} ({})",
        v.name,
        if observe {
            "with ObserveLayer"
        } else {
            "decoding by itself"
        }
    );
    v.expected.check(&name, &observed)
}

/// The consumer: reads the body to its end, or until the played body says
/// it has nothing more (then drops it, as an SDK does after its end
/// marker). The report of the request, once it ended.
async fn consume<B>(
    answer: Result<Response<tower_recovery::RecoveryBody<B>>, recovery_core::error::RecoveryError>,
    stop: &Stop,
    delivered: &mut Vec<u8>,
) -> recovery_core::report::RecoveryReport
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tower_recovery::BoxError>,
{
    let resp = match answer {
        Ok(resp) => resp,
        Err(e) => return e.report().clone(),
    };
    let report = resp.extensions().get::<ReportHandle>().cloned().unwrap();
    let mut body = resp.into_body();
    loop {
        tokio::select! {
            frame = body.frame() => match frame {
                Some(Ok(f)) => {
                    if let Some(d) = f.data_ref() {
                        delivered.extend_from_slice(d);
                    }
                }
                Some(Err(_)) | None => break,
            },
            () = stop.notify.notified() => break,
        }
    }
    drop(body);
    report.report()
}

#[tokio::test(start_paused = true)]
async fn every_vector_runs_through_the_tower_driver() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance/engine");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 30, "found {} vectors", files.len());
    let mut failures = Vec::new();
    for path in files {
        let v: Vector = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for observe in [true, false] {
            if let Err(e) = run_vector(&v, observe).await {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
