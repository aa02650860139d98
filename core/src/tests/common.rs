//! A thin driver of the machine ([`Exchange`]) on the virtual clock: each
//! scripted step is played as wire events (a head, chunks, an end, an
//! error, a silence), and the driver does what the machine says, as the
//! tower and wasm drivers do. Every engine test reads as a script of
//! failures.
//!
//! Each wait goes through `Timing::sleep`, polled with a no-op waker: the
//! driver advances `d − 1 ms` and asserts the machine's deadline is still
//! ahead (no send), then `+1 ms` and wakes it (the send follows). After
//! every run the harness asserts the global lifecycle invariants (LC1, G9,
//! G12).
#![allow(dead_code)]

use std::borrow::Cow;
use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::budget::{AttemptAllowance, RetryBudget};
use crate::conformance::{Played, PlayedHead, RequestSpec, WireEnd};
use crate::cooldown::{self, CooldownStore, Cooldowns};
use crate::decision::{AdmissionAnswer, DelayCause};
use crate::exchange::{
    AdmissionRequest, Chunk, Exchange, Head, Io, RequestFacts, Role, Send, Setup,
};
use crate::failure::{Failure, Phase, Stall, TransportKind};
use crate::lifecycle::{EventKind, LifecycleEvent};
use crate::outcome::{CancelPhase, Outcome, ReplayDisabled};
use crate::policy::RecoveryPolicy;
use crate::progress::{Progress, Proof, SemanticKind};
use crate::protocol::{ProtocolChoice, ProtocolKind, SseTerminal};
use crate::report::RecoveryReport;
use crate::timing::{Connectivity, Fraction, Instant, ManualTiming, ScriptedConnectivity, Timing};

pub(super) const MS: Duration = Duration::from_millis(1);

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub(super) fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The fault rows' test policy: 3 attempts, backoff
/// 0.5 s / 8 s, Retry-After ceiling 60 s, recovery budget 120 s, statuses
/// 408, 409, 429, 500, 502, 503, 504, 529.
pub(super) fn test_policy() -> RecoveryPolicy {
    test_builder().build().expect("test policy")
}

pub(super) fn test_builder() -> crate::policy::PolicyBuilder {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).expect("3"))
        .backoff(ms(500), secs(8))
        .budget(Some(secs(120)))
        .retryable_statuses([408, 409, 429, 500, 502, 503, 504, 529])
}

/// Progress with `n` observed (not yet delivered) fragments of `kind`.
pub(super) fn observed(kind: SemanticKind, n: u64) -> Progress {
    let mut p = Progress {
        headers_received: true,
        raw_bytes: 100,
        frames: n,
        ..Progress::default()
    };
    for _ in 0..n {
        p.observe(kind);
    }
    p
}

/// Progress of a stream that carried only keepalives.
pub(super) fn keepalives_only(n: u64) -> Progress {
    Progress {
        headers_received: true,
        raw_bytes: 20 * n,
        frames: n,
        keepalives: n,
        ..Progress::default()
    }
}

/// What one physical send does.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// The send fails `after` it started. With `commit`, the attempt commits
    /// (first semantic fragment delivered) before failing. With `offline`, the
    /// platform goes offline at the failure.
    Fail {
        after: Duration,
        failure: Failure,
        commit: bool,
        offline: bool,
    },
    /// No head comes back: the driver's head timer (`policy.head_timeout`)
    /// fires and the attempt fails with `Timeout{Head}` in `phase`.
    HeadTimeout { phase: Phase },
    /// The stream goes silent: the `stall` watchdog of the policy fires.
    Watchdog { stall: Stall, commit: bool },
    /// The stream ends with terminal proof `after` the send started.
    Succeed {
        after: Duration,
        proof: Proof,
        commit: bool,
    },
    /// The caller cancels `after` the send started, in `phase`.
    Cancel {
        after: Duration,
        phase: CancelPhase,
        commit: bool,
    },
    /// The send as a conformance vector plays it, byte for byte.
    Played(Played),
}

pub(super) fn fail(failure: Failure) -> Step {
    Step::Fail {
        after: Duration::ZERO,
        failure,
        commit: false,
        offline: false,
    }
}

pub(super) fn fail_after(after: Duration, failure: Failure) -> Step {
    Step::Fail {
        after,
        failure,
        commit: false,
        offline: false,
    }
}

pub(super) fn commit_then_fail(failure: Failure) -> Step {
    Step::Fail {
        after: Duration::ZERO,
        failure,
        commit: true,
        offline: false,
    }
}

pub(super) fn fail_offline(failure: Failure) -> Step {
    Step::Fail {
        after: Duration::ZERO,
        failure,
        commit: false,
        offline: true,
    }
}

pub(super) fn succeed() -> Step {
    Step::Succeed {
        after: Duration::ZERO,
        proof: Proof::Strong,
        commit: true,
    }
}

pub(super) fn succeed_after(after: Duration) -> Step {
    Step::Succeed {
        after,
        proof: Proof::Strong,
        commit: true,
    }
}

pub(super) fn status(code: u16) -> Failure {
    Failure::status(code, crate::retry_after::RetryAfter::Absent, None)
}

/// What the admission hook does when asked.
#[derive(Debug, Clone, Copy)]
pub(super) enum Hook {
    /// Answers after `after`.
    Answer {
        after: Duration,
        answer: AdmissionAnswer,
    },
    /// The caller cancels while the hook is pending.
    CancelAfter(Duration),
    /// Never answers.
    Never,
}

pub(super) fn answer(answer: AdmissionAnswer) -> Hook {
    Hook::Answer {
        after: Duration::ZERO,
        answer,
    }
}

/// What happens while parked offline.
#[derive(Debug, Clone, Copy)]
pub(super) enum Park {
    /// The platform comes back online after this long.
    OnlineAfter(Duration),
    /// The caller cancels after this long.
    CancelAfter(Duration),
}

/// How jitter is drawn.
#[derive(Debug, Clone)]
pub(super) enum Jitter {
    Pinned(f64),
    Seeded(u64),
    Scripted(Vec<f64>),
}

/// A whole scenario.
#[derive(Debug, Clone)]
pub(super) struct Script {
    pub policy: RecoveryPolicy,
    pub steps: Vec<Step>,
    /// `Some` installs an admission hook answering in this order.
    pub hook: Option<Vec<Hook>>,
    pub parks: Vec<Park>,
    pub jitter: Jitter,
    /// Wall clock at the origin, since the Unix epoch.
    pub wall: Duration,
    /// Cancel during wait number `.0` (0-based), `.1` into it.
    pub cancel_in_wait: Option<(usize, Duration)>,
    pub retry_budget: Option<RetryBudget>,
    /// An absolute deadline, from the start of the request.
    pub deadline: Option<Duration>,
    pub replay_disabled: Option<ReplayDisabled>,
    pub resume_possible: bool,
    /// Extra time the driver oversleeps each wait (a late timer), to exercise
    /// the recheck before sending.
    pub oversleep: Duration,
    /// The protocol, request and resume settings of a conformance vector
    /// (`None`: OpenAI Chat, or a resumable SSE endpoint with
    /// `resume_possible`).
    pub vector: Option<VectorSetup>,
}

/// The request side of a conformance vector.
#[derive(Debug, Clone)]
pub(super) struct VectorSetup {
    pub protocol: ProtocolKind,
    pub request: RequestSpec,
    pub resumable_sse: bool,
    pub continuation: Option<RequestSpec>,
    /// A cooldown in force for the request's key when it starts.
    pub cooldown_ms: Option<u64>,
    /// The request's alternates.
    pub alternates: Vec<crate::failover::Target>,
    /// The request's own target's declared context window.
    pub context_window: Option<u64>,
    /// The request's own target's prefill form.
    pub prefill: Option<crate::continuation::Prefill>,
}

impl Script {
    pub(super) fn new(policy: RecoveryPolicy, steps: Vec<Step>) -> Self {
        Script {
            policy,
            steps,
            hook: None,
            parks: Vec::new(),
            jitter: Jitter::Pinned(0.5),
            wall: secs(1000),
            cancel_in_wait: None,
            retry_budget: None,
            deadline: None,
            replay_disabled: None,
            resume_possible: false,
            oversleep: Duration::ZERO,
            vector: None,
        }
    }

    pub(super) fn hook(mut self, answers: Vec<Hook>) -> Self {
        self.hook = Some(answers);
        self
    }

    pub(super) fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    pub(super) fn run(self) -> Run {
        run(self)
    }
}

/// What the admission hook was shown.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HookCall {
    pub logical_id: String,
    pub next_attempt: u32,
    pub failure: Failure,
    pub progress: Progress,
}

/// What a run did.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub outcome: Outcome,
    pub events: Vec<LifecycleEvent>,
    /// (time of the send, wire attempt).
    pub sends: Vec<(Instant, u32)>,
    /// Waits scheduled by the engine: (delay, cause, resume).
    pub waits: Vec<(Duration, DelayCause, bool)>,
    /// Total virtual time spent sleeping in waits.
    pub slept: Duration,
    /// Ordered log of what the driver waited for (`backoff`, `online`,
    /// `admission`, `response`).
    pub log: Vec<&'static str>,
    pub hook_calls: Vec<HookCall>,
    pub report: RecoveryReport,
    pub allowance_used: u32,
    pub end: Instant,
    pub timing: ManualTiming,
    /// The bytes the consumer received.
    pub delivered: Vec<u8>,
    /// Each send as `METHOD path[ last-event-id=<id>]`.
    pub requests: Vec<String>,
    /// Each send's body.
    pub bodies: Vec<String>,
    /// What a vector run's cooldown store held for the request's key at
    /// its end.
    pub cooldown_left: Duration,
}

impl Run {
    pub(super) fn names(&self) -> Vec<&'static str> {
        self.events.iter().map(|e| e.kind.name()).collect()
    }

    /// Event names without `committed` (the canonical sequences list
    /// transitions only; commit is asserted apart).
    pub(super) fn transitions(&self) -> Vec<&'static str> {
        self.names()
            .into_iter()
            .filter(|n| *n != "committed")
            .collect()
    }

    pub(super) fn send_count(&self) -> usize {
        self.sends.len()
    }

    pub(super) fn terminal(&self) -> &LifecycleEvent {
        self.events.last().expect("events")
    }
}

fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    f.poll(&mut cx)
}

/// Sleeps `d` on the virtual clock, asserting the sleep is still pending at
/// `d − 1 ms` and complete at `d`.
pub(super) fn sleep_exactly(timing: &ManualTiming, d: Duration) {
    let mut sleep = Box::pin(timing.sleep(d));
    if d >= MS {
        assert!(
            poll_once(sleep.as_mut()).is_pending(),
            "a {d:?} sleep completed at once"
        );
        timing.advance(d.checked_sub(MS).expect("d >= 1 ms"));
        assert!(
            poll_once(sleep.as_mut()).is_pending(),
            "a {d:?} sleep completed 1 ms early: a send would start too soon"
        );
        timing.advance(MS);
    } else {
        timing.advance(d);
    }
    assert!(
        poll_once(sleep.as_mut()).is_ready(),
        "a {d:?} sleep did not complete on time"
    );
    drop(sleep);
    assert_eq!(timing.pending_timers(), 0, "sleep left a timer behind");
}

/// What happens on the wire during one send, in order, as the thin driver
/// plays it to the machine.
#[derive(Debug, Clone)]
enum Wire {
    /// The request is not reported sent (a failure while connecting).
    Unsent,
    /// Time passes before the next event.
    After(Duration),
    /// The platform goes offline.
    Offline,
    /// The response head with this status.
    Head(u16),
    /// A response head with its headers.
    HeadWith(u16, Vec<(String, String)>),
    /// A body chunk.
    Chunk(&'static str),
    /// A body chunk of a vector.
    Text(String),
    /// A keepalive comment every this long, until the machine's deadline.
    KeepaliveEvery(Duration),
    /// A keepalive comment now, then one every this long (a race plays
    /// [`Wire::KeepaliveEvery`] as a wait and this).
    KeepaliveTick(Duration),
    /// The body's clean end.
    End,
    /// The attempt fails with this evidence.
    Error(Failure),
    /// Nothing more arrives: the machine's next deadline passes.
    Silence(&'static str),
    /// The caller cancels.
    Cancel,
}

/// Chunks of the scripted protocol: OpenAI Chat, or (for a script whose
/// stream can be resumed) an SSE endpoint declared resumable, whose events
/// carry ids.
struct Chunks {
    semantic: &'static str,
    preamble: &'static str,
    keepalive: &'static str,
    strong: &'static str,
    finish_only: &'static str,
}

const CHAT: Chunks = Chunks {
    semantic: "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
    preamble: "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
    keepalive: ": keepalive\n\n",
    strong: "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    finish_only: "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
};

const RESUMABLE_SSE: Chunks = Chunks {
    semantic: "id: 1\ndata: Hi\n\n",
    preamble: ": open\n\n",
    keepalive: ": keepalive\n\n",
    strong: "id: 2\ndata: [DONE]\n\n",
    finish_only: "id: 2\ndata: [DONE]\n\n",
};

impl Step {
    /// The step as wire events.
    fn wire(&self, c: &Chunks) -> Vec<Wire> {
        let wait = |after: &Duration| (!after.is_zero()).then_some(Wire::After(*after));
        match self {
            Step::Fail {
                after,
                failure,
                commit,
                offline,
            } => {
                let mut w = Vec::new();
                if *commit {
                    w.extend([Wire::Head(200), Wire::Chunk(c.semantic)]);
                }
                w.extend(wait(after));
                if *offline {
                    w.push(Wire::Offline);
                }
                w.push(Wire::Error(failure.clone()));
                w
            }
            Step::HeadTimeout { phase } => {
                let mut w = Vec::new();
                if *phase == Phase::Connecting {
                    w.push(Wire::Unsent);
                }
                w.push(Wire::Silence("head_timer"));
                w
            }
            Step::Watchdog { commit, .. } => vec![
                Wire::Head(200),
                Wire::Chunk(if *commit { c.semantic } else { c.keepalive }),
                Wire::Silence("watchdog"),
            ],
            Step::Succeed {
                after,
                proof,
                commit,
            } => {
                let mut w = vec![Wire::Head(200)];
                if *commit {
                    w.push(Wire::Chunk(c.semantic));
                }
                w.extend(wait(after));
                w.push(Wire::Chunk(match proof {
                    Proof::Strong => c.strong,
                    Proof::FinishReasonOnly => c.finish_only,
                }));
                w.push(Wire::End);
                w
            }
            Step::Played(p) => {
                let mut w = Vec::new();
                let failing = |w: &mut Vec<Wire>| {
                    if p.offline {
                        w.push(Wire::Offline);
                    }
                };
                match &p.head {
                    PlayedHead::Status { status, headers } => {
                        w.extend(wait(&ms(p.head_at_ms)));
                        w.push(Wire::HeadWith(*status, headers.clone()));
                    }
                    PlayedHead::Fails { transport, phase } => {
                        if matches!(phase, Phase::Connecting) {
                            w.insert(0, Wire::Unsent);
                        }
                        failing(&mut w);
                        w.push(Wire::Error(Failure::transport(*transport, *phase)));
                        return w;
                    }
                    PlayedHead::Never => {
                        failing(&mut w);
                        w.push(if p.cancel_awaiting {
                            Wire::Cancel
                        } else {
                            Wire::Silence("head_timer")
                        });
                        return w;
                    }
                }
                let mut last = p.head_at_ms;
                for (chunk, &at) in p.chunks.iter().zip(&p.chunks_at_ms) {
                    w.extend(wait(&ms(at - last)));
                    w.push(Wire::Text(chunk.clone()));
                    last = at;
                }
                if let Some(every) = p.keepalive_every_ms {
                    w.push(Wire::KeepaliveEvery(ms(every)));
                }
                failing(&mut w);
                w.push(match p.end {
                    WireEnd::Eof => Wire::End,
                    WireEnd::Reset => {
                        Wire::Error(Failure::transport(TransportKind::Reset, Phase::Streaming))
                    }
                    WireEnd::Hang => Wire::Silence("watchdog"),
                    WireEnd::ConsumerDrop | WireEnd::ConsumerCancel => Wire::Cancel,
                });
                w
            }
            Step::Cancel {
                after,
                phase,
                commit,
            } => {
                let mut w = Vec::new();
                match phase {
                    CancelPhase::Sending => w.push(Wire::Unsent),
                    CancelPhase::Streaming => {
                        w.push(Wire::Head(200));
                        w.push(Wire::Chunk(if *commit { c.semantic } else { c.preamble }));
                    }
                    _ => {}
                }
                w.extend(wait(after));
                w.push(Wire::Cancel);
                w
            }
        }
    }
}

/// How long until a lane's next event, waits merged (`None`: nothing more
/// comes).
fn due_in(wire: &std::collections::VecDeque<Wire>) -> Option<Duration> {
    let mut d = Duration::ZERO;
    for event in wire {
        match event {
            Wire::After(a) => d += *a,
            Wire::Silence(_) => return None,
            _ => return Some(d),
        }
    }
    None
}

/// `by` has passed for a lane: its leading waits shrink.
fn elapse(wire: &mut std::collections::VecDeque<Wire>, mut by: Duration) {
    while !by.is_zero() {
        match wire.front_mut() {
            Some(Wire::After(a)) if *a > by => {
                *a -= by;
                return;
            }
            Some(Wire::After(a)) => {
                by -= *a;
                wire.pop_front();
            }
            _ => return,
        }
    }
}

/// A scripted head: a status and its headers (an SSE stream by default).
struct ScriptedHead(u16, Vec<(String, String)>);

impl Head for ScriptedHead {
    fn status(&self) -> u16 {
        self.0
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        self.1
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| Cow::Borrowed(v.as_str()))
    }
}

fn sse_head() -> Vec<(String, String)> {
    vec![("content-type".into(), "text/event-stream".into())]
}

/// The thin driver: plays the script's wire events to the machine, and does
/// what the machine says (waits on the virtual clock, asks the scripted
/// hooks), as every driver does.
struct Driver {
    /// The virtual clock and the scripted connectivity: the machine's `Env`.
    env: (ManualTiming, ScriptedConnectivity),
    ex: Exchange<Vec<u8>>,
    chunks: &'static Chunks,
    script: Script,
    steps: std::vec::IntoIter<Step>,
    hooks: std::vec::IntoIter<Hook>,
    parks: std::vec::IntoIter<Park>,
    wire: std::collections::VecDeque<Wire>,
    /// What the hedge's send does on the wire, while one races.
    hedge: std::collections::VecDeque<Wire>,
    events: Vec<LifecycleEvent>,
    sends: Vec<(Instant, u32)>,
    slept: Duration,
    log: Vec<&'static str>,
    hook_calls: Vec<HookCall>,
    waits_seen: usize,
    delivered: Vec<u8>,
    requests: Vec<String>,
    bodies: Vec<String>,
}

impl Driver {
    fn drain(&mut self) {
        self.events.extend(self.ex.drain_events());
    }

    /// Waits for the machine's next deadline, exactly: pending at `d − 1 ms`,
    /// due at `d` (then [`Exchange::handle_timeout`]).
    fn until_deadline(&mut self) -> Duration {
        let deadline = self
            .ex
            .poll_timeout()
            .expect("the machine waits on a deadline");
        let d = deadline.saturating_since(self.env.0.now());
        if d >= MS {
            sleep_exactly(&self.env.0, d.saturating_sub(MS));
            let env = &self.env;
            self.ex.handle_timeout(env.0.now());
            assert_eq!(
                self.ex.poll_timeout(),
                Some(deadline),
                "a deadline passed 1 ms early"
            );
            sleep_exactly(&self.env.0, MS);
        } else {
            sleep_exactly(&self.env.0, d);
        }
        let env = &self.env;
        self.ex.handle_timeout(env.0.now());
        d
    }

    /// The next wire event of the current send.
    fn next_wire(&mut self) -> Wire {
        self.wire
            .pop_front()
            .expect("the machine waits on the wire but the step has nothing more")
    }

    /// Plays wire events until one the machine has to take.
    fn play(&mut self) {
        loop {
            match self.next_wire() {
                Wire::After(d) => {
                    self.log.push("response");
                    // The machine's checks fall inside the wait; none of them
                    // may find a deadline passed.
                    let end = self.env.0.now() + d;
                    while let Some(t) = self.ex.poll_timeout().filter(|t| *t <= end) {
                        sleep_exactly(&self.env.0, t.saturating_since(self.env.0.now()));
                        let env = &self.env;
                        self.ex.handle_timeout(env.0.now());
                        let before = self.events.len();
                        self.drain();
                        if self.events[before..]
                            .iter()
                            .any(|e| matches!(e.kind, EventKind::HedgeStarted { .. }))
                        {
                            // A hedge is due: the machine says so at its
                            // next poll, and the wait goes on in the race.
                            let left = end.saturating_since(self.env.0.now());
                            self.wire.push_front(Wire::After(left));
                            return;
                        }
                        assert!(
                            self.ex.poll_timeout().is_none_or(|next| next > t),
                            "a scripted delay reaches past the machine's deadline"
                        );
                        self.drain();
                        assert!(
                            !self.events.iter().any(|e| matches!(
                                e.kind,
                                EventKind::AttemptFailed { .. }
                            ) && e.identity.wire_attempt
                                == self.ex.ledger().wire_attempt()),
                            "a scripted delay reaches past the machine's deadline"
                        );
                    }
                    sleep_exactly(&self.env.0, end.saturating_since(self.env.0.now()));
                }
                Wire::Offline => self.env.1.set_online(false),
                Wire::Unsent => {}
                Wire::Head(status) => {
                    let env = &self.env;
                    self.ex.on_head(
                        env.0.now(),
                        env.0.wall_now(),
                        &ScriptedHead(status, sse_head()),
                        None,
                    );
                    return;
                }
                Wire::HeadWith(status, headers) => {
                    let env = &self.env;
                    self.ex.on_head(
                        env.0.now(),
                        env.0.wall_now(),
                        &ScriptedHead(status, headers),
                        None,
                    );
                    return;
                }
                Wire::Text(text) => {
                    let env = &self.env;
                    if let Some(chunk) = self.ex.on_chunk(env.0.now(), text.into_bytes()) {
                        self.delivered.extend(chunk);
                    }
                    return;
                }
                Wire::KeepaliveEvery(every) => {
                    // Keepalives go on until the machine stops reading.
                    self.wire.push_front(Wire::KeepaliveEvery(every));
                    let due = self.ex.poll_timeout().expect("a stream has a deadline");
                    if due <= self.env.0.now() + every {
                        self.until_deadline();
                    } else {
                        sleep_exactly(&self.env.0, every);
                        let env = &self.env;
                        let _ = self.ex.on_chunk(env.0.now(), b": keepalive\n\n".to_vec());
                    }
                    return;
                }
                Wire::KeepaliveTick(every) => {
                    self.wire.push_front(Wire::KeepaliveEvery(every));
                    let env = &self.env;
                    let _ = self.ex.on_chunk(env.0.now(), b": keepalive\n\n".to_vec());
                    return;
                }
                Wire::Chunk(c) => {
                    let env = &self.env;
                    if let Some(chunk) = self.ex.on_chunk(env.0.now(), c.as_bytes().to_vec()) {
                        self.delivered.extend(chunk);
                    }
                    return;
                }
                Wire::End => {
                    let env = &self.env;
                    self.ex.on_end(env.0.now());
                    return;
                }
                Wire::Error(failure) => {
                    let env = &self.env;
                    self.ex.on_error(env.0.now(), failure);
                    return;
                }
                Wire::Silence(what) => {
                    if !what.is_empty() {
                        self.log.push(what);
                    }
                    // Silent until the machine stops waiting (its checks
                    // find nothing new).
                    self.wire.push_front(Wire::Silence(""));
                    self.until_deadline();
                    return;
                }
                Wire::Cancel => {
                    let env = &self.env;
                    self.ex.cancel(env.0.now());
                    return;
                }
            }
        }
    }

    /// One step of a race: the earliest of the two attempts' next wire
    /// events and the machine's deadline happens (on a tie, the deadline,
    /// then the first attempt's event, then the hedge's).
    fn race(&mut self) {
        for w in [&mut self.wire, &mut self.hedge] {
            if let Some(Wire::KeepaliveEvery(every)) = w.front().cloned() {
                w.pop_front();
                w.push_front(Wire::KeepaliveTick(every));
                w.push_front(Wire::After(every));
            }
        }
        let now = self.env.0.now();
        let deadline = self.ex.poll_timeout().map(|t| t.saturating_since(now));
        let candidates = [
            (deadline, None),
            (due_in(&self.wire), Some(Role::First)),
            (due_in(&self.hedge), Some(Role::Hedge)),
        ];
        let (d, role) = candidates
            .into_iter()
            .filter_map(|(d, role)| d.map(|d| (d, role)))
            .min_by_key(|(d, _)| *d)
            .expect("a race waits on nothing");
        self.env.0.advance(d);
        elapse(&mut self.wire, d);
        elapse(&mut self.hedge, d);
        let now = self.env.0.now();
        let Some(role) = role else {
            self.ex.handle_timeout(now);
            return;
        };
        let lane = match role {
            Role::First => &mut self.wire,
            Role::Hedge => &mut self.hedge,
        };
        loop {
            match lane.pop_front().expect("a lane's event is due") {
                Wire::Offline => self.env.1.set_online(false),
                Wire::Unsent => {}
                Wire::Head(status) => {
                    let head = ScriptedHead(status, sse_head());
                    let wall = self.env.0.wall_now();
                    return self.ex.on_head_of(role, now, wall, &head, None);
                }
                Wire::HeadWith(status, headers) => {
                    let wall = self.env.0.wall_now();
                    let head = ScriptedHead(status, headers);
                    return self.ex.on_head_of(role, now, wall, &head, None);
                }
                Wire::Text(text) => {
                    if let Some(c) = self.ex.on_chunk_of(role, now, text.into_bytes()) {
                        self.delivered.extend(c);
                    }
                    return;
                }
                Wire::Chunk(c) => {
                    if let Some(c) = self.ex.on_chunk_of(role, now, c.as_bytes().to_vec()) {
                        self.delivered.extend(c);
                    }
                    return;
                }
                Wire::KeepaliveTick(every) => {
                    lane.push_front(Wire::KeepaliveEvery(every));
                    let _ = self.ex.on_chunk_of(role, now, b": keepalive\n\n".to_vec());
                    return;
                }
                Wire::End => return self.ex.on_end_of(role, now),
                Wire::Error(failure) => return self.ex.on_error_of(role, now, failure),
                Wire::Cancel => return self.ex.cancel(now),
                other => panic!("{other:?} is not an event a race plays"),
            }
        }
    }

    fn send(&mut self, kind: Send) {
        let target = self.ex.target();
        self.send_to(kind, target, Role::First);
    }

    /// Records a send of `kind` to `target` as `role`'s attempt and takes
    /// the script's next step for it.
    fn send_to(&mut self, kind: Send, target: usize, role: Role) {
        self.sends
            .push((self.env.0.now(), self.ex.ledger().wire_attempt()));
        let path = |url: &str| {
            url.find("://")
                .and_then(|i| url[i + 3..].find('/').map(|j| url[i + 3 + j..].to_owned()))
                .unwrap_or_else(|| url.to_owned())
        };
        let (method, url, body) = match &self.script.vector {
            Some(v) => match target.checked_sub(1) {
                Some(i) => (
                    v.request.method.clone(),
                    v.alternates[i].rewrite_url(&v.request.path).into_owned(),
                    String::from_utf8_lossy(
                        &v.alternates[i].rewrite_body(v.request.body.as_bytes()),
                    )
                    .into_owned(),
                ),
                None => (
                    v.request.method.clone(),
                    v.request.path.clone(),
                    v.request.body.clone(),
                ),
            },
            None => (
                "POST".to_owned(),
                "/v1/chat/completions".to_owned(),
                String::new(),
            ),
        };
        self.bodies.push(match &kind {
            Send::Original => body,
            Send::Resume(r) if r.with_body => body,
            Send::Resume(_) => String::new(),
            Send::Continuation => self
                .script
                .vector
                .as_ref()
                .and_then(|v| v.continuation.as_ref())
                .map_or_else(String::new, |c| c.body.clone()),
            Send::Prefill(b) => String::from_utf8_lossy(b).into_owned(),
        });
        self.requests.push(match kind {
            Send::Original | Send::Prefill(_) => format!("{method} {url}"),
            Send::Resume(r) => match &r.header {
                Some((name, value)) => format!("{} {} {name}={value}", r.method, path(&r.url)),
                None => format!("{} {}", r.method, path(&r.url)),
            },
            Send::Continuation => {
                let c = self
                    .script
                    .vector
                    .as_ref()
                    .and_then(|v| v.continuation.clone());
                c.map_or_else(String::new, |c| format!("{} {}", c.method, c.path))
            }
        });
        // The key the driver would set, with the logical id written `{id}`
        // (each runner draws its own).
        if let (Some(key), Some(line)) = (self.ex.idempotency_key(false), self.requests.last_mut())
        {
            let key = key.replace(self.ex.ledger().logical_id(), "{id}");
            line.push_str(" idempotency-key=");
            line.push_str(&key);
        }
        let step = self
            .steps
            .next()
            .expect("the script ran out of steps: the machine sent more than scripted");
        let wire: std::collections::VecDeque<Wire> = step.wire(self.chunks).into();
        let sent = !matches!(wire.front(), Some(Wire::Unsent));
        match role {
            Role::First => self.wire = wire,
            Role::Hedge => self.hedge = wire,
        }
        if sent {
            let env = &self.env;
            self.ex.on_sent_of(role, env.0.now());
        }
    }

    fn sleep(&mut self) {
        let index = self.waits_seen;
        self.waits_seen += 1;
        self.log.push("backoff");
        let deadline = self.ex.poll_timeout().expect("a wait has its end");
        let delay = deadline.saturating_since(self.env.0.now());
        // A cancel point past the end of its wait never happens.
        if let Some((i, at)) = self.script.cancel_in_wait
            && i == index
            && at < delay
        {
            self.env.0.advance(at);
            self.slept += at;
            let env = &self.env;
            self.ex.handle_timeout(env.0.now());
            self.ex.cancel(env.0.now());
            return;
        }
        let slept = self.until_deadline();
        self.slept += slept;
        if !self.script.oversleep.is_zero() {
            self.env.0.advance(self.script.oversleep);
        }
    }

    fn park(&mut self) {
        self.log.push("online");
        let mut wait = Box::pin(self.env.1.wait_until_online());
        assert!(poll_once(wait.as_mut()).is_pending(), "parked while online");
        match self.parks.next() {
            Some(Park::OnlineAfter(d)) => {
                self.env.0.advance(d);
                assert!(poll_once(wait.as_mut()).is_pending());
                self.env.1.set_online(true);
                assert!(poll_once(wait.as_mut()).is_ready());
                let env = &self.env;
                self.ex.online(env.0.now());
            }
            Some(Park::CancelAfter(d)) => {
                self.env.0.advance(d);
                assert!(poll_once(wait.as_mut()).is_pending());
                let env = &self.env;
                self.ex.cancel(env.0.now());
            }
            // Nothing said: the network never comes back, and the park
            // ends at its bound.
            None => {
                drop(wait);
                self.until_deadline();
            }
        }
    }

    fn ask(&mut self, request: AdmissionRequest) {
        self.log.push("admission");
        self.hook_calls.push(HookCall {
            logical_id: request.logical_id,
            next_attempt: request.next_attempt,
            progress: request.failure.progress,
            failure: request.failure,
        });
        let hook = self
            .hooks
            .next()
            .expect("admission asked but the script has no hook answer left");
        match hook {
            Hook::Answer { after, answer } => {
                sleep_exactly(&self.env.0, after);
                let env = &self.env;
                self.ex.admission(env.0.now(), answer);
            }
            Hook::CancelAfter(after) => {
                self.env.0.advance(after);
                let env = &self.env;
                self.ex.cancel(env.0.now());
            }
            // Pending is not approval: the machine's bound ends the wait.
            Hook::Never => {
                self.until_deadline();
            }
        }
    }
}

/// Runs `script` to its end and checks the global invariants.
pub(super) fn run(script: Script) -> Run {
    let timing = ManualTiming::new(0).with_wall_clock(script.wall);
    let timing = match &script.jitter {
        Jitter::Pinned(f) => timing.with_pinned_jitter(Fraction::new(*f)),
        Jitter::Seeded(seed) => ManualTiming::new(*seed).with_wall_clock(script.wall),
        Jitter::Scripted(draws) => {
            timing.script_jitter(draws.iter().map(|f| Fraction::new(*f)));
            timing.with_pinned_jitter(Fraction::new(0.5))
        }
    };
    let allowance = AttemptAllowance::new(script.policy.max_attempts().get());
    let (protocol, method, url, body, chunks) = match &script.vector {
        Some(v) => (
            v.protocol.clone(),
            v.request.method.clone(),
            v.request.path.clone(),
            v.request.body.clone(),
            &CHAT,
        ),
        None if script.resume_possible => {
            let sse = ProtocolKind::Sse {
                terminal_sentinel: Some(SseTerminal::Data("[DONE]".into())),
            };
            (
                sse,
                "POST".into(),
                "/stream".into(),
                "{}".into(),
                &RESUMABLE_SSE,
            )
        }
        None => (
            ProtocolKind::OpenAiChat,
            "POST".into(),
            "/v1/chat/completions".into(),
            r#"{"stream":true}"#.into(),
            &CHAT,
        ),
    };
    let request = RequestFacts::new(&method, &url, body.as_bytes());
    let resumable_sse =
        script.resume_possible || script.vector.as_ref().is_some_and(|v| v.resumable_sse);
    let continuation = script
        .vector
        .as_ref()
        .is_some_and(|v| v.continuation.is_some());
    // A vector run shares a cooldown store, as every driver does.
    let cooldown = script.vector.as_ref().map(|v| {
        let store = Arc::new(Cooldowns::new());
        let key = cooldown::key_of(&url, &request.fields());
        if let Some(wait) = v.cooldown_ms {
            store.note(&key, timing.now(), Duration::from_millis(wait));
        }
        (store, key)
    });
    let choice = ProtocolChoice::Fixed(protocol);
    let mut setup = Setup::new(
        script.policy.clone(),
        &choice,
        request,
        allowance.clone(),
        0x2a,
    )
    .admission_hook(script.hook.is_some())
    .resumable_sse(resumable_sse)
    .continuation_hook(continuation)
    .jitter(timing.jitter_source());
    if let Some(b) = &script.retry_budget {
        setup = setup.retry_budget(Arc::new(b.clone()));
    }
    if let Some(d) = script.deadline {
        setup = setup.deadline(timing.now().saturating_add(d));
    }
    if let Some(r) = script.replay_disabled {
        setup = setup.without_replay(r);
    }
    if let Some((store, key)) = &cooldown {
        setup = setup.cooldown(store.clone(), key.clone());
    }
    if let Some(v) = &script.vector {
        setup = setup
            .alternates(&v.alternates)
            .context_window(v.context_window)
            .prefill(v.prefill);
    }
    let ex = setup.start(timing.now());
    let mut d = Driver {
        ex,
        chunks,
        steps: script.steps.clone().into_iter(),
        hooks: script.hook.clone().unwrap_or_default().into_iter(),
        parks: script.parks.clone().into_iter(),
        env: (timing, ScriptedConnectivity::new(true)),
        script,
        wire: std::collections::VecDeque::new(),
        hedge: std::collections::VecDeque::new(),
        events: Vec::new(),
        sends: Vec::new(),
        slept: Duration::ZERO,
        log: Vec::new(),
        hook_calls: Vec::new(),
        waits_seen: 0,
        delivered: Vec::new(),
        requests: Vec::new(),
        bodies: Vec::new(),
    };
    for turn in 0.. {
        let io = d.ex.poll(d.env.0.now(), d.env.1.is_online());
        d.drain();
        assert!(
            turn < 10_000,
            "the machine does not move on: {io:?} at {:?}",
            d.env.0.now()
        );
        match io {
            Io::Send(kind) => d.send(kind),
            Io::Hedge { target } => d.send_to(Send::Original, target, Role::Hedge),
            Io::AwaitHead | Io::Read => d.play(),
            Io::Race => d.race(),
            Io::ReleaseHedge => d.hedge.clear(),
            Io::Promote => d.wire = std::mem::take(&mut d.hedge),
            Io::Release | Io::Respond | Io::RespondError => {}
            Io::Deliver(Chunk::Read(c)) => d.delivered.extend(c),
            Io::Deliver(Chunk::Made(b)) => d.delivered.extend_from_slice(&b),
            Io::Sleep => d.sleep(),
            Io::WaitOnline => d.park(),
            Io::AskAdmission(request) => d.ask(request),
            Io::AwaitAdmission => panic!("the scripted hook answers when asked"),
            Io::AskContinuation => {
                let given = d
                    .script
                    .vector
                    .as_ref()
                    .is_some_and(|v| v.continuation.is_some());
                let env = &d.env;
                d.ex.continuation(env.0.now(), given);
            }
            Io::End(_) => break,
        }
        d.drain();
    }
    d.drain();
    let report = d.ex.ledger().report().clone();
    let waits = report
        .delays
        .iter()
        .map(|r| {
            let resume = report
                .attempts
                .get(r.after_attempt as usize)
                .is_some_and(|a| a.resume);
            (r.delay_ms, r.cause, resume)
        })
        .collect();
    let run = Run {
        outcome: d.ex.ledger().outcome().cloned().expect("the request ended"),
        events: d.events,
        sends: d.sends,
        waits,
        slept: d.slept,
        log: d.log,
        hook_calls: d.hook_calls,
        report,
        allowance_used: allowance.used(),
        end: d.env.0.now(),
        timing: d.env.0.clone(),
        delivered: d.delivered,
        requests: d.requests,
        bodies: d.bodies,
        cooldown_left: cooldown
            .and_then(|(store, key)| store.remaining(&key, d.env.0.now()))
            .unwrap_or_default(),
    };
    check_invariants(&run, &d.script.policy);
    run
}

/// LC1, G2, G9, G12, asserted after every run.
pub(super) fn check_invariants(run: &Run, policy: &RecoveryPolicy) {
    let names = run.names();
    // LC1: exactly one terminal event, and it is the last one.
    let terminals: Vec<_> = run.events.iter().filter(|e| e.kind.is_terminal()).collect();
    assert_eq!(
        terminals.len(),
        1,
        "LC1: exactly one terminal event: {names:?}"
    );
    assert!(
        run.events.last().is_some_and(|e| e.kind.is_terminal()),
        "LC1: the terminal event is last: {names:?}"
    );
    // G2: sends bounded, debited before they were made.
    let max = policy.max_attempts().get() as usize;
    assert!(
        run.sends.len() <= max,
        "G2: {} sends > {max}",
        run.sends.len()
    );
    assert_eq!(
        run.allowance_used as usize,
        run.sends.len(),
        "G2: one debit per send"
    );
    assert_eq!(run.report.attempt_count() as usize, run.sends.len());
    // G9: attempt numbers contiguous from 1.
    let started: Vec<u32> = run
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::AttemptStarted { .. }))
        .map(|e| e.identity.wire_attempt)
        .collect();
    let want: Vec<u32> = (1..=run.sends.len() as u32).collect();
    assert_eq!(started, want, "G9: contiguous attempt numbers: {names:?}");
    let sent: Vec<u32> = run.sends.iter().map(|s| s.1).collect();
    assert_eq!(sent, want);
    // Event attempt numbers never go backwards (but for the attempts of a
    // hedging race, which run side by side), and the clock neither.
    let raced = |n: u32| {
        run.report
            .attempts
            .iter()
            .any(|a| a.wire_attempt == n && a.role.is_some())
    };
    for pair in run.events.windows(2) {
        let (a, b) = (pair[0].identity.wire_attempt, pair[1].identity.wire_attempt);
        assert!(
            a <= b || raced(a) && raced(b),
            "attempts go backwards: {names:?}"
        );
        assert!(
            pair[0].at <= pair[1].at,
            "event times go backwards: {names:?}"
        );
    }
    // G9 ordering: a send after the first follows a failure, a scheduled
    // delay (or a failover, which sends at once) and `retry_started`, in
    // that order, after the send before it; a hedge follows its
    // `hedge_started`.
    for n in 2..=run.sends.len() as u32 {
        let pos = |pred: &dyn Fn(&LifecycleEvent) -> bool| run.events.iter().position(pred);
        let last_before = |end: usize, pred: &dyn Fn(&LifecycleEvent) -> bool| {
            run.events[..end].iter().rposition(pred)
        };
        let start = pos(&|e| {
            e.identity.wire_attempt == n && matches!(e.kind, EventKind::AttemptStarted { .. })
        })
        .expect("attempt_started");
        let previous = pos(&|e| {
            e.identity.wire_attempt == n - 1 && matches!(e.kind, EventKind::AttemptStarted { .. })
        })
        .expect("attempt_started");
        if raced(n) && run.report.attempts[n as usize - 1].role == Some(crate::report::Role::Hedge)
        {
            let hedged = last_before(
                start,
                &|e| matches!(e.kind, EventKind::HedgeStarted { hedge, .. } if hedge == n),
            )
            .expect("G9: hedge_started before the hedge's send");
            assert!(previous < hedged, "G9 order: {names:?}");
            continue;
        }
        let failed = last_before(start, &|e| {
            matches!(e.kind, EventKind::AttemptFailed { .. })
        })
        .expect("G9: attempt_failed before the next send");
        let delay = last_before(start, &|e| {
            matches!(
                e.kind,
                EventKind::DelayScheduled { .. } | EventKind::Failover { .. }
            )
        })
        .expect("G9: delay_scheduled (or failover) before the next send");
        let retry = last_before(start, &|e| {
            matches!(e.kind, EventKind::RetryStarted | EventKind::ResumeStarted)
        })
        .expect("G9: retry_started before the next send");
        assert!(
            previous < failed && failed < delay && delay < retry && retry < start,
            "G9 order: {names:?}"
        );
    }
    // Terminal event and report agree with the outcome.
    assert_eq!(run.report.outcome.as_ref(), Some(&run.outcome));
    let attempts = match &run.terminal().kind {
        EventKind::Completed { attempts, .. }
        | EventKind::Exhausted { attempts, .. }
        | EventKind::Interrupted { attempts, .. }
        | EventKind::Cancelled { attempts, .. } => *attempts,
        _ => unreachable!(),
    };
    assert_eq!(
        attempts as usize,
        run.sends.len(),
        "terminal counts the sends"
    );
    match (&run.terminal().kind, &run.outcome) {
        (EventKind::Completed { .. }, Outcome::Completed { .. })
        | (EventKind::Cancelled { .. }, Outcome::Cancelled { .. }) => {}
        (EventKind::Exhausted { outcome, .. } | EventKind::Interrupted { outcome, .. }, o) => {
            assert_eq!(outcome, o);
            assert!(!o.is_completed() && !matches!(o, Outcome::Cancelled { .. }));
        }
        (e, o) => panic!("terminal event {e:?} does not match outcome {o:?}"),
    }
    // G3: completed only after an attempt_succeeded.
    if run.outcome.is_completed() {
        assert!(names.contains(&"attempt_succeeded"), "G3: {names:?}");
    }
    // G12: no timer left behind.
    assert_eq!(run.timing.pending_timers(), 0, "G12: pending timers");
    // G7: no wait ended after a deadline.
    if let Some(deadline) = policy.deadline() {
        for (at, n) in &run.sends {
            if *n > 1 {
                assert!(
                    at.since_origin() <= deadline,
                    "G7: send {n} after the deadline"
                );
            }
        }
    }
}
