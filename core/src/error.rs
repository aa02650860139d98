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
    response_headers: Option<http::HeaderMap>,
    cap: usize,
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

    /// Keeps the response headers.
    pub fn set_headers(&mut self, headers: http::HeaderMap) {
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
}

impl RecoveryError {
    /// An error with `outcome`, its report and the sensitive evidence.
    pub fn new(outcome: Outcome, report: RecoveryReport, evidence: Evidence) -> Self {
        RecoveryError {
            inner: Box::new(Parts {
                outcome,
                report,
                evidence,
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
        self.inner.evidence.response_headers.as_ref()
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
