//! The stream log on Redis Streams, shared by every gateway instance that
//! points at the same Redis, so a client that reconnects through a load
//! balancer can land on any of them.
//!
//! # Layout
//!
//! Each gateway stream `id` has two keys:
//!
//! - `{prefix}stream:{id}`, a Redis stream. Event `seq` is the entry with
//!   the explicit id `0-<seq>` (one field, `ev`, the event's bytes), so a
//!   read after `seq` is an exact `XRANGE 0-<seq+1> +` and an `XREAD` from
//!   `0-<seq>`, with no id translation. When the stream ends, one marker
//!   entry `1-0` follows (field `end`, or `full` when the stream outgrew its
//!   bounds): it sorts after every event, so the append that would follow it
//!   is refused by Redis itself, and a reader blocked in `XREAD` wakes up on
//!   it as on any event.
//! - `{prefix}meta:{id}`, a hash: the last seq, the bytes kept, the state
//!   (`open`, `done`, `full`). It exists from `open` on (a stream with no
//!   event yet has no Redis stream key), and tells an empty stream from an
//!   unknown or expired one.
//!
//! Both keys expire together: the ttl is set on `open`, refreshed on every
//! append and set again on `finish`. A third, `{prefix}reader:{id}`, is
//! set with a lease (`PX`) by a reader following the stream on any
//! instance, so the instance running it keeps generating.
//!
//! # Why scripts
//!
//! `open`, `append`, `finish` and the first half of `read` are small Lua
//! scripts (`EVALSHA`, loaded once per connection and reloaded when Redis
//! answers `NOSCRIPT`): each checks and changes both keys in one atomic step
//! and one round trip. That is what makes the bounds exact (an append past
//! `max_entries` or `max_bytes` is refused and marks the stream full instead
//! of being trimmed with `MAXLEN`, which would silently drop events a client
//! has not read), refuses an append that is not the previous seq plus one
//! (a duplicate or a gap), and lets a read tell "nothing yet" from "unknown"
//! without a race.
//!
//! # Connections and timeouts
//!
//! Commands share one multiplexed connection, opened on first use and
//! opened again after it broke; every connect and every command is bounded
//! by the options' timeouts. After a failed connect, calls fail at once for
//! a short pause (instead of each trying again and waiting out its own
//! timeout), so a gateway whose Redis is down answers its clients quickly
//! with [`LogError::Store`], whose text never carries the URL or a
//! password.
//!
//! A read that finds nothing waits in `XREAD BLOCK`, which would stall every
//! other command on a shared connection: it runs on a dedicated connection
//! taken from a small idle pool, with a bounded number of such reads at once
//! (`max_blocking_reads` on the builder). The block lasts a little less
//! than what is left of the caller's `wait`, and the whole read is cut at the
//! caller's deadline whatever Redis does, so a read never waits longer than
//! `wait`.
//!
//! `Limits::max_streams` bounds the memory of one process and does not
//! apply here: Redis holds the streams, each bounded by `max_entries`,
//! `max_bytes` and the ttl.
//!
//! The two keys of a stream are not hash-tagged: this log talks to one
//! Redis node (or a primary behind a proxy), not to a Redis Cluster.

use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Value};
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use super::{BoxFuture, Entry, Limits, LogError, Read, StreamLog};

/// Stream ids longer than this are unknown without asking Redis: an id comes
/// back from clients (`Last-Event-ID`), and a key is built from it.
const MAX_ID_LEN: usize = 256;

/// Entries returned by one read at most; the caller reads again for more.
const READ_BATCH: u64 = 512;

/// How long calls fail at once after a connect failed.
const DOWN_PAUSE: Duration = Duration::from_millis(250);

/// Idle dedicated connections kept for blocking reads.
const MAX_IDLE_BLOCKING: usize = 16;

/// The id of the marker entry that ends a stream: after every `0-<seq>`.
const MARKER_ID: &str = "1-0";

/// `KEYS`: stream, meta. `ARGV`: ttl ms. 1 opened, 0 exists.
const OPEN: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
redis.call('HSET', KEYS[2], 'last', '0', 'bytes', '0', 'state', 'open')
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
";

/// `KEYS`: stream, meta. `ARGV`: seq, event, max entries, max bytes, ttl ms.
/// `{code, last}`: 1 appended, 0 unknown, 2 full, 3 out of order,
/// 4 finished.
const APPEND: &str = r"
local m = redis.call('HMGET', KEYS[2], 'last', 'bytes', 'state')
if not m[1] then
  return {0, 0}
end
local last = tonumber(m[1])
if m[3] == 'full' then
  return {2, last}
end
if m[3] ~= 'open' then
  return {4, last}
end
if tonumber(ARGV[1]) ~= last + 1 then
  return {3, last}
end
local bytes = tonumber(m[2]) + string.len(ARGV[2])
if last + 1 > tonumber(ARGV[3]) or bytes > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[2], 'state', 'full')
  redis.call('XADD', KEYS[1], '1-0', 'full', '1')
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  return {2, last}
end
redis.call('XADD', KEYS[1], '0-' .. ARGV[1], 'ev', ARGV[2])
redis.call('HSET', KEYS[2], 'last', ARGV[1], 'bytes', tostring(bytes))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
return {1, last + 1}
";

/// `KEYS`: stream, meta. `ARGV`: ttl ms. 1 finished (or already), 0 unknown.
const FINISH: &str = r"
local s = redis.call('HGET', KEYS[2], 'state')
if not s then
  return 0
end
if s == 'open' then
  redis.call('HSET', KEYS[2], 'state', 'done')
  redis.call('XADD', KEYS[1], '1-0', 'end', '1')
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
";

/// `KEYS`: stream, meta. `ARGV`: first id, count. Nil when unknown, else
/// the entries from the first id on (the marker included).
const RANGE: &str = r"
if redis.call('EXISTS', KEYS[2]) == 0 then
  return false
end
return redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
";

/// The scripts, in the order of their cached SHA1s.
#[derive(Debug, Clone, Copy)]
enum Script {
    Open = 0,
    Append = 1,
    Finish = 2,
    Range = 3,
}

impl Script {
    fn text(self) -> &'static str {
        match self {
            Script::Open => OPEN,
            Script::Append => APPEND,
            Script::Finish => FINISH,
            Script::Range => RANGE,
        }
    }
}

/// How a [`RedisLog`] is set up: bounds, key prefix, timeouts. Made by
/// [`RedisLog::builder`]; ends with [`connect`](Self::connect) or
/// [`lazy`](Self::lazy).
#[derive(Debug, Clone)]
pub struct RedisLogBuilder {
    limits: Limits,
    prefix: String,
    connect_timeout: Duration,
    command_timeout: Duration,
    max_blocking_reads: usize,
}

impl RedisLogBuilder {
    fn new(limits: Limits) -> Self {
        RedisLogBuilder {
            limits,
            prefix: RedisLog::DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            max_blocking_reads: 256,
        }
    }

    /// The prefix of every key (several gateways, or tests, may share a
    /// Redis under different prefixes).
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long opening a connection may take (at least 1 ms).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long one command may take (at least 1 ms). A blocking read is
    /// bounded by its own `wait` instead.
    #[must_use]
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Reads waiting in `XREAD BLOCK` at once (at least 1), each on its own
    /// connection. A read beyond waits for a turn within its own `wait`.
    #[must_use]
    pub fn max_blocking_reads(mut self, n: usize) -> Self {
        self.max_blocking_reads = n.max(1);
        self
    }

    /// The bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Connects to `url` and checks that Redis answers (see
    /// [`RedisLog::connect`]).
    pub async fn connect(self, url: &str) -> Result<RedisLog, LogError> {
        let log = self.lazy(url)?;
        let mut conn = log.conn().await?;
        let ping = redis::cmd("PING");
        log.run::<Value>(&mut conn, &ping).await?;
        Ok(log)
    }

    /// A log for `url` that connects on first use: nothing is sent yet, only
    /// the URL is checked. Calls made while Redis is down fail fast with
    /// [`LogError::Store`]; the first call after it is back connects.
    pub fn lazy(self, url: &str) -> Result<RedisLog, LogError> {
        let client = open_client(url)?;
        Ok(RedisLog {
            inner: Arc::new(Inner {
                client,
                blocking: Semaphore::new(self.max_blocking_reads),
                options: self,
                commands: Mutex::new(Slot::default()),
                shas: Default::default(),
                idle: StdMutex::new(Vec::new()),
            }),
        })
    }
}

/// A [`StreamLog`] on Redis Streams (see the module docs). Cheap to clone:
/// clones share their connections.
#[derive(Clone)]
pub struct RedisLog {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    options: RedisLogBuilder,
    commands: Mutex<Slot>,
    shas: [OnceLock<String>; 4],
    blocking: Semaphore,
    idle: StdMutex<Vec<MultiplexedConnection>>,
}

/// The shared command connection, or why there is none.
#[derive(Default)]
struct Slot {
    conn: Option<MultiplexedConnection>,
    down_until: Option<Instant>,
    down_because: String,
}

impl fmt::Debug for RedisLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("RedisLog")
            .field("prefix", &self.inner.options.prefix)
            .field("limits", &self.inner.options.limits)
            .finish_non_exhaustive()
    }
}

impl RedisLog {
    /// The prefix of every key unless the builder gives another.
    pub const DEFAULT_PREFIX: &'static str = "recovery-gateway:";

    /// Connects to `url` (`redis://`, `redis+unix://` or `unix://`) with
    /// these bounds, this key prefix and the default timeouts, and checks
    /// that Redis answers, so a wrong URL or a Redis that is down shows when
    /// the gateway starts.
    pub async fn connect(url: &str, limits: Limits, prefix: &str) -> Result<RedisLog, LogError> {
        Self::builder(limits).prefix(prefix).connect(url).await
    }

    /// A builder with these bounds and the defaults: prefix
    /// [`DEFAULT_PREFIX`](Self::DEFAULT_PREFIX), connect and command
    /// timeouts of 2 s, 256 blocking reads at once.
    pub fn builder(limits: Limits) -> RedisLogBuilder {
        RedisLogBuilder::new(limits)
    }

    /// The bounds it runs with.
    pub fn limits(&self) -> Limits {
        self.inner.options.limits
    }

    /// The Redis key of stream `id`'s events.
    pub fn stream_key(&self, id: &str) -> String {
        format!("{}stream:{id}", self.inner.options.prefix)
    }

    /// The Redis key of stream `id`'s state.
    pub fn meta_key(&self, id: &str) -> String {
        format!("{}meta:{id}", self.inner.options.prefix)
    }

    /// The key a reader following stream `id` keeps with a lease.
    pub fn reader_key(&self, id: &str) -> String {
        format!("{}reader:{id}", self.inner.options.prefix)
    }

    fn ttl_ms(&self) -> u64 {
        (self.inner.options.limits.ttl.as_millis() as u64).max(1)
    }

    /// The shared command connection, opened if there is none.
    async fn conn(&self) -> Result<MultiplexedConnection, LogError> {
        let options = &self.inner.options;
        // Bounded: a caller never queues behind a slow connect for longer
        // than a connect of its own would take.
        let Ok(mut slot) =
            tokio::time::timeout(options.connect_timeout, self.inner.commands.lock()).await
        else {
            return Err(LogError::Store("redis connect timed out".to_owned()));
        };
        if let Some(conn) = &slot.conn {
            return Ok(conn.clone());
        }
        if let Some(until) = slot.down_until
            && Instant::now() < until
        {
            return Err(LogError::Store(slot.down_because.clone()));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout));
        let connect = self
            .inner
            .client
            .get_multiplexed_async_connection_with_config(&config);
        let result = match tokio::time::timeout(options.connect_timeout, connect).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(connect_error(&e)),
            Err(_) => Err("redis connect timed out".to_owned()),
        };
        match result {
            Ok(conn) => {
                slot.down_until = None;
                slot.conn = Some(conn.clone());
                Ok(conn)
            }
            Err(text) => {
                slot.down_until = Some(Instant::now() + DOWN_PAUSE);
                slot.down_because.clone_from(&text);
                Err(LogError::Store(text))
            }
        }
    }

    /// Forgets the shared connection after it failed in a way that may
    /// have broken it; the next call opens a new one.
    async fn forget(&self) {
        if let Ok(mut slot) = tokio::time::timeout(
            self.inner.options.command_timeout,
            self.inner.commands.lock(),
        )
        .await
        {
            slot.conn = None;
        }
    }

    /// Runs one command within the command timeout.
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut MultiplexedConnection,
        cmd: &redis::Cmd,
    ) -> Result<T, LogError> {
        match tokio::time::timeout(
            self.inner.options.command_timeout,
            cmd.query_async::<T>(conn),
        )
        .await
        {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    self.forget().await;
                }
                Err(LogError::Store(command_error(&e)))
            }
            Err(_) => {
                self.forget().await;
                Err(LogError::Store("redis command timed out".to_owned()))
            }
        }
    }

    /// Runs `script` on stream `id`'s two keys with `args`, loading it
    /// first if this process has not yet, and again if Redis lost it.
    async fn script(&self, script: Script, id: &str, args: &[&[u8]]) -> Result<Value, LogError> {
        let mut conn = self.conn().await?;
        let stream = self.stream_key(id);
        let meta = self.meta_key(id);
        let mut reloaded = false;
        loop {
            let sha = if let Some(sha) = self.inner.shas[script as usize].get() {
                sha.clone()
            } else {
                let sha = self.load(&mut conn, script).await?;
                let _ = self.inner.shas[script as usize].set(sha.clone());
                sha
            };
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha).arg(2).arg(&stream).arg(&meta);
            for arg in args {
                cmd.arg(*arg);
            }
            let work = cmd.query_async::<Value>(&mut conn);
            match tokio::time::timeout(self.inner.options.command_timeout, work).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) if e.code() == Some("NOSCRIPT") && !reloaded => {
                    // Redis restarted or its script cache was flushed.
                    reloaded = true;
                    let sha = self.load(&mut conn, script).await?;
                    let _ = self.inner.shas[script as usize].set(sha);
                }
                Ok(Err(e)) => {
                    if breaks_connection(&e) {
                        self.forget().await;
                    }
                    return Err(LogError::Store(command_error(&e)));
                }
                Err(_) => {
                    self.forget().await;
                    return Err(LogError::Store("redis command timed out".to_owned()));
                }
            }
        }
    }

    /// `SCRIPT LOAD`: the script's SHA1, as Redis computes it.
    async fn load(
        &self,
        conn: &mut MultiplexedConnection,
        script: Script,
    ) -> Result<String, LogError> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(script.text());
        self.run::<String>(conn, &cmd).await
    }

    /// The entries of `id` from `first` on (at most a batch), or `None`
    /// when the stream is unknown.
    async fn range(&self, id: &str, first: &str) -> Result<Option<Vec<Item>>, LogError> {
        let count = READ_BATCH.to_string();
        let value = self
            .script(Script::Range, id, &[first.as_bytes(), count.as_bytes()])
            .await?;
        match value {
            Value::Nil => Ok(None),
            other => parse_entries(&other).map(Some),
        }
    }

    /// Waits (on a dedicated connection) until an entry after `after`
    /// arrives or `deadline` passes.
    async fn wait_for(
        &self,
        id: &str,
        after: u64,
        deadline: Instant,
    ) -> Result<Option<Vec<Item>>, LogError> {
        let Ok(Ok(_permit)) =
            tokio::time::timeout_at(deadline, self.inner.blocking.acquire()).await
        else {
            return Ok(None);
        };
        // A pooled connection may have died with a Redis restart since it
        // was last used: then one fresh connection is tried.
        let mut pooled = self.take_idle();
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(conn) => conn,
                None => match self.dedicated(deadline).await? {
                    Some(conn) => conn,
                    None => return Ok(None),
                },
            };
            let left = deadline.saturating_duration_since(Instant::now());
            // Redis ends the block a little before the deadline, so the
            // answer is usually back in time and the connection can be kept.
            let margin = (left / 8).min(Duration::from_millis(25));
            let block_ms = left.saturating_sub(margin).as_millis() as u64;
            if block_ms == 0 {
                // `BLOCK 0` would wait forever.
                self.put_idle(conn);
                return Ok(None);
            }
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(READ_BATCH)
                .arg("BLOCK")
                .arg(block_ms)
                .arg("STREAMS")
                .arg(self.stream_key(id))
                .arg(format!("0-{after}"));
            match tokio::time::timeout_at(deadline, cmd.query_async::<Value>(&mut conn)).await {
                Ok(Ok(value)) => {
                    self.put_idle(conn);
                    return parse_xread(&value);
                }
                Ok(Err(e)) if reused && breaks_connection(&e) => {}
                Ok(Err(e)) => return Err(LogError::Store(command_error(&e))),
                // The connection may still get the answer: it is dropped.
                Err(_) => return Ok(None),
            }
        }
    }

    /// A new connection for blocking reads (`None`: the deadline came
    /// first).
    async fn dedicated(
        &self,
        deadline: Instant,
    ) -> Result<Option<MultiplexedConnection>, LogError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.inner.options.connect_timeout))
            // Bounded by the caller's deadline instead.
            .set_response_timeout(None);
        let connect = self
            .inner
            .client
            .get_multiplexed_async_connection_with_config(&config);
        let limit = Instant::now() + self.inner.options.connect_timeout;
        match tokio::time::timeout_at(limit.min(deadline), connect).await {
            Ok(Ok(conn)) => Ok(Some(conn)),
            Ok(Err(e)) => Err(LogError::Store(connect_error(&e))),
            Err(_) if deadline <= limit => Ok(None),
            Err(_) => Err(LogError::Store("redis connect timed out".to_owned())),
        }
    }

    fn take_idle(&self) -> Option<MultiplexedConnection> {
        self.inner.idle.lock().ok()?.pop()
    }

    fn put_idle(&self, conn: MultiplexedConnection) {
        if let Ok(mut idle) = self.inner.idle.lock()
            && idle.len() < MAX_IDLE_BLOCKING
        {
            idle.push(conn);
        }
    }

    async fn read_inner(&self, id: &str, after: u64, wait: Duration) -> Result<Read, LogError> {
        let deadline = Instant::now() + wait;
        if !valid_id(id) {
            return Err(LogError::Unknown);
        }
        let first = match after.checked_add(1) {
            Some(next) => format!("0-{next}"),
            None => MARKER_ID.to_owned(),
        };
        let items = self.range(id, &first).await?.ok_or(LogError::Unknown)?;
        if !items.is_empty() || wait.is_zero() {
            return settle(items);
        }
        match self.wait_for(id, after, deadline).await? {
            Some(items) => settle(items),
            None => Ok(Read {
                entries: Vec::new(),
                finished: false,
            }),
        }
    }
}

impl StreamLog for RedisLog {
    fn open<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            if !valid_id(id) {
                return Err(LogError::Store("stream id too long or empty".to_owned()));
            }
            let ttl = self.ttl_ms().to_string();
            match self.script(Script::Open, id, &[ttl.as_bytes()]).await? {
                Value::Int(1) => Ok(()),
                Value::Int(0) => Err(LogError::Exists),
                _ => Err(unexpected()),
            }
        })
    }

    fn append<'a>(&'a self, id: &'a str, entry: Entry) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            if !valid_id(id) {
                return Err(LogError::Unknown);
            }
            let limits = self.inner.options.limits;
            let seq = entry.seq.to_string();
            let max_entries = limits.max_entries.to_string();
            let max_bytes = limits.max_bytes.to_string();
            let ttl = self.ttl_ms().to_string();
            let args: [&[u8]; 5] = [
                seq.as_bytes(),
                &entry.event,
                max_entries.as_bytes(),
                max_bytes.as_bytes(),
                ttl.as_bytes(),
            ];
            let value = self.script(Script::Append, id, &args).await?;
            let (code, last) = match &value {
                Value::Array(items) if items.len() == 2 => match (&items[0], &items[1]) {
                    (Value::Int(code), Value::Int(last)) => (*code, *last),
                    _ => return Err(unexpected()),
                },
                _ => return Err(unexpected()),
            };
            match code {
                1 => Ok(()),
                0 => Err(LogError::Unknown),
                2 => Err(LogError::StreamFull),
                3 => Err(LogError::Store(format!(
                    "append of seq {} refused: the next seq is {}",
                    entry.seq,
                    last + 1
                ))),
                4 => Err(LogError::Store(
                    "append refused: the stream is finished".to_owned(),
                )),
                _ => Err(unexpected()),
            }
        })
    }

    fn finish<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            if !valid_id(id) {
                return Err(LogError::Unknown);
            }
            let ttl = self.ttl_ms().to_string();
            match self.script(Script::Finish, id, &[ttl.as_bytes()]).await? {
                Value::Int(1) => Ok(()),
                Value::Int(0) => Err(LogError::Unknown),
                _ => Err(unexpected()),
            }
        })
    }

    fn reading<'a>(&'a self, id: &'a str, lease: Duration) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            if !valid_id(id) {
                return Err(LogError::Unknown);
            }
            let mut conn = self.conn().await?;
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.reader_key(id))
                .arg(1)
                .arg("PX")
                .arg(lease.as_millis().max(1) as u64);
            self.run::<()>(&mut conn, &cmd).await
        })
    }

    fn has_reader<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, LogError>> {
        Box::pin(async move {
            if !valid_id(id) {
                return Ok(false);
            }
            let mut conn = self.conn().await?;
            let mut cmd = redis::cmd("EXISTS");
            cmd.arg(self.reader_key(id));
            Ok(self.run::<i64>(&mut conn, &cmd).await? > 0)
        })
    }

    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Read, LogError>> {
        Box::pin(async move {
            let deadline = Instant::now() + wait;
            // The range half is bounded by the command timeout; the whole
            // read by the caller's wait when that is longer.
            let limit = deadline.max(Instant::now() + self.inner.options.command_timeout * 2);
            match tokio::time::timeout_at(limit, self.read_inner(id, after, wait)).await {
                Ok(result) => result,
                Err(_) => Err(LogError::Store("redis read timed out".to_owned())),
            }
        })
    }
}

/// One entry of a Redis stream of this log.
enum Item {
    Event(Entry),
    /// The marker: finished (`true`) or full (`false`).
    End {
        finished: bool,
    },
}

/// What a read returns for these items: the events, and whether the stream
/// finished after them. A full stream read to its end is an error, never a
/// silent end.
fn settle(items: Vec<Item>) -> Result<Read, LogError> {
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        match item {
            Item::Event(entry) => entries.push(entry),
            Item::End { finished: true } => {
                return Ok(Read {
                    entries,
                    finished: true,
                });
            }
            Item::End { finished: false } => {
                if entries.is_empty() {
                    return Err(LogError::StreamFull);
                }
                // The events before the bound are still delivered; the
                // next read says the stream is full.
                return Ok(Read {
                    entries,
                    finished: false,
                });
            }
        }
    }
    Ok(Read {
        entries,
        finished: false,
    })
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN
}

fn unexpected() -> LogError {
    LogError::Store("unexpected answer from redis".to_owned())
}

/// The entries of an `XRANGE` answer.
fn parse_entries(value: &Value) -> Result<Vec<Item>, LogError> {
    let Value::Array(list) = value else {
        return Err(unexpected());
    };
    list.iter().map(parse_entry).collect()
}

/// One `[id, [field, value, ...]]` entry.
fn parse_entry(value: &Value) -> Result<Item, LogError> {
    let Value::Array(pair) = value else {
        return Err(unexpected());
    };
    let [id, fields] = pair.as_slice() else {
        return Err(unexpected());
    };
    let id = text(id).ok_or_else(unexpected)?;
    let fields: Vec<(&[u8], &Value)> = match fields {
        Value::Array(flat) => flat
            .chunks_exact(2)
            .filter_map(|kv| bytes(&kv[0]).map(|k| (k, &kv[1])))
            .collect(),
        Value::Map(map) => map
            .iter()
            .filter_map(|(k, v)| bytes(k).map(|k| (k, v)))
            .collect(),
        _ => return Err(unexpected()),
    };
    let field = |name: &[u8]| fields.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    if id == MARKER_ID {
        return Ok(Item::End {
            finished: field(b"end").is_some(),
        });
    }
    let seq = id
        .strip_prefix("0-")
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(unexpected)?;
    let event = field(b"ev").and_then(bytes).ok_or_else(unexpected)?;
    Ok(Item::Event(Entry {
        seq,
        event: Bytes::copy_from_slice(event),
    }))
}

/// The entries of an `XREAD` answer on one key (`None`: the block timed
/// out).
fn parse_xread(value: &Value) -> Result<Option<Vec<Item>>, LogError> {
    let entries = match value {
        Value::Nil => return Ok(None),
        // RESP2: [[key, entries]].
        Value::Array(keys) => match keys.first() {
            Some(Value::Array(pair)) if pair.len() == 2 => &pair[1],
            None => return Ok(None),
            _ => return Err(unexpected()),
        },
        // RESP3: {key: entries}.
        Value::Map(map) => match map.first() {
            Some((_, entries)) => entries,
            None => return Ok(None),
        },
        _ => return Err(unexpected()),
    };
    parse_entries(entries).map(Some)
}

fn bytes(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn text(value: &Value) -> Option<&str> {
    bytes(value).and_then(|b| std::str::from_utf8(b).ok())
}

/// A client for `url`, checked without connecting. Errors never show the
/// URL (it may carry a password).
fn open_client(url: &str) -> Result<redis::Client, LogError> {
    let scheme = url.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("redis" | "redis+unix" | "unix" | "valkey" | "valkey+unix") => {}
        Some("rediss" | "valkeys") => {
            return Err(LogError::Store(
                "TLS Redis URLs (rediss://) are not supported by this build".to_owned(),
            ));
        }
        _ => {
            return Err(LogError::Store(
                "not a Redis URL (use redis://, redis+unix:// or unix://)".to_owned(),
            ));
        }
    }
    redis::Client::open(url)
        .map_err(|_| LogError::Store("the Redis URL was refused by the Redis client".to_owned()))
}

/// Errors after which the shared connection is opened again.
fn breaks_connection(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() || e.is_timeout()
}

/// Safe text for a failed connect: the kind of failure, never the URL.
fn connect_error(e: &RedisError) -> String {
    if e.is_connection_refusal() {
        "redis connection refused".to_owned()
    } else if e.is_timeout() {
        "redis connect timed out".to_owned()
    } else if let Some(code) = e.code() {
        // NOAUTH, WRONGPASS, ...: a code, never the detail.
        format!("redis refused the connection ({code})")
    } else if e.is_io_error() {
        "redis connect failed (i/o error)".to_owned()
    } else {
        "redis connect failed".to_owned()
    }
}

/// Safe text for a failed command: the kind or the server's error code.
fn command_error(e: &RedisError) -> String {
    if e.is_timeout() {
        "redis command timed out".to_owned()
    } else if e.is_connection_dropped() || e.is_connection_refusal() {
        "redis connection lost".to_owned()
    } else if let Some(code) = e.code() {
        format!("redis answered with an error ({code})")
    } else if e.is_io_error() {
        "redis i/o error".to_owned()
    } else {
        "redis command failed".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, field: &str, value: &[u8]) -> Value {
        Value::Array(vec![
            Value::BulkString(id.as_bytes().to_vec()),
            Value::Array(vec![
                Value::BulkString(field.as_bytes().to_vec()),
                Value::BulkString(value.to_vec()),
            ]),
        ])
    }

    #[test]
    fn entries_and_markers_parse() {
        let value = Value::Array(vec![
            event("0-1", "ev", b"id: s:1\ndata: a\n\n"),
            event("0-2", "ev", b"id: s:2\ndata: b\n\n"),
            event("1-0", "end", b"1"),
        ]);
        let read = settle(parse_entries(&value).unwrap()).unwrap();
        assert!(read.finished);
        assert_eq!(read.entries.len(), 2);
        assert_eq!(read.entries[1].seq, 2);
        assert_eq!(&read.entries[0].event[..], b"id: s:1\ndata: a\n\n");
    }

    #[test]
    fn a_full_stream_is_an_error_once_read_to_its_bound() {
        let full = Value::Array(vec![event("1-0", "full", b"1")]);
        assert_eq!(
            settle(parse_entries(&full).unwrap()),
            Err(LogError::StreamFull)
        );
        let some = Value::Array(vec![event("0-7", "ev", b"x"), event("1-0", "full", b"1")]);
        let read = settle(parse_entries(&some).unwrap()).unwrap();
        assert!(!read.finished, "never a silent end");
        assert_eq!(read.entries.len(), 1);
    }

    #[test]
    fn xread_answers_parse_in_both_protocols() {
        assert!(parse_xread(&Value::Nil).unwrap().is_none());
        let entries = Value::Array(vec![event("0-3", "ev", b"x")]);
        let resp2 = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"k".to_vec()),
            entries.clone(),
        ])]);
        let resp3 = Value::Map(vec![(Value::BulkString(b"k".to_vec()), entries)]);
        for value in [resp2, resp3] {
            let items = parse_xread(&value).unwrap().unwrap();
            assert!(matches!(&items[0], Item::Event(e) if e.seq == 3));
        }
    }

    #[test]
    fn urls_are_checked_and_never_shown() {
        let err = open_client("rediss://user:s3cret@host").unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let err = open_client("http://user:s3cret@host").unwrap_err();
        assert!(!format!("{err:?}").contains("s3cret"), "{err:?}");
        assert!(open_client("redis+unix:///tmp/r.sock").is_ok());
        assert!(open_client("redis://127.0.0.1:6379/0").is_ok());
    }

    #[test]
    fn ids_are_bounded() {
        assert!(!valid_id(""));
        assert!(valid_id("abc"));
        assert!(!valid_id(&"x".repeat(MAX_ID_LEN + 1)));
    }
}
