//! Shared pieces of the Recovery examples: a provider run, delta text, and
//! (from `recovery-cli`) the HTTPS client and readable output.
#![deny(unsafe_code, missing_docs, unreachable_pub)]

pub mod provider;
pub mod text;

pub use recovery_cli::{client, show};

/// The README's code blocks, compiled as doc tests so the README cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
