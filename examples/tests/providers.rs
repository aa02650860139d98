//! The quickstart and the real-provider examples, run as a user runs them,
//! with the base-URL variables pointing at the loopback fault provider.

mod support;

use recovery_tests::fault::{Ending, FaultProvider, Script, Write};
use serde_json::Value;
use support::{example, run};

fn stream(content_type: &str, fixture: &str) -> Script {
    Script::ok()
        .header("content-type", content_type)
        .write(Write::fixture(fixture).split_lines())
}

fn no_escapes(text: &str) {
    assert!(
        !text.contains('\x1b'),
        "plain output when not a terminal: {text:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_recovers_and_exits_0() {
    let started = std::time::Instant::now();
    let out = run(&example("quickstart"), &[], &[], b"").await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.code(), Some(0), "{stdout}\n{}", out.stderr);
    no_escapes(&stdout);
    for want in [
        "attempt 1 failed",
        "503",
        "waiting 1000 ms (retry_after)",
        "attempt 2 failed: transport",
        "committed",
        "arrived whole.",
        "completed",
        "time to first token",
        "every resend byte-identical: true",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    assert!(started.elapsed().as_secs() < 15, "a few seconds, not more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_serves_from_the_backup_and_exits_0() {
    let out = run(&example("failover"), &[], &[], b"").await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.code(), Some(0), "{stdout}\n{}", out.stderr);
    no_escapes(&stdout);
    for want in [
        "attempt 1 failed: provider_response 529",
        "failing over from primary to backup (no output yet)",
        "attempt 2/3 sent to backup",
        "served by           backup",
        "primary 1 request(s), backup 2 request(s), backup model small-model: true",
    ] {
        assert!(stdout.contains(want), "missing {want:?} in:\n{stdout}");
    }
    // The second request goes to the backup first: the primary's
    // Retry-After is a cooldown the layer's requests share.
    let second = stdout.split("request 2").nth(1).unwrap_or_default();
    assert!(second.contains("attempt 1/3 sent to backup"), "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_needs_a_key_and_says_so() {
    let out = run(&example("openai_chat"), &[], &[], b"").await;
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr.contains("OPENAI_API_KEY"), "{}", out.stderr);
    assert!(out.stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_streams_through_a_503_from_the_base_url() {
    let provider = FaultProvider::start(vec![
        Script::status(503).header("retry-after-ms", "10"),
        stream("text/event-stream", "openai-chat/happy-usage.sse"),
    ])
    .await
    .unwrap();
    let base = format!("{}/v1", provider.base_url());
    let out = run(
        &example("openai_chat"),
        &["Say", "hello"],
        &[
            ("OPENAI_API_KEY", "sk-test-key"),
            ("OPENAI_BASE_URL", &base),
            ("OPENAI_MODEL", "m-test"),
        ],
        b"",
    )
    .await;
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hello world\n");
    no_escapes(&out.stderr);
    assert!(out.stderr.contains("completed"), "{}", out.stderr);
    assert!(!out.stderr.contains("sk-test-key"), "{}", out.stderr);
    let sent = provider.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].path(), "/v1/chat/completions");
    assert_eq!(
        sent[0].header("authorization"),
        Some(&b"Bearer sk-test-key"[..])
    );
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body["model"], "m-test");
    assert_eq!(body["stream"], true);
    assert_eq!(body["messages"][0]["content"], "Say hello");
    assert_eq!(sent[1].body, sent[0].body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_reports_an_interrupted_stream_with_exit_1() {
    let happy = support::fixture("openai-chat/happy-usage.sse");
    let text = String::from_utf8(happy).unwrap();
    let cut = text.match_indices("\n\n").nth(1).unwrap().0 + 2;
    let provider = FaultProvider::start(vec![
        stream("text/event-stream", "openai-chat/happy-usage.sse")
            .cut_at(cut)
            .ending(Ending::Rst),
    ])
    .await
    .unwrap();
    let base = provider.base_url();
    let out = run(
        &example("openai_chat"),
        &[],
        &[("OPENAI_API_KEY", "sk-test"), ("OPENAI_BASE_URL", &base)],
        b"",
    )
    .await;
    assert_eq!(out.code(), Some(1), "{}", out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hello\n");
    assert!(out.stderr.contains("interrupted"), "{}", out.stderr);
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_needs_a_key_and_says_so() {
    let out = run(&example("anthropic"), &[], &[], b"").await;
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr.contains("ANTHROPIC_API_KEY"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_streams_through_an_overload_from_the_base_url() {
    let overloaded =
        r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#;
    let provider = FaultProvider::start(vec![
        Script::status(529)
            .header("content-type", "application/json")
            .header("retry-after-ms", "10")
            .write(Write::text(overloaded)),
        stream("text/event-stream", "anthropic/happy.sse"),
    ])
    .await
    .unwrap();
    let base = provider.base_url();
    let out = run(
        &example("anthropic"),
        &[],
        &[
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
            ("ANTHROPIC_BASE_URL", &base),
        ],
        b"",
    )
    .await;
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hello\n");
    let sent = provider.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].path(), "/v1/messages");
    assert_eq!(sent[0].header("x-api-key"), Some(&b"sk-ant-test"[..]));
    assert_eq!(
        sent[0].header("anthropic-version"),
        Some(&b"2023-06-01"[..])
    );
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body["stream"], true);
    assert!(body["max_tokens"].as_u64().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_says_what_it_needs_when_nothing_listens() {
    let addr = recovery_tests::fault::refused_addr().unwrap();
    let out = run(
        &example("ollama"),
        &[],
        &[("OLLAMA_HOST", &addr.to_string())],
        b"",
    )
    .await;
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("needs a running Ollama"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_streams_through_a_reset_with_admission() {
    let provider = FaultProvider::start(vec![
        Script::just(Ending::ResetBeforeHead),
        stream("application/x-ndjson", "ollama/chat-happy.ndjson"),
    ])
    .await
    .unwrap();
    let host = provider.addr().to_string();
    let out = run(&example("ollama"), &[], &[("OLLAMA_HOST", &host)], b"").await;
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "Hello\n");
    assert!(out.stderr.contains("allowing resend 2"), "{}", out.stderr);
    let sent = provider.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].path(), "/api/chat");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_resumes_a_background_stream_cut_after_output() {
    let happy = support::fixture("openai-responses/happy.sse");
    let text = String::from_utf8(happy).unwrap();
    let delta = text.find("response.output_text.delta").unwrap();
    let cut = text[delta..].find("\n\n").unwrap() + delta + 2;
    let provider = FaultProvider::start(
        recovery_tests::fault::ScriptSet::new(vec![])
            .path(
                "/v1/responses",
                vec![
                    stream("text/event-stream", "openai-responses/happy.sse")
                        .cut_at(cut)
                        .ending(Ending::Rst),
                ],
            )
            .path(
                "/v1/responses/resp_1",
                vec![stream("text/event-stream", "openai-responses/happy.sse")],
            ),
    )
    .await
    .unwrap();
    let base = format!("{}/v1", provider.base_url());
    let out = run(
        &example("openai_responses"),
        &[],
        &[
            ("OPENAI_API_KEY", "sk-test-key"),
            ("OPENAI_BASE_URL", &base),
        ],
        b"",
    )
    .await;
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    let expected =
        recovery_examples::text::DeltaText::new(recovery_core::ProtocolKind::OpenAiResponses)
            .push(text.as_bytes());
    assert!(!expected.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{expected}\n"),
        "the whole answer once: no gap, no duplicate"
    );
    assert!(out.stderr.contains("resum"), "{}", out.stderr);
    assert!(!out.stderr.contains("sk-test-key"), "{}", out.stderr);
    let post = provider.requests_for("/v1/responses");
    assert_eq!(post.len(), 1, "never a POST replay");
    let body: Value = serde_json::from_slice(&post[0].body).unwrap();
    assert_eq!(body["background"], true);
    assert_eq!(body["stream"], true);
    let get = &provider.requests_for("/v1/responses/resp_1")[0];
    assert_eq!(get.method, "GET");
    assert!(get.target.contains("starting_after="), "{}", get.target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_needs_a_key_and_says_so() {
    let out = run(&example("gemini"), &[], &[], b"").await;
    assert_eq!(out.code(), Some(2));
    assert!(out.stderr.contains("GEMINI_API_KEY"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_streams_through_a_503_from_the_base_url() {
    let provider = FaultProvider::start(vec![
        Script::status(503)
            .header("content-type", "application/json")
            .write(Write::text(
                r#"{"error":{"code":503,"message":"The model is overloaded.","status":"UNAVAILABLE"}}"#,
            )),
        stream("text/event-stream", "gemini/lf-happy.sse"),
    ])
    .await
    .unwrap();
    let base = format!("{}/v1beta", provider.base_url());
    let out = run(
        &example("gemini"),
        &["Count", "to", "three"],
        &[
            ("GEMINI_API_KEY", "g-test-key"),
            ("GEMINI_BASE_URL", &base),
            ("GEMINI_MODEL", "gemini-test"),
        ],
        b"",
    )
    .await;
    assert_eq!(out.code(), Some(0), "{}", out.stderr);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "There are three.\n");
    assert!(!out.stderr.contains("g-test-key"), "{}", out.stderr);
    let sent = provider.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0].target,
        "/v1beta/models/gemini-test:streamGenerateContent?alt=sse"
    );
    assert_eq!(sent[0].header("x-goog-api-key"), Some(&b"g-test-key"[..]));
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body["contents"][0]["parts"][0]["text"], "Count to three");
}
