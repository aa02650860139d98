//! Pulls the visible text out of a provider stream, for display only.
//!
//! The recovery layer never needs this: it forwards bytes untouched. The
//! examples use it to print what a user would see while the raw bytes stream.

use recovery_core::protocol::ProtocolKind;
use serde_json::Value;

/// Incremental text extraction: feed body chunks, get the text deltas they
/// complete. Chunk boundaries may fall anywhere, even inside a UTF-8 sequence.
#[derive(Debug)]
pub struct DeltaText {
    protocol: ProtocolKind,
    pending: Vec<u8>,
}

impl DeltaText {
    /// An extractor for `protocol`'s wire format.
    pub fn new(protocol: ProtocolKind) -> Self {
        DeltaText {
            protocol,
            pending: Vec::new(),
        }
    }

    /// The text carried by the lines that `chunk` completes.
    pub fn push(&mut self, chunk: &[u8]) -> String {
        self.pending.extend_from_slice(chunk);
        let mut out = String::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']);
            if let Some(text) = self.line_text(line) {
                out.push_str(&text);
            }
        }
        out
    }

    fn line_text(&self, line: &str) -> Option<String> {
        if matches!(self.protocol, ProtocolKind::Ollama) {
            let value: Value = serde_json::from_str(line).ok()?;
            return ollama(&value);
        }
        let data = line.strip_prefix("data:")?;
        let data = data.strip_prefix(' ').unwrap_or(data);
        if matches!(self.protocol, ProtocolKind::Sse { .. }) {
            return Some(format!("{data}\n"));
        }
        let value: Value = serde_json::from_str(data).ok()?;
        match self.protocol {
            ProtocolKind::OpenAiChat => openai_chat(&value),
            ProtocolKind::OpenAiResponses => openai_responses(&value),
            ProtocolKind::Anthropic => anthropic(&value),
            ProtocolKind::Gemini => gemini(&value),
            _ => None,
        }
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn openai_chat(v: &Value) -> Option<String> {
    let choices = v.get("choices")?.as_array()?;
    non_empty(
        choices
            .iter()
            .filter_map(|c| c.pointer("/delta/content").and_then(Value::as_str))
            .collect(),
    )
}

fn openai_responses(v: &Value) -> Option<String> {
    if v.get("type")?.as_str()? != "response.output_text.delta" {
        return None;
    }
    non_empty(v.get("delta")?.as_str()?.to_owned())
}

fn anthropic(v: &Value) -> Option<String> {
    if v.get("type")?.as_str()? != "content_block_delta" {
        return None;
    }
    let delta = v.get("delta")?;
    if delta.get("type")?.as_str()? != "text_delta" {
        return None;
    }
    non_empty(delta.get("text")?.as_str()?.to_owned())
}

fn gemini(v: &Value) -> Option<String> {
    let candidates = v.get("candidates")?.as_array()?;
    let mut out = String::new();
    for c in candidates {
        for part in c
            .pointer("/content/parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if part.get("thought").and_then(Value::as_bool) == Some(true) {
                continue;
            }
            if let Some(t) = part.get("text").and_then(Value::as_str) {
                out.push_str(t);
            }
        }
    }
    non_empty(out)
}

fn ollama(v: &Value) -> Option<String> {
    let text = v
        .pointer("/message/content")
        .or_else(|| v.get("response"))?
        .as_str()?;
    non_empty(text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(protocol: ProtocolKind, bytes: &[u8], step: usize) -> String {
        let mut d = DeltaText::new(protocol);
        bytes.chunks(step).map(|c| d.push(c)).collect()
    }

    fn fixture(name: &str) -> Vec<u8> {
        std::fs::read(recovery_tests::fault::default_fixtures_dir().join(name)).unwrap()
    }

    #[test]
    fn every_protocol_yields_its_visible_text_whatever_the_chunking() {
        let cases = [
            (
                ProtocolKind::OpenAiChat,
                "openai-chat/happy-usage.sse",
                "Hello world",
            ),
            (ProtocolKind::Anthropic, "anthropic/happy.sse", "Hello"),
            (ProtocolKind::Ollama, "ollama/chat-happy.ndjson", "Hello"),
        ];
        for (protocol, name, want) in cases {
            let bytes = fixture(name);
            for step in [1, 3, 7, bytes.len()] {
                assert_eq!(
                    all(protocol.clone(), &bytes, step),
                    want,
                    "{name} step {step}"
                );
            }
        }
    }

    #[test]
    fn responses_and_gemini_deltas() {
        let responses = b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n";
        assert_eq!(all(ProtocolKind::OpenAiResponses, responses, 5), "Hi");
        let gemini = b"data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\",\"thought\":true},{\"text\":\"b\"}]}}]}\r\n\r\n";
        assert_eq!(all(ProtocolKind::Gemini, gemini, 4), "b");
    }

    #[test]
    fn nothing_comes_from_structure_or_sentinels() {
        let bytes = b"data: [DONE]\n\n: comment\n\ndata: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        assert_eq!(all(ProtocolKind::OpenAiChat, bytes, 2), "");
    }
}
