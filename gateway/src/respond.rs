//! The one place a refusal or a failure becomes a response.
//!
//! Every answer the gateway writes itself is a [`Refusal`]: why, and which
//! status says who should act (4xx the client, 5xx the gateway or the
//! upstream). It is written in the error shape of the protocol the request
//! speaks, so the client's SDK raises it as its own API error type with
//! the message: OpenAI's `{"error":{"message","type","param","code"}}`,
//! Anthropic's `{"type":"error","error":{"type","message"}}`, Google's
//! `{"error":{"code","message","status"}}`, Ollama's `{"error":"…"}`. The
//! message never repeats request content or credentials.

use http::header::{ALLOW, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::{ErrorClass, StreamFailure, error_body};

use crate::body::{GatewayBody, json};

/// Why the gateway answers a request itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No route matches and there is no default upstream.
    NoRoute,
    /// A method the gateway never forwards (`CONNECT`, `TRACE`), or not
    /// `GET` on a reserved path.
    MethodNotAllowed(&'static str),
    /// A path with dot or empty segments or backslashes.
    BadPath,
    /// An absolute-form target naming another authority.
    ForeignAuthority,
    /// `[[clients]]` are configured and the request names none of them.
    Unauthorized,
    /// A reconnect to a stream this caller cannot read (or none).
    StreamNotFound,
    /// `after` is not a number.
    BadAfter,
    /// The stream log cannot be read now.
    StreamLogUnavailable,
    /// Every stream slot is taken.
    TooManyStreams,
    /// The stream has as many readers as it may have.
    TooManyReaders,
    /// The request body is over the limit.
    BodyTooLarge(usize),
    /// The request bodies held at once fill their budget.
    BodiesFull,
    /// The request body did not arrive within its deadline or rate.
    BodyTooSlow,
    /// The request body could not be read.
    BodyUnreadable,
    /// The request body is not JSON.
    InvalidJson,
    /// The request cannot be turned into an upstream request.
    Unforwardable,
    /// Recovery failed before anything reached the client.
    Upstream(StreamFailure),
}

impl Refusal {
    fn status(&self, protocol: &ProtocolKind) -> StatusCode {
        match self {
            Refusal::NoRoute | Refusal::StreamNotFound => StatusCode::NOT_FOUND,
            Refusal::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Refusal::BadPath
            | Refusal::ForeignAuthority
            | Refusal::BadAfter
            | Refusal::BodyUnreadable
            | Refusal::InvalidJson
            | Refusal::Unforwardable => StatusCode::BAD_REQUEST,
            Refusal::Unauthorized => StatusCode::UNAUTHORIZED,
            Refusal::StreamLogUnavailable
            | Refusal::TooManyStreams
            | Refusal::TooManyReaders
            | Refusal::BodiesFull => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::BodyTooSlow => StatusCode::REQUEST_TIMEOUT,
            // Anthropic's own word for overloaded is 529, which its SDK
            // raises as `OverloadedError`; the others say 503.
            Refusal::Upstream(f) => match (f.class, protocol) {
                (ErrorClass::Overloaded, ProtocolKind::Anthropic) => {
                    StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
                }
                (ErrorClass::Overloaded, _) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::BAD_GATEWAY,
            },
        }
    }

    /// The error's `type` (OpenAI, Anthropic) and its text.
    fn words(&self) -> (&'static str, String) {
        let (kind, text): (&str, &str) = match self {
            Refusal::NoRoute => (
                "no_route",
                "no route matches this path and no default upstream is configured",
            ),
            Refusal::MethodNotAllowed(allow) => (
                "method_not_allowed",
                if *allow == "GET" {
                    "this path is the gateway's own and answers GET only"
                } else {
                    "the gateway does not forward this method"
                },
            ),
            Refusal::BadPath => (
                "invalid_path",
                "the path has dot segments, empty segments or backslashes; it was not forwarded",
            ),
            Refusal::ForeignAuthority => (
                "invalid_request",
                "an absolute request target must name this gateway",
            ),
            Refusal::Unauthorized => (
                "authentication_error",
                "no valid client key: send the key the gateway's operator gave you as your SDK's API key",
            ),
            Refusal::StreamNotFound => (
                "stream_not_found",
                "no stream with this id: it never existed or it expired",
            ),
            Refusal::BadAfter => ("invalid_request", "`after` must be a sequence number"),
            Refusal::StreamLogUnavailable => (
                "stream_log_unavailable",
                "the gateway's stream log cannot be read now",
            ),
            Refusal::TooManyStreams => (
                "too_many_streams",
                "the gateway is at its concurrent stream limit; retry later",
            ),
            Refusal::BodiesFull => (
                "too_many_request_bytes",
                "the gateway holds as many request bytes as it may at once; retry later",
            ),
            Refusal::TooManyReaders => (
                "too_many_readers",
                "this stream has as many readers as the gateway allows; retry later",
            ),
            Refusal::BodyTooLarge(max) => {
                return (
                    "request_too_large",
                    format!("the request body is over the gateway's limit of {max} bytes"),
                );
            }
            Refusal::BodyTooSlow => (
                "request_timeout",
                "the request body did not arrive within the gateway's read deadline",
            ),
            Refusal::BodyUnreadable => ("invalid_request", "the request body could not be read"),
            Refusal::InvalidJson => (
                "invalid_json",
                "the request body is not valid JSON; it was not forwarded",
            ),
            Refusal::Unforwardable => ("invalid_request", "the request cannot be forwarded"),
            Refusal::Upstream(f) => {
                let kind = match f.class {
                    ErrorClass::Overloaded => "overloaded_error",
                    _ => "api_error",
                };
                return (kind, f.message.clone());
            }
        };
        (kind, text.to_owned())
    }

    /// The response, in the error shape of `protocol`.
    pub(crate) fn respond(&self, protocol: &ProtocolKind) -> Response<GatewayBody> {
        let status = self.status(protocol);
        // Recovery's own failures keep core's shapes (and classes).
        let body = if let Refusal::Upstream(f) = self {
            error_body(protocol, f, status.as_u16())
        } else {
            let (kind, text) = self.words();
            shaped(protocol, status, kind, &text)
        };
        let mut resp = json(status, body);
        let h = resp.headers_mut();
        match self {
            Refusal::MethodNotAllowed(allow) => {
                h.insert(ALLOW, HeaderValue::from_static(allow));
            }
            Refusal::TooManyStreams
            | Refusal::TooManyReaders
            | Refusal::StreamLogUnavailable
            | Refusal::BodiesFull => {
                h.insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        resp
    }
}

/// Google's status name of an HTTP status.
fn google_status(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        405 => "UNIMPLEMENTED",
        408 => "DEADLINE_EXCEEDED",
        429 => "RESOURCE_EXHAUSTED",
        503 => "UNAVAILABLE",
        _ => "INTERNAL",
    }
}

fn shaped(protocol: &ProtocolKind, status: StatusCode, kind: &str, message: &str) -> Vec<u8> {
    let value = match protocol {
        ProtocolKind::Anthropic => serde_json::json!({
            "type": "error",
            "error": { "type": kind, "message": message },
        }),
        ProtocolKind::Gemini => serde_json::json!({
            "error": {
                "code": status.as_u16(),
                "message": message,
                "status": google_status(status),
            },
        }),
        ProtocolKind::Ollama => serde_json::json!({ "error": message }),
        _ => serde_json::json!({
            "error": { "message": message, "type": kind, "param": null, "code": kind },
        }),
    };
    value.to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt as _;

    async fn body(resp: Response<GatewayBody>) -> serde_json::Value {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[tokio::test]
    async fn each_protocol_gets_its_own_error_shape() {
        let r = Refusal::Unauthorized;
        let v = body(r.respond(&ProtocolKind::OpenAiChat)).await;
        assert_eq!(v["error"]["type"], "authentication_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("client key")
        );
        let v = body(r.respond(&ProtocolKind::Anthropic)).await;
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "authentication_error");
        let v = body(r.respond(&ProtocolKind::Gemini)).await;
        assert_eq!(v["error"]["code"], 401);
        assert_eq!(v["error"]["status"], "UNAUTHENTICATED");
        let v = body(r.respond(&ProtocolKind::Ollama)).await;
        assert!(v["error"].as_str().unwrap().contains("client key"));
        let resp = Refusal::TooManyStreams.respond(&ProtocolKind::OpenAiChat);
        assert_eq!(resp.status(), 503);
        assert_eq!(resp.headers()[RETRY_AFTER], "1");
        let resp = Refusal::MethodNotAllowed("GET").respond(&ProtocolKind::OpenAiChat);
        assert_eq!(resp.headers()[ALLOW], "GET");
        let failure = StreamFailure::new(ErrorClass::Overloaded, "recovery failed: x");
        let resp = Refusal::Upstream(failure.clone()).respond(&ProtocolKind::Anthropic);
        assert_eq!(resp.status(), 529, "Anthropic's overloaded");
        assert_eq!(
            Refusal::Upstream(failure.clone())
                .respond(&ProtocolKind::OpenAiChat)
                .status(),
            503
        );
        assert_eq!(body(resp).await["error"]["type"], "overloaded_error");
    }
}
