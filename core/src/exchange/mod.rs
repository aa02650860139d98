//! The sans-IO machine of one logical request: every attempt's head, chunk,
//! end, read error, consumer drop, cancellation and timer goes in; what the
//! driver does next comes out. Every driver runs this one machine, so the
//! same evidence gives the same decision whatever the runtime.
//!
//! A driver only does I/O. It asks [`Exchange::poll`] what to do ([`Io`]),
//! does it, and reports what happened: [`Exchange::on_sent`],
//! [`Exchange::on_head`], [`Exchange::on_chunk`], [`Exchange::on_end`],
//! [`Exchange::on_error`], [`Exchange::admission`], [`Exchange::online`],
//! [`Exchange::continuation`], [`Exchange::cancel`]. Time leaves the
//! machine as a deadline ([`Exchange::poll_timeout`], in the manner of
//! quinn-proto): the driver keeps one sleep, and when it wakes calls
//! [`Exchange::handle_timeout`]. Lifecycle events come out of
//! [`Exchange::drain_events`].
//!
//! What is decided here, once: the commit trigger (first semantic fragment,
//! hold-back cap, terminal proof), the end-of-body rule (proof or a typed
//! failure), the unfinished-frame rule, error heads (`Retry-After` in every
//! form against the injected wall clock, `retry-after-ms`,
//! `x-should-retry`, the capped error body), the content-type rule, the
//! protocol default, the stall and head timers, the resume gate
//! (event-granular delivery, duplicate dropping, continuation splice), and
//! that nothing after terminal proof changes a completed outcome.
//!
//! ```
//! use std::borrow::Cow;
//! use std::time::{Duration, SystemTime};
//! use recovery_core::budget::AttemptAllowance;
//! use recovery_core::exchange::{Env, Exchange, Head, Io, RequestFacts, Send};
//! use recovery_core::policy::RecoveryPolicy;
//! use recovery_core::protocol::ProtocolChoice;
//! use recovery_core::timing::{Fraction, Instant};
//!
//! struct Clock(Instant);
//! impl Env for Clock {
//!     fn now(&self) -> Instant { self.0 }
//!     fn wall_now(&self) -> SystemTime { SystemTime::UNIX_EPOCH }
//!     fn jitter(&self) -> Fraction { Fraction::new(0.5) }
//!     fn online(&self) -> bool { true }
//! }
//! struct Ok200;
//! impl Head for Ok200 {
//!     fn status(&self) -> u16 { 200 }
//!     fn header(&self, name: &str) -> Option<Cow<'_, str>> {
//!         (name == "content-type").then_some(Cow::Borrowed("text/event-stream"))
//!     }
//! }
//!
//! let env = Clock(Instant::from_origin(Duration::ZERO));
//! let request = RequestFacts::new("POST", "/v1/chat/completions", b"{}");
//! let mut ex: Exchange<Vec<u8>> = Exchange::new(
//!     RecoveryPolicy::default(),
//!     &ProtocolChoice::Auto,
//!     request,
//!     AttemptAllowance::new(3),
//!     7,
//!     env.now(),
//! );
//! assert!(matches!(ex.poll(&env), Io::Send(Send::Original)));
//! ex.on_sent(&env);
//! ex.on_head(&env, &Ok200, None);
//! let delta = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n".to_vec();
//! assert_eq!(ex.on_chunk(&env, delta), None); // held back until commit...
//! assert!(matches!(ex.poll(&env), Io::Respond)); // ...which this semantic delta is
//! assert!(matches!(ex.poll(&env), Io::Deliver(_)));
//! assert!(matches!(ex.poll(&env), Io::Read));
//! ```

mod attempt;
pub(crate) mod course;
mod decoded;
mod gate;
mod head;
mod io;
mod ledger;
mod outbox;
mod resumption;
mod route;
mod setup;
mod targets;
mod timers;

use std::collections::VecDeque;

pub use crate::decision::AdmissionAnswer;
pub use decoded::{Decoded, SelfDecoded};
pub use io::{AdmissionRequest, Chunk, Env, Head, Io, RequestFacts, Send};
pub use ledger::Ledger;
pub use setup::Setup;
pub use timers::{CHECKS_PER_TIMEOUT, DRAIN_GRACE};

use crate::budget::AttemptAllowance;
use crate::continuation::DeliveredPrefix;
use crate::decision::Action;
use crate::failure::{Failure, FailureKind, Phase};
use crate::lifecycle::{CommitTrigger, LifecycleEvent};
use crate::outcome::{CancelPhase, Outcome};
use crate::policy::RecoveryPolicy;
use crate::progress::Proof;
use crate::protocol::{ProtocolChoice, ProtocolKind};
use crate::resume::native_resume;
use crate::timing::Instant;
use attempt::{Attempt, Ctx, Phase as AttemptPhase, Step};
use course::{CooldownStep, Course};
use head::Verdict;
use outbox::{Due, Holds, Outbox};
use resumption::{Continue, Resumption};
use route::Route;
use timers::{Timer, Timers};

/// Where the request is; the timers each stage arms are in [`Timers`].
#[derive(Debug)]
enum Stage {
    /// The next send is due.
    ToSend,
    /// An attempt is on its way or being read ([`Attempt`]'s phase says
    /// where).
    InFlight,
    /// A wait before the next send (a resume's, when `resume`).
    Waiting { resume: bool },
    /// Offline; `then_send` when the resume is due as soon as it is back.
    Parked { then_send: bool },
    /// Waiting for the admission hook (the question, until asked).
    Admission {
        request: Option<Box<AdmissionRequest>>,
    },
    /// Waiting for the continuation hook's answer.
    Continuation(Box<Failure>),
    /// The request ended: the body's clean end, or its typed outcome.
    Ended(Result<(), Outcome>),
}

/// The machine of one logical request. See the module docs.
///
/// `C` is the driver's chunk type; `D` the evidence of a decoder outside
/// the machine, when the driver has one ([`SelfDecoded`] when not).
#[derive(Debug)]
pub struct Exchange<C, D = SelfDecoded> {
    /// The request's course over its sends, and its books.
    course: Course,
    /// The protocol the answer is decoded as.
    protocol: ProtocolKind,
    stage: Stage,
    /// Where the request is sent.
    route: Route,
    /// The attempt in flight (or the last one).
    attempt: Attempt<D>,
    /// What is due to the driver and the consumer.
    outbox: Outbox<C>,
    timers: Timers,
    /// How a committed stream can be continued, when it can.
    resumption: Option<Box<Resumption>>,
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

    fn resumption_mut(&mut self) -> &mut Resumption {
        self.resumption
            .get_or_insert_with(|| Resumption::new(false))
    }

    /// The target the current (or next) send goes to: 0 for the request as
    /// it was given, `i` for alternate `i` ([`Setup::alternates`]).
    pub fn target(&self) -> usize {
        self.course.target()
    }

    /// The protocol the answer is decoded as.
    pub fn protocol(&self) -> &ProtocolKind {
        &self.protocol
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
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, LifecycleEvent> {
        self.course.ledger.drain_events()
    }

    /// The last error body read (capped at the policy's evidence cap):
    /// sensitive evidence, for `inspect_*` only.
    pub fn error_body(&self) -> &[u8] {
        &self.attempt.error_body
    }

    /// What the consumer has received, as the continuation hook is given
    /// it (present when a continuation may be asked for).
    pub fn delivered_prefix(&self) -> Option<&DeliveredPrefix> {
        self.resumption.as_ref().and_then(|r| r.prefix.as_ref())
    }

    /// The chunks held for the consumer, taken out (the final error
    /// response's first chunks, after [`Io::RespondError`]).
    pub fn take_held(&mut self) -> VecDeque<Chunk<C>> {
        self.outbox.take()
    }

    /// Whether the head just received may become the final answer as the
    /// server sent it (an error head, before commit): a driver whose
    /// runtime can copy a body (a `Response.clone()`) reads the copy and
    /// keeps the original for [`Io::RespondError`].
    pub fn keeps_response(&self) -> bool {
        !self.outbox.responded() && self.in_phase(|p| matches!(p, AttemptPhase::ErrorBody(_)))
            || matches!(self.stage, Stage::Ended(_)) && self.outbox.error_response_due()
    }

    /// Whether an attempt is in flight in a phase `is` says yes to.
    fn in_phase(&self, is: impl Fn(&AttemptPhase) -> bool) -> bool {
        matches!(self.stage, Stage::InFlight) && is(&self.attempt.phase)
    }

    /// Whether the body streams the committed attempt with nothing queued,
    /// pending or gated: a driver may then read and hand out chunks through
    /// [`Exchange::on_chunk`] alone, without asking [`Exchange::poll`].
    #[inline]
    pub fn is_passing_through(&self) -> bool {
        self.outbox.is_idle()
            && self.attempt.gate.is_none()
            && self.in_phase(|p| matches!(p, AttemptPhase::Streaming | AttemptPhase::Draining))
    }

    /// When the driver must wake the machine ([`Exchange::handle_timeout`])
    /// if nothing else happens first: the earliest of its timers.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next()
    }

    /// What the driver does next. Call again after every reported event.
    pub fn poll<E: Env + ?Sized>(&mut self, env: &E) -> Io<C> {
        loop {
            if let Some(due) = self.outbox.next_due() {
                return match due {
                    Due::Release => Io::Release,
                    Due::Respond => Io::Respond,
                    Due::RespondError => Io::RespondError,
                };
            }
            if let Some((chunk, last)) = self.outbox.next_chunk() {
                if last {
                    self.settle_if_proven(env.now());
                }
                return Io::Deliver(chunk);
            }
            if let Some(failure) = self.outbox.take_deferred() {
                self.fail_attempt(env, failure);
                continue;
            }
            return match &mut self.stage {
                Stage::ToSend => match self.begin_send(env) {
                    Some(io) => io,
                    None => continue,
                },
                Stage::InFlight if self.attempt.awaits_head() => Io::AwaitHead,
                Stage::InFlight => Io::Read,
                Stage::Waiting { .. } => Io::Sleep,
                Stage::Parked { .. } => Io::WaitOnline,
                Stage::Admission { request } => match request.take() {
                    Some(r) => Io::AskAdmission(*r),
                    None => Io::AwaitAdmission,
                },
                Stage::Continuation(_) => Io::AskContinuation,
                Stage::Ended(result) => Io::End(result.clone()),
            };
        }
    }

    /// Enters `stage`, its timers stopped: it arms its own.
    fn enter(&mut self, stage: Stage) {
        self.timers.clear();
        self.stage = stage;
    }

    /// What an attempt's inputs reach beyond it, and the attempt.
    fn split(&mut self) -> (&mut Attempt<D>, Ctx<'_, C>) {
        let prefix = self
            .resumption
            .as_deref_mut()
            .and_then(|r| r.prefix.as_mut());
        let cx = Ctx {
            course: &mut self.course,
            outbox: &mut self.outbox,
            timers: &mut self.timers,
            prefix,
            protocol: &self.protocol,
        };
        (&mut self.attempt, cx)
    }

    /// Carries out what an attempt's input means for the request.
    fn step<E: Env + ?Sized>(&mut self, env: &E, step: Step<C>) -> Option<C> {
        match step {
            Step::Quiet => None,
            Step::Pass(chunk) => {
                self.settle_if_proven(env.now());
                Some(chunk)
            }
            Step::Failed(failure) => {
                self.attempt_failed(env, failure);
                None
            }
            Step::Proven(proof) => {
                self.complete(env.now(), proof);
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
    fn begin_send<E: Env + ?Sized>(&mut self, env: &E) -> Option<Io<C>> {
        let now = env.now();
        if let Some(protocol) = self.route.adopt(self.course.target()) {
            self.adopt(protocol);
        }
        if !self.course.is_committed()
            && let Some(wait) = self.route.cooldown(now)
        {
            match self.course.hold_for_cooldown(now, wait) {
                Ok(CooldownStep::Wait(wait)) => {
                    self.enter(Stage::Waiting { resume: false });
                    self.timers.set(Timer::Wait, Some(now + wait));
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
        self.outbox.new_attempt();
        self.enter(Stage::InFlight);
        let head_timeout = self.course.policy().head_timeout();
        self.attempt.send(now, head_timeout, &mut self.timers);
        if !resumed {
            if let Some(r) = self.resumption.as_mut() {
                r.next_gate = Some((None, None));
            }
            return Some(Io::Send(Send::Original));
        }
        let delivered: u64 = self
            .course
            .ledger
            .report()
            .attempts
            .iter()
            .map(|a| a.progress.delivered_bytes)
            .sum();
        let (route, protocol) = (&self.route, &self.protocol);
        let Some(r) = self.resumption.as_mut() else {
            let attempts = self.course.ledger.wire_attempt();
            self.end(Err(Outcome::Exhausted { attempts }));
            return None;
        };
        let plan = r.plan(protocol, route.background);
        match r.next_send(plan, &route.method, &route.url, protocol) {
            Continue::Send(send, strategy) => {
                self.course.ledger.seam(strategy, delivered);
                Some(Io::Send(send))
            }
            Continue::Impossible => {
                self.resume_impossible(env);
                None
            }
        }
    }

    /// A resume was decided but no request can carry it (the cursor does
    /// not fit a URL or header, or the hook's continuation is gone): the
    /// send fails as a protocol sequence error.
    fn resume_impossible<E: Env + ?Sized>(&mut self, env: &E) {
        let violation = crate::failure::Violation::Sequence;
        let failure = Failure::new(FailureKind::Protocol { violation }, Phase::Sending);
        self.fail_attempt(env, failure);
    }

    /// The request left: the head timer runs, a cancel now catches it
    /// awaiting its head.
    pub fn on_sent<E: Env + ?Sized>(&mut self, _env: &E) {
        if matches!(self.stage, Stage::InFlight) {
            self.attempt.sent();
        }
    }

    /// The response head arrived. `decoded` is the evidence of a layer that
    /// decodes this response's body before the driver reads it, if any.
    pub fn on_head<E: Env + ?Sized, H: Head + ?Sized>(
        &mut self,
        env: &E,
        head: &H,
        decoded: Option<D>,
    ) {
        if !self.in_phase(|_| self.attempt.awaits_head()) {
            return;
        }
        let now = env.now();
        let (verdict, seen) = head::judge(head, env.wall_now());
        self.course
            .ledger
            .head(now, seen.status, seen.request_id, seen.rate_limits);
        self.attempt.status = Some(seen.status);
        let form = match verdict {
            Verdict::Redirect(failure) => {
                self.outbox.set_holds(Holds::ErrorResponse);
                self.attempt_failed(env, failure);
                return;
            }
            Verdict::Error(error) => {
                self.attempt.read_error(now, error, &mut self.timers);
                return;
            }
            Verdict::Answer(form) => form,
        };
        if let Some(kind) = decoded.as_ref().and_then(Decoded::protocol)
            && *kind != self.protocol
        {
            let kind = kind.clone();
            self.adopt(kind);
        }
        let next_gate = self.resumption.as_mut().and_then(|r| r.next_gate.take());
        // A resume continues a committed answer: its first token is not due.
        let first_token = self
            .course
            .policy()
            .first_token_timeout()
            .filter(|_| !self.course.is_committed());
        let (attempt, mut cx) = self.split();
        attempt.read_answer(now, form, decoded, next_gate, first_token, &mut cx);
    }

    /// Reads the exchange as `protocol` from now on: the decoder of the
    /// answer named it, or the request moved to a target that speaks it.
    #[cold]
    fn adopt(&mut self, protocol: ProtocolKind) {
        let (sse, background) = (self.route.sse_resumable, self.route.background);
        let native = native_resume(&protocol, sse, background);
        if let Some(r) = self.resumption.as_mut() {
            r.native = native;
            // What was delivered was read as the protocol it spoke; a
            // target that speaks another starts its own prefix.
            if r.prefix.is_some() && protocol != self.protocol {
                r.prefix = Some(DeliveredPrefix::new(protocol.clone()));
            }
        } else if native {
            let r = self.resumption_mut();
            r.native = true;
            r.next_gate = Some((None, None));
        }
        self.protocol = protocol;
    }

    /// A chunk of a body that [`is_passing_through`](Self::is_passing_through),
    /// read by reference (the lean path of [`Exchange::on_chunk`]):
    /// `true` when the driver hands it out as it is; `false` when the
    /// machine needs it, then given with [`Exchange::on_kept_chunk`]. The
    /// chunk is decoded either way, once.
    #[inline]
    pub fn on_passing_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: &[u8]) -> bool {
        debug_assert!(self.is_passing_through());
        match self
            .attempt
            .on_passing_chunk(chunk, &mut self.outbox, &mut self.timers)
        {
            Ok(passes) => passes,
            Err(v) => {
                self.attempt_failed(env, attempt::violation(v));
                false
            }
        }
    }

    /// The chunk [`Exchange::on_passing_chunk`] kept, already decoded:
    /// returns it when it goes out at once after all.
    pub fn on_kept_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: C) -> Option<C> {
        let now = env.now();
        let (attempt, mut cx) = self.split();
        let step = attempt.on_kept_chunk(now, chunk, &mut cx);
        self.step(env, step)
    }

    /// A chunk of the body arrived. Returns it when it goes to the consumer
    /// at once, as it is; otherwise the machine keeps it (held back before
    /// commit, queued, or cut into events) and [`Exchange::poll`] says what
    /// follows.
    #[inline]
    pub fn on_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: C) -> Option<C> {
        if !matches!(self.stage, Stage::InFlight) {
            return None;
        }
        let now = env.now();
        let (attempt, mut cx) = self.split();
        let step = attempt.on_chunk(now, chunk, &mut cx);
        self.step(env, step)
    }

    /// The body ended cleanly (the transport's end of body).
    pub fn on_end<E: Env + ?Sized>(&mut self, env: &E) {
        if matches!(self.stage, Stage::InFlight) {
            let (attempt, mut cx) = self.split();
            let step = attempt.on_end(&mut cx);
            self.step(env, step);
        }
    }

    /// The attempt failed: no head came back, the body's read failed, or a
    /// hook of the driver vetoed it. `failure` says what and where (kind,
    /// phase, acceptance); the machine adds what the attempt showed.
    pub fn on_error<E: Env + ?Sized>(&mut self, env: &E, failure: Failure) {
        if matches!(self.stage, Stage::InFlight) {
            let (attempt, mut cx) = self.split();
            let step = attempt.on_error(failure, &mut cx);
            self.step(env, step);
        }
    }

    /// A deadline of [`Exchange::poll_timeout`] may have passed: each timer
    /// that has is handled, in order. Nothing happens when none has.
    pub fn handle_timeout<E: Env + ?Sized>(&mut self, env: &E) {
        let now = env.now();
        while let Some(timer) = self.timers.expired(now) {
            match timer {
                Timer::Head | Timer::FirstToken | Timer::Watch => {
                    let (attempt, mut cx) = self.split();
                    let step = attempt.on_timer(timer, now, &mut cx);
                    self.step(env, step);
                }
                Timer::Wait => {
                    let resume = matches!(self.stage, Stage::Waiting { resume: true });
                    self.enter(Stage::ToSend);
                    // A resume waits its backoff first and connectivity
                    // second (reliability matrix AD5).
                    if resume && self.course.park_before_send(now, env.online()) {
                        self.park(now, true);
                    }
                }
                Timer::Bound => match self.stage {
                    Stage::Parked { .. } => {
                        // The budget or the deadline ran out while parked.
                        let action = self.course.online_again(now, env.jitter());
                        self.act(env, action);
                    }
                    _ => self.admission(env, AdmissionAnswer::Unresolved),
                },
            }
        }
    }

    /// Parks offline until the recovery budget or the deadline;
    /// `then_send` when a resume is due as soon as it is back.
    fn park(&mut self, now: Instant, then_send: bool) {
        self.enter(Stage::Parked { then_send });
        let limit = self.course.wait_limit(now).map(|d| now + d);
        self.timers.set(Timer::Bound, limit);
    }

    /// The platform is online again (after [`Io::WaitOnline`]).
    pub fn online<E: Env + ?Sized>(&mut self, env: &E) {
        let Stage::Parked { then_send } = self.stage else {
            return;
        };
        if then_send {
            self.enter(Stage::ToSend);
        } else {
            let action = self.course.online_again(env.now(), env.jitter());
            self.act(env, action);
        }
    }

    /// The admission hook answered (after [`Io::AskAdmission`]).
    pub fn admission<E: Env + ?Sized>(&mut self, env: &E, answer: AdmissionAnswer) {
        if !matches!(self.stage, Stage::Admission { .. }) {
            return;
        }
        let action = self
            .course
            .admission(env.now(), answer, env.online(), env.jitter());
        self.act(env, action);
    }

    /// The continuation hook answered (after [`Io::AskContinuation`]):
    /// `true` when it gave a continuation request, which the driver sends
    /// at [`Send::Continuation`].
    pub fn continuation<E: Env + ?Sized>(&mut self, env: &E, given: bool) {
        let Stage::Continuation(failure) = std::mem::replace(&mut self.stage, Stage::ToSend) else {
            return;
        };
        if let Some(r) = self.resumption.as_mut() {
            r.continuation_ready = given;
        }
        self.course.set_resume_possible(given);
        let action = self
            .course
            .fail(env.now(), *failure, env.online(), env.jitter());
        self.act(env, action);
    }

    /// The caller cancelled, or the consumer dropped the body. Once
    /// terminal proof was observed and handed out, that is a completed
    /// request (an SDK stops reading at its end marker); otherwise it is
    /// `cancelled`, in the phase the request was in.
    pub fn cancel<E: Env + ?Sized>(&mut self, env: &E) {
        let now = env.now();
        let phase = match (&self.stage, &self.attempt.phase) {
            (Stage::Ended(_), _) => return,
            (Stage::InFlight, AttemptPhase::Draining) => {
                self.enter(Stage::Ended(Ok(())));
                self.outbox.release();
                return;
            }
            (Stage::ToSend, _) if self.course.ledger.wire_attempt() == 0 => CancelPhase::Sending,
            (Stage::ToSend | Stage::Waiting { .. } | Stage::Continuation(_), _) => {
                CancelPhase::Waiting
            }
            (Stage::InFlight, AttemptPhase::Sending) => CancelPhase::Sending,
            (Stage::InFlight, AttemptPhase::AwaitingHead) => CancelPhase::AwaitingHead,
            (Stage::InFlight, _) => CancelPhase::Streaming,
            (Stage::Parked { .. }, _) => CancelPhase::Parked,
            (Stage::Admission { .. }, _) => CancelPhase::Admission,
        };
        if self.outbox.responded()
            && self.outbox.is_empty()
            && let Some(proof) = self.attempt.proof()
        {
            self.complete(now, proof);
            self.outbox.release();
            return;
        }
        if let Some(mut progress) = self.attempt.progress() {
            if self.outbox.responded() {
                progress.deliver_observed();
                progress.delivered_bytes = self.outbox.delivered();
            }
            self.course.ledger.progress(progress);
        }
        let outcome = self.course.cancel(now, phase);
        self.outbox.release();
        self.outbox.set_holds(Holds::Answer);
        self.end(Err(outcome));
    }

    /// Strong proof was handed out with nothing queued: the request is
    /// complete now, whatever the consumer or the connection does next (an
    /// SDK that stops reading at its end marker still gets its outcome).
    /// The rest of the body drains. Weaker proof (a finish reason that needs
    /// the clean end) waits for the end.
    #[inline]
    fn settle_if_proven(&mut self, now: Instant) {
        if self.attempt.proven() {
            self.settle(now);
        }
    }

    #[cold]
    fn settle(&mut self, now: Instant) {
        if !self.in_phase(|p| matches!(p, AttemptPhase::Streaming))
            || !self.outbox.responded()
            || !self.outbox.is_empty()
        {
            return;
        }
        if let Some(Proof::Strong) = self.attempt.proof()
            && !self.outbox.deferred()
        {
            self.complete(now, Proof::Strong);
            self.stage = Stage::InFlight;
            self.attempt.drain(now, &mut self.timers);
        }
    }

    fn end(&mut self, result: Result<(), Outcome>) {
        self.enter(Stage::Ended(result));
        self.outbox.end();
    }

    /// The attempt finished with success proof.
    fn complete(&mut self, now: Instant, proof: Proof) {
        let (_, mut cx) = self.split();
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
        let mut progress = self.attempt.progress().unwrap_or_default();
        progress.deliver_observed();
        progress.delivered_bytes = self.outbox.delivered() + self.outbox.queued_bytes();
        self.course.succeed(now, proof, progress);
        self.end(Ok(()));
    }

    /// The attempt in flight failed. After commit, a failure found inside a
    /// chunk waits until the queued chunks are handed out.
    fn attempt_failed<E: Env + ?Sized>(&mut self, env: &E, failure: Failure) {
        if self.outbox.responded() && !self.outbox.is_empty() {
            self.outbox.defer(failure);
            return;
        }
        self.fail_attempt(env, failure);
    }

    fn fail_attempt<E: Env + ?Sized>(&mut self, env: &E, failure: Failure) {
        let now = env.now();
        if let Some(wait) = failure.retry_after.delay() {
            self.route.note_cooldown(now, wait);
        }
        if self.course.is_committed() {
            let cursor = self.attempt.cursor();
            let (route, protocol) = (&self.route, &self.protocol);
            let native = self.resumption.as_mut().is_some_and(|r| {
                r.fold(cursor.as_ref());
                r.plan(protocol, route.background).is_some()
            });
            let hook = self.resumption.as_ref().is_some_and(|r| r.hook);
            let continued = !native
                && self.resumption.is_some()
                && self.course.would_resume(now, &failure, env.online());
            if continued && hook {
                self.enter(Stage::Continuation(Box::new(failure)));
                return;
            }
            let prefilled = continued && self.prepare_prefill(now, &failure, env.online());
            self.course.set_resume_possible(native || prefilled);
        }
        let action = self.course.fail(now, failure, env.online(), env.jitter());
        self.act(env, action);
    }

    /// A committed answer was cut and would be resumed: when a prefill can
    /// continue it (text only delivered, the serving target or the next one
    /// speaking the same protocol declares one), its body is written and
    /// the course told where it goes.
    fn prepare_prefill(&mut self, now: Instant, failure: &Failure, online: bool) -> bool {
        let serving = self.course.target();
        let (route, protocol) = (&self.route, &self.protocol);
        let target = self
            .resumption
            .as_mut()
            .and_then(|r| r.prepare_prefill(serving, protocol, |i| route.speaks(i, protocol)));
        let Some(target) = target else {
            return false;
        };
        self.course
            .continue_by_prefill(now, failure, online, target);
        true
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

    /// Carries out what the course decided after a failure. A final HTTP
    /// error response is kept through a park or an admission wait (it is
    /// the answer if no send follows), and released once one does.
    fn act<E: Env + ?Sized>(&mut self, env: &E, action: Action) {
        let now = env.now();
        let keep = self.outbox.holds() == Holds::ErrorResponse && !self.outbox.responded();
        match action {
            Action::RetryAfter { delay, .. } | Action::Resume { delay, .. } => {
                let resume = matches!(action, Action::Resume { .. });
                self.enter(Stage::Waiting { resume });
                self.timers.set(Timer::Wait, Some(now + delay));
                self.drop_attempt();
            }
            Action::Failover => {
                self.enter(Stage::ToSend);
                self.drop_attempt();
            }
            Action::ParkUntilOnline => {
                self.park(now, false);
                if !keep {
                    self.outbox.release();
                }
            }
            Action::AskAdmission => {
                let request = self.course.last_failure().cloned().map(|failure| {
                    Box::new(AdmissionRequest {
                        logical_id: self.course.ledger.logical_id().to_owned(),
                        next_attempt: self.course.ledger.wire_attempt() + 1,
                        failure,
                    })
                });
                self.enter(Stage::Admission { request });
                let limit = self.course.wait_limit(now).map(|d| now + d);
                self.timers.set(Timer::Bound, limit);
                if !keep {
                    self.outbox.release();
                }
            }
            Action::Fail(outcome) if !keep && self.shows_stream_error() => {
                // A final in-stream error before commit is handed out as
                // the provider streamed it, through its error event, then
                // the request fails: a client's SDK raises the provider's
                // own error, with its type and message.
                self.outbox.release();
                self.outbox.respond();
                self.end(Err(outcome));
            }
            Action::Fail(outcome) => {
                // A final HTTP error is returned as that response.
                if !keep {
                    self.drop_attempt();
                }
                self.end(Err(outcome));
            }
        }
    }

    /// The failed attempt's response is released, and what it held dropped.
    fn drop_attempt(&mut self) {
        self.outbox.set_holds(Holds::Answer);
        self.outbox.release();
        self.outbox.clear();
    }
}
