//! Continuing a committed stream instead of failing it.
//!
//! After the first semantic fragment a replay is forbidden, but some
//! protocols let a stream *continue* from a cursor. This module decides,
//! from the original request and the cursor, whether a resume is possible
//! and builds the resume request; it also declares, per protocol, which
//! capabilities exist and the public source each declaration rests on.

use serde::{Deserialize, Serialize};

#[cfg(test)]
use crate::body_fields::BodyFields;
use crate::progress::ResumeCursor;
use crate::protocol::ProtocolKind;

/// Whether a protocol offers a capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Support {
    /// Offered, with the preconditions documented by the source.
    Supported,
    /// Not offered.
    Unsupported,
    /// The provider does not say.
    Unknown,
}

/// One capability and why it is declared so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Declared {
    /// The declaration.
    pub support: Support,
    /// The public source it is based on.
    pub source: &'static str,
}

/// What a protocol offers beyond replay-before-commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// Continuing a committed stream from a cursor.
    pub resume: Declared,
    /// Stopping a generation on the server.
    pub remote_cancellation: Declared,
    /// Idempotency keys that make a resend safe.
    pub idempotency: Declared,
    /// Proof that a given attempt's generation stopped on the server.
    pub exact_attempt_termination: Declared,
}

const fn declared(support: Support, source: &'static str) -> Declared {
    Declared { support, source }
}

const NO_IDEMPOTENCY: &str = "no idempotency key is documented for generation requests";
const NO_TERMINATION: &str = "closing a connection does not prove the remote generation stopped";

/// The capabilities of `kind`.
pub fn capabilities(kind: &ProtocolKind) -> Capabilities {
    let unsupported_cancel = declared(
        Support::Unsupported,
        "no documented endpoint cancels a running streamed generation",
    );
    let base = Capabilities {
        resume: declared(Support::Unsupported, "no documented stream resume"),
        remote_cancellation: unsupported_cancel,
        idempotency: declared(Support::Unsupported, NO_IDEMPOTENCY),
        exact_attempt_termination: declared(Support::Unknown, NO_TERMINATION),
    };
    match kind {
        ProtocolKind::OpenAiResponses => Capabilities {
            resume: declared(
                Support::Supported,
                "OpenAI background mode: GET /v1/responses/{id}?stream=true&starting_after=N \
                 for responses created with background: true and stream: true",
            ),
            remote_cancellation: declared(
                Support::Supported,
                "OpenAI background mode: POST /v1/responses/{id}/cancel",
            ),
            ..base
        },
        ProtocolKind::Sse { .. } => Capabilities {
            resume: declared(
                Support::Unknown,
                "WHATWG server-sent events: Last-Event-ID, honoured only by servers that \
                 implement it; the caller declares an endpoint resumable",
            ),
            ..base
        },
        ProtocolKind::Anthropic => Capabilities {
            resume: declared(
                Support::Unsupported,
                "Anthropic Messages streaming has no resume; recovery is a new request \
                 (prompt-level continuation)",
            ),
            ..base
        },
        ProtocolKind::OpenAiChat | ProtocolKind::Gemini | ProtocolKind::Ollama => base,
    }
}

/// How a committed stream will be continued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "strategy")]
pub(crate) enum ResumePlan {
    /// OpenAI Responses background stream, continued after a sequence number.
    ResponsesBackground {
        /// The response id.
        response_id: String,
        /// The last sequence number forwarded to the consumer.
        after_sequence: u64,
    },
    /// A declared-resumable SSE endpoint, re-requested with `Last-Event-ID`.
    LastEventId {
        /// The last event id forwarded to the consumer (never empty).
        last_event_id: String,
    },
}

/// Whether a resume strategy can apply to a request of `kind` at all, before
/// any cursor is known (drivers then deliver event by event, so that a seam
/// never splits an event).
#[cfg(test)]
pub(crate) fn may_resume(kind: &ProtocolKind, sse_resumable: bool, request_body: &[u8]) -> bool {
    native_resume(
        kind,
        sse_resumable,
        BodyFields::read(request_body).background_stream(),
    )
}

/// Whether a resume strategy can apply to a request of `kind` at all
/// (before any cursor is known), with the request body already judged: `background` when
/// it asked for `background: true` and `stream: true`.
///
/// A declared-resumable endpoint (`sse_resumable`: a relay such as
/// `recovery-gateway` that honours `Last-Event-ID`) resumes a stream of any
/// SSE protocol; Ollama's NDJSON has no event ids.
pub(crate) fn native_resume(kind: &ProtocolKind, sse_resumable: bool, background: bool) -> bool {
    match kind {
        ProtocolKind::OpenAiResponses if background => true,
        ProtocolKind::Ollama => false,
        _ => sse_resumable,
    }
}

/// The resume possible for a stream of `kind` at `cursor`, if any.
///
/// Responses: only for a request created with `background: true` and
/// `stream: true`, once the response id and a sequence number are known.
/// SSE: only when the caller declared the endpoint resumable and a non-empty
/// event id was forwarded; never with an empty `Last-Event-ID` (providers
/// ignore it and the consumer would get the whole answer again).
#[cfg(test)]
pub(crate) fn plan(
    kind: &ProtocolKind,
    sse_resumable: bool,
    request_body: &[u8],
    cursor: &ResumeCursor,
) -> Option<ResumePlan> {
    if may_resume(kind, sse_resumable, request_body) {
        plan_at(
            kind,
            BodyFields::read(request_body).background_stream(),
            cursor,
        )
    } else {
        None
    }
}

/// The plan at `cursor` for a request [`may_resume`] allows: a background
/// Responses stream from its sequence number, any other from its last
/// event id.
pub(crate) fn plan_at(
    kind: &ProtocolKind,
    background: bool,
    cursor: &ResumeCursor,
) -> Option<ResumePlan> {
    match kind {
        ProtocolKind::OpenAiResponses if background => {
            let (Some(id), Some(seq)) = (&cursor.response_id, cursor.sequence_number) else {
                return None;
            };
            Some(ResumePlan::ResponsesBackground {
                response_id: id.clone(),
                after_sequence: seq,
            })
        }
        _ => cursor
            .last_event_id
            .as_ref()
            .filter(|id| !id.is_empty())
            .map(|id| ResumePlan::LastEventId {
                last_event_id: id.clone(),
            }),
    }
}

/// Why a resume request could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResumeRequestError {
    /// The original URI does not end in `/responses`.
    NotAResponsesUri,
    /// The id or cursor cannot be put in a URI or header.
    InvalidCursor,
}

impl std::fmt::Display for ResumeRequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ResumeRequestError::NotAResponsesUri => "the request URI does not end in /responses",
            ResumeRequestError::InvalidCursor => "the resume cursor is not URI- or header-safe",
        })
    }
}

impl std::error::Error for ResumeRequestError {}

/// How a resume request differs from the original request, for a driver
/// to build it in its own types.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResumeRequest {
    /// The method: `GET` for a Responses resume, else the original one.
    pub method: String,
    /// The URL to send to (the original, or its Responses resume URL).
    pub url: String,
    /// A header to set (`last-event-id`), lowercase name.
    pub header: Option<(&'static str, String)>,
    /// Whether the original body is sent again; without it, drop the
    /// body's headers (`content-type`, `content-length`,
    /// `transfer-encoding`).
    pub with_body: bool,
}

/// Headers that describe a request body, dropped with it.
pub const BODY_HEADERS: [&str; 3] = ["content-type", "content-length", "transfer-encoding"];

impl ResumePlan {
    /// The resume request, from the original request's method and URL (an
    /// absolute URL or a path with its query).
    pub(crate) fn request(
        &self,
        method: &str,
        url: &str,
    ) -> Result<ResumeRequest, ResumeRequestError> {
        match self {
            ResumePlan::ResponsesBackground {
                response_id,
                after_sequence,
            } => {
                let safe = !response_id.is_empty()
                    && response_id
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !safe {
                    return Err(ResumeRequestError::InvalidCursor);
                }
                let base = url.split(['?', '#']).next().unwrap_or(url);
                let base = base.trim_end_matches('/');
                if !base.ends_with("/responses") {
                    return Err(ResumeRequestError::NotAResponsesUri);
                }
                Ok(ResumeRequest {
                    method: "GET".to_owned(),
                    url: {
                        let mut url = crate::text::joined(&[
                            base,
                            "/",
                            response_id,
                            "?stream=true&starting_after=",
                        ]);
                        crate::text::push_decimal(&mut url, *after_sequence);
                        url
                    },
                    header: None,
                    with_body: false,
                })
            }
            ResumePlan::LastEventId { last_event_id } => {
                let header_safe = last_event_id
                    .bytes()
                    .all(|b| b == b'\t' || (0x20..0x7f).contains(&b));
                if !header_safe {
                    return Err(ResumeRequestError::InvalidCursor);
                }
                Ok(ResumeRequest {
                    method: method.to_owned(),
                    url: url.to_owned(),
                    header: Some(("last-event-id", last_event_id.clone())),
                    with_body: true,
                })
            }
        }
    }

    /// The head of the resume request, derived from the original request's
    /// head ([`ResumePlan::request`] in `http` types). The body is empty
    /// for a Responses `GET`, and the original body for a `Last-Event-ID`
    /// resend.
    #[cfg(test)]
    pub(crate) fn request_head(
        &self,
        original: &http::request::Parts,
    ) -> Result<(http::request::Parts, bool), ResumeRequestError> {
        let req = self.request(original.method.as_str(), &original.uri.to_string())?;
        let mut head = original.clone();
        head.method = http::Method::from_bytes(req.method.as_bytes())
            .map_err(|_| ResumeRequestError::InvalidCursor)?;
        head.uri = req
            .url
            .parse()
            .map_err(|_| ResumeRequestError::InvalidCursor)?;
        if let Some((name, value)) = req.header {
            let value = http::HeaderValue::from_str(&value)
                .map_err(|_| ResumeRequestError::InvalidCursor)?;
            head.headers.insert(name, value);
        }
        if !req.with_body {
            for name in BODY_HEADERS {
                head.headers.remove(name);
            }
        }
        Ok((head, req.with_body))
    }

    /// The cursor after which the resumed stream's events are new, for
    /// dropping the ones a server repeats.
    pub(crate) fn after_sequence(&self) -> Option<u64> {
        match self {
            ResumePlan::ResponsesBackground { after_sequence, .. } => Some(*after_sequence),
            ResumePlan::LastEventId { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(id: Option<&str>, seq: Option<u64>, event: Option<&str>) -> ResumeCursor {
        ResumeCursor {
            last_event_id: event.map(str::to_owned),
            response_id: id.map(str::to_owned),
            sequence_number: seq,
        }
    }

    #[test]
    fn responses_resume_needs_background_and_stream() {
        let c = cursor(Some("resp_1"), Some(7), None);
        let bg = br#"{"model":"m","stream":true,"background":true,"input":"x"}"#;
        let fg = br#"{"model":"m","stream":true,"input":"x"}"#;
        assert_eq!(
            plan(&ProtocolKind::OpenAiResponses, false, bg, &c),
            Some(ResumePlan::ResponsesBackground {
                response_id: "resp_1".into(),
                after_sequence: 7
            })
        );
        assert_eq!(plan(&ProtocolKind::OpenAiResponses, false, fg, &c), None);
        assert_eq!(
            plan(
                &ProtocolKind::OpenAiResponses,
                false,
                bg,
                &cursor(None, Some(7), None)
            ),
            None,
            "RS9: no id yet"
        );
        assert_eq!(plan(&ProtocolKind::OpenAiChat, true, bg, &c), None);
    }

    #[test]
    fn responses_resume_request_is_a_get_after_the_cursor() {
        let original = http::Request::post("https://api.example/v1/responses")
            .header("authorization", "Bearer k")
            .header("content-type", "application/json")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let plan = ResumePlan::ResponsesBackground {
            response_id: "resp_abc".into(),
            after_sequence: 12,
        };
        let (head, with_body) = plan.request_head(&original).unwrap();
        assert!(!with_body);
        assert_eq!(head.method, http::Method::GET);
        assert_eq!(
            head.uri.to_string(),
            "https://api.example/v1/responses/resp_abc?stream=true&starting_after=12"
        );
        assert_eq!(head.headers["authorization"], "Bearer k");
        assert!(head.headers.get("content-type").is_none());
        let evil = ResumePlan::ResponsesBackground {
            response_id: "../x?y".into(),
            after_sequence: 1,
        };
        assert_eq!(
            evil.request_head(&original).unwrap_err(),
            ResumeRequestError::InvalidCursor
        );
    }

    #[test]
    fn sse_resume_only_when_declared_and_never_with_an_empty_id() {
        let kind = ProtocolKind::Sse {
            terminal_sentinel: None,
        };
        let c = cursor(None, None, Some("42"));
        assert!(
            plan(&kind, false, b"", &c).is_none(),
            "not declared resumable"
        );
        assert!(plan(&kind, true, b"", &cursor(None, None, Some(""))).is_none());
        let p = plan(&kind, true, b"", &c).unwrap();
        let original = http::Request::post("http://h/stream")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let (head, with_body) = p.request_head(&original).unwrap();
        assert!(with_body);
        assert_eq!(head.headers["last-event-id"], "42");
        assert_eq!(head.method, http::Method::POST);
    }

    #[test]
    fn capabilities_name_their_source() {
        for kind in [
            ProtocolKind::OpenAiChat,
            ProtocolKind::OpenAiResponses,
            ProtocolKind::Anthropic,
            ProtocolKind::Gemini,
            ProtocolKind::Ollama,
        ] {
            let c = capabilities(&kind);
            assert!(!c.resume.source.is_empty());
        }
        assert_eq!(
            capabilities(&ProtocolKind::OpenAiResponses).resume.support,
            Support::Supported
        );
        assert_eq!(
            capabilities(&ProtocolKind::OpenAiChat).resume.support,
            Support::Unsupported
        );
    }
}
