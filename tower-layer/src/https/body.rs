//! The body of an answer: hyper's, holding its stream's place on a lane
//! until the stream ends.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;

use super::lanes::Slot;

pin_project_lite::pin_project! {
    /// An answer's body as hyper reads it. While it is read, its stream
    /// counts against its connection's bound; the place is freed at its
    /// end, at an error, or when it is dropped.
    #[derive(Debug)]
    pub struct ResponseBody {
        #[pin]
        inner: Incoming,
        slot: Option<Slot>,
    }
}

impl ResponseBody {
    pub(super) fn new(inner: Incoming, slot: Option<Slot>) -> Self {
        ResponseBody { inner, slot }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.slot.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
