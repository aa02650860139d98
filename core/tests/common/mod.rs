//! A scripted driver for the engine: it executes the engine's actions on the
//! virtual clock ([`ManualTiming`]) the way a real driver would, so that every
//! engine test reads as a script of failures.
//!
//! Each wait goes through `Timing::sleep`, polled with a no-op waker: the
//! driver advances `d − 1 ms` and asserts the sleep is still pending (no
//! send), then `+1 ms` and asserts it completed (the send follows). After every
//! run the harness asserts the global lifecycle invariants (LC1, G9, G12).
#![allow(dead_code)]

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use recovery_core::budget::{AttemptAllowance, RetryBudget};
use recovery_core::decision::{Action, AdmissionAnswer, DelayCause};
use recovery_core::engine::Recovery;
use recovery_core::failure::{Failure, FailureKind, Phase, Stall};
use recovery_core::lifecycle::{CommitTrigger, EventKind, LifecycleEvent};
use recovery_core::outcome::{CancelPhase, Outcome, ReplayDisabled};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::progress::{Progress, Proof, SemanticKind};
use recovery_core::report::RecoveryReport;
use recovery_core::timing::{
    Connectivity, Fraction, Instant, ManualTiming, ScriptedConnectivity, Timing,
};

pub const MS: Duration = Duration::from_millis(1);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The matrix's test policy (reliability-matrix.md §1): 3 attempts, backoff
/// 0.5 s / 8 s, Retry-After ceiling 60 s, recovery budget 120 s, statuses
/// 408, 409, 429, 500, 502, 503, 504, 529.
pub fn test_policy() -> RecoveryPolicy {
    test_builder().build().expect("test policy")
}

pub fn test_builder() -> recovery_core::policy::PolicyBuilder {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).expect("3"))
        .backoff(ms(500), secs(8))
        .budget(Some(secs(120)))
        .retryable_statuses([408, 409, 429, 500, 502, 503, 504, 529])
}

/// Progress with `n` observed (not yet delivered) fragments of `kind`.
pub fn observed(kind: SemanticKind, n: u64) -> Progress {
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
pub fn keepalives_only(n: u64) -> Progress {
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
pub enum Step {
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
}

pub fn fail(failure: Failure) -> Step {
    Step::Fail {
        after: Duration::ZERO,
        failure,
        commit: false,
        offline: false,
    }
}

pub fn fail_after(after: Duration, failure: Failure) -> Step {
    Step::Fail {
        after,
        failure,
        commit: false,
        offline: false,
    }
}

pub fn commit_then_fail(failure: Failure) -> Step {
    Step::Fail {
        after: Duration::ZERO,
        failure,
        commit: true,
        offline: false,
    }
}

pub fn fail_offline(failure: Failure) -> Step {
    Step::Fail {
        after: Duration::ZERO,
        failure,
        commit: false,
        offline: true,
    }
}

pub fn succeed() -> Step {
    Step::Succeed {
        after: Duration::ZERO,
        proof: Proof::Strong,
        commit: true,
    }
}

pub fn succeed_after(after: Duration) -> Step {
    Step::Succeed {
        after,
        proof: Proof::Strong,
        commit: true,
    }
}

pub fn status(code: u16) -> Failure {
    Failure::status(code, recovery_core::retry_after::RetryAfter::Absent, None)
}

/// What the admission hook does when asked.
#[derive(Debug, Clone, Copy)]
pub enum Hook {
    /// Answers after `after`.
    Answer {
        after: Duration,
        answer: AdmissionAnswer,
    },
    /// The caller cancels while the hook is pending.
    CancelAfter(Duration),
}

pub fn answer(answer: AdmissionAnswer) -> Hook {
    Hook::Answer {
        after: Duration::ZERO,
        answer,
    }
}

/// What happens while parked offline.
#[derive(Debug, Clone, Copy)]
pub enum Park {
    /// The platform comes back online after this long.
    OnlineAfter(Duration),
    /// The caller cancels after this long.
    CancelAfter(Duration),
}

/// How jitter is drawn.
#[derive(Debug, Clone)]
pub enum Jitter {
    Pinned(f64),
    Seeded(u64),
    Scripted(Vec<f64>),
}

/// A whole scenario.
#[derive(Debug, Clone)]
pub struct Script {
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
}

impl Script {
    pub fn new(policy: RecoveryPolicy, steps: Vec<Step>) -> Self {
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
        }
    }

    pub fn hook(mut self, answers: Vec<Hook>) -> Self {
        self.hook = Some(answers);
        self
    }

    pub fn jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    pub fn run(self) -> Run {
        run(self)
    }
}

/// What the admission hook was shown.
#[derive(Debug, Clone, PartialEq)]
pub struct HookCall {
    pub logical_id: String,
    pub next_attempt: u32,
    pub failure: Failure,
    pub progress: Progress,
}

/// What a run did.
#[derive(Debug, Clone)]
pub struct Run {
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
}

impl Run {
    pub fn names(&self) -> Vec<&'static str> {
        self.events.iter().map(|e| e.kind.name()).collect()
    }

    /// Event names without `committed` (the canonical sequences of
    /// anchors.md §1.2 list transitions only; commit is asserted apart).
    pub fn transitions(&self) -> Vec<&'static str> {
        self.names()
            .into_iter()
            .filter(|n| *n != "committed")
            .collect()
    }

    pub fn send_count(&self) -> usize {
        self.sends.len()
    }

    pub fn terminal(&self) -> &LifecycleEvent {
        self.events.last().expect("events")
    }
}

fn poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    let mut cx = Context::from_waker(Waker::noop());
    f.poll(&mut cx)
}

/// Sleeps `d` on the virtual clock, asserting the sleep is still pending at
/// `d − 1 ms` and complete at `d`.
pub fn sleep_exactly(timing: &ManualTiming, d: Duration) {
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

enum Next {
    Send,
    Done(Outcome),
}

struct Driver {
    timing: ManualTiming,
    conn: ScriptedConnectivity,
    rec: Recovery,
    script: Script,
    steps: std::vec::IntoIter<Step>,
    hooks: std::vec::IntoIter<Hook>,
    parks: std::vec::IntoIter<Park>,
    sends: Vec<(Instant, u32)>,
    waits: Vec<(Duration, DelayCause, bool)>,
    slept: Duration,
    log: Vec<&'static str>,
    hook_calls: Vec<HookCall>,
    cancelled: bool,
    last_failure: Option<Failure>,
    allowance: AttemptAllowance,
}

impl Driver {
    fn now(&self) -> Instant {
        self.timing.now()
    }

    fn jitter(&self) -> Fraction {
        self.timing.jitter()
    }

    fn progress_for_commit() -> Progress {
        let mut p = observed(SemanticKind::Content, 1);
        p.deliver_observed();
        p
    }

    /// Runs one physical send; returns the engine's action after it.
    fn attempt(&mut self) -> Result<Action, Outcome> {
        let step = self
            .steps
            .next()
            .expect("the script ran out of steps: the engine sent more than scripted");
        match step {
            Step::Fail {
                after,
                failure,
                commit,
                offline,
            } => {
                if !after.is_zero() {
                    self.log.push("response");
                    sleep_exactly(&self.timing, after);
                }
                let now = self.now();
                self.rec
                    .head_received(now, failure.status.unwrap_or(200), None);
                if commit {
                    self.rec.commit(now, CommitTrigger::Semantic);
                }
                let mut failure = failure;
                if commit && !failure.progress.blocks_replay() {
                    failure.progress = Self::progress_for_commit();
                }
                if offline {
                    self.conn.set_online(false);
                }
                self.last_failure = Some(failure.clone());
                let online = self.conn.is_online();
                let jitter = self.jitter();
                Ok(self.rec.fail(now, failure, online, jitter))
            }
            Step::HeadTimeout { phase } => {
                let t = self
                    .script
                    .policy
                    .head_timeout()
                    .expect("HeadTimeout needs policy.head_timeout");
                self.log.push("head_timer");
                sleep_exactly(&self.timing, t);
                let failure = Failure::new(FailureKind::Timeout { stall: Stall::Head }, phase);
                self.last_failure = Some(failure.clone());
                let (now, online, jitter) = (self.now(), self.conn.is_online(), self.jitter());
                Ok(self.rec.fail(now, failure, online, jitter))
            }
            Step::Watchdog { stall, commit } => {
                let t = match stall {
                    Stall::Idle => self.script.policy.idle_timeout(),
                    Stall::Progress => self.script.policy.progress_timeout(),
                    Stall::Head => self.script.policy.head_timeout(),
                }
                .expect("Watchdog needs its timeout in the policy");
                let now = self.now();
                self.rec.head_received(now, 200, None);
                let mut progress = keepalives_only(1);
                if commit {
                    self.rec.commit(now, CommitTrigger::Semantic);
                    progress = Self::progress_for_commit();
                }
                self.log.push("watchdog");
                sleep_exactly(&self.timing, t);
                let failure = Failure::new(FailureKind::Timeout { stall }, Phase::Streaming)
                    .with_progress(progress);
                self.last_failure = Some(failure.clone());
                let (now, online, jitter) = (self.now(), self.conn.is_online(), self.jitter());
                Ok(self.rec.fail(now, failure, online, jitter))
            }
            Step::Succeed {
                after,
                proof,
                commit,
            } => {
                let now = self.now();
                self.rec.head_received(now, 200, None);
                let mut progress = Progress::default();
                if commit {
                    self.rec.commit(now, CommitTrigger::Semantic);
                    progress = Self::progress_for_commit();
                } else {
                    self.rec.commit(now, CommitTrigger::Terminal);
                }
                if !after.is_zero() {
                    self.log.push("response");
                    sleep_exactly(&self.timing, after);
                }
                Err(self.rec.succeed(self.now(), proof, progress))
            }
            Step::Cancel {
                after,
                phase,
                commit,
            } => {
                if commit {
                    let now = self.now();
                    self.rec.head_received(now, 200, None);
                    self.rec.commit(now, CommitTrigger::Semantic);
                }
                if !after.is_zero() {
                    sleep_exactly(&self.timing, after);
                }
                self.cancelled = true;
                Err(self.rec.cancel(self.now(), phase))
            }
        }
    }

    /// Executes actions until a send is due or the request ended.
    fn execute(&mut self, mut action: Action) -> Next {
        loop {
            action = match action {
                Action::Fail(outcome) => return Next::Done(outcome),
                Action::AskAdmission => {
                    let hook = self
                        .hooks
                        .next()
                        .expect("admission asked but the script has no hook answer left");
                    let failure = self.last_failure.clone().expect("a failure");
                    self.hook_calls.push(HookCall {
                        logical_id: self.rec.logical_id().to_owned(),
                        next_attempt: self.rec.wire_attempt() + 1,
                        progress: failure.progress,
                        failure,
                    });
                    self.log.push("admission");
                    // The hook's pending future is modelled by a timer.
                    match hook {
                        Hook::Answer { after, answer } => {
                            sleep_exactly(&self.timing, after);
                            let (now, online, jitter) =
                                (self.now(), self.conn.is_online(), self.jitter());
                            self.rec.admission(now, answer, online, jitter)
                        }
                        Hook::CancelAfter(after) => {
                            let mut pending = Box::pin(self.timing.sleep(after + secs(3600)));
                            assert!(poll_once(pending.as_mut()).is_pending());
                            self.timing.advance(after);
                            assert!(poll_once(pending.as_mut()).is_pending());
                            drop(pending); // the hook future is dropped
                            self.cancelled = true;
                            let now = self.now();
                            return Next::Done(self.rec.cancel(now, CancelPhase::Admission));
                        }
                    }
                }
                Action::ParkUntilOnline => {
                    let park = self
                        .parks
                        .next()
                        .expect("parked but the script says nothing about connectivity");
                    self.log.push("online");
                    let mut wait = Box::pin(self.conn.wait_until_online());
                    assert!(poll_once(wait.as_mut()).is_pending(), "parked while online");
                    match park {
                        Park::OnlineAfter(d) => {
                            self.timing.advance(d);
                            assert!(poll_once(wait.as_mut()).is_pending());
                            self.conn.set_online(true);
                            assert!(poll_once(wait.as_mut()).is_ready());
                            let (now, jitter) = (self.now(), self.jitter());
                            self.rec.online_again(now, jitter)
                        }
                        Park::CancelAfter(d) => {
                            self.timing.advance(d);
                            assert!(poll_once(wait.as_mut()).is_pending());
                            drop(wait);
                            self.cancelled = true;
                            let now = self.now();
                            return Next::Done(self.rec.cancel(now, CancelPhase::Parked));
                        }
                    }
                }
                Action::RetryAfter { delay, cause } | Action::Resume { delay, cause } => {
                    let resume = matches!(action, Action::Resume { .. });
                    let index = self.waits.len();
                    self.waits.push((delay, cause, resume));
                    self.log.push("backoff");
                    // A cancel point past the end of its wait never happens.
                    if let Some((i, at)) = self.script.cancel_in_wait {
                        if i == index && at < delay {
                            let mut sleep = Box::pin(self.timing.sleep(delay));
                            assert!(poll_once(sleep.as_mut()).is_pending());
                            self.timing.advance(at);
                            assert!(poll_once(sleep.as_mut()).is_pending());
                            self.slept += at;
                            drop(sleep);
                            assert_eq!(
                                self.timing.pending_timers(),
                                0,
                                "CX1: the backoff timer must be removed on cancel"
                            );
                            self.cancelled = true;
                            let now = self.now();
                            return Next::Done(self.rec.cancel(now, CancelPhase::Waiting));
                        }
                    }
                    sleep_exactly(&self.timing, delay);
                    self.slept += delay;
                    if !self.script.oversleep.is_zero() {
                        self.timing.advance(self.script.oversleep);
                    }
                    return Next::Send;
                }
            };
        }
    }
}

/// Runs `script` to its end and checks the global invariants.
pub fn run(script: Script) -> Run {
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
    let mut rec = Recovery::new(script.policy.clone(), allowance.clone(), 0x2a, timing.now())
        .with_admission_hook(script.hook.is_some());
    if let Some(b) = &script.retry_budget {
        rec = rec.with_retry_budget(b.clone());
    }
    if let Some(d) = script.deadline {
        rec = rec.with_deadline(timing.now().saturating_add(d));
    }
    if let Some(r) = script.replay_disabled {
        rec.disable_replay(r);
    }
    rec.set_resume_possible(script.resume_possible);
    let mut d = Driver {
        conn: ScriptedConnectivity::new(true),
        rec,
        steps: script.steps.clone().into_iter(),
        hooks: script.hook.clone().unwrap_or_default().into_iter(),
        parks: script.parks.clone().into_iter(),
        timing,
        script,
        sends: Vec::new(),
        waits: Vec::new(),
        slept: Duration::ZERO,
        log: Vec::new(),
        hook_calls: Vec::new(),
        cancelled: false,
        last_failure: None,
        allowance,
    };
    let outcome = loop {
        let now = d.now();
        match d.rec.begin_attempt(now, d.cancelled, false) {
            Err(outcome) => break outcome,
            Ok(n) => d.sends.push((now, n)),
        }
        let action = match d.attempt() {
            Ok(action) => action,
            Err(outcome) => break outcome,
        };
        match d.execute(action) {
            Next::Send => {}
            Next::Done(outcome) => break outcome,
        }
    };
    let events: Vec<_> = d.rec.drain_events().collect();
    let run = Run {
        outcome,
        events,
        sends: d.sends,
        waits: d.waits,
        slept: d.slept,
        log: d.log,
        hook_calls: d.hook_calls,
        report: d.rec.report().clone(),
        allowance_used: d.allowance.used(),
        end: d.timing.now(),
        timing: d.timing.clone(),
    };
    check_invariants(&run, &d.script.policy);
    run
}

/// LC1, G2, G9, G12, asserted after every run.
pub fn check_invariants(run: &Run, policy: &RecoveryPolicy) {
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
    // Event attempt numbers never go backwards, and the clock neither.
    for pair in run.events.windows(2) {
        assert!(pair[0].identity.wire_attempt <= pair[1].identity.wire_attempt);
        assert!(
            pair[0].at <= pair[1].at,
            "event times go backwards: {names:?}"
        );
    }
    // G9 ordering: attempt_failed(n) < delay_scheduled < retry_started <
    // attempt_started(n+1), and no retry without a scheduled delay.
    for n in 2..=run.sends.len() as u32 {
        let pos = |pred: &dyn Fn(&LifecycleEvent) -> bool| run.events.iter().position(pred);
        let failed = pos(&|e| {
            e.identity.wire_attempt == n - 1 && matches!(e.kind, EventKind::AttemptFailed { .. })
        })
        .expect("G9: attempt_failed before the next send");
        let delay = pos(&|e| {
            e.identity.wire_attempt == n - 1 && matches!(e.kind, EventKind::DelayScheduled { .. })
        })
        .expect("G9: delay_scheduled before the next send");
        let retry = pos(&|e| {
            e.identity.wire_attempt == n - 1
                && matches!(e.kind, EventKind::RetryStarted | EventKind::ResumeStarted)
        })
        .expect("G9: retry_started before the next send");
        let start = pos(&|e| {
            e.identity.wire_attempt == n && matches!(e.kind, EventKind::AttemptStarted { .. })
        })
        .expect("attempt_started");
        assert!(
            failed < delay && delay < retry && retry < start,
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
