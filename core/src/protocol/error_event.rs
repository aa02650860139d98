//! A failure written as the provider's own error, so a client's SDK raises
//! on it as it would on the provider's.
//!
//! A proxy that cannot hide a failure must still say so in terms the client
//! understands. Once a streamed answer has begun (status 200 sent, some
//! events delivered), the only honest end is an in-stream error event of
//! the protocol the client speaks: ending the body quietly would look like
//! a finished answer to a lenient parser, and an HTTP status can no longer
//! be changed. Before anything was sent, a whole error body in the
//! provider's shape does the same for a non-streamed error response.
//!
//! The shapes are the ones the official SDKs raise on:
//!
//! | protocol | in-stream event | raised by |
//! |---|---|---|
//! | OpenAI Chat | `data: {"error":{"message",…}}` | `openai` (`Stream.__stream__`: any event whose data has `error`) |
//! | OpenAI Responses | `event: error` + `{"type":"error","code","message","param","error":{…}}` | the `ResponseErrorEvent` fields, plus the nested `error` the `openai` SDK raises on |
//! | Anthropic | `event: error` + `{"type":"error","error":{"type":"api_error"\|"overloaded_error",…}}` | `anthropic` (any `error` event) |
//! | Gemini | `data: {"error":{"code","message","status"}}` | `google-genai` (a chunk starting with `{"error":`) |
//! | Ollama | `{"error":"…"}` line | `ollama` (any line with `error`) |
//! | generic SSE | `event: error` + `{"error":{"type","message"}}` | — |
//!
//! The message is the caller's safe text (an outcome's `Display`, never
//! body text, prompt or credentials); it is escaped here, so any text makes
//! valid JSON.

use std::fmt::Write as _;

use crate::outcome::Outcome;

use super::ProtocolKind;

/// Which kind of provider error the failure is shown as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// A server-side failure (`server_error`, `api_error`, `INTERNAL`).
    Server,
    /// The provider was overloaded (`overloaded_error`, `UNAVAILABLE`):
    /// SDKs and clients treat it as a reason to come back later.
    Overloaded,
}

/// A failure to write in a provider's error shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFailure {
    /// How it is classed.
    pub class: ErrorClass,
    /// Safe text for the client: no body text, prompt or credentials.
    pub message: String,
    /// The Responses `sequence_number` the event takes, when known (the
    /// last one delivered plus 1).
    pub sequence_number: Option<u64>,
}

impl StreamFailure {
    /// A failure of `class` saying `message`.
    pub fn new(class: ErrorClass, message: impl Into<String>) -> Self {
        StreamFailure {
            class,
            message: message.into(),
            sequence_number: None,
        }
    }

    /// The failure a request that ended with `outcome` shows, `last_status`
    /// being the last HTTP status its attempts saw: overloaded after a
    /// `503` or `529` (the provider's own words for "come back later"),
    /// a server error otherwise. The message is the outcome's safe text.
    pub fn of_outcome(outcome: &Outcome, last_status: Option<u16>) -> Self {
        let class = match last_status {
            Some(503 | 529) => ErrorClass::Overloaded,
            _ => ErrorClass::Server,
        };
        StreamFailure::new(class, format!("recovery failed: {outcome}"))
    }

    /// The same failure with a Responses `sequence_number`.
    pub fn with_sequence_number(mut self, n: u64) -> Self {
        self.sequence_number = Some(n);
        self
    }
}

/// Appends `failure` to `out` as one in-stream error event of `protocol`:
/// a whole SSE event ending in a blank line, or one NDJSON line for Ollama.
pub fn write_error_event(protocol: &ProtocolKind, failure: &StreamFailure, out: &mut Vec<u8>) {
    let message = json_string(&failure.message);
    let mut s = String::with_capacity(128 + message.len());
    match protocol {
        ProtocolKind::OpenAiChat => {
            let _ = write!(
                s,
                "data: {{\"error\":{}}}\n\n",
                openai_error(failure.class, &message)
            );
        }
        ProtocolKind::OpenAiResponses => {
            let code = openai_code(failure.class);
            s.push_str("event: error\ndata: {\"type\":\"error\",");
            if let Some(n) = failure.sequence_number {
                let _ = write!(s, "\"sequence_number\":{n},");
            }
            let _ = write!(
                s,
                "\"code\":\"{code}\",\"message\":{message},\"param\":null,\"error\":{}}}\n\n",
                openai_error(failure.class, &message)
            );
        }
        ProtocolKind::Anthropic => {
            let _ = write!(
                s,
                "event: error\ndata: {}\n\n",
                anthropic_error(failure.class, &message)
            );
        }
        ProtocolKind::Gemini => {
            let status = match failure.class {
                ErrorClass::Overloaded => 503,
                ErrorClass::Server => 500,
            };
            let _ = write!(
                s,
                "data: {}\n\n",
                gemini_error(failure.class, status, &message)
            );
        }
        ProtocolKind::Ollama => {
            let _ = writeln!(s, "{{\"error\":{message}}}");
        }
        ProtocolKind::Sse { .. } => {
            let _ = write!(
                s,
                "event: error\ndata: {{\"error\":{{\"type\":\"{}\",\"message\":{message}}}}}\n\n",
                openai_type(failure.class)
            );
        }
    }
    out.extend_from_slice(s.as_bytes());
}

/// `failure` as a whole JSON error body of `protocol`, for an error
/// response with HTTP status `status` (a `502` a proxy answers when no
/// attempt produced a response of its own).
pub fn error_body(protocol: &ProtocolKind, failure: &StreamFailure, status: u16) -> Vec<u8> {
    let message = json_string(&failure.message);
    let body = match protocol {
        ProtocolKind::Anthropic => anthropic_error(failure.class, &message),
        ProtocolKind::Gemini => gemini_error(failure.class, status, &message),
        ProtocolKind::Ollama => format!("{{\"error\":{message}}}"),
        ProtocolKind::OpenAiChat | ProtocolKind::OpenAiResponses | ProtocolKind::Sse { .. } => {
            format!("{{\"error\":{}}}", openai_error(failure.class, &message))
        }
    };
    body.into_bytes()
}

fn openai_type(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Server => "server_error",
        ErrorClass::Overloaded => "overloaded_error",
    }
}

fn openai_code(class: ErrorClass) -> &'static str {
    match class {
        ErrorClass::Server => "server_error",
        ErrorClass::Overloaded => "overloaded",
    }
}

/// OpenAI's error object (`message`, `type`, `param`, `code`); `message`
/// is already a JSON string.
fn openai_error(class: ErrorClass, message: &str) -> String {
    format!(
        "{{\"message\":{message},\"type\":\"{}\",\"param\":null,\"code\":\"{}\"}}",
        openai_type(class),
        openai_code(class)
    )
}

fn anthropic_error(class: ErrorClass, message: &str) -> String {
    let kind = match class {
        ErrorClass::Server => "api_error",
        ErrorClass::Overloaded => "overloaded_error",
    };
    format!("{{\"type\":\"error\",\"error\":{{\"type\":\"{kind}\",\"message\":{message}}}}}")
}

/// Google's error object; its first key must be `error`: the `google-genai`
/// SDK recognises an error chunk by that prefix.
fn gemini_error(class: ErrorClass, code: u16, message: &str) -> String {
    let status = match class {
        ErrorClass::Server => "INTERNAL",
        ErrorClass::Overloaded => "UNAVAILABLE",
    };
    format!("{{\"error\":{{\"code\":{code},\"message\":{message},\"status\":\"{status}\"}}}}")
}

/// `text` as a JSON string literal, quotes included.
fn json_string(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            // Control characters, and the two line separators that some
            // JavaScript parsers reject inside strings.
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

#[cfg(all(test, feature = "serde_json"))]
mod tests {
    use super::*;
    use crate::outcome::InterruptCause;
    use serde_json::Value;

    fn failure(class: ErrorClass) -> StreamFailure {
        StreamFailure::new(class, "cut \"mid\"\nstream \u{1}")
    }

    fn event(protocol: &ProtocolKind, f: &StreamFailure) -> String {
        let mut out = Vec::new();
        write_error_event(protocol, f, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// The `event:` name and the parsed data of one SSE event.
    fn sse(text: &str) -> (Option<String>, Value) {
        assert!(text.ends_with("\n\n"), "a whole event: {text:?}");
        let mut name = None;
        let mut data = None;
        for line in text.trim_end().lines() {
            if let Some(v) = line.strip_prefix("event: ") {
                name = Some(v.to_owned());
            } else if let Some(v) = line.strip_prefix("data: ") {
                assert!(data.is_none(), "one data line");
                data = Some(serde_json::from_str(v).unwrap());
            } else {
                panic!("unexpected line {line:?}");
            }
        }
        (name, data.unwrap())
    }

    #[test]
    fn openai_chat_data_has_the_error_the_sdk_raises_on() {
        let (name, data) = sse(&event(
            &ProtocolKind::OpenAiChat,
            &failure(ErrorClass::Server),
        ));
        assert_eq!(name, None, "an unnamed event, as the API sends");
        assert_eq!(data["error"]["message"], "cut \"mid\"\nstream \u{1}");
        assert_eq!(data["error"]["type"], "server_error");
        assert!(data["error"]["param"].is_null());
    }

    #[test]
    fn responses_event_has_both_the_event_fields_and_the_nested_error() {
        let f = failure(ErrorClass::Overloaded).with_sequence_number(7);
        let (name, data) = sse(&event(&ProtocolKind::OpenAiResponses, &f));
        assert_eq!(name.as_deref(), Some("error"));
        assert_eq!(data["type"], "error");
        assert_eq!(data["sequence_number"], 7);
        assert_eq!(data["code"], "overloaded");
        assert_eq!(data["message"], f.message.as_str());
        assert_eq!(data["error"]["message"], f.message.as_str());
        let without = sse(&event(
            &ProtocolKind::OpenAiResponses,
            &failure(ErrorClass::Server),
        ))
        .1;
        assert!(without.get("sequence_number").is_none());
    }

    #[test]
    fn anthropic_error_types() {
        for (class, kind) in [
            (ErrorClass::Server, "api_error"),
            (ErrorClass::Overloaded, "overloaded_error"),
        ] {
            let (name, data) = sse(&event(&ProtocolKind::Anthropic, &failure(class)));
            assert_eq!(name.as_deref(), Some("error"));
            assert_eq!(data["type"], "error");
            assert_eq!(data["error"]["type"], kind);
            assert_eq!(data["error"]["message"], "cut \"mid\"\nstream \u{1}");
        }
    }

    #[test]
    fn gemini_chunk_starts_with_error() {
        let text = event(&ProtocolKind::Gemini, &failure(ErrorClass::Overloaded));
        assert!(text.starts_with("data: {\"error\":"), "{text}");
        let (_, data) = sse(&text);
        assert_eq!(data["error"]["code"], 503);
        assert_eq!(data["error"]["status"], "UNAVAILABLE");
    }

    #[test]
    fn ollama_line() {
        let text = event(&ProtocolKind::Ollama, &failure(ErrorClass::Server));
        assert!(text.ends_with('\n') && !text.ends_with("\n\n"));
        assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
        let data: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(data["error"], "cut \"mid\"\nstream \u{1}");
    }

    #[test]
    fn generic_sse() {
        let (name, data) = sse(&event(
            &ProtocolKind::Sse {
                terminal_sentinel: None,
            },
            &failure(ErrorClass::Server),
        ));
        assert_eq!(name.as_deref(), Some("error"));
        assert_eq!(data["error"]["type"], "server_error");
    }

    #[test]
    fn the_core_decoders_read_the_events_as_provider_errors() {
        use crate::observer::StreamObserver;
        for kind in [
            ProtocolKind::OpenAiChat,
            ProtocolKind::OpenAiResponses,
            ProtocolKind::Anthropic,
            ProtocolKind::Gemini,
            ProtocolKind::Ollama,
        ] {
            let mut observer = StreamObserver::new(kind.clone());
            let text = event(&kind, &failure(ErrorClass::Overloaded));
            observer.feed(text.as_bytes()).unwrap();
            assert!(
                observer.provider_error().is_some(),
                "{kind}: the event reads as the provider's error"
            );
        }
    }

    #[test]
    fn whole_bodies() {
        let f = failure(ErrorClass::Server);
        let body = |p: &ProtocolKind| -> Value {
            serde_json::from_slice(&error_body(p, &f, 502)).unwrap()
        };
        assert_eq!(
            body(&ProtocolKind::OpenAiChat)["error"]["type"],
            "server_error"
        );
        assert_eq!(body(&ProtocolKind::Anthropic)["error"]["type"], "api_error");
        assert_eq!(body(&ProtocolKind::Gemini)["error"]["code"], 502);
        assert_eq!(body(&ProtocolKind::Ollama)["error"], f.message.as_str());
    }

    #[test]
    fn outcome_text_and_class() {
        let outcome = Outcome::Interrupted {
            cause: InterruptCause::Transport,
            stall: None,
            committed: true,
        };
        let f = StreamFailure::of_outcome(&outcome, Some(200));
        assert_eq!(f.class, ErrorClass::Server);
        assert!(
            f.message.contains("interrupted after commit"),
            "{}",
            f.message
        );
        let f = StreamFailure::of_outcome(&Outcome::Exhausted { attempts: 3 }, Some(529));
        assert_eq!(f.class, ErrorClass::Overloaded);
    }

    #[test]
    fn every_control_character_is_escaped() {
        let all: String = (0u8..0x20).map(char::from).collect::<String>() + "\u{2028}\"\\é";
        let s = json_string(&all);
        let back: String = serde_json::from_str(&s).unwrap();
        assert_eq!(back, all);
        assert!(!s.bytes().skip(1).take(s.len() - 2).any(|b| b < 0x20));
    }
}
