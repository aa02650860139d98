//! The `recovery-gateway` binary: its first stdout line, usage errors,
//! structured stderr without credentials, and a graceful SIGTERM.

mod support;

use std::process::Stdio;

use recovery_tests::fault::FaultProvider;
use support::*;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_recovery-gateway");

#[tokio::test]
async fn help_and_version() {
    let out = Command::new(BIN).arg("--help").output().await.unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("usage: recovery-gateway"), "{text}");
    assert!(text.contains("RECOVERY_GATEWAY_KEEP_GENERATING_MS"));
    let out = Command::new(BIN).arg("--version").output().await.unwrap();
    assert!(out.status.success());
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .starts_with("recovery-gateway ")
    );
}

#[tokio::test]
async fn bad_usage_exits_2_with_one_line() {
    for args in [
        vec!["--bogus"],
        vec!["--listen", "not-an-address"],
        vec!["--max-streams", "0"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .env_remove("RECOVERY_GATEWAY_CONFIG")
            .output()
            .await
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("recovery-gateway: "), "{err}");
        assert!(out.stdout.is_empty());
    }
    let out = Command::new(BIN)
        .env("RECOVERY_GATEWAY_STREAM_LOG", "disk")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a bad variable too");
}

#[tokio::test]
async fn serves_logs_safely_and_exits_0_on_sigterm() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["--listen", "127.0.0.1:0"])
        .env("RECOVERY_GATEWAY_UPSTREAM", provider.base_url())
        .stderr(Stdio::piped());
    let (mut child, addr) = listening::listening(command, LIMIT).await.unwrap();
    assert!(addr.parse::<std::net::SocketAddr>().unwrap().port() != 0);

    let mut stderr = child.stderr.take().unwrap();
    let collect = tokio::spawn(async move {
        let mut all = String::new();
        let _ = stderr.read_to_string(&mut all).await;
        all
    });

    let mut req = post(format!("http://{addr}{CHAT}"), CHAT_BODY);
    req.headers_mut()
        .insert("x-api-key", "sk-ant-SECRET-999".parse().unwrap());
    let a = send(req).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        without_ids(&a.text()).as_bytes(),
        &fixture("openai-chat/happy-usage.sse")[..]
    );
    assert_eq!(
        provider.requests()[0].header("authorization"),
        Some(&b"Bearer sk-test-secret-0123"[..])
    );

    let pid = child.id().expect("running").to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0), "graceful shutdown exits 0");

    let err = collect.await.unwrap();
    assert!(!err.is_empty());
    for l in err.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        assert!(v["ts"].is_string() && v["level"].is_string() && v["msg"].is_string());
        assert!(!l.contains("SECRET") && !l.contains("secret"), "{l}");
    }
    assert!(err.contains("\"event\":\"stream_finished\""), "{err}");
    // A thread per core, and the shutdown told once, not by each thread.
    let cores = std::thread::available_parallelism().unwrap().get();
    assert!(
        err.contains("\"event\":\"listening\"") && err.contains(&format!("\"threads\":{cores}")),
        "{err}"
    );
    for event in ["shutdown_started", "shutdown_finished"] {
        assert_eq!(
            err.matches(&format!("\"event\":\"{event}\"")).count(),
            1,
            "{event}: {err}"
        );
    }
}

/// Standard error that nobody reads (a stalled log shipper) fills its pipe:
/// the gateway goes on serving, drops the lines it cannot write and says
/// how many once the pipe is read again.
#[tokio::test]
async fn a_stderr_nobody_reads_costs_lines_not_service() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["--listen", "127.0.0.1:0", "--log-level", "debug"])
        .env("RECOVERY_GATEWAY_UPSTREAM", provider.base_url())
        .stderr(Stdio::piped());
    let (mut child, addr) = listening::listening(command, LIMIT).await.unwrap();
    // Held, not read: the pipe (64 KiB on Linux) fills after a few hundred
    // lines, the gateway's queue after 4,096 more; each request here logs
    // six.
    let stderr = child.stderr.take().unwrap();
    for i in 0..1200 {
        let answer =
            tokio::time::timeout(LIMIT, send(post(format!("http://{addr}{CHAT}"), CHAT_BODY)))
                .await
                .unwrap_or_else(|_| panic!("request {i} answered while stderr was not read"));
        assert_eq!(answer.status, 200, "request {i}");
    }
    // The reader is back: lines are read as they come.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let collect = tokio::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            let _ = tx.send(l);
        }
    });
    // A request on a path of its own: its line shows that what was queued
    // before it is written and that lines logged now are written too.
    let mut err = Vec::new();
    let marker = "\"path\":\"/after/v1/chat/completions\"";
    for sent in 0.. {
        if err.iter().any(|l: &String| l.contains(marker)) {
            break;
        }
        assert!(
            sent < 1000,
            "no line of a request made after the reader came back"
        );
        let answer = send(post(format!("http://{addr}/after{CHAT}"), CHAT_BODY)).await;
        assert_eq!(answer.status, 200);
        while let Ok(Some(l)) = tokio::time::timeout(LIMIT, rx.recv()).await {
            let seen = l.contains(marker);
            err.push(l);
            if seen || rx.is_empty() {
                break;
            }
        }
    }
    let pid = child.id().expect("running").to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().await;
    assert!(killed.unwrap().success());
    let status = tokio::time::timeout(LIMIT, child.wait()).await.unwrap();
    assert_eq!(status.unwrap().code(), Some(0));
    collect.await.unwrap();
    while let Some(l) = rx.recv().await {
        err.push(l);
    }
    let err = err.join("\n");
    let mut dropped = 0;
    for l in err.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
        if v["event"] == "log_lines_dropped" {
            dropped += v["lines"].as_u64().unwrap();
        }
    }
    assert!(dropped > 0, "{err}");
    // Every line after the count was written, the shutdown's last.
    assert!(err.contains("\"event\":\"shutdown_finished\""), "{err}");
}
