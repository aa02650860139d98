//! The sans-IO machine of one logical request: every attempt's head, chunk,
//! end, read error, consumer drop, cancellation and timer goes in; what the
//! driver does next comes out. Every driver runs this one machine, so the
//! same evidence gives the same decision whatever the runtime.
//!
//! A driver only does I/O. It asks [`Exchange::poll`] what to do ([`Io`]),
//! does it, and reports what happened: [`Exchange::on_sent`],
//! [`Exchange::on_head`], [`Exchange::on_chunk`], [`Exchange::on_end`],
//! [`Exchange::on_error`], [`Exchange::admission`], [`Exchange::online`],
//! [`Exchange::continuation`], [`Exchange::cancel`]. Time leaves the
//! machine as a deadline ([`Exchange::poll_timeout`], in the manner of
//! quinn-proto): the driver keeps one sleep, and when it wakes calls
//! [`Exchange::handle_timeout`]. Lifecycle events come out of
//! [`Exchange::drain_events`].
//!
//! What is decided here, once: the commit trigger (first semantic fragment,
//! hold-back cap, terminal proof), the end-of-body rule (proof or a typed
//! failure), the unfinished-frame rule, error heads (`Retry-After` in every
//! form against the injected wall clock, `retry-after-ms`,
//! `x-should-retry`, the capped error body), the content-type rule, the
//! protocol default, the stall and head timers, the resume gate
//! (event-granular delivery, duplicate dropping, continuation splice), and
//! that nothing after terminal proof changes a completed outcome.
//!
//! ```
//! use std::borrow::Cow;
//! use std::time::{Duration, SystemTime};
//! use recovery_core::budget::AttemptAllowance;
//! use recovery_core::exchange::{Env, Exchange, Head, Io, RequestFacts, Send};
//! use recovery_core::policy::RecoveryPolicy;
//! use recovery_core::protocol::ProtocolChoice;
//! use recovery_core::timing::{Fraction, Instant};
//!
//! struct Clock(Instant);
//! impl Env for Clock {
//!     fn now(&self) -> Instant { self.0 }
//!     fn wall_now(&self) -> SystemTime { SystemTime::UNIX_EPOCH }
//!     fn jitter(&self) -> Fraction { Fraction::new(0.5) }
//!     fn online(&self) -> bool { true }
//! }
//! struct Ok200;
//! impl Head for Ok200 {
//!     fn status(&self) -> u16 { 200 }
//!     fn header(&self, name: &str) -> Option<Cow<'_, str>> {
//!         (name == "content-type").then_some(Cow::Borrowed("text/event-stream"))
//!     }
//! }
//!
//! let env = Clock(Instant::from_origin(Duration::ZERO));
//! let request = RequestFacts::new("POST", "/v1/chat/completions", b"{}");
//! let mut ex: Exchange<Vec<u8>> = Exchange::new(
//!     RecoveryPolicy::default(),
//!     &ProtocolChoice::Auto,
//!     request,
//!     AttemptAllowance::new(3),
//!     7,
//!     env.now(),
//! );
//! assert!(matches!(ex.poll(&env), Io::Send(Send::Original)));
//! ex.on_sent(&env);
//! ex.on_head(&env, &Ok200, None);
//! let delta = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n".to_vec();
//! assert_eq!(ex.on_chunk(&env, delta), None); // held back until commit...
//! assert!(matches!(ex.poll(&env), Io::Respond)); // ...which this semantic delta is
//! assert!(matches!(ex.poll(&env), Io::Deliver(_)));
//! assert!(matches!(ex.poll(&env), Io::Read));
//! ```

mod decoded;
mod gate;

use std::borrow::Cow;
use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use std::sync::Arc;

use bytes::Bytes;

pub use crate::decision::AdmissionAnswer;
pub use decoded::{Decoded, SelfDecoded};

#[cfg(doc)]
use crate::budget::RetryBudget;
use crate::budget::{AttemptAllowance, BudgetStore};
use crate::continuation::splice::Splice;
use crate::continuation::{DeliveredPrefix, Prefill, prefill_body};
use crate::cooldown::CooldownStore;
use crate::decision::Action;
use crate::engine::{CooldownStep, Recovery};
use crate::failure::{Acceptance, Failure, FailureKind, Phase, Stall, Unfinished};
use crate::lifecycle::{CommitTrigger, LifecycleEvent};
use crate::observer::{EndOfStream, StreamObserver};
use crate::outcome::{CancelPhase, Outcome, ReplayDisabled};
use crate::policy::RecoveryPolicy;
use crate::progress::{Progress, Proof, ResumeCursor, Terminal};
use crate::protocol::{BodyForm, ProtocolChoice, ProtocolKind, classify_error_body};
use crate::report::{RecoveryReport, SeamStrategy};
use crate::resume::{ResumePlan, ResumeRequest, native_resume, plan_at};
use crate::retry_after::{RetryAfter, parse_should_retry};
use crate::safe::{rate_limits_with, request_id_with};
use crate::timing::{Connectivity, Fraction, Instant, Timing};
use crate::wire::Limits;
use decoded::Source;
use gate::Gate;

/// How long a completed body may stay silent before the driver stops
/// reading it: bytes that follow strong proof (a `data: [DONE]` after
/// `response.completed`, the end of the chunked body) come at once; an SDK
/// that reads to the end must not wait on a server that never closes.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// What the driver's surroundings say now: the clocks, a jitter draw and
/// connectivity. Every [`Timing`] with a [`Connectivity`] is one.
pub trait Env {
    /// Now, on the monotonic clock.
    fn now(&self) -> Instant;
    /// Now, on the wall clock (for HTTP-date `Retry-After` values).
    fn wall_now(&self) -> SystemTime;
    /// A jitter draw.
    fn jitter(&self) -> Fraction;
    /// Whether the platform believes it is online.
    fn online(&self) -> bool;
}

impl<E: Env + ?Sized> Env for &E {
    fn now(&self) -> Instant {
        (**self).now()
    }
    fn wall_now(&self) -> SystemTime {
        (**self).wall_now()
    }
    fn jitter(&self) -> Fraction {
        (**self).jitter()
    }
    fn online(&self) -> bool {
        (**self).online()
    }
}

/// A [`Timing`] and a [`Connectivity`] together are an environment.
impl<T: Timing, C: Connectivity> Env for (T, C) {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn wall_now(&self) -> SystemTime {
        self.0.wall_now()
    }
    fn jitter(&self) -> Fraction {
        self.0.jitter()
    }
    fn online(&self) -> bool {
        self.1.is_online()
    }
}

/// A response head as the driver received it.
pub trait Head {
    /// The status code (0 for a browser's opaque redirect).
    fn status(&self) -> u16;
    /// A header's value by lowercase name; the first one when repeated.
    fn header(&self, name: &str) -> Option<Cow<'_, str>>;
    /// A browser hid a redirect behind an `opaqueredirect` response.
    fn opaque_redirect(&self) -> bool {
        false
    }
}

impl Head for http::response::Parts {
    fn status(&self) -> u16 {
        self.status.as_u16()
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(Cow::Borrowed)
    }
}

/// What the machine needs to know of the logical request.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestFacts<'a> {
    /// The method.
    pub method: &'a str,
    /// The URL (absolute, or a path with its query).
    pub url: &'a str,
    /// The buffered body (empty when it could not be buffered).
    pub body: &'a [u8],
}

impl<'a> RequestFacts<'a> {
    /// The facts of a request: its method, its URL (absolute, or a path with
    /// its query) and its buffered body (empty when it could not be
    /// buffered).
    pub fn new(method: &'a str, url: &'a str, body: &'a [u8]) -> Self {
        RequestFacts { method, url, body }
    }
}

/// A chunk for the consumer: one the driver read, as it was, or one the
/// machine cut out of the stream (a complete event, when delivery is event
/// by event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk<C> {
    /// A chunk the driver read.
    Read(C),
    /// A complete event the machine cut out.
    Made(Bytes),
}

/// Which request a send carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Send {
    /// The original request (the first send, or a replay).
    Original,
    /// A provider-native resume of the committed stream.
    Resume(ResumeRequest),
    /// The continuation the caller's hook returned.
    Continuation,
    /// A declared prefill continuation of the committed answer on
    /// [`Exchange::target`]: that target's request (URL, headers) with this
    /// body, which carries the delivered text as the final assistant
    /// message ([`crate::continuation::Prefill`]).
    Prefill(Bytes),
}

/// What an admission hook is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionRequest {
    /// The logical request.
    pub logical_id: String,
    /// The send number the resend would be.
    pub next_attempt: u32,
    /// The failure that prompted it (safe evidence only).
    pub failure: Failure,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Io<C> {
    /// Send a request (the attempt is counted already); call
    /// [`Exchange::on_sent`] once it is on its way.
    Send(Send),
    /// Keep waiting for the response head.
    AwaitHead,
    /// Read the next chunk of the body.
    Read,
    /// Close the current attempt's response: it is not used any more.
    Release,
    /// Hand the committed attempt's head to the caller; its body follows as
    /// [`Io::Deliver`] chunks.
    Respond,
    /// Hand the final error response to the caller as the server sent it:
    /// [`Exchange::take_held`] first, then the rest of its body untouched.
    RespondError,
    /// Hand this chunk to the consumer.
    Deliver(Chunk<C>),
    /// Sleep until [`Exchange::poll_timeout`].
    Sleep,
    /// Wait until the platform is online ([`Exchange::online`]) or
    /// [`Exchange::poll_timeout`].
    WaitOnline,
    /// Ask the admission hook; answer with [`Exchange::admission`]. Pending
    /// is not approval: [`Exchange::poll_timeout`] bounds the wait.
    AskAdmission(AdmissionRequest),
    /// Keep waiting for the admission hook.
    AwaitAdmission,
    /// Ask the continuation hook for a continuation of
    /// [`Exchange::delivered_prefix`]; answer with [`Exchange::continuation`].
    AskContinuation,
    /// The request ended: the body's clean end (`Ok`), or the typed outcome
    /// it fails with. Before [`Io::Respond`], the request fails.
    End(Result<(), Outcome>),
}

/// Where the request is.
#[derive(Debug)]
enum Stage {
    /// The next send is due.
    ToSend,
    /// The request is on its way: connecting, writing.
    Sending { head_by: Option<Instant> },
    /// Sent; no head yet.
    AwaitingHead { head_by: Option<Instant> },
    /// Reading (a capped part of) an error body.
    ErrorBody(Box<ErrorHead>),
    /// Reading a successful body, before or after commit.
    Streaming,
    /// Completed (strong proof was handed out); the rest of the body passes
    /// through until it ends or is silent for [`DRAIN_GRACE`], and nothing
    /// that follows changes the outcome.
    Draining,
    /// A wait before the next send.
    Waiting { until: Instant, resume: bool },
    /// Offline; `then_send` when the resume is due as soon as it is back.
    Parked {
        limit: Option<Instant>,
        then_send: bool,
    },
    /// Waiting for the admission hook.
    Admission {
        limit: Option<Instant>,
        request: Option<Box<AdmissionRequest>>,
    },
    /// Waiting for the continuation hook's answer.
    Continuation(Box<Failure>),
    /// The request ended.
    Ended,
}

/// An error head whose body is being read for its provider code.
#[derive(Debug)]
struct ErrorHead {
    status: u16,
    retry_after: RetryAfter,
    should_retry: Option<bool>,
    body: Vec<u8>,
    read: usize,
}

/// How many checks a stall timer makes over its timeout: activity is
/// noticed at the next check, so a stall is detected between the timeout
/// and the timeout plus a sixteenth of it after the last byte, never
/// before. A chunk costs a counter, not a clock read (undici keeps coarse
/// timers for the same reason).
pub const CHECKS_PER_TIMEOUT: u32 = 16;

/// Stall timers of the body being read. Chunks only count; the clock is
/// read at checks (a deadline the driver wakes the machine for), which
/// move the last-activity marks to the check's time when something came
/// since the previous one.
#[derive(Debug, Clone, Copy)]
struct Watch {
    idle: Option<Duration>,
    progress: Option<Duration>,
    first_token: Option<Duration>,
    /// The first semantic fragment is due by then (a streamed answer's
    /// head came, nothing committed yet).
    first_token_by: Option<Instant>,
    /// No activity after this (as of the last check).
    idle_since: Instant,
    /// No new semantic fragment after this (as of the last check).
    progress_since: Instant,
    checked_at: Instant,
    chunks_checked: u64,
    semantic_checked: u64,
    /// The next deadline with nothing new since the last check, and with
    /// something new (then the next check may come first); planned at
    /// every check, so that asking costs a comparison.
    due_quiet: Option<Instant>,
    due_active: Option<Instant>,
}

impl Watch {
    fn restart(&mut self, now: Instant, chunks: u64) {
        self.idle_since = now;
        self.progress_since = now;
        self.checked_at = now;
        self.chunks_checked = chunks;
        self.semantic_checked = 0;
    }

    /// The interval between checks while activity is pending.
    fn granularity(timeout: Duration) -> Duration {
        (timeout / CHECKS_PER_TIMEOUT).max(Duration::from_millis(1))
    }

    /// Notes what came since the last check.
    fn check(&mut self, now: Instant, chunks: u64, semantic: u64) {
        if chunks != self.chunks_checked {
            self.chunks_checked = chunks;
            self.idle_since = now;
        }
        if semantic != self.semantic_checked {
            self.semantic_checked = semantic;
            self.progress_since = now;
        }
        self.checked_at = now;
    }
}

/// How a committed stream can be continued, and where it is.
#[derive(Debug)]
struct Resumption {
    /// A native strategy may apply (Responses background, declared SSE).
    native: bool,
    /// The caller installed a continuation hook.
    hook: bool,
    /// The cursor reached over every attempt so far.
    cursor: ResumeCursor,
    /// What the consumer has, for the continuation hook.
    prefix: Option<DeliveredPrefix>,
    /// The hook gave a continuation for the next send.
    continuation_ready: bool,
    /// The targets that continue a prefill, by index (0: the request's
    /// own), with the body each sends.
    prefill: Vec<Option<(Prefill, Bytes)>>,
    /// A prefill continuation is the next send: its body and the splice of
    /// its stream.
    prefill_ready: Option<(Bytes, Box<Splice>)>,
    /// The gate for the next attempt's stream: the sequence it resumes
    /// after, and the splice of a continuation.
    next_gate: Option<(Option<u64>, Option<Box<Splice>>)>,
}

impl Resumption {
    fn new(native: bool) -> Box<Self> {
        Box::new(Resumption {
            native,
            hook: false,
            cursor: ResumeCursor::default(),
            prefix: None,
            continuation_ready: false,
            prefill: Vec::new(),
            prefill_ready: None,
            next_gate: None,
        })
    }

    /// Whether some target continues a prefill.
    fn prefills(&self) -> bool {
        self.prefill.iter().any(Option::is_some)
    }

    /// Declares target `i`'s prefill form and the body it sends.
    fn declare_prefill(&mut self, i: usize, prefill: Prefill, body: &[u8]) {
        if self.prefill.len() <= i {
            self.prefill.resize_with(i + 1, || None);
        }
        self.prefill[i] = Some((prefill, Bytes::copy_from_slice(body)));
    }
}

/// The machine of one logical request. See the module docs.
///
/// `C` is the driver's chunk type; `D` the evidence of a decoder outside
/// the machine, when the driver has one ([`SelfDecoded`] when not).
#[derive(Debug)]
pub struct Exchange<C, D = SelfDecoded> {
    engine: Recovery,
    protocol: ProtocolKind,
    limits: Limits,
    method: String,
    url: String,
    stage: Stage,
    /// Chunks held back before commit, queued for the consumer after.
    out: VecDeque<Chunk<C>>,
    held_bytes: usize,
    delivered_bytes: u64,
    /// Chunks read, for the stall timers' checks.
    chunks: u64,
    /// The engine's commit, mirrored where every chunk reads it.
    committed: bool,
    /// A passing chunk was decoded and waits for [`Exchange::on_kept_chunk`].
    kept: bool,
    source: Option<Source<D>>,
    gate: Option<Box<Gate>>,
    watch: Watch,
    status: Option<u16>,
    resumption: Option<Box<Resumption>>,
    /// A failure to act on once the queued chunks are delivered (a provider
    /// error arrives inside a chunk the consumer still gets).
    after_delivery: Option<Box<Failure>>,
    release: bool,
    respond_due: bool,
    responded: bool,
    error_response: bool,
    error_body: Vec<u8>,
    finished: Option<Result<(), Outcome>>,
    admission_hook: bool,
    prepaid: bool,
    /// The request asked for a background stream (`background` and
    /// `stream` both true), which OpenAI Responses can resume.
    background: bool,
    /// The endpoint was declared an SSE server that honours `Last-Event-ID`.
    sse_resumable: bool,
    /// The cooldown store shared with other requests, and this one's key.
    cooldown: Option<Shared>,
    /// Where each target sends (the request's own first); empty when the
    /// request has no alternates.
    targets: Vec<TargetFacts>,
    /// The target `url`, `protocol`, `background` and the cooldown key are
    /// those of.
    at_target: usize,
}

/// What the machine needs of one target.
#[derive(Debug)]
struct TargetFacts {
    url: String,
    protocol: ProtocolKind,
    background: bool,
    cooldown_key: String,
}

/// A cooldown store and the key of this request in it.
struct Shared {
    store: Arc<dyn CooldownStore>,
    key: String,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cooldown")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl<C: AsRef<[u8]>, D: Decoded> Exchange<C, D> {
    /// Starts a logical request at `now`: its answer is decoded as
    /// `protocol` resolves for its URL, and its sends are drawn from
    /// `allowance` (shared with any nested layer).
    pub fn new(
        policy: RecoveryPolicy,
        protocol: &ProtocolChoice,
        request: RequestFacts<'_>,
        allowance: AttemptAllowance,
        logical_id: u64,
        now: Instant,
    ) -> Self {
        let protocol = protocol.resolve(request.url);
        let watch = Watch {
            idle: policy.idle_timeout(),
            progress: policy.progress_timeout(),
            first_token: policy.first_token_timeout(),
            first_token_by: None,
            idle_since: now,
            progress_since: now,
            checked_at: now,
            chunks_checked: 0,
            semantic_checked: 0,
            due_quiet: None,
            due_active: None,
        };
        let background = crate::resume::is_background_stream(request.body);
        let native = native_resume(&protocol, false, background);
        let resumption = native.then(|| Resumption::new(native));
        Exchange {
            engine: Recovery::new(policy, allowance, logical_id, now),
            protocol,
            limits: Limits::default(),
            method: request.method.to_owned(),
            url: request.url.to_owned(),
            stage: Stage::ToSend,
            out: VecDeque::new(),
            held_bytes: 0,
            delivered_bytes: 0,
            chunks: 0,
            committed: false,
            kept: false,
            source: None,
            gate: None,
            watch,
            status: None,
            resumption,
            after_delivery: None,
            release: false,
            respond_due: false,
            responded: false,
            error_response: false,
            error_body: Vec::new(),
            finished: None,
            admission_hook: false,
            prepaid: false,
            background,
            sse_resumable: false,
            cooldown: None,
            targets: Vec::new(),
            at_target: 0,
        }
    }

    /// Lets the request be served by `alternates`, in order, before commit
    /// ([`crate::failover`]). `request` and `protocol` are what
    /// [`Exchange::new`] was given: each alternate's URL, body and protocol
    /// are derived from them, and its cooldown key from its URL and body.
    /// Drivers send [`Exchange::target`]'s rewrite of the request.
    #[must_use]
    pub fn with_alternates(
        mut self,
        request: RequestFacts<'_>,
        protocol: &ProtocolChoice,
        alternates: &[crate::failover::Target],
    ) -> Self {
        if alternates.is_empty() {
            return self;
        }
        let primary = TargetFacts {
            url: self.url.clone(),
            protocol: self.protocol.clone(),
            background: self.background,
            cooldown_key: self.cooldown.as_ref().map_or_else(
                || crate::cooldown::key_for(request.url, request.body),
                |c| c.key.clone(),
            ),
        };
        let mut labels = vec![crate::failover::PRIMARY.to_owned()];
        let mut windows = vec![None];
        self.targets.push(primary);
        for (i, t) in alternates.iter().enumerate() {
            windows.push(t.context_window());
            let url = t.rewrite_url(request.url).into_owned();
            let body = t.rewrite_body(request.body);
            if let Some(prefill) = t.prefill() {
                self.resumption_mut().declare_prefill(i + 1, prefill, &body);
                self.keep_prefix();
            }
            self.targets.push(TargetFacts {
                protocol: t.protocol().unwrap_or(protocol).resolve(&url),
                background: crate::resume::is_background_stream(&body),
                cooldown_key: crate::cooldown::key_for(&url, &body),
                url,
            });
            labels.push(t.label().to_owned());
        }
        self.engine = self
            .engine
            .with_targets(labels)
            .with_context_windows(windows);
        self
    }

    /// Declares the context window, in tokens, of the request's own target
    /// (after [`Exchange::with_alternates`]; without alternates it changes
    /// nothing): a prompt too long for it moves only to an alternate whose
    /// declared window is larger.
    #[must_use]
    pub fn with_context_window(mut self, tokens: Option<u64>) -> Self {
        self.engine.declare_own_window(tokens);
        self
    }

    /// The target the current (or next) send goes to: 0 for the request as
    /// it was given, `i` for alternate `i` ([`Exchange::with_alternates`]).
    pub fn target(&self) -> usize {
        self.engine.target()
    }

    /// Takes up the facts of the target the engine moved to.
    #[cold]
    fn adopt_target(&mut self) {
        let i = self.engine.target();
        let Some(facts) = self.targets.get(i) else {
            return;
        };
        self.at_target = i;
        self.url.clone_from(&facts.url);
        self.background = facts.background;
        let protocol = facts.protocol.clone();
        if let Some(c) = self.cooldown.as_mut() {
            c.key.clone_from(&facts.cooldown_key);
        }
        self.adopt(protocol);
    }

    /// Shares waits with the other requests that use `store`: a wait this
    /// request learns from its endpoint (`Retry-After`, `retry-after-ms`)
    /// is noted under `key`, and before each send that is not a resume the
    /// request waits out one in force for `key`, or fails refused when it
    /// may not wait that long ([`crate::cooldown`]). `key` is usually
    /// [`crate::cooldown::key_for`] of the request.
    pub fn with_cooldown(mut self, store: Arc<dyn CooldownStore>, key: String) -> Self {
        if let Some(own) = self.targets.first_mut() {
            own.cooldown_key.clone_from(&key);
        }
        self.cooldown = Some(Shared { store, key });
        self
    }

    /// Uses a cross-request retry budget (a [`RetryBudget`], or any
    /// [`BudgetStore`]); this request deposits into it.
    #[must_use]
    pub fn with_retry_budget(mut self, budget: Arc<dyn BudgetStore>) -> Self {
        self.engine = self.engine.with_retry_budget(budget);
        self
    }

    /// Declares that an admission hook is installed.
    #[must_use]
    pub fn with_admission_hook(mut self, installed: bool) -> Self {
        self.admission_hook = installed;
        self.engine = self.engine.with_admission_hook(installed);
        self
    }

    /// Sets an absolute deadline for the whole request.
    #[must_use]
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.engine = self.engine.with_deadline(deadline);
        self
    }

    /// An outer layer already debited the first send.
    #[must_use]
    pub fn with_prepaid_first_send(mut self, prepaid: bool) -> Self {
        self.prepaid = prepaid;
        self
    }

    /// Turns replay off (the request body could not be buffered, or was
    /// over the replay cap).
    #[must_use]
    pub fn without_replay(mut self, reason: ReplayDisabled) -> Self {
        self.engine.disable_replay(reason);
        self
    }

    /// Declares the endpoint an SSE stream that honours `Last-Event-ID`.
    #[must_use]
    pub fn with_resumable_sse(mut self, resumable: bool) -> Self {
        self.sse_resumable = resumable;
        let native = native_resume(&self.protocol, resumable, self.background);
        self.resumption_mut().native = native;
        self.drop_idle_resumption();
        self
    }

    /// Declares a continuation hook: a committed stream no native strategy
    /// can continue is offered to it ([`Io::AskContinuation`]).
    #[must_use]
    pub fn with_continuation_hook(mut self, installed: bool) -> Self {
        self.resumption_mut().hook = installed;
        if installed {
            self.keep_prefix();
        }
        self.drop_idle_resumption();
        self
    }

    fn resumption_mut(&mut self) -> &mut Resumption {
        self.resumption
            .get_or_insert_with(|| Resumption::new(false))
    }

    fn drop_idle_resumption(&mut self) {
        if self
            .resumption
            .as_ref()
            .is_some_and(|r| !r.native && !r.hook && !r.prefills())
        {
            self.resumption = None;
        }
    }

    /// Keeps what the consumer receives, for a continuation.
    fn keep_prefix(&mut self) {
        let protocol = self.protocol.clone();
        let r = self.resumption_mut();
        if r.prefix.is_none() {
            r.prefix = Some(DeliveredPrefix::new(protocol));
        }
    }

    /// Declares how the request's own target continues a committed answer
    /// from a prefill of the delivered text ([`crate::continuation`]);
    /// `request` is what [`Exchange::new`] was given. Alternates declare
    /// theirs on their [`crate::failover::Target`].
    #[must_use]
    pub fn with_prefill(mut self, request: RequestFacts<'_>, prefill: Option<Prefill>) -> Self {
        if let Some(prefill) = prefill {
            self.resumption_mut()
                .declare_prefill(0, prefill, request.body);
            self.keep_prefix();
        }
        self
    }

    /// The protocol the answer is decoded as.
    pub fn protocol(&self) -> &ProtocolKind {
        &self.protocol
    }

    /// The logical id, as events show it.
    pub fn logical_id(&self) -> &str {
        self.engine.logical_id()
    }

    /// The `Idempotency-Key` the send about to go out carries, when the
    /// policy asks for one and the request (`has_one`: it already has the
    /// header) does not bring its own: the driver sets it on each send (the
    /// original, a replay, a resume, a continuation). One key per logical
    /// request, so every send of it carries the same.
    pub fn idempotency_key(&self, has_one: bool) -> Option<String> {
        (!has_one && self.engine.policy().idempotency_key()).then(|| {
            let mut key = String::from("recovery-");
            key.push_str(self.engine.logical_id());
            key
        })
    }

    /// The current physical send number (0 before the first).
    pub fn wire_attempt(&self) -> u32 {
        self.engine.wire_attempt()
    }

    /// The policy in force.
    pub fn policy(&self) -> &RecoveryPolicy {
        self.engine.policy()
    }

    /// Whether output has reached (or is queued for) the consumer.
    pub fn is_committed(&self) -> bool {
        self.engine.is_committed()
    }

    /// The outcome, once the request ended.
    pub fn outcome(&self) -> Option<&Outcome> {
        self.engine.outcome()
    }

    /// The report so far.
    pub fn report(&self) -> &RecoveryReport {
        self.engine.report()
    }

    /// Whether lifecycle events wait in [`Exchange::drain_events`] (a
    /// driver that crosses a boundary per call asks before draining).
    pub fn has_events(&self) -> bool {
        self.engine.has_events()
    }

    /// Takes the lifecycle events produced since the last call, in order.
    pub fn drain_events(&mut self) -> std::vec::Drain<'_, LifecycleEvent> {
        self.engine.drain_events()
    }

    /// The last error body read (capped at the policy's evidence cap):
    /// sensitive evidence, for `inspect_*` only.
    pub fn error_body(&self) -> &[u8] {
        &self.error_body
    }

    /// What the consumer has received, as the continuation hook is given
    /// it (present when a continuation hook is declared).
    pub fn delivered_prefix(&self) -> Option<&DeliveredPrefix> {
        self.resumption.as_ref().and_then(|r| r.prefix.as_ref())
    }

    /// The chunks held for the consumer, taken out (the final error
    /// response's first chunks, after [`Io::RespondError`]).
    pub fn take_held(&mut self) -> VecDeque<Chunk<C>> {
        std::mem::take(&mut self.out)
    }

    /// Whether the head just received may become the final answer as the
    /// server sent it (an error head, before commit): a driver whose
    /// runtime can copy a body (a `Response.clone()`) reads the copy and
    /// keeps the original for [`Io::RespondError`].
    pub fn keeps_response(&self) -> bool {
        !self.responded && matches!(self.stage, Stage::ErrorBody(_))
            || matches!(self.stage, Stage::Ended) && self.error_response
    }

    /// Whether the body streams the committed attempt with nothing queued,
    /// pending or gated: a driver may then read and hand out chunks through
    /// [`Exchange::on_chunk`] alone, without asking [`Exchange::poll`].
    #[inline]
    pub fn is_passing_through(&self) -> bool {
        self.responded
            && self.out.is_empty()
            && self.after_delivery.is_none()
            && self.gate.is_none()
            && !self.release
            && matches!(self.stage, Stage::Streaming | Stage::Draining)
    }

    /// When the driver must wake the machine ([`Exchange::handle_timeout`])
    /// if nothing else happens first.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.stage {
            Stage::Sending { head_by } | Stage::AwaitingHead { head_by } => *head_by,
            Stage::ErrorBody(_) | Stage::Draining | Stage::Streaming => {
                if self.chunks == self.watch.chunks_checked {
                    self.watch.due_quiet
                } else {
                    self.watch.due_active
                }
            }
            Stage::Waiting { until, .. } => Some(*until),
            Stage::Parked { limit, .. } | Stage::Admission { limit, .. } => *limit,
            Stage::ToSend | Stage::Continuation(_) | Stage::Ended => None,
        }
    }

    /// Plans the stall timers' next deadlines for the stage: an idle,
    /// progress or first-token timeout, or, when chunks came since the last
    /// check, the next check if it comes first.
    fn plan_watch(&mut self) {
        let first_token = match self.stage {
            Stage::Streaming if !self.committed => self.watch.first_token_by,
            _ => None,
        };
        let (idle, progress) = match self.stage {
            Stage::ErrorBody(_) => (self.watch.idle, None),
            Stage::Draining => (Some(DRAIN_GRACE), None),
            Stage::Streaming => {
                let proven = self.source.as_ref().is_some_and(Source::terminal_seen);
                (self.watch.idle, self.watch.progress.filter(|_| !proven))
            }
            _ => (None, None),
        };
        let w = &mut self.watch;
        let idle_at = idle.map(|d| w.idle_since + d);
        let progress_at = progress.map(|d| w.progress_since + d);
        w.due_quiet = match (idle_at, progress_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let finest = match (idle, progress) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        w.due_active = finest.map(|f| {
            let check = w.checked_at + Watch::granularity(f);
            w.due_quiet.map_or(check, |d| d.min(check))
        });
        if let Some(by) = first_token {
            // Whatever came: only a semantic fragment (a commit) stops it.
            w.due_quiet = Some(w.due_quiet.map_or(by, |d| d.min(by)));
            w.due_active = Some(w.due_active.map_or(by, |d| d.min(by)));
        }
    }

    /// Restarts the stall timers at `now` for the stage just entered.
    fn restart_watch(&mut self, now: Instant) {
        self.watch.restart(now, self.chunks);
        self.plan_watch();
    }

    /// A check of the stall timers: notes what came since the last one.
    fn check_watch(&mut self, now: Instant) {
        let semantic = self
            .source
            .as_ref()
            .map_or(self.watch.semantic_checked, Source::semantic_fragments);
        self.watch.check(now, self.chunks, semantic);
        self.plan_watch();
    }

    /// What the driver does next. Call again after every reported event.
    pub fn poll<E: Env + ?Sized>(&mut self, env: &E) -> Io<C> {
        loop {
            if self.release {
                self.release = false;
                return Io::Release;
            }
            if self.respond_due {
                self.respond_due = false;
                self.responded = true;
                return Io::Respond;
            }
            if self.responded
                && let Some(chunk) = self.out.pop_front()
            {
                self.delivered_bytes += match &chunk {
                    Chunk::Read(c) => c.as_ref().len() as u64,
                    Chunk::Made(b) => b.len() as u64,
                };
                if self.out.is_empty() {
                    self.settle_if_proven(env);
                }
                return Io::Deliver(chunk);
            }
            if let Some(failure) = self.after_delivery.take() {
                self.fail_attempt(env, *failure);
                continue;
            }
            if matches!(self.stage, Stage::ToSend) {
                if let Some(io) = self.begin_send(env) {
                    return io;
                }
                continue;
            }
            return match &mut self.stage {
                Stage::ToSend => continue,
                Stage::Sending { .. } | Stage::AwaitingHead { .. } => Io::AwaitHead,
                Stage::ErrorBody(_) | Stage::Streaming | Stage::Draining => Io::Read,
                Stage::Waiting { .. } => Io::Sleep,
                Stage::Parked { .. } => Io::WaitOnline,
                Stage::Admission { request, .. } => match request.take() {
                    Some(r) => Io::AskAdmission(*r),
                    None => Io::AwaitAdmission,
                },
                Stage::Continuation(_) => Io::AskContinuation,
                Stage::Ended => {
                    if self.error_response {
                        self.error_response = false;
                        Io::RespondError
                    } else {
                        Io::End(
                            self.finished
                                .clone()
                                .unwrap_or(Err(Outcome::Exhausted { attempts: 0 })),
                        )
                    }
                }
            };
        }
    }

    /// The send is due: counts it (allowance, deadline, retry permit) and
    /// says which request to send, or ends the request.
    fn begin_send<E: Env + ?Sized>(&mut self, env: &E) -> Option<Io<C>> {
        let now = env.now();
        if self.engine.target() != self.at_target {
            self.adopt_target();
        }
        if !self.engine.is_committed()
            && let Some(c) = &self.cooldown
            && let Some(wait) = c.store.remaining(&c.key, now)
        {
            match self.engine.hold_for_cooldown(now, wait) {
                Ok(CooldownStep::Wait(wait)) => {
                    self.stage = Stage::Waiting {
                        until: now + wait,
                        resume: false,
                    };
                    return None;
                }
                // Decided again for the next target, on the next turn.
                Ok(CooldownStep::Switched) => return None,
                Ok(CooldownStep::Send) => {}
                Err(outcome) => {
                    self.end(Err(outcome));
                    return None;
                }
            }
        }
        let prepaid = std::mem::take(&mut self.prepaid);
        if let Err(outcome) = self.engine.begin_attempt(now, false, prepaid) {
            self.end(Err(outcome));
            return None;
        }
        self.out.clear();
        self.held_bytes = 0;
        self.source = None;
        self.gate = None;
        self.status = None;
        self.error_response = false;
        let head_by = self.engine.policy().head_timeout().map(|d| now + d);
        self.stage = Stage::Sending { head_by };
        let resumed = self
            .engine
            .report()
            .attempts
            .last()
            .is_some_and(|a| a.resume);
        if !resumed {
            if let Some(r) = self.resumption.as_mut() {
                r.next_gate = Some((None, None));
            }
            return Some(Io::Send(Send::Original));
        }
        let delivered: u64 = self
            .engine
            .report()
            .attempts
            .iter()
            .map(|a| a.progress.delivered_bytes)
            .sum();
        let plan = self.plan();
        let Some(r) = self.resumption.as_mut() else {
            self.end(Err(Outcome::Exhausted {
                attempts: self.engine.wire_attempt(),
            }));
            return None;
        };
        match plan {
            Some(plan) => {
                let strategy = match plan {
                    ResumePlan::ResponsesBackground { .. } => SeamStrategy::ResponsesBackground,
                    ResumePlan::LastEventId { .. } => SeamStrategy::LastEventId,
                };
                r.next_gate = Some((plan.after_sequence(), None));
                if let Ok(request) = plan.request(&self.method, &self.url) {
                    self.engine.record_seam(strategy, delivered);
                    Some(Io::Send(Send::Resume(request)))
                } else {
                    self.resume_impossible(env);
                    None
                }
            }
            None if r.continuation_ready => {
                r.continuation_ready = false;
                let facts = r.prefix.as_ref().map(|p| p.seam.clone());
                let splice = Splice::new(&self.protocol, facts.unwrap_or_default(), "");
                r.next_gate = Some((None, Some(Box::new(splice))));
                self.engine
                    .record_seam(SeamStrategy::Continuation, delivered);
                Some(Io::Send(Send::Continuation))
            }
            None if r.prefill_ready.is_some() => {
                let (body, splice) = r.prefill_ready.take()?;
                r.next_gate = Some((None, Some(splice)));
                self.engine.record_seam(SeamStrategy::Prefill, delivered);
                Some(Io::Send(Send::Prefill(body)))
            }
            None => {
                self.resume_impossible(env);
                None
            }
        }
    }

    /// A resume was decided but no request can carry it (the cursor does
    /// not fit a URL or header, or the hook's continuation is gone): the
    /// send fails as a protocol sequence error.
    fn resume_impossible<E: Env + ?Sized>(&mut self, env: &E) {
        let violation = crate::failure::Violation::Sequence;
        let failure = Failure::new(FailureKind::Protocol { violation }, Phase::Sending);
        self.fail_attempt(env, failure);
    }

    /// The native resume plan for the cursor reached, if any.
    fn plan(&self) -> Option<ResumePlan> {
        let r = self.resumption.as_ref()?;
        if r.native {
            plan_at(&self.protocol, self.background, &r.cursor)
        } else {
            None
        }
    }

    /// The request left: the head timer runs, a cancel now catches it
    /// awaiting its head.
    pub fn on_sent<E: Env + ?Sized>(&mut self, _env: &E) {
        if let Stage::Sending { head_by } = self.stage {
            self.stage = Stage::AwaitingHead { head_by };
        }
    }

    /// The response head arrived. `decoded` is the evidence of a layer that
    /// decodes this response's body before the driver reads it, if any.
    pub fn on_head<E: Env + ?Sized, H: Head + ?Sized>(
        &mut self,
        env: &E,
        head: &H,
        decoded: Option<D>,
    ) {
        if !matches!(
            self.stage,
            Stage::Sending { .. } | Stage::AwaitingHead { .. }
        ) {
            return;
        }
        let now = env.now();
        let status = head.status();
        let header = |name: &str| head.header(name).map(Cow::into_owned);
        let request_id = request_id_with(header);
        let rate_limits = rate_limits_with(header);
        self.engine
            .head_received(now, status, request_id, rate_limits);
        self.status = Some(status);
        if head.opaque_redirect() {
            let mut failure =
                Failure::new(FailureKind::Redirect { status }, Phase::AwaitingHeaders);
            failure.acceptance = Acceptance::Yes;
            failure.status = Some(status);
            self.error_response = true;
            self.attempt_failed(env, failure);
            return;
        }
        if !(200..300).contains(&status) {
            let header = |name| head.header(name);
            let retry_after = RetryAfter::from_values(
                header("retry-after-ms").as_deref(),
                header("retry-after").as_deref(),
                env.wall_now(),
            );
            let should_retry = header("x-should-retry")
                .as_deref()
                .and_then(parse_should_retry);
            self.stage = Stage::ErrorBody(Box::new(ErrorHead {
                status,
                retry_after,
                should_retry,
                body: Vec::new(),
                read: 0,
            }));
            self.restart_watch(now);
            return;
        }
        if let Some(kind) = decoded.as_ref().and_then(Decoded::protocol)
            && *kind != self.protocol
        {
            let kind = kind.clone();
            self.adopt(kind);
        }
        let form = BodyForm::of(head.header("content-type").as_deref());
        self.source = Some(match decoded {
            Some(d) => Source::Elsewhere(d),
            None => Source::Own(Box::new(StreamObserver::for_form(
                &self.protocol,
                self.limits,
                form,
            ))),
        });
        if let Some((after, splice)) = self.resumption.as_mut().and_then(|r| r.next_gate.take()) {
            let gate = Gate::new(&self.protocol, self.limits, after);
            self.gate = Some(Box::new(match splice {
                Some(splice) => gate.splicing(*splice),
                None => gate,
            }));
        }
        self.stage = Stage::Streaming;
        // A streamed answer's first token is due, before commit (a resume
        // continues a committed answer); a whole JSON answer has its output
        // only at its end, bounded by the other watchdogs.
        self.watch.first_token_by = self
            .watch
            .first_token
            .filter(|_| form == BodyForm::Stream && !self.committed)
            .map(|d| now + d);
        self.restart_watch(now);
    }

    /// Reads the exchange as `protocol` from now on: the decoder of the
    /// answer named it.
    #[cold]
    fn adopt(&mut self, protocol: ProtocolKind) {
        let sse = self.sse_resumable;
        let native = native_resume(&protocol, sse, self.background);
        if let Some(r) = self.resumption.as_mut() {
            r.native = native;
            // What was delivered was read as the protocol it spoke; a
            // target that speaks another starts its own prefix.
            if r.prefix.is_some() && protocol != self.protocol {
                r.prefix = Some(DeliveredPrefix::new(protocol.clone()));
            }
        } else if native {
            self.resumption_mut().native = true;
            self.resumption_mut().next_gate = Some((None, None));
        }
        self.protocol = protocol;
    }

    /// A chunk of a body that [`is_passing_through`](Self::is_passing_through),
    /// read by reference (the lean path of [`Exchange::on_chunk`]):
    /// `true` when the driver hands it out as it is; `false` when the
    /// machine needs it, then given with [`Exchange::on_kept_chunk`]. The
    /// chunk is decoded either way, once.
    #[inline]
    pub fn on_passing_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: &[u8]) -> bool {
        debug_assert!(self.is_passing_through());
        if matches!(self.stage, Stage::Draining) {
            self.chunks += 1;
            self.delivered_bytes += chunk.len() as u64;
            return true;
        }
        let Some(source) = self.source.as_mut() else {
            return false;
        };
        match source.feed(chunk) {
            Ok(()) if !source.flagged() => {
                self.chunks += 1;
                self.delivered_bytes += chunk.len() as u64;
                true
            }
            Ok(()) => {
                self.kept = true;
                false
            }
            Err(v) => {
                self.violated(env, v);
                false
            }
        }
    }

    /// The chunk [`Exchange::on_passing_chunk`] kept, already decoded:
    /// returns it when it goes out at once after all.
    pub fn on_kept_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: C) -> Option<C> {
        if !std::mem::take(&mut self.kept) || !matches!(self.stage, Stage::Streaming) {
            return None;
        }
        self.on_fed_chunk(env, chunk)
    }

    /// The decoder refused the stream.
    #[cold]
    fn violated<E: Env + ?Sized>(&mut self, env: &E, v: crate::wire::ProtocolViolation) {
        let failure = Failure::new(
            FailureKind::Protocol {
                violation: v.into(),
            },
            Phase::Decoding,
        );
        self.attempt_failed(env, failure);
    }

    /// A chunk of the body arrived. Returns it when it goes to the consumer
    /// at once, as it is; otherwise the machine keeps it (held back before
    /// commit, queued, or cut into events) and [`Exchange::poll`] says what
    /// follows.
    #[inline]
    pub fn on_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: C) -> Option<C> {
        if !matches!(self.stage, Stage::Streaming) {
            return self.on_other_chunk(env, chunk);
        }
        let source = self.source.as_mut()?;
        if let Err(v) = source.feed(chunk.as_ref()) {
            self.violated(env, v);
            return None;
        }
        self.on_fed_chunk(env, chunk)
    }

    /// A chunk the decoder took: hold it, queue it, cut it into events, or
    /// hand it out.
    fn on_fed_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: C) -> Option<C> {
        self.chunks += 1;
        let source = self.source.as_ref()?;
        if !self.committed {
            self.before_commit(env, chunk);
            return None;
        }
        if source.provider_error_seen() && self.after_delivery.is_none() {
            // The chunk that carries the error still reaches the consumer;
            // the failure is acted on after it.
            if let Some(error) = source.provider_error() {
                let failure = Failure::new(FailureKind::Provider { error }, Phase::Streaming);
                self.after_delivery = Some(Box::new(self.enrich(failure)));
            }
        }
        if self.gate.is_some() {
            self.through_gate(env, chunk.as_ref());
            return None;
        }
        if self.responded && self.out.is_empty() {
            self.delivered_bytes += chunk.as_ref().len() as u64;
            self.settle_if_proven(env);
            return Some(chunk);
        }
        self.out.push_back(Chunk::Read(chunk));
        None
    }

    /// A chunk outside a streamed answer: one after its completion, an
    /// error body's, or a late one.
    #[cold]
    fn on_other_chunk<E: Env + ?Sized>(&mut self, env: &E, chunk: C) -> Option<C> {
        self.chunks += 1;
        if matches!(self.stage, Stage::Draining) {
            if self.out.is_empty() {
                self.delivered_bytes += chunk.as_ref().len() as u64;
                return Some(chunk);
            }
            self.out.push_back(Chunk::Read(chunk));
            return None;
        }
        let Stage::ErrorBody(e) = &mut self.stage else {
            return None;
        };
        let cap = self.engine.policy().evidence_cap();
        let bytes = chunk.as_ref();
        let room = cap.saturating_sub(e.body.len());
        e.body.extend_from_slice(&bytes[..bytes.len().min(room)]);
        e.read += bytes.len();
        let full = e.read >= cap;
        // Kept for a final error response; after commit (a resume answered
        // with an error) the consumer never sees it.
        if !self.responded {
            self.out.push_back(Chunk::Read(chunk));
        }
        if full {
            self.finish_error_head(env);
        }
        None
    }

    /// Before commit: hold the chunk back, and commit on the first semantic
    /// fragment, terminal proof, or the hold-back cap.
    fn before_commit<E: Env + ?Sized>(&mut self, env: &E, chunk: C) {
        let Some(source) = self.source.as_ref() else {
            return;
        };
        self.held_bytes += chunk.as_ref().len();
        let progress = source.progress();
        self.engine.record_progress(progress);
        if source.provider_error_seen()
            && let Some(error) = source.provider_error()
        {
            // Held with the rest: if no attempt follows, the provider's own
            // error is the answer.
            if self.gate.is_none() {
                self.out.push_back(Chunk::Read(chunk));
            }
            let failure = Failure::new(FailureKind::Provider { error }, Phase::Streaming);
            let failure = self.enrich(failure);
            self.attempt_failed(env, failure);
            return;
        }
        let trigger = if progress.semantic_observed() {
            Some(CommitTrigger::Semantic)
        } else if source.terminal_seen() {
            Some(CommitTrigger::Terminal)
        } else if self.held_bytes > self.engine.policy().holdback_cap() {
            Some(CommitTrigger::HoldbackCap)
        } else {
            None
        };
        if self.gate.is_some() {
            self.through_gate(env, chunk.as_ref());
        } else {
            self.out.push_back(Chunk::Read(chunk));
        }
        if matches!(self.stage, Stage::Streaming)
            && let Some(trigger) = trigger
        {
            self.commit(env, trigger);
        }
    }

    fn commit<E: Env + ?Sized>(&mut self, env: &E, trigger: CommitTrigger) {
        if !self.engine.is_committed() {
            self.engine.commit(env.now(), trigger);
            self.respond_due = !self.responded;
        }
        self.committed = self.engine.is_committed();
        if self.watch.first_token_by.take().is_some() {
            self.plan_watch();
        }
    }

    /// Event-granular delivery: only complete, new events are queued.
    fn through_gate<E: Env + ?Sized>(&mut self, env: &E, bytes: &[u8]) {
        let Some(gate) = self.gate.as_mut() else {
            return;
        };
        let out = &mut self.out;
        let mut prefix = self.resumption.as_mut().and_then(|r| r.prefix.as_mut());
        let pushed = gate.push(bytes, |event| {
            if let Some(p) = prefix.as_mut() {
                p.absorb(&event);
            }
            out.push_back(Chunk::Made(event));
        });
        if let Err(v) = pushed {
            let failure = Failure::new(
                FailureKind::Protocol {
                    violation: v.into(),
                },
                Phase::Decoding,
            );
            self.attempt_failed(env, failure);
        }
    }

    /// The body ended cleanly (the transport's end of body).
    pub fn on_end<E: Env + ?Sized>(&mut self, env: &E) {
        match &self.stage {
            Stage::Draining => self.stage = Stage::Ended,
            Stage::ErrorBody(_) => self.finish_error_head(env),
            Stage::Streaming => {
                let Some(source) = self.source.as_mut() else {
                    return;
                };
                let failure = match source.finish() {
                    EndOfStream::Success { proof } => {
                        self.complete(env, proof);
                        return;
                    }
                    EndOfStream::Unsuccessful { reason } => {
                        Failure::new(FailureKind::Unsuccessful { reason }, Phase::Streaming)
                    }
                    EndOfStream::ProviderError { error } => {
                        Failure::new(FailureKind::Provider { error }, Phase::Streaming)
                    }
                    EndOfStream::Violation { violation } => Failure::new(
                        FailureKind::Protocol {
                            violation: violation.into(),
                        },
                        Phase::Decoding,
                    ),
                    EndOfStream::UnexpectedEof { pending } => {
                        Failure::new(FailureKind::UnexpectedEof, Phase::Streaming)
                            .with_unfinished(pending.unwrap_or_default())
                    }
                };
                let failure = self.enrich(failure);
                self.attempt_failed(env, failure);
            }
            _ => {}
        }
    }

    /// The attempt failed: no head came back, the body's read failed, or a
    /// hook of the driver vetoed it. `failure` says what and where (kind,
    /// phase, acceptance); the machine adds what the attempt showed.
    pub fn on_error<E: Env + ?Sized>(&mut self, env: &E, failure: Failure) {
        match &self.stage {
            Stage::Sending { .. } | Stage::AwaitingHead { .. } => {
                self.attempt_failed(env, failure);
            }
            Stage::ErrorBody(_) => self.finish_error_head(env),
            Stage::Draining => {
                // A reset right after `[DONE]` changes nothing.
                self.engine.late_error();
                self.stage = Stage::Ended;
                self.release = true;
            }
            Stage::Streaming => {
                if let Some(proof) = self.proof() {
                    // A reset right after `[DONE]` changes nothing.
                    self.engine.late_error();
                    self.complete(env, proof);
                    self.release = true;
                    return;
                }
                let failure = self.enrich(failure);
                self.attempt_failed(env, failure);
            }
            _ => {}
        }
    }

    /// A deadline of [`Exchange::poll_timeout`] may have passed: the head
    /// timer, a stall watchdog, a wait, or the bound of a park or an
    /// admission. Nothing happens when none did.
    pub fn handle_timeout<E: Env + ?Sized>(&mut self, env: &E) {
        let now = env.now();
        if self.poll_timeout().is_none_or(|d| now < d) {
            return;
        }
        if matches!(
            self.stage,
            Stage::Streaming | Stage::ErrorBody(_) | Stage::Draining
        ) {
            // A check: what came since the last one moves the marks; only
            // a deadline still passed after it is a stall.
            self.check_watch(now);
            if self.poll_timeout().is_none_or(|d| now < d) {
                return;
            }
        }
        match &self.stage {
            Stage::Sending { .. } | Stage::AwaitingHead { .. } => {
                // Not yet sent: the request never left (connecting).
                let phase = if matches!(self.stage, Stage::Sending { .. }) {
                    Phase::Connecting
                } else {
                    Phase::AwaitingHeaders
                };
                let failure = Failure::new(FailureKind::Timeout { stall: Stall::Head }, phase);
                self.release = true;
                self.attempt_failed(env, failure);
            }
            Stage::ErrorBody(_) => self.finish_error_head(env),
            Stage::Draining => {
                // Silent after its proof: the answer is whole; stop reading.
                self.stage = Stage::Ended;
                self.release = true;
            }
            Stage::Streaming => {
                self.release = true;
                if let Some(proof) = self.proof() {
                    self.complete(env, proof);
                    return;
                }
                let idle_due = self
                    .watch
                    .idle
                    .is_some_and(|d| now >= self.watch.idle_since + d);
                let first_token_due =
                    !self.committed && self.watch.first_token_by.is_some_and(|by| now >= by);
                let stall = if first_token_due {
                    Stall::FirstToken
                } else if idle_due {
                    Stall::Idle
                } else {
                    Stall::Progress
                };
                let failure = Failure::new(FailureKind::Timeout { stall }, Phase::Streaming);
                let failure = self.enrich(failure);
                self.attempt_failed(env, failure);
            }
            Stage::Waiting { resume, .. } => {
                let resume = *resume;
                self.stage = Stage::ToSend;
                // A resume waits its backoff first and connectivity second
                // (reliability matrix AD5).
                if resume && self.engine.park_before_send(now, env.online()) {
                    let limit = self.engine.wait_limit(now).map(|d| now + d);
                    self.stage = Stage::Parked {
                        limit,
                        then_send: true,
                    };
                }
            }
            Stage::Parked { .. } => {
                // The budget or the deadline ran out while parked.
                let action = self.engine.online_again(now, env.jitter());
                self.act(env, action);
            }
            Stage::Admission { .. } => self.admission(env, AdmissionAnswer::Unresolved),
            Stage::ToSend | Stage::Continuation(_) | Stage::Ended => {}
        }
    }

    /// The platform is online again (after [`Io::WaitOnline`]).
    pub fn online<E: Env + ?Sized>(&mut self, env: &E) {
        let Stage::Parked { then_send, .. } = self.stage else {
            return;
        };
        if then_send {
            self.stage = Stage::ToSend;
        } else {
            let action = self.engine.online_again(env.now(), env.jitter());
            self.act(env, action);
        }
    }

    /// The admission hook answered (after [`Io::AskAdmission`]).
    pub fn admission<E: Env + ?Sized>(&mut self, env: &E, answer: AdmissionAnswer) {
        if !matches!(self.stage, Stage::Admission { .. }) {
            return;
        }
        let action = self
            .engine
            .admission(env.now(), answer, env.online(), env.jitter());
        self.act(env, action);
    }

    /// The continuation hook answered (after [`Io::AskContinuation`]):
    /// `true` when it gave a continuation request, which the driver sends
    /// at [`Send::Continuation`].
    pub fn continuation<E: Env + ?Sized>(&mut self, env: &E, given: bool) {
        let Stage::Continuation(failure) = std::mem::replace(&mut self.stage, Stage::Streaming)
        else {
            return;
        };
        if let Some(r) = self.resumption.as_mut() {
            r.continuation_ready = given;
        }
        self.engine.set_resume_possible(given);
        let action = self
            .engine
            .fail(env.now(), *failure, env.online(), env.jitter());
        self.act(env, action);
    }

    /// The caller cancelled, or the consumer dropped the body. Once
    /// terminal proof was observed and handed out, that is a completed
    /// request (an SDK stops reading at its end marker); otherwise it is
    /// `cancelled`, in the phase the request was in.
    pub fn cancel<E: Env + ?Sized>(&mut self, env: &E) {
        let phase = match &self.stage {
            Stage::Ended => return,
            Stage::Draining => {
                self.stage = Stage::Ended;
                self.release = true;
                return;
            }
            Stage::ToSend if self.engine.wire_attempt() == 0 => CancelPhase::Sending,
            Stage::ToSend | Stage::Waiting { .. } | Stage::Continuation(_) => CancelPhase::Waiting,
            Stage::Sending { .. } => CancelPhase::Sending,
            Stage::AwaitingHead { .. } => CancelPhase::AwaitingHead,
            Stage::ErrorBody(_) | Stage::Streaming => CancelPhase::Streaming,
            Stage::Parked { .. } => CancelPhase::Parked,
            Stage::Admission { .. } => CancelPhase::Admission,
        };
        if self.responded
            && self.out.is_empty()
            && let Some(proof) = self.proof()
        {
            self.complete(env, proof);
            self.release = true;
            return;
        }
        if let Some(source) = &self.source {
            let mut progress = source.progress();
            if self.responded {
                progress.deliver_observed();
                progress.delivered_bytes = self.delivered_bytes;
            }
            self.engine.record_progress(progress);
        }
        let outcome = self.engine.cancel(env.now(), phase);
        self.release = true;
        self.error_response = false;
        self.end(Err(outcome));
    }

    /// Strong proof was handed out with nothing queued: the request is
    /// complete now, whatever the consumer or the connection does next (an
    /// SDK that stops reading at its end marker still gets its outcome).
    /// The rest of the body drains. Weaker proof (a finish reason that needs
    /// the clean end) waits for the end.
    #[inline]
    fn settle_if_proven<E: Env + ?Sized>(&mut self, env: &E) {
        let proven = self.source.as_ref().is_some_and(Source::terminal_seen);
        if proven {
            self.settle(env);
        }
    }

    #[cold]
    fn settle<E: Env + ?Sized>(&mut self, env: &E) {
        if !matches!(self.stage, Stage::Streaming) || !self.responded || !self.out.is_empty() {
            return;
        }
        if let Some(Proof::Strong) = self.proof()
            && self.after_delivery.is_none()
        {
            self.complete(env, Proof::Strong);
            self.stage = Stage::Draining;
            self.restart_watch(env.now());
        }
    }

    /// The success proof of the attempt being read, once observed.
    fn proof(&self) -> Option<Proof> {
        match self.source.as_ref()?.terminal()? {
            Terminal::Success { proof } => Some(proof),
            Terminal::Unsuccessful { .. } => None,
        }
    }

    /// What the attempt showed, added to a failure the driver or the
    /// decoder reported.
    fn enrich(&self, mut failure: Failure) -> Failure {
        if let Some(source) = &self.source {
            // A driver's own evidence of progress (a test driver's), else
            // what the attempt showed.
            let mut progress = if failure.progress == Progress::default() {
                source.progress()
            } else {
                failure.progress
            };
            if self.responded {
                progress.deliver_observed();
                progress.delivered_bytes = self.delivered_bytes;
            }
            failure.progress = progress;
            if failure.unfinished == Unfinished::default() {
                failure.unfinished = source.unfinished().unwrap_or_default();
            }
        }
        if failure.status.is_none() {
            failure.status = self.status;
        }
        failure
    }

    fn end(&mut self, result: Result<(), Outcome>) {
        self.stage = Stage::Ended;
        self.finished = Some(result);
        self.after_delivery = None;
    }

    /// The attempt finished with success proof.
    fn complete<E: Env + ?Sized>(&mut self, env: &E, proof: Proof) {
        self.commit(env, CommitTrigger::Terminal);
        if let Some(rest) = self
            .gate
            .as_mut()
            .map(|g| g.rest())
            .filter(|b| !b.is_empty())
        {
            self.out.push_back(Chunk::Made(rest));
        }
        let mut progress = self
            .source
            .as_ref()
            .map(Source::progress)
            .unwrap_or_default();
        progress.deliver_observed();
        let queued: u64 = self
            .out
            .iter()
            .map(|c| match c {
                Chunk::Read(c) => c.as_ref().len() as u64,
                Chunk::Made(b) => b.len() as u64,
            })
            .sum();
        progress.delivered_bytes = self.delivered_bytes + queued;
        self.engine.succeed(env.now(), proof, progress);
        self.end(Ok(()));
    }

    fn finish_error_head<E: Env + ?Sized>(&mut self, env: &E) {
        let Stage::ErrorBody(e) = std::mem::replace(&mut self.stage, Stage::Streaming) else {
            return;
        };
        let mut failure = Failure::status(e.status, e.retry_after, e.should_retry);
        if !(300..400).contains(&e.status)
            && let Some(error) = classify_error_body(&self.protocol, Some(e.status), &e.body)
        {
            failure.kind = FailureKind::Provider { error };
        }
        self.error_body = e.body;
        self.error_response = true;
        self.attempt_failed(env, failure);
    }

    /// The attempt in flight failed. After commit, a failure found inside a
    /// chunk waits until the queued chunks are handed out.
    fn attempt_failed<E: Env + ?Sized>(&mut self, env: &E, failure: Failure) {
        if self.responded && !self.out.is_empty() {
            self.after_delivery = Some(Box::new(failure));
            return;
        }
        self.fail_attempt(env, failure);
    }

    fn fail_attempt<E: Env + ?Sized>(&mut self, env: &E, failure: Failure) {
        let now = env.now();
        if let (Some(c), Some(wait)) = (&self.cooldown, failure.retry_after.delay()) {
            c.store.note(&c.key, now, wait);
        }
        if self.engine.is_committed() {
            let cursor = match (&self.gate, &self.source) {
                (Some(g), _) => Some(g.cursor().clone()),
                (None, Some(s)) => Some(s.cursor()),
                _ => None,
            };
            let native = self.plan_after(cursor.as_ref()).is_some();
            let hook = self.resumption.as_ref().is_some_and(|r| r.hook);
            let continued = !native
                && self.resumption.is_some()
                && self.engine.would_resume(now, &failure, env.online());
            if continued && hook {
                self.stage = Stage::Continuation(Box::new(failure));
                return;
            }
            let prefilled = continued && self.prepare_prefill(now, &failure, env.online());
            self.engine.set_resume_possible(native || prefilled);
        }
        let action = self.engine.fail(now, failure, env.online(), env.jitter());
        self.committed = self.engine.is_committed();
        self.act(env, action);
    }

    /// A committed answer was cut and would be resumed: when what the
    /// consumer has is text only and the serving target (or the next one
    /// speaking the same protocol) declares a prefill, the continuation's
    /// body is written and the engine told where it goes. `false` when no
    /// prefill can continue it.
    fn prepare_prefill(&mut self, now: Instant, failure: &Failure, online: bool) -> bool {
        let serving = self.engine.target();
        let protocol = self.protocol.clone();
        let targets = &self.targets;
        let Some(r) = self.resumption.as_mut() else {
            return false;
        };
        let Some(prefix) = r.prefix.as_ref().filter(|p| p.is_text_only()) else {
            return false;
        };
        let speaks = |i: usize| targets.get(i).map_or(i == 0, |t| t.protocol == protocol);
        let found = r
            .prefill
            .iter()
            .enumerate()
            .skip(serving)
            .filter(|(i, _)| speaks(*i))
            .find_map(|(i, p)| {
                let (prefill, body) = p.as_ref()?;
                let prefilled = prefill_body(body, &protocol, *prefill, &prefix.text)?;
                Some((i, prefilled))
            });
        let Some((target, prefilled)) = found else {
            return false;
        };
        let splice = Splice::new(&protocol, prefix.seam.clone(), &prefilled.trimmed);
        r.prefill_ready = Some((Bytes::from(prefilled.body), Box::new(splice)));
        self.engine
            .continue_by_prefill(now, failure, online, target);
        true
    }

    /// Folds `cursor` into the request's cursor; the plan it allows.
    fn plan_after(&mut self, cursor: Option<&ResumeCursor>) -> Option<ResumePlan> {
        let r = self.resumption.as_mut()?;
        if let Some(c) = cursor {
            if c.response_id.is_some() {
                r.cursor.response_id.clone_from(&c.response_id);
            }
            if c.sequence_number.is_some() {
                r.cursor.sequence_number = c.sequence_number;
            }
            if c.last_event_id.is_some() {
                r.cursor.last_event_id.clone_from(&c.last_event_id);
            }
        }
        self.plan()
    }

    /// Whether the attempt that failed streamed a provider's error event
    /// before commit, held here with what came before it.
    fn shows_stream_error(&self) -> bool {
        !self.responded
            && self.gate.is_none()
            && !self.out.is_empty()
            && self.status.is_some_and(|s| (200..300).contains(&s))
            && self.engine.last_failure().is_some_and(|f| {
                matches!(f.kind, FailureKind::Provider { .. }) && f.phase == Phase::Streaming
            })
    }

    /// Carries out what the engine decided after a failure. A final HTTP
    /// error response is kept through a park or an admission wait (it is
    /// the answer if no send follows), and released once one does.
    fn act<E: Env + ?Sized>(&mut self, env: &E, action: Action) {
        let now = env.now();
        let keep = self.error_response && !self.responded;
        match action {
            Action::RetryAfter { delay, .. } | Action::Resume { delay, .. } => {
                self.stage = Stage::Waiting {
                    until: now + delay,
                    resume: matches!(action, Action::Resume { .. }),
                };
                self.error_response = false;
                self.release = true;
                self.out.clear();
            }
            Action::Failover => {
                self.stage = Stage::ToSend;
                self.error_response = false;
                self.release = true;
                self.out.clear();
            }
            Action::ParkUntilOnline => {
                let limit = self.engine.wait_limit(now).map(|d| now + d);
                self.stage = Stage::Parked {
                    limit,
                    then_send: false,
                };
                self.release = !keep;
            }
            Action::AskAdmission => {
                let limit = self.engine.wait_limit(now).map(|d| now + d);
                let failure = self.engine.last_failure().cloned();
                let request = failure.map(|failure| {
                    Box::new(AdmissionRequest {
                        logical_id: self.engine.logical_id().to_owned(),
                        next_attempt: self.engine.wire_attempt() + 1,
                        failure,
                    })
                });
                self.stage = Stage::Admission { limit, request };
                self.release = !keep;
            }
            Action::Fail(outcome) if !keep && self.shows_stream_error() => {
                // A final in-stream error before commit is handed out as
                // the provider streamed it, through its error event, then
                // the request fails: a client's SDK raises the provider's
                // own error, with its type and message.
                self.respond_due = true;
                self.release = true;
                self.end(Err(outcome));
            }
            Action::Fail(outcome) => {
                // A final HTTP error is returned as that response.
                self.error_response = keep;
                self.release = !keep;
                if !keep {
                    self.out.clear();
                }
                self.end(Err(outcome));
            }
        }
    }
}
