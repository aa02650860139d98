//! Failover at the engine: what the decision does with alternates that the
//! conformance vectors (`fo*`) do not reach — the outcome's list of
//! targets, the retry budget, admission and the attempt allowance.

use std::num::NonZeroU32;
use std::sync::Arc;

use crate::budget::{AttemptAllowance, RetryBudget, RetryBudgetConfig};
use crate::decision::Action;
use crate::exchange::course::Course as Recovery;
use crate::failure::{Failure, Phase, TransportKind};
use crate::lifecycle::EventKind;
use crate::outcome::{BudgetKind, Outcome};
use crate::policy::{Endpoint, RecoveryPolicy};
use crate::retry_after::RetryAfter;
use crate::timing::{Fraction, Instant, JitterSource};

fn t0() -> Instant {
    Instant::from_origin(std::time::Duration::ZERO)
}

fn engine(policy: RecoveryPolicy, labels: &[&str]) -> Recovery {
    let allowance = AttemptAllowance::new(policy.max_attempts().get());
    Recovery::new(
        policy,
        allowance,
        1,
        JitterSource::pinned(Fraction::HALF),
        t0(),
    )
    .with_targets(
        labels.iter().map(|l| (*l).to_owned()).collect(),
        vec![None; labels.len()],
    )
}

fn overloaded() -> Failure {
    Failure::status(529, RetryAfter::Absent, None)
}

fn send_and_fail(r: &mut Recovery, failure: Failure) -> Action {
    r.begin_attempt(t0()).expect("send");
    r.fail(t0(), failure, true)
}

#[test]
fn the_outcome_names_every_target_in_order() {
    let policy = RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(5).unwrap())
        .build()
        .unwrap();
    let mut r = engine(policy, &["primary", "b", "c"]);
    assert_eq!(send_and_fail(&mut r, overloaded()), Action::Failover);
    assert_eq!(r.target(), 1);
    assert_eq!(send_and_fail(&mut r, overloaded()), Action::Failover);
    let Action::Fail(outcome) = send_and_fail(&mut r, overloaded()) else {
        panic!("the last target's failure ends the request");
    };
    assert_eq!(
        outcome,
        Outcome::AlternatesExhausted {
            attempts: 3,
            targets: vec!["primary".into(), "b".into(), "c".into()],
        }
    );
    assert!(outcome.to_string().contains("primary, b, c"), "{outcome}");
    let targets: Vec<_> = r
        .ledger
        .report()
        .attempts
        .iter()
        .map(|a| a.target.clone())
        .collect();
    assert_eq!(
        targets,
        [Some("primary".into()), Some("b".into()), Some("c".into())]
    );
    assert_eq!(r.ledger.report().served_by, None);
}

#[test]
fn a_failover_draws_on_the_retry_budget() {
    let budget = RetryBudget::new(RetryBudgetConfig {
        min_retries_per_sec: 0,
        percent: 0.0,
        ..RetryBudgetConfig::default()
    });
    let mut r =
        engine(RecoveryPolicy::default(), &["primary", "alt"]).with_retry_budget(Arc::new(budget));
    assert_eq!(
        send_and_fail(&mut r, overloaded()),
        Action::Fail(Outcome::BudgetExhausted {
            budget: BudgetKind::RetryTokens
        })
    );
    assert_eq!(r.target(), 0, "no switch without a permit");
}

#[test]
fn an_ambiguous_failure_to_a_local_endpoint_needs_admission_before_a_switch() {
    let policy = RecoveryPolicy::builder()
        .endpoint(Endpoint::Local)
        .build()
        .unwrap();
    let mut r = engine(policy, &["primary", "alt"]);
    let reset = Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders);
    assert_eq!(
        send_and_fail(&mut r, reset),
        Action::Fail(Outcome::AdmissionRequired)
    );
}

#[test]
fn a_failure_the_policy_does_not_retry_never_switches() {
    let mut r = engine(RecoveryPolicy::default(), &["primary", "alt"]);
    let action = send_and_fail(&mut r, Failure::status(400, RetryAfter::Absent, None));
    assert!(
        matches!(action, Action::Fail(Outcome::Permanent { .. })),
        "{action:?}"
    );
    assert_eq!(r.target(), 0);
}

#[test]
fn the_allowance_bounds_failover() {
    let policy = RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(2).unwrap())
        .build()
        .unwrap();
    let mut r = engine(policy, &["primary", "b", "c"]);
    assert_eq!(send_and_fail(&mut r, overloaded()), Action::Failover);
    assert_eq!(
        send_and_fail(&mut r, overloaded()),
        Action::Fail(Outcome::Exhausted { attempts: 2 })
    );
}

#[test]
fn without_alternates_nothing_is_labelled() {
    let mut r = engine(RecoveryPolicy::default(), &["primary"]);
    assert!(matches!(
        send_and_fail(&mut r, overloaded()),
        Action::RetryAfter { .. }
    ));
    let started = r
        .ledger
        .drain_events()
        .find(|e| matches!(e.kind, EventKind::AttemptStarted { .. }))
        .unwrap();
    let json = serde_json::to_string(&started).unwrap();
    assert!(!json.contains("target"), "{json}");
    assert_eq!(r.ledger.report().attempts[0].target, None);
}

#[test]
fn the_switch_is_announced_with_both_labels() {
    let mut r = engine(RecoveryPolicy::default(), &["primary", "alt"]);
    send_and_fail(&mut r, overloaded());
    let failover = r
        .ledger
        .drain_events()
        .find_map(|e| match e.kind {
            EventKind::Failover { from, to, .. } => Some((from, to)),
            _ => None,
        })
        .unwrap();
    assert_eq!(failover, ("primary".into(), "alt".into()));
    r.begin_attempt(t0()).unwrap();
    let json = serde_json::to_string(&r.ledger.drain_events().next_back().unwrap()).unwrap();
    assert!(json.contains(r#""target":"alt""#), "{json}");
}
