//! Downstream SSE framing: the upstream body cut into whole events, each
//! given the gateway's `id: <stream>:<seq>` line where the protocol's SDKs
//! read one.
//!
//! The upstream's chunks fall anywhere (mid-line, mid-`\r\n`); a client
//! that resumes needs ids on event boundaries, and the stream log keeps
//! whole events. The [`Framer`] buffers up to one event (bounded) and
//! hands out blocks ending in a blank line, accepting the three line ends
//! of the SSE grammar (`\n`, `\r\n`, `\r`). [`number`] rewrites one event:
//! the upstream's own `id:` lines are dropped (a client's `Last-Event-ID`
//! must name a position in the gateway's log, not the provider's), the
//! gateway's id goes first, every other byte stays as it came.
//!
//! A block of comments only (a keepalive, `: OPENROUTER PROCESSING`) is
//! neither numbered nor logged. Once a stream carried an `id:`, an SSE
//! reader keeps that last event id, and the common readers (the Stainless
//! decoder of `openai`, `anthropic`, `groq`) then dispatch an event at any
//! blank line, a comment block's included: an empty event that their JSON
//! decoding raises on. So where ids are added a comment block is sent as
//! its comment lines without the blank line ([`comment_lines`]): a reader
//! skips them and dispatches nothing.

use bytes::{Bytes, BytesMut};

/// A whole block of the stream, its blank line included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// An event (at least one field line).
    Event(Bytes),
    /// Comment lines only (`: keepalive`), or a stray blank line.
    Comment(Bytes),
}

/// What becomes of an upstream comment block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Comments {
    /// It reaches the client as the comment it was.
    #[default]
    Pass,
    /// It is dropped.
    Drop,
}

impl Comments {
    /// Parses `pass` or `drop`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "pass" => Some(Comments::Pass),
            "drop" => Some(Comments::Drop),
            _ => None,
        }
    }
}

/// The comment lines of a comment block without its blank lines, so they
/// reach a reader as comments and dispatch no event; `None` when nothing
/// is left (a stray blank line).
pub fn comment_lines(block: &[u8]) -> Option<Bytes> {
    let mut out = BytesMut::with_capacity(block.len());
    for (line, term) in lines(block) {
        if !line.is_empty() {
            out.extend_from_slice(line);
            out.extend_from_slice(if term.is_empty() { b"\n" } else { term });
        }
    }
    (!out.is_empty()).then(|| out.freeze())
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
pub struct Framer {
    buf: BytesMut,
    /// Where the line being scanned starts.
    line_start: usize,
    /// Where scanning resumes.
    scan: usize,
    max_event: usize,
}

impl Framer {
    /// A framer holding at most `max_event` bytes of an unfinished event.
    pub fn new(max_event: usize) -> Self {
        Framer {
            buf: BytesMut::new(),
            line_start: 0,
            scan: 0,
            max_event,
        }
    }

    /// Adds bytes; whole blocks are then taken with [`Framer::next_block`].
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next whole block, if one is complete. Errs when the unfinished
    /// event is over the bound.
    pub fn next_block(&mut self) -> Result<Option<Block>, EventTooLarge> {
        let buf = &self.buf[..];
        let mut i = self.scan;
        while i < buf.len() {
            let b = buf[i];
            if b != b'\n' && b != b'\r' {
                i += 1;
                continue;
            }
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

    /// What is left at the end of the body: an event the upstream did not
    /// close with a blank line, closed here so the client dispatches it.
    pub fn finish(&mut self) -> Option<Block> {
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

/// Lines of `block` with their terminators.
fn lines(block: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut rest = block;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let at = rest.iter().position(|b| *b == b'\n' || *b == b'\r');
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

fn classify(block: Bytes) -> Block {
    let only_comments = lines(&block).all(|(line, _)| line.is_empty() || line[0] == b':');
    if only_comments {
        Block::Comment(block)
    } else {
        Block::Event(block)
    }
}

/// Whether `line` is an `id` field.
fn is_id_field(line: &[u8]) -> bool {
    line == b"id" || line.starts_with(b"id:")
}

/// `event` with the gateway's id `<stream>:<seq>` first and the upstream's
/// `id` fields removed; its own line ending is used for the new line.
pub fn number(event: &[u8], stream: &str, seq: u64) -> Bytes {
    let term: &[u8] = lines(event)
        .next()
        .map_or(b"\n", |(_, t)| if t.is_empty() { b"\n" } else { t });
    let mut out = BytesMut::with_capacity(event.len() + stream.len() + 32);
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(b":");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(term);
    for (line, t) in lines(event) {
        if !is_id_field(line) {
            out.extend_from_slice(line);
            out.extend_from_slice(t);
        }
    }
    out.freeze()
}

/// Parses a `Last-Event-ID` of the gateway's form, `<stream>:<seq>`, where
/// `<stream>` looks like one of the gateway's ids; anything else is left
/// to the upstream.
pub fn parse_last_event_id(value: &str) -> Option<(&str, u64)> {
    let (stream, seq) = value.trim().rsplit_once(':')?;
    if !crate::identity::looks_like_stream_id(stream) {
        return None;
    }
    Some((stream, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(chunks: &[&[u8]]) -> Vec<Block> {
        let mut f = Framer::new(1 << 20);
        let mut out = Vec::new();
        for c in chunks {
            f.push(c);
            while let Some(b) = f.next_block().unwrap() {
                out.push(b);
            }
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
                Block::Comment(Bytes::from_static(b": ping\n\n")),
                Block::Event(Bytes::from_static(b"data: a\r\n\r\n")),
                Block::Event(Bytes::from_static(b"event: x\rdata: b\r\r")),
                Block::Event(Bytes::from_static(b"data: c\n\n")),
                Block::Event(Bytes::from_static(b"data: tail\n\n")),
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
    fn bounded() {
        let mut f = Framer::new(8);
        f.push(b"data: 0123456789");
        assert_eq!(f.next_block(), Err(EventTooLarge));
    }

    #[test]
    fn numbering_replaces_the_upstream_id() {
        assert_eq!(
            &number(b"id: 7\nevent: e\ndata: x\n\n", "s", 3)[..],
            b"id: s:3\nevent: e\ndata: x\n\n"
        );
        assert_eq!(
            &number(b"data: x\r\nid\r\n\r\n", "s", 12)[..],
            b"id: s:12\r\ndata: x\r\n\r\n"
        );
        assert_eq!(
            &number(b"data: id: not a field\n\n", "s", 1)[..],
            b"id: s:1\ndata: id: not a field\n\n"
        );
    }

    #[test]
    fn a_comment_block_loses_its_blank_line_only() {
        assert_eq!(
            comment_lines(b": keepalive\n\n").as_deref(),
            Some(&b": keepalive\n"[..])
        );
        assert_eq!(
            comment_lines(b": a\r\n: b\r\n\r\n").as_deref(),
            Some(&b": a\r\n: b\r\n"[..])
        );
        assert_eq!(comment_lines(b"\n"), None);
        assert_eq!(
            comment_lines(b": end"),
            Some(Bytes::from_static(b": end\n"))
        );
    }

    #[test]
    fn last_event_id() {
        let id = crate::identity::new_stream_id();
        assert_eq!(parse_last_event_id(&format!("{id}:4")), Some((&id[..], 4)));
        assert_eq!(parse_last_event_id("42"), None);
        assert_eq!(parse_last_event_id("abc:4"), None);
        assert_eq!(parse_last_event_id(&format!("{id}:x")), None);
    }
}
