//! Runs every conformance vector of `tests/conformance/engine/*.json`
//! through the machine on the virtual clock, with the thin test driver. The
//! format is documented in `tests/conformance/README.md`; the tower and
//! wasm drivers run the same files.

use super::common;

use std::path::PathBuf;
use std::time::Duration;

use crate::conformance::{Observed, Vector};
use crate::decision::AdmissionAnswer;
use common::{Hook, Jitter, Script, Step, VectorSetup, ms};

const WALL: Duration = crate::conformance::WALL_CLOCK;

fn hook(answer: &str) -> Hook {
    let answer = match answer {
        "allow" => AdmissionAnswer::Allow,
        "reject" => AdmissionAnswer::Reject,
        "unresolved" => AdmissionAnswer::Unresolved,
        "cancel" => return Hook::CancelAfter(ms(10)),
        "never" => return Hook::Never,
        other => panic!("unknown admission answer {other}"),
    };
    Hook::Answer {
        after: Duration::ZERO,
        answer,
    }
}

fn run_vector(v: &Vector) -> Result<(), String> {
    let steps = v
        .attempts
        .iter()
        .map(|a| a.played().map(Step::Played))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", v.name))?;
    let protocol = v.protocol().map_err(|e| format!("{}: {e}", v.name))?;
    let mut script = Script::new(v.policy.build().expect("valid policy"), steps)
        .jitter(Jitter::Pinned(v.jitter));
    script.wall = WALL;
    script.hook = v
        .admission
        .as_ref()
        .map(|a| a.iter().map(|s| hook(s)).collect());
    script.cancel_in_wait = v
        .cancel_during_wait
        .as_ref()
        .map(|c| (c.wait, ms(c.after_ms)));
    script.retry_budget = v.retry_budget.map(|b| b.budget());
    script.vector = Some(VectorSetup {
        protocol,
        request: v.request(),
        resumable_sse: v.resumable_sse,
        continuation: v.continuation.clone(),
        cooldown_ms: v.cooldown_ms,
        alternates: v.targets().map_err(|e| format!("{}: {e}", v.name))?,
        context_window: v.context_window,
        prefill: v.own_prefill().map_err(|e| format!("{}: {e}", v.name))?,
    });
    let run = script.run();
    let mut observed = Observed {
        events: run.transitions().into_iter().map(str::to_owned).collect(),
        sends: run.send_count(),
        delivered: run.delivered.clone(),
        requests: run.requests.clone(),
        bodies: run.bodies.clone(),
        cooldown_left_ms: run.cooldown_left.as_millis() as u64,
        ..Observed::default()
    };
    observed.from_report(&run.report);
    v.expected.check(&v.name, &observed)
}

#[test]
fn every_engine_vector_runs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/engine");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 14,
        "expected the conformance vectors, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let v: Vector =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            path.file_stem().and_then(|s| s.to_str()),
            Some(v.name.as_str()),
            "file name = vector name"
        );
        if let Err(e) = run_vector(&v) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The runner can fail: an altered expectation is caught.
#[test]
fn an_altered_vector_is_caught() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/engine");
    let text = std::fs::read_to_string(dir.join("503_then_success.json")).unwrap();
    let mut v: Vector = serde_json::from_str(&text).unwrap();
    run_vector(&v).unwrap();
    v.expected.delays_ms = vec![500];
    assert!(run_vector(&v).unwrap_err().contains("delays_ms"));
}
