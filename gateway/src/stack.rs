//! The server side as one stack, read top to bottom in the order a request
//! meets it: the rescue layer (the only place a refusal becomes a
//! response), then each phase (`phases`), then the proxy.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use tower::ServiceBuilder;
use tower_service::Service;

use crate::body::GatewayBody;
use crate::phase::{BoxFuture, PhaseLayer, RescueLayer};
use crate::phases::admit::Admit;
use crate::phases::client_auth::ClientAuth;
use crate::phases::limit::Limit;
use crate::phases::read_body::ReadBody;
use crate::phases::reserved::Reserved;
use crate::proxy::{Proxy, ProxyService};

/// Every phase and the proxy, as `Gateway::bind` builds them.
pub(crate) struct Phases {
    pub(crate) admit: Admit,
    pub(crate) client_auth: ClientAuth,
    pub(crate) reserved: Reserved,
    pub(crate) limit: Limit,
    pub(crate) read_body: ReadBody,
    pub(crate) proxy: Proxy,
}

/// The stack a connection serves requests with.
pub(crate) fn server<B>(
    phases: Phases,
) -> impl Service<
    Request<B>,
    Response = Response<GatewayBody>,
    Error = Infallible,
    Future = BoxFuture<Result<Response<GatewayBody>, Infallible>>,
> + Clone
+ Send
+ 'static
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    ServiceBuilder::new()
        .layer(RescueLayer)
        .layer(PhaseLayer::new(phases.admit))
        .layer(PhaseLayer::new(phases.client_auth))
        .layer(PhaseLayer::new(phases.reserved))
        .layer(PhaseLayer::new(phases.limit))
        .layer(PhaseLayer::new(phases.read_body))
        .service(ProxyService(Arc::new(phases.proxy)))
}
