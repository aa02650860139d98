use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use recovery_core::error::RecoveryError;
use recovery_core::failure::{Failure, FailureKind, Phase, Stall};
use recovery_core::outcome::CancelPhase;
use recovery_core::progress::Terminal;
use recovery_core::timing::{Instant, Timing};

use super::classify;
use super::shared::{SharedRef, lock};
use super::wire::WireObserver;
use crate::BoxError;
use crate::observe::ObserveHandle;

/// The clock a body needs after commit, object-safe so that
/// [`RecoveryBody`] is not generic over the timing.
pub(crate) trait BodyClock: Send + Sync {
    fn now(&self) -> Instant;
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
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
}

pub(crate) fn clock<T>(timing: &T) -> Arc<dyn BodyClock>
where
    T: Timing + Clone + Send + Sync + 'static,
    T::Sleep: Send + 'static,
{
    Arc::new(timing.clone())
}

struct Live {
    handle: Option<ObserveHandle>,
    shared: SharedRef,
    clock: Arc<dyn BodyClock>,
    idle_timeout: Option<Duration>,
    idle: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    wire: Option<(Arc<dyn WireObserver>, u32)>,
    /// A provider error was delivered in the last frame: fail on the next poll.
    failed_after_frame: Option<Failure>,
    done: bool,
}

/// The stitched response body: first the held-back prefix, then the
/// committed attempt's stream. After commit a failure ends it with a typed
/// [`RecoveryError`]; the end of the stream completes the report.
pub struct RecoveryBody {
    held: VecDeque<Frame<Bytes>>,
    inner: Option<UnsyncBoxBody<Bytes, BoxError>>,
    live: Option<Live>,
}

impl fmt::Debug for RecoveryBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveryBody")
            .field("held_frames", &self.held.len())
            .field("committed", &self.live.is_some())
            .finish_non_exhaustive()
    }
}

impl RecoveryBody {
    /// A final HTTP error response's body, passed through as the server sent it.
    pub(crate) fn passthrough(
        held: VecDeque<Frame<Bytes>>,
        rest: UnsyncBoxBody<Bytes, BoxError>,
    ) -> Self {
        RecoveryBody {
            held,
            inner: Some(rest),
            live: None,
        }
    }

    pub(crate) fn committed(
        held: VecDeque<Frame<Bytes>>,
        inner: UnsyncBoxBody<Bytes, BoxError>,
        handle: Option<ObserveHandle>,
        shared: SharedRef,
        clock: Arc<dyn BodyClock>,
        idle_timeout: Option<Duration>,
        wire: Option<(Arc<dyn WireObserver>, u32)>,
    ) -> Self {
        let idle = idle_timeout.map(|d| clock.sleep(d));
        RecoveryBody {
            held,
            inner: Some(inner),
            live: Some(Live {
                handle,
                shared,
                clock,
                idle_timeout,
                idle,
                wire,
                failed_after_frame: None,
                done: false,
            }),
        }
    }

    fn deliver(&self, frame: &Frame<Bytes>) {
        if let Some(live) = &self.live {
            let mut s = lock(&live.shared);
            let mut progress = live
                .handle
                .as_ref()
                .map(|h| h.snapshot().progress)
                .unwrap_or_default();
            progress.deliver_observed();
            progress.delivered_bytes = s
                .engine
                .report()
                .attempts
                .last()
                .map_or(0, |a| a.progress.delivered_bytes)
                + frame.data_ref().map_or(0, |d| d.len() as u64);
            s.engine.record_progress(progress);
        }
    }

    fn fail(&mut self, failure: Failure) -> Poll<Option<Result<Frame<Bytes>, RecoveryError>>> {
        self.inner = None;
        let Some(live) = &mut self.live else {
            return Poll::Ready(None);
        };
        live.done = true;
        let mut s = lock(&live.shared);
        let progress = live.handle.as_ref().map(|h| h.snapshot().progress);
        let failure = match progress {
            Some(p) => {
                let mut p = p;
                p.deliver_observed();
                failure.with_progress(p)
            }
            None => failure,
        };
        let now = live.clock.now();
        let action = s
            .engine
            .fail(now, failure, true, recovery_core::timing::Fraction::ZERO);
        s.flush();
        let outcome = match action {
            recovery_core::decision::Action::Fail(o) => o,
            // After commit only a resume could continue the stream, and this
            // body does not resume: the engine never offers one here.
            _ => s.engine.cancel(now, CancelPhase::Streaming),
        };
        s.flush();
        Poll::Ready(Some(Err(s.error(outcome))))
    }

    fn end(&mut self) -> Poll<Option<Result<Frame<Bytes>, RecoveryError>>> {
        let Some(live) = &mut self.live else {
            return Poll::Ready(None);
        };
        let terminal = live.handle.as_ref().and_then(|h| h.snapshot().terminal);
        match terminal {
            Some(Terminal::Success { proof }) => {
                live.done = true;
                let mut s = lock(&live.shared);
                let mut progress = live
                    .handle
                    .as_ref()
                    .map(|h| h.snapshot().progress)
                    .unwrap_or_default();
                progress.deliver_observed();
                s.engine.succeed(live.clock.now(), proof, progress);
                s.flush();
                self.inner = None;
                Poll::Ready(None)
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
}

impl Body for RecoveryBody {
    type Data = Bytes;
    type Error = RecoveryError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, RecoveryError>>> {
        let this = &mut *self;
        if let Some(frame) = this.held.pop_front() {
            this.deliver(&frame);
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(live) = &mut this.live {
            if live.done {
                return Poll::Ready(None);
            }
            if let Some(failure) = live.failed_after_frame.take() {
                return this.fail(failure);
            }
        }
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if polled.is_pending() {
            if let Some(live) = &mut this.live {
                if let Some(idle) = live.idle.as_mut() {
                    ready!(idle.as_mut().poll(cx));
                    return this.fail(Failure::new(
                        FailureKind::Timeout { stall: Stall::Idle },
                        Phase::Streaming,
                    ));
                }
            }
            return Poll::Pending;
        }
        match ready!(polled) {
            Some(Ok(frame)) => {
                if let Some(live) = &mut this.live {
                    if let (Some((wire, attempt)), Some(data)) = (&live.wire, frame.data_ref()) {
                        if let Err(e) = wire.on_body_chunk(*attempt, data) {
                            lock(&live.shared).evidence.set_cause(Arc::from(e));
                            return this.fail(Failure::new(
                                FailureKind::ObserverRejected,
                                Phase::Streaming,
                            ));
                        }
                    }
                    if let Some(d) = live.idle_timeout {
                        live.idle = Some(live.clock.sleep(d));
                    }
                    if let Some(error) = live
                        .handle
                        .as_ref()
                        .and_then(|h| h.snapshot().provider_error)
                    {
                        live.failed_after_frame = Some(Failure::new(
                            FailureKind::Provider { error },
                            Phase::Streaming,
                        ));
                    }
                }
                this.deliver(&frame);
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(e)) => {
                if this.live.is_none() {
                    this.inner = None;
                    return Poll::Ready(None);
                }
                if let Some(live) = &this.live {
                    let proven = live
                        .handle
                        .as_ref()
                        .is_some_and(|h| h.snapshot().terminal.is_some());
                    if proven {
                        // An error after terminal proof (a reset right after
                        // `[DONE]`) changes nothing: the outcome stands.
                        lock(&live.shared).engine.late_error();
                        return this.end();
                    }
                }
                let failure = classify::body_error(&e);
                if let Some(live) = &this.live {
                    lock(&live.shared).evidence.set_cause(Arc::from(e));
                }
                this.fail(failure)
            }
            None => this.end(),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty()
            && match &self.live {
                Some(live) => live.done,
                None => self.inner.as_ref().is_none_or(Body::is_end_stream),
            }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

impl Drop for RecoveryBody {
    fn drop(&mut self) {
        if let Some(live) = &self.live {
            if !live.done {
                // The consumer dropped the body: cancellation, never an EOF.
                let mut s = lock(&live.shared);
                s.engine.cancel(live.clock.now(), CancelPhase::Streaming);
                s.flush();
            }
        }
    }
}
