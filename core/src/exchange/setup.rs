//! What a logical request starts with: its policy, its protocol, its facts,
//! the sends it may draw on, and everything a driver declares before the
//! first send (alternates, a cooldown store, a retry budget, hooks, a
//! deadline, resume and continuation strategies). [`Setup::start`] makes
//! the machine; the order the declarations are applied in is its business.

use std::sync::Arc;

#[cfg(doc)]
use super::SelfDecoded;
use super::io::RequestFacts;
use super::lane::Lane;
use super::resumption::Resumption;
use super::route::Route;
use super::{Exchange, Stage};
use crate::budget::{AttemptAllowance, BudgetStore};
use crate::continuation::Prefill;
use crate::cooldown::CooldownStore;
use crate::failover::Target;
use crate::outcome::ReplayDisabled;
use crate::policy::RecoveryPolicy;
use crate::protocol::ProtocolChoice;
use crate::resume::native_resume;
use crate::timing::{Instant, JitterSource};

#[cfg(doc)]
use crate::budget::RetryBudget;

/// A logical request before its first send. See the module docs.
#[must_use]
pub struct Setup<'a> {
    policy: RecoveryPolicy,
    protocol: &'a ProtocolChoice,
    request: RequestFacts<'a>,
    allowance: AttemptAllowance,
    logical_id: u64,
    alternates: &'a [Target],
    context_window: Option<u64>,
    cooldown: Option<(Arc<dyn CooldownStore>, String)>,
    retry_budget: Option<Arc<dyn BudgetStore>>,
    admission_hook: bool,
    deadline: Option<Instant>,
    prepaid: bool,
    replay: Option<ReplayDisabled>,
    resumable_sse: bool,
    continuation_hook: bool,
    prefill: Option<Prefill>,
    jitter: Option<JitterSource>,
}

impl<'a> Setup<'a> {
    /// A request whose answer is decoded as `protocol` resolves for its
    /// URL, and whose sends are drawn from `allowance` (shared with any
    /// nested layer); `logical_id` names it in events and reports.
    pub fn new(
        policy: RecoveryPolicy,
        protocol: &'a ProtocolChoice,
        request: RequestFacts<'a>,
        allowance: AttemptAllowance,
        logical_id: u64,
    ) -> Self {
        Setup {
            policy,
            protocol,
            request,
            allowance,
            logical_id,
            alternates: &[],
            context_window: None,
            cooldown: None,
            retry_budget: None,
            admission_hook: false,
            deadline: None,
            prepaid: false,
            replay: None,
            resumable_sse: false,
            continuation_hook: false,
            prefill: None,
            jitter: None,
        }
    }

    /// Lets the request be served by `alternates`, in order, before commit
    /// ([`crate::failover`]): each one's URL, body and protocol are derived
    /// from the request's, and its cooldown key from its URL and body.
    /// Drivers send [`Exchange::target`]'s rewrite of the request.
    pub fn alternates(mut self, alternates: &'a [Target]) -> Self {
        self.alternates = alternates;
        self
    }

    /// Declares the context window, in tokens, of the request's own target
    /// (with alternates): a prompt too long for it moves only to an
    /// alternate whose declared window is larger.
    pub fn context_window(mut self, tokens: Option<u64>) -> Self {
        self.context_window = tokens;
        self
    }

    /// Shares waits with the other requests that use `store`: a wait this
    /// request learns from its endpoint (`Retry-After`, `retry-after-ms`)
    /// is noted under `key`, and before each send that is not a resume the
    /// request waits out one in force for `key`, or fails refused when it
    /// may not wait that long ([`crate::cooldown`]). `key` is usually
    /// [`crate::cooldown::key_for`] of the request.
    pub fn cooldown(mut self, store: Arc<dyn CooldownStore>, key: String) -> Self {
        self.cooldown = Some((store, key));
        self
    }

    /// Uses a cross-request retry budget (a [`RetryBudget`], or any
    /// [`BudgetStore`]); this request deposits into it.
    pub fn retry_budget(mut self, budget: Arc<dyn BudgetStore>) -> Self {
        self.retry_budget = Some(budget);
        self
    }

    /// Declares that an admission hook is installed.
    pub fn admission_hook(mut self, installed: bool) -> Self {
        self.admission_hook = installed;
        self
    }

    /// Sets an absolute deadline for the whole request.
    pub fn deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// An outer layer already debited the first send.
    pub fn prepaid_first_send(mut self, prepaid: bool) -> Self {
        self.prepaid = prepaid;
        self
    }

    /// Turns replay off (the request body could not be buffered, or a
    /// driver stopped buffering it at the replay cap). A body given whole
    /// in the request's facts is held to the cap here, for every driver.
    pub fn without_replay(mut self, reason: ReplayDisabled) -> Self {
        self.replay = Some(reason);
        self
    }

    /// Declares the endpoint an SSE stream that honours `Last-Event-ID`.
    pub fn resumable_sse(mut self, resumable: bool) -> Self {
        self.resumable_sse = resumable;
        self
    }

    /// Declares a continuation hook: a committed stream no native strategy
    /// can continue is offered to it ([`super::Io::AskContinuation`]).
    pub fn continuation_hook(mut self, installed: bool) -> Self {
        self.continuation_hook = installed;
        self
    }

    /// Declares how the request's own target continues a committed answer
    /// from a prefill of the delivered text ([`crate::continuation`]).
    /// Alternates declare theirs on their [`Target`].
    pub fn prefill(mut self, prefill: Option<Prefill>) -> Self {
        self.prefill = prefill;
        self
    }

    /// Where the request's backoff jitter is drawn from: the driver's
    /// randomness, given once (`Timing::jitter_source`). Without it the
    /// draws come from a generator seeded with the logical id, which a
    /// driver should draw at random so that clients do not retry in step.
    pub fn jitter(mut self, source: JitterSource) -> Self {
        self.jitter = Some(source);
        self
    }

    /// The machine of the request, started at `now`. `C` is the driver's
    /// chunk type; `D` the evidence of a decoder outside the machine, when
    /// the driver has one ([`SelfDecoded`] when not).
    pub fn start<C: AsRef<[u8]>, D: super::Decoded>(self, now: Instant) -> Exchange<C, D> {
        let Setup {
            policy,
            protocol: choice,
            request,
            allowance,
            logical_id,
            ..
        } = self;
        let protocol = choice.resolve(request.url);
        let mut route = Route::new(request, &protocol);
        route.sse_resumable = self.resumable_sse;
        if let Some((store, key)) = self.cooldown {
            route.share_cooldown(store, key);
        }
        let jitter = self
            .jitter
            .unwrap_or_else(|| JitterSource::seeded(logical_id));
        let replay = self.replay.or_else(|| {
            (request.body.len() > policy.replay_body_cap()).then_some(ReplayDisabled::BodyTooLarge)
        });
        let mut course = super::course::Course::new(policy, allowance, logical_id, jitter, now);
        course.declare(self.admission_hook, self.prepaid, self.deadline, replay);
        if let Some(budget) = self.retry_budget {
            course = course.with_retry_budget(budget);
        }
        let native = native_resume(&protocol, self.resumable_sse, route.background);
        let mut resumption = Resumption::new(native);
        resumption.hook = self.continuation_hook;
        if let Some(prefill) = self.prefill {
            resumption.declare_prefill(0, prefill, request.body);
        }
        if !self.alternates.is_empty() {
            let declared = route.with_alternates(request, choice, &protocol, self.alternates);
            for (i, t) in self.alternates.iter().enumerate() {
                if let Some(prefill) = t.prefill() {
                    resumption.declare_prefill(i + 1, prefill, &t.rewrite_body(request.body));
                }
            }
            let mut windows = declared.windows;
            windows[0] = self.context_window;
            course = course.with_targets(declared.labels, windows);
        }
        if resumption.continues_by_prompt() {
            resumption.keep_prefix(&protocol);
        }
        let timers = super::timers::Timers::new(
            course.policy().idle_timeout(),
            course.policy().progress_timeout(),
            now,
        );
        Exchange {
            course,
            stage: Stage::ToSend { resume: false },
            route,
            lane: Lane {
                attempt: super::attempt::Attempt::new(),
                outbox: super::outbox::Outbox::new(),
                timers,
                protocol,
                resumption: (!resumption.is_idle()).then_some(resumption),
            },
            race: None,
        }
    }
}

impl std::fmt::Debug for Setup<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Setup")
            .field("logical_id", &self.logical_id)
            .field("alternates", &self.alternates.len())
            .finish_non_exhaustive()
    }
}
