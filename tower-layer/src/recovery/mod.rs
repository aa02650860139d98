//! `RecoveryLayer`: replays a request transparently while no semantic output
//! was observed, holds back the pre-commit prefix so a failed attempt is
//! invisible, and fails with a typed [`RecoveryError`] after commit.
//!
//! [`RecoveryError`]: recovery_core::error::RecoveryError

mod body;
mod bounds;
mod classify;
mod future;
mod layer;
mod resume;
mod service;
mod shared;
mod wire;

pub use body::RecoveryBody;
pub use future::ResponseFuture;
pub use layer::{AdmissionContext, AdmissionHook, RecoveryLayer};
pub use resume::{ContinuationContext, ContinuationHook};
pub use service::Recover;
pub use shared::ReportHandle;
pub use wire::WireObserver;
