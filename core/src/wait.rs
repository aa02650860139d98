//! Runtime-free combinators for the waits every driver makes: a send, a
//! sleep or an admission hook, each raced against cancellation or a timer.
//!
//! Left-biased: when both sides are ready in the same poll, the awaited
//! future wins, so a result that already arrived is never thrown away.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::task::Poll;

/// Which of two futures finished first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum First<A, B> {
    /// The first future.
    Left(A),
    /// The second future.
    Right(B),
}

/// Polls `a` then `b` until one completes; the other is dropped.
pub async fn first<A: Future, B: Future>(a: A, b: B) -> First<A::Output, B::Output> {
    let mut a = pin!(a);
    let mut b = pin!(b);
    poll_fn(|cx| {
        if let Poll::Ready(v) = a.as_mut().poll(cx) {
            return Poll::Ready(First::Left(v));
        }
        if let Poll::Ready(v) = b.as_mut().poll(cx) {
            return Poll::Ready(First::Right(v));
        }
        Poll::Pending
    })
    .await
}

/// `fut`'s output, or `None` when `stop` (a cancellation) completes first.
pub async fn unless<F: Future, C: Future<Output = ()>>(fut: F, stop: C) -> Option<F::Output> {
    match first(fut, stop).await {
        First::Left(v) => Some(v),
        First::Right(()) => None,
    }
}

/// The timer fired before the awaited future completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedOut;

/// `fut`'s output, or [`TimedOut`] when `timer` (if any) completes first.
pub async fn within<F: Future, S: Future<Output = ()>>(
    fut: F,
    timer: Option<S>,
) -> Result<F::Output, TimedOut> {
    match timer {
        None => Ok(fut.await),
        Some(t) => match first(fut, t).await {
            First::Left(v) => Ok(v),
            First::Right(()) => Err(TimedOut),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::Cancellation;
    use crate::timing::{ManualTiming, Timing};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};
    use std::time::Duration;

    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }

    fn poll_once<F: Future>(f: std::pin::Pin<&mut F>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::new(Noop));
        f.poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn cancellation_stops_a_sleep_and_removes_its_timer() {
        let t = ManualTiming::new(0);
        let c = Cancellation::new();
        let mut f = Box::pin(unless(t.sleep(Duration::from_secs(5)), c.cancelled()));
        assert!(poll_once(f.as_mut()).is_pending());
        assert_eq!(t.pending_timers(), 1);
        c.cancel();
        assert_eq!(poll_once(f.as_mut()), Poll::Ready(None));
        drop(f);
        assert_eq!(t.pending_timers(), 0, "the cancelled sleep left no timer");
    }

    #[test]
    fn a_ready_result_wins_over_a_simultaneous_cancel() {
        let c = Cancellation::new();
        c.cancel();
        let mut f = pin!(unless(std::future::ready(7), c.cancelled()));
        assert_eq!(poll_once(f.as_mut()), Poll::Ready(Some(7)));
    }

    #[test]
    fn the_timer_bounds_the_wait_only_when_set() {
        let t = ManualTiming::new(0);
        let mut f = pin!(within(
            std::future::pending::<()>(),
            Some(t.sleep(Duration::from_millis(10)))
        ));
        assert!(poll_once(f.as_mut()).is_pending());
        t.advance(Duration::from_millis(10));
        assert_eq!(poll_once(f.as_mut()), Poll::Ready(Err(TimedOut)));
        let mut g = pin!(within(
            std::future::ready(1),
            None::<std::future::Ready<()>>
        ));
        assert_eq!(poll_once(g.as_mut()), Poll::Ready(Ok(1)));
    }
}
