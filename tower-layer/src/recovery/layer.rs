use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use recovery_core::budget::RetryBudget;
use recovery_core::decision::AdmissionAnswer;
use recovery_core::failure::Failure;
use recovery_core::lifecycle::{LifecycleEvent, LifecycleObserver};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::timing::{AlwaysOnline, Connectivity, Timing};
use tower_layer::Layer;

use super::resume::ContinuationHook;
use super::service::Recover;
use super::wire::WireObserver;

/// What an admission hook is told about the resend it is asked to allow.
#[derive(Debug, Clone)]
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

pub(crate) struct Config<T, C> {
    pub(crate) policy: RecoveryPolicy,
    pub(crate) timing: T,
    pub(crate) connectivity: C,
    pub(crate) observer: Arc<dyn LifecycleObserver + Send + Sync>,
    pub(crate) admission: Option<AdmissionHook>,
    pub(crate) retry_budget: Option<RetryBudget>,
    pub(crate) wire: Option<Arc<dyn WireObserver>>,
    pub(crate) sse_resumable: bool,
    pub(crate) continuation: Option<ContinuationHook>,
}

/// Applies [`Recover`] to a service. Put it outermost: outside the
/// [`ObserveLayer`](crate::ObserveLayer), limits and the HTTP client, and turn
/// off the client's own retries.
pub struct RecoveryLayer<T = DefaultTiming, C = AlwaysOnline> {
    pub(crate) config: Arc<Config<T, C>>,
}

/// The timing used when none is given.
#[cfg(feature = "tokio")]
pub type DefaultTiming = crate::TokioTiming;
/// The timing used when none is given.
#[cfg(not(feature = "tokio"))]
pub type DefaultTiming = recovery_core::timing::ManualTiming;

impl<T, C> Clone for RecoveryLayer<T, C> {
    fn clone(&self) -> Self {
        RecoveryLayer {
            config: Arc::clone(&self.config),
        }
    }
}

impl<T, C> fmt::Debug for RecoveryLayer<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoveryLayer")
            .field("policy", &self.config.policy)
            .field("admission", &self.config.admission.is_some())
            .field("retry_budget", &self.config.retry_budget.is_some())
            .finish_non_exhaustive()
    }
}

impl RecoveryLayer {
    /// A layer with `policy`, the default timing and no connectivity signal.
    pub fn new(policy: RecoveryPolicy) -> Self {
        RecoveryLayer {
            config: Arc::new(Config {
                policy,
                timing: DefaultTiming::default(),
                connectivity: AlwaysOnline,
                observer: Arc::new(()),
                admission: None,
                retry_budget: None,
                wire: None,
                sse_resumable: false,
                continuation: None,
            }),
        }
    }
}

impl<T: Clone, C: Clone> RecoveryLayer<T, C> {
    fn map<T2, C2>(self, f: impl FnOnce(Config<T, C>) -> Config<T2, C2>) -> RecoveryLayer<T2, C2> {
        let config = Arc::try_unwrap(self.config).unwrap_or_else(|shared| Config {
            policy: shared.policy.clone(),
            timing: shared.timing.clone(),
            connectivity: shared.connectivity.clone(),
            observer: Arc::clone(&shared.observer),
            admission: shared.admission.clone(),
            retry_budget: shared.retry_budget.clone(),
            wire: shared.wire.clone(),
            sse_resumable: shared.sse_resumable,
            continuation: shared.continuation.clone(),
        });
        RecoveryLayer {
            config: Arc::new(f(config)),
        }
    }

    /// Uses `timing` for clocks, sleeps and jitter (a virtual clock in tests).
    pub fn with_timing<T2: Timing>(self, timing: T2) -> RecoveryLayer<T2, C> {
        self.map(|c| Config {
            policy: c.policy,
            timing,
            connectivity: c.connectivity,
            observer: c.observer,
            admission: c.admission,
            retry_budget: c.retry_budget,
            wire: c.wire,
            sse_resumable: c.sse_resumable,
            continuation: c.continuation,
        })
    }

    /// Parks retries while `connectivity` reports offline.
    pub fn with_connectivity<C2: Connectivity>(self, connectivity: C2) -> RecoveryLayer<T, C2> {
        self.map(|c| Config {
            policy: c.policy,
            timing: c.timing,
            connectivity,
            observer: c.observer,
            admission: c.admission,
            retry_budget: c.retry_budget,
            wire: c.wire,
            sse_resumable: c.sse_resumable,
            continuation: c.continuation,
        })
    }

    /// Sends every lifecycle event to `observer`.
    pub fn on_event(
        self,
        observer: impl Fn(&LifecycleEvent) + Send + Sync + 'static,
    ) -> RecoveryLayer<T, C> {
        self.map(|mut c| {
            c.observer = Arc::new(observer);
            c
        })
    }

    /// Asks `hook` before every resend.
    pub fn with_admission(self, hook: AdmissionHook) -> RecoveryLayer<T, C> {
        self.map(|mut c| {
            c.admission = Some(hook);
            c
        })
    }

    /// Shares `budget` between every request through this layer and its
    /// clones, so an outage cannot become a retry storm.
    pub fn with_retry_budget(self, budget: RetryBudget) -> RecoveryLayer<T, C> {
        self.map(|mut c| {
            c.retry_budget = Some(budget);
            c
        })
    }

    /// Shows every attempt's raw request, response head and body chunks to
    /// `observer`; an error from it stops recovery before delivery.
    pub fn with_wire_observer(self, observer: impl WireObserver + 'static) -> RecoveryLayer<T, C> {
        self.map(|mut c| {
            c.wire = Some(Arc::new(observer));
            c
        })
    }

    /// Declares the endpoint a resumable SSE server: a committed stream
    /// that breaks is re-requested with `Last-Event-ID` set to the last
    /// event id delivered (never with an empty one). Only for servers that
    /// honour the header; providers' LLM endpoints do not.
    pub fn with_resumable_sse(self, resumable: bool) -> RecoveryLayer<T, C> {
        self.map(|mut c| {
            c.sse_resumable = resumable;
            c
        })
    }

    /// Continues committed streams that have no native resume with `hook`:
    /// it gets the original request and the delivered prefix and returns a
    /// continuation request (or declines). Each continuation is a resume: it
    /// is a physical send, counted against `max_attempts` and `max_resumes`.
    pub fn with_continuation(self, hook: ContinuationHook) -> RecoveryLayer<T, C> {
        self.map(|mut c| {
            c.continuation = Some(hook);
            c
        })
    }

    /// The policy.
    pub fn policy(&self) -> &RecoveryPolicy {
        &self.config.policy
    }
}

impl<S, T, C> Layer<S> for RecoveryLayer<T, C> {
    type Service = Recover<S, T, C>;

    fn layer(&self, inner: S) -> Self::Service {
        Recover {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}
