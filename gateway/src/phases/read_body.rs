//! The request body, read whole before anything goes upstream (the
//! recovery layer replays it): at most `max_bytes`, within a deadline that
//! grows with what arrived (`timeout` plus one second per
//! `min_bytes_per_sec` bytes, so a large body on a slow link arrives and a
//! trickle does not), and valid JSON when its content type says JSON (or
//! it has none, as LLM APIs take): UTF-8, nested at most 127 deep, as `serde_json` reads a value.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt as _;
use recovery_core::body_fields::ReadFields;
use recovery_core::protocol::BodyForm;

use crate::metrics::Metrics;
use crate::phase::{Decision, Phase, Step};
use crate::respond::Refusal;

/// How long and how slowly a request body may arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BodyLimits {
    /// The largest body forwarded.
    pub(crate) max_bytes: usize,
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
    B: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Out = Bytes;

    fn run(self: &Arc<Self>, req: Request<B>) -> Decision<Bytes> {
        let this = Arc::clone(self);
        Decision::Later(Box::pin(async move {
            let max = this.limits.max_bytes;
            let declared = req
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
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
            Ok(Step::next(Request::from_parts(parts, bytes)))
        }))
    }
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
