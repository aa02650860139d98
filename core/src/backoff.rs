//! Full-jitter capped exponential backoff.
//!
//! Retry `n` (1-based: the wait before the second send is retry 1) waits a
//! uniform draw in `[0, min(ceiling, base · 2^(n−1))]`. Full jitter does the
//! least total work under contention of the common schemes; the exponent is
//! clamped so that retry 100000 cannot overflow.

use std::time::Duration;

use crate::timing::Fraction;

/// The upper bound of the jitter draw for retry `n` (1-based).
pub(crate) fn bound(base: Duration, ceiling: Duration, retry: u32) -> Duration {
    let exponent = retry.saturating_sub(1).min(32);
    let scaled = base.saturating_mul(1u32 << exponent.min(31));
    let scaled = if exponent > 31 {
        scaled.saturating_mul(2)
    } else {
        scaled
    };
    scaled.min(ceiling)
}

/// The jittered wait before retry `n`: `fraction · bound(n)`.
pub(crate) fn delay(base: Duration, ceiling: Duration, retry: u32, fraction: Fraction) -> Duration {
    fraction.of(bound(base, ceiling, retry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_jitter_vectors() {
        // base 1 s, ceiling 3 s, jitter pinned at half its bound.
        let base = Duration::from_secs(1);
        let ceiling = Duration::from_secs(3);
        let table = [
            (1, Duration::from_millis(500)),
            (2, Duration::from_secs(1)),
            (3, Duration::from_millis(1500)),
            (100_000, Duration::from_millis(1500)),
        ];
        for (retry, want) in table {
            assert_eq!(
                delay(base, ceiling, retry, Fraction::HALF),
                want,
                "retry {retry}"
            );
        }
    }

    #[test]
    fn bounds_double_then_cap() {
        let base = Duration::from_millis(500);
        let ceiling = Duration::from_secs(8);
        let bounds: Vec<_> = (1..=7)
            .map(|n| bound(base, ceiling, n).as_millis())
            .collect();
        assert_eq!(bounds, [500, 1000, 2000, 4000, 8000, 8000, 8000]);
        assert_eq!(bound(base, ceiling, u32::MAX), ceiling);
        assert_eq!(
            delay(base, ceiling, 3, Fraction::ONE),
            Duration::from_secs(2)
        );
        assert_eq!(delay(base, ceiling, 3, Fraction::ZERO), Duration::ZERO);
    }
}
