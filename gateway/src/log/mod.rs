//! Stream logs: what the gateway sent downstream, per stream, so a client
//! that reconnects gets the rest without gap or duplicate.
//!
//! The gateway gives every streamed answer an id (`x-recovery-stream-id`)
//! and numbers its SSE events from 1 (`id: <stream>:<seq>`). Each event is
//! appended to the log before the gateway sends it (the events of one
//! upstream read in one append), and the generation goes on
//! upstream when the client leaves (within a keep-generating window), so a
//! reconnect with `Last-Event-ID: <stream>:<seq>` (or `GET
//! /streams/<stream>?after=<seq>`) reads what follows `seq` from the log,
//! then follows the live stream until it finishes.
//!
//! [`StreamLog`] is the seam: in memory by default ([`MemoryLog`]), on Redis
//! Streams when configured ([`RedisLog`], feature `redis`) so that any
//! instance behind a load balancer can serve a reconnect.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

mod memory;
pub use memory::MemoryLog;

#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
pub use redis::{RedisLog, RedisLogBuilder};

/// A boxed future, as the log's methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One event of a stream, as sent downstream (its `id:` line included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its number in the stream, from 1, without gaps.
    pub seq: u64,
    /// The event's bytes, a whole SSE event ending in a blank line.
    pub event: Bytes,
}

/// What a read found after a sequence number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// The entries after the one asked for, in order (empty when none came
    /// within the wait).
    pub entries: Vec<Entry>,
    /// The stream finished: nothing follows the last entry returned (or,
    /// with no entries, the one asked for).
    pub finished: bool,
}

/// Bounds of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries kept per stream; past it, an append fails with
    /// [`LogError::StreamFull`] (the stream is no longer resumable, it is
    /// never cut silently).
    pub max_entries: u64,
    /// Bytes kept per stream, the same way.
    pub max_bytes: u64,
    /// Streams kept at once (in memory); past it the stream that finished
    /// longest ago is dropped, and with none finished opening one fails
    /// with [`LogError::Full`].
    pub max_streams: usize,
    /// Event bytes kept in all streams at once (in memory); past it the
    /// streams that finished longest ago are dropped, and with none
    /// finished the append fails with [`LogError::StreamFull`] (that
    /// stream is no longer resumable; no other stream is touched).
    pub max_total_bytes: u64,
    /// How long a stream stays readable after it finished (or after its last
    /// append, if it never finishes).
    pub ttl: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 100_000,
            // An image generation's stream carries each partial image and
            // the final one as base64 events of several MiB.
            max_bytes: 64 << 20,
            max_streams: 10_000,
            max_total_bytes: 256 << 20,
            ttl: Duration::from_mins(5),
        }
    }
}

/// Why a log call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogError {
    /// No stream has this id (never opened, or expired).
    Unknown,
    /// The stream reached its per-stream bound.
    StreamFull,
    /// The log holds as many streams as it may.
    Full,
    /// A stream with this id exists already.
    Exists,
    /// The store could not be reached or answered in error (Redis); the
    /// text is safe to log (no credentials).
    Store(String),
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Unknown => f.write_str("no such stream (unknown or expired)"),
            LogError::StreamFull => f.write_str("the stream reached its log bound"),
            LogError::Full => f.write_str("the log holds as many streams as it may"),
            LogError::Exists => f.write_str("a stream with this id exists"),
            LogError::Store(e) => write!(f, "stream log store: {e}"),
        }
    }
}

impl std::error::Error for LogError {}

/// Where the events of in-flight streams are kept. One writer per stream
/// (the gateway instance that runs it), any number of readers, on any
/// instance that shares the store.
pub trait StreamLog: Send + Sync + 'static {
    /// Starts stream `id`.
    fn open<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>>;

    /// Appends `entries` to stream `id`, numbered on from its last one
    /// (the first is the previous seq plus 1, each next one plus 1 more):
    /// all of them, or none when one would pass a bound (then the stream
    /// is full). The events of one upstream read come in one call, so a
    /// shared log takes them in one round trip.
    fn append<'a>(
        &'a self,
        id: &'a str,
        entries: &'a [Entry],
    ) -> BoxFuture<'a, Result<(), LogError>>;

    /// Marks stream `id` finished (completed or failed: its last event says
    /// which); it stays readable for the ttl.
    fn finish<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>>;

    /// The entries of stream `id` after `after` (0: from the start),
    /// waiting up to `wait` for one when none is there yet and the stream
    /// has not finished. Never waits longer than `wait`.
    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Read, LogError>>;

    /// A reader follows stream `id` and will say so again within `lease`.
    /// A log shared by instances keeps this where the instance running the
    /// stream sees it ([`StreamLog::has_reader`]), so a client that
    /// reconnected elsewhere keeps the generation going; a log of one
    /// process needs nothing (the instance counts its own readers).
    fn reading<'a>(&'a self, id: &'a str, lease: Duration) -> BoxFuture<'a, Result<(), LogError>> {
        let _ = (id, lease);
        Box::pin(async { Ok(()) })
    }

    /// Whether a reader said it follows stream `id` within its lease.
    fn has_reader<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, LogError>> {
        let _ = id;
        Box::pin(async { Ok(false) })
    }
}
