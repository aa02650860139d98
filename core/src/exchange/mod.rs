//! The sans-IO machine of one logical request: every attempt's head, chunk,
//! end, read error, consumer drop, cancellation and timer goes in; what the
//! driver does next comes out. Every driver runs this one machine, so the
//! same evidence gives the same decision whatever the runtime.
//!
//! A driver only does I/O. It asks [`Exchange::poll`] what to do ([`Io`]),
//! does it, and reports what happened: [`Exchange::on_sent`],
//! [`Exchange::on_head`], [`Exchange::on_chunk`], [`Exchange::on_end`],
//! [`Exchange::on_error`], [`Exchange::admission`], [`Exchange::online`],
//! [`Exchange::continuation`], [`Exchange::cancel`]. Each input carries
//! `now`; [`Exchange::poll`] carries connectivity too, and every decision
//! that depends on it is taken there. Time leaves the machine as a deadline
//! ([`Exchange::poll_timeout`], in the manner of quinn-proto): the driver
//! keeps one sleep, and when it wakes calls [`Exchange::handle_timeout`].
//! Lifecycle events come out of [`Exchange::drain_events`]. [`Io`] shows a
//! request from its send to its first delivered chunk.
//!
//! What is decided here, once: the commit trigger (first semantic fragment,
//! hold-back cap, terminal proof), the end-of-body rule (proof or a typed
//! failure), the unfinished-frame rule, error heads (`Retry-After` in every
//! form against the injected wall clock, `retry-after-ms`,
//! `x-should-retry`, the capped error body), the content-type rule, the
//! protocol default, the stall and head timers, the resume gate
//! (event-granular delivery, duplicate dropping, continuation splice), and
//! that nothing after terminal proof changes a completed outcome.

mod attempt;
pub mod codes;
pub(crate) mod course;
mod ctx;
mod decoded;
mod gate;
mod head;
mod hedging;
mod io;
mod lane;
mod ledger;
mod outbox;
mod race;
mod recourse;
mod resumption;
mod route;
mod setup;
mod stage;
mod targets;
mod timers;
mod view;

pub use crate::decision::AdmissionAnswer;
pub use decoded::{Decoded, SelfDecoded};
pub use io::{AdmissionRequest, Chunk, Head, Io, RequestFacts, Role, Send};
pub use ledger::Ledger;
pub use setup::Setup;
pub use timers::{CHECKS_PER_TIMEOUT, DRAIN_GRACE};

use crate::budget::AttemptAllowance;
use crate::decision::Action;
use crate::failure::Failure;
use crate::lifecycle::CommitTrigger;
use crate::outcome::Outcome;
use crate::policy::RecoveryPolicy;
use crate::progress::Proof;
use crate::protocol::ProtocolChoice;
use crate::report::HedgeCancel;
use crate::timing::Instant;
use attempt::{Phase as AttemptPhase, Step};
use course::{CooldownStep, Course};
use lane::Lane;
use outbox::{Due, Holds};
use race::{Left, Race};
use route::Route;
use stage::{Pending, Stage};
use std::time::SystemTime;
use timers::Timer;

/// The machine of one logical request. See the module docs.
///
/// `C` is the driver's chunk type; `D` the evidence of a decoder outside
/// the machine, when the driver has one ([`SelfDecoded`] when not).
#[derive(Debug)]
pub struct Exchange<C, D = SelfDecoded> {
    /// The request's course over its sends, and its books.
    course: Course,
    stage: Stage,
    /// Where the request is sent.
    route: Route,
    /// The attempt in flight (or the last one), and what is its own.
    lane: Lane<C, D>,
    /// A hedge racing it, before commit.
    race: Option<Box<Race<C, D>>>,
}

impl<C: AsRef<[u8]>, D: Decoded> Exchange<C, D> {
    /// Starts a logical request at `now` with nothing more declared: its
    /// answer is decoded as `protocol` resolves for its URL, and its sends
    /// are drawn from `allowance` (shared with any nested layer). A driver
    /// that declares more starts it from a [`Setup`].
    pub fn new(
        policy: RecoveryPolicy,
        protocol: &ProtocolChoice,
        request: RequestFacts<'_>,
        allowance: AttemptAllowance,
        logical_id: u64,
        now: Instant,
    ) -> Self {
        Setup::new(policy, protocol, request, allowance, logical_id).start(now)
    }

    /// Whether an attempt is in flight in a phase `is` says yes to.
    fn in_phase(&self, is: impl Fn(&AttemptPhase) -> bool) -> bool {
        matches!(self.stage, Stage::InFlight) && is(&self.lane.attempt.phase)
    }

    /// What the driver does next, `online` saying whether the platform
    /// believes it is online. Call again after every reported event.
    pub fn poll(&mut self, now: Instant, online: bool) -> Io<C> {
        loop {
            self.decide(now, online);
            if let Some(due) = self.lane.outbox.next_due() {
                return match due {
                    Due::Release => Io::Release,
                    Due::Respond => Io::Respond,
                    Due::RespondError => Io::RespondError,
                    Due::ReleaseHedge => Io::ReleaseHedge,
                    Due::Promote => Io::Promote,
                };
            }
            if let Some((chunk, last)) = self.lane.outbox.next_chunk() {
                if last {
                    self.settle_if_proven(now);
                }
                return Io::Deliver(chunk);
            }
            if let Some(failure) = self.lane.outbox.take_deferred() {
                self.fail_attempt(now, online, failure);
                continue;
            }
            return match &mut self.stage {
                Stage::ToSend { .. } => match self.begin_send(now, online) {
                    Some(io) => io,
                    None => continue,
                },
                Stage::InFlight => match self.race.as_deref_mut() {
                    Some(race) => race
                        .take_due()
                        .map_or(Io::Race, |target| Io::Hedge { target }),
                    None if self.lane.attempt.awaits_head() => Io::AwaitHead,
                    None => Io::Read,
                },
                Stage::Waiting { .. } => Io::Sleep,
                Stage::Parked { .. } => Io::WaitOnline,
                Stage::Admission { request, .. } => match request.take() {
                    Some(r) => Io::AskAdmission(*r),
                    None => Io::AwaitAdmission,
                },
                Stage::Continuation { .. } => Io::AskContinuation,
                Stage::Ended(result) => Io::End(result.clone()),
                Stage::Failed(_) => continue,
            };
        }
    }

    /// Decides what waited for connectivity: a failure, an admission
    /// answer, a continuation hook's answer.
    fn decide(&mut self, now: Instant, online: bool) {
        let action = match self.stage.take_pending() {
            None => return,
            Some(Pending::Failure(failure)) => return self.fail_attempt(now, online, *failure),
            Some(Pending::Admission(answer)) => self.course.admission(now, answer, online),
            Some(Pending::Continuation(failure, given)) => {
                if let Some(r) = self.lane.resumption.as_mut() {
                    r.continuation_ready = given;
                }
                self.course.set_resume_possible(given);
                self.course.fail(now, *failure, online)
            }
        };
        self.act(now, action);
    }

    /// Enters `stage`, its timers stopped: it arms its own.
    fn enter(&mut self, stage: Stage) {
        self.lane.timers.clear();
        self.stage = stage;
    }

    /// Carries out what an attempt's input means for the request. In a
    /// race, an attempt that fails or cannot win leaves it instead.
    fn step(&mut self, now: Instant, step: Step<C>) -> Option<C> {
        if let Some(race) = self.race.as_deref_mut() {
            let left = match step {
                Step::Failed(failure) => Left::Failed(Box::new(failure)),
                Step::Proven(_) if !self.course.is_committed() => {
                    Left::Cancelled(HedgeCancel::EndedEmpty)
                }
                Step::Unfit(CommitTrigger::HoldbackCap) => {
                    Left::Cancelled(HedgeCancel::HoldbackCap)
                }
                Step::Unfit(_) => Left::Cancelled(HedgeCancel::EndedEmpty),
                step => return self.step_alone(now, step),
            };
            race.leave(left, &mut self.lane);
            return None;
        }
        self.step_alone(now, step)
    }

    /// An input's step for the request's one attempt.
    fn step_alone(&mut self, now: Instant, step: Step<C>) -> Option<C> {
        match step {
            Step::Quiet | Step::Unfit(_) => None,
            Step::Pass(chunk) => {
                self.settle_if_proven(now);
                Some(chunk)
            }
            Step::Failed(failure) => {
                self.attempt_failed(failure);
                None
            }
            Step::Proven(proof) => {
                self.complete(now, proof);
                None
            }
            Step::Drained => {
                self.enter(Stage::Ended(Ok(())));
                None
            }
        }
    }

    /// The send is due: counts it (allowance, deadline, retry permit) and
    /// says which request to send, or ends the request.
    fn begin_send(&mut self, now: Instant, online: bool) -> Option<Io<C>> {
        if matches!(self.stage, Stage::ToSend { resume: true })
            && self.course.park_before_send(now, online)
        {
            self.stage = self
                .lane
                .recourse(&mut self.course, &self.route)
                .park(now, true);
            return None;
        }
        if let Some(protocol) = self.route.adopt(self.course.target()) {
            self.lane.adopt(&self.route, protocol);
        }
        if !self.course.is_committed()
            && let Some(wait) = self.route.cooldown(now)
        {
            match self.course.hold_for_cooldown(now, wait) {
                Ok(CooldownStep::Wait(wait)) => {
                    self.enter(Stage::Waiting { resume: false });
                    self.lane.timers.set(Timer::Wait, Some(now + wait));
                    return None;
                }
                // Decided again for the next target, on the next turn.
                Ok(CooldownStep::Switched) => return None,
                Ok(CooldownStep::Send) => {}
                Err(outcome) => {
                    self.end(Err(outcome));
                    return None;
                }
            }
        }
        let resumed = match self.course.begin_attempt(now) {
            Ok(resumed) => resumed,
            Err(outcome) => {
                self.end(Err(outcome));
                return None;
            }
        };
        self.enter(Stage::InFlight);
        match self.lane.send(now, resumed, &mut self.course, &self.route) {
            Ok(send) => Some(Io::Send(send)),
            Err(Some(failure)) => {
                self.enter(Stage::Failed(failure));
                None
            }
            Err(None) => {
                let attempts = self.course.ledger.wire_attempt();
                self.end(Err(Outcome::Exhausted { attempts }));
                None
            }
        }
    }

    /// The request left: the head timer runs, a cancel now catches it
    /// awaiting its head.
    pub fn on_sent(&mut self, now: Instant) {
        self.on_sent_of(Role::First, now);
    }

    /// [`Exchange::on_sent`] of `role`'s attempt.
    pub fn on_sent_of(&mut self, role: Role, now: Instant) {
        self.judge(role, now, |ex| {
            if matches!(ex.stage, Stage::InFlight) {
                ex.lane.attempt.sent();
            }
        });
    }

    /// The response head arrived at `now`, `wall` on the wall clock (an
    /// HTTP-date `Retry-After` is judged against it). `decoded` is the
    /// evidence of a layer that decodes this response's body before the
    /// driver reads it, if any.
    pub fn on_head<H: Head + ?Sized>(
        &mut self,
        now: Instant,
        wall: SystemTime,
        head: &H,
        decoded: Option<D>,
    ) {
        self.on_head_of(Role::First, now, wall, head, decoded);
    }

    /// [`Exchange::on_head`] of `role`'s attempt.
    pub fn on_head_of<H: Head + ?Sized>(
        &mut self,
        role: Role,
        now: Instant,
        wall: SystemTime,
        head: &H,
        decoded: Option<D>,
    ) {
        self.judge(role, now, |ex| ex.head(now, wall, head, decoded));
    }

    fn head<H: Head + ?Sized>(
        &mut self,
        now: Instant,
        wall: SystemTime,
        head: &H,
        decoded: Option<D>,
    ) {
        if !self.in_phase(|_| self.lane.attempt.awaits_head()) {
            return;
        }
        let racing = self.race.is_some();
        if let Some(failure) = self.lane.head(
            now,
            wall,
            head,
            decoded,
            &mut self.course,
            &self.route,
            racing,
        ) {
            self.step(now, Step::Failed(failure));
        }
    }

    /// A chunk of a body that [`is_passing_through`](Self::is_passing_through),
    /// read by reference (the lean path of [`Exchange::on_chunk`]):
    /// `true` when the driver hands it out as it is; `false` when the
    /// machine needs it, then given with [`Exchange::on_kept_chunk`]. The
    /// chunk is decoded either way, once.
    #[inline]
    pub fn on_passing_chunk(&mut self, chunk: &[u8]) -> bool {
        debug_assert!(self.is_passing_through());
        match self.lane.attempt.on_passing_chunk(
            chunk,
            &mut self.lane.outbox,
            &mut self.lane.timers,
        ) {
            Ok(passes) => passes,
            Err(v) => {
                self.attempt_failed(attempt::violation(v));
                false
            }
        }
    }

    /// The chunk [`Exchange::on_passing_chunk`] kept, already decoded:
    /// returns it when it goes out at once after all.
    pub fn on_kept_chunk(&mut self, now: Instant, chunk: C) -> Option<C> {
        let (attempt, mut cx) = self.lane.split(&mut self.course, self.race.is_some());
        let step = attempt.on_kept_chunk(now, chunk, &mut cx);
        self.step(now, step)
    }

    /// A chunk of the body arrived. Returns it when it goes to the consumer
    /// at once, as it is; otherwise the machine keeps it (held back before
    /// commit, queued, or cut into events) and [`Exchange::poll`] says what
    /// follows.
    #[inline]
    pub fn on_chunk(&mut self, now: Instant, chunk: C) -> Option<C> {
        self.on_chunk_of(Role::First, now, chunk)
    }

    /// [`Exchange::on_chunk`] of `role`'s attempt.
    #[inline]
    pub fn on_chunk_of(&mut self, role: Role, now: Instant, chunk: C) -> Option<C> {
        self.judge(role, now, |ex| {
            if !matches!(ex.stage, Stage::InFlight) {
                return None;
            }
            let (attempt, mut cx) = ex.lane.split(&mut ex.course, ex.race.is_some());
            let step = attempt.on_chunk(now, chunk, &mut cx);
            ex.step(now, step)
        })
        .flatten()
    }

    /// The body ended cleanly (the transport's end of body).
    pub fn on_end(&mut self, now: Instant) {
        self.on_end_of(Role::First, now);
    }

    /// [`Exchange::on_end`] of `role`'s attempt.
    pub fn on_end_of(&mut self, role: Role, now: Instant) {
        self.judge(role, now, |ex| {
            if matches!(ex.stage, Stage::InFlight) {
                let (attempt, mut cx) = ex.lane.split(&mut ex.course, ex.race.is_some());
                let step = attempt.on_end(&mut cx);
                ex.step(now, step);
            }
        });
    }

    /// The attempt failed: no head came back, the body's read failed, or a
    /// hook of the driver vetoed it. `failure` says what and where (kind,
    /// phase, acceptance); the machine adds what the attempt showed.
    pub fn on_error(&mut self, now: Instant, failure: Failure) {
        self.on_error_of(Role::First, now, failure);
    }

    /// [`Exchange::on_error`] of `role`'s attempt.
    pub fn on_error_of(&mut self, role: Role, now: Instant, failure: Failure) {
        self.judge(role, now, |ex| {
            if matches!(ex.stage, Stage::InFlight) {
                let (attempt, mut cx) = ex.lane.split(&mut ex.course, ex.race.is_some());
                let step = attempt.on_error(failure, &mut cx);
                ex.step(now, step);
            }
        });
    }

    /// Runs an input of `role`'s attempt, then settles the race it may
    /// have decided. The input of a hedge that no longer races is dropped.
    #[inline]
    fn judge<R>(
        &mut self,
        role: Role,
        now: Instant,
        input: impl FnOnce(&mut Self) -> R,
    ) -> Option<R> {
        let hedge = role == Role::Hedge;
        if hedge {
            let race = self.race.as_deref_mut()?;
            race.swap(&mut self.lane, &mut self.course, &mut self.route);
        }
        let out = input(self);
        if let Some(race) = self.race.as_deref_mut()
            && race.settle(
                now,
                hedge,
                &mut self.lane,
                &mut self.course,
                &mut self.route,
            )
        {
            self.race = None;
        }
        Some(out)
    }

    /// A deadline of [`Exchange::poll_timeout`] may have passed by `now`:
    /// each timer that has is handled, in order, the first attempt's
    /// before a hedge's. Nothing happens when none has.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.judge(Role::First, now, |ex| ex.timers_fired(now));
        self.judge(Role::Hedge, now, |ex| ex.timers_fired(now));
    }

    fn timers_fired(&mut self, now: Instant) {
        while let Some(timer) = self.lane.timers.expired(now) {
            match timer {
                Timer::Head | Timer::FirstToken | Timer::Watch => {
                    let (attempt, mut cx) = self.lane.split(&mut self.course, self.race.is_some());
                    let step = attempt.on_timer(timer, now, &mut cx);
                    self.step(now, step);
                }
                Timer::Hedge => {
                    self.lane.timers.stop(Timer::Hedge);
                    if self.race.is_none() && self.in_phase(|_| self.lane.attempt.may_be_raced()) {
                        self.race =
                            Race::start(now, &mut self.lane, &mut self.course, &mut self.route);
                    }
                }
                Timer::Wait => {
                    // A resume waits its backoff first and connectivity
                    // second, as the next poll finds it.
                    let resume = matches!(self.stage, Stage::Waiting { resume: true });
                    self.enter(Stage::ToSend { resume });
                }
                Timer::Bound => {
                    self.lane.timers.stop(Timer::Bound);
                    if let Stage::Parked { .. } = self.stage {
                        // The budget or the deadline ran out while parked.
                        let action = self.course.online_again(now);
                        self.act(now, action);
                    } else {
                        self.admission(now, AdmissionAnswer::Unresolved);
                    }
                }
            }
        }
    }

    /// The platform is online again (after [`Io::WaitOnline`]).
    pub fn online(&mut self, now: Instant) {
        let Stage::Parked { then_send } = self.stage else {
            return;
        };
        if then_send {
            self.enter(Stage::ToSend { resume: false });
        } else {
            let action = self.course.online_again(now);
            self.act(now, action);
        }
    }

    /// The admission hook answered (after [`Io::AskAdmission`]); the
    /// answer is weighed at the next poll.
    pub fn admission(&mut self, _now: Instant, answer: AdmissionAnswer) {
        if let Stage::Admission { answer: slot, .. } = &mut self.stage {
            slot.get_or_insert(answer);
        }
    }

    /// The continuation hook answered (after [`Io::AskContinuation`]):
    /// `true` when it gave a continuation request, which the driver sends
    /// at [`Send::Continuation`].
    pub fn continuation(&mut self, _now: Instant, answer: bool) {
        if let Stage::Continuation { given, .. } = &mut self.stage {
            given.get_or_insert(answer);
        }
    }

    /// The caller cancelled, or the consumer dropped the body. Once
    /// terminal proof was observed and handed out, that is a completed
    /// request (an SDK stops reading at its end marker); otherwise it is
    /// `cancelled`, in the phase the request was in.
    pub fn cancel(&mut self, now: Instant) {
        if let Some(race) = self.race.take() {
            race.cancel(now, &mut self.lane, &mut self.course, &mut self.route);
        }
        if let Stage::Failed(_) = self.stage {
            // The failure is on the books before the cancellation.
            self.decide(now, true);
        }
        if let (Stage::InFlight, AttemptPhase::Draining) = (&self.stage, &self.lane.attempt.phase) {
            self.enter(Stage::Ended(Ok(())));
            self.lane.outbox.release();
            return;
        }
        let sent = self.course.ledger.wire_attempt() > 0;
        let Some(phase) = self.stage.cancel_phase(&self.lane.attempt.phase, sent) else {
            return;
        };
        if self.lane.outbox.responded()
            && self.lane.outbox.is_empty()
            && let Some(proof) = self.lane.attempt.proof()
        {
            self.complete(now, proof);
            self.lane.outbox.release();
            return;
        }
        if let Some(progress) = self.lane.progress_shown() {
            self.course.ledger.progress(progress);
        }
        let outcome = self.course.cancel(now, phase);
        self.lane.outbox.release();
        self.lane.outbox.set_holds(Holds::Answer);
        self.end(Err(outcome));
    }

    /// Strong proof was handed out with nothing queued: the request is
    /// complete now, whatever the consumer or the connection does next (an
    /// SDK that stops reading at its end marker still gets its outcome).
    /// The rest of the body drains. Weaker proof (a finish reason that needs
    /// the clean end) waits for the end.
    #[inline]
    fn settle_if_proven(&mut self, now: Instant) {
        if self.lane.attempt.proven() {
            self.settle(now);
        }
    }

    #[cold]
    fn settle(&mut self, now: Instant) {
        if !self.in_phase(|p| matches!(p, AttemptPhase::Streaming))
            || !self.lane.outbox.responded()
            || !self.lane.outbox.is_empty()
        {
            return;
        }
        if let Some(Proof::Strong) = self.lane.attempt.proof()
            && !self.lane.outbox.deferred()
        {
            self.complete(now, Proof::Strong);
            self.stage = Stage::InFlight;
            self.lane.attempt.drain(now, &mut self.lane.timers);
        }
    }

    fn end(&mut self, result: Result<(), Outcome>) {
        self.enter(Stage::Ended(result));
        self.lane.outbox.end();
    }

    /// The attempt finished with success proof.
    fn complete(&mut self, now: Instant, proof: Proof) {
        self.lane.complete(now, proof, &mut self.course);
        self.end(Ok(()));
    }

    /// The attempt in flight failed. After commit, a failure found inside a
    /// chunk waits until the queued chunks are handed out.
    fn attempt_failed(&mut self, failure: Failure) {
        if self.lane.outbox.responded() && !self.lane.outbox.is_empty() {
            self.lane.outbox.defer(failure);
            return;
        }
        self.enter(Stage::Failed(Box::new(failure)));
    }

    /// Decides and carries out what follows a failed attempt.
    fn fail_attempt(&mut self, now: Instant, online: bool, failure: Failure) {
        self.stage = self
            .lane
            .recourse(&mut self.course, &self.route)
            .fail(now, online, failure);
    }

    /// Carries out what the course decided.
    fn act(&mut self, now: Instant, action: Action) {
        self.stage = self
            .lane
            .recourse(&mut self.course, &self.route)
            .act(now, action);
    }
}
