//! The body a request goes upstream with: the bytes the body phase read
//! whole (a generation's, replayed as often as the recovery layer sends
//! it), or an upload streamed once as it arrives.
//!
//! An upload is the body of a request that is not a generation and is not
//! JSON (a file, audio to transcribe: `multipart/form-data`,
//! `application/octet-stream`). Holding it whole would cost its size in
//! memory per request, so it is not held: it is sent once
//! (`RecoveryCall::streaming_body`: a failure before the answer is not
//! replayed), at most `max_upload_bytes` of it, within the deadline every
//! body has (the body phase's `timeout`, plus a second per
//! `min_bytes_per_sec` bytes that arrived). An upload that breaks a bound
//! ends with an error, so the upstream never takes it for whole.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::UnsyncBoxBody;
use tokio::time::{Instant, Sleep};

use crate::body::BoxError;

/// See the module docs.
pub(crate) enum RequestBody {
    /// Read whole by the body phase (`None`: empty, or sent).
    Whole(Option<Bytes>),
    /// Streamed once, bounded.
    Upload(UnsyncBoxBody<Bytes, BoxError>),
}

impl RequestBody {
    /// A whole body.
    pub(crate) fn whole(bytes: Bytes) -> Self {
        RequestBody::Whole((!bytes.is_empty()).then_some(bytes))
    }

    /// Whether it is an upload, streamed once.
    pub(crate) fn is_upload(&self) -> bool {
        matches!(self, RequestBody::Upload(_))
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Whole(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            RequestBody::Upload(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Whole(bytes) => bytes.is_none(),
            RequestBody::Upload(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Whole(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
            RequestBody::Upload(body) => body.size_hint(),
        }
    }
}

/// Why an upload was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// More than the bound arrived.
    TooLarge(usize),
    /// It did not arrive within its deadline.
    TooSlow,
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::TooLarge(max) => write!(f, "the upload is over max_upload_bytes ({max})"),
            Cut::TooSlow => f.write_str("the upload did not arrive within its deadline"),
        }
    }
}

impl std::error::Error for Cut {}

/// An upload's body under its bounds; `on_slow` runs once when it misses
/// its deadline.
pub(crate) struct Bounded<B> {
    body: B,
    max: usize,
    read: usize,
    started: Instant,
    timeout: Duration,
    min_bytes_per_sec: u64,
    sleep: Pin<Box<Sleep>>,
    on_slow: Option<Box<dyn FnOnce() + Send>>,
    done: bool,
}

impl<B> Bounded<B> {
    pub(crate) fn new(
        body: B,
        max: usize,
        timeout: Duration,
        min_bytes_per_sec: u64,
        on_slow: Box<dyn FnOnce() + Send>,
    ) -> Self {
        let started = Instant::now();
        Bounded {
            body,
            max,
            read: 0,
            started,
            timeout,
            min_bytes_per_sec,
            sleep: Box::pin(tokio::time::sleep_until(started + timeout)),
            on_slow: Some(on_slow),
            done: false,
        }
    }

    /// The deadline what arrived so far earned.
    fn deadline(&self) -> Instant {
        let earned = if self.min_bytes_per_sec == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(self.read as f64 / self.min_bytes_per_sec as f64)
        };
        self.started + self.timeout + earned
    }
}

impl<B> Body for Bounded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            let frame = match frame {
                None => {
                    this.done = true;
                    return Poll::Ready(None);
                }
                Some(Err(e)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Some(Ok(frame)) => frame,
            };
            if let Some(data) = frame.data_ref() {
                this.read += data.len();
                if this.read > this.max {
                    this.done = true;
                    return Poll::Ready(Some(Err(Box::new(Cut::TooLarge(this.max)))));
                }
                let deadline = this.deadline();
                this.sleep.as_mut().reset(deadline);
            }
            return Poll::Ready(Some(Ok(frame)));
        }
        ready!(this.sleep.as_mut().poll(cx));
        this.done = true;
        if let Some(on_slow) = this.on_slow.take() {
            on_slow();
        }
        Poll::Ready(Some(Err(Box::new(Cut::TooSlow))))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt as _, StreamBody};

    fn chunks(n: usize, size: usize) -> impl Body<Data = Bytes, Error = BoxError> + Unpin {
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = (0..n)
            .map(|_| Ok(Frame::data(Bytes::from(vec![b'x'; size]))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    /// `body` under a 4,000-byte bound and a 10 s deadline.
    fn bounded<B>(body: B) -> Bounded<B> {
        Bounded::new(body, 4000, Duration::from_secs(10), 0, Box::new(|| {}))
    }

    #[tokio::test]
    async fn an_upload_within_its_bound_arrives_whole() {
        let body = bounded(chunks(4, 1000));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(got.len(), 4000);
    }

    #[tokio::test]
    async fn an_upload_over_its_bound_ends_with_an_error() {
        let body = bounded(chunks(5, 1000));
        let err = body.collect().await.unwrap_err();
        assert_eq!(err.downcast_ref::<Cut>(), Some(&Cut::TooLarge(4000)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_upload_ends_at_its_deadline() {
        let stalled = StreamBody::new(futures_util::stream::pending::<
            Result<Frame<Bytes>, BoxError>,
        >());
        let slow = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = std::sync::Arc::clone(&slow);
        let body = Bounded::new(
            stalled,
            4000,
            Duration::from_secs(10),
            0,
            Box::new(move || flag.store(true, std::sync::atomic::Ordering::SeqCst)),
        );
        let started = Instant::now();
        let err = body.collect().await.unwrap_err();
        assert_eq!(err.downcast_ref::<Cut>(), Some(&Cut::TooSlow));
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert!(slow.load(std::sync::atomic::Ordering::SeqCst));
    }
}
