//! The fetch driver: runs one logical request through the engine.
//!
//! Mirrors the tower driver's decisions step for step: every send is begun
//! through [`Recovery::begin_attempt`]; before commit the attempt's head and
//! frames are held back and a failed attempt is invisible (status, headers,
//! bytes); commit happens on the first semantic fragment, at the hold-back
//! cap, or on terminal proof with no semantic output; after commit a failure
//! ends the stitched body with a typed error; a final HTTP error is returned
//! as that response; exactly one terminal event is emitted.
//!
//! `fetch` hides where a request failed (connect, send or awaiting the
//! head): a rejected `fetch()` is a transport failure in phase `unknown`
//! (acceptance unknown), a rejected `read()` one in phase `streaming`.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use js_sys::{Array, Function, Object, Reflect, Uint8Array};
use recovery_core::budget::{AttemptAllowance, RetryBudget};
use recovery_core::decision::{Action, AdmissionAnswer};
use recovery_core::engine::Recovery;
use recovery_core::failure::{EofEvidence, Failure, FailureKind, Phase, Stall, TransportKind};
use recovery_core::lifecycle::CommitTrigger;
use recovery_core::observer::{EndOfStream, ObserverConfig, StreamObserver};
use recovery_core::outcome::{CancelPhase, Outcome, ReplayDisabled};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_core::retry_after::{RetryAfter, parse_should_retry};
use recovery_core::safe::request_id_with;
use recovery_core::timing::{Fraction, Instant};
use recovery_core::watchdog::{WatchClock, Watchdog};
use recovery_core::wire::{Limits, ProtocolViolation};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{AbortController, ReadableStreamDefaultReader, ReadableStreamReadResult, Response};

use crate::js_value::to_js;
use crate::options::{ProtocolChoice, Settings, guess_protocol, has};
use crate::platform::{Platform, Wait, get, random_u64};

/// What a `createRecoveringFetch` instance shares between its requests.
pub(crate) struct Client {
    pub(crate) settings: Settings,
    pub(crate) budget: Option<RetryBudget>,
}

/// One logical request as the wrapper hands it over: the body is already
/// buffered so it can be replayed.
pub(crate) struct RequestSpec {
    pub(crate) fetch: Function,
    pub(crate) url: String,
    pub(crate) method: String,
    /// `[name, value]` pairs.
    pub(crate) headers: Array,
    pub(crate) body: Option<Uint8Array>,
    pub(crate) on_event: Option<Function>,
    pub(crate) admission: Option<Function>,
}

/// Caller cancellation: a flag, the in-flight attempt's `AbortController`
/// (aborted on cancel) and the waker of whoever is waiting.
#[derive(Default)]
pub(crate) struct Cancel {
    cancelled: Cell<bool>,
    waker: RefCell<Option<Waker>>,
    controller: RefCell<Option<AbortController>>,
}

impl Cancel {
    pub(crate) fn cancel(&self) {
        if self.cancelled.replace(true) {
            return;
        }
        if let Some(c) = self.controller.borrow().as_ref() {
            c.abort();
        }
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.get()
    }

    fn set_controller(&self, c: &AbortController) {
        *self.controller.borrow_mut() = Some(Clone::clone(c));
        if self.is_cancelled() {
            c.abort();
        }
    }

    fn abort_current(&self) {
        if let Some(c) = self.controller.borrow().as_ref() {
            c.abort();
        }
    }

    fn poll_cancelled(&self, cx: &mut Context<'_>) -> bool {
        if self.is_cancelled() {
            return true;
        }
        *self.waker.borrow_mut() = Some(cx.waker().clone());
        false
    }
}

/// What the driver waits on: a JS promise or a platform wait.
enum Awaited {
    Promise(JsFuture),
    Wait(Wait),
}

/// How a driver wait ended.
enum Woke {
    /// The promise settled.
    Settled(Result<JsValue, JsValue>),
    /// The platform wait (a sleep, connectivity) completed.
    Done,
    /// The bounding timer fired first.
    TimedOut,
    /// The stall watchdog fired first.
    Stalled(Stall),
    /// The caller cancelled first.
    Cancelled,
}

/// The platform's clock as the watchdog's.
pub(crate) struct WatchPlatform(Rc<dyn Platform>);

impl WatchClock for WatchPlatform {
    type Sleep = Wait;
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn sleep(&self, duration: Duration) -> Wait {
        self.0.sleep(duration)
    }
}

/// The one wait every await of the driver goes through: `awaited`, raced
/// against an optional timer, an optional stall watchdog and cancellation,
/// polled in that order (a result that already arrived wins).
struct WaitOn<'a> {
    awaited: Awaited,
    timer: Option<Wait>,
    watchdog: Option<&'a mut Watchdog<WatchPlatform>>,
    cancel: &'a Cancel,
}

impl Future for WaitOn<'_> {
    type Output = Woke;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Woke> {
        let this = self.get_mut();
        let ready = match &mut this.awaited {
            Awaited::Promise(p) => match Pin::new(p).poll(cx) {
                Poll::Ready(r) => Some(Woke::Settled(r)),
                Poll::Pending => None,
            },
            Awaited::Wait(w) => w.as_mut().poll(cx).is_ready().then_some(Woke::Done),
        };
        if let Some(woke) = ready {
            return Poll::Ready(woke);
        }
        if this
            .timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Woke::TimedOut);
        }
        if let Some(dog) = this.watchdog.as_mut() {
            if let Poll::Ready(stall) = dog.poll_stall(cx) {
                return Poll::Ready(Woke::Stalled(stall));
            }
        }
        if this.cancel.poll_cancelled(cx) {
            return Poll::Ready(Woke::Cancelled);
        }
        Poll::Pending
    }
}

/// Waits on `awaited` (made only when not already cancelled).
#[inline(never)]
fn wait_on<'a>(
    awaited: impl FnOnce() -> Awaited,
    timer: Option<Wait>,
    watchdog: Option<&'a mut Watchdog<WatchPlatform>>,
    cancel: &'a Cancel,
) -> Option<WaitOn<'a>> {
    if cancel.is_cancelled() {
        return None;
    }
    Some(WaitOn {
        awaited: awaited(),
        timer,
        watchdog,
        cancel,
    })
}

/// Runs a wait made by [`wait_on`]: `Woke::Cancelled` when it was not made.
async fn run(wait: Option<WaitOn<'_>>) -> Woke {
    match wait {
        Some(w) => w.await,
        None => Woke::Cancelled,
    }
}

/// Reads one chunk from `reader`, watched by `watchdog`.
async fn read(
    reader: &ReadableStreamDefaultReader,
    watchdog: Option<&mut Watchdog<WatchPlatform>>,
    cancel: &Cancel,
) -> Woke {
    run(wait_on(
        || Awaited::Promise(JsFuture::from(reader.read())),
        None,
        watchdog,
        cancel,
    ))
    .await
}

/// Waits on a platform wait (a sleep, connectivity) made before the
/// cancellation check, as the engine's drivers do.
async fn wait_platform(wait: Wait, cancel: &Cancel) -> bool {
    !matches!(
        run(wait_on(move || Awaited::Wait(wait), None, None, cancel)).await,
        Woke::Cancelled
    )
}

/// The engine, where its events go, and the sensitive evidence.
pub(crate) struct Shared {
    pub(crate) engine: Recovery,
    on_event: Option<Function>,
    /// The last JS error seen (may carry text from the wire).
    pub(crate) cause: JsValue,
    /// The last failed response's status text and headers are not kept:
    /// the final error response itself is returned to the caller.
    pub(crate) protocol: ProtocolKind,
    /// Clocks, timers, jitter and connectivity: the JS platform, or what a
    /// test injected.
    pub(crate) platform: Rc<dyn Platform>,
}

/// Now, on the request's monotonic clock.
pub(crate) fn now(shared: &SharedRef) -> Instant {
    shared.borrow().platform.now()
}

pub(crate) type SharedRef = Rc<RefCell<Shared>>;

/// Delivers pending lifecycle events to `onEvent` as plain objects with the
/// Rust serde field names. The callback runs with no borrow held, so it may
/// read the report; what it throws is ignored.
pub(crate) fn flush(shared: &SharedRef) {
    let (events, callback) = {
        let mut s = shared.borrow_mut();
        let events: Vec<_> = s.engine.drain_events().collect();
        (events, s.on_event.clone())
    };
    let Some(callback) = callback else { return };
    for event in events {
        let _ = callback.call1(&JsValue::UNDEFINED, &to_js(&event));
    }
}

/// Marks a promise we do not wait for as handled, so its rejection is not
/// an unhandled rejection (which ends a Node process).
fn settle(promise: js_sys::Promise) {
    drop(JsFuture::from(promise));
}

fn set(obj: &Object, key: &str, value: &JsValue) {
    let _ = Reflect::set(obj, &JsValue::from_str(key), value);
}

/// The rejection value for a request that ended without a response:
/// `{ message, outcome, report, cause }`; the wrapper turns it into a
/// `TypeError` (before commit) or a `RecoveryError` (after).
pub(crate) fn failure_value(shared: &SharedRef, outcome: &Outcome, committed: bool) -> JsValue {
    let s = shared.borrow();
    let report = s.engine.report();
    let obj = Object::new();
    let mut message = format!(
        "recovery failed: {outcome} ({} attempt(s)",
        report.attempt_count()
    );
    if let Some(status) = report.last_status() {
        let _ = write!(message, ", last status {status}");
    }
    message.push(')');
    set(&obj, "message", &JsValue::from_str(&message));
    set(&obj, "outcome", &to_js(outcome));
    set(&obj, "report", &to_js(report));
    set(&obj, "cause", &s.cause);
    set(&obj, "committed", &JsValue::from_bool(committed));
    obj.into()
}

/// A committed attempt's body, consumed by [`Call::next`](crate::Call).
pub(crate) struct Live {
    reader: Option<ReadableStreamDefaultReader>,
    observer: StreamObserver,
    held: VecDeque<Uint8Array>,
    delivered_bytes: u64,
    /// The engine has ended the request.
    pub(crate) done: bool,
    /// A provider error arrived in the last delivered chunk: fail next.
    failed_after_chunk: Option<Failure>,
    /// The stall watchdog after commit (idle and progress).
    watchdog: Watchdog<WatchPlatform>,
}

/// What a finished attempt hands back.
pub(crate) enum Resolved {
    /// Committed: the response head, and the live body kept by the call.
    Committed(Response, Box<Live>),
    /// A final HTTP error, returned as that response.
    ErrorResponse(Response),
}

enum Attempt {
    Commit(Response, Box<Live>),
    Failed(Failure, Option<(Response, AbortController)>),
    Cancelled(CancelPhase),
}

fn transport(phase: Phase) -> Failure {
    Failure::transport(TransportKind::Other, phase)
}

fn protocol_failure(v: ProtocolViolation) -> Failure {
    Failure::new(
        FailureKind::Protocol {
            violation: v.into(),
        },
        Phase::Decoding,
    )
}

fn eof_failure(pending: Option<recovery_core::protocol::PendingAtEof>) -> Failure {
    Failure::new(
        FailureKind::UnexpectedEof {
            eof: EofEvidence {
                pending_bytes: pending.map_or(0, |p| p.bytes),
                pending_may_be_semantic: pending.is_some_and(|p| p.possibly_semantic),
            },
        },
        Phase::Streaming,
    )
}

/// Starts the engine for one logical request.
pub(crate) fn start_engine(
    client: &Client,
    spec: &RequestSpec,
    platform: Rc<dyn Platform>,
) -> SharedRef {
    let policy: RecoveryPolicy = client.settings.policy.clone();
    let allowance = AttemptAllowance::new(policy.max_attempts().get());
    let mut engine = Recovery::new(policy, allowance, random_u64(), platform.now())
        .with_admission_hook(spec.admission.is_some());
    if let Some(budget) = &client.budget {
        engine = engine.with_retry_budget(budget.clone());
    }
    let protocol = match &client.settings.protocol {
        ProtocolChoice::Auto => guess_protocol(&spec.url),
        ProtocolChoice::Fixed(kind) => kind.clone(),
    };
    Rc::new(RefCell::new(Shared {
        engine,
        on_event: spec.on_event.clone(),
        cause: JsValue::UNDEFINED,
        protocol,
        platform,
    }))
}

/// Drives the logical request up to commit, a final HTTP error response, or
/// a terminal failure (`Err` carries the rejection value).
pub(crate) async fn drive(
    spec: &RequestSpec,
    shared: &SharedRef,
    cancel: &Cancel,
) -> Result<Resolved, JsValue> {
    let timing = Rc::clone(&shared.borrow().platform);
    let connectivity = Rc::clone(&timing);
    let policy = shared.borrow().engine.policy().clone();
    if spec
        .body
        .as_ref()
        .is_some_and(|b| b.length() as usize > policy.replay_body_cap())
    {
        shared
            .borrow_mut()
            .engine
            .disable_replay(ReplayDisabled::BodyTooLarge);
    }
    let end = |outcome: Outcome| -> Result<Resolved, JsValue> {
        flush(shared);
        Err(failure_value(shared, &outcome, false))
    };
    loop {
        let begun = {
            let r = shared.borrow_mut().engine.begin_attempt(
                timing.now(),
                cancel.is_cancelled(),
                false,
            );
            flush(shared);
            r
        };
        if let Err(outcome) = begun {
            return end(outcome);
        }

        let (failure, mut error_response) = match run_attempt(spec, shared, cancel, &policy).await {
            Attempt::Commit(response, live) => return Ok(Resolved::Committed(response, live)),
            Attempt::Cancelled(phase) => {
                let outcome = shared.borrow_mut().engine.cancel(timing.now(), phase);
                return end(outcome);
            }
            Attempt::Failed(failure, error_response) => (failure, error_response),
        };

        let mut action = {
            let a = shared.borrow_mut().engine.fail(
                timing.now(),
                failure.clone(),
                connectivity.is_online(),
                timing.jitter(),
            );
            flush(shared);
            a
        };
        let release = |resp: &mut Option<(Response, AbortController)>| {
            // Superseded by a retry: release its connection.
            if let Some((_, controller)) = resp.take() {
                controller.abort();
            }
        };
        loop {
            match action {
                Action::RetryAfter { delay, .. } | Action::Resume { delay, .. } => {
                    release(&mut error_response);
                    if !wait_platform(timing.sleep(delay), cancel).await {
                        let outcome = shared
                            .borrow_mut()
                            .engine
                            .cancel(timing.now(), CancelPhase::Waiting);
                        return end(outcome);
                    }
                    break;
                }
                Action::ParkUntilOnline => {
                    if !wait_platform(connectivity.wait_until_online(), cancel).await {
                        release(&mut error_response);
                        let outcome = shared
                            .borrow_mut()
                            .engine
                            .cancel(timing.now(), CancelPhase::Parked);
                        return end(outcome);
                    }
                    action = shared
                        .borrow_mut()
                        .engine
                        .online_again(timing.now(), timing.jitter());
                    flush(shared);
                }
                Action::AskAdmission => {
                    let answer = match &spec.admission {
                        None => Some(AdmissionAnswer::Unresolved),
                        Some(hook) => ask_admission(hook, shared, &failure, cancel).await,
                    };
                    let Some(answer) = answer else {
                        release(&mut error_response);
                        let outcome = shared
                            .borrow_mut()
                            .engine
                            .cancel(timing.now(), CancelPhase::Admission);
                        return end(outcome);
                    };
                    action = shared.borrow_mut().engine.admission(
                        timing.now(),
                        answer,
                        connectivity.is_online(),
                        timing.jitter(),
                    );
                    flush(shared);
                }
                Action::Fail(outcome) => {
                    if let Some((response, _)) = error_response.take() {
                        return Ok(Resolved::ErrorResponse(response));
                    }
                    return end(outcome);
                }
            }
        }
    }
}

/// Calls the admission hook with `{ logicalId, nextAttempt, failure }`; it
/// may answer `"allow"`, `"reject"`, `true`/`false` or a promise of those.
/// Anything else (or a throw) is `unresolved`: pending is not approval.
/// `None` when cancelled first (the hook is not called once cancelled).
async fn ask_admission(
    hook: &Function,
    shared: &SharedRef,
    failure: &Failure,
    cancel: &Cancel,
) -> Option<AdmissionAnswer> {
    if cancel.is_cancelled() {
        return None;
    }
    let ctx = Object::new();
    {
        let s = shared.borrow();
        set(&ctx, "logicalId", &JsValue::from_str(s.engine.logical_id()));
        set(
            &ctx,
            "nextAttempt",
            &JsValue::from(s.engine.wire_attempt() + 1),
        );
    }
    set(&ctx, "failure", &to_js(failure));
    let Ok(value) = hook.call1(&JsValue::UNDEFINED, &ctx) else {
        return Some(AdmissionAnswer::Unresolved);
    };
    let value = match value.dyn_into::<js_sys::Promise>() {
        Ok(p) => {
            let wait = WaitOn {
                awaited: Awaited::Promise(JsFuture::from(p)),
                timer: None,
                watchdog: None,
                cancel,
            };
            match wait.await {
                Woke::Settled(Ok(v)) => v,
                Woke::Settled(Err(_)) => return Some(AdmissionAnswer::Unresolved),
                _ => return None,
            }
        }
        Err(v) => v,
    };
    Some(match (value.as_bool(), value.as_string().as_deref()) {
        (Some(true), _) | (_, Some("allow")) => AdmissionAnswer::Allow,
        (Some(false), _) | (_, Some("reject")) => AdmissionAnswer::Reject,
        _ => AdmissionAnswer::Unresolved,
    })
}

fn observer_for(
    protocol: &ProtocolKind,
    content_type: Option<&str>,
    policy: &RecoveryPolicy,
) -> StreamObserver {
    let config = ObserverConfig {
        limits: Limits::default(),
        ..ObserverConfig::default()
    };
    let _ = policy;
    let ct = content_type.unwrap_or("").to_ascii_lowercase();
    if has(&ct, "json") && !has(&ct, "ndjson") && !has(&ct, "jsonl") {
        StreamObserver::non_streaming(protocol.clone(), config)
    } else {
        StreamObserver::with_config(protocol.clone(), config)
    }
}

/// A settled `read()`: `Ok(Some(bytes))`, `Ok(None)` at the end, `Err(js)`
/// when the read rejected.
fn chunk_of(settled: Result<JsValue, JsValue>) -> Result<Option<Uint8Array>, JsValue> {
    let result: ReadableStreamReadResult = settled?.unchecked_into();
    if result.get_done().unwrap_or(false) {
        return Ok(None);
    }
    let value = result.get_value();
    Ok(Some(if value.is_instance_of::<Uint8Array>() {
        value.unchecked_into()
    } else {
        Uint8Array::new(&value)
    }))
}

/// Feeds a chunk to the observer without copying it twice.
fn feed(observer: &mut StreamObserver, chunk: &Uint8Array) -> Result<(), ProtocolViolation> {
    let bytes = chunk.to_vec();
    observer.observe(&bytes)
}

/// One physical attempt, up to commit or failure.
async fn run_attempt(
    spec: &RequestSpec,
    shared: &SharedRef,
    cancel: &Cancel,
    policy: &RecoveryPolicy,
) -> Attempt {
    let timing = Rc::clone(&shared.borrow().platform);
    let Ok(controller) = AbortController::new() else {
        return Attempt::Failed(transport(Phase::Unknown), None);
    };
    cancel.set_controller(&controller);
    if cancel.is_cancelled() {
        return Attempt::Cancelled(CancelPhase::Sending);
    }
    let init = Object::new();
    set(&init, "method", &JsValue::from_str(&spec.method));
    set(&init, "headers", &spec.headers);
    if let Some(body) = &spec.body {
        set(&init, "body", body);
    }
    set(&init, "redirect", &JsValue::from_str("manual"));
    set(&init, "signal", &controller.signal());

    let promise = match spec
        .fetch
        .call2(&js_sys::global(), &JsValue::from_str(&spec.url), &init)
    {
        Ok(p) => js_sys::Promise::resolve(&p),
        Err(e) => js_sys::Promise::reject(&e),
    };
    let head_timer = policy.head_timeout().map(|d| timing.sleep(d));
    let fetched = run(wait_on(
        || Awaited::Promise(JsFuture::from(promise)),
        head_timer,
        None,
        cancel,
    ))
    .await;
    let response = match fetched {
        Woke::Cancelled | Woke::Done | Woke::Stalled(_) => {
            return Attempt::Cancelled(CancelPhase::AwaitingHead);
        }
        Woke::TimedOut => {
            controller.abort();
            return Attempt::Failed(
                Failure::new(
                    FailureKind::Timeout { stall: Stall::Head },
                    Phase::AwaitingHeaders,
                ),
                None,
            );
        }
        Woke::Settled(Err(e)) => {
            if cancel.is_cancelled() {
                return Attempt::Cancelled(CancelPhase::AwaitingHead);
            }
            shared.borrow_mut().cause = e;
            return Attempt::Failed(transport(Phase::Unknown), None);
        }
        Woke::Settled(Ok(r)) => r.unchecked_into::<Response>(),
    };

    let js_headers = response.headers();
    let header = |name: &str| js_headers.get(name).ok().flatten();
    let status = response.status();
    let opaque_redirect = get(&response, "type").as_string().as_deref() == Some("opaqueredirect");
    {
        shared
            .borrow_mut()
            .engine
            .head_received(timing.now(), status, request_id_with(header));
        flush(shared);
    }

    if opaque_redirect || !(200..300).contains(&status) {
        // Classify from (a capped part of) a clone of the error body; keep
        // the original untouched in case it is the final answer.
        let mut error_body = Vec::new();
        if !opaque_redirect {
            if let Ok(probe) = response.clone() {
                if let Some(stream) = probe.body() {
                    let reader: ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
                    let cap = policy.evidence_cap();
                    while error_body.len() < cap {
                        let settled = match read(&reader, None, cancel).await {
                            Woke::Settled(r) => chunk_of(r),
                            _ => return Attempt::Cancelled(CancelPhase::Streaming),
                        };
                        match settled {
                            Ok(Some(chunk)) => {
                                let bytes = chunk.to_vec();
                                let room = cap - error_body.len();
                                error_body.extend_from_slice(&bytes[..bytes.len().min(room)]);
                            }
                            Ok(None) | Err(_) => break,
                        }
                    }
                    settle(reader.cancel());
                }
            }
        }
        let retry_after = RetryAfter::from_values(
            header("retry-after-ms").as_deref(),
            header("retry-after").as_deref(),
            timing.wall_now(),
        );
        let should_retry = header("x-should-retry")
            .as_deref()
            .and_then(parse_should_retry);
        let mut failure = if opaque_redirect {
            // The browser hides the redirect's status: status 0, kind redirect.
            let mut f = Failure::new(FailureKind::Redirect { status }, Phase::AwaitingHeaders);
            f.acceptance = recovery_core::failure::Acceptance::Yes;
            f.status = Some(status);
            f
        } else {
            Failure::status(status, retry_after, should_retry)
        };
        if !(300..400).contains(&status) && !opaque_redirect {
            let protocol = shared.borrow().protocol.clone();
            if let Some(error) =
                recovery_core::protocol::classify_error_body(&protocol, Some(status), &error_body)
            {
                failure.kind = FailureKind::Provider { error };
            }
        }
        return Attempt::Failed(failure, Some((response, controller)));
    }

    // A 2xx: stream until commit, holding the prefix back.
    let protocol = shared.borrow().protocol.clone();
    let content_type = header("content-type");
    let mut observer = observer_for(&protocol, content_type.as_deref(), policy);
    let reader: Option<ReadableStreamDefaultReader> =
        response.body().map(|s| s.get_reader().unchecked_into());
    let mut held: VecDeque<Uint8Array> = VecDeque::new();
    let mut held_bytes = 0usize;
    // Time to the first semantic fragment; commit ends it (as in tower).
    let mut watchdog = Watchdog::start(
        WatchPlatform(Rc::clone(&timing)),
        policy.idle_timeout(),
        policy.progress_timeout(),
    );
    let fail_with = |failure: Failure, observer: &StreamObserver| {
        controller.abort();
        Attempt::Failed(
            failure
                .with_progress(*observer.progress())
                .with_status(status),
            None,
        )
    };
    loop {
        let next = match &reader {
            None => Ok(Ok(None)),
            Some(reader) => match read(reader, Some(&mut watchdog), cancel).await {
                Woke::Settled(r) => Ok(chunk_of(r)),
                Woke::Stalled(stall) => Err(stall),
                _ => return Attempt::Cancelled(CancelPhase::Streaming),
            },
        };
        match next {
            Err(stall) => {
                return fail_with(
                    Failure::new(FailureKind::Timeout { stall }, Phase::Streaming),
                    &observer,
                );
            }
            Ok(Err(e)) => {
                if cancel.is_cancelled() {
                    return Attempt::Cancelled(CancelPhase::Streaming);
                }
                shared.borrow_mut().cause = e;
                return fail_with(transport(Phase::Streaming), &observer);
            }
            Ok(Ok(Some(chunk))) => {
                let fed = feed(&mut observer, &chunk);
                watchdog.on_frame(observer.progress().semantic_fragments());
                held_bytes += chunk.length() as usize;
                held.push_back(chunk);
                shared
                    .borrow_mut()
                    .engine
                    .record_progress(*observer.progress());
                if let Err(v) = fed {
                    return fail_with(protocol_failure(v), &observer);
                }
                if let Some(error) = observer.provider_error() {
                    let error = error.clone();
                    return fail_with(
                        Failure::new(FailureKind::Provider { error }, Phase::Streaming),
                        &observer,
                    );
                }
                let trigger = if observer.progress().semantic_observed() {
                    Some(CommitTrigger::Semantic)
                } else if observer.terminal().is_some() {
                    Some(CommitTrigger::Terminal)
                } else if held_bytes > policy.holdback_cap() {
                    Some(CommitTrigger::HoldbackCap)
                } else {
                    None
                };
                if let Some(trigger) = trigger {
                    shared.borrow_mut().engine.commit(timing.now(), trigger);
                    flush(shared);
                    let live = Live {
                        reader,
                        observer,
                        held,
                        delivered_bytes: 0,
                        done: false,
                        failed_after_chunk: None,
                        watchdog: Watchdog::start(
                            WatchPlatform(Rc::clone(&timing)),
                            policy.idle_timeout(),
                            policy.progress_timeout(),
                        ),
                    };
                    return Attempt::Commit(response, Box::new(live));
                }
            }
            Ok(Ok(None)) => {
                // Ended before commit: proof with no semantic output is an
                // (empty) answer; anything else is a failure of this attempt.
                return match observer.finish() {
                    EndOfStream::Success { .. } | EndOfStream::Unsuccessful { .. } => {
                        shared
                            .borrow_mut()
                            .engine
                            .commit(timing.now(), CommitTrigger::Terminal);
                        flush(shared);
                        let live = Live {
                            reader: None,
                            observer,
                            held,
                            delivered_bytes: 0,
                            done: false,
                            failed_after_chunk: None,
                            watchdog: Watchdog::start(
                                WatchPlatform(Rc::clone(&timing)),
                                None,
                                None,
                            ),
                        };
                        Attempt::Commit(response, Box::new(live))
                    }
                    EndOfStream::ProviderError { error } => fail_with(
                        Failure::new(FailureKind::Provider { error }, Phase::Streaming),
                        &observer,
                    ),
                    EndOfStream::Violation { violation } => {
                        fail_with(protocol_failure(violation), &observer)
                    }
                    EndOfStream::UnexpectedEof { pending } => {
                        fail_with(eof_failure(pending), &observer)
                    }
                };
            }
        }
    }
}

/// The committed body's next chunk: `Ok(Some)` bytes, `Ok(None)` at the
/// end with proof, `Err` the rejection value of a failure after commit.
pub(crate) async fn next_chunk(
    live: &mut Live,
    shared: &SharedRef,
    cancel: &Cancel,
) -> Result<Option<Uint8Array>, JsValue> {
    if live.done {
        return Ok(None);
    }
    if let Some(chunk) = live.held.pop_front() {
        deliver(live, shared, &chunk);
        return Ok(Some(chunk));
    }
    if let Some(failure) = live.failed_after_chunk.take() {
        return Err(fail_live(live, shared, cancel, failure));
    }
    if cancel.is_cancelled() {
        cancel_live(live, shared);
        return Ok(None);
    }
    let Some(reader) = live.reader.clone() else {
        return end_live(live, shared, cancel);
    };
    let read = match read(&reader, Some(&mut live.watchdog), cancel).await {
        Woke::Settled(r) => chunk_of(r),
        Woke::Stalled(stall) => {
            return Err(fail_live(
                live,
                shared,
                cancel,
                Failure::new(FailureKind::Timeout { stall }, Phase::Streaming),
            ));
        }
        _ => {
            cancel_live(live, shared);
            return Ok(None);
        }
    };
    match read {
        Err(e) => {
            if cancel.is_cancelled() {
                cancel_live(live, shared);
                return Ok(None);
            }
            shared.borrow_mut().cause = e;
            Err(fail_live(live, shared, cancel, transport(Phase::Streaming)))
        }
        Ok(None) => {
            live.reader = None;
            end_live(live, shared, cancel)
        }
        Ok(Some(chunk)) => {
            if let Err(v) = feed(&mut live.observer, &chunk) {
                return Err(fail_live(live, shared, cancel, protocol_failure(v)));
            }
            let semantic = live.observer.progress().semantic_fragments();
            live.watchdog.on_frame(semantic);
            if let Some(error) = live.observer.provider_error() {
                live.failed_after_chunk = Some(Failure::new(
                    FailureKind::Provider {
                        error: error.clone(),
                    },
                    Phase::Streaming,
                ));
            }
            deliver(live, shared, &chunk);
            Ok(Some(chunk))
        }
    }
}

fn deliver(live: &mut Live, shared: &SharedRef, chunk: &Uint8Array) {
    live.delivered_bytes += u64::from(chunk.length());
    let mut progress = *live.observer.progress();
    progress.deliver_observed();
    progress.delivered_bytes = live.delivered_bytes;
    shared.borrow_mut().engine.record_progress(progress);
}

fn end_live(
    live: &mut Live,
    shared: &SharedRef,
    cancel: &Cancel,
) -> Result<Option<Uint8Array>, JsValue> {
    match live.observer.finish() {
        EndOfStream::Success { proof } => {
            live.done = true;
            let mut progress = *live.observer.progress();
            progress.deliver_observed();
            progress.delivered_bytes = live.delivered_bytes;
            let now = now(shared);
            shared.borrow_mut().engine.succeed(now, proof, progress);
            flush(shared);
            Ok(None)
        }
        EndOfStream::Unsuccessful { reason } => Err(fail_live(
            live,
            shared,
            cancel,
            Failure::new(FailureKind::Unsuccessful { reason }, Phase::Streaming),
        )),
        EndOfStream::Violation { violation } => {
            Err(fail_live(live, shared, cancel, protocol_failure(violation)))
        }
        EndOfStream::ProviderError { .. } => Err(fail_live(
            live,
            shared,
            cancel,
            eof_failure(live.observer.pending_at_eof()),
        )),
        EndOfStream::UnexpectedEof { pending } => {
            Err(fail_live(live, shared, cancel, eof_failure(pending)))
        }
    }
}

/// A failure after commit: only a resume could continue, and this driver
/// does not resume, so it ends the request with the engine's outcome.
fn fail_live(live: &mut Live, shared: &SharedRef, cancel: &Cancel, failure: Failure) -> JsValue {
    live.done = true;
    cancel.abort_current();
    if let Some(reader) = live.reader.take() {
        settle(reader.cancel());
    }
    let mut progress = *live.observer.progress();
    progress.deliver_observed();
    progress.delivered_bytes = live.delivered_bytes;
    let now = now(shared);
    let outcome = {
        let mut s = shared.borrow_mut();
        match s
            .engine
            .fail(now, failure.with_progress(progress), true, Fraction::ZERO)
        {
            Action::Fail(o) => o,
            _ => s.engine.cancel(now, CancelPhase::Streaming),
        }
    };
    flush(shared);
    failure_value(shared, &outcome, true)
}

/// The consumer cancelled the committed body.
pub(crate) fn cancel_live(live: &mut Live, shared: &SharedRef) {
    if live.done {
        return;
    }
    live.done = true;
    if let Some(reader) = live.reader.take() {
        settle(reader.cancel());
    }
    let now = now(shared);
    shared
        .borrow_mut()
        .engine
        .cancel(now, CancelPhase::Streaming);
    flush(shared);
}
