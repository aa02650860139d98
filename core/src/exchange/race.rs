//! Hedging the first token: a second attempt races one that has shown no
//! semantic fragment for the policy's `hedge_after`, before commit. Both
//! run; the first semantic fragment decides the race, and the other
//! attempt is released at once. An error, a keepalive, a role-only chunk or
//! a terminal with no output never wins: an attempt that fails, ends empty
//! or holds back past the cap while its rival runs leaves the race (its
//! record says how), and the rival goes on as the request's one attempt,
//! decided as it would be alone.
//!
//! The machine judges one lane at a time. The race keeps the other lane
//! ([`Lane`]: its attempt, the chunks it holds back, its timers, the
//! protocol it is read as, its ways on) and its seat in the course (its
//! target and its record); the lanes change places while the other's
//! inputs are judged, so every rule of one attempt applies to either
//! unchanged. Whichever wins ends in the first lane's place; the driver
//! learns of it as [`Io::Promote`](super::Io::Promote).

use std::mem;

use super::attempt::Attempt;
use super::course::Course;
use super::decoded::Decoded;
use super::hedging::Seat;
use super::lane::Lane;
use super::outbox::Outbox;
use super::resumption::Resumption;
use super::route::Route;
use super::timers::{Timer, Timers};
use crate::failure::Failure;
use crate::report::HedgeCancel;
use crate::timing::Instant;

/// A race in progress. See the module docs.
#[derive(Debug)]
pub(super) struct Race<C, D> {
    /// The lane not being judged: the hedge's while the first is, the
    /// first's while the hedge is.
    lane: Lane<C, D>,
    /// Its seat in the course.
    seat: Seat,
    /// The hedge's send is due and the driver has not been told yet.
    due: bool,
    /// How the lane being judged left the race, when it did.
    left: Option<Left>,
}

/// How a lane left the race.
#[derive(Debug)]
pub(super) enum Left {
    /// It failed.
    Failed(Box<Failure>),
    /// It could not win.
    Cancelled(HedgeCancel),
}

impl<C: AsRef<[u8]>, D: Decoded> Race<C, D> {
    /// Starts a hedge of the attempt in `lane` at `now`, when it may go:
    /// its target's cooldown is not in force, and the course counts its
    /// send (deadline, retry budget, allowance). The hedge is sent from a
    /// lane of its own; `None` leaves the attempt in flight alone.
    pub(super) fn start(
        now: Instant,
        lane: &mut Lane<C, D>,
        course: &mut Course,
        route: &mut Route,
    ) -> Option<Box<Self>> {
        let after = course.hedge_delay(false)?;
        let seat = course.hedge_seat();
        let protocol = route
            .protocol_of(seat.target())
            .unwrap_or(&lane.protocol)
            .clone();
        let policy = course.policy();
        let hedge = Lane {
            attempt: Attempt::new(),
            outbox: Outbox::new(),
            timers: Timers::new(policy.idle_timeout(), policy.progress_timeout(), now),
            resumption: lane.resumption.as_ref().map(|r| r.for_lane(&protocol)),
            protocol,
        };
        let mut race = Box::new(Race {
            lane: hedge,
            seat,
            due: true,
            left: None,
        });
        race.swap(lane, course, route);
        let cooling = route.cooldown(now).is_some();
        race.swap(lane, course, route);
        if cooling || !course.begin_hedge(now, after) {
            return None;
        }
        race.swap(lane, course, route);
        let protocol = lane.protocol.clone();
        Resumption::adopt(&mut lane.resumption, route, &protocol, &protocol);
        course.open_hedge(now, &race.seat);
        let head_timeout = course.policy().head_bound(route.whole);
        lane.attempt.send(now, head_timeout, &mut lane.timers);
        race.swap(lane, course, route);
        Some(race)
    }

    /// The lanes change places: the machine judges the other one.
    pub(super) fn swap(&mut self, lane: &mut Lane<C, D>, course: &mut Course, route: &mut Route) {
        mem::swap(lane, &mut self.lane);
        course.swap_seat(&mut self.seat);
        // Each lane's protocol travels with it.
        let _ = route.adopt(course.target());
    }

    /// The protocol the answer of the lane not being judged is read as.
    pub(super) fn protocol(&self) -> &crate::protocol::ProtocolKind {
        &self.lane.protocol
    }

    /// Whether the lane not being judged reads an error body.
    pub(super) fn reads_error_body(&self) -> bool {
        matches!(self.lane.attempt.phase, super::attempt::Phase::ErrorBody(_))
    }

    /// The hedge's send, once: the target it goes to.
    pub(super) fn take_due(&mut self) -> Option<usize> {
        mem::take(&mut self.due).then(|| self.seat.target())
    }

    /// The lane being judged leaves the race, as `left` says; its timers
    /// stop.
    pub(super) fn leave(&mut self, left: Left, lane: &mut Lane<C, D>) {
        lane.timers.clear();
        self.left = Some(left);
    }

    /// The earliest deadline of the lane not being judged.
    pub(super) fn next_timeout(&self) -> Option<Instant> {
        self.lane.timers.next()
    }

    /// After an input of the lane judged in `lane` (the hedge's when
    /// `hedge`): `true` when the race is over, with the winner or the lane
    /// left in `lane`. A lane that committed won, and the other is
    /// cancelled; a lane that left gives the race to the other, which may
    /// be raced again later.
    pub(super) fn settle(
        &mut self,
        now: Instant,
        hedge: bool,
        lane: &mut Lane<C, D>,
        course: &mut Course,
        route: &mut Route,
    ) -> bool {
        if course.is_committed() {
            self.swap(lane, course, route);
            course.ledger.hedge_cancelled(now, HedgeCancel::RivalWon);
            self.swap(lane, course, route);
            Self::handover(hedge, lane);
            return true;
        }
        let Some(left) = self.left.take() else {
            if hedge {
                self.swap(lane, course, route);
            }
            return false;
        };
        match left {
            Left::Failed(failure) => {
                if let Some(wait) = failure.retry_after.delay() {
                    route.note_cooldown(now, wait);
                }
                course.lane_failed(now, &failure);
            }
            Left::Cancelled(reason) => course.ledger.hedge_cancelled(now, reason),
        }
        self.swap(lane, course, route);
        Self::handover(!hedge, lane);
        if let Some(after) = course.hedge_delay(false)
            && lane.attempt.may_be_raced()
        {
            lane.timers.set(Timer::Hedge, Some(now + after));
        }
        true
    }

    /// The race is over with `lane` the request's: the other's response
    /// is closed, and when the hedge is the one that stays, it takes the
    /// first's place.
    fn handover(hedge_stays: bool, lane: &mut Lane<C, D>) {
        if hedge_stays {
            lane.outbox.promote();
        } else {
            lane.outbox.release_hedge();
        }
    }

    /// The caller cancelled during the race: the hedge's record closes as
    /// cancelled, in the phase it was in, and its response is closed; the
    /// first lane's cancellation follows as a request's does.
    pub(super) fn cancel(
        mut self,
        now: Instant,
        lane: &mut Lane<C, D>,
        course: &mut Course,
        route: &mut Route,
    ) {
        self.swap(lane, course, route);
        if let Some(phase) = super::Stage::InFlight.cancel_phase(&lane.attempt.phase, true) {
            course.cancel_lane(now, phase);
        }
        self.swap(lane, course, route);
        lane.outbox.release_hedge();
    }
}
