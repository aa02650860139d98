use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use recovery_core::decision::Action;
use recovery_core::error::RecoveryError;
use recovery_core::failure::{Failure, FailureKind, Phase};
use recovery_core::outcome::CancelPhase;
use recovery_core::progress::{Progress, Terminal};
use recovery_core::timing::{Fraction, Instant, Timing};
use recovery_core::watchdog::{WatchClock, Watchdog};

use super::classify;
use super::resume::{Gate, ResumeCtx, Sent};
use super::shared::{SharedRef, lock};
use super::wire::WireObserver;
use crate::BoxError;
use crate::observe::ObserveHandle;

/// The clock a body needs after commit, object-safe so that
/// [`RecoveryBody`] is not generic over the timing.
pub(crate) trait BodyClock: Send + Sync {
    fn now(&self) -> Instant;
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
    fn jitter(&self) -> Fraction;
}

impl<T> BodyClock for T
where
    T: Timing + Send + Sync,
    T::Sleep: Send + 'static,
{
    fn now(&self) -> Instant {
        Timing::now(self)
    }
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(Timing::sleep(self, d))
    }
    fn jitter(&self) -> Fraction {
        Timing::jitter(self)
    }
}

/// A body's clock as the watchdog's.
struct WatchBody(Arc<dyn BodyClock>);

impl WatchClock for WatchBody {
    type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn sleep(&self, d: Duration) -> Self::Sleep {
        self.0.sleep(d)
    }
}

pub(crate) fn clock<T>(timing: &T) -> Arc<dyn BodyClock>
where
    T: Timing + Clone + Send + Sync + 'static,
    T::Sleep: Send + 'static,
{
    Arc::new(timing.clone())
}

/// Where a committed body is.
enum Stage<B> {
    /// Reading the current attempt's body.
    Streaming,
    /// Waiting before a resume (backoff, `Retry-After`).
    Waiting(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// Waiting for the network before deciding again.
    Parked(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// A resume's wait is over but the network is gone: waiting for it (or
    /// for the budget to run out), then sending.
    ParkedBeforeSend(Timer, Option<Timer>),
    /// The resume request is on its way.
    Connecting(Sent<B>),
    /// Ended (terminal outcome reached).
    Done,
}

type Timer = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A committed body's state. The parts used only around failures and
/// resumes are boxed, so that the fields read for every frame share a few
/// cache lines (unboxed, the gates and resume context made it 3.6 KB).
struct Live<B> {
    /// Body bytes handed to the consumer from the current attempt.
    delivered_bytes: u64,
    handle: Option<ObserveHandle>,
    shared: SharedRef,
    clock: Arc<dyn BodyClock>,
    watchdog: Watchdog<WatchBody>,
    wire: Option<(Arc<dyn WireObserver>, u32)>,
    /// A provider error was delivered in the last frame: fail on the next poll.
    failed_after_frame: Option<Box<Failure>>,
    /// Event-granular delivery, when a resume strategy applies.
    gate: Option<Box<Gate>>,
    /// The gate of the resume request in flight.
    next_gate: Option<Box<Gate>>,
    resume: Option<Box<ResumeCtx<B>>>,
    stage: Stage<B>,
}

/// What a committed body starts from.
pub(crate) struct Committed<B> {
    pub(crate) held: VecDeque<Frame<Bytes>>,
    pub(crate) inner: Pin<Box<B>>,
    pub(crate) handle: Option<ObserveHandle>,
    pub(crate) shared: SharedRef,
    pub(crate) clock: Arc<dyn BodyClock>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) progress_timeout: Option<Duration>,
    pub(crate) wire: Option<(Arc<dyn WireObserver>, u32)>,
    pub(crate) resume: Option<ResumeCtx<B>>,
}

/// The stitched response body: first the held-back prefix, then the
/// committed attempt's stream, continued by resumes where the protocol
/// allows. After commit a failure ends it with a typed [`RecoveryError`];
/// the end of the stream completes the report.
///
/// `B` is the inner service's response body, polled in place: no boxing
/// behind a trait object, no error mapping per frame.
pub struct RecoveryBody<B> {
    held: VecDeque<Frame<Bytes>>,
    inner: Option<Pin<Box<B>>>,
    live: Option<Live<B>>,
}

impl<B> fmt::Debug for RecoveryBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveryBody")
            .field("held_frames", &self.held.len())
            .field("committed", &self.live.is_some())
            .finish_non_exhaustive()
    }
}

type Polled = Poll<Option<Result<Frame<Bytes>, RecoveryError>>>;

impl<B> RecoveryBody<B> {
    /// A final HTTP error response's body, passed through as the server sent it.
    pub(crate) fn passthrough(held: VecDeque<Frame<Bytes>>, rest: Pin<Box<B>>) -> Self {
        RecoveryBody {
            held,
            inner: Some(rest),
            live: None,
        }
    }

    pub(crate) fn committed(c: Committed<B>) -> Self {
        let watchdog = Watchdog::start(
            WatchBody(Arc::clone(&c.clock)),
            c.idle_timeout,
            c.progress_timeout,
        );
        let mut resume = c.resume;
        let mut gate = resume
            .as_ref()
            .filter(|r| r.applies())
            .map(|r| Box::new(Gate::new(&r.protocol, r.limits, None)));
        let mut held = VecDeque::new();
        let mut failed = None;
        match gate.as_mut() {
            // Event by event: held frames go through the gate too, and only
            // complete events are released.
            Some(g) => {
                for frame in c.held {
                    match frame.into_data() {
                        Ok(data) => match g.push(&data) {
                            Ok(events) => {
                                if let Some(r) = resume.as_mut() {
                                    r.delivered(&events);
                                }
                                held.extend(events.into_iter().map(Frame::data));
                            }
                            Err(v) => {
                                failed = Some(Failure::new(
                                    FailureKind::Protocol {
                                        violation: v.into(),
                                    },
                                    Phase::Decoding,
                                ));
                                break;
                            }
                        },
                        Err(frame) => held.push_back(frame),
                    }
                }
            }
            None => held = c.held,
        }
        RecoveryBody {
            held,
            inner: Some(c.inner),
            live: Some(Live {
                delivered_bytes: 0,
                handle: c.handle,
                shared: c.shared,
                clock: c.clock,
                watchdog,
                wire: c.wire,
                failed_after_frame: failed.map(Box::new),
                gate,
                next_gate: None,
                resume: resume.map(Box::new),
                stage: Stage::Streaming,
            }),
        }
    }

    /// Counts bytes handed to the consumer. The engine's record is brought up
    /// to date when the stream ends, fails or is dropped, not per frame.
    fn deliver(&mut self, frame: &Frame<Bytes>) {
        if let Some(live) = &mut self.live {
            live.delivered_bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
        }
    }

    /// The attempt's progress as delivered so far.
    fn delivered_progress(live: &Live<B>) -> Progress {
        let mut progress = live
            .handle
            .as_ref()
            .map(ObserveHandle::progress)
            .unwrap_or_default();
        progress.deliver_observed();
        progress.delivered_bytes = live.delivered_bytes;
        progress
    }

    /// The committed attempt failed: resume if the engine says so, else end
    /// with the typed error.
    fn fail(&mut self, failure: Failure) -> Polled {
        self.inner = None;
        let Some(live) = &mut self.live else {
            return Poll::Ready(None);
        };
        let failure = failure.with_progress(Self::delivered_progress(live));
        if let (Some(resume), Some(gate)) = (live.resume.as_mut(), live.gate.as_ref()) {
            resume.advance(gate.cursor());
        }
        let resumable = live.resume.as_deref_mut().is_some_and(ResumeCtx::prepare);
        let online = live.resume.as_ref().is_none_or(|r| (r.is_online)());
        let mut s = lock(&live.shared);
        s.engine.set_resume_possible(resumable);
        let now = live.clock.now();
        let action = s.engine.fail(now, failure, online, live.clock.jitter());
        s.flush();
        drop(s);
        self.act(action)
    }

    fn act(&mut self, action: Action) -> Polled {
        let Some(live) = &mut self.live else {
            return Poll::Ready(None);
        };
        match action {
            Action::Resume { delay, .. } => {
                live.stage = Stage::Waiting(live.clock.sleep(delay));
                Poll::Pending
            }
            Action::ParkUntilOnline => match &live.resume {
                Some(r) => {
                    live.stage = Stage::Parked((r.wait_online)());
                    Poll::Pending
                }
                None => self.end_with_current_outcome(),
            },
            Action::Fail(outcome) => {
                live.stage = Stage::Done;
                Poll::Ready(Some(Err(lock(&live.shared).error(outcome))))
            }
            // After commit, neither a replay nor an admission wait applies:
            // the stream ends with what the engine concluded.
            Action::RetryAfter { .. } | Action::AskAdmission => self.end_with_current_outcome(),
        }
    }

    fn end_with_current_outcome(&mut self) -> Polled {
        let Some(live) = &mut self.live else {
            return Poll::Ready(None);
        };
        live.stage = Stage::Done;
        let mut s = lock(&live.shared);
        let now = live.clock.now();
        let outcome = match s.engine.outcome() {
            Some(o) => o.clone(),
            None => s.engine.cancel(now, CancelPhase::Streaming),
        };
        s.flush();
        Poll::Ready(Some(Err(s.error(outcome))))
    }

    fn end(&mut self) -> Polled {
        let Some(live) = &mut self.live else {
            return Poll::Ready(None);
        };
        let terminal = live.handle.as_ref().and_then(ObserveHandle::terminal);
        match terminal {
            Some(Terminal::Success { proof }) => {
                if let Some(rest) = live
                    .gate
                    .as_deref_mut()
                    .map(Gate::rest)
                    .filter(|b| !b.is_empty())
                {
                    self.held.push_back(Frame::data(rest));
                }
                let Some(live) = &mut self.live else {
                    return Poll::Ready(None);
                };
                live.stage = Stage::Done;
                let progress = Self::delivered_progress(live);
                let mut s = lock(&live.shared);
                s.engine.succeed(live.clock.now(), proof, progress);
                s.flush();
                drop(s);
                self.inner = None;
                match self.held.pop_front() {
                    Some(frame) => Poll::Ready(Some(Ok(frame))),
                    None => Poll::Ready(None),
                }
            }
            Some(Terminal::Unsuccessful { reason }) => self.fail(Failure::new(
                FailureKind::Unsuccessful { reason },
                Phase::Streaming,
            )),
            // Without an observer, or without proof, an end is not a finish.
            None => self.fail(Failure::new(
                FailureKind::UnexpectedEof {
                    eof: recovery_core::failure::EofEvidence::default(),
                },
                Phase::Streaming,
            )),
        }
    }

    /// Drives the waits and the resume request: `None` when streaming can go
    /// on, `Some` with what to return otherwise.
    fn poll_resume(&mut self, cx: &mut Context<'_>) -> Option<Polled> {
        loop {
            let live = self.live.as_mut()?;
            match &mut live.stage {
                Stage::Streaming => return None,
                Stage::Done => return Some(Poll::Ready(None)),
                Stage::Parked(wait) => {
                    if wait.as_mut().poll(cx).is_pending() {
                        return Some(Poll::Pending);
                    }
                    if let ready @ Poll::Ready(_) = self.decide_again() {
                        return Some(ready);
                    }
                }
                Stage::Waiting(sleep) => {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Some(Poll::Pending);
                    }
                    live.stage = Stage::Streaming;
                    // Backoff first, connectivity second (AD5).
                    let online = live.resume.as_ref().is_none_or(|r| (r.is_online)());
                    let now = live.clock.now();
                    let (parked, limit) = {
                        let mut s = lock(&live.shared);
                        let parked = s.engine.park_before_send(now, online);
                        s.flush();
                        (parked, s.engine.wait_limit(now))
                    };
                    if let (true, Some(r)) = (parked, live.resume.as_ref()) {
                        let limit = limit.map(|d| live.clock.sleep(d));
                        live.stage = Stage::ParkedBeforeSend((r.wait_online)(), limit);
                        continue;
                    }
                    if let Some(ready) = self.start_resume() {
                        return Some(ready);
                    }
                }
                Stage::ParkedBeforeSend(online, limit) => {
                    if online.as_mut().poll(cx).is_ready() {
                        live.stage = Stage::Streaming;
                        if let Some(ready) = self.start_resume() {
                            return Some(ready);
                        }
                        continue;
                    }
                    let expired = limit
                        .as_mut()
                        .is_some_and(|t| t.as_mut().poll(cx).is_ready());
                    if !expired {
                        return Some(Poll::Pending);
                    }
                    // The budget ran out while parked: decide again, now.
                    if let ready @ Poll::Ready(_) = self.decide_again() {
                        return Some(ready);
                    }
                }
                Stage::Connecting(fut) => {
                    let result = match fut.as_mut().poll(cx) {
                        Poll::Pending => return Some(Poll::Pending),
                        Poll::Ready(r) => r,
                    };
                    live.stage = Stage::Streaming;
                    match self.resumed(result) {
                        Poll::Pending => {}
                        Poll::Ready(None) => return None,
                        ready @ Poll::Ready(_) => return Some(ready),
                    }
                }
            }
        }
    }

    /// A park ended (back online, or out of budget): the engine decides
    /// again. `Pending` when that scheduled another wait or a resume.
    fn decide_again(&mut self) -> Polled {
        let Some(live) = self.live.as_mut() else {
            return Poll::Ready(None);
        };
        live.stage = Stage::Streaming;
        let action = {
            let mut s = lock(&live.shared);
            let a = s.engine.online_again(live.clock.now(), live.clock.jitter());
            s.flush();
            a
        };
        self.act(action)
    }

    /// The wait before a resume is over: debit, then send the resume request.
    fn start_resume(&mut self) -> Option<Polled> {
        let live = self.live.as_mut()?;
        let now = live.clock.now();
        let cancelled = live
            .resume
            .as_ref()
            .is_some_and(|r| r.call.cancellation().is_cancelled());
        let begun = {
            let mut s = lock(&live.shared);
            let b = s.engine.begin_attempt(now, cancelled, false);
            s.flush();
            b
        };
        if let Err(outcome) = begun {
            live.stage = Stage::Done;
            return Some(Poll::Ready(Some(Err(lock(&live.shared).error(outcome)))));
        }
        let resume = live.resume.as_mut()?;
        match resume.send_next() {
            Ok((fut, strategy, gate)) => {
                let delivered = lock(&live.shared)
                    .engine
                    .report()
                    .attempts
                    .iter()
                    .map(|a| a.progress.delivered_bytes)
                    .sum();
                lock(&live.shared).engine.record_seam(strategy, delivered);
                live.next_gate = Some(Box::new(gate));
                live.stage = Stage::Connecting(fut);
                None
            }
            Err(e) => {
                lock(&live.shared).evidence.set_cause(Arc::from(e));
                match self.fail(Failure::new(
                    FailureKind::Protocol {
                        violation: recovery_core::failure::Violation::Sequence,
                    },
                    Phase::Sending,
                )) {
                    Poll::Pending => None,
                    ready @ Poll::Ready(_) => Some(ready),
                }
            }
        }
    }

    /// The resume request answered: stream its body (dropping the events a
    /// server repeats), or fail it. `Ready(None)` means streaming goes on.
    fn resumed(&mut self, result: Result<http::Response<B>, BoxError>) -> Polled {
        let Some(live) = self.live.as_mut() else {
            return Poll::Ready(None);
        };
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                let failure = classify::head_error(&e);
                lock(&live.shared).evidence.set_cause(Arc::from(e));
                return self.fail(failure);
            }
        };
        let (parts, body) = response.into_parts();
        let status = parts.status.as_u16();
        {
            let mut s = lock(&live.shared);
            s.engine.head_received(
                live.clock.now(),
                status,
                recovery_core::safe::request_id_from(&parts.headers),
            );
            s.flush();
        }
        if !parts.status.is_success() {
            let retry_after = recovery_core::retry_after::RetryAfter::from_headers(
                &parts.headers,
                std::time::SystemTime::UNIX_EPOCH,
            );
            return self.fail(Failure::status(status, retry_after, None));
        }
        live.gate = live.next_gate.take();
        live.handle = parts.extensions.get::<ObserveHandle>().cloned();
        live.delivered_bytes = 0;
        live.watchdog.restart();
        self.inner = Some(Box::pin(body));
        Poll::Ready(None)
    }
}

impl<B> Body for RecoveryBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = RecoveryError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = &mut *self;
        // The common case, kept small: nothing held, streaming the committed
        // attempt, no failure pending.
        let plain = this.held.is_empty()
            && this.live.as_ref().is_some_and(|l| {
                matches!(l.stage, Stage::Streaming) && l.failed_after_frame.is_none()
            });
        if let (true, Some(inner)) = (plain, this.inner.as_mut()) {
            // The frame's bytes are taken out and put back in a new frame:
            // moving the whole `Frame` (sized for trailers) costs more.
            let polled = match inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if this.passes(&data) => {
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Ok(data) => this.on_frame(Frame::data(data)),
                    Err(trailers) => this.on_frame(trailers),
                },
                Poll::Pending => match this.on_pending(cx) {
                    // Nothing fired: wait for the inner body.
                    Poll::Pending if this.waiting() => return Poll::Pending,
                    other => other,
                },
                Poll::Ready(other) => this.on_ended(other.map(|r| r.map_err(Into::into))),
            };
            // `Pending` here means frames were queued or a resume was
            // scheduled: the general path takes it from there.
            if let ready @ Poll::Ready(_) = polled {
                return ready;
            }
        }
        this.poll_general(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty()
            && match &self.live {
                Some(live) => matches!(live.stage, Stage::Done),
                None => self.inner.as_ref().is_none_or(Body::is_end_stream),
            }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl<B> RecoveryBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// Every state: held frames, waits and resumes, pending failures.
    #[inline(never)]
    fn poll_general(&mut self, cx: &mut Context<'_>) -> Polled {
        let this = self;
        loop {
            if let Some(frame) = this.held.pop_front() {
                this.deliver(&frame);
                return Poll::Ready(Some(Ok(frame)));
            }
            if let Some(polled) = this.poll_resume(cx) {
                match polled {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(frame))) => {
                        this.held.push_back(frame);
                        continue;
                    }
                    ready @ Poll::Ready(_) => return ready,
                }
            }
            if let Some(live) = &mut this.live {
                if let Some(failure) = live.failed_after_frame.take() {
                    match this.fail(*failure) {
                        Poll::Pending => continue,
                        ready @ Poll::Ready(_) => return ready,
                    }
                }
            }
            let Some(inner) = this.inner.as_mut() else {
                return Poll::Ready(None);
            };
            let result = match inner.as_mut().poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => this.on_frame(frame),
                Poll::Pending => match this.on_pending(cx) {
                    // Nothing fired: wait for the inner body.
                    Poll::Pending if this.waiting() => return Poll::Pending,
                    other => other,
                },
                Poll::Ready(other) => this.on_ended(other.map(|r| r.map_err(Into::into))),
            };
            match result {
                // A resume was scheduled, or frames were queued: go round.
                Poll::Pending => {}
                ready @ Poll::Ready(_) => return ready,
            }
        }
    }

    /// Whether the body is waiting on its inner body and nothing else is due:
    /// streaming, no failure pending.
    fn waiting(&self) -> bool {
        self.live
            .as_ref()
            .is_none_or(|l| matches!(l.stage, Stage::Streaming) && l.failed_after_frame.is_none())
    }

    /// The inner body is not ready: the watchdog may have fired. `Pending`
    /// either way but a stall; callers go round when [`waiting`] is false.
    fn on_pending(&mut self, cx: &mut Context<'_>) -> Polled {
        let Some(live) = &mut self.live else {
            return Poll::Pending;
        };
        let stall = ready!(live.watchdog.poll_stall(cx));
        self.fail(Failure::new(
            FailureKind::Timeout { stall },
            Phase::Streaming,
        ))
    }

    /// The inner body ended or failed.
    #[cold]
    fn on_ended(&mut self, polled: Option<Result<Frame<Bytes>, BoxError>>) -> Polled {
        match polled {
            Some(Ok(frame)) => self.on_frame(frame),
            Some(Err(e)) => self.on_error(e),
            None => self.end(),
        }
    }

    /// The common data frame: committed, no wire hook, no event gate. Does
    /// the bookkeeping [`on_frame`](Self::on_frame) does for it and says
    /// whether the bytes go out as they are.
    #[inline]
    fn passes(&mut self, data: &Bytes) -> bool {
        let Some(live) = &mut self.live else {
            return false;
        };
        if live.wire.is_some() || live.gate.is_some() || live.watchdog.is_armed() {
            return false;
        }
        if live
            .handle
            .as_ref()
            .is_some_and(ObserveHandle::provider_error_seen)
        {
            return false;
        }
        live.delivered_bytes += data.len() as u64;
        true
    }

    fn on_frame(&mut self, frame: Frame<Bytes>) -> Polled {
        let Some(live) = &mut self.live else {
            return Poll::Ready(Some(Ok(frame)));
        };
        if let (Some((wire, attempt)), Some(data)) = (&live.wire, frame.data_ref()) {
            if let Err(e) = wire.on_body_chunk(*attempt, data) {
                lock(&live.shared).evidence.set_cause(Arc::from(e));
                return self.fail(Failure::new(
                    FailureKind::ObserverRejected,
                    Phase::Streaming,
                ));
            }
        }
        let handle = live.handle.as_ref();
        if live.watchdog.is_armed() {
            let semantic = handle.map_or(0, ObserveHandle::semantic_fragments);
            live.watchdog.on_frame(semantic);
        }
        if let Some(error) = handle
            .filter(|h| h.provider_error_seen())
            .and_then(ObserveHandle::provider_error)
        {
            live.failed_after_frame = Some(Box::new(Failure::new(
                FailureKind::Provider { error },
                Phase::Streaming,
            )));
        }
        if live.gate.is_some() {
            return self.through_gate(frame);
        }
        live.delivered_bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
        Poll::Ready(Some(Ok(frame)))
    }

    /// Event-granular delivery: only complete events leave the gate.
    fn through_gate(&mut self, frame: Frame<Bytes>) -> Polled {
        let Some(live) = &mut self.live else {
            return Poll::Ready(Some(Ok(frame)));
        };
        match (live.gate.as_mut(), frame.into_data()) {
            (Some(gate), Ok(data)) => match gate.push(&data) {
                Ok(events) => {
                    if let Some(r) = live.resume.as_mut() {
                        r.delivered(&events);
                    }
                    self.held.extend(events.into_iter().map(Frame::data));
                    Poll::Pending
                }
                Err(v) => self.fail(Failure::new(
                    FailureKind::Protocol {
                        violation: v.into(),
                    },
                    Phase::Decoding,
                )),
            },
            (_, Ok(data)) => {
                let frame = Frame::data(data);
                self.deliver(&frame);
                Poll::Ready(Some(Ok(frame)))
            }
            (_, Err(frame)) => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn on_error(&mut self, e: BoxError) -> Polled {
        let Some(live) = &self.live else {
            self.inner = None;
            return Poll::Ready(None);
        };
        let proven = live.handle.as_ref().is_some_and(|h| h.terminal().is_some());
        if proven {
            // An error after terminal proof (a reset right after `[DONE]`)
            // changes nothing: the outcome stands.
            lock(&live.shared).engine.late_error();
            return self.end();
        }
        let failure = classify::body_error(&e);
        lock(&live.shared).evidence.set_cause(Arc::from(e));
        self.fail(failure)
    }
}

impl<B> Drop for RecoveryBody<B> {
    fn drop(&mut self) {
        if let Some(live) = &self.live {
            let phase = match live.stage {
                Stage::Done => return,
                Stage::Waiting(_) => CancelPhase::Waiting,
                Stage::Parked(_) | Stage::ParkedBeforeSend(..) => CancelPhase::Parked,
                Stage::Connecting(_) => CancelPhase::AwaitingHead,
                Stage::Streaming => CancelPhase::Streaming,
            };
            // The consumer dropped the body: cancellation, never an EOF.
            let progress = Self::delivered_progress(live);
            let mut s = lock(&live.shared);
            s.engine.record_progress(progress);
            s.engine.cancel(live.clock.now(), phase);
            s.flush();
        }
    }
}
