use std::fmt;
use std::sync::Arc;

use recovery_core::budget::{BudgetStore, RetryBudget, RetryBudgetConfig};
use recovery_core::cooldown::{CooldownStore, Cooldowns};
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::{ProtocolChoice, ProtocolKind};
use recovery_core::timing::AlwaysOnline;
use tower_layer::Layer;

use super::alternate::Alternate;
use super::bounds::{DriverConnectivity, DriverTiming};
use super::continuation::ContinuationHook;
use super::hooks::{AdmissionHook, Config, Hooks};
use super::service::Recover;
use super::surroundings::surroundings;
use super::wire::WireObserver;

/// Applies [`Recover`] to a service. Put it outermost: outside the
/// [`ObserveLayer`](crate::ObserveLayer), limits and the HTTP client, and turn
/// off the client's own retries.
///
/// `T` is the [`Timing`](recovery_core::timing::Timing) (clocks, sleeps, jitter) and `C` the
/// [`Connectivity`](recovery_core::timing::Connectivity). With the `tokio` feature (on by default) `T` defaults
/// to [`TokioTiming`](crate::TokioTiming) and [`RecoveryLayer::new`] builds
/// one; without it there is no default clock, and a layer is built with
/// [`RecoveryLayer::with_timing`] (a clock that never wakes would turn every
/// wait into a hang).
#[cfg(feature = "tokio")]
pub struct RecoveryLayer<T = crate::TokioTiming, C = AlwaysOnline> {
    pub(crate) config: Arc<Config<T, C>>,
}

/// Applies [`Recover`] to a service. Put it outermost: outside the
/// [`ObserveLayer`](crate::ObserveLayer), limits and the HTTP client, and turn
/// off the client's own retries.
///
/// `T` is the [`Timing`](recovery_core::timing::Timing) (clocks, sleeps, jitter) and `C` the
/// [`Connectivity`](recovery_core::timing::Connectivity). Without the `tokio` feature there is no default clock:
/// build the layer with [`RecoveryLayer::with_timing`]. `RecoveryLayer::new`
/// does not exist then, so code that relied on a default clock fails to
/// compile instead of hanging on its first wait:
///
/// ```compile_fail,E0599
/// use tower_recovery::RecoveryLayer;
/// use tower_recovery::core::RecoveryPolicy;
///
/// let layer = RecoveryLayer::new(RecoveryPolicy::default());
/// ```
#[cfg(not(feature = "tokio"))]
pub struct RecoveryLayer<T, C = AlwaysOnline> {
    pub(crate) config: Arc<Config<T, C>>,
}

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
            .field("policy", &self.config.hooks.policy)
            .field("admission", &self.config.hooks.admission.is_some())
            .field("retry_budget", &self.config.hooks.retry_budget.is_some())
            .field("cooldowns", &self.config.hooks.cooldowns.is_some())
            .field("alternates", &self.config.hooks.alternates)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
impl RecoveryLayer {
    /// A layer with `policy` on tokio's clock, with no connectivity signal.
    pub fn new(policy: RecoveryPolicy) -> Self {
        RecoveryLayer::with_timing(policy, crate::TokioTiming::default())
    }
}

impl<T: DriverTiming> RecoveryLayer<T> {
    /// A layer with `policy` that takes its clocks, sleeps and jitter from
    /// `timing` (another runtime's timer, or a virtual clock in tests).
    pub fn with_timing(policy: RecoveryPolicy, timing: T) -> Self {
        let hooks = Hooks {
            policy,
            protocol: ProtocolChoice::Auto,
            surroundings: surroundings(&timing, &AlwaysOnline),
            observer: Arc::new(()),
            admission: None,
            retry_budget: Some(Arc::new(RetryBudget::new(RetryBudgetConfig::default()))),
            cooldowns: Some(Arc::new(Cooldowns::new())),
            cooldown_key: None,
            alternates: Vec::new(),
            targets: Vec::new(),
            wire: None,
            sse_resumable: false,
            continuation: None,
        };
        RecoveryLayer {
            config: Arc::new(Config {
                timing,
                connectivity: AlwaysOnline,
                hooks: Arc::new(hooks),
            }),
        }
    }
}

impl<T, C> RecoveryLayer<T, C>
where
    T: DriverTiming,
    C: DriverConnectivity,
{
    fn hooks(self, f: impl FnOnce(&mut Hooks)) -> Self {
        let config = Arc::unwrap_or_clone(self.config);
        let mut hooks = Arc::unwrap_or_clone(config.hooks);
        f(&mut hooks);
        RecoveryLayer {
            config: Arc::new(Config {
                timing: config.timing,
                connectivity: config.connectivity,
                hooks: Arc::new(hooks),
            }),
        }
    }

    /// Parks retries while `connectivity` reports offline.
    pub fn with_connectivity<C2>(self, connectivity: C2) -> RecoveryLayer<T, C2>
    where
        C2: DriverConnectivity,
    {
        let config = Arc::unwrap_or_clone(self.config);
        let mut hooks = Arc::unwrap_or_clone(config.hooks);
        hooks.surroundings = surroundings(&config.timing, &connectivity);
        RecoveryLayer {
            config: Arc::new(Config {
                timing: config.timing,
                connectivity,
                hooks: Arc::new(hooks),
            }),
        }
    }

    /// Sends every lifecycle event to `observer`.
    pub fn on_event(self, observer: impl Fn(&LifecycleEvent) + Send + Sync + 'static) -> Self {
        self.hooks(|h| h.observer = Arc::new(observer))
    }

    /// Decodes answers as `protocol` (by default it is guessed from each
    /// request's URL: `…/messages` Anthropic, `…/responses` OpenAI
    /// Responses, `:streamGenerateContent` Gemini, `/api/chat` Ollama,
    /// OpenAI Chat otherwise). An [`ObserveLayer`](crate::ObserveLayer)
    /// inside names the protocol it decodes, and that one is used.
    pub fn with_protocol(self, protocol: ProtocolKind) -> Self {
        self.hooks(|h| h.protocol = ProtocolChoice::Fixed(protocol))
    }

    /// Asks `hook` before every resend.
    pub fn with_admission(self, hook: AdmissionHook) -> Self {
        self.hooks(|h| h.admission = Some(hook))
    }

    /// Shares `budget` between every request through this layer and its
    /// clones, so an outage cannot become a retry storm. A layer has one by
    /// default, [`RetryBudgetConfig::default`] (20 % of requests plus 1
    /// retry/s over 10 s), shared by its clones; this replaces it, for
    /// example with one [`RetryBudget`] shared by several layers (its
    /// clones share their state), or a [`BudgetStore`] kept elsewhere.
    pub fn with_retry_budget(self, budget: impl BudgetStore + 'static) -> Self {
        self.hooks(|h| h.retry_budget = Some(Arc::new(budget)))
    }

    /// Shares endpoint cooldowns through `store` instead of the layer's own:
    /// when a request learns a `Retry-After` (or `retry-after-ms`), the
    /// others bound for the same origin and model hold their next send
    /// until the same instant, or fail at once refused when they may not
    /// wait that long ([`recovery_core::cooldown`]). A layer has an
    /// in-memory store by default, shared by its clones; pass one store to
    /// several layers to share it between them.
    pub fn with_cooldowns(self, store: Arc<dyn CooldownStore>) -> Self {
        self.hooks(|h| h.cooldowns = Some(store))
    }

    /// Keys cooldowns by what `key` returns for a request's head and body,
    /// instead of its origin and model: for example one key per provider
    /// account, when several origins share one organisation's limit. An
    /// alternate ([`RecoveryLayer::with_alternate`]) keeps the origin and
    /// model of what it is sent.
    pub fn with_cooldown_key(
        self,
        key: impl Fn(&http::request::Parts, &[u8]) -> String + Send + Sync + 'static,
    ) -> Self {
        self.hooks(|h| h.cooldown_key = Some(Arc::new(key)))
    }

    /// Lets requests be served by `alternate` (after the alternates added
    /// before it) when their own endpoint fails before any output
    /// ([`recovery_core::failover`]): a failure the policy retries moves
    /// the request on once its target used its share of sends
    /// ([`RecoveryPolicy::attempts_per_target`], 1 by default) or asks for a
    /// wait the request may not give, and a cooldown in force moves it on
    /// before it sends. After the first token a failure never switches.
    /// Each switch is a send: `max_attempts` bounds them all.
    ///
    /// [`RecoveryPolicy::attempts_per_target`]: recovery_core::policy::RecoveryPolicy::attempts_per_target
    pub fn with_alternate(self, alternate: Alternate) -> Self {
        self.hooks(|h| {
            h.targets.push(alternate.target.clone());
            h.alternates.push(alternate);
        })
    }

    /// Each request learns its endpoint's waits on its own: the default
    /// cooldown store is removed.
    pub fn without_cooldowns(self) -> Self {
        self.hooks(|h| h.cooldowns = None)
    }

    /// Retries bounded only per request (the policy's attempts, budget and
    /// deadline), not across requests: the default cross-request
    /// [`RetryBudget`] is removed.
    pub fn without_retry_budget(self) -> Self {
        self.hooks(|h| h.retry_budget = None)
    }

    /// Shows every attempt's raw request, response head and body chunks to
    /// `observer`; an error from it stops recovery before delivery.
    pub fn with_wire_observer(self, observer: impl WireObserver + 'static) -> Self {
        self.hooks(|h| h.wire = Some(Arc::new(observer)))
    }

    /// Declares the endpoint a resumable SSE server: a committed stream
    /// that breaks is re-requested with `Last-Event-ID` set to the last
    /// event id delivered (never with an empty one), whatever SSE protocol
    /// it speaks. Only for servers that honour the header, such as
    /// `recovery-gateway` in front of a provider; providers' own LLM
    /// endpoints do not.
    pub fn with_resumable_sse(self, resumable: bool) -> Self {
        self.hooks(|h| h.sse_resumable = resumable)
    }

    /// Continues committed streams that have no native resume with `hook`:
    /// it gets the original request and the delivered prefix and returns a
    /// continuation request (or declines). Each continuation is a resume: it
    /// is a physical send, counted against `max_attempts` and `max_resumes`.
    pub fn with_continuation(self, hook: ContinuationHook) -> Self {
        self.hooks(|h| h.continuation = Some(hook))
    }
}

impl<T, C> RecoveryLayer<T, C> {
    /// The policy.
    pub fn policy(&self) -> &RecoveryPolicy {
        &self.config.hooks.policy
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
