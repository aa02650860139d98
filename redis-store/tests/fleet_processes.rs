//! Three OS processes share one cooldown through a real Redis.
//!
//! The test binary is its own client: run with `--fleet-client`, it is one
//! process of the fleet (a tower `RecoveryLayer` with `RedisCooldowns` over
//! hyper-util); run plainly, it starts Redis and a loopback provider,
//! then three clients. The provider answers the first send `429` with
//! `Retry-After: 2`. The client that got it waits and succeeds; the two
//! started after it must not send at all until those 2 s have passed, and
//! then succeed with one send each.

mod support;

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant, SystemTime, UNIX_EPOCH};

use recovery_redis::{RedisCooldowns, RedisOptions};
use support::{Provider, RedisServer, TempDir, eventually};
use tokio::io::AsyncReadExt;

const HINT: Duration = Duration::from_secs(2);
/// Scheduling and the millisecond granularity of Redis TTLs and tokio
/// timers: a send this much before the end still counts as after it.
const SLACK: Duration = Duration::from_millis(15);

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--fleet-client") {
        return client(&args[1..]);
    }
    if args.iter().any(|a| a == "--list") {
        println!("three_processes_share_one_cooldown: test");
        return ExitCode::SUCCESS;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(three_processes_share_one_cooldown());
    println!("test three_processes_share_one_cooldown ... ok");
    ExitCode::SUCCESS
}

/// One process of the fleet: `--fleet-client REDIS_URL PROVIDER_URL ID`.
/// Prints `started_ms=… status=… completed=… attempts=… body_ok=…`.
fn client(args: &[String]) -> ExitCode {
    let [redis_url, provider_url, id] = args else {
        eprintln!("usage: --fleet-client REDIS_URL PROVIDER_URL ID");
        return ExitCode::from(2);
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let store = match RedisCooldowns::connect(redis_url, RedisOptions::default()) {
            Ok(store) => store,
            Err(e) => {
                eprintln!("client {id}: {e}");
                return ExitCode::from(3);
            }
        };
        if !store.ready(Duration::from_secs(5)).await {
            eprintln!("client {id}: redis not ready");
            return ExitCode::from(4);
        }
        let started_ms = unix_ms();
        let done = support::send(Arc::new(store), provider_url, id).await;
        println!(
            "started_ms={started_ms} status={} completed={} attempts={} body_ok={}",
            done.status, done.completed, done.attempts, done.body_ok
        );
        ExitCode::SUCCESS
    })
}

fn spawn(redis_url: &str, provider_url: &str, id: &str) -> tokio::process::Child {
    tokio::process::Command::new(std::env::current_exe().expect("own path"))
        .args(["--fleet-client", redis_url, provider_url, id])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a fleet client")
}

/// What a client printed, as (started_ms, line).
async fn report(mut child: tokio::process::Child, id: &str) -> (u128, String) {
    let mut out = String::new();
    let mut stdout = child.stdout.take().expect("stdout");
    let status = tokio::time::timeout(Duration::from_secs(30), async {
        stdout.read_to_string(&mut out).await.expect("read stdout");
        child.wait().await.expect("wait")
    })
    .await
    .unwrap_or_else(|_| panic!("client {id} did not finish within 30 s"));
    assert!(status.success(), "client {id}: {status}");
    let line = out.lines().last().unwrap_or_default().to_owned();
    let started = line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("started_ms="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("client {id} printed {out:?}"));
    (started, line)
}

async fn three_processes_share_one_cooldown() {
    let dir = TempDir::new("redis-store");
    let _redis = RedisServer::start(&dir);
    let redis_url = dir.url();
    let provider = Provider::start(("retry-after", "2")).await;
    let url = provider.url();

    // The first process learns the 429.
    let first = spawn(&redis_url, &url, "a");
    assert!(
        eventually(Duration::from_secs(20), || !provider.sends().is_empty()).await,
        "client a never sent"
    );
    let told_at = provider.sends()[0].at;
    let told_at_ms = unix_ms() - told_at.elapsed().as_millis();
    // Its note reaches Redis (a key of the cooldown namespace, expiring).
    let mut conn = support::redis_conn(&redis_url).await;
    let mut keys: Vec<String> = Vec::new();
    let deadline = StdInstant::now() + Duration::from_secs(5);
    while keys.is_empty() {
        assert!(
            StdInstant::now() < deadline,
            "the cooldown never reached Redis"
        );
        keys = redis::cmd("KEYS")
            .arg("recovery:cooldown:*")
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(keys.len(), 1, "{keys:?}");
    let ttl = support::pttl(&mut conn, &keys[0]).await;
    assert!(ttl > 0 && ttl <= 2_000, "expires on its own: PTTL {ttl}");

    // Two more processes start now, after the note.
    let second = spawn(&redis_url, &url, "b");
    let third = spawn(&redis_url, &url, "c");
    let (_, line_a) = report(first, "a").await;
    let (started_b, line_b) = report(second, "b").await;
    let (started_c, line_c) = report(third, "c").await;

    for line in [&line_a, &line_b, &line_c] {
        assert!(
            line.contains("status=200")
                && line.contains("completed=true")
                && line.contains("body_ok=true"),
            "{line}"
        );
    }
    assert!(line_a.contains("attempts=2"), "{line_a}");
    for (id, started, line) in [("b", started_b, &line_b), ("c", started_c, &line_c)] {
        assert!(line.contains("attempts=1"), "client {id} sent once: {line}");
        assert!(
            started < told_at_ms + HINT.as_millis(),
            "client {id} must start its request inside the cooldown (started {} ms after the 429)",
            started.saturating_sub(told_at_ms)
        );
    }

    let sends = provider.sends();
    let end = told_at + HINT;
    for id in ["b", "c"] {
        let theirs: Vec<_> = sends.iter().filter(|s| s.client == id).collect();
        assert_eq!(theirs.len(), 1, "client {id}: {sends:?}");
        let early = theirs.iter().filter(|s| s.at + SLACK < end).count();
        assert_eq!(
            early,
            0,
            "client {id} sent {} ms after the 429, inside the 2 s",
            theirs[0].at.duration_since(told_at).as_millis()
        );
    }
    assert_eq!(sends.iter().filter(|s| s.client == "a").count(), 2);
    assert_eq!(sends.len(), 4, "{sends:?}");
}
