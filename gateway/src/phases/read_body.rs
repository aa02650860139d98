//! The request body, read whole before anything goes upstream (the
//! recovery layer replays it): at most `max_bytes`, within a deadline that
//! grows with what arrived (`timeout` plus one second per
//! `min_bytes_per_sec` bytes, so a large body on a slow link arrives and a
//! trickle does not), and valid JSON when its content type says JSON (or
//! it has none, as LLM APIs take): UTF-8, nested at most 127 deep, as `serde_json` reads a value.
//!
//! An upload (the body of a request that is not a generation and not
//! JSON: a file, audio) is not read here: it goes on as a bounded stream,
//! at most `max_upload_bytes` (`request_body`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt as _;
use http_body_util::combinators::UnsyncBoxBody;
use recovery_core::body_fields::ReadFields;
use recovery_core::protocol::{BodyForm, is_generation};

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
        if is_upload(&req) {
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
            let bytes = read(body, declared, this.limits).await.inspect_err(|r| {
                if *r == Refusal::BodyTooSlow {
                    this.metrics.body_timeout();
                }
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
/// switch, whose body is not JSON.
fn is_upload<B>(req: &Request<B>) -> bool {
    !must_be_json(req.headers().get(CONTENT_TYPE))
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

async fn read<B>(body: B, declared: Option<u64>, limits: BodyLimits) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes>,
{
    let started = tokio::time::Instant::now();
    let mut body = std::pin::pin!(body);
    let ahead = declared.unwrap_or(0).min(RESERVED_AHEAD) as usize;
    let mut out = bytes::BytesMut::with_capacity(ahead);
    loop {
        let earned = if limits.min_bytes_per_sec == 0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(out.len() as f64 / limits.min_bytes_per_sec as f64)
        };
        let deadline = started + limits.timeout + earned;
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(Refusal::BodyTooSlow),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(_))) => return Err(Refusal::BodyUnreadable),
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limits.max_bytes {
                return Err(Refusal::BodyTooLarge(limits.max_bytes));
            }
            out.extend_from_slice(&data);
        }
    }
}
