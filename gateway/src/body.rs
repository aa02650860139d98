//! Response bodies: whole, streamed, JSON.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

/// A type-erased error, as hyper takes.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body the gateway writes.
pub(crate) type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// A whole body.
pub(crate) fn full(bytes: impl Into<Bytes>) -> GatewayBody {
    Full::new(bytes.into())
        .map_err(|e: Infallible| match e {})
        .boxed_unsync()
}

/// A body from a stream of chunks; an `Err` aborts the response (the
/// client sees a broken body, never a clean end).
pub(crate) fn streaming<S>(stream: S) -> GatewayBody
where
    S: Stream<Item = Result<Bytes, BoxError>> + Send + 'static,
{
    StreamBody {
        inner: Box::pin(stream),
    }
    .boxed_unsync()
}

struct StreamBody<S> {
    inner: Pin<Box<S>>,
}

impl<S> Body for StreamBody<S>
where
    S: Stream<Item = Result<Bytes, BoxError>>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.inner
            .as_mut()
            .poll_next(cx)
            .map(|o| o.map(|r| r.map(Frame::data)))
    }
}

/// A JSON response.
pub(crate) fn json(status: StatusCode, body: impl Into<Bytes>) -> Response<GatewayBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}
