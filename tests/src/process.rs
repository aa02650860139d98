//! Running built binaries (the `recover` CLI, the examples) against the
//! loopback fault provider, and reading what they wrote.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// Longest any example run may take before the test fails.
pub const LIMIT: Duration = Duration::from_secs(30);

/// What a finished run left behind.
#[derive(Debug)]
pub struct Output {
    /// How it ended.
    pub status: ExitStatus,
    /// Everything it wrote to stdout.
    pub stdout: Vec<u8>,
    /// Everything it wrote to stderr, as text.
    pub stderr: String,
}

impl Output {
    /// The exit code, if it exited.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

/// Spawns `program` with `args` and `env`, stdin, stdout and stderr piped.
pub fn spawn(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    // Hermetic: nothing from the developer's shell reaches a real provider.
    for k in [
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_MODEL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_MODEL",
        "OLLAMA_HOST",
        "OLLAMA_MODEL",
        "GEMINI_API_KEY",
        "GEMINI_BASE_URL",
        "GEMINI_MODEL",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn the program")
}

/// Runs to completion with `stdin` as input, within [`LIMIT`].
pub async fn run(program: &Path, args: &[&str], env: &[(&str, &str)], stdin: &[u8]) -> Output {
    let mut child = spawn(program, args, env);
    let mut input = child.stdin.take().expect("stdin");
    // A process that stops before reading (a usage error) closes the pipe.
    if let Err(e) = input.write_all(stdin).await {
        assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
    }
    drop(input);
    finish(child).await
}

/// Waits for `child` (within [`LIMIT`]) and collects what it printed.
pub async fn finish(mut child: Child) -> Output {
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let collect = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let (a, b, status) = tokio::join!(
            stdout.read_to_end(&mut out),
            stderr.read_to_end(&mut err),
            child.wait()
        );
        a.expect("read stdout");
        b.expect("read stderr");
        (status.expect("wait"), out, err)
    };
    let (status, stdout, stderr) = tokio::time::timeout(LIMIT, collect)
        .await
        .expect("the program did not finish in time");
    Output {
        status,
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Like [`finish`] for a child whose stdout the caller already consumed.
pub async fn finish_without_stdout(mut child: Child) -> Output {
    let mut stderr = child.stderr.take().expect("stderr");
    let collect = async {
        let mut err = Vec::new();
        let (b, status) = tokio::join!(stderr.read_to_end(&mut err), child.wait());
        b.expect("read stderr");
        (status.expect("wait"), err)
    };
    let (status, stderr) = tokio::time::timeout(LIMIT, collect)
        .await
        .expect("the program did not finish in time");
    Output {
        status,
        stdout: Vec::new(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// Sends SIGINT to `pid`, as Ctrl-C in a terminal does.
pub fn interrupt(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -INT {pid}");
}

/// Parses an events file: every line one JSON object with an `event` field.
pub fn events(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("events file");
    assert!(text.ends_with('\n'), "every event line ends: {text:?}");
    text.lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("event line is not JSON ({e}): {line}"));
            assert!(
                v.get("event").and_then(Value::as_str).is_some(),
                "no event field: {line}"
            );
            for field in ["logical_id", "wire_attempt", "at_ms"] {
                assert!(v.get(field).is_some(), "no {field}: {line}");
            }
            v
        })
        .collect()
}

/// The event names of `events`, in order.
pub fn names(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["event"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// Checks that exactly one terminal event ends the sequence and returns it.
pub fn terminal(events: &[Value]) -> String {
    let names = names(events);
    let terminal: Vec<&String> = names
        .iter()
        .filter(|n| {
            matches!(
                n.as_str(),
                "completed" | "exhausted" | "interrupted" | "cancelled"
            )
        })
        .collect();
    assert_eq!(terminal.len(), 1, "exactly one terminal event: {names:?}");
    assert_eq!(
        names.last(),
        terminal.first().copied(),
        "terminal comes last: {names:?}"
    );
    terminal[0].clone()
}

/// Parses a report file.
pub fn report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("report file");
    let v: Value = serde_json::from_str(&text).expect("report is JSON");
    assert!(
        v.get("logical_id").is_some() && v.get("attempts").is_some(),
        "{v}"
    );
    v
}

/// The report's outcome name (`completed`, `exhausted`, ...).
pub fn outcome(report: &Value) -> String {
    report["outcome"]["outcome"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A fresh scratch directory for one test's files.
pub fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recovery-run-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// A fixture's bytes.
pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(crate::fault::default_fixtures_dir().join(name)).expect("fixture")
}

/// The offset just after the `n`th event (1-based) of the SSE fixture
/// `name`: where a cut leaves `n` whole events delivered.
pub fn after_events(name: &str, n: usize) -> usize {
    let text = String::from_utf8(fixture(name)).expect("an SSE fixture is UTF-8");
    text.match_indices("\n\n")
        .nth(n - 1)
        .expect("the fixture has n events")
        .0
        + 2
}
