//! tokio implementation of the core's [`Timing`] trait.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use recovery_core::timing::{Fraction, Instant, Timing};

/// Timing on tokio's clock (so `tokio::time::pause` drives it in tests) with
/// jitter from a randomly seeded generator, never a fixed seed.
#[derive(Debug, Clone)]
pub struct TokioTiming {
    origin: tokio::time::Instant,
    state: Arc<(RandomState, AtomicU64)>,
}

impl Default for TokioTiming {
    fn default() -> Self {
        TokioTiming::new()
    }
}

impl TokioTiming {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        TokioTiming {
            origin: tokio::time::Instant::now(),
            state: Arc::new((RandomState::new(), AtomicU64::new(0))),
        }
    }
}

impl Timing for TokioTiming {
    type Sleep = tokio::time::Sleep;

    fn now(&self) -> Instant {
        Instant::from_origin(tokio::time::Instant::now().saturating_duration_since(self.origin))
    }

    fn wall_now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn has_elapsed(sleep: &Self::Sleep) -> Option<bool> {
        Some(sleep.is_elapsed())
    }

    fn jitter(&self) -> Fraction {
        let n = self.state.1.fetch_add(1, Ordering::Relaxed);
        let mut h = self.state.0.build_hasher();
        h.write_u64(n);
        Fraction::from_bits(h.finish())
    }
}
