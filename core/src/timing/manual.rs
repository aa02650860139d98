//! The virtual clock and scripted connectivity of tests (feature
//! `test-util`): time moves only when a test says so.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime};

use super::{Connectivity, Fraction, Instant, JitterSource, Timing};

#[derive(Debug, Default)]
struct ManualState {
    now: Duration,
    wall_origin: Duration,
    next_timer: u64,
    timers: BTreeMap<u64, (Duration, Option<Waker>)>,
    jitter: JitterSource,
}

/// A virtual clock for tests: time moves only when [`ManualTiming::advance`]
/// is called, sleeps complete when their deadline is reached, and jitter is
/// scripted, pinned or drawn from a seeded generator.
///
/// Clones share one clock. It is `Send + Sync` so it can drive tower futures.
#[derive(Debug, Clone, Default)]
pub struct ManualTiming {
    state: Arc<Mutex<ManualState>>,
}

impl ManualTiming {
    /// A clock at its origin whose wall clock reads the Unix epoch and whose
    /// jitter is drawn from a generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        let t = ManualTiming::default();
        t.state.lock().expect("clock").jitter = JitterSource::seeded(seed);
        t
    }

    /// Pins every jitter draw to `fraction` (grpc-java pins 0.5).
    pub fn with_pinned_jitter(self, fraction: Fraction) -> Self {
        let mut s = self.state.lock().expect("clock");
        s.jitter = std::mem::take(&mut s.jitter).then_pinned(fraction);
        drop(s);
        self
    }

    /// Sets the wall clock so that the origin reads `since_epoch` after the
    /// Unix epoch.
    pub fn with_wall_clock(self, since_epoch: Duration) -> Self {
        self.state.lock().expect("clock").wall_origin = since_epoch;
        self
    }

    /// Queues jitter draws returned before any pinned or seeded value.
    pub fn script_jitter(&self, draws: impl IntoIterator<Item = Fraction>) {
        let mut s = self.state.lock().expect("clock");
        let then = std::mem::take(&mut s.jitter);
        s.jitter = JitterSource::scripted(draws, then);
    }

    /// Moves time forward by `d`, waking every sleep whose deadline passed.
    pub fn advance(&self, d: Duration) {
        let wakers = {
            let mut s = self.state.lock().expect("clock");
            s.now = s.now.saturating_add(d);
            let now = s.now;
            let mut wakers = Vec::new();
            for (deadline, waker) in s.timers.values_mut() {
                if *deadline <= now
                    && let Some(w) = waker.take()
                {
                    wakers.push(w);
                }
            }
            wakers
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Sleeps that were created and are neither complete nor dropped.
    pub fn pending_timers(&self) -> usize {
        self.state.lock().expect("clock").timers.len()
    }

    /// The earliest pending sleep deadline, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        let s = self.state.lock().expect("clock");
        s.timers.values().map(|(d, _)| Instant(*d)).min()
    }
}

impl Timing for ManualTiming {
    type Sleep = ManualSleep;

    fn now(&self) -> Instant {
        Instant(self.state.lock().expect("clock").now)
    }

    fn wall_now(&self) -> SystemTime {
        let s = self.state.lock().expect("clock");
        SystemTime::UNIX_EPOCH + s.wall_origin + s.now
    }

    fn sleep(&self, duration: Duration) -> ManualSleep {
        let mut s = self.state.lock().expect("clock");
        let id = s.next_timer;
        s.next_timer += 1;
        let deadline = s.now.saturating_add(duration);
        s.timers.insert(id, (deadline, None));
        ManualSleep {
            state: Arc::clone(&self.state),
            id,
        }
    }

    fn jitter(&self) -> Fraction {
        self.state.lock().expect("clock").jitter.draw()
    }

    /// The clock's source as it stands (its scripted draws go to this
    /// request); the clock's own generator moves on a draw, so the next
    /// request's source differs.
    fn jitter_source(&self) -> JitterSource {
        let mut s = self.state.lock().expect("clock");
        let source = s.jitter.clone();
        s.jitter = source.after_script();
        s.jitter.draw();
        source
    }
}

/// The sleep future of [`ManualTiming`]. Dropping it removes the timer.
#[derive(Debug)]
pub struct ManualSleep {
    state: Arc<Mutex<ManualState>>,
    id: u64,
}

impl Future for ManualSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.state.lock().expect("clock");
        let now = s.now;
        match s.timers.get_mut(&self.id) {
            Some((deadline, _)) if *deadline <= now => {
                s.timers.remove(&self.id);
                Poll::Ready(())
            }
            Some((_, waker)) => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }
}

impl Drop for ManualSleep {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock() {
            s.timers.remove(&self.id);
        }
    }
}

#[derive(Debug, Default)]
struct OnlineState {
    online: bool,
    next: u64,
    /// Waiters by id, so a dropped wait removes its listener.
    waiters: BTreeMap<u64, Option<Waker>>,
}

/// Connectivity scripted by a test: starts online or offline, flipped with
/// [`ScriptedConnectivity::set_online`].
#[derive(Debug, Clone, Default)]
pub struct ScriptedConnectivity {
    inner: Arc<Mutex<OnlineState>>,
}

impl ScriptedConnectivity {
    /// Starts in the given state.
    pub fn new(online: bool) -> Self {
        ScriptedConnectivity {
            inner: Arc::new(Mutex::new(OnlineState {
                online,
                ..OnlineState::default()
            })),
        }
    }

    /// Changes the state; going online wakes every waiter.
    pub fn set_online(&self, online: bool) {
        let wakers: Vec<Waker> = {
            let mut s = self.inner.lock().expect("connectivity");
            s.online = online;
            if online {
                s.waiters.values_mut().filter_map(Option::take).collect()
            } else {
                Vec::new()
            }
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Waits for the online signal that are alive (created, not complete,
    /// not dropped): zero once every listener was removed.
    pub fn waiters(&self) -> usize {
        self.inner.lock().expect("connectivity").waiters.len()
    }
}

impl Connectivity for ScriptedConnectivity {
    type Online = WaitOnline;

    fn is_online(&self) -> bool {
        self.inner.lock().expect("connectivity").online
    }

    fn wait_until_online(&self) -> WaitOnline {
        let mut s = self.inner.lock().expect("connectivity");
        let id = s.next;
        s.next += 1;
        s.waiters.insert(id, None);
        WaitOnline {
            inner: Arc::clone(&self.inner),
            id,
        }
    }
}

/// Future of [`ScriptedConnectivity::wait_until_online`]. Dropping it removes
/// its listener.
#[derive(Debug)]
pub struct WaitOnline {
    inner: Arc<Mutex<OnlineState>>,
    id: u64,
}

impl Future for WaitOnline {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.inner.lock().expect("connectivity");
        if s.online {
            s.waiters.remove(&self.id);
            Poll::Ready(())
        } else {
            s.waiters.insert(self.id, Some(cx.waker().clone()));
            Poll::Pending
        }
    }
}

impl Drop for WaitOnline {
    fn drop(&mut self) {
        if let Ok(mut s) = self.inner.lock() {
            s.waiters.remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Flag(std::sync::atomic::AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn sleep_fires_exactly_at_its_deadline() {
        let t = ManualTiming::new(1);
        let mut sleep = Box::pin(t.sleep(Duration::from_millis(500)));
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(Arc::clone(&flag));
        let mut cx = Context::from_waker(&waker);
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        t.advance(Duration::from_millis(499));
        assert!(!flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(sleep.as_mut().poll(&mut cx).is_pending());
        t.advance(Duration::from_millis(1));
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(sleep.as_mut().poll(&mut cx).is_ready());
        assert_eq!(t.pending_timers(), 0);
    }

    #[test]
    fn dropped_sleep_leaves_no_timer() {
        let t = ManualTiming::new(1);
        let s = t.sleep(Duration::from_secs(1));
        assert_eq!(t.pending_timers(), 1);
        drop(s);
        assert_eq!(t.pending_timers(), 0);
    }

    #[test]
    fn a_request_takes_its_jitter_source_once() {
        // Scripted draws go to the request that starts next, then the pin.
        let t = ManualTiming::new(7).with_pinned_jitter(Fraction::HALF);
        t.script_jitter([Fraction::new(0.25)]);
        let mut first = t.jitter_source();
        assert_eq!(first.draw(), Fraction::new(0.25));
        assert_eq!(first.draw(), Fraction::HALF);
        assert_eq!(
            t.jitter_source().draw(),
            Fraction::HALF,
            "the script is spent"
        );
        // Seeded: each request's source differs from the next one's, and a
        // source's draws differ from each other.
        let seeded = ManualTiming::new(7);
        let (mut a, mut b) = (seeded.jitter_source(), seeded.jitter_source());
        let (a1, a2) = (a.draw(), a.draw());
        assert_ne!(a1, a2);
        assert_ne!(a1, b.draw());
        // The default of a timing that does not say: seeded from one draw.
        assert_ne!(
            JitterSource::seeded(1).draw(),
            JitterSource::seeded(2).draw()
        );
    }

    #[test]
    fn jitter_is_scripted_then_pinned_then_seeded() {
        let t = ManualTiming::new(7);
        t.script_jitter([Fraction::new(0.25), Fraction::new(0.75)]);
        assert_eq!(t.jitter(), Fraction::new(0.25));
        assert_eq!(t.jitter(), Fraction::new(0.75));
        let a = t.jitter();
        let b = t.jitter();
        assert_ne!(a, b, "seeded draws differ");
        assert!((0.0..=1.0).contains(&a.get()));
        let pinned = ManualTiming::new(7).with_pinned_jitter(Fraction::HALF);
        assert_eq!(pinned.jitter(), Fraction::HALF);
    }

    #[test]
    fn dropped_online_wait_removes_its_listener() {
        let c = ScriptedConnectivity::new(false);
        let mut wait = Box::pin(c.wait_until_online());
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(Arc::clone(&flag));
        let mut cx = Context::from_waker(&waker);
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        assert_eq!(c.waiters(), 1, "re-polling does not add listeners");
        drop(wait);
        assert_eq!(c.waiters(), 0);
        let mut wait = Box::pin(c.wait_until_online());
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        c.set_online(true);
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(wait.as_mut().poll(&mut cx).is_ready());
        assert_eq!(c.waiters(), 0);
    }

    #[test]
    fn wall_clock_moves_with_virtual_time() {
        let t = ManualTiming::new(0).with_wall_clock(Duration::from_secs(1000));
        t.advance(Duration::from_secs(2));
        assert_eq!(
            t.wall_now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1002)
        );
    }
}
