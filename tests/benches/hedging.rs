//! Time to first token with and without hedging, over loopback sockets.
//!
//! The loopback fault provider answers every request with its head and a
//! role chunk at once and its first token after a heavy-tailed delay: of
//! every 20 answers (in a fixed shuffled order, so both runs meet the same
//! sequence), 19 take 50–250 ms and one takes 10 s. `REQUESTS` requests
//! (1,000 by default) go through `RecoveryLayer` + `ObserveLayer` over a
//! hyper-util client, `CONCURRENCY` (100) at a time: once with the default
//! policy, once with `hedge_after` of `HEDGE_AFTER_MS` (500 ms). The time to
//! first token is from the call to the first body frame the consumer
//! reads (the committed head comes with it). Prints p50, p90, p99 and the
//! maximum, the sends the provider received and the extra sends hedging
//! cost; `cargo bench -p recovery-tests --bench hedging`.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_tests::fault::{FaultProvider, Script, ScriptSet, Write};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody};

const PATH: &str = "/v1/chat/completions";
const PROMPT: &str = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The first-token delay of answer `i`: one in 20 is 10 s, the others
/// 50–250 ms, in an order fixed by a small xorshift.
fn delays(n: usize) -> Vec<u64> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .map(|_| {
            if next() % 20 == 0 {
                10_000
            } else {
                50 + next() % 201
            }
        })
        .collect()
}

fn answer(delay_ms: u64) -> Script {
    let role = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n";
    let token = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n";
    let end = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::text(role))
        .write(Write::text(token).delay_ms(delay_ms))
        .write(Write::text(end))
}

struct Figures {
    ttft: Vec<Duration>,
    sends: u64,
    hedges: u32,
    hedges_won: u32,
}

async fn run(policy: RecoveryPolicy, requests: usize, concurrency: usize) -> Figures {
    // More answers than requests: each hedge takes the next one.
    let scripts: Vec<Script> = delays(requests * 2).into_iter().map(answer).collect();
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(PATH, scripts))
        .await
        .expect("the fault provider");
    let client: Client<HttpConnector, ReplayBody> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(concurrency * 2)
        .build_http();
    let svc = RecoveryLayer::new(policy)
        .without_retry_budget()
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = Vec::with_capacity(requests);
    for _ in 0..requests {
        let svc = svc.clone();
        let gate = Arc::clone(&gate);
        let url = provider.url(PATH);
        tasks.push(tokio::spawn(async move {
            let _slot = gate.acquire_owned().await.expect("the gate");
            let req = Request::post(url)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
                .expect("a request");
            let started = Instant::now();
            let resp = svc.oneshot(req).await.expect("an answer");
            let report = resp
                .extensions()
                .get::<tower_recovery::ReportHandle>()
                .cloned()
                .expect("a report");
            let mut body = resp.into_body();
            let first = body.frame().await;
            let ttft = started.elapsed();
            assert!(first.is_some(), "a first frame");
            while body.frame().await.is_some() {}
            (ttft, report.report().hedges())
        }));
    }
    let mut figures = Figures {
        ttft: Vec::with_capacity(requests),
        sends: 0,
        hedges: 0,
        hedges_won: 0,
    };
    for task in tasks {
        let (ttft, hedges) = task.await.expect("a request task");
        figures.ttft.push(ttft);
        figures.hedges += hedges.started;
        figures.hedges_won += hedges.won;
    }
    figures.sends = provider.count_path(PATH);
    figures.ttft.sort();
    figures
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let requests = setting("REQUESTS", 1000) as usize;
    let concurrency = setting("CONCURRENCY", 100) as usize;
    let hedge_after = Duration::from_millis(setting("HEDGE_AFTER_MS", 500));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let three = NonZeroU32::new(3).expect("3");
    let plain = RecoveryPolicy::builder()
        .max_attempts(three)
        .build()
        .expect("a policy");
    let hedged = plain
        .to_builder()
        .hedge_after(Some(hedge_after))
        .build()
        .expect("a policy");
    let slow = delays(requests * 2)
        .iter()
        .filter(|d| **d == 10_000)
        .count();
    println!(
        "hedging: {requests} requests, {concurrency} at a time; first token after 50-250 ms, \
         10 s for {slow} of {} answers; hedge_after {}",
        requests * 2,
        ms(hedge_after)
    );
    println!(
        "{:<22} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>5}",
        "", "p50", "p90", "p99", "max", "sends", "hedges", "won"
    );
    let mut results = Vec::new();
    for (name, policy) in [("without hedging", plain), ("hedge_after", hedged)] {
        let f = runtime.block_on(run(policy, requests, concurrency));
        println!(
            "{:<22} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>5}",
            name,
            ms(quantile(&f.ttft, 0.5)),
            ms(quantile(&f.ttft, 0.9)),
            ms(quantile(&f.ttft, 0.99)),
            ms(*f.ttft.last().expect("a request")),
            f.sends,
            f.hedges,
            f.hedges_won
        );
        results.push(f);
    }
    let (a, b) = (&results[0], &results[1]);
    println!(
        "ratio hedged/plain: p50 {:.2}, p99 {:.3}; extra sends {} ({:.1} % of requests)",
        quantile(&b.ttft, 0.5).as_secs_f64() / quantile(&a.ttft, 0.5).as_secs_f64(),
        quantile(&b.ttft, 0.99).as_secs_f64() / quantile(&a.ttft, 0.99).as_secs_f64(),
        b.sends.saturating_sub(a.sends),
        100.0 * b.sends.saturating_sub(a.sends) as f64 / requests as f64
    );
}
