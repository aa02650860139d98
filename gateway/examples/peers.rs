//! The gateway beside its peers: the same loopback upstream and the same
//! load client against several targets (a direct connection, the gateway,
//! another proxy), in alternating rounds, with each figure also given as a
//! ratio to the first target.
//!
//! ```sh
//! bash scripts/gateway-peers.sh           # builds, starts every target, runs this
//! # or, by hand, with the targets already running:
//! target/release/examples/peers --print-script > script.json   # for fault-provider
//! target/release/examples/peers --upstream http://127.0.0.1:P \
//!     --target 'direct=http://127.0.0.1:P/{route}/v1/chat/completions' \
//!     --target 'gateway=http://127.0.0.1:G/{route}/v1/chat/completions' --pid gateway=PID \
//!     [--auth NAME=TOKEN] [--streams 300] [--throughput 1000] [--concurrency 64] \
//!     [--held 1000] [--rounds 5]
//! ```
//!
//! `{route}` in a target's URL becomes `fast` or `held`, and the request's
//! `model` is that same word, so a proxy that routes by model name (two
//! models whose `api_base` ends in `/fast/v1` and `/held/v1`) reaches the
//! same upstream paths as one that passes the path through.
//!
//! The upstream is the standalone fault provider (`fault-provider --script`
//! with the script `--print-script` writes): `/fast/...` answers the fixture
//! `openai-chat/happy-usage.sse` in one write, `/held/...` sends the role
//! chunk and the first token, then stalls until released over the
//! provider's `/__fault/` control endpoint.
//!
//! Every request is a fresh HTTP/1.1 connection from a raw client, and a
//! stream counts as done at the `data: [DONE]` line: a proxy may rewrite the
//! events (ids, fields, dropped usage), so bytes are not compared.
//!
//! Each round runs, target after target in the order given: `--streams /
//! --rounds` sequential streams (latency to the last byte), then
//! `--throughput / --rounds` streams from `--concurrency` clients (streams
//! per second, and the CPU time of the target's process tree, from
//! `/proc/<pid>/stat`). Alternating spreads the machine's drift over every
//! target alike. Last, for each target with a `--pid`, `--held` streams are
//! held open at once and the resident memory of its process tree is read
//! before and while they are held.
//!
//! Everything is bounded: every stream and every wait has a deadline, only
//! loopback addresses are accepted, and the run stops by itself.

#[path = "shared/proc.rs"]
mod proc;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use recovery_tests::fault::{Script, ScriptSet, Write};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use proc::{cpu_seconds, rss_kib};

const FIXTURE: &str = "openai-chat/happy-usage.sse";
const DONE: &[u8] = b"data: [DONE]";
/// One stream may take this long at most.
const STREAM_LIMIT: Duration = Duration::from_secs(30);
/// How long the held streams may take to all reach their first token.
const HOLD_LIMIT: Duration = Duration::from_mins(2);

const USAGE: &str = "usage: peers --target NAME=URL [--target NAME=URL ...] [--pid NAME=PID ...]\n\
    \x20            [--auth NAME=TOKEN ...] [--upstream URL] [--streams N] [--throughput N]\n\
    \x20            [--concurrency N] [--held N] [--rounds N] [--warmup N]\n\
    \x20      peers --print-script\n\
    \nThe first target is the baseline of the ratios. {route} in a URL becomes fast or held.";

/// One thing to measure.
struct Target {
    name: String,
    /// `host:port`, loopback only.
    addr: String,
    /// The request path, with `{route}` still in it.
    path: String,
    pid: Option<u32>,
    /// Sent as `authorization: Bearer <token>`.
    token: Option<String>,
}

struct Args {
    targets: Vec<Target>,
    /// The fault provider's base URL, for its control endpoint (held streams).
    upstream: Option<String>,
    streams: usize,
    throughput: usize,
    concurrency: usize,
    held: usize,
    rounds: usize,
    warmup: usize,
}

/// `http://host:port/path` into `(host:port, /path)`, loopback hosts only.
fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url:?}: only http:// URLs"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
        return Err(format!("{url:?}: loopback addresses only"));
    }
    if !authority.contains(':') {
        return Err(format!("{url:?}: give the port"));
    }
    Ok((authority.to_owned(), format!("/{path}")))
}

fn parse_args(raw: Vec<String>) -> Result<Args, String> {
    let mut args = Args {
        targets: Vec::new(),
        upstream: None,
        streams: 300,
        throughput: 1000,
        concurrency: 64,
        held: 1000,
        rounds: 5,
        warmup: 20,
    };
    let mut pids = Vec::new();
    let mut tokens = Vec::new();
    let mut it = raw.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |text: String| -> Result<usize, String> {
            text.parse::<usize>()
                .ok()
                .filter(|n| (1..=20_000).contains(n))
                .ok_or_else(|| format!("{text:?} is not a number in 1..=20000"))
        };
        let pair = |text: String| -> Result<(String, String), String> {
            text.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| format!("{text:?} is not NAME=VALUE"))
        };
        match flag.as_str() {
            "--target" => {
                let (name, url) = pair(value()?)?;
                let (addr, path) = split_url(&url)?;
                args.targets.push(Target {
                    name,
                    addr,
                    path,
                    pid: None,
                    token: None,
                });
            }
            "--pid" => {
                let (name, pid) = pair(value()?)?;
                let pid = pid.parse::<u32>().map_err(|_| format!("bad pid {pid:?}"))?;
                pids.push((name, pid));
            }
            "--auth" => tokens.push(pair(value()?)?),
            "--upstream" => {
                let url = value()?;
                split_url(&url)?;
                args.upstream = Some(url.trim_end_matches('/').to_owned());
            }
            "--streams" => args.streams = number(value()?)?,
            "--throughput" => args.throughput = number(value()?)?,
            "--concurrency" => args.concurrency = number(value()?)?,
            "--held" => args.held = number(value()?)?,
            "--rounds" => args.rounds = number(value()?)?,
            "--warmup" => args.warmup = number(value()?)?,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.targets.is_empty() {
        return Err("give at least one --target".to_owned());
    }
    let find = |targets: &mut [Target], name: &str| {
        targets
            .iter_mut()
            .position(|t| t.name == name)
            .ok_or_else(|| format!("no target named {name:?}"))
    };
    for (name, pid) in pids {
        let i = find(&mut args.targets, &name)?;
        args.targets[i].pid = Some(pid);
    }
    for (name, token) in tokens {
        let i = find(&mut args.targets, &name)?;
        args.targets[i].token = Some(token);
    }
    Ok(args)
}

/// The upstream's scripts, as JSON for `fault-provider --script`.
fn script_json() -> String {
    let full = std::fs::read(recovery_tests::fault::default_fixtures_dir().join(FIXTURE))
        .expect("the fixture");
    // Just past the second event: the role chunk and the first token.
    let first_token = full
        .windows(2)
        .enumerate()
        .filter(|(_, w)| *w == b"\n\n")
        .map(|(i, _)| i + 2)
        .nth(1)
        .expect("two events in the fixture");
    let fast = Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::fixture(FIXTURE));
    let held = Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::fixture(FIXTURE).range(0, first_token))
        .write(Write {
            stall: true,
            ..Write::fixture(FIXTURE).range(first_token, full.len())
        });
    let set = ScriptSet::new(vec![])
        .path("/fast/v1/chat/completions", vec![fast])
        .path("/held/v1/chat/completions", vec![held]);
    serde_json::to_string_pretty(&set).expect("the script set as JSON")
}

/// Sends one streamed chat request and reads until `data: [DONE]`; returns
/// the time from connecting to that line. `on_token` is called once the
/// first token ("Hello") has arrived.
async fn stream(target: &Target, route: &str, on_token: impl FnOnce()) -> Result<Duration, String> {
    let started = Instant::now();
    let path = target.path.replace("{route}", route);
    let body = format!(
        r#"{{"model":"{route}","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    let auth = target
        .token
        .as_ref()
        .map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n{auth}\
         content-length: {}\r\naccept: text/event-stream\r\nconnection: close\r\n\r\n{body}",
        target.addr,
        body.len()
    );
    let mut socket = TcpStream::connect(&target.addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    socket
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut reader = BufReader::new(socket);
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .await
        .map_err(|e| format!("head: {e}"))?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("status line {:?}", status.trim_end()));
    }
    let mut seen = Vec::with_capacity(4096);
    let mut on_token = Some(on_token);
    let mut buf = [0u8; 4096];
    loop {
        let n = reader
            .read(&mut buf)
            .await
            .map_err(|e| format!("body: {e}"))?;
        if n == 0 {
            return Err("the stream ended before [DONE]".to_owned());
        }
        // Search only what is new, plus a needle's length of overlap.
        let from = seen.len().saturating_sub(DONE.len());
        seen.extend_from_slice(&buf[..n]);
        if on_token.is_some()
            && contains(&seen, b"\"Hello\"")
            && let Some(f) = on_token.take()
        {
            f();
        }
        if contains(&seen[from..], DONE) {
            return Ok(started.elapsed());
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

async fn bounded_stream(target: &Target, route: &str) -> Result<Duration, String> {
    tokio::time::timeout(STREAM_LIMIT, stream(target, route, || {}))
        .await
        .map_err(|_| "timed out".to_owned())
        .and_then(|r| r)
}

/// What the rounds gathered for one target.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    throughput_streams: usize,
    throughput_time: Duration,
    /// CPU-seconds of the process tree over the throughput runs.
    cpu: f64,
    failures: usize,
    first_failure: Option<String>,
}

impl Tally {
    fn fail(&mut self, error: String) {
        self.failures += 1;
        self.first_failure.get_or_insert(error);
    }
}

/// `n` streams from `clients` clients at once: how many finished, how long
/// it took, and the failures.
async fn concurrent(
    target: &Arc<Target>,
    n: usize,
    clients: usize,
) -> (usize, Duration, Vec<String>) {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients.min(n))
        .map(|_| {
            let next = Arc::clone(&next);
            let target = Arc::clone(target);
            tokio::spawn(async move {
                let mut ok = 0usize;
                let mut errors = Vec::new();
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    match bounded_stream(&target, "fast").await {
                        Ok(_) => ok += 1,
                        Err(e) => errors.push(e),
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    let mut ok = 0;
    let mut errors = Vec::new();
    for task in tasks {
        let (n, mut e) = task.await.expect("client task");
        ok += n;
        errors.append(&mut e);
    }
    (ok, started.elapsed(), errors)
}

/// A bodiless POST to the fault provider's control endpoint.
async fn control(upstream: &str, route: &str) -> Result<(), String> {
    let (addr, base) = split_url(upstream)?;
    let path = format!("{}/__fault/{route}", base.trim_end_matches('/'));
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    let exchange = async {
        let mut socket = TcpStream::connect(&addr).await?;
        socket.write_all(request.as_bytes()).await?;
        let mut reply = Vec::new();
        socket.read_to_end(&mut reply).await?;
        Ok::<_, std::io::Error>(reply)
    };
    let reply = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| format!("{path}: timed out"))?
        .map_err(|e| format!("{path}: {e}"))?;
    if reply.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("{path}: {}", String::from_utf8_lossy(&reply)))
    }
}

/// What holding `--held` streams through one target showed.
struct Holding {
    held: usize,
    finished: usize,
    before_kib: u64,
    during_kib: u64,
    opened_in: Duration,
    first_failure: Option<String>,
}

async fn hold(target: &Arc<Target>, pid: u32, upstream: &str, n: usize) -> Result<Holding, String> {
    // A fresh gate: no permits left over from anything before.
    control(upstream, "reset").await?;
    // Let the target settle and forget the finished streams before it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before_kib = rss_kib(pid);
    let ready = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let ready = Arc::clone(&ready);
        let target = Arc::clone(target);
        tasks.push(tokio::spawn(async move {
            tokio::time::timeout(
                HOLD_LIMIT + STREAM_LIMIT,
                stream(&target, "held", move || {
                    ready.fetch_add(1, Ordering::Relaxed);
                }),
            )
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r)
        }));
        if i % 100 == 99 {
            // Let the accept queues drain between batches.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let deadline = Instant::now() + HOLD_LIMIT;
    while ready.load(Ordering::Relaxed) < n
        && Instant::now() < deadline
        && !tasks.iter().all(tokio::task::JoinHandle::is_finished)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened_in = started.elapsed();
    let held = ready.load(Ordering::Relaxed);
    // Let allocations settle before sampling.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during_kib = rss_kib(pid);
    let released = control(upstream, "release?all").await;
    let mut finished = 0;
    let mut first_failure = released.err();
    for task in tasks {
        match task.await.expect("client task") {
            Ok(_) => finished += 1,
            Err(e) => {
                first_failure.get_or_insert(e);
            }
        }
    }
    control(upstream, "reset").await?;
    Ok(Holding {
        held,
        finished,
        before_kib,
        during_kib,
        opened_in,
        first_failure,
    })
}

/// A ratio with two significant figures at least, so a small one is not 0.00.
fn ratio(x: f64) -> String {
    if x >= 10.0 {
        format!("x{x:.0}")
    } else if x >= 0.1 {
        format!("x{x:.2}")
    } else {
        format!("x{x:.3}")
    }
}

/// The sample at quantile `q` of sorted durations, in ms.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0
}

fn main() -> std::process::ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.iter().any(|a| a == "--print-script") {
        println!("{}", script_json());
        return std::process::ExitCode::SUCCESS;
    }
    let args = match parse_args(raw) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("peers: {e}\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if runtime.block_on(run(args)) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// Runs every round and prints the figures; false when a stream failed.
async fn run(args: Args) -> bool {
    let targets: Vec<Arc<Target>> = args.targets.into_iter().map(Arc::new).collect();
    let mut tallies: Vec<Tally> = targets.iter().map(|_| Tally::default()).collect();
    println!(
        "targets: {}",
        targets
            .iter()
            .map(|t| match t.pid {
                Some(pid) => format!("{} (http://{}{}, pid {pid})", t.name, t.addr, t.path),
                None => format!("{} (http://{}{})", t.name, t.addr, t.path),
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "fixture {FIXTURE}; {} rounds of: {} sequential streams, then {} streams from {} clients, per target; then {} held",
        args.rounds,
        args.streams.div_ceil(args.rounds),
        args.throughput.div_ceil(args.rounds),
        args.concurrency,
        args.held,
    );

    // Warm every path (pools, allocators, a proxy's first-request setup).
    for (target, tally) in targets.iter().zip(&mut tallies) {
        for _ in 0..args.warmup {
            if let Err(e) = bounded_stream(target, "fast").await {
                tally.fail(format!("warm-up: {e}"));
            }
        }
    }

    for round in 0..args.rounds {
        let share = |total: usize| total / args.rounds + usize::from(round < total % args.rounds);
        let started = Instant::now();
        for (target, tally) in targets.iter().zip(&mut tallies) {
            for _ in 0..share(args.streams) {
                match bounded_stream(target, "fast").await {
                    Ok(d) => tally.latencies.push(d),
                    Err(e) => tally.fail(e),
                }
            }
        }
        for (target, tally) in targets.iter().zip(&mut tallies) {
            let cpu_before = target.pid.map(cpu_seconds);
            let (ok, took, errors) =
                concurrent(target, share(args.throughput), args.concurrency).await;
            if let (Some(pid), Some(before)) = (target.pid, cpu_before) {
                tally.cpu += cpu_seconds(pid) - before;
            }
            tally.throughput_streams += ok;
            tally.throughput_time += took;
            for e in errors {
                tally.fail(e);
            }
        }
        println!(
            "round {} of {} done in {:.1} s",
            round + 1,
            args.rounds,
            started.elapsed().as_secs_f64()
        );
    }

    let mut held = Vec::new();
    for target in &targets {
        let result = match (target.pid, &args.upstream) {
            (Some(pid), Some(upstream)) => Some(hold(target, pid, upstream, args.held).await),
            _ => None,
        };
        held.push(result);
    }

    // The table: one column per target, ratios to the first.
    let base = 0;
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let p = |tally: &Tally, q: f64| {
        let mut sorted = tally.latencies.clone();
        sorted.sort_unstable();
        quantile_ms(&sorted, q)
    };
    let rate =
        |tally: &Tally| tally.throughput_streams as f64 / tally.throughput_time.as_secs_f64();
    let base_p50 = p(&tallies[base], 0.50);
    let base_p99 = p(&tallies[base], 0.99);
    let base_rate = rate(&tallies[base]);
    let column = |f: &dyn Fn(usize, &Tally) -> String| -> Vec<String> {
        tallies.iter().enumerate().map(|(i, t)| f(i, t)).collect()
    };
    for (q, name, base_q) in [(0.50, "p50", base_p50), (0.99, "p99", base_p99)] {
        rows.push((
            format!("last byte, {name} (1 client)"),
            column(&|_, t| format!("{:.3} ms", p(t, q))),
        ));
        rows.push((
            format!("  added to the first, {name}"),
            column(&|i, t| {
                if i == base {
                    "-".into()
                } else {
                    format!("{:+.3} ms ({})", p(t, q) - base_q, ratio(p(t, q) / base_q))
                }
            }),
        ));
    }
    rows.push((
        format!("streams/s, {} clients", args.concurrency),
        column(&|i, t| {
            if i == base {
                format!("{:.0}", rate(t))
            } else {
                format!("{:.0} ({})", rate(t), ratio(rate(t) / base_rate))
            }
        }),
    ));
    rows.push((
        "CPU-s per 1,000 streams".into(),
        column(&|i, t| match targets[i].pid {
            Some(_) => format!("{:.2}", t.cpu * 1000.0 / t.throughput_streams.max(1) as f64),
            None => "-".into(),
        }),
    ));
    rows.push((
        format!("RSS per held stream ({} held)", args.held),
        held.iter()
            .map(|h| match h {
                Some(Ok(h)) if h.held > 0 => format!(
                    "{:.1} KiB",
                    h.during_kib.saturating_sub(h.before_kib) as f64 / h.held as f64
                ),
                Some(Ok(_)) => "none held".into(),
                Some(Err(e)) => format!("error: {e}"),
                None => "-".into(),
            })
            .collect(),
    ));
    rows.push((
        "streams failed".into(),
        column(&|_, t| t.failures.to_string()),
    ));

    let label_width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..targets.len())
        .map(|i| {
            rows.iter()
                .map(|(_, cells)| cells[i].len())
                .chain([targets[i].name.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    println!();
    print!("{:<label_width$}", "");
    for (target, width) in targets.iter().zip(&widths) {
        print!("  {:>width$}", target.name);
    }
    println!();
    for (label, cells) in &rows {
        print!("{label:<label_width$}");
        for (cell, width) in cells.iter().zip(&widths) {
            print!("  {cell:>width$}");
        }
        println!();
    }

    println!();
    let mut all_good = true;
    for ((target, tally), h) in targets.iter().zip(&tallies).zip(&held) {
        println!(
            "{}: {} latency samples, {} throughput streams in {:.2} s{}",
            target.name,
            tally.latencies.len(),
            tally.throughput_streams,
            tally.throughput_time.as_secs_f64(),
            match &tally.first_failure {
                Some(e) => format!(", {} failed (first: {e})", tally.failures),
                None => String::new(),
            }
        );
        all_good &= tally.failures == 0;
        if let Some(Ok(h)) = h {
            println!(
                "  held {} of {} (first token on each within {:.2} s), VmRSS before {} KiB, while held {} KiB, finished after release {}{}",
                h.held,
                args.held,
                h.opened_in.as_secs_f64(),
                h.before_kib,
                h.during_kib,
                h.finished,
                match &h.first_failure {
                    Some(e) => format!(" (first failure: {e})"),
                    None => String::new(),
                }
            );
            all_good &= h.held == args.held && h.finished == args.held;
        } else if let Some(Err(e)) = h {
            println!("  held streams: {e}");
            all_good = false;
        }
    }
    all_good
}
