//! Terminal outcomes of a logical request.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::failure::{Category, PermanentCause, Stall, Violation};
use crate::progress::{Proof, UnsuccessfulReason};

/// Which budget ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum BudgetKind {
    /// The per-request recovery budget (time from the first failure).
    Recovery,
    /// The cross-request retry budget (tokens).
    RetryTokens,
}

/// Which limit refused a `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefusalLimit {
    /// The policy's `Retry-After` ceiling.
    Ceiling,
    /// The remaining recovery budget.
    Budget,
    /// The deadline.
    Deadline,
}

/// Where the caller's cancellation caught the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum CancelPhase {
    /// Before or while a request was sent.
    Sending,
    /// Waiting for the response head.
    AwaitingHead,
    /// Reading the body (before or after commit).
    Streaming,
    /// Waiting for a backoff or `Retry-After` delay.
    Waiting,
    /// Waiting for an admission hook.
    Admission,
    /// Parked until the network is back.
    Parked,
}

/// Why replay was not possible for this request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReplayDisabled {
    /// The request body was over the replay cap; it was sent once.
    BodyTooLarge,
    /// The request body could not be buffered.
    NotReplayable,
}

/// Why a committed stream was cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum InterruptCause {
    /// The connection failed.
    Transport,
    /// The body ended without terminal proof.
    UnexpectedEof,
    /// The body ended inside an event that may have been semantic.
    PartialFrame,
    /// The provider reported an error in the stream.
    ProviderError,
    /// A stall watchdog fired.
    Stall,
    /// A resume was attempted and failed.
    ResumeFailed,
    /// Resumes ran out of attempts.
    AttemptsExhausted,
}

impl InterruptCause {
    /// The stable snake_case name (`partial_frame`, `stall`, ...).
    pub fn name(self) -> &'static str {
        match self {
            InterruptCause::Transport => "transport",
            InterruptCause::UnexpectedEof => "unexpected_eof",
            InterruptCause::PartialFrame => "partial_frame",
            InterruptCause::ProviderError => "provider_error",
            InterruptCause::Stall => "stall",
            InterruptCause::ResumeFailed => "resume_failed",
            InterruptCause::AttemptsExhausted => "attempts_exhausted",
        }
    }
}

/// How a logical request ended. Exactly one per request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
#[non_exhaustive]
pub enum Outcome {
    /// The stream finished with terminal proof.
    Completed {
        /// The proof.
        proof: Proof,
    },
    /// The provider ended the generation unsuccessfully (never retried).
    Unsuccessful {
        /// Why.
        reason: UnsuccessfulReason,
    },
    /// A failure no resend can fix.
    Permanent {
        /// Why.
        #[serde(flatten)]
        cause: PermanentCause,
    },
    /// A failure the policy does not retry (status outside the set,
    /// unselected category, provider error of unknown transience).
    NotRetryable {
        /// Category of the failure.
        category: Category,
        /// The status, if any.
        status: Option<u16>,
    },
    /// Every allowed send was used before commit.
    Exhausted {
        /// Sends made.
        attempts: u32,
    },
    /// Every target (the request's own and its alternates) used its share
    /// of sends before commit ([`crate::failover`]).
    AlternatesExhausted {
        /// Sends made.
        attempts: u32,
        /// The targets tried, in order, by label.
        targets: Vec<String>,
    },
    /// A budget ran out before the next send could start.
    BudgetExhausted {
        /// Which.
        budget: BudgetKind,
    },
    /// The deadline passed (or the next wait would end after it).
    DeadlineExceeded,
    /// The server asked for a longer wait than allowed; never shortened.
    RetryAfterRefused {
        /// The hint.
        #[serde(with = "millis")]
        value: Duration,
        /// The limit it was above.
        limit: RefusalLimit,
    },
    /// An attempt that showed (or may have shown) semantic output failed
    /// and could not be resumed. Usually after commit; `committed: false`
    /// when nothing reached the consumer yet (the output was observed in the
    /// failing read, or an unfinished frame may hold some), which forbids a
    /// replay all the same.
    Interrupted {
        /// Why.
        cause: InterruptCause,
        /// Which watchdog, when `cause` is a stall.
        stall: Option<Stall>,
        /// Whether output had reached the consumer (the request committed).
        #[serde(default = "yes")]
        committed: bool,
    },
    /// The stream broke its protocol.
    Protocol {
        /// How.
        violation: Violation,
    },
    /// An ambiguous resend needed admission and no hook was given.
    AdmissionRequired,
    /// The admission hook refused the resend.
    AdmissionRejected,
    /// The admission hook could not decide.
    AdmissionUnresolved,
    /// A pre-commit failure that could not be replayed.
    ReplayDisabled {
        /// Why replay was off.
        reason: ReplayDisabled,
    },
    /// The caller cancelled.
    Cancelled {
        /// Where.
        phase: CancelPhase,
    },
}

impl Outcome {
    /// How a resume that fails for good with this outcome ends the
    /// committed stream: a permanent, not retryable or broken answer to the
    /// resume request is a failed resume, whatever its own cause.
    pub(crate) fn of_a_resume(self) -> Outcome {
        match self {
            Outcome::Permanent { .. } | Outcome::NotRetryable { .. } | Outcome::Protocol { .. } => {
                Outcome::Interrupted {
                    cause: InterruptCause::ResumeFailed,
                    stall: None,
                    committed: true,
                }
            }
            other => other,
        }
    }

    /// Whether the request completed with proof.
    pub fn is_completed(&self) -> bool {
        matches!(self, Outcome::Completed { .. })
    }

    /// Short stable name (`completed`, `exhausted`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Completed { .. } => "completed",
            Outcome::Unsuccessful { .. } => "unsuccessful",
            Outcome::Permanent { .. } => "permanent",
            Outcome::NotRetryable { .. } => "not_retryable",
            Outcome::Exhausted { .. } => "exhausted",
            Outcome::AlternatesExhausted { .. } => "alternates_exhausted",
            Outcome::BudgetExhausted { .. } => "budget_exhausted",
            Outcome::DeadlineExceeded => "deadline_exceeded",
            Outcome::RetryAfterRefused { .. } => "retry_after_refused",
            Outcome::Interrupted { .. } => "interrupted",
            Outcome::Protocol { .. } => "protocol",
            Outcome::AdmissionRequired => "admission_required",
            Outcome::AdmissionRejected => "admission_rejected",
            Outcome::AdmissionUnresolved => "admission_unresolved",
            Outcome::ReplayDisabled { .. } => "replay_disabled",
            Outcome::Cancelled { .. } => "cancelled",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Completed { proof } => write!(f, "completed ({proof} proof)"),
            Outcome::Unsuccessful { reason } => write!(f, "unsuccessful terminal ({reason:?})"),
            Outcome::Permanent { cause } => write!(f, "permanent failure ({cause})"),
            Outcome::NotRetryable { category, status } => match status {
                Some(s) => write!(f, "{category} failure with status {s} is not retryable"),
                None => write!(f, "{category} failure is not retryable"),
            },
            Outcome::Exhausted { attempts } => write!(f, "exhausted after {attempts} attempt(s)"),
            Outcome::AlternatesExhausted { attempts, targets } => {
                f.write_str("every target failed before output (")?;
                for (i, t) in targets.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    f.write_str(t)?;
                }
                write!(f, ") after {attempts} attempt(s)")
            }
            Outcome::BudgetExhausted { budget } => write!(f, "{budget:?} budget exhausted"),
            Outcome::DeadlineExceeded => f.write_str("deadline exceeded"),
            Outcome::RetryAfterRefused { value, limit } => write!(
                f,
                "Retry-After of {} ms refused (above the {limit:?} limit)",
                value.as_millis()
            ),
            Outcome::Interrupted {
                cause,
                committed: true,
                ..
            } => write!(f, "interrupted after commit ({cause:?})"),
            Outcome::Interrupted { cause, .. } => write!(
                f,
                "stopped before commit: the attempt may have shown output, so it was not replayed ({cause:?})"
            ),
            Outcome::Protocol { violation } => write!(f, "protocol violation ({violation})"),
            Outcome::AdmissionRequired => f.write_str("resend needs admission and no hook was set"),
            Outcome::AdmissionRejected => f.write_str("admission hook rejected the resend"),
            Outcome::AdmissionUnresolved => f.write_str("admission hook could not decide"),
            Outcome::ReplayDisabled { reason } => write!(f, "replay disabled ({reason:?})"),
            Outcome::Cancelled { phase } => write!(f, "cancelled while {phase:?}"),
        }
    }
}

fn yes() -> bool {
    true
}

/// Reasons attached to a failed attempt in events and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureReason {
    /// A later attempt may succeed.
    Transient,
    /// No resend can help.
    Permanent,
    /// Semantic output was observed: a resend would duplicate or change it.
    SemanticOutput,
    /// The body ended without terminal proof.
    UnexpectedEof,
    /// The provider ended the generation unsuccessfully.
    UnsuccessfulTerminal,
    /// The server vetoed a retry.
    ServerVetoed,
    /// The policy does not select this failure.
    NotSelected,
    /// A protocol violation.
    Protocol,
    /// A stall watchdog fired.
    Stall,
    /// The caller cancelled.
    Cancelled,
    /// The prompt is longer than the target's context window: never sent
    /// to it again.
    ContextLength,
}

pub(crate) mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}
