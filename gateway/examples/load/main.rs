//! Load figures for the gateway: what it adds to a stream's latency, how
//! many slow streams it holds at once, and the memory each one costs.
//!
//! ```sh
//! bash scripts/gateway-load.sh            # release build, default sizes
//! # or, by hand:
//! cargo build --release -p recovery-gateway --bin recovery-gateway --example load
//! target/release/examples/load [--streams 500] [--concurrency 64] [--held 1000]
//! target/release/examples/load --kept-alive-only   # phase 2b alone, for a profiler
//! target/release/examples/load --kept-alive-only --prompt-kb 540   # large prompts
//! ```
//!
//! The loopback fault provider runs in this process on a runtime of its own
//! thread; the gateway is the release binary next to this example
//! (`--gateway PATH` to point elsewhere), started on `127.0.0.1:0` with the
//! in-memory stream log. Every request is a fresh HTTP/1.1 connection from a
//! raw client, to the provider directly or through the gateway, so the
//! difference between the two is the gateway's share. Phases 1 and 2 also
//! run through a reverse proxy with nothing but hyper in it (the
//! `bare_proxy` example, `--bare PATH`): the floor of any proxy on the
//! machine, against which the gateway's own share is read; phase 3 holds
//! the same streams through it first.
//!
//! 1. Latency: `--streams` sequential chat streams of a fixed fixture
//!    (`openai-chat/happy-usage.sse`, 6 events, no delays): time to the
//!    first event and to `data: [DONE]`, direct and through the gateway.
//! 2. Throughput: the same streams from `--concurrency` clients at once,
//!    each stream on a fresh connection; then (2b) each client keeping one
//!    connection alive for all its streams, as an SDK's connection pool
//!    does.
//! 3. Held streams: `--held` streams that send their first token and then
//!    stall upstream, all open at once through the gateway; the gateway's
//!    resident memory (`VmRSS` of `/proc/<pid>/status`) before and while
//!    they are held gives the memory per stream. Then the provider releases
//!    them and every one must finish.
//! 4. The same through a second gateway whose upstream speaks HTTP/2
//!    (`http2 = true`, a loopback HTTP/2-only server): every upstream
//!    stream shares one connection (`h2.rs`). That gateway first serves 64
//!    held streams at once, as phases 1 and 2 warm the gateway of phase 3,
//!    and its memory from the idle start is printed as well.
//!
//! `--prompt-kb N` sends every request with a conversation of about N KB
//! (messages of ~500 bytes before `model`, as the SDKs write them) instead
//! of a one-line chat request: what a prompt costs the gateway, which
//! validates and reads it, against the bare proxy, which passes it on.
//!
//! Everything is bounded: every wait has a deadline, the run stops by
//! itself, and only loopback addresses are used.

mod h2;
#[path = "../../tests/support/listening.rs"]
mod listening;
#[path = "../shared/proc.rs"]
mod proc;
mod proxy;

use proc::{cpu_seconds, rss_kib};
use proxy::Proxy;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use recovery_tests::fault::{FaultProvider, Options, Script, ScriptSet, Write};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const FIXTURE: &str = "openai-chat/happy-usage.sse";
const FAST: &str = "/fast/v1/chat/completions";
const CHAT: &str = "/v1/chat/completions";
const HELD: &str = "/held/v1/chat/completions";
const SHORT_BODY: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
/// The request body of every stream: [`SHORT_BODY`], or with `--prompt-kb`
/// a conversation written before `model`, as the SDKs write it.
static BODY: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn body() -> &'static str {
    BODY.get().map_or(SHORT_BODY, String::as_str)
}

/// A chat body of about `kb` KB: messages of ~500 bytes (quotes and a
/// `\u` escape in each), `model` after them.
fn prompt_body(kb: usize) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(r#"{"messages":["#);
    let mut i = 0;
    while out.len() < kb * 1000 {
        if i > 0 {
            out.push(',');
        }
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let _ = write!(
            out,
            r#"{{"role":"{role}","content":"{} \"quoted\" \u00e9 turn {i}"}}"#,
            "lorem ipsum dolor sit amet ".repeat(18)
        );
        i += 1;
    }
    out.push_str(r#"],"model":"m","stream":true}"#);
    out
}
/// One stream may take this long at most.
const STREAM_LIMIT: Duration = Duration::from_secs(30);

struct Args {
    streams: usize,
    concurrency: usize,
    held: usize,
    gateway: PathBuf,
    /// The bare hyper proxy (`bare_proxy.rs`), the floor.
    bare: PathBuf,
    /// Phase 2b alone (for a profiler around the gateway).
    kept_alive_only: bool,
    /// Each request carries a conversation of about this many KB.
    prompt_kb: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/examples/load -> target/<profile>/recovery-gateway
    let default_gateway = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|dir| dir.join("recovery-gateway"))
        .ok_or("cannot locate the gateway binary; pass --gateway PATH")?;
    // target/<profile>/examples/load -> target/<profile>/examples/bare_proxy
    let default_bare = exe.with_file_name("bare_proxy");
    let mut args = Args {
        streams: 500,
        concurrency: 64,
        held: 1000,
        gateway: default_gateway,
        bare: default_bare,
        kept_alive_only: false,
        prompt_kb: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |text: String| -> Result<usize, String> {
            text.parse::<usize>()
                .ok()
                .filter(|n| (1..=20_000).contains(n))
                .ok_or_else(|| format!("{text:?} is not a number in 1..=20000"))
        };
        match flag.as_str() {
            "--streams" => args.streams = number(value()?)?,
            "--concurrency" => args.concurrency = number(value()?)?,
            "--held" => args.held = number(value()?)?,
            "--gateway" => args.gateway = PathBuf::from(value()?),
            "--bare" => args.bare = PathBuf::from(value()?),
            "--kept-alive-only" => args.kept_alive_only = true,
            "--prompt-kb" => args.prompt_kb = Some(number(value()?)?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

/// Byte offsets just past each event of the fixture.
fn event_ends(bytes: &[u8]) -> Vec<usize> {
    bytes
        .windows(2)
        .enumerate()
        .filter(|(_, w)| *w == b"\n\n")
        .map(|(i, _)| i + 2)
        .collect()
}

fn scripts() -> ScriptSet {
    let full = std::fs::read(recovery_tests::fault::default_fixtures_dir().join(FIXTURE))
        .expect("the fixture");
    // Role chunk and first token, then a stall until released, then the rest.
    let first_token = event_ends(&full)[1];
    let held = Script::ok()
        .header("content-type", "text/event-stream")
        .write(Write::fixture(FIXTURE).range(0, first_token))
        .write(Write {
            stall: true,
            ..Write::fixture(FIXTURE).range(first_token, full.len())
        });
    ScriptSet::new(vec![])
        .path(
            FAST,
            vec![
                Script::ok()
                    .header("content-type", "text/event-stream")
                    .write(Write::fixture(FIXTURE)),
            ],
        )
        .path(HELD, vec![held])
}

/// How one stream went, from the client's side.
#[derive(Debug, Clone, Copy)]
struct Timing {
    first_event: Duration,
    total: Duration,
}

/// Sends one streamed chat request to `addr` on a fresh connection and
/// reads until `[DONE]`. `on_token` is called once the first token
/// ("Hello") has arrived.
async fn stream(addr: &str, path: &str, on_token: impl FnOnce()) -> Result<Timing, String> {
    stream_on(None, addr, path, on_token).await
}

/// A client's connection, kept between its streams.
type Connection = Option<BufReader<TcpStream>>;

/// As [`stream`]; with a `keep` slot, on the connection it holds (a new one
/// when empty), asking for keep-alive and reading the answer to its chunked
/// end, after which the connection goes back into the slot for the next
/// stream.
async fn stream_on(
    keep: Option<&mut Connection>,
    addr: &str,
    path: &str,
    on_token: impl FnOnce(),
) -> Result<Timing, String> {
    let started = Instant::now();
    let keep_alive = keep.is_some();
    let connect = || async {
        TcpStream::connect(addr)
            .await
            .map(BufReader::new)
            .map_err(|e| format!("connect: {e}"))
    };
    let (mut reader, slot) = match keep {
        Some(slot) => match slot.take() {
            Some(reader) => (reader, Some(slot)),
            None => (connect().await?, Some(slot)),
        },
        None => (connect().await?, None),
    };
    let request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\naccept: text/event-stream\r\nconnection: {}\r\n\r\n{}",
        body().len(),
        if keep_alive { "keep-alive" } else { "close" },
        body()
    );
    reader
        .get_mut()
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut status = String::new();
    reader
        .read_line(&mut status)
        .await
        .map_err(|e| format!("head: {e}"))?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("status line {:?}", status.trim_end()));
    }
    let mut seen = Vec::with_capacity(4096);
    let mut first_event = None;
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
        seen.extend_from_slice(&buf[..n]);
        if first_event.is_none() && contains(&seen, b"data: ") {
            first_event = Some(started.elapsed());
        }
        if on_token.is_some()
            && contains(&seen, b"\"Hello\"")
            && let Some(f) = on_token.take()
        {
            f();
        }
        // A kept connection is reused only once its answer's chunked body
        // has ended.
        if contains(&seen, b"data: [DONE]") && (!keep_alive || seen.ends_with(b"\r\n0\r\n\r\n")) {
            if let Some(slot) = slot {
                *slot = Some(reader);
            }
            return Ok(Timing {
                first_event: first_event.unwrap_or_default(),
                total: started.elapsed(),
            });
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Percentiles of a set of durations, in ms.
struct Summary {
    p50: f64,
    p90: f64,
    p99: f64,
    mean: f64,
}

fn summary(mut samples: Vec<Duration>) -> Summary {
    samples.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: f64| ms(samples[((samples.len() - 1) as f64 * q).round() as usize]);
    Summary {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        mean: samples.iter().map(|d| ms(*d)).sum::<f64>() / samples.len() as f64,
    }
}

fn print_row(label: &str, s: &Summary) {
    println!(
        "  {label:<28} p50 {:>7.3} ms  p90 {:>7.3} ms  p99 {:>7.3} ms  mean {:>7.3} ms",
        s.p50, s.p90, s.p99, s.mean
    );
}

/// `n` sequential streams to `addr`.
async fn sequential(addr: &str, n: usize) -> Vec<Timing> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let timing = tokio::time::timeout(STREAM_LIMIT, stream(addr, FAST, || {}))
            .await
            .expect("a stream within its limit")
            .expect("a whole stream");
        out.push(timing);
    }
    out
}

/// `n` streams to `addr` from `clients` clients at once; streams per second.
/// With `keep_alive`, each client sends its streams over one connection.
async fn concurrent(addr: &str, n: usize, clients: usize, keep_alive: bool) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let next = Arc::clone(&next);
            let addr = addr.to_owned();
            tokio::spawn(async move {
                let mut kept: Connection = None;
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    let slot = keep_alive.then_some(&mut kept);
                    tokio::time::timeout(STREAM_LIMIT, stream_on(slot, &addr, FAST, || {}))
                        .await
                        .expect("a stream within its limit")
                        .expect("a whole stream");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("client task");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// `n` streams opened at once through `addr`, each held after its first
/// token by the upstream.
struct Holding {
    tasks: Vec<tokio::task::JoinHandle<Result<Timing, String>>>,
    /// Streams at their first token.
    held: usize,
    /// How long they took to get there.
    opened_in: Duration,
}

impl Holding {
    /// Opens the streams (in batches of 100, letting the accept queues
    /// drain) and waits, at most a minute, until each has its first token
    /// and allocations settled.
    async fn open(addr: &str, path: &'static str, n: usize) -> Holding {
        let ready = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = Vec::with_capacity(n);
        for i in 0..n {
            let ready = Arc::clone(&ready);
            let addr = addr.to_owned();
            tasks.push(tokio::spawn(async move {
                tokio::time::timeout(
                    Duration::from_mins(2),
                    stream(&addr, path, move || {
                        ready.fetch_add(1, Ordering::Relaxed);
                    }),
                )
                .await
                .map_err(|_| "timed out".to_owned())
                .and_then(|r| r)
            }));
            if i % 100 == 99 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let deadline = Instant::now() + Duration::from_mins(1);
        while ready.load(Ordering::Relaxed) < n && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let opened_in = started.elapsed();
        let held = ready.load(Ordering::Relaxed);
        // Let allocations settle before the caller samples memory.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Holding {
            tasks,
            held,
            opened_in,
        }
    }

    /// Once released: the streams that finished, and why the others did
    /// not.
    async fn finish(self) -> (usize, Vec<String>) {
        let mut finished = 0usize;
        let mut failures = Vec::new();
        for task in self.tasks {
            match task.await.expect("client task") {
                Ok(_) => finished += 1,
                Err(e) => failures.push(e),
            }
        }
        (finished, failures)
    }
}

fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!(
                "load: {e}\nusage: load [--streams N] [--concurrency N] [--held N] [--gateway PATH] [--bare PATH] [--kept-alive-only] [--prompt-kb N]"
            );
            return std::process::ExitCode::from(2);
        }
    };
    if let Some(kb) = args.prompt_kb {
        let _ = BODY.set(prompt_body(kb));
    }
    let provider = FaultProvider::start_dedicated(Options::new(scripts())).expect("fault provider");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(&args, &provider));
    std::process::ExitCode::SUCCESS
}

async fn run(args: &Args, provider: &FaultProvider) {
    let memory_log = ["--stream-log", "memory"];
    let gateway = Proxy::start(&args.gateway, &provider.base_url(), args.held, &memory_log).await;
    let bare = Proxy::start(&args.bare, &provider.base_url(), args.held, &[]).await;
    let (pid, gateway_addr) = (gateway.pid, gateway.addr.clone());
    let direct_addr = provider.addr().to_string();

    println!(
        "recovery-gateway load (pid {pid}, {})",
        args.gateway.display()
    );
    println!(
        "fixture {FIXTURE}; {} sequential streams, {} at {} concurrency, {} held",
        args.streams, args.streams, args.concurrency, args.held
    );
    let idle_rss = rss_kib(pid);

    // Warm up every path (connection pools, allocator).
    sequential(&direct_addr, 20).await;
    sequential(&gateway_addr, 20).await;
    sequential(&bare.addr, 20).await;

    if args.kept_alive_only {
        throughput(args, &direct_addr, &gateway_addr, pid, &bare, true).await;
        bare.stop().await;
        gateway.stop().await;
        return;
    }

    println!("\n1. latency per stream, sequential, fresh connection each");
    let direct = sequential(&direct_addr, args.streams).await;
    let through = sequential(&gateway_addr, args.streams).await;
    let floor = sequential(&bare.addr, args.streams).await;
    let d_first = summary(direct.iter().map(|t| t.first_event).collect());
    let g_first = summary(through.iter().map(|t| t.first_event).collect());
    let d_total = summary(direct.iter().map(|t| t.total).collect());
    let g_total = summary(through.iter().map(|t| t.total).collect());
    let b_total = summary(floor.iter().map(|t| t.total).collect());
    print_row("direct: first event", &d_first);
    print_row("gateway: first event", &g_first);
    print_row("direct: whole stream", &d_total);
    print_row("gateway: whole stream", &g_total);
    print_row("bare proxy: whole stream", &b_total);
    println!(
        "  added by the gateway: first event +{:.3} ms p50 (x{:.2}), whole stream +{:.3} ms p50 (x{:.2}), +{:.3} ms p99",
        g_first.p50 - d_first.p50,
        g_first.p50 / d_first.p50,
        g_total.p50 - d_total.p50,
        g_total.p50 / d_total.p50,
        g_total.p99 - d_total.p99,
    );
    println!(
        "  added by the bare hyper proxy: whole stream +{:.3} ms p50, +{:.3} ms p99",
        b_total.p50 - d_total.p50,
        b_total.p99 - d_total.p99,
    );

    for keep_alive in [false, true] {
        throughput(args, &direct_addr, &gateway_addr, pid, &bare, keep_alive).await;
    }

    println!(
        "\n3. {} slow streams held open at once through the gateway",
        args.held
    );
    // The floor first: the same streams held through the bare proxy, then
    // released (exactly as many stall points as are waiting).
    let bare_before = rss_kib(bare.pid);
    let holding = Holding::open(&bare.addr, HELD, args.held).await;
    let bare_held = holding.held;
    let bare_during = rss_kib(bare.pid);
    provider.release(bare_held);
    let (bare_finished, _) = holding.finish().await;
    bare.stop().await;
    println!(
        "  bare proxy: {bare_held} held, {bare_finished} finished; memory per held stream {:.1} KiB",
        bare_during.saturating_sub(bare_before) as f64 / bare_held.max(1) as f64
    );
    // Let the gateway settle and forget the finished streams of the runs above.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let holding = Holding::open(&gateway_addr, HELD, args.held).await;
    let (held_now, opened_in) = (holding.held, holding.opened_in);
    let during = rss_kib(pid);
    let upstream_open = provider.open_connections();
    provider.release_all();
    let (finished, failures) = holding.finish().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    println!(
        "  held at once: {held_now} of {} (first token on every one within {:.2} s); upstream connections open then: {upstream_open}",
        args.held,
        opened_in.as_secs_f64()
    );
    println!(
        "  gateway VmRSS: idle at start {idle_rss} KiB, before {before} KiB, while held {during} KiB, after release {after} KiB"
    );
    let per_stream = during.saturating_sub(before) as f64 / held_now.max(1) as f64;
    println!(
        "  memory per held stream: {per_stream:.1} KiB ({:.1} MiB for {held_now})",
        during.saturating_sub(before) as f64 / 1024.0
    );
    println!(
        "  finished after release: {finished} of {}{}",
        args.held,
        if failures.is_empty() {
            String::new()
        } else {
            format!(" (first failure: {})", failures[0])
        }
    );

    println!(
        "\ngateway exit after SIGTERM: {}",
        gateway
            .stop()
            .await
            .map_or_else(|| "did not exit in 20 s".to_owned(), |s| s.to_string())
    );
    assert!(
        held_now == args.held && finished == args.held,
        "every held stream must be held and then finish"
    );

    println!(
        "\n4. {} slow streams held open at once through a gateway with an HTTP/2 upstream",
        args.held
    );
    assert!(
        h2::held(&args.gateway, args.held).await,
        "every held stream over HTTP/2 must be held and then finish"
    );
}

/// Phase 2 (`keep_alive` false) or 2b: the same streams from
/// `--concurrency` clients, direct, through the gateway and through the
/// bare proxy, with the CPU each proxy spent.
async fn throughput(
    args: &Args,
    direct_addr: &str,
    gateway_addr: &str,
    pid: u32,
    bare: &Proxy,
    keep_alive: bool,
) {
    println!(
        "\n2{}. throughput, {} clients at once, {}",
        if keep_alive { "b" } else { "" },
        args.concurrency,
        if keep_alive {
            "each on one kept-alive connection (as an SDK's pool)"
        } else {
            "a fresh connection per stream"
        }
    );
    let direct_rate = concurrent(direct_addr, args.streams, args.concurrency, keep_alive).await;
    let cpu_before = cpu_seconds(pid);
    let gateway_rate = concurrent(gateway_addr, args.streams, args.concurrency, keep_alive).await;
    let cpu = cpu_seconds(pid) - cpu_before;
    let bare_before = cpu_seconds(bare.pid);
    let bare_rate = concurrent(&bare.addr, args.streams, args.concurrency, keep_alive).await;
    let bare_cpu = cpu_seconds(bare.pid) - bare_before;
    let per_1000 = |cpu: f64| cpu * 1000.0 / args.streams as f64;
    println!(
        "  direct {direct_rate:.0} streams/s, gateway {gateway_rate:.0} streams/s (x{:.2}), bare proxy {bare_rate:.0} streams/s (x{:.2})",
        gateway_rate / direct_rate,
        bare_rate / direct_rate
    );
    println!(
        "  gateway CPU: {cpu:.3} s for {} streams, {:.3} CPU-seconds per 1,000 streams; bare proxy {:.3} (gateway x{:.2})",
        args.streams,
        per_1000(cpu),
        per_1000(bare_cpu),
        cpu / bare_cpu.max(1e-9)
    );
}
