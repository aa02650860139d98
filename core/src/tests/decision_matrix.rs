//! The decision function as an exhaustive table.
//!
//! Every combination of (semantic observed, failure class, ambiguous
//! acceptance, endpoint, attempts left, budget left, resume possible, online,
//! admission answer, hook installed, cancelled) is fed to `decide` and
//! compared with an oracle written here from the rules of ARCHITECTURE.md,
//! as a precedence list, not from `decide`'s body. Then the Retry-After
//! decision vectors (a hint is a floor, never shortened; above the ceiling
//! or the budget it is refused).

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use crate::decision::{Action, AdmissionAnswer, AttemptState, DecisionInput, DelayCause, decide};
use crate::failure::{Acceptance, Category, Failure, PermanentCause};
use crate::outcome::{BudgetKind, CancelPhase, InterruptCause, Outcome, RefusalLimit};
use crate::policy::{Endpoint, OverCeiling, RecoveryPolicy};
use crate::progress::{Progress, SemanticKind};
use crate::retry_after::RetryAfter;
use crate::timing::{Fraction, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// 503: in the retryable set.
    Retryable,
    /// 501: a 5xx outside the set.
    NotSelected,
    /// 400: permanent whatever the policy says.
    Permanent,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    semantic: bool,
    class: Class,
    ambiguous: bool,
    local: bool,
    attempts_left: bool,
    budget_left: bool,
    resume_possible: bool,
    online: bool,
    answer: Option<AdmissionAnswer>,
    hook: bool,
    cancelled: bool,
}

const BASE: Duration = Duration::from_millis(500);
const CEILING: Duration = Duration::from_secs(8);
const BUDGET: Duration = Duration::from_mins(2);
const NOW: Duration = Duration::from_secs(200);
const JITTER: f64 = 0.5;

fn policy(local: bool) -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .backoff(BASE, CEILING)
        .budget(Some(BUDGET))
        .endpoint(if local {
            Endpoint::Local
        } else {
            Endpoint::Remote
        })
        .build()
        .unwrap()
}

fn failure(c: &Case) -> Failure {
    let code = match c.class {
        Class::Retryable => 503,
        Class::NotSelected => 501,
        Class::Permanent => 400,
    };
    let mut f = Failure::status(code, RetryAfter::Absent, None);
    if c.semantic {
        let mut p = Progress::default();
        p.observe(SemanticKind::Content);
        f.progress = p;
    }
    f.acceptance = if c.ambiguous {
        Acceptance::Unknown
    } else {
        Acceptance::Yes
    };
    f
}

fn state(c: &Case) -> AttemptState {
    let now = Instant::from_origin(NOW);
    let mut s = AttemptState::first(Instant::from_origin(Duration::ZERO), 3);
    if c.attempts_left {
        s.attempts_made = 1;
        s.attempts_left = 2;
    } else {
        s.attempts_made = 3;
        s.attempts_left = 0;
    }
    s.first_failure_at = Some(if c.budget_left {
        now
    } else {
        Instant::from_origin(NOW.checked_sub(BUDGET).unwrap())
    });
    s.resume_possible = c.resume_possible;
    s.admission_hook = c.hook;
    s.admission = c.answer;
    s.cancelled = c.cancelled;
    s
}

/// The rules, in the order they take precedence (first match wins):
///
/// 1. Cancellation wins everywhere (G8).
/// 2. A permanent failure is never retried, whatever else holds (G5); its
///    typed outcome stands even after semantic output.
/// 3. A failure the policy does not select is not retried; after semantic
///    output it is reported as an interruption.
/// 4. Semantic output forbids a replay (G1): only a resume can continue, if
///    one is possible; otherwise the request is interrupted.
/// 5. No attempts left: exhausted (or, for a resume, interrupted because
///    attempts ran out).
/// 6. The recovery budget, counted from the first failure, bounds the start
///    of any retry (G7).
/// 7. An admission answer decides: reject and unresolved stop (pending is not
///    approval); with a hook and no answer yet, ask; with no hook, an
///    ambiguous resend to a local endpoint needs admission.
/// 8. Offline: a replay parks until online before any backoff (AD4); a
///    resume waits its backoff first and checks connectivity just before
///    sending (AD5).
/// 9. Otherwise wait the jittered backoff `r · min(ceiling, base · 2^(n−1))`
///    for retry `n`, then replay or resume.
fn oracle(c: &Case) -> Action {
    if c.cancelled {
        return Action::Fail(Outcome::Cancelled {
            phase: CancelPhase::Waiting,
        });
    }
    if c.class == Class::Permanent {
        return Action::Fail(Outcome::Permanent {
            cause: PermanentCause::Status { status: 400 },
        });
    }
    // Observed but not delivered: nothing committed.
    let interrupted = |cause| Outcome::Interrupted {
        cause,
        stall: None,
        committed: false,
    };
    if c.class == Class::NotSelected {
        return Action::Fail(if c.semantic {
            interrupted(InterruptCause::Transport)
        } else {
            Outcome::NotRetryable {
                category: Category::Http,
                status: Some(501),
            }
        });
    }
    let resume = c.semantic;
    if c.semantic && !c.resume_possible {
        return Action::Fail(interrupted(InterruptCause::Transport));
    }
    if !c.attempts_left {
        return Action::Fail(if resume {
            interrupted(InterruptCause::AttemptsExhausted)
        } else {
            Outcome::Exhausted { attempts: 3 }
        });
    }
    if !c.budget_left {
        return Action::Fail(Outcome::BudgetExhausted {
            budget: BudgetKind::Recovery,
        });
    }
    match (c.answer, c.hook) {
        (Some(AdmissionAnswer::Reject), _) => return Action::Fail(Outcome::AdmissionRejected),
        (Some(AdmissionAnswer::Unresolved), _) => {
            return Action::Fail(Outcome::AdmissionUnresolved);
        }
        (None, true) => return Action::AskAdmission,
        (None, false) if c.ambiguous && c.local => {
            return Action::Fail(Outcome::AdmissionRequired);
        }
        _ => {}
    }
    if !c.online && !resume {
        return Action::ParkUntilOnline;
    }
    // Retry 1 (after the first send): 0.5 · min(8 s, 0.5 s · 2^0) = 250 ms.
    let delay = Duration::from_millis(250);
    if resume {
        Action::Resume {
            delay,
            cause: DelayCause::Backoff,
        }
    } else {
        Action::RetryAfter {
            delay,
            cause: DelayCause::Backoff,
        }
    }
}

fn all_cases() -> Vec<Case> {
    let b = [false, true];
    let classes = [Class::Retryable, Class::NotSelected, Class::Permanent];
    let answers = [
        None,
        Some(AdmissionAnswer::Allow),
        Some(AdmissionAnswer::Reject),
        Some(AdmissionAnswer::Unresolved),
    ];
    let mut out = Vec::new();
    for semantic in b {
        for class in classes {
            for ambiguous in b {
                for local in b {
                    for attempts_left in b {
                        for budget_left in b {
                            for resume_possible in b {
                                for online in b {
                                    for answer in answers {
                                        for hook in b {
                                            for cancelled in b {
                                                out.push(Case {
                                                    semantic,
                                                    class,
                                                    ambiguous,
                                                    local,
                                                    attempts_left,
                                                    budget_left,
                                                    resume_possible,
                                                    online,
                                                    answer,
                                                    hook,
                                                    cancelled,
                                                });
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

fn action_name(a: &Action) -> String {
    match a {
        Action::RetryAfter { .. } => "retry".into(),
        Action::Resume { .. } => "resume".into(),
        Action::ParkUntilOnline => "park".into(),
        Action::AskAdmission => "ask".into(),
        Action::Failover => "failover".into(),
        Action::Fail(o) => format!("fail:{}", o.name()),
    }
}

#[test]
fn decision_is_exhaustively_the_oracle() {
    let cases = all_cases();
    assert_eq!(cases.len(), 2 * 3 * 2 * 2 * 2 * 2 * 2 * 2 * 4 * 2 * 2);
    let mut seen = BTreeSet::new();
    let mut mismatches = Vec::new();
    for c in &cases {
        let policy = policy(c.local);
        let state = state(c);
        let failure = failure(c);
        let got = decide(DecisionInput {
            policy: &policy,
            state: &state,
            failure: &failure,
            online: c.online,
            now: Instant::from_origin(NOW),
            jitter: Fraction::new(JITTER),
        });
        let want = oracle(c);
        seen.insert(action_name(&want));
        if got != want {
            mismatches.push(format!("{c:?}\n  decide: {got:?}\n  oracle: {want:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ; first:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The table reaches every kind of action.
    let want: BTreeSet<String> = [
        "retry",
        "resume",
        "park",
        "ask",
        "fail:cancelled",
        "fail:permanent",
        "fail:not_retryable",
        "fail:interrupted",
        "fail:exhausted",
        "fail:budget_exhausted",
        "fail:admission_rejected",
        "fail:admission_unresolved",
        "fail:admission_required",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(seen, want);
}

#[test]
fn decide_is_pure() {
    // Same input, same action: no hidden clock, randomness or state.
    for c in all_cases().iter().step_by(7) {
        let policy = policy(c.local);
        let state = state(c);
        let failure = failure(c);
        let input = DecisionInput {
            policy: &policy,
            state: &state,
            failure: &failure,
            online: c.online,
            now: Instant::from_origin(NOW),
            jitter: Fraction::new(JITTER),
        };
        assert_eq!(decide(input), decide(input));
    }
}

// --- Retry-After decision vectors ---------------------------------------

fn wall() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1000)
}

fn hint(headers: &[(&str, &str)]) -> RetryAfter {
    let mut h = http::HeaderMap::new();
    for (k, v) in headers {
        h.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    RetryAfter::from_headers(&h, wall())
}

/// Policy of the vectors: base 1 s, ceiling 30 s (backoff and Retry-After).
fn vector_policy(budget: Option<Duration>) -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .backoff(Duration::from_secs(1), Duration::from_secs(30))
        .retry_after_ceiling(Duration::from_secs(30), OverCeiling::Refuse)
        .budget(budget)
        .build()
        .unwrap()
}

fn decide_429(retry_after: RetryAfter, policy: &RecoveryPolicy) -> Action {
    let now = Instant::from_origin(Duration::from_secs(5));
    let mut state = AttemptState::first(Instant::from_origin(Duration::ZERO), 3);
    state.first_failure_at = Some(now);
    let failure = Failure::status(429, retry_after, None);
    decide(DecisionInput {
        policy,
        state: &state,
        failure: &failure,
        online: true,
        now,
        jitter: Fraction::HALF,
    })
}

#[test]
fn retry_after_decision_vectors() {
    let secs = Duration::from_secs;
    let rows: Vec<(&str, RetryAfter, Option<Duration>, Action)> = vec![
        (
            "429 Retry-After: 2 -> sleep 2 s",
            hint(&[("retry-after", "2")]),
            None,
            Action::RetryAfter {
                delay: secs(2),
                cause: DelayCause::RetryAfter,
            },
        ),
        (
            "429 past HTTP-date -> policy delay 0.5 s",
            hint(&[("retry-after", "Thu, 01 Jan 1970 00:16:39 GMT")]),
            None,
            Action::RetryAfter {
                delay: Duration::from_millis(500),
                cause: DelayCause::Backoff,
            },
        ),
        (
            "429 Retry-After: 31 -> refused at the ceiling",
            hint(&[("retry-after", "31")]),
            None,
            Action::Fail(Outcome::RetryAfterRefused {
                value: secs(31),
                limit: RefusalLimit::Ceiling,
            }),
        ),
        (
            "429 Retry-After: 2 with a 1 s budget -> refused by the budget",
            hint(&[("retry-after", "2")]),
            Some(secs(1)),
            Action::Fail(Outcome::RetryAfterRefused {
                value: secs(2),
                limit: RefusalLimit::Budget,
            }),
        ),
    ];
    for (name, ra, budget, want) in rows {
        assert_eq!(decide_429(ra, &vector_policy(budget)), want, "{name}");
    }
}

/// (row id, response headers, expected action).
type RaRow<'a> = (&'a str, Vec<(&'a str, &'a str)>, Action);

/// RA1–RA8 at the decision level: (row, headers, expected action) with the
/// matrix policy (base 0.5 s, Retry-After ceiling 60 s, budget 120 s) and
/// jitter pinned at half (policy delay of the first retry: 250 ms).
#[test]
fn ra_rows_at_the_decision_level() {
    let policy = RecoveryPolicy::builder()
        .backoff(Duration::from_millis(500), Duration::from_secs(8))
        .budget(Some(Duration::from_mins(2)))
        .build()
        .unwrap();
    let backoff = Action::RetryAfter {
        delay: Duration::from_millis(250),
        cause: DelayCause::Backoff,
    };
    let wait = |ms: u64| Action::RetryAfter {
        delay: Duration::from_millis(ms),
        cause: DelayCause::RetryAfter,
    };
    let refused = |s: u64, limit| {
        Action::Fail(Outcome::RetryAfterRefused {
            value: Duration::from_secs(s),
            limit,
        })
    };
    let nines = "9".repeat(5000);
    let rows: Vec<RaRow> = vec![
        ("RA1", vec![("retry-after", "2")], wait(2000)),
        (
            "RA2",
            vec![("retry-after", "2"), ("retry-after-ms", "1500")],
            wait(1500),
        ),
        (
            "RA3 imf",
            vec![("retry-after", "Thu, 01 Jan 1970 00:16:42 GMT")],
            wait(2000),
        ),
        (
            "RA3 rfc850",
            vec![("retry-after", "Thursday, 01-Jan-70 00:16:42 GMT")],
            wait(2000),
        ),
        (
            "RA3 asctime",
            vec![("retry-after", "Thu Jan  1 00:16:42 1970")],
            wait(2000),
        ),
        (
            "RA4",
            vec![("retry-after", "Thu, 01 Jan 1970 00:16:39 GMT")],
            backoff.clone(),
        ),
        ("RA5 1.5", vec![("retry-after", "1.5")], backoff.clone()),
        ("RA5 -1", vec![("retry-after", "-1")], backoff.clone()),
        ("RA5 nines", vec![("retry-after", &nines)], backoff.clone()),
        ("RA5 empty", vec![("retry-after", "")], backoff.clone()),
        (
            "RA5 garbled date",
            vec![("retry-after", "Thu, 32 Foo 1970 25:61:00 GMT")],
            backoff.clone(),
        ),
        (
            "RA6 61 s",
            vec![("retry-after", "61")],
            refused(61, RefusalLimit::Ceiling),
        ),
        (
            "RA6 3600 s",
            vec![("retry-after", "3600")],
            refused(3600, RefusalLimit::Ceiling),
        ),
    ];
    for (row, headers, want) in rows {
        let ra = hint(&headers);
        assert_eq!(decide_429(ra, &policy), want, "{row}");
    }
    // RA7: a hint within the ceiling but beyond the remaining budget or the
    // deadline: 50 s left of the budget, hint 55 s.
    let now = Instant::from_origin(Duration::from_secs(100));
    let mut state = AttemptState::first(Instant::from_origin(Duration::ZERO), 3);
    state.first_failure_at = Some(Instant::from_origin(Duration::from_secs(30)));
    let f = Failure::status(429, hint(&[("retry-after", "55")]), None);
    let input = DecisionInput {
        policy: &policy,
        state: &state,
        failure: &f,
        online: true,
        now,
        jitter: Fraction::HALF,
    };
    assert_eq!(
        decide(input),
        refused(55, RefusalLimit::Budget),
        "RA7 budget"
    );
    let mut with_deadline = state.clone();
    with_deadline.first_failure_at = Some(now);
    with_deadline.deadline = Some(Instant::from_origin(Duration::from_secs(150)));
    let input = DecisionInput {
        state: &with_deadline,
        ..input
    };
    assert_eq!(
        decide(input),
        refused(55, RefusalLimit::Deadline),
        "RA7 deadline"
    );
    // RA8: a hint on a permanent status is ignored.
    for code in [400, 401, 403, 404, 413, 422] {
        let f = Failure::status(code, hint(&[("retry-after", "1")]), Some(true));
        let input = DecisionInput {
            failure: &f,
            state: &state,
            ..input
        };
        assert_eq!(
            decide(input),
            Action::Fail(Outcome::Permanent {
                cause: PermanentCause::Status { status: code }
            }),
            "RA8 {code}"
        );
    }
}

#[test]
fn over_ceiling_backoff_falls_back_to_the_policy_delay() {
    let policy = RecoveryPolicy::builder()
        .backoff(Duration::from_millis(500), Duration::from_secs(8))
        .retry_after_ceiling(Duration::from_mins(1), OverCeiling::Backoff)
        .build()
        .unwrap();
    assert_eq!(
        decide_429(hint(&[("retry-after", "3600")]), &policy),
        Action::RetryAfter {
            delay: Duration::from_millis(250),
            cause: DelayCause::Backoff
        }
    );
}
