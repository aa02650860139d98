//! Hedging the first token, input by input: what the vectors (`hg*`) do
//! not reach — a cancellation during a race, a second race, the bounds
//! that refuse a hedge, the hold-back cap while racing, the report's
//! counts and a hedge's own protocol.

use std::borrow::Cow;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::budget::AttemptAllowance;
use crate::cooldown::{CooldownStore, Cooldowns};
use crate::exchange::{Exchange, Head, Io, RequestFacts, Role, Send, Setup};
use crate::failover::Target;
use crate::outcome::Outcome;
use crate::policy::{Endpoint, RecoveryPolicy};
use crate::protocol::{ProtocolChoice, ProtocolKind};
use crate::report::{AttemptResult, HedgeCancel};
use crate::timing::Instant;

const ROLE: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const TEXT: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const DONE: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

struct Sse;
impl Head for Sse {
    fn status(&self) -> u16 {
        200
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        (name == "content-type").then_some(Cow::Borrowed("text/event-stream"))
    }
}

fn at(ms: u64) -> Instant {
    Instant::from_origin(Duration::from_millis(ms))
}

fn policy(hedges: u32) -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .hedge_after(Some(Duration::from_secs(1)))
        .max_hedges(NonZeroU32::new(hedges).unwrap())
        .max_attempts(NonZeroU32::new(4).unwrap())
        .build()
        .unwrap()
}

fn setup(policy: RecoveryPolicy) -> Setup<'static> {
    let request = RequestFacts::new("POST", "/v1/chat/completions", b"{\"model\":\"m\"}");
    let allowance = AttemptAllowance::new(policy.max_attempts().get());
    Setup::new(
        policy,
        &ProtocolChoice::Fixed(ProtocolKind::OpenAiChat),
        request,
        allowance,
        1,
    )
}

/// The first send out, its head and a role chunk in at 0 ms: the machine
/// reads on.
fn streaming(setup: Setup<'_>) -> Exchange<Vec<u8>> {
    let mut ex: Exchange<Vec<u8>> = setup.start(at(0));
    assert_eq!(ex.poll(at(0), true), Io::Send(Send::Original));
    ex.on_sent(at(0));
    ex.on_head(at(0), SystemTime::UNIX_EPOCH, &Sse, None);
    assert_eq!(ex.on_chunk(at(0), ROLE.to_vec()), None);
    assert_eq!(ex.poll(at(0), true), Io::Read);
    ex
}

/// At `ms`, the hedge timer fires and a hedge to `target` goes out,
/// answers a head and a role chunk.
fn hedged(ex: &mut Exchange<Vec<u8>>, ms: u64, target: usize) {
    assert_eq!(ex.poll_timeout(), Some(at(ms)));
    ex.handle_timeout(at(ms));
    assert_eq!(ex.poll(at(ms), true), Io::Hedge { target });
    ex.on_sent_of(Role::Hedge, at(ms));
    ex.on_head_of(Role::Hedge, at(ms), SystemTime::UNIX_EPOCH, &Sse, None);
    assert_eq!(ex.on_chunk_of(Role::Hedge, at(ms), ROLE.to_vec()), None);
    assert_eq!(ex.poll(at(ms), true), Io::Race);
}

struct Limited;
impl Head for Limited {
    fn status(&self) -> u16 {
        429
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        (name == "retry-after").then_some(Cow::Borrowed("7"))
    }
}

fn names(ex: &mut Exchange<Vec<u8>>) -> Vec<&'static str> {
    ex.drain_events().map(|e| e.kind.name()).collect()
}

#[test]
fn a_cancellation_during_a_race_closes_both_attempts_and_both_responses() {
    let mut ex = streaming(setup(policy(1)));
    hedged(&mut ex, 1000, 0);
    ex.cancel(at(1200));
    assert_eq!(ex.poll(at(1200), true), Io::Release);
    assert_eq!(ex.poll(at(1200), true), Io::ReleaseHedge);
    assert!(matches!(
        ex.poll(at(1200), true),
        Io::End(Err(Outcome::Cancelled { .. }))
    ));
    let report = ex.ledger().report();
    assert_eq!(report.attempts.len(), 2);
    for a in &report.attempts {
        assert!(
            matches!(a.result, AttemptResult::Failed { .. }),
            "{:?}",
            a.result
        );
        assert_eq!(a.ended_ms, Some(1200));
    }
    let events = names(&mut ex);
    assert_eq!(
        events,
        [
            "attempt_started",
            "hedge_started",
            "attempt_started",
            "attempt_failed",
            "attempt_failed",
            "cancelled"
        ]
    );
}

#[test]
fn after_a_race_without_a_winner_a_second_hedge_may_race_the_survivor() {
    let mut ex = streaming(setup(policy(2)));
    hedged(&mut ex, 1000, 0);
    // The first attempt resets at 1.5 s: the hedge takes its place, and
    // with a hedge left, may be raced 1 s later.
    ex.on_error(
        at(1500),
        crate::failure::Failure::transport(
            crate::failure::TransportKind::Reset,
            crate::failure::Phase::Streaming,
        ),
    );
    assert_eq!(ex.poll(at(1500), true), Io::Release);
    assert_eq!(ex.poll(at(1500), true), Io::Promote);
    assert_eq!(ex.poll(at(1500), true), Io::Read);
    hedged(&mut ex, 2500, 0);
    assert_eq!(ex.on_chunk_of(Role::Hedge, at(2600), TEXT.to_vec()), None);
    assert_eq!(ex.poll(at(2600), true), Io::Release);
    assert_eq!(ex.poll(at(2600), true), Io::Promote);
    assert_eq!(ex.poll(at(2600), true), Io::Respond);
    let report = ex.ledger().report();
    assert_eq!(report.attempts.len(), 3);
    assert_eq!(report.committed_attempt, Some(3));
    let counts = report.hedges();
    assert_eq!((counts.started, counts.won, counts.cancelled), (2, 1, 1));
    assert_eq!(
        report.attempts[1].result,
        AttemptResult::HedgeCancelled {
            reason: HedgeCancel::RivalWon
        }
    );
    // No third hedge: max_hedges is 2.
    assert!(ex.poll_timeout().is_none_or(|t| t > at(3600)));
}

#[test]
fn a_local_endpoint_is_never_hedged() {
    let p = policy(1)
        .to_builder()
        .endpoint(Endpoint::Local)
        .build()
        .unwrap();
    let ex = streaming(setup(p));
    let due = ex.poll_timeout().expect("the stall watch");
    assert!(due > at(1000), "no hedge timer: {due:?}");
}

#[test]
fn a_cooldown_in_force_for_the_hedges_target_leaves_the_attempt_alone() {
    let store = Arc::new(Cooldowns::new());
    let alt = Target::new("alt")
        .unwrap()
        .with_url("/alt/v1/chat/completions")
        .unwrap()
        .with_model("alt-model")
        .unwrap();
    let key = crate::cooldown::key_for("/alt/v1/chat/completions", b"{\"model\":\"alt-model\"}");
    store.note(&key, at(0), Duration::from_secs(30));
    let targets = [alt];
    let own = crate::cooldown::key_for("/v1/chat/completions", b"{\"model\":\"m\"}");
    let mut ex = streaming(setup(policy(1)).cooldown(store, own).alternates(&targets));
    ex.handle_timeout(at(1000));
    assert_eq!(ex.poll(at(1000), true), Io::Read);
    assert_eq!(ex.ledger().wire_attempt(), 1);
    assert!(!names(&mut ex).contains(&"hedge_started"));
}

#[test]
fn holding_back_past_the_cap_while_racing_cannot_win() {
    let p = policy(1).to_builder().holdback_cap(100).build().unwrap();
    let mut ex = streaming(setup(p));
    hedged(&mut ex, 1000, 0);
    // The hedge holds more than 100 bytes of role chunks: it leaves.
    assert_eq!(ex.on_chunk_of(Role::Hedge, at(1100), ROLE.to_vec()), None);
    assert_eq!(ex.poll(at(1100), true), Io::ReleaseHedge);
    assert_eq!(ex.poll(at(1100), true), Io::Read);
    let report = ex.ledger().report();
    assert_eq!(
        report.attempts[1].result,
        AttemptResult::HedgeCancelled {
            reason: HedgeCancel::HoldbackCap
        }
    );
    // Alone again, the first commits at its cap as before.
    assert_eq!(ex.on_chunk(at(1200), ROLE.to_vec()), None);
    assert_eq!(ex.poll(at(1200), true), Io::Respond);
}

#[test]
fn a_hedge_to_an_alternate_is_read_as_the_alternates_protocol() {
    let alt = Target::new("claude")
        .unwrap()
        .with_url("/v1/messages")
        .unwrap()
        .with_protocol(ProtocolChoice::Fixed(ProtocolKind::Anthropic));
    let targets = [alt];
    let mut ex = streaming(setup(policy(1)).alternates(&targets));
    ex.handle_timeout(at(1000));
    assert_eq!(ex.poll(at(1000), true), Io::Hedge { target: 1 });
    assert_eq!(ex.protocol_of(Role::Hedge), &ProtocolKind::Anthropic);
    assert_eq!(ex.protocol_of(Role::First), &ProtocolKind::OpenAiChat);
    ex.on_sent_of(Role::Hedge, at(1000));
    ex.on_head_of(Role::Hedge, at(1100), SystemTime::UNIX_EPOCH, &Sse, None);
    let text = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    assert_eq!(ex.on_chunk_of(Role::Hedge, at(1200), text.to_vec()), None);
    assert_eq!(ex.poll(at(1200), true), Io::Release);
    assert_eq!(ex.poll(at(1200), true), Io::Promote);
    assert_eq!(ex.poll(at(1200), true), Io::Respond);
    assert_eq!(ex.protocol(), &ProtocolKind::Anthropic);
    assert_eq!(ex.ledger().report().served_by.as_deref(), Some("claude"));
    assert_eq!(ex.on_chunk(at(1300), DONE.to_vec()), None);
}

#[test]
fn a_retry_after_learned_by_a_hedge_holds_its_targets_cooldown() {
    let store = Arc::new(Cooldowns::new());
    let own = crate::cooldown::key_for("/v1/chat/completions", b"{\"model\":\"m\"}");
    let mut ex = streaming(setup(policy(1)).cooldown(store.clone(), own.clone()));
    ex.handle_timeout(at(1000));
    assert_eq!(ex.poll(at(1000), true), Io::Hedge { target: 0 });
    ex.on_sent_of(Role::Hedge, at(1000));
    ex.on_head_of(
        Role::Hedge,
        at(1100),
        SystemTime::UNIX_EPOCH,
        &Limited,
        None,
    );
    ex.on_end_of(Role::Hedge, at(1100));
    assert_eq!(ex.poll(at(1100), true), Io::ReleaseHedge);
    assert_eq!(ex.poll(at(1100), true), Io::Read);
    assert_eq!(
        store.remaining(&own, at(1100)),
        Some(Duration::from_secs(7))
    );
    let events = names(&mut ex);
    assert_eq!(
        events,
        [
            "attempt_started",
            "hedge_started",
            "attempt_started",
            "attempt_failed"
        ]
    );
}

struct Overloaded;
impl Head for Overloaded {
    fn status(&self) -> u16 {
        503
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        (name == "content-type").then_some(Cow::Borrowed("application/json"))
    }
}

#[test]
fn a_hedges_error_head_may_be_the_answer_once_its_rival_left() {
    let p = policy(1)
        .to_builder()
        .max_attempts(NonZeroU32::new(2).unwrap())
        .build()
        .unwrap();
    let mut ex = streaming(setup(p));
    ex.handle_timeout(at(1000));
    assert_eq!(ex.poll(at(1000), true), Io::Hedge { target: 0 });
    ex.on_sent_of(Role::Hedge, at(1000));
    ex.on_head_of(
        Role::Hedge,
        at(1050),
        SystemTime::UNIX_EPOCH,
        &Overloaded,
        None,
    );
    // Its body is read from a copy: the response may be the answer.
    assert!(ex.keeps_response_of(Role::Hedge));
    assert!(!ex.keeps_response_of(Role::First));
    // The first attempt resets before the hedge's error body is judged:
    // the hedge takes its place, and with no send left its error is the
    // request's answer, as the server sent it.
    ex.on_error(
        at(1100),
        crate::failure::Failure::transport(
            crate::failure::TransportKind::Reset,
            crate::failure::Phase::Streaming,
        ),
    );
    assert_eq!(ex.poll(at(1100), true), Io::Release);
    assert_eq!(ex.poll(at(1100), true), Io::Promote);
    assert_eq!(ex.poll(at(1100), true), Io::Read);
    assert!(ex.keeps_response());
    let _ = ex.on_chunk(at(1150), b"{\"error\":{\"type\":\"overloaded\"}}".to_vec());
    ex.on_end(at(1150));
    assert_eq!(ex.poll(at(1150), true), Io::RespondError);
    assert!(matches!(ex.poll(at(1150), true), Io::End(Err(_))));
}
