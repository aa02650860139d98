//! The gateway's own paths, answered here: `GET /healthz`, `GET /metrics`,
//! `GET /streams/<id>?after=N`, and a reconnect: a request with
//! `Last-Event-ID: <stream>:<seq>` naming one of the gateway's streams,
//! whatever its method and path (no upstream request is made).
//!
//! A reconnect reads the stream only with the credentials that created it
//! (`identity`): any other gets exactly the 404 of an unknown id.

use std::sync::Arc;

use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use recovery_core::protocol::ProtocolKind;

use crate::body::{GatewayBody, full, json};
use crate::downstream::numbering::parse_last_event_id;
use crate::downstream::{AttachError, STREAM_ID_HEADER, Streams};
use crate::identity::Keys;
use crate::log::LogError;
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::phase::{Decision, Phase, Step};
use crate::respond::Refusal;

/// The reserved-paths phase.
pub(crate) struct Reserved {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) streams: Arc<Streams>,
    pub(crate) keys: Arc<Keys>,
    /// The credential headers routes name (a stream's owner includes them).
    pub(crate) credential_headers: Vec<HeaderName>,
    pub(crate) logger: Logger,
}

impl<B: Send + 'static> Phase<B> for Reserved {
    type Out = B;

    fn run(self: &Arc<Self>, req: Request<B>) -> Decision<B> {
        let path = req.uri().path();
        if path == "/healthz" {
            return Decision::Now(
                get_only(&req).map(|()| Step::Answer(json(StatusCode::OK, r#"{"status":"ok"}"#))),
            );
        }
        if path == "/metrics" {
            return Decision::Now(get_only(&req).map(|()| {
                let mut resp = Response::new(full(self.metrics.render()));
                resp.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
                );
                Step::Answer(resp)
            }));
        }
        if let Some(id) = path.strip_prefix("/streams/") {
            if req.method() != Method::GET {
                return Decision::Now(Err(Refusal::MethodNotAllowed("GET")));
            }
            let after = match after_param(req.uri().query()) {
                Ok(after) => after,
                Err(refusal) => return Decision::Now(Err(refusal)),
            };
            let id = id.to_owned();
            return self.reconnect(req, id, after);
        }
        let last_event_id = req
            .headers()
            .get("last-event-id")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_last_event_id)
            .map(|(id, seq)| (id.to_owned(), seq));
        match last_event_id {
            Some((id, seq)) => self.reconnect(req, id, seq),
            None => Decision::Now(Ok(Step::next(req))),
        }
    }
}

impl Reserved {
    /// The reconnect `req` asks for: stream `id` after event `after`.
    fn reconnect<B: Send + 'static>(
        self: &Arc<Self>,
        req: Request<B>,
        id: String,
        after: u64,
    ) -> Decision<B> {
        let this = Arc::clone(self);
        Decision::Later(Box::pin(async move {
            let guess = ProtocolKind::guess(req.uri().path());
            let resp = this.attach(req.headers(), &id, after, guess).await?;
            Ok(Step::Answer(resp))
        }))
    }

    async fn attach(
        &self,
        headers: &HeaderMap,
        id: &str,
        after: u64,
        guess: ProtocolKind,
    ) -> Result<Response<GatewayBody>, Refusal> {
        let owner = self.keys.owner(headers, &self.credential_headers);
        let key = self.keys.stream_key(id, &owner);
        match self.streams.attach(&key, after, guess).await {
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
                self.logger.warn(
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
}

fn get_only<B>(req: &Request<B>) -> Result<(), Refusal> {
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
