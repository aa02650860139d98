//! What every request through a layer shares: the policy, the hooks and
//! the stores, whatever the layer's timing and connectivity types (the
//! driver is generic over the response body only).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use recovery_core::budget::BudgetStore;
use recovery_core::cooldown::CooldownStore;
use recovery_core::exchange::AdmissionAnswer;
use recovery_core::failover::Target;
use recovery_core::failure::Failure;
use recovery_core::lifecycle::LifecycleObserver;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolChoice;

use super::alternate::Alternate;
use super::continuation::ContinuationHook;
use super::surroundings::Surroundings;
use super::wire::WireObserver;

/// What an admission hook is told about the resend it is asked to allow.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AdmissionContext {
    /// The logical request.
    pub logical_id: String,
    /// The send number the resend would be.
    pub next_attempt: u32,
    /// The failure that prompted it (safe evidence only).
    pub failure: Failure,
}

/// An async hook that allows or rejects ambiguous resends.
pub type AdmissionHook = Arc<
    dyn Fn(AdmissionContext) -> Pin<Box<dyn Future<Output = AdmissionAnswer> + Send>> + Send + Sync,
>;

/// A caller's cooldown key: from a request's head and buffered body.
pub(crate) type CooldownKey = Arc<dyn Fn(&http::request::Parts, &[u8]) -> String + Send + Sync>;

/// What every request through a layer shares, whatever the layer's timing
/// and connectivity types: the driver is generic over the response body only.
#[derive(Clone)]
pub(crate) struct Hooks {
    pub(crate) policy: RecoveryPolicy,
    pub(crate) protocol: ProtocolChoice,
    pub(crate) surroundings: Arc<dyn Surroundings>,
    pub(crate) observer: Arc<dyn LifecycleObserver + Send + Sync>,
    pub(crate) admission: Option<AdmissionHook>,
    pub(crate) retry_budget: Option<Arc<dyn BudgetStore>>,
    pub(crate) cooldowns: Option<Arc<dyn CooldownStore>>,
    pub(crate) cooldown_key: Option<CooldownKey>,
    /// Where a request may go instead before commit, in order.
    pub(crate) alternates: Vec<Alternate>,
    /// Their targets, as the machine takes them.
    pub(crate) targets: Vec<Target>,
    pub(crate) wire: Option<Arc<dyn WireObserver>>,
    pub(crate) sse_resumable: bool,
    pub(crate) continuation: Option<ContinuationHook>,
}

#[derive(Clone)]
pub(crate) struct Config<T, C> {
    pub(crate) timing: T,
    pub(crate) connectivity: C,
    pub(crate) hooks: Arc<Hooks>,
}
