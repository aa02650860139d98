//! The request's course over its sends: what the decision reads (the
//! attempt state, the targets and their windows, the last failure) and how
//! each verdict is carried into the [`Ledger`]: a send debited before it is
//! made, a retry permit taken when a wait is scheduled and spent at the
//! send, the lifecycle events in their canonical order, exactly one
//! terminal event.

use std::sync::Arc;
use std::time::Duration;

use super::hedging::{Hedging, Seat};
use super::ledger::{Ending, Ledger};
use super::targets::Targets;
use crate::budget::{AttemptAllowance, BudgetStore, RetryPermit};
use crate::decision::{
    Action, AdmissionAnswer, AttemptState, CooldownHold, DecisionInput, DelayCause, cooldown_hold,
    decide,
};
use crate::failure::{Failure, FailureKind, Phase};
use crate::lifecycle::{CommitTrigger, EventKind};
use crate::outcome::{BudgetKind, CancelPhase, FailureReason, Outcome, ReplayDisabled};
use crate::policy::RecoveryPolicy;
use crate::progress::{Generation, Progress, Proof};
use crate::timing::{Fraction, Instant, JitterSource};

/// What kind of send comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextSend {
    First,
    Retry,
    Resume,
}

/// What a send does about a cooldown in force for its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CooldownStep {
    /// Wait this long, then send.
    Wait(Duration),
    /// Send now (the policy ignores hints above its ceiling).
    Send,
    /// The send goes to the next target instead; decide it again there.
    Switched,
}

/// The request's course. See the module docs.
#[derive(Debug)]
pub(crate) struct Course {
    policy: RecoveryPolicy,
    /// The books, for the driver to read.
    pub(crate) ledger: Ledger,
    retry_budget: Option<Arc<dyn BudgetStore>>,
    state: AttemptState,
    next: NextSend,
    /// Boxed: most requests never fail, and a course lives as long as
    /// its stream.
    last_failure: Option<Box<Failure>>,
    /// Semantic output was observed in some attempt (delivered or not).
    output_observed: bool,
    /// The targets it may be served from ([`crate::failover`]).
    targets: Targets,
    /// The interruption a prefill continuation stands in for: if the
    /// continuation ends the request after all, this is its outcome.
    continuing_from: Option<Outcome>,
    /// An outer layer already debited the first send.
    prepaid: bool,
    /// The hedges it started.
    hedging: Hedging,
    /// The backoff's jitter draws, fixed when the request started.
    jitter: JitterSource,
}

impl Course {
    /// Starts a logical request at `now` under `policy`, drawing its sends
    /// from `allowance` (shared with any nested layer).
    pub(crate) fn new(
        policy: RecoveryPolicy,
        allowance: AttemptAllowance,
        logical_id: u64,
        jitter: JitterSource,
        now: Instant,
    ) -> Self {
        let mut state = AttemptState::first(now, policy.max_attempts().get());
        state.attempts_made = 0;
        state.target_sends = 0;
        state.attempts_left = allowance.remaining();
        Course {
            ledger: Ledger::new(logical_id, allowance, now),
            policy,
            retry_budget: None,
            state,
            next: NextSend::First,
            last_failure: None,
            output_observed: false,
            targets: Targets::default(),
            continuing_from: None,
            prepaid: false,
            hedging: Hedging::default(),
            jitter,
        }
    }

    /// Names the targets the request may be served from, its own first
    /// (`labels[0]`), then its alternates in order ([`crate::failover`]),
    /// with each one's declared context window.
    #[must_use]
    pub(crate) fn with_targets(mut self, labels: Vec<String>, windows: Vec<Option<u64>>) -> Self {
        self.targets = Targets::new(labels, windows);
        if self.targets.len() > 1 {
            self.state.alternates_left = Some(self.targets.left());
        }
        self
    }

    /// The index of the target the next (or current) send goes to: 0 for
    /// the request's own, `i` for its alternate `i`.
    pub(crate) fn target(&self) -> usize {
        self.targets.current()
    }

    /// Moves the next send to the next target: the next one, or for a
    /// prompt too long for the current one, the next that may take it.
    fn switch_target(&mut self, now: Instant) {
        let reason = self
            .last_failure
            .as_deref()
            .map_or(FailureReason::Transient, |f| self.reason_for(f));
        let (from, to) = self.targets.switch(reason == FailureReason::ContextLength);
        self.state.target_sends = 0;
        if let Some(left) = self.state.alternates_left.as_mut() {
            *left = self.targets.left();
        }
        self.ledger
            .emit(now, EventKind::Failover { from, to, reason });
    }

    /// Uses a cross-request retry budget; this request deposits into it.
    #[must_use]
    pub(crate) fn with_retry_budget(mut self, budget: Arc<dyn BudgetStore>) -> Self {
        budget.deposit(self.state.started_at);
        self.retry_budget = Some(budget);
        self
    }

    /// Takes what the request declared of itself: an admission hook is
    /// installed, an outer layer already debited the first send
    /// (`prepaid`), an absolute deadline, replay turned off (the request
    /// body could not be buffered).
    pub(crate) fn declare(
        &mut self,
        admission_hook: bool,
        prepaid: bool,
        deadline: Option<Instant>,
        replay_disabled: Option<ReplayDisabled>,
    ) {
        self.state.admission_hook = admission_hook;
        self.prepaid = prepaid;
        self.state.deadline = deadline;
        self.state.replay_disabled = replay_disabled;
        if let Some(reason) = replay_disabled {
            self.ledger.replay_disabled(reason);
        }
    }

    /// Declares whether a resume strategy can continue the committed stream.
    pub(crate) fn set_resume_possible(&mut self, possible: bool) {
        self.state.resume_possible = possible;
    }

    /// The policy in force.
    pub(crate) fn policy(&self) -> &RecoveryPolicy {
        &self.policy
    }

    /// Whether the request has committed (output reached the consumer).
    pub(crate) fn is_committed(&self) -> bool {
        self.state.committed
    }

    /// The failure of the last attempt, once one failed.
    pub(crate) fn last_failure(&self) -> Option<&Failure> {
        self.last_failure.as_deref()
    }

    /// Ends the request with `outcome`, emitting its one terminal event
    /// (an interruption once output was observed, delivered or not).
    fn finish(&mut self, now: Instant, outcome: Outcome) -> Outcome {
        let after_output = self.state.committed || self.output_observed;
        self.ledger
            .finish(now, outcome, after_output, self.state.attempts_made)
    }

    /// Call after a resume's wait, before [`Course::begin_attempt`]: when
    /// the platform is offline, announces `parked_offline` and returns
    /// `true` (the driver waits for connectivity, then sends). A resume waits
    /// its backoff first and connectivity second (reliability matrix AD5).
    pub(crate) fn park_before_send(&mut self, now: Instant, online: bool) -> bool {
        if online || self.ledger.ended() || self.next != NextSend::Resume {
            return false;
        }
        self.ledger.emit(now, EventKind::ParkedOffline);
        true
    }

    /// A retry from the budget at `now`, when the request draws from one;
    /// `Err` when the budget has none left.
    fn permit(&self, now: Instant) -> Result<Option<RetryPermit>, ()> {
        match &self.retry_budget {
            Some(budget) => RetryPermit::take(Arc::clone(budget), now)
                .map(Some)
                .ok_or(()),
            None => Ok(None),
        }
    }

    /// The request's deadline, if it has one: the caller's or the
    /// policy's, whichever comes first.
    fn deadline(&self) -> Option<Instant> {
        [
            self.state.deadline,
            self.policy
                .deadline()
                .map(|d| self.state.started_at.saturating_add(d)),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// How long after the send about to go out (a resume when `resumed`) a
    /// hedge races it, when one may ([`Hedging::delay`]).
    pub(super) fn hedge_delay(&self, resumed: bool) -> Option<Duration> {
        self.hedging
            .delay(&self.policy, self.is_committed(), resumed)
    }

    /// The seat a hedge of the attempt in flight takes.
    pub(super) fn hedge_seat(&self) -> Seat {
        Seat::for_hedge(&self.targets, self.state.target_sends)
    }

    /// Takes `seat` as the course's, leaving the one it had there: the
    /// lanes of a race change places.
    pub(super) fn swap_seat(&mut self, seat: &mut Seat) {
        seat.swap(&mut self.targets, &mut self.state, &mut self.ledger);
    }

    /// Counts a hedge's send at `now`, when it may go before the deadline
    /// with a retry from the budget ([`Hedging::begin`]). `false`: nothing
    /// was counted and the attempt in flight goes on alone.
    pub(super) fn begin_hedge(&mut self, now: Instant, after: Duration) -> bool {
        if self.ledger.ended() || self.deadline().is_some_and(|d| now >= d) {
            return false;
        }
        let Ok(permit) = self.permit(now) else {
            return false;
        };
        self.hedging.begin(now, after, &mut self.ledger, permit)
    }

    /// The hedge counted by [`Course::begin_hedge`] goes out at `now`
    /// from the seat the course holds, racing the attempt in `raced`.
    pub(super) fn open_hedge(&mut self, now: Instant, raced: &Seat) {
        self.state.attempts_made += 1;
        self.state.target_sends += 1;
        self.state.attempts_left = self.ledger.sends_left();
        self.ledger
            .open_hedge(now, self.targets.label(), raced.slot());
    }

    /// Call immediately before every physical send. Rechecks the deadline,
    /// debits the allowance (unless an outer layer already paid the first),
    /// spends the retry permit, and emits `retry_started` /
    /// `resume_started` and `attempt_started`. Returns whether the send is
    /// a resume, or the outcome that ends the request instead of sending.
    pub(crate) fn begin_attempt(&mut self, now: Instant) -> Result<bool, Outcome> {
        if let Some(done) = self.ledger.outcome() {
            return Err(done.clone());
        }
        if self.next != NextSend::First && self.deadline().is_some_and(|d| now >= d) {
            return Err(self.finish(now, Outcome::DeadlineExceeded));
        }
        let prepaid = std::mem::take(&mut self.prepaid);
        if !self.ledger.debit(prepaid) {
            let attempts = self.state.attempts_made;
            return Err(self.finish(now, Outcome::Exhausted { attempts }));
        }
        match self.next {
            NextSend::First => {}
            NextSend::Retry => self.ledger.emit(now, EventKind::RetryStarted),
            NextSend::Resume => self.ledger.emit(now, EventKind::ResumeStarted),
        }
        let resume = self.next == NextSend::Resume;
        self.state.attempts_made += 1;
        self.state.target_sends += 1;
        self.state.attempts_left = self.ledger.sends_left();
        self.state.admission = None;
        if resume {
            self.state.resumes_made += 1;
        }
        let target = self.targets.label();
        self.ledger.open(now, resume, target);
        Ok(resume)
    }

    /// How long a wait (admission, parking) may last before the recovery
    /// budget or the deadline runs out, if either is set: pending is not
    /// approval.
    pub(crate) fn wait_limit(&self, now: Instant) -> Option<Duration> {
        let first_failure = self.state.first_failure_at.unwrap_or(now);
        let budget = self
            .policy
            .budget()
            .map(|b| first_failure.saturating_add(b));
        [budget, self.deadline()]
            .into_iter()
            .flatten()
            .min()
            .map(|end| end.saturating_since(now))
    }

    /// The decision on `failure` with `resume_possible` as given, before
    /// anything is recorded (asked before a continuation is prepared).
    fn would(
        &self,
        now: Instant,
        failure: &Failure,
        online: bool,
        resume_possible: bool,
    ) -> Action {
        let mut state = self.state.clone();
        state.resume_possible = resume_possible;
        state.attempts_left = self.ledger.sends_left();
        state.first_failure_at.get_or_insert(now);
        decide(DecisionInput {
            policy: &self.policy,
            state: &state,
            failure,
            online,
            now,
            jitter: Fraction::ZERO,
        })
    }

    /// Whether `failure` of the attempt in flight would be resumed if a
    /// resume were possible (asked before a continuation hook is called, so
    /// the hook is not asked for a failure that ends the request anyway).
    pub(crate) fn would_resume(&self, now: Instant, failure: &Failure, online: bool) -> bool {
        matches!(
            self.would(now, failure, online, true),
            Action::Resume { .. }
        )
    }

    /// A prefill continuation of the committed stream will answer
    /// `failure` (its resume was decided), sent to target `target`. Should
    /// the continuation end the request after all (the target refuses a
    /// prefill, or fails), the request fails with the interruption
    /// `failure` is: a target's refusal of a prefill says nothing about the
    /// answer the consumer holds.
    pub(crate) fn continue_by_prefill(
        &mut self,
        now: Instant,
        failure: &Failure,
        online: bool,
        target: usize,
    ) {
        if let Action::Fail(outcome) = self.would(now, failure, online, false) {
            self.continuing_from = Some(outcome);
        }
        if self.targets.go_to(target) {
            self.state.target_sends = 0;
        }
    }

    /// Before a send, a cooldown of `wait` is in force for the request's
    /// target (another request learned it): what the send does about it.
    /// A wait and a switch are announced; a refusal ends the request.
    pub(crate) fn hold_for_cooldown(
        &mut self,
        now: Instant,
        wait: Duration,
    ) -> Result<CooldownStep, Outcome> {
        match cooldown_hold(&self.policy, &self.state, now, wait) {
            CooldownHold::Wait(wait) => {
                self.ledger.delay(now, wait, DelayCause::Cooldown);
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

    /// The attempt in flight committed: its output now reaches the consumer
    /// and it can no longer be replayed.
    pub(crate) fn commit(&mut self, now: Instant, trigger: CommitTrigger) {
        if self.state.committed || self.ledger.ended() {
            return;
        }
        self.state.committed = true;
        let target = self.targets.label();
        self.ledger.commit(now, trigger, target);
    }

    /// The attempt in flight finished with success proof.
    pub(crate) fn succeed(
        &mut self,
        now: Instant,
        proof: Proof,
        progress: Progress,
        generation: Generation,
    ) -> Outcome {
        if let Some(done) = self.ledger.outcome() {
            return done.clone();
        }
        self.ledger.progress(progress);
        let target = self.targets.label();
        self.ledger.succeeded(now, proof, target, generation);
        self.finish(now, Outcome::Completed { proof })
    }

    fn reason_for(&self, failure: &Failure) -> FailureReason {
        crate::decision::reason(&self.policy, &self.state, failure)
    }

    /// The attempt in flight failed. Emits `attempt_failed`, decides, and
    /// returns what the driver does next (a terminal `Fail` has already
    /// emitted its terminal event).
    pub(crate) fn fail(&mut self, now: Instant, failure: Failure, online: bool) -> Action {
        if let Some(done) = self.ledger.outcome() {
            return Action::Fail(done.clone());
        }
        self.record_failure(now, &failure);
        self.output_observed |= failure.progress.blocks_replay();
        if failure.progress.blocks_replay() {
            self.state.committed |= failure.progress.semantic_delivered();
        }
        self.state.admission = None;
        self.last_failure = Some(Box::new(failure));
        self.decide_next(now, online)
    }

    /// An attempt of a hedging race failed while its rival runs on: its
    /// record closes (`attempt_failed`), and nothing is decided. Nothing
    /// it showed reached the consumer, and the rival is no replay of it.
    pub(super) fn lane_failed(&mut self, now: Instant, failure: &Failure) {
        if !self.ledger.ended() {
            self.record_failure(now, failure);
        }
    }

    /// Closes the record of the attempt in flight with `failure`.
    fn record_failure(&mut self, now: Instant, failure: &Failure) {
        let ending = Ending {
            category: failure.category(),
            phase: failure.phase,
            reason: self.reason_for(failure),
            status: failure.status,
            retry_after: failure.retry_after,
            acceptance: failure.acceptance,
            progress: failure.progress,
        };
        let stall = match failure.kind {
            FailureKind::Timeout { stall } => Some(stall),
            _ => None,
        };
        self.ledger.failed(now, &ending, stall);
        self.state.first_failure_at.get_or_insert(now);
    }

    /// The caps the answer about to be read is decoded under.
    pub(crate) fn limits(&self) -> crate::wire::Limits {
        crate::wire::Limits::uniform(self.policy.max_event_bytes())
    }

    /// The first-token timeout of the answer about to be read: none once
    /// committed (a resume continues an answer whose first token came).
    pub(crate) fn first_token_timeout(&self) -> Option<std::time::Duration> {
        self.policy
            .first_token_timeout()
            .filter(|_| !self.is_committed())
    }

    /// The admission hook answered.
    pub(crate) fn admission(
        &mut self,
        now: Instant,
        answer: AdmissionAnswer,
        online: bool,
    ) -> Action {
        if let Some(done) = self.ledger.outcome() {
            return Action::Fail(done.clone());
        }
        self.ledger.emit(
            now,
            match answer {
                AdmissionAnswer::Allow => EventKind::AdmissionAllowed,
                AdmissionAnswer::Reject => EventKind::AdmissionRejected,
                AdmissionAnswer::Unresolved => EventKind::AdmissionUnresolved,
            },
        );
        self.state.admission = Some(answer);
        self.decide_next(now, online)
    }

    /// The platform is online again after a park: decide again.
    pub(crate) fn online_again(&mut self, now: Instant) -> Action {
        if let Some(done) = self.ledger.outcome() {
            return Action::Fail(done.clone());
        }
        self.decide_next(now, true)
    }

    /// The caller cancelled in `phase`. An attempt in flight is recorded as
    /// failed (category cancellation) before the one `cancelled` event.
    pub(crate) fn cancel(&mut self, now: Instant, phase: CancelPhase) -> Outcome {
        if let Some(done) = self.ledger.outcome() {
            return done.clone();
        }
        self.cancel_lane(now, phase);
        self.finish(now, Outcome::Cancelled { phase })
    }

    /// The caller cancelled with the attempt in flight in `phase`: its
    /// record closes as cancelled (the other lane's of a race too).
    pub(super) fn cancel_lane(&mut self, now: Instant, phase: CancelPhase) {
        let wire_phase = match phase {
            CancelPhase::Sending => Phase::Sending,
            CancelPhase::AwaitingHead => Phase::AwaitingHeaders,
            _ => Phase::Streaming,
        };
        self.ledger.cancelled(now, wire_phase);
    }

    fn decide_next(&mut self, now: Instant, online: bool) -> Action {
        let Some(failure) = self.last_failure.as_deref() else {
            return Action::Fail(self.finish(
                now,
                Outcome::Exhausted {
                    attempts: self.state.attempts_made,
                },
            ));
        };
        self.state.attempts_left = self.ledger.sends_left();
        self.state.larger_window_left = self.targets.larger_window().is_some();
        let action = decide(DecisionInput {
            policy: &self.policy,
            state: &self.state,
            failure,
            online,
            now,
            jitter: self.jitter.draw(),
        });
        match action {
            Action::Fail(Outcome::AlternatesExhausted { attempts, .. }) => {
                let targets = self.targets.tried();
                let outcome = Outcome::AlternatesExhausted { attempts, targets };
                Action::Fail(self.finish(now, outcome))
            }
            Action::Fail(outcome) => {
                let resumed = (self.ledger.report().attempts.last()).is_some_and(|a| a.resume);
                let outcome = match &self.continuing_from {
                    Some(from) if resumed => from.clone(),
                    _ if resumed => outcome.of_a_resume(),
                    _ => outcome,
                };
                Action::Fail(self.finish(now, outcome))
            }
            Action::AskAdmission => {
                self.ledger.emit(now, EventKind::AdmissionPending);
                Action::AskAdmission
            }
            Action::ParkUntilOnline => {
                self.ledger.emit(now, EventKind::ParkedOffline);
                Action::ParkUntilOnline
            }
            Action::RetryAfter { .. } | Action::Resume { .. } | Action::Failover => {
                match self.permit(now) {
                    Ok(Some(permit)) => self.ledger.hold(permit),
                    Ok(None) => {}
                    Err(()) => {
                        let budget = BudgetKind::RetryTokens;
                        return Action::Fail(self.finish(now, Outcome::BudgetExhausted { budget }));
                    }
                }
                match action {
                    Action::RetryAfter { delay, cause } | Action::Resume { delay, cause } => {
                        self.next = if matches!(action, Action::Resume { .. }) {
                            NextSend::Resume
                        } else {
                            NextSend::Retry
                        };
                        self.ledger.delay(now, delay, cause);
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
