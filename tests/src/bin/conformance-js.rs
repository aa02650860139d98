//! The conformance vectors for runners that are not written in Rust (the
//! npm package's, in Node, a Chromium page and a worker), so that one
//! translation of each vector and one check serve every driver.
//!
//! `conformance-js prepare` prints a JSON array, one element per vector:
//! its name, the npm options of its policy, its request, the sends played
//! byte for byte (`AttemptSpec::played`), the hooks' scripted answers, the
//! pinned jitter, the virtual wall clock's origin, and why `fetch` cannot
//! express it (`skip`, or `null`).
//!
//! `conformance-js check FILE` reads what a runner observed (a JSON array of
//! `{ name, events, sends, delivered, requests, report }`) and checks each
//! against its vector's expectations (`Expected::check`); it prints every
//! mismatch and exits 1 when there is one.

use std::path::PathBuf;
use std::process::ExitCode;

use recovery_core::conformance::{Observed, PlayedHead, Vector, WALL_CLOCK};
use recovery_core::failure::{Phase, TransportKind};
use recovery_core::report::RecoveryReport;
use serde_json::{Value, json};

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("conformance/engine")
}

fn vectors() -> Result<Vec<Vector>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(vectors_dir())
        .map_err(|e| format!("{}: {e}", vectors_dir().display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
        })
        .collect()
}

/// Why `v` cannot run through `fetch`, if it cannot.
///
/// `fetch` hides where a request failed: every rejected `fetch()` reaches
/// the driver as a transport failure of kind `other` in phase `unknown`, and
/// every rejected `read()` as kind `other` in phase `streaming`. A vector
/// whose decision rests on finer evidence (a failure known to be before the
/// request was sent: `connecting`, `sending`; kinds `dns`, `refused`, `tls`,
/// `refused_stream`, which prove the request was not processed; or a
/// transport error while decoding) cannot be reproduced.
fn not_for_fetch(v: &Vector) -> Option<String> {
    for (i, a) in v.attempts.iter().enumerate() {
        let Ok(played) = a.played() else { continue };
        let PlayedHead::Fails { transport, phase } = played.head else {
            continue;
        };
        let kind_ok = matches!(
            transport,
            TransportKind::Reset | TransportKind::Closed | TransportKind::Other
        );
        let phase_ok = matches!(
            phase,
            Phase::AwaitingHeaders | Phase::Unknown | Phase::Streaming
        );
        if !(kind_ok && phase_ok) {
            return Some(format!(
                "send {}: a `{}` failure in phase `{}`; fetch cannot tell connect from send \
                 from awaiting headers, and every transport kind is `other`",
                i + 1,
                serde_json::to_value(transport).unwrap_or_default(),
                serde_json::to_value(phase).unwrap_or_default(),
            ));
        }
    }
    None
}

/// The vector's policy as npm options (the path `createRecoveringFetch`
/// takes): each knob it gives under the policy table's camelCase name, a
/// bound that is off as `'off'` (the npm package also reads `null` so).
fn options(v: &Vector) -> Value {
    let mut o = json!({
        "protocol": v.protocol_name(),
        "resumableSse": v.resumable_sse,
        "contextWindow": v.context_window,
    });
    for (field, value) in v.policy.iter() {
        o[field.camel_case()] = serde_json::to_value(value).unwrap_or_default();
    }
    if let Some(p) = &v.prefill {
        o["continuation"] = json!("prefill");
        o["prefillTemplate"] = json!(p);
    }
    if !v.alternates.is_empty() {
        o["alternates"] = v
            .alternates
            .iter()
            .map(|a| {
                let mut alt = json!({
                    "label": a.label,
                    "url": a.url,
                    "model": a.model,
                    "protocol": a.protocol,
                    "contextWindow": a.context_window,
                });
                if let Some(p) = &a.prefill {
                    alt["continuation"] = json!("prefill");
                    alt["prefillTemplate"] = json!(p);
                }
                alt
            })
            .collect();
    }
    if let Some(t) = &v.sse_terminal {
        o["sseTerminal"] = serde_json::to_value(t).unwrap_or_default();
    }
    if let Some(b) = &v.retry_budget {
        o["retryBudget"] = json!({
            "ttlMs": b.ttl_ms,
            "minRetriesPerSec": b.min_retries_per_sec,
            "percent": b.percent,
        });
    }
    o
}

fn prepare() -> Result<Value, String> {
    let mut out = Vec::new();
    for v in vectors()? {
        let played = v
            .attempts
            .iter()
            .map(recovery_core::conformance::AttemptSpec::played)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{}: {e}", v.name))?;
        out.push(json!({
            "name": v.name,
            "options": options(&v),
            "request": v.request(),
            "played": played,
            "jitter": v.jitter,
            "wallOriginMs": WALL_CLOCK.as_millis() as u64,
            "admission": v.admission,
            "continuation": v.continuation,
            "cancelDuringWait": v.cancel_during_wait,
            "cooldownMs": v.cooldown_ms,
            "skip": not_for_fetch(&v),
        }));
    }
    Ok(Value::Array(out))
}

fn check(file: &str) -> Result<usize, Vec<String>> {
    let text = std::fs::read_to_string(file).map_err(|e| vec![format!("{file}: {e}")])?;
    let runs: Vec<Value> = serde_json::from_str(&text).map_err(|e| vec![format!("{file}: {e}")])?;
    let vectors = vectors().map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    for run in &runs {
        let name = run["name"].as_str().unwrap_or_default();
        let Some(v) = vectors.iter().find(|v| v.name == name) else {
            errors.push(format!("{name}: no such vector"));
            continue;
        };
        let report: RecoveryReport = match serde_json::from_value(run["report"].clone()) {
            Ok(r) => r,
            Err(e) => {
                errors.push(format!("{name}: report: {e}"));
                continue;
            }
        };
        let strings = |key: &str| -> Vec<String> {
            run[key]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut observed = Observed {
            events: strings("events")
                .into_iter()
                .filter(|n| n != "committed")
                .collect(),
            sends: run["sends"].as_u64().unwrap_or(0) as usize,
            delivered: run["delivered"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|b| b.as_u64().map(|b| b as u8))
                        .collect()
                })
                .unwrap_or_default(),
            // The logical id written `{id}`: each runner draws its own.
            requests: strings("requests")
                .into_iter()
                .map(|r| r.replace(&report.logical_id, "{id}"))
                .collect(),
            bodies: strings("bodies"),
            cooldown_left_ms: run["cooldownLeftMs"].as_f64().unwrap_or(0.0) as u64,
            ..Observed::default()
        };
        observed.from_report(&report);
        if let Err(e) = v.expected.check(&v.name, &observed) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(runs.len())
    } else {
        Err(errors)
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["prepare"] => match prepare() {
            Ok(v) => {
                println!("{v}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("conformance-js: {e}");
                ExitCode::FAILURE
            }
        },
        ["check", file] => match check(file) {
            Ok(n) => {
                println!("conformance-js: {n} runs match their vectors");
                ExitCode::SUCCESS
            }
            Err(errors) => {
                for e in errors {
                    eprintln!("{e}");
                }
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("usage: conformance-js prepare | conformance-js check FILE");
            ExitCode::from(2)
        }
    }
}
