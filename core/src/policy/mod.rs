//! The recovery policy: what may be retried, how often, and how long to wait.
//!
//! A policy is validated once, when built, into a typed [`PolicyError`]; after
//! that every field is known to be coherent, so the decision function never
//! has to second-guess it. Front ends write one as a [`PolicySpec`] (the
//! [`spec`] module): the knobs of [`FIELDS`], the same names, units and
//! rules in the gateway's TOML, `recover`'s flags, the npm and Python
//! options and the conformance vectors.

mod fields;
pub mod spec;
mod value;

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::failure::Category;

pub use crate::failure::NEVER_RETRYABLE;
pub use spec::{FIELDS, Field, MAX_MS, PolicySpec, Unit, Value, field, field_by_camel_case};

/// Whether a status may be selected as retryable at all: 408, 409, 429 and
/// 5xx.
pub fn can_be_retryable(status: u16) -> bool {
    matches!(status, 408 | 409 | 429 | 500..=599)
}

/// Default retryable statuses.
pub const DEFAULT_RETRYABLE_STATUSES: &[u16] = &[408, 429, 500, 502, 503, 504, 529];

/// What to do with a `Retry-After` above the policy's ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OverCeiling {
    /// Refuse the retry and fail with the value (the default: never shorten a
    /// server's minimum).
    #[default]
    Refuse,
    /// Ignore the hint and use the policy's own backoff.
    Backoff,
}

/// Where the endpoint runs, which decides whether an ambiguous resend (the
/// request was sent, no head came back) needs admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Endpoint {
    /// A hosted provider: ambiguous resends are allowed.
    #[default]
    Remote,
    /// A local runner (Ollama, llama.cpp): a resend may start overlapping
    /// inference, so ambiguous resends need an admission hook's approval.
    Local,
}

/// Set of failure categories that may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Categories {
    /// Transport failures (connect, reset, EOF).
    pub transport: bool,
    /// Retryable HTTP statuses.
    pub http: bool,
    /// Client-side timeouts (head timeout, stall watchdog).
    pub client_timeout: bool,
    /// Transient in-stream provider errors.
    pub provider_response: bool,
}

impl Default for Categories {
    fn default() -> Self {
        Categories {
            transport: true,
            http: true,
            client_timeout: true,
            provider_response: true,
        }
    }
}

impl Categories {
    /// Whether `category` is selected.
    pub fn contains(self, category: Category) -> bool {
        match category {
            Category::Transport => self.transport,
            Category::Http => self.http,
            Category::ClientTimeout => self.client_timeout,
            Category::ProviderResponse => self.provider_response,
            Category::Protocol | Category::Cancellation => false,
        }
    }
}

/// Why a policy could not be built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// A status that can never be retried (anything but 408, 409, 429 and
    /// 5xx; the never-retryable set 400/401/403/404/413/422 among them).
    InvalidStatus(u16),
    /// A category that can never be retried (protocol, cancellation).
    UnsupportedCategory(Category),
    /// The backoff ceiling is below its base.
    CeilingBelowBase,
    /// A duration that must be positive is zero.
    ZeroDuration(&'static str),
    /// A size cap that must be positive is zero.
    ZeroCap(&'static str),
    /// A knob a [`PolicySpec`] does not have.
    UnknownKnob(String),
    /// A value its knob does not take: the wrong kind, or out of range.
    Invalid {
        /// The knob.
        field: &'static Field,
        /// What was given, as written (a name quoted).
        got: String,
    },
    /// 0 for a knob whose row refuses it ([`Field::refuses_zero`]): a bound
    /// is turned off with `"off"`, never with 0, and a count or a cap of 0
    /// would mean nothing. The same error from every front end.
    Zero(&'static Field),
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::InvalidStatus(s) => {
                f.write_str("status ")?;
                crate::text::write_decimal(f, (*s).into())?;
                f.write_str(" cannot be made retryable")
            }
            PolicyError::UnsupportedCategory(c) => {
                write!(f, "failure category {c} is never retryable")
            }
            PolicyError::CeilingBelowBase => f.write_str("backoff ceiling is below its base"),
            PolicyError::ZeroDuration(what) | PolicyError::ZeroCap(what) => {
                write!(f, "{what} must be greater than zero")
            }
            PolicyError::UnknownKnob(name) => write!(f, "unknown policy knob `{name}`"),
            PolicyError::Invalid { field, got } => {
                write!(
                    f,
                    "{}: expected {}, got {got}",
                    field.name,
                    field.expected()
                )
            }
            PolicyError::Zero(field) => {
                let name = field.name;
                match field.unit {
                    Unit::Ms if field.can_be_off => {
                        write!(f, "{name}: 0 is not a duration; use \"off\" to turn it off")
                    }
                    Unit::Ms => write!(f, "{name}: 0 is not a duration; give at least 1 ms"),
                    Unit::Bytes => write!(f, "{name}: must be at least 1 byte"),
                    _ => write!(f, "{name}: must be at least 1"),
                }
            }
        }
    }
}

impl std::error::Error for PolicyError {}

/// A validated recovery policy. Build one with [`RecoveryPolicy::builder`].
///
/// | knob | default |
/// |---|---|
/// | `max_attempts` (first send included) | 3 |
/// | backoff base / ceiling (full jitter) | 500 ms / 8 s |
/// | recovery budget, from the first failure | 60 s |
/// | deadline (from the start of the request) | none |
/// | retryable statuses | 408, 429, 500, 502, 503, 504, 529 |
/// | retryable categories | transport, http, client_timeout, provider_response |
/// | `Retry-After` ceiling / above it | 60 s / refuse |
/// | replay body cap | 64 MiB |
/// | hold-back cap | 1 MiB |
/// | evidence cap | 16 KiB |
/// | event cap (a line, an event, a whole JSON answer) | 32 MiB |
/// | max resumes | 1 |
/// | endpoint | remote (ambiguous resends allowed) |
/// | head timeout (send to response head) | 300 s |
/// | idle timeout (no byte at all) | 600 s |
/// | progress timeout (no semantic fragment; keepalives do not count) | 600 s |
///
/// The three timeouts make the default safe: a stalled head, a stalled body
/// or an endless run of keepalives cannot hang a request. The head timeout
/// follows undici's `headersTimeout` (300 s), which Node's `fetch` and the
/// OpenAI JS SDK run under (a whole answer's head, which comes only when
/// the answer is done, gets the longer of it and the progress timeout).
/// Idle and progress are the 600 s the OpenAI and Anthropic SDKs give a
/// request (their Python read timeout), because a reasoning model may
/// think for minutes, some sending nothing at all until their first token:
/// a shorter idle timeout cut such a stream and paid for it again, each
/// time. Set any of them to `None` to turn it off, or lower for
/// interactive use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecoveryPolicy {
    pub(crate) max_attempts: NonZeroU32,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_ceiling: Duration,
    pub(crate) budget: Option<Duration>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) retryable_statuses: Vec<u16>,
    pub(crate) categories: Categories,
    pub(crate) retry_after_ceiling: Duration,
    pub(crate) over_ceiling: OverCeiling,
    pub(crate) replay_body_cap: usize,
    pub(crate) holdback_cap: usize,
    pub(crate) evidence_cap: usize,
    #[serde(default = "default_max_event_bytes")]
    pub(crate) max_event_bytes: usize,
    pub(crate) max_resumes: u32,
    pub(crate) attempts_per_target: NonZeroU32,
    pub(crate) retry_protocol_violations: bool,
    pub(crate) idempotency_key: bool,
    pub(crate) endpoint: Endpoint,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) progress_timeout: Option<Duration>,
    pub(crate) first_token_timeout: Option<Duration>,
    pub(crate) hedge_after: Option<Duration>,
    pub(crate) max_hedges: NonZeroU32,
    pub(crate) head_timeout: Option<Duration>,
}

/// The longer of two bounds, of those on (`None`: off): off only when both
/// are.
pub(crate) fn longer(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Default bound from a send to its response head (undici's `headersTimeout`).
pub const DEFAULT_HEAD_TIMEOUT: Duration = Duration::from_mins(5);
/// Default bound on a silence with no byte at all: the OpenAI and Anthropic
/// Python SDKs' read timeout (undici's `bodyTimeout` is 300 s), since a
/// reasoning model may send nothing for minutes before its first token.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_mins(10);
/// Default bound on a time without a semantic fragment (keepalives do not
/// reset it).
pub const DEFAULT_PROGRESS_TIMEOUT: Duration = Duration::from_mins(10);

/// Default bound on one line, one event or one whole JSON answer read: the
/// decoders' own ([`Limits::default`](crate::wire::Limits)).
fn default_max_event_bytes() -> usize {
    crate::wire::Limits::default().max_event
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            max_attempts: NonZeroU32::new(3).expect("non-zero"),
            backoff_base: Duration::from_millis(500),
            backoff_ceiling: Duration::from_secs(8),
            budget: Some(Duration::from_mins(1)),
            deadline: None,
            retryable_statuses: DEFAULT_RETRYABLE_STATUSES.to_vec(),
            categories: Categories::default(),
            retry_after_ceiling: Duration::from_mins(1),
            over_ceiling: OverCeiling::Refuse,
            // Providers take requests of 32 MB (Anthropic's Messages) to
            // 50 MB (OpenAI's images): the largest, costliest requests are
            // replayed too. Most drivers hold the body whole anyway.
            replay_body_cap: 64 << 20,
            // A Responses stream echoes the request's instructions and
            // tools twice before its first token (an agent's come to a
            // hundred KiB and more): held back whole, its replay stays
            // invisible. Held only until the first token.
            holdback_cap: 1 << 20,
            evidence_cap: 16 << 10,
            max_event_bytes: default_max_event_bytes(),
            max_resumes: 1,
            attempts_per_target: NonZeroU32::MIN,
            retry_protocol_violations: false,
            idempotency_key: false,
            endpoint: Endpoint::Remote,
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            progress_timeout: Some(DEFAULT_PROGRESS_TIMEOUT),
            first_token_timeout: None,
            hedge_after: None,
            max_hedges: NonZeroU32::MIN,
            head_timeout: Some(DEFAULT_HEAD_TIMEOUT),
        }
    }
}

impl RecoveryPolicy {
    /// A builder starting from the defaults.
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder {
            policy: RecoveryPolicy::default(),
            error: None,
        }
    }

    /// A builder starting from this policy (for per-call overrides).
    pub fn to_builder(&self) -> PolicyBuilder {
        PolicyBuilder {
            policy: self.clone(),
            error: None,
        }
    }

    /// Physical sends allowed, first send included.
    pub fn max_attempts(&self) -> NonZeroU32 {
        self.max_attempts
    }
    /// Backoff base (the bound of the first retry's jitter).
    pub fn backoff_base(&self) -> Duration {
        self.backoff_base
    }
    /// Backoff ceiling.
    pub fn backoff_ceiling(&self) -> Duration {
        self.backoff_ceiling
    }
    /// Recovery budget, measured from the first failure.
    pub fn budget(&self) -> Option<Duration> {
        self.budget
    }
    /// Deadline, measured from the start of the logical request.
    pub fn deadline(&self) -> Option<Duration> {
        self.deadline
    }
    /// Statuses a retry is allowed for.
    pub fn retryable_statuses(&self) -> &[u16] {
        &self.retryable_statuses
    }
    /// Categories a retry is allowed for.
    pub fn categories(&self) -> Categories {
        self.categories
    }
    /// Largest `Retry-After` honoured.
    pub fn retry_after_ceiling(&self) -> Duration {
        self.retry_after_ceiling
    }
    /// What happens above the `Retry-After` ceiling.
    pub fn over_ceiling(&self) -> OverCeiling {
        self.over_ceiling
    }
    /// Largest request body buffered for replay.
    pub fn replay_body_cap(&self) -> usize {
        self.replay_body_cap
    }
    /// Largest pre-commit prefix held back from the consumer.
    pub fn holdback_cap(&self) -> usize {
        self.holdback_cap
    }
    /// Largest sensitive evidence kept for `inspect_*`.
    pub fn evidence_cap(&self) -> usize {
        self.evidence_cap
    }
    /// Largest line, event or whole JSON answer the decoders read (the
    /// answer breaks its protocol past it).
    pub fn max_event_bytes(&self) -> usize {
        self.max_event_bytes
    }
    /// Resumes allowed (each is also a physical send).
    pub fn max_resumes(&self) -> u32 {
        self.max_resumes
    }
    /// Sends a target gets before a request with alternates moves on to
    /// the next one ([`crate::failover`]); 1 by default: an overloaded
    /// provider is left at its first failure.
    pub fn attempts_per_target(&self) -> NonZeroU32 {
        self.attempts_per_target
    }
    /// Whether a stream that breaks its protocol before any output is
    /// replayed like a reset.
    pub fn retry_protocol_violations(&self) -> bool {
        self.retry_protocol_violations
    }
    /// Whether every send carries an `Idempotency-Key`, the same for every
    /// send of one logical request.
    pub fn idempotency_key(&self) -> bool {
        self.idempotency_key
    }
    /// Where the endpoint runs.
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
    }
    /// Stall watchdog: longest silence (no bytes) tolerated.
    pub fn idle_timeout(&self) -> Option<Duration> {
        self.idle_timeout
    }
    /// Stall watchdog: longest time without a semantic fragment.
    pub fn progress_timeout(&self) -> Option<Duration> {
        self.progress_timeout
    }
    /// Longest wait, from the head of a streamed answer, for its first
    /// semantic fragment before commit (off by default).
    pub fn first_token_timeout(&self) -> Option<Duration> {
        self.first_token_timeout
    }
    /// How long an attempt may show no semantic fragment, from its send,
    /// before a second attempt races it (off by default).
    pub fn hedge_after(&self) -> Option<Duration> {
        self.hedge_after
    }
    /// Hedges a request may start in all.
    pub fn max_hedges(&self) -> NonZeroU32 {
        self.max_hedges
    }
    /// Longest wait for a response head.
    pub fn head_timeout(&self) -> Option<Duration> {
        self.head_timeout
    }
    /// The bound from a send to its head: the head timeout for a streamed
    /// answer; for a whole answer (`whole`), whose head comes only when it
    /// is done, the longer of the head and progress timeouts (of those
    /// on), so that a reasoning model's minutes of work are not cut, and
    /// paid for again, where its own SDKs wait 600 s.
    pub fn head_bound(&self, whole: bool) -> Option<Duration> {
        if whole {
            longer(self.head_timeout, self.progress_timeout)
        } else {
            self.head_timeout
        }
    }
    /// Whether `status` is retryable under this policy (never for the
    /// permanent set).
    pub fn status_retryable(&self, status: u16) -> bool {
        !NEVER_RETRYABLE.contains(&status) && self.retryable_statuses.contains(&status)
    }
}

/// Builds a [`RecoveryPolicy`]; errors are reported by [`PolicyBuilder::build`].
#[derive(Debug, Clone)]
#[must_use]
pub struct PolicyBuilder {
    policy: RecoveryPolicy,
    error: Option<PolicyError>,
}

impl PolicyBuilder {
    fn fail(mut self, e: PolicyError) -> Self {
        self.error.get_or_insert(e);
        self
    }

    /// Physical sends allowed, first send included.
    pub fn max_attempts(mut self, n: NonZeroU32) -> Self {
        self.policy.max_attempts = n;
        self
    }

    /// Full-jitter backoff: retry `n` waits uniform in
    /// `[0, min(ceiling, base · 2^(n−1))]`.
    pub fn backoff(mut self, base: Duration, ceiling: Duration) -> Self {
        if base.is_zero() {
            return self.fail(PolicyError::ZeroDuration("backoff base"));
        }
        if ceiling < base {
            return self.fail(PolicyError::CeilingBelowBase);
        }
        self.policy.backoff_base = base;
        self.policy.backoff_ceiling = ceiling;
        self
    }

    /// Recovery budget from the first failure; `None` for unbounded.
    pub fn budget(mut self, budget: Option<Duration>) -> Self {
        if budget.is_some_and(|b| b.is_zero()) {
            return self.fail(PolicyError::ZeroDuration("budget"));
        }
        self.policy.budget = budget;
        self
    }

    /// Deadline from the start of the logical request; `None` for none.
    pub fn deadline(mut self, deadline: Option<Duration>) -> Self {
        if deadline.is_some_and(|d| d.is_zero()) {
            return self.fail(PolicyError::ZeroDuration("deadline"));
        }
        self.policy.deadline = deadline;
        self
    }

    /// The statuses that may be retried. A never-retryable status
    /// (400/401/403/404/413/422) or one outside 100..=599 is an error.
    pub fn retryable_statuses(mut self, statuses: impl IntoIterator<Item = u16>) -> Self {
        let mut list = Vec::new();
        for s in statuses {
            // Only timeouts, conflicts, rate limits and server errors can
            // ever be retried: any other status is permanent, so selecting it
            // would be a setting that silently does nothing.
            if !can_be_retryable(s) {
                return self.fail(PolicyError::InvalidStatus(s));
            }
            // Kept sorted and without duplicates as it grows.
            if let Err(at) = list.binary_search(&s) {
                list.insert(at, s);
            }
        }
        self.policy.retryable_statuses = list;
        self
    }

    /// The failure categories that may be retried. Protocol violations and
    /// cancellation are never retryable and are refused here.
    pub fn retryable_categories(mut self, categories: impl IntoIterator<Item = Category>) -> Self {
        let mut set = Categories {
            transport: false,
            http: false,
            client_timeout: false,
            provider_response: false,
        };
        for c in categories {
            match c {
                Category::Transport => set.transport = true,
                Category::Http => set.http = true,
                Category::ClientTimeout => set.client_timeout = true,
                Category::ProviderResponse => set.provider_response = true,
                Category::Protocol | Category::Cancellation => {
                    return self.fail(PolicyError::UnsupportedCategory(c));
                }
            }
        }
        self.policy.categories = set;
        self
    }

    /// Largest `Retry-After` honoured, and what to do above it.
    pub fn retry_after_ceiling(mut self, ceiling: Duration, over: OverCeiling) -> Self {
        self.policy.retry_after_ceiling = ceiling;
        self.policy.over_ceiling = over;
        self
    }

    /// Largest request body buffered for replay; larger bodies are sent once.
    pub fn replay_body_cap(mut self, bytes: usize) -> Self {
        self.policy.replay_body_cap = bytes;
        self
    }

    /// Largest pre-commit prefix held back before the body commits early.
    pub fn holdback_cap(mut self, bytes: usize) -> Self {
        if bytes == 0 {
            return self.fail(PolicyError::ZeroCap("hold-back cap"));
        }
        self.policy.holdback_cap = bytes;
        self
    }

    /// Largest sensitive evidence kept for `inspect_*`.
    pub fn evidence_cap(mut self, bytes: usize) -> Self {
        self.policy.evidence_cap = bytes;
        self
    }

    /// Largest line, event or whole JSON answer read before the answer is
    /// judged broken (a typed protocol failure, never an unbounded
    /// buffer). Real events are large: an image generation's partial image
    /// or a Gemini 4K image arrives as one base64 event of several MiB.
    pub fn max_event_bytes(mut self, bytes: usize) -> Self {
        if bytes == 0 {
            return self.fail(PolicyError::ZeroCap("event cap"));
        }
        self.policy.max_event_bytes = bytes;
        self
    }

    /// Replays a stream that breaks its protocol (malformed or spliced
    /// SSE, invalid JSON, a bad sequence) before any output, as a reset
    /// would be: a proxy or a load balancer that garbles the first bytes is
    /// then no reason to fail the turn. Off by default; after output a
    /// violation still ends the request as `Protocol`.
    pub fn retry_protocol_violations(mut self, retry: bool) -> Self {
        self.policy.retry_protocol_violations = retry;
        self
    }

    /// Sends an `Idempotency-Key` header on every send: one key per
    /// logical request (`recovery-` and its logical id), the same on every
    /// replay and resume, so a server that deduplicates on it runs the work
    /// once. A key the caller set on the request is kept instead. Off by
    /// default.
    pub fn idempotency_key(mut self, send: bool) -> Self {
        self.policy.idempotency_key = send;
        self
    }

    /// Resumes allowed per logical request.
    pub fn max_resumes(mut self, n: u32) -> Self {
        self.policy.max_resumes = n;
        self
    }

    /// Sends each target gets, before commit, before a request with
    /// alternates moves on ([`crate::failover`]). Every send still counts
    /// against `max_attempts`.
    pub fn attempts_per_target(mut self, n: NonZeroU32) -> Self {
        self.policy.attempts_per_target = n;
        self
    }

    /// Where the endpoint runs.
    pub fn endpoint(mut self, endpoint: Endpoint) -> Self {
        self.policy.endpoint = endpoint;
        self
    }

    /// Stall watchdog on silence (any byte resets it).
    pub fn idle_timeout(mut self, t: Option<Duration>) -> Self {
        if t.is_some_and(|d| d.is_zero()) {
            return self.fail(PolicyError::ZeroDuration("idle timeout"));
        }
        self.policy.idle_timeout = t;
        self
    }

    /// Stall watchdog on progress (only semantic fragments reset it).
    pub fn progress_timeout(mut self, t: Option<Duration>) -> Self {
        if t.is_some_and(|d| d.is_zero()) {
            return self.fail(PolicyError::ZeroDuration("progress timeout"));
        }
        self.policy.progress_timeout = t;
        self
    }

    /// Longest wait, from the head of a streamed answer, for its first
    /// semantic fragment (text, reasoning, a tool-call fragment); off by
    /// default. Past it, before commit, the attempt fails as a stall
    /// ([`Stall::FirstToken`](crate::failure::Stall::FirstToken)): it is
    /// released at once, so the provider stops generating, and the next send
    /// goes to the next target when there is one, else to the same target,
    /// under every bound a replay has. A provider that holds a request
    /// 20 s before its first token, where another answers in one, is left
    /// in the time the caller chose. After commit it has no effect (the
    /// idle and progress watchdogs bound a committed stream).
    pub fn first_token_timeout(mut self, t: Option<Duration>) -> Self {
        if t.is_some_and(|d| d.is_zero()) {
            return self.fail(PolicyError::ZeroDuration("first-token timeout"));
        }
        self.policy.first_token_timeout = t;
        self
    }

    /// Hedging of the first token: an attempt that has shown no semantic
    /// fragment (text, reasoning, a tool-call fragment) this long after its
    /// send, before commit, is raced by a second attempt, to the next target
    /// when the request has alternates, else to the same one; off by
    /// default. Both run; the first semantic fragment decides the race, and
    /// the other attempt is released at once. An error, a keepalive, a
    /// role-only chunk or a terminal with no output never wins while its
    /// rival runs. Each hedge is a send under the allowance, the retry
    /// budget, the cooldown and the deadline; never after commit, never on
    /// a `local` endpoint (a second inference on the same machine needs the
    /// admission hook, which a hedge does not ask).
    pub fn hedge_after(mut self, t: Option<Duration>) -> Self {
        if t.is_some_and(|d| d.is_zero()) {
            return self.fail(PolicyError::ZeroDuration("hedge delay"));
        }
        self.policy.hedge_after = t;
        self
    }

    /// Hedges a request may start in all (default 1): one race at a time,
    /// and after a race that ended without a winner, the next no sooner
    /// than [`hedge_after`](Self::hedge_after) later.
    pub fn max_hedges(mut self, n: NonZeroU32) -> Self {
        self.policy.max_hedges = n;
        self
    }

    /// Longest wait for a response head.
    pub fn head_timeout(mut self, t: Option<Duration>) -> Self {
        if t.is_some_and(|d| d.is_zero()) {
            return self.fail(PolicyError::ZeroDuration("head timeout"));
        }
        self.policy.head_timeout = t;
        self
    }

    /// The validated policy, or the first error met.
    pub fn build(self) -> Result<RecoveryPolicy, PolicyError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.policy),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_table() {
        let p = RecoveryPolicy::default();
        assert_eq!(p.max_attempts().get(), 3);
        assert_eq!(p.backoff_base(), Duration::from_millis(500));
        assert_eq!(p.backoff_ceiling(), Duration::from_secs(8));
        assert_eq!(p.budget(), Some(Duration::from_mins(1)));
        assert_eq!(p.retryable_statuses(), DEFAULT_RETRYABLE_STATUSES);
        assert_eq!(p.retry_after_ceiling(), Duration::from_mins(1));
        assert_eq!(p.over_ceiling(), OverCeiling::Refuse);
    }

    #[test]
    fn a_whole_answers_head_gets_the_longer_of_the_bounds_on() {
        let secs = Duration::from_secs;
        let p = |head, progress| {
            RecoveryPolicy::builder()
                .head_timeout(head)
                .progress_timeout(progress)
                .build()
                .unwrap()
        };
        let default = RecoveryPolicy::default();
        assert_eq!(default.head_bound(false), Some(secs(300)));
        assert_eq!(default.head_bound(true), Some(secs(600)));
        assert_eq!(
            p(Some(secs(900)), Some(secs(600))).head_bound(true),
            Some(secs(900))
        );
        assert_eq!(p(None, Some(secs(600))).head_bound(true), Some(secs(600)));
        assert_eq!(p(Some(secs(30)), None).head_bound(true), Some(secs(30)));
        assert_eq!(p(None, None).head_bound(true), None);
        assert_eq!(p(None, Some(secs(600))).head_bound(false), None);
    }

    #[test]
    fn permanent_statuses_cannot_be_selected() {
        for s in NEVER_RETRYABLE {
            let err = RecoveryPolicy::builder()
                .retryable_statuses([503, *s])
                .build()
                .unwrap_err();
            assert_eq!(err, PolicyError::InvalidStatus(*s));
        }
        for s in [600, 402, 307, 200, 99] {
            assert_eq!(
                RecoveryPolicy::builder().retryable_statuses([s]).build(),
                Err(PolicyError::InvalidStatus(s))
            );
        }
    }

    #[test]
    fn invalid_shapes_are_typed_errors() {
        assert_eq!(
            RecoveryPolicy::builder()
                .backoff(Duration::from_secs(2), Duration::from_secs(1))
                .build(),
            Err(PolicyError::CeilingBelowBase)
        );
        assert_eq!(
            RecoveryPolicy::builder()
                .retryable_categories([Category::Protocol])
                .build(),
            Err(PolicyError::UnsupportedCategory(Category::Protocol))
        );
        assert!(RecoveryPolicy::builder().holdback_cap(0).build().is_err());
        assert!(
            RecoveryPolicy::builder()
                .max_event_bytes(0)
                .build()
                .is_err()
        );
    }

    #[test]
    fn status_retryable_respects_the_permanent_set() {
        let p = RecoveryPolicy::builder()
            .retryable_statuses([409, 503])
            .build()
            .unwrap();
        assert!(p.status_retryable(409));
        assert!(!p.status_retryable(500));
        assert!(!p.status_retryable(400));
    }
}
