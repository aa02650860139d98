//! The request body, read whole before anything goes upstream (the
//! recovery layer replays it): at most `max_bytes`, within a deadline that
//! grows with what arrived (`timeout` plus one second per
//! `min_bytes_per_sec` bytes, so a large body on a slow link arrives and a
//! trickle does not), and valid JSON when its content type says JSON (or
//! it has none, as LLM APIs take): UTF-8, nested at most 127 deep, as `serde_json` reads a value.
//!
//! The bodies held at once share one budget (`held`, `max_held_body_bytes`),
//! counted as their bytes arrive and given back when the last holder of
//! the bytes lets go of them (the recovery layer keeps them for replays
//! until the request ends, a kept generation after its client left); a
//! body that does not fit is refused at once (`503`, `retry-after`), as
//! the stream slots shed load.
//!
//! An upload (the body of a request that is not a generation and not
//! JSON: a file, audio; or one that is not a generation, declared larger
//! than `max_bytes`: a batch) is not read here: it goes on as a bounded
//! stream, at most `max_upload_bytes` (`request_body`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use recovery_core::body_fields::ReadFields;
use recovery_core::protocol::{BodyForm, is_generation};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;
use crate::phase::{Decision, Phase, Step};
use crate::request_body::{Bounded, RequestBody};
use crate::respond::Refusal;

/// How long and how slowly a request body may arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyLimits {
    /// The largest body forwarded.
    pub(crate) max_bytes: usize,
    /// The largest upload forwarded (streamed, never held).
    pub(crate) max_upload_bytes: usize,
    /// The time any body gets.
    pub(crate) timeout: Duration,
    /// Each byte received earns this much more time.
    pub(crate) min_bytes_per_sec: u64,
}

/// The body phase.
pub(crate) struct ReadBody {
    pub(crate) limits: BodyLimits,
    /// The budget of body bytes held at once, a permit a byte, shared by
    /// every serving thread.
    pub(crate) held: Arc<Semaphore>,
    pub(crate) metrics: Arc<Metrics>,
}

impl<B> Phase<B> for ReadBody
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    type Out = RequestBody;

    fn run(self: &Arc<Self>, req: Request<B>) -> Decision<RequestBody> {
        let declared = req
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if is_upload(&req, declared, self.limits.max_bytes) {
            let max = self.limits.max_upload_bytes;
            if declared.is_some_and(|n| n > max as u64) {
                return Decision::Now(Err(Refusal::BodyTooLarge(max)));
            }
            let metrics = Arc::clone(&self.metrics);
            let limits = self.limits;
            let req = req.map(move |body| {
                let bounded = Bounded::new(
                    body,
                    max,
                    limits.timeout,
                    limits.min_bytes_per_sec,
                    Box::new(move || metrics.body_timeout()),
                );
                RequestBody::Upload(UnsyncBoxBody::new(bounded))
            });
            return Decision::Now(Ok(Step::next(req)));
        }
        let this = Arc::clone(self);
        Decision::Later(Box::pin(async move {
            let max = this.limits.max_bytes;
            if declared.is_some_and(|n| n > max as u64)
                || req.body().size_hint().lower() > max as u64
            {
                return Err(Refusal::BodyTooLarge(max));
            }
            let (mut parts, body) = req.into_parts();
            let held = Arc::clone(&this.held);
            let bytes = read(body, declared, this.limits, held)
                .await
                .inspect_err(|r| match r {
                    Refusal::BodyTooSlow => this.metrics.body_timeout(),
                    Refusal::BodiesFull => this.metrics.rejected(),
                    _ => {}
                })?;
            if !bytes.is_empty() && must_be_json(parts.headers.get(CONTENT_TYPE)) {
                // One pass validates the body and reads what the recovery
                // layer reads of it, which takes it from the extensions.
                let read = ReadFields::read(bytes.clone());
                if !read.is_json() {
                    return Err(Refusal::InvalidJson);
                }
                parts.extensions.insert(read);
            }
            Ok(Step::next(Request::from_parts(
                parts,
                RequestBody::whole(bytes),
            )))
        }))
    }
}

/// Whether `req`'s body is an upload: a request that is not a generation
/// (`is_generation`, the rule the recovery layer applies), nor a protocol
/// switch, whose body is not JSON or is declared larger than `max_bytes`
/// (a batch of requests in one JSON body).
fn is_upload<B>(req: &Request<B>, declared: Option<u64>, max_bytes: usize) -> bool {
    (!must_be_json(req.headers().get(CONTENT_TYPE))
        || declared.is_some_and(|n| n > max_bytes as u64))
        && crate::tunnel::wanted(req.headers()).is_none()
        && !is_generation(
            req.method().as_str(),
            req.uri().path_and_query().map_or("/", |p| p.as_str()),
        )
}

/// Whether a body with this content type must be JSON: JSON media types,
/// and no content type at all.
fn must_be_json(content_type: Option<&HeaderValue>) -> bool {
    match content_type.and_then(|v| v.to_str().ok()) {
        None => true,
        Some(ct) => BodyForm::of(Some(ct)) == BodyForm::WholeJson,
    }
}

/// The most reserved for a body before its bytes arrive: a body of its
/// declared length up to this is copied once, not once per doubling, and
/// a length declared but not sent holds no more than this.
const RESERVED_AHEAD: u64 = 1 << 20;

/// A body's bytes with their share of the budget: the share goes back
/// when the last clone of the bytes is dropped, wherever it is held.
struct Held {
    bytes: Bytes,
    _permit: OwnedSemaphorePermit,
}

impl Held {
    fn bytes(bytes: Bytes, permit: Option<OwnedSemaphorePermit>) -> Bytes {
        match permit {
            Some(permit) => Bytes::from_owner(Held {
                bytes,
                _permit: permit,
            }),
            None => bytes,
        }
    }
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

async fn read<B>(
    body: B,
    declared: Option<u64>,
    limits: BodyLimits,
    held: Arc<Semaphore>,
) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes>,
{
    let started = tokio::time::Instant::now();
    let mut body = std::pin::pin!(body);
    let ahead = declared.unwrap_or(0).min(RESERVED_AHEAD) as usize;
    let mut out = bytes::BytesMut::with_capacity(ahead);
    let mut permit: Option<OwnedSemaphorePermit> = None;
    loop {
        let earned = if limits.min_bytes_per_sec == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(out.len() as f64 / limits.min_bytes_per_sec as f64)
        };
        let deadline = started + limits.timeout + earned;
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(Refusal::BodyTooSlow),
            Ok(None) => return Ok(Held::bytes(out.freeze(), permit)),
            Ok(Some(Err(_))) => return Err(Refusal::BodyUnreadable),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limits.max_bytes {
                return Err(Refusal::BodyTooLarge(limits.max_bytes));
            }
            if !data.is_empty() {
                // A frame is far below 4 GiB; one that is not cannot fit.
                let n = u32::try_from(data.len()).map_err(|_| Refusal::BodiesFull)?;
                let more = Arc::clone(&held)
                    .try_acquire_many_owned(n)
                    .map_err(|_| Refusal::BodiesFull)?;
                match &mut permit {
                    Some(p) => p.merge(more),
                    None => permit = Some(more),
                }
            }
            out.extend_from_slice(&data);
        }
    }
}
