//! CPU and wall overhead of `ObserveLayer` + `RecoveryLayer` over a bare
//! hyper-util client, on a loopback stream of 100k OpenAI-style SSE events,
//! one HTTP chunk per event (as providers flush them).
//!
//! The server runs on its own thread in this process; the client runs on a
//! current-thread runtime in the measuring thread. Two CPU figures are
//! printed: the process CPU time (client, server and the kernel's socket
//! copies: the whole loopback exchange, the figure the target is stated in)
//! and the client thread's CPU time alone (the strictest view: hyper's own
//! client work is tiny, so any decoding shows as a large ratio). Trials are
//! interleaved (bare, layered, bare, ...) so drift affects both alike; the
//! figures are medians.
//!
//! Two calibration wrappers run in the same trials, to place the figures on
//! a scale: a pass-through body wrapper (the floor of any body middleware)
//! and a wrapper that splits the events and decodes every payload with
//! `serde_json` into a `Value` (what a naive observer costs).
//!
//! The default policy bounds a stalled body (idle and progress timeouts),
//! so the layered client keeps one tokio timer while it reads, and tokio's
//! scheduler does more on every park while any timer exists. Two more
//! configurations separate that cost from the layers' own: the bare client
//! with one tokio timer over its read, and the layers with the timeouts
//! off.
//!
//! Run: `cargo bench -p tower-recovery --bench overhead` (`OVERHEAD_TRIALS=n`
//! for another number of trials than 15).

use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cpu_time::{ProcessTime, ThreadTime};
use http::Request;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::{Layer, ServiceExt};
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody};

const EVENTS: usize = 100_000;

fn corpus() -> Bytes {
    let mut out = Vec::with_capacity(EVENTS * 280);
    out.extend_from_slice(
        b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-bench\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
    );
    for i in 0..EVENTS {
        write!(
            out,
            "data: {{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-bench\",\"system_fingerprint\":\"fp_bench\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" token{i:06} with some text\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )
        .unwrap();
    }
    out.extend_from_slice(
        b"data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"gpt-bench\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    );
    Bytes::from(out)
}

/// The response bytes: head, then one HTTP chunk per SSE event, as streaming
/// LLM servers flush each event as it is produced. Built once, so the server
/// thread only writes.
fn response(body: &[u8]) -> Bytes {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    let mut out = Vec::with_capacity(body.len() + body.len() / 8);
    out.extend_from_slice(head.as_bytes());
    let mut rest = body;
    while !rest.is_empty() {
        let end = rest
            .windows(2)
            .position(|w| w == b"\n\n")
            .map_or(rest.len(), |i| i + 2);
        let (event, tail) = rest.split_at(end);
        write!(out, "{:x}\r\n", event.len()).unwrap();
        out.extend_from_slice(event);
        out.extend_from_slice(b"\r\n");
        rest = tail;
    }
    out.extend_from_slice(b"0\r\n\r\n");
    Bytes::from(out)
}

/// A loopback server answering every connection with `response`.
fn serve(response: Bytes) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let (mut sock, _) = listener.accept().await.unwrap();
                let response = response.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        let n = sock.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        seen.extend_from_slice(&buf[..n]);
                    }
                    // Written in 16 KiB pieces: the kernel coalesces, the
                    // client still decodes one HTTP chunk per event.
                    for piece in response.chunks(16 * 1024) {
                        if sock.write_all(piece).await.is_err() {
                            return;
                        }
                    }
                    let _ = sock.shutdown().await;
                });
            }
        });
    });
    rx.recv().unwrap()
}

/// Reads a body to its end; the number of data bytes.
async fn drain<B>(mut body: B) -> usize
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut n = 0;
    while let Some(frame) = body.frame().await {
        n += frame.unwrap().data_ref().map_or(0, Bytes::len);
    }
    n
}

/// The streamed response of a bare hyper-util client.
async fn bare_response(url: &str) -> http::Response<hyper::body::Incoming> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    client
        .request(Request::post(url).body(Empty::new()).unwrap())
        .await
        .unwrap()
}

async fn bare(url: &str) -> usize {
    drain(bare_response(url).await.into_body()).await
}

/// The bare client with one tokio timer in the runtime while it reads (a
/// deadline on the whole read): what any timeout costs tokio's scheduler,
/// whoever sets it.
async fn bare_timed(url: &str) -> usize {
    tokio::time::timeout(Duration::from_mins(10), bare(url))
        .await
        .unwrap()
}

async fn layered(url: &str) -> usize {
    layered_with(url, RecoveryPolicy::default()).await
}

/// The layers with the head, idle and progress timeouts off: no timer.
async fn layered_untimed(url: &str) -> usize {
    let policy = RecoveryPolicy::builder()
        .head_timeout(None)
        .idle_timeout(None)
        .progress_timeout(None)
        .build()
        .unwrap();
    layered_with(url, policy).await
}

async fn layered_with(url: &str, policy: RecoveryPolicy) -> usize {
    let client: Client<HttpConnector, ReplayBody> =
        Client::builder(TokioExecutor::new()).build_http();
    let svc =
        RecoveryLayer::new(policy).layer(ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client));
    let resp = svc
        .oneshot(Request::post(url).body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    drain(resp.into_body()).await
}

/// `ObserveLayer` alone: the decoding cost without the recovery body.
async fn observed(url: &str) -> usize {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let svc = ObserveLayer::new(ProtocolKind::OpenAiChat).layer(client);
    let resp = svc
        .oneshot(Request::post(url).body(Empty::<Bytes>::new()).unwrap())
        .await
        .unwrap();
    drain(resp.into_body()).await
}

pin_project_lite::pin_project! {
    /// A calibration body wrapper: forwards every frame; with `decode`, also
    /// splits the SSE events and decodes each payload with `serde_json`.
    struct Calibration<B> {
        #[pin]
        inner: B,
        decode: bool,
        carry: Vec<u8>,
        decoded: u64,
    }
}

impl<B: Body<Data = Bytes>> Body for Calibration<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        if let (true, Some(Ok(frame))) = (*this.decode, &polled)
            && let Some(data) = frame.data_ref()
        {
            this.carry.extend_from_slice(data);
            let mut start = 0;
            while let Some(end) = memchr::memmem::find(&this.carry[start..], b"\n\n") {
                let event = &this.carry[start..start + end];
                if let Some(payload) = event.strip_prefix(b"data: ")
                    && payload != b"[DONE]"
                {
                    let value: serde_json::Value =
                        serde_json::from_slice(payload).expect("the corpus is valid JSON");
                    *this.decoded += u64::from(value.is_object());
                }
                start += end + 2;
            }
            this.carry.drain(..start);
        }
        Poll::Ready(polled)
    }
}

/// The bare client's body behind a calibration wrapper.
async fn calibrated(url: &str, decode: bool) -> usize {
    let resp = bare_response(url).await;
    let mut body = Calibration {
        inner: resp.into_body(),
        decode,
        carry: Vec::new(),
        decoded: 0,
    };
    let n = drain(&mut body).await;
    assert!(
        !decode || body.decoded as usize > EVENTS,
        "every event decoded"
    );
    n
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let body = corpus();
    let expected = body.len();
    let addr = serve(response(&body));
    let url = format!("http://{addr}/v1/chat/completions");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // For profilers: `OVERHEAD_ONLY=bare|bare-timed|observed|layered|untimed|passthrough|serde`
    // runs one client
    // `OVERHEAD_RUNS` times (default 20) and prints nothing else.
    if let Ok(only) = std::env::var("OVERHEAD_ONLY") {
        let runs = std::env::var("OVERHEAD_RUNS").map_or(20, |r| r.parse().unwrap_or(20));
        for _ in 0..runs {
            let n = match only.as_str() {
                "bare" => rt.block_on(bare(&url)),
                "bare-timed" => rt.block_on(bare_timed(&url)),
                "untimed" => rt.block_on(layered_untimed(&url)),
                "observed" => rt.block_on(observed(&url)),
                "passthrough" => rt.block_on(calibrated(&url, false)),
                "serde" => rt.block_on(calibrated(&url, true)),
                _ => rt.block_on(layered(&url)),
            };
            assert_eq!(n, expected);
        }
        return;
    }
    let (mut bare_cpu, mut bare_wall, mut layer_cpu, mut layer_wall) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut bare_proc, mut layer_proc) = (Vec::new(), Vec::new());
    let (mut observe_proc, mut pass_proc, mut serde_proc) = (Vec::new(), Vec::new(), Vec::new());
    let (mut timed_proc, mut untimed_proc) = (Vec::new(), Vec::new());
    let trials: usize = std::env::var("OVERHEAD_TRIALS").map_or(15, |t| t.parse().unwrap_or(15));
    // One warm-up of each, then interleaved trials.
    assert_eq!(rt.block_on(bare(&url)), expected);
    assert_eq!(rt.block_on(layered(&url)), expected);
    for trial in 0..trials {
        // Bare and layered swap places every other trial, so that neither
        // always runs right after the heavy serde_json wrapper.
        for layered_turn in [trial % 2 == 1, trial % 2 == 0] {
            let (p, c, w) = (ProcessTime::now(), ThreadTime::now(), Instant::now());
            if layered_turn {
                assert_eq!(rt.block_on(layered(&url)), expected);
                layer_cpu.push(c.elapsed());
                layer_wall.push(w.elapsed());
                layer_proc.push(p.elapsed());
            } else {
                assert_eq!(rt.block_on(bare(&url)), expected);
                bare_cpu.push(c.elapsed());
                bare_wall.push(w.elapsed());
                bare_proc.push(p.elapsed());
            }
        }
        let p = ProcessTime::now();
        assert_eq!(rt.block_on(bare_timed(&url)), expected);
        timed_proc.push(p.elapsed());
        let p = ProcessTime::now();
        assert_eq!(rt.block_on(layered_untimed(&url)), expected);
        untimed_proc.push(p.elapsed());
        let p = ProcessTime::now();
        assert_eq!(rt.block_on(observed(&url)), expected);
        observe_proc.push(p.elapsed());
        let p = ProcessTime::now();
        assert_eq!(rt.block_on(calibrated(&url, false)), expected);
        pass_proc.push(p.elapsed());
        let p = ProcessTime::now();
        assert_eq!(rt.block_on(calibrated(&url, true)), expected);
        serde_proc.push(p.elapsed());
    }
    let (bare_proc_all, layer_proc_all) = (bare_proc.clone(), layer_proc.clone());
    let (bare_cpu_all, layer_cpu_all) = (bare_cpu.clone(), layer_cpu.clone());
    let (bare_wall_all, layer_wall_all) = (bare_wall.clone(), layer_wall.clone());
    let (bp, lp, op) = (median(bare_proc), median(layer_proc), median(observe_proc));
    let (bc, bw, lc, lw) = (
        median(bare_cpu),
        median(bare_wall),
        median(layer_cpu),
        median(layer_wall),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mb = expected as f64 / 1e6;
    println!("overhead: {EVENTS} events, {mb:.1} MB, {trials} interleaved trials, medians");
    println!(
        "  bare hyper client:          process cpu {:>7.1} ms  client cpu {:>7.1} ms  wall {:>7.1} ms",
        ms(bp),
        ms(bc),
        ms(bw)
    );
    println!(
        "  Observe + Recovery layers:  process cpu {:>7.1} ms  client cpu {:>7.1} ms  wall {:>7.1} ms",
        ms(lp),
        ms(lc),
        ms(lw)
    );
    println!(
        "  ObserveLayer alone:         process cpu {:>7.1} ms  (ratio {:.3})",
        ms(op),
        op.as_secs_f64() / bp.as_secs_f64()
    );
    let (pp, sp) = (median(pass_proc), median(serde_proc));
    println!(
        "  calibration: pass-through wrapper process cpu {:>7.1} ms (ratio {:.3}), serde_json wrapper {:>7.1} ms (ratio {:.3})",
        ms(pp),
        pp.as_secs_f64() / bp.as_secs_f64(),
        ms(sp),
        sp.as_secs_f64() / bp.as_secs_f64()
    );
    println!(
        "  ratio of medians:           process cpu {:.3}   client cpu {:.3}   wall {:.3}",
        lp.as_secs_f64() / bp.as_secs_f64(),
        lc.as_secs_f64() / bc.as_secs_f64(),
        lw.as_secs_f64() / bw.as_secs_f64()
    );
    // Each trial's own ratio: a burst of load on the shared machine lands
    // on one trial's pair rather than on one side of the comparison.
    let paired = |layer: &[Duration], bare: &[Duration]| {
        let mut r: Vec<f64> = layer
            .iter()
            .zip(bare)
            .map(|(l, b)| l.as_secs_f64() / b.as_secs_f64())
            .collect();
        r.sort_by(f64::total_cmp);
        (r[r.len() / 2], r[0], r[r.len() - 1])
    };
    let (timed, t_lo, t_hi) = paired(&layer_proc_all, &timed_proc);
    let (untimed, u_lo, u_hi) = paired(&untimed_proc, &bare_proc_all);
    let (bt, _, _) = paired(&timed_proc, &bare_proc_all);
    println!(
        "  bare + one tokio timer:     ratio to bare {bt:.3} (the scheduler's cost of any timer)"
    );
    println!(
        "  layered / (bare + timer):   process cpu {timed:.3} (trials {t_lo:.3}..{t_hi:.3})   like for like: both bound the read"
    );
    println!(
        "  layered, timeouts off / bare: process cpu {untimed:.3} (trials {u_lo:.3}..{u_hi:.3})   no timer on either side"
    );
    let (p, p_lo, p_hi) = paired(&layer_proc_all, &bare_proc_all);
    let (c, _, _) = paired(&layer_cpu_all, &bare_cpu_all);
    let (w, _, _) = paired(&layer_wall_all, &bare_wall_all);
    println!(
        "  ratio layered/bare:         process cpu {p:.3} (trials {p_lo:.3}..{p_hi:.3})   client cpu {c:.3}   wall {w:.3}   (median of per-trial ratios; target: process cpu <= 1.10)"
    );
}
