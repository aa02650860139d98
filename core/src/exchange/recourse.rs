//! What follows a failed attempt: the course decides (retry after a wait,
//! fail over, park offline, ask the admission hook, continue a committed
//! answer, or fail), and the decision is carried out here on what the
//! request holds — the outbox, the timers, the resumption — ending in the
//! stage the request enters next.

use super::Stage;
use super::attempt::Attempt;
use super::course::Course;
use super::decoded::Decoded;
use super::io::AdmissionRequest;
use super::outbox::{Holds, Outbox};
use super::resumption::Resumption;
use super::route::Route;
use super::timers::{Timer, Timers};
use crate::decision::Action;
use crate::failure::{Failure, FailureKind, Phase};
use crate::outcome::Outcome;
use crate::protocol::ProtocolKind;
use crate::timing::Instant;

/// What a failure's recourse reaches: the request's parts it decides and
/// acts on, and the attempt that failed.
pub(super) struct Recourse<'a, C, D> {
    pub(super) course: &'a mut Course,
    pub(super) route: &'a Route,
    pub(super) resumption: Option<&'a mut Resumption>,
    pub(super) outbox: &'a mut Outbox<C>,
    pub(super) timers: &'a mut Timers,
    pub(super) attempt: &'a Attempt<D>,
    pub(super) protocol: &'a ProtocolKind,
}

impl<C: AsRef<[u8]>, D: Decoded> Recourse<'_, C, D> {
    /// Decides what follows the failed attempt, `online` as the platform
    /// says now. After commit the stream may be continued: natively, by the
    /// caller's hook (asked first), or by a declared prefill.
    pub(super) fn fail(mut self, now: Instant, online: bool, failure: Failure) -> Stage {
        if let Some(wait) = failure.retry_after.delay() {
            self.route.note_cooldown(now, wait);
        }
        if self.course.is_committed() {
            let cursor = self.attempt.cursor();
            let (route, protocol) = (self.route, self.protocol);
            let native = self.resumption.as_deref_mut().is_some_and(|r| {
                r.fold(cursor.as_ref());
                r.plan(protocol, route.background).is_some()
            });
            let hook = self.resumption.as_deref().is_some_and(|r| r.hook);
            let continued = !native
                && self.resumption.is_some()
                && self.course.would_resume(now, &failure, online);
            if continued && hook {
                self.timers.clear();
                let failure = Box::new(failure);
                return Stage::Continuation {
                    failure,
                    given: None,
                };
            }
            let prefilled = continued && self.prepare_prefill(now, &failure, online);
            self.course.set_resume_possible(native || prefilled);
        }
        let action = self.course.fail(now, failure, online);
        self.act(now, action)
    }

    /// A committed answer was cut and would be resumed: when a prefill can
    /// continue it (text only delivered, the serving target or the next one
    /// speaking the same protocol declares one), its body is written and
    /// the course told where it goes.
    fn prepare_prefill(&mut self, now: Instant, failure: &Failure, online: bool) -> bool {
        let serving = self.course.target();
        let (route, protocol) = (self.route, self.protocol);
        let target = self
            .resumption
            .as_deref_mut()
            .and_then(|r| r.prepare_prefill(serving, protocol, |i| route.speaks(i, protocol)));
        let Some(target) = target else {
            return false;
        };
        self.course
            .continue_by_prefill(now, failure, online, target);
        true
    }

    /// Carries out what the course decided. A final HTTP error response is
    /// kept through a park or an admission wait (it is the answer if no
    /// send follows), and released once one does.
    pub(super) fn act(mut self, now: Instant, action: Action) -> Stage {
        self.timers.clear();
        let keep = self.outbox.holds() == Holds::ErrorResponse && !self.outbox.responded();
        match action {
            Action::RetryAfter { delay, .. } | Action::Resume { delay, .. } => {
                self.timers.set(Timer::Wait, Some(now + delay));
                self.drop_attempt();
                let resume = matches!(action, Action::Resume { .. });
                Stage::Waiting { resume }
            }
            Action::Failover => {
                self.drop_attempt();
                Stage::ToSend { resume: false }
            }
            Action::ParkUntilOnline => {
                if !keep {
                    self.outbox.release();
                }
                self.park(now, false)
            }
            Action::AskAdmission => {
                let request = self.course.last_failure().cloned().map(|failure| {
                    Box::new(AdmissionRequest {
                        logical_id: self.course.ledger.logical_id().to_owned(),
                        next_attempt: self.course.ledger.wire_attempt() + 1,
                        failure,
                    })
                });
                let limit = self.course.wait_limit(now).map(|d| now + d);
                self.timers.set(Timer::Bound, limit);
                if !keep {
                    self.outbox.release();
                }
                Stage::Admission {
                    request,
                    answer: None,
                }
            }
            Action::Fail(outcome) if !keep && self.shows_stream_error() => {
                // A final in-stream error before commit is handed out as
                // the provider streamed it, through its error event, then
                // the request fails: a client's SDK raises the provider's
                // own error, with its type and message.
                self.outbox.release();
                self.outbox.respond();
                self.end(Err(outcome))
            }
            Action::Fail(outcome) => {
                // A final HTTP error is returned as that response.
                if !keep {
                    self.drop_attempt();
                }
                self.end(Err(outcome))
            }
        }
    }

    /// Parks offline until the recovery budget or the deadline;
    /// `then_send` when a resume is due as soon as it is back.
    pub(super) fn park(&mut self, now: Instant, then_send: bool) -> Stage {
        self.timers.clear();
        let limit = self.course.wait_limit(now).map(|d| now + d);
        self.timers.set(Timer::Bound, limit);
        Stage::Parked { then_send }
    }

    fn end(&mut self, result: Result<(), Outcome>) -> Stage {
        self.outbox.end();
        Stage::Ended(result)
    }

    /// Whether the attempt that failed streamed a provider's error event
    /// before commit, held here with what came before it.
    fn shows_stream_error(&self) -> bool {
        !self.outbox.responded()
            && self.attempt.gate.is_none()
            && !self.outbox.is_empty()
            && self.attempt.status.is_some_and(|s| (200..300).contains(&s))
            && self.course.last_failure().is_some_and(|f| {
                matches!(f.kind, FailureKind::Provider { .. }) && f.phase == Phase::Streaming
            })
    }

    /// The failed attempt's response is released, and what it held dropped.
    fn drop_attempt(&mut self) {
        self.outbox.set_holds(Holds::Answer);
        self.outbox.release();
        self.outbox.clear();
    }
}
