//! The delivered prefix as structured data, for caller continuation hooks.
//!
//! When no provider-native resume exists, a caller may continue a broken
//! answer at the prompt level (an Anthropic assistant prefill, a "continue"
//! turn). The hook needs what the consumer already has: the text, the
//! reasoning and the tool-call fragments delivered so far. This module
//! rebuilds them from the delivered bytes with a full JSON decode: it runs
//! only when a hook is installed, off the fast path.
//!
//! The prefix holds response text, so its `Debug` shows sizes only.

use std::fmt;

use serde_json::Value;

use crate::protocol::ProtocolKind;
use crate::wire::{Limits, NdjsonDecoder, NdjsonItem, SseDecoder, SseItem};

/// Most text kept per field (4 MiB); past it the prefix is marked truncated.
pub const MAX_PREFIX: usize = 4 << 20;

enum Framing {
    Sse(SseDecoder),
    Ndjson(NdjsonDecoder),
}

/// What the consumer has received so far, by kind of output.
pub struct DeliveredPrefix {
    kind: ProtocolKind,
    framing: Framing,
    /// Visible text.
    pub text: String,
    /// Reasoning text (summaries, thinking).
    pub reasoning: String,
    /// Tool-call fragments in order (names and argument pieces).
    pub tool_fragments: Vec<String>,
    /// A field hit [`MAX_PREFIX`]; the prefix is incomplete.
    pub truncated: bool,
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
        let framing = if kind.is_ndjson() {
            Framing::Ndjson(NdjsonDecoder::new(Limits::default()))
        } else {
            Framing::Sse(SseDecoder::new(Limits::default()))
        };
        DeliveredPrefix {
            kind,
            framing,
            text: String::new(),
            reasoning: String::new(),
            tool_fragments: Vec::new(),
            truncated: false,
        }
    }

    /// Takes delivered bytes (whole events, as the consumer got them).
    pub fn absorb(&mut self, bytes: &[u8]) {
        let mut datas: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let result = match &mut self.framing {
            Framing::Sse(d) => d.feed(bytes, |item| {
                if let SseItem::Event(e) = item {
                    datas.push((e.event_type.to_vec(), e.data.to_vec()));
                }
                Ok(())
            }),
            Framing::Ndjson(d) => d.feed(bytes, |item| {
                if let NdjsonItem::Line { data, .. } = item {
                    datas.push((Vec::new(), data.to_vec()));
                }
                Ok(())
            }),
        };
        if result.is_err() {
            self.truncated = true;
        }
        for (event, data) in datas {
            self.event(&event, &data);
        }
    }

    fn event(&mut self, _event_type: &[u8], data: &[u8]) {
        if let ProtocolKind::Sse { .. } = self.kind {
            if let Ok(s) = std::str::from_utf8(data) {
                push(&mut self.text, s, &mut self.truncated);
            }
            return;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return;
        };
        let mut text = Vec::new();
        let mut reasoning = Vec::new();
        let mut tools = Vec::new();
        let s = |v: &Value| v.as_str().map(str::to_owned);
        match self.kind {
            ProtocolKind::OpenAiChat => {
                for choice in v["choices"].as_array().into_iter().flatten() {
                    let d = &choice["delta"];
                    text.extend(s(&d["content"]));
                    reasoning.extend(s(&d["reasoning_content"]).or_else(|| s(&d["reasoning"])));
                    for call in d["tool_calls"].as_array().into_iter().flatten() {
                        tools.extend(s(&call["function"]["name"]));
                        tools.extend(s(&call["function"]["arguments"]).filter(|a| !a.is_empty()));
                    }
                }
            }
            ProtocolKind::Anthropic => match v["type"].as_str() {
                Some("content_block_delta") => {
                    let d = &v["delta"];
                    match d["type"].as_str() {
                        Some("text_delta") => text.extend(s(&d["text"])),
                        Some("thinking_delta") => reasoning.extend(s(&d["thinking"])),
                        Some("input_json_delta") => tools.extend(s(&d["partial_json"])),
                        _ => {}
                    }
                }
                Some("content_block_start") => {
                    let b = &v["content_block"];
                    if matches!(b["type"].as_str(), Some("tool_use" | "server_tool_use")) {
                        tools.extend(s(&b["name"]));
                    }
                }
                _ => {}
            },
            ProtocolKind::OpenAiResponses => {
                let t = v["type"].as_str().unwrap_or_default();
                if t == "response.output_text.delta" || t == "response.refusal.delta" {
                    text.extend(s(&v["delta"]));
                } else if t.starts_with("response.reasoning")
                    && t.rsplit('.').next() == Some("delta")
                {
                    reasoning.extend(s(&v["delta"]));
                } else if t == "response.function_call_arguments.delta" {
                    tools.extend(s(&v["delta"]));
                }
            }
            ProtocolKind::Gemini => {
                for cand in v["candidates"].as_array().into_iter().flatten() {
                    for part in cand["content"]["parts"].as_array().into_iter().flatten() {
                        if part.get("functionCall").is_some() {
                            tools.push(part["functionCall"].to_string());
                        } else if part["thought"].as_bool() == Some(true) {
                            reasoning.extend(s(&part["text"]));
                        } else {
                            text.extend(s(&part["text"]));
                        }
                    }
                }
            }
            ProtocolKind::Ollama => {
                let m = &v["message"];
                text.extend(s(&m["content"]).or_else(|| s(&v["response"])));
                reasoning.extend(s(&m["thinking"]).or_else(|| s(&v["thinking"])));
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    tools.push(call.to_string());
                }
            }
            ProtocolKind::Sse { .. } => {}
        }
        for t in text {
            push(&mut self.text, &t, &mut self.truncated);
        }
        for r in reasoning {
            push(&mut self.reasoning, &r, &mut self.truncated);
        }
        self.tool_fragments
            .extend(tools.into_iter().filter(|t| !t.is_empty()));
    }
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
