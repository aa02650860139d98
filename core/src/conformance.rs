//! The conformance vector format: one logical request as data (a policy, what
//! each physical send does, and what must come out), run by every driver so
//! the same evidence gives the same decisions everywhere.
//!
//! The files live in `tests/conformance/engine/*.json`; the format is
//! documented in `tests/conformance/README.md`. This module is the one
//! reading of that format, shared by the engine's runner, the tower runner
//! and the wasm runner.

use std::num::NonZeroU32;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::failure::{Failure, Phase, TransportKind};
use crate::outcome::CancelPhase;
use crate::policy::{Endpoint, OverCeiling, PolicyError, RecoveryPolicy};
use crate::progress::Proof;
use crate::retry_after::{RetryAfter, parse_retry_after};

/// The wall clock every vector starts at: 1000 s after the Unix epoch.
pub const WALL_CLOCK: Duration = Duration::from_secs(1000);

/// One scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vector {
    /// Short name (the file name without `.json`).
    pub name: String,
    /// What it shows.
    pub description: String,
    /// The policy knobs.
    pub policy: PolicySpec,
    /// Every jitter draw, as a fraction of the backoff bound.
    pub jitter: f64,
    /// An admission hook's answers in order (`allow`, `reject`,
    /// `unresolved`, `cancel`); absent: no hook.
    pub admission: Option<Vec<String>>,
    /// The caller cancels during a wait.
    pub cancel_during_wait: Option<CancelSpec>,
    /// What each send does, in order.
    pub attempts: Vec<AttemptSpec>,
    /// What must come out.
    pub expected: Expected,
}

/// Policy knobs of a vector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// Sends allowed.
    pub max_attempts: u32,
    /// Backoff base.
    pub backoff_base_ms: u64,
    /// Backoff ceiling.
    pub backoff_ceiling_ms: u64,
    /// Recovery budget from the first failure.
    pub budget_ms: Option<u64>,
    /// Deadline from the start of the request.
    pub deadline_ms: Option<u64>,
    /// `Retry-After` ceiling (refused above).
    pub retry_after_ceiling_ms: u64,
    /// Retryable statuses.
    pub retryable_statuses: Vec<u16>,
    /// Remote or local endpoint.
    pub endpoint: Endpoint,
}

impl PolicySpec {
    /// The policy these knobs describe.
    pub fn policy(&self) -> Result<RecoveryPolicy, PolicyError> {
        let ms = Duration::from_millis;
        RecoveryPolicy::builder()
            .max_attempts(NonZeroU32::new(self.max_attempts).unwrap_or(NonZeroU32::MIN))
            .backoff(ms(self.backoff_base_ms), ms(self.backoff_ceiling_ms))
            .budget(self.budget_ms.map(ms))
            .deadline(self.deadline_ms.map(ms))
            .retry_after_ceiling(ms(self.retry_after_ceiling_ms), OverCeiling::Refuse)
            .retryable_statuses(self.retryable_statuses.iter().copied())
            .endpoint(self.endpoint)
            .build()
    }
}

/// A cancellation during a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelSpec {
    /// Which wait (0-based).
    pub wait: usize,
    /// How far into it.
    pub after_ms: u64,
}

/// What one send does: exactly one of `fail`, `succeed`, `cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptSpec {
    /// The send fails.
    pub fail: Option<FailSpec>,
    /// The send ends with terminal proof.
    pub succeed: Option<Proof>,
    /// The consumer cancels in this phase.
    pub cancel: Option<CancelPhase>,
    /// The attempt delivered a semantic fragment (it commits) before it ended.
    #[serde(default)]
    pub semantic: bool,
}

/// A failed send: a status or a transport error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailSpec {
    /// The response status.
    pub status: Option<u16>,
    /// The `Retry-After` header value.
    pub retry_after: Option<String>,
    /// The `x-should-retry` header.
    pub should_retry: Option<bool>,
    /// The transport error.
    pub transport: Option<TransportKind>,
    /// Where the transport error happened.
    pub phase: Option<Phase>,
}

impl FailSpec {
    /// The failure evidence, `None` when the spec is neither a status nor a
    /// transport error with a phase.
    pub fn failure(&self) -> Option<Failure> {
        match (self.status, self.transport, self.phase) {
            (Some(status), None, _) => {
                let hint = self.retry_after.as_deref().map_or(RetryAfter::Absent, |v| {
                    parse_retry_after(v, SystemTime::UNIX_EPOCH + WALL_CLOCK)
                });
                Some(Failure::status(status, hint, self.should_retry))
            }
            (None, Some(kind), Some(phase)) => Some(Failure::transport(kind, phase)),
            _ => None,
        }
    }
}

/// What must come out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// Lifecycle event names in order, `committed` left out.
    pub events: Vec<String>,
    /// The outcome's stable name.
    pub outcome: String,
    /// Physical sends made.
    pub sends: usize,
    /// Every wait scheduled, in ms, in order.
    pub delays_ms: Vec<u64>,
}
