//! The loopback fault provider and cross-crate integration tests.
#![deny(unsafe_code, missing_docs, unreachable_pub)]

pub mod fault;
pub mod policy;
pub mod process;
pub mod redis;
pub mod relay;
#[cfg(feature = "spans")]
pub mod spans;
