//! The report of one logical request: every attempt, every wait, the outcome
//! and stream metrics, safe to log and serialize.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::copy;
use crate::decision::DelayCause;
use crate::failure::{Acceptance, Category, Phase};
use crate::outcome::{FailureReason, Outcome, ReplayDisabled};
use crate::progress::{Generation, Progress, Proof};
use crate::retry_after::RetryAfter;
pub use crate::safe::{RateLimits, SafeToken};

/// How one attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
#[non_exhaustive]
pub enum AttemptResult {
    /// Still running.
    InProgress,
    /// Ended with terminal success proof.
    Succeeded {
        /// The proof.
        proof: Proof,
    },
    /// Failed.
    Failed {
        /// Category.
        category: Category,
        /// Phase.
        phase: Phase,
        /// Reason.
        reason: FailureReason,
    },
    /// Left a hedging race without failing, and released.
    HedgeCancelled {
        /// Why.
        reason: HedgeCancel,
    },
}

/// What an attempt was in a hedging race ([`crate::policy::PolicyBuilder::hedge_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The attempt that was raced: the one in flight when the hedge
    /// started.
    First,
    /// The attempt that raced it.
    Hedge,
}

/// Why an attempt left a hedging race without failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HedgeCancel {
    /// Its rival's first semantic fragment came first.
    RivalWon,
    /// It ended with terminal proof and no output while its rival ran: an
    /// empty answer never wins a race.
    EndedEmpty,
    /// It held back more than the hold-back cap with no semantic fragment
    /// while its rival ran.
    HoldbackCap,
}

impl HedgeCancel {
    /// The stable name (`rival_won`, `ended_empty`, `holdback_cap`).
    pub fn name(self) -> &'static str {
        match self {
            HedgeCancel::RivalWon => "rival_won",
            HedgeCancel::EndedEmpty => "ended_empty",
            HedgeCancel::HoldbackCap => "holdback_cap",
        }
    }
}

/// What a request's hedging came to ([`RecoveryReport::hedges`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HedgeCounts {
    /// Hedges sent.
    pub started: u32,
    /// Hedges whose answer reached the caller.
    pub won: u32,
    /// Attempts of a race released because they could not win (either
    /// role).
    pub cancelled: u32,
}

/// One physical send.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AttemptRecord {
    /// 1-based send number.
    pub wire_attempt: u32,
    /// Whether it was a resume of a committed stream.
    pub resume: bool,
    /// When it started, in ms since the logical request started.
    #[serde(with = "crate::outcome::millis")]
    pub started_ms: Duration,
    /// When it ended, in ms since the logical request started.
    pub ended_ms: Option<u64>,
    /// Response status, if a head arrived.
    pub status: Option<u16>,
    /// How it ended.
    #[serde(flatten)]
    pub result: AttemptResult,
    /// For an attempt that failed on evidence, whether the server may have
    /// accepted the request: `no` when it provably did not (a refused
    /// connection or HTTP/2 stream), `unknown` when the request went out and
    /// no head came back. Absent while running, on success and on
    /// cancellation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acceptance: Option<Acceptance>,
    /// The server's retry hint.
    pub retry_after: RetryAfter,
    /// What the attempt's stream carried and delivered.
    pub progress: Progress,
    /// The provider's request id, when it has a safe shape.
    pub request_id: Option<SafeToken>,
    /// What the response's rate-limit headers said, when it sent any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<RateLimits>,
    /// The target it went to, when the request has alternates
    /// ([`crate::failover`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// What it was in a hedging race, when it was in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// One wait between sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DelayRecord {
    /// The attempt that failed before the wait.
    pub after_attempt: u32,
    /// How long, in ms.
    #[serde(with = "crate::outcome::millis")]
    pub delay_ms: Duration,
    /// Why that long.
    pub cause: DelayCause,
}

/// How a committed stream was continued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SeamStrategy {
    /// OpenAI Responses background stream, `starting_after`.
    ResponsesBackground,
    /// SSE `Last-Event-ID`.
    LastEventId,
    /// A caller continuation hook (prompt-level).
    Continuation,
    /// A declared prefill: the delivered text sent back as the final
    /// assistant message (prompt-level).
    Prefill,
}

/// Where a resumed stream joins the delivered prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Seam {
    /// The resume attempt that continues the stream.
    pub attempt: u32,
    /// How.
    pub strategy: SeamStrategy,
    /// Body bytes the consumer had before the seam.
    pub delivered_bytes: u64,
}

/// Timings across all attempts, in ms since the logical request started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StreamMetrics {
    /// First response head of the attempt that committed (or the last one).
    pub time_to_headers_ms: Option<u64>,
    /// First semantic fragment observed.
    pub time_to_first_semantic_ms: Option<u64>,
    /// Until the terminal outcome.
    pub total_ms: Option<u64>,
}

/// Everything known about one logical request, without body text, header
/// values outside the allowlist, credentials or prompt text.
///
/// Its `clone_from` (and so `ToOwned::clone_into`) keeps the target's
/// strings and vectors where they have room: a driver copies the report
/// into the handle its caller reads after every step that changed it.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RecoveryReport {
    /// The logical request id.
    pub logical_id: String,
    /// How it ended (`None` while it runs).
    pub outcome: Option<Outcome>,
    /// Every physical send, in order.
    pub attempts: Vec<AttemptRecord>,
    /// Every wait between sends.
    pub delays: Vec<DelayRecord>,
    /// Sends after the first (OpenTelemetry `http.request.resend_count`).
    pub resend_count: u32,
    /// Resumes among the sends.
    pub resumes: u32,
    /// The attempt whose output reached the consumer.
    pub committed_attempt: Option<u32>,
    /// Why replay was off, if it was.
    pub replay_disabled: Option<ReplayDisabled>,
    /// Timings.
    pub metrics: StreamMetrics,
    /// A transport error arrived after terminal proof; it changed nothing.
    pub late_error: bool,
    /// Every seam where a resume joined the delivered prefix.
    pub seams: Vec<Seam>,
    /// The target whose answer reached the caller, when the request has
    /// alternates ([`crate::failover`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<String>,
    /// What the provider said of the generation on the stream that
    /// succeeded: the model that answered, finish reasons, usage
    /// (OpenTelemetry `gen_ai.response.*`, `gen_ai.usage.*`); empty when it
    /// said nothing or the request did not succeed.
    #[serde(default, skip_serializing_if = "Generation::is_empty")]
    pub generation: Generation,
}

// A field that is not `Copy` has to be named in both methods (`..*source`
// copies only `Copy` ones), so none added later is left out of a copy.
impl Clone for AttemptRecord {
    fn clone(&self) -> Self {
        AttemptRecord {
            result: self.result.clone(),
            request_id: self.request_id.clone(),
            rate_limits: self.rate_limits.clone(),
            target: self.target.clone(),
            ..*self
        }
    }

    fn clone_from(&mut self, source: &Self) {
        let mut request_id = self.request_id.take();
        request_id.clone_from(&source.request_id);
        let mut rate_limits = self.rate_limits.take();
        rate_limits.clone_from(&source.rate_limits);
        let mut target = self.target.take();
        target.clone_from(&source.target);
        *self = AttemptRecord {
            result: source.result.clone(),
            request_id,
            rate_limits,
            target,
            ..*source
        };
    }
}

// Every field named, so a field added later cannot be left out of a copy.
impl Clone for RecoveryReport {
    fn clone(&self) -> Self {
        let mut copy = RecoveryReport::new(String::new());
        copy.clone_from(self);
        copy
    }

    fn clone_from(&mut self, source: &Self) {
        let RecoveryReport {
            logical_id,
            outcome,
            attempts,
            delays,
            resend_count,
            resumes,
            committed_attempt,
            replay_disabled,
            metrics,
            late_error,
            seams,
            served_by,
            generation,
        } = source;
        self.logical_id.clone_from(logical_id);
        self.outcome.clone_from(outcome);
        copy::exact(&mut self.attempts, attempts);
        copy::exact(&mut self.delays, delays);
        self.resend_count = *resend_count;
        self.resumes = *resumes;
        self.committed_attempt = *committed_attempt;
        self.replay_disabled = *replay_disabled;
        self.metrics = *metrics;
        self.late_error = *late_error;
        copy::exact(&mut self.seams, seams);
        self.served_by.clone_from(served_by);
        self.generation.clone_from(generation);
    }
}

impl RecoveryReport {
    /// An empty report for `logical_id`.
    pub fn new(logical_id: String) -> Self {
        RecoveryReport {
            logical_id,
            outcome: None,
            attempts: Vec::new(),
            delays: Vec::new(),
            resend_count: 0,
            resumes: 0,
            committed_attempt: None,
            replay_disabled: None,
            metrics: StreamMetrics::default(),
            late_error: false,
            seams: Vec::new(),
            served_by: None,
            generation: Generation::default(),
        }
    }

    /// Physical sends made.
    pub fn attempt_count(&self) -> u32 {
        self.attempts.len() as u32
    }

    /// What the request's hedging came to: hedges sent, won (the
    /// committed attempt is a hedge) and attempts cancelled in a race.
    pub fn hedges(&self) -> HedgeCounts {
        let mut counts = HedgeCounts::default();
        for a in &self.attempts {
            if a.role == Some(Role::Hedge) {
                counts.started += 1;
                if self.committed_attempt == Some(a.wire_attempt) {
                    counts.won += 1;
                }
            }
            if matches!(a.result, AttemptResult::HedgeCancelled { .. }) {
                counts.cancelled += 1;
            }
        }
        counts
    }

    /// The last attempt's status, if any.
    pub fn last_status(&self) -> Option<u16> {
        self.attempts.iter().rev().find_map(|a| a.status)
    }

    /// Progress summed over all attempts (what the request cost).
    pub fn total_progress(&self) -> Progress {
        self.attempts
            .iter()
            .fold(Progress::default(), |mut acc, a| {
                let p = &a.progress;
                acc.headers_received |= p.headers_received;
                acc.raw_bytes += p.raw_bytes;
                acc.frames += p.frames;
                acc.keepalives += p.keepalives;
                acc.observed_content += p.observed_content;
                acc.observed_reasoning += p.observed_reasoning;
                acc.observed_tool_fragments += p.observed_tool_fragments;
                acc.observed_side_effects += p.observed_side_effects;
                acc.completed_tool_calls += p.completed_tool_calls;
                acc.delivered_content += p.delivered_content;
                acc.delivered_reasoning += p.delivered_reasoning;
                acc.delivered_tool_fragments += p.delivered_tool_fragments;
                acc.delivered_side_effects += p.delivered_side_effects;
                acc.delivered_bytes += p.delivered_bytes;
                acc
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(n: u32, request_id: Option<&str>, target: Option<&str>) -> AttemptRecord {
        AttemptRecord {
            wire_attempt: n,
            resume: n > 1,
            started_ms: Duration::from_millis(u64::from(n) * 10),
            ended_ms: Some(u64::from(n) * 10 + 5),
            status: Some(200),
            result: AttemptResult::InProgress,
            acceptance: None,
            retry_after: RetryAfter::Absent,
            progress: Progress::default(),
            request_id: request_id.and_then(SafeToken::new),
            rate_limits: None,
            target: target.map(str::to_owned),
            role: None,
        }
    }

    fn report(id: &str, attempts: Vec<AttemptRecord>, model: Option<&str>) -> RecoveryReport {
        let mut r = RecoveryReport::new(id.to_owned());
        r.attempts = attempts;
        r.resend_count = r.attempts.len().saturating_sub(1) as u32;
        r.served_by = Some("primary".to_owned());
        if let Some(m) = model {
            r.generation.note_model(m);
            r.generation.note_finish("stop");
        }
        r
    }

    #[test]
    fn a_copy_into_a_report_is_equal_to_its_source_whatever_their_shapes() {
        let shapes = [
            report("a", vec![], None),
            report("bb", vec![attempt(1, Some("req_1"), None)], Some("gpt-x")),
            report(
                "ccc",
                vec![
                    attempt(1, Some("req_1"), Some("primary")),
                    attempt(2, None, Some("alternate")),
                    attempt(3, Some("req_3"), None),
                ],
                Some("m"),
            ),
        ];
        for target in &shapes {
            for source in &shapes {
                let mut copy = target.clone();
                copy.clone_from(source);
                assert_eq!(&copy, source);
                let mut owned = target.clone();
                source.clone_into(&mut owned);
                assert_eq!(&owned, source);
            }
            assert_eq!(&target.clone(), target);
        }
    }

    #[test]
    fn a_copy_into_a_report_keeps_the_buffers_that_have_room() {
        let source = report(
            "logical-1",
            vec![attempt(1, Some("req_1"), Some("primary"))],
            Some("gpt-x"),
        );
        let mut copy = source.clone();
        let id = copy.logical_id.as_ptr();
        let attempts = copy.attempts.as_ptr();
        let request_id = copy.attempts[0]
            .request_id
            .as_ref()
            .map(|t| t.as_str().as_ptr());
        let model = copy.generation.model.as_ref().map(|m| m.as_ptr());
        let mut changed = source.clone();
        changed.attempts[0].ended_ms = Some(99);
        changed.resend_count = 4;
        copy.clone_from(&changed);
        assert_eq!(copy, changed);
        assert_eq!(copy.logical_id.as_ptr(), id);
        assert_eq!(copy.attempts.as_ptr(), attempts);
        assert_eq!(
            copy.attempts[0]
                .request_id
                .as_ref()
                .map(|t| t.as_str().as_ptr()),
            request_id
        );
        assert_eq!(copy.generation.model.as_ref().map(|m| m.as_ptr()), model);
    }

    #[test]
    fn a_copy_has_room_for_what_it_holds_not_for_later_pushes() {
        let source = report(
            "logical-1",
            vec![attempt(1, Some("req_1"), Some("primary"))],
            Some("gpt-x"),
        );
        let mut copy = source.clone();
        assert_eq!(copy.attempts.capacity(), 1);
        assert_eq!(copy.generation.finish_reasons.capacity(), 1);
        let mut grown = source.clone();
        grown.attempts.push(attempt(2, None, None));
        grown.seams.push(Seam {
            attempt: 2,
            strategy: SeamStrategy::LastEventId,
            delivered_bytes: 10,
        });
        copy.clone_from(&grown);
        assert_eq!(copy, grown);
        assert_eq!((copy.attempts.capacity(), copy.seams.capacity()), (2, 1));
        // Fewer records fit in the room there is.
        copy.clone_from(&source);
        assert_eq!(copy, source);
        assert_eq!(copy.attempts.capacity(), 2);
    }
}
