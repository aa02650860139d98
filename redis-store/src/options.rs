//! Settings shared by both stores.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use recovery_core::timing::{Instant, Timing};

use crate::error::RedisStoreError;

/// A monotonic clock read by a store: now, as an [`Instant`].
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// The longest key prefix accepted.
const MAX_PREFIX: usize = 256;

/// How a store talks to Redis, and how it names its keys.
///
/// The defaults suit a Redis next to the fleet (same host or data centre):
/// a connection is given 2 s, a command 1 s, reconnects back off from
/// 100 ms to 5 s, and a budget flushes every 500 ms.
#[derive(Clone)]
pub struct RedisOptions {
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) flush_interval: Duration,
    pub(crate) budget_name: String,
    pub(crate) clock: Option<Clock>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            prefix: "recovery:".to_owned(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(1),
            max_backoff: Duration::from_secs(5),
            flush_interval: Duration::from_millis(500),
            budget_name: "default".to_owned(),
            clock: None,
        }
    }
}

impl fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisOptions")
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("max_backoff", &self.max_backoff)
            .field("flush_interval", &self.flush_interval)
            .field("budget_name", &self.budget_name)
            .field(
                "clock",
                &if self.clock.is_some() {
                    "given"
                } else {
                    "tokio"
                },
            )
            .finish()
    }
}

impl RedisOptions {
    /// The default options.
    pub fn new() -> Self {
        RedisOptions::default()
    }

    /// The first part of every key and channel name (default `recovery:`).
    /// Processes that share limits use the same prefix; processes that
    /// must not (two provider accounts on one Redis) use different ones.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long establishing a connection may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long one command or pipeline may take (default 1 s). A command
    /// that takes longer ends the connection; the store goes on locally and
    /// reconnects.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// The longest pause between two reconnect attempts (default 5 s). The
    /// pause starts at 100 ms (or this value, if smaller) and doubles.
    pub fn max_backoff(mut self, max: Duration) -> Self {
        self.max_backoff = max;
        self
    }

    /// How often a [`RedisBudget`](crate::RedisBudget) sends its counts and
    /// reads the fleet's (default 500 ms; at least 10 ms). It is also how
    /// stale the budget's fleet view may be.
    pub fn flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// The name of a [`RedisBudget`](crate::RedisBudget)'s counters
    /// (default `default`): budgets with one prefix and one name are one
    /// budget.
    pub fn budget_name(mut self, name: impl Into<String>) -> Self {
        self.budget_name = name.into();
        self
    }

    /// The clock that stamps what other processes said: a wait they noted
    /// arrives as "so long from now", and the store keeps it as an end on
    /// this clock. It must run at the rate of the clock its callers pass
    /// (their `now`); its origin does not matter. Default: tokio's clock
    /// (so a paused tokio clock in tests drives it too).
    pub fn clock(mut self, clock: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// [`RedisOptions::clock`] from a [`Timing`], for example the one a
    /// `RecoveryLayer` was built with.
    pub fn timing<T: Timing + Send + Sync + 'static>(self, timing: T) -> Self {
        self.clock(move || timing.now())
    }

    pub(crate) fn validate(&self) -> Result<(), RedisStoreError> {
        if self.prefix.len() > MAX_PREFIX {
            return Err(RedisStoreError::InvalidOption {
                option: "prefix",
                reason: "longer than 256 bytes",
            });
        }
        if self.budget_name.is_empty() || self.budget_name.len() > MAX_PREFIX {
            return Err(RedisStoreError::InvalidOption {
                option: "budget_name",
                reason: "empty or longer than 256 bytes",
            });
        }
        for (option, d) in [
            ("connect_timeout", self.connect_timeout),
            ("command_timeout", self.command_timeout),
            ("max_backoff", self.max_backoff),
        ] {
            if d.is_zero() {
                return Err(RedisStoreError::InvalidOption {
                    option,
                    reason: "zero",
                });
            }
        }
        Ok(())
    }

    /// The clock to use: the given one, or tokio's from now on.
    pub(crate) fn clock_or_tokio(&self) -> Clock {
        if let Some(clock) = &self.clock {
            return Arc::clone(clock);
        }
        let origin = tokio::time::Instant::now();
        Arc::new(move || {
            Instant::from_origin(tokio::time::Instant::now().saturating_duration_since(origin))
        })
    }

    pub(crate) fn flush_every(&self) -> Duration {
        self.flush_interval.max(Duration::from_millis(10))
    }
}
