use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::time::Duration;

use recovery_core::budget::{BudgetStore, RetryBudget, RetryBudgetConfig};
use recovery_core::cooldown::{CooldownStore, Cooldowns};
use recovery_core::exchange::AdmissionAnswer;
use recovery_core::failover::Target;
use recovery_core::failure::Failure;
use recovery_core::lifecycle::{LifecycleEvent, LifecycleObserver};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::{ProtocolChoice, ProtocolKind};
use recovery_core::timing::{AlwaysOnline, Connectivity, Timing};
use tower_layer::Layer;

use super::alternate::Alternate;
use super::bounds::{DriverConnectivity, DriverTiming};
use super::continuation::ContinuationHook;
use super::driver::{Alarm, Surroundings, Timer};
use super::service::Recover;
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

/// A layer's timing and connectivity, as the driver uses them.
impl<T, C> Surroundings for (T, C)
where
    T: Timing<Sleep: Send + 'static> + Send + Sync,
    C: Connectivity<Online: Send + 'static> + Send + Sync,
{
    fn sleep(&self, d: Duration) -> Box<dyn Alarm> {
        Box::new(Sleeping {
            sleep: Box::pin(self.0.sleep(d)),
            elapsed: T::has_elapsed,
        })
    }
    fn wait_online(&self) -> Timer {
        Box::pin(self.1.wait_until_online())
    }
}

/// A sleep of the layer's timing as the driver's alarm.
struct Sleeping<S> {
    sleep: Pin<Box<S>>,
    elapsed: fn(&S) -> Option<bool>,
}

impl<S: Future<Output = ()> + Send> Alarm for Sleeping<S> {
    fn poll_elapsed(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.sleep.as_mut().poll(cx)
    }

    fn has_elapsed(&self) -> Option<bool> {
        (self.elapsed)(&self.sleep)
    }
}

fn surroundings<T, C>(timing: &T, connectivity: &C) -> Arc<dyn Surroundings>
where
    T: DriverTiming,
    C: DriverConnectivity,
{
    Arc::new((timing.clone(), connectivity.clone()))
}

/// Applies [`Recover`] to a service. Put it outermost: outside the
/// [`ObserveLayer`](crate::ObserveLayer), limits and the HTTP client, and turn
/// off the client's own retries.
///
/// `T` is the [`Timing`] (clocks, sleeps, jitter) and `C` the
/// [`Connectivity`]. With the `tokio` feature (on by default) `T` defaults
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
/// `T` is the [`Timing`] (clocks, sleeps, jitter) and `C` the
/// [`Connectivity`]. Without the `tokio` feature there is no default clock:
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
