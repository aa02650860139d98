//! The stream log on Redis: [`tower_recovery::redis::RedisStreamLog`] (its layout,
//! scripts, connections and bounds are documented there) behind the
//! gateway's [`StreamLog`] seam, so every gateway instance that points at
//! the same Redis can serve a client's reconnect.
//!
//! `Limits::max_streams` and `Limits::max_total_bytes` bound the memory of
//! one process and do not apply here: Redis holds the streams, each bounded
//! by `max_entries`, `max_bytes` and the ttl.

use std::time::Duration;

use tower_recovery::redis::{
    RedisOptions, RedisStreamLog, StreamBounds, StreamEntry, StreamLogError,
};

use super::{BoxFuture, Entry, Limits, LogError, Read, StreamLog};

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

    fn store(self) -> tower_recovery::redis::StreamLogBuilder {
        let bounds = StreamBounds {
            max_entries: self.limits.max_entries,
            max_bytes: self.limits.max_bytes,
            ttl: self.limits.ttl,
        };
        let options = RedisOptions::new()
            .prefix(self.prefix)
            .connect_timeout(self.connect_timeout)
            .command_timeout(self.command_timeout);
        RedisStreamLog::builder(bounds)
            .options(options)
            .max_blocking_reads(self.max_blocking_reads)
    }

    /// Connects to `url` and checks that Redis answers (see
    /// [`RedisLog::connect`]).
    pub async fn connect(self, url: &str) -> Result<RedisLog, LogError> {
        let limits = self.limits;
        let store = self.store().connect(url).await.map_err(log_error)?;
        Ok(RedisLog { store, limits })
    }

    /// A log for `url` that connects on first use: nothing is sent yet, only
    /// the URL is checked. Calls made while Redis is down fail fast with
    /// [`LogError::Store`]; the first call after it is back connects.
    pub fn lazy(self, url: &str) -> Result<RedisLog, LogError> {
        let limits = self.limits;
        let store = self.store().lazy(url).map_err(log_error)?;
        Ok(RedisLog { store, limits })
    }
}

/// A [`StreamLog`] on Redis Streams. Cheap to clone: clones share their
/// connections.
#[derive(Debug, Clone)]
pub struct RedisLog {
    store: RedisStreamLog,
    limits: Limits,
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
        RedisLogBuilder {
            limits,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
            max_blocking_reads: 256,
        }
    }

    /// The bounds it runs with.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The Redis key of stream `id`'s events.
    pub fn stream_key(&self, id: &str) -> String {
        self.store.stream_key(id)
    }

    /// The Redis key of stream `id`'s state.
    pub fn meta_key(&self, id: &str) -> String {
        self.store.meta_key(id)
    }

    /// The key a reader following stream `id` keeps with a lease.
    pub fn reader_key(&self, id: &str) -> String {
        self.store.reader_key(id)
    }
}

fn log_error(e: StreamLogError) -> LogError {
    match e {
        StreamLogError::Unknown => LogError::Unknown,
        StreamLogError::StreamFull => LogError::StreamFull,
        StreamLogError::Exists => LogError::Exists,
        StreamLogError::Store(text) => LogError::Store(text),
        other => LogError::Store(other.to_string()),
    }
}

impl StreamLog for RedisLog {
    fn open<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move { self.store.open(id).await.map_err(log_error) })
    }

    fn append<'a>(
        &'a self,
        id: &'a str,
        entries: &'a [Entry],
    ) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move {
            let entries: Vec<StreamEntry> = entries
                .iter()
                .map(|e| StreamEntry {
                    seq: e.seq,
                    event: e.event.clone(),
                })
                .collect();
            self.store.append(id, &entries).await.map_err(log_error)
        })
    }

    fn finish<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move { self.store.finish(id).await.map_err(log_error) })
    }

    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Read, LogError>> {
        Box::pin(async move {
            let read = self.store.read(id, after, wait).await.map_err(log_error)?;
            Ok(Read {
                entries: read
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        seq: e.seq,
                        event: e.event,
                    })
                    .collect(),
                finished: read.finished,
            })
        })
    }

    fn reading<'a>(&'a self, id: &'a str, lease: Duration) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move { self.store.reading(id, lease).await.map_err(log_error) })
    }

    fn has_reader<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, LogError>> {
        Box::pin(async move { self.store.has_reader(id).await.map_err(log_error) })
    }
}
