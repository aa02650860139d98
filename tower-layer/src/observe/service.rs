use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use http_body::Body;
use recovery_core::protocol::{BodyForm, ProtocolKind, is_generation};
use recovery_core::wire::Limits;
use tower_service::Service;

use super::body::ObservedBody;
use super::handle::ObserveHandle;
use recovery_core::observer::StreamObserver;

/// Observes the response bodies of the inner service. See [`ObserveLayer`].
///
/// [`ObserveLayer`]: super::ObserveLayer
#[derive(Debug, Clone)]
pub struct Observe<S> {
    pub(crate) inner: S,
    pub(crate) protocol: ProtocolKind,
    pub(crate) limits: Limits,
}

impl<S> Observe<S> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, this layer removed.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Observe<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Body<Data = bytes::Bytes>,
{
    type Response = Response<ObservedBody<ResBody>>;
    type Error = S::Error;
    type Future = ObserveFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        // Under a recovery layer, the send says how its machine reads it:
        // its caps, and its protocol when not this layer's (an alternate
        // that speaks another).
        let (protocol, limits) = match req.extensions().get::<crate::recovery::SendReading>() {
            Some(r) => (
                r.protocol.clone().unwrap_or_else(|| self.protocol.clone()),
                r.limits,
            ),
            None => (self.protocol.clone(), self.limits),
        };
        let generation = is_generation(
            req.method().as_str(),
            req.uri().path_and_query().map_or("/", |p| p.as_str()),
        );
        ObserveFuture {
            inner: self.inner.call(req),
            protocol: Some(protocol),
            limits,
            generation,
        }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`Observe`].
    #[derive(Debug)]
    pub struct ObserveFuture<F> {
        #[pin]
        inner: F,
        protocol: Option<ProtocolKind>,
        limits: Limits,
        // Whether the request asks for a generation: an answer to any
        // other is passed through, not decoded (`BodyForm::Opaque`).
        generation: bool,
    }
}

impl<F, ResBody, E> Future for ObserveFuture<F>
where
    F: Future<Output = Result<Response<ResBody>, E>>,
    ResBody: Body<Data = bytes::Bytes>,
{
    type Output = Result<Response<ObservedBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let protocol = this.protocol.take().unwrap_or(ProtocolKind::OpenAiChat);
        let (mut parts, body) = response.into_parts();
        // Only a successful answer is a stream to decode; an error body is
        // passed through untouched for the recovery layer to classify.
        let body = if parts.status.is_success() {
            // One rule for every driver: a JSON answer is a whole
            // (non-streamed) body, judged at its end; the answer to a
            // request that is not a generation is not judged at all.
            let form = if *this.generation {
                BodyForm::of(
                    parts
                        .headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok()),
                )
            } else {
                BodyForm::Opaque
            };
            let observer = StreamObserver::for_form(&protocol, *this.limits, form);
            let handle = ObserveHandle::new(protocol);
            parts.extensions.insert(handle.clone());
            ObservedBody::new(body, observer, handle)
        } else {
            parts.extensions.insert(ObserveHandle::new(protocol));
            ObservedBody::passthrough(body)
        };
        Poll::Ready(Ok(Response::from_parts(parts, body)))
    }
}
