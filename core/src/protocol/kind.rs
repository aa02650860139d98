//! Naming the protocol a stream speaks.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What ends a generic SSE stream successfully, when the user knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SseTerminal {
    /// An event whose data equals this string (for example `[DONE]`).
    Data(String),
    /// An event whose type equals this string.
    Event(String),
}

/// The wire protocol of a response body.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProtocolKind {
    /// OpenAI Chat Completions and compatible servers (SSE).
    #[serde(rename = "openai-chat", alias = "openai_chat")]
    OpenAiChat,
    /// OpenAI Responses (SSE).
    #[serde(rename = "openai-responses", alias = "openai_responses")]
    OpenAiResponses,
    /// Anthropic Messages (SSE).
    Anthropic,
    /// Google Gemini `streamGenerateContent?alt=sse`.
    Gemini,
    /// Ollama `/api/chat` and `/api/generate` (NDJSON).
    Ollama,
    /// Any other SSE stream; without a terminal it can never prove success.
    Sse {
        /// The configured success terminal, if any.
        terminal_sentinel: Option<SseTerminal>,
    },
}

impl ProtocolKind {
    /// The kebab-case name (`openai-chat`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            ProtocolKind::OpenAiChat => "openai-chat",
            ProtocolKind::OpenAiResponses => "openai-responses",
            ProtocolKind::Anthropic => "anthropic",
            ProtocolKind::Gemini => "gemini",
            ProtocolKind::Ollama => "ollama",
            ProtocolKind::Sse { .. } => "sse",
        }
    }

    /// Whether the body is NDJSON rather than SSE.
    pub fn is_ndjson(&self) -> bool {
        matches!(self, ProtocolKind::Ollama)
    }
}

impl fmt::Display for ProtocolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A protocol name that is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownProtocol;

impl fmt::Display for UnknownProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown protocol name")
    }
}

impl std::error::Error for UnknownProtocol {}

impl FromStr for ProtocolKind {
    type Err = UnknownProtocol;

    /// Accepts the kebab-case names and their snake_case spellings; `sse`
    /// means a generic stream without a terminal.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(
            match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
                "openai-chat" | "openai" | "chat" => ProtocolKind::OpenAiChat,
                "openai-responses" | "responses" => ProtocolKind::OpenAiResponses,
                "anthropic" => ProtocolKind::Anthropic,
                "gemini" => ProtocolKind::Gemini,
                "ollama" => ProtocolKind::Ollama,
                "sse" => ProtocolKind::Sse {
                    terminal_sentinel: None,
                },
                _ => return Err(UnknownProtocol),
            },
        )
    }
}
