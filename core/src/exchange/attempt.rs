//! One send and its answer, from the send to the end of its body: the
//! phase it is in, where its evidence comes from (the machine's own decoder
//! or an outside one), the gate that cuts it into events when a resume may
//! apply, and what it showed. Its inputs (a chunk, the end, a read error,
//! its timers) are judged here; what they mean for the request comes back
//! as a [`Step`].

use std::time::Duration;

use super::ctx::Ctx;
use super::decoded::{Decoded, Source};
use super::gate::Gate;
use super::head::ErrorHead;
use super::io::Chunk;
use super::outbox::{Holds, Outbox};
use super::timers::{Timer, Timers, Watching};
use crate::continuation::splice::Splice;
use crate::failure::{Failure, FailureKind, Phase as WirePhase, Stall, Unfinished};
use crate::lifecycle::CommitTrigger;
use crate::observer::{EndOfStream, StreamObserver};
use crate::progress::{Generation, Progress, Proof, ResumeCursor, Terminal};
use crate::protocol::BodyForm;
use crate::timing::Instant;
use crate::wire::{Limits, ProtocolViolation};

/// Where the attempt is.
#[derive(Debug)]
pub(super) enum Phase {
    /// On its way: connecting, writing.
    Sending,
    /// Sent; no head yet.
    AwaitingHead,
    /// Reading (a capped part of) an error body.
    ErrorBody(Box<ErrorHead>),
    /// Reading a successful body, before or after commit.
    Streaming,
    /// Completed (strong proof was handed out); the rest of the body passes
    /// through until it ends or is silent for
    /// [`DRAIN_GRACE`](super::DRAIN_GRACE), and nothing that follows
    /// changes the outcome.
    Draining,
}

/// What an input of the attempt means for the request.
#[derive(Debug)]
pub(super) enum Step<C> {
    /// Nothing for the request to do.
    Quiet,
    /// The chunk goes to the consumer at once, as it is.
    Pass(C),
    /// The attempt failed.
    Failed(Failure),
    /// The attempt ended with success proof.
    Proven(Proof),
    /// Done with the body after its proof: reading stops.
    Drained,
    /// While a rival races it, the attempt would commit without a semantic
    /// fragment (on terminal proof, or past the hold-back cap): it cannot
    /// win, and leaves the race.
    Unfit(CommitTrigger),
}

/// How an answer's body is read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reading {
    /// As a stream of the protocol, one JSON body, or bytes passed on.
    pub(super) form: BodyForm,
    /// The caps its decoder holds it to (the policy's `max_event_bytes`).
    pub(super) limits: Limits,
    /// When its first token is due, before commit.
    pub(super) first_token: Option<Duration>,
}

/// The attempt. See the module docs.
#[derive(Debug)]
pub(super) struct Attempt<D> {
    pub(super) phase: Phase,
    /// Its evidence, once a streamed head came.
    source: Option<Source<D>>,
    /// Event-granular delivery, when a resume may apply.
    pub(super) gate: Option<Box<Gate>>,
    /// The status of its head.
    pub(super) status: Option<u16>,
    /// Chunks read (of every attempt), for the stall timers' checks.
    chunks: u64,
    /// A passing chunk was decoded and waits for `on_kept_chunk`.
    kept: bool,
    /// The last error body read (capped): sensitive evidence.
    pub(super) error_body: Vec<u8>,
}

/// The failure a decoder's refusal is.
pub(super) fn violation(v: ProtocolViolation) -> Failure {
    let violation = v.into();
    Failure::new(FailureKind::Protocol { violation }, WirePhase::Decoding)
}

impl<D: Decoded> Attempt<D> {
    pub(super) fn new() -> Self {
        Attempt {
            phase: Phase::Sending,
            source: None,
            gate: None,
            status: None,
            chunks: 0,
            kept: false,
            error_body: Vec::new(),
        }
    }

    /// A new send at `now`: nothing read yet, its head due by `head_timeout`.
    pub(super) fn send(
        &mut self,
        now: Instant,
        head_timeout: Option<Duration>,
        timers: &mut Timers,
    ) {
        self.phase = Phase::Sending;
        self.source = None;
        self.gate = None;
        self.status = None;
        timers.set(Timer::Head, head_timeout.map(|d| now + d));
    }

    /// The request left: a cancel now catches it awaiting its head.
    pub(super) fn sent(&mut self) {
        if matches!(self.phase, Phase::Sending) {
            self.phase = Phase::AwaitingHead;
        }
    }

    /// Whether a hedge may race it: it is on its way or streaming (an
    /// error body fails it, a drained one is complete).
    pub(super) fn may_be_raced(&self) -> bool {
        matches!(
            self.phase,
            Phase::Sending | Phase::AwaitingHead | Phase::Streaming
        )
    }

    /// Whether its head is still awaited.
    pub(super) fn awaits_head(&self) -> bool {
        matches!(self.phase, Phase::Sending | Phase::AwaitingHead)
    }

    /// An error head came at `now`: its body is read, capped, for the
    /// provider's code.
    pub(super) fn read_error(&mut self, now: Instant, error: Box<ErrorHead>, timers: &mut Timers) {
        self.phase = Phase::ErrorBody(error);
        // An error head fails the attempt once its body is read: a hedge
        // would race a failure.
        timers.clear();
        self.restart_watch(now, timers);
    }

    /// A streamed answer's head came at `now`: its body is read as
    /// `read` says, by the machine's own decoder unless `decoded` (a layer
    /// decodes it first), through a gate when a resume may apply.
    pub(super) fn read_answer<C>(
        &mut self,
        now: Instant,
        read: Reading,
        decoded: Option<D>,
        gate: Option<(Option<u64>, Option<Box<Splice>>)>,
        cx: &mut Ctx<'_, C>,
    ) {
        let (protocol, timers) = (cx.protocol, &mut *cx.timers);
        let Reading {
            form,
            limits,
            first_token,
        } = read;
        self.source = Some(match decoded {
            Some(d) => Source::Elsewhere(d),
            None => Source::Own(Box::new(StreamObserver::for_form(protocol, limits, form))),
        });
        self.gate = gate.map(|(after, splice)| {
            let gate = Gate::new(protocol, limits, after);
            Box::new(match splice {
                Some(splice) => gate.splicing(*splice),
                None => gate,
            })
        });
        self.phase = Phase::Streaming;
        timers.clear_reading();
        // A streamed answer's first token is due, before commit; a whole
        // JSON answer has its output only at its end, bounded by the other
        // watchdogs.
        let first_token = first_token.filter(|_| form == BodyForm::Stream);
        timers.set(Timer::FirstToken, first_token.map(|d| now + d));
        self.restart_watch(now, timers);
    }

    /// Its strong proof was handed out at `now`: the rest of the body
    /// drains.
    pub(super) fn drain(&mut self, now: Instant, timers: &mut Timers) {
        self.phase = Phase::Draining;
        timers.clear();
        self.restart_watch(now, timers);
    }

    /// What the stall watchdogs watch in this phase.
    fn watching(&self) -> Option<Watching> {
        match self.phase {
            Phase::ErrorBody(_) => Some(Watching::ErrorBody),
            Phase::Draining => Some(Watching::Drain),
            Phase::Streaming => Some(Watching::Stream {
                proven: self.proven(),
            }),
            Phase::Sending | Phase::AwaitingHead => None,
        }
    }

    fn restart_watch(&mut self, now: Instant, timers: &mut Timers) {
        if let Some(watching) = self.watching() {
            timers.restart_watch(now, self.chunks, watching);
        }
    }

    #[inline]
    fn count_chunk(&mut self, timers: &mut Timers) {
        self.chunks += 1;
        timers.chunk_came(self.chunks);
    }

    /// The success proof observed, if any.
    pub(super) fn proof(&self) -> Option<Proof> {
        match self.source.as_ref()?.terminal()? {
            Terminal::Success { proof } => Some(proof),
            Terminal::Unsuccessful { .. } => None,
        }
    }

    /// Whether terminal proof was seen.
    pub(super) fn proven(&self) -> bool {
        self.source.as_ref().is_some_and(Source::terminal_seen)
    }

    /// What the body showed so far.
    pub(super) fn progress(&self) -> Option<Progress> {
        self.source.as_ref().map(Source::progress)
    }

    /// What the attempt showed, all of it handed out: `delivered` bytes
    /// reached the consumer.
    pub(super) fn progress_delivered(&self, delivered: u64) -> Progress {
        let mut progress = self.progress().unwrap_or_default();
        progress.deliver_observed();
        progress.delivered_bytes = delivered;
        progress
    }

    /// What the provider said of the generation.
    pub(super) fn generation(&self) -> Generation {
        self.source
            .as_ref()
            .map(Source::generation)
            .unwrap_or_default()
    }

    /// The cursor of the last complete event, where a resume continues.
    pub(super) fn cursor(&self) -> Option<ResumeCursor> {
        match (&self.gate, &self.source) {
            (Some(g), _) => Some(g.cursor().clone()),
            (None, Some(s)) => Some(s.cursor()),
            _ => None,
        }
    }

    /// A chunk of a body the consumer reads as it comes (the lean path):
    /// `Ok(true)` when it goes out as it is, `Ok(false)` when the machine
    /// needs it (`on_kept_chunk`), or the failure the decoder's refusal is.
    #[inline]
    pub(super) fn on_passing_chunk<C: AsRef<[u8]>>(
        &mut self,
        chunk: &[u8],
        outbox: &mut Outbox<C>,
        timers: &mut Timers,
    ) -> Result<bool, ProtocolViolation> {
        if matches!(self.phase, Phase::Draining) {
            self.count_chunk(timers);
            outbox.passed(chunk.len());
            return Ok(true);
        }
        let Some(source) = self.source.as_mut() else {
            return Ok(false);
        };
        match source.feed(chunk) {
            Ok(()) if !source.flagged() => {
                self.count_chunk(timers);
                outbox.passed(chunk.len());
                Ok(true)
            }
            Ok(()) => {
                self.kept = true;
                Ok(false)
            }
            Err(v) => Err(v),
        }
    }

    /// The chunk `on_passing_chunk` kept, already decoded.
    pub(super) fn on_kept_chunk<C: AsRef<[u8]>>(
        &mut self,
        now: Instant,
        chunk: C,
        cx: &mut Ctx<'_, C>,
    ) -> Step<C> {
        if !std::mem::take(&mut self.kept) || !matches!(self.phase, Phase::Streaming) {
            return Step::Quiet;
        }
        self.on_fed_chunk(now, chunk, cx)
    }

    /// A chunk of the body: decoded, then held back before commit
    /// (committing on the first semantic fragment, terminal proof, or past
    /// the hold-back cap), queued or cut into events after, or handed out.
    pub(super) fn on_chunk<C: AsRef<[u8]>>(
        &mut self,
        now: Instant,
        chunk: C,
        cx: &mut Ctx<'_, C>,
    ) -> Step<C> {
        match &mut self.phase {
            Phase::Streaming => {
                let Some(source) = self.source.as_mut() else {
                    return Step::Quiet;
                };
                if let Err(v) = source.feed(chunk.as_ref()) {
                    return Step::Failed(violation(v));
                }
                self.on_fed_chunk(now, chunk, cx)
            }
            Phase::Draining => {
                self.count_chunk(cx.timers);
                if cx.outbox.pass(chunk.as_ref().len()) {
                    return Step::Pass(chunk);
                }
                cx.outbox.push(Chunk::Read(chunk));
                Step::Quiet
            }
            Phase::ErrorBody(e) => {
                let full = e.take(chunk.as_ref(), cx.course.policy().evidence_cap());
                // Kept for a final error response; after commit (a resume
                // answered with an error) the consumer never sees it.
                if !cx.outbox.responded() {
                    cx.outbox.push(Chunk::Read(chunk));
                }
                self.count_chunk(cx.timers);
                if full {
                    return self.judge_error(cx);
                }
                Step::Quiet
            }
            Phase::Sending | Phase::AwaitingHead => Step::Quiet,
        }
    }

    /// A chunk the decoder took.
    fn on_fed_chunk<C: AsRef<[u8]>>(
        &mut self,
        now: Instant,
        chunk: C,
        cx: &mut Ctx<'_, C>,
    ) -> Step<C> {
        self.count_chunk(cx.timers);
        let Some(source) = self.source.as_ref() else {
            return Step::Quiet;
        };
        if !cx.course.is_committed() {
            let held = cx.outbox.hold_bytes(chunk.as_ref().len());
            let progress = source.progress();
            cx.course.ledger.progress(progress);
            if source.provider_error_seen()
                && let Some(error) = source.provider_error()
            {
                // Held with the rest: if no attempt follows, the provider's
                // own error is the answer.
                if self.gate.is_none() {
                    cx.outbox.push(Chunk::Read(chunk));
                }
                let failure = Failure::new(FailureKind::Provider { error }, WirePhase::Streaming);
                return Step::Failed(self.enrich(failure, cx.outbox));
            }
            let trigger = if progress.semantic_observed() {
                Some(CommitTrigger::Semantic)
            } else if source.terminal_seen() {
                Some(CommitTrigger::Terminal)
            } else if held > cx.course.policy().holdback_cap() {
                Some(CommitTrigger::HoldbackCap)
            } else {
                None
            };
            if let Err(v) = self.through_gate(chunk, cx) {
                return Step::Failed(violation(v));
            }
            match trigger {
                Some(trigger) if cx.racing && trigger != CommitTrigger::Semantic => {
                    return Step::Unfit(trigger);
                }
                Some(trigger) => cx.commit(now, trigger),
                None => {}
            }
            return Step::Quiet;
        }
        if source.provider_error_seen()
            && !cx.outbox.deferred()
            && let Some(error) = source.provider_error()
        {
            // The chunk that carries the error still reaches the consumer;
            // the failure is acted on after it.
            let failure = Failure::new(FailureKind::Provider { error }, WirePhase::Streaming);
            let failure = self.enrich(failure, cx.outbox);
            cx.outbox.defer(failure);
        }
        if self.gate.is_none() && cx.outbox.pass(chunk.as_ref().len()) {
            return Step::Pass(chunk);
        }
        match self.through_gate(chunk, cx) {
            Ok(()) => Step::Quiet,
            Err(v) => Step::Failed(violation(v)),
        }
    }

    /// Queues `chunk` for the consumer: as it is, or, with a gate, cut into
    /// complete, new events (kept in the prefix too, for a continuation).
    fn through_gate<C: AsRef<[u8]>>(
        &mut self,
        chunk: C,
        cx: &mut Ctx<'_, C>,
    ) -> Result<(), ProtocolViolation> {
        let Some(gate) = self.gate.as_mut() else {
            cx.outbox.push(Chunk::Read(chunk));
            return Ok(());
        };
        let (outbox, prefix) = (&mut *cx.outbox, &mut cx.prefix);
        gate.push(chunk.as_ref(), |event| {
            if let Some(p) = prefix.as_mut() {
                p.absorb(&event);
            }
            outbox.push(Chunk::Made(event));
        })
    }

    /// The body ended cleanly (the transport's end of body).
    pub(super) fn on_end<C: AsRef<[u8]>>(&mut self, cx: &mut Ctx<'_, C>) -> Step<C> {
        match &self.phase {
            Phase::Draining => Step::Drained,
            Phase::ErrorBody(_) => self.judge_error(cx),
            Phase::Streaming => {
                let Some(source) = self.source.as_mut() else {
                    return Step::Quiet;
                };
                let failure = match source.finish() {
                    EndOfStream::Success { proof } => return Step::Proven(proof),
                    EndOfStream::Unsuccessful { reason } => {
                        Failure::new(FailureKind::Unsuccessful { reason }, WirePhase::Streaming)
                    }
                    EndOfStream::ProviderError { error } => {
                        Failure::new(FailureKind::Provider { error }, WirePhase::Streaming)
                    }
                    EndOfStream::Violation { violation } => Failure::new(
                        FailureKind::Protocol {
                            violation: violation.into(),
                        },
                        WirePhase::Decoding,
                    ),
                    EndOfStream::UnexpectedEof { pending } => {
                        Failure::new(FailureKind::UnexpectedEof, WirePhase::Streaming)
                            .with_unfinished(pending.unwrap_or_default())
                    }
                };
                Step::Failed(self.enrich(failure, cx.outbox))
            }
            Phase::Sending | Phase::AwaitingHead => Step::Quiet,
        }
    }

    /// The attempt's send or read failed: no head came back, the body's
    /// read failed, or a hook of the driver vetoed it.
    pub(super) fn on_error<C: AsRef<[u8]>>(
        &mut self,
        failure: Failure,
        cx: &mut Ctx<'_, C>,
    ) -> Step<C> {
        match &self.phase {
            Phase::Sending | Phase::AwaitingHead => Step::Failed(failure),
            Phase::ErrorBody(_) => self.judge_error(cx),
            Phase::Draining => {
                // A reset right after `[DONE]` changes nothing.
                cx.course.ledger.late_error();
                cx.outbox.release();
                Step::Drained
            }
            Phase::Streaming => {
                if let Some(proof) = self.proof() {
                    // A reset right after `[DONE]` changes nothing.
                    cx.course.ledger.late_error();
                    cx.outbox.release();
                    return Step::Proven(proof);
                }
                Step::Failed(self.enrich(failure, cx.outbox))
            }
        }
    }

    /// One of its timers fired at `now`: its head is late, its first token
    /// is late, or a check of the stall watchdogs (a stall only when a
    /// deadline is still passed after it).
    pub(super) fn on_timer<C: AsRef<[u8]>>(
        &mut self,
        timer: Timer,
        now: Instant,
        cx: &mut Ctx<'_, C>,
    ) -> Step<C> {
        match timer {
            Timer::Head => {
                // Not yet sent: the request never left (connecting).
                let phase = match self.phase {
                    Phase::Sending => WirePhase::Connecting,
                    _ => WirePhase::AwaitingHeaders,
                };
                cx.outbox.release();
                Step::Failed(Failure::new(
                    FailureKind::Timeout { stall: Stall::Head },
                    phase,
                ))
            }
            Timer::FirstToken => self.stalled(Stall::FirstToken, cx),
            _ => {
                let Some(watching) = self.watching() else {
                    cx.timers.stop(timer);
                    return Step::Quiet;
                };
                let semantic = self.source.as_ref().map_or(0, Source::semantic_fragments);
                cx.timers.check_watch(now, self.chunks, semantic, watching);
                if cx.timers.get(Timer::Watch).is_none_or(|d| now < d) {
                    return Step::Quiet;
                }
                match self.phase {
                    Phase::ErrorBody(_) => self.judge_error(cx),
                    Phase::Draining => {
                        // Silent after its proof: the answer is whole.
                        cx.outbox.release();
                        Step::Drained
                    }
                    _ => {
                        let idle = cx.timers.idle_due(now);
                        self.stalled(if idle { Stall::Idle } else { Stall::Progress }, cx)
                    }
                }
            }
        }
    }

    /// The body stalled: the attempt is released, and fails unless its
    /// proof was already seen.
    fn stalled<C: AsRef<[u8]>>(&mut self, stall: Stall, cx: &mut Ctx<'_, C>) -> Step<C> {
        cx.outbox.release();
        if let Some(proof) = self.proof() {
            return Step::Proven(proof);
        }
        let failure = Failure::new(FailureKind::Timeout { stall }, WirePhase::Streaming);
        Step::Failed(self.enrich(failure, cx.outbox))
    }

    /// The error body was read (as far as it is kept): the failure its head
    /// and body show; the response held is the answer if no send follows.
    fn judge_error<C: AsRef<[u8]>>(&mut self, cx: &mut Ctx<'_, C>) -> Step<C> {
        let Phase::ErrorBody(e) = std::mem::replace(&mut self.phase, Phase::Streaming) else {
            return Step::Quiet;
        };
        let (failure, body) = e.judge(cx.protocol);
        self.error_body = body;
        cx.outbox.set_holds(Holds::ErrorResponse);
        Step::Failed(failure)
    }

    /// What the attempt showed, added to a failure the driver or the
    /// decoder reported (with what the consumer has, once it has the head).
    pub(super) fn enrich<C: AsRef<[u8]>>(
        &self,
        mut failure: Failure,
        outbox: &Outbox<C>,
    ) -> Failure {
        if let Some(source) = &self.source {
            // A driver's own evidence of progress (a test driver's), else
            // what the attempt showed.
            let mut progress = if failure.progress == Progress::default() {
                source.progress()
            } else {
                failure.progress
            };
            if outbox.responded() {
                progress.deliver_observed();
                progress.delivered_bytes = outbox.delivered();
            }
            failure.progress = progress;
            if failure.unfinished == Unfinished::default() {
                failure.unfinished = source.unfinished().unwrap_or_default();
            }
        }
        if failure.status.is_none() {
            failure.status = self.status;
        }
        failure
    }
}
