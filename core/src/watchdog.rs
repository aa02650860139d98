//! The opt-in stall watchdog, shared by every driver.
//!
//! Two clocks (protocols.md §10): *idle* fires after a silence with no byte
//! at all; *progress* fires after a time without a new semantic fragment,
//! and keepalives never reset it (a keepalive proves the connection lives,
//! not that the answer moves). Deadlines never cut an active generation; only
//! this watchdog does, and its failure names it (`client_timeout`).

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::failure::Stall;

/// Idle and progress timers over sleeps of type `S` (a driver's timer).
pub struct Watchdog<S> {
    idle_timeout: Option<Duration>,
    progress_timeout: Option<Duration>,
    idle: Option<Pin<Box<S>>>,
    progress: Option<Pin<Box<S>>>,
    semantic_seen: u64,
}

impl<S> std::fmt::Debug for Watchdog<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("idle_timeout", &self.idle_timeout)
            .field("progress_timeout", &self.progress_timeout)
            .field("semantic_seen", &self.semantic_seen)
            .finish_non_exhaustive()
    }
}

impl<S: Future<Output = ()>> Watchdog<S> {
    /// Arms the configured timers now; `sleep` makes a timer of a duration.
    pub fn start(
        idle_timeout: Option<Duration>,
        progress_timeout: Option<Duration>,
        sleep: impl Fn(Duration) -> S,
    ) -> Self {
        Watchdog {
            idle_timeout,
            progress_timeout,
            idle: idle_timeout.map(|d| Box::pin(sleep(d))),
            progress: progress_timeout.map(|d| Box::pin(sleep(d))),
            semantic_seen: 0,
        }
    }

    /// Rearms both timers for a new stream (a resumed attempt).
    pub fn restart(&mut self, sleep: impl Fn(Duration) -> S) {
        self.idle = self.idle_timeout.map(|d| Box::pin(sleep(d)));
        self.progress = self.progress_timeout.map(|d| Box::pin(sleep(d)));
        self.semantic_seen = 0;
    }

    /// Whether any timer is configured; without one, [`on_frame`](Self::on_frame)
    /// has nothing to do and a driver may skip it.
    #[inline]
    pub fn is_armed(&self) -> bool {
        self.idle_timeout.is_some() || self.progress_timeout.is_some()
    }

    /// Bytes arrived; `semantic` is the stream's count of semantic fragments
    /// so far. Any byte rearms the idle timer; only a new semantic fragment
    /// rearms the progress timer.
    pub fn on_frame(&mut self, semantic: u64, sleep: impl Fn(Duration) -> S) {
        if let Some(d) = self.idle_timeout {
            self.idle = Some(Box::pin(sleep(d)));
        }
        if semantic > self.semantic_seen {
            self.semantic_seen = semantic;
            if let Some(d) = self.progress_timeout {
                self.progress = Some(Box::pin(sleep(d)));
            }
        }
    }

    /// Which timer fired, if one did.
    pub fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<Stall> {
        if self
            .idle
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Stall::Idle);
        }
        if self
            .progress
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
        {
            return Poll::Ready(Stall::Progress);
        }
        Poll::Pending
    }

    /// Completes when a timer fires; never, when none is configured.
    pub async fn stalled(&mut self) -> Stall {
        poll_fn(|cx| self.poll_stall(cx)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::{ManualTiming, Timing};
    use std::sync::Arc;
    use std::task::{Wake, Waker};

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    fn poll<S: Future<Output = ()>>(w: &mut Watchdog<S>) -> Poll<Stall> {
        let waker = Waker::from(Arc::new(Noop));
        w.poll_stall(&mut Context::from_waker(&waker))
    }

    #[test]
    fn idle_fires_after_silence_and_any_byte_rearms_it() {
        let t = ManualTiming::new(0);
        let mut w = Watchdog::start(Some(Duration::from_secs(5)), None, |d| t.sleep(d));
        t.advance(Duration::from_millis(4999));
        assert!(poll(&mut w).is_pending());
        w.on_frame(0, |d| t.sleep(d));
        t.advance(Duration::from_millis(4999));
        assert!(poll(&mut w).is_pending(), "the byte rearmed the timer");
        t.advance(Duration::from_millis(1));
        assert_eq!(poll(&mut w), Poll::Ready(Stall::Idle));
    }

    #[test]
    fn keepalives_never_rearm_the_progress_timer() {
        let t = ManualTiming::new(0);
        let mut w = Watchdog::start(None, Some(Duration::from_secs(30)), |d| t.sleep(d));
        for _ in 0..29 {
            t.advance(Duration::from_secs(1));
            w.on_frame(0, |d| t.sleep(d)); // a keepalive: no new fragment
        }
        t.advance(Duration::from_millis(999));
        assert!(poll(&mut w).is_pending());
        t.advance(Duration::from_millis(1));
        assert_eq!(poll(&mut w), Poll::Ready(Stall::Progress));
        w.restart(|d| t.sleep(d));
        w.on_frame(1, |d| t.sleep(d));
        t.advance(Duration::from_secs(29));
        assert!(poll(&mut w).is_pending(), "a fragment rearmed it");
    }

    #[test]
    fn without_timers_nothing_ever_fires() {
        let t = ManualTiming::new(0);
        let mut w = Watchdog::start(None, None, |d| t.sleep(d));
        t.advance(Duration::from_secs(86_400));
        assert!(poll(&mut w).is_pending());
        assert_eq!(t.pending_timers(), 0);
    }
}
