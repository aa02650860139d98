//! What a request costs before its first send: the reads of its body's
//! top-level fields (the cooldown key, the resume plan, the GenAI
//! attributes), on chat bodies whose `messages` come before `model`, as
//! the SDKs write them; against `serde_json` checking the same body
//! (`IgnoredAny`) and reading the same fields typed.
//!
//! Run: `cargo bench -p recovery-core --bench request_body`. Criterion
//! prints its own figures; a summary with µs per body and MB/s follows.
#![allow(missing_docs)]

use std::fmt::Write as _;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use recovery_core::cooldown;
use recovery_core::exchange::RequestFacts;
use recovery_core::genai::GenAiRequest;
use recovery_core::protocol::ProtocolKind;
use serde::Deserialize;

const URL: &str = "https://api.openai.com/v1/chat/completions";

/// A chat body of `turns` messages of ~500 bytes, `model` after them.
fn body(turns: usize) -> Vec<u8> {
    let mut out = String::from(r#"{"messages":["#);
    for i in 0..turns {
        if i > 0 {
            out.push(',');
        }
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let _ = write!(
            out,
            r#"{{"role":"{role}","content":"{} \"quoted\" \u00e9 turn {i}"}}"#,
            "lorem ipsum dolor sit amet ".repeat(18)
        );
    }
    out.push_str(r#"],"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true}}"#);
    out.into_bytes()
}

/// Everything the tower layer reads of a request's body.
fn reads(body: &[u8]) -> usize {
    let facts = RequestFacts::new("POST", URL, body);
    let fields = facts.fields();
    let key = cooldown::key_of(URL, &fields);
    let genai = GenAiRequest::of(&ProtocolKind::OpenAiChat, URL, &fields);
    key.len() + usize::from(genai.stream)
}

fn serde_check(body: &[u8]) -> bool {
    serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
}

fn serde_fields(body: &[u8]) -> usize {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        model: Option<std::borrow::Cow<'a, str>>,
        stream: Option<bool>,
        background: Option<bool>,
    }
    serde_json::from_slice::<Top<'_>>(body).map_or(0, |t| {
        t.model.map_or(0, |m| m.len())
            + usize::from(t.stream == Some(true) && t.background == Some(true))
    })
}

const TURNS: [usize; 3] = [4, 100, 1000];

fn bench(c: &mut Criterion) {
    for turns in TURNS {
        let b = body(turns);
        let mut group = c.benchmark_group(format!("request-body/{}KB", b.len() / 1000));
        group.throughput(Throughput::Bytes(b.len() as u64));
        group.bench_function("fields", |x| x.iter(|| reads(black_box(&b))));
        group.bench_function("serde-check", |x| x.iter(|| serde_check(black_box(&b))));
        group.bench_function("serde-fields", |x| x.iter(|| serde_fields(black_box(&b))));
        group.finish();
    }
    summary();
}

/// Best of 200 runs of `f`.
fn best(mut f: impl FnMut()) -> Duration {
    (0..200)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn summary() {
    println!("\nsummary (µs per body, best of 200; MB/s)");
    println!(
        "{:>9} {:>18} {:>18} {:>18}",
        "body", "fields (ours)", "serde check", "serde fields"
    );
    for turns in TURNS {
        let b = body(turns);
        let cell = |d: Duration| {
            format!(
                "{:.1} ({:.0})",
                d.as_secs_f64() * 1e6,
                b.len() as f64 / d.as_secs_f64() / 1e6
            )
        };
        let ours = best(|| {
            black_box(reads(&b));
        });
        let check = best(|| {
            black_box(serde_check(&b));
        });
        let typed = best(|| {
            black_box(serde_fields(&b));
        });
        println!(
            "{:>7}KB {:>18} {:>18} {:>18}",
            b.len() / 1000,
            cell(ours),
            cell(check),
            cell(typed)
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
