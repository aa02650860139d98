//! Resumable downstream streams: the registry of live generations, the
//! task that keeps reading upstream when the client leaves, and the
//! readers that serve a reconnect from the stream log.
//!
//! # One writer, many readers
//!
//! A streamed SSE answer gets an id and a pump task. The pump reads the
//! upstream (through the recovery layer), cuts it into whole events
//! ([`crate::sse::Framer`]), numbers them, appends each to the
//! [`StreamLog`] and only then hands it to the client that asked
//! (a bounded channel: a slow client slows the upstream read, as it would
//! without the gateway). A reconnect reads the log after its last id and
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
use http_body_util::BodyExt as _;
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::{ErrorClass, StreamFailure, write_error_event};
use std::sync::atomic::Ordering;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::time::Instant;

use crate::forward::UpstreamBody;
use crate::identity::StreamKey;
use crate::log::{Entry, LogError, StreamLog};
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::sse::{Block, Comments, Framer, comment_lines, number};

/// The longest one event may be before the stream is failed.
const MAX_EVENT_BYTES: usize = 4 << 20;
/// Events buffered between the pump and the first client.
const DIRECT_CAPACITY: usize = 32;
/// How often a generation with no place in the keep-generating pool asks
/// the log again whether a reader elsewhere still follows it.
const REMOTE_RECHECK: Duration = Duration::from_secs(5);
/// How long one log read waits for an event before it asks again.
const READ_WAIT: Duration = Duration::from_secs(15);
/// How long a reader's word that it follows a stream holds: longer than a
/// read (it is renewed before each), so the instance running the stream
/// sees a reader on another instance without a gap.
const READER_LEASE: Duration = Duration::from_secs(40);
/// Resolves once `flag` is raised (or its sender is gone).
pub(crate) async fn raised(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|s| *s).await;
}

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
struct Live {
    readers: watch::Sender<usize>,
    /// Reconnected readers now (the first client not counted).
    reconnects: std::sync::atomic::AtomicUsize,
    protocol: ProtocolKind,
    content_type: HeaderValue,
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
    log: Arc<dyn StreamLog>,
    keep_generating: Duration,
    ttl: Duration,
    max_readers_per_stream: usize,
    /// Places of generations going on with no reader.
    kept: Arc<Semaphore>,
    /// Places of reconnected readers.
    readers: Arc<Semaphore>,
    live: Mutex<HashMap<StreamKey, Arc<Live>>>,
    /// Streams whose log stopped short of the answer: the last seq logged,
    /// and until when the note is kept.
    truncated: Mutex<HashMap<StreamKey, (u64, Instant)>>,
    metrics: Arc<Metrics>,
    logger: Logger,
    /// Pumps running.
    active: watch::Sender<usize>,
    /// Raised when the shutdown grace is over: pumps end their streams.
    stop: watch::Sender<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A new stream's parts, as [`Streams::start`] takes them.
pub(crate) struct NewStream {
    pub(crate) body: UpstreamBody,
    pub(crate) protocol: ProtocolKind,
    pub(crate) content_type: HeaderValue,
    pub(crate) logical_id: String,
    pub(crate) permit: OwnedSemaphorePermit,
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

    /// Starts the pump of a new stream: the first client's channel of
    /// numbered events. Fails when the log will not open it (the caller
    /// then passes the answer through, not resumable).
    pub(crate) async fn start(
        self: &Arc<Self>,
        new: NewStream,
    ) -> Result<mpsc::Receiver<Bytes>, (NewStream, LogError)> {
        let key = new.key.clone();
        if let Err(e) = self.log.open(key.as_str()).await {
            return Err((new, e));
        }
        let (tx, rx) = mpsc::channel(DIRECT_CAPACITY);
        let live = Arc::new(Live {
            readers: watch::channel(1).0,
            reconnects: std::sync::atomic::AtomicUsize::new(0),
            protocol: new.protocol.clone(),
            content_type: new.content_type,
        });
        lock(&self.live).insert(key.clone(), Arc::clone(&live));
        self.active.send_modify(|n| *n += 1);
        self.metrics.stream_started();
        self.logger.info(
            "stream_started",
            "streaming with a resumable id",
            &[
                ("logical_id", Field::Str(&new.logical_id)),
                ("stream", Field::Str(key.digest())),
                ("protocol", Field::Str(new.protocol.name())),
            ],
        );
        let pump = Pump {
            streams: Arc::clone(self),
            id: new.id,
            key,
            logical_id: new.logical_id,
            protocol: new.protocol,
            live,
            direct: Some(tx),
            logging: true,
            ids: new.ids,
            comments: new.comments,
            seq: 0,
            slot: Some(new.permit),
            kept: None,
        };
        tokio::spawn(pump.run(new.first, new.body));
        Ok(rx)
    }

    fn live(&self, key: &StreamKey) -> Option<Arc<Live>> {
        lock(&self.live).get(key).cloned()
    }

    fn truncated_at(&self, key: &StreamKey) -> Option<u64> {
        let now = Instant::now();
        let mut t = lock(&self.truncated);
        t.retain(|_, (_, until)| *until > now);
        t.get(key).map(|(seq, _)| *seq)
    }

    /// A reconnect after `after`: `Err(LogError::Unknown)` for a stream
    /// the log does not have (never opened, or expired).
    pub(crate) async fn attach(
        self: &Arc<Self>,
        key: &StreamKey,
        after: u64,
        fallback_protocol: ProtocolKind,
    ) -> Result<Attached, AttachError> {
        let Ok(place) = Arc::clone(&self.readers).try_acquire_owned() else {
            return Err(AttachError::Busy);
        };
        let first = self
            .log
            .read(key.as_str(), after, Duration::ZERO)
            .await
            .map_err(AttachError::Log)?;
        let live = self.live(key);
        if let Some(l) = &live {
            let max = self.max_readers_per_stream;
            let taken = l
                .reconnects
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < max).then_some(n + 1)
                });
            if taken.is_err() {
                return Err(AttachError::Busy);
            }
        }
        let (protocol, content_type) = match &live {
            Some(l) => (l.protocol.clone(), l.content_type.clone()),
            None => (
                fallback_protocol,
                HeaderValue::from_static("text/event-stream"),
            ),
        };
        let guard = live.map(|l| {
            l.readers.send_modify(|n| *n += 1);
            ReaderGuard(l)
        });
        self.metrics.reconnect();
        self.logger.info(
            "downstream_reconnect",
            "serving a reconnect from the stream log",
            &[
                ("stream", Field::Str(key.digest())),
                ("after", Field::U64(after)),
            ],
        );
        let reader = Reader {
            streams: Arc::clone(self),
            key: key.clone(),
            after,
            pending: Some(first),
            protocol,
            done: false,
            local: guard,
            _place: place,
        };
        let stream = futures_util::stream::unfold(reader, |mut r| async move {
            let chunk = r.next_chunk().await?;
            Some((Ok(chunk), r))
        });
        Ok(Attached {
            body: crate::body::streaming(stream),
            content_type,
        })
    }
}

/// Counts a reconnect among the stream's readers while it lives.
struct ReaderGuard(Arc<Live>);

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.0.reconnects.fetch_sub(1, Ordering::AcqRel);
        self.0.readers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A reconnect reading the log.
struct Reader {
    streams: Arc<Streams>,
    key: StreamKey,
    after: u64,
    pending: Option<crate::log::Read>,
    protocol: ProtocolKind,
    done: bool,
    local: Option<ReaderGuard>,
    /// Its place among all reconnected readers.
    _place: OwnedSemaphorePermit,
}

impl Reader {
    /// The next bytes for the client, `None` at the end.
    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            let read = if let Some(r) = self.pending.take() {
                Ok(r)
            } else {
                // A reconnect on another instance than the one running the
                // stream says, through the log, that it reads.
                if self.local.is_none() {
                    let _ = self
                        .streams
                        .log
                        .reading(self.key.as_str(), READER_LEASE)
                        .await;
                }
                self.streams
                    .log
                    .read(self.key.as_str(), self.after, READ_WAIT)
                    .await
            };
            match read {
                Ok(read) => {
                    if let Some(last) = read.entries.last() {
                        self.after = last.seq;
                        if read.finished {
                            self.pending = Some(crate::log::Read {
                                entries: Vec::new(),
                                finished: true,
                            });
                        }
                        let mut out =
                            Vec::with_capacity(read.entries.iter().map(|e| e.event.len()).sum());
                        for e in &read.entries {
                            out.extend_from_slice(&e.event);
                        }
                        return Some(Bytes::from(out));
                    }
                    if read.finished {
                        self.done = true;
                        let short = self
                            .streams
                            .truncated_at(&self.key)
                            .is_some_and(|at| self.after >= at);
                        if short {
                            return Some(self.error(
                                "this stream outgrew the gateway's stream log; its rest cannot be replayed",
                            ));
                        }
                        return None;
                    }
                }
                Err(e) => {
                    self.done = true;
                    let text = match e {
                        LogError::Unknown => {
                            "the stream expired from the gateway's log before it finished"
                                .to_owned()
                        }
                        other => format!("the gateway's stream log failed: {other}"),
                    };
                    return Some(self.error(&text));
                }
            }
        }
    }

    fn error(&self, message: &str) -> Bytes {
        let mut out = Vec::new();
        write_error_event(
            &self.protocol,
            &StreamFailure::new(ErrorClass::Server, message),
            &mut out,
        );
        Bytes::from(out)
    }
}

/// Why a pump stopped reading before the upstream ended.
enum Stop {
    /// Nobody read for the keep-generating window.
    Abandoned,
    /// The gateway's shutdown grace ran out.
    Shutdown,
    /// Neither a client nor the log can take the rest.
    Unserved,
}

/// The task that reads one upstream answer to its end.
struct Pump {
    streams: Arc<Streams>,
    /// The public id, for the `id:` lines.
    id: String,
    key: StreamKey,
    logical_id: String,
    protocol: ProtocolKind,
    live: Arc<Live>,
    direct: Option<mpsc::Sender<Bytes>>,
    logging: bool,
    /// Whether events carry `id:` lines.
    ids: bool,
    comments: Comments,
    seq: u64,
    /// The first client's place under `--max-streams`, held until it
    /// leaves.
    slot: Option<OwnedSemaphorePermit>,
    /// A place in the pool of generations going on for nobody, held
    /// from when the last reader left.
    kept: Option<OwnedSemaphorePermit>,
}

impl Pump {
    async fn run(mut self, first: Bytes, body: UpstreamBody) {
        let outcome = self.read(first, body).await;
        let streams = Arc::clone(&self.streams);
        let (event, msg, failure) = match outcome {
            Ok(None) => ("stream_finished", "stream finished", None),
            Ok(Some(f)) => ("stream_failed", "stream ended with an error event", Some(f)),
            Err(Stop::Abandoned) => (
                "stream_abandoned",
                "no reader within the keep-generating window; upstream read cancelled",
                Some(StreamFailure::new(
                    ErrorClass::Server,
                    "generation cancelled: no client read this stream within the gateway's keep-generating window",
                )),
            ),
            Err(Stop::Shutdown) => (
                "stream_stopped",
                "gateway shutting down; upstream read cancelled",
                Some(StreamFailure::new(
                    ErrorClass::Overloaded,
                    "the gateway shut down before the stream finished",
                )),
            ),
            Err(Stop::Unserved) => (
                "stream_unserved",
                "no client and no log for the rest; upstream read cancelled",
                None,
            ),
        };
        if let Some(f) = failure {
            let mut out = Vec::new();
            write_error_event(&self.protocol, &f, &mut out);
            self.emit(Block::Event(Bytes::from(out))).await;
        }
        if let Err(e) = streams.log.finish(self.key.as_str()).await {
            streams.logger.warn(
                "stream_log_error",
                "the stream log could not mark the stream finished",
                &[
                    ("stream", Field::Str(self.key.digest())),
                    ("error", Field::Str(&e.to_string())),
                ],
            );
        }
        streams.logger.info(
            event,
            msg,
            &[
                ("logical_id", Field::Str(&self.logical_id)),
                ("stream", Field::Str(self.key.digest())),
                ("events", Field::U64(self.seq)),
            ],
        );
        lock(&streams.live).remove(&self.key);
        streams.metrics.stream_ended();
        // Dropping the channel ends the first client's body.
        drop(self.direct.take());
        streams.active.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Reads the upstream to its end: `Ok(None)` finished, `Ok(Some)` the
    /// failure the recovery layer could not hide, `Err` stopped early.
    async fn read(
        &mut self,
        first: Bytes,
        mut body: UpstreamBody,
    ) -> Result<Option<StreamFailure>, Stop> {
        let mut framer = Framer::new(MAX_EVENT_BYTES);
        framer.push(&first);
        loop {
            match framer.next_block() {
                Ok(Some(block)) => {
                    if !self.emit(block).await {
                        return Err(Stop::Unserved);
                    }
                }
                Ok(None) => break,
                Err(e) => return Ok(Some(StreamFailure::new(ErrorClass::Server, e.to_string()))),
            }
        }
        let mut readers = self.live.readers.subscribe();
        let mut stop = self.streams.stop.subscribe();
        let keep = self.streams.keep_generating;
        let mut idle_since: Option<Instant> = None;
        let mut remote_reader = false;
        loop {
            let alone = *readers.borrow_and_update() == 0;
            match (alone, idle_since) {
                (true, None) => {
                    idle_since = Some(Instant::now());
                    if self.kept.is_none() {
                        self.kept = Arc::clone(&self.streams.kept).try_acquire_owned().ok();
                    }
                }
                (false, Some(_)) => idle_since = None,
                _ => {}
            }
            // Without a place in the pool, a generation nobody reads
            // stops at once.
            let window = match (&self.kept, remote_reader) {
                (Some(_), _) => keep,
                (None, true) => REMOTE_RECHECK,
                (None, false) => Duration::ZERO,
            };
            let deadline = idle_since.map(|t| t + window);
            let direct = self.direct.clone();
            tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => {
                        let Ok(data) = frame.into_data() else { continue };
                        framer.push(&data);
                        loop {
                            match framer.next_block() {
                                Ok(Some(block)) => {
                                    if !self.emit(block).await {
                                        return Err(Stop::Unserved);
                                    }
                                }
                                Ok(None) => break,
                                Err(e) => {
                                    return Ok(Some(StreamFailure::new(ErrorClass::Server, e.to_string())));
                                }
                            }
                        }
                    }
                    Some(Err(e)) => {
                        if let Some(block) = framer.finish() {
                            // An event cut short is not the provider's: drop
                            // it rather than hand out half a JSON object.
                            drop(block);
                        }
                        return Ok(Some(StreamFailure::of_outcome(e.outcome(), e.report().last_status())));
                    }
                    None => {
                        if let Some(block) = framer.finish() {
                            self.emit(block).await;
                        }
                        return Ok(None);
                    }
                },
                () = async {
                    match direct {
                        Some(tx) => tx.closed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    self.client_left();
                }
                changed = readers.changed() => {
                    if changed.is_err() {
                        return Err(Stop::Unserved);
                    }
                }
                () = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => {
                    // Nobody read here for the window; a reader on another
                    // instance sharing the log keeps it going.
                    if self.streams.log.has_reader(self.key.as_str()).await == Ok(true) {
                        idle_since = Some(Instant::now());
                        remote_reader = true;
                        continue;
                    }
                    return Err(Stop::Abandoned);
                }
                () = raised(&mut stop) => {
                    return Err(Stop::Shutdown);
                }
            }
        }
    }

    fn client_left(&mut self) {
        if self.direct.take().is_some() {
            self.slot = None;
            self.live.readers.send_modify(|n| *n = n.saturating_sub(1));
            self.streams.logger.info(
                "downstream_disconnected",
                "the client left; the generation goes on",
                &[
                    ("logical_id", Field::Str(&self.logical_id)),
                    ("stream", Field::Str(self.key.digest())),
                    ("events", Field::U64(self.seq)),
                ],
            );
        }
    }

    /// Numbers an event, logs it, then hands it to the first client; a
    /// comment block goes to the first client only, as
    /// [`Comments`] says. `false` when nobody can take it any more.
    async fn emit(&mut self, block: Block) -> bool {
        let bytes = match block {
            Block::Comment(b) => match self.comments {
                Comments::Drop => return self.logging || self.direct.is_some(),
                // Without ids the block dispatches nothing in any reader:
                // it goes as it came.
                Comments::Pass if !self.ids => b,
                Comments::Pass => match comment_lines(&b) {
                    Some(lines) => lines,
                    None => return self.logging || self.direct.is_some(),
                },
            },
            Block::Event(b) => {
                self.seq += 1;
                let bytes = if self.ids {
                    number(&b, &self.id, self.seq)
                } else {
                    b
                };
                self.log(bytes.clone()).await;
                bytes
            }
        };
        if let Some(tx) = &self.direct
            && tx.send(bytes).await.is_err()
        {
            self.client_left();
        }
        self.logging || self.direct.is_some()
    }

    /// Appends event `self.seq` to the log while the log takes it.
    async fn log(&mut self, event: Bytes) {
        if !self.logging {
            return;
        }
        let entry = Entry {
            seq: self.seq,
            event,
        };
        if let Err(e) = self.streams.log.append(self.key.as_str(), entry).await {
            self.logging = false;
            let until = Instant::now() + self.streams.ttl;
            lock(&self.streams.truncated).insert(self.key.clone(), (self.seq - 1, until));
            self.streams.logger.warn(
                "stream_log_refused",
                "the stream log refused an event; the stream is no longer resumable",
                &[
                    ("stream", Field::Str(self.key.digest())),
                    ("seq", Field::U64(self.seq)),
                    ("error", Field::Str(&e.to_string())),
                ],
            );
        }
    }
}
