//! The request's books: the sends it may still make (the attempt
//! allowance, shared with nested layers), the retry permit it holds, the
//! lifecycle events it emitted, its report and its one outcome. The course
//! ([`super::course`]) decides; the ledger records, in the canonical order,
//! and a driver reads it ([`Exchange::ledger`](super::Exchange::ledger)).

use std::time::Duration;

use crate::budget::{AttemptAllowance, RetryPermit};
use crate::failure::{Acceptance, Category, Phase, Stall};
use crate::lifecycle::{CommitTrigger, EventKind, Identity, LifecycleEvent};
use crate::outcome::{FailureReason, Outcome};
use crate::progress::{Generation, Progress, Proof};
use crate::report::{
    AttemptRecord, AttemptResult, DelayRecord, HedgeCancel, RecoveryReport, Role, Seam,
    SeamStrategy,
};
use crate::retry_after::RetryAfter;
use crate::safe::{RateLimits, SafeToken};
use crate::timing::Instant;

/// Formats a logical id the way events and reports show it.
pub(super) fn format_logical_id(id: u64) -> String {
    let mut s = String::with_capacity(16);
    crate::text::push_hex16(&mut s, id);
    s
}

/// The request's books. See the module docs.
#[derive(Debug)]
pub struct Ledger {
    logical_id: String,
    started_at: Instant,
    allowance: AttemptAllowance,
    permit: Option<RetryPermit>,
    events: Vec<LifecycleEvent>,
    report: RecoveryReport,
    outcome: Option<Outcome>,
    /// Sends made so far.
    sends: u32,
    /// The record the attempt in flight writes to, and the send events
    /// name.
    slot: Slot,
}

/// The record an attempt writes to (while it runs) and the send the
/// events of its lane name: one per lane of a hedging race, swapped with
/// the lanes ([`Ledger::swap_slot`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Slot {
    /// The index of its open record in the report.
    open: Option<usize>,
    /// Its send number (the last one, once its record closed).
    naming: u32,
}

/// How an attempt failed, as its record keeps it.
pub(crate) struct Ending {
    pub(crate) category: Category,
    pub(crate) phase: Phase,
    pub(crate) reason: FailureReason,
    pub(crate) status: Option<u16>,
    pub(crate) retry_after: RetryAfter,
    pub(crate) acceptance: Acceptance,
    pub(crate) progress: Progress,
}

impl Ledger {
    pub(crate) fn new(logical_id: u64, allowance: AttemptAllowance, now: Instant) -> Self {
        let logical_id = format_logical_id(logical_id);
        Ledger {
            report: RecoveryReport::new(logical_id.clone()),
            logical_id,
            started_at: now,
            allowance,
            permit: None,
            events: Vec::new(),
            outcome: None,
            sends: 0,
            slot: Slot::default(),
        }
    }

    /// The logical id, as events show it.
    pub fn logical_id(&self) -> &str {
        &self.logical_id
    }

    /// The report so far.
    pub fn report(&self) -> &RecoveryReport {
        &self.report
    }

    /// The outcome, once the request ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// The current physical send number (0 before the first).
    pub fn wire_attempt(&self) -> u32 {
        self.sends
    }

    /// Sends still allowed (shared with nested layers).
    pub(crate) fn sends_left(&self) -> u32 {
        self.allowance.remaining()
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Takes the events with their buffer: a request emits a few at a
    /// time, then may stream for minutes, and a buffer kept empty for
    /// that long is memory every held stream pays for nothing.
    pub(crate) fn drain_events(&mut self) -> std::vec::IntoIter<LifecycleEvent> {
        std::mem::take(&mut self.events).into_iter()
    }

    pub(crate) fn ended(&self) -> bool {
        self.outcome.is_some()
    }

    pub(crate) fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_since(self.started_at)
    }

    /// Emits `kind` at `now`, naming the send in flight.
    pub(crate) fn emit(&mut self, now: Instant, kind: EventKind) {
        let n = self.slot.naming;
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
        self.slot.open.and_then(|i| self.report.attempts.get_mut(i))
    }

    /// Takes `slot` as the one the attempt in flight writes to, leaving
    /// the one it had there (the lanes of a race change places).
    pub(crate) fn swap_slot(&mut self, slot: &mut Slot) {
        std::mem::swap(&mut self.slot, slot);
    }

    /// Marks the record `slot` writes to (if open) as `role` in a race,
    /// unless it was already in one.
    fn mark(&mut self, slot: Slot, role: Role) {
        if let Some(rec) = slot.open.and_then(|i| self.report.attempts.get_mut(i)) {
            rec.role.get_or_insert(role);
        }
    }

    /// Debits a send from the allowance (unless an outer layer did:
    /// `prepaid`) and spends the permit held for it; `false` when none is
    /// left.
    pub(crate) fn debit(&mut self, prepaid: bool) -> bool {
        if !prepaid && !self.allowance.try_debit() {
            return false;
        }
        if let Some(permit) = self.permit.take() {
            permit.spend();
        }
        true
    }

    /// Holds `permit` for the next send (dropped, so refunded, if the
    /// request ends first).
    pub(crate) fn hold(&mut self, permit: RetryPermit) {
        self.permit = Some(permit);
    }

    /// Debits a hedge's send from the allowance; `false` when none is left.
    pub(crate) fn debit_hedge(&mut self) -> bool {
        self.allowance.try_debit()
    }

    /// Opens the record of a send to `target`; emits `attempt_started`.
    pub(crate) fn open(&mut self, now: Instant, resume: bool, target: Option<String>) -> u32 {
        self.sends += 1;
        if resume {
            self.report.resumes += 1;
        }
        if self.sends > 1 {
            self.report.resend_count += 1;
        }
        let n = self.sends;
        if self.report.attempts.capacity() == 0 {
            // Most requests make one send: room for one record (a first
            // push would make room for four, a kilobyte per request).
            self.report.attempts.reserve_exact(1);
        }
        self.report.attempts.push(AttemptRecord {
            wire_attempt: n,
            resume,
            started_ms: self.elapsed(now),
            ended_ms: None,
            status: None,
            result: AttemptResult::InProgress,
            acceptance: None,
            retry_after: RetryAfter::Absent,
            progress: Progress::default(),
            request_id: None,
            rate_limits: None,
            target: target.clone(),
            role: None,
        });
        self.slot = Slot {
            open: Some(self.report.attempts.len() - 1),
            naming: n,
        };
        let max_attempts = self.allowance.total();
        self.emit(
            now,
            EventKind::AttemptStarted {
                max_attempts,
                resume,
                target,
            },
        );
        n
    }

    /// Opens the record of a hedge to `target` racing the attempt whose
    /// record `raced` holds, and marks both in the race; emits
    /// `attempt_started`.
    pub(crate) fn open_hedge(&mut self, now: Instant, target: Option<String>, raced: Slot) {
        self.open(now, false, target);
        self.mark(raced, Role::First);
        self.mark(self.slot, Role::Hedge);
    }

    /// Records the response head of the send in flight.
    pub(crate) fn head(
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

    /// Records the commit of the send in flight, served by `target`.
    pub(crate) fn commit(&mut self, now: Instant, trigger: CommitTrigger, target: Option<String>) {
        self.report.committed_attempt = Some(self.slot.naming);
        self.report.served_by = target;
        if trigger == CommitTrigger::Semantic
            && self.report.metrics.time_to_first_semantic_ms.is_none()
        {
            self.report.metrics.time_to_first_semantic_ms =
                Some(self.elapsed(now).as_millis() as u64);
        }
        let role = self.current().and_then(|r| r.role);
        self.emit(now, EventKind::Committed { trigger, role });
    }

    /// Updates the progress of the send in flight.
    pub(crate) fn progress(&mut self, progress: Progress) {
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

    /// Closes the record of the send in flight with success `proof`.
    pub(crate) fn succeeded(
        &mut self,
        now: Instant,
        proof: Proof,
        served_by: Option<String>,
        generation: Generation,
    ) {
        let at = self.elapsed(now).as_millis() as u64;
        if let Some(rec) = self.current() {
            rec.ended_ms = Some(at);
            rec.result = AttemptResult::Succeeded { proof };
        }
        self.slot.open = None;
        self.report.served_by = served_by;
        self.report.generation = generation;
        self.emit(now, EventKind::AttemptSucceeded { proof });
    }

    /// Closes the record of the send in flight as failed; emits
    /// `attempt_failed` (with the watchdog that fired, if one did).
    pub(crate) fn failed(&mut self, now: Instant, ending: &Ending, stall: Option<Stall>) {
        let at = self.elapsed(now).as_millis() as u64;
        if let Some(rec) = self.current() {
            rec.ended_ms = Some(at);
            if ending.status.is_some() {
                rec.status = ending.status;
            }
            rec.retry_after = ending.retry_after;
            let headers = rec.progress.headers_received;
            rec.progress = ending.progress;
            rec.progress.headers_received |= headers || ending.status.is_some();
            rec.result = AttemptResult::Failed {
                category: ending.category,
                phase: ending.phase,
                reason: ending.reason,
            };
            rec.acceptance = Some(ending.acceptance);
        }
        self.slot.open = None;
        self.emit(
            now,
            EventKind::AttemptFailed {
                category: ending.category,
                phase: ending.phase,
                reason: ending.reason,
                status: ending.status,
                stall,
            },
        );
    }

    /// The caller cancelled while a send was in flight (`phase` on the
    /// wire): its record closes as cancelled.
    pub(crate) fn cancelled(&mut self, now: Instant, phase: Phase) {
        let at = self.elapsed(now).as_millis() as u64;
        let reason = FailureReason::Cancelled;
        let category = Category::Cancellation;
        let Some(rec) = self.current() else {
            return;
        };
        rec.ended_ms = Some(at);
        rec.result = AttemptResult::Failed {
            category,
            phase,
            reason,
        };
        let status = rec.status;
        self.slot.open = None;
        self.emit(
            now,
            EventKind::AttemptFailed {
                category,
                phase,
                reason,
                status,
                stall: None,
            },
        );
    }

    /// The attempt in flight left a hedging race without failing: its
    /// record closes as cancelled for `reason`; emits `hedge_cancelled`.
    pub(crate) fn hedge_cancelled(&mut self, now: Instant, reason: HedgeCancel) {
        let at = self.elapsed(now).as_millis() as u64;
        let mut role = Role::First;
        if let Some(rec) = self.current() {
            rec.ended_ms = Some(at);
            rec.result = AttemptResult::HedgeCancelled { reason };
            role = rec.role.unwrap_or(Role::First);
        }
        self.slot.open = None;
        self.emit(now, EventKind::HedgeCancelled { role, reason });
    }

    /// Records a wait after the current send.
    pub(crate) fn delay(
        &mut self,
        now: Instant,
        delay: Duration,
        cause: crate::decision::DelayCause,
    ) {
        self.report.delays.push(DelayRecord {
            after_attempt: self.slot.naming,
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

    /// Records the seam of the resume in flight.
    pub(crate) fn seam(&mut self, strategy: SeamStrategy) {
        let delivered_bytes = self
            .report
            .attempts
            .iter()
            .map(|a| a.progress.delivered_bytes)
            .sum();
        self.report.seams.push(Seam {
            attempt: self.slot.naming,
            strategy,
            delivered_bytes,
        });
    }

    /// A transport error arrived after terminal proof: the outcome stands.
    pub(crate) fn late_error(&mut self) {
        self.report.late_error = true;
    }

    /// Replay is off for this request.
    pub(crate) fn replay_disabled(&mut self, reason: crate::outcome::ReplayDisabled) {
        self.report.replay_disabled = Some(reason);
    }

    /// Ends the request with `outcome` after `attempts` sends, emitting its
    /// one terminal event: `completed`, `cancelled`, `interrupted` (once
    /// output was observed, `after_output`, even if not yet delivered: the
    /// request did not fail "before commit", G1) or `exhausted` (after an
    /// `admission_required` when that is why). An outcome already reached
    /// stands.
    pub(crate) fn finish(
        &mut self,
        now: Instant,
        outcome: Outcome,
        after_output: bool,
        attempts: u32,
    ) -> Outcome {
        if let Some(done) = &self.outcome {
            return done.clone();
        }
        let kind = match &outcome {
            Outcome::Completed { proof } => EventKind::Completed {
                proof: *proof,
                attempts,
            },
            Outcome::Cancelled { phase } => EventKind::Cancelled {
                phase: *phase,
                attempts,
            },
            other if after_output || matches!(other, Outcome::Interrupted { .. }) => {
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
        self.close(now, outcome, kind)
    }

    /// Ends the request with `outcome` and its one terminal event `kind`
    /// (an outcome already reached stands).
    fn close(&mut self, now: Instant, outcome: Outcome, kind: EventKind) -> Outcome {
        if let Some(done) = &self.outcome {
            return done.clone();
        }
        self.permit = None;
        self.emit(now, kind);
        self.report.outcome = Some(outcome.clone());
        self.report.metrics.total_ms = Some(self.elapsed(now).as_millis() as u64);
        self.outcome = Some(outcome.clone());
        outcome
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn drained_events_take_their_buffer_with_them() {
        let now = Instant::from_origin(Duration::ZERO);
        let mut ledger = Ledger::new(7, AttemptAllowance::new(3), now);
        ledger.open(now, false, None);
        assert!(ledger.has_events());
        let drained: Vec<_> = ledger.drain_events().collect();
        assert_eq!(drained.len(), 1);
        assert!(!ledger.has_events());
        // A held stream keeps its ledger for minutes: no room kept.
        assert_eq!(ledger.events.capacity(), 0);
    }
}
