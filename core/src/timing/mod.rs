//! Time, sleep, randomness and connectivity, injected.
//!
//! `core` never reads a clock itself: `std::time::Instant::now()` and
//! `SystemTime::now()` trap on `wasm32-unknown-unknown`, and tests must control
//! time exactly. Drivers implement [`Timing`] on their runtime (tokio, gloo
//! timers); tests use `ManualTiming`, a virtual clock (feature `test-util`).

use std::future::Future;
use std::ops::{Add, Sub};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// A point on a driver's monotonic clock, as the time since that clock's
/// origin. Only differences between two `Instant`s of one clock mean anything.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Instant(Duration);

impl Instant {
    /// The instant `since_origin` after the clock's origin.
    pub const fn from_origin(since_origin: Duration) -> Self {
        Instant(since_origin)
    }

    /// The time since the clock's origin.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// `self + d`, saturating at the far future.
    pub fn saturating_add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_since(rhs)
    }
}

/// A uniform random fraction in `[0, 1]`, used to draw full jitter.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
pub struct Fraction(f64);

impl Fraction {
    /// Zero.
    pub const ZERO: Fraction = Fraction(0.0);
    /// One half (the pinned value of the reference test vectors).
    pub const HALF: Fraction = Fraction(0.5);
    /// One.
    pub const ONE: Fraction = Fraction(1.0);

    /// Clamps `value` into `[0, 1]`; NaN becomes 0.
    pub fn new(value: f64) -> Self {
        if value.is_nan() {
            Fraction(0.0)
        } else {
            Fraction(value.clamp(0.0, 1.0))
        }
    }

    /// From 64 random bits (uniform over `[0, 1)` with 53 bits of precision).
    pub fn from_bits(bits: u64) -> Self {
        Fraction((bits >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// The value in `[0, 1]`.
    pub fn get(self) -> f64 {
        self.0
    }

    /// `d · self`, rounded down to whole microseconds.
    pub fn of(self, d: Duration) -> Duration {
        let micros = d.as_micros() as f64 * self.0;
        Duration::from_micros(micros as u64)
    }
}

/// Where one request's jitter draws come from, fixed when the request
/// starts: a driver hands the machine its randomness once (a seed), not at
/// every input. A seeded source is splitmix64: small, and with seeds drawn
/// at random (or distinct per request), clients do not retry in lockstep.
#[derive(Debug, Clone, PartialEq)]
pub struct JitterSource {
    /// Draws given before any other, in order (tests).
    scripted: Vec<Fraction>,
    /// Every draw after the scripted ones, when pinned.
    pinned: Option<Fraction>,
    /// The generator's state otherwise.
    seed: u64,
}

impl Default for JitterSource {
    /// Seeded with 0.
    fn default() -> Self {
        JitterSource::seeded(0)
    }
}

impl JitterSource {
    /// Draws from a generator seeded with `seed`.
    pub fn seeded(seed: u64) -> Self {
        JitterSource {
            scripted: Vec::new(),
            pinned: None,
            seed,
        }
    }

    /// Every draw is `fraction` (the conformance vectors pin 0.5).
    pub fn pinned(fraction: Fraction) -> Self {
        JitterSource {
            pinned: Some(fraction),
            ..JitterSource::seeded(0)
        }
    }

    /// `draws` first, in order, then what `then` draws.
    pub fn scripted(draws: impl IntoIterator<Item = Fraction>, then: JitterSource) -> Self {
        let mut scripted: Vec<Fraction> = draws.into_iter().collect();
        scripted.reverse();
        scripted.extend(then.scripted);
        JitterSource { scripted, ..then }
    }

    /// The same scripted draws, then every draw `fraction`.
    pub fn then_pinned(self, fraction: Fraction) -> Self {
        JitterSource {
            pinned: Some(fraction),
            ..self
        }
    }

    /// The same source without its scripted draws.
    pub fn after_script(&self) -> Self {
        JitterSource {
            scripted: Vec::new(),
            ..self.clone()
        }
    }

    /// The next draw.
    pub fn draw(&mut self) -> Fraction {
        if let Some(f) = self.scripted.pop() {
            return f;
        }
        if let Some(f) = self.pinned {
            return f;
        }
        self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Fraction::from_bits(z ^ (z >> 31))
    }
}

/// The driver's clocks, timer and random source.
///
/// `Sleep` carries no `Send` bound: browser timers are not `Send`. A driver
/// that needs `Send` futures (tower over a multi-threaded runtime) asks for it
/// on its own impl.
pub trait Timing {
    /// The future returned by [`Timing::sleep`].
    type Sleep: Future<Output = ()>;

    /// Now, on the monotonic clock.
    fn now(&self) -> Instant;

    /// Now, on the wall clock (only used to read HTTP-date `Retry-After`).
    fn wall_now(&self) -> SystemTime;

    /// A future that completes `duration` after it was created.
    fn sleep(&self, duration: Duration) -> Self::Sleep;

    /// A fresh uniform random fraction for jitter. Never a fixed seed in
    /// production drivers: clients must not retry in lockstep.
    fn jitter(&self) -> Fraction;

    /// The jitter source of a request that starts now: by default a
    /// generator seeded from one draw of [`Timing::jitter`]. A timing whose
    /// draws are pinned (tests) returns [`JitterSource::pinned`].
    fn jitter_source(&self) -> JitterSource {
        JitterSource::seeded(self.jitter().get().to_bits())
    }

    /// Whether `sleep` has completed, read without polling it, when the
    /// timer can tell (`None`, the default: poll it to know). A driver
    /// whose task is woken by the sleep anyway then checks it cheaply
    /// instead of registering its waker again on every pending read.
    fn has_elapsed(sleep: &Self::Sleep) -> Option<bool> {
        let _ = sleep;
        None
    }
}

/// Whether the network is reachable, as far as the platform can tell.
pub trait Connectivity {
    /// The future returned by [`Connectivity::wait_until_online`].
    type Online: Future<Output = ()>;

    /// Whether the platform believes it is online now.
    fn is_online(&self) -> bool;

    /// Completes once the platform reports it is online again.
    fn wait_until_online(&self) -> Self::Online;
}

/// Connectivity for platforms that cannot tell: always online.
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysOnline;

impl Connectivity for AlwaysOnline {
    type Online = std::future::Ready<()>;

    fn is_online(&self) -> bool {
        true
    }

    fn wait_until_online(&self) -> Self::Online {
        std::future::ready(())
    }
}

#[cfg(any(test, feature = "test-util"))]
mod manual;
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub use manual::{ManualSleep, ManualTiming, ScriptedConnectivity, WaitOnline};
