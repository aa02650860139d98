//! Raw SSE framing: a byte stream cut into whole blocks (an event, or
//! comment lines only), each block's bytes exactly as they arrived, its
//! blank line included.
//!
//! [`SseDecoder`](super::SseDecoder) reads what events *say*; this cuts
//! where they *are*, for a proxy that forwards, numbers or stores events
//! without changing a byte. The upstream's chunks fall anywhere (mid-line,
//! mid-`\r\n`); [`SseBlocks`] buffers up to one block (bounded) and hands
//! out blocks ending in a blank line, accepting the three line ends of the
//! SSE grammar (`\n`, `\r\n`, `\r`): the same blocks for every split of
//! the stream.

use bytes::{Bytes, BytesMut};

/// A whole block of the stream, its blank line included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseBlock {
    /// An event (at least one field line).
    Event(Bytes),
    /// Comment lines only (`: keepalive`), or a stray blank line.
    Comment(Bytes),
}

/// One event was longer than the framer's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTooLarge;

impl std::fmt::Display for EventTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an upstream event is larger than the gateway's event bound")
    }
}

impl std::error::Error for EventTooLarge {}

/// Cuts a byte stream into SSE blocks.
#[derive(Debug)]
pub struct SseBlocks {
    buf: BytesMut,
    /// Where the line being scanned starts.
    line_start: usize,
    /// Where scanning resumes.
    scan: usize,
    max_event: usize,
}

impl SseBlocks {
    /// A framer holding at most `max_event` bytes of an unfinished event.
    pub fn new(max_event: usize) -> Self {
        SseBlocks {
            buf: BytesMut::new(),
            line_start: 0,
            scan: 0,
            max_event,
        }
    }

    /// Adds bytes; whole blocks are then taken with [`SseBlocks::next_block`].
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole block, if one is complete. Errs when the unfinished
    /// event is over the bound.
    pub fn next_block(&mut self) -> Result<Option<SseBlock>, EventTooLarge> {
        let buf = &self.buf[..];
        let mut i = self.scan;
        while i < buf.len() {
            // The next line end, found a word at a time.
            let Some(at) = memchr::memchr2(b'\n', b'\r', &buf[i..]) else {
                i = buf.len();
                break;
            };
            i += at;
            let b = buf[i];
            let end = if b == b'\r' {
                match buf.get(i + 1) {
                    Some(b'\n') => i + 2,
                    Some(_) => i + 1,
                    // A `\r` last: it may be the first half of `\r\n`.
                    None => break,
                }
            } else {
                i + 1
            };
            if i == self.line_start {
                // A blank line: the block ends after it.
                let block = self.buf.split_to(end).freeze();
                self.line_start = 0;
                self.scan = 0;
                return Ok(Some(classify(block)));
            }
            self.line_start = end;
            i = end;
        }
        self.scan = i;
        if self.buf.len() > self.max_event {
            return Err(EventTooLarge);
        }
        Ok(None)
    }

    /// Frees the buffer when no unfinished event is in it. A stream that
    /// waits for its next read (a held stream waits for minutes) then
    /// keeps no room for it; the next [`SseBlocks::push`] allocates what it
    /// needs. An unfinished event stays.
    pub fn release_idle(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
            self.line_start = 0;
            self.scan = 0;
        }
    }

    /// What is left at the end of the body: an event the upstream did not
    /// close with a blank line, closed here so the client dispatches it.
    pub fn finish(&mut self) -> Option<SseBlock> {
        if self.buf.is_empty() {
            return None;
        }
        let mut rest = std::mem::take(&mut self.buf);
        self.line_start = 0;
        self.scan = 0;
        let ends_line = matches!(rest.last(), Some(b'\n' | b'\r'));
        if !ends_line {
            rest.extend_from_slice(b"\n");
        }
        rest.extend_from_slice(b"\n");
        Some(classify(rest.freeze()))
    }
}

/// The lines of `block`, each with its terminator (empty for a last line
/// without one).
pub fn block_lines(block: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut rest = block;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let at = memchr::memchr2(b'\n', b'\r', rest);
        let (line, term_len) = match at {
            None => (rest, 0),
            Some(i) if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') => (&rest[..i], 2),
            Some(i) => (&rest[..i], 1),
        };
        let term = &rest[line.len()..line.len() + term_len];
        rest = &rest[line.len() + term_len..];
        Some((line, term))
    })
}

fn classify(block: Bytes) -> SseBlock {
    let only_comments = block_lines(&block).all(|(line, _)| line.is_empty() || line[0] == b':');
    if only_comments {
        SseBlock::Comment(block)
    } else {
        SseBlock::Event(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<SseBlock> {
        let mut f = SseBlocks::new(1 << 20);
        let mut out = Vec::new();
        for c in chunks {
            f.push(c);
            while let Some(b) = f.next_block().unwrap() {
                out.push(b);
            }
            f.release_idle();
        }
        out.extend(f.finish());
        out
    }

    #[test]
    fn any_split_gives_the_same_blocks() {
        let text: &[u8] = b": ping\n\ndata: a\r\n\r\nevent: x\rdata: b\r\rdata: c\n\ndata: tail";
        let whole = all(&[text]);
        assert_eq!(
            whole,
            vec![
                SseBlock::Comment(Bytes::from_static(b": ping\n\n")),
                SseBlock::Event(Bytes::from_static(b"data: a\r\n\r\n")),
                SseBlock::Event(Bytes::from_static(b"event: x\rdata: b\r\r")),
                SseBlock::Event(Bytes::from_static(b"data: c\n\n")),
                SseBlock::Event(Bytes::from_static(b"data: tail\n\n")),
            ]
        );
        for i in 0..text.len() {
            for j in i..text.len() {
                assert_eq!(
                    all(&[&text[..i], &text[i..j], &text[j..]]),
                    whole,
                    "{i} {j}"
                );
            }
        }
    }

    #[test]
    fn an_idle_framer_keeps_no_buffer_and_an_unfinished_event_stays() {
        let mut f = SseBlocks::new(1 << 20);
        f.push(b"data: a\n\n");
        assert!(matches!(f.next_block(), Ok(Some(SseBlock::Event(_)))));
        assert_eq!(f.next_block(), Ok(None));
        f.release_idle();
        assert_eq!(f.buf.capacity(), 0, "nothing pending: the buffer is freed");
        f.push(b"data: b");
        assert_eq!(f.next_block(), Ok(None));
        f.release_idle();
        f.push(b"\n\n");
        assert_eq!(
            f.next_block(),
            Ok(Some(SseBlock::Event(Bytes::from_static(b"data: b\n\n"))))
        );
    }

    #[test]
    fn bounded() {
        let mut f = SseBlocks::new(8);
        f.push(b"data: 0123456789");
        assert_eq!(f.next_block(), Err(EventTooLarge));
    }
}
