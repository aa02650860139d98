//! The response futures of the phases and of the rescue layer.
//!
//! They nest as the services do, so a request's way through every phase is
//! one future, kept where hyper keeps the connection's request in flight;
//! only a phase that waits boxes its own decision.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use recovery_core::protocol::ProtocolKind;
use tower_service::Service;

use super::{BoxFuture, Hold, Step, with_hold};
use crate::body::GatewayBody;
use crate::respond::Refusal;

pin_project! {
    /// The response of a phase ([`super::PhaseService`]): its decision still
    /// to come, the rest of the stack's response, or an answer made at once.
    #[project = Projected]
    pub(crate) enum PhaseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        Deciding {
            decision: BoxFuture<Result<Step<B>, Refusal>>,
            // Taken when the decision passes the request on.
            inner: Option<S>,
        },
        Calling {
            #[pin]
            response: S::Future,
            hold: Option<Hold>,
        },
        Done {
            // Taken by the one poll that returns it.
            answer: Option<Result<Response<GatewayBody>, Refusal>>,
        },
    }
}

impl<S: Service<Request<B>>, B> PhaseFuture<S, B> {
    pub(super) fn deciding(decision: BoxFuture<Result<Step<B>, Refusal>>, inner: S) -> Self {
        PhaseFuture::Deciding {
            decision,
            inner: Some(inner),
        }
    }

    pub(super) fn calling(response: S::Future, hold: Option<Hold>) -> Self {
        PhaseFuture::Calling { response, hold }
    }

    pub(super) fn done(answer: Result<Response<GatewayBody>, Refusal>) -> Self {
        PhaseFuture::Done {
            answer: Some(answer),
        }
    }
}

impl<S, B> Future for PhaseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = Refusal>,
{
    type Output = Result<Response<GatewayBody>, Refusal>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project() {
                Projected::Deciding { decision, inner } => match ready!(decision.as_mut().poll(cx))
                {
                    Ok(Step::Next { req, hold }) => {
                        // Present until here: this state is left at once.
                        let mut inner =
                            inner.take().expect("a decision passes its request on once");
                        PhaseFuture::calling(inner.call(req), hold)
                    }
                    Ok(Step::Answer(resp)) => PhaseFuture::done(Ok(resp)),
                    Err(refusal) => PhaseFuture::done(Err(refusal)),
                },
                Projected::Calling { response, hold } => {
                    let resp = ready!(response.poll(cx))?;
                    return Poll::Ready(Ok(with_hold(resp, hold.take())));
                }
                Projected::Done { answer } => {
                    return Poll::Ready(
                        answer.take().expect("PhaseFuture polled after completion"),
                    );
                }
            };
            self.set(next);
        }
    }
}

pin_project! {
    /// The response of the rescue layer ([`super::Rescue`]): a refusal
    /// becomes the response of the protocol the request's path speaks.
    pub(crate) struct RescueFuture<F> {
        #[pin]
        inner: F,
        protocol: ProtocolKind,
    }
}

impl<F> RescueFuture<F> {
    pub(super) fn new(inner: F, protocol: ProtocolKind) -> Self {
        RescueFuture { inner, protocol }
    }
}

impl<F> Future for RescueFuture<F>
where
    F: Future<Output = Result<Response<GatewayBody>, Refusal>>,
{
    type Output = Result<Response<GatewayBody>, std::convert::Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        Poll::Ready(Ok(match ready!(this.inner.poll(cx)) {
            Ok(resp) => resp,
            Err(refusal) => refusal.respond(this.protocol),
        }))
    }
}
