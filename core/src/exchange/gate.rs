//! Event-granular delivery for streams a resume may continue: a seam must
//! never split an event, and a resumed server's repeats must not reach the
//! consumer twice.

use bytes::{Bytes, BytesMut};

use crate::continuation::splice::Splice;
use crate::observer::{EventEnd, ObserverConfig, StreamObserver};
use crate::progress::ResumeCursor;
use crate::protocol::ProtocolKind;
use crate::wire::{Limits, ProtocolViolation};

/// Forwards a stream one complete event at a time, dropping events a
/// resumed server repeats (at or below the resume cursor) and, for a
/// continuation, the frames that only open the new generation, before its
/// first semantic event; its events are rewritten to run on from the
/// delivered stream ([`Splice`]).
#[derive(Debug)]
pub(crate) struct Gate {
    observer: StreamObserver,
    pending: BytesMut,
    /// Stream offset of `pending`'s first byte.
    offset: u64,
    skip_until_semantic: bool,
    splice: Option<Box<Splice>>,
}

impl Gate {
    pub(crate) fn new(
        protocol: &ProtocolKind,
        limits: Limits,
        after_sequence: Option<u64>,
    ) -> Self {
        let config = ObserverConfig {
            limits,
            resume_after_sequence: after_sequence,
            ..ObserverConfig::default()
        };
        Gate {
            observer: StreamObserver::with_config(protocol.clone(), config),
            pending: BytesMut::new(),
            offset: 0,
            skip_until_semantic: false,
            splice: None,
        }
    }

    /// A gate for a continuation's stream: its preamble is dropped, the
    /// rest rewritten by `splice`.
    pub(crate) fn splicing(mut self, splice: Splice) -> Self {
        self.skip_until_semantic = true;
        self.splice = Some(Box::new(splice));
        self
    }

    /// Takes a chunk; calls `out` with each complete, new event it finished.
    pub(crate) fn push(
        &mut self,
        chunk: &[u8],
        mut out: impl FnMut(Bytes),
    ) -> Result<(), ProtocolViolation> {
        self.pending.extend_from_slice(chunk);
        let mut ends = Vec::new();
        self.observer.observe_ends(chunk, Some(&mut ends))?;
        for EventEnd {
            end_offset: end,
            duplicate,
            semantic,
        } in ends
        {
            let len = usize::try_from(end.saturating_sub(self.offset)).unwrap_or(usize::MAX);
            let event = self.pending.split_to(len.min(self.pending.len())).freeze();
            self.offset = end;
            if self.skip_until_semantic && !semantic {
                // The continuation's preamble: dropped while it only opens
                // the new generation.
                let opening = self
                    .splice
                    .as_ref()
                    .and_then(|s| s.opens_generation(&event));
                if opening.unwrap_or(true) {
                    continue;
                }
            }
            self.skip_until_semantic = false;
            if !duplicate && !event.is_empty() {
                out(match self.splice.as_mut() {
                    Some(splice) => splice.rewrite(event),
                    None => event,
                });
            }
        }
        Ok(())
    }

    /// What is left after the last complete event (forwarded only when the
    /// stream ended with proof: a trailing line ending).
    pub(crate) fn rest(&mut self) -> Bytes {
        self.pending.split().freeze()
    }

    /// The cursor of the last complete event.
    pub(crate) fn cursor(&self) -> &ResumeCursor {
        self.observer.cursor()
    }
}
