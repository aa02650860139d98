//! `RecoveryLayer` over a scripted inner service (bodies that emit scripted
//! frames, fail, or stay pending) on tokio's paused clock: the M rows of the
//! reliability matrix.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use recovery_core::call::{Cancellation, RecoveryCall};
use recovery_core::lifecycle::{CommitTrigger, EventKind, LifecycleEvent};
use recovery_core::outcome::{CancelPhase, Outcome, ReplayDisabled};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use tower::{Layer, Service, ServiceExt};
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};

/// One step of a scripted response body.
#[derive(Clone)]
enum Step {
    Data(&'static str),
    Reset,
    Pending,
}

struct ScriptBody {
    steps: VecDeque<Step>,
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.steps.pop_front() {
            None => Poll::Ready(None),
            Some(Step::Data(d)) => {
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(d.as_bytes())))))
            }
            Some(Step::Reset) => Poll::Ready(Some(Err(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )))),
            Some(Step::Pending) => {
                self.steps.push_front(Step::Pending);
                Poll::Pending
            }
        }
    }
}

#[derive(Clone)]
struct Reply {
    status: u16,
    steps: Vec<Step>,
}

fn ok(steps: &[Step]) -> Reply {
    Reply {
        status: 200,
        steps: steps.to_vec(),
    }
}

/// A complete Chat stream: role, one content chunk, finish, `[DONE]`.
fn happy() -> Reply {
    ok(&[
        Step::Data(ROLE),
        Step::Data(HELLO),
        Step::Data(STOP),
        Step::Data(DONE),
    ])
}

fn status(s: u16) -> Reply {
    Reply {
        status: s,
        steps: vec![Step::Data("{}")],
    }
}

/// A service answering scripted replies in order (the last repeats), counting
/// calls and keeping each request body.
#[derive(Clone)]
struct Scripted {
    replies: Arc<Vec<Reply>>,
    calls: Arc<AtomicU32>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Scripted {
    fn new(replies: Vec<Reply>) -> Self {
        Scripted {
            replies: Arc::new(replies),
            calls: Arc::default(),
            bodies: Arc::default(),
        }
    }
    fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Service<Request<ReplayBody>> for Scripted {
    type Response = Response<ScriptBody>;
    type Error = Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReplayBody>) -> Self::Future {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) as usize;
        let reply = self.replies[n.min(self.replies.len() - 1)].clone();
        let bodies = Arc::clone(&self.bodies);
        Box::pin(async move {
            let body = req.into_body().collect().await.unwrap().to_bytes();
            bodies.lock().unwrap().push(body);
            Ok(Response::builder()
                .status(reply.status)
                .header("content-type", "text/event-stream")
                .body(ScriptBody {
                    steps: reply.steps.into(),
                })
                .unwrap())
        })
    }
}

const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const HELLO: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n";
const STOP: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";
const KEEPALIVE: &str = ": keep-alive\n\n";

fn policy() -> tower_recovery::core::policy::PolicyBuilder {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).unwrap())
        .backoff(Duration::from_millis(500), Duration::from_secs(8))
}

type Events = Arc<Mutex<Vec<LifecycleEvent>>>;

fn layer(policy: RecoveryPolicy, events: &Events) -> RecoveryLayer {
    let sink = Arc::clone(events);
    RecoveryLayer::new(policy).on_event(move |e| sink.lock().unwrap().push(e.clone()))
}

fn names(events: &Events) -> Vec<&'static str> {
    events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name())
        .collect()
}

/// Yields until `cond` holds; a bounded wait, so a broken driver fails the
/// test instead of hanging it.
async fn until(mut cond: impl FnMut() -> bool) {
    for _ in 0..100_000 {
        if cond() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the condition never held");
}

fn request() -> Request<Full<Bytes>> {
    Request::post("http://mock/v1/chat/completions")
        .body(Full::new(Bytes::from_static(b"{\"stream\":true}")))
        .unwrap()
}

async fn collect<B>(resp: Response<tower_recovery::RecoveryBody<B>>) -> (Vec<u8>, Option<Outcome>)
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<tower_recovery::BoxError>,
{
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => out.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(e) => return (out, Some(e.outcome().clone())),
        }
    }
    (out, None)
}

#[tokio::test(start_paused = true)]
async fn tb3_stacked_layers_share_one_allowance() {
    let inner = Scripted::new(vec![status(503)]);
    let events: Events = Arc::default();
    let p = policy().build().unwrap();
    let stack = layer(p.clone(), &events).layer(
        layer(p, &Arc::default())
            .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone())),
    );
    let resp = stack.oneshot(request()).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(inner.calls(), 3, "three sends in all, not nine");
}

#[tokio::test(start_paused = true)]
async fn bd8_idle_watchdog_replays_before_commit() {
    let inner = Scripted::new(vec![ok(&[Step::Data(ROLE), Step::Pending]), happy()]);
    let events: Events = Arc::default();
    let p = policy()
        .idle_timeout(Some(Duration::from_secs(5)))
        .build()
        .unwrap();
    let svc =
        layer(p, &events).layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let resp = svc.oneshot(request()).await.unwrap();
    let (body, err) = collect(resp).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(body, [ROLE, HELLO, STOP, DONE].concat().as_bytes());
    assert_eq!(inner.calls(), 2);
    let ev = events.lock().unwrap();
    assert!(ev.iter().any(|e| matches!(
        e.kind,
        EventKind::AttemptFailed {
            category: recovery_core::failure::Category::ClientTimeout,
            ..
        }
    )));
}

#[tokio::test(start_paused = true)]
async fn bd9_keepalives_never_reset_the_progress_watchdog() {
    let mut steps = vec![Step::Data(ROLE)];
    steps.extend(std::iter::repeat_n(Step::Data(KEEPALIVE), 5));
    steps.push(Step::Pending);
    let inner = Scripted::new(vec![ok(&steps)]);
    let events: Events = Arc::default();
    let p = policy()
        .progress_timeout(Some(Duration::from_secs(30)))
        .max_attempts(NonZeroU32::new(1).unwrap())
        .build()
        .unwrap();
    let svc =
        layer(p, &events).layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let started = tokio::time::Instant::now();
    let err = svc.oneshot(request()).await.unwrap_err();
    assert_eq!(err.outcome(), &Outcome::Exhausted { attempts: 1 });
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(30),
        "fired at exactly its period"
    );
}

#[tokio::test(start_paused = true)]
async fn bd5_holdback_overflow_forces_commit_then_failure_is_interrupted() {
    let mut steps: Vec<Step> = std::iter::repeat_n(Step::Data(KEEPALIVE), 200).collect();
    steps.push(Step::Reset);
    let inner = Scripted::new(vec![ok(&steps)]);
    let events: Events = Arc::default();
    let p = policy().holdback_cap(1024).build().unwrap();
    let svc =
        layer(p, &events).layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let resp = svc.oneshot(request()).await.unwrap();
    let (_, err) = collect(resp).await;
    assert!(matches!(err, Some(Outcome::Interrupted { .. })), "{err:?}");
    assert_eq!(inner.calls(), 1, "committed: no transparent replay");
    assert!(events.lock().unwrap().iter().any(|e| e.kind
        == EventKind::Committed {
            trigger: CommitTrigger::HoldbackCap,
            role: None
        }));
}

#[tokio::test(start_paused = true)]
async fn cx1_cancel_during_backoff_sends_nothing_more() {
    let inner = Scripted::new(vec![status(503)]);
    let events: Events = Arc::default();
    let p = policy().build().unwrap();
    let svc =
        layer(p, &events).layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let cancel = Cancellation::new();
    let mut req = request();
    req.extensions_mut()
        .insert(RecoveryCall::new().with_cancellation(cancel.clone()));
    let fut = tokio::spawn(svc.oneshot(req));
    // Let the first attempt fail and the backoff start.
    until(|| names(&events).contains(&"delay_scheduled")).await;
    cancel.cancel();
    let err = fut.await.unwrap().unwrap_err();
    assert_eq!(
        err.outcome(),
        &Outcome::Cancelled {
            phase: CancelPhase::Waiting
        }
    );
    assert_eq!(inner.calls(), 1);
    assert_eq!(names(&events).last(), Some(&"cancelled"));
}

#[tokio::test(start_paused = true)]
async fn rq2_body_over_the_replay_cap_is_sent_once() {
    let inner = Scripted::new(vec![ok(&[Step::Data(ROLE), Step::Reset])]);
    let events: Events = Arc::default();
    let p = policy().replay_body_cap(4).build().unwrap();
    let svc =
        layer(p, &events).layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let err = svc.oneshot(request()).await.unwrap_err();
    assert_eq!(
        err.outcome(),
        &Outcome::ReplayDisabled {
            reason: ReplayDisabled::BodyTooLarge
        }
    );
    assert_eq!(inner.calls(), 1);
    assert_eq!(
        inner.bodies.lock().unwrap()[0],
        Bytes::from_static(b"{\"stream\":true}"),
        "sent whole, never truncated"
    );
}

#[tokio::test(start_paused = true)]
async fn tb1_waits_follow_the_pinned_backoff_schedule() {
    let inner = Scripted::new(vec![status(503)]);
    let events: Events = Arc::default();
    let timing = recovery_core::timing::ManualTiming::new(0)
        .with_pinned_jitter(recovery_core::timing::Fraction::HALF);
    // The manual clock drives delays; tokio's paused clock is not involved.
    let sink = Arc::clone(&events);
    let svc = RecoveryLayer::with_timing(policy().build().unwrap(), timing.clone())
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let fut = tokio::spawn(svc.oneshot(request()));
    for (k, wait_ms) in [(1u32, 250u64), (2, 500)] {
        until(|| timing.pending_timers() > 0).await;
        assert_eq!(inner.calls(), k);
        timing.advance(Duration::from_millis(wait_ms - 1));
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        assert_eq!(inner.calls(), k, "advance d-1: no send");
        timing.advance(Duration::from_millis(1));
        until(|| inner.calls() != k).await;
    }
    let resp = fut.await.unwrap().unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(inner.calls(), 3);
    assert_eq!(timing.pending_timers(), 0);
}

#[tokio::test(start_paused = true)]
async fn storm_with_and_without_the_retry_budget() {
    const N: u32 = 500;
    let mut ratios = Vec::new();
    for with_budget in [false, true] {
        let inner = Scripted::new(vec![status(503)]);
        let mut l = RecoveryLayer::new(RecoveryPolicy::default());
        if !with_budget {
            l = l.without_retry_budget();
        }
        let svc = l.layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
        let mut tasks = Vec::new();
        for _ in 0..N {
            tasks.push(tokio::spawn(svc.clone().oneshot(request())));
        }
        for t in tasks {
            let resp = t.await.unwrap();
            match resp {
                Ok(r) => assert_eq!(r.status(), 503),
                Err(e) => assert!(
                    matches!(e.outcome(), Outcome::BudgetExhausted { .. }),
                    "{e}"
                ),
            }
        }
        let ratio = f64::from(inner.calls()) / f64::from(N);
        println!(
            "storm: {N} requests, always 503, budget {}: {} sends, {ratio:.2} sends/request",
            if with_budget { "on" } else { "off" },
            inner.calls()
        );
        ratios.push(ratio);
    }
    assert!(
        (ratios[0] - 3.0).abs() < f64::EPSILON,
        "without a budget every request sends 3 times"
    );
    assert!(ratios[1] <= 1.3, "with the budget: {}", ratios[1]);
}

#[tokio::test(start_paused = true)]
async fn report_is_complete_when_the_body_ends() {
    let inner = Scripted::new(vec![happy()]);
    let events: Events = Arc::default();
    let svc = layer(policy().build().unwrap(), &events)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let resp = svc.oneshot(request()).await.unwrap();
    let handle = resp.extensions().get::<ReportHandle>().cloned().unwrap();
    assert_eq!(
        handle.report().outcome,
        None,
        "not finished before the body ends"
    );
    let (_, err) = collect(resp).await;
    assert!(err.is_none());
    let report = handle.report();
    assert!(matches!(report.outcome, Some(Outcome::Completed { .. })));
    assert_eq!(report.committed_attempt, Some(1));
    assert!(report.attempts[0].progress.delivered_content > 0);
}

#[tokio::test(start_paused = true)]
async fn tb11_no_permit_is_held_during_backoff() {
    // One concurrency permit shared by two logical requests: while the first
    // backs off after a 503, the second must get the permit and finish.
    let inner = Scripted::new(vec![status(503), happy()]);
    let events: Events = Arc::default();
    let limited = tower::limit::ConcurrencyLimitLayer::new(1)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let svc = layer(policy().build().unwrap(), &events).layer(limited);
    let first = tokio::spawn(svc.clone().oneshot(request()));
    until(|| names(&events).contains(&"delay_scheduled")).await;
    // The first request is asleep in its backoff; the second goes through.
    let second = svc.clone().oneshot(request()).await.unwrap();
    let (_, err) = collect(second).await;
    assert!(err.is_none());
    assert_eq!(
        inner.calls(),
        2,
        "the second request was served during the backoff"
    );
    let resp = first.await.unwrap().unwrap();
    assert_eq!(resp.status(), 200);
    let (_, err) = collect(resp).await;
    assert!(err.is_none());
    assert_eq!(inner.calls(), 3);
}

/// A service whose readiness fails.
#[derive(Clone)]
struct NeverReady;

impl Service<Request<ReplayBody>> for NeverReady {
    type Response = Response<ScriptBody>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<ScriptBody>, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), std::io::Error>> {
        Poll::Ready(Err(std::io::Error::other("overloaded")))
    }

    fn call(&mut self, _req: Request<ReplayBody>) -> Self::Future {
        unreachable!("never called when not ready")
    }
}

#[tokio::test(start_paused = true)]
async fn tb11_a_readiness_error_is_final() {
    let events: Events = Arc::default();
    let svc = layer(policy().build().unwrap(), &events)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(NeverReady));
    let err = svc.oneshot(request()).await.unwrap_err();
    assert!(
        matches!(err.outcome(), Outcome::Permanent { .. }),
        "{}",
        err.outcome()
    );
    assert_eq!(err.report().attempt_count(), 1);
    assert!(
        err.inspect_cause().is_some(),
        "the readiness error is kept as evidence"
    );
}

#[tokio::test(start_paused = true)]
async fn ad4_failure_while_offline_parks_until_online() {
    use recovery_core::timing::ScriptedConnectivity;
    let inner = Scripted::new(vec![status(503), happy()]);
    let events: Events = Arc::default();
    let net = ScriptedConnectivity::new(false);
    let sink = Arc::clone(&events);
    let svc = RecoveryLayer::new(policy().build().unwrap())
        .with_connectivity(net.clone())
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let fut = tokio::spawn(svc.oneshot(request()));
    until(|| net.waiters() > 0).await;
    // Parked: half a minute passes offline (within the 60 s budget), and
    // nothing is sent.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(inner.calls(), 1, "no send while offline");
    assert!(names(&events).contains(&"parked_offline"));
    net.set_online(true);
    let resp = fut.await.unwrap().unwrap();
    let (_, err) = collect(resp).await;
    assert!(err.is_none());
    assert_eq!(inner.calls(), 2);
    assert_eq!(net.waiters(), 0, "the online listener was removed");
}

#[tokio::test(start_paused = true)]
async fn ad6_parking_is_bounded_by_the_recovery_budget() {
    use recovery_core::timing::ScriptedConnectivity;
    let inner = Scripted::new(vec![status(503)]);
    let events: Events = Arc::default();
    let net = ScriptedConnectivity::new(false);
    let sink = Arc::clone(&events);
    let svc = RecoveryLayer::new(policy().build().unwrap())
        .with_connectivity(net.clone())
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let started = tokio::time::Instant::now();
    let resp = svc.oneshot(request()).await.unwrap();
    assert_eq!(
        resp.status(),
        503,
        "the last answer, once the budget ran out"
    );
    assert_eq!(
        started.elapsed(),
        Duration::from_mins(1),
        "parked exactly for the budget"
    );
    assert_eq!(inner.calls(), 1);
    let report = resp.extensions().get::<ReportHandle>().unwrap().report();
    assert!(matches!(
        report.outcome,
        Some(Outcome::BudgetExhausted { .. })
    ));
    assert_eq!(net.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn bd9_after_commit_keepalives_do_not_hold_off_the_progress_watchdog() {
    let mut steps = vec![Step::Data(ROLE), Step::Data(HELLO)];
    steps.extend(std::iter::repeat_n(Step::Data(KEEPALIVE), 3));
    steps.push(Step::Pending);
    let inner = Scripted::new(vec![ok(&steps)]);
    let events: Events = Arc::default();
    let p = policy()
        .progress_timeout(Some(Duration::from_secs(20)))
        .build()
        .unwrap();
    let svc =
        layer(p, &events).layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let resp = svc.oneshot(request()).await.unwrap();
    let started = tokio::time::Instant::now();
    let (body, err) = collect(resp).await;
    assert_eq!(
        err,
        Some(Outcome::Interrupted {
            cause: recovery_core::outcome::InterruptCause::Stall,
            stall: Some(recovery_core::failure::Stall::Progress),
            committed: true,
        })
    );
    // The delta at 0 s is noticed at the first check (20 s / 16 = 1.25 s);
    // the keepalives after it never move the progress mark.
    assert_eq!(started.elapsed(), Duration::from_millis(21_250));
    assert_eq!(
        body,
        [ROLE, HELLO, KEEPALIVE, KEEPALIVE, KEEPALIVE]
            .concat()
            .as_bytes()
    );
    assert_eq!(inner.calls(), 1, "committed: not replayed");
}

#[derive(Default)]
struct Capture {
    requests: Mutex<Vec<Bytes>>,
    chunks: AtomicU32,
    veto_after_chunks: u32,
}

impl tower_recovery::recovery::WireObserver for Capture {
    fn on_request(
        &self,
        _attempt: u32,
        _head: &http::request::Parts,
        body: &Bytes,
    ) -> Result<(), tower_recovery::BoxError> {
        self.requests.lock().unwrap().push(body.clone());
        Ok(())
    }

    fn on_body_chunk(&self, _attempt: u32, _chunk: &Bytes) -> Result<(), tower_recovery::BoxError> {
        let n = self.chunks.fetch_add(1, Ordering::SeqCst) + 1;
        if self.veto_after_chunks != 0 && n >= self.veto_after_chunks {
            return Err("audit refused the stream".into());
        }
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn wire_observer_sees_every_send_and_its_error_stops_recovery() {
    // Sees both sends of a 503-then-success exchange.
    let inner = Scripted::new(vec![status(503), happy()]);
    let capture = Arc::new(Capture::default());
    let svc = RecoveryLayer::new(policy().build().unwrap())
        .with_wire_observer(Arc::clone(&capture))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let (_, err) = collect(svc.oneshot(request()).await.unwrap()).await;
    assert!(err.is_none());
    assert_eq!(capture.requests.lock().unwrap().len(), 2);
    assert!(capture.chunks.load(Ordering::SeqCst) >= 4);

    // A veto on the first chunk stops before anything is delivered.
    let inner = Scripted::new(vec![ok(&[Step::Data(ROLE), Step::Data(HELLO)])]);
    let capture = Arc::new(Capture {
        veto_after_chunks: 1,
        ..Capture::default()
    });
    let svc = RecoveryLayer::new(policy().build().unwrap())
        .with_wire_observer(Arc::clone(&capture))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let err = svc.oneshot(request()).await.unwrap_err();
    assert!(
        matches!(err.outcome(), Outcome::Permanent { .. }),
        "{}",
        err.outcome()
    );
    assert_eq!(inner.calls(), 1, "no replay after a veto");
    assert!(err.inspect_cause().is_some());
}

#[tokio::test(start_paused = true)]
async fn rq3_a_body_the_caller_streams_is_sent_once_never_buffered() {
    let inner = Scripted::new(vec![ok(&[Step::Data(ROLE), Step::Reset])]);
    let events: Events = Arc::default();
    let svc = layer(policy().build().unwrap(), &events)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(inner.clone()));
    let mut req = request();
    req.extensions_mut()
        .insert(RecoveryCall::new().streaming_body());
    let err = svc.oneshot(req).await.unwrap_err();
    assert_eq!(
        err.outcome(),
        &Outcome::ReplayDisabled {
            reason: ReplayDisabled::NotReplayable
        }
    );
    assert_eq!(inner.calls(), 1);
    assert_eq!(
        inner.bodies.lock().unwrap()[0],
        Bytes::from_static(b"{\"stream\":true}")
    );
    assert_eq!(
        err.report().replay_disabled,
        Some(ReplayDisabled::NotReplayable)
    );
}

const R_CREATED: &str = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_9\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n";
const R_DELTA_1: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":1,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hel\"}\n\n";
const R_DELTA_2: &str = "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"lo\"}\n\n";
const R_DONE: &str = "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_9\",\"object\":\"response\",\"status\":\"completed\",\"output\":[]}}\n\n";

#[tokio::test(start_paused = true)]
async fn ad5_a_resume_decided_offline_waits_for_the_network() {
    use recovery_core::timing::ScriptedConnectivity;
    let inner = Scripted::new(vec![
        ok(&[Step::Data(R_CREATED), Step::Data(R_DELTA_1), Step::Reset]),
        // The resumed stream repeats everything; the body drops what it had.
        ok(&[
            Step::Data(R_CREATED),
            Step::Data(R_DELTA_1),
            Step::Data(R_DELTA_2),
            Step::Data(R_DONE),
        ]),
    ]);
    let events: Events = Arc::default();
    let net = ScriptedConnectivity::new(true);
    let sink = Arc::clone(&events);
    let svc = RecoveryLayer::new(policy().build().unwrap())
        .with_connectivity(net.clone())
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiResponses).layer(inner.clone()));
    let req = Request::post("http://mock/v1/responses")
        .body(Full::new(Bytes::from_static(
            b"{\"model\":\"m\",\"input\":\"x\",\"stream\":true,\"background\":true}",
        )))
        .unwrap();
    let resp = svc.oneshot(req).await.unwrap();
    // The network goes away before the cut is seen.
    net.set_online(false);
    let reader = tokio::spawn(collect(resp));
    // The resume waits its backoff (at most 8 s) first, then parks.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(net.waiters(), 1, "parked after the backoff");
    assert_eq!(inner.calls(), 1, "no resume while offline");
    net.set_online(true);
    let (body, err) = reader.await.unwrap();
    assert!(err.is_none(), "{err:?}");
    assert_eq!(
        body,
        [R_CREATED, R_DELTA_1, R_DELTA_2, R_DONE]
            .concat()
            .as_bytes()
    );
    assert_eq!(inner.calls(), 2);
    let names = names(&events);
    // Backoff first, then connectivity, then the resume (AD5).
    let delay = names.iter().position(|n| *n == "delay_scheduled").unwrap();
    let park = names.iter().position(|n| *n == "parked_offline").unwrap();
    let resume = names.iter().position(|n| *n == "resume_started").unwrap();
    assert!(delay < park && park < resume, "{names:?}");
    assert_eq!(net.waiters(), 0);
}

#[tokio::test(start_paused = true)]
async fn cx1_dropping_the_body_while_a_resume_waits_cancels_it() {
    let inner = Scripted::new(vec![
        ok(&[Step::Data(R_CREATED), Step::Data(R_DELTA_1), Step::Reset]),
        ok(&[Step::Data(R_DELTA_2), Step::Data(R_DONE)]),
    ]);
    let events: Events = Arc::default();
    let p = policy()
        .backoff(Duration::from_secs(4), Duration::from_secs(8))
        .build()
        .unwrap();
    let svc = layer(p, &events)
        .layer(ObserveLayer::new(ProtocolKind::OpenAiResponses).layer(inner.clone()));
    let req = Request::post("http://mock/v1/responses")
        .body(Full::new(Bytes::from_static(
            b"{\"model\":\"m\",\"input\":\"x\",\"stream\":true,\"background\":true}",
        )))
        .unwrap();
    let resp = svc.oneshot(req).await.unwrap();
    let mut body = resp.into_body();
    // Read until the cut has been seen and the resume is waiting.
    let mut got = Vec::new();
    while !names(&events).contains(&"delay_scheduled") {
        match tokio::time::timeout(Duration::from_millis(10), body.frame()).await {
            Ok(Some(Ok(f))) => got.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Ok(other) => panic!("the body ended early: {:?}", other.map(|r| r.is_ok())),
            Err(_) => {}
        }
    }
    drop(body);
    assert_eq!(got, [R_CREATED, R_DELTA_1].concat().as_bytes());
    let names = names(&events);
    assert_eq!(names.last(), Some(&"cancelled"), "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == "cancelled").count(), 1);
    let last = events.lock().unwrap().last().cloned().unwrap();
    assert!(matches!(
        last.kind,
        EventKind::Cancelled {
            phase: CancelPhase::Waiting,
            ..
        }
    ));
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(inner.calls(), 1, "no resume after the consumer left");
}
