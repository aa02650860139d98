//! The clocks, sleeps and connectivity a driver uses, object-safe: a
//! layer's `Timing` and `Connectivity` behind one trait object.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::time::SystemTime;

use recovery_core::timing::{Connectivity, Fraction, Instant, JitterSource, Timing};

use super::bounds::{DriverConnectivity, DriverTiming};

/// A connectivity wait (or any one-shot wait), boxed so the driver is
/// generic over the response body only.
pub(crate) type Timer = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The driver's one sleep.
pub(crate) trait Alarm: Send {
    fn poll_elapsed(&mut self, cx: &mut Context<'_>) -> Poll<()>;
    /// Whether it elapsed, when the timer can tell without a poll.
    fn has_elapsed(&self) -> Option<bool>;
}

/// The clocks, sleeps and connectivity of a layer, object-safe.
pub(crate) trait Surroundings: Send + Sync {
    fn now(&self) -> Instant;
    fn wall_now(&self) -> SystemTime;
    fn jitter(&self) -> Fraction;
    /// The jitter source of a request that starts now.
    fn jitter_source(&self) -> JitterSource;
    fn online(&self) -> bool;
    fn sleep(&self, d: Duration) -> Box<dyn Alarm>;
    fn wait_online(&self) -> Timer;
}

/// A layer's timing and connectivity, as the driver uses them.
impl<T, C> Surroundings for (T, C)
where
    T: Timing<Sleep: Send + 'static> + Send + Sync,
    C: Connectivity<Online: Send + 'static> + Send + Sync,
{
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn wall_now(&self) -> SystemTime {
        self.0.wall_now()
    }
    fn jitter(&self) -> Fraction {
        self.0.jitter()
    }
    fn jitter_source(&self) -> JitterSource {
        self.0.jitter_source()
    }
    fn online(&self) -> bool {
        self.1.is_online()
    }
    fn sleep(&self, d: Duration) -> Box<dyn Alarm> {
        Box::new(Sleeping {
            sleep: Box::pin(self.0.sleep(d)),
            elapsed: T::has_elapsed,
        })
    }
    fn wait_online(&self) -> Timer {
        Box::pin(self.1.wait_until_online())
    }
}

/// A sleep of the layer's timing as the driver's alarm.
struct Sleeping<S> {
    sleep: Pin<Box<S>>,
    elapsed: fn(&S) -> Option<bool>,
}

impl<S: Future<Output = ()> + Send> Alarm for Sleeping<S> {
    fn poll_elapsed(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.sleep.as_mut().poll(cx)
    }

    fn has_elapsed(&self) -> Option<bool> {
        (self.elapsed)(&self.sleep)
    }
}

/// A layer's timing and connectivity as the driver's surroundings.
pub(crate) fn surroundings<T, C>(timing: &T, connectivity: &C) -> Arc<dyn Surroundings>
where
    T: DriverTiming,
    C: DriverConnectivity,
{
    Arc::new((timing.clone(), connectivity.clone()))
}
