use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use recovery_core::error::RecoveryError;
use recovery_core::timing::{Connectivity, Timing};
use tower_service::Service;

use super::body::RecoveryBody;
use super::future::{ResponseFuture, drive};
use super::layer::Config;
use crate::BoxError;
use crate::request_body::ReplayBody;

/// Recovers streamed responses of the inner service. See [`RecoveryLayer`].
///
/// [`RecoveryLayer`]: super::RecoveryLayer
pub struct Recover<S, T, C> {
    pub(crate) inner: S,
    pub(crate) config: Arc<Config<T, C>>,
}

impl<S: Clone, T, C> Clone for Recover<S, T, C> {
    fn clone(&self) -> Self {
        Recover {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S: fmt::Debug, T, C> fmt::Debug for Recover<S, T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recover")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B, ResBody, T, C> Service<Request<B>> for Recover<S, T, C>
where
    S: Service<Request<ReplayBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
    T: Timing + Clone + Send + Sync + 'static,
    T::Sleep: Send,
    C: Connectivity + Clone + Send + Sync + 'static,
    C::Online: Send,
{
    type Response = Response<RecoveryBody<ResBody>>;
    type Error = RecoveryError;
    type Future = ResponseFuture<ResBody>;

    /// Always ready: readiness of the inner service is polled on a fresh
    /// clone before every send, so no permit is held while backing off.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let svc = self.inner.clone();
        let fut = drive(Arc::clone(&self.config), svc, req);
        #[cfg(feature = "tracing")]
        let fut = {
            use tracing::Instrument;
            fut.instrument(tracing::info_span!(
                "recovery.request",
                recovery.logical_id = tracing::field::Empty,
            ))
        };
        ResponseFuture::new(fut)
    }
}
