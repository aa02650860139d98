//! The registry of resumable streams: which generations run on this
//! instance, their readers, and the bounds on both. The pump
//! ([`super::pump`]) and the readers ([`super::reader`]) do the reading.
//!
//! # One writer, many readers
//!
//! A streamed SSE answer gets an id and a pump task. The pump reads the
//! upstream (through the recovery layer), cuts it into whole events
//! (core's `SseBlocks`), numbers them, appends each to the
//! [`StreamLog`] and only then hands it to the client that asked
//! (a bounded queue, [`super::direct`]: a slow client slows the upstream
//! read, as it would without the gateway). A reconnect reads the log after its last id and
//! follows it to the end; log order is the only order, so there is no gap
//! and no duplicate at the seam.
//!
//! # Keep generating
//!
//! The pump counts its readers here: the first client until it goes, and
//! each reconnect while it reads. While one reads, the generation goes to
//! its end. When none is left, a timer of `keep_generating` starts; a
//! reader that comes back stops it; when it fires the upstream read is
//! dropped (the recovery layer records a cancellation), the log gets the
//! protocol's error event so a later reader is told, and the stream ends.
//! The window has its own bounded pool (`max_kept`): a generation that
//! finds no place when its last reader leaves stops at once.
//! A reader on another instance (a shared log) renews a lease in the log
//! before each read ([`StreamLog::reading`]); when the window fires with
//! nobody reading here, the pump asks the log ([`StreamLog::has_reader`])
//! and goes on while such a lease holds, so it may run up to a lease past
//! the last remote reader.
//!
//! # Never cut silently
//!
//! Every way a stream ends short is an error event of the client's
//! protocol (`recovery_core::protocol::error_event`): a failure the
//! recovery layer could not hide, the keep-generating window, a shutdown,
//! a log that refused an append (the first client still gets the whole
//! answer; a reconnect on this instance is told where the log stopped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use recovery_core::protocol::ProtocolKind;

use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use super::numbering::Comments;
use crate::forward::UpstreamBody;
use crate::identity::StreamKey;
use crate::log::{LogError, StreamLog};
use crate::logs::Logger;
use crate::metrics::Metrics;

/// Reads (each one message of its events) buffered between the pump and
/// the first client.
pub(super) const DIRECT_CAPACITY: usize = 32;

/// What the pump hands its first client: the events of one upstream read,
/// and whether they are the stream's last, so the client's body ends with
/// them, in their write, rather than in a write of its own.
#[derive(Debug)]
pub(crate) struct Handed {
    /// Numbered events and comment lines, back to back.
    pub(crate) bytes: Bytes,
    /// Nothing follows.
    pub(crate) last: bool,
}
/// How often a generation with no place in the keep-generating pool asks
/// the log again whether a reader elsewhere still follows it.
pub(super) const REMOTE_RECHECK: Duration = Duration::from_secs(5);
/// How long one log read waits for an event before it asks again.
pub(super) const READ_WAIT: Duration = Duration::from_secs(15);
/// How long a reader's word that it follows a stream holds: longer than a
/// read (it is renewed before each), so the instance running the stream
/// sees a reader on another instance without a gap.
pub(super) const READER_LEASE: Duration = Duration::from_secs(40);

/// How many of what the registry holds at once.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// How long a generation goes on after its last reader left.
    pub(crate) keep_generating: Duration,
    /// How long a log-truncation note is kept (the log's ttl).
    pub(crate) ttl: Duration,
    /// Generations kept going with no reader, at once.
    pub(crate) max_kept: usize,
    /// Reconnected readers of one live stream.
    pub(crate) max_readers_per_stream: usize,
    /// Reconnected readers in all.
    pub(crate) max_readers: usize,
    /// The longest one event may be before the stream is failed: the
    /// policy's `max_event_bytes`, the bound its decoder holds it to.
    pub(crate) max_event: usize,
}

/// Why a reconnect was not served.
#[derive(Debug)]
pub(crate) enum AttachError {
    /// The log could not serve it ([`LogError::Unknown`]: no such stream).
    Log(LogError),
    /// The stream, or the gateway, has as many readers as it may.
    Busy,
}

/// A stream running on this instance.
pub(super) struct Live {
    /// Readers now: the first client while it reads, and reconnects.
    pub(super) readers: watch::Sender<usize>,
    /// Reconnected readers now (the first client not counted).
    pub(super) reconnects: std::sync::atomic::AtomicUsize,
    pub(super) protocol: ProtocolKind,
    pub(super) content_type: HeaderValue,
}

/// What a reconnect gets.
pub(crate) struct Attached {
    /// The events after the asked sequence number, then the live rest.
    pub(crate) body: crate::body::GatewayBody,
    /// The stream's content type.
    pub(crate) content_type: HeaderValue,
}

/// The registry.
pub(crate) struct Streams {
    pub(super) log: Arc<dyn StreamLog>,
    pub(super) keep_generating: Duration,
    pub(super) ttl: Duration,
    pub(super) max_readers_per_stream: usize,
    /// The longest one event may be ([`Bounds::max_event`]).
    pub(super) max_event: usize,
    /// Places of generations going on with no reader.
    pub(super) kept: Arc<Semaphore>,
    /// Places of reconnected readers.
    pub(super) readers: Arc<Semaphore>,
    pub(super) live: Mutex<HashMap<StreamKey, Arc<Live>>>,
    /// Streams whose log stopped short of the answer: the last seq logged,
    /// and until when the note is kept.
    pub(super) truncated: Mutex<HashMap<StreamKey, (u64, Instant)>>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) logger: Logger,
    /// Pumps running.
    pub(super) active: watch::Sender<usize>,
    /// Raised when the shutdown grace is over: pumps end their streams.
    pub(super) stop: watch::Sender<bool>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new stream's parts, as [`Streams::start`] takes them.
pub(crate) struct NewStream {
    pub(crate) body: UpstreamBody,
    pub(crate) protocol: ProtocolKind,
    pub(crate) content_type: HeaderValue,
    pub(crate) logical_id: String,
    /// The id the client is told (numbering uses it).
    pub(crate) id: String,
    /// The name the log keeps it under (logs show its digest).
    pub(crate) key: StreamKey,
    /// Whether events carry the gateway's `id:` line.
    pub(crate) ids: bool,
    /// What becomes of comment blocks.
    pub(crate) comments: Comments,
    /// Bytes already read from `body` (its first frame).
    pub(crate) first: Bytes,
    /// The recovery layer's report of the request, read at the end for
    /// the token use.
    pub(crate) report: Option<tower_recovery::ReportHandle>,
    /// What the observer saw of the answer (whether it was proven).
    pub(crate) observed: Option<tower_recovery::ObserveHandle>,
}

impl Streams {
    pub(crate) fn new(
        log: Arc<dyn StreamLog>,
        bounds: Bounds,
        metrics: Arc<Metrics>,
        logger: Logger,
    ) -> Self {
        Streams {
            log,
            keep_generating: bounds.keep_generating,
            ttl: bounds.ttl,
            max_readers_per_stream: bounds.max_readers_per_stream,
            max_event: bounds.max_event,
            kept: Arc::new(Semaphore::new(bounds.max_kept)),
            readers: Arc::new(Semaphore::new(bounds.max_readers)),
            live: Mutex::new(HashMap::new()),
            truncated: Mutex::new(HashMap::new()),
            metrics,
            logger,
            active: watch::channel(0).0,
            stop: watch::channel(false).0,
        }
    }

    /// Pumps running now.
    pub(crate) fn active(&self) -> usize {
        *self.active.borrow()
    }

    /// Waits until no pump runs.
    pub(crate) async fn wait_idle(&self) {
        let mut rx = self.active.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Ends every running stream now (with its error event).
    pub(crate) fn stop_all(&self) {
        let _ = self.stop.send(true);
    }

    pub(super) fn live(&self, key: &StreamKey) -> Option<Arc<Live>> {
        lock(&self.live).get(key).cloned()
    }

    pub(super) fn truncated_at(&self, key: &StreamKey) -> Option<u64> {
        let now = Instant::now();
        let mut t = lock(&self.truncated);
        t.retain(|_, (_, until)| *until > now);
        t.get(key).map(|(seq, _)| *seq)
    }
}
