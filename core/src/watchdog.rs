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
use crate::timing::{Instant, Timing};

/// What a watchdog needs of a driver's clock: the time now, and a sleep.
/// Every [`Timing`] is one.
pub trait WatchClock {
    /// The sleep future.
    type Sleep: Future<Output = ()>;
    /// Now, on the monotonic clock.
    fn now(&self) -> Instant;
    /// A future that completes `duration` after it was created.
    fn sleep(&self, duration: Duration) -> Self::Sleep;
}

impl<T: Timing> WatchClock for T {
    type Sleep = T::Sleep;
    fn now(&self) -> Instant {
        Timing::now(self)
    }
    fn sleep(&self, duration: Duration) -> T::Sleep {
        Timing::sleep(self, duration)
    }
}

/// Idle and progress timers on a driver's clock.
///
/// A frame only records when it arrived: a timer is re-armed lazily, when
/// it fires before its deadline (the last byte, or the last fragment, plus
/// the timeout), so a stream costs a clock read per frame rather than a new
/// timer.
pub struct Watchdog<C: WatchClock> {
    clock: C,
    idle: Timer<C::Sleep>,
    progress: Timer<C::Sleep>,
    semantic_seen: u64,
}

/// One timer: its timeout, the start of the silence it measures, and the
/// sleep that wakes it.
struct Timer<S> {
    timeout: Option<Duration>,
    since: Instant,
    sleep: Option<Pin<Box<S>>>,
}

impl<S: Future<Output = ()>> Timer<S> {
    fn new(timeout: Option<Duration>) -> Self {
        Timer {
            timeout,
            since: Instant::default(),
            sleep: None,
        }
    }

    fn arm<C: WatchClock<Sleep = S>>(&mut self, clock: &C, now: Instant) {
        self.since = now;
        self.sleep = self.timeout.map(|d| Box::pin(clock.sleep(d)));
    }

    /// Whether the deadline passed; re-arms for the rest when the sleep
    /// woke early (the silence restarted meanwhile).
    fn fired<C: WatchClock<Sleep = S>>(&mut self, clock: &C, cx: &mut Context<'_>) -> bool {
        let Some(timeout) = self.timeout else {
            return false;
        };
        loop {
            let Some(sleep) = self.sleep.as_mut() else {
                return false;
            };
            if sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
            let deadline = self.since + timeout;
            let now = clock.now();
            if now >= deadline {
                return true;
            }
            self.sleep = Some(Box::pin(clock.sleep(deadline.saturating_since(now))));
        }
    }
}

impl<C: WatchClock> std::fmt::Debug for Watchdog<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watchdog")
            .field("idle_timeout", &self.idle.timeout)
            .field("progress_timeout", &self.progress.timeout)
            .field("semantic_seen", &self.semantic_seen)
            .finish_non_exhaustive()
    }
}

impl<C: WatchClock> Watchdog<C> {
    /// Arms the configured timers now.
    pub fn start(
        clock: C,
        idle_timeout: Option<Duration>,
        progress_timeout: Option<Duration>,
    ) -> Self {
        let mut dog = Watchdog {
            clock,
            idle: Timer::new(idle_timeout),
            progress: Timer::new(progress_timeout),
            semantic_seen: 0,
        };
        dog.restart();
        dog
    }

    /// Rearms both timers for a new stream (a resumed attempt).
    pub fn restart(&mut self) {
        if !self.is_armed() {
            return;
        }
        let now = self.clock.now();
        self.idle.arm(&self.clock, now);
        self.progress.arm(&self.clock, now);
        self.semantic_seen = 0;
    }

    /// Whether any timer is configured; without one, [`on_frame`](Self::on_frame)
    /// has nothing to do and a driver may skip it.
    #[inline]
    pub fn is_armed(&self) -> bool {
        self.idle.timeout.is_some() || self.progress.timeout.is_some()
    }

    /// Bytes arrived; `semantic` is the stream's count of semantic fragments
    /// so far. Any byte restarts the idle silence; only a new semantic
    /// fragment restarts the progress one.
    pub fn on_frame(&mut self, semantic: u64) {
        if !self.is_armed() {
            return;
        }
        let now = self.clock.now();
        self.idle.since = now;
        if semantic > self.semantic_seen {
            self.semantic_seen = semantic;
            self.progress.since = now;
        }
    }

    /// Which timer fired, if one did.
    pub fn poll_stall(&mut self, cx: &mut Context<'_>) -> Poll<Stall> {
        if !self.is_armed() {
            return Poll::Pending;
        }
        if self.idle.fired(&self.clock, cx) {
            return Poll::Ready(Stall::Idle);
        }
        if self.progress.fired(&self.clock, cx) {
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

    fn poll<C: WatchClock>(w: &mut Watchdog<C>) -> Poll<Stall> {
        let waker = Waker::from(Arc::new(Noop));
        w.poll_stall(&mut Context::from_waker(&waker))
    }

    #[test]
    fn idle_fires_after_silence_and_any_byte_rearms_it() {
        let t = ManualTiming::new(0);
        let mut w = Watchdog::start(t.clone(), Some(Duration::from_secs(5)), None);
        t.advance(Duration::from_millis(4999));
        assert!(poll(&mut w).is_pending());
        w.on_frame(0);
        t.advance(Duration::from_millis(4999));
        assert!(poll(&mut w).is_pending(), "the byte rearmed the timer");
        t.advance(Duration::from_millis(1));
        assert_eq!(poll(&mut w), Poll::Ready(Stall::Idle));
    }

    #[test]
    fn keepalives_never_rearm_the_progress_timer() {
        let t = ManualTiming::new(0);
        let mut w = Watchdog::start(t.clone(), None, Some(Duration::from_secs(30)));
        for _ in 0..29 {
            t.advance(Duration::from_secs(1));
            w.on_frame(0); // a keepalive: no new fragment
        }
        t.advance(Duration::from_millis(999));
        assert!(poll(&mut w).is_pending());
        t.advance(Duration::from_millis(1));
        assert_eq!(poll(&mut w), Poll::Ready(Stall::Progress));
        w.restart();
        w.on_frame(1);
        t.advance(Duration::from_secs(29));
        assert!(poll(&mut w).is_pending(), "a fragment rearmed it");
    }

    #[test]
    fn frames_create_no_timers_and_a_rearm_keeps_the_exact_deadline() {
        /// A clock that counts the sleeps it made.
        struct Counting(ManualTiming, std::cell::Cell<u32>);
        impl WatchClock for &Counting {
            type Sleep = <ManualTiming as Timing>::Sleep;
            fn now(&self) -> Instant {
                Timing::now(&self.0)
            }
            fn sleep(&self, d: Duration) -> Self::Sleep {
                self.1.set(self.1.get() + 1);
                Timing::sleep(&self.0, d)
            }
        }
        let t = ManualTiming::new(0);
        let clock = Counting(t.clone(), std::cell::Cell::new(0));
        let mut w = Watchdog::start(
            &clock,
            Some(Duration::from_secs(5)),
            Some(Duration::from_secs(30)),
        );
        for k in 1..=1000 {
            t.advance(Duration::from_millis(10));
            w.on_frame(k);
            assert!(poll(&mut w).is_pending());
        }
        // A thousand frames: two sleeps at the start, and one re-arm of the
        // idle sleep each time it woke (at 5 s and at 10 s).
        assert_eq!(clock.1.get(), 4, "a frame only records its time");
        // The silence began with the last frame, at 10 s.
        t.advance(Duration::from_millis(4999));
        assert!(poll(&mut w).is_pending());
        t.advance(Duration::from_millis(1));
        assert_eq!(poll(&mut w), Poll::Ready(Stall::Idle));
    }

    #[test]
    fn without_timers_nothing_ever_fires() {
        let t = ManualTiming::new(0);
        let mut w = Watchdog::start(t.clone(), None, None);
        t.advance(Duration::from_secs(86_400));
        assert!(poll(&mut w).is_pending());
        assert_eq!(t.pending_timers(), 0);
    }
}
