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
//!
//! Most phases decide from the head alone: they decide while the request
//! is handed to them and the next phase is called in the same call, with
//! no future or allocation of their own. The response futures nest as the
//! services do ([`future`]), so a request's way in is one future.

mod future;

use std::any::Any;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use http_body_util::BodyExt as _;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::GatewayBody;
use crate::respond::Refusal;
pub(crate) use future::{PhaseFuture, RescueFuture};

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

/// When a phase decides: most decide from the head alone, while the
/// request is handed to them, and pass it on in the same call (no future,
/// no allocation); a phase that waits (a body read, a stream log) returns
/// the future of its decision.
// Returned and matched at once, never kept: boxing the step would cost the
// allocation this type exists to save.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Decision<B> {
    /// Decided at once.
    Now(Result<Step<B>, Refusal>),
    /// Decided when this future ends.
    Later(BoxFuture<Result<Step<B>, Refusal>>),
}

/// One step of a request's way in.
pub(crate) trait Phase<B>: Send + Sync + 'static {
    /// The request body the next phase gets.
    type Out: Send + 'static;

    /// Decides on `req`.
    fn run(self: &Arc<Self>, req: Request<B>) -> Decision<Self::Out>;
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
    S: Service<Request<P::Out>, Response = Response<GatewayBody>, Error = Refusal> + Clone,
{
    type Response = Response<GatewayBody>;
    type Error = Refusal;
    type Future = PhaseFuture<S, P::Out>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
        // Every phase sheds load itself and none waits for capacity: the
        // stack is as ready as the rest of it.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        match self.phase.run(req) {
            Decision::Now(Ok(Step::Next { req, hold })) => {
                PhaseFuture::calling(self.inner.call(req), hold)
            }
            Decision::Now(Ok(Step::Answer(resp))) => PhaseFuture::done(Ok(resp)),
            Decision::Now(Err(refusal)) => PhaseFuture::done(Err(refusal)),
            Decision::Later(decision) => {
                // The service made ready goes with this request; its clone
                // stays for the next one.
                let ready = self.inner.clone();
                PhaseFuture::deciding(decision, std::mem::replace(&mut self.inner, ready))
            }
        }
    }
}

/// `resp`, keeping `hold` until its body ends: the hold lives in the
/// body's frame mapping, dropped with the body.
fn with_hold(resp: Response<GatewayBody>, hold: Option<Hold>) -> Response<GatewayBody> {
    match hold {
        None => resp,
        Some(hold) => resp.map(|body| {
            body.map_frame(move |frame| {
                let _held = &hold;
                frame
            })
            .boxed_unsync()
        }),
    }
}

/// The top of the stack: the only place a [`Refusal`] becomes a response,
/// in the error shape of the protocol the request's path speaks.
#[derive(Clone)]
pub(crate) struct Rescue<S>(pub(crate) S);

impl<S, B> Service<Request<B>> for Rescue<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = Refusal>,
{
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = RescueFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        match self.0.poll_ready(cx) {
            Poll::Ready(_) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let protocol = recovery_core::protocol::ProtocolKind::guess(req.uri().path());
        RescueFuture::new(self.0.call(req), protocol)
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use futures_util::FutureExt as _;
    use http::StatusCode;
    use tower::ServiceExt as _;

    use super::*;
    use crate::body::full;

    /// The rest of the stack: counts its calls and answers 200.
    #[derive(Clone, Default)]
    struct Counting(Arc<AtomicUsize>);

    impl Service<Request<()>> for Counting {
        type Response = Response<GatewayBody>;
        type Error = Refusal;
        type Future = std::future::Ready<Result<Response<GatewayBody>, Refusal>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Refusal>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _req: Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(Response::new(full("inner"))))
        }
    }

    /// Sets its flag when dropped.
    struct Flag(Arc<AtomicBool>);

    impl Drop for Flag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// A phase that decides by the request's path: `/next` passes on at
    /// once holding a flag, `/refuse` refuses at once, `/answer` answers
    /// at once, `/later` passes on after a wait, `/later-refuse` refuses
    /// after one.
    struct ByPath(Arc<AtomicBool>);

    impl Phase<()> for ByPath {
        type Out = ();

        fn run(self: &Arc<Self>, req: Request<()>) -> Decision<()> {
            match req.uri().path() {
                "/next" => Decision::Now(Ok(Step::Next {
                    req,
                    hold: Some(Box::new(Flag(Arc::clone(&self.0)))),
                })),
                "/refuse" => Decision::Now(Err(Refusal::Unauthorized)),
                "/answer" => Decision::Now(Ok(Step::Answer(Response::new(full("phase"))))),
                "/later" => Decision::Later(Box::pin(async move {
                    tokio::task::yield_now().await;
                    Ok(Step::next(req))
                })),
                _ => Decision::Later(Box::pin(async {
                    tokio::task::yield_now().await;
                    Err(Refusal::Unauthorized)
                })),
            }
        }
    }

    fn stack() -> (
        PhaseService<ByPath, Counting>,
        Arc<AtomicUsize>,
        Arc<AtomicBool>,
    ) {
        let calls = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicBool::new(false));
        let service =
            PhaseLayer::new(ByPath(Arc::clone(&dropped))).layer(Counting(Arc::clone(&calls)));
        (service, calls, dropped)
    }

    fn req(path: &str) -> Request<()> {
        Request::builder().uri(path).body(()).unwrap()
    }

    async fn text(resp: Response<GatewayBody>) -> Bytes {
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn a_phase_that_decides_at_once_passes_the_request_on_in_the_call() {
        let (mut service, calls, dropped) = stack();
        let future = service.call(req("/next"));
        // The rest of the stack was called before anything polled.
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let resp = future.await.unwrap();
        // What the phase holds lives as long as the response body.
        assert!(!dropped.load(Ordering::SeqCst));
        assert_eq!(text(resp).await, "inner");
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_phase_that_waits_passes_the_request_on_when_it_decided() {
        let (mut service, calls, _) = stack();
        let mut future = service.call(req("/later"));
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // The decision waits one turn: the first poll does not call on.
        assert!((&mut future).now_or_never().is_none());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        let resp = future.await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(text(resp).await, "inner");
    }

    #[tokio::test]
    async fn answers_and_refusals_at_once_or_later_never_reach_the_rest() {
        let (service, calls, _) = stack();
        let resp = service.clone().oneshot(req("/answer")).await.unwrap();
        assert_eq!(text(resp).await, "phase");
        for path in ["/refuse", "/later-refuse"] {
            let refused = service.clone().oneshot(req(path)).await;
            assert_eq!(refused.err(), Some(Refusal::Unauthorized), "{path}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_rescue_layer_makes_a_refusal_the_protocols_response() {
        let (service, _, _) = stack();
        let rescued = RescueLayer.layer(service);
        for path in ["/refuse", "/later-refuse"] {
            let resp = rescued.clone().oneshot(req(path)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        }
        let resp = rescued.oneshot(req("/next")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
}
