//! The recovery policy the loopback tests share.

use std::num::NonZeroU32;
use std::time::Duration;

use recovery_core::{PolicyBuilder, RecoveryPolicy};

/// Three sends and a backoff of 5 to 20 ms, every other bound the
/// default's: a replay costs a test milliseconds. Callers add what they
/// test and build.
pub fn loopback() -> PolicyBuilder {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).expect("three"))
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
}
