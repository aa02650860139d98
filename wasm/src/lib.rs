//! `recovery-wasm`: the Recovery engine over `fetch`, for browsers, workers,
//! Node and edge runtimes.
//!
//! The driver (wasm32 only) runs the same sans-IO engine as the tower layer
//! over the global `fetch` and the body's `ReadableStream`; the npm package
//! in this folder wraps it as `createRecoveringFetch(options)`, a function
//! with `fetch`'s signature. On native targets only the option parsing is
//! built, so its validation is tested with `cargo test`.
#![deny(unsafe_code, missing_docs)]

pub mod options;

#[cfg(target_arch = "wasm32")]
mod driver;
#[cfg(target_arch = "wasm32")]
mod exports;
#[cfg(target_arch = "wasm32")]
mod js_value;
#[cfg(target_arch = "wasm32")]
pub mod platform;

#[cfg(target_arch = "wasm32")]
pub use exports::{Call, RecoveryClient};
