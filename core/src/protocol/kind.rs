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

    /// Whether a request (`method` to `url`, its body's `stream` field)
    /// asks this protocol for a whole answer rather than a stream: its
    /// head then comes only once the answer is done. OpenAI and Anthropic
    /// stream only when `stream` is true, Ollama unless it is false,
    /// Gemini by its method (`generateContent`, not
    /// `streamGenerateContent`); a GET (a background stream, resumed) and
    /// any other SSE server stream.
    pub fn asks_whole_answer(&self, method: &str, url: &str, stream: Option<bool>) -> bool {
        if !method.eq_ignore_ascii_case("POST") {
            return false;
        }
        match self {
            ProtocolKind::OpenAiChat | ProtocolKind::OpenAiResponses | ProtocolKind::Anthropic => {
                stream != Some(true)
            }
            ProtocolKind::Ollama => stream == Some(false),
            ProtocolKind::Gemini => {
                let path = url.split(['?', '#']).next().unwrap_or(url);
                path.rsplit('/')
                    .next()
                    .and_then(|last| last.split_once(':'))
                    .is_some_and(|(_, m)| m == "generateContent")
            }
            ProtocolKind::Sse { .. } => false,
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
    /// The answer to a request that is not a generation ([`is_generation`]:
    /// a model list, an embedding, a file, audio): its bytes reach the
    /// caller as they come, the first of them commit it, and its clean end
    /// is its proof.
    Opaque,
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

/// Whether a request asks for a generation, the answer a protocol's
/// decoder reads, judged from its method and URL (absolute, or a path with
/// its query) by one rule for every driver. Everything else the supported
/// APIs answer is passed through as it comes ([`BodyForm::Opaque`]), so a
/// client pointed at a recovering driver lists models, embeds, uploads
/// and downloads as it does without one.
///
/// Not a generation:
/// - a method other than `POST` and `GET` (`DELETE`, ...);
/// - a model list or one model (`…/models`, `…/models/{id}`);
/// - a path with a segment naming another resource: `embeddings`, `embed`,
///   `files`, `audio`, `images`, `moderations`, `batches`, `uploads`,
///   `fine_tuning`, `vector_stores`, `count_tokens`, `input_tokens`,
///   `input_items`, `conversations`, `containers`, `evals`, `videos`,
///   `realtime`, `rerank`, `tokenize`, `detokenize`, `cachedContents`,
///   `tunedModels`, `operations`, `fileSearchStores`, `assistants`,
///   `threads`, `organization(s)`, `skills`, `chatkit`, `graders`, `ocr`,
///   `score`, `classify`, `pooling`;
/// - a Gemini method other than `generateContent` and
///   `streamGenerateContent` (`:countTokens`, `:embedContent`, ...);
/// - Ollama's `/api/…` other than `/api/chat` and `/api/generate`;
/// - anything below a created answer: `…/chat/completions/{id}` and
///   `…/responses/{id}/…`, and `GET …/responses/{id}` unless its query asks
///   for `stream=true` (a background answer's stream, resumed).
///
/// Every other request is a generation of its protocol, as before: a
/// server's own path for one (a protocol named for it) keeps its recovery.
pub fn is_generation(method: &str, url: &str) -> bool {
    let post = method.eq_ignore_ascii_case("POST");
    if !post && !method.eq_ignore_ascii_case("GET") {
        return false;
    }
    let (path, query) = match url.split_once('?') {
        Some((p, q)) => (p, q.split('#').next().unwrap_or(q)),
        None => (url.split('#').next().unwrap_or(url), ""),
    };
    // The path of an absolute URL: after its authority. A window scan, as
    // in `ProtocolKind::guess` (`str::find` of a string would link the
    // two-way searcher into the wasm module).
    let path = match path.as_bytes().windows(3).position(|w| w == b"://") {
        Some(i) => path[i + 3..].find('/').map_or("", |j| &path[i + 3 + j..]),
        None => path,
    };
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let gemini_method = segments
        .last()
        .and_then(|last| last.split_once(':'))
        .map(|(_, m)| m);
    if let Some(m) = gemini_method {
        return m == "generateContent" || m == "streamGenerateContent";
    }
    if segments.iter().any(|s| OTHER_RESOURCES.contains(s)) {
        return false;
    }
    // A model list or one model; a path below them is a server's own
    // (Azure AI's `/models/chat/completions`).
    if let Some(i) = segments.iter().position(|s| *s == "models")
        && segments.len() - i <= 2
    {
        return false;
    }
    if let Some(i) = segments.iter().position(|s| *s == "api")
        && let Some(next) = segments.get(i + 1)
        && i + 2 == segments.len()
        && matches!(
            *next,
            "tags"
                | "show"
                | "ps"
                | "version"
                | "pull"
                | "push"
                | "create"
                | "copy"
                | "delete"
                | "blobs"
        )
    {
        return false;
    }
    if let Some(i) = segments
        .windows(2)
        .position(|w| w == ["chat", "completions"])
        && i + 2 < segments.len()
    {
        return false;
    }
    if let Some(i) = segments.iter().rposition(|s| *s == "responses")
        && i + 1 < segments.len()
    {
        let below_one = i + 2 < segments.len();
        let streamed = query
            .split('&')
            .any(|pair| pair.eq_ignore_ascii_case("stream=true"));
        return !below_one && !post && streamed;
    }
    true
}

/// Path segments that name a resource other than a generation
/// ([`is_generation`]).
const OTHER_RESOURCES: [&str; 36] = [
    "embeddings",
    "embed",
    "files",
    "audio",
    "images",
    "moderations",
    "batches",
    "uploads",
    "fine_tuning",
    "vector_stores",
    "count_tokens",
    "input_tokens",
    "input_items",
    "conversations",
    "containers",
    "evals",
    "videos",
    "realtime",
    "rerank",
    "tokenize",
    "detokenize",
    "cachedContents",
    "tunedModels",
    "operations",
    "fileSearchStores",
    "assistants",
    "threads",
    "organization",
    "organizations",
    "skills",
    "chatkit",
    "graders",
    "ocr",
    "score",
    "classify",
    "pooling",
];

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
    fn generations_are_told_from_everything_else_an_api_answers() {
        for (method, url) in [
            ("POST", "/v1/chat/completions"),
            ("POST", "https://api.openai.com/v1/chat/completions"),
            (
                "POST",
                "/openai/deployments/d/chat/completions?api-version=1",
            ),
            ("POST", "/v1/completions"),
            ("POST", "/v1/responses"),
            ("GET", "/v1/responses/resp_1?stream=true&starting_after=4"),
            ("POST", "/v1/messages"),
            (
                "POST",
                "/v1beta/models/gemini-2.5:streamGenerateContent?alt=sse",
            ),
            ("POST", "/v1beta/models/gemini-2.5:generateContent"),
            ("POST", "/api/chat"),
            ("POST", "/api/generate"),
            ("POST", "/v2/chat"),
            ("POST", "/v1/agents/completions"),
            (
                "POST",
                "/models/chat/completions?api-version=2024-05-01-preview",
            ),
            ("GET", "/custom/sse"),
        ] {
            assert!(is_generation(method, url), "{method} {url}");
        }
        for (method, url) in [
            ("GET", "/v1/models"),
            ("GET", "/v1/models/gpt-5"),
            ("GET", "https://api.openai.com/v1/models"),
            ("POST", "/v1/embeddings"),
            ("GET", "/v1/files/file-1/content"),
            ("POST", "/v1/files"),
            ("POST", "/v1/audio/speech"),
            ("POST", "/v1/audio/transcriptions"),
            ("POST", "/v1/images/generations"),
            ("POST", "/v1/moderations"),
            ("POST", "/v1/batches"),
            ("GET", "/v1/chat/completions/chatcmpl-1"),
            ("GET", "/v1/chat/completions/chatcmpl-1/messages"),
            ("GET", "/v1/responses/resp_1"),
            ("GET", "/v1/responses/resp_1/input_items"),
            ("POST", "/v1/responses/resp_1/cancel"),
            ("POST", "/v1/responses/input_tokens"),
            ("DELETE", "/v1/responses/resp_1"),
            ("POST", "/v1/messages/count_tokens"),
            ("POST", "/v1/messages/batches"),
            ("POST", "/v1beta/models/gemini-2.5:countTokens"),
            ("POST", "/v1beta/models/text-embedding:embedContent"),
            ("GET", "/v1beta/models"),
            ("GET", "/api/tags"),
            ("POST", "/api/show"),
            ("POST", "/api/embed"),
            ("POST", "/api/pull"),
            ("POST", "/v1/rerank"),
            ("POST", "/v1/score"),
            ("GET", "/v1/organizations/usage_report/messages"),
            ("POST", "/v1/skills"),
            ("POST", "/v1/threads/thread_1/runs"),
        ] {
            assert!(!is_generation(method, url), "{method} {url}");
        }
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
