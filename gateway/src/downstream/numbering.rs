//! Downstream numbering: each whole event (cut by core's
//! [`SseBlocks`](recovery_core::wire::SseBlocks)) given the gateway's
//! `id: <stream>:<seq>` line where the protocol's SDKs read one.
//!
//! A client that resumes needs ids on event boundaries, and the stream log
//! keeps whole events. [`number`] rewrites one event:
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

use bytes::BytesMut;
use recovery_core::wire::block_lines as lines;

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

/// Writes the comment lines of a comment block to `out` without its blank
/// lines, so they reach a reader as comments and dispatch no event
/// (nothing, for a stray blank line).
pub(crate) fn comment_lines(block: &[u8], out: &mut BytesMut) {
    for (line, term) in lines(block) {
        if !line.is_empty() {
            out.extend_from_slice(line);
            out.extend_from_slice(if term.is_empty() { b"\n" } else { term });
        }
    }
}

/// Whether `line` is an `id` field.
fn is_id_field(line: &[u8]) -> bool {
    line == b"id" || line.starts_with(b"id:")
}

/// Writes `event` to `out` with the gateway's id `<stream>:<seq>` first
/// and the upstream's `id` fields removed; its own line ending is used for
/// the new line.
pub(crate) fn number(event: &[u8], stream: &str, seq: u64, out: &mut BytesMut) {
    let term: &[u8] = lines(event)
        .next()
        .map_or(b"\n", |(_, t)| if t.is_empty() { b"\n" } else { t });
    let mut digits = [0; 20];
    let seq = recovery_core::text::decimal(seq, &mut digits);
    out.reserve(4 + stream.len() + 1 + seq.len() + term.len() + event.len());
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(b":");
    out.extend_from_slice(seq);
    out.extend_from_slice(term);
    for (line, t) in lines(event) {
        if !is_id_field(line) {
            out.extend_from_slice(line);
            out.extend_from_slice(t);
        }
    }
}

/// Parses a `Last-Event-ID` of the gateway's form, `<stream>:<seq>`, where
/// `<stream>` looks like one of the gateway's ids; anything else is left
/// to the upstream.
pub(crate) fn parse_last_event_id(value: &str) -> Option<(&str, u64)> {
    let (stream, seq) = value.trim().rsplit_once(':')?;
    if !crate::identity::looks_like_stream_id(stream) {
        return None;
    }
    Some((stream, seq.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(event: &[u8], stream: &str, seq: u64) -> BytesMut {
        let mut out = BytesMut::new();
        number(event, stream, seq, &mut out);
        out
    }

    fn comments(block: &[u8]) -> BytesMut {
        let mut out = BytesMut::new();
        comment_lines(block, &mut out);
        out
    }

    #[test]
    fn sequence_numbers_are_written_in_decimal() {
        for seq in [0, 7, 10, 99, 1_000_000, u64::MAX] {
            let event = numbered(b"data: x\n\n", "s", seq);
            assert_eq!(&event[..], format!("id: s:{seq}\ndata: x\n\n").as_bytes());
        }
    }

    #[test]
    fn numbering_replaces_the_upstream_id() {
        assert_eq!(
            &numbered(b"id: 7\nevent: e\ndata: x\n\n", "s", 3)[..],
            b"id: s:3\nevent: e\ndata: x\n\n"
        );
        assert_eq!(
            &numbered(b"data: x\r\nid\r\n\r\n", "s", 12)[..],
            b"id: s:12\r\ndata: x\r\n\r\n"
        );
        assert_eq!(
            &numbered(b"data: id: not a field\n\n", "s", 1)[..],
            b"id: s:1\ndata: id: not a field\n\n"
        );
    }

    #[test]
    fn events_of_one_read_are_written_back_to_back() {
        let mut out = BytesMut::new();
        number(b"data: a\n\n", "s", 1, &mut out);
        comment_lines(b": keepalive\n\n", &mut out);
        number(b"id: 9\ndata: b\n\n", "s", 2, &mut out);
        assert_eq!(
            &out[..],
            b"id: s:1\ndata: a\n\n: keepalive\nid: s:2\ndata: b\n\n"
        );
    }

    #[test]
    fn a_comment_block_loses_its_blank_line_only() {
        assert_eq!(&comments(b": keepalive\n\n")[..], b": keepalive\n");
        assert_eq!(&comments(b": a\r\n: b\r\n\r\n")[..], b": a\r\n: b\r\n");
        assert!(comments(b"\n").is_empty());
        assert_eq!(&comments(b": end")[..], b": end\n");
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
