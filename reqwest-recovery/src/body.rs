//! Bodies across the boundary between `http`/`http-body` and reqwest.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures_core::Stream;
use http_body::{Body, Frame, SizeHint};

use crate::BoxError;
use crate::error::Error;

/// The body of a response received through reqwest, as an
/// [`http_body::Body`] of [`Bytes`] with a typed [`Error`].
///
/// It reads the reqwest response as it arrives (no buffering). A failed read
/// (a reset, a body shorter than announced, one of reqwest's timers) is an
/// [`Error`] whose source chain holds reqwest's, hyper's and the socket's
/// errors, which is where recovery reads what happened.
pub struct ResponseBody {
    inner: reqwest::Body,
}

impl ResponseBody {
    pub(crate) fn new(inner: reqwest::Body) -> Self {
        ResponseBody { inner }
    }
}

impl fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody").finish_non_exhaustive()
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map(|frame| frame.map(|r| r.map_err(Error::from_reqwest)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Makes a request body reqwest can send.
///
/// The recovery layer hands over its buffered request as one ready frame.
/// That frame is taken at once (a single poll that needs no wakeup) and
/// given to reqwest as plain bytes: reqwest then sends an exact
/// `content-length`, and its own resend of an HTTP/2 stream the server
/// refused unprocessed stays possible. Any other body is streamed as it is,
/// the frame already taken first.
pub(crate) fn request_body<B>(body: B) -> reqwest::Body
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    if body.is_end_stream() {
        return reqwest::Body::from(Bytes::new());
    }
    let mut body = Box::pin(body);
    let mut cx = Context::from_waker(Waker::noop());
    let first = match body.as_mut().poll_frame(&mut cx) {
        Poll::Ready(None) => return reqwest::Body::from(Bytes::new()),
        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
            Ok(data) if body.is_end_stream() => return reqwest::Body::from(data),
            Ok(data) => Some(Ok(data)),
            // Request trailers are not sent by reqwest.
            Err(_) => None,
        },
        Poll::Ready(Some(Err(e))) => Some(Err(e.into())),
        Poll::Pending => None,
    };
    reqwest::Body::wrap_stream(RequestStream {
        first,
        body: Some(body),
    })
}

/// A request body as the stream reqwest takes: the frame already read, then
/// the rest, data only.
struct RequestStream<B> {
    first: Option<Result<Bytes, BoxError>>,
    body: Option<Pin<Box<B>>>,
}

impl<B> Stream for RequestStream<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Item = Result<Bytes, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(first) = self.first.take() {
            if first.is_err() {
                self.body = None;
            }
            return Poll::Ready(Some(first));
        }
        poll_data(&mut self.body, cx).map(|item| item.map(|r| r.map_err(Into::into)))
    }
}

/// A response body (the recovering one) as the stream a `reqwest::Body`
/// wraps: data frames only, since `reqwest::Response` has no trailers.
#[cfg(feature = "middleware")]
pub(crate) struct DataStream<B> {
    body: Option<Pin<Box<B>>>,
}

#[cfg(feature = "middleware")]
impl<B> DataStream<B> {
    pub(crate) fn new(body: B) -> Self {
        DataStream {
            body: Some(Box::pin(body)),
        }
    }
}

#[cfg(feature = "middleware")]
impl<B: Body<Data = Bytes>> Stream for DataStream<B> {
    type Item = Result<Bytes, B::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        poll_data(&mut self.body, cx)
    }
}

/// The next data frame of `body`, skipping trailers; after its end or its
/// first error the body is dropped and the stream stays ended.
fn poll_data<B: Body<Data = Bytes>>(
    body: &mut Option<Pin<Box<B>>>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, B::Error>>> {
    loop {
        let Some(inner) = body.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.as_mut().poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    return Poll::Ready(Some(Ok(data)));
                }
            }
            Poll::Ready(Some(Err(e))) => {
                *body = None;
                return Poll::Ready(Some(Err(e)));
            }
            Poll::Ready(None) => {
                *body = None;
                return Poll::Ready(None);
            }
        }
    }
}
