//! The one loop that does the machine's I/O for a logical request: it asks
//! [`Exchange::poll`] what to do and does it with tower and hyper types
//! (sends through a fresh clone of the inner service, reads the response
//! body, sleeps, waits for connectivity, calls the hooks), reporting back
//! what happened. It decides nothing. The response future runs it up to the
//! committed head; the response body runs it from there.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body::{Body, Frame};
use recovery_core::call::{Cancelled, SendCredit};
use recovery_core::error::{CopiedHeaders, Evidence, RecoveryError};
use recovery_core::exchange::{Chunk, Exchange, Io, Role, Send as SendKind};
use recovery_core::failure::{Failure, FailureKind, Phase};
use recovery_core::outcome::Outcome;
use recovery_core::timing::Instant;
use recovery_core::wire::Limits;

use super::classify;
use super::continuation::ContinuationContext;
use super::hooks::Hooks;
use super::origin::{Origin, Unwritable};
use super::report::ReportHandle;
use super::surroundings::{Alarm, Timer};
use crate::BoxError;
use crate::observe::{ObserveError, ObserveHandle};
use crate::request_body::ReplayBody;

/// The header that carries the machine's idempotency key.
const IDEMPOTENCY_KEY: http::HeaderName = http::HeaderName::from_static("idempotency-key");

/// A send on its way: the inner service's response.
pub(crate) type Sent<B> = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

/// A clone of the inner service, for one send: readiness, then the call.
pub(crate) trait Sender<B>: Send {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>>;
    fn call(&mut self, req: Request<ReplayBody>) -> Sent<B>;
    fn fresh(&self) -> Box<dyn Sender<B>>;
}

/// What the driver is waiting on besides its timer.
enum Activity<B> {
    None,
    Readying(Box<dyn Sender<B>>, Option<Box<Request<ReplayBody>>>),
    Awaiting(Sent<B>),
    Admission(Pin<Box<dyn Future<Output = recovery_core::exchange::AdmissionAnswer> + Send>>),
    Online(Timer),
}

/// A hedge's I/O while it races the first attempt: its send on the way,
/// then its head and body. The driver judges one attempt at a time: the
/// hedge's parts take the first's place while its I/O is done
/// ([`Driver::as_role`]).
struct HedgeLane<B> {
    activity: Activity<B>,
    inner: Option<Pin<Box<B>>>,
    head: Option<Box<http::response::Parts>>,
    #[cfg(feature = "tracing")]
    span: Option<tracing::Span>,
}

/// The sleep armed at a deadline, and the waker it last registered, as the
/// task passed it (data and vtable addresses: a clone of a borrowed waker
/// has another vtable, so the clone cannot be compared).
struct Armed {
    at: Instant,
    alarm: Box<dyn Alarm>,
    waker: Option<(usize, usize)>,
}

/// A waker's identity as passed to a poll.
fn identity(waker: &std::task::Waker) -> (usize, usize) {
    (
        waker.data() as usize,
        std::ptr::from_ref(waker.vtable()) as usize,
    )
}

/// What the loop hands to the future or the body.
pub(crate) enum Step<B> {
    /// The committed head: its body follows from this driver.
    Respond(http::response::Parts),
    /// The final HTTP error response, as the server sent it.
    RespondError(http::response::Parts, VecDeque<Bytes>, Option<Pin<Box<B>>>),
    /// A chunk for the consumer.
    Deliver(Bytes),
    /// Trailers of the committed attempt, at its end.
    Trailers(HeaderMap),
    /// The end: clean, or the typed error.
    End(Result<(), RecoveryError>),
}

/// The driver of one logical request.
pub(crate) struct Driver<B> {
    pub(crate) ex: Exchange<Bytes, ObserveHandle>,
    hooks: Arc<Hooks>,
    origin: Origin,
    sender: Box<dyn Sender<B>>,
    report: ReportHandle,
    /// The last attempt's underlying error, kept as evidence.
    cause: Option<Arc<dyn std::error::Error + Send + Sync>>,
    /// The last response's headers, kept as evidence in one buffer (see
    /// [`CopiedHeaders`]).
    headers: Option<CopiedHeaders>,
    activity: Activity<B>,
    timer: Option<Armed>,
    cancelled: Option<Pin<Box<Cancelled>>>,
    pub(crate) inner: Option<Pin<Box<B>>>,
    // The head, the continuation and the trailers are boxed: the driver
    // lives as long as its stream, and these are gone (or never came)
    // by the time most streams are read.
    head: Option<Box<http::response::Parts>>,
    continuation: Option<Box<Request<Bytes>>>,
    trailers: Option<Box<HeaderMap>>,
    /// A kept chunk the machine let through after all (boxed: rare, and
    /// the driver's size decides its allocation's size class).
    passed: Option<Box<Bytes>>,
    /// A hedge racing the first attempt.
    hedge: Option<Box<HedgeLane<B>>>,
    /// Whose I/O the attempt fields hold now.
    role: Role,
    ended: bool,
    #[cfg(feature = "tracing")]
    telemetry: super::telemetry::Telemetry,
}

impl<B> Driver<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(
        ex: Exchange<Bytes, ObserveHandle>,
        hooks: Arc<Hooks>,
        origin: Origin,
        sender: Box<dyn Sender<B>>,
        #[cfg(feature = "tracing")] telemetry: super::telemetry::Telemetry,
    ) -> Self {
        let report = ReportHandle::new(ex.ledger().report().clone());
        let cancelled = Some(Box::pin(origin.call.cancellation().cancelled()));
        let mut driver = Driver {
            ex,
            hooks,
            origin,
            sender,
            report,
            cause: None,
            headers: None,
            activity: Activity::None,
            timer: None,
            cancelled,
            inner: None,
            head: None,
            continuation: None,
            trailers: None,
            passed: None,
            hedge: None,
            role: Role::First,
            ended: false,
            #[cfg(feature = "tracing")]
            telemetry,
        };
        driver.flush();
        driver
    }

    pub(crate) fn report_handle(&self) -> ReportHandle {
        self.report.clone()
    }

    /// A body frame went to the consumer (a no-op without telemetry).
    #[inline]
    #[cfg_attr(not(feature = "tracing"), allow(clippy::unused_self))]
    pub(crate) fn delivered(&mut self) {
        #[cfg(feature = "tracing")]
        if self.telemetry.active() {
            self.telemetry.chunk(self.hooks.surroundings.now());
        }
    }

    /// The request's typed error now: its outcome, or (when it has none)
    /// that it ended without an answer.
    pub(crate) fn unanswered(&self) -> RecoveryError {
        let outcome = self
            .ex
            .ledger()
            .outcome()
            .cloned()
            .unwrap_or(Outcome::Exhausted {
                attempts: self.ex.ledger().wire_attempt(),
            });
        self.error(outcome)
    }

    fn error(&self, outcome: Outcome) -> RecoveryError {
        let mut evidence = Evidence::with_cap(self.ex.policy().evidence_cap());
        if let Some(cause) = &self.cause {
            evidence.set_cause(Arc::clone(cause));
        }
        if let Some(headers) = &self.headers {
            evidence.set_copied_headers(headers.clone());
        }
        evidence.push_bytes(self.ex.error_body());
        RecoveryError::new(outcome, self.ex.ledger().report().clone(), evidence)
    }

    /// The caller cancelled before the request ended, or dropped what held
    /// it: the machine decides what that means.
    pub(crate) fn cancel(&mut self) {
        if self.ended {
            return;
        }
        let env = &*self.hooks.surroundings;
        self.ex.cancel(env.now());
        self.ended = true;
        self.flush();
    }

    /// Whether the common committed frame may take the short path
    /// ([`Driver::pass`]): the body passes through and no wire observer
    /// looks at chunks.
    #[inline]
    pub(crate) fn passing(&self) -> bool {
        self.ex.is_passing_through() && self.hooks.wire.is_none()
    }

    /// A data frame of a passing body: `true` when it goes out as it is;
    /// otherwise the machine took it and the general loop goes on.
    #[inline]
    pub(crate) fn pass(&mut self, data: &Bytes) -> bool {
        self.ex.on_passing_chunk(data)
    }

    /// The frame [`Driver::pass`] did not let through.
    #[cold]
    pub(crate) fn keep(&mut self, data: Bytes) {
        let env = &*self.hooks.surroundings;
        if let Some(data) = self.ex.on_kept_chunk(env.now(), data) {
            self.passed = Some(Box::new(data));
        }
        self.flush();
    }

    /// Trailers of the body being read, kept for its clean end.
    #[cold]
    pub(crate) fn trailers(&mut self, frame: Frame<Bytes>) {
        self.trailers = frame.into_trailers().ok().map(Box::new);
    }

    /// The inner body is not ready: `true` while nothing else is due
    /// either (the caller returns `Pending`).
    #[inline]
    pub(crate) fn idle(&mut self, cx: &mut Context<'_>) -> bool {
        self.poll_timer(cx).is_pending()
    }

    /// Runs the machine until it has something for the future or the body.
    pub(crate) fn poll_step(&mut self, cx: &mut Context<'_>) -> Poll<Step<B>> {
        #[cfg(feature = "tracing")]
        let _request = self.telemetry.request.clone().entered();
        if let Some(data) = self.passed.take() {
            return Poll::Ready(Step::Deliver(*data));
        }
        loop {
            let env = &*self.hooks.surroundings;
            let io = self.ex.poll(env.now(), env.online());
            self.flush();
            match io {
                Io::Send(kind) => self.send(kind, self.ex.target()),
                Io::Hedge { target } => {
                    self.hedge = Some(Box::new(HedgeLane {
                        activity: Activity::None,
                        inner: None,
                        head: None,
                        #[cfg(feature = "tracing")]
                        span: None,
                    }));
                    self.as_role(Role::Hedge, |d| d.send(SendKind::Original, target));
                }
                Io::AwaitHead => {
                    if self.poll_head(cx).is_pending() && self.poll_waiting(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                Io::Read => match self.poll_body(cx) {
                    Poll::Pending => {
                        if self.poll_waiting(cx).is_pending() {
                            return Poll::Pending;
                        }
                    }
                    Poll::Ready(Some(data)) => return Poll::Ready(Step::Deliver(data)),
                    Poll::Ready(None) => {}
                },
                Io::Race => {
                    if self.poll_lane(cx).is_pending()
                        && self.as_role(Role::Hedge, |d| d.poll_lane(cx)).is_pending()
                        && self.poll_waiting(cx).is_pending()
                    {
                        return Poll::Pending;
                    }
                }
                Io::Release => {
                    self.inner = None;
                    self.activity = Activity::None;
                }
                Io::ReleaseHedge => self.hedge = None,
                Io::Promote => {
                    if let Some(hedge) = self.hedge.take() {
                        self.activity = hedge.activity;
                        self.inner = hedge.inner;
                        self.head = hedge.head;
                        #[cfg(feature = "tracing")]
                        {
                            self.telemetry.attempt = hedge.span;
                        }
                    }
                }
                Io::Respond => {
                    let head = self.head.take().expect("a committed attempt has its head");
                    return Poll::Ready(Step::Respond(*head));
                }
                Io::RespondError => return Poll::Ready(self.respond_error()),
                Io::Deliver(Chunk::Read(b) | Chunk::Made(b)) => {
                    return Poll::Ready(Step::Deliver(b));
                }
                Io::Sleep => {
                    if self.poll_waiting(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                Io::WaitOnline => {
                    if self.poll_online(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                Io::AskAdmission(request) => self.ask_admission(request),
                Io::AwaitAdmission => {
                    if self.poll_admission(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                Io::AskContinuation => self.ask_continuation(),
                Io::End(result) => return Poll::Ready(self.end(result)),
            }
        }
    }

    /// The final error response, with the chunks the machine held of it.
    fn respond_error(&mut self) -> Step<B> {
        let head = self.head.take().expect("an error response has its head");
        let held = self
            .ex
            .take_held()
            .into_iter()
            .map(|c| match c {
                Chunk::Read(b) | Chunk::Made(b) => b,
            })
            .collect();
        self.ended = true;
        Step::RespondError(*head, held, self.inner.take())
    }

    /// Waits for connectivity, or the deadline: `Ready` when the machine
    /// has news.
    fn poll_online(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !matches!(self.activity, Activity::Online(_)) {
            self.activity = Activity::Online(self.hooks.surroundings.wait_online());
        }
        if let Activity::Online(wait) = &mut self.activity
            && wait.as_mut().poll(cx).is_ready()
        {
            self.activity = Activity::None;
            self.ex.online(self.hooks.surroundings.now());
            return Poll::Ready(());
        }
        self.poll_waiting(cx)
    }

    /// Asks the admission hook (the machine asks only when one was
    /// declared).
    fn ask_admission(&mut self, request: recovery_core::exchange::AdmissionRequest) {
        let ctx = super::hooks::AdmissionContext {
            logical_id: request.logical_id,
            next_attempt: request.next_attempt,
            failure: request.failure,
        };
        if let Some(hook) = &self.hooks.admission {
            self.activity = Activity::Admission(hook(ctx));
        }
    }

    /// Waits for the admission hook's answer, or the deadline: `Ready` when
    /// the machine has news.
    fn poll_admission(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Activity::Admission(answer) = &mut self.activity
            && let Poll::Ready(answer) = answer.as_mut().poll(cx)
        {
            self.activity = Activity::None;
            self.ex.admission(self.hooks.surroundings.now(), answer);
            return Poll::Ready(());
        }
        self.poll_waiting(cx)
    }

    /// Asks the continuation hook for the request that continues what the
    /// consumer has; it is sent at the next continuation send.
    fn ask_continuation(&mut self) {
        let given = match (&self.hooks.continuation, self.ex.delivered_prefix()) {
            (Some(hook), Some(delivered)) => hook(&ContinuationContext {
                head: &self.origin.head,
                body: &self.origin.body,
                delivered,
            }),
            _ => None,
        };
        self.ex
            .continuation(self.hooks.surroundings.now(), given.is_some());
        self.continuation = given.map(Box::new);
    }

    /// The request ended: the final report (with what followed the last
    /// event, such as a late error after proof), then the trailers of a
    /// clean end or the typed error.
    fn end(&mut self, result: Result<(), Outcome>) -> Step<B> {
        self.ended = true;
        self.report.set(self.ex.ledger().report());
        self.inner = None;
        self.hedge = None;
        self.activity = Activity::None;
        self.timer = None;
        if result.is_ok()
            && let Some(trailers) = self.trailers.take()
        {
            return Step::Trailers(*trailers);
        }
        Step::End(result.map_err(|o| self.error(o)))
    }

    /// Does `io` with the attempt fields holding `role`'s parts: a hedge's
    /// change places with the first's while its I/O is done.
    fn as_role<R>(&mut self, role: Role, io: impl FnOnce(&mut Self) -> R) -> R {
        let swap = |d: &mut Self| {
            if let Some(h) = d.hedge.as_deref_mut() {
                std::mem::swap(&mut d.activity, &mut h.activity);
                std::mem::swap(&mut d.inner, &mut h.inner);
                std::mem::swap(&mut d.head, &mut h.head);
                #[cfg(feature = "tracing")]
                std::mem::swap(&mut d.telemetry.attempt, &mut h.span);
            }
        };
        if role == Role::First {
            return io(self);
        }
        swap(self);
        self.role = role;
        let out = io(self);
        self.role = Role::First;
        swap(self);
        out
    }

    /// The attempt's next news in a race: its head, or its next frame.
    fn poll_lane(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if matches!(
            self.activity,
            Activity::Readying(..) | Activity::Awaiting(_)
        ) {
            self.poll_head(cx)
        } else {
            self.poll_body(cx).map(|_| ())
        }
    }

    /// Builds the request of this send to `target` and starts it on a
    /// fresh clone of the inner service.
    fn send(&mut self, kind: SendKind, target: usize) {
        // The alternate the machine sends to, if it is not the request's own
        // endpoint.
        let alternate = target
            .checked_sub(1)
            .and_then(|i| self.origin.alternates.get(i))
            .and_then(|&i| self.hooks.alternates.get(i));
        let written = match kind {
            SendKind::Original => self.origin.original(alternate, target),
            SendKind::Prefill(body) => self.origin.prefill(alternate, body),
            SendKind::Resume(resume) => self.origin.resume(alternate, target, &resume),
            SendKind::Continuation => (self.continuation.take())
                .map(|req| req.map(ReplayBody::full))
                .ok_or(Unwritable),
        };
        let Ok(mut req) = written else {
            return self.fail_send(FailureKind::ObserverRejected);
        };
        if let Some(key) = self
            .ex
            .idempotency_key(req.headers().contains_key(IDEMPOTENCY_KEY))
            && let Ok(value) = http::HeaderValue::from_str(&key)
        {
            req.headers_mut().insert(IDEMPOTENCY_KEY, value);
        }
        #[cfg(feature = "tracing")]
        {
            let ledger = self.ex.ledger();
            self.telemetry
                .send(ledger.logical_id(), ledger.wire_attempt());
            #[cfg(feature = "opentelemetry")]
            self.telemetry.inject(req.headers_mut());
        }
        if let Some(wire) = &self.hooks.wire {
            let (head, body) = req.into_parts();
            let checked =
                wire.on_request(self.ex.ledger().wire_attempt(), &head, &self.origin.body);
            req = Request::from_parts(head, body);
            if let Err(e) = checked {
                self.cause = Some(Arc::from(e));
                return self.fail_send(FailureKind::ObserverRejected);
            }
        }
        req.extensions_mut().insert(self.origin.call.clone());
        req.extensions_mut().insert(SendCredit);
        // The observer inside reads this send as the machine does: under
        // the policy's caps, and as the machine's protocol when it is not
        // the layer's (an alternate's own, or the call's).
        let protocol = (alternate.is_some_and(|alt| alt.target.protocol().is_some())
            || self.origin.call.protocol().is_some())
        .then(|| self.ex.protocol_of(self.role).clone());
        req.extensions_mut().insert(super::SendReading {
            protocol,
            limits: Limits::uniform(self.ex.policy().max_event_bytes()),
        });
        self.head = None;
        self.inner = None;
        self.activity = Activity::Readying(self.sender.fresh(), Some(Box::new(req)));
    }

    fn fail_send(&mut self, kind: FailureKind) {
        let env = &*self.hooks.surroundings;
        self.ex
            .on_error_of(self.role, env.now(), Failure::new(kind, Phase::Sending));
        self.flush();
    }

    /// Readiness, then the call, then the head: `Ready` when the machine
    /// has news of it.
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        #[cfg(feature = "tracing")]
        let _attempt = self.telemetry.attempt.clone().map(tracing::Span::entered);
        if let Activity::Readying(sender, req) = &mut self.activity {
            match sender.poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    let req = req.take().expect("a request per send");
                    let sent = sender.call(*req);
                    self.activity = Activity::Awaiting(sent);
                    let env = &*self.hooks.surroundings;
                    self.ex.on_sent_of(self.role, env.now());
                }
                Poll::Ready(Err(e)) => {
                    self.activity = Activity::None;
                    self.cause = Some(Arc::from(e));
                    let env = &*self.hooks.surroundings;
                    let failure = Failure::new(FailureKind::NotReady, Phase::Connecting);
                    self.ex.on_error_of(self.role, env.now(), failure);
                    return Poll::Ready(());
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        let Activity::Awaiting(sent) = &mut self.activity else {
            return Poll::Ready(());
        };
        let response = match sent.as_mut().poll(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(r) => r,
        };
        self.activity = Activity::None;
        let env = &*self.hooks.surroundings;
        let role = self.role;
        match response {
            Err(e) => {
                let failure = classify::head_error(&e);
                self.cause = Some(Arc::from(e));
                self.ex.on_error_of(role, env.now(), failure);
            }
            Ok(response) => {
                let (parts, body) = response.into_parts();
                self.headers = Some(CopiedHeaders::of(&parts.headers));
                let handle = parts.extensions.get::<ObserveHandle>().cloned();
                self.ex
                    .on_head_of(role, env.now(), env.wall_now(), &parts, handle);
                if let Some(wire) = &self.hooks.wire
                    && let Err(e) = wire.on_response_head(self.ex.ledger().wire_attempt(), &parts)
                {
                    self.cause = Some(Arc::from(e));
                    let failure =
                        Failure::new(FailureKind::ObserverRejected, Phase::AwaitingHeaders);
                    self.ex.on_error_of(role, env.now(), failure);
                }
                self.head = Some(Box::new(parts));
                self.inner = Some(Box::pin(body));
            }
        }
        Poll::Ready(())
    }

    /// One frame of the current attempt's body; `Some` when it goes to the
    /// consumer at once.
    fn poll_body(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        #[cfg(feature = "tracing")]
        let _attempt = self.telemetry.attempt.clone().map(tracing::Span::entered);
        let Some(inner) = self.inner.as_mut() else {
            let env = &*self.hooks.surroundings;
            self.ex.on_end_of(self.role, env.now());
            return Poll::Ready(None);
        };
        match inner.as_mut().poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => Poll::Ready(match frame.into_data() {
                Ok(data) => self.chunk(data),
                Err(frame) => {
                    self.trailers = frame.into_trailers().ok().map(Box::new);
                    None
                }
            }),
            Poll::Ready(other) => {
                self.body_ended(other.map(|r| r.map_err(Into::into)));
                Poll::Ready(None)
            }
        }
    }

    fn chunk(&mut self, data: Bytes) -> Option<Bytes> {
        let env = &*self.hooks.surroundings;
        if let Some(wire) = &self.hooks.wire
            && let Err(e) = wire.on_body_chunk(self.ex.ledger().wire_attempt(), &data)
        {
            self.cause = Some(Arc::from(e));
            let failure = Failure::new(FailureKind::ObserverRejected, Phase::Streaming);
            self.ex.on_error_of(self.role, env.now(), failure);
            return None;
        }
        self.ex.on_chunk_of(self.role, env.now(), data)
    }

    /// The body's end or failure.
    #[cold]
    pub(crate) fn body_ended(&mut self, polled: Option<Result<Frame<Bytes>, BoxError>>) {
        let env = &*self.hooks.surroundings;
        let role = self.role;
        match polled {
            None => self.ex.on_end_of(role, env.now()),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                // The observer below judged the end (no proof, or a broken
                // protocol): the machine reads its verdict.
                let judged = matches!(
                    e.downcast_ref::<ObserveError>(),
                    Some(ObserveError::UnexpectedEof(_) | ObserveError::Protocol(_))
                );
                if judged {
                    self.ex.on_end_of(role, env.now());
                } else {
                    let failure = classify::body_error(&e);
                    self.cause = Some(Arc::from(e));
                    self.ex.on_error_of(role, env.now(), failure);
                }
            }
        }
        self.flush();
    }

    /// Waits on the machine's deadline (and, before the response is handed
    /// out, the caller's cancellation). `Ready` when either fired.
    fn poll_waiting(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.ex.is_passing_through()
            && let Some(c) = self.cancelled.as_mut()
            && c.as_mut().poll(cx).is_ready()
        {
            self.cancelled = None;
            let env = &*self.hooks.surroundings;
            self.ex.cancel(env.now());
            return Poll::Ready(());
        }
        self.poll_timer(cx)
    }

    /// The one sleep: armed at the machine's deadline, re-armed only when
    /// the deadline moved earlier or passed without firing. Polled (its
    /// waker registered) only when armed or when the task's waker changed;
    /// otherwise asked whether it elapsed.
    #[inline]
    fn poll_timer(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(deadline) = self.ex.poll_timeout() else {
            self.timer = None;
            return Poll::Pending;
        };
        let fired = match self.timer.as_mut() {
            Some(armed) if deadline >= armed.at => armed.check(cx),
            _ => {
                let now = self.hooks.surroundings.now();
                let alarm = self
                    .hooks
                    .surroundings
                    .sleep(deadline.saturating_since(now));
                let mut armed = Armed {
                    at: deadline,
                    alarm,
                    waker: None,
                };
                let fired = armed.check(cx);
                self.timer = Some(armed);
                fired
            }
        };
        if !fired {
            return Poll::Pending;
        }
        self.timer = None;
        let env = &*self.hooks.surroundings;
        self.ex.handle_timeout(env.now());
        self.flush();
        Poll::Ready(())
    }
}

impl Armed {
    /// Whether the sleep elapsed; registers the task's waker when it is new.
    #[inline]
    fn check(&mut self, cx: &mut Context<'_>) -> bool {
        let waker = identity(cx.waker());
        if self.waker == Some(waker)
            && let Some(elapsed) = self.alarm.has_elapsed()
        {
            return elapsed;
        }
        let ready = self.alarm.poll_elapsed(cx).is_ready();
        self.waker = Some(waker);
        ready
    }
}

impl<B> Driver<B> {
    /// Hands the machine's events to the observer and refreshes the report
    /// (and, at the terminal event, the request's telemetry).
    fn flush(&mut self) {
        let mut any = false;
        #[cfg(feature = "tracing")]
        let mut terminal = None;
        for event in self.ex.drain_events() {
            any = true;
            self.hooks.observer.on_event(&event);
            #[cfg(feature = "tracing")]
            if event.kind.is_terminal() {
                terminal = Some(event.kind);
            }
        }
        if any {
            self.report.set(self.ex.ledger().report());
        }
        #[cfg(feature = "tracing")]
        if let Some(kind) = terminal {
            self.telemetry.end(&kind, self.ex.ledger().report());
        }
    }
}

impl<B> Drop for Driver<B> {
    fn drop(&mut self) {
        if !self.ended {
            // Dropped before the end (the caller gave up on the future, or
            // the consumer on the body): the machine says whether that is a
            // cancellation or, after proof was handed out, a completion.
            let env = &*self.hooks.surroundings;
            self.ex.cancel(env.now());
            self.flush();
        }
        #[cfg(feature = "opentelemetry")]
        if self.telemetry.active() {
            self.telemetry.close(self.hooks.surroundings.now());
        }
    }
}
