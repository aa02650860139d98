//! Endpoint cooldowns shared through Redis.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use recovery_core::cooldown::{CooldownStore, Cooldowns};
use recovery_core::timing::Instant;
use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;

use crate::error::RedactedUrl;
use crate::link::{self, Backoff, Health, Link, LinkError, LinkStatus, QueryKind, Stop};
use crate::options::Clock;
use crate::{RedisOptions, RedisStoreError};

/// Cooldown keys longer than this stay local: a key is an origin and a
/// model name, and one this long is not worth a Redis key.
pub(crate) const MAX_KEY: usize = 1024;
/// Notes waiting to be written at most (one per key, coalesced). Past it a
/// new key's note stays local and is counted in
/// [`RedisCooldowns::dropped_notes`].
const MAX_PENDING: usize = 256;
/// A wait read from Redis is capped at a day: a stray key must not hold an
/// endpoint for longer than a policy could ever accept anyway.
const MAX_WAIT: Duration = Duration::from_hours(24);
/// Startup and reconnect read at most this many `SCAN` pages.
const MAX_SCAN_PAGES: usize = 64;
/// How often an idle connection is checked.
const PING_EVERY: Duration = Duration::from_secs(5);

/// Sets the cooldown key to the longer of the wait in force and the new
/// one, and tells the other processes only when it grew. Returns the wait
/// in force afterwards (ms).
///
/// KEYS[1] the cooldown key; ARGV[1] the wait (ms), ARGV[2] the channel,
/// ARGV[3] the message.
const NOTE_SCRIPT: &str = r"
local left = redis.call('PTTL', KEYS[1])
local wait = tonumber(ARGV[1])
if left >= wait then return left end
redis.call('SET', KEYS[1], ARGV[1], 'PX', wait)
redis.call('PUBLISH', ARGV[2], ARGV[3])
return wait
";

/// A [`CooldownStore`] that a fleet of processes shares through Redis.
///
/// Why: processes that share one provider key share its limits. When one
/// of them learns a `Retry-After`, the others should hold their sends too,
/// instead of each spending a request to learn it again.
///
/// The store never makes a request wait for Redis. The trait's methods are
/// called inside the attempt machine and answer at once from a local
/// mirror; a background task writes notes to Redis (coalesced per key,
/// bounded), receives the other processes' notes by pub/sub, and on every
/// (re)connect reads the cooldowns already in force (`SCAN` and `PTTL`), so
/// a process started later learns them too. While Redis is unreachable the
/// store is the in-memory one: notes apply within the process and are
/// written once the link is back (those still in force).
///
/// # Keys (prefix `recovery:` by default)
///
/// - `{prefix}cooldown:{key}`: one string per cooldown key (origin and
///   model, as [`recovery_core::cooldown::key_for`] makes it), set with
///   `PX` to the wait, so it expires on its own. A longer wait replaces a
///   shorter one; a shorter one never shortens it (atomic, in a script).
/// - `{prefix}cooldowns`: the pub/sub channel. A message is
///   `{instance} {wait_ms} {key}`, published only when a wait grew.
///
/// # Clocks
///
/// The trait speaks in waits relative to the caller's clock. Notes from
/// this process keep the caller's instants exactly; a note from another
/// process arrives as "so long from now" and is kept as an end on the
/// store's clock ([`RedisOptions::clock`], tokio's by default), which must
/// run at the caller's rate but need not share its origin. A remote wait is
/// late by the time the message took (well under a millisecond on a local
/// network): others may send that much later than needed, never earlier.
///
/// # Example
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use recovery_redis::{RedisCooldowns, RedisOptions};
///
/// let cooldowns = RedisCooldowns::connect("redis://127.0.0.1:6379/0", RedisOptions::default())?;
/// // Optional: wait (bounded) for the cooldowns already in force.
/// let _caught_up = cooldowns.ready(std::time::Duration::from_secs(1)).await;
/// let store: Arc<dyn recovery_core::cooldown::CooldownStore> = Arc::new(cooldowns);
/// // RecoveryLayer::new(policy).with_cooldowns(store)
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisCooldowns {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    url: RedactedUrl,
    _guard: link::Guard,
}

struct Shared {
    /// This process's notes, on the callers' clock.
    local: Cooldowns,
    /// Other processes' notes, on the store's clock.
    remote: Cooldowns,
    clock: Clock,
    /// Notes to write, as ends on the store's clock, one per key.
    pending: Mutex<Vec<(String, Instant)>>,
    wake: Notify,
    dropped: AtomicU64,
    health: Health,
    instance: u64,
    /// `{prefix}cooldown:`
    key_prefix: String,
    /// `{prefix}cooldowns`
    channel: String,
}

impl fmt::Debug for RedisCooldowns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCooldowns")
            .field("url", &self.inner.url)
            .field("key_prefix", &self.inner.shared.key_prefix)
            .field("status", &self.inner.shared.health.status())
            .finish_non_exhaustive()
    }
}

impl RedisCooldowns {
    /// A store on the Redis at `url` (`redis://[user:pass@]host[:port][/db]`,
    /// `redis+unix:///path/to/socket[?db=N&pass=...]` or `unix:///...`).
    ///
    /// Returns at once: the connection is made in the background, on the
    /// current tokio runtime, and the store works locally until it is up.
    /// Fails on a URL that cannot work, an option out of range, or when
    /// called outside a tokio runtime.
    pub fn connect(url: &str, options: RedisOptions) -> Result<Self, RedisStoreError> {
        options.validate()?;
        let shared = Arc::new(Shared::new(options.clock_or_tokio(), &options.prefix));
        let task = Arc::clone(&shared);
        let guard = link::start(url, options, |link, stop| run(task, link, stop))?;
        Ok(RedisCooldowns {
            inner: Arc::new(Inner {
                shared,
                url: RedactedUrl::new(url),
                _guard: guard,
            }),
        })
    }

    /// Waits, at most `timeout`, until the store is connected and has read
    /// the cooldowns in force; whether it has. Never needed for
    /// correctness: a process that sends before then only misses what the
    /// fleet learned earlier, as a process without the store would.
    pub async fn ready(&self, timeout: Duration) -> bool {
        self.inner.shared.health.wait_connected(timeout).await
    }

    /// The link's state.
    pub fn status(&self) -> LinkStatus {
        self.inner.shared.health.status()
    }

    /// Notes kept local because the queue to Redis was full.
    pub fn dropped_notes(&self) -> u64 {
        self.inner.shared.dropped.load(Ordering::Relaxed)
    }
}

impl CooldownStore for RedisCooldowns {
    fn note(&self, key: &str, now: Instant, wait: Duration) {
        self.inner.shared.note(key, now, wait);
    }

    fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        self.inner.shared.remaining(key, now)
    }
}

impl Shared {
    fn new(clock: Clock, prefix: &str) -> Self {
        Shared {
            local: Cooldowns::new(),
            remote: Cooldowns::new(),
            clock,
            pending: Mutex::new(Vec::new()),
            wake: Notify::new(),
            dropped: AtomicU64::new(0),
            health: Health::new(),
            instance: link::instance_id(),
            key_prefix: format!("{prefix}cooldown:"),
            channel: format!("{prefix}cooldowns"),
        }
    }

    /// This process's note: kept on the caller's clock, queued for Redis
    /// as an end on the store's.
    fn note(&self, key: &str, now: Instant, wait: Duration) {
        if wait.is_zero() {
            return;
        }
        self.local.note(key, now, wait);
        if key.is_empty() || key.len() > MAX_KEY {
            return;
        }
        let end = (self.clock)().saturating_add(wait);
        if self.queue(key, end) {
            self.wake.notify_one();
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        let local = self.local.remaining(key, now);
        let remote = self.remote.remaining(key, (self.clock)());
        local.max(remote)
    }

    /// Queues a note, merged with one for the same key; `false` when the
    /// queue is full.
    fn queue(&self, key: &str, end: Instant) -> bool {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, e)) = pending.iter_mut().find(|(k, _)| k == key) {
            *e = (*e).max(end);
            return true;
        }
        if pending.len() >= MAX_PENDING {
            return false;
        }
        pending.push((key.to_owned(), end));
        true
    }

    fn take_pending(&self) -> Vec<(String, Instant)> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A message from the channel: another process's note.
    fn receive(&self, payload: &[u8]) {
        if let Some((from, wait, key)) = parse_message(payload)
            && from != self.instance
        {
            self.remote.note(key, (self.clock)(), wait);
        }
    }
}

/// `{instance:x} {wait_ms} {key}`.
fn message(instance: u64, wait_ms: u64, key: &str) -> String {
    format!("{instance:x} {wait_ms} {key}")
}

fn parse_message(payload: &[u8]) -> Option<(u64, Duration, &str)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (from, rest) = text.split_once(' ')?;
    let (wait_ms, key) = rest.split_once(' ')?;
    let from = u64::from_str_radix(from, 16).ok()?;
    let wait_ms: u64 = wait_ms.parse().ok()?;
    if wait_ms == 0 || key.is_empty() || key.len() > MAX_KEY {
        return None;
    }
    Some((from, Duration::from_millis(wait_ms).min(MAX_WAIT), key))
}

/// Whole milliseconds, rounded up: a wait is never shortened on the way.
fn ceil_ms(d: Duration) -> u64 {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if d > Duration::from_millis(ms) {
        ms.saturating_add(1)
    } else {
        ms
    }
}

/// The background task: sessions with Redis, with a pause between them.
async fn run(shared: Arc<Shared>, link: Link, mut stop: Stop) {
    let mut backoff = Backoff::new(link.options.max_backoff);
    loop {
        let ended = stop.or_stop(session(&shared, &link, &mut backoff)).await;
        if ended.is_none() {
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

/// One connection's life: subscribe, catch up, then write and receive
/// until something fails.
async fn session(shared: &Shared, link: &Link, backoff: &mut Backoff) -> LinkError {
    match session_inner(shared, link, backoff).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

enum Never {}

async fn session_inner(
    shared: &Shared,
    link: &Link,
    backoff: &mut Backoff,
) -> Result<Never, LinkError> {
    let mut conn = link.commands().await?;
    // Subscribe before reading what is in force: nothing noted in between
    // is missed.
    let (mut sink, mut messages) = link.subscribed(&shared.channel).await?.split();
    let sha = link.load(&mut conn, NOTE_SCRIPT).await?;
    learn(shared, link, &mut conn).await?;
    write_pending(shared, link, &mut conn, &sha).await?;
    shared.health.up();
    backoff.reset();
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        tokio::select! {
            message = messages.next() => match message {
                Some(message) => shared.receive(message.get_payload_bytes()),
                None => return Err(LinkError::closed()),
            },
            () = shared.wake.notified() => write_pending(shared, link, &mut conn, &sha).await?,
            _ = ping.tick() => {
                let cmd = redis::cmd("PING");
                link.run::<redis::Value>(&mut conn, &QueryKind::Cmd(&cmd)).await?;
                tokio::time::timeout(link.options.command_timeout, sink.ping::<redis::Value>())
                    .await
                    .map_err(|_| LinkError::Timeout)??;
            }
        }
    }
}

/// Reads the cooldowns in force into the mirror: `SCAN` pages of the
/// cooldown keys, each followed by one pipeline of `PTTL`.
async fn learn(
    shared: &Shared,
    link: &Link,
    conn: &mut MultiplexedConnection,
) -> Result<(), LinkError> {
    let pattern = format!("{}*", link::glob_escape(&shared.key_prefix));
    let mut cursor: u64 = 0;
    for _ in 0..MAX_SCAN_PAGES {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(256);
        let (next, keys): (u64, Vec<Vec<u8>>) = link.run(conn, &QueryKind::Cmd(&scan)).await?;
        if !keys.is_empty() {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("PTTL").arg(key);
            }
            let ttls: Vec<i64> = link.run(conn, &QueryKind::Pipe(&pipe)).await?;
            let now = (shared.clock)();
            for (key, ttl) in keys.iter().zip(ttls) {
                let name = key
                    .strip_prefix(shared.key_prefix.as_bytes())
                    .and_then(|k| std::str::from_utf8(k).ok());
                if let Some(name) = name
                    && ttl > 0
                    && !name.is_empty()
                    && name.len() <= MAX_KEY
                {
                    let wait = Duration::from_millis(ttl.unsigned_abs()).min(MAX_WAIT);
                    shared.remote.note(name, now, wait);
                }
            }
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(())
}

/// Writes the queued notes still in force, all in one pipeline; on failure
/// they go back to the queue.
async fn write_pending(
    shared: &Shared,
    link: &Link,
    conn: &mut MultiplexedConnection,
    sha: &str,
) -> Result<(), LinkError> {
    let batch = shared.take_pending();
    let now = (shared.clock)();
    let live: Vec<(&str, u64)> = batch
        .iter()
        .filter(|(_, end)| *end > now)
        .map(|(key, end)| (key.as_str(), ceil_ms(end.saturating_since(now))))
        .collect();
    if live.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for (key, wait_ms) in &live {
        pipe.cmd("EVALSHA")
            .arg(sha)
            .arg(1)
            .arg(format!("{}{key}", shared.key_prefix))
            .arg(*wait_ms)
            .arg(&shared.channel)
            .arg(message(shared.instance, *wait_ms, key));
    }
    match link.run::<Vec<i64>>(conn, &QueryKind::Pipe(&pipe)).await {
        Ok(in_force) => {
            let now = (shared.clock)();
            for ((key, _), left) in live.iter().zip(in_force) {
                if left > 0 {
                    let wait = Duration::from_millis(left.unsigned_abs()).min(MAX_WAIT);
                    shared.remote.note(key, now, wait);
                }
            }
            Ok(())
        }
        Err(e) => {
            for (key, end) in &batch {
                if *end > now {
                    shared.queue(key, *end);
                }
            }
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_origin(Duration::from_millis(ms))
    }

    /// A store's mirror on a virtual clock that starts at 50 s, while
    /// callers pass instants of their own clock (origin elsewhere).
    fn mirror() -> (Shared, Arc<AtomicU64>) {
        let store_ms = Arc::new(AtomicU64::new(50_000));
        let reading = Arc::clone(&store_ms);
        let clock: Clock = Arc::new(move || at(reading.load(Ordering::SeqCst)));
        (Shared::new(clock, "t:"), store_ms)
    }

    #[test]
    fn own_notes_keep_the_callers_clock_and_remote_ones_the_stores() {
        let (shared, store_ms) = mirror();
        shared.note("k", at(1_000), Duration::from_secs(2));
        assert_eq!(
            shared.remaining("k", at(2_500)),
            Some(Duration::from_millis(500))
        );
        assert_eq!(shared.remaining("k", at(3_000)), None);
        // Another process says "3 s from now" while the store reads 50 s.
        let other = message(shared.instance ^ 1, 3_000, "k");
        shared.receive(other.as_bytes());
        store_ms.store(51_000, Ordering::SeqCst);
        assert_eq!(
            shared.remaining("k", at(9_999)),
            Some(Duration::from_secs(2))
        );
        store_ms.store(53_000, Ordering::SeqCst);
        assert_eq!(
            shared.remaining("k", at(9_999)),
            None,
            "ended on the store's clock"
        );
        // Its own messages come back on the channel, and are not news.
        let echo = message(shared.instance, 60_000, "k");
        shared.receive(echo.as_bytes());
        assert_eq!(shared.remaining("k", at(9_999)), None);
    }

    #[test]
    fn the_queue_to_redis_coalesces_and_is_bounded() {
        let (shared, _) = mirror();
        shared.note("k", at(0), Duration::from_secs(1));
        shared.note("k", at(0), Duration::from_secs(5));
        shared.note("k", at(0), Duration::from_secs(2));
        let pending = shared.take_pending();
        assert_eq!(
            pending,
            vec![("k".to_owned(), at(55_000))],
            "one note, the longest"
        );
        for i in 0..MAX_PENDING + 5 {
            shared.note(&format!("k{i}"), at(0), Duration::from_secs(1));
        }
        assert_eq!(shared.take_pending().len(), MAX_PENDING);
        assert_eq!(shared.dropped.load(Ordering::Relaxed), 5);
        assert!(
            shared
                .remaining(&format!("k{}", MAX_PENDING + 4), at(0))
                .is_some(),
            "a note dropped from the queue still holds locally"
        );
        let long = "x".repeat(MAX_KEY + 1);
        shared.note(&long, at(0), Duration::from_secs(1));
        assert!(shared.take_pending().is_empty(), "too long for Redis");
        assert!(shared.remaining(&long, at(0)).is_some(), "but local");
    }

    #[test]
    fn messages_round_trip_and_garbage_is_ignored() {
        let text = message(0xabc, 1500, r#"https://api.example model="m 1""#);
        let (from, wait, key) = parse_message(text.as_bytes()).unwrap();
        assert_eq!(from, 0xabc);
        assert_eq!(wait, Duration::from_millis(1500));
        assert_eq!(key, r#"https://api.example model="m 1""#);
        for bad in [
            &b""[..],
            b"zz 10 k",
            b"1 x k",
            b"1 0 k",
            b"1 10 ",
            b"1 10",
            b"\xff 1 k",
        ] {
            assert!(parse_message(bad).is_none(), "{bad:?}");
        }
        let (_, wait, _) = parse_message(b"1 99999999999 k").unwrap();
        assert_eq!(wait, MAX_WAIT, "capped");
    }

    #[test]
    fn waits_round_up_to_whole_milliseconds() {
        assert_eq!(ceil_ms(Duration::from_micros(1)), 1);
        assert_eq!(ceil_ms(Duration::from_secs(2)), 2000);
        assert_eq!(ceil_ms(Duration::from_micros(2_000_001)), 2001);
    }
}
