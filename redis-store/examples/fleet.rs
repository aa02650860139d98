//! Two members of a fleet share one cooldown and one retry budget through
//! Redis.
//!
//! ```sh
//! cargo run -p recovery-redis --example fleet
//! REDIS_URL=redis://127.0.0.1:6379/0 cargo run -p recovery-redis --example fleet
//! ```
//!
//! Without `REDIS_URL` it starts a `redis-server` of its own on a unix
//! socket in a temporary directory (and stops it at the end). A loopback
//! provider answers the first request `429` with `Retry-After: 1`, then
//! streams. Member `a` gets the 429; member `b`, with its own stores and
//! connections as another process would have, starts after that and holds
//! its send until the second is over instead of learning the 429 itself.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant as StdInstant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use recovery_core::budget::RetryBudgetConfig;
use recovery_core::cooldown::CooldownStore;
use recovery_core::timing::Timing;
use recovery_redis::{RedisBudget, RedisCooldowns, RedisOptions};
use tower::{ServiceBuilder, ServiceExt};
use tower_recovery::core::policy::RecoveryPolicy;
use tower_recovery::core::protocol::ProtocolKind;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle, TokioTiming};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const STREAM: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
                      data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
                      data: [DONE]\n\n";
const BODY: &[u8] = br#"{"model":"fleet-model","stream":true}"#;

/// A `redis-server` of the example's own, stopped on drop.
struct LocalRedis {
    child: Child,
    dir: PathBuf,
}

impl LocalRedis {
    fn start() -> Result<(Self, String), BoxError> {
        let dir = std::env::temp_dir().join(format!("recovery-fleet-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("redis.sock");
        let child = Command::new("redis-server")
            .args(["--port", "0", "--save", "", "--appendonly", "no"])
            .arg("--unixsocket")
            .arg(&socket)
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("set REDIS_URL or install redis-server: {e}"))?;
        let deadline = StdInstant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            if StdInstant::now() > deadline {
                return Err("redis-server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let url = format!("redis+unix://{}", socket.display());
        Ok((LocalRedis { child, dir }, url))
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A provider on 127.0.0.1:0: `429 Retry-After: 1` first, then the stream.
async fn provider() -> Result<SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let sends = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let sends = Arc::clone(&sends);
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let n = sends.fetch_add(1, Ordering::SeqCst);
                let who = req.headers().get("x-member").cloned();
                async move {
                    let _ = req.into_body().collect().await;
                    let who = who.as_ref().and_then(|v| v.to_str().ok()).unwrap_or("?");
                    let response = if n == 0 {
                        println!("provider: send {} from {who}: 429 Retry-After: 1", n + 1);
                        Response::builder()
                            .status(429)
                            .header("retry-after", "1")
                            .body(Full::new(Bytes::new()))
                    } else {
                        println!("provider: send {} from {who}: 200, streamed", n + 1);
                        Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(Full::new(Bytes::from_static(STREAM.as_bytes())))
                    };
                    Ok::<_, Infallible>(response.expect("a valid response"))
                }
            });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// One member: its own stores (own connections), its own layer.
struct Member {
    name: &'static str,
    cooldowns: RedisCooldowns,
    budget: RedisBudget,
}

impl Member {
    async fn join(name: &'static str, url: &str, prefix: &str) -> Result<Self, BoxError> {
        let options = RedisOptions::default().prefix(prefix);
        let cooldowns = RedisCooldowns::connect(url, options.clone())?;
        let budget = RedisBudget::connect(url, RetryBudgetConfig::default(), options)?;
        if !cooldowns.ready(Duration::from_secs(2)).await {
            println!("{name}: Redis not reachable yet; going on locally");
        }
        Ok(Member {
            name,
            cooldowns,
            budget,
        })
    }

    async fn ask(&self, url: &str) -> Result<(), BoxError> {
        let client: Client<HttpConnector, ReplayBody> =
            Client::builder(TokioExecutor::new()).build_http();
        let layer = RecoveryLayer::new(RecoveryPolicy::default())
            .with_cooldowns(Arc::new(self.cooldowns.clone()))
            .with_retry_budget(self.budget.clone());
        let svc = ServiceBuilder::new()
            .layer(layer)
            .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
            .service(client);
        let request = Request::post(url)
            .header("content-type", "application/json")
            .header("x-member", self.name)
            .body(Full::new(Bytes::from_static(BODY)))?;
        let start = StdInstant::now();
        let response = svc.oneshot(request).await?;
        let status = response.status();
        let report = response.extensions().get::<ReportHandle>().cloned();
        response.into_body().collect().await?;
        let attempts = report.map_or(0, |r| r.report().attempt_count());
        println!(
            "{}: {status} after {} ms, {attempts} send(s)",
            self.name,
            start.elapsed().as_millis()
        );
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (_local, redis_url) = if let Ok(url) = std::env::var("REDIS_URL") {
        (None, url)
    } else {
        let (local, url) = LocalRedis::start()?;
        (Some(local), url)
    };
    // A prefix of this run's own, so a shared Redis keeps other data apart.
    let prefix = format!("recovery-example:{}:", std::process::id());
    let addr = provider().await?;
    let url = format!("http://{addr}/v1/chat/completions");

    let a = Member::join("a", &redis_url, &prefix).await?;
    let b = Member::join("b", &redis_url, &prefix).await?;
    let first = tokio::spawn({
        let url = url.clone();
        async move { a.ask(&url).await.map_err(|e| e.to_string()) }
    });

    // b starts once it has heard of a's cooldown (through Redis).
    let key = recovery_core::cooldown::key_for(&url, BODY);
    let clock = TokioTiming::new();
    let deadline = StdInstant::now() + Duration::from_secs(5);
    while b.cooldowns.remaining(&key, clock.now()).is_none() && StdInstant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if let Some(left) = b.cooldowns.remaining(&key, clock.now()) {
        println!(
            "b: the fleet is cooling down for {} ms more",
            left.as_millis()
        );
    }
    b.ask(&url).await?;
    first.await??;
    Ok(())
}
