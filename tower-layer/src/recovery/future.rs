use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use http_body::Body;
use recovery_core::error::RecoveryError;

use super::body::RecoveryBody;
use super::driver::{Driver, Step};
use crate::BoxError;

/// Buffers the caller's request body and sets up the driver.
pub(crate) type Preparing<B> =
    Pin<Box<dyn Future<Output = Result<Driver<B>, RecoveryError>> + Send>>;

enum State<B> {
    /// Buffering the request body (for replay).
    Preparing(Preparing<B>),
    /// Running attempts up to commit.
    Driving(Box<Driver<B>>),
    /// Resolved.
    Done,
}

/// Response future of [`Recover`](super::Recover): resolves at commit with
/// the committed attempt's head, or with the final HTTP error response, or
/// fails with a typed [`RecoveryError`]. Dropped before it resolved, the
/// request is cancelled (exactly one terminal event either way).
pub struct ResponseFuture<B> {
    state: State<B>,
}

impl<B> ResponseFuture<B> {
    pub(crate) fn new(preparing: Preparing<B>) -> Self {
        ResponseFuture {
            state: State::Preparing(preparing),
        }
    }
}

impl<B> std::fmt::Debug for ResponseFuture<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<B> Future for ResponseFuture<B>
where
    B: Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<RecoveryBody<B>>, RecoveryError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Preparing(preparing) => match ready!(preparing.as_mut().poll(cx)) {
                    Ok(driver) => this.state = State::Driving(Box::new(driver)),
                    Err(e) => {
                        this.state = State::Done;
                        return Poll::Ready(Err(e));
                    }
                },
                State::Driving(driver) => {
                    let step = ready!(driver.poll_step(cx));
                    let State::Driving(driver) = std::mem::replace(&mut this.state, State::Done)
                    else {
                        unreachable!("driving")
                    };
                    let report = driver.report_handle();
                    return Poll::Ready(match step {
                        Step::Respond(mut parts) => {
                            parts.extensions.insert(report);
                            Ok(Response::from_parts(parts, RecoveryBody::committed(driver)))
                        }
                        Step::RespondError(mut parts, held, inner) => {
                            parts.extensions.insert(report);
                            Ok(Response::from_parts(
                                parts,
                                RecoveryBody::passthrough(held, inner),
                            ))
                        }
                        Step::End(Err(e)) => Err(e),
                        // Output only flows after the head was handed out.
                        Step::Deliver(_) | Step::Trailers(_) | Step::End(Ok(())) => {
                            Err(driver.unanswered())
                        }
                    });
                }
                State::Done => return Poll::Pending,
            }
        }
    }
}
