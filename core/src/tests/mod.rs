//! The engine's and the decoders' tests. They live in the crate because
//! they reach what applications never see (the decision function, the
//! engine under the machine, the JSON scanner), and they read the recorded
//! provider streams and conformance vectors under `tests/`, which travel
//! with the packaged crate.

mod common;
mod decode_support;

mod decision_matrix;
#[cfg(feature = "serde_json")]
mod decode_fastpaths;
mod decode_fixtures;
#[cfg(feature = "serde_json")]
mod decode_props;
mod decode_robustness;
mod engine_conformance;
mod engine_lifecycle;
mod engine_matrix;
mod engine_proptest;
mod engine_resume;
mod failover;
mod hedging;
mod report_usage;
mod unescape;
