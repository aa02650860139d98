//! Resume at engine level: a committed stream with a resume strategy is
//! continued (`Action::Resume`), resumes share the attempt allowance, are
//! capped by `max_resumes`, and a resume that fails for good ends as
//! `Interrupted{resume_failed}` (RS3, RS4, RS6).

use std::num::NonZeroU32;
use std::time::Duration;

use crate::budget::AttemptAllowance;
use crate::decision::Action;
use crate::exchange::course::Course as Recovery;
use crate::failure::{Failure, Phase, TransportKind};
use crate::lifecycle::CommitTrigger;
use crate::outcome::{InterruptCause, Outcome};
use crate::policy::RecoveryPolicy;
use crate::progress::{Progress, SemanticKind};
use crate::retry_after::RetryAfter;
use crate::timing::{Fraction, Instant, JitterSource};

fn at(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

fn committed_reset() -> Failure {
    let mut p = Progress::default();
    p.observe(SemanticKind::Content);
    p.deliver_observed();
    Failure::transport(TransportKind::Reset, Phase::Streaming).with_progress(p)
}

fn engine(max_attempts: u32, max_resumes: u32) -> Recovery {
    let policy = RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(max_attempts).unwrap())
        .max_resumes(max_resumes)
        .build()
        .unwrap();
    let mut r = Recovery::new(
        policy,
        AttemptAllowance::new(max_attempts),
        1,
        JitterSource::pinned(Fraction::HALF),
        at(0),
    );
    r.set_resume_possible(true);
    r
}

fn names(r: &mut Recovery) -> Vec<&'static str> {
    r.ledger.drain_events().map(|e| e.kind.name()).collect()
}

#[test]
fn rs3_resume_answered_404_is_a_failed_resume_never_a_replay() {
    let mut r = engine(3, 1);
    r.begin_attempt(at(0)).unwrap();
    r.commit(at(1), CommitTrigger::Semantic);
    let action = r.fail(at(2), committed_reset(), true);
    assert!(matches!(action, Action::Resume { .. }), "{action:?}");
    assert_eq!(
        r.begin_attempt(at(300)).map(|_| r.ledger.wire_attempt()),
        Ok(2)
    );
    let action = r.fail(
        at(301),
        Failure::status(404, RetryAfter::Absent, None),
        true,
    );
    assert_eq!(
        action,
        Action::Fail(Outcome::Interrupted {
            cause: InterruptCause::ResumeFailed,
            stall: None,
            committed: true,
        })
    );
    assert_eq!(
        names(&mut r),
        [
            "attempt_started",
            "committed",
            "attempt_failed",
            "delay_scheduled",
            "resume_started",
            "attempt_started",
            "attempt_failed",
            "interrupted"
        ]
    );
    assert_eq!(r.ledger.report().resumes, 1);
}

#[test]
fn rs4_rs6_resumes_and_retries_share_one_allowance_and_the_resume_cap() {
    // Three sends in all: the POST and two resumes, the second resume failing
    // before its first event and being retried as a resume (RS6).
    let mut r = engine(3, 5);
    r.begin_attempt(at(0)).unwrap();
    r.commit(at(1), CommitTrigger::Semantic);
    assert!(matches!(
        r.fail(at(2), committed_reset(), true),
        Action::Resume { .. }
    ));
    r.begin_attempt(at(1000)).unwrap();
    let action = r.fail(
        at(1001),
        Failure::status(503, RetryAfter::Absent, None),
        true,
    );
    assert!(matches!(action, Action::Resume { .. }), "{action:?}");
    r.begin_attempt(at(3000)).unwrap();
    let action = r.fail(at(3001), committed_reset(), true);
    assert!(
        matches!(
            action,
            Action::Fail(Outcome::Interrupted {
                cause: InterruptCause::AttemptsExhausted,
                ..
            })
        ),
        "{action:?}"
    );
    assert_eq!(r.ledger.report().attempt_count(), 3, "G2 across resumes");
}

#[test]
fn resume_cap_stops_resuming() {
    let mut r = engine(5, 1);
    r.begin_attempt(at(0)).unwrap();
    r.commit(at(1), CommitTrigger::Semantic);
    assert!(matches!(
        r.fail(at(2), committed_reset(), true),
        Action::Resume { .. }
    ));
    r.begin_attempt(at(1000)).unwrap();
    let action = r.fail(at(1001), committed_reset(), true);
    assert!(
        matches!(action, Action::Fail(Outcome::Interrupted { .. })),
        "one resume allowed: {action:?}"
    );
    assert_eq!(r.ledger.report().resumes, 1);
}

#[test]
fn unsuccessful_terminal_is_never_resumed() {
    let mut r = engine(3, 1);
    r.begin_attempt(at(0)).unwrap();
    r.commit(at(1), CommitTrigger::Semantic);
    let mut f = Failure::new(
        crate::failure::FailureKind::Unsuccessful {
            reason: crate::progress::UnsuccessfulReason::Length,
        },
        Phase::Streaming,
    );
    f.progress = committed_reset().progress;
    let action = r.fail(at(2), f, true);
    assert!(matches!(action, Action::Fail(Outcome::Unsuccessful { .. })));
}

#[test]
fn ad5_a_resume_decided_offline_waits_backoff_then_connectivity() {
    let mut r = engine(3, 1);
    r.begin_attempt(at(0)).unwrap();
    r.commit(at(1), CommitTrigger::Semantic);
    // Offline when the committed stream breaks: the backoff comes first.
    let action = r.fail(at(2), committed_reset(), false);
    let Action::Resume { delay, .. } = action else {
        panic!("a resume, not a park: {action:?}");
    };
    // After the wait, still offline: park before sending.
    let after = at(2) + delay;
    assert!(r.park_before_send(after, false));
    // Back online: send.
    assert!(!r.park_before_send(after, true));
    assert_eq!(
        r.begin_attempt(after).map(|_| r.ledger.wire_attempt()),
        Ok(2)
    );
    assert_eq!(
        names(&mut r),
        [
            "attempt_started",
            "committed",
            "attempt_failed",
            "delay_scheduled",
            "parked_offline",
            "resume_started",
            "attempt_started"
        ]
    );
}

#[test]
fn ad4_a_replay_decided_offline_parks_before_any_backoff() {
    let policy = RecoveryPolicy::builder().build().unwrap();
    let mut r = Recovery::new(
        policy,
        AttemptAllowance::new(3),
        1,
        JitterSource::pinned(Fraction::HALF),
        at(0),
    );
    r.begin_attempt(at(0)).unwrap();
    let action = r.fail(
        at(1),
        Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders),
        false,
    );
    assert_eq!(action, Action::ParkUntilOnline);
    assert!(
        !r.park_before_send(at(2), false),
        "only resumes park at the send"
    );
}
