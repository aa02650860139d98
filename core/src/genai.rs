//! What the OpenTelemetry GenAI conventions say of a request, read from the
//! request itself: the operation, the provider, the model asked for and
//! whether it streams. Every driver that records spans or metrics names a
//! request the same way, so a dashboard reads the library, the gateway and
//! the bindings alike.
//!
//! The attribute values follow the conventions' registries:
//! `gen_ai.operation.name` is `chat` (Chat Completions, Responses,
//! Anthropic Messages, Ollama `/api/chat`), `generate_content` (Gemini) or
//! `text_completion` (Ollama `/api/generate`, `/v1/completions`);
//! `gen_ai.provider.name` is the provider of a well-known API host, else
//! the protocol's owner (`openai` for the OpenAI-compatible servers,
//! `anthropic`, `gcp.gemini`, `ollama`).

use crate::body_fields::BodyFields;
use crate::json::JsonView;
use crate::progress::is_model_name;
use crate::protocol::ProtocolKind;

/// A request as the GenAI conventions describe it (the default: a chat
/// request to an OpenAI-compatible server, of no known model, not
/// streamed).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GenAiRequest {
    /// `gen_ai.operation.name`.
    pub operation: &'static str,
    /// `gen_ai.provider.name`.
    pub provider: &'static str,
    /// `gen_ai.request.model`, when the request names one of a safe shape.
    pub model: Option<String>,
    /// `gen_ai.request.stream`: whether the answer is asked for as a stream.
    pub stream: bool,
}

impl Default for GenAiRequest {
    fn default() -> Self {
        GenAiRequest {
            operation: "chat",
            provider: "openai",
            model: None,
            stream: false,
        }
    }
}

impl GenAiRequest {
    /// Reads a request to `url` whose body has `fields`, answered in
    /// `protocol`.
    pub fn of(protocol: &ProtocolKind, url: &str, fields: &BodyFields<'_>) -> Self {
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let model = || {
            fields
                .model()
                .and_then(JsonView::text)
                .map(std::borrow::Cow::into_owned)
        };
        let stream_flag = fields.stream();
        let (operation, model, stream) = match protocol {
            ProtocolKind::Gemini => (
                "generate_content",
                gemini_model(path),
                path.contains(":streamGenerateContent"),
            ),
            ProtocolKind::Ollama => (
                if path.ends_with("/api/generate") {
                    "text_completion"
                } else {
                    "chat"
                },
                model(),
                // Ollama streams unless told not to.
                stream_flag.unwrap_or(true),
            ),
            _ => (
                if path.trim_end_matches('/').ends_with("/completions") && !path.contains("/chat/")
                {
                    "text_completion"
                } else {
                    "chat"
                },
                model(),
                stream_flag.unwrap_or(false),
            ),
        };
        GenAiRequest {
            operation,
            provider: provider(protocol, url),
            model: model.filter(|m| is_model_name(m)),
            stream,
        }
    }

    /// The span name the conventions give: `{operation} {model}`, or the
    /// operation alone when no model is known.
    pub fn span_name(&self) -> String {
        match &self.model {
            Some(m) => format!("{} {m}", self.operation),
            None => self.operation.to_owned(),
        }
    }
}

/// `models/{model}:streamGenerateContent` in a Gemini path.
fn gemini_model(path: &str) -> Option<String> {
    let at = path.rfind("/models/")? + "/models/".len();
    let rest = &path[at..];
    let end = rest.find(':').unwrap_or(rest.len());
    Some(rest[..end].to_owned()).filter(|m| !m.is_empty())
}

/// The provider of a well-known host, else the protocol's owner.
fn provider(protocol: &ProtocolKind, url: &str) -> &'static str {
    const HOSTS: [(&str, &str); 11] = [
        ("api.openai.com", "openai"),
        ("api.anthropic.com", "anthropic"),
        ("generativelanguage.googleapis.com", "gcp.gemini"),
        ("aiplatform.googleapis.com", "gcp.vertex_ai"),
        ("openai.azure.com", "azure.ai.openai"),
        ("api.groq.com", "groq"),
        ("api.mistral.ai", "mistral_ai"),
        ("api.deepseek.com", "deepseek"),
        ("api.x.ai", "x_ai"),
        ("api.perplexity.ai", "perplexity"),
        ("api.cohere.com", "cohere"),
    ];
    let host = url.split_once("://").map_or("", |(_, rest)| {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        authority.split(':').next().unwrap_or(authority)
    });
    for (suffix, name) in HOSTS {
        if host == suffix || host.ends_with(&format!(".{suffix}")) {
            return name;
        }
    }
    match protocol {
        ProtocolKind::Anthropic => "anthropic",
        ProtocolKind::Gemini => "gcp.gemini",
        ProtocolKind::Ollama => "ollama",
        _ => "openai",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Generation;

    fn of(protocol: &ProtocolKind, url: &str, body: &[u8]) -> GenAiRequest {
        GenAiRequest::of(protocol, url, &BodyFields::read(body))
    }

    #[test]
    fn chat_names_the_model_and_the_stream() {
        let r = of(
            &ProtocolKind::OpenAiChat,
            "https://api.openai.com/v1/chat/completions",
            br#"{"model":"gpt-4o-mini","stream":true,"messages":[]}"#,
        );
        assert_eq!(r.operation, "chat");
        assert_eq!(r.provider, "openai");
        assert_eq!(r.model.as_deref(), Some("gpt-4o-mini"));
        assert!(r.stream);
        assert_eq!(r.span_name(), "chat gpt-4o-mini");
    }

    #[test]
    fn gemini_reads_the_model_from_the_path() {
        let r = of(
            &ProtocolKind::Gemini,
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
            b"{}",
        );
        assert_eq!(r.operation, "generate_content");
        assert_eq!(r.provider, "gcp.gemini");
        assert_eq!(r.model.as_deref(), Some("gemini-2.5-flash"));
        assert!(r.stream);
    }

    #[test]
    fn an_unknown_host_is_named_by_its_protocol() {
        let anthropic = of(
            &ProtocolKind::Anthropic,
            "http://127.0.0.1:9/v1/messages",
            br#"{"model":"claude-sonnet-4-5","stream":true}"#,
        );
        assert_eq!(anthropic.provider, "anthropic");
        let groq = of(
            &ProtocolKind::OpenAiChat,
            "https://user@api.groq.com:443/openai/v1/chat/completions",
            b"{}",
        );
        assert_eq!(groq.provider, "groq");
        let ollama = of(&ProtocolKind::Ollama, "/api/generate", br#"{"model":"m"}"#);
        assert_eq!(
            (ollama.provider, ollama.operation, ollama.stream),
            ("ollama", "text_completion", true)
        );
    }

    #[test]
    fn a_model_of_an_unsafe_shape_or_a_body_not_json_names_none() {
        for body in [
            &br#"{"model":"a b"}"#[..],
            br#"{"model":"<script>"}"#,
            br#"{"model":7}"#,
            b"not json",
            b"",
        ] {
            let r = of(&ProtocolKind::OpenAiChat, "/v1/chat/completions", body);
            assert_eq!(r.model, None, "{body:?}");
            assert_eq!(r.span_name(), "chat");
        }
        let long = format!(
            r#"{{"model":"{}"}}"#,
            "m".repeat(Generation::MAX_MODEL_LEN + 1)
        );
        let r = of(
            &ProtocolKind::OpenAiChat,
            "/v1/chat/completions",
            long.as_bytes(),
        );
        assert_eq!(r.model, None);
    }
}
