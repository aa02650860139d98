//! What the tests over the loopback fault provider share (`tests/sdks.rs`
//! and `tests/loopback.rs` here, and the rig-core tests of `rig-tests/`, a
//! workspace of their own that includes this file): the fixture, the
//! policy and its event sink, and the checks of what a request left
//! behind. Each test crate takes what it needs of it.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use recovery_core::failure::Phase;
use recovery_core::outcome::Outcome;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::report::{AttemptResult, RecoveryReport};
use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Write};
use tower_recovery::{RecoveryLayer, ReportHandle};

pub const LIMIT: Duration = Duration::from_secs(20);
pub const PATH: &str = "/v1/chat/completions";
pub const HAPPY: &str = "openai-chat/happy-usage.sse";
/// The text the happy stream's deltas add up to.
pub const ANSWER: &str = "Hello world";

/// The offset just after the `n`th event (1-based) of the happy stream.
pub fn after_events(n: usize) -> usize {
    recovery_tests::process::after_events(HAPPY, n)
}

fn policy() -> RecoveryPolicy {
    recovery_tests::policy::loopback().build().unwrap()
}

/// The names of the lifecycle events, in order.
pub type Events = Arc<Mutex<Vec<String>>>;
/// The report of every request the SDK made, as its transport got it.
pub type Reports = Arc<Mutex<Vec<ReportHandle>>>;

/// The recovery layer of the tests, its events noted in `events`.
pub fn layer(events: &Events) -> RecoveryLayer {
    let sink = Arc::clone(events);
    RecoveryLayer::new(policy()).on_event(move |e| sink.lock().unwrap().push(e.kind.name().into()))
}

/// The one report the transport kept.
pub fn only_report(reports: &Reports) -> RecoveryReport {
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 1, "one request, one report");
    reports[0].report()
}

pub fn failed_phases(report: &RecoveryReport) -> Vec<Phase> {
    report
        .attempts
        .iter()
        .filter_map(|a| match &a.result {
            AttemptResult::Failed { phase, .. } => Some(*phase),
            _ => None,
        })
        .collect()
}

pub fn terminal_events(events: &Events) -> Vec<String> {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|n| {
            matches!(
                n.as_str(),
                "completed" | "exhausted" | "interrupted" | "cancelled"
            )
        })
        .cloned()
        .collect()
}

/// Every send carried the SDK's request, unchanged (the same body, the
/// caller's key), asked for a stream, and left no connection open; the
/// first send's body, for the SDK's own fields.
pub async fn check_sends(provider: &FaultProvider, expected: u64) -> serde_json::Value {
    let stats = tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .expect("connections left open");
    assert_eq!(stats.open_connections, 0);
    assert_eq!(provider.count_path(PATH), expected);
    let sent = provider.requests_for(PATH);
    let first: serde_json::Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(first["stream"], true, "the SDK asked for a stream");
    for r in &sent {
        assert_eq!(r.method, "POST");
        assert_eq!(r.body, sent[0].body, "a replay sends the same body");
        assert_eq!(
            r.header("authorization"),
            Some(&b"Bearer sk-canary-secret"[..])
        );
    }
    first
}

/// A provider whose first answer sends the role-only event (no semantic
/// output) and resets, and whose second answers whole.
pub async fn reset_before_the_first_token() -> FaultProvider {
    reset_after_events(1, true).await
}

/// A provider whose answer resets after "Hello" went out.
pub async fn reset_after_the_first_token() -> FaultProvider {
    reset_after_events(2, false).await
}

/// A provider whose first answer resets after `n` events; with
/// `then_whole`, its second answers whole.
async fn reset_after_events(n: usize, then_whole: bool) -> FaultProvider {
    let whole = || Script::event_stream(Write::fixture(HAPPY).split_lines());
    let mut scripts = vec![whole().cut_at(after_events(n)).ending(Ending::Rst)];
    if then_whole {
        scripts.push(whole());
    }
    FaultProvider::start(ScriptSet::new(vec![]).path(PATH, scripts))
        .await
        .unwrap()
}

/// The request was replayed once, unseen, and completed.
pub fn check_replayed_once(reports: &Reports, events: &Events) {
    let report = only_report(reports);
    assert!(
        matches!(report.outcome, Some(Outcome::Completed { .. })),
        "{:?}",
        report.outcome
    );
    assert_eq!(report.resend_count, 1);
    assert_eq!(failed_phases(&report), [Phase::Streaming]);
    assert_eq!(terminal_events(events), ["completed"]);
}

/// The request was interrupted after commit, never replayed; its report.
pub fn check_interrupted(reports: &Reports, events: &Events) -> RecoveryReport {
    let report = only_report(reports);
    assert!(
        matches!(
            report.outcome,
            Some(Outcome::Interrupted {
                committed: true,
                ..
            })
        ),
        "{:?}",
        report.outcome
    );
    assert_eq!(failed_phases(&report), [Phase::Streaming]);
    assert_eq!(terminal_events(events), ["interrupted"]);
    report
}
