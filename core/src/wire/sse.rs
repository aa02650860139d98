//! A push decoder for `text/event-stream` following the WHATWG parsing rules.
//!
//! Lines are split at the byte level (LF, CR or CRLF, also when the CR and
//! the LF arrive in different reads), so a UTF-8 code point cut by a read
//! boundary is harmless. A `data:` line that lies wholly inside one read is
//! handed out as a borrowed slice of that read; only a line or an event that
//! straddles two reads is copied.

use memchr::{memchr, memchr2};

use super::{Limits, ProtocolViolation};

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched SSE event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SseEvent<'a> {
    /// The `event:` field, empty when none was sent (the spec then says
    /// `message`).
    pub event_type: &'a [u8],
    /// The data buffer without its final LF.
    pub data: &'a [u8],
    /// Stream offset just past the first byte (CR or LF) of the blank line
    /// that dispatched the event: the same for every split of the stream.
    pub end_offset: u64,
}

/// What the decoder hands out, in stream order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SseItem<'a> {
    /// A dispatched event.
    Event(SseEvent<'a>),
    /// A comment line (`:` first): a keepalive.
    Comment {
        /// Stream offset just past the comment line.
        end_offset: u64,
    },
}

/// Bytes the decoder holds that no dispatch has consumed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SsePending<'a> {
    /// An unterminated line.
    pub partial_line: &'a [u8],
    /// Whether `data:` lines are waiting for their blank line.
    pub has_data: bool,
    /// The pending `event:` value, if one was set.
    pub event_type: &'a [u8],
    /// The pending event's complete `data:` values so far, each followed by LF.
    pub data: &'a [u8],
}

impl SsePending<'_> {
    /// Whether anything is pending at all (truncation evidence at EOF).
    pub(crate) fn is_empty(&self) -> bool {
        self.partial_line.is_empty() && !self.has_data && self.event_type.is_empty()
    }
}

/// What an [`SseDecoder`] hands its items to.
///
pub(crate) trait SseSink {
    /// A completed item, in stream order.
    fn item(&mut self, item: SseItem<'_>) -> Result<(), ProtocolViolation>;

    /// Offered `rest`, the unread bytes of the read at an event boundary
    /// (nothing carried or pending, no field set), which start at stream
    /// offset `offset`. A sink that recognises whole events of the plainest
    /// shape there (one `data:` line and a blank line, both ending in LF,
    /// within the caps) may handle them itself and return their length;
    /// the decoder then skips them, and stands at the next event boundary.
    /// The default recognises nothing.
    fn whole_events(&mut self, rest: &[u8], offset: u64) -> Option<usize> {
        let _ = (rest, offset);
        None
    }
}

/// A closure as a sink.
#[cfg(test)]
struct FnSink<F>(F);

#[cfg(test)]
impl<F> SseSink for FnSink<F>
where
    F: FnMut(SseItem<'_>) -> Result<(), ProtocolViolation>,
{
    fn item(&mut self, item: SseItem<'_>) -> Result<(), ProtocolViolation> {
        (self.0)(item)
    }
}

/// Where the value of a `data:` line at the start of `buf` begins: after
/// the colon and one optional space. Always inlined: it runs per event.
#[allow(clippy::inline_always)]
#[inline(always)]
pub(crate) fn data_value_start(buf: &[u8]) -> Option<usize> {
    // A slice pattern: compared in place, where `starts_with` is a call to
    // a byte-by-byte `memcmp` on wasm32 at opt-level "z".
    match buf {
        [b'd', b'a', b't', b'a', b':', b' ', ..] => Some(6),
        [b'd', b'a', b't', b'a', b':', ..] => Some(5),
        _ => None,
    }
}

/// Incremental SSE decoder.
#[derive(Debug, Clone)]
pub(crate) struct SseDecoder {
    limits: Limits,
    /// Unterminated line carried over from the previous read.
    carry: Vec<u8>,
    /// The previous read ended in CR: a leading LF of the next one belongs to it.
    after_cr: bool,
    /// No line completed yet: the first one may start with a BOM.
    at_start: bool,
    /// Data buffer (lines joined, each followed by LF) once it had to be copied.
    data: Vec<u8>,
    /// Whether any `data` field was seen for the pending event.
    has_data: bool,
    /// The single data line of the pending event, still inside the current read.
    borrowed: Option<(usize, usize)>,
    event_type: Vec<u8>,
    id_buf: Vec<u8>,
    last_id: Vec<u8>,
    id_version: u64,
    retry: Option<u64>,
    consumed: u64,
    failed: Option<ProtocolViolation>,
}

impl SseDecoder {
    /// A decoder at the start of a stream.
    pub(crate) fn new(limits: Limits) -> Self {
        SseDecoder {
            limits,
            carry: Vec::new(),
            after_cr: false,
            at_start: true,
            data: Vec::new(),
            has_data: false,
            borrowed: None,
            event_type: Vec::new(),
            id_buf: Vec::new(),
            last_id: Vec::new(),
            id_version: 0,
            retry: None,
            consumed: 0,
            failed: None,
        }
    }

    /// Feeds one read; `emit` sees every item it completes, in order.
    ///
    /// After an error the decoder stays failed and returns the same error.
    #[cfg(test)]
    pub(crate) fn feed<F>(&mut self, chunk: &[u8], emit: F) -> Result<(), ProtocolViolation>
    where
        F: FnMut(SseItem<'_>) -> Result<(), ProtocolViolation>,
    {
        self.feed_into(chunk, FnSink(emit))
    }

    /// Feeds one read into `sink`, which sees every item it completes, in
    /// order, and is offered whole events first.
    ///
    /// After an error the decoder stays failed and returns the same error.
    pub(crate) fn feed_into<S: SseSink>(
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

    fn feed_inner<S: SseSink>(
        &mut self,
        chunk: &[u8],
        sink: &mut S,
    ) -> Result<(), ProtocolViolation> {
        if chunk.is_empty() {
            return Ok(());
        }
        let base = self.consumed;
        let max_line = self.limits.max_line;
        let mut pos = 0;
        if self.after_cr {
            self.after_cr = false;
            if chunk[0] == b'\n' {
                pos = 1;
            }
        }
        while pos < chunk.len() {
            if self.idle() {
                pos = self.whole_events(chunk, pos, sink)?;
                if pos == chunk.len() {
                    break;
                }
            }
            // A blank line (the usual end of an event) needs no search.
            let found = match chunk[pos] {
                b'\n' | b'\r' => Some(0),
                _ => memchr2(b'\n', b'\r', &chunk[pos..]),
            };
            if let Some(rel) = found {
                let end = pos + rel;
                let mut next = end + 1;
                if chunk[end] == b'\r' {
                    if next < chunk.len() {
                        if chunk[next] == b'\n' {
                            next += 1;
                        }
                    } else {
                        self.after_cr = true;
                    }
                }
                // Past the terminator's first byte: the same offset whether or
                // not the LF of a CRLF arrived in this read.
                let end_offset = base + end as u64 + 1;
                if self.carry.is_empty() {
                    if rel > max_line {
                        return Err(ProtocolViolation::LineTooLong { cap: max_line });
                    }
                    self.line(chunk, &chunk[pos..end], Some(pos), end_offset, sink)?;
                } else {
                    if self.carry.len() + rel > max_line {
                        return Err(ProtocolViolation::LineTooLong { cap: max_line });
                    }
                    self.carry.extend_from_slice(&chunk[pos..end]);
                    let carry = std::mem::take(&mut self.carry);
                    let result = self.line(chunk, &carry, None, end_offset, sink);
                    self.carry = carry;
                    self.carry.clear();
                    result?;
                }
                pos = next;
            } else {
                let rest = &chunk[pos..];
                if self.carry.len() + rest.len() > max_line {
                    return Err(ProtocolViolation::LineTooLong { cap: max_line });
                }
                self.carry.extend_from_slice(rest);
                pos = chunk.len();
            }
        }
        // The pending event straddles this read: copy its data line now.
        if let Some((s, e)) = self.borrowed.take() {
            self.data.extend_from_slice(&chunk[s..e]);
            self.data.push(b'\n');
        }
        Ok(())
    }

    /// Whether the decoder stands between events with nothing pending: a
    /// read may then start with events a [`SseSink`] takes whole (see
    /// [`skip_taken`](Self::skip_taken)).
    pub(crate) fn at_event_boundary(&self) -> bool {
        self.failed.is_none() && !self.after_cr && self.idle()
    }

    /// Accounts for `n` bytes at an event boundary that a sink took whole
    /// ([`SseSink::whole_events`]), as the decoder's own loop does.
    pub(crate) fn skip_taken(&mut self, n: usize) {
        self.consumed += n as u64;
    }

    /// Whether no event is under way: nothing carried, no data, type or id
    /// pending, past the start of the stream.
    fn idle(&self) -> bool {
        self.carry.is_empty()
            && !self.has_data
            && self.event_type.is_empty()
            && !self.at_start
            && self.id_buf.len() == self.last_id.len()
            && (self.id_buf.is_empty() || self.last_id == self.id_buf)
    }

    /// Dispatches, straight from the read, every complete event of the
    /// usual shape at `pos`: an optional `event:` line, one `data:` line and
    /// a blank line, all ending in LF and within the caps. Returns where
    /// the first other line starts; the line-by-line path takes it from
    /// there. For such events both paths emit the same items and leave the
    /// decoder in the same (idle) state. The sink is offered each event
    /// first ([`SseSink::whole_events`]).
    fn whole_events<S: SseSink>(
        &mut self,
        chunk: &[u8],
        mut pos: usize,
        sink: &mut S,
    ) -> Result<usize, ProtocolViolation> {
        let base = self.consumed;
        let Limits {
            max_line,
            max_event,
        } = self.limits;
        loop {
            let rest = &chunk[pos..];
            let taken = sink.whole_events(rest, base + pos as u64);
            if let Some(n) = taken.filter(|&n| n > 0 && n <= rest.len()) {
                pos += n;
                continue;
            }
            let (event_type, data_line) = if rest.starts_with(b"event:") {
                let Some(n) = memchr2(b'\n', b'\r', rest) else {
                    return Ok(pos);
                };
                if rest[n] != b'\n' || n > max_line {
                    return Ok(pos);
                }
                // `n` > 6 when a space follows the colon.
                let v = if rest[6] == b' ' { 7 } else { 6 };
                (&rest[v..n], n + 1)
            } else {
                (&rest[..0], 0)
            };
            let line = &rest[data_line..];
            if !line.starts_with(b"data:") {
                return Ok(pos);
            }
            let Some(n) = memchr2(b'\n', b'\r', line) else {
                return Ok(pos);
            };
            if line[n] != b'\n' || n > max_line || !matches!(line.get(n + 1), Some(b'\n')) {
                return Ok(pos);
            }
            let v = if line[5] == b' ' { 6 } else { 5 };
            let data = &line[v..n];
            if data.len() + 1 + event_type.len() > max_event {
                return Ok(pos);
            }
            let blank = pos + data_line + n + 1;
            sink.item(SseItem::Event(SseEvent {
                event_type,
                data,
                end_offset: base + blank as u64 + 1,
            }))?;
            pos = blank + 1;
        }
    }

    fn line<S: SseSink>(
        &mut self,
        chunk: &[u8],
        line: &[u8],
        chunk_start: Option<usize>,
        end_offset: u64,
        sink: &mut S,
    ) -> Result<(), ProtocolViolation> {
        let mut line = line;
        let mut chunk_start = chunk_start;
        if self.at_start {
            self.at_start = false;
            if line.starts_with(BOM) {
                line = &line[BOM.len()..];
                chunk_start = chunk_start.map(|s| s + BOM.len());
            }
        }
        if line.is_empty() {
            return self.dispatch(chunk, end_offset, sink);
        }
        if line[0] == b':' {
            return sink.item(SseItem::Comment { end_offset });
        }
        // The two fields of nearly every line, without searching for the colon.
        if line.starts_with(b"data:") {
            let v = if matches!(line.get(5), Some(b' ')) {
                6
            } else {
                5
            };
            return self.push_data(chunk, &line[v..], chunk_start.map(|s| s + v));
        }
        if line.starts_with(b"event:") {
            let v = if matches!(line.get(6), Some(b' ')) {
                7
            } else {
                6
            };
            self.event_type.clear();
            self.event_type.extend_from_slice(&line[v..]);
            return self.check_event_size(0);
        }
        let (name, value, value_start) = match memchr(b':', line) {
            Some(colon) => {
                let mut v = colon + 1;
                if matches!(line.get(v), Some(b' ')) {
                    v += 1;
                }
                (&line[..colon], &line[v..], v)
            }
            None => (line, &line[line.len()..], line.len()),
        };
        match name {
            b"data" => self.push_data(chunk, value, chunk_start.map(|s| s + value_start)),
            b"event" => {
                self.event_type.clear();
                self.event_type.extend_from_slice(value);
                self.check_event_size(0)
            }
            b"id" => {
                if memchr(0, value).is_none() {
                    self.id_buf.clear();
                    self.id_buf.extend_from_slice(value);
                }
                Ok(())
            }
            b"retry" => {
                if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
                    let ms = value.iter().fold(0u64, |acc, d| {
                        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
                    });
                    self.retry = Some(ms);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn data_len(&self) -> usize {
        match self.borrowed {
            Some((s, e)) => e - s + 1,
            None => self.data.len(),
        }
    }

    fn check_event_size(&self, extra: usize) -> Result<(), ProtocolViolation> {
        if self.data_len() + extra + self.event_type.len() > self.limits.max_event {
            Err(ProtocolViolation::EventTooLarge {
                cap: self.limits.max_event,
            })
        } else {
            Ok(())
        }
    }

    fn push_data(
        &mut self,
        chunk: &[u8],
        value: &[u8],
        value_start: Option<usize>,
    ) -> Result<(), ProtocolViolation> {
        self.check_event_size(value.len() + 1)?;
        if !self.has_data
            && let Some(s) = value_start
        {
            self.borrowed = Some((s, s + value.len()));
            self.has_data = true;
            return Ok(());
        }
        if let Some((s, e)) = self.borrowed.take() {
            self.data.extend_from_slice(&chunk[s..e]);
            self.data.push(b'\n');
        }
        self.data.extend_from_slice(value);
        self.data.push(b'\n');
        self.has_data = true;
        Ok(())
    }

    fn dispatch<S: SseSink>(
        &mut self,
        chunk: &[u8],
        end_offset: u64,
        sink: &mut S,
    ) -> Result<(), ProtocolViolation> {
        if self.last_id != self.id_buf {
            self.last_id.clear();
            self.last_id.extend_from_slice(&self.id_buf);
            self.id_version += 1;
        }
        if !self.has_data {
            self.event_type.clear();
            return Ok(());
        }
        let result = if let Some((s, e)) = self.borrowed.take() {
            sink.item(SseItem::Event(SseEvent {
                event_type: &self.event_type,
                data: &chunk[s..e],
                end_offset,
            }))
        } else {
            let end = self.data.len() - 1;
            sink.item(SseItem::Event(SseEvent {
                event_type: &self.event_type,
                data: &self.data[..end],
                end_offset,
            }))
        };
        self.data.clear();
        self.event_type.clear();
        self.has_data = false;
        result
    }

    /// What is buffered without having been dispatched.
    pub(crate) fn pending(&self) -> SsePending<'_> {
        SsePending {
            partial_line: &self.carry,
            has_data: self.has_data,
            event_type: &self.event_type,
            data: &self.data,
        }
    }

    /// The stream's last event id (the `Last-Event-ID` to send), as bytes.
    pub(crate) fn last_event_id(&self) -> &[u8] {
        &self.last_id
    }

    /// Bumped each time the last event id changes; lets callers copy it only
    /// when it did.
    pub(crate) fn last_event_id_version(&self) -> u64 {
        self.id_version
    }

    /// The last valid `retry:` value, in milliseconds.
    #[cfg(test)]
    pub(crate) fn retry_ms(&self) -> Option<u64> {
        self.retry
    }

    /// Total bytes fed so far.
    pub(crate) fn consumed(&self) -> u64 {
        self.consumed
    }

    /// Bytes currently buffered (carried line plus copied event data).
    pub(crate) fn buffered(&self) -> usize {
        self.carry.len() + self.data.len() + self.event_type.len()
    }
}
