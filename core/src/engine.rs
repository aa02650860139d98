//! The attempt state machine of one logical request.
//!
//! [`Recovery`] wraps [`decide`](crate::decision::decide()) with everything a
//! driver would otherwise re-implement: the shared attempt allowance (debited
//! before each send), the cross-request retry budget (a permit taken when a
//! wait is scheduled, spent at the send, refunded if the wait is cancelled),
//! the lifecycle events in their canonical order, exactly one terminal event,
//! and the report. It is sans-IO: drivers tell it what happened and when, it
//! tells them what to do next, and they drain its events.

use std::sync::Arc;
use std::time::Duration;

use crate::budget::{AttemptAllowance, BudgetStore, RetryPermit};
use crate::decision::{Action, AdmissionAnswer, AttemptState, CooldownHold, DecisionInput, decide};
use crate::failure::{Category, Failure, FailureKind, Phase};
use crate::lifecycle::{CommitTrigger, EventKind, Identity, LifecycleEvent};
use crate::outcome::{
    BudgetKind, CancelPhase, FailureReason, InterruptCause, Outcome, ReplayDisabled,
};
use crate::policy::RecoveryPolicy;
use crate::progress::{Progress, Proof, Transience};
use crate::report::{AttemptRecord, AttemptResult, DelayRecord, RecoveryReport};
use crate::safe::{RateLimits, SafeToken};
use crate::timing::{Fraction, Instant};

/// What kind of send comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextSend {
    First,
    Retry,
    Resume,
}

/// What a send does about a cooldown in force for its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CooldownStep {
    /// Wait this long, then send.
    Wait(Duration),
    /// Send now (the policy ignores hints above its ceiling).
    Send,
    /// The send goes to the next target instead; decide it again there.
    Switched,
}

/// The attempt state machine of one logical request. See the module docs.
#[derive(Debug)]
pub struct Recovery {
    policy: RecoveryPolicy,
    logical_id: String,
    allowance: AttemptAllowance,
    retry_budget: Option<Arc<dyn BudgetStore>>,
    permit: Option<RetryPermit>,
    state: AttemptState,
    next: NextSend,
    in_flight: bool,
    last_failure: Option<Failure>,
    /// Semantic output was observed in some attempt (delivered or not).
    output_observed: bool,
    events: Vec<LifecycleEvent>,
    report: RecoveryReport,
    outcome: Option<Outcome>,
    /// The labels of the request's own target and its alternates; empty
    /// when it has none ([`crate::failover`]).
    targets: Vec<String>,
    /// The target the next (or current) send goes to.
    target: usize,
    /// Each target's declared context window, in the order of `targets`.
    windows: Vec<Option<u64>>,
    /// The interruption a prefill continuation stands in for: if the
    /// continuation ends the request after all, this is its outcome.
    continuing_from: Option<Outcome>,
}

/// Formats a logical id the way events and reports show it.
pub fn format_logical_id(id: u64) -> String {
    let mut s = String::with_capacity(16);
    crate::text::push_hex16(&mut s, id);
    s
}

impl Recovery {
    /// Starts a logical request at `now` under `policy`, drawing its sends
    /// from `allowance` (shared with any nested layer).
    pub fn new(
        policy: RecoveryPolicy,
        allowance: AttemptAllowance,
        logical_id: u64,
        now: Instant,
    ) -> Self {
        let mut state = AttemptState::first(now, policy.max_attempts().get());
        state.attempts_made = 0;
        state.target_sends = 0;
        state.attempts_left = allowance.remaining();
        let logical_id = format_logical_id(logical_id);
        Recovery {
            report: RecoveryReport::new(logical_id.clone()),
            policy,
            logical_id,
            allowance,
            retry_budget: None,
            permit: None,
            state,
            next: NextSend::First,
            in_flight: false,
            last_failure: None,
            output_observed: false,
            events: Vec::new(),
            outcome: None,
            targets: Vec::new(),
            target: 0,
            windows: Vec::new(),
            continuing_from: None,
        }
    }

    /// Names the targets the request may be served from, its own first
    /// (`labels[0]`), then its alternates in order ([`crate::failover`]).
    #[must_use]
    pub fn with_targets(mut self, labels: Vec<String>) -> Self {
        if labels.len() > 1 {
            self.state.alternates_left = Some(labels.len() as u32 - 1);
            self.targets = labels;
        }
        self
    }

    /// The index of the target the next (or current) send goes to: 0 for
    /// the request's own, `i` for its alternate `i`.
    pub fn target(&self) -> usize {
        self.target
    }

    fn target_label(&self) -> Option<String> {
        self.targets.get(self.target).cloned()
    }

    /// Moves the next send to the next target: the next one, or for a
    /// prompt too long for the current one, the next that may take it.
    fn switch_target(&mut self, now: Instant) {
        let from = self.target_label().unwrap_or_default();
        let reason = self
            .last_failure
            .as_ref()
            .map_or(FailureReason::Transient, |f| self.reason_for(f));
        let next = match reason {
            FailureReason::ContextLength => self.larger_window_target(),
            _ => None,
        };
        self.target = next.unwrap_or(self.target + 1);
        self.state.target_sends = 0;
        if let Some(left) = self.state.alternates_left.as_mut() {
            *left = (self.targets.len().saturating_sub(self.target + 1)) as u32;
        }
        let to = self.target_label().unwrap_or_default();
        self.emit(now, EventKind::Failover { from, to, reason });
    }

    /// Declares each target's context window in tokens (`None`: not
    /// declared), in the order of [`Recovery::with_targets`].
    #[must_use]
    pub fn with_context_windows(mut self, windows: Vec<Option<u64>>) -> Self {
        self.windows = windows;
        self
    }

    /// Declares the request's own target's context window.
    pub fn declare_own_window(&mut self, tokens: Option<u64>) {
        if let Some(own) = self.windows.first_mut() {
            *own = tokens;
        }
    }

    /// The target after the current one that may take a prompt too long
    /// for it: the first whose declared context window is larger than the
    /// current one's (an undeclared current window counts as 0), or, when
    /// none after it declares one, the next target.
    fn larger_window_target(&self) -> Option<usize> {
        let rest = self.target + 1..self.targets.len();
        let window = |i: usize| self.windows.get(i).copied().flatten();
        if rest.clone().all(|i| window(i).is_none()) {
            return rest.clone().next();
        }
        let current = window(self.target).unwrap_or(0);
        rest.into_iter()
            .find(|&i| window(i).is_some_and(|w| w > current))
    }

    /// Uses a cross-request retry budget; this request deposits into it.
    #[must_use]
    pub fn with_retry_budget(mut self, budget: Arc<dyn BudgetStore>) -> Self {
        budget.deposit(self.state.started_at);
        self.retry_budget = Some(budget);
        self
    }

    /// Declares that an admission hook is installed.
    #[must_use]
    pub fn with_admission_hook(mut self, installed: bool) -> Self {
        self.state.admission_hook = installed;
        self
    }

    /// Sets an absolute deadline for the whole request.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.state.deadline = Some(deadline);
        self
    }

    /// Turns replay off (the request body could not be buffered).
    pub fn disable_replay(&mut self, reason: ReplayDisabled) {
        self.state.replay_disabled = Some(reason);
        self.report.replay_disabled = Some(reason);
    }

    /// Declares whether a resume strategy can continue the committed stream.
    pub fn set_resume_possible(&mut self, possible: bool) {
        self.state.resume_possible = possible;
    }

    /// The policy in force.
    pub fn policy(&self) -> &RecoveryPolicy {
        &self.policy
    }

    /// The logical id, as events show it.
    pub fn logical_id(&self) -> &str {
        &self.logical_id
    }

    /// The current physical send number (0 before the first).
    pub fn wire_attempt(&self) -> u32 {
        self.state.attempts_made
    }

    /// Whether the request has committed (output reached the consumer).
    pub fn is_committed(&self) -> bool {
        self.state.committed
    }

    /// The outcome, once the request ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// The report so far.
    pub fn report(&self) -> &RecoveryReport {
        &self.report
    }

    /// Whether events wait to be drained.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Takes the events produced since the last call, in order.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, LifecycleEvent> {
        self.events.drain(..)
    }

    fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_since(self.state.started_at)
    }

    fn emit(&mut self, now: Instant, kind: EventKind) {
        let n = self.state.attempts_made;
        let event = LifecycleEvent {
            identity: Identity {
                logical_id: self.logical_id.clone(),
                attempt_id: (n > 0).then(|| {
                    let mut id = String::with_capacity(self.logical_id.len() + 4);
                    id.push_str(&self.logical_id);
                    id.push('-');
                    crate::text::push_decimal(&mut id, u64::from(n));
                    id
                }),
                wire_attempt: n,
            },
            at: self.elapsed(now),
            kind,
        };
        self.events.push(event);
    }

    fn current(&mut self) -> Option<&mut AttemptRecord> {
        if self.in_flight {
            self.report.attempts.last_mut()
        } else {
            None
        }
    }

    /// Ends the request with `outcome`, emitting its one terminal event.
    fn finish(&mut self, now: Instant, outcome: Outcome) -> Outcome {
        if let Some(done) = &self.outcome {
            return done.clone();
        }
        self.permit = None;
        let attempts = self.state.attempts_made;
        let kind = match &outcome {
            Outcome::Completed { proof } => EventKind::Completed {
                proof: *proof,
                attempts,
            },
            Outcome::Cancelled { phase } => EventKind::Cancelled {
                phase: *phase,
                attempts,
            },
            // An interruption is reported as such even when the semantic
            // output that forbade the replay was observed but not yet
            // delivered (G1): the request did not fail "before commit".
            other
                if self.state.committed
                    || self.output_observed
                    || matches!(other, Outcome::Interrupted { .. }) =>
            {
                EventKind::Interrupted {
                    outcome: other.clone(),
                    attempts,
                }
            }
            other => {
                if matches!(other, Outcome::AdmissionRequired) {
                    self.emit(now, EventKind::AdmissionRequired);
                }
                EventKind::Exhausted {
                    outcome: other.clone(),
                    attempts,
                }
            }
        };
        self.emit(now, kind);
        self.report.outcome = Some(outcome.clone());
        self.report.metrics.total_ms = Some(self.elapsed(now).as_millis() as u64);
        self.outcome = Some(outcome.clone());
        outcome
    }

    /// Call after a resume's wait, before [`Recovery::begin_attempt`]: when
    /// the platform is offline, announces `parked_offline` and returns
    /// `true` (the driver waits for connectivity, then sends). A resume waits
    /// its backoff first and connectivity second (reliability matrix AD5).
    pub fn park_before_send(&mut self, now: Instant, online: bool) -> bool {
        if online || self.outcome.is_some() || self.next != NextSend::Resume {
            return false;
        }
        self.emit(now, EventKind::ParkedOffline);
        true
    }

    /// Call immediately before every physical send. Rechecks cancellation and
    /// the deadline, debits the allowance (unless an outer layer already did:
    /// `prepaid`), spends the retry permit, and emits `retry_started` /
    /// `resume_started` and `attempt_started`. Returns the wire attempt
    /// number, or the outcome that ends the request instead of sending.
    pub fn begin_attempt(
        &mut self,
        now: Instant,
        cancelled: bool,
        prepaid: bool,
    ) -> Result<u32, Outcome> {
        if let Some(done) = &self.outcome {
            return Err(done.clone());
        }
        if cancelled {
            let phase = if self.next == NextSend::First {
                CancelPhase::Sending
            } else {
                CancelPhase::Waiting
            };
            return Err(self.finish(now, Outcome::Cancelled { phase }));
        }
        let deadline = [
            self.state.deadline,
            self.policy
                .deadline()
                .map(|d| self.state.started_at.saturating_add(d)),
        ]
        .into_iter()
        .flatten()
        .min();
        if self.next != NextSend::First && deadline.is_some_and(|d| now >= d) {
            return Err(self.finish(now, Outcome::DeadlineExceeded));
        }
        if !prepaid && !self.allowance.try_debit() {
            let attempts = self.state.attempts_made;
            return Err(self.finish(now, Outcome::Exhausted { attempts }));
        }
        if let Some(permit) = self.permit.take() {
            permit.spend();
        }
        match self.next {
            NextSend::First => {}
            NextSend::Retry => self.emit(now, EventKind::RetryStarted),
            NextSend::Resume => self.emit(now, EventKind::ResumeStarted),
        }
        let resume = self.next == NextSend::Resume;
        self.state.attempts_made += 1;
        self.state.target_sends += 1;
        self.state.attempts_left = self.allowance.remaining();
        self.state.admission = None;
        if resume {
            self.state.resumes_made += 1;
            self.report.resumes += 1;
        }
        if self.state.attempts_made > 1 {
            self.report.resend_count += 1;
        }
        let n = self.state.attempts_made;
        self.report.attempts.push(AttemptRecord {
            wire_attempt: n,
            resume,
            started_ms: self.elapsed(now),
            ended_ms: None,
            status: None,
            result: AttemptResult::InProgress,
            acceptance: None,
            retry_after: crate::retry_after::RetryAfter::Absent,
            progress: Progress::default(),
            request_id: None,
            rate_limits: None,
            target: self.target_label(),
        });
        self.in_flight = true;
        let max_attempts = self.allowance.total();
        let target = self.target_label();
        self.emit(
            now,
            EventKind::AttemptStarted {
                max_attempts,
                resume,
                target,
            },
        );
        Ok(n)
    }

    /// How long a wait (admission, parking) may last before the recovery
    /// budget or the deadline runs out, if either is set. A driver races its
    /// admission hook and connectivity wait against this: pending is not
    /// approval.
    pub fn wait_limit(&self, now: Instant) -> Option<Duration> {
        let first_failure = self.state.first_failure_at.unwrap_or(now);
        [
            self.policy
                .budget()
                .map(|b| first_failure.saturating_add(b)),
            self.state.deadline,
            self.policy
                .deadline()
                .map(|d| self.state.started_at.saturating_add(d)),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|end| end.saturating_since(now))
    }

    /// The failure of the last attempt, once one failed.
    pub fn last_failure(&self) -> Option<&Failure> {
        self.last_failure.as_ref()
    }

    /// Whether `failure` of the attempt in flight would be resumed if a
    /// resume were possible (asked before a continuation hook is called, so
    /// the hook is not asked for a failure that ends the request anyway).
    pub fn would_resume(&self, now: Instant, failure: &Failure, online: bool) -> bool {
        let mut state = self.state.clone();
        state.resume_possible = true;
        state.attempts_left = self.allowance.remaining();
        state.first_failure_at.get_or_insert(now);
        matches!(
            decide(DecisionInput {
                policy: &self.policy,
                state: &state,
                failure,
                online,
                now,
                jitter: Fraction::ZERO,
            }),
            Action::Resume { .. }
        )
    }

    /// A prefill continuation of the committed stream will answer
    /// `failure` (its resume was decided), sent to target `target`. Should
    /// the continuation end the request after all (the target refuses a
    /// prefill, or fails), the request fails with the interruption
    /// `failure` is: a target's refusal of a prefill says nothing about the
    /// answer the consumer holds.
    pub fn continue_by_prefill(
        &mut self,
        now: Instant,
        failure: &Failure,
        online: bool,
        target: usize,
    ) {
        let mut state = self.state.clone();
        state.resume_possible = false;
        state.attempts_left = self.allowance.remaining();
        state.first_failure_at.get_or_insert(now);
        let action = decide(DecisionInput {
            policy: &self.policy,
            state: &state,
            failure,
            online,
            now,
            jitter: Fraction::ZERO,
        });
        if let Action::Fail(outcome) = action {
            self.continuing_from = Some(outcome);
        }
        if target != self.target && target < self.targets.len() {
            self.target = target;
            self.state.target_sends = 0;
        }
    }

    /// Before a send, a cooldown of `wait` is in force for the request's
    /// target (another request learned it): what the send does about it.
    /// A wait and a switch are announced; a refusal ends the request.
    pub fn hold_for_cooldown(
        &mut self,
        now: Instant,
        wait: Duration,
    ) -> Result<CooldownStep, Outcome> {
        match crate::decision::cooldown_hold(&self.policy, &self.state, now, wait) {
            CooldownHold::Wait(wait) => {
                let cause = crate::decision::DelayCause::Cooldown;
                self.report.delays.push(DelayRecord {
                    after_attempt: self.state.attempts_made,
                    delay_ms: wait,
                    cause,
                });
                self.emit(
                    now,
                    EventKind::DelayScheduled {
                        delay_ms: wait,
                        cause,
                    },
                );
                Ok(CooldownStep::Wait(wait))
            }
            CooldownHold::Switch => {
                self.switch_target(now);
                Ok(CooldownStep::Switched)
            }
            CooldownHold::Send => Ok(CooldownStep::Send),
            CooldownHold::Refuse(outcome) => Err(self.finish(now, outcome)),
        }
    }

    /// Records the seam of the resume attempt now in flight.
    pub fn record_seam(&mut self, strategy: crate::report::SeamStrategy, delivered_bytes: u64) {
        let attempt = self.state.attempts_made;
        self.report.seams.push(crate::report::Seam {
            attempt,
            strategy,
            delivered_bytes,
        });
    }

    /// A transport error arrived after terminal proof (a reset right after
    /// `[DONE]`): the outcome stands, the error is recorded.
    pub fn late_error(&mut self) {
        self.report.late_error = true;
    }

    /// Records the response head of the attempt in flight.
    pub fn head_received(
        &mut self,
        now: Instant,
        status: u16,
        request_id: Option<SafeToken>,
        rate_limits: Option<RateLimits>,
    ) {
        let at = self.elapsed(now).as_millis() as u64;
        if let Some(rec) = self.current() {
            rec.status = Some(status);
            rec.request_id = request_id;
            rec.rate_limits = rate_limits;
            rec.progress.headers_received = true;
            self.report.metrics.time_to_headers_ms = Some(at);
        }
    }

    /// Records the first semantic fragment of the request (first call wins).
    pub fn first_semantic(&mut self, now: Instant) {
        if self.report.metrics.time_to_first_semantic_ms.is_none() {
            self.report.metrics.time_to_first_semantic_ms =
                Some(self.elapsed(now).as_millis() as u64);
        }
    }

    /// The attempt in flight committed: its output now reaches the consumer
    /// and it can no longer be replayed.
    pub fn commit(&mut self, now: Instant, trigger: CommitTrigger) {
        if self.state.committed || self.outcome.is_some() {
            return;
        }
        self.state.committed = true;
        self.report.committed_attempt = Some(self.state.attempts_made);
        self.report.served_by = self.target_label();
        if trigger == CommitTrigger::Semantic {
            self.first_semantic(now);
        }
        self.emit(now, EventKind::Committed { trigger });
    }

    /// Updates the progress of the attempt in flight.
    pub fn record_progress(&mut self, progress: Progress) {
        if let Some(rec) = self.current() {
            let (headers, delivered) =
                (rec.progress.headers_received, rec.progress.delivered_bytes);
            rec.progress = progress;
            rec.progress.headers_received |= headers;
            // Delivered bytes are counted by the driver as it hands them
            // out; an observer's snapshot never lowers them.
            rec.progress.delivered_bytes = rec.progress.delivered_bytes.max(delivered);
        }
    }

    /// The attempt in flight finished with success proof.
    pub fn succeed(&mut self, now: Instant, proof: Proof, progress: Progress) -> Outcome {
        if let Some(done) = &self.outcome {
            return done.clone();
        }
        self.record_progress(progress);
        let at = self.elapsed(now).as_millis() as u64;
        if let Some(rec) = self.current() {
            rec.ended_ms = Some(at);
            rec.result = AttemptResult::Succeeded { proof };
        }
        self.in_flight = false;
        self.report.served_by = self.target_label();
        self.emit(now, EventKind::AttemptSucceeded { proof });
        self.finish(now, Outcome::Completed { proof })
    }

    fn reason_for(&self, failure: &Failure) -> FailureReason {
        if failure.is_context_overflow() {
            return FailureReason::ContextLength;
        }
        if matches!(failure.kind, FailureKind::Unsuccessful { .. }) {
            return FailureReason::UnsuccessfulTerminal;
        }
        if crate::decision::eligibility(&self.policy, failure).is_err() {
            return match &failure.kind {
                FailureKind::Protocol { .. } => FailureReason::Protocol,
                _ if failure.should_retry == Some(false) => FailureReason::ServerVetoed,
                _ if failure.permanent_cause().is_some() => FailureReason::Permanent,
                _ => FailureReason::NotSelected,
            };
        }
        if crate::decision::semantic_seen(&self.state, failure) {
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

    /// The attempt in flight failed. Emits `attempt_failed`, decides, and
    /// returns what the driver does next (a terminal `Fail` has already
    /// emitted its terminal event).
    pub fn fail(
        &mut self,
        now: Instant,
        failure: Failure,
        online: bool,
        jitter: Fraction,
    ) -> Action {
        if let Some(done) = &self.outcome {
            return Action::Fail(done.clone());
        }
        let reason = self.reason_for(&failure);
        let at = self.elapsed(now).as_millis() as u64;
        let (category, phase) = (failure.category(), failure.phase);
        if let Some(rec) = self.current() {
            rec.ended_ms = Some(at);
            if failure.status.is_some() {
                rec.status = failure.status;
            }
            rec.retry_after = failure.retry_after;
            let headers = rec.progress.headers_received;
            rec.progress = failure.progress;
            rec.progress.headers_received |= headers || failure.status.is_some();
            rec.result = AttemptResult::Failed {
                category,
                phase,
                reason,
            };
            rec.acceptance = Some(failure.acceptance);
        }
        self.in_flight = false;
        self.output_observed |= failure.progress.blocks_replay();
        if failure.progress.blocks_replay() {
            self.state.committed |= failure.progress.semantic_delivered();
        }
        self.emit(
            now,
            EventKind::AttemptFailed {
                category,
                phase,
                reason,
                status: failure.status,
                stall: match failure.kind {
                    FailureKind::Timeout { stall } => Some(stall),
                    _ => None,
                },
            },
        );
        self.state.first_failure_at.get_or_insert(now);
        self.state.admission = None;
        self.last_failure = Some(failure);
        self.decide_next(now, online, jitter)
    }

    /// The admission hook answered.
    pub fn admission(
        &mut self,
        now: Instant,
        answer: AdmissionAnswer,
        online: bool,
        jitter: Fraction,
    ) -> Action {
        if let Some(done) = &self.outcome {
            return Action::Fail(done.clone());
        }
        self.emit(
            now,
            match answer {
                AdmissionAnswer::Allow => EventKind::AdmissionAllowed,
                AdmissionAnswer::Reject => EventKind::AdmissionRejected,
                AdmissionAnswer::Unresolved => EventKind::AdmissionUnresolved,
            },
        );
        self.state.admission = Some(answer);
        self.decide_next(now, online, jitter)
    }

    /// The platform is online again after a park: decide again.
    pub fn online_again(&mut self, now: Instant, jitter: Fraction) -> Action {
        if let Some(done) = &self.outcome {
            return Action::Fail(done.clone());
        }
        self.decide_next(now, true, jitter)
    }

    /// The caller cancelled in `phase`. An attempt in flight is recorded as
    /// failed (category cancellation) before the one `cancelled` event.
    pub fn cancel(&mut self, now: Instant, phase: CancelPhase) -> Outcome {
        if let Some(done) = &self.outcome {
            return done.clone();
        }
        if self.in_flight {
            let at = self.elapsed(now).as_millis() as u64;
            let wire_phase = match phase {
                CancelPhase::Sending => Phase::Sending,
                CancelPhase::AwaitingHead => Phase::AwaitingHeaders,
                _ => Phase::Streaming,
            };
            if let Some(rec) = self.current() {
                rec.ended_ms = Some(at);
                rec.result = AttemptResult::Failed {
                    category: Category::Cancellation,
                    phase: wire_phase,
                    reason: FailureReason::Cancelled,
                };
            }
            self.in_flight = false;
            self.emit(
                now,
                EventKind::AttemptFailed {
                    category: Category::Cancellation,
                    phase: wire_phase,
                    reason: FailureReason::Cancelled,
                    status: self.report.attempts.last().and_then(|a| a.status),
                    stall: None,
                },
            );
        }
        self.finish(now, Outcome::Cancelled { phase })
    }

    fn decide_next(&mut self, now: Instant, online: bool, jitter: Fraction) -> Action {
        let Some(failure) = self.last_failure.as_ref() else {
            return Action::Fail(self.finish(
                now,
                Outcome::Exhausted {
                    attempts: self.state.attempts_made,
                },
            ));
        };
        self.state.attempts_left = self.allowance.remaining();
        self.state.larger_window_left = self.larger_window_target().is_some();
        let action = decide(DecisionInput {
            policy: &self.policy,
            state: &self.state,
            failure,
            online,
            now,
            jitter,
        });
        match action {
            Action::Fail(Outcome::AlternatesExhausted { attempts, .. }) => {
                let targets = self.targets[..=self.target].to_vec();
                let outcome = Outcome::AlternatesExhausted { attempts, targets };
                Action::Fail(self.finish(now, outcome))
            }
            Action::Fail(outcome) => {
                // A resume that fails for good ends the committed stream as a
                // failed resume, whatever the resume request's own failure.
                let resumed = self.report.attempts.last().is_some_and(|a| a.resume);
                let outcome = match outcome {
                    _ if resumed && self.continuing_from.is_some() => {
                        self.continuing_from.clone().unwrap_or(outcome)
                    }
                    Outcome::Permanent { .. }
                    | Outcome::NotRetryable { .. }
                    | Outcome::Protocol { .. }
                        if resumed =>
                    {
                        Outcome::Interrupted {
                            cause: InterruptCause::ResumeFailed,
                            stall: None,
                            committed: true,
                        }
                    }
                    other => other,
                };
                Action::Fail(self.finish(now, outcome))
            }
            Action::AskAdmission => {
                self.emit(now, EventKind::AdmissionPending);
                Action::AskAdmission
            }
            Action::ParkUntilOnline => {
                self.emit(now, EventKind::ParkedOffline);
                Action::ParkUntilOnline
            }
            Action::RetryAfter { .. } | Action::Resume { .. } | Action::Failover => {
                if let Some(budget) = &self.retry_budget {
                    match RetryPermit::take(Arc::clone(budget), now) {
                        Some(permit) => self.permit = Some(permit),
                        None => {
                            return Action::Fail(self.finish(
                                now,
                                Outcome::BudgetExhausted {
                                    budget: BudgetKind::RetryTokens,
                                },
                            ));
                        }
                    }
                }
                match action {
                    Action::RetryAfter { delay, cause } | Action::Resume { delay, cause } => {
                        self.next = if matches!(action, Action::Resume { .. }) {
                            NextSend::Resume
                        } else {
                            NextSend::Retry
                        };
                        self.report.delays.push(DelayRecord {
                            after_attempt: self.state.attempts_made,
                            delay_ms: delay,
                            cause,
                        });
                        self.emit(
                            now,
                            EventKind::DelayScheduled {
                                delay_ms: delay,
                                cause,
                            },
                        );
                    }
                    _ => {
                        self.next = NextSend::Retry;
                        self.switch_target(now);
                    }
                }
                action
            }
        }
    }
}
