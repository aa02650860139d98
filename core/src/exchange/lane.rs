//! What one attempt holds as its own: the send and its answer, what it has
//! for the driver and the consumer, its timers, the protocol its answer is
//! read as, and how its stream could be continued once committed. A request
//! has one lane; while a hedge races it ([`super::race`]), two, and
//! whichever wins is the request's from then on. What an input does to an
//! attempt is done here, on its lane, with the course and the route it
//! reaches.

use std::time::SystemTime;

use super::attempt::{Attempt, Reading};
use super::course::Course;
use super::ctx::Ctx;
use super::decoded::Decoded;
use super::head::{self, Verdict};
use super::io::{Chunk, Head, Send};
use super::outbox::{Holds, Outbox};
use super::recourse::Recourse;
use super::resumption::{Continue, Resumption};
use super::route::Route;
use super::timers::{Timer, Timers};
use crate::failure::{Failure, FailureKind, Phase, Violation};
use crate::lifecycle::CommitTrigger;
use crate::progress::{Progress, Proof};
use crate::protocol::{BodyForm, ProtocolKind};
use crate::timing::Instant;

/// One attempt's own state. See the module docs.
#[derive(Debug)]
pub(super) struct Lane<C, D> {
    /// The attempt in flight (or the last one).
    pub(super) attempt: Attempt<D>,
    /// What is due to the driver and the consumer.
    pub(super) outbox: Outbox<C>,
    pub(super) timers: Timers,
    /// The protocol the answer is decoded as.
    pub(super) protocol: ProtocolKind,
    /// How a committed stream can be continued, when it can.
    pub(super) resumption: Option<Box<Resumption>>,
}

impl<C: AsRef<[u8]>, D: Decoded> Lane<C, D> {
    /// What the attempt's inputs reach beyond it (`racing`: a rival races
    /// it), and the attempt.
    pub(super) fn split<'a>(
        &'a mut self,
        course: &'a mut Course,
        racing: bool,
    ) -> (&'a mut Attempt<D>, Ctx<'a, C>) {
        let prefix = self
            .resumption
            .as_deref_mut()
            .and_then(|r| r.prefix.as_mut());
        let cx = Ctx {
            course,
            outbox: &mut self.outbox,
            timers: &mut self.timers,
            prefix,
            protocol: &self.protocol,
            racing,
        };
        (&mut self.attempt, cx)
    }

    /// What a failure's recourse reaches.
    pub(super) fn recourse<'a>(
        &'a mut self,
        course: &'a mut Course,
        route: &'a Route,
    ) -> Recourse<'a, C, D> {
        Recourse {
            course,
            route,
            resumption: self.resumption.as_deref_mut(),
            outbox: &mut self.outbox,
            timers: &mut self.timers,
            attempt: &self.attempt,
            protocol: &self.protocol,
        }
    }

    /// Reads the answer as `protocol` from now on: its decoder named it,
    /// or the request moved to a target that speaks it.
    #[cold]
    pub(super) fn adopt(&mut self, route: &Route, protocol: ProtocolKind) {
        Resumption::adopt(&mut self.resumption, route, &self.protocol, &protocol);
        self.protocol = protocol;
    }

    /// The attempt's response head arrived at `now` (`wall` on the wall
    /// clock), with the evidence of a decoder outside the machine if any:
    /// an error head's body is read next, an answer's body is read as its
    /// form. A hidden redirect fails the attempt: its failure, then.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn head<H: Head + ?Sized>(
        &mut self,
        now: Instant,
        wall: SystemTime,
        head: &H,
        decoded: Option<D>,
        course: &mut Course,
        route: &Route,
        racing: bool,
    ) -> Option<Failure> {
        let (verdict, seen) = head::judge(head, wall);
        course
            .ledger
            .head(now, seen.status, seen.request_id, seen.rate_limits);
        self.attempt.status = Some(seen.status);
        let form = match verdict {
            Verdict::Redirect(failure) => {
                self.outbox.set_holds(Holds::ErrorResponse);
                return Some(failure);
            }
            Verdict::Error(error) => {
                self.attempt.read_error(now, error, &mut self.timers);
                return None;
            }
            Verdict::Answer(form) => form,
        };
        // Not a generation: the machine's own pass-through reads it, not a
        // decoder of the protocol (`BodyForm::Opaque`).
        let (form, decoded) = if route.generation {
            (form, decoded)
        } else {
            (BodyForm::Opaque, None)
        };
        if let Some(kind) = decoded.as_ref().and_then(Decoded::protocol)
            && *kind != self.protocol
        {
            let kind = kind.clone();
            self.adopt(route, kind);
        }
        let next_gate = self.resumption.as_mut().and_then(|r| r.next_gate.take());
        let (first_token, limits) = (course.first_token_timeout(), course.limits());
        let (attempt, mut cx) = self.split(course, racing);
        let read = Reading {
            form,
            limits,
            first_token,
        };
        attempt.read_answer(now, read, decoded, next_gate, &mut cx);
        None
    }

    /// The attempt finished with success `proof`: the answer commits (if
    /// it had not), the gate's last event is queued, and the course records
    /// what was delivered.
    pub(super) fn complete(&mut self, now: Instant, proof: Proof, course: &mut Course) {
        let (_, mut cx) = self.split(course, false);
        cx.commit(now, CommitTrigger::Terminal);
        if let Some(rest) = self
            .attempt
            .gate
            .as_mut()
            .map(|g| g.rest())
            .filter(|b| !b.is_empty())
        {
            self.outbox.push(Chunk::Made(rest));
        }
        let delivered = self.outbox.delivered() + self.outbox.queued_bytes();
        let progress = self.attempt.progress_delivered(delivered);
        course.succeed(now, proof, progress, self.attempt.generation());
    }

    /// A send of this lane goes out at `now` (a resume of the committed
    /// stream when `resumed`): what the last attempt held is dropped, the
    /// head is due, and a hedge may be due to race it. The request it
    /// carries, or why none can: no way on was planned (`None`), or the
    /// resume planned cannot be written (the cursor does not fit a URL or
    /// header, the hook's continuation is gone: a protocol sequence error).
    pub(super) fn send(
        &mut self,
        now: Instant,
        resumed: bool,
        course: &mut Course,
        route: &Route,
    ) -> Result<Send, Option<Box<Failure>>> {
        self.outbox.new_attempt();
        let head_timeout = course.policy().head_bound(route.whole);
        self.attempt.send(now, head_timeout, &mut self.timers);
        // A hedge races for a first token; a request that is not a
        // generation has none, and sending it twice could do its work
        // twice (an upload).
        if route.generation
            && let Some(after) = course.hedge_delay(resumed)
        {
            self.timers.set(Timer::Hedge, Some(now + after));
        }
        if !resumed {
            if let Some(r) = self.resumption.as_mut() {
                r.next_gate = Some((None, None));
            }
            return Ok(Send::Original);
        }
        let r = self.resumption.as_deref_mut().ok_or(None)?;
        match r.next_send(route, &self.protocol) {
            Continue::Send(send, strategy) => {
                course.ledger.seam(strategy);
                Ok(send)
            }
            Continue::Impossible => {
                let violation = Violation::Sequence;
                let kind = FailureKind::Protocol { violation };
                Err(Some(Box::new(Failure::new(kind, Phase::Sending))))
            }
        }
    }

    /// What the attempt showed, as the consumer had it (once the head went
    /// out, delivered as far as handed out).
    pub(super) fn progress_shown(&self) -> Option<Progress> {
        let progress = self.attempt.progress()?;
        Some(if self.outbox.responded() {
            self.attempt.progress_delivered(self.outbox.delivered())
        } else {
            progress
        })
    }
}
