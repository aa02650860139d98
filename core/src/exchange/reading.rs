//! The body of the attempt in flight, as the machine reads it: where its
//! evidence comes from (its own decoder or an outside one), the gate that
//! cuts it into events when a resume may apply, and what it showed.

use super::decoded::{Decoded, Source};
use super::gate::Gate;
use super::io::Chunk;
use super::outbox::Outbox;
use crate::continuation::DeliveredPrefix;
use crate::continuation::splice::Splice;
use crate::failure::{Failure, FailureKind, Phase, Unfinished};
use crate::lifecycle::CommitTrigger;
use crate::observer::{EndOfStream, StreamObserver};
use crate::progress::{Progress, Proof, ResumeCursor, Terminal};
use crate::protocol::{BodyForm, ProtocolKind};
use crate::wire::Limits;
use crate::wire::ProtocolViolation;

/// The failure a decoder's refusal is.
pub(super) fn violation(v: ProtocolViolation) -> Failure {
    let violation = v.into();
    Failure::new(FailureKind::Protocol { violation }, Phase::Decoding)
}

/// The attempt's body. See the module docs.
#[derive(Debug)]
pub(super) struct Reading<D> {
    /// Its evidence, once a streamed head came.
    pub(super) source: Option<Source<D>>,
    /// Event-granular delivery, when a resume may apply.
    pub(super) gate: Option<Box<Gate>>,
    /// The status of its head.
    pub(super) status: Option<u16>,
    /// Chunks read (of every attempt), for the stall timers' checks.
    pub(super) chunks: u64,
    /// A passing chunk was decoded and waits for `on_kept_chunk`.
    pub(super) kept: bool,
    /// The last error body read (capped): sensitive evidence.
    pub(super) error_body: Vec<u8>,
}

/// What became of a chunk of a streamed answer the decoder took.
pub(super) enum Taken<C> {
    /// It goes to the consumer at once, as it is.
    Pass(C),
    /// Queued, or cut into events, for the consumer.
    Queued,
    /// Held back before commit: what the attempt showed so far, and the
    /// commit it triggers, if any.
    Held(Progress, Option<CommitTrigger>),
    /// Held back before commit, with a provider's error event: the attempt
    /// failed.
    HeldFailed(Progress, Failure),
    /// The gate refused the stream.
    Failed(Failure),
}

impl<D: Decoded> Reading<D> {
    pub(super) fn new() -> Self {
        Reading {
            source: None,
            gate: None,
            status: None,
            chunks: 0,
            kept: false,
            error_body: Vec::new(),
        }
    }

    /// A streamed answer's head came: its body is read as `form` of
    /// `protocol`, by the machine's own decoder unless `decoded` (a layer
    /// decodes it first), through a gate when a resume may apply.
    pub(super) fn start(
        &mut self,
        protocol: &ProtocolKind,
        form: BodyForm,
        decoded: Option<D>,
        gate: Option<(Option<u64>, Option<Box<Splice>>)>,
    ) {
        self.source = Some(match decoded {
            Some(d) => Source::Elsewhere(d),
            None => Source::Own(Box::new(StreamObserver::for_form(
                protocol,
                Limits::default(),
                form,
            ))),
        });
        self.gate = gate.map(|(after, splice)| {
            let gate = Gate::new(protocol, Limits::default(), after);
            Box::new(match splice {
                Some(splice) => gate.splicing(*splice),
                None => gate,
            })
        });
    }

    /// The body ended cleanly: its proof, or the failure an end without it
    /// is (`None` when nothing was read).
    pub(super) fn finish(&mut self) -> Option<Result<Proof, Failure>> {
        let failure = match self.source.as_mut()?.finish() {
            EndOfStream::Success { proof } => return Some(Ok(proof)),
            EndOfStream::Unsuccessful { reason } => {
                Failure::new(FailureKind::Unsuccessful { reason }, Phase::Streaming)
            }
            EndOfStream::ProviderError { error } => {
                Failure::new(FailureKind::Provider { error }, Phase::Streaming)
            }
            EndOfStream::Violation { violation } => Failure::new(
                FailureKind::Protocol {
                    violation: violation.into(),
                },
                Phase::Decoding,
            ),
            EndOfStream::UnexpectedEof { pending } => {
                Failure::new(FailureKind::UnexpectedEof, Phase::Streaming)
                    .with_unfinished(pending.unwrap_or_default())
            }
        };
        Some(Err(failure))
    }

    /// A new attempt: nothing read yet.
    pub(super) fn restart(&mut self) {
        self.source = None;
        self.gate = None;
        self.status = None;
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
    pub(super) fn progress(&self) -> Progress {
        self.source
            .as_ref()
            .map(Source::progress)
            .unwrap_or_default()
    }

    /// Semantic fragments seen (`fallback` when nothing is read).
    pub(super) fn semantic(&self, fallback: u64) -> u64 {
        self.source
            .as_ref()
            .map_or(fallback, Source::semantic_fragments)
    }

    /// The cursor of the last complete event, where a resume continues.
    pub(super) fn cursor(&self) -> Option<ResumeCursor> {
        match (&self.gate, &self.source) {
            (Some(g), _) => Some(g.cursor().clone()),
            (None, Some(s)) => Some(s.cursor()),
            _ => None,
        }
    }

    /// A chunk the decoder took, of an answer `committed` or not: held back
    /// before commit (committing on the first semantic fragment, terminal
    /// proof, or past `holdback_cap` held bytes), queued or cut into events
    /// after, or handed out at once. What is cut into events is also kept
    /// in `prefix`, for a continuation.
    pub(super) fn take<C: AsRef<[u8]>>(
        &mut self,
        chunk: C,
        committed: bool,
        holdback_cap: usize,
        outbox: &mut Outbox<C>,
        prefix: Option<&mut DeliveredPrefix>,
    ) -> Taken<C> {
        let Some(source) = self.source.as_ref() else {
            return Taken::Queued;
        };
        if !committed {
            let held = outbox.hold_bytes(chunk.as_ref().len());
            let progress = source.progress();
            if source.provider_error_seen()
                && let Some(error) = source.provider_error()
            {
                // Held with the rest: if no attempt follows, the provider's
                // own error is the answer.
                if self.gate.is_none() {
                    outbox.push(Chunk::Read(chunk));
                }
                let failure = Failure::new(FailureKind::Provider { error }, Phase::Streaming);
                return Taken::HeldFailed(progress, self.enrich(failure, None));
            }
            let trigger = if progress.semantic_observed() {
                Some(CommitTrigger::Semantic)
            } else if source.terminal_seen() {
                Some(CommitTrigger::Terminal)
            } else if held > holdback_cap {
                Some(CommitTrigger::HoldbackCap)
            } else {
                None
            };
            if let Err(v) = self.through_gate(chunk, outbox, prefix) {
                return Taken::Failed(violation(v));
            }
            return Taken::Held(progress, trigger);
        }
        if source.provider_error_seen()
            && !outbox.deferred()
            && let Some(error) = source.provider_error()
        {
            // The chunk that carries the error still reaches the consumer;
            // the failure is acted on after it.
            let failure = Failure::new(FailureKind::Provider { error }, Phase::Streaming);
            let delivered = outbox.responded().then(|| outbox.delivered());
            outbox.defer(self.enrich(failure, delivered));
        }
        if self.gate.is_none() && outbox.pass(chunk.as_ref().len()) {
            return Taken::Pass(chunk);
        }
        match self.through_gate(chunk, outbox, prefix) {
            Ok(()) => Taken::Queued,
            Err(v) => Taken::Failed(violation(v)),
        }
    }

    /// Queues `chunk` for the consumer: as it is, or, with a gate, cut into
    /// complete, new events (kept in `prefix` too).
    fn through_gate<C: AsRef<[u8]>>(
        &mut self,
        chunk: C,
        outbox: &mut Outbox<C>,
        mut prefix: Option<&mut DeliveredPrefix>,
    ) -> Result<(), ProtocolViolation> {
        let Some(gate) = self.gate.as_mut() else {
            outbox.push(Chunk::Read(chunk));
            return Ok(());
        };
        gate.push(chunk.as_ref(), |event| {
            if let Some(p) = prefix.as_mut() {
                p.absorb(&event);
            }
            outbox.push(Chunk::Made(event));
        })
    }

    /// What the attempt showed, added to a failure the driver or the
    /// decoder reported; `delivered` is what the consumer has, once it has
    /// the head.
    pub(super) fn enrich(&self, mut failure: Failure, delivered: Option<u64>) -> Failure {
        if let Some(source) = &self.source {
            // A driver's own evidence of progress (a test driver's), else
            // what the attempt showed.
            let mut progress = if failure.progress == Progress::default() {
                source.progress()
            } else {
                failure.progress
            };
            if let Some(bytes) = delivered {
                progress.deliver_observed();
                progress.delivered_bytes = bytes;
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
