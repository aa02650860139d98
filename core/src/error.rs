//! The typed, redacted error of a failed logical request.
//!
//! `Display`, `Debug` and the serde form of [`RecoveryError`] carry the
//! outcome and the report only. The original cause, response bytes and
//! response headers are kept as sensitive evidence, capped in size, and
//! reachable only through the explicit `inspect_*` methods.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use crate::outcome::Outcome;
use crate::report::RecoveryReport;

/// Sensitive evidence of a failure: never printed, capped in size.
#[derive(Clone, Default)]
pub struct Evidence {
    cause: Option<Arc<dyn Error + Send + Sync>>,
    response_bytes: Vec<u8>,
    response_headers: Option<CopiedHeaders>,
    cap: usize,
}

/// Response headers copied into one buffer: each name and value with its
/// lengths and its sensitive flag, back to back.
///
/// A request keeps its last response's headers for as long as it runs, in
/// case it fails. As a `HeaderMap` that is a table and an allocation per
/// value, a kilobyte or more kept by every held stream and a dozen
/// allocations made by every request; a clone of the map as parsed would
/// instead hold the connection's whole read buffer (its values are slices
/// of it). The map is built again only when an error is made.
#[derive(Clone, Default)]
pub struct CopiedHeaders {
    buf: Vec<u8>,
}

impl CopiedHeaders {
    /// Copies `headers`.
    pub fn of(headers: &http::HeaderMap) -> Self {
        let bytes: usize = headers
            .iter()
            .map(|(n, v)| 1 + 2 + 4 + n.as_str().len() + v.len())
            .sum();
        let mut buf = Vec::with_capacity(bytes);
        for (name, value) in headers {
            let (name, value_bytes) = (name.as_str().as_bytes(), value.as_bytes());
            // A header name is at most 64 KiB (the `http` crate's bound);
            // a value over 4 GiB cannot have been parsed.
            let (Ok(name_len), Ok(value_len)) =
                (u16::try_from(name.len()), u32::try_from(value_bytes.len()))
            else {
                continue;
            };
            buf.push(u8::from(value.is_sensitive()));
            buf.extend_from_slice(&name_len.to_le_bytes());
            buf.extend_from_slice(&value_len.to_le_bytes());
            buf.extend_from_slice(name);
            buf.extend_from_slice(value_bytes);
        }
        CopiedHeaders { buf }
    }

    /// The headers as a map again, in their order.
    pub fn to_map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        let mut rest = &self.buf[..];
        while let Some((&[sensitive, n0, n1, v0, v1, v2, v3], tail)) = rest.split_first_chunk() {
            let name_len = usize::from(u16::from_le_bytes([n0, n1]));
            let value_len = u32::from_le_bytes([v0, v1, v2, v3]) as usize;
            let Some((name, tail)) = tail.split_at_checked(name_len) else {
                break;
            };
            let Some((value, tail)) = tail.split_at_checked(value_len) else {
                break;
            };
            rest = tail;
            // Both were a valid name and value when copied.
            if let (Ok(name), Ok(mut value)) = (
                http::HeaderName::from_bytes(name),
                http::HeaderValue::from_bytes(value),
            ) {
                value.set_sensitive(sensitive == 1);
                map.append(name, value);
            }
        }
        map
    }
}

impl fmt::Debug for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Evidence(<redacted; use inspect_*>)")
    }
}

impl Evidence {
    /// Empty evidence keeping at most `cap` response bytes.
    pub fn with_cap(cap: usize) -> Self {
        Evidence {
            cap,
            ..Evidence::default()
        }
    }

    /// Keeps the underlying error.
    pub fn set_cause(&mut self, cause: Arc<dyn Error + Send + Sync>) {
        self.cause = Some(cause);
    }

    /// Keeps response bytes up to the cap; the rest is dropped.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let room = self.cap.saturating_sub(self.response_bytes.len());
        self.response_bytes
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// Keeps a copy of the response headers.
    pub fn set_headers(&mut self, headers: &http::HeaderMap) {
        self.response_headers = Some(CopiedHeaders::of(headers));
    }

    /// Keeps response headers copied before.
    pub fn set_copied_headers(&mut self, headers: CopiedHeaders) {
        self.response_headers = Some(headers);
    }

    /// Drops the bytes kept so far (a new attempt starts).
    pub fn clear_bytes(&mut self) {
        self.response_bytes.clear();
    }
}

/// A logical request that did not complete.
///
/// One pointer wide: it travels in every `Result` a body returns per frame,
/// so its weight would be copied on the hot path.
#[derive(Clone)]
pub struct RecoveryError {
    inner: Box<Parts>,
}

#[derive(Clone)]
struct Parts {
    outcome: Outcome,
    report: RecoveryReport,
    evidence: Evidence,
    /// The evidence's headers as a map, built when the error is made.
    response_headers: Option<http::HeaderMap>,
}

impl RecoveryError {
    /// An error with `outcome`, its report and the sensitive evidence.
    pub fn new(outcome: Outcome, report: RecoveryReport, mut evidence: Evidence) -> Self {
        let response_headers = evidence
            .response_headers
            .take()
            .map(|copied| copied.to_map());
        RecoveryError {
            inner: Box::new(Parts {
                outcome,
                report,
                evidence,
                response_headers,
            }),
        }
    }

    /// How the request ended.
    pub fn outcome(&self) -> &Outcome {
        &self.inner.outcome
    }

    /// The full, safe report.
    pub fn report(&self) -> &RecoveryReport {
        &self.inner.report
    }

    /// The underlying error (may hold text from the wire).
    pub fn inspect_cause(&self) -> Option<&(dyn Error + Send + Sync + 'static)> {
        self.inner.evidence.cause.as_deref()
    }

    /// The failed response's body bytes, capped at the policy's evidence cap.
    pub fn inspect_response_bytes(&self) -> &[u8] {
        &self.inner.evidence.response_bytes
    }

    /// The failed response's headers, unfiltered.
    pub fn inspect_response_headers(&self) -> Option<&http::HeaderMap> {
        self.inner.response_headers.as_ref()
    }
}

impl fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "recovery failed: {} ({} attempt(s)",
            self.inner.outcome,
            self.inner.report.attempt_count()
        )?;
        if let Some(status) = self.inner.report.last_status() {
            write!(f, ", last status {status}")?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for RecoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveryError")
            .field("outcome", &self.inner.outcome)
            .field("report", &self.inner.report)
            .field("evidence", &self.inner.evidence)
            .finish()
    }
}

impl Error for RecoveryError {}

impl serde::Serialize for RecoveryError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("RecoveryError", 2)?;
        st.serialize_field("outcome", &self.inner.outcome)?;
        st.serialize_field("report", &self.inner.report)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;

    #[test]
    fn copied_headers_come_back_whole_in_order_with_their_flags() {
        let mut headers = HeaderMap::new();
        headers.append(
            "content-type",
            HeaderValue::from_static("text/event-stream"),
        );
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        let mut secret = HeaderValue::from_static("sk-test");
        secret.set_sensitive(true);
        headers.append(HeaderName::from_static("x-api-key"), secret);
        headers.append("x-empty", HeaderValue::from_static(""));
        headers.append(
            "x-binary",
            HeaderValue::from_bytes(b"\xff\x80 tail").unwrap(),
        );

        let back = CopiedHeaders::of(&headers).to_map();
        assert_eq!(back, headers);
        let pairs = |m: &HeaderMap| {
            m.iter()
                .map(|(n, v)| (n.clone(), v.as_bytes().to_vec(), v.is_sensitive()))
                .collect::<Vec<_>>()
        };
        assert_eq!(pairs(&back), pairs(&headers));
        assert!(back["x-api-key"].is_sensitive());
        assert!(CopiedHeaders::default().to_map().is_empty());
    }

    #[test]
    fn an_error_shows_the_headers_its_evidence_kept() {
        let mut headers = HeaderMap::new();
        headers.insert("retry-after", HeaderValue::from_static("3"));
        let mut evidence = Evidence::with_cap(16);
        evidence.set_headers(&headers);
        let err = RecoveryError::new(
            Outcome::Exhausted { attempts: 1 },
            RecoveryReport::new("0".into()),
            evidence,
        );
        assert_eq!(err.inspect_response_headers(), Some(&headers));
    }
}
