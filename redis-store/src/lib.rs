//! Redis-backed stores for Recovery's two cross-request seams: endpoint
//! cooldowns ([`RedisCooldowns`], a
//! [`CooldownStore`](recovery_core::cooldown::CooldownStore)) and the retry
//! budget ([`RedisBudget`], a
//! [`BudgetStore`](recovery_core::budget::BudgetStore)); and the log of
//! streamed answers a fleet of gateways shares so any of them can serve a
//! client's reconnect ([`RedisStreamLog`]).
//!
//! Why: a fleet of agents on one provider key meets one set of limits. A
//! `Retry-After` learned by one process is news for all of them, and a
//! retry budget per process lets an outage grow with the fleet. These
//! stores share both through one Redis.
//!
//! Both keep requests off Redis: the traits are synchronous and called
//! inside the attempt machine, so each store answers from a local mirror
//! at once and talks to Redis from a background tokio task (bounded work
//! per note or flush interval, connect and command timeouts, reconnects
//! with a capped backoff). When Redis is unreachable they work as the
//! in-memory stores do, within the process.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use recovery_core::budget::RetryBudgetConfig;
//! use recovery_redis::{RedisBudget, RedisCooldowns, RedisOptions};
//!
//! let url = "redis://127.0.0.1:6379/0";
//! let cooldowns = RedisCooldowns::connect(url, RedisOptions::default())?;
//! let budget = RedisBudget::connect(url, RetryBudgetConfig::default(), RedisOptions::default())?;
//! // With tower-recovery (feature `redis`, as `tower_recovery::redis`):
//! // RecoveryLayer::new(policy)
//! //     .with_cooldowns(Arc::new(cooldowns))
//! //     .with_retry_budget(budget)
//! # let _ = (Arc::new(cooldowns), budget);
//! # Ok(())
//! # }
//! ```
//!
//! Key layout (prefix `recovery:` by default, [`RedisOptions::prefix`]):
//!
//! | key or channel | type | what |
//! |---|---|---|
//! | `{prefix}cooldown:{key}` | string, `PX` = the wait | one cooldown per origin and model |
//! | `{prefix}cooldowns` | pub/sub channel | `{instance} {wait_ms} {key}` when a wait grew |
//! | `{prefix}budget:{name}` | hash `d{slot}`, `w{slot}` | a budget's deposits and withdrawals per slot |
//! | `{prefix}stream:{id}` | stream, entries `0-{seq}` and the end marker `1-0` | a logged stream's events |
//! | `{prefix}meta:{id}` | hash `last`, `bytes`, `state` | a logged stream's state |
//! | `{prefix}reader:{id}` | string, `PX` = the lease | a reader follows the stream |
#![deny(unsafe_code, missing_docs, unreachable_pub)]

mod budget;
mod cooldowns;
mod error;
mod link;
mod options;
mod stream_log;

pub use budget::RedisBudget;
pub use cooldowns::RedisCooldowns;
pub use error::{RedactedUrl, RedisStoreError};
pub use link::LinkStatus;
pub use options::{Clock, RedisOptions};
pub use stream_log::{
    RedisStreamLog, StreamBounds, StreamEntry, StreamLogBuilder, StreamLogError, StreamRead,
};
