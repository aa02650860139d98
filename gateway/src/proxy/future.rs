//! The proxy's response future: the upstream call, then the delivery of
//! its answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use recovery_core::error::RecoveryError;
use recovery_core::protocol::ProtocolKind;
use recovery_core::protocol::error_event::StreamFailure;
use tower::util::Oneshot;
use tower_recovery::ReportHandle;

use super::Proxy;
use crate::body::GatewayBody;
use crate::downstream::Delivery;
use crate::forward::{Stack, UpstreamBody};
use crate::identity::Owner;
use crate::logs::Field;
use crate::phase::BoxFuture;
use crate::request_body::RequestBody;
use crate::respond::Refusal;

pin_project! {
    /// The answer to a request the proxy sends. Waiting for the upstream's
    /// head it holds the call and what the delivery needs, inline in the
    /// phases' future; the delivery (the stream log's opening, the first
    /// event) is several times that size and lasts until the head goes
    /// out, so it is boxed when the head comes. A tunnel's answer is
    /// boxed from the start (`tunnel`).
    #[project = Projected]
    pub(crate) enum AnswerFuture {
        Calling {
            #[pin]
            call: Oneshot<Stack, Request<RequestBody>>,
            // Taken when the call answers.
            then: Option<Then>,
        },
        Delivering {
            delivery: BoxFuture<Result<Response<GatewayBody>, Refusal>>,
        },
        Refused {
            // Taken by the one poll that returns it.
            refusal: Option<Refusal>,
        },
    }
}

/// What the delivery of an answer needs besides the answer.
pub(super) struct Then {
    pub(super) proxy: Arc<Proxy>,
    pub(super) protocol: ProtocolKind,
    pub(super) resumable: bool,
    pub(super) generation: bool,
    pub(super) owner: Owner,
}

impl AnswerFuture {
    pub(super) fn calling(call: Oneshot<Stack, Request<RequestBody>>, then: Then) -> Self {
        AnswerFuture::Calling {
            call,
            then: Some(then),
        }
    }

    /// An answer made whole elsewhere (a tunnel's).
    pub(super) fn boxed(answer: BoxFuture<Result<Response<GatewayBody>, Refusal>>) -> Self {
        AnswerFuture::Delivering { delivery: answer }
    }

    pub(super) fn refused(refusal: Refusal) -> Self {
        AnswerFuture::Refused {
            refusal: Some(refusal),
        }
    }
}

impl Future for AnswerFuture {
    type Output = Result<Response<GatewayBody>, Refusal>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project() {
                Projected::Calling { call, then } => {
                    let answer = ready!(call.poll(cx));
                    let then = then.take().expect("a call answers once");
                    match answer {
                        Ok(resp) => AnswerFuture::Delivering {
                            delivery: then.deliver(resp),
                        },
                        Err(e) => return Poll::Ready(Err(then.failed(&e))),
                    }
                }
                Projected::Delivering { delivery } => return delivery.as_mut().poll(cx),
                Projected::Refused { refusal } => {
                    return Poll::Ready(Err(refusal
                        .take()
                        .expect("AnswerFuture polled after completion")));
                }
            };
            self.set(next);
        }
    }
}

impl Then {
    /// The client's response to the upstream's `resp`, delivered.
    fn deliver(
        self,
        resp: Response<UpstreamBody>,
    ) -> BoxFuture<Result<Response<GatewayBody>, Refusal>> {
        let logical_id = resp
            .extensions()
            .get::<ReportHandle>()
            .map(|h| h.inspect(|r| r.logical_id.clone()))
            .unwrap_or_default();
        Box::pin(async move {
            let Then {
                proxy,
                protocol,
                resumable,
                generation,
                owner,
            } = self;
            Delivery {
                streams: &proxy.streams,
                keys: &proxy.keys,
                logger: &proxy.logger,
                comments: proxy.comments,
                protocol,
                resumable,
                generation,
                owner,
                logical_id,
            }
            .answer(resp)
            .await
        })
    }

    /// The refusal for a request that got no upstream answer.
    fn failed(&self, e: &RecoveryError) -> Refusal {
        self.proxy.logger.warn(
            "upstream_failed",
            "no upstream response; answering with the provider's error shape",
            &[
                ("logical_id", Field::Str(&e.report().logical_id)),
                ("outcome", Field::Str(e.outcome().name())),
            ],
        );
        Refusal::Upstream(StreamFailure::of_outcome(
            e.outcome(),
            e.report().last_status(),
        ))
    }
}
