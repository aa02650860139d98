use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use recovery_core::failure::{Unfinished, Violation};
use recovery_core::observer::{EndOfStream, StreamObserver};

use super::handle::{ObserveHandle, Published};
use crate::BoxError;

/// Why an observed body ended in error.
#[derive(Debug)]
#[non_exhaustive]
pub enum ObserveError {
    /// The inner body failed (reset, incomplete chunked body, ...).
    Body(BoxError),
    /// The stream broke its protocol; the body stops here.
    Protocol(Violation),
    /// The body ended cleanly without terminal proof: truncation (with the
    /// frame it ended inside, if any).
    UnexpectedEof(Option<Unfinished>),
}

impl fmt::Display for ObserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObserveError::Body(_) => f.write_str("response body failed"),
            ObserveError::Protocol(v) => write!(f, "protocol violation: {v}"),
            ObserveError::UnexpectedEof(_) => {
                f.write_str("response body ended without terminal proof")
            }
        }
    }
}

impl std::error::Error for ObserveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ObserveError::Body(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body decoded as it passes. Bytes are forwarded untouched;
    /// evidence goes to the [`ObserveHandle`], which owns the decoder. A clean
    /// end without terminal proof becomes [`ObserveError::UnexpectedEof`];
    /// dropping the body early is recorded as cancellation, never as an EOF.
    pub struct ObservedBody<B> {
        #[pin]
        inner: B,
        observing: Option<Observing>,
        ended: bool,
    }

    impl<B> PinnedDrop for ObservedBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(o) = this.observing.as_ref()
                && !*this.ended {
                    o.handle.lock().cancelled = true;
                }
        }
    }
}

impl<B> fmt::Debug for ObservedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObservedBody")
            .field("observed", &self.observing.is_some())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// The decoder of an observed body and where it publishes.
struct Observing {
    observer: StreamObserver,
    handle: ObserveHandle,
    published: Published,
}

impl<B> ObservedBody<B> {
    /// A body decoded by `observer`, published to `handle`.
    pub(crate) fn new(inner: B, observer: StreamObserver, handle: ObserveHandle) -> Self {
        ObservedBody {
            inner,
            observing: Some(Observing {
                observer,
                handle,
                published: Published::default(),
            }),
            ended: false,
        }
    }

    pub(crate) fn passthrough(inner: B) -> Self {
        ObservedBody {
            inner,
            observing: None,
            ended: false,
        }
    }
}

impl Observing {
    /// Feeds one data frame to the decoder.
    fn frame(&mut self, data: &Bytes) -> Result<(), Violation> {
        let fed = self.observer.observe(data);
        self.handle.publish(&self.observer, &mut self.published);
        fed.map_err(|v| {
            let mut state = self.handle.lock();
            state.end = Some(EndOfStream::Violation { violation: v });
            state.ended = true;
            Violation::from(v)
        })
    }

    /// Judges the clean end of the body: the error it ends with, if any.
    #[cold]
    fn end(&mut self) -> Option<ObserveError> {
        let end = self.observer.finish();
        self.handle.publish(&self.observer, &mut self.published);
        let mut state = self.handle.lock();
        state.ended = true;
        state.generation.clone_from(self.observer.generation());
        state.end = Some(end.clone());
        match end {
            EndOfStream::Success { .. }
            | EndOfStream::Unsuccessful { .. }
            | EndOfStream::ProviderError { .. } => None,
            EndOfStream::Violation { violation } => {
                Some(ObserveError::Protocol(Violation::from(violation)))
            }
            EndOfStream::UnexpectedEof { pending } => Some(ObserveError::UnexpectedEof(pending)),
        }
    }
}

impl<B> Body for ObservedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = ObserveError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ObserveError>>> {
        let this = self.project();
        if *this.ended {
            return Poll::Ready(None);
        }
        let Some(observing) = this.observing.as_mut() else {
            let polled = ready!(this.inner.poll_frame(cx));
            if polled.is_none() {
                *this.ended = true;
            }
            return Poll::Ready(polled.map(|r| r.map_err(|e| ObserveError::Body(e.into()))));
        };
        // Matched in place, and the frame's bytes put back in a new frame:
        // moving the whole `Frame` (sized for trailers) costs more.
        match ready!(this.inner.poll_frame(cx)) {
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    if let Err(v) = observing.frame(&data) {
                        *this.ended = true;
                        return Poll::Ready(Some(Err(ObserveError::Protocol(v))));
                    }
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Err(trailers) => Poll::Ready(Some(Ok(trailers))),
            },
            Some(Err(e)) => {
                *this.ended = true;
                // The frame the body broke inside: the same evidence a clean
                // end would judge.
                let unfinished = observing.observer.unfinished();
                let mut state = observing.handle.lock();
                state.ended = true;
                state.unfinished = unfinished;
                drop(state);
                Poll::Ready(Some(Err(ObserveError::Body(e.into()))))
            }
            None => {
                *this.ended = true;
                Poll::Ready(observing.end().map(Err))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
