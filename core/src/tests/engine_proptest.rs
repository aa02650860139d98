//! Property test of the engine over random failure sequences, `Retry-After`
//! values, policies and jitter seeds: physical sends never exceed
//! `max_attempts`, no wait exceeds its ceiling (the backoff ceiling, or an
//! accepted `Retry-After` within its own ceiling), no retry starts past the
//! recovery budget or the deadline, and there is exactly one terminal event
//! (the harness checks G2, G9, G12 and LC1 on every run as well).

use super::common;

use std::num::NonZeroU32;
use std::time::Duration;

use crate::decision::{AdmissionAnswer, DelayCause};
use crate::failure::{Failure, Phase, TransportKind};
use crate::lifecycle::EventKind;
use crate::policy::{Endpoint, OverCeiling, RecoveryPolicy};
use crate::progress::{Progress, Proof, SemanticKind};
use crate::retry_after::RetryAfter;
use common::{Hook, Jitter, Script, Step, ms, secs};
use proptest::prelude::*;

fn hint() -> impl Strategy<Value = RetryAfter> {
    prop_oneof![
        Just(RetryAfter::Absent),
        Just(RetryAfter::Invalid),
        (0u64..120_000).prop_map(|m| RetryAfter::Millis(ms(m))),
        (0u64..200).prop_map(|s| RetryAfter::Seconds(secs(s))),
        (0u64..200).prop_map(|s| RetryAfter::Date(secs(s))),
    ]
}

fn failure() -> impl Strategy<Value = Failure> {
    let status = prop_oneof![
        Just(400u16),
        Just(404),
        Just(408),
        Just(429),
        Just(500),
        Just(501),
        Just(503),
        Just(504),
        Just(529),
        Just(307),
    ];
    let transport = prop_oneof![
        Just((TransportKind::Refused, Phase::Connecting)),
        Just((TransportKind::Reset, Phase::AwaitingHeaders)),
        Just((TransportKind::Reset, Phase::Streaming)),
        Just((TransportKind::Dns, Phase::Connecting)),
        Just((TransportKind::Closed, Phase::Sending)),
    ];
    prop_oneof![
        4 => (status, hint(), prop::option::of(any::<bool>()))
            .prop_map(|(s, h, x)| Failure::status(s, h, x)),
        2 => transport.prop_map(|(k, p)| Failure::transport(k, p)),
        1 => (0u64..3).prop_map(|n| {
            let mut p = Progress::default();
            for _ in 0..n {
                p.observe(SemanticKind::Content);
            }
            Failure::transport(TransportKind::Reset, Phase::Streaming).with_progress(p)
        }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u64..200_000, failure()).prop_map(|(after, failure)| Step::Fail {
            after: ms(after),
            failure,
            commit: false,
            offline: false,
        }),
        1 => (0u64..200_000).prop_map(|after| Step::Succeed {
            after: ms(after),
            proof: Proof::Strong,
            commit: true,
        }),
    ]
}

#[derive(Debug, Clone)]
struct Knobs {
    max_attempts: u32,
    base_ms: u64,
    ceiling_ms: u64,
    budget_s: Option<u64>,
    deadline_s: Option<u64>,
    ra_ceiling_s: u64,
    over: OverCeiling,
    local: bool,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        1u32..7,
        1u64..2_000,
        0u64..20_000,
        prop::option::of(1u64..300),
        prop::option::of(1u64..600),
        0u64..120,
        prop_oneof![Just(OverCeiling::Refuse), Just(OverCeiling::Backoff)],
        any::<bool>(),
    )
        .prop_map(
            |(max_attempts, base_ms, extra, budget_s, deadline_s, ra_ceiling_s, over, local)| {
                Knobs {
                    max_attempts,
                    base_ms,
                    ceiling_ms: base_ms + extra,
                    budget_s,
                    deadline_s,
                    ra_ceiling_s,
                    over,
                    local,
                }
            },
        )
}

fn policy(k: &Knobs) -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(k.max_attempts).unwrap())
        .backoff(ms(k.base_ms), ms(k.ceiling_ms))
        .budget(k.budget_s.map(secs))
        .deadline(k.deadline_s.map(secs))
        .retry_after_ceiling(secs(k.ra_ceiling_s), k.over)
        .endpoint(if k.local {
            Endpoint::Local
        } else {
            Endpoint::Remote
        })
        .build()
        .unwrap()
}

fn answer() -> impl Strategy<Value = Hook> {
    (
        0u64..5_000,
        prop_oneof![
            6 => Just(AdmissionAnswer::Allow),
            1 => Just(AdmissionAnswer::Reject),
            1 => Just(AdmissionAnswer::Unresolved),
        ],
    )
        .prop_map(|(after, answer)| Hook::Answer {
            after: ms(after),
            answer,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn engine_invariants_hold_for_any_failure_sequence(
        k in knobs(),
        steps in prop::collection::vec(step(), 6),
        hook in prop::option::of(prop::collection::vec(answer(), 6)),
        seed in any::<u64>(),
        cancel in prop::option::of((0usize..6, 0u64..1_000)),
    ) {
        let policy = policy(&k);
        let mut script = Script::new(policy, steps.clone()).jitter(Jitter::Seeded(seed));
        script.hook = hook;
        script.cancel_in_wait = cancel.map(|(i, at)| (i, Duration::from_micros(at)));
        let run = script.run();

        // G2: physical sends never exceed max_attempts.
        prop_assert!(run.send_count() <= k.max_attempts as usize);

        // Exactly one terminal event.
        prop_assert_eq!(run.events.iter().filter(|e| e.kind.is_terminal()).count(), 1);

        // No wait exceeds its ceiling: a backoff draw stays under the backoff
        // ceiling; a Retry-After wait is the hint of the failure before it and
        // stays within the Retry-After ceiling.
        let failures: Vec<&Failure> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Fail { failure, .. } => Some(failure),
                _ => None,
            })
            .collect();
        for (i, (delay, cause, _)) in run.waits.iter().enumerate() {
            match cause {
                DelayCause::Backoff => prop_assert!(*delay <= ms(k.ceiling_ms)),
                DelayCause::RetryAfter => {
                    prop_assert!(*delay <= secs(k.ra_ceiling_s));
                    prop_assert_eq!(Some(*delay), failures[i].retry_after.delay());
                }
                // No cooldown store in these runs.
                DelayCause::Cooldown => prop_assert!(false, "a cooldown wait without a store"),
            }
            prop_assert!(*delay <= ms(k.ceiling_ms).max(secs(k.ra_ceiling_s)));
        }

        // No retry starts past the recovery budget (counted from the first
        // failure) or the deadline.
        let first_failure = run.events.iter().find_map(|e| match e.kind {
            EventKind::AttemptFailed { .. } => Some(e.at),
            _ => None,
        });
        for (at, n) in run.sends.iter().skip(1) {
            let at = at.since_origin();
            if let (Some(b), Some(f)) = (k.budget_s, first_failure) {
                prop_assert!(at <= f + secs(b), "send {} at {:?} past the budget", n, at);
            }
            if let Some(d) = k.deadline_s {
                prop_assert!(at <= secs(d), "send {} at {:?} past the deadline", n, at);
            }
        }

        // Refused hints are never slept on and never shortened.
        if let crate::outcome::Outcome::RetryAfterRefused { value, .. } = run.outcome {
            let last = failures[run.send_count() - 1];
            prop_assert_eq!(last.retry_after.delay(), Some(value));
        }
    }
}
