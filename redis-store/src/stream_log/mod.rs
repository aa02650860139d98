//! A log of streamed answers on Redis Streams, shared by every process that
//! points at the same Redis: the events one process sent a client are
//! readable by any other, so a client that reconnects through a load
//! balancer can land on any of them and get the rest without gap or
//! duplicate. `recovery-gateway` keeps its resumable streams here.
//!
//! # Layout
//!
//! Each stream `id` has two keys:
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
//! set with a lease (`PX`) by a reader following the stream in any
//! process, so the process running it keeps generating.
//!
//! # Why scripts
//!
//! `open`, `append`, `finish` and the first half of `read` are small Lua
//! scripts (`EVALSHA`, loaded when Redis does not know them): each checks
//! and changes both keys in one atomic step and one round trip. That is what
//! makes the bounds exact (an append past `max_entries` or `max_bytes` is
//! refused and marks the stream full instead of being trimmed with
//! `MAXLEN`, which would silently drop events a client has not read),
//! refuses an append that is not the previous seq plus one (a duplicate or
//! a gap), and lets a read tell "nothing yet" from "unknown" without a race.
//!
//! # Connections and timeouts
//!
//! Every connect and command goes through the crate's link, with the
//! [`RedisOptions`] timeouts. Calls share one multiplexed connection,
//! opened on first use and again after it broke. After a failed connect,
//! calls fail at once for a short pause (instead of each trying again and
//! waiting out its own timeout), so a process whose Redis is down answers
//! its clients quickly with [`StreamLogError::Store`], whose text never
//! carries the URL or a password.
//!
//! A read that finds nothing waits in `XREAD BLOCK`, which would stall every
//! other command on a shared connection: it runs on a connection of its
//! own taken from a small idle pool, with a bounded number of such reads at
//! once ([`StreamLogBuilder::max_blocking_reads`]). The block lasts a little
//! less than what is left of the caller's `wait`, and the whole read is cut
//! at the caller's deadline whatever Redis does, so a read never waits
//! longer than `wait`.
//!
//! The two keys of a stream are not hash-tagged: the log talks to one
//! Redis node (or a primary behind a proxy), not to a Redis Cluster.

use std::fmt;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use bytes::Bytes;
use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio::sync::{Mutex, Semaphore};
use tokio::time::Instant;

use crate::RedisOptions;
use crate::link::{Link, LinkError, QueryKind};

mod answer;
mod scripts;

use answer::{Item, parse_entries, parse_xread, settle};

/// Stream ids longer than this are unknown without asking Redis: an id comes
/// back from clients, and a key is built from it.
const MAX_ID_LEN: usize = 256;

/// Entries returned by one read at most; the caller reads again for more.
const READ_BATCH: u64 = 512;

/// How long calls fail at once after a connect failed.
const DOWN_PAUSE: Duration = Duration::from_millis(250);

/// Idle connections kept for blocking reads.
const MAX_IDLE_BLOCKING: usize = 16;

/// The id of the marker entry that ends a stream: after every `0-<seq>`.
const MARKER_ID: &str = "1-0";

/// One event of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEntry {
    /// Its number in the stream, from 1, without gaps.
    pub seq: u64,
    /// The event's bytes, as they were sent.
    pub event: Bytes,
}

/// What a read found after a sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRead {
    /// The entries after the one asked for, in order (empty when none came
    /// within the wait).
    pub entries: Vec<StreamEntry>,
    /// The stream finished: nothing follows the last entry returned (or,
    /// with no entries, the one asked for).
    pub finished: bool,
}

/// The bounds of each stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamBounds {
    /// Entries kept per stream; past it an append fails with
    /// [`StreamLogError::StreamFull`] (the stream is no longer readable to
    /// its end; it is never cut silently).
    pub max_entries: u64,
    /// Event bytes kept per stream, the same way.
    pub max_bytes: u64,
    /// How long a stream stays readable after it finished (or after its
    /// last append, if it never finishes).
    pub ttl: Duration,
}

impl Default for StreamBounds {
    fn default() -> Self {
        StreamBounds {
            max_entries: 100_000,
            // An image generation's stream carries each partial image and
            // the final one as base64 events of several MiB.
            max_bytes: 64 << 20,
            ttl: Duration::from_mins(5),
        }
    }
}

/// Why a log call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamLogError {
    /// No stream has this id (never opened, or expired).
    Unknown,
    /// The stream reached its bounds.
    StreamFull,
    /// A stream with this id exists already.
    Exists,
    /// Redis could not be reached or answered in error, or the URL or the
    /// options cannot work; the text is safe to log (no URL, no password).
    Store(String),
}

impl fmt::Display for StreamLogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamLogError::Unknown => f.write_str("no such stream (unknown or expired)"),
            StreamLogError::StreamFull => f.write_str("the stream reached its log bound"),
            StreamLogError::Exists => f.write_str("a stream with this id exists"),
            StreamLogError::Store(e) => write!(f, "stream log store: {e}"),
        }
    }
}

impl std::error::Error for StreamLogError {}

impl From<LinkError> for StreamLogError {
    fn from(e: LinkError) -> Self {
        StreamLogError::Store(e.to_string())
    }
}

/// How a [`RedisStreamLog`] is set up. Made by [`RedisStreamLog::builder`];
/// ends with [`connect`](Self::connect) or [`lazy`](Self::lazy).
#[derive(Debug, Clone)]
pub struct StreamLogBuilder {
    bounds: StreamBounds,
    options: RedisOptions,
    max_blocking_reads: usize,
}

impl StreamLogBuilder {
    /// The key prefix and timeouts ([`RedisOptions::prefix`],
    /// [`connect_timeout`](RedisOptions::connect_timeout),
    /// [`command_timeout`](RedisOptions::command_timeout); the others do
    /// not apply). A blocking read is bounded by its own `wait` instead of
    /// the command timeout.
    #[must_use]
    pub fn options(mut self, options: RedisOptions) -> Self {
        self.options = options;
        self
    }

    /// Reads waiting in `XREAD BLOCK` at once (at least 1; default 256),
    /// each on its own connection. A read beyond waits for a turn within
    /// its own `wait`.
    #[must_use]
    pub fn max_blocking_reads(mut self, n: usize) -> Self {
        self.max_blocking_reads = n.max(1);
        self
    }

    /// The bounds.
    pub fn bounds(&self) -> StreamBounds {
        self.bounds
    }

    /// Connects to `url` and checks that Redis answers, so a wrong URL or
    /// a Redis that is down shows at start-up.
    pub async fn connect(self, url: &str) -> Result<RedisStreamLog, StreamLogError> {
        let log = self.lazy(url)?;
        let mut conn = log.conn().await?;
        let ping = redis::cmd("PING");
        log.run::<Value>(&mut conn, &ping).await?;
        Ok(log)
    }

    /// A log for `url` that connects on first use: nothing is sent yet, only
    /// the URL and the options are checked. Calls made while Redis is down
    /// fail fast with [`StreamLogError::Store`]; the first call after it is
    /// back connects.
    pub fn lazy(self, url: &str) -> Result<RedisStreamLog, StreamLogError> {
        let safe = |e: crate::RedisStoreError| StreamLogError::Store(e.to_string());
        self.options.validate().map_err(safe)?;
        let client = crate::error::open(url).map_err(safe)?;
        Ok(RedisStreamLog {
            inner: Arc::new(Inner {
                link: Link::new(client, Arc::new(self.options)),
                bounds: self.bounds,
                blocking: Semaphore::new(self.max_blocking_reads),
                commands: Mutex::new(Slot::default()),
                idle: StdMutex::new(Vec::new()),
                scripts: Scripts::new(),
            }),
        })
    }
}

/// A log of streamed answers on Redis Streams (see the module docs). Cheap
/// to clone: clones share their connections.
#[derive(Clone)]
pub struct RedisStreamLog {
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    bounds: StreamBounds,
    commands: Mutex<Slot>,
    blocking: Semaphore,
    idle: StdMutex<Vec<MultiplexedConnection>>,
    scripts: Scripts,
}

/// The scripts, their SHA1s computed once.
struct Scripts {
    open: redis::Script,
    append: redis::Script,
    finish: redis::Script,
    range: redis::Script,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            open: redis::Script::new(scripts::OPEN),
            append: redis::Script::new(scripts::APPEND),
            finish: redis::Script::new(scripts::FINISH),
            range: redis::Script::new(scripts::RANGE),
        }
    }
}

/// The shared command connection, or why there is none.
#[derive(Default)]
struct Slot {
    conn: Option<MultiplexedConnection>,
    down_until: Option<Instant>,
    down_because: String,
}

impl fmt::Debug for RedisStreamLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No URL: it may carry a password.
        f.debug_struct("RedisStreamLog")
            .field("prefix", &self.inner.link.options.prefix)
            .field("bounds", &self.inner.bounds)
            .finish_non_exhaustive()
    }
}

impl RedisStreamLog {
    /// A builder with these bounds and the defaults: [`RedisOptions`]'
    /// defaults, 256 blocking reads at once.
    pub fn builder(bounds: StreamBounds) -> StreamLogBuilder {
        StreamLogBuilder {
            bounds,
            options: RedisOptions::default(),
            max_blocking_reads: 256,
        }
    }

    /// The bounds it runs with.
    pub fn bounds(&self) -> StreamBounds {
        self.inner.bounds
    }

    /// The Redis key of stream `id`'s events.
    pub fn stream_key(&self, id: &str) -> String {
        format!("{}stream:{id}", self.inner.link.options.prefix)
    }

    /// The Redis key of stream `id`'s state.
    pub fn meta_key(&self, id: &str) -> String {
        format!("{}meta:{id}", self.inner.link.options.prefix)
    }

    /// The key a reader following stream `id` keeps with a lease.
    pub fn reader_key(&self, id: &str) -> String {
        format!("{}reader:{id}", self.inner.link.options.prefix)
    }

    /// Starts stream `id`.
    pub async fn open(&self, id: &str) -> Result<(), StreamLogError> {
        if !valid_id(id) {
            return Err(StreamLogError::Store(
                "stream id too long or empty".to_owned(),
            ));
        }
        let ttl = self.ttl_ms().to_string();
        let script = &self.inner.scripts.open;
        match self.script(script, id, &[ttl.as_bytes()]).await? {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(StreamLogError::Exists),
            _ => Err(unexpected()),
        }
    }

    /// Appends `entries` to stream `id` in one round trip: the first one's
    /// seq is the previous one plus 1, and each next one's 1 more. All of
    /// them are appended, or none: past the bounds the append is refused
    /// and the stream marked full. An empty slice changes nothing.
    pub async fn append(&self, id: &str, entries: &[StreamEntry]) -> Result<(), StreamLogError> {
        if !valid_id(id) {
            return Err(StreamLogError::Unknown);
        }
        let Some(first) = entries.first() else {
            return Ok(());
        };
        if let Some(e) = entries
            .iter()
            .zip(first.seq..)
            .find_map(|(e, seq)| (e.seq != seq).then_some(e))
        {
            return Err(StreamLogError::Store(format!(
                "append of seq {} out of order in a batch from {}",
                e.seq, first.seq
            )));
        }
        let bounds = self.inner.bounds;
        let seq = first.seq.to_string();
        let max_entries = bounds.max_entries.to_string();
        let max_bytes = bounds.max_bytes.to_string();
        let ttl = self.ttl_ms().to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(4 + entries.len());
        args.extend([
            seq.as_bytes(),
            max_entries.as_bytes(),
            max_bytes.as_bytes(),
            ttl.as_bytes(),
        ]);
        args.extend(entries.iter().map(|e| &e.event[..]));
        let value = self.script(&self.inner.scripts.append, id, &args).await?;
        let (code, last) = match &value {
            Value::Array(items) if items.len() == 2 => match (&items[0], &items[1]) {
                (Value::Int(code), Value::Int(last)) => (*code, *last),
                _ => return Err(unexpected()),
            },
            _ => return Err(unexpected()),
        };
        match code {
            1 => Ok(()),
            0 => Err(StreamLogError::Unknown),
            2 => Err(StreamLogError::StreamFull),
            3 => Err(StreamLogError::Store(format!(
                "append of seq {} refused: the next seq is {}",
                first.seq,
                last + 1
            ))),
            4 => Err(StreamLogError::Store(
                "append refused: the stream is finished".to_owned(),
            )),
            _ => Err(unexpected()),
        }
    }

    /// Marks stream `id` finished; it stays readable for the ttl.
    pub async fn finish(&self, id: &str) -> Result<(), StreamLogError> {
        if !valid_id(id) {
            return Err(StreamLogError::Unknown);
        }
        let ttl = self.ttl_ms().to_string();
        let script = &self.inner.scripts.finish;
        match self.script(script, id, &[ttl.as_bytes()]).await? {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(StreamLogError::Unknown),
            _ => Err(unexpected()),
        }
    }

    /// The entries of stream `id` after `after` (0: from the start),
    /// waiting up to `wait` for one when none is there yet and the stream
    /// has not finished. Never waits longer than `wait` (or, with a shorter
    /// `wait`, twice the command timeout).
    pub async fn read(
        &self,
        id: &str,
        after: u64,
        wait: Duration,
    ) -> Result<StreamRead, StreamLogError> {
        let deadline = Instant::now() + wait;
        let command_timeout = self.inner.link.options.command_timeout;
        let limit = deadline.max(Instant::now() + command_timeout * 2);
        match tokio::time::timeout_at(limit, self.read_inner(id, after, wait)).await {
            Ok(result) => result,
            Err(_) => Err(StreamLogError::Store("redis read timed out".to_owned())),
        }
    }

    /// A reader follows stream `id` and will say so again within `lease`.
    pub async fn reading(&self, id: &str, lease: Duration) -> Result<(), StreamLogError> {
        if !valid_id(id) {
            return Err(StreamLogError::Unknown);
        }
        let mut conn = self.conn().await?;
        let mut cmd = redis::cmd("SET");
        cmd.arg(self.reader_key(id))
            .arg(1)
            .arg("PX")
            .arg(u64::try_from(lease.as_millis().max(1)).unwrap_or(u64::MAX));
        self.run::<()>(&mut conn, &cmd).await
    }

    /// Whether a reader said it follows stream `id` within its lease.
    pub async fn has_reader(&self, id: &str) -> Result<bool, StreamLogError> {
        if !valid_id(id) {
            return Ok(false);
        }
        let mut conn = self.conn().await?;
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(self.reader_key(id));
        Ok(self.run::<i64>(&mut conn, &cmd).await? > 0)
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.inner.bounds.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// The shared command connection, opened if there is none.
    async fn conn(&self) -> Result<MultiplexedConnection, StreamLogError> {
        let connect_timeout = self.inner.link.options.connect_timeout;
        // Bounded: a caller never queues behind a slow connect for longer
        // than a connect of its own would take.
        let Ok(mut slot) = tokio::time::timeout(connect_timeout, self.inner.commands.lock()).await
        else {
            return Err(StreamLogError::Store("redis connect timed out".to_owned()));
        };
        if let Some(conn) = &slot.conn {
            return Ok(conn.clone());
        }
        if let Some(until) = slot.down_until
            && Instant::now() < until
        {
            return Err(StreamLogError::Store(slot.down_because.clone()));
        }
        match self.inner.link.commands().await {
            Ok(conn) => {
                slot.down_until = None;
                slot.conn = Some(conn.clone());
                Ok(conn)
            }
            Err(e) => {
                let text = match e {
                    LinkError::Timeout => "redis connect timed out".to_owned(),
                    e @ LinkError::Redis(_) => e.to_string(),
                };
                slot.down_until = Some(Instant::now() + DOWN_PAUSE);
                slot.down_because.clone_from(&text);
                Err(StreamLogError::Store(text))
            }
        }
    }

    /// What a failed command says; the shared connection is forgotten
    /// when the failure may have broken it, so the next call opens one.
    async fn failed(&self, e: LinkError) -> StreamLogError {
        if e.breaks_connection()
            && let Ok(mut slot) = tokio::time::timeout(
                self.inner.link.options.command_timeout,
                self.inner.commands.lock(),
            )
            .await
        {
            slot.conn = None;
        }
        e.into()
    }

    /// Runs one command within the command timeout.
    async fn run<T: redis::FromRedisValue>(
        &self,
        conn: &mut MultiplexedConnection,
        cmd: &redis::Cmd,
    ) -> Result<T, StreamLogError> {
        match self.inner.link.run(conn, &QueryKind::Cmd(cmd)).await {
            Ok(value) => Ok(value),
            Err(e) => Err(self.failed(e).await),
        }
    }

    /// Runs `script` on stream `id`'s two keys with `args`.
    async fn script(
        &self,
        script: &redis::Script,
        id: &str,
        args: &[&[u8]],
    ) -> Result<Value, StreamLogError> {
        let mut conn = self.conn().await?;
        let mut call = script.key(self.stream_key(id));
        call.key(self.meta_key(id));
        for arg in args {
            call.arg(*arg);
        }
        match self.inner.link.invoke(&mut conn, &call).await {
            Ok(value) => Ok(value),
            Err(e) => Err(self.failed(e).await),
        }
    }

    /// The entries of `id` from `first` on (at most a batch), or `None`
    /// when the stream is unknown.
    async fn range(&self, id: &str, first: &str) -> Result<Option<Vec<Item>>, StreamLogError> {
        let count = READ_BATCH.to_string();
        let script = &self.inner.scripts.range;
        let value = self
            .script(script, id, &[first.as_bytes(), count.as_bytes()])
            .await?;
        match value {
            Value::Nil => Ok(None),
            other => parse_entries(&other).map(Some),
        }
    }

    /// Waits (on a connection of its own) until an entry after `after`
    /// arrives or `deadline` passes.
    async fn wait_for(
        &self,
        id: &str,
        after: u64,
        deadline: Instant,
    ) -> Result<Option<Vec<Item>>, StreamLogError> {
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
                None => match self.inner.link.blocking(deadline).await? {
                    Some(conn) => conn,
                    None => return Ok(None),
                },
            };
            let left = deadline.saturating_duration_since(Instant::now());
            // Redis ends the block a little before the deadline, so the
            // answer is usually back in time and the connection can be kept.
            let margin = (left / 8).min(Duration::from_millis(25));
            let block_ms = u64::try_from(left.saturating_sub(margin).as_millis()).unwrap_or(0);
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
                Ok(Err(e)) => {
                    let e = LinkError::from(e);
                    if !(reused && e.breaks_connection()) {
                        return Err(e.into());
                    }
                }
                // The connection may still get the answer: it is dropped.
                Err(_) => return Ok(None),
            }
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

    async fn read_inner(
        &self,
        id: &str,
        after: u64,
        wait: Duration,
    ) -> Result<StreamRead, StreamLogError> {
        let deadline = Instant::now() + wait;
        if !valid_id(id) {
            return Err(StreamLogError::Unknown);
        }
        let first = match after.checked_add(1) {
            Some(next) => format!("0-{next}"),
            None => MARKER_ID.to_owned(),
        };
        let items = self
            .range(id, &first)
            .await?
            .ok_or(StreamLogError::Unknown)?;
        if !items.is_empty() || wait.is_zero() {
            return settle(items);
        }
        match self.wait_for(id, after, deadline).await? {
            Some(items) => settle(items),
            None => Ok(StreamRead {
                entries: Vec::new(),
                finished: false,
            }),
        }
    }
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN
}

fn unexpected() -> StreamLogError {
    StreamLogError::Store("unexpected answer from redis".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_never_shown() {
        let builder = || RedisStreamLog::builder(StreamBounds::default());
        let err = builder().lazy("http://user:s3cret@host").unwrap_err();
        assert!(!format!("{err:?} {err}").contains("s3cret"), "{err:?}");
        assert!(builder().lazy("redis+unix:///tmp/r.sock").is_ok());
        assert!(builder().lazy("redis://127.0.0.1:6379/0").is_ok());
    }

    #[test]
    fn ids_are_bounded() {
        assert!(!valid_id(""));
        assert!(valid_id("abc"));
        assert!(!valid_id(&"x".repeat(MAX_ID_LEN + 1)));
    }
}
