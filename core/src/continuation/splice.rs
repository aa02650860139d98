//! The seam of a continuation: its events rewritten so that they run on
//! from the delivered stream as one answer.
//!
//! A continuation is a new generation: the frames that only open it (a
//! role chunk, `message_start` and its first block's start, a ping,
//! `response.created`) are dropped before its first output ([`Splice::
//! opens_generation`]); what follows is rewritten here, event by event, so
//! a reader sees no gap:
//!
//! - OpenAI Chat: every chunk carries the delivered stream's `id`;
//! - Anthropic: content block indexes continue from the block that was cut
//!   (the continuation's first block is that block), and the output tokens
//!   already reported are added to the continuation's usage;
//! - whitespace cut from the end of a prefill (see
//!   [`Prefilled::trimmed`](super::Prefilled::trimmed)) is dropped from
//!   the start of the continuation's first text, which repeats it.
//!
//! Only one-`data:`-line JSON events are rewritten; anything else passes
//! as it came.

use bytes::Bytes;

use super::delivered::SeamFacts;
use crate::json::{Edits, JsonKind, JsonView, Lazy, write_json_string};
use crate::protocol::ProtocolKind;

/// Rewrites a continuation's events. See the module docs.
#[derive(Debug)]
pub(crate) struct Splice {
    protocol: ProtocolKind,
    facts: SeamFacts,
    /// The trimmed whitespace, as a JSON string's escaped content, still to
    /// drop from the first text.
    strip: Option<Vec<u8>>,
    /// What the continuation's block indexes are shifted by, once its first
    /// index is seen.
    shift: Option<i128>,
}

impl Splice {
    /// A splice after a stream whose seam facts are `facts`; `trimmed` is
    /// the whitespace cut from the end of the prefill.
    pub(crate) fn new(protocol: &ProtocolKind, facts: SeamFacts, trimmed: &str) -> Self {
        let strip = (!trimmed.is_empty()).then(|| {
            let mut literal = Vec::new();
            write_json_string(&mut literal, trimmed);
            literal[1..literal.len() - 1].to_vec()
        });
        Splice {
            protocol: protocol.clone(),
            facts,
            strip,
            shift: None,
        }
    }

    /// Whether `event`, before the continuation's first output, only opens
    /// the new generation (the answer it continues is already open): a
    /// role chunk, `message_start`, a block start, a ping, a keepalive,
    /// `response.created` and the like. `None` for a protocol this is not
    /// known of: there, nothing but output ends the preamble. A finish
    /// (a finish reason, `message_delta`, `[DONE]`, usage) is not an
    /// opening: a continuation with nothing more to say still ends the
    /// answer the consumer reads.
    pub(crate) fn opens_generation(&self, event: &[u8]) -> Option<bool> {
        let Some((start, end)) = data_span(event) else {
            // No data: a comment (keepalive), or several data lines.
            return Some(!event.windows(5).any(|w| w == b"data:"));
        };
        let root = Lazy::parse(&event[start..end]).ok();
        let kind = || root.and_then(|r| r.get("type"));
        let is = |names: &[&str]| kind().is_some_and(|k| names.iter().any(|n| k.str_eq(n)));
        match self.protocol {
            ProtocolKind::OpenAiChat => {
                let Some(choices) = root.and_then(|r| r.get("choices")) else {
                    return Some(false);
                };
                let (mut any, mut finished) = (false, false);
                choices.for_each(|c| {
                    any = true;
                    finished |= c.get("finish_reason").is_some_and(|f| !f.is_null());
                });
                Some(any && !finished)
            }
            ProtocolKind::Anthropic => Some(is(&["message_start", "content_block_start", "ping"])),
            ProtocolKind::OpenAiResponses => Some(is(&[
                "response.created",
                "response.in_progress",
                "response.queued",
                "response.output_item.added",
                "response.content_part.added",
            ])),
            _ => None,
        }
    }

    /// One complete event of the continuation, as the consumer gets it.
    pub(crate) fn rewrite(&mut self, event: Bytes) -> Bytes {
        let Some((start, end)) = data_span(&event) else {
            return event;
        };
        let doc = &event[start..end];
        let Ok(root) = Lazy::parse(doc) else {
            return event;
        };
        if root.kind() != JsonKind::Object {
            return event;
        }
        let mut edits = Edits::new(doc);
        match self.protocol {
            ProtocolKind::OpenAiChat => self.chat(&mut edits, root),
            ProtocolKind::Anthropic => self.anthropic(&mut edits, root),
            _ => {}
        }
        if edits.is_empty() {
            return event;
        }
        let mut out = Vec::with_capacity(event.len() + 16);
        out.extend_from_slice(&event[..start]);
        out.extend_from_slice(&edits.apply());
        out.extend_from_slice(&event[end..]);
        Bytes::from(out)
    }

    fn chat<'a>(&mut self, edits: &mut Edits<'a>, root: Lazy<'a>) {
        if let (Some(id), Some(theirs)) = (&self.facts.chunk_id, root.get("id"))
            && !theirs.str_eq(id)
        {
            let mut literal = Vec::new();
            write_json_string(&mut literal, id);
            edits.replace(theirs.as_bytes(), literal);
        }
        if self.strip.is_some() {
            let mut text = None;
            if let Some(choices) = root.get("choices") {
                choices.for_each(|c| {
                    if text.is_none() {
                        text = c
                            .get("delta")
                            .and_then(|d| d.get("content"))
                            .filter(|t| t.is_nonempty_str());
                    }
                });
            }
            if let Some(text) = text {
                self.strip_first(edits, text);
            }
        }
    }

    fn anthropic<'a>(&mut self, edits: &mut Edits<'a>, root: Lazy<'a>) {
        if let Some(index) = root.get("index").and_then(|i| i.as_u64().map(|n| (i, n))) {
            let (value, n) = index;
            let shift = *self.shift.get_or_insert_with(|| {
                i128::from(self.facts.block_index.unwrap_or(0)) - i128::from(n)
            });
            let moved = u64::try_from(i128::from(n) + shift).unwrap_or(n);
            if moved != n {
                edits.replace(value.as_bytes(), moved.to_string().into_bytes());
            }
        }
        let kind = root.get("type");
        if kind.is_some_and(|k| k.str_eq("message_delta"))
            && let Some(before) = self.facts.output_tokens.filter(|n| *n > 0)
            && let Some(tokens) = root.get("usage").and_then(|u| u.get("output_tokens"))
            && let Some(n) = tokens.as_u64()
        {
            let sum = n.saturating_add(before);
            edits.replace(tokens.as_bytes(), sum.to_string().into_bytes());
        }
        if self.strip.is_some()
            && kind.is_some_and(|k| k.str_eq("content_block_delta"))
            && let Some(text) = root
                .get("delta")
                .filter(|d| d.get("type").is_some_and(|t| t.str_eq("text_delta")))
                .and_then(|d| d.get("text"))
                .filter(|t| t.is_nonempty_str())
        {
            self.strip_first(edits, text);
        }
    }

    /// The first text of the continuation: the trimmed whitespace it
    /// repeats is dropped (once, whether or not it was repeated).
    fn strip_first<'a>(&mut self, edits: &mut Edits<'a>, text: Lazy<'a>) {
        let Some(strip) = self.strip.take() else {
            return;
        };
        let literal = text.as_bytes();
        let inner = &literal[1..literal.len() - 1];
        if let Some(rest) = inner.strip_prefix(strip.as_slice()) {
            let mut out = Vec::with_capacity(rest.len() + 2);
            out.push(b'"');
            out.extend_from_slice(rest);
            out.push(b'"');
            edits.replace(literal, out);
        }
    }
}

/// Where the JSON of an event's only `data:` line starts and ends (SSE), or
/// the whole line (NDJSON); `None` for an event with no data line or more
/// than one.
fn data_span(event: &[u8]) -> Option<(usize, usize)> {
    let mut found = None;
    let mut at = 0;
    for line in event.split(|&b| b == b'\n') {
        let start = at;
        at += line.len() + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(value) = line.strip_prefix(b"data:") else {
            continue;
        };
        if found.is_some() {
            return None;
        }
        let skip = usize::from(value.first() == Some(&b' '));
        let from = start + 5 + skip;
        found = Some((from, start + line.len()));
    }
    found.filter(|(s, e)| s < e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrite(s: &mut Splice, e: &str) -> String {
        String::from_utf8(s.rewrite(Bytes::from(e.to_owned())).to_vec()).unwrap()
    }

    #[test]
    fn chat_chunks_take_the_delivered_id() {
        let facts = SeamFacts {
            chunk_id: Some("chatcmpl-1".into()),
            ..SeamFacts::default()
        };
        let mut s = Splice::new(&ProtocolKind::OpenAiChat, facts, "");
        assert_eq!(
            rewrite(
                &mut s,
                "data: {\"id\":\"chatcmpl-2\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" b\"}}]}\n\n"
            ),
            "data: {\"id\":\"chatcmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" b\"}}]}\n\n"
        );
        let done = "data: [DONE]\n\n";
        assert_eq!(rewrite(&mut s, done), done);
    }

    #[test]
    fn anthropic_indexes_run_on_and_usage_adds_up() {
        let facts = SeamFacts {
            block_index: Some(2),
            output_tokens: Some(40),
            ..SeamFacts::default()
        };
        let mut s = Splice::new(&ProtocolKind::Anthropic, facts, " ");
        let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" world\"}}\n\n";
        assert_eq!(
            rewrite(&mut s, delta),
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"text_delta\",\"text\":\"world\"}}\n\n"
        );
        // Only the first text loses the trimmed whitespace.
        assert!(rewrite(&mut s, delta).contains("\"text\":\" world\""));
        let stop =
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n";
        assert!(rewrite(&mut s, stop).contains("\"index\":3"));
        let usage = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":20}}\n\n";
        assert!(rewrite(&mut s, usage).contains("\"output_tokens\":60"));
    }

    #[test]
    fn a_continuation_that_does_not_repeat_the_whitespace_keeps_its_text() {
        let mut s = Splice::new(&ProtocolKind::Anthropic, SeamFacts::default(), "\n");
        let delta = "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"next\"}}\n\n";
        assert_eq!(rewrite(&mut s, delta), delta);
        let again = "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\\nx\"}}\n\n";
        assert_eq!(rewrite(&mut s, again), again, "stripped once at most");
    }

    #[test]
    fn only_the_frames_that_open_a_generation_are_its_preamble() {
        let chat = Splice::new(&ProtocolKind::OpenAiChat, SeamFacts::default(), "");
        let opens = |s: &Splice, e: &str| s.opens_generation(e.as_bytes());
        assert_eq!(
            opens(
                &chat,
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
            ),
            Some(true)
        );
        assert_eq!(opens(&chat, ": keepalive\n\n"), Some(true));
        for finish in [
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n",
        ] {
            assert_eq!(opens(&chat, finish), Some(false), "{finish}");
        }
        let anthropic = Splice::new(&ProtocolKind::Anthropic, SeamFacts::default(), "");
        for (event, opening) in [
            (
                "event: message_start\ndata: {\"type\":\"message_start\"}\n\n",
                true,
            ),
            (
                "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0}\n\n",
                true,
            ),
            ("event: ping\ndata: {\"type\":\"ping\"}\n\n", true),
            (
                "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
                false,
            ),
            (
                "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                false,
            ),
        ] {
            assert_eq!(opens(&anthropic, event), Some(opening), "{event}");
        }
        let gemini = Splice::new(&ProtocolKind::Gemini, SeamFacts::default(), "");
        assert_eq!(opens(&gemini, "data: {}\n\n"), None);
    }

    #[test]
    fn events_it_cannot_read_pass_unchanged() {
        let facts = SeamFacts {
            chunk_id: Some("a".into()),
            ..SeamFacts::default()
        };
        let mut s = Splice::new(&ProtocolKind::OpenAiChat, facts, "");
        for e in [
            ": keepalive\n\n",
            "data: {\"id\":\"b\"\ndata: }\n\n",
            "data: not json\n\n",
            "data: [1]\n\n",
        ] {
            assert_eq!(rewrite(&mut s, e), e);
        }
    }
}
