//! Resume of a committed stream over real sockets (issue: resume instead of
//! fail): OpenAI Responses background streams continued with
//! `starting_after`, declared-resumable SSE continued with `Last-Event-ID`.
//!
//! The consumer's bytes must equal the uninterrupted stream exactly, whatever
//! event boundary the cut falls on and even when the server repeats events
//! before the cursor.

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::observer::StreamObserver;
use recovery_core::outcome::{InterruptCause, Outcome};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::{ProtocolKind, SseTerminal};
use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Write};
use tower_layer::Layer;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};
use tower_service::Service;

const LIMIT: Duration = Duration::from_secs(20);
const POST_PATH: &str = "/v1/responses";
const GET_PATH: &str = "/v1/responses/resp_1";
const BACKGROUND: &str = r#"{"model":"m","input":"hi","stream":true,"background":true}"#;
const FOREGROUND: &str = r#"{"model":"m","input":"hi","stream":true}"#;

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(recovery_tests::fault::default_fixtures_dir().join(name)).unwrap()
}

/// A 200 SSE answer starting with `write`.
fn sse(write: impl Into<recovery_tests::fault::WriteSpec>) -> Script {
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(write)
}

fn policy(max_resumes: u32) -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).unwrap())
        .max_resumes(max_resumes)
        .backoff(Duration::from_millis(2), Duration::from_millis(10))
        .build()
        .unwrap()
}

struct Run {
    body: Vec<u8>,
    error: Option<Outcome>,
    outcome: Option<Outcome>,
    seams: Vec<recovery_core::report::Seam>,
    events: Vec<&'static str>,
}

async fn run(
    provider: &FaultProvider,
    kind: ProtocolKind,
    layer: RecoveryLayer,
    path: &str,
    body: &'static str,
) -> Run {
    let events: Arc<Mutex<Vec<LifecycleEvent>>> = Arc::default();
    let sink = Arc::clone(&events);
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut svc = layer
        .on_event(move |e| sink.lock().unwrap().push(e.clone()))
        .layer(ObserveLayer::new(kind).layer(client));
    let req = Request::post(provider.url(path))
        .header("authorization", "Bearer sk-test")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap();
    let (bytes, error, report) = tokio::time::timeout(LIMIT, async {
        let resp = svc.call(req).await.expect("committed");
        let report = resp.extensions().get::<ReportHandle>().cloned().unwrap();
        let mut body = resp.into_body();
        let mut bytes = Vec::new();
        let mut error = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) => bytes.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
                Err(e) => {
                    error = Some(e.outcome().clone());
                    break;
                }
            }
        }
        (bytes, error, report)
    })
    .await
    .expect("hung");
    drop(svc);
    tokio::time::timeout(LIMIT, provider.wait_idle())
        .await
        .expect("connections left open");
    let events: Vec<&'static str> = events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.kind.name())
        .collect();
    let terminal = events
        .iter()
        .filter(|n| matches!(**n, "completed" | "exhausted" | "interrupted" | "cancelled"))
        .count();
    assert_eq!(terminal, 1, "exactly one terminal event: {events:?}");
    Run {
        body: bytes,
        error,
        outcome: report.report().outcome,
        seams: report.report().seams,
        events,
    }
}

/// Event boundaries after the first semantic event, with the sequence
/// number of the last event before each.
fn cuts_after_commit(kind: &ProtocolKind, bytes: &[u8]) -> Vec<(usize, Option<u64>)> {
    let mut observer = StreamObserver::new(kind.clone());
    let mut ends = Vec::new();
    observer.observe_ends(bytes, Some(&mut ends)).unwrap();
    let commit = observer.committed_at().unwrap();
    ends.into_iter()
        .map(|e| e.end_offset as usize)
        .filter(|end| *end as u64 >= commit && *end < bytes.len())
        .map(|end| {
            // The cursor after the prefix: the last sequence number seen.
            let mut prefix = StreamObserver::new(kind.clone());
            prefix.feed(&bytes[..end]).unwrap();
            (end, prefix.cursor().sequence_number)
        })
        .collect()
}

#[tokio::test]
async fn rs1_rs2_background_stream_resumes_at_every_boundary_exactly_once() {
    let name = "openai-responses/happy.sse";
    let full = fixture(name);
    let kind = ProtocolKind::OpenAiResponses;
    let cuts = cuts_after_commit(&kind, &full);
    assert!(cuts.len() >= 3, "enough cut points: {cuts:?}");
    for (cut, seq) in cuts {
        let provider = FaultProvider::start(
            ScriptSet::new(vec![])
                .path(
                    POST_PATH,
                    vec![
                        sse(Write::fixture(name).split_lines())
                            .cut_at(cut)
                            .ending(Ending::Rst),
                    ],
                )
                // The resumed stream repeats everything from the start (RS2):
                // the events at or below the cursor must be dropped.
                .path(GET_PATH, vec![sse(Write::fixture(name))]),
        )
        .await
        .unwrap();
        let run = run(
            &provider,
            kind.clone(),
            RecoveryLayer::new(policy(1)),
            POST_PATH,
            BACKGROUND,
        )
        .await;
        assert!(run.error.is_none(), "cut {cut}: {:?}", run.error);
        assert_eq!(
            String::from_utf8_lossy(&run.body),
            String::from_utf8_lossy(&full),
            "cut {cut}: the consumer sees the uninterrupted stream, no gap, no duplicate"
        );
        assert!(
            matches!(run.outcome, Some(Outcome::Completed { .. })),
            "cut {cut}"
        );
        assert_eq!(
            provider.count_path(POST_PATH),
            1,
            "cut {cut}: never a POST replay"
        );
        assert_eq!(provider.count_path(GET_PATH), 1, "cut {cut}: one resume");
        let get = &provider.requests_for(GET_PATH)[0];
        assert_eq!(get.method, "GET");
        let want = format!("starting_after={}", seq.expect("a sequence number"));
        assert!(get.target.contains("stream=true"), "{}", get.target);
        assert!(
            get.target.contains(&want),
            "cut {cut}: {} lacks {want}",
            get.target
        );
        assert_eq!(
            get.header("authorization").map(<[u8]>::to_vec),
            Some(b"Bearer sk-test".to_vec()),
            "same auth headers"
        );
        assert_eq!(
            run.events,
            [
                "attempt_started",
                "committed",
                "attempt_failed",
                "delay_scheduled",
                "resume_started",
                "attempt_started",
                "attempt_succeeded",
                "completed"
            ],
            "cut {cut}"
        );
    }
}

#[tokio::test]
async fn rs3_resume_answered_404_keeps_the_prefix_and_fails_typed() {
    let name = "openai-responses/happy.sse";
    let full = fixture(name);
    let (cut, _) = cuts_after_commit(&ProtocolKind::OpenAiResponses, &full)[0];
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                POST_PATH,
                vec![sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst)],
            )
            .path(GET_PATH, vec![Script::status(404).write(Write::text("{}"))]),
    )
    .await
    .unwrap();
    let run = run(
        &provider,
        ProtocolKind::OpenAiResponses,
        RecoveryLayer::new(policy(1)),
        POST_PATH,
        BACKGROUND,
    )
    .await;
    assert_eq!(run.body, &full[..cut], "the delivered prefix is kept");
    assert_eq!(
        run.error,
        Some(Outcome::Interrupted {
            cause: InterruptCause::ResumeFailed,
            stall: None,
            committed: true,
        })
    );
    assert_eq!(provider.count_path(POST_PATH), 1);
    assert_eq!(provider.count_path(GET_PATH), 1);
}

#[tokio::test]
async fn rs5_foreground_request_is_never_resumed() {
    let name = "openai-responses/happy.sse";
    let full = fixture(name);
    let (cut, _) = cuts_after_commit(&ProtocolKind::OpenAiResponses, &full)[0];
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        POST_PATH,
        vec![sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst)],
    ))
    .await
    .unwrap();
    let run = run(
        &provider,
        ProtocolKind::OpenAiResponses,
        RecoveryLayer::new(policy(1)),
        POST_PATH,
        FOREGROUND,
    )
    .await;
    assert!(
        matches!(run.error, Some(Outcome::Interrupted { .. })),
        "{:?}",
        run.error
    );
    assert_eq!(run.body, &full[..cut]);
    assert_eq!(provider.count_path(GET_PATH), 0, "zero GETs");
    assert_eq!(provider.count_path(POST_PATH), 1);
}

const SSE_PATH: &str = "/events";
const SSE_STREAM: &str =
    "id: 1\ndata: one\n\nid: 2\ndata: two\n\nid: 3\ndata: three\n\ndata: [DONE]\n\n";

fn sse_kind() -> ProtocolKind {
    ProtocolKind::Sse {
        terminal_sentinel: Some(SseTerminal::Data("[DONE]".into())),
    }
}

#[tokio::test]
async fn rs7_declared_resumable_sse_resends_with_last_event_id_at_every_boundary() {
    let cuts = cuts_after_commit(&sse_kind(), SSE_STREAM.as_bytes());
    assert!(cuts.len() >= 3, "{cuts:?}");
    for (cut, _) in cuts {
        let delivered = &SSE_STREAM[..cut];
        let last_id = delivered
            .lines()
            .filter_map(|l| l.strip_prefix("id: "))
            .next_back()
            .expect("an id before the cut");
        // A server that honours Last-Event-ID sends what follows it.
        let tail = &SSE_STREAM[cut..];
        let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
            SSE_PATH,
            vec![
                sse(Write::text(SSE_STREAM)).cut_at(cut).ending(Ending::Rst),
                sse(Write::text(tail)),
            ],
        ))
        .await
        .unwrap();
        let layer = RecoveryLayer::new(policy(1)).with_resumable_sse(true);
        let run = run(&provider, sse_kind(), layer, SSE_PATH, "{}").await;
        assert!(run.error.is_none(), "cut {cut}: {:?}", run.error);
        assert_eq!(run.body, SSE_STREAM.as_bytes(), "cut {cut}");
        let sent = provider.requests_for(SSE_PATH);
        assert_eq!(sent.len(), 2, "cut {cut}");
        assert_eq!(sent[0].header("last-event-id"), None);
        assert_eq!(
            sent[1].header("last-event-id").map(<[u8]>::to_vec),
            Some(last_id.as_bytes().to_vec()),
            "cut {cut}"
        );
        assert_eq!(
            sent[1].body, sent[0].body,
            "the same request, with the cursor"
        );
        assert_eq!(
            run.seams.first().map(|s| s.strategy),
            Some(recovery_core::report::SeamStrategy::LastEventId)
        );
    }
}

#[tokio::test]
async fn rs7_undeclared_sse_is_interrupted_not_resent() {
    let cut = SSE_STREAM.find("id: 3").unwrap();
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        SSE_PATH,
        vec![sse(Write::text(SSE_STREAM)).cut_at(cut).ending(Ending::Rst)],
    ))
    .await
    .unwrap();
    let run = run(
        &provider,
        sse_kind(),
        RecoveryLayer::new(policy(1)),
        SSE_PATH,
        "{}",
    )
    .await;
    assert!(
        matches!(run.error, Some(Outcome::Interrupted { .. })),
        "{:?}",
        run.error
    );
    assert_eq!(provider.count_path(SSE_PATH), 1);
}

#[tokio::test]
async fn rs4_repeated_cuts_stop_at_max_attempts_across_post_and_resumes() {
    let name = "openai-responses/happy.sse";
    let full = fixture(name);
    let cuts = cuts_after_commit(&ProtocolKind::OpenAiResponses, &full);
    let (cut, _) = cuts[0];
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                POST_PATH,
                vec![sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst)],
            )
            // Every resume is cut too: it repeats the stream up to the same cut.
            .path(
                GET_PATH,
                vec![sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst)],
            ),
    )
    .await
    .unwrap();
    let run = run(
        &provider,
        ProtocolKind::OpenAiResponses,
        RecoveryLayer::new(policy(5)),
        POST_PATH,
        BACKGROUND,
    )
    .await;
    assert_eq!(
        run.error,
        Some(Outcome::Interrupted {
            cause: InterruptCause::AttemptsExhausted,
            stall: None,
            committed: true,
        })
    );
    assert_eq!(
        provider.count_path(POST_PATH) + provider.count_path(GET_PATH),
        3,
        "max_attempts physical sends in all (G2)"
    );
    assert_eq!(run.body, &full[..cut], "nothing delivered twice");
    assert_eq!(
        run.events,
        [
            "attempt_started",
            "committed",
            "attempt_failed",
            "delay_scheduled",
            "resume_started",
            "attempt_started",
            "attempt_failed",
            "delay_scheduled",
            "resume_started",
            "attempt_started",
            "attempt_failed",
            "interrupted"
        ]
    );
}

const MESSAGES_PATH: &str = "/v1/messages";

fn sse_event(kind: &str, data: &str) -> String {
    format!("event: {kind}\ndata: {data}\n\n")
}

#[tokio::test]
async fn continuation_hook_splices_a_prefilled_continuation_after_the_prefix() {
    let prefix = [
        sse_event("message_start", r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#),
        sse_event("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
        sse_event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Once upon"}}"#),
        sse_event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" a time"}}"#),
    ]
    .concat();
    let continuation_preamble = [
        sse_event("message_start", r#"{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":9,"output_tokens":1}}}"#),
        sse_event("content_block_start", r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#),
        sse_event("ping", r#"{"type": "ping"}"#),
    ]
    .concat();
    let continuation_body = [
        sse_event("content_block_delta", r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":", the end."}}"#),
        sse_event("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        sse_event("message_delta", r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":4}}"#),
        sse_event("message_stop", r#"{"type":"message_stop"}"#),
    ]
    .concat();
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        MESSAGES_PATH,
        vec![
            sse(Write::text(prefix.clone())).ending(Ending::Rst),
            sse(Write::text(
                [continuation_preamble, continuation_body.clone()].concat(),
            )),
        ],
    ))
    .await
    .unwrap();
    let seen = Arc::new(Mutex::new(String::new()));
    let seen_in_hook = Arc::clone(&seen);
    let hook: tower_recovery::recovery::ContinuationHook = Arc::new(move |ctx| {
        seen_in_hook.lock().unwrap().clone_from(&ctx.delivered.text);
        let body = serde_json::json!({
            "model": "m",
            "stream": true,
            "messages": [
                {"role": "user", "content": "tell a story"},
                {"role": "assistant", "content": ctx.delivered.text},
            ],
        });
        let mut req = Request::builder()
            .method(ctx.head.method.clone())
            .uri(ctx.head.uri.clone());
        for (k, v) in &ctx.head.headers {
            req = req.header(k, v);
        }
        Some(req.body(Bytes::from(body.to_string())).unwrap())
    });
    let layer = RecoveryLayer::new(policy(1)).with_continuation(hook);
    let run = run(
        &provider,
        ProtocolKind::Anthropic,
        layer,
        MESSAGES_PATH,
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"tell a story"}]}"#,
    )
    .await;
    assert!(run.error.is_none(), "{:?}", run.error);
    // The output tokens the prefix's message_start reported (1) are added
    // to the continuation's usage.
    let spliced = continuation_body.replace("\"output_tokens\":4", "\"output_tokens\":5");
    assert_eq!(
        String::from_utf8_lossy(&run.body),
        [prefix, spliced].concat(),
        "the prefix, then the continuation from its first semantic event"
    );
    assert_eq!(
        *seen.lock().unwrap(),
        "Once upon a time",
        "the hook saw the delivered text"
    );
    let sent = provider.requests_for(MESSAGES_PATH);
    assert_eq!(sent.len(), 2);
    let second: serde_json::Value = serde_json::from_slice(&sent[1].body).unwrap();
    assert_eq!(
        second["messages"][1]["content"], "Once upon a time",
        "prefilled"
    );
    assert!(matches!(run.outcome, Some(Outcome::Completed { .. })));
    assert!(run.events.contains(&"resume_started"));
    assert_eq!(run.seams.len(), 1, "the seam is recorded");
    assert_eq!(
        run.seams[0].strategy,
        recovery_core::report::SeamStrategy::Continuation
    );
    assert_eq!(run.seams[0].attempt, 2);
}

#[tokio::test]
async fn a_declining_continuation_hook_leaves_the_typed_interruption() {
    let name = "anthropic/happy.sse";
    let full = fixture(name);
    let cuts = cuts_after_commit(&ProtocolKind::Anthropic, &full);
    let (cut, _) = cuts[0];
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        MESSAGES_PATH,
        vec![sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst)],
    ))
    .await
    .unwrap();
    let hook: tower_recovery::recovery::ContinuationHook = Arc::new(|_| None);
    let layer = RecoveryLayer::new(policy(1)).with_continuation(hook);
    let run = run(
        &provider,
        ProtocolKind::Anthropic,
        layer,
        MESSAGES_PATH,
        "{}",
    )
    .await;
    assert!(
        matches!(run.error, Some(Outcome::Interrupted { .. })),
        "{:?}",
        run.error
    );
    assert_eq!(provider.count_path(MESSAGES_PATH), 1);
    assert_eq!(run.body, &full[..cut]);
}

const CHAT_PATH: &str = "/v1/chat/completions";

/// A declared prefill over real sockets: an OpenAI Chat answer reset at
/// every event boundary after its first token is continued by its own
/// endpoint from a prefill of the delivered text; the continuation answers
/// the rest of the same stream after a role chunk of its own, and the
/// consumer reads exactly the uninterrupted bytes.
#[tokio::test]
async fn a_prefill_continuation_gives_exactly_the_uninterrupted_stream_at_every_cut() {
    let name = "openai-chat/happy-usage.sse";
    let full = fixture(name);
    let kind = ProtocolKind::OpenAiChat;
    // A continuation ends with a finish of its own: the cuts are those
    // before the finish reason (the model still had something to say).
    let finish = b"\"finish_reason\":\"stop\"";
    let cuts: Vec<_> = cuts_after_commit(&kind, &full)
        .into_iter()
        .filter(|(cut, _)| full[*cut..].windows(finish.len()).any(|w| w == finish))
        .collect();
    assert_eq!(cuts.len(), 2, "after each token: {cuts:?}");
    let role = "data: {\"id\":\"chatcmpl-2\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n";
    let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    for (cut, _) in cuts {
        let mut rest = role.as_bytes().to_vec();
        rest.extend_from_slice(&full[cut..]);
        let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
            CHAT_PATH,
            vec![
                sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst),
                sse(Write::bytes(rest)),
            ],
        ))
        .await
        .unwrap();
        let client: Client<HttpConnector, ReplayBody> =
            Client::builder(TokioExecutor::new()).build_http();
        let mut svc =
            RecoveryLayer::new(policy(1)).layer(ObserveLayer::new(kind.clone()).layer(client));
        let mut req = Request::post(provider.url(CHAT_PATH))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        req.extensions_mut().insert(
            recovery_core::call::RecoveryCall::new()
                .with_prefill(recovery_core::continuation::Prefill::Auto),
        );
        let (bytes, report) = tokio::time::timeout(LIMIT, async {
            let resp = svc.call(req).await.expect("committed");
            let report = resp.extensions().get::<ReportHandle>().cloned().unwrap();
            let bytes = resp.into_body().collect().await.expect("whole").to_bytes();
            (bytes, report.report())
        })
        .await
        .expect("hung");
        assert_eq!(
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&full),
            "cut at {cut}: exactly the uninterrupted stream"
        );
        assert!(matches!(report.outcome, Some(Outcome::Completed { .. })));
        assert_eq!(report.seams.len(), 1);
        assert_eq!(
            report.seams[0].strategy,
            recovery_core::report::SeamStrategy::Prefill
        );
        let sent = provider.requests_for(CHAT_PATH);
        assert_eq!(sent.len(), 2, "cut at {cut}");
        let second: serde_json::Value = serde_json::from_slice(&sent[1].body).unwrap();
        let last = &second["messages"][1];
        assert_eq!(last["role"], "assistant");
        assert_eq!(last["prefix"], true);
        let text = last["content"].as_str().unwrap();
        assert!(
            ["Hello", "Hello world"].contains(&text),
            "cut at {cut}: the delivered text, {text:?}"
        );
        drop(svc);
        tokio::time::timeout(LIMIT, provider.wait_idle())
            .await
            .expect("connections left open");
    }
}
