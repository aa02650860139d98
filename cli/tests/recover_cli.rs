//! The `recover` contract, checked from outside the process against the
//! loopback fault provider: exit codes 0/1/2/130, the delivered bytes on
//! stdout, events as JSON lines, the report as JSON, one readable stderr line.

use std::path::{Path, PathBuf};

use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Write};
use recovery_tests::process::{
    self as support, events, fixture, outcome, report, run, scratch, terminal,
};
use tokio::io::AsyncReadExt;

const BODY: &[u8] =
    br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"canary-prompt"}]}"#;

fn recover() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_recover"))
}

struct Files {
    events: PathBuf,
    report: PathBuf,
}

impl Files {
    fn new(test: &str) -> Self {
        let dir = scratch(test);
        Files {
            events: dir.join("events.jsonl"),
            report: dir.join("report.json"),
        }
    }

    fn args<'a>(&'a self, protocol: &'a str, extra: &[&'a str], url: &'a str) -> Vec<&'a str> {
        let mut args = vec![
            "--protocol",
            protocol,
            "--events",
            self.events.to_str().unwrap(),
            "--report",
            self.report.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        args.push(url);
        args
    }
}

fn stream(fixture: &str) -> Script {
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::fixture(fixture).split_lines())
}

fn one_line_error(stderr: &str) -> &str {
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with("recover: "), "stderr: {stderr:?}");
    for bad in ["panicked", "RUST_BACKTRACE", "RecoveryError {", "Evidence"] {
        assert!(!stderr.contains(bad), "stderr: {stderr:?}");
    }
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_after_503_and_reset_exits_0_with_the_exact_stream() {
    let provider = FaultProvider::start(vec![
        Script::status(503).header("retry-after-ms", "20"),
        Script::just(Ending::ResetBeforeHead),
        stream("openai-chat/happy-usage.sse"),
    ])
    .await
    .unwrap();
    let files = Files::new("completed");
    let url = provider.url("/v1/chat/completions");
    let args = files.args(
        "openai-chat",
        &[
            "--max-attempts",
            "3",
            "--header",
            "authorization: Bearer sk-canary",
        ],
        &url,
    );
    let out = run(&recover(), &args, &[], BODY).await;
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    assert_eq!(out.stdout, fixture("openai-chat/happy-usage.sse"));
    assert!(out.stderr.is_empty(), "{}", out.stderr);

    let ev = events(&files.events);
    assert_eq!(terminal(&ev), "completed");
    assert_eq!(
        support::names(&ev)
            .iter()
            .filter(|n| *n == "attempt_started")
            .count(),
        3
    );
    for line in std::fs::read_to_string(&files.events).unwrap().lines() {
        assert!(!line.contains("canary"), "no secrets in events: {line}");
    }
    let rep = report(&files.report);
    assert_eq!(outcome(&rep), "completed");
    assert_eq!(rep["attempts"].as_array().unwrap().len(), 3);
    assert!(
        !std::fs::read_to_string(&files.report)
            .unwrap()
            .contains("canary")
    );

    let sent = provider.requests();
    assert_eq!(sent.len(), 3);
    for r in &sent {
        assert_eq!(r.body, BODY, "stdin is the request body, byte for byte");
        assert_eq!(r.method, "POST");
        assert_eq!(r.header("authorization"), Some(&b"Bearer sk-canary"[..]));
        assert_eq!(r.header("content-type"), Some(&b"application/json"[..]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_protocol_completes_with_its_own_proof() {
    let cases = [
        (
            "openai-responses",
            "/v1/responses",
            "openai-responses/happy.sse",
        ),
        ("anthropic", "/v1/messages", "anthropic/happy.sse"),
        (
            "gemini",
            "/v1beta/models/m:streamGenerateContent",
            "gemini/crlf-happy.sse",
        ),
        ("ollama", "/api/chat", "ollama/chat-happy.ndjson"),
    ];
    for (protocol, path, name) in cases {
        let content_type = if protocol == "ollama" {
            "application/x-ndjson"
        } else {
            "text/event-stream"
        };
        let provider = FaultProvider::start(vec![
            Script::just(Ending::ResetBeforeHead),
            Script::ok()
                .header("content-type", content_type)
                .write(Write::fixture(name).split_lines()),
        ])
        .await
        .unwrap();
        let files = Files::new(protocol);
        let url = provider.url(path);
        let out = run(&recover(), &files.args(protocol, &[], &url), &[], BODY).await;
        assert_eq!(out.code(), Some(0), "{protocol}: {}", out.stderr);
        assert_eq!(out.stdout, fixture(name), "{protocol}");
        assert_eq!(terminal(&events(&files.events)), "completed", "{protocol}");
        assert_eq!(outcome(&report(&files.report)), "completed", "{protocol}");
        assert_eq!(provider.count(), 2, "{protocol}");
    }
}

/// Runs `recover` against `scripts` and checks the failure contract: exit 1,
/// one readable stderr line, a terminal failure event, a report with `want`.
async fn fails(
    test: &str,
    protocol: &str,
    scripts: Vec<Script>,
    extra: &[&str],
    want: &str,
) -> (support::Output, serde_json::Value, FaultProvider) {
    let provider = FaultProvider::start(ScriptSet::new(scripts)).await.unwrap();
    let files = Files::new(test);
    let url = provider.url("/v1/chat/completions");
    let out = run(&recover(), &files.args(protocol, extra, &url), &[], BODY).await;
    assert_eq!(out.code(), Some(1), "{test}: stderr {}", out.stderr);
    let line = one_line_error(&out.stderr);
    assert!(line.contains("recovery failed"), "{test}: {line}");
    let ev = events(&files.events);
    let end = terminal(&ev);
    assert!(end == "exhausted" || end == "interrupted", "{test}: {end}");
    let rep = report(&files.report);
    assert_eq!(outcome(&rep), want, "{test}: {rep}");
    (out, rep, provider)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_exhausted_exits_1() {
    let (_, rep, provider) = fails(
        "exhausted",
        "openai-chat",
        vec![Script::status(503).header("retry-after-ms", "5")],
        &["--max-attempts", "2"],
        "exhausted",
    )
    .await;
    assert_eq!(provider.count(), 2, "--max-attempts bounds the sends");
    assert_eq!(rep["attempts"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_after_output_exits_1_with_the_delivered_prefix() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let text = String::from_utf8(happy.clone()).unwrap();
    let cut = text.match_indices("\n\n").nth(1).unwrap().0 + 2;
    let (out, _, provider) = fails(
        "interrupted",
        "openai-chat",
        vec![
            stream("openai-chat/happy-usage.sse")
                .cut_at(cut)
                .ending(Ending::Rst),
        ],
        &[],
        "interrupted",
    )
    .await;
    assert_eq!(
        out.stdout,
        &happy[..cut],
        "the committed prefix, nothing more"
    );
    assert_eq!(provider.count(), 1, "no replay after output");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_eof_without_terminal_proof_is_not_success() {
    let (out, _, _) = fails(
        "eof",
        "openai-chat",
        vec![stream("openai-chat/clean-eof-no-terminal.sse")],
        &[],
        "interrupted",
    )
    .await;
    assert_eq!(out.stdout, fixture("openai-chat/clean-eof-no-terminal.sse"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsuccessful_terminal_exits_1() {
    fails(
        "length",
        "openai-chat",
        vec![stream("openai-chat/length.sse")],
        &[],
        "unsuccessful",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_status_is_not_retried_and_exits_1() {
    let error = r#"{"error":{"message":"bad request","type":"invalid_request_error"}}"#;
    let (out, _, provider) = fails(
        "permanent",
        "openai-chat",
        vec![
            Script::status(400)
                .header("content-type", "application/json")
                .write(Write::text(error)),
        ],
        &[],
        "permanent",
    )
    .await;
    assert_eq!(provider.count(), 1);
    assert!(out.stderr.contains("400"), "{}", out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_above_the_ceiling_is_refused_and_exits_1() {
    let (_, _, provider) = fails(
        "ceiling",
        "anthropic",
        vec![Script::status(529).header("retry-after", "30")],
        &["--retry-after-ceiling-ms", "1000"],
        "retry_after_refused",
    )
    .await;
    assert_eq!(provider.count(), 1, "never shortened, never retried early");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_fires_on_a_silent_stream_and_exits_1() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let text = String::from_utf8(happy).unwrap();
    let cut = text.match_indices("\n\n").nth(1).unwrap().0 + 2;
    fails(
        "idle",
        "openai-chat",
        vec![
            stream("openai-chat/happy-usage.sse")
                .cut_at(cut)
                .ending(Ending::Stall),
        ],
        &["--idle-timeout-ms", "300"],
        "interrupted",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_sse_never_proves_an_end_so_it_exits_1() {
    fails(
        "sse",
        "sse",
        vec![stream("sse/sentinel.sse")],
        &[],
        "interrupted",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connection_exits_1_with_a_report() {
    let addr = recovery_tests::fault::refused_addr().unwrap();
    let files = Files::new("refused");
    let url = format!("http://{addr}/v1/chat/completions");
    let args = files.args("openai-chat", &["--max-attempts", "2"], &url);
    let out = run(&recover(), &args, &[], BODY).await;
    assert_eq!(out.code(), Some(1), "{}", out.stderr);
    one_line_error(&out.stderr);
    assert_eq!(terminal(&events(&files.events)), "exhausted");
    assert_eq!(outcome(&report(&files.report)), "exhausted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2_without_sending() {
    let provider = FaultProvider::start(vec![stream("openai-chat/happy-usage.sse")])
        .await
        .unwrap();
    let url = provider.url("/v1/chat/completions");
    let dir = scratch("usage");
    let missing_dir = dir.join("no/such/dir/events.jsonl");
    let missing = missing_dir.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &[u8])> = vec![
        (vec![], BODY),
        (vec!["--protocol", "openai-chat"], BODY),
        (vec![&url], BODY),
        (vec!["--protocol", "openai-chat", "--bogus", &url], BODY),
        (vec!["--protocol", "openai", &url], BODY),
        (vec!["--protocol", "nope", &url], BODY),
        (
            vec!["--protocol", "openai-chat", "--max-attempts", "x", &url],
            BODY,
        ),
        (
            vec!["--protocol", "openai-chat", "--max-attempts", "0", &url],
            BODY,
        ),
        (
            vec!["--protocol", "openai-chat", "--budget-ms", "-5", &url],
            BODY,
        ),
        (
            vec![
                "--protocol",
                "openai-chat",
                "--idle-timeout-ms",
                "1e3",
                &url,
            ],
            BODY,
        ),
        (
            vec![
                "--protocol",
                "openai-chat",
                "--retry-after-ceiling-ms",
                "",
                &url,
            ],
            BODY,
        ),
        (
            vec!["--protocol", "openai-chat", "--header", "no-colon", &url],
            BODY,
        ),
        (vec!["--protocol", "openai-chat", "--events"], BODY),
        (vec!["--protocol", "openai-chat", "ftp://127.0.0.1/"], BODY),
        (vec!["--protocol", "openai-chat", &url, &url], BODY),
        (
            vec!["--protocol", "openai-chat", "--events", missing, &url],
            BODY,
        ),
        (vec!["--protocol", "openai-chat", &url], b"{not json"),
    ];
    for (args, stdin) in cases {
        let out = run(&recover(), &args, &[], stdin).await;
        assert_eq!(out.code(), Some(2), "{args:?}: {}", out.stderr);
        let line = one_line_error(&out.stderr);
        assert!(
            out.stderr.contains("usage: recover"),
            "{args:?}: {}",
            out.stderr
        );
        assert!(line.len() > "recover: ".len(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    assert_eq!(provider.count(), 0, "a usage error sends nothing");

    let help = run(&recover(), &["--help"], &[], b"").await;
    assert_eq!(help.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("--protocol"));
}

async fn wait_for_event(path: &Path, name: &str) {
    let needle = format!("\"event\":\"{name}\"");
    tokio::time::timeout(support::LIMIT, async {
        loop {
            if std::fs::read_to_string(path).is_ok_and(|t| t.contains(&needle)) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {name} event"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_streaming_exits_130_with_a_cancelled_event() {
    let happy = fixture("openai-chat/happy-usage.sse");
    let text = String::from_utf8(happy.clone()).unwrap();
    let cut = text.match_indices("\n\n").nth(1).unwrap().0 + 2;
    let provider = FaultProvider::start(vec![
        stream("openai-chat/happy-usage.sse")
            .cut_at(cut)
            .ending(Ending::Stall),
    ])
    .await
    .unwrap();
    let files = Files::new("sigint-streaming");
    let url = provider.url("/v1/chat/completions");
    let mut child = support::spawn(&recover(), &files.args("openai-chat", &[], &url), &[]);
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(BODY).await.unwrap();
    }
    // Wait until the committed prefix has reached stdout, then interrupt.
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    tokio::time::timeout(support::LIMIT, async {
        while seen.len() < cut {
            let mut buf = [0u8; 4096];
            let n = stdout.read(&mut buf).await.unwrap();
            assert!(n > 0, "stdout ended early");
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the prefix never arrived");
    assert_eq!(seen, &happy[..cut]);
    provider.wait_for_stalls(1).await;
    support::interrupt(child.id().unwrap());
    let mut rest = Vec::new();
    stdout.read_to_end(&mut rest).await.unwrap();
    child.stdout = None;
    let out = support::finish_without_stdout(child).await;
    assert_eq!(out.code(), Some(130), "stderr: {}", out.stderr);
    assert!(rest.is_empty());
    let ev = events(&files.events);
    assert_eq!(terminal(&ev), "cancelled");
    assert_eq!(ev.last().unwrap()["phase"], "streaming");
    assert_eq!(outcome(&report(&files.report)), "cancelled");
    tokio::time::timeout(support::LIMIT, provider.wait_idle())
        .await
        .expect("the connection was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_during_a_retry_wait_exits_130_with_a_cancelled_event() {
    let provider = FaultProvider::start(vec![
        Script::status(503).header("retry-after", "30"),
        stream("openai-chat/happy-usage.sse"),
    ])
    .await
    .unwrap();
    let files = Files::new("sigint-waiting");
    let url = provider.url("/v1/chat/completions");
    let mut child = support::spawn(&recover(), &files.args("openai-chat", &[], &url), &[]);
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(BODY).await.unwrap();
    }
    wait_for_event(&files.events, "delay_scheduled").await;
    support::interrupt(child.id().unwrap());
    let out = support::finish(child).await;
    assert_eq!(out.code(), Some(130), "stderr: {}", out.stderr);
    assert!(out.stdout.is_empty());
    let ev = events(&files.events);
    assert_eq!(terminal(&ev), "cancelled");
    assert_eq!(ev.last().unwrap()["phase"], "waiting");
    assert_eq!(outcome(&report(&files.report)), "cancelled");
    assert_eq!(provider.count(), 1, "no send after the cancel");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_and_help_exit_0_on_stdout() {
    let out = run(&recover(), &["--version"], &[], b"").await;
    assert_eq!(out.code(), Some(0));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("recover {}\n", env!("CARGO_PKG_VERSION"))
    );
    let out = run(&recover(), &["--help"], &[], b"").await;
    assert_eq!(out.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    for part in [
        "usage: recover --protocol",
        "--resumable-sse",
        "--head-timeout-ms",
        "--progress-timeout-ms",
        "Examples:",
        "https://api.openai.com/v1/chat/completions",
    ] {
        assert!(help.contains(part), "--help lacks {part:?}:\n{help}");
    }
    assert!(out.stderr.is_empty(), "{}", out.stderr);
}

/// The first event boundary after the first text delta of `stream`.
fn after_first_delta(stream: &[u8], marker: &str) -> usize {
    let text = std::str::from_utf8(stream).unwrap();
    let delta = text.find(marker).expect("a delta");
    text[delta..].find("\n\n").unwrap() + delta + 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_background_stream_cut_after_output_is_resumed_whole() {
    let full = fixture("openai-responses/happy.sse");
    let cut = after_first_delta(&full, "response.output_text.delta");
    let provider = FaultProvider::start(
        ScriptSet::new(vec![])
            .path(
                "/v1/responses",
                vec![
                    stream("openai-responses/happy.sse")
                        .cut_at(cut)
                        .ending(Ending::Rst),
                ],
            )
            .path(
                "/v1/responses/resp_1",
                vec![stream("openai-responses/happy.sse")],
            ),
    )
    .await
    .unwrap();
    let files = Files::new("responses-resume");
    let url = provider.url("/v1/responses");
    let args = files.args("openai-responses", &[], &url);
    let body = br#"{"model":"m","input":"hi","stream":true,"background":true}"#;
    let out = run(&recover(), &args, &[], body).await;
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    assert_eq!(out.stdout, full, "no gap, no duplicate");
    let ev = events(&files.events);
    assert!(support::names(&ev).contains(&String::from("resume_started")));
    assert_eq!(terminal(&ev), "completed");
    assert_eq!(
        provider.count_path("/v1/responses"),
        1,
        "never a POST replay"
    );
    let get = &provider.requests_for("/v1/responses/resp_1")[0];
    assert_eq!(get.method, "GET");
    assert!(get.target.contains("starting_after="), "{}", get.target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumable_sse_resends_with_last_event_id() {
    const SSE: &str = "id: 1\ndata: one\n\nid: 2\ndata: two\n\nid: 3\ndata: three\n\n";
    let cut = SSE.find("id: 3").unwrap();
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        "/events",
        vec![
            Script::ok()
                .header("content-type", "text/event-stream")
                .write(Write::text(SSE))
                .cut_at(cut)
                .ending(Ending::Rst),
            Script::ok()
                .header("content-type", "text/event-stream")
                .write(Write::text(&SSE[cut..])),
        ],
    ))
    .await
    .unwrap();
    let files = Files::new("sse-resume");
    let url = provider.url("/events");
    let args = files.args("sse", &["--resumable-sse"], &url);
    let out = run(&recover(), &args, &[], b"{}").await;
    // A generic SSE stream carries no terminal proof, so the run ends
    // unproven (exit 1); what matters is the resumed, whole byte stream.
    assert_eq!(out.code(), Some(1), "stderr: {}", out.stderr);
    assert_eq!(out.stdout, SSE.as_bytes());
    let sent = provider.requests_for("/events");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].header("last-event-id"), Some(&b"2"[..]));
    assert!(support::names(&events(&files.events)).contains(&String::from("resume_started")));

    // Without the flag the same cut is not resent.
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        "/events",
        vec![Script::ok()
            .header("content-type", "text/event-stream")
            .write(Write::text(SSE))
            .cut_at(cut)
            .ending(Ending::Rst)],
    ))
    .await
    .unwrap();
    let url = provider.url("/events");
    let out = run(&recover(), &["--protocol", "sse", &url], &[], b"{}").await;
    assert_eq!(out.code(), Some(1));
    assert_eq!(provider.count_path("/events"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_shows_a_live_status_line_and_a_pipe_does_not() {
    let provider = FaultProvider::start(vec![
        Script::status(503).header("retry-after-ms", "600"),
        stream("openai-chat/happy-usage.sse"),
    ])
    .await
    .unwrap();
    let url = provider.url("/v1/chat/completions");
    let dir = scratch("status-line");
    let body = dir.join("body.json");
    std::fs::write(&body, BODY).unwrap();
    // `script` gives the command a terminal for stdout and stderr.
    let command = format!(
        "{} --protocol openai-chat {url} < {}",
        recover().display(),
        body.display()
    );
    let out = run(
        Path::new("script"),
        &["-q", "-e", "-c", &command, "/dev/null"],
        &[],
        b"",
    )
    .await;
    assert_eq!(out.code(), Some(0), "stderr: {}", out.stderr);
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        seen.contains("Reconnecting… attempt 2/3, retry in 0.6 s"),
        "the status line on the terminal: {seen:?}"
    );
    assert!(seen.contains("\r\x1b[2K"), "and cleared: {seen:?}");
    assert!(seen.contains("[DONE]"), "{seen:?}");

    // Through pipes (the other tests): stderr stays empty on success.
    let provider = FaultProvider::start(vec![
        Script::status(503).header("retry-after-ms", "20"),
        stream("openai-chat/happy-usage.sse"),
    ])
    .await
    .unwrap();
    let url = provider.url("/v1/chat/completions");
    let out = run(&recover(), &["--protocol", "openai-chat", &url], &[], BODY).await;
    assert_eq!(out.code(), Some(0));
    assert!(out.stderr.is_empty(), "{:?}", out.stderr);
}
