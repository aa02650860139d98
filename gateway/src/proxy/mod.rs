//! The innermost service: a request that passed every phase goes to its
//! route's upstream, with the credentials it may spend, through the
//! recovery stack of its protocol, and its answer goes downstream.

mod future;

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use http_body_util::Full;
use recovery_core::body_fields::ReadFields;
use recovery_core::protocol::ProtocolKind;
use tower_service::Service;

use crate::auth::Credentials;
use crate::body::GatewayBody;
use crate::downstream::numbering::Comments;
use crate::downstream::{RESUMABLE_HEADER, Streams};
use crate::forward::{Stack, Upstream, upstream_request};
use crate::identity::{Keys, Owner};
use crate::logs::{Field, Logger};
use crate::metrics::Metrics;
use crate::respond::Refusal;
use crate::routes::Router;
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
}

/// [`Proxy`] as a service (clones share it).
#[derive(Clone)]
pub(crate) struct ProxyService(pub(crate) Arc<Proxy>);

impl Service<Request<Bytes>> for ProxyService {
    type Response = Response<GatewayBody>;
    type Error = Refusal;
    type Future = AnswerFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        match self.0.send(req) {
            Ok(Sent {
                call,
                protocol,
                resumable,
                owner,
            }) => AnswerFuture::calling(
                call,
                Then {
                    proxy: Arc::clone(&self.0),
                    protocol,
                    resumable,
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
}
