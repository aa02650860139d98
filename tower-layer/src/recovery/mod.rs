//! `RecoveryLayer`: replays a request transparently while no semantic output
//! was observed, holds back the pre-commit prefix so a failed attempt is
//! invisible, and fails with a typed [`RecoveryError`] after commit.
//!
//! Every decision is made by the request's machine in core
//! ([`recovery_core::exchange::Exchange`]); this module only does its I/O.
//!
//! [`RecoveryError`]: recovery_core::error::RecoveryError

mod alternate;
mod body;
mod bounds;
mod classify;
mod continuation;
mod driver;
mod future;
mod hooks;
mod layer;
mod origin;
mod reading;
mod report;
mod service;
mod surroundings;
#[cfg(feature = "tracing")]
mod telemetry;
mod wire;

pub use alternate::Alternate;
pub use body::RecoveryBody;
pub use continuation::{ContinuationContext, ContinuationHook};
pub use future::ResponseFuture;
pub use hooks::{AdmissionContext, AdmissionHook};
pub use layer::RecoveryLayer;
pub(crate) use reading::SendReading;
pub use report::ReportHandle;
pub use service::Recover;
pub use wire::WireObserver;
