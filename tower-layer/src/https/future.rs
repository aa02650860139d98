//! The future of a send: hyper-util's, then the answer's body with its
//! place on a lane.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use hyper::body::Incoming;
use hyper_util::client::legacy::Error;

use super::body::ResponseBody;
use super::lanes::Slot;

pin_project_lite::pin_project! {
    /// The answer to a request sent through [`HttpsClient`](super::HttpsClient).
    /// Dropped before the answer, it frees the request's place on its lane.
    pub struct ResponseFuture {
        #[pin]
        inner: hyper_util::client::legacy::ResponseFuture,
        slot: Option<Slot>,
    }
}

impl ResponseFuture {
    pub(super) fn new(
        inner: hyper_util::client::legacy::ResponseFuture,
        slot: Option<Slot>,
    ) -> Self {
        ResponseFuture { inner, slot }
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<ResponseBody>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answer: Result<Response<Incoming>, Error> = ready!(this.inner.poll(cx));
        // A failed send drops its place here.
        let slot = this.slot.take();
        Poll::Ready(answer.map(|r| r.map(|body| ResponseBody::new(body, slot))))
    }
}
