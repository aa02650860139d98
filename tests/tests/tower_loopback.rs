//! `RecoveryLayer` + `ObserveLayer` over a hyper-util client against the
//! loopback fault provider: real sockets, real framing, server-side counters.
//!
//! Every test checks the global invariants that apply to it: delivered bytes
//! equal exactly one attempt's stream, server sends ≤ `max_attempts` and equal
//! to the reported attempts, resends byte-identical, exactly one terminal
//! lifecycle event, and no connection left open.

mod support;

use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::lifecycle::{DelayCause, EventKind, LifecycleEvent};
use recovery_core::outcome::Outcome;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Write};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};
use tower_service::Service;

const LIMIT: Duration = Duration::from_secs(20);
const PATH: &str = "/v1/chat/completions";
const PROMPT: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"canary-prompt"}]}"#;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(recovery_tests::fault::default_fixtures_dir().join(name)).expect("fixture")
}

/// A 200 SSE answer starting with `write`.
fn sse(write: impl Into<recovery_tests::fault::WriteSpec>) -> Script {
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(write)
}

fn policy() -> RecoveryPolicy {
    recovery_tests::policy::loopback().build().unwrap()
}

type Events = Arc<Mutex<Vec<LifecycleEvent>>>;

/// The stack under test: `RecoveryLayer` (its events into `events`) over
/// `ObserveLayer` over a hyper-util client.
type Stack = tower_recovery::recovery::Recover<
    tower_recovery::observe::Observe<Client<HttpConnector, ReplayBody>>,
    tower_recovery::TokioTiming,
    recovery_core::timing::AlwaysOnline,
>;

fn stack(layer: RecoveryLayer, kind: ProtocolKind, events: &Events) -> Stack {
    let sink = Arc::clone(events);
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    layer
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(kind).layer(client))
}

struct Run {
    status: u16,
    body: Vec<u8>,
    body_error: Option<tower_recovery::core::error::RecoveryError>,
    report: Option<tower_recovery::core::report::RecoveryReport>,
    events: Vec<String>,
}

async fn run(provider: &FaultProvider, kind: ProtocolKind, policy: RecoveryPolicy) -> Run {
    let events: Events = Arc::default();
    let mut svc = stack(RecoveryLayer::new(policy), kind, &events);
    let req = Request::post(provider.url(PATH))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-canary-secret")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let result = tokio::time::timeout(LIMIT, async {
        match svc.call(req).await {
            Ok(resp) => {
                let d = support::read_to_end(resp).await;
                (d.status, d.bytes, d.body_error, d.report)
            }
            Err(e) => panic!("the response future failed: {e}"),
        }
    })
    .await
    .expect("hung");
    drop(svc);
    let stats = tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .expect("connections left open");
    assert_eq!(stats.open_connections, 0);
    let events: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name().to_owned())
        .collect();
    let terminal = events
        .iter()
        .filter(|n| {
            matches!(
                n.as_str(),
                "completed" | "exhausted" | "interrupted" | "cancelled"
            )
        })
        .count();
    assert_eq!(terminal, 1, "exactly one terminal event: {events:?}");
    let run = Run {
        status: result.0,
        body: result.1,
        body_error: result.2,
        report: result.3,
        events,
    };
    // G2 and RQ1: sends within the allowance, every resend byte-identical.
    let sent = provider.requests_for(PATH);
    assert!(sent.len() <= 3);
    for r in &sent {
        assert_eq!(r.body, sent[0].body, "resends carry the same bytes");
        assert_eq!(r.method, sent[0].method);
    }
    run
}

#[tokio::test]
async fn st1_cn3_503_then_reset_before_head_then_happy_stream_completes() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            Script::status(503).header("retry-after-ms", "10"),
            Script::just(Ending::ResetBeforeHead),
            sse(Write::fixture("openai-chat/happy-usage.sse").split_lines()),
        ],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert_eq!(run.status, 200);
    assert!(run.body_error.is_none(), "{:?}", run.body_error);
    assert_eq!(
        run.body, happy,
        "delivered bytes are exactly the committed stream"
    );
    assert_eq!(provider.count_path(PATH), 3);
    let report = run.report.expect("report");
    assert_eq!(report.attempt_count(), 3);
    assert!(matches!(report.outcome, Some(Outcome::Completed { .. })));
    assert_eq!(report.resend_count, 2);
    assert_eq!(
        run.events,
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
            "committed",
            "attempt_succeeded",
            "completed"
        ]
    );
}

#[tokio::test]
async fn pt5_transient_error_before_output_is_replayed_invisibly() {
    let happy = fixture("anthropic/happy.sse");
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            sse(Write::fixture("anthropic/error-first.sse")),
            sse(Write::fixture("anthropic/happy.sse").split_lines()),
        ],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::Anthropic, policy()).await;
    assert_eq!(
        run.body, happy,
        "nothing of the failed attempt reaches the consumer"
    );
    assert_eq!(provider.count_path(PATH), 2);
    assert!(matches!(
        run.report.unwrap().outcome,
        Some(Outcome::Completed { .. })
    ));
}

#[tokio::test]
async fn a_permanent_stream_error_before_output_is_the_answer() {
    // The provider's own stream through its error event, then the typed
    // error, with the text the npm package gives too (its fetch case
    // `permanent_error_in_stream_before_commit_is_the_answer`).
    let start = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",",
        "\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",",
        "\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"output_tokens\":0}}}\n\n"
    );
    let error = concat!(
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",",
        "\"message\":\"max_tokens: must be at least 1\"}}\n\n"
    );
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            sse(Write::text(format!("{start}{error}"))),
            sse(Write::fixture("anthropic/happy.sse")),
        ],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::Anthropic, policy()).await;
    assert_eq!(run.status, 200);
    assert_eq!(
        String::from_utf8(run.body).unwrap(),
        format!("{start}{error}")
    );
    let error = run.body_error.expect("the body ends with the typed error");
    assert_eq!(
        error.to_string(),
        "recovery failed: permanent failure (provider error invalid_request_error) (1 attempt(s), last status 200)"
    );
    assert_eq!(provider.count_path(PATH), 1, "never resent");
    assert_eq!(run.events.last().map(String::as_str), Some("exhausted"));
}

#[tokio::test]
async fn a_first_token_timeout_closes_the_attempt_at_once() {
    // The head and a role chunk, then nothing: at the first-token timeout
    // the attempt's connection is closed at once (the provider stops
    // generating). One attempt allowed, so the request then fails; the
    // replay and the move to an alternate are vectors ft1 and ft2.
    let role = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![sse(Write::text(role)).ending(Ending::Stall)]),
    )
    .await
    .unwrap();
    let policy = RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::MIN)
        .first_token_timeout(Some(Duration::from_millis(150)))
        .build()
        .unwrap();
    let events: Events = Arc::default();
    let mut svc = stack(
        RecoveryLayer::new(policy),
        ProtocolKind::OpenAiChat,
        &events,
    );
    let req = Request::post(provider.url(PATH))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let started = std::time::Instant::now();
    let watch = async {
        provider.wait_for_stalls(1).await;
        let stalled = std::time::Instant::now();
        provider.wait_until(|s| s.open_connections == 0).await;
        (stalled.elapsed(), std::time::Instant::now())
    };
    let (result, (closed_after, closed_at)) =
        tokio::time::timeout(LIMIT, async { tokio::join!(svc.call(req), watch) })
            .await
            .expect("hung");
    let error = result.expect_err("no token in time, no attempt left");
    assert!(
        error.to_string().contains("exhausted after 1 attempt(s)"),
        "{error}"
    );
    // The first-token watchdog ended it, at its timeout (the idle
    // watchdog's default is 300 s).
    let names: Vec<String> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| serde_json::to_string(&e.kind).unwrap())
        .collect();
    assert!(
        names
            .iter()
            .any(|e| e.contains(r#""reason":"stall""#) && e.contains(r#""stall":"first_token""#)),
        "{names:?}"
    );
    let ended = error.report().attempts[0].ended_ms.expect("ended");
    assert!((150..450).contains(&ended), "ended at {ended} ms");
    // The decision comes at 150 ms; the close follows it at once: the
    // provider sees its peer gone within 100 ms of it.
    assert!(
        closed_after < Duration::from_millis(450),
        "the stalled connection closed {closed_after:?} after the stall began"
    );
    let decided = events
        .lock()
        .unwrap()
        .iter()
        .find(|e| e.kind.name() == "attempt_failed")
        .map(|e| started + e.at)
        .expect("the attempt failed");
    let close_delay = closed_at.saturating_duration_since(decided);
    assert!(
        close_delay < Duration::from_millis(100),
        "closed {close_delay:?} after the decision"
    );
    assert_eq!(provider.count_path(PATH), 1);
}

#[tokio::test]
async fn bd1_cut_after_first_semantic_event_is_interrupted_not_replayed() {
    let happy = fixture("openai-chat/happy-usage.sse");
    // The first two events: the role-only chunk and the first content chunk.
    let text = String::from_utf8(happy.clone()).unwrap();
    let cut = text.match_indices("\n\n").nth(1).unwrap().0 + 2;
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![sse(Write::fixture("openai-chat/happy-usage.sse").split_lines())
            .cut_at(cut)
            .ending(Ending::Rst)],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert_eq!(run.status, 200);
    assert_eq!(
        run.body,
        &happy[..cut],
        "the committed prefix, nothing more"
    );
    let err = run.body_error.expect("typed error at the end of the body");
    assert!(
        matches!(err.outcome(), Outcome::Interrupted { .. }),
        "{err}"
    );
    assert_eq!(
        provider.count_path(PATH),
        1,
        "no replay after semantic output"
    );
    assert_eq!(run.events.last().unwrap(), "interrupted");
}

#[tokio::test]
async fn bd4_keepalives_then_cut_are_replayed() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            sse(Write::text(": keep-alive\n\n: keep-alive\n\n")).ending(Ending::Fin),
            sse(Write::fixture("openai-chat/happy-usage.sse")),
        ],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert_eq!(run.body, happy);
    assert_eq!(provider.count_path(PATH), 2);
}

#[tokio::test]
async fn tb2_always_503_returns_the_final_response_after_three_sends() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![Script::status(503).write(Write::text("{}"))]),
    )
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert_eq!(
        run.status, 503,
        "a final HTTP error comes back as that response"
    );
    assert_eq!(provider.count_path(PATH), 3);
    let report = run.report.expect("report in the extensions");
    assert_eq!(report.attempt_count(), 3);
    assert!(matches!(
        report.outcome,
        Some(Outcome::Exhausted { attempts: 3 })
    ));
    assert_eq!(
        &run.events[run.events.len() - 3..],
        ["attempt_started", "attempt_failed", "exhausted"]
    );
}

#[tokio::test]
async fn st2_st3_permanent_status_and_redirect_are_sent_once() {
    for (status, location) in [(400, None), (401, None), (307, Some("/elsewhere"))] {
        let mut script = Script::status(status).header("x-should-retry", "true");
        if let Some(loc) = location {
            script = script.header("location", loc);
        }
        let provider = FaultProvider::start(ScriptSet::new(vec![]).path(PATH, vec![script]))
            .await
            .unwrap();
        let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
        assert_eq!(run.status, status);
        assert_eq!(provider.count_path(PATH), 1, "status {status} sent once");
        assert_eq!(
            provider.count_path("/elsewhere"),
            0,
            "redirect never followed"
        );
        assert!(matches!(
            run.report.unwrap().outcome,
            Some(Outcome::Permanent { .. })
        ));
    }
}

#[tokio::test]
async fn cn1_connection_refused_exhausts_with_a_typed_error() {
    let addr = recovery_tests::fault::refused_addr().unwrap();
    let events: Events = Arc::default();
    let mut svc = stack(
        RecoveryLayer::new(policy()),
        ProtocolKind::OpenAiChat,
        &events,
    );
    let req = Request::post(format!("http://{addr}{PATH}"))
        .header("authorization", "Bearer sk-canary-secret")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let err = tokio::time::timeout(LIMIT, svc.call(req))
        .await
        .unwrap()
        .expect_err("refused everywhere");
    assert_eq!(err.outcome(), &Outcome::Exhausted { attempts: 3 });
    let rendered = format!("{err} {err:?} {}", serde_json::to_string(&err).unwrap());
    assert!(!rendered.contains("canary"), "redacted: {rendered}");
    let names: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(names.iter().filter(|n| **n == "attempt_started").count(), 3);
    assert_eq!(names.last(), Some(&"exhausted"));
}

#[tokio::test]
async fn pt4_unsuccessful_terminal_is_not_retried_and_not_completed() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![sse(Write::fixture("openai-chat/length.sse"))]),
    )
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    let err = run.body_error.expect("typed error");
    assert!(
        matches!(err.outcome(), Outcome::Unsuccessful { .. }),
        "{err}"
    );
    assert_eq!(provider.count_path(PATH), 1);
}

#[tokio::test]
async fn cx5_consumer_drop_is_cancellation_not_eof() {
    let happy = String::from_utf8(fixture("openai-chat/happy-usage.sse")).unwrap();
    let cut = happy.match_indices("\n\n").nth(1).unwrap().0 + 2;
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            sse(Write::fixture("openai-chat/happy-usage.sse").range(0, cut)).ending(Ending::Stall),
        ],
    ))
    .await
    .unwrap();
    let events: Events = Arc::default();
    let mut svc = stack(
        RecoveryLayer::new(policy()),
        ProtocolKind::OpenAiChat,
        &events,
    );
    let req = Request::post(provider.url(PATH))
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let resp = tokio::time::timeout(LIMIT, svc.call(req))
        .await
        .unwrap()
        .unwrap();
    drop(resp);
    drop(svc);
    tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .unwrap();
    let names: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(&names[names.len() - 2..], ["attempt_failed", "cancelled"]);
    assert_eq!(provider.count_path(PATH), 1);
}

#[tokio::test]
async fn bd11_reset_right_after_proof_completes_and_records_the_late_error() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![sse(Write::fixture("openai-chat/happy-usage.sse")).ending(Ending::Rst)],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert!(run.body_error.is_none(), "{:?}", run.body_error);
    assert_eq!(run.body, happy);
    let report = run.report.unwrap();
    assert!(matches!(report.outcome, Some(Outcome::Completed { .. })));
    assert!(report.late_error, "the reset after [DONE] is recorded");
}

#[tokio::test]
async fn st7_json_answer_is_judged_whole_not_as_a_stream() {
    let body = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}"#;
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![Script::ok()
            .header("content-type", "application/json")
            .write(Write::text(body))],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert!(run.body_error.is_none(), "{:?}", run.body_error);
    assert_eq!(run.body, body.as_bytes());
    assert!(matches!(
        run.report.unwrap().outcome,
        Some(Outcome::Completed { .. })
    ));
}

#[tokio::test]
async fn st4_quota_429_is_permanent_even_with_retry_after() {
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![Script::status(429)
            .header("retry-after", "1")
            .header("content-type", "application/json")
            .write(Write::text(
                r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#,
            ))],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert_eq!(run.status, 429);
    assert_eq!(provider.count_path(PATH), 1);
    assert!(matches!(
        run.report.unwrap().outcome,
        Some(Outcome::Permanent { .. })
    ));
}

/// The event boundaries of `bytes` and whether the prefix up to each one
/// carries strong success proof, from the core observer (the oracle; the
/// decoders have their own tests).
fn boundaries(kind: &ProtocolKind, bytes: &[u8]) -> (u64, Vec<(u64, bool)>) {
    use recovery_core::observer::StreamObserver;
    let mut observer = StreamObserver::new(kind.clone());
    let mut ends = Vec::new();
    observer
        .observe_ends(bytes, Some(&mut ends))
        .expect("fixture decodes");
    let commit = observer
        .committed_at()
        .expect("fixture has semantic output");
    let out = ends
        .into_iter()
        .map(|e| e.end_offset)
        .map(|end| {
            let mut prefix = StreamObserver::new(kind.clone());
            prefix.feed(&bytes[..end as usize]).unwrap();
            let proven = matches!(
                prefix.terminal(),
                Some(recovery_core::progress::Terminal::Success {
                    proof: recovery_core::progress::Proof::Strong
                })
            );
            (end, proven)
        })
        .collect();
    (commit, out)
}

#[tokio::test]
async fn bd1_reset_at_every_event_boundary_of_every_protocol() {
    let cases = [
        (ProtocolKind::OpenAiChat, "openai-chat/happy-usage.sse"),
        (ProtocolKind::OpenAiResponses, "openai-responses/happy.sse"),
        (ProtocolKind::Anthropic, "anthropic/happy.sse"),
        (ProtocolKind::Gemini, "gemini/crlf-happy.sse"),
        (ProtocolKind::Ollama, "ollama/chat-happy.ndjson"),
    ];
    for (kind, name) in cases {
        let bytes = fixture(name);
        let (commit, ends) = boundaries(&kind, &bytes);
        let first_event_commits = ends.first().is_some_and(|(end, _)| *end == commit);
        let (mut replayed, mut interrupted) = (0, 0);
        for (end, proven) in ends {
            if end as usize == bytes.len() {
                continue;
            }
            let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
                PATH,
                vec![
                    sse(Write::fixture(name).split_lines())
                        .cut_at(end as usize)
                        .ending(Ending::Rst),
                    sse(Write::fixture(name)),
                ],
            ))
            .await
            .unwrap();
            let run = run(&provider, kind.clone(), policy()).await;
            let outcome = run.report.as_ref().and_then(|r| r.outcome.clone());
            if end < commit {
                replayed += 1;
                assert_eq!(run.body, bytes, "{name} cut at {end}: replayed whole");
                assert_eq!(provider.count_path(PATH), 2, "{name} cut at {end}");
                assert!(
                    matches!(outcome, Some(Outcome::Completed { .. })),
                    "{name} {end}"
                );
            } else if proven {
                assert_eq!(run.body, &bytes[..end as usize], "{name} cut at {end}");
                assert_eq!(provider.count_path(PATH), 1, "{name} cut at {end}");
                assert!(
                    matches!(outcome, Some(Outcome::Completed { .. })),
                    "{name} {end}"
                );
            } else {
                interrupted += 1;
                assert_eq!(
                    run.body,
                    &bytes[..end as usize],
                    "{name} cut at {end}: prefix only"
                );
                assert_eq!(
                    provider.count_path(PATH),
                    1,
                    "{name} cut at {end}: never replayed"
                );
                assert!(
                    matches!(outcome, Some(Outcome::Interrupted { .. })),
                    "{name} cut at {end}: {outcome:?}"
                );
                assert!(run.body_error.is_some());
            }
        }
        assert!(
            (replayed > 0 || first_event_commits) && interrupted > 0,
            "{name}: both sides of the commit point were cut ({replayed} replayed, {interrupted} interrupted)"
        );
    }
}

#[tokio::test]
async fn bd6_bd7_hostile_streams_end_in_typed_protocol_failures_not_retried() {
    let huge = format!("data: {}", "x".repeat(2 << 20)).into_bytes();
    let garbage = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"\n\n".to_vec();
    let mut invalid_utf8 = b"data: {\"choices\":[{\"delta\":{\"content\":\"".to_vec();
    invalid_utf8.extend_from_slice(b"\xff\xfe\"}}]}\n\n");
    let cases: [(&str, Vec<u8>); 3] = [
        ("line_too_long", huge),
        ("malformed", garbage),
        ("malformed", invalid_utf8),
    ];
    for (want, body) in cases {
        let provider =
            FaultProvider::start(ScriptSet::new(vec![]).path(PATH, vec![sse(Write::bytes(body))]))
                .await
                .unwrap();
        let events: Events = Arc::default();
        // The policy's event cap reaches the observer inside: a 2 MiB
        // line is over 1 MiB.
        let capped = policy().to_builder().max_event_bytes(1 << 20);
        let mut svc = stack(
            RecoveryLayer::new(capped.build().unwrap()),
            ProtocolKind::OpenAiChat,
            &events,
        );
        let req = Request::post(provider.url(PATH))
            .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
            .unwrap();
        // A line longer than the hold-back cap commits the attempt before the
        // line cap is reached (BD5), so the violation may end the body
        // rather than the response future: either way it is typed.
        let outcome = match tokio::time::timeout(LIMIT, svc.call(req)).await.unwrap() {
            Err(err) => err.outcome().clone(),
            Ok(resp) => {
                let mut body = resp.into_body();
                let mut outcome = None;
                while let Some(frame) = body.frame().await {
                    if let Err(e) = frame {
                        outcome = Some(e.outcome().clone());
                        break;
                    }
                }
                outcome.expect("the body ends with the typed error")
            }
        };
        match outcome {
            Outcome::Protocol { violation } => assert_eq!(violation.to_string(), want),
            other => panic!("{want}: {other}"),
        }
        assert_eq!(provider.count_path(PATH), 1, "{want}: never retried");
        drop(svc);
        tokio::time::timeout(LIMIT, provider.wait_idle())
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn cn4_fin_before_the_head_is_replayed_byte_identically() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            Script::just(Ending::FinBeforeHead),
            sse(Write::fixture("openai-chat/happy-usage.sse")),
        ],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    assert_eq!(run.body, happy);
    assert_eq!(provider.count_path(PATH), 2);
}

#[tokio::test]
async fn cn7_head_timeout_closes_the_stalled_connection_and_retries() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            Script::just(Ending::NeverAnswer),
            sse(Write::fixture("openai-chat/happy-usage.sse")),
        ],
    ))
    .await
    .unwrap();
    let p = RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).unwrap())
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .head_timeout(Some(Duration::from_millis(300)))
        .build()
        .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, p).await;
    assert_eq!(run.body, happy);
    assert_eq!(provider.count_path(PATH), 2);
    let report = run.report.unwrap();
    assert!(matches!(
        report.attempts[0].result,
        recovery_core::report::AttemptResult::Failed {
            category: recovery_core::failure::Category::ClientTimeout,
            ..
        }
    ));
}

#[tokio::test]
async fn cx4_cancel_while_awaiting_the_head_releases_the_connection() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(PATH, vec![Script::just(Ending::NeverAnswer)]),
    )
    .await
    .unwrap();
    let events: Events = Arc::default();
    let mut svc = stack(
        RecoveryLayer::new(policy()),
        ProtocolKind::OpenAiChat,
        &events,
    );
    let cancel = recovery_core::call::Cancellation::new();
    let mut req = Request::post(provider.url(PATH))
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    req.extensions_mut()
        .insert(recovery_core::call::RecoveryCall::new().with_cancellation(cancel.clone()));
    let fut = tokio::spawn(svc.call(req));
    tokio::time::timeout(LIMIT, provider.wait_for_stalls(1))
        .await
        .unwrap();
    cancel.cancel();
    let err = tokio::time::timeout(LIMIT, fut)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(
        err.outcome(),
        &Outcome::Cancelled {
            phase: recovery_core::outcome::CancelPhase::AwaitingHead
        }
    );
    drop(svc);
    let stats = tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .unwrap();
    assert_eq!(stats.open_connections, 0, "the server saw the disconnect");
    assert_eq!(provider.count_path(PATH), 1);
    let names: Vec<_> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name())
        .collect();
    assert_eq!(names, ["attempt_started", "attempt_failed", "cancelled"]);
}

/// 500 concurrent requests against an endpoint that always answers 503,
/// through one layer with the default policy: its default retry budget
/// keeps resends to a fifth of the requests plus the reserve; without it
/// every request sends three times.
#[tokio::test]
async fn tb9_storm_over_sockets_with_the_default_policy() {
    const N: usize = 500;
    let mut ratios = Vec::new();
    for with_budget in [false, true] {
        let provider = FaultProvider::start(
            ScriptSet::new(vec![]).path(PATH, vec![Script::status(503).write(Write::text("{}"))]),
        )
        .await
        .unwrap();
        let client: Client<HttpConnector, ReplayBody> =
            Client::builder(TokioExecutor::new()).build_http();
        let mut layer = RecoveryLayer::new(RecoveryPolicy::default());
        if !with_budget {
            layer = layer.without_retry_budget();
        }
        let svc = layer.layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
        let mut tasks = Vec::new();
        for _ in 0..N {
            let mut svc = svc.clone();
            let req = Request::post(provider.url(PATH))
                .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
                .unwrap();
            tasks.push(tokio::spawn(async move {
                match svc.call(req).await {
                    Ok(resp) => {
                        let _ = resp.into_body().collect().await;
                    }
                    Err(e) => assert!(
                        matches!(e.outcome(), Outcome::BudgetExhausted { .. }),
                        "{e}"
                    ),
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(LIMIT, t).await.unwrap().unwrap();
        }
        drop(svc);
        tokio::time::timeout(LIMIT, provider.wait_idle())
            .await
            .unwrap();
        let ratio = provider.count_path(PATH) as f64 / N as f64;
        println!(
            "storm over sockets: {N} requests, always 503, budget {}: {} sends, {ratio:.2} sends/request",
            if with_budget { "on" } else { "off" },
            provider.count_path(PATH)
        );
        ratios.push(ratio);
    }
    assert!((ratios[0] - 3.0).abs() < f64::EPSILON);
    assert!(ratios[1] <= 1.0 + 0.2 + 10.0 / N as f64, "{}", ratios[1]);
    assert!(ratios[1] <= 1.3, "{}", ratios[1]);
}

/// A caller's cooldown key: a wait learned for one model holds a request
/// for another model when both map to one key (one account's limit), and
/// does not when each keeps its default key (origin and model).
#[tokio::test]
async fn cd5_a_callers_key_shares_a_cooldown_across_models() {
    for shared in [false, true] {
        let provider = FaultProvider::start(
            ScriptSet::new(vec![])
                .path(
                    "/a/v1/chat/completions",
                    vec![
                        Script::status(429)
                            .header("retry-after-ms", "300")
                            .write(Write::text("{}")),
                    ],
                )
                .path(
                    "/b/v1/chat/completions",
                    vec![sse(Write::fixture("openai-chat/happy-usage.sse"))],
                ),
        )
        .await
        .unwrap();
        let one_send = RecoveryPolicy::builder()
            .max_attempts(NonZeroU32::new(1).unwrap())
            .build()
            .unwrap();
        let (mut layer, events) = recorded(RecoveryLayer::new(one_send));
        if shared {
            layer = layer.with_cooldown_key(|_, _| "account-1".to_owned());
        }
        let svc = layer.layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(http_client()));
        let call = |path: &str, model: &str| {
            Request::post(provider.url(path))
                .body(Full::new(Bytes::from(format!(
                    r#"{{"model":"{model}","stream":true}}"#
                ))))
                .unwrap()
        };
        let limited = svc
            .clone()
            .oneshot(call("/a/v1/chat/completions", "a"))
            .await
            .unwrap();
        assert_eq!(limited.status(), 429);
        let resp = tokio::time::timeout(
            LIMIT,
            svc.clone().oneshot(call("/b/v1/chat/completions", "b")),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.into_body().collect().await.unwrap();
        assert_eq!(
            cooldown_waits(&events),
            usize::from(shared),
            "shared key: {shared}"
        );
    }
}

/// The rate-limit headers of each answer stay in its attempt's record:
/// numbers and reset tokens, nothing else.
#[tokio::test]
async fn rl1_rate_limit_headers_are_kept_as_safe_evidence() {
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            Script::status(429)
                .header("retry-after-ms", "10")
                .header("x-ratelimit-limit-requests", "500")
                .header("x-ratelimit-remaining-requests", "0")
                .header("x-ratelimit-reset-requests", "6m0s")
                .header("x-ratelimit-reset-tokens", "not a reset")
                .write(Write::text("{}")),
            sse(Write::fixture("openai-chat/happy-usage.sse"))
                .header("x-ratelimit-remaining-requests", "499"),
        ],
    ))
    .await
    .unwrap();
    let run = run(&provider, ProtocolKind::OpenAiChat, policy()).await;
    let report = run.report.expect("report");
    let limits: Vec<_> = report
        .attempts
        .iter()
        .map(|a| serde_json::to_value(&a.rate_limits).unwrap())
        .collect();
    assert_eq!(
        limits,
        [
            serde_json::json!({"requests_limit": 500, "requests_remaining": 0, "requests_reset": "6m0s"}),
            serde_json::json!({"requests_remaining": 499}),
        ]
    );
}

/// One request learns `retry-after-ms: 1500` from a 429; the 40 requests
/// that start while it is in force, through clones of the same layer,
/// send nothing until it ends (the server counts no send in the window),
/// then all complete, each after one send and one `cooldown` wait.
#[tokio::test]
async fn cd4_a_learned_retry_after_holds_every_other_request_over_sockets() {
    const N: usize = 40;
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            Script::status(429)
                .header("retry-after-ms", "1500")
                .write(Write::text("{}")),
            sse(Write::fixture("openai-chat/happy-usage.sse")),
        ],
    ))
    .await
    .unwrap();
    let (layer, events) = recorded(RecoveryLayer::new(RecoveryPolicy::default()));
    let svc = layer.layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(http_client()));
    let request = || {
        Request::post(provider.url(PATH))
            .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
            .unwrap()
    };
    // The first request learns the wait, and waits it out itself.
    let first = tokio::spawn(svc.clone().oneshot(request()));
    while provider.count_path(PATH) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let learned = std::time::Instant::now();
    let others: Vec<_> = (0..N)
        .map(|_| tokio::spawn(svc.clone().oneshot(request())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        learned.elapsed() < Duration::from_millis(1350),
        "the window is still open"
    );
    assert_eq!(
        provider.count_path(PATH),
        1,
        "no send while the cooldown is in force"
    );
    for task in std::iter::once(first).chain(others) {
        let resp = tokio::time::timeout(LIMIT, task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), 200);
        let _ = resp.into_body().collect().await.unwrap();
    }
    assert_eq!(provider.count_path(PATH), 1 + 1 + N as u64);
    assert_eq!(cooldown_waits(&events), N, "each other request waited once");
}

/// `layer` with every lifecycle event recorded.
fn recorded(layer: RecoveryLayer) -> (RecoveryLayer, Events) {
    let events: Events = Arc::default();
    let sink = Arc::clone(&events);
    let layer = layer.on_event(move |e| sink.lock().unwrap().push(e.clone()));
    (layer, events)
}

/// A plain hyper-util client over loopback.
fn http_client() -> Client<HttpConnector, ReplayBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// How many waits the recorded events scheduled for a cooldown.
fn cooldown_waits(events: &Events) -> usize {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                EventKind::DelayScheduled {
                    cause: DelayCause::Cooldown,
                    ..
                }
            )
        })
        .count()
}

/// One call through a fresh `RecoveryLayer` + `ObserveLayer` over `client`
/// (a clone shares its pool): the delivered bytes and the report, with
/// exactly one terminal lifecycle event checked.
async fn call_on<C>(
    client: &Client<C, ReplayBody>,
    url: String,
) -> (Vec<u8>, tower_recovery::core::report::RecoveryReport)
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let events: Events = Arc::default();
    let sink = Arc::clone(&events);
    let mut svc = RecoveryLayer::new(policy())
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client.clone()));
    let req = Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    let (body, report) = tokio::time::timeout(LIMIT, async {
        let resp = svc.call(req).await.expect("the response future");
        let report = resp.extensions().get::<ReportHandle>().cloned().unwrap();
        let body = resp
            .into_body()
            .collect()
            .await
            .expect("the body")
            .to_bytes();
        (body.to_vec(), report.report())
    })
    .await
    .expect("hung");
    let terminal = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| e.kind.is_terminal())
        .count();
    assert_eq!(terminal, 1, "exactly one terminal event");
    (body, report)
}

/// The server answers the first call, then closes that connection (FIN,
/// unannounced) while it sits idle in the pool; the second call gets a
/// clean answer on whatever connection it lands on.
async fn closes_after_first_answer() -> FaultProvider {
    FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            sse(Write::fixture("openai-chat/happy-usage.sse")).no_keep_alive(),
            sse(Write::fixture("openai-chat/happy-usage.sse")),
        ],
    ))
    .await
    .unwrap()
}

/// What CN6 expects of the second call, whichever way the client learned
/// that its pooled connection was closed: one attempt reported, one request
/// received (on a new connection), the fixture delivered once.
fn assert_second_call_is_one_attempt(
    provider: &FaultProvider,
    second: &(Vec<u8>, tower_recovery::core::report::RecoveryReport),
) {
    let happy = fixture("openai-chat/happy-usage.sse");
    let (body, report) = second;
    assert_eq!(body, &happy);
    assert_eq!(report.attempt_count(), 1, "{report:?}");
    assert_eq!(report.resend_count, 0);
    assert!(matches!(report.outcome, Some(Outcome::Completed { .. })));
    let sent = provider.requests_for(PATH);
    assert_eq!(sent.len(), 2, "exactly one request per call");
    assert_eq!(sent[0].connection, 0);
    assert_eq!(
        sent[1].connection, 1,
        "the closed connection carried nothing"
    );
    assert_eq!(sent[1].body, sent[0].body);
}

#[tokio::test]
async fn cn6_pooled_connection_closed_while_idle_costs_no_attempt() {
    // A race by nature: the pool may notice the FIN before the checkout
    // (it connects anew), or hyper may find it when the request arrives
    // (hyper-util re-sends it unwritten). Either way: one attempt, one request.
    let happy = fixture("openai-chat/happy-usage.sse");
    let provider = closes_after_first_answer().await;
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let first = call_on(&client, provider.url(PATH)).await;
    assert_eq!(first.0, happy);
    assert_eq!(first.1.attempt_count(), 1);
    let second = call_on(&client, provider.url(PATH)).await;
    assert_second_call_is_one_attempt(&provider, &second);
    drop(client);
    let stats = tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .unwrap();
    assert_eq!(stats.connections_accepted, 2);
}

/// Shared state of [`LateEof`] connections.
#[derive(Default)]
struct LateEofState {
    /// Connections made.
    connections: AtomicU32,
    /// Once set, a hidden end of stream is reported on the next read.
    reveal: AtomicBool,
    /// Hidden ends of stream, counted as they happen.
    hidden: tokio::sync::watch::Sender<u32>,
    /// Hidden ends of stream later reported to hyper.
    revealed: AtomicU32,
    /// Bytes hyper wrote on a connection after its end of stream was hidden.
    written_after_eof: AtomicUsize,
}

/// A connector whose connections keep the server's FIN from hyper until
/// `reveal` is set *and* something else wakes the connection: an idle pooled
/// connection the server closed then still looks open to the pool, and
/// hyper finds it closed only when the next request wakes it, before it
/// writes anything. This makes hyper-util's re-send of an unstarted request
/// (`retry_canceled_requests`) happen every time instead of by chance.
#[derive(Clone)]
struct LateEof {
    inner: HttpConnector,
    state: Arc<LateEofState>,
}

impl LateEof {
    fn new() -> Self {
        LateEof {
            inner: HttpConnector::new(),
            state: Arc::default(),
        }
    }
}

struct LateEofStream {
    stream: tokio::net::TcpStream,
    state: Arc<LateEofState>,
    eof: bool,
    revealed: bool,
}

impl tower_service::Service<http::Uri> for LateEof {
    type Response = hyper_util::rt::TokioIo<LateEofStream>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let state = Arc::clone(&self.state);
        Box::pin(async move {
            let stream = connecting.await?.into_inner();
            state.connections.fetch_add(1, SeqCst);
            Ok(hyper_util::rt::TokioIo::new(LateEofStream {
                stream,
                state,
                eof: false,
                revealed: false,
            }))
        })
    }
}

impl hyper_util::client::legacy::connect::Connection for LateEofStream {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.stream.connected()
    }
}

impl tokio::io::AsyncRead for LateEofStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.eof {
            let before = buf.filled().len();
            match Pin::new(&mut this.stream).poll_read(cx, buf) {
                Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                    this.eof = true;
                    this.state.hidden.send_modify(|n| *n += 1);
                }
                other => return other,
            }
        }
        if this.state.reveal.load(SeqCst) {
            if !this.revealed {
                this.revealed = true;
                this.state.revealed.fetch_add(1, SeqCst);
            }
            Poll::Ready(Ok(()))
        } else {
            // No waker is kept: only another event (a request handed to
            // this connection) polls it again.
            Poll::Pending
        }
    }
}

impl tokio::io::AsyncWrite for LateEofStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.eof {
            this.state.written_after_eof.fetch_add(data.len(), SeqCst);
        }
        Pin::new(&mut this.stream).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The second call of [`closes_after_first_answer`] handed to the closed
/// pooled connection every time (see [`LateEof`]), through a client whose
/// own re-send of unwritten requests is `retry_canceled`.
async fn second_call_on_a_closed_pooled_connection(
    retry_canceled: bool,
) -> (
    FaultProvider,
    (Vec<u8>, tower_recovery::core::report::RecoveryReport),
) {
    let happy = fixture("openai-chat/happy-usage.sse");
    let provider = closes_after_first_answer().await;
    let connector = LateEof::new();
    let state = Arc::clone(&connector.state);
    let client: Client<LateEof, ReplayBody> = Client::builder(TokioExecutor::new())
        .retry_canceled_requests(retry_canceled)
        .build(connector);
    let first = call_on(&client, provider.url(PATH)).await;
    assert_eq!(first.0, happy);
    assert_eq!(first.1.attempt_count(), 1);
    // The server closed connection 0 once its answer was out; hyper read
    // the FIN, and it was kept from it.
    let mut hidden = state.hidden.subscribe();
    tokio::time::timeout(LIMIT, hidden.wait_for(|n| *n >= 1))
        .await
        .unwrap()
        .unwrap();
    // Let the pool take the connection back as idle (its return is a task
    // woken by the connection) before the next checkout.
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
    state.reveal.store(true, SeqCst);
    let second = call_on(&client, provider.url(PATH)).await;
    assert_eq!(
        state.revealed.load(SeqCst),
        1,
        "the second request was handed to the closed pooled connection"
    );
    assert_eq!(
        state.written_after_eof.load(SeqCst),
        0,
        "nothing was written to it"
    );
    assert_eq!(state.connections.load(SeqCst), 2);
    drop(client);
    let stats = tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .unwrap();
    assert_eq!(stats.connections_accepted, 2);
    (provider, second)
}

#[tokio::test]
async fn cn6_hyper_util_resends_an_unwritten_request_and_it_is_one_attempt() {
    let (provider, second) = second_call_on_a_closed_pooled_connection(true).await;
    assert_second_call_is_one_attempt(&provider, &second);
}

#[tokio::test]
async fn cn6_with_the_clients_resend_off_the_unwritten_request_costs_an_attempt() {
    // What the row guards against: without hyper-util's re-send, the request
    // hyper handed back unwritten reaches recovery as a failure it cannot
    // tell from a lost send (acceptance unknown) and is counted, although
    // the server received one request.
    let (provider, second) = second_call_on_a_closed_pooled_connection(false).await;
    let (body, report) = &second;
    assert_eq!(body, &fixture("openai-chat/happy-usage.sse"));
    assert_eq!(report.attempt_count(), 2);
    assert_eq!(
        report.attempts[0].acceptance,
        Some(recovery_core::failure::Acceptance::Unknown)
    );
    assert_eq!(provider.count_path(PATH), 2, "one request per call");
}

/// A policy for a local endpoint: a failure the server may have accepted
/// is not replayed without an admission hook (`admission_required`), so
/// only a failure provably before the connection is retried.
fn local_policy() -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(2).unwrap())
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .endpoint(recovery_core::policy::Endpoint::Local)
        .build()
        .unwrap()
}

/// One call through `RecoveryLayer` + `ObserveLayer` over `client`, which
/// must fail before any head: its error.
async fn call_failing<C>(
    client: Client<C, ReplayBody>,
    url: String,
) -> tower_recovery::core::error::RecoveryError
where
    C: hyper_util::client::legacy::connect::Connect + Clone + Send + Sync + 'static,
{
    let mut svc = RecoveryLayer::new(local_policy())
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let req = Request::post(url)
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap();
    tokio::time::timeout(LIMIT, svc.call(req))
        .await
        .expect("hung")
        .expect_err("no connection can be made")
}

/// Every attempt failed before the connection, and the local endpoint's
/// request was retried to its allowance, not refused for want of an
/// admission hook.
fn assert_failed_before_connecting(err: &tower_recovery::core::error::RecoveryError) {
    use recovery_core::failure::{Acceptance, Phase};
    use recovery_core::report::AttemptResult;
    assert_eq!(err.outcome(), &Outcome::Exhausted { attempts: 2 });
    let report = err.report();
    assert_eq!(report.attempts.len(), 2);
    for a in &report.attempts {
        assert_eq!(a.acceptance, Some(Acceptance::No), "{a:?}");
        assert!(
            matches!(
                a.result,
                AttemptResult::Failed {
                    phase: Phase::Connecting,
                    ..
                }
            ),
            "{a:?}"
        );
    }
}

#[tokio::test]
async fn cn8_a_connect_timeout_never_sent_the_request_and_is_retried() {
    let listener = recovery_tests::fault::UnansweredListener::new().unwrap();
    let addr = listener.addr();
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(Duration::from_millis(200)));
    let client = Client::builder(TokioExecutor::new()).build(http);
    let err = call_failing(client, format!("http://{addr}{PATH}")).await;
    assert_failed_before_connecting(&err);
    drop(listener);
}

#[tokio::test]
async fn cn9_a_name_that_does_not_resolve_never_sent_the_request_and_is_retried() {
    use hyper_util::client::legacy::connect::dns::Name;
    let resolver = tower::service_fn(|_: Name| async {
        Err::<std::vec::IntoIter<std::net::SocketAddr>, _>(std::io::Error::other("no such host"))
    });
    let client =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new_with_resolver(resolver));
    let err = call_failing(client, format!("http://provider.invalid{PATH}")).await;
    assert_failed_before_connecting(&err);
}
