//! One request: a reserved path, a reconnect, or a forward upstream.
//!
//! Reserved: `GET /healthz`, `GET /metrics`, `GET /streams/<id>?after=N`.
//! A request with `Last-Event-ID: <stream>:<seq>` naming one of the
//! gateway's streams is a reconnect, whatever its method and path: no
//! upstream request is made. Everything else is forwarded.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{
    CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, RETRY_AFTER,
};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Limited};
use recovery_core::protocol::error_event::{StreamFailure, error_body, write_error_event};
use recovery_core::protocol::{BodyForm, ProtocolKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;
use tower_recovery::ReportHandle;

use crate::body::{GatewayBody, json, json_error, streaming};
use crate::forward::{Upstream, UpstreamBody, response_headers, upstream_request};
use crate::log::LogError;
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::routes::Router;
use crate::sse::parse_last_event_id;
use crate::streams::{NewStream, Streams};

/// The response header naming a resumable stream.
pub const STREAM_ID_HEADER: &str = "x-recovery-stream-id";

/// What every request shares.
pub(crate) struct State {
    pub(crate) router: Router,
    pub(crate) upstream: Upstream,
    pub(crate) streams: Arc<Streams>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) logger: Logger,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) max_body_bytes: usize,
}

/// Answers one request; never fails (every error is a JSON response).
pub(crate) async fn handle<B>(state: Arc<State>, req: Request<B>) -> Response<GatewayBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let path = req.uri().path().to_owned();
    match path.as_str() {
        "/healthz" => return reserved_get(&req, || json(StatusCode::OK, r#"{"status":"ok"}"#)),
        "/metrics" => {
            return reserved_get(&req, || {
                let mut resp = Response::new(crate::body::full(state.metrics.render()));
                resp.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                resp
            });
        }
        _ => {}
    }
    if let Some(id) = path.strip_prefix("/streams/") {
        if req.method() != Method::GET {
            return method_not_allowed();
        }
        let after = match after_param(req.uri().query()) {
            Ok(n) => n,
            Err(resp) => return *resp,
        };
        let guess = ProtocolKind::guess(&path);
        return reconnect(&state, id, after, guess).await;
    }
    let last_event_id = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_last_event_id)
        .map(|(id, seq)| (id.to_owned(), seq));
    if let Some((id, seq)) = last_event_id {
        let guess = ProtocolKind::guess(&path);
        return reconnect(&state, &id, seq, guess).await;
    }
    forward(state, req).await
}

fn reserved_get<B>(
    req: &Request<B>,
    answer: impl FnOnce() -> Response<GatewayBody>,
) -> Response<GatewayBody> {
    if req.method() == Method::GET || req.method() == Method::HEAD {
        answer()
    } else {
        method_not_allowed()
    }
}

fn method_not_allowed() -> Response<GatewayBody> {
    let mut resp = json_error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this path is the gateway's own and answers GET only",
    );
    resp.headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static("GET"));
    resp
}

fn after_param(query: Option<&str>) -> Result<u64, Box<Response<GatewayBody>>> {
    let Some(q) = query else { return Ok(0) };
    for pair in q.split('&') {
        if let Some(v) = pair.strip_prefix("after=") {
            return v.parse().map_err(|_| {
                Box::new(json_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "`after` must be a sequence number",
                ))
            });
        }
    }
    Ok(0)
}

async fn reconnect(
    state: &Arc<State>,
    id: &str,
    after: u64,
    guess: ProtocolKind,
) -> Response<GatewayBody> {
    match state.streams.attach(id, after, guess).await {
        Ok(attached) => {
            let mut resp = Response::new(attached.body);
            let h = resp.headers_mut();
            h.insert(CONTENT_TYPE, attached.content_type);
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            if let Ok(v) = HeaderValue::from_str(id) {
                h.insert(HeaderName::from_static(STREAM_ID_HEADER), v);
            }
            resp
        }
        Err(LogError::Unknown) => json_error(
            StatusCode::NOT_FOUND,
            "stream_not_found",
            "no stream with this id: it never existed or it expired",
        ),
        Err(e) => {
            state.logger.warn(
                "stream_log_error",
                "a reconnect could not read the stream log",
                &[
                    ("stream_id", Field::Str(id)),
                    ("error", Field::Str(&e.to_string())),
                ],
            );
            json_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "stream_log_unavailable",
                "the gateway's stream log cannot be read now",
            )
        }
    }
}

/// Whether a body with this content type must be JSON: JSON media types,
/// and no content type at all (what LLM APIs take; a client that sends
/// something else says so).
fn must_be_json(content_type: Option<&HeaderValue>) -> bool {
    match content_type.and_then(|v| v.to_str().ok()) {
        None => true,
        Some(ct) => BodyForm::of(Some(ct)) == BodyForm::WholeJson,
    }
}

async fn forward<B>(state: Arc<State>, req: Request<B>) -> Response<GatewayBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let Some(target) = state.router.target(req.uri().path(), req.uri().query()) else {
        return json_error(
            StatusCode::NOT_FOUND,
            "no_route",
            "no route matches this path and no default upstream is configured",
        );
    };
    let Ok(permit) = Arc::clone(&state.permits).try_acquire_owned() else {
        state.metrics.rejected();
        let mut resp = json_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            "the gateway is at its concurrent stream limit; retry later",
        );
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return resp;
    };
    let max = state.max_body_bytes;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) || req.body().size_hint().lower() > max as u64 {
        return too_large(max);
    }
    let (parts, body) = req.into_parts();
    let bytes: Bytes = match Limited::new(body, max).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return too_large(max),
        Err(_) => {
            return json_error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the request body could not be read",
            );
        }
    };
    if !bytes.is_empty()
        && must_be_json(parts.headers.get(CONTENT_TYPE))
        && serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_err()
    {
        return json_error(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "the request body is not valid JSON; it was not forwarded",
        );
    }
    let protocol = target.protocol.clone();
    let Ok(upstream_req) = upstream_request(&parts, target.uri, bytes) else {
        return json_error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "the request cannot be forwarded",
        );
    };
    state.metrics.request();
    state.logger.info(
        "request",
        "forwarding upstream",
        &[
            ("method", Field::Str(parts.method.as_str())),
            ("path", Field::Str(parts.uri.path())),
            ("protocol", Field::Str(protocol.name())),
        ],
    );
    let stack = state.upstream.stack(&protocol);
    match stack.oneshot(upstream_req).await {
        Ok(resp) => answer(&state, resp, protocol, permit).await,
        Err(e) => {
            let logical_id = e.report().logical_id.clone();
            state.logger.warn(
                "upstream_failed",
                "no upstream response; answering 502",
                &[
                    ("logical_id", Field::Str(&logical_id)),
                    ("outcome", Field::Str(e.outcome().name())),
                    ("status", Field::U64(502)),
                ],
            );
            let failure = StreamFailure::of_outcome(e.outcome(), e.report().last_status());
            json(
                StatusCode::BAD_GATEWAY,
                error_body(&protocol, &failure, 502),
            )
        }
    }
}

fn too_large(max: usize) -> Response<GatewayBody> {
    json_error(
        StatusCode::PAYLOAD_TOO_LARGE,
        "request_too_large",
        &format!("the request body is over the gateway's limit of {max} bytes"),
    )
}

fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
}

async fn answer(
    state: &Arc<State>,
    resp: Response<UpstreamBody>,
    protocol: ProtocolKind,
    permit: OwnedSemaphorePermit,
) -> Response<GatewayBody> {
    let logical_id = resp
        .extensions()
        .get::<ReportHandle>()
        .map(|h| h.report().logical_id)
        .unwrap_or_default();
    let (parts, body) = resp.into_parts();
    let status = parts.status;
    state.logger.info(
        "response",
        "upstream answered",
        &[
            ("logical_id", Field::Str(&logical_id)),
            ("status", Field::U64(u64::from(status.as_u16()))),
        ],
    );
    let mut headers = response_headers(&parts.headers);
    if status.is_success() && is_event_stream(&parts.headers) && !protocol.is_ndjson() {
        let content_type = parts
            .headers
            .get(CONTENT_TYPE)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("text/event-stream"));
        let new = NewStream {
            body,
            protocol: protocol.clone(),
            content_type,
            logical_id: logical_id.clone(),
            permit,
        };
        // `start` only fails before it took the body when the log refuses
        // to open: then the answer cannot be resumed and is passed through.
        match state.streams.start(new).await {
            Ok((id, rx)) => {
                if let Ok(v) = HeaderValue::from_str(&id) {
                    headers.insert(HeaderName::from_static(STREAM_ID_HEADER), v);
                }
                let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|b| (Ok(b), rx))
                });
                let mut out = Response::new(streaming(stream));
                *out.status_mut() = status;
                *out.headers_mut() = headers;
                return out;
            }
            Err((new, e)) => {
                state.logger.warn(
                    "stream_log_error",
                    "the stream log would not open; passing the stream through, not resumable",
                    &[
                        ("logical_id", Field::Str(&logical_id)),
                        ("error", Field::Str(&e.to_string())),
                    ],
                );
                let mut out = Response::new(passthrough(new.body, protocol, new.permit));
                *out.status_mut() = status;
                *out.headers_mut() = headers;
                return out;
            }
        }
    }
    let mut out = Response::new(passthrough(body, protocol, permit));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// An answer passed through as it comes (NDJSON, whole JSON, error
/// statuses, a stream the log would not take). A failure after bytes went
/// out is the protocol's error line for NDJSON and an aborted body
/// otherwise (a whole JSON answer cannot carry an error after its start).
fn passthrough(
    body: UpstreamBody,
    protocol: ProtocolKind,
    permit: OwnedSemaphorePermit,
) -> GatewayBody {
    struct Pass {
        body: UpstreamBody,
        protocol: ProtocolKind,
        done: bool,
        _permit: OwnedSemaphorePermit,
    }
    let state = Pass {
        body,
        protocol,
        done: false,
        _permit: permit,
    };
    streaming(futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if s.done {
                return None;
            }
            match s.body.frame().await {
                None => return None,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Some((Ok(data), s));
                    }
                }
                Some(Err(e)) => {
                    s.done = true;
                    if s.protocol.is_ndjson() {
                        let f = StreamFailure::of_outcome(e.outcome(), e.report().last_status());
                        let mut out = Vec::new();
                        write_error_event(&s.protocol, &f, &mut out);
                        return Some((Ok(Bytes::from(out)), s));
                    }
                    let err: crate::body::BoxError = Box::new(e);
                    return Some((Err(err), s));
                }
            }
        }
    }))
}
