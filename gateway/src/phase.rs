//! The one mechanism every server-side phase is built on.
//!
//! A phase is one step of a request's way in (admission, client keys, the
//! reserved paths, the concurrency limit, the body read): it answers the
//! request itself, refuses it with a [`Refusal`], or passes it on, perhaps
//! changed (a buffered body, a known client in its extensions) and perhaps
//! with something to hold until the response body ends (a stream slot).
//! [`PhaseLayer`] makes any phase a tower layer, so the server is one
//! `ServiceBuilder` that reads in order (see `stack`), and no phase turns
//! a failure into a response: the rescue layer on top does that, once.

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::{BoxError, GatewayBody};
use crate::respond::Refusal;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Something a phase holds until the response body ends.
pub(crate) type Hold = Box<dyn Any + Send + Sync>;

/// What a phase decided.
pub(crate) enum Step<B> {
    /// The phase answers the request itself.
    Answer(Response<GatewayBody>),
    /// The request goes on to the next phase; `hold` lives as long as the
    /// response body does.
    Next {
        /// The request, as the next phase takes it.
        req: Request<B>,
        /// Held until the response body ends (or is dropped).
        hold: Option<Hold>,
    },
}

impl<B> Step<B> {
    /// The request goes on as it is.
    pub(crate) fn next(req: Request<B>) -> Self {
        Step::Next { req, hold: None }
    }
}

/// One step of a request's way in.
pub(crate) trait Phase<B>: Send + Sync + 'static {
    /// The request body the next phase gets.
    type Out: Send + 'static;

    /// Decides on `req`.
    fn run(self: Arc<Self>, req: Request<B>) -> BoxFuture<Result<Step<Self::Out>, Refusal>>;
}

/// A phase as a tower layer.
pub(crate) struct PhaseLayer<P>(Arc<P>);

impl<P> PhaseLayer<P> {
    pub(crate) fn new(phase: P) -> Self {
        PhaseLayer(Arc::new(phase))
    }
}

impl<P, S> Layer<S> for PhaseLayer<P> {
    type Service = PhaseService<P, S>;

    fn layer(&self, inner: S) -> Self::Service {
        PhaseService {
            phase: Arc::clone(&self.0),
            inner,
        }
    }
}

/// A phase in front of the rest of the stack.
pub(crate) struct PhaseService<P, S> {
    phase: Arc<P>,
    inner: S,
}

impl<P, S: Clone> Clone for PhaseService<P, S> {
    fn clone(&self) -> Self {
        PhaseService {
            phase: Arc::clone(&self.phase),
            inner: self.inner.clone(),
        }
    }
}

impl<P, S, B> Service<Request<B>> for PhaseService<P, S>
where
    P: Phase<B>,
    S: Service<Request<P::Out>, Response = Response<GatewayBody>, Error = Refusal>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = Refusal;
    type Future = BoxFuture<Result<Response<GatewayBody>, Refusal>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        // Every phase sheds load itself; none waits for capacity.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let phase = Arc::clone(&self.phase);
        let inner = self.inner.clone();
        Box::pin(async move {
            match phase.run(req).await? {
                Step::Answer(resp) => Ok(resp),
                Step::Next { req, hold } => {
                    let resp = inner.oneshot(req).await?;
                    Ok(match hold {
                        None => resp,
                        Some(hold) => resp.map(|body| Holding { body, _hold: hold }.boxed_unsync()),
                    })
                }
            }
        })
    }
}

/// A response body that keeps what a phase holds until it ends.
struct Holding {
    body: GatewayBody,
    _hold: Hold,
}

impl Body for Holding {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The top of the stack: the only place a [`Refusal`] becomes a response,
/// in the error shape of the protocol the request's path speaks.
#[derive(Clone)]
pub(crate) struct Rescue<S>(pub(crate) S);

impl<S, B> Service<Request<B>> for Rescue<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = Refusal>,
    S::Future: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<GatewayBody>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        match self.0.poll_ready(cx) {
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let protocol = recovery_core::protocol::ProtocolKind::guess(req.uri().path());
        let fut = self.0.call(req);
        Box::pin(async move {
            Ok(match fut.await {
                Ok(resp) => resp,
                Err(refusal) => refusal.respond(&protocol),
            })
        })
    }
}

/// [`Rescue`] as a layer.
#[derive(Clone, Copy, Default)]
pub(crate) struct RescueLayer;

impl<S> Layer<S> for RescueLayer {
    type Service = Rescue<S>;

    fn layer(&self, inner: S) -> Rescue<S> {
        Rescue(inner)
    }
}
