//! What a client reads of an upstream answer.
//!
//! The answer's head waits for its first bytes: the recovery layer holds
//! back everything before commit, so the first bytes it hands out are
//! committed output (or the end of an answer without any), and a failure
//! before them is still an HTTP error of its own ([`Refusal::Upstream`]).
//! Then a streamed SSE answer becomes a resumable stream ([`registry`]: an
//! id bound to its creator's credentials, a [`pump`] that numbers and logs
//! each event, driven by the first client's body ([`first_client`]) and
//! in a task of its own once that client left, [`reader`]s for
//! reconnects), whose head goes out with the pump's first event in one
//! write; everything else, and a stream whose
//! client asked for the upstream's bytes exactly, passes through.
//!
//! [`Refusal::Upstream`]: crate::respond::Refusal::Upstream

mod direct;
mod events;
mod first_client;
pub(crate) mod numbering;
mod pump;
mod reader;
mod registry;

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt as _;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::BodyExt as _;
use recovery_core::protocol::error_event::{StreamFailure, write_error_event};
use recovery_core::protocol::{BodyForm, ProtocolKind};
use tokio::sync::watch;

pub(crate) use registry::{AttachError, Bounds, NewStream, Streams};

use crate::body::{BoxError, GatewayBody, streaming};
use crate::forward::UpstreamBody;
use crate::identity::{Keys, Owner, new_stream_id};
use crate::logs::{Field, Logger};
use crate::respond::Refusal;
use events::EventEnds;
use numbering::Comments;

/// The response header naming a resumable stream.
pub const STREAM_ID_HEADER: &str = "x-recovery-stream-id";

/// The request header that turns the resumable downstream off for one
/// request (`off`): the client reads the upstream's bytes as they came.
pub const RESUMABLE_HEADER: &str = "x-recovery-resumable";

/// Resolves once `flag` is raised (or its sender is gone).
pub(crate) async fn raised(flag: &mut watch::Receiver<bool>) {
    let _ = flag.wait_for(|s| *s).await;
}

/// How one answer goes downstream.
pub(crate) struct Delivery<'a> {
    pub(crate) streams: &'a Arc<Streams>,
    pub(crate) keys: &'a Keys,
    pub(crate) logger: &'a Logger,
    pub(crate) comments: Comments,
    pub(crate) protocol: ProtocolKind,
    /// Whether a streamed SSE answer becomes resumable.
    pub(crate) resumable: bool,
    /// Whether the request asked for a generation: the answer to any other
    /// is passed through as it came, never framed as a stream.
    pub(crate) generation: bool,
    /// Whose stream it becomes.
    pub(crate) owner: Owner,
    pub(crate) logical_id: String,
}

/// The first bytes of an answer, read before its head goes out.
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

/// Whether the gateway adds its `id:` line to the events of `protocol`:
/// only where every official SDK of the protocol reads SSE `id:` lines.
/// Google's SDKs read `data:` lines only (google-genai raises on any
/// other field), so Gemini streams go without; their clients resume with
/// the `x-recovery-stream-id` header and `GET /streams/<id>?after=<n>`,
/// `n` the events they received. Those SDKs raise on a comment line too
/// (google-genai parses it as JSON), so there comment blocks are dropped.
fn adds_event_ids(protocol: &ProtocolKind) -> bool {
    !matches!(protocol, ProtocolKind::Gemini)
}

impl Delivery<'_> {
    /// The client's response to the upstream's `resp`.
    pub(crate) async fn answer(
        self,
        resp: Response<UpstreamBody>,
    ) -> Result<Response<GatewayBody>, Refusal> {
        let (parts, mut body) = resp.into_parts();
        let status = parts.status;
        self.logger.debug(
            "response",
            "upstream answered",
            &[
                ("logical_id", Field::Str(&self.logical_id)),
                ("status", Field::U64(u64::from(status.as_u16()))),
            ],
        );
        let first = match first_bytes(&mut body).await {
            Ok(b) => b,
            Err(failure) => {
                self.logger.warn(
                    "upstream_failed",
                    "recovery failed before the first token; answering with the provider's error",
                    &[("logical_id", Field::Str(&self.logical_id))],
                );
                return Err(Refusal::Upstream(failure));
            }
        };
        let headers = if self.generation {
            crate::forward::response_headers(&parts.headers)
        } else {
            crate::forward::exact_response_headers(&parts.headers)
        };
        // A copy: a clone would be a slice of the upstream connection's
        // read buffer, held with the stream (for reconnects) for its life.
        let content_type = parts
            .headers
            .get(CONTENT_TYPE)
            .map(|v| HeaderValue::from_bytes(v.as_bytes()).unwrap_or_else(|_| v.clone()));
        let media = content_type.as_ref().and_then(|v| v.to_str().ok());
        let answer = status.is_success() && self.generation;
        let streamed = answer && BodyForm::of(media) == BodyForm::Stream;
        let sse = answer && BodyForm::is_event_stream(media) && !self.protocol.is_ndjson();
        if !(sse && self.resumable) {
            let report = parts
                .extensions
                .get::<tower_recovery::ReportHandle>()
                .cloned();
            let seen = Seen::new(&self.streams.metrics, report, &self.protocol, streamed);
            let body = passthrough(first, body, self.protocol, streamed, seen);
            return Ok(respond(status, headers, body));
        }
        let id = new_stream_id();
        let new = NewStream {
            body,
            key: self.keys.stream_key(&id, &self.owner),
            ids: adds_event_ids(&self.protocol),
            comments: self.comments,
            first,
            id,
            protocol: self.protocol.clone(),
            content_type: content_type
                .unwrap_or_else(|| HeaderValue::from_static("text/event-stream")),
            logical_id: self.logical_id.clone(),
            report: parts
                .extensions
                .get::<tower_recovery::ReportHandle>()
                .cloned(),
            observed: parts
                .extensions
                .get::<tower_recovery::ObserveHandle>()
                .cloned(),
        };
        let id = new.id.clone();
        // `start` only fails before it took the body when the log refuses
        // to open: then the answer cannot be resumed and is passed through.
        match self.streams.start(new).await {
            Ok(mut client) => {
                let mut headers = headers;
                if let Ok(v) = HeaderValue::from_str(&id) {
                    headers.insert(HeaderName::from_static(STREAM_ID_HEADER), v);
                }
                // The head waits for the pump's first event (the first bytes
                // hold at least one whole one), so both leave in one write
                // rather than the head alone and the events after it.
                let first = std::future::poll_fn(|cx| client.poll_handed(cx)).await;
                let rest = futures_util::stream::iter(first.map(Ok)).chain(client);
                Ok(respond(status, headers, streaming(rest)))
            }
            Err((new, e)) => {
                self.logger.warn(
                    "stream_log_error",
                    "the stream log would not open; passing the stream through, not resumable",
                    &[
                        ("logical_id", Field::Str(&self.logical_id)),
                        ("error", Field::Str(&e.to_string())),
                    ],
                );
                let seen = Seen::new(&self.streams.metrics, new.report, &new.protocol, true);
                let body = passthrough(new.first, new.body, new.protocol, true, seen);
                Ok(respond(status, headers, body))
            }
        }
    }
}

fn respond(status: StatusCode, headers: HeaderMap, body: GatewayBody) -> Response<GatewayBody> {
    let mut out = Response::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// What `/metrics` takes of a passed-through answer: the time between
/// its events when it is a stream (as for a numbered one), and the token
/// use at its end.
struct Seen {
    metrics: Arc<crate::metrics::Metrics>,
    report: Option<tower_recovery::ReportHandle>,
    /// Where the events of a streamed answer end (none for a whole one).
    events: Option<EventEnds>,
    last: Option<tokio::time::Instant>,
}

impl Seen {
    fn new(
        metrics: &Arc<crate::metrics::Metrics>,
        report: Option<tower_recovery::ReportHandle>,
        protocol: &ProtocolKind,
        streamed: bool,
    ) -> Self {
        Seen {
            metrics: Arc::clone(metrics),
            report,
            events: streamed.then(|| EventEnds::new(protocol.is_ndjson())),
            last: None,
        }
    }

    /// `data` reached the client: each event that ends in it is one
    /// output chunk.
    fn chunk(&mut self, data: &[u8]) {
        let Some(events) = &mut self.events else {
            return;
        };
        let n = events.count(data);
        if n == 0 {
            return;
        }
        let now = tokio::time::Instant::now();
        for _ in 0..n {
            if let Some(last) = self.last.replace(now) {
                self.metrics.output_chunk(now - last);
            }
        }
    }

    fn end(&self) {
        if let Some(report) = &self.report {
            report.inspect(|r| self.metrics.tokens(&r.generation.usage));
        }
    }
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
    streamed: bool,
    seen: Seen,
) -> GatewayBody {
    struct Pass {
        first: Option<Bytes>,
        body: UpstreamBody,
        protocol: ProtocolKind,
        streamed: bool,
        done: bool,
        seen: Seen,
    }
    let state = Pass {
        first: (!first.is_empty()).then_some(first),
        body,
        protocol,
        streamed,
        done: false,
        seen,
    };
    streaming(futures_util::stream::unfold(state, |mut s| async move {
        if let Some(first) = s.first.take() {
            s.seen.chunk(&first);
            return Some((Ok(first), s));
        }
        loop {
            if s.done {
                return None;
            }
            match s.body.frame().await {
                None => {
                    s.seen.end();
                    return None;
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        s.seen.chunk(&data);
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
                    let err: BoxError = Box::new(e);
                    return Some((Err(err), s));
                }
            }
        }
    }))
}
