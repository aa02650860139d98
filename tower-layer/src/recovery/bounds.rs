//! What the recovery driver needs of the types it is generic over, named
//! once instead of spelled out on every function.

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use recovery_core::timing::{Connectivity, Timing};
use tower_service::Service;

use crate::BoxError;
use crate::request_body::ReplayBody;

/// The inner service: cloned for every send, its futures sent across threads.
pub(crate) trait InnerService<ResBody>:
    Service<Request<ReplayBody>, Response = Response<ResBody>, Future: Send, Error: Into<BoxError>>
    + Clone
    + Send
    + 'static
{
}

impl<S, ResBody> InnerService<ResBody> for S
where
    S: Service<Request<ReplayBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
{
}

/// A request or response body of bytes.
pub(crate) trait StreamBody:
    Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static
{
}

impl<B> StreamBody for B
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
}

/// A timing a layer can run on: sendable sleeps, shared by every request.
pub trait DriverTiming: Timing<Sleep: Send + 'static> + Clone + Send + Sync + 'static {}

impl<T> DriverTiming for T where T: Timing<Sleep: Send + 'static> + Clone + Send + Sync + 'static {}

/// A connectivity signal a layer can run on, shared by every request.
pub trait DriverConnectivity:
    Connectivity<Online: Send + 'static> + Clone + Send + Sync + 'static
{
}

impl<C> DriverConnectivity for C where
    C: Connectivity<Online: Send + 'static> + Clone + Send + Sync + 'static
{
}
