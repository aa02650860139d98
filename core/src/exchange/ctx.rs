//! What an attempt's inputs reach beyond the attempt: the course and its
//! books, the outbox, the timers, what the consumer has (for a
//! continuation) and the protocol the answer is read as. A lane hands it
//! to its attempt ([`super::lane::Lane::split`]).

use super::course::Course;
use super::outbox::Outbox;
use super::timers::{Timer, Timers};
use crate::continuation::DeliveredPrefix;
use crate::lifecycle::CommitTrigger;
use crate::protocol::ProtocolKind;
use crate::timing::Instant;

/// What an attempt's inputs reach beyond it: the course and its books, the
/// outbox, the timers, what the consumer has (for a continuation) and the
/// protocol the answer is read as.
pub(super) struct Ctx<'a, C> {
    pub(super) course: &'a mut Course,
    pub(super) outbox: &'a mut Outbox<C>,
    pub(super) timers: &'a mut Timers,
    pub(super) prefix: Option<&'a mut DeliveredPrefix>,
    pub(super) protocol: &'a ProtocolKind,
    /// A rival races the attempt: only a semantic fragment commits it.
    pub(super) racing: bool,
}

impl<C: AsRef<[u8]>> Ctx<'_, C> {
    /// The answer commits (once): the head goes to the caller, and the
    /// first token is no longer due.
    pub(super) fn commit(&mut self, now: Instant, trigger: CommitTrigger) {
        if !self.course.is_committed() {
            self.course.commit(now, trigger);
            self.outbox.respond();
        }
        self.timers.stop(Timer::FirstToken);
        self.timers.stop(Timer::Hedge);
    }
}
