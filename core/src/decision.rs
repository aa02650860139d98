//! The decision: one pure function from evidence to the next action.
//!
//! `decide` is the whole retry policy of the project. Both drivers call it
//! with the same inputs and execute the [`Action`] it returns, so a
//! conformance vector gives the same decisions everywhere. It reads no clock,
//! draws no randomness and keeps no state: the jitter fraction, the time and
//! the connectivity are inputs.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backoff;
use crate::failure::{Acceptance, Failure, FailureKind, PermanentCause, Stall};
use crate::outcome::{
    BudgetKind, FailureReason, InterruptCause, Outcome, RefusalLimit, ReplayDisabled,
};
use crate::policy::{Endpoint, OverCeiling, RecoveryPolicy};
use crate::progress::Transience;
use crate::timing::{Fraction, Instant};

/// An admission hook's answer about a resend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AdmissionAnswer {
    /// Resend.
    Allow,
    /// Do not resend.
    Reject,
    /// The hook could not tell; pending is not approval.
    Unresolved,
}

/// Why the next send waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DelayCause {
    /// The policy's jittered backoff.
    Backoff,
    /// The server's `Retry-After` (it was longer than the backoff draw).
    RetryAfter,
    /// A wait another request to the same endpoint learned from its
    /// `Retry-After` ([`crate::cooldown`]).
    Cooldown,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Wait `delay`, then replay the request.
    RetryAfter {
        /// How long.
        delay: Duration,
        /// Why that long.
        cause: DelayCause,
    },
    /// Wait `delay`, then continue the committed stream with a resume.
    Resume {
        /// How long.
        delay: Duration,
        /// Why that long.
        cause: DelayCause,
    },
    /// Wait until the platform reports it is online, then decide again.
    ParkUntilOnline,
    /// Ask the admission hook, then decide again with its answer.
    AskAdmission,
    /// Send to the next target at once, before commit ([`crate::failover`]).
    Failover,
    /// Stop with this outcome.
    Fail(Outcome),
}

/// The logical request's state, as far as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AttemptState {
    /// Physical sends made so far (the failed one included).
    pub attempts_made: u32,
    /// Physical sends still allowed (shared allowance).
    pub attempts_left: u32,
    /// Resumes made so far.
    pub resumes_made: u32,
    /// When the logical request started.
    pub started_at: Instant,
    /// When its first failure happened (the recovery budget counts from here).
    pub first_failure_at: Option<Instant>,
    /// An absolute deadline set by the caller, if any.
    pub deadline: Option<Instant>,
    /// Whether semantic output was observed or delivered in any attempt.
    pub committed: bool,
    /// Whether a resume strategy can continue the committed stream.
    pub resume_possible: bool,
    /// Why replay is off for this request, if it is.
    pub replay_disabled: Option<ReplayDisabled>,
    /// Whether an admission hook is installed.
    pub admission_hook: bool,
    /// The hook's answer for this failure, once asked.
    pub admission: Option<AdmissionAnswer>,
    /// Whether the caller cancelled.
    pub cancelled: bool,
    /// Sends made to the current target, the failed one included.
    pub target_sends: u32,
    /// Alternates not tried yet; `None` when the request has none
    /// ([`crate::failover`]).
    pub alternates_left: Option<u32>,
    /// An alternate after the current target may take a longer prompt
    /// (its declared context window is larger, or none is declared).
    pub larger_window_left: bool,
}

impl AttemptState {
    /// State after the first send of a request that started at `started_at`.
    pub(crate) fn first(started_at: Instant, max_attempts: u32) -> Self {
        AttemptState {
            attempts_made: 1,
            attempts_left: max_attempts.saturating_sub(1),
            resumes_made: 0,
            started_at,
            first_failure_at: None,
            deadline: None,
            committed: false,
            resume_possible: false,
            replay_disabled: None,
            admission_hook: false,
            admission: None,
            cancelled: false,
            target_sends: 1,
            alternates_left: None,
            larger_window_left: false,
        }
    }
}

/// Everything the decision reads.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecisionInput<'a> {
    /// The policy.
    pub policy: &'a RecoveryPolicy,
    /// The request's state.
    pub state: &'a AttemptState,
    /// The failure being decided on.
    pub failure: &'a Failure,
    /// Whether the platform says it is online.
    pub online: bool,
    /// Now, on the monotonic clock.
    pub now: Instant,
    /// A uniform draw for the backoff jitter.
    pub jitter: Fraction,
}

/// Whether the policy would retry `failure` at all (before any budget,
/// attempt, semantic or admission check), and if not, the outcome.
pub(crate) fn eligibility(policy: &RecoveryPolicy, failure: &Failure) -> Result<(), Outcome> {
    if let FailureKind::Unsuccessful { reason } = &failure.kind {
        return Err(Outcome::Unsuccessful {
            reason: reason.clone(),
        });
    }
    if let Some(cause) = failure.permanent_cause() {
        return Err(match cause {
            PermanentCause::Protocol { violation } => Outcome::Protocol { violation },
            cause => Outcome::Permanent { cause },
        });
    }
    if failure.should_retry == Some(false) {
        return Err(Outcome::Permanent {
            cause: PermanentCause::ServerVetoed,
        });
    }
    let category = failure.category();
    let selected = policy.categories().contains(category)
        && match &failure.kind {
            FailureKind::Status { status } => {
                policy.status_retryable(*status) || failure.should_retry == Some(true)
            }
            FailureKind::Provider { error } => error.transience == Transience::Transient,
            _ => true,
        };
    if selected {
        Ok(())
    } else {
        Err(Outcome::NotRetryable {
            category,
            status: failure.status,
        })
    }
}

/// Why an attempt's failure is what it is, as its record and
/// `attempt_failed` say.
pub(crate) fn reason(
    policy: &RecoveryPolicy,
    state: &AttemptState,
    failure: &Failure,
) -> FailureReason {
    if failure.is_context_overflow() {
        return FailureReason::ContextLength;
    }
    if matches!(failure.kind, FailureKind::Unsuccessful { .. }) {
        return FailureReason::UnsuccessfulTerminal;
    }
    if eligibility(policy, failure).is_err() {
        return match &failure.kind {
            FailureKind::Protocol { .. } => FailureReason::Protocol,
            _ if failure.should_retry == Some(false) => FailureReason::ServerVetoed,
            _ if failure.permanent_cause().is_some() => FailureReason::Permanent,
            _ => FailureReason::NotSelected,
        };
    }
    if semantic_seen(state, failure) {
        return FailureReason::SemanticOutput;
    }
    match &failure.kind {
        FailureKind::UnexpectedEof => FailureReason::UnexpectedEof,
        FailureKind::Timeout { .. } => FailureReason::Stall,
        FailureKind::Provider { error } if error.transience != Transience::Transient => {
            FailureReason::Permanent
        }
        _ => FailureReason::Transient,
    }
}

/// Whether the failure shows (or may hide) semantic output, which forbids a
/// replay.
pub(crate) fn semantic_seen(state: &AttemptState, failure: &Failure) -> bool {
    state.committed || failure.shows_output()
}

fn interrupt_cause(failure: &Failure) -> InterruptCause {
    match &failure.kind {
        _ if failure.unfinished.may_be_semantic && !failure.progress.blocks_replay() => {
            InterruptCause::PartialFrame
        }
        FailureKind::UnexpectedEof => InterruptCause::UnexpectedEof,
        FailureKind::Provider { .. } => InterruptCause::ProviderError,
        FailureKind::Timeout { .. } => InterruptCause::Stall,
        _ => InterruptCause::Transport,
    }
}

fn interrupted(state: &AttemptState, failure: &Failure, cause: Option<InterruptCause>) -> Outcome {
    let stall = match failure.kind {
        FailureKind::Timeout { stall } => Some(stall),
        _ => None,
    };
    Outcome::Interrupted {
        cause: cause.unwrap_or_else(|| interrupt_cause(failure)),
        stall,
        committed: state.committed || failure.progress.semantic_delivered(),
    }
}

/// What a send does about a cooldown in force for its target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CooldownHold {
    /// Wait it out.
    Wait(Duration),
    /// Send now (a policy that ignores hints above its ceiling).
    Send,
    /// Go to the next target instead ([`crate::failover`]).
    Switch,
    /// End the request: it may not wait that long.
    Refuse(Outcome),
}

/// What a send does about `wait`, a cooldown another request learned for
/// its target: before commit with an alternate left it switches; otherwise
/// it waits under the limits the request's own `Retry-After` meets (the
/// policy's ceiling, the recovery budget, the deadline) or is refused.
pub(crate) fn cooldown_hold(
    policy: &RecoveryPolicy,
    state: &AttemptState,
    now: Instant,
    wait: Duration,
) -> CooldownHold {
    if !state.committed && state.alternates_left.is_some_and(|left| left > 0) {
        return CooldownHold::Switch;
    }
    let (budget_end, deadline) = limits(policy, state, now);
    match refusal(policy, wait, now, budget_end, deadline) {
        Some(Refusal::Refused(outcome)) => CooldownHold::Refuse(outcome),
        Some(Refusal::Ignored) => CooldownHold::Send,
        None => CooldownHold::Wait(wait),
    }
}

/// What the limits say of a server's wait `hint` from `now`.
enum Refusal {
    /// The request may not wait that long.
    Refused(Outcome),
    /// Above the ceiling, and the policy backs off as if there were none.
    Ignored,
}

fn refusal(
    policy: &RecoveryPolicy,
    hint: Duration,
    now: Instant,
    budget_end: Option<Instant>,
    deadline: Option<Instant>,
) -> Option<Refusal> {
    let refused = |limit| {
        Some(Refusal::Refused(Outcome::RetryAfterRefused {
            value: hint,
            limit,
        }))
    };
    if hint > policy.retry_after_ceiling() {
        return match policy.over_ceiling() {
            OverCeiling::Refuse => refused(RefusalLimit::Ceiling),
            OverCeiling::Backoff => Some(Refusal::Ignored),
        };
    }
    let at = now.saturating_add(hint);
    if budget_end.is_some_and(|b| at > b) {
        return refused(RefusalLimit::Budget);
    }
    if deadline.is_some_and(|d| at > d) {
        return refused(RefusalLimit::Deadline);
    }
    None
}

/// When the recovery budget ends (counted from the first failure, or from
/// `now` before any) and the earliest deadline, each if set.
fn limits(
    policy: &RecoveryPolicy,
    state: &AttemptState,
    now: Instant,
) -> (Option<Instant>, Option<Instant>) {
    let first_failure = state.first_failure_at.unwrap_or(now);
    let budget_end = policy.budget().map(|b| first_failure.saturating_add(b));
    let deadline = [
        state.deadline,
        policy
            .deadline()
            .map(|d| state.started_at.saturating_add(d)),
    ]
    .into_iter()
    .flatten()
    .min();
    (budget_end, deadline)
}

/// Decides what happens after `input.failure`.
///
/// The checks run in a fixed order, each one final:
/// cancellation; unsuccessful terminal, permanent and vetoed failures;
/// policy selection; the semantic gate (resume or interrupt); replay
/// disabled; every target's share used (with alternates); attempts left;
/// recovery budget and deadline; `Retry-After`
/// against its ceiling, the budget and the deadline; failover to the next
/// target (before commit, when the current one used its share of sends or
/// asks for a wait the request may not give; with every target's share used,
/// the request fails naming them); the backoff against the deadline;
/// admission; connectivity (for a replay; a resume checks it after its
/// backoff). Only then a wait is scheduled, or the switch made.
pub(crate) fn decide(input: DecisionInput<'_>) -> Action {
    next_action(input).unwrap_or_else(Action::Fail)
}

/// [`decide`]'s checks in their order; `Err` is the outcome the request
/// ends with.
fn next_action(input: DecisionInput<'_>) -> Result<Action, Outcome> {
    let DecisionInput {
        policy,
        state,
        failure,
        online,
        now,
        jitter,
    } = input;

    let route = route(policy, state, failure)?;

    let (budget_end, deadline) = limits(policy, state, now);
    within_limits(budget_end, deadline, |end| now >= end)?;

    let (hint, switch) = handover(input, &route, budget_end, deadline)?;
    let (delay, cause) = if switch {
        (Duration::ZERO, DelayCause::Backoff)
    } else {
        wait(policy, state, hint, jitter)
    };
    let at = now.saturating_add(delay);
    within_limits(budget_end, deadline, |end| at > end)?;

    if !admitted(policy, state, failure)? {
        return Ok(Action::AskAdmission);
    }

    // A replay parks before any backoff is spent (AD4). A resume waits its
    // backoff first; the driver checks connectivity again just before the
    // send ([`crate::engine::Recovery::park_before_send`], AD5).
    if !online && !route.resume {
        return Ok(Action::ParkUntilOnline);
    }

    Ok(if route.resume {
        Action::Resume { delay, cause }
    } else if switch {
        Action::Failover
    } else {
        Action::RetryAfter { delay, cause }
    })
}

/// How a failure that may be recovered from goes on, as the checks that
/// read no clock found it.
struct Route {
    /// The committed stream is continued rather than the request replayed.
    resume: bool,
    /// The current target used its share of sends.
    share_spent: bool,
    /// The prompt was too long for this target and one left may take it.
    to_larger_window: bool,
}

/// The checks that read no clock, in [`decide`]'s order: cancellation, the
/// failure's class, the semantic gate, replay disabled, every target's
/// share used, attempts left.
fn route(
    policy: &RecoveryPolicy,
    state: &AttemptState,
    failure: &Failure,
) -> Result<Route, Outcome> {
    if state.cancelled {
        return Err(Outcome::Cancelled {
            phase: crate::outcome::CancelPhase::Waiting,
        });
    }

    let semantic = semantic_seen(state, failure);
    // A prompt too long for this target is never sent to it again; before
    // output it moves to a target that may take it, when one is left.
    let to_larger_window = failure.is_context_overflow() && !semantic && state.larger_window_left;
    class_allows(policy, state, failure, semantic, to_larger_window)?;

    let resume = semantic && state.resume_possible && state.resumes_made < policy.max_resumes();
    if semantic && !resume {
        return Err(interrupted(state, failure, None));
    }
    if !resume && let Some(reason) = state.replay_disabled {
        return Err(Outcome::ReplayDisabled { reason });
    }

    // Every target used its share: the request fails naming them (the
    // engine fills in their labels).
    let share_spent = state.target_sends >= policy.attempts_per_target().get();
    if !resume && share_spent && state.alternates_left == Some(0) {
        return Err(Outcome::AlternatesExhausted {
            attempts: state.attempts_made,
            targets: Vec::new(),
        });
    }

    if state.attempts_left == 0 {
        return Err(if semantic {
            interrupted(state, failure, Some(InterruptCause::AttemptsExhausted))
        } else {
            Outcome::Exhausted {
                attempts: state.attempts_made,
            }
        });
    }

    Ok(Route {
        resume,
        share_spent,
        to_larger_window,
    })
}

/// Whether the failure's class lets the request go on: unsuccessful
/// terminal, permanent, vetoed and not-selected failures end it, except a
/// protocol violation the policy replays and a prompt that moves to a
/// larger window.
fn class_allows(
    policy: &RecoveryPolicy,
    state: &AttemptState,
    failure: &Failure,
    semantic: bool,
    to_larger_window: bool,
) -> Result<(), Outcome> {
    // A protocol violation before any output is replayed like a reset when
    // the policy opts in; with output it ends the request as ever.
    let replayable_violation = policy.retry_protocol_violations()
        && !semantic
        && matches!(failure.kind, FailureKind::Protocol { .. });
    if replayable_violation || to_larger_window {
        return Ok(());
    }
    // A failure that ends a committed stream is reported as an interruption
    // when it is a transport-level or not-selected one; the typed terminal
    // (unsuccessful, permanent, protocol) stands as it is.
    eligibility(policy, failure).map_err(|outcome| match outcome {
        Outcome::NotRetryable { .. } if semantic => interrupted(state, failure, None),
        other => other,
    })
}

/// Fails when `passed` holds for the deadline or the end of the recovery
/// budget (the deadline named first when both do).
fn within_limits(
    budget_end: Option<Instant>,
    deadline: Option<Instant>,
    passed: impl Fn(Instant) -> bool,
) -> Result<(), Outcome> {
    if deadline.is_some_and(&passed) {
        return Err(Outcome::DeadlineExceeded);
    }
    if budget_end.is_some_and(&passed) {
        return Err(Outcome::BudgetExhausted {
            budget: BudgetKind::Recovery,
        });
    }
    Ok(())
}

/// The server's `Retry-After` as the wait takes it (`None` when absent or
/// ignored above the ceiling), and whether the request hands over to the
/// next target instead of waiting; `Err` when the hint may not be waited
/// and no target is left to switch to.
fn handover(
    input: DecisionInput<'_>,
    route: &Route,
    budget_end: Option<Instant>,
    deadline: Option<Instant>,
) -> Result<(Option<Duration>, bool), Outcome> {
    let DecisionInput {
        policy,
        state,
        failure,
        now,
        ..
    } = input;
    let mut hint = failure.retry_after.delay();
    let refused = match hint.and_then(|h| refusal(policy, h, now, budget_end, deadline)) {
        Some(Refusal::Refused(outcome)) => Some(outcome),
        Some(Refusal::Ignored) => {
            hint = None;
            None
        }
        None => None,
    };

    // Before commit, a target that used its share of sends, that asks for
    // a wait the request may not give, or that was too slow to give its
    // first token (it is likely to be as slow again) hands over to the next
    // one at once; its hint is about itself, not the next target.
    let slow = matches!(
        failure.kind,
        FailureKind::Timeout {
            stall: Stall::FirstToken
        }
    );
    let switch = match state.alternates_left {
        Some(left) if !route.resume && left > 0 => {
            route.share_spent || refused.is_some() || route.to_larger_window || slow
        }
        _ => false,
    };
    match refused {
        Some(outcome) if !switch => Err(outcome),
        _ => Ok((hint, switch)),
    }
}

/// How long the next send waits and why: the jittered backoff, or the
/// server's hint when that is longer.
fn wait(
    policy: &RecoveryPolicy,
    state: &AttemptState,
    hint: Option<Duration>,
    jitter: Fraction,
) -> (Duration, DelayCause) {
    let retry_index = state.attempts_made.max(1);
    let drawn = backoff::delay(
        policy.backoff_base(),
        policy.backoff_ceiling(),
        retry_index,
        jitter,
    );
    match hint {
        Some(h) if h > drawn => (h, DelayCause::RetryAfter),
        _ => (drawn, DelayCause::Backoff),
    }
}

/// Whether the admission hook's answer lets the resend go: `Ok(false)`
/// when the hook is still to be asked; `Err` when it rejected, could not
/// tell, or an ambiguous failure on a local endpoint has no hook to ask.
fn admitted(
    policy: &RecoveryPolicy,
    state: &AttemptState,
    failure: &Failure,
) -> Result<bool, Outcome> {
    let ambiguous = failure.acceptance == Acceptance::Unknown;
    match state.admission {
        Some(AdmissionAnswer::Reject) => Err(Outcome::AdmissionRejected),
        Some(AdmissionAnswer::Unresolved) => Err(Outcome::AdmissionUnresolved),
        None if state.admission_hook => Ok(false),
        None if ambiguous && policy.endpoint() == Endpoint::Local => {
            Err(Outcome::AdmissionRequired)
        }
        Some(AdmissionAnswer::Allow) | None => Ok(true),
    }
}
