//! What the Redis store tests share: a real `redis-server` on a unix socket
//! in a temporary directory, a loopback provider that records every send,
//! and a tower client with a cooldown store.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use recovery_core::cooldown::CooldownStore;
use recovery_core::timing::Instant;
use tower::{ServiceBuilder, ServiceExt};
use tower_recovery::core::policy::RecoveryPolicy;
use tower_recovery::core::protocol::ProtocolKind;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};

/// A complete OpenAI chat stream.
pub const STREAM: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
                          data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                          data: [DONE]\n\n";

/// The request body every client sends: one model, so one cooldown key.
pub const BODY: &[u8] = br#"{"model":"fleet-model","stream":true}"#;

/// Now on the tests' own monotonic clock, as callers of a store pass it.
pub fn now() -> Instant {
    static START: OnceLock<StdInstant> = OnceLock::new();
    Instant::from_origin(START.get_or_init(StdInstant::now).elapsed())
}

/// Polls `check` every 20 ms until it holds or `limit` has passed; whether
/// it held.
pub async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub use recovery_tests::redis::{RedisServer, TempDir};

/// A connection for the tests' own look at Redis.
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the test redis")
}

/// `PTTL key` (ms; -2 when the key does not exist).
pub async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// One send the provider received: who sent it, when.
#[derive(Debug, Clone)]
pub struct Sent {
    pub client: String,
    pub at: StdInstant,
}

/// A loopback provider on 127.0.0.1:0. The first send gets
/// `429` with `hint` (`("retry-after", "2")`); every later one, the stream.
pub struct Provider {
    pub addr: SocketAddr,
    pub sends: Arc<Mutex<Vec<Sent>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Provider {
    pub async fn start(hint: (&'static str, &'static str)) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("addr");
        let sends: Arc<Mutex<Vec<Sent>>> = Arc::default();
        let log = Arc::clone(&sends);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let log = Arc::clone(&log);
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let client = req
                            .headers()
                            .get("x-fleet-client")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("?")
                            .to_owned();
                        let first = {
                            let mut log = log.lock().unwrap();
                            log.push(Sent {
                                client,
                                at: StdInstant::now(),
                            });
                            log.len() == 1
                        };
                        async move {
                            // Read the request body before answering.
                            let _ = req.into_body().collect().await;
                            let response = if first {
                                Response::builder()
                                    .status(429)
                                    .header(hint.0, hint.1)
                                    .body(Full::new(Bytes::new()))
                            } else {
                                Response::builder()
                                    .header("content-type", "text/event-stream")
                                    .body(Full::new(Bytes::from_static(STREAM.as_bytes())))
                            };
                            Ok::<_, Infallible>(response.expect("response"))
                        }
                    });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Provider { addr, sends, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}/v1/chat/completions", self.addr)
    }

    pub fn sends(&self) -> Vec<Sent> {
        self.sends.lock().unwrap().clone()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How one request through the stack ended.
#[derive(Debug)]
pub struct Done {
    pub status: u16,
    pub completed: bool,
    pub attempts: u32,
    pub body_ok: bool,
}

/// Sends one request through `RecoveryLayer` (with `store`) over a hyper-util
/// client, as client `id`, and reads the whole body.
pub async fn send(store: Arc<dyn CooldownStore>, url: &str, id: &str) -> Done {
    let policy = RecoveryPolicy::builder()
        .backoff(Duration::from_millis(10), Duration::from_millis(100))
        .build()
        .expect("policy");
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let svc = ServiceBuilder::new()
        .layer(RecoveryLayer::new(policy).with_cooldowns(store))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
        .service(client);
    let request = Request::post(url)
        .header("content-type", "application/json")
        .header("x-fleet-client", id)
        .body(Full::new(Bytes::from_static(BODY)))
        .expect("request");
    let response = svc.oneshot(request).await.expect("a response");
    let status = response.status().as_u16();
    let report = response
        .extensions()
        .get::<ReportHandle>()
        .cloned()
        .expect("report handle");
    let body = response
        .into_body()
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes);
    let report = report.report();
    Done {
        status,
        completed: report
            .outcome
            .as_ref()
            .is_some_and(recovery_core::outcome::Outcome::is_completed),
        attempts: report.attempt_count(),
        body_ok: body.is_ok_and(|b| b == STREAM.as_bytes()),
    }
}
