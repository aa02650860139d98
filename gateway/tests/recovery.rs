//! The upstream leg over real sockets: what a client of the gateway sees
//! when the provider fails before and after the first token.

mod support;

use std::fmt::Write as _;

use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Write};
use support::*;

#[tokio::test]
async fn reset_before_the_first_token_is_replayed_once_and_invisible() {
    let name = "openai-chat/happy-usage.sse";
    let full = String::from_utf8(fixture(name)).unwrap();
    let provider = FaultProvider::start(vec![
        // Cut inside the role-only first event: nothing semantic yet.
        sse(Write::fixture(name)).cut_at(40).ending(Ending::Rst),
        sse(Write::fixture(name)),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(without_ids(&answer.text()), full, "the whole answer, once");
    assert_eq!(provider.count(), 2, "two upstream sends");
    let m = gw.metrics();
    assert_eq!((m.attempts, m.resends, m.completed), (2, 1, 1));
    gw.shutdown().await;
}

#[tokio::test]
async fn status_503_and_529_then_success_are_replayed() {
    let chat = "openai-chat/happy-usage.sse";
    let anthropic = "anthropic/happy.sse";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(CHAT, vec![Script::status(503), sse(Write::fixture(chat))])
            .path(
                MESSAGES,
                vec![
                    Script::status(529).header("retry-after-ms", "5"),
                    sse(Write::fixture(anthropic)),
                ],
            ),
    )
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(a.status, 200);
    assert_eq!(without_ids(&a.text()).as_bytes(), &fixture(chat)[..]);
    let b = send(post(
        gw.url(MESSAGES),
        r#"{"model":"m","stream":true,"max_tokens":5,"messages":[]}"#,
    ))
    .await;
    assert_eq!(b.status, 200);
    assert_eq!(without_ids(&b.text()).as_bytes(), &fixture(anthropic)[..]);
    assert_eq!(provider.count_path(CHAT), 2);
    assert_eq!(provider.count_path(MESSAGES), 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn in_stream_overloaded_error_before_output_is_replayed() {
    let provider = FaultProvider::start(vec![
        sse(Write::fixture("anthropic/error-first.sse")),
        sse(Write::fixture("anthropic/happy.sse")),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(MESSAGES), r#"{"stream":true}"#)).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        without_ids(&a.text()).as_bytes(),
        &fixture("anthropic/happy.sse")[..],
        "the error event of the first attempt never reaches the client"
    );
    assert_eq!(provider.count(), 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn final_error_response_passes_through_as_it_came() {
    let provider = FaultProvider::start(vec![
        Script::status(400)
            .header("content-type", "application/json")
            .write(Write::text(
                r#"{"error":{"message":"bad model","type":"invalid_request_error"}}"#,
            )),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"]["message"], "bad model");
    assert_eq!(provider.count(), 1, "a permanent status is never retried");
    gw.shutdown().await;
}

#[tokio::test]
async fn no_response_at_all_is_a_502_in_the_providers_shape() {
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).with_default(Script::just(Ending::ResetBeforeHead)),
    )
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(MESSAGES), r#"{"stream":true}"#)).await;
    assert_eq!(a.status, 502);
    let v = a.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "api_error", "{v}");
    assert_eq!(provider.count(), 3, "max_attempts sends");
    gw.shutdown().await;
}

#[tokio::test]
async fn reset_after_the_first_token_ends_with_the_openai_error_event() {
    let name = "openai-chat/happy-usage.sse";
    let full = fixture(name);
    // Events 1 (role) and 2 ("Hello") are whole; then the connection dies.
    let cut = after_event(&full, 2);
    let provider = FaultProvider::start(vec![
        sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(a.status, 200);
    let evs = events(&a.text());
    assert_eq!(evs.len(), 3, "{evs:?}");
    assert_eq!(
        without_ids(&evs[..2].concat()).as_bytes(),
        &full[..cut],
        "the prefix as sent"
    );
    let error = data(&evs[2]);
    let message = error["error"]["message"].as_str().expect("error.message");
    assert!(message.contains("interrupted"), "{message}");
    assert!(
        !evs[2].contains("event:"),
        "an unnamed event, as OpenAI sends"
    );
    assert_eq!(provider.count(), 1, "never replayed after output");
    assert_eq!(gw.metrics().interrupted, 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn reset_after_the_first_token_ends_with_the_anthropic_error_event() {
    let name = "anthropic/happy.sse";
    let full = fixture(name);
    let cut = after_first(&full, "event: content_block_delta");
    let provider = FaultProvider::start(vec![
        sse(Write::fixture(name)).cut_at(cut).ending(Ending::Rst),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(MESSAGES), r#"{"stream":true}"#)).await;
    let evs = events(&a.text());
    let last = evs.last().unwrap();
    assert!(last.contains("event: error\n"), "{last}");
    let v = data(last);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "api_error");
    assert_eq!(
        without_ids(&evs[..evs.len() - 1].concat()).as_bytes(),
        &full[..cut]
    );
    assert_eq!(provider.count(), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn responses_background_stream_is_resumed_byte_identically() {
    let name = "openai-responses/happy.sse";
    let full = fixture(name);
    let cut = after_first(&full, "event: response.output_text.delta");
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                RESPONSES,
                vec![
                    sse(Write::fixture(name).split_lines())
                        .cut_at(cut)
                        .ending(Ending::Rst),
                ],
            )
            .path("/v1/responses/resp_1", vec![sse(Write::fixture(name))]),
    )
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(
        gw.url(RESPONSES),
        r#"{"model":"m","input":"hi","stream":true,"background":true}"#,
    ))
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        without_ids(&a.text()).as_bytes(),
        &full[..],
        "the uninterrupted stream, modulo the gateway's ids"
    );
    let ids: Vec<String> = events(&a.text())
        .iter()
        .filter_map(|e| event_id(e))
        .collect();
    let sid = a.stream_id();
    let want: Vec<String> = (1..=ids.len()).map(|n| format!("{sid}:{n}")).collect();
    assert_eq!(ids, want, "one id per event, from 1");
    assert_eq!(provider.count_path(RESPONSES), 1, "never a POST replay");
    assert_eq!(provider.count_path("/v1/responses/resp_1"), 1, "one resume");
    assert_eq!(gw.metrics().resumes, 1);
    gw.shutdown().await;
}

/// `[[alternates]]`: an overloaded upstream before the first token sends the
/// request to the alternate of its protocol, with its model and key; the
/// client gets the alternate's whole answer once and never knows.
#[tokio::test]
async fn an_overloaded_upstream_fails_over_to_the_alternate_of_its_protocol() {
    let name = "openai-chat/happy-usage.sse";
    let backup = "/backup/v1/chat/completions";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![json_error(529, r#"{"error":{"type":"overloaded_error"}}"#)],
            )
            .path(backup, vec![sse(Write::fixture(name))]),
    )
    .await
    .unwrap();
    let text = format!(
        "[[alternates]]\nlabel = \"backup\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\nmodel = \"small\"\nheaders = {{ authorization = \"$GATEWAY_TEST_BACKUP_KEY\" }}\n",
        provider.url(backup)
    );
    let env = |var: &str| (var == "GATEWAY_TEST_BACKUP_KEY").then(|| "Bearer sk-backup".to_owned());
    let from_file = recovery_gateway::config::from_toml_with_env(&text, &env).unwrap();
    let (mut config, _) = config(&provider);
    config.alternates = from_file.alternates;
    let gw = gateway(config).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(without_ids(&answer.text()).as_bytes(), &fixture(name)[..]);
    assert_eq!(provider.count_path(CHAT), 1);
    let sent = provider.requests_for(backup);
    assert_eq!(sent.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(body["model"], "small");
    let auth = sent[0]
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .map(|(_, v)| v.clone());
    assert_eq!(auth.as_deref(), Some(&b"Bearer sk-backup"[..]));
    gw.shutdown().await;
}

/// A gateway on `provider` with the `[policy]` and `[[alternates]]` of
/// `toml` (no environment).
async fn gateway_with(provider: &FaultProvider, toml: &str) -> recovery_gateway::Gateway {
    let from_file = recovery_gateway::config::from_toml_with_env(toml, &|_: &str| None).unwrap();
    let (mut config, _) = config(provider);
    config.alternates = from_file.alternates;
    config.policy = from_file.policy;
    config.upstream_declared = from_file.upstream_declared;
    gateway(config).await
}

/// A `status` answer with a JSON error body.
fn json_error(status: u16, body: &str) -> Script {
    Script::status(status)
        .header("content-type", "application/json")
        .write(Write::text(body))
}

/// `[policy] attempts_per_target = 2`: a `429` whose `Retry-After` the
/// request may wait is waited out on the primary, which then answers; the
/// alternate is never sent to.
#[tokio::test]
async fn attempts_per_target_retries_the_primary_before_the_alternate() {
    let name = "openai-chat/happy-usage.sse";
    let backup = "/backup/v1/chat/completions";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![
                    json_error(429, r#"{"error":{"type":"rate_limit_error"}}"#)
                        .header("retry-after-ms", "150"),
                    sse(Write::fixture(name)),
                ],
            )
            .path(backup, vec![sse(Write::fixture(name))]),
    )
    .await
    .unwrap();
    let text = format!(
        "[policy]\nmax_attempts = 3\nattempts_per_target = 2\n\
         [[alternates]]\nlabel = \"backup\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\n",
        provider.url(backup)
    );
    let gw = gateway_with(&provider, &text).await;
    let started = std::time::Instant::now();
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(without_ids(&answer.text()).as_bytes(), &fixture(name)[..]);
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(150),
        "the Retry-After was waited out"
    );
    assert_eq!(
        provider.count_path(CHAT),
        2,
        "the primary got its two sends"
    );
    assert_eq!(
        provider.count_path(backup),
        0,
        "the alternate was never sent to"
    );
    gw.shutdown().await;
}

/// `[policy] first_token_timeout_ms`: a primary that sends its head and a
/// role chunk, then nothing, is left at the timeout for the alternate,
/// whose whole answer the client gets once.
#[tokio::test]
async fn no_first_token_in_time_moves_to_the_alternate() {
    let name = "openai-chat/happy-usage.sse";
    let backup = "/backup/v1/chat/completions";
    let role = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null}]}\n\n";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(CHAT, vec![sse(Write::text(role)).ending(Ending::Stall)])
            .path(backup, vec![sse(Write::fixture(name))]),
    )
    .await
    .unwrap();
    let text = format!(
        "[policy]\nfirst_token_timeout_ms = 200\n\
         [[alternates]]\nlabel = \"backup\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\n",
        provider.url(backup)
    );
    let gw = gateway_with(&provider, &text).await;
    let started = std::time::Instant::now();
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    let took = started.elapsed();
    assert_eq!(answer.status, 200);
    assert_eq!(without_ids(&answer.text()).as_bytes(), &fixture(name)[..]);
    assert!(
        (std::time::Duration::from_millis(200)..std::time::Duration::from_secs(5)).contains(&took),
        "answered after {took:?}"
    );
    assert_eq!(provider.count_path(CHAT), 1);
    assert_eq!(provider.count_path(backup), 1);
    gw.shutdown().await;
}

/// A `400 context_length_exceeded` is never resent to its upstream
/// (`attempts_per_target = 2` notwithstanding): the request goes to the
/// alternate at once, whose whole answer the client gets.
#[tokio::test]
async fn a_prompt_too_long_moves_to_the_alternate_at_once() {
    let name = "openai-chat/happy-usage.sse";
    let large = "/large/v1/chat/completions";
    let too_long = r#"{"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(CHAT, vec![json_error(400, too_long)])
            .path(large, vec![sse(Write::fixture(name))]),
    )
    .await
    .unwrap();
    let text = format!(
        "[policy]\nmax_attempts = 3\nattempts_per_target = 2\n\
         [[alternates]]\nlabel = \"large\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\ncontext_window = 128000\n",
        provider.url(large)
    );
    let gw = gateway_with(&provider, &text).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(without_ids(&answer.text()).as_bytes(), &fixture(name)[..]);
    assert_eq!(provider.count_path(CHAT), 1, "never resent to the primary");
    assert_eq!(provider.count_path(large), 1);
    gw.shutdown().await;
}

/// The default upstream declares its context window: a prompt too long for
/// it skips the alternate with a smaller window for the larger one.
#[tokio::test]
async fn a_prompt_too_long_skips_an_alternate_with_a_smaller_window() {
    let name = "openai-chat/happy-usage.sse";
    let small = "/small/v1/chat/completions";
    let large = "/large/v1/chat/completions";
    let too_long = r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 9000 tokens > 8192 maximum"}}"#;
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(CHAT, vec![json_error(400, too_long)])
            .path(small, vec![sse(Write::fixture(name))])
            .path(large, vec![sse(Write::fixture(name))]),
    )
    .await
    .unwrap();
    let text = format!(
        "context_window = 8192\n\
         [[alternates]]\nlabel = \"small\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\ncontext_window = 4096\n\
         [[alternates]]\nlabel = \"large\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\ncontext_window = 128000\n",
        provider.url(small),
        provider.url(large)
    );
    let gw = gateway_with(&provider, &text).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(without_ids(&answer.text()).as_bytes(), &fixture(name)[..]);
    assert_eq!(provider.count_path(CHAT), 1);
    assert_eq!(provider.count_path(small), 0, "a smaller window is skipped");
    assert_eq!(provider.count_path(large), 1);
    gw.shutdown().await;
}

/// One OpenAI Chat chunk of `content`, under chunk id `id`.
fn token_chunk(id: &str, content: &str) -> String {
    let content = serde_json::to_string(content).unwrap();
    format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{content}}},\"finish_reason\":null}}]}}\n\n"
    )
}

/// A Chat stream under id `id`: its role chunk, tokens `from..=to`
/// (` w1`, ` w2`, ...), and, when `end`, the finish reason and `[DONE]`.
fn counted(id: &str, from: u32, to: u32, end: bool) -> String {
    let mut out = format!(
        "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}},\"finish_reason\":null}}]}}\n\n"
    );
    for i in from..=to {
        out.push_str(&token_chunk(id, &format!(" w{i}")));
    }
    if end {
        let _ = write!(
            out,
            "data: {{\"id\":\"{id}\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n"
        );
    }
    out
}

/// The content an SSE Chat answer carries, in order.
fn chat_content(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// A gateway whose alternate declares `continuation = "prefill"` on
/// `provider`'s `alt` path, under the baseline policy.
async fn prefill_gateway(provider: &FaultProvider, alt: &str) -> recovery_gateway::Gateway {
    let text = format!(
        "[policy]\nmax_attempts = 3\nhead_timeout_ms = 30000\nidle_timeout_ms = 30000\n\
         [[alternates]]\nlabel = \"prefill\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\nmodel = \"alt-model\"\ncontinuation = \"prefill\"\n",
        provider.url(alt)
    );
    gateway_with(provider, &text).await
}

/// A stream reset after 40 of its 60 tokens, with an alternate that
/// continues a prefill: the alternate gets the request with the 40 tokens
/// as the final assistant message (`prefix: true`), and the client reads
/// the 60 tokens once, under the first stream's chunk id.
#[tokio::test]
async fn a_cut_answer_is_continued_by_a_prefill_alternate() {
    let alt = "/alt/v1/chat/completions";
    let whole = chat_content(&counted("x", 1, 60, true));
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![sse(Write::text(counted("c1", 1, 40, false))).ending(Ending::Rst)],
            )
            .path(alt, vec![sse(Write::text(counted("c2", 41, 60, true)))]),
    )
    .await
    .unwrap();
    let gw = prefill_gateway(&provider, alt).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200);
    let text = answer.text();
    assert_eq!(chat_content(&text), whole, "the whole answer, once");
    assert!(
        !text.contains("\"c2\""),
        "the continuation runs on under the first id"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert_eq!(
        provider.count_path(CHAT),
        1,
        "the cut answer is never replayed"
    );
    let sent = provider.requests_for(alt);
    assert_eq!(sent.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&sent[0].body).unwrap();
    let messages = body["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "assistant");
    assert_eq!(last["prefix"], true);
    assert_eq!(last["content"], chat_content(&counted("x", 1, 40, false)));
    assert_eq!(body["model"], "alt-model");
    let m = gw.metrics();
    assert_eq!((m.resumes, m.completed), (1, 1), "the seam is counted");
    gw.shutdown().await;
}

/// The alternate answers the prefill with a 400: the client's stream ends
/// with the interruption that cut it (a reset), never the 400.
#[tokio::test]
async fn a_rejected_prefill_leaves_the_original_interruption() {
    let alt = "/alt/v1/chat/completions";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(CHAT, vec![sse(Write::text(counted("c1", 1, 40, false))).ending(Ending::Rst)])
            .path(
                alt,
                vec![json_error(
                    400,
                    r#"{"error":{"message":"prefix is not supported","type":"invalid_request_error"}}"#,
                )],
            ),
    )
    .await
    .unwrap();
    let gw = prefill_gateway(&provider, alt).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200);
    let text = answer.text();
    assert_eq!(
        chat_content(&text),
        chat_content(&counted("x", 1, 40, false))
    );
    assert!(!text.contains("prefix is not supported"), "{text}");
    assert!(!text.contains("400"), "{text}");
    assert!(
        text.contains("interrupted after commit (Transport)"),
        "the reset's interruption: {text}"
    );
    assert_eq!(provider.count_path(alt), 1);
    let m = gw.metrics();
    assert_eq!(m.completed, 0);
    gw.shutdown().await;
}

/// The baseline of independent fault benchmarks: one alternate, three
/// sends, two per target, 30 s head and idle timeouts (and, with
/// `first_token`, that first-token timeout).
async fn baseline_gateway(
    provider: &FaultProvider,
    alt: &str,
    first_token: Option<u64>,
) -> recovery_gateway::Gateway {
    let mut text = String::from(
        "[policy]\nmax_attempts = 3\nattempts_per_target = 2\nhead_timeout_ms = 30000\nidle_timeout_ms = 30000\n",
    );
    if let Some(ms) = first_token {
        let _ = writeln!(text, "first_token_timeout_ms = {ms}");
    }
    let _ = write!(
        text,
        "[[alternates]]\nlabel = \"alt\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\n",
        provider.url(alt)
    );
    gateway_with(provider, &text).await
}

/// Baseline: `429` with `Retry-After: 2`, then OK: the primary's answer,
/// after the 2 s it asked for; the alternate is never sent to.
#[tokio::test]
async fn baseline_a_429_retry_after_2_is_waited_out_on_the_primary() {
    let alt = "/alt/v1/chat/completions";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![
                    json_error(429, r#"{"error":{"type":"rate_limit_error"}}"#)
                        .header("retry-after", "2"),
                    sse(Write::text(counted("p", 1, 3, true))),
                ],
            )
            .path(alt, vec![sse(Write::text(counted("a", 1, 3, true)))]),
    )
    .await
    .unwrap();
    let gw = baseline_gateway(&provider, alt, None).await;
    let started = std::time::Instant::now();
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200);
    assert!(
        answer.text().contains("\"id\":\"p\""),
        "the primary's answer"
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(2));
    assert_eq!(provider.count_path(CHAT), 2);
    assert_eq!(provider.count_path(alt), 0);
    gw.shutdown().await;
}

/// Baseline: a `500` once: the primary's answer at its second send.
#[tokio::test]
async fn baseline_a_500_once_is_retried_on_the_primary() {
    let alt = "/alt/v1/chat/completions";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![
                    json_error(500, r#"{"error":{"type":"server_error"}}"#),
                    sse(Write::text(counted("p", 1, 3, true))),
                ],
            )
            .path(alt, vec![sse(Write::text(counted("a", 1, 3, true)))]),
    )
    .await
    .unwrap();
    let gw = baseline_gateway(&provider, alt, None).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200);
    assert!(
        answer.text().contains("\"id\":\"p\""),
        "the primary's answer"
    );
    assert_eq!(
        (provider.count_path(CHAT), provider.count_path(alt)),
        (2, 0)
    );
    gw.shutdown().await;
}

/// Baseline: `400 context_length_exceeded`: the alternate's answer, the
/// primary sent to once (`attempts_per_target = 2` notwithstanding).
#[tokio::test]
async fn baseline_a_prompt_too_long_goes_to_the_alternate_after_one_send() {
    let alt = "/alt/v1/chat/completions";
    let too_long = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#;
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(CHAT, vec![json_error(400, too_long)])
            .path(alt, vec![sse(Write::text(counted("a", 1, 3, true)))]),
    )
    .await
    .unwrap();
    let gw = baseline_gateway(&provider, alt, None).await;
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(
        answer.text().contains("\"id\":\"a\""),
        "the alternate's answer"
    );
    assert_eq!(
        (provider.count_path(CHAT), provider.count_path(alt)),
        (1, 1)
    );
    gw.shutdown().await;
}

/// Baseline with `first_token_timeout_ms = 10000`: a primary whose head and
/// role chunk come at once and whose first token would come at 20 s is left
/// at 10 s (its connection closed), and the client reads the alternate's
/// answer in about 10 s.
#[tokio::test]
async fn baseline_a_first_token_at_20_s_is_left_at_10_s_for_the_alternate() {
    let alt = "/alt/v1/chat/completions";
    let role = counted("p", 1, 0, false);
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![
                    // The tokens wait on a stall point, released at 20 s
                    // unless the gateway hangs up first.
                    sse(Write::text(role))
                        .write(Write::stall())
                        .write(Write::text(counted("p", 1, 3, true))),
                ],
            )
            .path(alt, vec![sse(Write::text(counted("a", 1, 3, true)))]),
    )
    .await
    .unwrap();
    let gw = baseline_gateway(&provider, alt, Some(10_000)).await;
    let releaser = {
        let provider = provider.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(20)).await;
            provider.release_all();
        })
    };
    let started = std::time::Instant::now();
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    let took = started.elapsed();
    assert_eq!(answer.status, 200);
    assert!(
        answer.text().contains("\"id\":\"a\""),
        "the alternate's answer"
    );
    assert!(
        (std::time::Duration::from_secs(10)..std::time::Duration::from_secs(13)).contains(&took),
        "answered after {took:?}"
    );
    assert_eq!(
        (provider.count_path(CHAT), provider.count_path(alt)),
        (1, 1)
    );
    // The primary's connection was closed at the decision, before the
    // alternate answered: its stall point ended with the hang-up.
    tokio::time::timeout(
        std::time::Duration::from_millis(500),
        provider.wait_until(|s| s.stalls_entered == 1 && s.stalls_waiting == 0),
    )
    .await
    .expect("the primary's connection was closed at the timeout");
    releaser.abort();
    gw.shutdown().await;
}

/// `[policy] hedge_after_ms = 1000` with one alternate: a primary whose
/// head and role chunk come at once and whose first token would come at
/// 8 s is raced at 1 s by a hedge to the alternate, whose token comes at
/// once: the client reads the alternate's answer in under 3 s, and the
/// gateway closes the primary's connection within 100 ms of the alternate's
/// token (the provider notes when it wrote each piece and when each
/// connection ended).
#[tokio::test]
async fn a_hedge_to_the_alternate_beats_a_primary_slow_to_its_first_token() {
    let alt = "/alt/v1/chat/completions";
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                CHAT,
                vec![
                    sse(Write::text(counted("p", 1, 0, false)))
                        .write(Write::text(counted("p", 1, 3, true)).delay_ms(8000)),
                ],
            )
            .path(
                alt,
                vec![
                    sse(Write::text(counted("a", 1, 0, false)))
                        .write(Write::text(counted("a", 1, 3, true)).delay_ms(100)),
                ],
            ),
    )
    .await
    .unwrap();
    let text = format!(
        "[policy]\nmax_attempts = 3\nhedge_after_ms = 1000\n\
         [[alternates]]\nlabel = \"alt\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\n",
        provider.url(alt)
    );
    let gw = gateway_with(&provider, &text).await;
    let started = std::time::Instant::now();
    let answer = send(post(gw.url(CHAT), CHAT_BODY)).await;
    let took = started.elapsed();
    assert_eq!(answer.status, 200);
    assert_eq!(chat_content(&answer.text()), " w1 w2 w3");
    assert!(
        answer.text().contains("\"id\":\"a\""),
        "the alternate's answer"
    );
    assert!(
        took < std::time::Duration::from_secs(3),
        "answered after {took:?}"
    );
    let primary = &provider.requests_for(CHAT)[0];
    let hedge = &provider.requests_for(alt)[0];
    let token = provider.pieces_at(hedge.seq)[1];
    let mut closed = None;
    for _ in 0..100 {
        closed = provider.closed_at(primary.connection);
        if closed.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let after = closed
        .expect("the primary's connection was closed")
        .saturating_duration_since(token);
    assert!(
        after < std::time::Duration::from_millis(100),
        "closed {after:?} after the alternate's token"
    );
    // The primary's own token (due at 8 s) was never written.
    assert_eq!(provider.pieces_at(primary.seq).len(), 1);
    let m = gw.metrics();
    assert_eq!((m.hedges, m.hedges_won, m.hedges_cancelled), (1, 1, 1));
    assert_eq!(m.completed, 1);
    gw.shutdown().await;
}
