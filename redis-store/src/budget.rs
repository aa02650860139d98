//! A retry budget shared through Redis.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use recovery_core::budget::{BudgetStore, RetryBudget, RetryBudgetConfig};
use recovery_core::timing::Instant;
use redis::aio::MultiplexedConnection;

use crate::error::RedactedUrl;
use crate::link::{self, Backoff, Health, Link, LinkError, LinkStatus, QueryKind, Stop};
use crate::options::Clock;
use crate::{RedisOptions, RedisStoreError};

/// Slots a window is divided into, as in the in-memory budget.
const SLOTS: usize = 10;
/// Fixed point: one retry costs this many units.
const UNIT: i64 = 1000;
/// The fleet view is used while younger than this many flush intervals.
const FRESH_FLUSHES: u32 = 3;

/// Adds this process's counts to the current slot of the fleet's window
/// (slots on the Redis server's clock, so processes need not agree on the
/// time), drops the slots that left the window, and returns the window's
/// totals: `{deposits, withdrawals}`. One hash per budget; it expires one
/// slot after its last write.
///
/// KEYS[1] the budget hash; ARGV[1] slot length (ms), ARGV[2] slots per
/// window, ARGV[3] deposits to add, ARGV[4] withdrawals to add (negative
/// for refunds).
const FLUSH_SCRIPT: &str = r"
if redis.replicate_commands then redis.replicate_commands() end
local slot_ms = tonumber(ARGV[1])
local slots = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cur = math.floor(now / slot_ms)
local d = tonumber(ARGV[3])
local w = tonumber(ARGV[4])
if d ~= 0 then redis.call('HINCRBY', KEYS[1], 'd' .. cur, d) end
if w ~= 0 then redis.call('HINCRBY', KEYS[1], 'w' .. cur, w) end
local sd, sw = 0, 0
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local field = all[i]
  local slot = tonumber(string.sub(field, 2))
  if slot == nil or slot <= cur - slots then
    redis.call('HDEL', KEYS[1], field)
  elseif string.sub(field, 1, 1) == 'd' then
    sd = sd + tonumber(all[i + 1])
  else
    sw = sw + tonumber(all[i + 1])
  end
end
if d ~= 0 or w ~= 0 then redis.call('PEXPIRE', KEYS[1], slot_ms * (slots + 1)) end
return {sd, sw}
";

/// A [`BudgetStore`] that a fleet of processes shares through Redis: the
/// retry budget of [`RetryBudgetConfig`] (retries may be `percent` of the
/// requests of the last `ttl`, plus `min_retries_per_sec · ttl`) counted
/// over the requests and retries of every process, not of each one.
///
/// Why: a fleet on one provider key meets one rate limit. With per-process
/// budgets, N processes may retry N times the reserve during an outage;
/// with this store the fleet shares one reserve and one ratio.
///
/// The trait's methods answer at once from local counts and the last fleet
/// view; a background task sends this process's counts and reads the
/// fleet's totals in one script call (one round trip) per flush interval
/// ([`RedisOptions::flush_interval`], 500 ms by default).
///
/// # How stale the fleet view is
///
/// A decision sees the fleet as of the last flush plus this process's own
/// counts since. Other processes' requests and retries reach it within
/// one flush interval of theirs plus one of its own (about 1 s with the
/// defaults), so during that time the fleet may overdraw by what the other
/// processes retry in it. Window slots are a tenth of `ttl` on the Redis
/// server's clock; the view ages by up to one flush interval, so counts
/// leave the window up to that much late. Every process must use the same
/// `RetryBudgetConfig`: the totals are raw counts, the ratio is applied by
/// each reader.
///
/// # When Redis is unreachable
///
/// Once the fleet view is older than three flush intervals, decisions use
/// this process's own counts over the window, with the whole reserve: the
/// in-memory budget's behaviour. Counts made meanwhile are sent when the
/// link is back (those still in the window, added to the current slot).
///
/// # Keys (prefix `recovery:` by default)
///
/// `{prefix}budget:{name}`: a hash with fields `d{slot}` and `w{slot}`
/// (deposits and withdrawals per slot number), expiring one slot after the
/// last write ([`RedisOptions::budget_name`] names the budget).
#[derive(Clone)]
pub struct RedisBudget {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    url: RedactedUrl,
    _guard: link::Guard,
}

struct Shared {
    rules: Rules,
    state: Mutex<State>,
    clock: Clock,
    health: Health,
    key: String,
}

impl fmt::Debug for RedisBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBudget")
            .field("url", &self.inner.url)
            .field("key", &self.inner.shared.key)
            .field("config", &self.inner.shared.rules.config)
            .field("status", &self.inner.shared.health.status())
            .finish_non_exhaustive()
    }
}

impl RedisBudget {
    /// A budget with `config` (clamped as the in-memory budget clamps it:
    /// `ttl` 1–60 s, `percent` 0–10) shared through the Redis at `url`.
    ///
    /// Returns at once; the connection is made in the background on the
    /// current tokio runtime, and the budget works locally until it is up.
    pub fn connect(
        url: &str,
        config: RetryBudgetConfig,
        options: RedisOptions,
    ) -> Result<Self, RedisStoreError> {
        options.validate()?;
        let shared = Arc::new(Shared::new(
            config,
            options.clock_or_tokio(),
            options.flush_every(),
            format!("{}budget:{}", options.prefix, options.budget_name),
        ));
        let task = Arc::clone(&shared);
        let guard = link::start(url, options, |link, stop| run(task, link, stop))?;
        Ok(RedisBudget {
            inner: Arc::new(Inner {
                shared,
                url: RedactedUrl::new(url),
                _guard: guard,
            }),
        })
    }

    /// Waits, at most `timeout`, until the budget has read the fleet's
    /// counts once; whether it has.
    pub async fn ready(&self, timeout: Duration) -> bool {
        self.inner.shared.health.wait_connected(timeout).await
    }

    /// The link's state.
    pub fn status(&self) -> LinkStatus {
        self.inner.shared.health.status()
    }

    /// The budget's settings, after clamping.
    pub fn config(&self) -> RetryBudgetConfig {
        self.inner.shared.rules.config
    }

    /// Whole retries this process would be granted at `now` (the fleet's
    /// balance while the fleet view is fresh, its own otherwise).
    pub fn balance(&self, now: Instant) -> i64 {
        let shared = &self.inner.shared;
        let store_now = (shared.clock)();
        let mut state = shared.lock();
        shared.rules.balance(&mut state, now, store_now) / UNIT
    }

    /// Whether decisions use the fleet's counts now (`false`: this
    /// process's own, as when Redis is unreachable).
    pub fn uses_fleet_view(&self) -> bool {
        let shared = &self.inner.shared;
        let store_now = (shared.clock)();
        shared.rules.fresh(&shared.lock(), store_now)
    }
}

impl BudgetStore for RedisBudget {
    fn deposit(&self, now: Instant) {
        let shared = &self.inner.shared;
        let store_now = (shared.clock)();
        Rules::deposit(&mut shared.lock(), now, store_now);
    }

    /// The token is the window slot (on the caller's clock) the withdrawal
    /// was counted in.
    fn withdraw(&self, now: Instant) -> Option<u64> {
        let shared = &self.inner.shared;
        let store_now = (shared.clock)();
        shared.rules.withdraw(&mut shared.lock(), now, store_now)
    }

    fn refund(&self, token: u64) {
        let shared = &self.inner.shared;
        let store_now = (shared.clock)();
        Rules::refund(&mut shared.lock(), token, store_now);
    }
}

/// Deposits and withdrawals (whole requests and retries).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    deposits: i64,
    withdrawals: i64,
}

impl Counts {
    fn plus(self, other: Counts) -> Counts {
        Counts {
            deposits: self.deposits.saturating_add(other.deposits),
            withdrawals: self.withdrawals.saturating_add(other.withdrawals),
        }
    }
}

/// Counts per slot over one window, on one clock.
#[derive(Debug)]
struct Ring {
    slot_len: Duration,
    current: u64,
    slots: [Counts; SLOTS],
}

impl Ring {
    fn new(ttl: Duration) -> Self {
        Ring {
            slot_len: ttl / SLOTS as u32,
            current: 0,
            slots: [Counts::default(); SLOTS],
        }
    }

    fn rotate(&mut self, now: Instant) -> usize {
        let slot = (now.since_origin().as_nanos() / self.slot_len.as_nanos().max(1)) as u64;
        if slot > self.current {
            let stale = (slot - self.current).min(SLOTS as u64);
            for i in 1..=stale {
                self.slots[((self.current + i) % SLOTS as u64) as usize] = Counts::default();
            }
            self.current = slot;
        }
        (self.current % SLOTS as u64) as usize
    }

    fn add(&mut self, now: Instant, counts: Counts) {
        let i = self.rotate(now);
        self.slots[i] = self.slots[i].plus(counts);
    }

    fn sum(&mut self, now: Instant) -> Counts {
        self.rotate(now);
        self.slots
            .iter()
            .fold(Counts::default(), |sum, c| sum.plus(*c))
    }

    /// Takes back one withdrawal of `slot`, if that slot is still in the
    /// window.
    fn refund(&mut self, slot: u64) -> bool {
        if slot + (SLOTS as u64) <= self.current || slot > self.current {
            return false;
        }
        let c = &mut self.slots[(slot % SLOTS as u64) as usize];
        c.withdrawals = (c.withdrawals - 1).max(0);
        true
    }

    fn clear(&mut self) {
        self.slots = [Counts::default(); SLOTS];
    }
}

/// What a budget knows.
#[derive(Debug)]
struct State {
    /// This process's counts, on the callers' clock: the budget when the
    /// fleet view is stale.
    local: Ring,
    /// Counts not yet sent, on the store's clock.
    pending: Ring,
    /// Counts sent in the flush under way.
    in_flight: Counts,
    /// The fleet's totals at the last flush, and when (store's clock).
    fleet: Option<(Counts, Instant)>,
}

/// A budget's arithmetic, apart from its link.
#[derive(Debug)]
struct Rules {
    config: RetryBudgetConfig,
    deposit_units: i64,
    reserve_units: i64,
    fresh_for: Duration,
}

impl Rules {
    fn new(config: RetryBudgetConfig, flush_every: Duration) -> Self {
        // The in-memory budget's clamping, so both read one config alike.
        let config = RetryBudget::new(config).config();
        Rules {
            config,
            deposit_units: (config.percent * UNIT as f64).round() as i64,
            reserve_units: i64::from(config.min_retries_per_sec)
                * i64::try_from(config.ttl.as_secs()).unwrap_or(60)
                * UNIT,
            fresh_for: flush_every * FRESH_FLUSHES,
        }
    }

    fn state(&self) -> State {
        State {
            local: Ring::new(self.config.ttl),
            pending: Ring::new(self.config.ttl),
            in_flight: Counts::default(),
            fleet: None,
        }
    }

    fn units(&self, counts: Counts) -> i64 {
        self.reserve_units
            .saturating_add(self.deposit_units.saturating_mul(counts.deposits.max(0)))
            .saturating_sub(UNIT.saturating_mul(counts.withdrawals.max(0)))
    }

    fn fresh(&self, state: &State, store_now: Instant) -> bool {
        state
            .fleet
            .is_some_and(|(_, at)| store_now.saturating_since(at) <= self.fresh_for)
    }

    fn balance(&self, state: &mut State, now: Instant, store_now: Instant) -> i64 {
        if self.fresh(state, store_now)
            && let Some((fleet, _)) = state.fleet
        {
            let mine = state.pending.sum(store_now).plus(state.in_flight);
            self.units(fleet.plus(mine))
        } else {
            let local = state.local.sum(now);
            self.units(local)
        }
    }

    fn deposit(state: &mut State, now: Instant, store_now: Instant) {
        let one = Counts {
            deposits: 1,
            withdrawals: 0,
        };
        state.local.add(now, one);
        state.pending.add(store_now, one);
    }

    fn withdraw(&self, state: &mut State, now: Instant, store_now: Instant) -> Option<u64> {
        if self.balance(state, now, store_now) < UNIT {
            return None;
        }
        let one = Counts {
            deposits: 0,
            withdrawals: 1,
        };
        state.local.add(now, one);
        state.pending.add(store_now, one);
        Some(state.local.current)
    }

    fn refund(state: &mut State, slot: u64, store_now: Instant) {
        if state.local.refund(slot) {
            state.pending.add(
                store_now,
                Counts {
                    deposits: 0,
                    withdrawals: -1,
                },
            );
        }
    }

    /// Moves what is pending to the flush under way, and returns it.
    fn start_flush(state: &mut State, store_now: Instant) -> Counts {
        let counts = state.pending.sum(store_now).plus(state.in_flight);
        state.pending.clear();
        state.in_flight = counts;
        counts
    }

    fn flushed(state: &mut State, fleet: Counts, store_now: Instant) {
        state.in_flight = Counts::default();
        state.fleet = Some((fleet, store_now));
    }

    fn flush_failed(state: &mut State, store_now: Instant) {
        let back = std::mem::take(&mut state.in_flight);
        state.pending.add(store_now, back);
    }
}

impl Shared {
    fn new(config: RetryBudgetConfig, clock: Clock, flush_every: Duration, key: String) -> Self {
        let rules = Rules::new(config, flush_every);
        Shared {
            state: Mutex::new(rules.state()),
            rules,
            clock,
            health: Health::new(),
            key,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The background task: sessions with Redis, with a pause between them.
async fn run(shared: Arc<Shared>, link: Link, mut stop: Stop) {
    let mut backoff = Backoff::new(link.options.max_backoff);
    loop {
        if stop
            .or_stop(session(&shared, &link, &mut backoff))
            .await
            .is_none()
        {
            return;
        }
        shared.health.down();
        if stop
            .or_stop(tokio::time::sleep(backoff.next_pause()))
            .await
            .is_none()
        {
            return;
        }
    }
}

/// One connection's life: flush every interval until something fails.
async fn session(shared: &Shared, link: &Link, backoff: &mut Backoff) -> LinkError {
    let mut conn = match link.commands().await {
        Ok(conn) => conn,
        Err(e) => return e,
    };
    let sha = match link.load(&mut conn, FLUSH_SCRIPT).await {
        Ok(sha) => sha,
        Err(e) => return e,
    };
    let mut tick = tokio::time::interval(link.options.flush_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut first = true;
    loop {
        tick.tick().await;
        if let Err(e) = flush(shared, link, &mut conn, &sha).await {
            return e;
        }
        if first {
            first = false;
            shared.health.up();
            backoff.reset();
        }
    }
}

/// Sends the pending counts and reads the fleet's: one script call.
async fn flush(
    shared: &Shared,
    link: &Link,
    conn: &mut MultiplexedConnection,
    sha: &str,
) -> Result<(), LinkError> {
    let counts = Rules::start_flush(&mut shared.lock(), (shared.clock)());
    let slot_ms = (shared.rules.config.ttl / SLOTS as u32).as_millis().max(1);
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha)
        .arg(1)
        .arg(&shared.key)
        .arg(u64::try_from(slot_ms).unwrap_or(u64::MAX))
        .arg(SLOTS)
        .arg(counts.deposits)
        .arg(counts.withdrawals);
    match link.run::<(i64, i64)>(conn, &QueryKind::Cmd(&cmd)).await {
        Ok((deposits, withdrawals)) => {
            let fleet = Counts {
                deposits,
                withdrawals,
            };
            Rules::flushed(&mut shared.lock(), fleet, (shared.clock)());
            Ok(())
        }
        Err(e) => {
            Rules::flush_failed(&mut shared.lock(), (shared.clock)());
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_origin(Duration::from_millis(ms))
    }

    fn rules(min_per_sec: u32, percent: f64) -> Rules {
        Rules::new(
            RetryBudgetConfig::new(Duration::from_secs(10), min_per_sec, percent),
            Duration::from_millis(500),
        )
    }

    /// Without a fleet view the budget is the in-memory one.
    #[test]
    fn alone_it_is_the_in_memory_budget() {
        let r = rules(1, 0.2);
        let reference = RetryBudget::new(RetryBudgetConfig::default());
        let mut s = r.state();
        let (mut mine, mut theirs) = (0, 0);
        for i in 0..1000 {
            Rules::deposit(&mut s, at(0), at(i));
            BudgetStore::deposit(&reference, at(0));
            mine += i64::from(r.withdraw(&mut s, at(0), at(i)).is_some());
            theirs += i64::from(BudgetStore::withdraw(&reference, at(0)).is_some());
        }
        assert_eq!((mine, theirs), (210, 210));
        assert!(
            r.withdraw(&mut s, at(10_000), at(10_000)).is_some(),
            "window rolled"
        );
    }

    /// Two processes: what one deposited, the other may spend, once it read
    /// the fleet's totals; and a view too old is not trusted.
    #[test]
    fn a_fresh_fleet_view_is_shared_and_a_stale_one_is_not() {
        let r = rules(0, 1.0);
        let (mut a, mut b) = (r.state(), r.state());
        for _ in 0..3 {
            Rules::deposit(&mut a, at(0), at(0));
        }
        // A flushes: Redis now holds 3 deposits.
        let sent = Rules::start_flush(&mut a, at(0));
        assert_eq!(sent.deposits, 3);
        Rules::flushed(&mut a, sent, at(10));
        // B flushes nothing and reads the fleet's totals.
        let nothing = Rules::start_flush(&mut b, at(20));
        assert_eq!(nothing, Counts::default());
        Rules::flushed(&mut b, sent, at(20));
        assert_eq!(r.balance(&mut b, at(20), at(20)) / UNIT, 3);
        assert!(r.withdraw(&mut b, at(20), at(20)).is_some());
        assert!(r.withdraw(&mut b, at(21), at(21)).is_some());
        assert_eq!(
            r.balance(&mut b, at(21), at(21)) / UNIT,
            1,
            "own withdrawals count at once"
        );
        // Stale after three flush intervals: B is alone, with its two
        // withdrawals and nothing deposited.
        assert_eq!(r.balance(&mut b, at(1_600), at(1_600)) / UNIT, -2);
        assert!(r.withdraw(&mut b, at(1_600), at(1_600)).is_none());
        // A still sees its own deposits while its view is fresh.
        assert_eq!(r.balance(&mut a, at(100), at(100)) / UNIT, 3);
    }

    #[test]
    fn a_failed_flush_keeps_its_counts_and_a_refund_travels() {
        let r = rules(0, 1.0);
        let mut s = r.state();
        Rules::deposit(&mut s, at(0), at(0));
        Rules::deposit(&mut s, at(0), at(0));
        let sent = Rules::start_flush(&mut s, at(0));
        Rules::deposit(&mut s, at(5), at(5));
        Rules::flush_failed(&mut s, at(6));
        assert_eq!(Rules::start_flush(&mut s, at(7)).deposits, 3);
        Rules::flushed(
            &mut s,
            sent.plus(Counts {
                deposits: 1,
                withdrawals: 0,
            }),
            at(8),
        );
        let token = r.withdraw(&mut s, at(9), at(9)).expect("fleet has 3");
        assert_eq!(r.balance(&mut s, at(9), at(9)) / UNIT, 2);
        Rules::refund(&mut s, token, at(10));
        assert_eq!(r.balance(&mut s, at(10), at(10)) / UNIT, 3);
        assert_eq!(Rules::start_flush(&mut s, at(11)).withdrawals, 0, "1 - 1");
        // A refund of a slot that left the window changes nothing.
        Rules::refund(&mut s, token, at(20_000));
        assert_eq!(s.local.sum(at(20_000)), Counts::default());
    }

    #[test]
    fn pending_counts_leave_the_window_too() {
        let r = rules(0, 1.0);
        let mut s = r.state();
        Rules::deposit(&mut s, at(0), at(0));
        assert_eq!(Rules::start_flush(&mut s, at(0)).deposits, 1);
        Rules::flush_failed(&mut s, at(0));
        assert_eq!(Rules::start_flush(&mut s, at(11_000)), Counts::default());
    }
}
