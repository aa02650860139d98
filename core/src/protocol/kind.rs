//! Naming the protocol a stream speaks.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// What ends a generic SSE stream successfully, when the user knows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SseTerminal {
    /// An event whose data equals this string (for example `[DONE]`).
    Data(String),
    /// An event whose type equals this string.
    Event(String),
}

/// The wire protocol of a response body.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
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

    /// The protocol a request to `url` (absolute, or a path) speaks, from
    /// its path: `…/messages` Anthropic, `…/responses` (and
    /// `…/responses/{id}`) OpenAI Responses, `:streamGenerateContent` /
    /// `:generateContent` Gemini, `/api/chat` and `/api/generate` Ollama;
    /// OpenAI Chat otherwise (the shape most compatible servers speak).
    pub fn guess(url: &str) -> ProtocolKind {
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let path = path.trim_end_matches('/');
        // A window scan: `str::contains` would link the two-way searcher
        // into the wasm module. Windows are compared only where the first
        // byte matches (a slice comparison is a call), so a path costs
        // about a byte comparison per byte.
        let has = |needle: &str| {
            let needle = needle.as_bytes();
            path.as_bytes()
                .windows(needle.len())
                .any(|w| w[0] == needle[0] && w == needle)
        };
        if path.ends_with("/messages") {
            ProtocolKind::Anthropic
        } else if path.ends_with("/responses") || has("/responses/") {
            ProtocolKind::OpenAiResponses
        } else if has(":streamGenerateContent") || has(":generateContent") {
            ProtocolKind::Gemini
        } else if path.ends_with("/api/chat") || path.ends_with("/api/generate") {
            ProtocolKind::Ollama
        } else {
            ProtocolKind::OpenAiChat
        }
    }
}

/// Which protocol a driver decodes a request's answer as: one the caller
/// named, or the one its URL implies ([`ProtocolKind::guess`]). The same
/// rule in every driver; the default is `Auto`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ProtocolChoice {
    /// Guessed from each request's URL.
    #[default]
    Auto,
    /// Always this protocol.
    Fixed(ProtocolKind),
}

impl ProtocolChoice {
    /// The protocol of a request to `url`.
    pub fn resolve(&self, url: &str) -> ProtocolKind {
        match self {
            ProtocolChoice::Auto => ProtocolKind::guess(url),
            ProtocolChoice::Fixed(kind) => kind.clone(),
        }
    }
}

impl From<ProtocolKind> for ProtocolChoice {
    fn from(kind: ProtocolKind) -> Self {
        ProtocolChoice::Fixed(kind)
    }
}

/// How a successful answer's body is framed, judged from its
/// `Content-Type` by one rule for every driver (reliability matrix AT6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BodyForm {
    /// A stream of the protocol's frames (SSE, or NDJSON for Ollama).
    Stream,
    /// One whole JSON answer (`stream: false`), judged at its end.
    WholeJson,
}

impl BodyForm {
    /// The form of a body with this `Content-Type` header value. The media
    /// type (before any `;` parameter, case-insensitive) `application/json`,
    /// `text/json` or any `…+json` is one whole JSON answer; everything else,
    /// `text/event-stream`, `application/x-ndjson` and a missing header
    /// among it, is read as the protocol's stream.
    pub fn of(content_type: Option<&str>) -> BodyForm {
        let Some(media) = content_type.map(media_type) else {
            return BodyForm::Stream;
        };
        let is = |name: &str| media.eq_ignore_ascii_case(name);
        let json_suffix = media.len() > 5
            && media
                .as_bytes()
                .get(media.len() - 5..)
                .is_some_and(|s| s.eq_ignore_ascii_case(b"+json"));
        if is("application/json") || is("text/json") || json_suffix {
            BodyForm::WholeJson
        } else {
            BodyForm::Stream
        }
    }

    /// Whether a body with this `Content-Type` header value is an SSE
    /// stream (`text/event-stream`, any case, any parameters): a proxy
    /// that frames events itself asks this of the answer, where
    /// [`BodyForm::of`] reads NDJSON and a missing header as streams too.
    pub fn is_event_stream(content_type: Option<&str>) -> bool {
        content_type.is_some_and(|v| media_type(v).eq_ignore_ascii_case("text/event-stream"))
    }
}

/// The media type of a `Content-Type` value: before any `;`, trimmed.
fn media_type(value: &str) -> &str {
    value.split(';').next().unwrap_or("").trim()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_content_type_rule() {
        for ct in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "text/json",
            " application/problem+json ",
        ] {
            assert_eq!(BodyForm::of(Some(ct)), BodyForm::WholeJson, "{ct}");
        }
        for ct in [
            "text/event-stream",
            "text/event-stream; charset=utf-8",
            "application/x-ndjson",
            "application/jsonl",
            "application/json-seq",
            "",
        ] {
            assert_eq!(BodyForm::of(Some(ct)), BodyForm::Stream, "{ct}");
        }
        assert_eq!(BodyForm::of(None), BodyForm::Stream);
        for ct in ["text/event-stream", " Text/Event-Stream ; charset=utf-8"] {
            assert!(BodyForm::is_event_stream(Some(ct)), "{ct}");
        }
        for ct in [
            "application/x-ndjson",
            "text/event-streams",
            "",
            "text/plain",
        ] {
            assert!(!BodyForm::is_event_stream(Some(ct)), "{ct}");
        }
        assert!(!BodyForm::is_event_stream(None));
    }

    #[test]
    fn protocol_guessed_from_the_path() {
        let g = ProtocolKind::guess;
        assert_eq!(
            g("https://api.anthropic.com/v1/messages"),
            ProtocolKind::Anthropic
        );
        assert_eq!(
            g("http://h/v1/responses?x=1"),
            ProtocolKind::OpenAiResponses
        );
        assert_eq!(
            g("http://h/v1/responses/resp_1?stream=true"),
            ProtocolKind::OpenAiResponses
        );
        assert_eq!(
            g("https://g/v1beta/models/m:streamGenerateContent?alt=sse"),
            ProtocolKind::Gemini
        );
        assert_eq!(g("http://127.0.0.1:11434/api/chat"), ProtocolKind::Ollama);
        assert_eq!(g("/v1/chat/completions"), ProtocolKind::OpenAiChat);
        assert_eq!(
            ProtocolChoice::Fixed(ProtocolKind::Ollama).resolve("/v1/messages"),
            ProtocolKind::Ollama
        );
    }
}
