//! One request: a reserved path, a reconnect, or a forward upstream.
//!
//! Reserved: `GET /healthz`, `GET /metrics`, `GET /streams/<id>?after=N`.
//! A request with `Last-Event-ID: <stream>:<seq>` naming one of the
//! gateway's streams is a reconnect, whatever its method and path: no
//! upstream request is made. Everything else is forwarded. Whatever the
//! gateway answers itself is a [`Refusal`], written in one place.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use recovery_core::protocol::error_event::{StreamFailure, write_error_event};
use recovery_core::protocol::{BodyForm, ProtocolKind};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;
use tower_recovery::ReportHandle;

use crate::auth::{Clients, Credentials};
use crate::body::{GatewayBody, json, streaming};
use crate::forward::{Upstream, UpstreamBody, response_headers, upstream_request};
use crate::identity::{Keys, new_stream_id};
use crate::log::LogError;
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::respond::Refusal;
use crate::routes::{Router, check_path};
use crate::sse::{Comments, parse_last_event_id};
use crate::streams::{AttachError, NewStream};

/// The response header naming a resumable stream.
pub const STREAM_ID_HEADER: &str = "x-recovery-stream-id";

/// The request header that turns the resumable downstream off for one
/// request (`off`): the client reads the upstream's bytes as they came.
pub const RESUMABLE_HEADER: &str = "x-recovery-resumable";

/// How long and how slowly a request body may arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyRead {
    /// The largest body forwarded.
    pub(crate) max_bytes: usize,
    /// The time any body gets.
    pub(crate) timeout: Duration,
    /// Each byte received earns this much more time: a large body on a
    /// slow link arrives, a trickle does not hold its slot.
    pub(crate) min_bytes_per_sec: u64,
}

/// What every request shares.
pub(crate) struct State {
    pub(crate) router: Router,
    pub(crate) upstream: Upstream,
    pub(crate) streams: Arc<crate::streams::Streams>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) logger: Logger,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) body: BodyRead,
    pub(crate) keys: Keys,
    pub(crate) clients: Clients,
    pub(crate) comments: Comments,
    /// The authorities an absolute-form request target may name.
    pub(crate) own_authorities: Vec<String>,
}

/// Answers one request; never fails (every error is a response).
pub(crate) async fn handle<B>(state: Arc<State>, req: Request<B>) -> Response<GatewayBody>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let path = req.uri().path().to_owned();
    let guess = ProtocolKind::guess(&path);
    match route(&state, req).await {
        Ok(resp) => resp,
        Err(refusal) => refusal.respond(&guess),
    }
}

async fn route<B>(state: &Arc<State>, req: Request<B>) -> Result<Response<GatewayBody>, Refusal>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let path = req.uri().path().to_owned();
    if path == "/healthz" {
        reserved_get(&req)?;
        return Ok(json(StatusCode::OK, r#"{"status":"ok"}"#));
    }
    if req.method() == Method::CONNECT || req.method() == Method::TRACE {
        return Err(Refusal::MethodNotAllowed(
            "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS",
        ));
    }
    if let Some(authority) = req.uri().authority()
        && !state
            .own_authorities
            .iter()
            .any(|a| a.eq_ignore_ascii_case(authority.as_str()))
    {
        return Err(Refusal::ForeignAuthority);
    }
    let credentials = state.clients.check(req.headers())?;
    if path == "/metrics" {
        reserved_get(&req)?;
        let mut resp = Response::new(crate::body::full(state.metrics.render()));
        resp.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        return Ok(resp);
    }
    if let Some(id) = path.strip_prefix("/streams/") {
        if req.method() != Method::GET {
            return Err(Refusal::MethodNotAllowed("GET"));
        }
        let after = after_param(req.uri().query())?;
        return reconnect(state, req.headers(), id, after, ProtocolKind::guess(&path)).await;
    }
    check_path(&path)?;
    let last_event_id = req
        .headers()
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_last_event_id)
        .map(|(id, seq)| (id.to_owned(), seq));
    if let Some((id, seq)) = last_event_id {
        return reconnect(state, req.headers(), &id, seq, ProtocolKind::guess(&path)).await;
    }
    forward(state, req, credentials).await
}

fn reserved_get<B>(req: &Request<B>) -> Result<(), Refusal> {
    if req.method() == Method::GET || req.method() == Method::HEAD {
        Ok(())
    } else {
        Err(Refusal::MethodNotAllowed("GET"))
    }
}

fn after_param(query: Option<&str>) -> Result<u64, Refusal> {
    let Some(q) = query else { return Ok(0) };
    for pair in q.split('&') {
        if let Some(v) = pair.strip_prefix("after=") {
            return v.parse().map_err(|_| Refusal::BadAfter);
        }
    }
    Ok(0)
}

async fn reconnect(
    state: &Arc<State>,
    headers: &HeaderMap,
    id: &str,
    after: u64,
    guess: ProtocolKind,
) -> Result<Response<GatewayBody>, Refusal> {
    let owner = state.keys.owner(headers, state.router.credential_header());
    let key = state.keys.stream_key(id, &owner);
    match state.streams.attach(&key, after, guess).await {
        Ok(attached) => {
            let mut resp = Response::new(attached.body);
            let h = resp.headers_mut();
            h.insert(CONTENT_TYPE, attached.content_type);
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            if let Ok(v) = HeaderValue::from_str(id) {
                h.insert(HeaderName::from_static(STREAM_ID_HEADER), v);
            }
            Ok(resp)
        }
        Err(AttachError::Log(LogError::Unknown)) => Err(Refusal::StreamNotFound),
        Err(AttachError::Busy) => Err(Refusal::TooManyReaders),
        Err(AttachError::Log(e)) => {
            state.logger.warn(
                "stream_log_error",
                "a reconnect could not read the stream log",
                &[
                    ("stream", Field::Str(key.digest())),
                    ("error", Field::Str(&e.to_string())),
                ],
            );
            Err(Refusal::StreamLogUnavailable)
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

/// Reads a whole request body within `limits`.
async fn read_body<B>(body: B, limits: BodyRead) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes>,
{
    let started = tokio::time::Instant::now();
    let mut body = std::pin::pin!(body);
    let mut out = bytes::BytesMut::new();
    loop {
        let earned = if limits.min_bytes_per_sec == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(out.len() as f64 / limits.min_bytes_per_sec as f64)
        };
        let deadline = started + limits.timeout + earned;
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(Refusal::BodyTooSlow),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(_))) => return Err(Refusal::BodyUnreadable),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limits.max_bytes {
                return Err(Refusal::BodyTooLarge(limits.max_bytes));
            }
            out.extend_from_slice(&data);
        }
    }
}

async fn forward<B>(
    state: &Arc<State>,
    req: Request<B>,
    credentials: Credentials,
) -> Result<Response<GatewayBody>, Refusal>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let target = state
        .router
        .target(req.uri().path(), req.uri().query())
        .ok_or(Refusal::NoRoute)?;
    // The slot is held from the request head to the end of the client's
    // read: a trickled body holds it only until its deadline.
    let Ok(permit) = Arc::clone(&state.permits).try_acquire_owned() else {
        state.metrics.rejected();
        return Err(Refusal::TooManyStreams);
    };
    let max = state.body.max_bytes;
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) || req.body().size_hint().lower() > max as u64 {
        return Err(Refusal::BodyTooLarge(max));
    }
    let (parts, body) = req.into_parts();
    let bytes = match read_body(body, state.body).await {
        Ok(b) => b,
        Err(refusal) => {
            if refusal == Refusal::BodyTooSlow {
                state.metrics.body_timeout();
            }
            return Err(refusal);
        }
    };
    if !bytes.is_empty()
        && must_be_json(parts.headers.get(CONTENT_TYPE))
        && serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_err()
    {
        return Err(Refusal::InvalidJson);
    }
    let resumable = target.resumable
        && !parts
            .headers
            .get(RESUMABLE_HEADER)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"off"));
    let owner = state
        .keys
        .owner(&parts.headers, state.router.credential_header());
    let protocol = target.protocol.clone();
    let mut upstream_req =
        upstream_request(&parts, target.uri, bytes).map_err(|_| Refusal::Unforwardable)?;
    credentials.apply(upstream_req.headers_mut(), &target.headers);
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
        Ok(resp) => answer(state, resp, protocol, permit, resumable, owner).await,
        Err(e) => {
            let logical_id = e.report().logical_id.clone();
            state.logger.warn(
                "upstream_failed",
                "no upstream response; answering with the provider's error shape",
                &[
                    ("logical_id", Field::Str(&logical_id)),
                    ("outcome", Field::Str(e.outcome().name())),
                ],
            );
            Err(Refusal::Upstream(StreamFailure::of_outcome(
                e.outcome(),
                e.report().last_status(),
            )))
        }
    }
}

fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("text/event-stream"))
}

/// The first bytes of an answer, read before its head goes out: the
/// recovery layer holds back everything before commit, so the first bytes
/// it hands out are committed output (or the end of an answer without
/// output), and a failure before them is still a status of its own.
async fn first_bytes(body: &mut UpstreamBody) -> Result<Bytes, StreamFailure> {
    loop {
        match body.frame().await {
            None => return Ok(Bytes::new()),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data()
                    && !data.is_empty()
                {
                    return Ok(data);
                }
            }
            Some(Err(e)) => {
                return Err(StreamFailure::of_outcome(
                    e.outcome(),
                    e.report().last_status(),
                ));
            }
        }
    }
}

async fn answer(
    state: &Arc<State>,
    resp: Response<UpstreamBody>,
    protocol: ProtocolKind,
    permit: OwnedSemaphorePermit,
    resumable: bool,
    owner: crate::identity::Owner,
) -> Result<Response<GatewayBody>, Refusal> {
    let logical_id = resp
        .extensions()
        .get::<ReportHandle>()
        .map(|h| h.report().logical_id)
        .unwrap_or_default();
    let (parts, mut body) = resp.into_parts();
    let status = parts.status;
    state.logger.info(
        "response",
        "upstream answered",
        &[
            ("logical_id", Field::Str(&logical_id)),
            ("status", Field::U64(u64::from(status.as_u16()))),
        ],
    );
    let first = match first_bytes(&mut body).await {
        Ok(b) => b,
        Err(failure) => {
            state.logger.warn(
                "upstream_failed",
                "recovery failed before the first token; answering with the provider's error shape",
                &[("logical_id", Field::Str(&logical_id))],
            );
            return Err(Refusal::Upstream(failure));
        }
    };
    let mut headers = response_headers(&parts.headers);
    let sse = status.is_success() && is_event_stream(&parts.headers) && !protocol.is_ndjson();
    let streamed = status.is_success()
        && BodyForm::of(
            parts
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
        ) == BodyForm::Stream;
    if sse && resumable {
        let content_type = parts
            .headers
            .get(CONTENT_TYPE)
            .cloned()
            .unwrap_or_else(|| HeaderValue::from_static("text/event-stream"));
        let id = new_stream_id();
        let new = NewStream {
            body,
            key: state.keys.stream_key(&id, &owner),
            ids: adds_event_ids(&protocol),
            comments: state.comments,
            first,
            id,
            protocol: protocol.clone(),
            content_type,
            logical_id: logical_id.clone(),
            permit,
        };
        let id = new.id.clone();
        // `start` only fails before it took the body when the log refuses
        // to open: then the answer cannot be resumed and is passed through.
        match state.streams.start(new).await {
            Ok(rx) => {
                if let Ok(v) = HeaderValue::from_str(&id) {
                    headers.insert(HeaderName::from_static(STREAM_ID_HEADER), v);
                }
                let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv().await.map(|b| (Ok(b), rx))
                });
                let mut out = Response::new(streaming(stream));
                *out.status_mut() = status;
                *out.headers_mut() = headers;
                return Ok(out);
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
                let mut out = Response::new(passthrough(
                    new.first, new.body, protocol, new.permit, streamed,
                ));
                *out.status_mut() = status;
                *out.headers_mut() = headers;
                return Ok(out);
            }
        }
    }
    let mut out = Response::new(passthrough(first, body, protocol, permit, streamed));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    Ok(out)
}

/// Whether the gateway adds its `id:` line to the events of `protocol`:
/// only where every official SDK of the protocol reads SSE `id:` lines.
/// Google's SDKs read `data:` lines only (google-genai raises on any
/// other field), so Gemini streams go without; their clients resume with
/// the `x-recovery-stream-id` header and `GET /streams/<id>?after=<n>`,
/// `n` the events they received.
fn adds_event_ids(protocol: &ProtocolKind) -> bool {
    !matches!(protocol, ProtocolKind::Gemini)
}

/// An answer passed through as it comes (NDJSON, whole JSON, error
/// statuses, a stream not resumable). A failure after bytes went out is
/// the protocol's error event for a stream (SSE or NDJSON) and an aborted
/// body otherwise (a whole JSON answer cannot carry an error after its
/// start).
fn passthrough(
    first: Bytes,
    body: UpstreamBody,
    protocol: ProtocolKind,
    permit: OwnedSemaphorePermit,
    streamed: bool,
) -> GatewayBody {
    struct Pass {
        first: Option<Bytes>,
        body: UpstreamBody,
        protocol: ProtocolKind,
        streamed: bool,
        done: bool,
        _permit: OwnedSemaphorePermit,
    }
    let state = Pass {
        first: (!first.is_empty()).then_some(first),
        body,
        protocol,
        streamed,
        done: false,
        _permit: permit,
    };
    streaming(futures_util::stream::unfold(state, |mut s| async move {
        if let Some(first) = s.first.take() {
            return Some((Ok(first), s));
        }
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
                    if s.streamed {
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
