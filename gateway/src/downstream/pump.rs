//! The task that reads one upstream answer to its end: it cuts the body
//! into events, numbers and logs each, then hands it to the first client;
//! it keeps going for absent clients within the keep-generating window and
//! its pool, and ends every short stream with the protocol's error event.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt as _;
use http_body_util::BodyExt as _;
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::{ErrorClass, StreamFailure, write_error_event};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;

use recovery_core::wire::{SseBlock, SseBlocks};

use super::direct::{DirectTx, direct};
use super::first_client::{FirstClient, Pumping};
use super::numbering::{Comments, comment_lines, number};
use super::raised;
use super::registry::{DIRECT_CAPACITY, Handed, Live, NewStream, REMOTE_RECHECK, Streams, lock};
use crate::forward::UpstreamBody;
use crate::identity::StreamKey;
use crate::log::Entry;
use crate::log::LogError;
use crate::logs::Field;

impl Streams {
    /// Starts the pump of a new stream: the first client's body, which
    /// drives the pump ([`FirstClient`]). Fails when the log will not open
    /// it (the caller then passes the answer through, not resumable).
    pub(crate) async fn start(
        self: &Arc<Self>,
        new: NewStream,
    ) -> Result<FirstClient, (NewStream, LogError)> {
        let key = new.key.clone();
        if let Err(e) = self.log.open(key.as_str()).await {
            return Err((new, e));
        }
        let (tx, rx) = direct(DIRECT_CAPACITY);
        let live = Arc::new(Live {
            readers: watch::channel(1).0,
            reconnects: std::sync::atomic::AtomicUsize::new(0),
            protocol: new.protocol.clone(),
            content_type: new.content_type,
        });
        let mut pump = Pump {
            streams: Arc::clone(self),
            id: new.id,
            key,
            logical_id: new.logical_id,
            protocol: new.protocol,
            live: Arc::clone(&live),
            direct: Some(tx),
            logging: true,
            ids: new.ids,
            comments: new.comments,
            seq: 0,
            kept: None,
            report: new.report,
            observed: new.observed,
            last_event: None,
        };
        // The first bytes are handed on here, before the response: its
        // head leaves with them. Nothing is registered yet, so a client
        // that leaves meanwhile leaves nothing behind but the log's entry,
        // which expires.
        let mut framer = SseBlocks::new(self.max_event);
        let mut body = new.body;
        let end = pump.forward(&mut framer, new.first, &mut body).await;
        lock(&self.live).insert(pump.key.clone(), live);
        self.active.send_modify(|n| *n += 1);
        self.metrics.stream_started();
        self.logger.debug(
            "stream_started",
            "streaming with a resumable id",
            &[
                ("logical_id", Field::Str(&pump.logical_id)),
                ("stream", Field::Str(pump.key.digest())),
                ("protocol", Field::Str(pump.protocol.name())),
            ],
        );
        let pumping: Pumping = match end {
            // The first read ended the stream: its closing work only.
            Some(end) => {
                drop(body);
                let mut pump = pump;
                Box::pin(async move { pump.finish(end).await })
            }
            None => Box::pin(pump.run(framer, body)),
        };
        Ok(FirstClient::new(rx, pumping))
    }
}

/// What woke a pump waiting for its upstream.
enum Woken {
    /// The upstream's next bytes.
    Data(Bytes),
    /// The failure the recovery layer could not hide.
    Failed(StreamFailure),
    /// The upstream's end.
    Ended,
    /// The first client left.
    ClientLeft,
    /// The count of readers changed (`false`: nobody can count them any
    /// more).
    Readers(bool),
    /// Nobody read here for the keep-generating window.
    WindowEnded,
    /// The gateway's shutdown grace ran out.
    Shutdown,
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
    pub(super) direct: Option<DirectTx>,
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
    /// The observer's view of the answer: past terminal proof, the end of
    /// the upstream body is close behind.
    pub(super) observed: Option<tower_recovery::ObserveHandle>,
    /// When the last event was handed on (for the time between chunks).
    pub(super) last_event: Option<Instant>,
}

impl Pump {
    /// Reads the rest of the upstream answer, then ends the stream.
    ///
    /// An async block rather than an `async fn`: a block keeps what it
    /// captures in one place, where an `async fn` would also keep a moved
    /// copy of its arguments, and a held stream pays for every byte of
    /// this future for as long as it is held.
    #[allow(clippy::manual_async_fn)]
    fn run(
        mut self,
        mut framer: SseBlocks,
        mut body: UpstreamBody,
    ) -> impl Future<Output = ()> + Send {
        async move {
            let outcome = self.read(&mut framer, &mut body).await;
            // The upstream read is over (a stop cancels it here).
            drop(body);
            drop(framer);
            self.finish(outcome).await;
        }
    }

    /// Ends the stream as `outcome` says: the protocol's error event for
    /// a stream cut short, the log's end, the log line and the counts.
    /// (Borrowing the pump, its future holds no copy of it.)
    async fn finish(&mut self, outcome: Result<Option<StreamFailure>, Stop>) {
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
            let mut batch = Batch::default();
            self.add(SseBlock::Event(Bytes::from(out)), &mut batch);
            self.hand_on(batch, true).await;
        }
        // Dropping the queue ends the first client's body: at once, so
        // that an end read with the last events leaves in their write.
        drop(self.direct.take());
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
        streams.active.send_modify(|n| *n = n.saturating_sub(1));
    }

    /// Reads the upstream to its end after the first bytes: `Ok(None)`
    /// finished, `Ok(Some)` the failure the recovery layer could not hide,
    /// `Err` stopped early.
    async fn read(
        &mut self,
        framer: &mut SseBlocks,
        body: &mut UpstreamBody,
    ) -> Result<Option<StreamFailure>, Stop> {
        let mut readers = self.live.readers.subscribe();
        let mut stop = self.streams.stop.subscribe();
        let keep = self.streams.keep_generating;
        let mut idle_since: Option<Instant> = None;
        let mut remote_reader = false;
        loop {
            // The wait for the next read may be long: no room kept for it.
            framer.release_idle();
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
            // Boxed, and only while nobody reads: a timer inline would
            // weigh on the future of every held stream.
            let window_ends = idle_since.map(|t| Box::pin(tokio::time::sleep_until(t + window)));
            let closed = self.direct.as_ref().map(DirectTx::closed);
            // The wait gives what woke it, and every await after it is
            // outside the `select!`: the waiting futures and the one that
            // handles what came share the room of this future instead of
            // adding up (a held stream keeps every byte of it).
            let woken = tokio::select! {
                frame = body.frame() => match frame {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => Woken::Data(data),
                        Err(_) => continue,
                    },
                    Some(Err(e)) => Woken::Failed(Self::failed(framer, &e)),
                    None => Woken::Ended,
                },
                () = async {
                    match closed {
                        Some(closed) => closed.wait().await,
                        None => std::future::pending().await,
                    }
                } => Woken::ClientLeft,
                changed = readers.changed() => Woken::Readers(changed.is_ok()),
                () = async {
                    match window_ends {
                        Some(sleep) => sleep.await,
                        None => std::future::pending().await,
                    }
                } => Woken::WindowEnded,
                () = raised(&mut stop) => Woken::Shutdown,
            };
            match woken {
                Woken::Data(data) => {
                    if let Some(end) = self.forward(framer, data, body).await {
                        return end;
                    }
                }
                Woken::Failed(failure) => {
                    let end = Ok(Some(failure));
                    self.hand_on(Batch::default(), ends_here(&end)).await;
                    return end;
                }
                Woken::Ended => {
                    let mut batch = Batch::default();
                    self.ended(framer, &mut batch);
                    self.hand_on(batch, true).await;
                    return Ok(None);
                }
                Woken::ClientLeft => self.client_left(),
                Woken::Readers(true) => {}
                Woken::Readers(false) => return Err(Stop::Unserved),
                Woken::WindowEnded => {
                    // Nobody read here for the window; a reader on another
                    // instance sharing the log keeps it going.
                    if self.streams.log.has_reader(self.key.as_str()).await != Ok(true) {
                        return Err(Stop::Abandoned);
                    }
                    idle_since = Some(Instant::now());
                    remote_reader = true;
                }
                Woken::Shutdown => return Err(Stop::Shutdown),
            }
        }
    }

    /// Cuts `data`, and the frames the upstream has ready after it, into
    /// blocks and hands the whole ones on together: the events of one
    /// upstream read leave in one write, and an end that is ready with
    /// them ends the stream here. `Some` when the stream must end here
    /// (the upstream ended or failed, an event over the bound, nobody to
    /// take it).
    async fn forward(
        &mut self,
        framer: &mut SseBlocks,
        data: Bytes,
        body: &mut UpstreamBody,
    ) -> Option<Result<Option<StreamFailure>, Stop>> {
        let mut batch = Batch::for_read(&data, self.ids.then_some((self.id.len(), self.seq)));
        let mut end = self.cut(framer, Some(data), body, &mut batch);
        if end.is_none() && batch.out.len() < BATCH_BYTES && self.proven() {
            // Past terminal proof the upstream's end is close behind, most
            // often in the bytes its connection's task holds already. One
            // turn of the runtime lets that task hand it over, so the last
            // events and the end of the client's body leave in one write
            // (else a write of its own, and the client waits for it). Once
            // per read: an upstream that keeps the body open after its
            // proof costs that one turn.
            tokio::task::yield_now().await;
            end = self.cut(framer, None, body, &mut batch);
        }
        let last = end.as_ref().is_some_and(ends_here);
        if !self.hand_on(batch, last).await {
            return Some(Err(Stop::Unserved));
        }
        end
    }

    /// Cuts `data`, then the frames the upstream has ready, into `batch`
    /// until nothing more is ready or the batch is full; `Some` when the
    /// stream ends here. Never waits: what is ready now costs no wait,
    /// polled once (the read loop waits, with its other conditions). Not
    /// part of [`Pump::forward`]'s future, whose every byte a held stream
    /// keeps.
    fn cut(
        &mut self,
        framer: &mut SseBlocks,
        mut data: Option<Bytes>,
        body: &mut UpstreamBody,
        batch: &mut Batch,
    ) -> Option<Result<Option<StreamFailure>, Stop>> {
        loop {
            // The first bytes may be a slice of the upstream connection's
            // read buffer: dropped once cut, since kept for the stream's
            // life they would make its next read take a second buffer.
            if let Some(data) = data.take() {
                framer.push(&data);
            }
            loop {
                match framer.next_block() {
                    Ok(Some(block)) => self.add(block, batch),
                    Ok(None) => break,
                    Err(e) => {
                        let f = StreamFailure::new(ErrorClass::Server, e.to_string());
                        return Some(Ok(Some(f)));
                    }
                }
            }
            // A batch stops growing at its bound: a fast upstream is
            // handed on in pieces, never held whole.
            if batch.out.len() >= BATCH_BYTES {
                return None;
            }
            match body.frame().now_or_never() {
                None => return None,
                Some(Some(Ok(frame))) => data = Some(frame.into_data().unwrap_or_default()),
                Some(Some(Err(e))) => return Some(Ok(Some(Self::failed(framer, &e)))),
                Some(None) => {
                    self.ended(framer, batch);
                    return Some(Ok(None));
                }
            }
        }
    }

    /// The upstream ended: the block left in `framer` (an event without
    /// its blank line) joins `batch`.
    fn ended(&mut self, framer: &mut SseBlocks, batch: &mut Batch) {
        if let Some(block) = framer.finish() {
            self.add(block, batch);
        }
    }

    /// The upstream failed with `e`, the failure the recovery layer could
    /// not hide.
    fn failed(framer: &mut SseBlocks, e: &recovery_core::RecoveryError) -> StreamFailure {
        // An event cut short is not the provider's: drop it rather than
        // hand out half a JSON object.
        drop(framer.finish());
        StreamFailure::of_outcome(e.outcome(), e.report().last_status())
    }

    /// Whether the observer saw the answer's terminal proof.
    fn proven(&self) -> bool {
        self.observed
            .as_ref()
            .is_some_and(tower_recovery::ObserveHandle::terminal_seen)
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

    /// Adds a block to `batch`: an event numbered (and timed), a comment
    /// block as [`Comments`] says.
    fn add(&mut self, block: SseBlock, batch: &mut Batch) {
        match block {
            SseBlock::Comment(b) => match self.comments {
                // Where the protocol's SDKs read `data:` lines only (no
                // ids: Gemini), a comment line is one they raise on.
                Comments::Drop => {}
                Comments::Pass if !self.ids => {}
                Comments::Pass => comment_lines(&b, &mut batch.out),
            },
            SseBlock::Event(b) => {
                let now = Instant::now();
                if let Some(last) = self.last_event.replace(now) {
                    self.streams.metrics.output_chunk(now - last);
                }
                self.seq += 1;
                let start = batch.out.len();
                if self.ids {
                    number(&b, &self.id, self.seq, &mut batch.out);
                } else {
                    batch.out.extend_from_slice(&b);
                }
                batch.events.push((self.seq, start..batch.out.len()));
            }
        }
    }

    /// Logs the events of `batch` in one append, then hands the whole
    /// batch (comments included) to the first client in one message, so
    /// the events of one upstream read leave in one write; with `last`,
    /// the client's body ends with it. `false` when nobody can take them
    /// any more.
    async fn hand_on(&mut self, batch: Batch, last: bool) -> bool {
        if !batch.out.is_empty() {
            let bytes = batch.out.freeze();
            if self.logging && !batch.events.is_empty() {
                let entries: Vec<Entry> = batch
                    .events
                    .into_iter()
                    .map(|(seq, at)| Entry {
                        seq,
                        event: bytes.slice(at),
                    })
                    .collect();
                self.log(&entries).await;
            }
            if let Some(tx) = &self.direct
                && tx.send(Handed { bytes, last }).await.is_err()
            {
                self.client_left();
            }
        }
        self.logging || self.direct.is_some()
    }

    /// Appends `entries` to the log while the log takes them.
    async fn log(&mut self, entries: &[Entry]) {
        let Err(e) = self.streams.log.append(self.key.as_str(), entries).await else {
            return;
        };
        let first = entries.first().map_or(self.seq, |e| e.seq);
        self.logging = false;
        let until = Instant::now() + self.streams.ttl;
        lock(&self.streams.truncated).insert(self.key.clone(), (first - 1, until));
        self.streams.logger.warn(
            "stream_log_refused",
            "the stream log refused an event; the stream is no longer resumable",
            &[
                ("stream", Field::Str(self.key.digest())),
                ("seq", Field::U64(first)),
                ("error", Field::Str(&e.to_string())),
            ],
        );
    }
}

/// Whether a read that ends the stream with `end` is the last thing its
/// client gets: so when the upstream finished (a failure is followed by
/// the protocol's error event).
fn ends_here(end: &Result<Option<StreamFailure>, Stop>) -> bool {
    matches!(end, Ok(None))
}

/// The most a batch takes before it is handed on: frames the upstream has
/// ready after it wait for the next one.
const BATCH_BYTES: usize = 64 << 10;

/// What blocks of one upstream read hand on: their bytes back to back
/// (numbered events, comment lines), and where each event lies in them
/// with its number, for the log.
#[derive(Default)]
struct Batch {
    out: BytesMut,
    events: Vec<(u64, std::ops::Range<usize>)>,
}

impl Batch {
    /// Room for the read `data` and, with `ids` (the stream id's length
    /// and the last sequence number given), an `id:` line for each event
    /// it ends. The log keeps the batch's buffer as long as it keeps its
    /// events, so room to spare stays allocated with them; an event the
    /// read does not end (closed at the upstream's end) reallocates.
    fn for_read(data: &[u8], ids: Option<(usize, u64)>) -> Self {
        let numbered = ids.map_or(0, |(id, seq)| {
            let events = memchr::memmem::find_iter(data, b"\n\n").count()
                + memchr::memmem::find_iter(data, b"\r\n\r\n").count();
            let last = seq.saturating_add(events as u64);
            let digits = recovery_core::text::decimal(last, &mut [0; 20]).len();
            // `id: <stream>:<seq>` and a line end of up to two bytes.
            events * (4 + id + 1 + digits + 2)
        });
        Batch {
            out: BytesMut::with_capacity(data.len() + numbered),
            events: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use recovery_core::wire::{SseBlock, SseBlocks};

    use super::*;

    /// Numbers the events of `read` into a batch sized for it, as the pump
    /// does; the batch's capacity before and after.
    fn numbered(read: &[u8], id: &str) -> (usize, usize, usize) {
        let mut batch = Batch::for_read(read, Some((id.len(), 0)));
        let before = batch.out.capacity();
        let mut framer = SseBlocks::new(1 << 20);
        framer.push(read);
        let mut seq = 0;
        while let Some(block) = framer.next_block().unwrap() {
            if let SseBlock::Event(event) = block {
                seq += 1;
                number(&event, id, seq, &mut batch.out);
            }
        }
        (before, batch.out.capacity(), batch.out.len())
    }

    #[test]
    fn a_batch_has_room_for_its_id_lines_and_little_more() {
        let id = crate::identity::new_stream_id();
        for read in [
            &b"data: {\"a\":1}\n\n"[..],
            b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\ndata: [DONE]\n\n",
            b"event: x\r\ndata: 1\r\n\r\nevent: y\r\ndata: 2\r\n\r\n",
        ] {
            let (before, after, len) = numbered(read, &id);
            assert_eq!(before, after, "numbering {read:?} grew the batch");
            // The log keeps the batch's buffer: a byte or two spare per
            // event at most (a line end of one byte where two were room).
            let events = memchr::memmem::find_iter(read, b"\n\n").count()
                + memchr::memmem::find_iter(read, b"\r\n\r\n").count();
            assert!(
                after - len <= 2 * events,
                "{} spare bytes for {read:?}",
                after - len
            );
        }
    }
}
