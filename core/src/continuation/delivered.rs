//! What the consumer already has, rebuilt from the delivered events.
//!
//! A continuation (the caller's hook, or a declared prefill) needs the
//! text, the reasoning and the tool-call fragments delivered so far, and a
//! splice needs the few facts that let the next generation run on without
//! a gap: the stream's chunk id, the last content block's index, the usage
//! already reported. They are read with the crate's own JSON reader (no
//! `serde_json`, so the wasm package has it too), only when a continuation
//! is possible, off the fast path.
//!
//! The prefix holds response text, so its `Debug` shows sizes only.

use std::fmt;

use crate::json::{JsonView, Lazy};
use crate::protocol::ProtocolKind;

/// Most text kept per field (4 MiB); past it the prefix is marked truncated.
pub const MAX_PREFIX: usize = 4 << 20;

/// What the consumer has received so far, by kind of output.
#[non_exhaustive]
pub struct DeliveredPrefix {
    kind: ProtocolKind,
    /// Visible text.
    pub text: String,
    /// Reasoning text (summaries, thinking).
    pub reasoning: String,
    /// Tool-call fragments in order (names and argument pieces).
    pub tool_fragments: Vec<String>,
    /// A field hit [`MAX_PREFIX`]; the prefix is incomplete.
    pub truncated: bool,
    /// What a splice needs to run the next generation on.
    pub(crate) seam: SeamFacts,
}

/// What a continuation's stream is rewritten with so that it runs on from
/// the delivered one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SeamFacts {
    /// The chunk id the delivered stream carries (OpenAI Chat `id`).
    pub(crate) chunk_id: Option<String>,
    /// The index of the last content block delivered (Anthropic).
    pub(crate) block_index: Option<u64>,
    /// Output tokens the delivered stream already reported (Anthropic's
    /// `message_start` / `message_delta` usage).
    pub(crate) output_tokens: Option<u64>,
}

impl fmt::Debug for DeliveredPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeliveredPrefix")
            .field("text_bytes", &self.text.len())
            .field("reasoning_bytes", &self.reasoning.len())
            .field("tool_fragments", &self.tool_fragments.len())
            .field("truncated", &self.truncated)
            .finish_non_exhaustive()
    }
}

fn push(dst: &mut String, s: &str, truncated: &mut bool) {
    if dst.len() + s.len() > MAX_PREFIX {
        *truncated = true;
    } else {
        dst.push_str(s);
    }
}

impl DeliveredPrefix {
    /// An empty prefix for a stream of `kind`.
    pub fn new(kind: ProtocolKind) -> Self {
        DeliveredPrefix {
            kind,
            text: String::new(),
            reasoning: String::new(),
            tool_fragments: Vec::new(),
            truncated: false,
            seam: SeamFacts::default(),
        }
    }

    /// Whether only text was delivered (no reasoning, no tool-call
    /// fragment), all of it kept: what a prefill may continue. Reasoning
    /// and tool calls are never continued: a model cannot be handed half
    /// of them back.
    pub fn is_text_only(&self) -> bool {
        !self.text.is_empty()
            && self.reasoning.is_empty()
            && self.tool_fragments.is_empty()
            && !self.truncated
    }

    /// Takes delivered bytes: whole events (SSE events, NDJSON lines), as
    /// the consumer got them. A plain line scan: the events were already
    /// framed by the stream's decoder, so no second decoder is needed.
    pub fn absorb(&mut self, bytes: &[u8]) {
        let lines = bytes
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        if self.kind.is_ndjson() {
            for line in lines.filter(|l| !l.iter().all(u8::is_ascii_whitespace)) {
                self.event(b"", line);
            }
            return;
        }
        let mut data: Vec<u8> = Vec::new();
        let mut has_data = false;
        for line in lines {
            if line.is_empty() {
                if has_data {
                    self.event(b"", &data);
                }
                data.clear();
                has_data = false;
            } else if let Some(value) = line.strip_prefix(b"data") {
                let value = match value.first() {
                    None => value,
                    Some(b':') => value[1..].strip_prefix(b" ").unwrap_or(&value[1..]),
                    Some(_) => continue,
                };
                if has_data {
                    data.push(b'\n');
                }
                data.extend_from_slice(value);
                has_data = true;
            }
        }
        if has_data {
            self.event(b"", &data);
        }
    }

    fn event(&mut self, _event_type: &[u8], data: &[u8]) {
        if let ProtocolKind::Sse { .. } = self.kind {
            if let Ok(s) = std::str::from_utf8(data) {
                push(&mut self.text, s, &mut self.truncated);
            }
            return;
        }
        let Ok(v) = Lazy::parse(data) else {
            return;
        };
        let mut got = Pieces::default();
        match self.kind {
            #[cfg(feature = "openai-chat")]
            ProtocolKind::OpenAiChat => openai_chat(v, &mut self.seam, &mut got),
            #[cfg(feature = "anthropic")]
            ProtocolKind::Anthropic => anthropic(v, &mut self.seam, &mut got),
            #[cfg(feature = "openai-responses")]
            ProtocolKind::OpenAiResponses => openai_responses(v, &mut got),
            #[cfg(feature = "gemini")]
            ProtocolKind::Gemini => gemini(v, &mut got),
            #[cfg(feature = "ollama")]
            ProtocolKind::Ollama => ollama(v, &mut got),
            _ => {}
        }
        for t in got.text {
            push(&mut self.text, &t, &mut self.truncated);
        }
        for r in got.reasoning {
            push(&mut self.reasoning, &r, &mut self.truncated);
        }
        self.tool_fragments
            .extend(got.tools.into_iter().filter(|t| !t.is_empty()));
    }
}

/// What one delivered event carried, by kind, in order, before it is
/// added to the prefix under its size limit.
#[derive(Default)]
struct Pieces {
    text: Vec<String>,
    reasoning: Vec<String>,
    tools: Vec<String>,
}

/// `v`'s text, owned (escapes decoded), when it is a string.
fn owned(v: Option<Lazy<'_>>) -> Option<String> {
    v.and_then(JsonView::text).map(std::borrow::Cow::into_owned)
}

/// `v`'s JSON as it was delivered: a tool call these protocols send whole.
#[cfg(any(feature = "gemini", feature = "ollama"))]
fn raw(v: Lazy<'_>) -> String {
    String::from_utf8_lossy(v.as_bytes()).into_owned()
}

/// An OpenAI Chat chunk: each choice's delta (content, reasoning, tool
/// call names and arguments); the chunk id for the seam.
#[cfg(feature = "openai-chat")]
fn openai_chat(v: Lazy<'_>, seam: &mut SeamFacts, got: &mut Pieces) {
    if seam.chunk_id.is_none() {
        seam.chunk_id = owned(v.get("id"));
    }
    for choice in items(v.get("choices")) {
        let Some(d) = choice.get("delta") else {
            continue;
        };
        got.text.extend(owned(d.get("content")));
        got.reasoning
            .extend(owned(d.get("reasoning_content")).or_else(|| owned(d.get("reasoning"))));
        for call in items(d.get("tool_calls")) {
            let f = call.get("function");
            got.tools.extend(owned(f.and_then(|f| f.get("name"))));
            got.tools.extend(owned(f.and_then(|f| f.get("arguments"))));
        }
    }
}

/// An Anthropic event: block deltas and tool blocks' names; the block
/// index and the output tokens reported so far for the seam.
#[cfg(feature = "anthropic")]
fn anthropic(v: Lazy<'_>, seam: &mut SeamFacts, got: &mut Pieces) {
    let kind = owned(v.get("type"));
    if let Some(i) = v.get("index").and_then(JsonView::as_u64) {
        seam.block_index = Some(i);
    }
    let usage = match kind.as_deref() {
        Some("message_start") => v.get("message").and_then(|m| m.get("usage")),
        Some("message_delta") => v.get("usage"),
        _ => None,
    };
    if let Some(n) = usage
        .and_then(|u| u.get("output_tokens"))
        .and_then(JsonView::as_u64)
    {
        seam.output_tokens = Some(n);
    }
    match kind.as_deref() {
        Some("content_block_delta") => {
            let d = v.get("delta");
            let field = |k| owned(d.and_then(|d| d.get(k)));
            match owned(d.and_then(|d| d.get("type"))).as_deref() {
                Some("text_delta") => got.text.extend(field("text")),
                Some("thinking_delta") => got.reasoning.extend(field("thinking")),
                Some("input_json_delta") => got.tools.extend(field("partial_json")),
                _ => {}
            }
        }
        Some("content_block_start") => {
            let b = v.get("content_block");
            let t = owned(b.and_then(|b| b.get("type")));
            if matches!(t.as_deref(), Some("tool_use" | "server_tool_use")) {
                got.tools.extend(owned(b.and_then(|b| b.get("name"))));
            }
        }
        _ => {}
    }
}

/// An OpenAI Responses event: text, refusal, reasoning and function-call
/// argument deltas.
#[cfg(feature = "openai-responses")]
fn openai_responses(v: Lazy<'_>, got: &mut Pieces) {
    let t = owned(v.get("type")).unwrap_or_default();
    if t == "response.output_text.delta" || t == "response.refusal.delta" {
        got.text.extend(owned(v.get("delta")));
    } else if t.starts_with("response.reasoning") && t.rsplit('.').next() == Some("delta") {
        got.reasoning.extend(owned(v.get("delta")));
    } else if t == "response.function_call_arguments.delta" {
        got.tools.extend(owned(v.get("delta")));
    }
}

/// A Gemini chunk: each candidate's parts, as text, thought or a whole
/// function call.
#[cfg(feature = "gemini")]
fn gemini(v: Lazy<'_>, got: &mut Pieces) {
    for cand in items(v.get("candidates")) {
        let parts = cand.get("content").and_then(|c| c.get("parts"));
        for part in items(parts) {
            if let Some(call) = part.get("functionCall") {
                got.tools.push(raw(call));
            } else if part.get("thought").and_then(JsonView::as_bool) == Some(true) {
                got.reasoning.extend(owned(part.get("text")));
            } else {
                got.text.extend(owned(part.get("text")));
            }
        }
    }
}

/// An Ollama line (`/api/chat` or `/api/generate`): content, thinking and
/// whole tool calls.
#[cfg(feature = "ollama")]
fn ollama(v: Lazy<'_>, got: &mut Pieces) {
    let m = v.get("message");
    let field = |k| owned(m.and_then(|m| m.get(k)));
    got.text
        .extend(field("content").or_else(|| owned(v.get("response"))));
    got.reasoning
        .extend(field("thinking").or_else(|| owned(v.get("thinking"))));
    for call in items(m.and_then(|m| m.get("tool_calls"))) {
        got.tools.push(raw(call));
    }
}

/// The elements of `v` when it is an array (one walk, one instantiation).
fn items(v: Option<Lazy<'_>>) -> Vec<Lazy<'_>> {
    let mut out = Vec::new();
    if let Some(v) = v {
        v.for_each(|e| out.push(e));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_prefix_collects_text_reasoning_and_tools() {
        let mut p = DeliveredPrefix::new(ProtocolKind::OpenAiChat);
        p.absorb(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n");
        p.absorb(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n");
        p.absorb(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\u00e9\"}}]}\n\n");
        p.absorb(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"get\",\"arguments\":\"\"}}]}}]}\n\n");
        assert_eq!(p.text, "Hello \u{e9}");
        assert_eq!(p.reasoning, "think");
        assert_eq!(p.tool_fragments, ["get"]);
        let shown = format!("{p:?}");
        assert!(!shown.contains("Hello"), "Debug shows sizes only: {shown}");
    }

    #[test]
    fn anthropic_prefix_is_rebuilt_from_deltas() {
        let mut p = DeliveredPrefix::new(ProtocolKind::Anthropic);
        p.absorb(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Once upon\"}}\n\n");
        p.absorb(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" a time\"}}\n\n");
        assert_eq!(p.text, "Once upon a time");
    }

    #[test]
    fn ollama_prefix_reads_ndjson() {
        let mut p = DeliveredPrefix::new(ProtocolKind::Ollama);
        p.absorb(b"{\"message\":{\"role\":\"assistant\",\"content\":\"Hi\"},\"done\":false}\n{\"message\":{\"role\":\"assistant\",\"content\":\" there\"},\"done\":false}\n");
        assert_eq!(p.text, "Hi there");
    }
}
