//! A push decoder for newline-delimited JSON (Ollama).
//!
//! Lines end at LF; a CR before it is tolerated. Blank lines carry nothing and
//! are reported as such. An unterminated tail is kept (capped) so the
//! observer can judge it at EOF: Ollama always ends its lines, so a tail is
//! either a complete final object without its newline or a cut frame.

use memchr::memchr;

use super::{Limits, ProtocolViolation};

/// What the decoder hands out, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NdjsonItem<'a> {
    /// A non-blank line, without its terminator.
    Line {
        /// The line.
        data: &'a [u8],
        /// Stream offset just past the line's LF.
        end_offset: u64,
    },
    /// An empty or whitespace-only line.
    Blank {
        /// Stream offset just past the line's LF.
        end_offset: u64,
    },
}

/// What an [`NdjsonDecoder`] hands its items to.
pub(crate) trait NdjsonSink {
    /// A completed item, in stream order.
    fn item(&mut self, item: NdjsonItem<'_>) -> Result<(), ProtocolViolation>;

    /// Offered `rest`, the unread bytes of the read at a line boundary
    /// (nothing carried), which start at stream offset `offset`. A sink that
    /// recognises whole lines there (each ending in LF, within the cap) may
    /// handle them itself and return their length; the decoder then skips
    /// them, and stands at the next line boundary. The default recognises
    /// nothing.
    fn whole_lines(&mut self, rest: &[u8], offset: u64) -> Option<usize> {
        let _ = (rest, offset);
        None
    }
}

/// Incremental NDJSON decoder.
#[derive(Debug, Clone)]
pub(crate) struct NdjsonDecoder {
    cap: usize,
    carry: Vec<u8>,
    consumed: u64,
    failed: Option<ProtocolViolation>,
}

fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r'))
}

impl NdjsonDecoder {
    /// A decoder at the start of a stream; a line may not exceed the smaller
    /// of the two caps.
    pub(crate) fn new(limits: Limits) -> Self {
        NdjsonDecoder {
            cap: limits.max_line.min(limits.max_event),
            carry: Vec::new(),
            consumed: 0,
            failed: None,
        }
    }

    /// Feeds one read into `sink`, which sees every item it completes, in
    /// order, and is offered whole lines first.
    ///
    /// After an error the decoder stays failed and returns the same error.
    pub(crate) fn feed_into<S: NdjsonSink>(
        &mut self,
        chunk: &[u8],
        mut sink: S,
    ) -> Result<(), ProtocolViolation> {
        if let Some(v) = self.failed {
            return Err(v);
        }
        let result = self.feed_inner(chunk, &mut sink);
        self.consumed += chunk.len() as u64;
        if let Err(v) = result {
            self.failed = Some(v);
        }
        result
    }

    fn feed_inner<S: NdjsonSink>(
        &mut self,
        chunk: &[u8],
        sink: &mut S,
    ) -> Result<(), ProtocolViolation> {
        let base = self.consumed;
        let cap = self.cap;
        let too_long = ProtocolViolation::LineTooLong { cap };
        let mut pos = 0;
        while pos < chunk.len() {
            if self.carry.is_empty() {
                let rest = &chunk[pos..];
                let taken = sink.whole_lines(rest, base + pos as u64);
                if let Some(n) = taken.filter(|&n| n > 0 && n <= rest.len()) {
                    pos += n;
                    continue;
                }
            }
            let Some(rel) = memchr(b'\n', &chunk[pos..]) else {
                let rest = &chunk[pos..];
                // One byte of slack: a CR that a following LF will strip.
                if self.carry.len() + rest.len() > cap + 1 {
                    return Err(too_long);
                }
                self.carry.extend_from_slice(rest);
                break;
            };
            let end = pos + rel;
            let end_offset = base + end as u64 + 1;
            if self.carry.is_empty() {
                let mut line = &chunk[pos..end];
                if matches!(line.last(), Some(b'\r')) {
                    line = &line[..line.len() - 1];
                }
                if line.len() > cap {
                    return Err(too_long);
                }
                emit_line(line, end_offset, sink)?;
            } else {
                if self.carry.len() + rel > cap + 1 {
                    return Err(too_long);
                }
                self.carry.extend_from_slice(&chunk[pos..end]);
                let carry = std::mem::take(&mut self.carry);
                let mut line = &carry[..];
                if matches!(line.last(), Some(b'\r')) {
                    line = &line[..line.len() - 1];
                }
                let result = if line.len() > cap {
                    Err(too_long)
                } else {
                    emit_line(line, end_offset, sink)
                };
                self.carry = carry;
                self.carry.clear();
                result?;
            }
            pos = end + 1;
        }
        Ok(())
    }

    /// The unterminated tail (without a trailing CR), empty when none.
    pub(crate) fn pending(&self) -> &[u8] {
        match self.carry.last() {
            Some(b'\r') => &self.carry[..self.carry.len() - 1],
            _ => &self.carry,
        }
    }

    /// Bytes currently buffered.
    pub(crate) fn buffered(&self) -> usize {
        self.carry.len()
    }
}

fn emit_line<S: NdjsonSink>(
    line: &[u8],
    end_offset: u64,
    sink: &mut S,
) -> Result<(), ProtocolViolation> {
    if is_blank(line) {
        sink.item(NdjsonItem::Blank { end_offset })
    } else {
        sink.item(NdjsonItem::Line {
            data: line,
            end_offset,
        })
    }
}
