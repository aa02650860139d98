//! What a driver reads of the machine between its inputs: where the next
//! send goes and how its answer is read, the books, the policy, what is
//! held for the consumer, and when the machine must be woken.

use std::collections::VecDeque;

use super::Exchange;
use super::attempt::Phase as AttemptPhase;
use super::decoded::Decoded;
use super::io::{Chunk, Role};
use super::ledger::Ledger;
use super::outbox::Holds;
use super::race::Race;
use super::stage::Stage;
#[cfg(doc)]
use super::{Io, Setup};
use crate::continuation::DeliveredPrefix;
use crate::lifecycle::LifecycleEvent;
use crate::policy::RecoveryPolicy;
use crate::protocol::ProtocolKind;
use crate::timing::Instant;

impl<C: AsRef<[u8]>, D: Decoded> Exchange<C, D> {
    /// The target the current (or next) send goes to: 0 for the request as
    /// it was given, `i` for alternate `i` ([`Setup::alternates`]).
    pub fn target(&self) -> usize {
        self.course.target()
    }

    /// The protocol the answer is decoded as.
    pub fn protocol(&self) -> &ProtocolKind {
        &self.lane.protocol
    }

    /// The protocol the answer of `role`'s attempt is decoded as (a hedge
    /// to an alternate may speak another).
    pub fn protocol_of(&self, role: Role) -> &ProtocolKind {
        match (role, &self.race) {
            (Role::Hedge, Some(race)) => race.protocol(),
            _ => &self.lane.protocol,
        }
    }

    /// The request's books: its logical id, sends, report and outcome.
    pub fn ledger(&self) -> &Ledger {
        &self.course.ledger
    }

    /// The `Idempotency-Key` the send about to go out carries, when the
    /// policy asks for one and the request (`has_one`: it already has the
    /// header) does not bring its own: the driver sets it on each send (the
    /// original, a replay, a resume, a continuation). One key per logical
    /// request, so every send of it carries the same.
    pub fn idempotency_key(&self, has_one: bool) -> Option<String> {
        (!has_one && self.course.policy().idempotency_key()).then(|| {
            let mut key = String::from("recovery-");
            key.push_str(self.course.ledger.logical_id());
            key
        })
    }

    /// The policy in force.
    pub fn policy(&self) -> &RecoveryPolicy {
        self.course.policy()
    }

    /// Whether output has reached (or is queued for) the consumer.
    pub fn is_committed(&self) -> bool {
        self.course.is_committed()
    }

    /// Whether lifecycle events wait in [`Exchange::drain_events`] (a
    /// driver that crosses a boundary per call asks before draining).
    pub fn has_events(&self) -> bool {
        self.course.ledger.has_events()
    }

    /// Takes the lifecycle events produced since the last call, in order.
    pub fn drain_events(&mut self) -> std::vec::IntoIter<LifecycleEvent> {
        self.course.ledger.drain_events()
    }

    /// The last error body read (capped at the policy's evidence cap):
    /// sensitive evidence, for `inspect_*` only.
    pub fn error_body(&self) -> &[u8] {
        &self.lane.attempt.error_body
    }

    /// What the consumer has received, as the continuation hook is given
    /// it (present when a continuation may be asked for).
    pub fn delivered_prefix(&self) -> Option<&DeliveredPrefix> {
        self.lane
            .resumption
            .as_ref()
            .and_then(|r| r.prefix.as_ref())
    }

    /// The chunks held for the consumer, taken out (the final error
    /// response's first chunks, after [`Io::RespondError`]).
    pub fn take_held(&mut self) -> VecDeque<Chunk<C>> {
        self.lane.outbox.take()
    }

    /// Whether the head just received may become the final answer as the
    /// server sent it (an error head, before commit): a driver whose
    /// runtime can copy a body (a `Response.clone()`) reads the copy and
    /// keeps the original for [`Io::RespondError`].
    pub fn keeps_response(&self) -> bool {
        self.keeps_response_of(Role::First)
    }

    /// [`Exchange::keeps_response`] of the head `role`'s attempt just
    /// received. An error head in a race may be the answer too: its rival
    /// may leave the race before its body is judged.
    pub fn keeps_response_of(&self, role: Role) -> bool {
        if let (Role::Hedge, Some(race)) = (role, self.race.as_deref()) {
            return race.reads_error_body();
        }
        !self.lane.outbox.responded() && self.in_phase(|p| matches!(p, AttemptPhase::ErrorBody(_)))
            || matches!(self.stage, Stage::Ended(_)) && self.lane.outbox.error_response_due()
            // A redirect that fails the attempt is weighed at the next
            // poll; it may be the answer.
            || matches!(self.stage, Stage::Failed(_)) && self.lane.outbox.holds() == Holds::ErrorResponse
    }

    /// Whether the body streams the committed attempt with nothing queued,
    /// pending or gated: a driver may then read and hand out chunks through
    /// [`Exchange::on_chunk`] alone, without asking [`Exchange::poll`].
    #[inline]
    pub fn is_passing_through(&self) -> bool {
        self.lane.outbox.is_idle()
            && self.lane.attempt.gate.is_none()
            && self.in_phase(|p| matches!(p, AttemptPhase::Streaming | AttemptPhase::Draining))
    }

    /// When the driver must wake the machine ([`Exchange::handle_timeout`])
    /// if nothing else happens first: the earliest of its timers.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let first = self.lane.timers.next();
        match self.race.as_deref().and_then(Race::next_timeout) {
            Some(hedge) => Some(first.map_or(hedge, |f| f.min(hedge))),
            None => first,
        }
    }
}
