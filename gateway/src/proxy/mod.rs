//! The innermost service: a request that passed every phase goes to its
//! route's upstream, with the credentials it may spend, through the
//! recovery stack of its protocol, and its answer goes downstream.

mod future;

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use recovery_core::body_fields::ReadFields;
use recovery_core::protocol::{ProtocolKind, is_generation};
use tower_service::Service;

use crate::auth::Credentials;
use crate::body::GatewayBody;
use crate::downstream::numbering::Comments;
use crate::downstream::{RESUMABLE_HEADER, Streams};
use crate::forward::{Stack, Upstream, upstream_request};
use crate::identity::{Keys, Owner};
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::phase::BoxFuture;
use crate::request_body::RequestBody;
use crate::respond::Refusal;
use crate::routes::{Router, Target};
use crate::tunnel::{self, Carrier, TunnelSlot};
use future::Then;

pub(crate) use future::AnswerFuture;

/// What the proxy needs.
pub(crate) struct Proxy {
    pub(crate) router: Router,
    pub(crate) upstream: Upstream,
    pub(crate) streams: Arc<Streams>,
    pub(crate) keys: Arc<Keys>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) logger: Logger,
    pub(crate) comments: Comments,
    pub(crate) carrier: Carrier,
}

/// [`Proxy`] as a service (clones share it).
#[derive(Clone)]
pub(crate) struct ProxyService(pub(crate) Arc<Proxy>);

impl Service<Request<RequestBody>> for ProxyService {
    type Response = Response<GatewayBody>;
    type Error = Refusal;
    type Future = AnswerFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<RequestBody>) -> Self::Future {
        if let Some(upgrade) = tunnel::wanted(req.headers()).cloned() {
            return match self.0.tunnel(req, upgrade) {
                Ok(answer) => AnswerFuture::boxed(answer),
                Err(refusal) => AnswerFuture::refused(refusal),
            };
        }
        match self.0.send(req) {
            Ok(Sent {
                call,
                protocol,
                resumable,
                generation,
                owner,
            }) => AnswerFuture::calling(
                call,
                Then {
                    proxy: Arc::clone(&self.0),
                    protocol,
                    resumable,
                    generation,
                    owner,
                },
            ),
            Err(refusal) => AnswerFuture::refused(refusal),
        }
    }
}

/// A request on its way upstream, and what its answer needs. The request's
/// routing and rewriting happen before the future of its answer is made,
/// so that future keeps none of them.
struct Sent {
    call: tower::util::Oneshot<Stack, Request<RequestBody>>,
    protocol: ProtocolKind,
    resumable: bool,
    generation: bool,
    owner: Owner,
}

impl Proxy {
    fn credential_headers(&self) -> &[HeaderName] {
        self.router.credential_header()
    }

    /// Routes `req` and makes its upstream request, with the call that
    /// sends it when polled.
    fn send(&self, req: Request<RequestBody>) -> Result<Sent, Refusal> {
        let target = self.route(&req)?;
        let (mut parts, bytes) = req.into_parts();
        let resumable = target.resumable
            && !parts
                .headers
                .get(RESUMABLE_HEADER)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"off"));
        let owner = self.keys.owner(&parts.headers, self.credential_headers());
        let protocol = target.protocol.clone();
        let mut upstream_req = rewrite(&parts, target.uri, &target.headers, bytes)?;
        // The rule the recovery layer applies to the same request.
        let generation = is_generation(
            parts.method.as_str(),
            upstream_req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str()),
        );
        // Kept on every send of the request, to an alternate too.
        upstream_req.extensions_mut().insert(target.http2);
        // What the body phase read of these bytes: the recovery layer does
        // not read them again.
        if let Some(read) = parts.extensions.remove::<ReadFields>() {
            upstream_req.extensions_mut().insert(read);
        }
        self.log_forward(&parts, &protocol);
        let call = self.upstream.call(upstream_req, &protocol, target.declared);
        // The client's head (`parts`) ends here: it is a slice of its
        // connection's read buffer, and held while the upstream answers it
        // would make hyper take a second buffer for that connection's next
        // read.
        Ok(Sent {
            call,
            protocol,
            resumable,
            generation,
            owner,
        })
    }

    /// A request that switches protocols, carried to its route's upstream
    /// with the credentials it may spend (`tunnel`).
    fn tunnel(
        self: &Arc<Self>,
        mut req: Request<RequestBody>,
        upgrade: http::HeaderValue,
    ) -> Result<BoxFuture<Result<Response<GatewayBody>, Refusal>>, Refusal> {
        let target = self.route(&req)?;
        let client_side = hyper::upgrade::on(&mut req);
        let (mut parts, body) = req.into_parts();
        let slot = parts.extensions.remove::<TunnelSlot>();
        let upstream_req = rewrite(
            &parts,
            target.uri,
            &target.headers,
            RequestBody::whole(Bytes::new()),
        )?;
        self.log_forward(&parts, &target.protocol);
        // The body phase reads a switch's body whole (`is_upload`).
        let bytes = match body {
            RequestBody::Whole(bytes) => bytes.unwrap_or_default(),
            RequestBody::Upload(_) => Bytes::new(),
        };
        let upstream_req = upstream_req.map(|_| tower_recovery::ReplayBody::full(bytes));
        let proxy = Arc::clone(self);
        Ok(Box::pin(async move {
            proxy
                .carrier
                .open(upstream_req, upgrade, client_side, slot)
                .await
        }))
    }

    fn route(&self, req: &Request<RequestBody>) -> Result<Target, Refusal> {
        self.router
            .target(req.uri().path(), req.uri().query())
            .ok_or(Refusal::NoRoute)
    }

    fn log_forward(&self, parts: &http::request::Parts, protocol: &ProtocolKind) {
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
    }
}

/// The upstream request of the client's `parts` to `uri`: its headers
/// filtered, with the credentials it may spend (`operator`'s, for a
/// known client).
fn rewrite(
    parts: &http::request::Parts,
    uri: http::Uri,
    operator: &http::HeaderMap,
    body: RequestBody,
) -> Result<Request<RequestBody>, Refusal> {
    let credentials = parts
        .extensions
        .get::<Credentials>()
        .cloned()
        .unwrap_or(Credentials::Own);
    let mut upstream_req =
        upstream_request(parts, uri, body).map_err(|_| Refusal::Unforwardable)?;
    upstream_req.headers_mut().remove(RESUMABLE_HEADER);
    credentials.apply(upstream_req.headers_mut(), operator);
    Ok(upstream_req)
}
