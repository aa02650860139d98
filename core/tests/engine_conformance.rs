//! Runs every lifecycle vector of `tests/conformance/engine/*.json` through
//! the engine on the virtual clock. The format is documented in
//! `tests/conformance/README.md`; other drivers run the same files.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Hook, Jitter, Script, Step, ms};
use recovery_core::conformance::{AttemptSpec, Vector};
use recovery_core::decision::AdmissionAnswer;
use recovery_core::progress::{Progress, SemanticKind};

const WALL: Duration = recovery_core::conformance::WALL_CLOCK;

fn step(a: &AttemptSpec) -> Step {
    match (&a.fail, a.succeed, a.cancel) {
        (Some(f), None, None) => {
            let mut failure = f
                .failure()
                .unwrap_or_else(|| panic!("a failure is a status or a transport error: {f:?}"));
            if a.semantic {
                let mut p = Progress::default();
                p.observe(SemanticKind::Content);
                p.deliver_observed();
                failure.progress = p;
            }
            Step::Fail {
                after: Duration::ZERO,
                failure,
                commit: a.semantic,
                offline: false,
            }
        }
        (None, Some(proof), None) => Step::Succeed {
            after: Duration::ZERO,
            proof,
            commit: true,
        },
        (None, None, Some(phase)) => Step::Cancel {
            after: Duration::ZERO,
            phase,
            commit: a.semantic,
        },
        _ => panic!("an attempt is exactly one of fail, succeed, cancel: {a:?}"),
    }
}

fn hook(answer: &str) -> Hook {
    let answer = match answer {
        "allow" => AdmissionAnswer::Allow,
        "reject" => AdmissionAnswer::Reject,
        "unresolved" => AdmissionAnswer::Unresolved,
        "cancel" => return Hook::CancelAfter(ms(10)),
        other => panic!("unknown admission answer {other}"),
    };
    Hook::Answer {
        after: Duration::ZERO,
        answer,
    }
}

fn run_vector(v: &Vector) {
    let mut script = Script::new(
        v.policy.policy().expect("valid policy"),
        v.attempts.iter().map(step).collect(),
    )
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
    let run = script.run();
    assert_eq!(run.transitions(), v.expected.events, "{}: events", v.name);
    assert_eq!(
        run.outcome.name(),
        v.expected.outcome,
        "{}: outcome",
        v.name
    );
    assert_eq!(run.send_count(), v.expected.sends, "{}: sends", v.name);
    let delays: Vec<u64> = run.waits.iter().map(|w| w.0.as_millis() as u64).collect();
    assert_eq!(delays, v.expected.delays_ms, "{}: delays", v.name);
}

#[test]
fn every_engine_vector_runs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/conformance/engine");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 10,
        "expected the lifecycle vectors, found {}",
        files.len()
    );
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let v: Vector =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            path.file_stem().and_then(|s| s.to_str()),
            Some(v.name.as_str()),
            "file name = vector name"
        );
        run_vector(&v);
    }
}
