//! The innermost service: a request that passed every phase goes to its
//! route's upstream, with the credentials it may spend, through the
//! recovery stack of its protocol, and its answer goes downstream.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use http_body_util::Full;
use recovery_core::body_fields::ReadFields;
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::StreamFailure;
use tower_recovery::ReportHandle;
use tower_service::Service;

use crate::auth::Credentials;
use crate::body::GatewayBody;
use crate::downstream::numbering::Comments;
use crate::downstream::{Delivery, RESUMABLE_HEADER, Streams};
use crate::forward::{Stack, Upstream, upstream_request};
use crate::identity::{Keys, Owner};
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::phase::BoxFuture;
use crate::respond::Refusal;
use crate::routes::Router;

/// What the proxy needs.
pub(crate) struct Proxy {
    pub(crate) router: Router,
    pub(crate) upstream: Upstream,
    pub(crate) streams: Arc<Streams>,
    pub(crate) keys: Arc<Keys>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) logger: Logger,
    pub(crate) comments: Comments,
}

/// [`Proxy`] as a service (clones share it).
#[derive(Clone)]
pub(crate) struct ProxyService(pub(crate) Arc<Proxy>);

impl Service<Request<Bytes>> for ProxyService {
    type Response = Response<GatewayBody>;
    type Error = Refusal;
    type Future = BoxFuture<Result<Response<GatewayBody>, Refusal>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        match self.0.send(req) {
            Ok(sent) => Box::pin(Arc::clone(&self.0).answer(sent)),
            Err(refusal) => Box::pin(std::future::ready(Err(refusal))),
        }
    }
}

/// A request on its way upstream, and what its answer needs. The request's
/// routing and rewriting happen before the future of its answer is made,
/// so that future keeps none of them.
struct Sent {
    call: tower::util::Oneshot<Stack, Request<Full<Bytes>>>,
    protocol: ProtocolKind,
    resumable: bool,
    owner: Owner,
}

impl Proxy {
    fn credential_headers(&self) -> &[HeaderName] {
        self.router.credential_header()
    }

    /// Routes `req` and makes its upstream request, with the call that
    /// sends it when polled.
    fn send(&self, req: Request<Bytes>) -> Result<Sent, Refusal> {
        let target = self
            .router
            .target(req.uri().path(), req.uri().query())
            .ok_or(Refusal::NoRoute)?;
        let (mut parts, bytes) = req.into_parts();
        let credentials = parts
            .extensions
            .get::<Credentials>()
            .cloned()
            .unwrap_or(Credentials::Own);
        let resumable = target.resumable
            && !parts
                .headers
                .get(RESUMABLE_HEADER)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"off"));
        let owner = self.keys.owner(&parts.headers, self.credential_headers());
        let protocol = target.protocol.clone();
        let mut upstream_req =
            upstream_request(&parts, target.uri, bytes).map_err(|_| Refusal::Unforwardable)?;
        upstream_req.headers_mut().remove(RESUMABLE_HEADER);
        // Kept on every send of the request, to an alternate too.
        upstream_req.extensions_mut().insert(target.http2);
        // What the body phase read of these bytes: the recovery layer does
        // not read them again.
        if let Some(read) = parts.extensions.remove::<ReadFields>() {
            upstream_req.extensions_mut().insert(read);
        }
        credentials.apply(upstream_req.headers_mut(), &target.headers);
        self.metrics.request();
        self.logger.debug(
            "request",
            "forwarding upstream",
            &[
                ("method", Field::Str(parts.method.as_str())),
                ("path", Field::Str(parts.uri.path())),
                ("protocol", Field::Str(protocol.name())),
            ],
        );
        let call = self.upstream.call(upstream_req, &protocol, target.declared);
        // The client's head (`parts`) ends here: it is a slice of its
        // connection's read buffer, and held while the upstream answers it
        // would make hyper take a second buffer for that connection's next
        // read.
        Ok(Sent {
            call,
            protocol,
            resumable,
            owner,
        })
    }

    /// The client's response: the upstream's answer to `sent`, delivered.
    async fn answer(self: Arc<Self>, sent: Sent) -> Result<Response<GatewayBody>, Refusal> {
        let Sent {
            call,
            protocol,
            resumable,
            owner,
        } = sent;
        let resp = match call.await {
            Ok(resp) => resp,
            Err(e) => {
                self.logger.warn(
                    "upstream_failed",
                    "no upstream response; answering with the provider's error shape",
                    &[
                        ("logical_id", Field::Str(&e.report().logical_id)),
                        ("outcome", Field::Str(e.outcome().name())),
                    ],
                );
                return Err(Refusal::Upstream(StreamFailure::of_outcome(
                    e.outcome(),
                    e.report().last_status(),
                )));
            }
        };
        let logical_id = resp
            .extensions()
            .get::<ReportHandle>()
            .map(|h| h.inspect(|r| r.logical_id.clone()))
            .unwrap_or_default();
        // Boxed: this future waits for the upstream's head with all of its
        // states' room, and the delivery's (the stream log's opening, the
        // first event) is ten times the call's. Apart, a request waiting
        // for its head holds the call's room only.
        Box::pin(
            Delivery {
                streams: &self.streams,
                keys: &self.keys,
                logger: &self.logger,
                comments: self.comments,
                protocol,
                resumable,
                owner,
                logical_id,
            }
            .answer(resp),
        )
        .await
    }
}
