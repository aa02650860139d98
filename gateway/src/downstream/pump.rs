//! The task that reads one upstream answer to its end: it cuts the body
//! into events, numbers and logs each, then hands it to the first client;
//! it keeps going for absent clients within the keep-generating window and
//! its pool, and ends every short stream with the protocol's error event.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::{ErrorClass, StreamFailure, write_error_event};
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tokio::time::Instant;

use recovery_core::wire::{SseBlock, SseBlocks};

use super::numbering::{Comments, comment_lines, number};
use super::raised;
use super::registry::{
    DIRECT_CAPACITY, Live, MAX_EVENT_BYTES, NewStream, REMOTE_RECHECK, Streams, lock,
};
use crate::forward::UpstreamBody;
use crate::identity::StreamKey;
use crate::log::Entry;
use crate::log::LogError;
use crate::logs::Field;

impl Streams {
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
        self.logger.debug(
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
            kept: None,
            report: new.report,
            last_event: None,
        };
        tokio::spawn(pump.run(new.first, new.body));
        Ok(rx)
    }
}

/// Why a pump stopped reading before the upstream ended.
pub(super) enum Stop {
    /// Nobody read for the keep-generating window.
    Abandoned,
    /// The gateway's shutdown grace ran out.
    Shutdown,
    /// Neither a client nor the log can take the rest.
    Unserved,
}

/// The task that reads one upstream answer to its end.
pub(super) struct Pump {
    pub(super) streams: Arc<Streams>,
    /// The public id, for the `id:` lines.
    pub(super) id: String,
    pub(super) key: StreamKey,
    pub(super) logical_id: String,
    pub(super) protocol: ProtocolKind,
    pub(super) live: Arc<Live>,
    pub(super) direct: Option<mpsc::Sender<Bytes>>,
    pub(super) logging: bool,
    /// Whether events carry `id:` lines.
    pub(super) ids: bool,
    pub(super) comments: Comments,
    pub(super) seq: u64,
    /// A place in the pool of generations going on for nobody, held
    /// from when the last reader left.
    pub(super) kept: Option<OwnedSemaphorePermit>,
    /// The recovery layer's report, read at the end for the token use.
    pub(super) report: Option<tower_recovery::ReportHandle>,
    /// When the last event was handed on (for the time between chunks).
    pub(super) last_event: Option<Instant>,
}

impl Pump {
    pub(super) async fn run(mut self, first: Bytes, body: UpstreamBody) {
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
            self.emit(SseBlock::Event(Bytes::from(out))).await;
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
        if let Some(report) = &self.report {
            report.inspect(|r| streams.metrics.tokens(&r.generation.usage));
        }
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
        let mut framer = SseBlocks::new(MAX_EVENT_BYTES);
        let end = self.forward(&mut framer, &first).await;
        // The first bytes may be a slice of the upstream connection's read
        // buffer: kept for the stream's life, they would make its next
        // read take a second buffer.
        drop(first);
        if let Some(end) = end {
            return end;
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
                        if let Some(end) = self.forward(&mut framer, &data).await {
                            return end;
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

    /// Cuts `data` into blocks and emits each whole one; `Some` when the
    /// stream must end here (an event over the bound, nobody to take it).
    async fn forward(
        &mut self,
        framer: &mut SseBlocks,
        data: &[u8],
    ) -> Option<Result<Option<StreamFailure>, Stop>> {
        framer.push(data);
        loop {
            match framer.next_block() {
                Ok(Some(block)) => {
                    if !self.emit(block).await {
                        return Some(Err(Stop::Unserved));
                    }
                }
                Ok(None) => return None,
                Err(e) => {
                    return Some(Ok(Some(StreamFailure::new(
                        ErrorClass::Server,
                        e.to_string(),
                    ))));
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
                    ("stream", Field::Str(self.key.digest())),
                    ("events", Field::U64(self.seq)),
                ],
            );
        }
    }

    /// Numbers an event, logs it, then hands it to the first client; a
    /// comment block goes to the first client only, as
    /// [`Comments`] says. `false` when nobody can take it any more.
    async fn emit(&mut self, block: SseBlock) -> bool {
        let bytes = match block {
            SseBlock::Comment(b) => match self.comments {
                // Where the protocol's SDKs read `data:` lines only (no
                // ids: Gemini), a comment line is one they raise on.
                Comments::Drop => return self.logging || self.direct.is_some(),
                Comments::Pass if !self.ids => return self.logging || self.direct.is_some(),
                Comments::Pass => match comment_lines(&b) {
                    Some(lines) => lines,
                    None => return self.logging || self.direct.is_some(),
                },
            },
            SseBlock::Event(b) => {
                let now = Instant::now();
                if let Some(last) = self.last_event.replace(now) {
                    self.streams.metrics.output_chunk(now - last);
                }
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
