//! `recovery-wasm`: the Recovery engine for `fetch`, as a synchronous
//! sans-IO module under a small JavaScript shell.
//!
//! The module decides nothing of its own: [`Machine`] translates between the
//! shell's plain values (numbers, strings, bytes) and
//! `recovery_core::exchange::Exchange`, the machine every driver of the
//! engine runs. The shell (`js/shell.mjs`) owns everything that touches the
//! platform: `fetch`, `ReadableStream`, `AbortController`, timers,
//! `navigator.onLine`, option checking and the texts of errors. Built with
//! one protocol feature, the module decodes only that protocol (the npm
//! package's `recovery-wasm/openai-chat` and its siblings); with all of
//! them, any (`protocol: "auto"`).
//!
//! Everything here also builds natively, so the translation is tested with
//! `cargo test -p recovery-wasm`.
#![deny(unsafe_code, missing_docs, unreachable_pub)]

mod json;
mod machine;

pub use machine::{Client, Machine, action, protocols};

#[cfg(target_arch = "wasm32")]
#[global_allocator]
static ALLOCATOR: lol_alloc::LockedAllocator<lol_alloc::FreeListAllocator> =
    lol_alloc::LockedAllocator::new(lol_alloc::FreeListAllocator::new());
