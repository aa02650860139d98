//! Shared pieces of the gateway's socket tests: a fault provider upstream,
//! a gateway in process, and a plain HTTP client that reads SSE event by
//! event.
#![allow(dead_code)]

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::policy::RecoveryPolicy;
use recovery_gateway::logs::Logger;
use recovery_gateway::{Config, Gateway};
use recovery_tests::fault::FaultProvider;

pub mod listening;

/// No test waits longer than this for anything.
pub const LIMIT: Duration = Duration::from_secs(20);

pub const CHAT: &str = "/v1/chat/completions";
pub const MESSAGES: &str = "/v1/messages";
pub const RESPONSES: &str = "/v1/responses";
pub const CHAT_BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// An SSE answer of these writes.
pub fn sse(write: impl Into<recovery_tests::fault::WriteSpec>) -> recovery_tests::fault::Script {
    recovery_tests::fault::Script::ok()
        .header("content-type", "text/event-stream")
        .write(write)
}

/// The whole answer of `openai-chat/happy-usage.sse`.
pub fn happy() -> recovery_tests::fault::Script {
    sse(recovery_tests::fault::Write::fixture(
        "openai-chat/happy-usage.sse",
    ))
}

/// A chat stream that stalls after its first content event.
pub fn stalled() -> recovery_tests::fault::Script {
    sse(recovery_tests::fault::Write::text(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n",
    ))
    .write(recovery_tests::fault::Write::stall())
    .write(recovery_tests::fault::Write::text("data: [DONE]\n\n"))
}

pub fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(recovery_tests::fault::default_fixtures_dir().join(name)).unwrap()
}

/// Fast backoff so replays take milliseconds.
pub fn policy() -> RecoveryPolicy {
    RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(3).unwrap())
        .backoff(Duration::from_millis(2), Duration::from_millis(10))
        .build()
        .unwrap()
}

/// A gateway config in front of `provider`, logging into memory.
pub fn config(provider: &FaultProvider) -> (Config, Arc<Mutex<Vec<String>>>) {
    let (logger, lines) = Logger::memory();
    let c = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstream: Some(provider.base_url().parse().unwrap()),
        policy: policy(),
        logger,
        ..Config::default()
    };
    (c, lines)
}

/// A gateway config in front of the upstream at `addr`, logging into
/// memory.
pub fn config_at(addr: std::net::SocketAddr) -> Config {
    let (logger, _) = Logger::memory();
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        upstream: Some(format!("http://{addr}").parse().unwrap()),
        policy: policy(),
        logger,
        ..Config::default()
    }
}

pub async fn gateway(config: Config) -> Gateway {
    Gateway::bind(config).await.expect("gateway binds")
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A response read whole.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }

    pub fn stream_id(&self) -> String {
        self.headers
            .get("x-recovery-stream-id")
            .expect("x-recovery-stream-id")
            .to_str()
            .unwrap()
            .to_owned()
    }
}

pub async fn send(req: Request<Full<Bytes>>) -> Answer {
    tokio::time::timeout(LIMIT, async {
        let resp = client().request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("whole body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    })
    .await
    .expect("hung")
}

/// The credentials the tests' requests carry.
pub const AUTH: &str = "Bearer sk-test-secret-0123";

pub fn post(url: String, body: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", AUTH)
        .body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
}

/// A GET with the tests' credentials (a reconnect must bring the
/// credentials that created the stream).
pub fn get(url: String) -> Request<Full<Bytes>> {
    get_as(url, &[("authorization", AUTH)])
}

/// A GET with these headers only.
pub fn get_as(url: String, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::get(url);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

/// The stream without the gateway's `id:` lines.
pub fn without_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        if !line.starts_with("id: ") {
            out.push_str(line);
        }
    }
    out
}

/// The SSE events of a text (split on blank lines), blank lines kept.
pub fn events(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("\n\n") {
        out.push(rest[..i + 2].to_owned());
        rest = &rest[i + 2..];
    }
    if !rest.is_empty() {
        out.push(rest.to_owned());
    }
    out
}

/// The gateway id of an event (`<stream>:<seq>`), if it has one.
pub fn event_id(event: &str) -> Option<String> {
    event
        .lines()
        .find_map(|l| l.strip_prefix("id: "))
        .map(str::to_owned)
}

/// The data of an event, parsed.
pub fn data(event: &str) -> serde_json::Value {
    let line = event
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or_else(|| panic!("no data in {event:?}"));
    serde_json::from_str(line).unwrap()
}

/// Byte offset just after the `n`th (1-based) blank-line event end.
pub fn after_event(bytes: &[u8], n: usize) -> usize {
    let mut seen = 0;
    for i in 0..bytes.len().saturating_sub(1) {
        if bytes[i] == b'\n' && bytes[i + 1] == b'\n' {
            seen += 1;
            if seen == n {
                return i + 2;
            }
        }
    }
    panic!("fewer than {n} events");
}

/// Byte offset just after the first event whose text starts with `head`
/// (`event: content_block_delta`, say).
pub fn after_first(bytes: &[u8], head: &str) -> usize {
    let text = std::str::from_utf8(bytes).expect("UTF-8 fixture");
    let at = text.find(head).unwrap_or_else(|| panic!("no {head:?}"));
    at + text[at..].find("\n\n").expect("a whole event") + 2
}

/// A streamed response read event by event.
pub struct Live {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Incoming,
    buf: String,
}

impl Live {
    pub async fn open(req: Request<Full<Bytes>>) -> Live {
        let resp = tokio::time::timeout(LIMIT, client().request(req))
            .await
            .expect("hung")
            .expect("response");
        let (parts, body) = resp.into_parts();
        Live {
            status: parts.status,
            headers: parts.headers,
            body,
            buf: String::new(),
        }
    }

    pub fn stream_id(&self) -> String {
        self.headers["x-recovery-stream-id"]
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// The next `n` whole events.
    pub async fn events(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        tokio::time::timeout(LIMIT, async {
            while out.len() < n {
                if let Some(i) = self.buf.find("\n\n") {
                    out.push(self.buf[..i + 2].to_owned());
                    self.buf.drain(..i + 2);
                    continue;
                }
                let frame = self.body.frame().await.expect("more").expect("a frame");
                if let Ok(data) = frame.into_data() {
                    self.buf.push_str(std::str::from_utf8(&data).unwrap());
                }
            }
        })
        .await
        .expect("hung reading events");
        out
    }
}

/// A chat request of `mib` MiB: a conversation carrying screenshots.
pub fn vision_body(mib: usize) -> String {
    format!(
        r#"{{"model":"m","stream":true,"messages":[{{"role":"user","content":[{{"type":"image_url","image_url":{{"url":"data:image/png;base64,{}"}}}}]}}]}}"#,
        "iVBO".repeat(mib << 18)
    )
}
