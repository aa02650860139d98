//! `recovery-core`: the sans-IO engine of Recovery.
//!
//! Plain data in, decisions out. No runtime, no sockets, no clock calls: time,
//! sleep, randomness and connectivity come in through the [`timing`] traits so
//! the same engine drives the tower layer and the wasm/`fetch` driver, and is
//! tested exhaustively on a virtual clock.
#![deny(unsafe_code, missing_docs)]

pub mod backoff;
pub mod budget;
pub mod call;
pub mod conformance;
pub mod decision;
pub mod engine;
pub mod error;
pub mod failure;
pub mod lifecycle;
pub mod observer;
pub mod outcome;
pub mod policy;
pub mod progress;
pub mod protocol;
pub mod report;
pub mod retry_after;
pub mod safe;
pub mod timing;
pub mod wire;
