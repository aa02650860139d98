//! Tower layers that keep streamed LLM responses whole when the network does
//! not.
//!
//! ```text
//! ServiceBuilder::new()
//!     .layer(RecoveryLayer::new(policy))      // outermost: replay, hold-back, typed errors
//!     .layer(ObserveLayer::new(protocol))     // decodes the stream, publishes evidence
//!     .service(client)                        // hyper-util client, its own retries off
//! ```
//!
//! [`ObserveLayer`] decodes every response body as it passes (SSE or NDJSON,
//! per provider protocol) and publishes progress and terminal proof.
//! [`RecoveryLayer`] replays the request while no semantic output was
//! observed, holds the pre-commit prefix back so a failed attempt is
//! invisible, resolves the response at commit, and ends the body with a typed
//! [`RecoveryError`](recovery_core::error::RecoveryError) when a committed
//! stream fails. Decisions come from `recovery-core`, the same engine the
//! wasm driver runs.
#![deny(unsafe_code, missing_docs)]

pub mod observe;
pub mod recovery;
mod request_body;
#[cfg(feature = "tokio")]
mod timing;

pub use observe::{ObserveHandle, ObserveLayer};
pub use recovery::{RecoveryBody, RecoveryLayer, ReportHandle};
pub use request_body::ReplayBody;
#[cfg(feature = "tokio")]
pub use timing::TokioTiming;

pub use recovery_core as core;

/// A type-erased error, as tower and hyper use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
