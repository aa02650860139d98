//! A client that loses its connection mid-stream reconnects with
//! `Last-Event-ID` and gets the rest, without gap or duplicate and without a
//! second upstream request: across two gateway processes that share one
//! Redis, and on one process with the in-memory log.
//!
//! Everything runs over real sockets: a `redis-server` on a unix socket in a
//! temporary directory, the loopback fault provider in this process (an
//! OpenAI chat stream with a pause between events, so it is still live when
//! the client comes back), and the `recovery-gateway` binary started as
//! child processes on `127.0.0.1:0`. The client is a raw HTTP/1.1 client on
//! a `TcpStream`, so dropping the connection is exactly a dropped socket.

#![cfg(feature = "redis")]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use recovery_tests::fault::{FaultProvider, Script, ScriptSet, Write};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

#[path = "support/listening.rs"]
mod listening;
use listening::listening;

/// Every wait in these tests ends by then.
const LIMIT: Duration = Duration::from_secs(30);
const CHAT: &str = "/v1/chat/completions";
const BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"count to ten"}]}"#;
/// The pause before each event after the first.
const PAUSE_MS: u64 = 150;

/// The payloads (`data:` values) the provider streams, in order.
fn payloads() -> Vec<String> {
    let mut out = vec![
        r#"{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#.to_owned(),
    ];
    for n in 1..=10 {
        out.push(format!(
            r#"{{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{{"index":0,"delta":{{"content":" {n}"}},"finish_reason":null}}]}}"#
        ));
    }
    out.push(
        r#"{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#.to_owned(),
    );
    out.push("[DONE]".to_owned());
    out
}

/// The chat stream, one write per event, each after a pause.
fn slow_chat() -> Script {
    payloads().iter().enumerate().fold(
        Script::ok().header("content-type", "text/event-stream"),
        |script, (i, data)| {
            let pause = if i == 0 { 0 } else { PAUSE_MS };
            script.write(Write::text(format!("data: {data}\n\n")).delay_ms(pause))
        },
    )
}

// ---------------------------------------------------------------- redis

use recovery_tests::redis::{RedisServer as Redis, TempDir};

// -------------------------------------------------------------- gateway

/// A `recovery-gateway` process, its address, and where its log lines go.
struct Gateway {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Gateway {
    async fn start(dir: &TempDir, name: &str, upstream: &str, stream_log: &str) -> Gateway {
        Gateway::start_keeping(dir, name, upstream, stream_log, 30_000).await
    }

    /// A gateway that keeps a generation going `keep_ms` after its last
    /// reader on this instance left.
    async fn start_keeping(
        dir: &TempDir,
        name: &str,
        upstream: &str,
        stream_log: &str,
        keep_ms: u64,
    ) -> Gateway {
        let keep = keep_ms.to_string();
        let args = ["--stream-log", stream_log, "--keep-generating-ms", &keep];
        Gateway::start_args(dir, name, upstream, &args).await
    }

    /// A gateway in front of `upstream` with these arguments besides.
    async fn start_args(dir: &TempDir, name: &str, upstream: &str, args: &[&str]) -> Gateway {
        let log = dir.path().join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_recovery-gateway"));
        command
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .args(args)
            // One secret for the fleet: every instance derives the same
            // stream keys.
            .env(
                "RECOVERY_GATEWAY_STREAM_SECRET",
                "two-instances-fleet-secret",
            )
            .stderr(stderr);
        let (child, addr) = listening(command, LIMIT)
            .await
            .unwrap_or_else(|e| panic!("{e}; log: {}", tail(&log)));
        Gateway { child, addr, log }
    }

    fn log_tail(&self) -> String {
        tail(&self.log)
    }

    /// SIGTERM, then its exit status (graceful: 0).
    async fn stop(mut self) -> i32 {
        let pid = self.child.id().expect("running");
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .await
            .expect("kill");
        assert!(sent.success());
        let status = tokio::time::timeout(LIMIT, self.child.wait())
            .await
            .expect("exits after SIGTERM")
            .expect("wait");
        status.code().unwrap_or(-1)
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

// --------------------------------------------------------------- client

/// One SSE event as the client got it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    id: Option<String>,
    data: String,
}

/// A streamed HTTP/1.1 response read off a raw socket.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// Bytes left in the current chunk.
    chunk_left: usize,
    done: bool,
    /// Decoded body bytes not yet parsed into events.
    pending: Vec<u8>,
}

impl Response {
    /// Sends `method path` with these extra headers and `body`, reads the head.
    async fn send(
        addr: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Response {
        let stream = TcpStream::connect(addr).await.expect("connect to gateway");
        let mut reader = BufReader::new(stream);
        let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\n");
        for (name, value) in headers {
            let _ = write!(head, "{name}: {value}\r\n");
        }
        if !body.is_empty() || method == "POST" {
            head.push_str("content-type: application/json\r\n");
            let _ = write!(head, "content-length: {}\r\n", body.len());
        }
        head.push_str("accept: text/event-stream\r\nconnection: close\r\n\r\n");
        let socket = reader.get_mut();
        socket.write_all(head.as_bytes()).await.expect("write head");
        socket.write_all(body.as_bytes()).await.expect("write body");
        let mut status_line = String::new();
        tokio::time::timeout(LIMIT, reader.read_line(&mut status_line))
            .await
            .expect("a response head in time")
            .expect("read status");
        let status = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("status line {status_line:?}"));
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).await.expect("read header");
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
            }
        }
        let chunked = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
        Response {
            status,
            headers,
            reader,
            chunked,
            chunk_left: 0,
            done: false,
            pending: Vec::new(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// More body bytes, or `false` at the end of the body.
    async fn fill(&mut self) -> bool {
        if self.done {
            return false;
        }
        if !self.chunked {
            let mut buf = [0u8; 4096];
            let n = self.reader.read(&mut buf).await.unwrap_or(0);
            self.pending.extend_from_slice(&buf[..n]);
            self.done = n == 0;
            return n > 0;
        }
        if self.chunk_left == 0 {
            let mut size = String::new();
            if self.reader.read_line(&mut size).await.unwrap_or(0) == 0 {
                self.done = true;
                return false;
            }
            let size = size.trim();
            if size.is_empty() {
                // The CRLF after the previous chunk's data.
                return true;
            }
            let hex = size.split(';').next().unwrap_or("");
            self.chunk_left = usize::from_str_radix(hex, 16)
                .unwrap_or_else(|_| panic!("chunk size line {size:?}"));
            if self.chunk_left == 0 {
                self.done = true;
                return false;
            }
        }
        let mut buf = vec![0u8; self.chunk_left.min(8192)];
        let n = self.reader.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            self.done = true;
            return false;
        }
        self.chunk_left -= n;
        self.pending.extend_from_slice(&buf[..n]);
        true
    }

    /// The next event with data (comments and keepalives skipped), or
    /// `None` at the end of the body.
    async fn next_event(&mut self) -> Option<Event> {
        loop {
            if let Some((end, gap)) = event_end(&self.pending) {
                let block = String::from_utf8_lossy(&self.pending[..end]).replace("\r\n", "\n");
                self.pending.drain(..end + gap);
                let mut event = Event {
                    id: None,
                    data: String::new(),
                };
                let mut has_data = false;
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("id:") {
                        event.id = Some(value.trim_start().to_owned());
                    } else if let Some(value) = line.strip_prefix("data:") {
                        if has_data {
                            event.data.push('\n');
                        }
                        event
                            .data
                            .push_str(value.strip_prefix(' ').unwrap_or(value));
                        has_data = true;
                    }
                }
                if has_data {
                    return Some(event);
                }
                continue;
            }
            let more = tokio::time::timeout(LIMIT, self.fill())
                .await
                .expect("the stream moves");
            if !more {
                return None;
            }
        }
    }

    /// Every remaining event.
    async fn rest(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(event) = self.next_event().await {
            out.push(event);
        }
        out
    }
}

/// Where the first event of `bytes` ends (its blank line), and how long that
/// line break is.
fn event_end(bytes: &[u8]) -> Option<(usize, usize)> {
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// `(stream, seq)` of an `id: <stream>:<seq>` line.
fn split_id(event: &Event) -> (String, u64) {
    let id = event
        .id
        .as_deref()
        .unwrap_or_else(|| panic!("no id: {event:?}"));
    let (stream, seq) = id.rsplit_once(':').unwrap_or_else(|| panic!("id {id:?}"));
    (stream.to_owned(), seq.parse().expect("numeric seq"))
}

/// Reads 3 events from `first`, drops the connection, reconnects to
/// `second` with `Last-Event-ID`, and checks the two halves make the whole
/// stream once, from one upstream request. The stream's id.
async fn drop_and_resume(provider: &FaultProvider, first: &Gateway, second: &Gateway) -> String {
    let mut a = Response::send(&first.addr, "POST", CHAT, &[], BODY).await;
    assert_eq!(a.status, 200, "log: {}", first.log_tail());
    let stream_id = a
        .header("x-recovery-stream-id")
        .unwrap_or_else(|| panic!("no stream id header: {:?}", a.headers))
        .to_owned();
    let mut head = Vec::new();
    for _ in 0..3 {
        let event = a.next_event().await.expect("an event before the cut");
        head.push(event);
    }
    drop(a);
    let dropped_at = Instant::now();
    for (event, seq) in head.iter().zip(1..) {
        assert_eq!(split_id(event), (stream_id.clone(), seq), "{event:?}");
    }

    let last = format!("{stream_id}:3");
    let mut b = Response::send(
        &second.addr,
        "POST",
        CHAT,
        &[("last-event-id", &last)],
        BODY,
    )
    .await;
    assert_eq!(b.status, 200, "log: {}", second.log_tail());
    let tail = b.rest().await;
    let took = dropped_at.elapsed();
    for (event, seq) in tail.iter().zip(4..) {
        assert_eq!(split_id(event), (stream_id.clone(), seq), "{event:?}");
    }
    let got: Vec<String> = head.iter().chain(&tail).map(|e| e.data.clone()).collect();
    assert_eq!(
        got,
        payloads(),
        "the first 3 events and the rest are the whole stream, no gap, no duplicate"
    );
    // The rest was partly live: it could not all have been in the log yet.
    assert!(
        took >= Duration::from_millis(PAUSE_MS * 3),
        "followed the live stream: {took:?}"
    );
    assert_eq!(
        provider.count_path(CHAT),
        1,
        "one upstream request: the reconnect was served from the stream log"
    );
    stream_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_on_another_instance_through_redis() {
    let dir = TempDir::new("gateway-two");
    let redis = Redis::start(&dir);
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(CHAT, vec![slow_chat()]))
        .await
        .expect("fault provider");
    let upstream = provider.base_url();
    let a = Gateway::start(&dir, "a", &upstream, &redis.url()).await;
    let b = Gateway::start(&dir, "b", &upstream, &redis.url()).await;
    let id = tokio::time::timeout(LIMIT * 2, drop_and_resume(&provider, &a, &b))
        .await
        .expect("done in time");

    // The finished stream, read again on B through the other route.
    let path = format!("/streams/{id}?after=5");
    let mut again = Response::send(&b.addr, "GET", &path, &[], "").await;
    assert_eq!(again.status, 200, "log: {}", b.log_tail());
    let rest = again.rest().await;
    for (event, seq) in rest.iter().zip(6..) {
        assert_eq!(split_id(event), (id.clone(), seq), "{event:?}");
    }
    let data: Vec<String> = rest.into_iter().map(|e| e.data).collect();
    assert_eq!(data, payloads()[5..]);
    assert_eq!(provider.count_path(CHAT), 1, "still one upstream request");

    assert_eq!(a.stop().await, 0, "graceful exit on SIGTERM");
    assert_eq!(b.stop().await, 0, "graceful exit on SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resumes_on_the_same_instance_with_the_memory_log() {
    let dir = TempDir::new("gateway-two");
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(CHAT, vec![slow_chat()]))
        .await
        .expect("fault provider");
    let gateway = Gateway::start(&dir, "mem", &provider.base_url(), "memory").await;
    tokio::time::timeout(LIMIT * 2, drop_and_resume(&provider, &gateway, &gateway))
        .await
        .expect("done in time");
    assert_eq!(gateway.stop().await, 0, "graceful exit on SIGTERM");
}

/// The instance running a stream counts only its own readers; a client that
/// reconnected to another instance says through the log that it reads, so
/// the generation outlives a keep-generating window far shorter than the
/// stream (300 ms against ~1.8 s) and the client gets it whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_another_instance_keeps_the_generation_going() {
    let dir = TempDir::new("gateway-two");
    let redis = Redis::start(&dir);
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(CHAT, vec![slow_chat()]))
        .await
        .expect("fault provider");
    let upstream = provider.base_url();
    let a = Gateway::start_keeping(&dir, "a", &upstream, &redis.url(), 300).await;
    let b = Gateway::start(&dir, "b", &upstream, &redis.url()).await;
    tokio::time::timeout(LIMIT * 2, drop_and_resume(&provider, &a, &b))
        .await
        .expect("done in time");
    assert_eq!(a.stop().await, 0);
    assert_eq!(b.stop().await, 0);
}

/// Gateways of a fleet (`--fleet-redis`) share the upstream's cooldown:
/// after instance A learns `429` with `retry-after-ms: 3000`, a request to
/// instance B holds its send until the window passes instead of learning
/// it again; the provider counts one request in the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_instances_share_the_upstream_cooldown() {
    let dir = TempDir::new("gateway-fleet");
    let redis = Redis::start(&dir);
    let limited = Script::status(429)
        .header("content-type", "application/json")
        .header("retry-after-ms", "3000")
        .write(Write::text(r#"{"error":{"type":"rate_limit_exceeded"}}"#));
    let provider = FaultProvider::start(
        ScriptSet::new(vec![]).path(CHAT, vec![limited, slow_chat(), slow_chat()]),
    )
    .await
    .expect("fault provider");
    let upstream = provider.base_url();
    let url = redis.url();
    let a = Gateway::start_args(&dir, "a", &upstream, &["--fleet-redis", &url]).await;
    let b = Gateway::start_args(&dir, "b", &upstream, &["--fleet-redis", &url]).await;
    let learner = {
        let addr = a.addr.clone();
        tokio::spawn(async move {
            let mut r = Response::send(&addr, "POST", CHAT, &[], BODY).await;
            (r.status, r.rest().await.len())
        })
    };
    provider.wait_for_requests(1).await;
    let learned = Instant::now();
    // The note travels by pub/sub; then B's request holds its send.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = {
        let addr = b.addr.clone();
        tokio::spawn(async move {
            let mut r = Response::send(&addr, "POST", CHAT, &[], BODY).await;
            (r.status, r.rest().await.len())
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        learned.elapsed() < Duration::from_millis(2800),
        "still inside the window"
    );
    assert_eq!(
        provider.count_path(CHAT),
        1,
        "inside the window only the request that learned it was sent; log b: {}",
        b.log_tail()
    );
    let (sa, na) = tokio::time::timeout(LIMIT, learner)
        .await
        .expect("a ends")
        .unwrap();
    let (sb, nb) = tokio::time::timeout(LIMIT, held)
        .await
        .expect("b ends")
        .unwrap();
    assert_eq!((sa, sb), (200, 200));
    assert_eq!((na, nb), (payloads().len(), payloads().len()), "both whole");
    assert_eq!(provider.count_path(CHAT), 3);
    assert_eq!(a.stop().await, 0);
    assert_eq!(b.stop().await, 0);
}
