//! Shared helpers for the decoder tests: run a fixture through an observer
//! with a given read partition and collect everything observable.
#![allow(
    dead_code,
    missing_docs,
    clippy::case_sensitive_file_extension_comparisons
)]

use std::path::PathBuf;

use crate::observer::{EndOfStream, EventRecord, ObserverConfig, StreamObserver};
use crate::progress::SemanticKind;
use crate::protocol::{EventClass, Evidence, ProtocolKind};
use crate::wire::ProtocolViolation;

/// Everything one run showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Run {
    pub records: Vec<EventRecord>,
    pub error: Option<ProtocolViolation>,
    pub end: EndOfStream,
    pub evidence: Evidence,
    /// Offset reported as the commit point, if any.
    pub committed_at: Option<u64>,
}

impl Run {
    /// Class codes of all records, space separated.
    pub(super) fn classes(&self) -> String {
        self.records
            .iter()
            .map(|r| code(r.info.class))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The short class code of a frame (`S`, `X`, `N`, `K`, `T+`, `T-`, `E`).
fn code(class: EventClass) -> &'static str {
    match class {
        EventClass::Semantic(SemanticKind::SideEffect) => "X",
        EventClass::Semantic(_) => "S",
        EventClass::NonSemantic => "N",
        EventClass::Keepalive => "K",
        EventClass::TerminalSuccess => "T+",
        EventClass::TerminalUnsuccessful => "T-",
        EventClass::Error => "E",
    }
}

pub(super) fn fixture(rel: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub(super) fn kind_of(rel: &str) -> ProtocolKind {
    let dir = rel.split('/').next().unwrap();
    if dir == "sse" && rel.contains("sentinel") {
        return ProtocolKind::Sse {
            terminal_sentinel: Some(crate::protocol::SseTerminal::Data("[DONE]".into())),
        };
    }
    dir.parse().unwrap()
}

/// All fixture files (relative paths) of streamed protocols.
pub(super) fn all_stream_fixtures() -> Vec<String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for dir in std::fs::read_dir(&root).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".sse") || name.ends_with(".ndjson") {
                out.push(format!(
                    "{}/{}",
                    dir.file_name().unwrap().to_string_lossy(),
                    name
                ));
            }
        }
    }
    out.sort();
    out
}

/// Feeds `bytes` cut at `cuts` (sorted offsets) to a fresh observer.
pub(super) fn run_with(
    kind: ProtocolKind,
    config: ObserverConfig,
    bytes: &[u8],
    cuts: &[usize],
) -> Run {
    let mut obs = StreamObserver::with_config(kind, config);
    let mut records = Vec::new();
    let mut error = None;
    let mut committed_at = None;
    let mut start = 0;
    let ends = cuts.iter().copied().chain(std::iter::once(bytes.len()));
    for end in ends {
        let end = end.clamp(start, bytes.len());
        match obs.feed_with(&bytes[start..end], |r| records.push(*r)) {
            Ok(feed) => {
                if feed.committed_at.is_some() {
                    assert!(committed_at.is_none(), "committed twice");
                    committed_at = feed.committed_at;
                }
            }
            Err(v) => {
                error = Some(v);
                break;
            }
        }
        start = end;
    }
    assert_eq!(obs.committed_at(), committed_at.or(obs.committed_at()));
    let committed_at = obs.committed_at();
    let end = obs.finish();
    Run {
        records,
        error,
        end,
        evidence: obs.evidence().clone(),
        committed_at,
    }
}

pub(super) fn run(kind: ProtocolKind, bytes: &[u8]) -> Run {
    run_with(kind, ObserverConfig::default(), bytes, &[])
}

pub(super) fn run_fixture(rel: &str) -> Run {
    run(kind_of(rel), &fixture(rel))
}

/// Same fixture decoded with the full `serde_json` reference.
pub(super) fn reference() -> ObserverConfig {
    ObserverConfig {
        reference_decode: true,
        ..ObserverConfig::default()
    }
}
