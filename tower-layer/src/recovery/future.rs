use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use recovery_core::call::{Cancellation, RecoveryCall, SendCredit};
use recovery_core::decision::{Action, AdmissionAnswer};
use recovery_core::engine::Recovery;
use recovery_core::error::{Evidence, RecoveryError};
use recovery_core::failure::{Failure, FailureKind, Phase, Stall};
use recovery_core::lifecycle::CommitTrigger;
use recovery_core::outcome::{CancelPhase, ReplayDisabled};
use recovery_core::progress::Terminal;
use recovery_core::retry_after::{RetryAfter, parse_should_retry};
use recovery_core::safe::request_id_from;
use recovery_core::timing::Timing;
use recovery_core::wait::{First, TimedOut, first, unless, within};
use recovery_core::watchdog::Watchdog;

use super::body::{Committed, RecoveryBody, clock};
use super::bounds::{DriverConnectivity, DriverTiming, InnerService, StreamBody};
use super::classify;
use super::layer::{AdmissionContext, Config};
use super::resume::{ResumeCtx, SendFn};
use super::shared::{ReportHandle, Shared, SharedRef, lock};
use crate::BoxError;
use crate::observe::ObserveHandle;
use crate::request_body::{Buffered, ReplayBody, buffer};

type Driven<B> =
    Pin<Box<dyn Future<Output = Result<Response<RecoveryBody<B>>, RecoveryError>> + Send>>;

pin_project_lite::pin_project! {
    /// Response future of [`Recover`](super::Recover): resolves at commit
    /// with the committed attempt's head, or with the final HTTP error
    /// response, or fails with a typed [`RecoveryError`].
    pub struct ResponseFuture<B> {
        #[pin]
        inner: Driven<B>,
    }
}

impl<B> ResponseFuture<B> {
    pub(crate) fn new(
        fut: impl Future<Output = Result<Response<RecoveryBody<B>>, RecoveryError>> + Send + 'static,
    ) -> Self {
        ResponseFuture {
            inner: Box::pin(fut),
        }
    }
}

impl<B> std::fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<B> Future for ResponseFuture<B> {
    type Output = Result<Response<RecoveryBody<B>>, RecoveryError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

/// Cancels the logical request if the response future is dropped before it
/// resolved (the caller gave up): exactly one terminal event either way.
struct DropGuard {
    shared: SharedRef,
    clock: Arc<dyn super::body::BodyClock>,
    phase: CancelPhase,
    armed: bool,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if self.armed {
            let mut s = lock(&self.shared);
            let now = self.clock.now();
            s.engine.cancel(now, self.phase);
            s.flush();
        }
    }
}

/// Races `fut` against the caller's cancellation.
async fn or_cancel<F: Future>(fut: F, cancel: &Cancellation) -> Option<F::Output> {
    unless(fut, cancel.cancelled()).await
}

enum Attempt<B> {
    /// Committed: hand the response to the caller.
    Commit(Response<RecoveryBody<B>>),
    /// Failed: decide. `Some` keeps an HTTP error response to return if this
    /// turns out to be the last attempt.
    Failed(Failure, Option<ErrorResponse<B>>),
    /// Cancelled by the caller.
    Cancelled(CancelPhase),
}

struct ErrorResponse<B> {
    parts: http::response::Parts,
    body: RecoveryBody<B>,
}

fn fresh_id<T: Timing>(timing: &T) -> u64 {
    let a = (timing.jitter().get() * f64::from(u32::MAX)) as u64;
    let b = (timing.jitter().get() * f64::from(u32::MAX)) as u64;
    (a << 32) ^ b
}

pub(crate) async fn drive<S, B, ResBody, T, C>(
    config: Arc<Config<T, C>>,
    svc: S,
    mut req: Request<B>,
) -> Result<Response<RecoveryBody<ResBody>>, RecoveryError>
where
    S: InnerService<ResBody>,
    B: StreamBody,
    ResBody: StreamBody,
    T: DriverTiming,
    C: DriverConnectivity,
{
    let timing = config.timing.clone();
    let prepaid_first = req.extensions_mut().remove::<SendCredit>().is_some();
    let mut call = req
        .extensions_mut()
        .remove::<RecoveryCall>()
        .unwrap_or_default();
    let policy = call
        .policy()
        .cloned()
        .unwrap_or_else(|| config.policy.clone());
    let (allowance, logical_id) = call.join(policy.max_attempts().get(), fresh_id(&timing));
    let cancel = call.cancellation().clone();
    let now = timing.now();
    let mut engine = Recovery::new(policy.clone(), allowance, logical_id, now)
        .with_admission_hook(config.admission.is_some());
    if let Some(budget) = &config.retry_budget {
        engine = engine.with_retry_budget(budget.clone());
    }
    #[cfg(feature = "tracing")]
    tracing::Span::current().record("recovery.logical_id", engine.logical_id());
    let report = ReportHandle::new(engine.report().clone());
    let shared: SharedRef = Arc::new(Mutex::new(Shared {
        engine,
        observer: Arc::clone(&config.observer),
        report: report.clone(),
        evidence: Evidence::with_cap(policy.evidence_cap()),
    }));
    let mut guard = DropGuard {
        shared: Arc::clone(&shared),
        clock: clock(&timing),
        phase: CancelPhase::Sending,
        armed: true,
    };

    let (parts, body) = req.into_parts();
    let mut once_body = None;
    let buffered = if call.streams_body() {
        Ok(Buffered::NotReplayable(ReplayBody::once(
            UnsyncBoxBody::new(body.map_err(Into::into)),
        )))
    } else {
        buffer(body, policy.replay_body_cap()).await
    };
    let bytes = match buffered {
        Ok(Buffered::NotReplayable(body)) => {
            lock(&shared)
                .engine
                .disable_replay(ReplayDisabled::NotReplayable);
            once_body = Some(body);
            Bytes::new()
        }
        Ok(Buffered::Replayable(bytes)) => bytes,
        Ok(Buffered::TooLarge(body)) => {
            lock(&shared)
                .engine
                .disable_replay(ReplayDisabled::BodyTooLarge);
            once_body = Some(body);
            Bytes::new()
        }
        Err(_) => {
            // The caller's body failed before anything was sent.
            let mut s = lock(&shared);
            s.engine.disable_replay(ReplayDisabled::NotReplayable);
            let outcome = s.engine.cancel(timing.now(), CancelPhase::Sending);
            s.flush();
            guard.armed = false;
            return Err(s.error(outcome));
        }
    };

    let mut prepaid = prepaid_first;
    loop {
        // Immediately before the send: cancellation, deadline, allowance.
        let begun = {
            let mut s = lock(&shared);
            let r = s
                .engine
                .begin_attempt(timing.now(), cancel.is_cancelled(), prepaid);
            s.flush();
            r
        };
        prepaid = false;
        if let Err(outcome) = begun {
            guard.armed = false;
            return Err(lock(&shared).error(outcome));
        }

        guard.phase = CancelPhase::Sending;
        let body = once_body
            .take()
            .unwrap_or_else(|| ReplayBody::full(bytes.clone()));
        if let Some(wire) = &config.wire {
            let attempt = lock(&shared).engine.wire_attempt();
            if let Err(e) = wire.on_request(attempt, &parts, &bytes) {
                let mut s = lock(&shared);
                s.evidence.set_cause(Arc::from(e));
                let action = s.engine.fail(
                    timing.now(),
                    Failure::new(FailureKind::ObserverRejected, Phase::Sending),
                    true,
                    timing.jitter(),
                );
                s.flush();
                guard.armed = false;
                let outcome = match action {
                    Action::Fail(o) => o,
                    _ => s.engine.cancel(timing.now(), CancelPhase::Sending),
                };
                s.flush();
                return Err(s.error(outcome));
            }
        }
        let mut attempt_req = Request::from_parts(parts.clone(), body);
        attempt_req.extensions_mut().insert(call.clone());
        attempt_req.extensions_mut().insert(SendCredit);

        let (logical, wire_attempt) = {
            let s = lock(&shared);
            (s.engine.logical_id().to_owned(), s.engine.wire_attempt())
        };
        let attempt = traced(
            run_attempt(
                &config,
                svc.clone(),
                attempt_req,
                &shared,
                &cancel,
                &mut guard,
                Origin {
                    head: &parts,
                    body: &bytes,
                    call: &call,
                },
            ),
            &logical,
            wire_attempt,
        )
        .await;

        let (failure, error_response) = match attempt {
            Attempt::Commit(mut response) => {
                guard.armed = false;
                response.extensions_mut().insert(report);
                return Ok(response);
            }
            Attempt::Cancelled(phase) => {
                guard.armed = false;
                let mut s = lock(&shared);
                let outcome = s.engine.cancel(timing.now(), phase);
                s.flush();
                return Err(s.error(outcome));
            }
            Attempt::Failed(failure, error_response) => (failure, error_response),
        };
        let mut last_error_response = error_response;

        let mut action = {
            let mut s = lock(&shared);
            let a = s.engine.fail(
                timing.now(),
                failure.clone(),
                config.connectivity.is_online(),
                timing.jitter(),
            );
            s.flush();
            a
        };
        loop {
            match action {
                Action::RetryAfter { delay, .. } | Action::Resume { delay, .. } => {
                    guard.phase = CancelPhase::Waiting;
                    if or_cancel(timing.sleep(delay), &cancel).await.is_none() {
                        guard.armed = false;
                        let mut s = lock(&shared);
                        let outcome = s.engine.cancel(timing.now(), CancelPhase::Waiting);
                        s.flush();
                        return Err(s.error(outcome));
                    }
                    break;
                }
                Action::ParkUntilOnline => {
                    guard.phase = CancelPhase::Parked;
                    let limit = lock(&shared).engine.wait_limit(timing.now());
                    let waited = or_cancel(
                        within(
                            config.connectivity.wait_until_online(),
                            limit.map(|d| timing.sleep(d)),
                        ),
                        &cancel,
                    )
                    .await;
                    if waited.is_none() {
                        guard.armed = false;
                        let mut s = lock(&shared);
                        let outcome = s.engine.cancel(timing.now(), CancelPhase::Parked);
                        s.flush();
                        return Err(s.error(outcome));
                    }
                    let mut s = lock(&shared);
                    // Online again, or the budget ran out while parked: either
                    // way the decision is taken again, now.
                    action = s.engine.online_again(timing.now(), timing.jitter());
                    s.flush();
                }
                Action::AskAdmission => {
                    guard.phase = CancelPhase::Admission;
                    let hook = config.admission.clone();
                    let ctx = {
                        let s = lock(&shared);
                        AdmissionContext {
                            logical_id: s.engine.logical_id().to_owned(),
                            next_attempt: s.engine.wire_attempt() + 1,
                            failure: failure.clone(),
                        }
                    };
                    // Pending is not approval: the hook is bounded by the
                    // budget and the deadline, and then counts as unresolved.
                    let limit = lock(&shared).engine.wait_limit(timing.now());
                    let answer = match hook {
                        Some(hook) => {
                            or_cancel(within(hook(ctx), limit.map(|d| timing.sleep(d))), &cancel)
                                .await
                                .map(|r| r.unwrap_or(AdmissionAnswer::Unresolved))
                        }
                        None => Some(AdmissionAnswer::Unresolved),
                    };
                    let Some(answer) = answer else {
                        guard.armed = false;
                        let mut s = lock(&shared);
                        let outcome = s.engine.cancel(timing.now(), CancelPhase::Admission);
                        s.flush();
                        return Err(s.error(outcome));
                    };
                    let mut s = lock(&shared);
                    action = s.engine.admission(
                        timing.now(),
                        answer,
                        config.connectivity.is_online(),
                        timing.jitter(),
                    );
                    s.flush();
                }
                Action::Fail(outcome) => {
                    guard.armed = false;
                    if let Some(resp) = last_error_response.take() {
                        // A final HTTP error is returned as that response.
                        let mut response = Response::from_parts(resp.parts, resp.body);
                        response.extensions_mut().insert(report);
                        return Ok(response);
                    }
                    return Err(lock(&shared).error(outcome));
                }
            }
        }
    }
}

/// The logical request as the caller sent it, for building resumes.
struct Origin<'a> {
    head: &'a http::request::Parts,
    body: &'a Bytes,
    call: &'a RecoveryCall,
}

/// Sends `req` through a fresh clone of `svc`, readiness first.
fn sender<S, ResBody>(svc: S) -> SendFn<ResBody>
where
    S: InnerService<ResBody>,
    ResBody: StreamBody,
{
    Box::new(move |req| {
        let mut svc = svc.clone();
        Box::pin(async move {
            poll_fn(|cx| svc.poll_ready(cx)).await.map_err(Into::into)?;
            svc.call(req).await.map_err(Into::into)
        })
    })
}

/// One physical attempt, up to commit or failure.
async fn run_attempt<S, ResBody, T, C>(
    config: &Config<T, C>,
    mut svc: S,
    req: Request<ReplayBody>,
    shared: &SharedRef,
    cancel: &Cancellation,
    guard: &mut DropGuard,
    origin: Origin<'_>,
) -> Attempt<ResBody>
where
    S: InnerService<ResBody>,
    ResBody: StreamBody,
    T: DriverTiming,
    C: DriverConnectivity,
{
    let timing = &config.timing;
    let policy = lock(shared).engine.policy().clone();

    // Readiness of a fresh clone; an error here is final.
    match or_cancel(poll_fn(|cx| svc.poll_ready(cx)), cancel).await {
        None => return Attempt::Cancelled(CancelPhase::Sending),
        Some(Err(e)) => {
            let e: BoxError = e.into();
            lock(shared).evidence.set_cause(Arc::from(e));
            return Attempt::Failed(Failure::new(FailureKind::NotReady, Phase::Connecting), None);
        }
        Some(Ok(())) => {}
    }

    guard.phase = CancelPhase::AwaitingHead;
    let head_timer = policy.head_timeout().map(|d| timing.sleep(d));
    let response = match or_cancel(within(svc.call(req), head_timer), cancel).await {
        None => return Attempt::Cancelled(CancelPhase::AwaitingHead),
        Some(Err(TimedOut)) => {
            return Attempt::Failed(
                Failure::new(
                    FailureKind::Timeout { stall: Stall::Head },
                    Phase::AwaitingHeaders,
                ),
                None,
            );
        }
        Some(Ok(Err(e))) => {
            let e: BoxError = e.into();
            let failure = classify::head_error(&e);
            lock(shared).evidence.set_cause(Arc::from(e));
            return Attempt::Failed(failure, None);
        }
        Some(Ok(Ok(response))) => response,
    };

    let (parts, body) = response.into_parts();
    {
        let mut s = lock(shared);
        s.engine.head_received(
            timing.now(),
            parts.status.as_u16(),
            request_id_from(&parts.headers),
        );
        s.evidence.clear_bytes();
        s.evidence.set_headers(parts.headers.clone());
        s.flush();
    }
    let attempt = lock(shared).engine.wire_attempt();
    if let Some(wire) = &config.wire {
        if let Err(e) = wire.on_response_head(attempt, &parts) {
            lock(shared).evidence.set_cause(Arc::from(e));
            return Attempt::Failed(
                Failure::new(FailureKind::ObserverRejected, Phase::AwaitingHeaders)
                    .with_status(parts.status.as_u16()),
                None,
            );
        }
    }
    let handle = parts.extensions.get::<ObserveHandle>().cloned();
    let mut body = Box::pin(body);

    let status = parts.status.as_u16();
    if !parts.status.is_success() {
        // Read (a capped part of) the error body for its provider code, keep
        // it as sensitive evidence, and keep the response in case it is final.
        let mut held = VecDeque::new();
        let mut error_body = Vec::new();
        let mut read = 0usize;
        let cap = policy.evidence_cap();
        while read < cap {
            match or_cancel(body.frame(), cancel).await {
                None => return Attempt::Cancelled(CancelPhase::Streaming),
                Some(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        read += data.len();
                        error_body.extend_from_slice(&data[..data.len().min(cap)]);
                        lock(shared).evidence.push_bytes(data);
                    }
                    held.push_back(frame);
                }
                Some(Some(Err(_)) | None) => break,
            }
        }
        let retry_after = RetryAfter::from_headers(&parts.headers, timing.wall_now());
        let should_retry = parts
            .headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_should_retry);
        let mut failure = Failure::status(status, retry_after, should_retry);
        let protocol = handle_protocol(&parts);
        if let Some(error) =
            recovery_core::protocol::classify_error_body(&protocol, Some(status), &error_body)
        {
            if !(300..400).contains(&status) {
                failure.kind = FailureKind::Provider { error };
            }
        }
        let response_body = RecoveryBody::passthrough(held, body);
        return Attempt::Failed(
            failure,
            Some(ErrorResponse {
                parts,
                body: response_body,
            }),
        );
    }

    // A 2xx: stream until commit, holding the prefix back.
    guard.phase = CancelPhase::Streaming;
    let mut held: VecDeque<Frame<Bytes>> = VecDeque::new();
    let mut held_bytes = 0usize;
    let mut watchdog = Watchdog::start(
        timing.clone(),
        policy.idle_timeout(),
        policy.progress_timeout(),
    );
    loop {
        let next = match or_cancel(first(body.frame(), watchdog.stalled()), cancel).await {
            None => return Attempt::Cancelled(CancelPhase::Streaming),
            Some(First::Left(f)) => Ok(f),
            Some(First::Right(stall)) => Err(stall),
        };
        let observation = handle.as_ref().map(ObserveHandle::snapshot);
        let progress = observation.as_ref().map(|o| o.progress).unwrap_or_default();
        match next {
            Err(stall) => {
                return Attempt::Failed(
                    Failure::new(FailureKind::Timeout { stall }, Phase::Streaming)
                        .with_progress(progress)
                        .with_status(status),
                    None,
                );
            }
            Ok(Some(Ok(frame))) => {
                watchdog.on_frame(progress.semantic_fragments());
                if let Some(data) = frame.data_ref() {
                    held_bytes += data.len();
                    if let Some(wire) = &config.wire {
                        if let Err(e) = wire.on_body_chunk(attempt, data) {
                            lock(shared).evidence.set_cause(Arc::from(e));
                            return Attempt::Failed(
                                Failure::new(FailureKind::ObserverRejected, Phase::Streaming)
                                    .with_progress(progress)
                                    .with_status(status),
                                None,
                            );
                        }
                    }
                }
                held.push_back(frame);
                let mut s = lock(shared);
                s.engine.record_progress(progress);
                if let Some(o) = &observation {
                    if let Some(error) = &o.provider_error {
                        drop(s);
                        return Attempt::Failed(
                            Failure::new(
                                FailureKind::Provider {
                                    error: error.clone(),
                                },
                                Phase::Streaming,
                            )
                            .with_progress(progress)
                            .with_status(status),
                            None,
                        );
                    }
                }
                let trigger = match &observation {
                    None => Some(CommitTrigger::Semantic),
                    Some(o) if o.progress.semantic_observed() => Some(CommitTrigger::Semantic),
                    Some(o) if o.terminal.is_some() => Some(CommitTrigger::Terminal),
                    Some(_) if held_bytes > policy.holdback_cap() => {
                        Some(CommitTrigger::HoldbackCap)
                    }
                    Some(_) => None,
                };
                if let Some(trigger) = trigger {
                    s.engine.commit(config.timing.now(), trigger);
                    s.flush();
                    drop(s);
                    let body = RecoveryBody::committed(Committed {
                        held,
                        inner: body,
                        resume: resume_ctx(config, &svc, &origin, handle.as_ref()),
                        handle,
                        shared: Arc::clone(shared),
                        clock: clock(&config.timing),
                        idle_timeout: policy.idle_timeout(),
                        progress_timeout: policy.progress_timeout(),
                        wire: config.wire.clone().map(|w| (w, attempt)),
                    });
                    return Attempt::Commit(Response::from_parts(parts, body));
                }
            }
            Ok(Some(Err(e))) => {
                let e: BoxError = e.into();
                let failure = classify::body_error(&e)
                    .with_progress(progress)
                    .with_status(status);
                lock(shared).evidence.set_cause(Arc::from(e));
                return Attempt::Failed(failure, None);
            }
            Ok(None) => {
                // Ended before commit: with proof and no semantic output, it
                // completes (an empty answer); without proof it is an EOF.
                return match observation.and_then(|o| o.terminal) {
                    Some(Terminal::Success { .. } | Terminal::Unsuccessful { .. }) => {
                        let mut s = lock(shared);
                        s.engine
                            .commit(config.timing.now(), CommitTrigger::Terminal);
                        s.flush();
                        drop(s);
                        let body = RecoveryBody::committed(Committed {
                            held,
                            inner: body,
                            resume: resume_ctx(config, &svc, &origin, handle.as_ref()),
                            handle,
                            shared: Arc::clone(shared),
                            clock: clock(&config.timing),
                            idle_timeout: policy.idle_timeout(),
                            progress_timeout: policy.progress_timeout(),
                            wire: config.wire.clone().map(|w| (w, attempt)),
                        });
                        Attempt::Commit(Response::from_parts(parts, body))
                    }
                    None => Attempt::Failed(
                        Failure::new(
                            FailureKind::UnexpectedEof {
                                eof: recovery_core::failure::EofEvidence::default(),
                            },
                            Phase::Streaming,
                        )
                        .with_progress(progress)
                        .with_status(status),
                        None,
                    ),
                };
            }
        }
    }
}

fn handle_protocol(parts: &http::response::Parts) -> recovery_core::protocol::ProtocolKind {
    parts
        .extensions
        .get::<ObserveHandle>()
        .map_or(recovery_core::protocol::ProtocolKind::OpenAiChat, |h| {
            h.protocol().clone()
        })
}

/// Runs `fut` inside an attempt span carrying the OpenTelemetry attribute
/// `http.request.resend_count` (set only on resends, as the convention asks).
#[cfg(feature = "tracing")]
fn traced<F: Future>(fut: F, logical_id: &str, attempt: u32) -> impl Future<Output = F::Output> {
    use tracing::Instrument;
    let span = tracing::info_span!(
        "recovery.attempt",
        recovery.logical_id = logical_id,
        recovery.attempt = attempt,
        http.request.resend_count = tracing::field::Empty,
    );
    if attempt > 1 {
        span.record("http.request.resend_count", attempt - 1);
    }
    fut.instrument(span)
}

#[cfg(not(feature = "tracing"))]
fn traced<F: Future>(fut: F, _logical_id: &str, _attempt: u32) -> F {
    fut
}

/// The resume context of a committed attempt, when its protocol is known.
fn resume_ctx<S, ResBody, T, C>(
    config: &Config<T, C>,
    svc: &S,
    origin: &Origin<'_>,
    handle: Option<&ObserveHandle>,
) -> Option<ResumeCtx<ResBody>>
where
    S: InnerService<ResBody>,
    ResBody: StreamBody,
    C: DriverConnectivity,
{
    let handle = handle?;
    let connectivity = config.connectivity.clone();
    let probe = config.connectivity.clone();
    let ctx = ResumeCtx {
        protocol: handle.protocol().clone(),
        limits: recovery_core::wire::Limits::default(),
        sse_resumable: config.sse_resumable,
        head: origin.head.clone(),
        body: origin.body.clone(),
        call: origin.call.clone(),
        send: sender(svc.clone()),
        wait_online: Arc::new(move || Box::pin(connectivity.wait_until_online())),
        is_online: Arc::new(move || probe.is_online()),
        cursor: recovery_core::progress::ResumeCursor::default(),
        delivered: config
            .continuation
            .as_ref()
            .map(|_| recovery_core::continuation::DeliveredPrefix::new(handle.protocol().clone())),
        continuation: config.continuation.clone(),
        next_continuation: None,
    };
    ctx.applies().then_some(ctx)
}
