//! Decoder throughput: our observer (framing + semantic classification +
//! terminal detection) against a memchr line scan, the `sse-stream` crate
//! (framing only) and a typed borrowing `serde_json` decode per event, on
//! ~8 MiB generated corpora read in 64 B, 1 KiB and 16 KiB pieces.
//!
//! Run: `cargo bench -p recovery-core --bench decode`. Criterion prints its
//! own figures; a summary table with MB/s and ratios follows.
#![allow(missing_docs)]

use std::borrow::Cow;
use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::Stream;
use recovery_core::observer::StreamObserver;
use recovery_core::protocol::ProtocolKind;
use serde::Deserialize;

const TARGET: usize = 8 << 20;
const READS: [usize; 3] = [64, 1024, 16 * 1024];

fn words(i: usize) -> &'static str {
    const W: [&str; 8] = [
        " the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog.",
    ];
    W[i % W.len()]
}

fn openai_corpus() -> Vec<u8> {
    let mut out = Vec::with_capacity(TARGET + 4096);
    out.extend_from_slice(b"data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_b376dfbbd5\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\",\"refusal\":null},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null,\"obfuscation\":\"Ab1\"}\n\n");
    let mut i = 0;
    while out.len() < TARGET {
        out.extend_from_slice(format!("data: {{\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"service_tier\":\"default\",\"system_fingerprint\":\"fp_b376dfbbd5\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\"logprobs\":null,\"finish_reason\":null}}],\"usage\":null,\"obfuscation\":\"x7Qp2\"}}\n\n", words(i)).as_bytes());
        i += 1;
    }
    out.extend_from_slice(b"data: {\"id\":\"chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT\",\"object\":\"chat.completion.chunk\",\"created\":1741569952,\"model\":\"gpt-4.1-2025-04-14\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\ndata: [DONE]\n\n");
    out
}

fn anthropic_corpus() -> Vec<u8> {
    let mut out = Vec::with_capacity(TARGET + 4096);
    out.extend_from_slice(b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01XFDUDYJgAACzvnptvVoYEL\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude-sonnet-4-5\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
    let mut i = 0;
    while out.len() < TARGET {
        out.extend_from_slice(format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}\n\n", words(i)).as_bytes());
        if i % 64 == 0 {
            out.extend_from_slice(b"event: ping\ndata: {\"type\": \"ping\"}\n\n");
        }
        i += 1;
    }
    out.extend_from_slice(b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    out
}

fn ollama_corpus() -> Vec<u8> {
    let mut out = Vec::with_capacity(TARGET + 4096);
    let mut i = 0;
    while out.len() < TARGET {
        out.extend_from_slice(format!("{{\"model\":\"llama3.2\",\"created_at\":\"2026-01-01T00:00:00.123456789Z\",\"message\":{{\"role\":\"assistant\",\"content\":\"{}\"}},\"done\":false}}\n", words(i)).as_bytes());
        i += 1;
    }
    out.extend_from_slice(b"{\"model\":\"llama3.2\",\"created_at\":\"2026-01-01T00:00:01Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":512000000,\"load_duration\":1000000,\"prompt_eval_count\":9,\"prompt_eval_duration\":2000000,\"eval_count\":2,\"eval_duration\":3000000}\n");
    out
}

// ------------------------------------------------------------- contenders

fn observer(kind: &ProtocolKind, corpus: &[u8], read: usize) -> bool {
    let mut obs = StreamObserver::new(kind.clone());
    for chunk in corpus.chunks(read) {
        obs.feed(chunk).expect("corpus is valid");
    }
    obs.finish();
    obs.terminal()
        .is_some_and(recovery_core::progress::Terminal::is_success)
}

fn memchr_lines(corpus: &[u8], read: usize) -> usize {
    corpus
        .chunks(read)
        .map(|c| memchr::memchr_iter(b'\n', c).count())
        .sum()
}

fn sse_stream(corpus: &Bytes, read: usize) -> usize {
    let chunks: Vec<Result<Bytes, Infallible>> = (0..corpus.len())
        .step_by(read)
        .map(|s| Ok(corpus.slice(s..(s + read).min(corpus.len()))))
        .collect();
    let mut stream = sse_stream::SseStream::from_bytes_stream(futures_util::stream::iter(chunks));
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    loop {
        match Pin::new(&mut stream).poll_next(&mut cx) {
            Poll::Ready(Some(Ok(_))) => n += 1,
            Poll::Ready(Some(Err(_)) | None) => return n,
            Poll::Pending => unreachable!("an iterator stream is always ready"),
        }
    }
}

#[derive(Deserialize)]
struct ChatChunk<'a> {
    #[serde(borrow, default)]
    choices: Vec<ChatChoice<'a>>,
}
#[derive(Deserialize)]
struct ChatChoice<'a> {
    #[serde(borrow)]
    delta: Option<ChatDelta<'a>>,
    #[serde(borrow)]
    finish_reason: Option<Cow<'a, str>>,
}
#[derive(Deserialize)]
struct ChatDelta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
}
#[derive(Deserialize)]
struct AnthropicEvent<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    delta: Option<AnthropicDelta<'a>>,
}
#[derive(Deserialize)]
struct AnthropicDelta<'a> {
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow)]
    stop_reason: Option<Cow<'a, str>>,
}
#[derive(Deserialize)]
struct OllamaLine<'a> {
    #[serde(borrow)]
    message: Option<ChatDelta<'a>>,
    done: bool,
}

/// memchr framing of whole lines plus a typed borrowing decode of every
/// JSON payload (read size does not apply: it decodes complete lines).
fn serde_typed(kind: &ProtocolKind, corpus: &[u8]) -> usize {
    let mut n = 0;
    for line in corpus.split(|&b| b == b'\n') {
        let payload = match kind {
            ProtocolKind::Ollama => line,
            _ => match line.strip_prefix(b"data: ") {
                Some(p) if p != b"[DONE]" => p,
                _ => continue,
            },
        };
        if payload.is_empty() {
            continue;
        }
        n += match kind {
            ProtocolKind::OpenAiChat => {
                let c: ChatChunk<'_> = serde_json::from_slice(payload).unwrap();
                c.choices
                    .iter()
                    .filter(|c| {
                        c.delta.as_ref().is_some_and(|d| d.content.is_some())
                            || c.finish_reason.is_some()
                    })
                    .count()
            }
            ProtocolKind::Anthropic => {
                let e: AnthropicEvent<'_> = serde_json::from_slice(payload).unwrap();
                usize::from(
                    e.kind.len() > 4
                        && e.delta
                            .is_some_and(|d| d.text.is_some() || d.stop_reason.is_some()),
                )
            }
            _ => {
                let l: OllamaLine<'_> = serde_json::from_slice(payload).unwrap();
                usize::from(l.done || l.message.is_some_and(|m| m.content.is_some()))
            }
        };
    }
    n
}

fn corpora() -> Vec<(&'static str, ProtocolKind, Vec<u8>)> {
    vec![
        ("openai", ProtocolKind::OpenAiChat, openai_corpus()),
        ("anthropic", ProtocolKind::Anthropic, anthropic_corpus()),
        ("ollama", ProtocolKind::Ollama, ollama_corpus()),
    ]
}

fn bench(c: &mut Criterion) {
    for (name, kind, corpus) in corpora() {
        assert!(
            observer(&kind, &corpus, 16 * 1024),
            "{name} corpus must end in success"
        );
        let shared = Bytes::from(corpus.clone());
        let mut group = c.benchmark_group(format!("decode/{name}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .throughput(Throughput::Bytes(corpus.len() as u64));
        for read in READS {
            group.bench_function(format!("observer/{read}"), |b| {
                b.iter(|| observer(&kind, black_box(&corpus), read));
            });
            group.bench_function(format!("memchr/{read}"), |b| {
                b.iter(|| memchr_lines(black_box(&corpus), read));
            });
            if !kind.is_ndjson() {
                group.bench_function(format!("sse-stream/{read}"), |b| {
                    b.iter(|| sse_stream(black_box(&shared), read));
                });
            }
        }
        group.bench_function("serde-typed", |b| {
            b.iter(|| serde_typed(&kind, black_box(&corpus)));
        });
        group.finish();
    }
    summary();
}

/// Best-of-N MB/s (10^6 bytes per second) of `f` over `bytes`.
fn mbps(bytes: usize, mut f: impl FnMut()) -> f64 {
    let mut best = Duration::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        f();
        best = best.min(start.elapsed());
    }
    bytes as f64 / best.as_secs_f64() / 1e6
}

fn summary() {
    println!("\nsummary (MB/s, best of 5; ratio = contender / observer)");
    println!(
        "{:<10} {:>6} {:>10} {:>16} {:>16} {:>16}",
        "corpus", "read", "observer", "memchr", "sse-stream", "serde-typed"
    );
    for (name, kind, corpus) in corpora() {
        let shared = Bytes::from(corpus.clone());
        let typed = mbps(corpus.len(), || {
            black_box(serde_typed(&kind, &corpus));
        });
        for read in READS {
            let ours = mbps(corpus.len(), || {
                black_box(observer(&kind, &corpus, read));
            });
            let scan = mbps(corpus.len(), || {
                black_box(memchr_lines(&corpus, read));
            });
            let framing = if kind.is_ndjson() {
                "n/a".to_owned()
            } else {
                let v = mbps(corpus.len(), || {
                    black_box(sse_stream(&shared, read));
                });
                format!("{v:.0} ({:.2}x)", v / ours)
            };
            println!(
                "{name:<10} {read:>6} {ours:>10.0} {:>16} {framing:>16} {:>16}",
                format!("{scan:.0} ({:.2}x)", scan / ours),
                format!("{typed:.0} ({:.2}x)", typed / ours),
            );
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
