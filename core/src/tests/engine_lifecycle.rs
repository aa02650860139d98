//! Lifecycle sequences of the engine, driven through `Recovery` on the
//! virtual clock: the canonical event sequences of a retry, a resume, a
//! cancellation and an exhaustion.
//! Every run also passes the harness's global checks (exactly one terminal
//! event, contiguous attempt numbers, G9 ordering, no timer left).

use super::common;

use std::time::Duration;

use crate::budget::{RetryBudget, RetryBudgetConfig};
use crate::decision::{AdmissionAnswer, DelayCause};
use crate::failure::{Failure, Phase, TransportKind};
use crate::lifecycle::{EventKind, RecoveryStatus};
use crate::outcome::{CancelPhase, InterruptCause, Outcome};
use crate::policy::Endpoint;
use crate::progress::{Proof, SemanticKind};
use crate::timing::Instant;
use common::{
    Hook, Jitter, Park, Script, Step, answer, commit_then_fail, fail, fail_offline, ms, observed,
    status, succeed, test_builder, test_policy,
};

const SUCCESS_AFTER_503: &[&str] = &[
    "attempt_started",
    "attempt_failed",
    "delay_scheduled",
    "retry_started",
    "attempt_started",
    "attempt_succeeded",
    "completed",
];

#[test]
fn status_503_then_success() {
    let run = Script::new(test_policy(), vec![fail(status(503)), succeed()]).run();
    assert_eq!(run.transitions(), SUCCESS_AFTER_503);
    assert_eq!(
        run.outcome,
        Outcome::Completed {
            proof: Proof::Strong
        }
    );
    // Jitter pinned at half: the first wait is 0.5 · min(8 s, 0.5 s) = 250 ms.
    assert_eq!(run.waits, vec![(ms(250), DelayCause::Backoff, false)]);
    let times: Vec<_> = run.sends.iter().map(|s| s.0.since_origin()).collect();
    assert_eq!(times, vec![Duration::ZERO, ms(250)]);
    // Only the second attempt committed.
    assert_eq!(run.report.committed_attempt, Some(2));
    assert_eq!(RecoveryStatus::of(&run.events), RecoveryStatus::Completed);
}

#[test]
fn status_503_then_success_with_an_admission_hook() {
    let run = Script::new(test_policy(), vec![fail(status(503)), succeed()])
        .hook(vec![answer(AdmissionAnswer::Allow)])
        .run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "admission_pending",
            "admission_allowed",
            "delay_scheduled",
            "retry_started",
            "attempt_started",
            "attempt_succeeded",
            "completed",
        ]
    );
    assert_eq!(run.send_count(), 2);
    assert_eq!(run.hook_calls.len(), 1);
}

#[test]
fn three_504s_are_exhausted() {
    let run = Script::new(
        test_policy(),
        vec![fail(status(504)), fail(status(504)), fail(status(504))],
    )
    .hook(vec![
        answer(AdmissionAnswer::Allow),
        answer(AdmissionAnswer::Allow),
    ])
    .run();
    let six = [
        "attempt_started",
        "attempt_failed",
        "admission_pending",
        "admission_allowed",
        "delay_scheduled",
        "retry_started",
    ];
    let mut want: Vec<&str> = six.iter().chain(six.iter()).copied().collect();
    want.extend(["attempt_started", "attempt_failed", "exhausted"]);
    assert_eq!(run.transitions(), want, "the 15 events of the 504 sequence");
    assert_eq!(run.outcome, Outcome::Exhausted { attempts: 3 });
    assert_eq!(run.send_count(), 3);
    // Waits: 0.5 · 500 ms, then 0.5 · 1 s.
    let delays: Vec<_> = run.waits.iter().map(|w| w.0).collect();
    assert_eq!(delays, vec![ms(250), ms(500)]);
    assert_eq!(RecoveryStatus::of(&run.events), RecoveryStatus::Failed);
}

#[test]
fn three_504s_without_a_hook() {
    let run = Script::new(
        test_policy(),
        vec![fail(status(504)), fail(status(504)), fail(status(504))],
    )
    .run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "delay_scheduled",
            "retry_started",
            "attempt_started",
            "attempt_failed",
            "delay_scheduled",
            "retry_started",
            "attempt_started",
            "attempt_failed",
            "exhausted",
        ]
    );
    assert_eq!(run.outcome, Outcome::Exhausted { attempts: 3 });
}

#[test]
fn ambiguous_resend_rejected_by_admission() {
    // Request written, reset before the head: the remote may be generating.
    let reset = Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders);
    let run = Script::new(test_policy(), vec![fail(reset)])
        .hook(vec![answer(AdmissionAnswer::Reject)])
        .run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "admission_pending",
            "admission_rejected",
            "exhausted",
        ]
    );
    assert_eq!(run.outcome, Outcome::AdmissionRejected);
    assert_eq!(run.send_count(), 1);
    assert!(run.waits.is_empty(), "no wait after a rejection");
}

#[test]
fn admission_unresolved_is_not_approval() {
    let run = Script::new(test_policy(), vec![fail(status(504))])
        .hook(vec![Hook::Answer {
            after: ms(300),
            answer: AdmissionAnswer::Unresolved,
        }])
        .run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "admission_pending",
            "admission_unresolved",
            "exhausted",
        ]
    );
    assert_eq!(run.outcome, Outcome::AdmissionUnresolved);
    assert_eq!(run.send_count(), 1);
}

#[test]
fn admission_required_for_a_local_endpoint_without_a_hook() {
    let policy = test_builder().endpoint(Endpoint::Local).build().unwrap();
    for ambiguous in [
        status(504),
        Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders),
        Failure::transport(TransportKind::Closed, Phase::Sending),
    ] {
        let run = Script::new(policy.clone(), vec![fail(ambiguous.clone())]).run();
        assert_eq!(
            run.transitions(),
            [
                "attempt_started",
                "attempt_failed",
                "admission_required",
                "exhausted"
            ],
            "{ambiguous:?}"
        );
        assert_eq!(run.outcome, Outcome::AdmissionRequired);
        assert_eq!(run.send_count(), 1);
    }
    // Not ambiguous (the server answered, or never got the request): retried.
    for clear in [
        status(503),
        Failure::transport(TransportKind::Refused, Phase::Connecting),
    ] {
        let run = Script::new(policy.clone(), vec![fail(clear), succeed()]).run();
        assert_eq!(run.transitions(), SUCCESS_AFTER_503);
    }
}

#[test]
fn cancel_during_admission() {
    let run = Script::new(test_policy(), vec![fail(status(503))])
        .hook(vec![Hook::CancelAfter(ms(40))])
        .run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "admission_pending",
            "cancelled"
        ]
    );
    assert_eq!(
        run.outcome,
        Outcome::Cancelled {
            phase: CancelPhase::Admission
        }
    );
    assert_eq!(run.send_count(), 1);
    assert_eq!(RecoveryStatus::of(&run.events), RecoveryStatus::Cancelled);
}

#[test]
fn cancel_during_backoff_removes_the_timer_and_refunds_the_permit() {
    let budget = RetryBudget::new(RetryBudgetConfig {
        ttl: Duration::from_secs(10),
        min_retries_per_sec: 0,
        percent: 1.0,
    });
    let mut script = Script::new(test_policy(), vec![fail(status(503))])
        .hook(vec![answer(AdmissionAnswer::Allow)]);
    script.retry_budget = Some(budget.clone());
    script.cancel_in_wait = Some((0, ms(100)));
    let run = script.run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "admission_pending",
            "admission_allowed",
            "delay_scheduled",
            "cancelled"
        ]
    );
    assert_eq!(
        run.outcome,
        Outcome::Cancelled {
            phase: CancelPhase::Waiting
        }
    );
    assert_eq!(run.send_count(), 1, "no send n+1");
    assert_eq!(run.timing.pending_timers(), 0);
    // The request deposited one retry; the permit taken for the wait came
    // back when the wait was cancelled.
    assert_eq!(budget.balance(run.end), 1, "permit refunded, not spent");
    assert!(budget.try_withdraw(run.end).is_some());
}

#[test]
fn spent_permit_is_not_refunded() {
    // Counter-check of the test above: a retry that is sent spends its permit.
    let budget = RetryBudget::new(RetryBudgetConfig {
        ttl: Duration::from_secs(10),
        min_retries_per_sec: 0,
        percent: 1.0,
    });
    let mut script = Script::new(test_policy(), vec![fail(status(503)), succeed()]);
    script.retry_budget = Some(budget.clone());
    let run = script.run();
    assert!(run.outcome.is_completed());
    assert_eq!(budget.balance(run.end), 0);
}

#[test]
fn semantic_output_then_failure_is_interrupted() {
    let reset = Failure::transport(TransportKind::Reset, Phase::Streaming);
    let run = Script::new(test_policy(), vec![commit_then_fail(reset)]).run();
    assert_eq!(
        run.transitions(),
        ["attempt_started", "attempt_failed", "interrupted"]
    );
    assert_eq!(run.names().iter().filter(|n| **n == "committed").count(), 1);
    assert_eq!(
        run.outcome,
        Outcome::Interrupted {
            cause: InterruptCause::Transport,
            stall: None,
            committed: true,
        }
    );
    assert_eq!(run.send_count(), 1, "exactly one request");
}

#[test]
fn semantic_output_observed_but_not_delivered_is_interrupted() {
    // G1: observed output blocks replay even before it reached the consumer,
    // and the terminal event says so.
    let reset = Failure::transport(TransportKind::Reset, Phase::Streaming)
        .with_progress(observed(SemanticKind::Content, 1));
    let run = Script::new(test_policy(), vec![fail(reset)]).run();
    assert_eq!(
        run.transitions(),
        ["attempt_started", "attempt_failed", "interrupted"]
    );
    assert!(matches!(run.outcome, Outcome::Interrupted { .. }));
    assert_eq!(run.send_count(), 1);
}

#[test]
fn consumer_cancel_while_streaming() {
    for commit in [false, true] {
        let run = Script::new(
            test_policy(),
            vec![Step::Cancel {
                after: ms(20),
                phase: CancelPhase::Streaming,
                commit,
            }],
        )
        .run();
        assert_eq!(
            run.transitions(),
            ["attempt_started", "attempt_failed", "cancelled"],
            "commit = {commit}"
        );
        assert_eq!(
            run.outcome,
            Outcome::Cancelled {
                phase: CancelPhase::Streaming
            }
        );
        let failed = &run
            .events
            .iter()
            .find(|e| e.kind.name() == "attempt_failed")
            .unwrap()
            .kind;
        assert!(
            matches!(failed, EventKind::AttemptFailed { category, .. } if category.to_string() == "cancellation"),
            "{failed:?}"
        );
    }
}

#[test]
fn offline_failure_parks_then_retries() {
    let mut script = Script::new(test_policy(), vec![fail_offline(status(503)), succeed()]);
    script.parks = vec![Park::OnlineAfter(ms(5_000))];
    let run = script.run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "parked_offline",
            "delay_scheduled",
            "retry_started",
            "attempt_started",
            "attempt_succeeded",
            "completed",
        ]
    );
    // The backoff is counted after the platform is back: no send while offline.
    assert_eq!(run.log, ["online", "backoff"]);
    assert_eq!(
        run.sends[1].0,
        Instant::from_origin(ms(5_000) + ms(250)),
        "retry = back online + full backoff"
    );
}

#[test]
fn status_follows_the_events() {
    let mut script = Script::new(test_policy(), vec![fail_offline(status(503)), succeed()]);
    script.parks = vec![Park::OnlineAfter(ms(10))];
    let run = script.run();
    let statuses: Vec<_> = run
        .events
        .iter()
        .scan(RecoveryStatus::InProgress, |s, e| {
            *s = s.after(&e.kind);
            Some(*s)
        })
        .collect();
    assert_eq!(statuses[0], RecoveryStatus::InProgress);
    assert_eq!(statuses[1], RecoveryStatus::Reconnecting);
    assert_eq!(statuses[2], RecoveryStatus::WaitingForNetwork);
    assert_eq!(*statuses.last().unwrap(), RecoveryStatus::Completed);
}

#[test]
fn events_serialize_with_stable_names() {
    let run = Script::new(test_policy(), vec![fail(status(503)), succeed()])
        .jitter(Jitter::Pinned(0.5))
        .run();
    for e in &run.events {
        let v = serde_json::to_value(e).unwrap();
        assert_eq!(v["event"], e.kind.name());
        assert_eq!(v["logical_id"], "000000000000002a");
        assert_eq!(v["wire_attempt"], e.identity.wire_attempt);
    }
    let delay = run
        .events
        .iter()
        .find(|e| e.kind.name() == "delay_scheduled")
        .unwrap();
    let v = serde_json::to_value(delay).unwrap();
    assert_eq!(v["delay_ms"], 250);
    assert_eq!(v["cause"], "backoff");
}

/// The machine names one idempotency key per logical request, only when
/// the policy asks for it and the send does not bring its own.
#[test]
fn the_idempotency_key_is_the_requests_and_a_callers_own_key_wins() {
    use crate::budget::AttemptAllowance;
    use crate::exchange::{Exchange, RequestFacts};
    use crate::policy::RecoveryPolicy;
    use crate::protocol::ProtocolChoice;
    let machine = |policy: RecoveryPolicy| -> Exchange<Vec<u8>> {
        Exchange::new(
            policy,
            &ProtocolChoice::Auto,
            RequestFacts::new("POST", "/v1/chat/completions", b"{}"),
            AttemptAllowance::new(3),
            0x2a,
            Instant::from_origin(Duration::ZERO),
        )
    };
    let on = machine(
        RecoveryPolicy::builder()
            .idempotency_key(true)
            .build()
            .unwrap(),
    );
    let key = on.idempotency_key(false).expect("asked for");
    assert_eq!(key, format!("recovery-{}", on.ledger().logical_id()));
    assert_eq!(
        on.idempotency_key(false),
        Some(key),
        "the same on every send"
    );
    assert_eq!(on.idempotency_key(true), None, "the caller's own key stays");
    assert_eq!(
        machine(RecoveryPolicy::default()).idempotency_key(false),
        None
    );
}
