//! The request body as the inner service sees it: buffered once so that every
//! resend carries the same bytes, or streamed once when it is too large.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;

use crate::BoxError;

/// Body of the requests `RecoveryLayer` sends to its inner service.
pub struct ReplayBody {
    kind: Kind,
}

enum Kind {
    /// A buffered body: cloning `Bytes` is zero-copy, so every attempt sends
    /// the very same bytes.
    Full(Option<Bytes>),
    /// A body over the replay cap, sent once: the buffered prefix, then the
    /// rest of the caller's body.
    Once(UnsyncBoxBody<Bytes, BoxError>),
}

impl std::fmt::Debug for ReplayBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Full(b) => f
                .debug_struct("ReplayBody")
                .field("len", &b.as_ref().map_or(0, Bytes::len))
                .finish(),
            Kind::Once(_) => f.write_str("ReplayBody(streamed once)"),
        }
    }
}

impl ReplayBody {
    /// A buffered body.
    pub fn full(bytes: Bytes) -> Self {
        ReplayBody {
            kind: Kind::Full((!bytes.is_empty()).then_some(bytes)),
        }
    }

    pub(crate) fn once(body: UnsyncBoxBody<Bytes, BoxError>) -> Self {
        ReplayBody {
            kind: Kind::Once(body),
        }
    }
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.kind {
            Kind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            Kind::Once(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.is_none(),
            Kind::Once(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Once(body) => body.size_hint(),
        }
    }
}

/// The caller's body after buffering.
pub(crate) enum Buffered {
    /// Fits the cap: replayable.
    Replayable(Bytes),
    /// Over the cap: the prefix read so far and the rest, to send once.
    TooLarge(ReplayBody),
    /// The caller asked for the body to be streamed through, never buffered.
    NotReplayable(ReplayBody),
}

/// Reads `body` into memory up to `cap` bytes.
pub(crate) async fn buffer<B>(body: B, cap: usize) -> Result<Buffered, BoxError>
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let mut body = Box::pin(body);
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut len = 0usize;
    while let Some(frame) = body.as_mut().frame().await {
        let frame = frame.map_err(Into::into)?;
        if let Ok(data) = frame.into_data() {
            len += data.len();
            chunks.push(data);
            if len > cap {
                let rest = Prefixed {
                    prefix: chunks.into(),
                    rest: body,
                };
                return Ok(Buffered::TooLarge(ReplayBody::once(UnsyncBoxBody::new(
                    rest.map_err(Into::into),
                ))));
            }
        }
    }
    let bytes = if chunks.len() == 1 {
        chunks.pop().unwrap_or_default()
    } else {
        let mut all = bytes::BytesMut::with_capacity(len);
        for c in chunks {
            all.extend_from_slice(&c);
        }
        all.freeze()
    };
    Ok(Buffered::Replayable(bytes))
}

/// The chunks already read, then the rest of the caller's body.
struct Prefixed<B> {
    prefix: std::collections::VecDeque<Bytes>,
    rest: Pin<Box<B>>,
}

impl<B: Body<Data = Bytes>> Body for Prefixed<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if let Some(chunk) = self.prefix.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        self.rest.as_mut().poll_frame(cx)
    }
}
