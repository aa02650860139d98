//! Lifecycle events: what happened to a logical request, in order, with
//! stable snake_case names and safe metadata only.
//!
//! Every logical request ends in exactly one terminal event: `completed`,
//! `exhausted` (failed before commit), `interrupted` (failed after commit) or
//! `cancelled`. Events carry identity, counters, categories and delays, never
//! body text, header values or error messages.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::decision::DelayCause;
use crate::failure::{Category, Phase, Stall};
use crate::outcome::{CancelPhase, FailureReason, Outcome};
use crate::progress::Proof;
use crate::report::{HedgeCancel, Role};

/// Who the event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Identity {
    /// The logical request (stable across attempts), 16 hex digits.
    pub logical_id: String,
    /// The wire attempt (`<logical_id>-<n>`), absent before the first send.
    pub attempt_id: Option<String>,
    /// 1-based physical send number; 0 before the first send.
    pub wire_attempt: u32,
}

/// What brought the attempt to commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CommitTrigger {
    /// The first semantic fragment was observed.
    Semantic,
    /// The held-back prefix reached its cap.
    HoldbackCap,
    /// Terminal proof arrived with no semantic output.
    Terminal,
}

/// The event itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "event")]
#[non_exhaustive]
pub enum EventKind {
    /// A physical send starts.
    AttemptStarted {
        /// Sends allowed in all.
        max_attempts: u32,
        /// Whether this send is a resume of a committed stream.
        resume: bool,
        /// The target's label, when the request has alternates.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
    },
    /// The attempt ended with terminal success proof.
    AttemptSucceeded {
        /// The proof.
        proof: Proof,
    },
    /// The attempt failed.
    AttemptFailed {
        /// Category of the failure.
        category: Category,
        /// Where it failed.
        phase: Phase,
        /// Why it counts as it does.
        reason: FailureReason,
        /// The response status, if a head arrived.
        status: Option<u16>,
        /// Which watchdog fired, for a stall (`head`, `idle`, `progress`,
        /// `first_token`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stall: Option<Stall>,
    },
    /// The admission hook was asked.
    AdmissionPending,
    /// The admission hook allowed the resend.
    AdmissionAllowed,
    /// The admission hook rejected the resend.
    AdmissionRejected,
    /// The admission hook could not decide.
    AdmissionUnresolved,
    /// Admission was needed and no hook was installed.
    AdmissionRequired,
    /// A wait before the next send was scheduled.
    DelayScheduled {
        /// How long, in milliseconds.
        #[serde(with = "crate::outcome::millis")]
        delay_ms: Duration,
        /// Why that long.
        cause: DelayCause,
    },
    /// Before commit, the next send goes to another target
    /// ([`crate::failover`]).
    Failover {
        /// The target left.
        from: String,
        /// The target the next send goes to.
        to: String,
        /// Why: the reason of the failure that moved it.
        reason: FailureReason,
    },
    /// Before commit, the attempt in flight showed no semantic fragment
    /// for the policy's `hedge_after`: a second attempt races it. The event
    /// names the attempt raced; the hedge's own `attempt_started` follows.
    HedgeStarted {
        /// The hedge's send number.
        hedge: u32,
        /// How long the raced attempt had run without output, in ms.
        #[serde(with = "crate::outcome::millis")]
        after_ms: Duration,
    },
    /// An attempt of a race was released without failing: its rival won,
    /// or it could not win. The event names that attempt.
    HedgeCancelled {
        /// Its role in the race.
        role: Role,
        /// Why.
        reason: HedgeCancel,
    },
    /// The wait is over; the next send follows.
    RetryStarted,
    /// A resume of the committed stream starts.
    ResumeStarted,
    /// The platform is offline; waiting for it to come back.
    ParkedOffline,
    /// The attempt committed: its output is now delivered to the consumer.
    Committed {
        /// Why now.
        trigger: CommitTrigger,
        /// The committing attempt's role, when it was in a hedging race
        /// (`hedge`: the hedge's answer is the one served).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        role: Option<Role>,
    },
    /// Terminal: the stream finished with proof.
    Completed {
        /// The proof.
        proof: Proof,
        /// Sends made in all.
        attempts: u32,
    },
    /// Terminal: failed before commit.
    Exhausted {
        /// How it ended.
        outcome: Outcome,
        /// Sends made in all.
        attempts: u32,
    },
    /// Terminal: failed after commit.
    Interrupted {
        /// How it ended.
        outcome: Outcome,
        /// Sends made in all.
        attempts: u32,
    },
    /// Terminal: the caller cancelled.
    Cancelled {
        /// Where.
        phase: CancelPhase,
        /// Sends made in all.
        attempts: u32,
    },
}

impl EventKind {
    /// The stable event name (`attempt_started`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::AttemptStarted { .. } => "attempt_started",
            EventKind::AttemptSucceeded { .. } => "attempt_succeeded",
            EventKind::AttemptFailed { .. } => "attempt_failed",
            EventKind::AdmissionPending => "admission_pending",
            EventKind::AdmissionAllowed => "admission_allowed",
            EventKind::AdmissionRejected => "admission_rejected",
            EventKind::AdmissionUnresolved => "admission_unresolved",
            EventKind::AdmissionRequired => "admission_required",
            EventKind::DelayScheduled { .. } => "delay_scheduled",
            EventKind::Failover { .. } => "failover",
            EventKind::HedgeStarted { .. } => "hedge_started",
            EventKind::HedgeCancelled { .. } => "hedge_cancelled",
            EventKind::RetryStarted => "retry_started",
            EventKind::ResumeStarted => "resume_started",
            EventKind::ParkedOffline => "parked_offline",
            EventKind::Committed { .. } => "committed",
            EventKind::Completed { .. } => "completed",
            EventKind::Exhausted { .. } => "exhausted",
            EventKind::Interrupted { .. } => "interrupted",
            EventKind::Cancelled { .. } => "cancelled",
        }
    }

    /// Whether this event ends the logical request.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            EventKind::Completed { .. }
                | EventKind::Exhausted { .. }
                | EventKind::Interrupted { .. }
                | EventKind::Cancelled { .. }
        )
    }
}

/// One lifecycle event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LifecycleEvent {
    /// Who.
    #[serde(flatten)]
    pub identity: Identity,
    /// Milliseconds since the logical request started.
    #[serde(with = "crate::outcome::millis", rename = "at_ms")]
    pub at: Duration,
    /// What.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl fmt::Display for LifecycleEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} attempt {}",
            self.kind.name(),
            self.identity.wire_attempt
        )
    }
}

/// Receives lifecycle events as they happen.
pub trait LifecycleObserver {
    /// Called once per event, in order.
    fn on_event(&self, event: &LifecycleEvent);
}

impl LifecycleObserver for () {
    fn on_event(&self, _event: &LifecycleEvent) {}
}

impl<F: Fn(&LifecycleEvent)> LifecycleObserver for F {
    fn on_event(&self, event: &LifecycleEvent) {
        self(event);
    }
}

/// What an application shows, derived from the events so it need not
/// interpret them itself ("Reconnecting…").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RecoveryStatus {
    /// Sending or streaming.
    #[default]
    InProgress,
    /// A failed attempt is being retried or resumed.
    Reconnecting,
    /// Parked until the network comes back.
    WaitingForNetwork,
    /// Finished with proof.
    Completed,
    /// Failed for good.
    Failed,
    /// Cancelled by the caller.
    Cancelled,
}

impl RecoveryStatus {
    /// The status after `event`, starting from `self`.
    pub fn after(self, event: &EventKind) -> Self {
        match event {
            EventKind::Completed { .. } => RecoveryStatus::Completed,
            EventKind::Exhausted { .. } | EventKind::Interrupted { .. } => RecoveryStatus::Failed,
            EventKind::Cancelled { .. } => RecoveryStatus::Cancelled,
            EventKind::ParkedOffline => RecoveryStatus::WaitingForNetwork,
            EventKind::AttemptFailed { .. }
            | EventKind::DelayScheduled { .. }
            | EventKind::RetryStarted
            | EventKind::ResumeStarted
            | EventKind::AdmissionPending
            | EventKind::AdmissionAllowed => RecoveryStatus::Reconnecting,
            EventKind::Committed { .. } | EventKind::AttemptSucceeded { .. } => {
                RecoveryStatus::InProgress
            }
            EventKind::AttemptStarted { .. } => {
                if self == RecoveryStatus::InProgress {
                    self
                } else {
                    RecoveryStatus::Reconnecting
                }
            }
            EventKind::AdmissionRejected
            | EventKind::AdmissionUnresolved
            | EventKind::AdmissionRequired
            | EventKind::Failover { .. }
            | EventKind::HedgeStarted { .. }
            | EventKind::HedgeCancelled { .. } => self,
        }
    }

    /// The status after a whole sequence of events.
    pub fn of<'a>(events: impl IntoIterator<Item = &'a LifecycleEvent>) -> Self {
        events
            .into_iter()
            .fold(RecoveryStatus::InProgress, |s, e| s.after(&e.kind))
    }
}
