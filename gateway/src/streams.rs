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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::BodyExt as _;
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::{ErrorClass, StreamFailure, write_error_event};
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tokio::time::Instant;

use crate::forward::UpstreamBody;
use crate::log::{Entry, LogError, StreamLog};
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::sse::{Block, Framer, number};

/// The longest one event may be before the stream is failed.
const MAX_EVENT_BYTES: usize = 4 << 20;
/// Events buffered between the pump and the first client.
const DIRECT_CAPACITY: usize = 32;
/// How long one log read waits for an event before it asks again.
const READ_WAIT: Duration = Duration::from_secs(15);
/// How long a reader's word that it follows a stream holds: longer than a
/// read (it is renewed before each), so the instance running the stream
/// sees a reader on another instance without a gap.
const READER_LEASE: Duration = Duration::from_secs(40);
/// Random bytes in a stream id: 128 bits.
const ID_BYTES: usize = 16;
/// Length of an id: 16 bytes in unpadded base64url.
const ID_LEN: usize = 22;

/// A new stream id: 128 random bits, URL-safe.
pub fn new_stream_id() -> String {
    let mut raw = [0u8; ID_BYTES];
    if getrandom::fill(&mut raw).is_err() {
        // No system randomness: the process cannot make unguessable ids.
        // Mix the clock and a counter so ids stay unique; they are then
        // guessable, which only the process's environment can fix.
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        raw[..8].copy_from_slice(&(t as u64).to_le_bytes());
        raw[8..].copy_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    }
    base64url(&raw)
}

fn base64url(raw: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(raw.len().div_ceil(3) * 4);
    for chunk in raw.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
        }
    }
    out
}

/// Whether `s` has the shape of a stream id (so a `Last-Event-ID` that
/// does not is the upstream's business).
pub fn looks_like_stream_id(s: &str) -> bool {
    s.len() == ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Resolves once `flag` is raised (or its sender is gone).
pub(crate) async fn raised(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|s| *s).await;
}

/// A stream running on this instance.
struct Live {
    readers: watch::Sender<usize>,
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
    live: Mutex<HashMap<String, Arc<Live>>>,
    /// Streams whose log stopped short of the answer: the last seq logged,
    /// and until when the note is kept.
    truncated: Mutex<HashMap<String, (u64, Instant)>>,
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
}

impl Streams {
    pub(crate) fn new(
        log: Arc<dyn StreamLog>,
        keep_generating: Duration,
        ttl: Duration,
        metrics: Arc<Metrics>,
        logger: Logger,
    ) -> Self {
        Streams {
            log,
            keep_generating,
            ttl,
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

    /// Starts the pump of a new stream: its id and the first client's
    /// channel of numbered events. Fails when the log will not open it
    /// (the caller then passes the answer through, not resumable).
    pub(crate) async fn start(
        self: &Arc<Self>,
        new: NewStream,
    ) -> Result<(String, mpsc::Receiver<Bytes>), (NewStream, LogError)> {
        let id = new_stream_id();
        if let Err(e) = self.log.open(&id).await {
            return Err((new, e));
        }
        let (tx, rx) = mpsc::channel(DIRECT_CAPACITY);
        let live = Arc::new(Live {
            readers: watch::channel(1).0,
            protocol: new.protocol.clone(),
            content_type: new.content_type,
        });
        lock(&self.live).insert(id.clone(), Arc::clone(&live));
        self.active.send_modify(|n| *n += 1);
        self.metrics.stream_started();
        self.logger.info(
            "stream_started",
            "streaming with a resumable id",
            &[
                ("logical_id", Field::Str(&new.logical_id)),
                ("stream_id", Field::Str(&id)),
                ("protocol", Field::Str(new.protocol.name())),
            ],
        );
        let pump = Pump {
            streams: Arc::clone(self),
            id: id.clone(),
            logical_id: new.logical_id,
            protocol: new.protocol,
            live,
            direct: Some(tx),
            logging: true,
            seq: 0,
            _permit: new.permit,
        };
        tokio::spawn(pump.run(new.body));
        Ok((id, rx))
    }

    fn live(&self, id: &str) -> Option<Arc<Live>> {
        lock(&self.live).get(id).cloned()
    }

    fn truncated_at(&self, id: &str) -> Option<u64> {
        let now = Instant::now();
        let mut t = lock(&self.truncated);
        t.retain(|_, (_, until)| *until > now);
        t.get(id).map(|(seq, _)| *seq)
    }

    /// A reconnect after `after`: `Err(LogError::Unknown)` for a stream
    /// the log does not have (never opened, or expired).
    pub(crate) async fn attach(
        self: &Arc<Self>,
        id: &str,
        after: u64,
        fallback_protocol: ProtocolKind,
    ) -> Result<Attached, LogError> {
        let first = self.log.read(id, after, Duration::ZERO).await?;
        let live = self.live(id);
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
            &[("stream_id", Field::Str(id)), ("after", Field::U64(after))],
        );
        let reader = Reader {
            streams: Arc::clone(self),
            id: id.to_owned(),
            after,
            pending: Some(first),
            protocol,
            done: false,
            local: guard,
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
        self.0.readers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A reconnect reading the log.
struct Reader {
    streams: Arc<Streams>,
    id: String,
    after: u64,
    pending: Option<crate::log::Read>,
    protocol: ProtocolKind,
    done: bool,
    local: Option<ReaderGuard>,
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
                    let _ = self.streams.log.reading(&self.id, READER_LEASE).await;
                }
                self.streams.log.read(&self.id, self.after, READ_WAIT).await
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
                            .truncated_at(&self.id)
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
    id: String,
    logical_id: String,
    protocol: ProtocolKind,
    live: Arc<Live>,
    direct: Option<mpsc::Sender<Bytes>>,
    logging: bool,
    seq: u64,
    /// The stream's place under `--max-streams`, held to its end.
    _permit: OwnedSemaphorePermit,
}

impl Pump {
    async fn run(mut self, body: UpstreamBody) {
        let outcome = self.read(body).await;
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
        if let Err(e) = streams.log.finish(&self.id).await {
            streams.logger.warn(
                "stream_log_error",
                "the stream log could not mark the stream finished",
                &[
                    ("stream_id", Field::Str(&self.id)),
                    ("error", Field::Str(&e.to_string())),
                ],
            );
        }
        streams.logger.info(
            event,
            msg,
            &[
                ("logical_id", Field::Str(&self.logical_id)),
                ("stream_id", Field::Str(&self.id)),
                ("events", Field::U64(self.seq)),
            ],
        );
        lock(&streams.live).remove(&self.id);
        streams.metrics.stream_ended();
        // Dropping the channel ends the first client's body.
        drop(self.direct.take());
        streams.active.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Reads the upstream to its end: `Ok(None)` finished, `Ok(Some)` the
    /// failure the recovery layer could not hide, `Err` stopped early.
    async fn read(&mut self, mut body: UpstreamBody) -> Result<Option<StreamFailure>, Stop> {
        let mut framer = Framer::new(MAX_EVENT_BYTES);
        let mut readers = self.live.readers.subscribe();
        let mut stop = self.streams.stop.subscribe();
        let keep = self.streams.keep_generating;
        let mut idle_since: Option<Instant> = None;
        loop {
            let alone = *readers.borrow_and_update() == 0;
            match (alone, idle_since) {
                (true, None) => idle_since = Some(Instant::now()),
                (false, Some(_)) => idle_since = None,
                _ => {}
            }
            let deadline = idle_since.map(|t| t + keep);
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
                    if self.streams.log.has_reader(&self.id).await == Ok(true) {
                        idle_since = Some(Instant::now());
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
            self.live.readers.send_modify(|n| *n = n.saturating_sub(1));
            self.streams.logger.info(
                "downstream_disconnected",
                "the client left; the generation goes on",
                &[
                    ("logical_id", Field::Str(&self.logical_id)),
                    ("stream_id", Field::Str(&self.id)),
                    ("events", Field::U64(self.seq)),
                ],
            );
        }
    }

    /// Numbers `block`, logs it, then hands it to the first client.
    /// `false` when nobody can take it any more.
    async fn emit(&mut self, block: Block) -> bool {
        self.seq += 1;
        let bytes = match &block {
            Block::Event(b) => number(b, &self.id, self.seq),
            Block::Comment(b) => b.clone(),
        };
        if self.logging {
            let entry = Entry {
                seq: self.seq,
                event: bytes.clone(),
            };
            if let Err(e) = self.streams.log.append(&self.id, entry).await {
                self.logging = false;
                let until = Instant::now() + self.streams.ttl;
                lock(&self.streams.truncated).insert(self.id.clone(), (self.seq - 1, until));
                self.streams.logger.warn(
                    "stream_log_refused",
                    "the stream log refused an event; the stream is no longer resumable",
                    &[
                        ("stream_id", Field::Str(&self.id)),
                        ("seq", Field::U64(self.seq)),
                        ("error", Field::Str(&e.to_string())),
                    ],
                );
            }
        }
        if let Some(tx) = &self.direct
            && tx.send(bytes).await.is_err()
        {
            self.client_left();
        }
        self.logging || self.direct.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_url_safe_and_distinct() {
        let a = new_stream_id();
        let b = new_stream_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), ID_LEN);
        assert!(looks_like_stream_id(&a), "{a}");
        assert!(!looks_like_stream_id("short"));
        assert_eq!(base64url(b"\xff\xff\xff"), "____");
        assert_eq!(base64url(b"Ma"), "TWE");
    }
}
