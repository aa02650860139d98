//! The fault rows (CONTRIBUTING.md, "Test names") checked at the engine, as engine-level
//! tests: scripted failures (the evidence a driver and the body observer would
//! produce) fed to `Recovery` on the virtual clock, no I/O. Each test is named
//! after its row. The harness checks LC1, G2, G9 and G12 on every run.

use super::common;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff;
use crate::budget::{AttemptAllowance, RetryBudget, RetryBudgetConfig};
use crate::decision::{Action, AdmissionAnswer, DelayCause};
use crate::error::{Evidence, RecoveryError};
use crate::exchange::course::Course as Recovery;
use crate::failure::{
    Acceptance, Category, Failure, FailureKind, PermanentCause, Phase, Stall, TransportKind,
    Unfinished, Violation,
};
use crate::lifecycle::{CommitTrigger, EventKind};
use crate::outcome::{
    BudgetKind, CancelPhase, FailureReason, InterruptCause, Outcome, RefusalLimit, ReplayDisabled,
};
use crate::policy::{Endpoint, RecoveryPolicy};
use crate::progress::{
    Generation, Progress, Proof, ProviderError, SemanticKind, Transience, UnsuccessfulReason,
};
use crate::report::AttemptResult;
use crate::retry_after::RetryAfter;
use crate::safe::{self, SafeToken};
use crate::timing::{Fraction, Instant, ManualTiming, Timing};
use common::{
    Hook, Jitter, Park, Run, Script, Step, answer, commit_then_fail, fail, fail_after,
    fail_offline, keepalives_only, ms, observed, secs, status, succeed, succeed_after,
    test_builder, test_policy,
};

const SUCCESS_ON_2: &[&str] = &[
    "attempt_started",
    "attempt_failed",
    "delay_scheduled",
    "retry_started",
    "attempt_started",
    "attempt_succeeded",
    "completed",
];

fn completed() -> Outcome {
    Outcome::Completed {
        proof: Proof::Strong,
    }
}

fn ra(value: &str) -> RetryAfter {
    let mut h = http::HeaderMap::new();
    h.insert("retry-after", value.parse().unwrap());
    RetryAfter::from_headers(&h, std::time::SystemTime::UNIX_EPOCH + secs(1000))
}

fn provider(code: &str, transience: Transience) -> Failure {
    Failure::new(
        FailureKind::Provider {
            error: ProviderError {
                code: safe::allowlisted_code(code),
                status: None,
                transience,
            },
        },
        Phase::Streaming,
    )
    .with_status(200)
}

fn failed_events(run: &Run) -> Vec<(Category, Phase, FailureReason)> {
    run.events
        .iter()
        .filter_map(|e| match e.kind {
            EventKind::AttemptFailed {
                category,
                phase,
                reason,
                ..
            } => Some((category, phase, reason)),
            _ => None,
        })
        .collect()
}

fn with_budget(mut script: Script, budget: &RetryBudget) -> Script {
    script.retry_budget = Some(budget.clone());
    script
}

/// A budget with exactly `tokens` whole retries once the request deposited
/// (percent 0: deposits add nothing; the reserve is the whole balance).
fn budget_of(per_sec: u32) -> RetryBudget {
    RetryBudget::new(RetryBudgetConfig {
        ttl: secs(10),
        min_retries_per_sec: per_sec,
        percent: 0.0,
    })
}

/// Asserts "failed at once, no sleep, no retry debit, one send".
fn assert_one_send_no_wait(run: &Run, budget: &RetryBudget, tokens: i64, row: &str) {
    assert_eq!(run.send_count(), 1, "{row}: sends");
    assert!(run.waits.is_empty(), "{row}: no wait scheduled");
    assert_eq!(run.slept, Duration::ZERO, "{row}: zero time asleep");
    assert_eq!(budget.balance(run.end), tokens, "{row}: nothing debited");
    assert!(!run.names().contains(&"delay_scheduled"), "{row}");
}

// ---------------------------------------------------------------- CN ------

#[test]
fn cn1_connect_refused_is_retried_with_backoff_then_exhausted() {
    for seed in [1, 2, 3, 42, 9_001] {
        let refused = Failure::transport(TransportKind::Refused, Phase::Connecting);
        let run = Script::new(
            test_policy(),
            vec![fail(refused.clone()), fail(refused.clone()), fail(refused)],
        )
        .jitter(Jitter::Seeded(seed))
        .run();
        assert_eq!(run.outcome, Outcome::Exhausted { attempts: 3 });
        for (category, phase, _) in failed_events(&run) {
            assert_eq!((category, phase), (Category::Transport, Phase::Connecting));
        }
        for (k, (delay, cause, _)) in run.waits.iter().enumerate() {
            let bound = ms(500 * (1 << k)).min(secs(8));
            assert!(
                *delay <= bound,
                "seed {seed}: wait {k} = {delay:?} > {bound:?}"
            );
            assert_eq!(*cause, DelayCause::Backoff);
        }
        assert_eq!(run.waits.len(), 2);
        assert_eq!(run.report.attempts[0].progress.raw_bytes, 0);
    }
}

#[test]
fn cn2_connect_timeout_fires_at_its_value_then_retries() {
    let policy = test_builder().head_timeout(Some(secs(10))).build().unwrap();
    let run = Script::new(
        policy,
        vec![
            Step::HeadTimeout {
                phase: Phase::Connecting,
            },
            succeed(),
        ],
    )
    .run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.transitions(), SUCCESS_ON_2);
    // The timer fired at exactly 10 s (checked at 10 s − 1 ms by the driver),
    // then the 250 ms backoff.
    assert_eq!(run.sends[1].0, Instant::from_origin(secs(10) + ms(250)));
    assert_eq!(
        failed_events(&run)[0],
        (
            Category::ClientTimeout,
            Phase::Connecting,
            FailureReason::Stall
        )
    );
}

#[test]
fn cn3_reset_before_the_head_is_retried_as_ambiguous() {
    let reset = Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders);
    assert_eq!(reset.acceptance, Acceptance::Unknown);
    let run = Script::new(test_policy(), vec![fail(reset), succeed()]).run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.transitions(), SUCCESS_ON_2);
    assert_eq!(run.report.committed_attempt, Some(2));
}

#[test]
fn cn5_refused_stream_is_resent_without_admission_and_counted() {
    // A local endpoint without a hook resends only what the server provably
    // did not process; a refused stream is that, and it still costs a send.
    let policy = test_builder().endpoint(Endpoint::Local).build().unwrap();
    let refused = Failure::transport(TransportKind::RefusedStream, Phase::AwaitingHeaders);
    assert_eq!(refused.acceptance, Acceptance::No);
    let run = Script::new(policy, vec![fail(refused), succeed()]).run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.transitions(), SUCCESS_ON_2);
    assert_eq!(run.report.attempt_count(), 2);
    assert_eq!(run.report.attempts[0].acceptance, Some(Acceptance::No));
    assert_eq!(run.report.attempts[1].acceptance, None);
    let json = serde_json::to_value(&run.report).unwrap();
    assert_eq!(json["attempts"][0]["acceptance"], "no");
    assert!(json["attempts"][1].get("acceptance").is_none());
}

#[test]
fn cn7_head_timeout_fires_at_its_value_then_retries() {
    let policy = test_builder().head_timeout(Some(secs(30))).build().unwrap();
    let run = Script::new(
        policy,
        vec![
            Step::HeadTimeout {
                phase: Phase::AwaitingHeaders,
            },
            succeed(),
        ],
    )
    .run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.sends[1].0, Instant::from_origin(secs(30) + ms(250)));
    assert_eq!(run.log, ["head_timer", "backoff"]);
}

#[test]
fn cn8_dns_is_retried_tls_is_permanent() {
    let dns = Failure::transport(TransportKind::Dns, Phase::Connecting);
    let run = Script::new(test_policy(), vec![fail(dns), succeed()]).run();
    assert_eq!(run.outcome, completed());

    let budget = budget_of(1);
    let tls = Failure::transport(TransportKind::Tls, Phase::Connecting);
    let run = with_budget(Script::new(test_policy(), vec![fail(tls)]), &budget).run();
    assert_eq!(
        run.outcome,
        Outcome::Permanent {
            cause: PermanentCause::Tls
        }
    );
    assert_one_send_no_wait(&run, &budget, 10, "CN8 tls");
}

// ---------------------------------------------------------------- ST ------

#[test]
fn st1_each_retryable_status_once_then_success() {
    for code in [408, 409, 429, 500, 502, 503, 504, 529] {
        let run = Script::new(test_policy(), vec![fail(status(code)), succeed()]).run();
        assert_eq!(run.outcome, completed(), "{code}");
        assert_eq!(run.transitions(), SUCCESS_ON_2, "{code}");
        let run = Script::new(test_policy(), vec![fail(status(code)), succeed()])
            .hook(vec![answer(AdmissionAnswer::Allow)])
            .run();
        assert_eq!(run.send_count(), 2, "{code} with a hook");
        assert!(run.names().contains(&"admission_allowed"));
    }
}

#[test]
fn st2_permanent_statuses_fail_after_one_send_whatever_the_hints() {
    for code in [400, 401, 402, 403, 404, 413, 422] {
        for (ra, should_retry) in [
            (RetryAfter::Absent, None),
            (ra("1"), None),
            (RetryAfter::Absent, Some(true)),
            (ra("1"), Some(true)),
        ] {
            let budget = budget_of(1);
            let f = Failure::status(code, ra, should_retry);
            let run = with_budget(Script::new(test_policy(), vec![fail(f)]), &budget).run();
            assert_eq!(
                run.outcome,
                Outcome::Permanent {
                    cause: PermanentCause::Status { status: code }
                },
                "{code} {ra:?} {should_retry:?}"
            );
            assert_one_send_no_wait(&run, &budget, 10, "ST2");
            assert_eq!(failed_events(&run)[0].2, FailureReason::Permanent);
        }
    }
}

#[test]
fn st3_redirects_are_never_followed() {
    for code in [301, 302, 303, 307, 308] {
        let budget = budget_of(1);
        let f = Failure::status(code, RetryAfter::Absent, Some(true));
        let run = with_budget(Script::new(test_policy(), vec![fail(f)]), &budget).run();
        assert_eq!(
            run.outcome,
            Outcome::Permanent {
                cause: PermanentCause::Redirect { status: code }
            }
        );
        assert_one_send_no_wait(&run, &budget, 10, "ST3");
    }
}

#[test]
fn st4_quota_429_is_permanent_even_with_retry_after() {
    let mut quota = Failure::new(
        FailureKind::Provider {
            error: ProviderError {
                code: safe::allowlisted_code("insufficient_quota"),
                status: Some(429),
                transience: Transience::Permanent,
            },
        },
        Phase::AwaitingHeaders,
    )
    .with_status(429);
    quota.retry_after = ra("1");
    let budget = budget_of(1);
    let run = with_budget(Script::new(test_policy(), vec![fail(quota)]), &budget).run();
    assert_eq!(
        run.outcome,
        Outcome::Permanent {
            cause: PermanentCause::Provider {
                code: SafeToken::new("insufficient_quota")
            }
        }
    );
    assert_one_send_no_wait(&run, &budget, 10, "ST4");
}

#[test]
fn st5_server_veto_stops_after_one_send() {
    let budget = budget_of(1);
    let f = Failure::status(503, RetryAfter::Absent, Some(false));
    let run = with_budget(Script::new(test_policy(), vec![fail(f)]), &budget).run();
    assert_eq!(
        run.outcome,
        Outcome::Permanent {
            cause: PermanentCause::ServerVetoed
        }
    );
    assert_eq!(failed_events(&run)[0].2, FailureReason::ServerVetoed);
    assert_one_send_no_wait(&run, &budget, 10, "ST5");
}

#[test]
fn st6_should_retry_true_helps_501_but_not_400() {
    let f = Failure::status(501, RetryAfter::Absent, Some(true));
    let run = Script::new(test_policy(), vec![fail(f), succeed()]).run();
    assert_eq!(run.outcome, completed());
    let f = Failure::status(400, RetryAfter::Absent, Some(true));
    let run = Script::new(test_policy(), vec![fail(f)]).run();
    assert!(matches!(run.outcome, Outcome::Permanent { .. }));
    assert_eq!(run.send_count(), 1);
}

#[test]
fn st7_json_200_to_a_streaming_request() {
    // An error object: classified by its code.
    let run = Script::new(
        test_policy(),
        vec![
            fail(provider("rate_limit_exceeded", Transience::Transient)),
            succeed(),
        ],
    )
    .run();
    assert_eq!(run.outcome, completed());
    let run = Script::new(
        test_policy(),
        vec![fail(provider(
            "invalid_request_error",
            Transience::Permanent,
        ))],
    )
    .run();
    assert!(matches!(run.outcome, Outcome::Permanent { .. }));
    // A complete non-streamed answer: a protocol outcome, not retried.
    let f = Failure::new(
        FailureKind::Protocol {
            violation: Violation::UnexpectedContentType,
        },
        Phase::Decoding,
    )
    .with_status(200);
    let run = Script::new(test_policy(), vec![fail(f)]).run();
    assert_eq!(
        run.outcome,
        Outcome::Protocol {
            violation: Violation::UnexpectedContentType
        }
    );
    assert_eq!(run.send_count(), 1);
}

#[test]
fn st8_5xx_outside_the_set_fails_and_the_set_is_honoured() {
    for code in [501, 505, 507] {
        let run = Script::new(test_policy(), vec![fail(status(code))]).run();
        assert_eq!(
            run.outcome,
            Outcome::NotRetryable {
                category: Category::Http,
                status: Some(code)
            }
        );
        assert_eq!(run.send_count(), 1);
        assert_eq!(failed_events(&run)[0].2, FailureReason::NotSelected);
        // Selected by the caller: retried.
        let policy = test_builder().retryable_statuses([code]).build().unwrap();
        let run = Script::new(policy, vec![fail(status(code)), succeed()]).run();
        assert_eq!(run.outcome, completed(), "{code} selected");
    }
}

// ---------------------------------------------------------------- RA ------

fn ra_run(hint: RetryAfter) -> Run {
    let f = Failure::status(429, hint, None);
    Script::new(test_policy(), vec![fail(f), succeed()]).run()
}

#[test]
fn ra1_retry_after_is_a_floor() {
    let run = ra_run(ra("2"));
    assert_eq!(run.outcome, completed());
    // The driver asserted no send at 2 s − 1 ms and the send at 2 s.
    assert_eq!(run.waits, vec![(secs(2), DelayCause::RetryAfter, false)]);
    assert_eq!(run.sends[1].0, Instant::from_origin(secs(2)));
    // A hint shorter than the draw: the draw wins (max of the two).
    let run = Script::new(
        test_policy(),
        vec![fail(Failure::status(503, ra("0"), None)), succeed()],
    )
    .jitter(Jitter::Pinned(1.0))
    .run();
    assert_eq!(run.waits, vec![(ms(500), DelayCause::Backoff, false)]);
}

#[test]
fn ra2_retry_after_ms_wins_over_seconds() {
    let mut h = http::HeaderMap::new();
    h.insert("retry-after", "2".parse().unwrap());
    h.insert("retry-after-ms", "1500".parse().unwrap());
    let hint = RetryAfter::from_headers(&h, std::time::SystemTime::UNIX_EPOCH);
    let run = ra_run(hint);
    assert_eq!(run.waits[0].0, ms(1500));
    assert_eq!(run.report.attempts[0].retry_after.state(), "millis");
}

#[test]
fn ra3_http_date_in_three_forms() {
    for date in [
        "Thu, 01 Jan 1970 00:16:42 GMT",
        "Thursday, 01-Jan-70 00:16:42 GMT",
        "Thu Jan  1 00:16:42 1970",
    ] {
        let run = ra_run(ra(date));
        assert_eq!(run.waits[0].0, secs(2), "{date}");
        assert_eq!(run.report.attempts[0].retry_after.state(), "date");
    }
}

#[test]
fn ra4_past_date_gives_the_policy_delay() {
    let run = ra_run(ra("Thu, 01 Jan 1970 00:16:39 GMT"));
    assert_eq!(run.waits, vec![(ms(250), DelayCause::Backoff, false)]);
    assert_eq!(
        run.report.attempts[0].retry_after,
        RetryAfter::Date(Duration::ZERO)
    );
}

#[test]
fn ra5_invalid_hints_are_ignored() {
    let nines = "9".repeat(5000);
    for value in [
        "1.5",
        "-1",
        nines.as_str(),
        "",
        "Thu, 99 Foo 1970 00:16:39 GMT",
    ] {
        let hint = ra(value);
        assert_eq!(hint, RetryAfter::Invalid, "{value:.20}");
        let run = ra_run(hint);
        assert_eq!(run.waits, vec![(ms(250), DelayCause::Backoff, false)]);
        assert_eq!(run.report.attempts[0].retry_after.state(), "invalid");
    }
}

#[test]
fn ra6_hint_above_the_ceiling_is_refused_without_sleep() {
    for s in [61, 3600] {
        let budget = budget_of(1);
        let f = Failure::status(429, ra(&s.to_string()), None);
        let run = with_budget(Script::new(test_policy(), vec![fail(f)]), &budget).run();
        assert_eq!(
            run.outcome,
            Outcome::RetryAfterRefused {
                value: secs(s),
                limit: RefusalLimit::Ceiling
            }
        );
        assert_one_send_no_wait(&run, &budget, 10, "RA6");
        assert_eq!(run.end, Instant::from_origin(Duration::ZERO));
    }
}

#[test]
fn ra7_hint_beyond_the_budget_or_deadline_is_refused() {
    let budget = budget_of(1);
    let policy = test_builder().budget(Some(secs(10))).build().unwrap();
    let f = Failure::status(503, ra("30"), None);
    let run = with_budget(Script::new(policy, vec![fail(f.clone())]), &budget).run();
    assert_eq!(
        run.outcome,
        Outcome::RetryAfterRefused {
            value: secs(30),
            limit: RefusalLimit::Budget
        }
    );
    assert_one_send_no_wait(&run, &budget, 10, "RA7 budget");

    let policy = test_builder().deadline(Some(secs(20))).build().unwrap();
    let run = with_budget(Script::new(policy, vec![fail(f)]), &budget).run();
    assert_eq!(
        run.outcome,
        Outcome::RetryAfterRefused {
            value: secs(30),
            limit: RefusalLimit::Deadline
        }
    );
    assert_one_send_no_wait(&run, &budget, 10, "RA7 deadline");
}

#[test]
fn ra8_hint_on_a_permanent_status_is_ignored() {
    let f = Failure::status(401, ra("1"), None);
    let run = Script::new(test_policy(), vec![fail(f)]).run();
    assert_eq!(
        run.outcome,
        Outcome::Permanent {
            cause: PermanentCause::Status { status: 401 }
        }
    );
    assert_eq!(run.slept, Duration::ZERO);
}

// ---------------------------------------------------------------- BD ------

/// Classes of the events of one fixture (Anthropic-like): N, K, N, S, S, T.
#[derive(Clone, Copy, PartialEq)]
enum Ev {
    N,
    K,
    S,
    T,
}
const FIXTURE: [Ev; 6] = [Ev::N, Ev::K, Ev::N, Ev::S, Ev::S, Ev::T];

fn progress_after(events: &[Ev]) -> Progress {
    let mut p = Progress {
        headers_received: true,
        ..Progress::default()
    };
    for e in events {
        p.raw_bytes += 30;
        p.frames += 1;
        match e {
            Ev::K => p.keepalives += 1,
            Ev::S => p.observe(SemanticKind::Content),
            Ev::N | Ev::T => {}
        }
    }
    p
}

#[test]
fn bd1_cut_at_every_event_boundary_switches_at_the_first_semantic_event() {
    // The oracle: the first S event, computed from the fixture.
    let first_s = FIXTURE.iter().position(|e| *e == Ev::S).unwrap();
    for cut in 0..FIXTURE.len() {
        let progress = progress_after(&FIXTURE[..cut]);
        let variants = [
            Failure::transport(TransportKind::Reset, Phase::Streaming),
            Failure::new(FailureKind::UnexpectedEof, Phase::Streaming),
        ];
        for f in variants {
            let f = f.with_progress(progress);
            let run = Script::new(test_policy(), vec![fail(f), succeed()]).run();
            if cut <= first_s {
                assert_eq!(run.outcome, completed(), "cut {cut}: replay");
                assert_eq!(run.send_count(), 2);
            } else {
                assert!(
                    matches!(run.outcome, Outcome::Interrupted { .. }),
                    "cut {cut}: {:?}",
                    run.outcome
                );
                assert_eq!(run.send_count(), 1, "G1: no replay after S");
            }
        }
    }
}

#[test]
fn bd3_cut_inside_an_event() {
    let eof = |may_be_semantic| {
        Failure::new(FailureKind::UnexpectedEof, Phase::Streaming)
            .with_unfinished(Unfinished {
                bytes: 17,
                may_be_semantic,
            })
            .with_progress(progress_after(&FIXTURE[..2]))
    };
    // Pending bytes identified as non-semantic: replay.
    let run = Script::new(test_policy(), vec![fail(eof(false)), succeed()]).run();
    assert_eq!(run.outcome, completed());
    // Possibly semantic: no replay.
    let run = Script::new(test_policy(), vec![fail(eof(true))]).run();
    assert_eq!(
        run.outcome,
        Outcome::Interrupted {
            cause: InterruptCause::PartialFrame,
            stall: None,
            committed: false,
        }
    );
    assert_eq!(run.send_count(), 1);
}

#[test]
fn bd4_keepalives_only_then_cut_is_replayed() {
    let f = Failure::transport(TransportKind::Reset, Phase::Streaming)
        .with_progress(keepalives_only(5));
    let run = Script::new(test_policy(), vec![fail(f), succeed()]).run();
    assert_eq!(run.outcome, completed());
    let first = &run.report.attempts[0].progress;
    assert!(first.raw_bytes > 0);
    assert!(!first.semantic_observed() && !first.semantic_delivered());
    assert_eq!(
        run.report.committed_attempt,
        Some(2),
        "nothing of attempt 1 delivered"
    );
}

#[test]
fn bd5_holdback_overflow_commits_then_a_failure_interrupts() {
    let t = ManualTiming::new(0).with_pinned_jitter(Fraction::HALF);
    let mut rec = Recovery::new(
        test_policy(),
        AttemptAllowance::new(3),
        5,
        t.jitter_source(),
        t.now(),
    );
    assert_eq!(
        rec.begin_attempt(t.now())
            .map(|_| rec.ledger.wire_attempt()),
        Ok(1)
    );
    rec.ledger.head(t.now(), 200, None, None);
    rec.commit(t.now(), CommitTrigger::HoldbackCap);
    let f = Failure::transport(TransportKind::Reset, Phase::Streaming)
        .with_progress(keepalives_only(3000));
    let action = rec.fail(t.now(), f, true);
    assert!(matches!(action, Action::Fail(Outcome::Interrupted { .. })));
    let events: Vec<_> = rec.ledger.drain_events().collect();
    let names: Vec<_> = events.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        names,
        [
            "attempt_started",
            "committed",
            "attempt_failed",
            "interrupted"
        ]
    );
    assert_eq!(
        events[1].kind,
        EventKind::Committed {
            trigger: CommitTrigger::HoldbackCap,
            role: None
        }
    );
}

#[test]
fn bd6_line_too_long_is_a_protocol_failure() {
    for progress in [keepalives_only(1), observed(SemanticKind::Content, 2)] {
        let f = Failure::new(
            FailureKind::Protocol {
                violation: Violation::LineTooLong,
            },
            Phase::Decoding,
        )
        .with_progress(progress);
        let run = Script::new(test_policy(), vec![fail(f)]).run();
        assert_eq!(
            run.outcome,
            Outcome::Protocol {
                violation: Violation::LineTooLong
            }
        );
        assert_eq!(run.send_count(), 1);
        assert_eq!(failed_events(&run)[0].2, FailureReason::Protocol);
    }
}

#[test]
fn bd7_malformed_event_is_a_protocol_failure() {
    let f = Failure::new(
        FailureKind::Protocol {
            violation: Violation::Malformed,
        },
        Phase::Decoding,
    );
    let run = Script::new(test_policy(), vec![fail(f)]).run();
    assert_eq!(
        run.outcome,
        Outcome::Protocol {
            violation: Violation::Malformed
        }
    );
    assert_eq!(run.send_count(), 1);
}

#[test]
fn bd8_idle_watchdog_fires_at_its_value() {
    assert_eq!(
        test_policy().idle_timeout(),
        Some(secs(600)),
        "bounded by default (the SDKs' read timeout)"
    );
    let policy = test_builder().idle_timeout(Some(secs(20))).build().unwrap();
    // Uncommitted: replay.
    let run = Script::new(
        policy.clone(),
        vec![
            Step::Watchdog {
                stall: Stall::Idle,
                commit: false,
            },
            succeed(),
        ],
    )
    .run();
    assert_eq!(run.outcome, completed());
    // The keepalive at 0 s is noticed at the first check (20 s / 16 =
    // 1.25 s): the stall is 20 s after that, then the 250 ms backoff.
    assert_eq!(
        run.sends[1].0,
        Instant::from_origin(secs(20) + ms(1250) + ms(250))
    );
    // Committed: interrupted by the stall, and says so.
    let run = Script::new(
        policy,
        vec![Step::Watchdog {
            stall: Stall::Idle,
            commit: true,
        }],
    )
    .run();
    assert_eq!(
        run.outcome,
        Outcome::Interrupted {
            cause: InterruptCause::Stall,
            stall: Some(Stall::Idle),
            committed: true,
        }
    );
    assert_eq!(failed_events(&run)[0].0, Category::ClientTimeout);
}

#[test]
fn bd9_progress_watchdog_with_keepalives_replays() {
    let policy = test_builder()
        .progress_timeout(Some(secs(60)))
        .build()
        .unwrap();
    let run = Script::new(
        policy,
        vec![
            Step::Watchdog {
                stall: Stall::Progress,
                commit: false,
            },
            succeed(),
        ],
    )
    .run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.report.attempts[0].progress.keepalives, 1);
    assert_eq!(
        run.report.committed_attempt,
        Some(2),
        "keepalives never commit"
    );
}

#[test]
fn bd10_slow_trickle_completes_past_the_deadline() {
    let policy = test_builder().deadline(Some(secs(30))).build().unwrap();
    // Silent for 120 s (under the idle timeout), well past the deadline.
    let run = Script::new(policy, vec![succeed_after(secs(120))]).run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.end, Instant::from_origin(secs(120)));
}

#[test]
fn bd11_reset_after_terminal_proof_is_completed() {
    let t = ManualTiming::new(0);
    let mut rec = Recovery::new(
        test_policy(),
        AttemptAllowance::new(3),
        5,
        t.jitter_source(),
        t.now(),
    );
    rec.begin_attempt(t.now()).unwrap();
    rec.commit(t.now(), CommitTrigger::Semantic);
    assert_eq!(
        rec.succeed(
            t.now(),
            Proof::Strong,
            Progress::default(),
            Generation::default()
        ),
        completed()
    );
    let late = Failure::transport(TransportKind::Reset, Phase::Streaming);
    assert_eq!(
        rec.fail(t.now(), late, true),
        Action::Fail(completed()),
        "the late error is not surfaced"
    );
    let names: Vec<_> = rec.ledger.drain_events().map(|e| e.kind.name()).collect();
    assert_eq!(
        names,
        [
            "attempt_started",
            "committed",
            "attempt_succeeded",
            "completed"
        ]
    );
}

// ---------------------------------------------------------------- PT ------

#[test]
fn pt1_pt2_success_proofs_complete_after_one_send() {
    for proof in [Proof::Strong, Proof::FinishReasonOnly] {
        let run = Script::new(
            test_policy(),
            vec![Step::Succeed {
                after: ms(10),
                proof,
                commit: true,
            }],
        )
        .run();
        assert_eq!(run.outcome, Outcome::Completed { proof });
        assert_eq!(run.send_count(), 1);
    }
}

#[test]
fn pt3_pt4_pt14_unsuccessful_terminals_are_never_retried() {
    let reasons = [
        UnsuccessfulReason::MissingFinishReason,
        UnsuccessfulReason::Length,
        UnsuccessfulReason::ContentFilter,
        UnsuccessfulReason::Incomplete,
        UnsuccessfulReason::MaxTokens,
        UnsuccessfulReason::Refusal,
        UnsuccessfulReason::ContextWindowExceeded,
        UnsuccessfulReason::Other(SafeToken::new("SOMETHING_NEW")),
    ];
    for reason in reasons {
        // With S, and without (a blocked prompt produced none).
        for progress in [observed(SemanticKind::Content, 3), Progress::default()] {
            let budget = budget_of(1);
            let f = Failure::new(
                FailureKind::Unsuccessful {
                    reason: reason.clone(),
                },
                Phase::Streaming,
            )
            .with_progress(progress);
            let run = with_budget(Script::new(test_policy(), vec![fail(f)]), &budget).run();
            assert_eq!(
                run.outcome,
                Outcome::Unsuccessful {
                    reason: reason.clone()
                }
            );
            assert_one_send_no_wait(&run, &budget, 10, "PT4");
            assert_eq!(
                failed_events(&run)[0].2,
                FailureReason::UnsuccessfulTerminal
            );
        }
    }
}

#[test]
fn pt5_transient_provider_error_before_s_is_replayed() {
    for code in ["overloaded_error", "server_error", "rate_limit_exceeded"] {
        let f = provider(code, Transience::Transient).with_progress(keepalives_only(2));
        let run = Script::new(test_policy(), vec![fail(f), succeed()]).run();
        assert_eq!(run.outcome, completed(), "{code}");
        assert_eq!(run.report.committed_attempt, Some(2));
    }
}

#[test]
fn pt6_transient_provider_error_after_s_is_interrupted() {
    let mut p = observed(SemanticKind::Content, 4);
    p.delivered_content = 3;
    let f = provider("overloaded_error", Transience::Transient).with_progress(p);
    let run = Script::new(test_policy(), vec![fail(f)]).run();
    assert_eq!(
        run.outcome,
        Outcome::Interrupted {
            cause: InterruptCause::ProviderError,
            stall: None,
            committed: true,
        }
    );
    assert_eq!(run.send_count(), 1);
    let kept = run.report.attempts[0].progress;
    assert_eq!((kept.observed_content, kept.delivered_content), (4, 3));
}

#[test]
fn pt7_permanent_provider_code_fails_after_one_send() {
    for code in [
        "insufficient_quota",
        "invalid_request_error",
        "invalid_api_key",
    ] {
        let run = Script::new(
            test_policy(),
            vec![fail(provider(code, Transience::Permanent))],
        )
        .run();
        assert_eq!(
            run.outcome,
            Outcome::Permanent {
                cause: PermanentCause::Provider {
                    code: SafeToken::new(code)
                }
            }
        );
        assert_eq!(run.send_count(), 1);
    }
    // A code off the allowlist is not surfaced.
    let run = Script::new(
        test_policy(),
        vec![fail(provider("sk-live-secret", Transience::Permanent))],
    )
    .run();
    assert_eq!(
        run.outcome,
        Outcome::Permanent {
            cause: PermanentCause::Provider { code: None }
        }
    );
}

#[test]
fn pt9_provider_error_of_unknown_transience_is_not_retried() {
    let f = provider("other", Transience::Unknown);
    let run = Script::new(test_policy(), vec![fail(f.clone())]).run();
    assert!(matches!(run.outcome, Outcome::NotRetryable { .. }));
    assert_eq!(run.send_count(), 1);
    let run = Script::new(
        test_policy(),
        vec![fail(f.with_progress(observed(SemanticKind::Content, 1)))],
    )
    .run();
    assert!(matches!(run.outcome, Outcome::Interrupted { .. }));
}

#[test]
fn pt10_spliced_message_is_a_protocol_failure() {
    let f = Failure::new(
        FailureKind::Protocol {
            violation: Violation::SplicedMessage,
        },
        Phase::Decoding,
    )
    .with_progress(observed(SemanticKind::Content, 1));
    let run = Script::new(test_policy(), vec![fail(f)]).run();
    assert_eq!(
        run.outcome,
        Outcome::Protocol {
            violation: Violation::SplicedMessage
        }
    );
    assert_eq!(run.send_count(), 1);
}

#[test]
fn pt11_pt12_pt13_reasoning_tool_or_side_effect_blocks_replay() {
    for kind in [
        SemanticKind::Reasoning,
        SemanticKind::Tool,
        SemanticKind::SideEffect,
    ] {
        let f = Failure::transport(TransportKind::Reset, Phase::Streaming)
            .with_progress(observed(kind, 1));
        let run = Script::new(test_policy(), vec![fail(f)]).run();
        assert!(
            matches!(run.outcome, Outcome::Interrupted { .. }),
            "{kind:?}: {:?}",
            run.outcome
        );
        assert_eq!(run.send_count(), 1);
        assert_eq!(failed_events(&run)[0].2, FailureReason::SemanticOutput);
    }
}

// ---------------------------------------------------------------- RS ------

#[test]
fn rs4_repeated_cuts_during_resumes_stop_at_max_attempts() {
    let policy = test_builder().max_resumes(5).build().unwrap();
    let cut = || commit_then_fail(Failure::transport(TransportKind::Reset, Phase::Streaming));
    let mut script = Script::new(policy, vec![cut(), cut(), cut()]);
    script.resume_possible = true;
    let run = script.run();
    assert_eq!(
        run.outcome,
        Outcome::Interrupted {
            cause: InterruptCause::AttemptsExhausted,
            stall: None,
            committed: true,
        }
    );
    assert_eq!(run.send_count(), 3, "G2 across resumes");
    assert_eq!(
        run.names()
            .iter()
            .filter(|n| **n == "resume_started")
            .count(),
        2
    );
    assert!(run.waits.iter().all(|w| w.2), "every wait led to a resume");
}

#[test]
fn rs5_rs9_resume_only_when_possible_and_only_after_s() {
    // Not resumable, cut after S: interrupted, no resume.
    let cut = Failure::transport(TransportKind::Reset, Phase::Streaming);
    let run = Script::new(test_policy(), vec![commit_then_fail(cut.clone())]).run();
    assert!(matches!(run.outcome, Outcome::Interrupted { .. }));
    assert!(!run.names().contains(&"resume_started"));
    // Resumable but cut before any S: a plain replay, not a resume.
    let mut script = Script::new(test_policy(), vec![fail(cut), succeed()]);
    script.resume_possible = true;
    let run = script.run();
    assert_eq!(run.outcome, completed());
    assert!(run.names().contains(&"retry_started"));
    assert!(!run.names().contains(&"resume_started"));
}

#[test]
fn rs6_failed_resume_is_retried_and_debited() {
    let policy = test_builder().max_resumes(3).build().unwrap();
    let cut = Failure::transport(TransportKind::Reset, Phase::Streaming);
    let mut script = Script::new(
        policy,
        vec![commit_then_fail(cut), fail(status(503)), succeed()],
    );
    script.resume_possible = true;
    let run = script.run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.send_count(), 3);
    assert_eq!(run.allowance_used, 3, "each resume debited");
    assert_eq!(run.report.resumes, 2);
}

// ---------------------------------------------------------------- TB ------

#[test]
fn tb1_backoff_schedule_with_a_pinned_rng() {
    let draws = [0.3, 0.7, 0.1, 0.9, 1.0, 0.5];
    let policy = test_builder()
        .max_attempts(NonZeroU32::new(7).unwrap())
        .build()
        .unwrap();
    let mut steps: Vec<Step> = (0..6).map(|_| fail(status(503))).collect();
    steps.push(succeed());
    let run = Script::new(policy, steps)
        .jitter(Jitter::Scripted(draws.to_vec()))
        .run();
    assert_eq!(run.outcome, completed());
    // Wait before send k+1 = r · min(8 s, 0.5 s · 2^(k−1)), computed here.
    let want: Vec<Duration> = draws
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let bound_ms = (500u64 << i).min(8000);
            Duration::from_micros((bound_ms as f64 * 1000.0 * r) as u64)
        })
        .collect();
    let got: Vec<Duration> = run.waits.iter().map(|w| w.0).collect();
    assert_eq!(got, want);
    // The sends happened exactly at the cumulative waits.
    let mut at = Duration::ZERO;
    for (k, w) in want.iter().enumerate() {
        at += *w;
        assert_eq!(run.sends[k + 1].0, Instant::from_origin(at));
    }
}

#[test]
fn tb2_always_503_is_exhausted_after_three_sends() {
    let run = Script::new(
        test_policy(),
        vec![fail(status(503)), fail(status(503)), fail(status(503))],
    )
    .run();
    assert_eq!(run.outcome, Outcome::Exhausted { attempts: 3 });
    let names = run.transitions();
    assert_eq!(
        names[names.len() - 3..],
        ["attempt_started", "attempt_failed", "exhausted"]
    );
    assert_eq!(run.send_count(), 3);
}

#[test]
fn tb4_delay_ending_after_the_deadline_fails_at_decision_time() {
    let policy = test_builder().deadline(Some(secs(1))).build().unwrap();
    let reset = Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders);
    let run = Script::new(policy, vec![fail_after(ms(900), reset)])
        .jitter(Jitter::Pinned(1.0))
        .run();
    assert_eq!(run.outcome, Outcome::DeadlineExceeded);
    assert!(run.waits.is_empty(), "no sleep started");
    assert_eq!(run.end, Instant::from_origin(ms(900)));
    // The last cause is kept in the report.
    assert_eq!(
        run.report.attempts[0].result,
        AttemptResult::Failed {
            category: Category::Transport,
            phase: Phase::AwaitingHeaders,
            reason: FailureReason::Transient
        }
    );
}

#[test]
fn tb5_deadline_never_cuts_an_active_generation() {
    let policy = test_builder().deadline(Some(secs(10))).build().unwrap();
    let run = Script::new(policy.clone(), vec![succeed_after(secs(60))]).run();
    assert_eq!(run.outcome, completed());
    // It fails after the deadline, before commit: no new attempt.
    let reset = Failure::transport(TransportKind::Reset, Phase::Streaming)
        .with_progress(keepalives_only(1));
    let run = Script::new(policy, vec![fail_after(secs(60), reset)]).run();
    assert_eq!(run.outcome, Outcome::DeadlineExceeded);
    assert_eq!(run.send_count(), 1);
    assert!(matches!(
        run.report.attempts[0].result,
        AttemptResult::Failed {
            category: Category::Transport,
            ..
        }
    ));
}

#[test]
fn tb6_admission_after_the_deadline_or_a_late_timer_does_not_send() {
    let policy = test_builder().deadline(Some(secs(5))).build().unwrap();
    let run = Script::new(policy.clone(), vec![fail(status(503))])
        .hook(vec![Hook::Answer {
            after: secs(6),
            answer: AdmissionAnswer::Allow,
        }])
        .run();
    assert_eq!(run.outcome, Outcome::DeadlineExceeded);
    assert_eq!(run.send_count(), 1);
    // A wait that ends in time, then a timer that fires late: the recheck
    // right before the send refuses it.
    let policy = test_builder().deadline(Some(secs(1))).build().unwrap();
    let mut script = Script::new(policy, vec![fail_after(ms(700), status(503))]);
    script.oversleep = ms(100);
    let run = script.run();
    assert_eq!(run.waits[0].0, ms(250));
    assert_eq!(run.outcome, Outcome::DeadlineExceeded);
    assert_eq!(run.send_count(), 1);
}

#[test]
fn tb7_empty_retry_budget_fails_fast() {
    let budget = budget_of(0);
    let run = with_budget(Script::new(test_policy(), vec![fail(status(503))]), &budget).run();
    assert_eq!(
        run.outcome,
        Outcome::BudgetExhausted {
            budget: BudgetKind::RetryTokens
        }
    );
    assert_one_send_no_wait(&run, &budget, 0, "TB7");
}

#[test]
fn tb7_tb8_token_accounting_table() {
    // 50 % of requests, no reserve: one row per logical request, with the
    // balance expected after it (whole retries).
    let budget = RetryBudget::new(RetryBudgetConfig {
        ttl: secs(10),
        min_retries_per_sec: 0,
        percent: 0.5,
    });
    // (start time, steps, outcome name, balance after)
    let rows: Vec<(u64, Vec<Step>, &str, i64)> = vec![
        (0, vec![succeed()], "completed", 0),
        (0, vec![succeed()], "completed", 1),
        (1, vec![fail(status(503)), succeed()], "completed", 0),
        (2, vec![fail(status(503)), succeed()], "completed", 0),
        (2, vec![fail(status(503))], "budget_exhausted", 0),
        (3, vec![succeed()], "completed", 1),
        (4, vec![succeed()], "completed", 1),
        (5, vec![succeed()], "completed", 2),
        (
            6,
            vec![fail(status(503)), fail(status(503)), succeed()],
            "completed",
            0,
        ),
        // TB8: ten seconds later every deposit and withdrawal expired; new
        // successes deposit again and retries are allowed again.
        (20, vec![succeed()], "completed", 0),
        (20, vec![succeed()], "completed", 1),
        (20, vec![fail(status(503)), succeed()], "completed", 0),
    ];
    let t = ManualTiming::new(0).with_pinned_jitter(Fraction::HALF);
    for (i, (start, steps, want, balance)) in rows.into_iter().enumerate() {
        t.advance(secs(start).saturating_sub(t.now().since_origin()));
        let mut rec = Recovery::new(
            test_policy(),
            AttemptAllowance::new(3),
            i as u64,
            t.jitter_source(),
            t.now(),
        )
        .with_retry_budget(std::sync::Arc::new(budget.clone()));
        let mut steps = steps.into_iter();
        let outcome = loop {
            rec.begin_attempt(t.now()).unwrap();
            match steps.next().unwrap() {
                Step::Fail { failure, .. } => match rec.fail(t.now(), failure, true) {
                    Action::Fail(o) => break o,
                    Action::RetryAfter { delay, .. } => common::sleep_exactly(&t, delay),
                    other => panic!("{other:?}"),
                },
                Step::Succeed { proof, .. } => {
                    break rec.succeed(t.now(), proof, Progress::default(), Generation::default());
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(outcome.name(), want, "row {i}");
        assert_eq!(budget.balance(t.now()), balance, "row {i}");
    }
}

/// Runs `n` logical requests against an always-503 upstream, all arriving
/// within the first second; returns (physical sends, retry start times).
fn storm(n: u64, budget: Option<&RetryBudget>) -> (u64, Vec<Duration>) {
    let t = ManualTiming::new(7);
    let mut recs: Vec<Recovery> = Vec::new();
    let mut queue = BinaryHeap::new();
    for i in 0..n {
        // Arrivals spread over one second.
        queue.push(Reverse((
            Duration::from_micros(i * 1_000_000 / n),
            i as usize,
            true,
        )));
    }
    let mut sends = 0;
    let mut retry_starts = Vec::new();
    while let Some(Reverse((at, idx, first))) = queue.pop() {
        t.advance(at.saturating_sub(t.now().since_origin()));
        if first {
            let mut rec = Recovery::new(
                test_policy(),
                AttemptAllowance::new(3),
                idx as u64,
                t.jitter_source(),
                t.now(),
            );
            if let Some(b) = budget {
                rec = rec.with_retry_budget(std::sync::Arc::new(b.clone()));
            }
            recs.push(rec);
        } else {
            retry_starts.push(at);
        }
        let rec = &mut recs[idx];
        rec.begin_attempt(t.now()).unwrap();
        sends += 1;
        match rec.fail(t.now(), status(503), true) {
            Action::RetryAfter { delay, .. } => {
                queue.push(Reverse((t.now().since_origin() + delay, idx, false)));
            }
            Action::Fail(_) => {}
            other => panic!("{other:?}"),
        }
    }
    for rec in &mut recs {
        assert_eq!(
            rec.ledger
                .drain_events()
                .filter(|e| e.kind.is_terminal())
                .count(),
            1,
            "LC1 in the storm"
        );
    }
    (sends, retry_starts)
}

#[test]
fn tb9_retry_storm_is_bounded_by_the_budget() {
    let n = 1000;
    let config = RetryBudgetConfig {
        ttl: secs(10),
        min_retries_per_sec: 10,
        percent: 0.2,
    };
    let (without, _) = storm(n, None);
    let (with, starts) = storm(n, Some(&RetryBudget::new(config)));
    println!("TB9 storm, N = {n}: {without} sends without a budget, {with} with it");
    assert_eq!(without, 3 * n, "every request retried to max_attempts");
    let bound = n + n / 5 + 10 * 10;
    assert!(with <= bound, "{with} sends > {bound}");
    assert!(with > n, "the budget still allows some retries");
    // Retry starts are spread: no 10 ms window holds more than 5 % of them.
    let mut windows: BTreeMap<u128, usize> = BTreeMap::new();
    for s in &starts {
        *windows.entry(s.as_millis() / 10).or_default() += 1;
    }
    let busiest = windows.values().copied().max().unwrap_or(0);
    assert!(
        busiest * 20 <= starts.len(),
        "{busiest} of {} retries in one 10 ms window",
        starts.len()
    );
}

#[test]
fn tb10_budget_counts_from_the_first_failure() {
    let policy = test_builder().budget(Some(secs(60))).build().unwrap();
    let run = Script::new(policy, vec![fail_after(secs(100), status(503)), succeed()]).run();
    assert_eq!(run.outcome, completed());
    assert_eq!(run.sends[1].0, Instant::from_origin(secs(100) + ms(250)));
}

// ---------------------------------------------------------------- CX ------

#[test]
fn cx1_cancel_during_backoff() {
    let budget = budget_of(1);
    let mut script = with_budget(Script::new(test_policy(), vec![fail(status(503))]), &budget);
    script.cancel_in_wait = Some((0, ms(249)));
    let run = script.run();
    assert_eq!(
        run.outcome,
        Outcome::Cancelled {
            phase: CancelPhase::Waiting
        }
    );
    assert_eq!(run.send_count(), 1);
    assert_eq!(run.timing.pending_timers(), 0);
    assert_eq!(budget.balance(run.end), 10, "permit released, not spent");
}

#[test]
fn cx2_cancel_while_admission_is_pending() {
    let run = Script::new(test_policy(), vec![fail(status(503))])
        .hook(vec![Hook::CancelAfter(secs(2))])
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
}

#[test]
fn cx3_cancel_while_parked_offline() {
    let mut script = Script::new(test_policy(), vec![fail_offline(status(503))]);
    script.parks = vec![Park::CancelAfter(secs(30))];
    let run = script.run();
    assert_eq!(
        run.transitions(),
        [
            "attempt_started",
            "attempt_failed",
            "parked_offline",
            "cancelled"
        ]
    );
    assert_eq!(
        run.outcome,
        Outcome::Cancelled {
            phase: CancelPhase::Parked
        }
    );
    assert_eq!(run.send_count(), 1);
}

#[test]
fn cx4_cx5_cancel_awaiting_the_head_or_streaming_is_never_retried() {
    for (phase, commit) in [
        (CancelPhase::AwaitingHead, false),
        (CancelPhase::Streaming, false),
        (CancelPhase::Streaming, true),
    ] {
        let run = Script::new(
            test_policy(),
            vec![Step::Cancel {
                after: ms(5),
                phase,
                commit,
            }],
        )
        .run();
        assert_eq!(
            run.transitions(),
            ["attempt_started", "attempt_failed", "cancelled"]
        );
        assert_eq!(run.outcome, Outcome::Cancelled { phase });
        assert_eq!(
            failed_events(&run)[0],
            (
                Category::Cancellation,
                if phase == CancelPhase::AwaitingHead {
                    Phase::AwaitingHeaders
                } else {
                    Phase::Streaming
                },
                FailureReason::Cancelled
            )
        );
    }
}

#[test]
fn cx6_cancel_in_the_same_poll_as_a_proof_or_a_failure() {
    let t = ManualTiming::new(0);
    let new = || {
        let mut rec = Recovery::new(
            test_policy(),
            AttemptAllowance::new(3),
            1,
            t.jitter_source(),
            t.now(),
        );
        rec.begin_attempt(t.now()).unwrap();
        rec
    };
    let terminals = |rec: &mut Recovery| {
        rec.ledger
            .drain_events()
            .filter(|e| e.kind.is_terminal())
            .map(|e| e.kind.name())
            .collect::<Vec<_>>()
    };
    // The proof was emitted first: it stands.
    let mut rec = new();
    rec.succeed(
        t.now(),
        Proof::Strong,
        Progress::default(),
        Generation::default(),
    );
    assert_eq!(rec.cancel(t.now(), CancelPhase::Streaming), completed());
    assert_eq!(terminals(&mut rec), ["completed"]);
    // Cancel first: it wins over the proof and over a failure.
    let mut rec = new();
    rec.cancel(t.now(), CancelPhase::Streaming);
    assert_eq!(
        rec.succeed(
            t.now(),
            Proof::Strong,
            Progress::default(),
            Generation::default()
        ),
        Outcome::Cancelled {
            phase: CancelPhase::Streaming
        }
    );
    assert!(matches!(
        rec.fail(t.now(), status(503), true),
        Action::Fail(Outcome::Cancelled { .. })
    ));
    assert_eq!(terminals(&mut rec), ["cancelled"]);
    // A failure whose retry is then cancelled before the send.
    let mut rec = new();
    assert!(matches!(
        rec.fail(t.now(), status(503), true),
        Action::RetryAfter { .. }
    ));
    assert_eq!(
        rec.cancel(t.now(), CancelPhase::Waiting),
        Outcome::Cancelled {
            phase: CancelPhase::Waiting
        }
    );
    assert_eq!(
        rec.begin_attempt(t.now()),
        Err(Outcome::Cancelled {
            phase: CancelPhase::Waiting
        })
    );
    assert_eq!(terminals(&mut rec), ["cancelled"]);
    assert_eq!(
        rec.ledger.report().attempt_count(),
        1,
        "no send after cancel"
    );
}

// ---------------------------------------------------------------- AD ------

#[test]
fn ad1_hook_allows() {
    let f = status(503).with_progress(keepalives_only(2));
    let run = Script::new(test_policy(), vec![fail(f.clone()), succeed()])
        .hook(vec![answer(AdmissionAnswer::Allow)])
        .run();
    assert_eq!(run.outcome, completed());
    assert_eq!(
        run.transitions()[..8],
        [
            "attempt_started",
            "attempt_failed",
            "admission_pending",
            "admission_allowed",
            "delay_scheduled",
            "retry_started",
            "attempt_started",
            "attempt_succeeded",
        ]
    );
    let call = &run.hook_calls[0];
    assert_eq!(call.next_attempt, 2);
    assert_eq!(call.logical_id, run.report.logical_id);
    assert_eq!(call.failure, f);
    assert_eq!(call.progress.keepalives, 2);
}

#[test]
fn ad2_hook_rejects() {
    let run = Script::new(test_policy(), vec![fail(status(503))])
        .hook(vec![answer(AdmissionAnswer::Reject)])
        .run();
    assert_eq!(run.outcome, Outcome::AdmissionRejected);
    assert_eq!(run.send_count(), 1);
}

#[test]
fn ad3_admission_required_without_a_hook() {
    let policy = test_builder().endpoint(Endpoint::Local).build().unwrap();
    let f = Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders);
    let run = Script::new(policy, vec![fail(f)]).run();
    assert_eq!(run.outcome, Outcome::AdmissionRequired);
    assert_eq!(run.send_count(), 1);
    assert!(run.names().contains(&"admission_required"));
}

#[test]
fn ad4_failure_while_offline_parks_until_online() {
    let mut script = Script::new(test_policy(), vec![fail_offline(status(503)), succeed()]);
    script.parks = vec![Park::OnlineAfter(secs(45))];
    let run = script.run();
    assert_eq!(run.outcome, completed());
    assert_eq!(
        run.log,
        ["online", "backoff"],
        "no backoff spent while parked"
    );
    assert!(
        run.sends[1].0 >= Instant::from_origin(secs(45)),
        "no send while offline"
    );
}

#[test]
fn ad6_admission_pending_past_the_budget_or_deadline() {
    let policy = test_builder().budget(Some(secs(10))).build().unwrap();
    let run = Script::new(policy, vec![fail(status(503))])
        .hook(vec![Hook::Answer {
            after: secs(11),
            answer: AdmissionAnswer::Allow,
        }])
        .run();
    assert_eq!(
        run.outcome,
        Outcome::BudgetExhausted {
            budget: BudgetKind::Recovery
        }
    );
    assert_eq!(run.send_count(), 1);
    let policy = test_builder().deadline(Some(secs(10))).build().unwrap();
    let run = Script::new(policy, vec![fail(status(503))])
        .hook(vec![Hook::Answer {
            after: secs(11),
            answer: AdmissionAnswer::Allow,
        }])
        .run();
    assert_eq!(run.outcome, Outcome::DeadlineExceeded);
}

// ---------------------------------------------------------------- RQ ------

#[test]
fn rq2_body_over_the_replay_limit_is_sent_once() {
    let mut script = Script::new(test_policy(), vec![fail(status(503))]);
    script.replay_disabled = Some(ReplayDisabled::BodyTooLarge);
    let run = script.run();
    assert_eq!(
        run.outcome,
        Outcome::ReplayDisabled {
            reason: ReplayDisabled::BodyTooLarge
        }
    );
    assert_eq!(run.send_count(), 1);
    assert_eq!(
        run.report.replay_disabled,
        Some(ReplayDisabled::BodyTooLarge)
    );
    assert_eq!(
        run.report.attempts[0].status,
        Some(503),
        "the failure is kept"
    );
}

// ---------------------------------------------------------------- PV ------

const CANARIES: [&str; 6] = [
    "CANARY-PROMPT-q7",
    "CANARY-BODY-x3",
    "CANARY-TOOLARGS-k9",
    "CANARY-AUTH-sk9",
    "CANARY-COOKIE-z1",
    "CANARY-ERRMSG-m2",
];

fn assert_no_canary(rendered: &str, what: &str) {
    for c in CANARIES {
        assert!(!rendered.contains(c), "{what} leaks {c}: {rendered:.300}");
    }
}

/// A failed request whose evidence carries every canary.
fn leaky_error() -> (RecoveryError, Vec<crate::lifecycle::LifecycleEvent>) {
    let policy = test_builder().evidence_cap(64).build().unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "authorization",
        format!("Bearer {}", CANARIES[3]).parse().unwrap(),
    );
    headers.insert("set-cookie", format!("s={}", CANARIES[4]).parse().unwrap());
    headers.insert(
        "x-request-id",
        format!("echo {} {}", CANARIES[0], CANARIES[1])
            .parse()
            .unwrap(),
    );
    headers.insert("retry-after", "1".parse().unwrap());
    let hint = RetryAfter::from_headers(&headers, std::time::SystemTime::UNIX_EPOCH);
    let request_id = safe::request_id_with(|n| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    assert!(request_id.is_none(), "an id that echoes text is dropped");
    // The provider echoes the prompt and tool arguments in its error message.
    let body = format!(
        r#"{{"error":{{"message":"{} {} {}","code":"{}"}}}}"#,
        CANARIES[0], CANARIES[2], CANARIES[5], CANARIES[1]
    );
    let code = safe::allowlisted_code(CANARIES[1]);
    let f = Failure::new(
        FailureKind::Provider {
            error: ProviderError {
                code,
                status: Some(400),
                transience: Transience::Permanent,
            },
        },
        Phase::AwaitingHeaders,
    )
    .with_status(400);
    let f = Failure {
        retry_after: hint,
        ..f
    };
    let t = ManualTiming::new(0);
    let mut rec = Recovery::new(
        policy.clone(),
        AttemptAllowance::new(3),
        9,
        t.jitter_source(),
        t.now(),
    );
    rec.begin_attempt(t.now()).unwrap();
    rec.ledger.head(t.now(), 400, request_id, None);
    let Action::Fail(outcome) = rec.fail(t.now(), f, true) else {
        panic!("permanent")
    };
    let mut evidence = Evidence::with_cap(policy.evidence_cap());
    evidence.set_cause(Arc::new(std::io::Error::other(format!(
        "upstream said: {body}; request had Authorization: Bearer {}",
        CANARIES[3]
    ))));
    evidence.push_bytes(body.as_bytes());
    evidence.set_headers(&headers);
    let events = rec.ledger.drain_events().collect();
    (
        RecoveryError::new(outcome, rec.ledger.report().clone(), evidence),
        events,
    )
}

#[test]
fn pv1_canaries_never_appear_in_any_rendered_form() {
    let (err, events) = leaky_error();
    assert_no_canary(&err.to_string(), "Display");
    assert_no_canary(&format!("{err:?}"), "Debug");
    assert_no_canary(&format!("{err:#?}"), "pretty Debug");
    assert_no_canary(&serde_json::to_string(&err).unwrap(), "serde");
    assert_no_canary(&serde_json::to_string(err.report()).unwrap(), "report");
    assert_no_canary(&format!("{:?}", err.report()), "report Debug");
    assert_no_canary(&err.outcome().to_string(), "outcome");
    for e in &events {
        assert_no_canary(&serde_json::to_string(e).unwrap(), "event");
        assert_no_canary(&format!("{e:?} {e}"), "event Debug/Display");
    }
    // The evidence is still there for whoever asks explicitly.
    let cause = err.inspect_cause().expect("cause kept").to_string();
    assert!(cause.contains(CANARIES[5]));
}

#[test]
fn pv2_inspect_returns_capped_evidence() {
    let (err, _) = leaky_error();
    assert_eq!(
        err.inspect_response_bytes().len(),
        64,
        "capped at the evidence cap"
    );
    assert!(
        err.inspect_response_bytes()
            .starts_with(br#"{"error":{"message":""#)
    );
    let headers = err.inspect_response_headers().expect("headers kept");
    assert!(headers.contains_key("authorization"));
    // A large body never grows the evidence past its cap.
    let mut ev = Evidence::with_cap(1024);
    for _ in 0..1000 {
        ev.push_bytes(&[b'x'; 4096]);
    }
    let e = RecoveryError::new(
        Outcome::DeadlineExceeded,
        crate::report::RecoveryReport::new("0".into()),
        ev,
    );
    assert_eq!(e.inspect_response_bytes().len(), 1024);
}

#[test]
fn pv3_outcome_keeps_the_evidence_that_matters() {
    let mut f = Failure::status(429, ra("2"), None);
    f.progress = keepalives_only(3);
    let run = Script::new(
        test_policy(),
        vec![fail(f.clone()), fail(f.clone()), fail(f)],
    )
    .run();
    let err = RecoveryError::new(run.outcome.clone(), run.report.clone(), Evidence::default());
    assert_eq!(err.report().attempt_count(), 3);
    assert_eq!(err.report().last_status(), Some(429));
    for a in &err.report().attempts {
        assert_eq!(a.retry_after, RetryAfter::Seconds(secs(2)));
        assert_eq!(
            a.result,
            AttemptResult::Failed {
                category: Category::Http,
                phase: Phase::AwaitingHeaders,
                reason: FailureReason::Transient
            }
        );
        assert_eq!(a.progress.keepalives, 3);
    }
    let shown = err.to_string();
    assert!(
        shown.contains("3 attempt(s)") && shown.contains("429"),
        "{shown}"
    );
    // Observed and delivered progress survive an interruption.
    let mut p = observed(SemanticKind::Tool, 5);
    p.delivered_tool_fragments = 2;
    let cut = Failure::transport(TransportKind::Reset, Phase::Streaming).with_progress(p);
    let run = Script::new(test_policy(), vec![fail(cut)]).run();
    let kept = run.report.attempts[0].progress;
    assert_eq!(
        (kept.observed_tool_fragments, kept.delivered_tool_fragments),
        (5, 2)
    );
}

#[test]
fn pv4_only_allowlisted_headers_survive() {
    let mut h = http::HeaderMap::new();
    for (k, v) in [
        ("authorization", "Bearer CANARY-AUTH-sk9"),
        ("cookie", "a=CANARY-COOKIE-z1"),
        ("set-cookie", "b=CANARY-COOKIE-z1"),
        ("x-api-key", "CANARY-AUTH-sk9"),
        ("x-custom", "CANARY-BODY-x3"),
        ("content-type", "text/event-stream"),
        ("retry-after", "2"),
        ("x-request-id", "req_0123456789abcdef"),
    ] {
        h.insert(http::HeaderName::from_static(k), v.parse().unwrap());
    }
    // What the machine reads of a head: a token-shaped request id and the
    // Retry-After hint. No other header value reaches a failure.
    let id = safe::request_id_with(|n| h.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned));
    assert_eq!(
        id.as_ref().map(SafeToken::as_str),
        Some("req_0123456789abcdef")
    );
    let hint = RetryAfter::from_headers(&h, std::time::SystemTime::UNIX_EPOCH);
    assert_eq!(hint, RetryAfter::Seconds(Duration::from_secs(2)));
    assert_no_canary(&format!("{id:?} {hint:?}"), "what a head gives");
}

// ---------------------------------------------------------------- LC ------

#[test]
fn lc1_exactly_one_terminal_event_in_every_shape_of_run() {
    // The harness asserts LC1 on every run of this file; this test adds runs
    // of every terminal shape side by side and checks the terminal's name.
    let cases: Vec<(Script, &str)> = vec![
        (Script::new(test_policy(), vec![succeed()]), "completed"),
        (
            Script::new(test_policy(), vec![fail(status(400))]),
            "exhausted",
        ),
        (
            Script::new(
                test_policy(),
                vec![commit_then_fail(Failure::transport(
                    TransportKind::Reset,
                    Phase::Streaming,
                ))],
            ),
            "interrupted",
        ),
        (
            Script::new(
                test_policy(),
                vec![Step::Cancel {
                    after: Duration::ZERO,
                    phase: CancelPhase::Streaming,
                    commit: false,
                }],
            ),
            "cancelled",
        ),
    ];
    for (script, want) in cases {
        let run = script.run();
        let terminals: Vec<_> = run
            .events
            .iter()
            .filter(|e| e.kind.is_terminal())
            .map(|e| e.kind.name())
            .collect();
        assert_eq!(terminals, [want]);
    }
}

#[test]
fn backoff_bound_is_the_documented_formula() {
    // The driver's waits rely on this; pin it against the matrix's formula.
    for k in 1..=10u32 {
        let want = ms(500 * (1u64 << (k - 1))).min(secs(8));
        assert_eq!(backoff::bound(ms(500), secs(8), k), want, "retry {k}");
    }
    let _ = RecoveryPolicy::default();
}
