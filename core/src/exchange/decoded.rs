//! Where the machine reads what an attempt's body showed: its own decoder,
//! or the evidence of a layer that decoded the same bytes before it (one
//! decode per stream either way).

use crate::failure::Unfinished;
use crate::observer::{EndOfStream, StreamObserver};
use crate::progress::{Generation, Progress, ProviderError, ResumeCursor, Terminal};
use crate::protocol::ProtocolKind;
use crate::wire::ProtocolViolation;

/// Evidence of one attempt's body, decoded outside the machine by a layer
/// that saw the bytes first (tower's `ObserveLayer`). The machine reads it
/// where it would otherwise decode.
pub trait Decoded {
    /// The stream's counters now.
    fn progress(&self) -> Progress;
    /// Semantic fragments observed so far (read per chunk when a progress
    /// timeout is armed: keep it cheap).
    fn semantic_fragments(&self) -> u64;
    /// Terminal proof, once seen.
    fn terminal(&self) -> Option<Terminal>;
    /// Whether terminal proof was seen (read when a deadline is asked for:
    /// keep it cheap).
    fn terminal_seen(&self) -> bool;
    /// Whether an in-stream provider error was seen (read per chunk: keep
    /// it cheap).
    fn provider_error_seen(&self) -> bool;
    /// The in-stream provider error, once seen.
    fn provider_error(&self) -> Option<ProviderError>;
    /// Where a resumable stream could continue from.
    fn cursor(&self) -> ResumeCursor;
    /// The decoder's verdict on the clean end of the body, once it ended.
    /// `None` before (or when it never judged it): the machine then treats
    /// the end as one without proof.
    fn end(&self) -> Option<EndOfStream>;
    /// The frame the body is (or ended) inside, if any.
    fn unfinished(&self) -> Option<Unfinished>;
    /// Whether terminal proof or a provider error was seen: the one check a
    /// streaming chunk needs (read per chunk: keep it cheap).
    fn flagged(&self) -> bool {
        self.terminal_seen() || self.provider_error_seen()
    }
    /// What the provider said of the generation so far: the model, finish
    /// reasons, usage (read once, when the attempt succeeds; a decoder that
    /// does not keep it says nothing).
    fn generation(&self) -> Generation {
        Generation::default()
    }
    /// The protocol the body was decoded as, when the decoder names one:
    /// the machine then reads the whole exchange as that protocol.
    fn protocol(&self) -> Option<&ProtocolKind> {
        None
    }
}

/// No outside decoder: the machine decodes every attempt itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SelfDecoded {}

impl Decoded for SelfDecoded {
    fn progress(&self) -> Progress {
        match *self {}
    }
    fn semantic_fragments(&self) -> u64 {
        match *self {}
    }
    fn terminal(&self) -> Option<Terminal> {
        match *self {}
    }
    fn terminal_seen(&self) -> bool {
        match *self {}
    }
    fn provider_error_seen(&self) -> bool {
        match *self {}
    }
    fn provider_error(&self) -> Option<ProviderError> {
        match *self {}
    }
    fn cursor(&self) -> ResumeCursor {
        match *self {}
    }
    fn end(&self) -> Option<EndOfStream> {
        match *self {}
    }
    fn unfinished(&self) -> Option<Unfinished> {
        match *self {}
    }
}

/// The evidence source of the attempt being read.
#[derive(Debug)]
pub(crate) enum Source<D> {
    Own(Box<StreamObserver>),
    Elsewhere(D),
}

impl<D: Decoded> Source<D> {
    /// Decodes a chunk (a no-op when it was decoded elsewhere).
    #[inline]
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Result<(), ProtocolViolation> {
        match self {
            Source::Own(o) => o.observe(chunk),
            Source::Elsewhere(_) => Ok(()),
        }
    }

    #[inline]
    pub(crate) fn semantic_fragments(&self) -> u64 {
        match self {
            Source::Own(o) => o.progress().semantic_fragments(),
            Source::Elsewhere(d) => d.semantic_fragments(),
        }
    }

    #[inline]
    pub(crate) fn provider_error_seen(&self) -> bool {
        match self {
            Source::Own(o) => o.provider_error().is_some(),
            Source::Elsewhere(d) => d.provider_error_seen(),
        }
    }

    /// Terminal proof or a provider error was seen.
    #[inline]
    pub(crate) fn flagged(&self) -> bool {
        match self {
            Source::Own(o) => o.terminal().is_some() || o.provider_error().is_some(),
            Source::Elsewhere(d) => d.flagged(),
        }
    }

    pub(crate) fn provider_error(&self) -> Option<ProviderError> {
        match self {
            Source::Own(o) => o.provider_error().cloned(),
            Source::Elsewhere(d) => d.provider_error(),
        }
    }

    pub(crate) fn progress(&self) -> Progress {
        match self {
            Source::Own(o) => *o.progress(),
            Source::Elsewhere(d) => d.progress(),
        }
    }

    pub(crate) fn terminal(&self) -> Option<Terminal> {
        match self {
            Source::Own(o) => o.terminal().cloned(),
            Source::Elsewhere(d) => d.terminal(),
        }
    }

    #[inline]
    pub(crate) fn terminal_seen(&self) -> bool {
        match self {
            Source::Own(o) => o.terminal().is_some(),
            Source::Elsewhere(d) => d.terminal_seen(),
        }
    }

    pub(crate) fn generation(&self) -> Generation {
        match self {
            Source::Own(o) => o.generation().clone(),
            Source::Elsewhere(d) => d.generation(),
        }
    }

    pub(crate) fn cursor(&self) -> ResumeCursor {
        match self {
            Source::Own(o) => o.cursor().clone(),
            Source::Elsewhere(d) => d.cursor(),
        }
    }

    pub(crate) fn unfinished(&self) -> Option<Unfinished> {
        match self {
            Source::Own(o) => o.unfinished(),
            Source::Elsewhere(d) => d.unfinished(),
        }
    }

    /// The verdict on the clean end of the body.
    pub(crate) fn finish(&mut self) -> EndOfStream {
        match self {
            Source::Own(o) => o.finish(),
            Source::Elsewhere(d) => d.end().unwrap_or(EndOfStream::UnexpectedEof {
                pending: d.unfinished(),
            }),
        }
    }
}
