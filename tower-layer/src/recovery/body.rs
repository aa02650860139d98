use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use recovery_core::error::RecoveryError;

use super::driver::{Driver, Step};
use crate::BoxError;

enum Kind<B> {
    /// The committed attempt's stream, continued by resumes where the
    /// protocol allows, driven by the request's machine.
    Committed(Box<Driver<B>>),
    /// A final HTTP error response, passed through as the server sent it.
    Passthrough {
        held: VecDeque<Bytes>,
        inner: Option<Pin<Box<B>>>,
    },
    /// Ended.
    Done,
}

/// The stitched response body: first the held-back prefix, then the
/// committed attempt's stream, continued by resumes where the protocol
/// allows. After commit a failure ends it with a typed [`RecoveryError`];
/// the end of the stream completes the report.
///
/// `B` is the inner service's response body, polled in place: no boxing
/// behind a trait object, no error mapping per frame.
pub struct RecoveryBody<B> {
    kind: Kind<B>,
}

impl<B> fmt::Debug for RecoveryBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveryBody")
            .field("committed", &matches!(self.kind, Kind::Committed(_)))
            .finish_non_exhaustive()
    }
}

type Polled = Poll<Option<Result<Frame<Bytes>, RecoveryError>>>;

impl<B> RecoveryBody<B> {
    pub(crate) fn committed(driver: Box<Driver<B>>) -> Self {
        RecoveryBody {
            kind: Kind::Committed(driver),
        }
    }

    pub(crate) fn passthrough(held: VecDeque<Bytes>, inner: Option<Pin<Box<B>>>) -> Self {
        RecoveryBody {
            kind: Kind::Passthrough { held, inner },
        }
    }
}

impl<B> Body for RecoveryBody<B>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = RecoveryError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = &mut *self;
        match &mut this.kind {
            Kind::Committed(driver) => {
                // The common frame: committed, nothing queued or pending.
                // The frame's bytes are taken out and put back in a new
                // frame: moving the whole `Frame` (sized for trailers)
                // costs more.
                if driver.passing()
                    && let Some(inner) = driver.inner.as_mut()
                {
                    match inner.as_mut().poll_frame(cx) {
                        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                            Ok(data) => {
                                if driver.pass(&data) {
                                    driver.delivered();
                                    return Poll::Ready(Some(Ok(Frame::data(data))));
                                }
                                driver.keep(data);
                            }
                            Err(frame) => driver.trailers(frame),
                        },
                        Poll::Pending => {
                            if driver.idle(cx) {
                                return Poll::Pending;
                            }
                        }
                        Poll::Ready(other) => {
                            driver.body_ended(other.map(|r| r.map_err(Into::into)));
                        }
                    }
                }
                let polled = match ready!(driver.poll_step(cx)) {
                    Step::Deliver(data) => {
                        driver.delivered();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Step::Trailers(trailers) => {
                        return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                    }
                    Step::End(Err(e)) => Some(Err(e)),
                    // A head is handed out once, before the body.
                    Step::End(Ok(())) | Step::Respond(_) | Step::RespondError(..) => None,
                };
                this.kind = Kind::Done;
                Poll::Ready(polled)
            }
            Kind::Passthrough { held, inner } => {
                if let Some(data) = held.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                let Some(body) = inner.as_mut() else {
                    return Poll::Ready(None);
                };
                if let Some(Ok(frame)) = ready!(body.as_mut().poll_frame(cx)) {
                    return Poll::Ready(Some(Ok(frame)));
                }
                // The error response is what it is: its body's own failure
                // ends it.
                *inner = None;
                Poll::Ready(None)
            }
            Kind::Done => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Committed(_) => false,
            Kind::Passthrough { held, inner } => {
                held.is_empty()
                    && inner
                        .as_ref()
                        .is_none_or(|b| Body::is_end_stream(b.as_ref().get_ref()))
            }
            Kind::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
