//! Shared pieces of the Recovery examples: the HTTPS client, one exchange
//! through the recovery stack, the `recover` command line, and readable
//! output.
#![deny(unsafe_code, missing_docs)]

pub mod cli;
pub mod client;
pub mod provider;
pub mod show;
pub mod text;

/// The README's code blocks, compiled as doc tests so the README cannot rot.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
