//! `recovery-core`: the sans-IO engine of Recovery.
//!
//! Plain data in, decisions out. No runtime, no sockets, no clock calls: time,
//! sleep, randomness and connectivity come in through the [`timing`] traits so
//! the same engine drives the tower layer (`tower-recovery`) and the
//! wasm/`fetch` driver, and is tested exhaustively on a virtual clock.
//!
//! Most applications use a driver (`tower-recovery`, the `recovery-wasm`
//! npm package) and name only what is at this crate's root: the
//! [`RecoveryPolicy`] they configure, the [`LifecycleEvent`]s they watch (or
//! the [`RecoveryStatus`] a UI shows), the [`RecoveryReport`], [`Outcome`]
//! and [`RecoveryError`] they get at the end, a [`RecoveryCall`] to cancel,
//! and a shared [`RetryBudget`]. The modules hold the rest of each area:
//!
//! | module | for |
//! |---|---|
//! | [`policy`], [`lifecycle`], [`report`], [`outcome`], [`error`] | configuring, watching and reading the result |
//! | [`failure`], [`progress`] | the evidence a report and an error carry |
//! | [`protocol`], [`resume`], [`continuation`] | which protocol an answer speaks, what it can resume, how a committed answer is continued (the hook's input, a declared prefill) |
//! | [`exchange`], [`observer`], [`timing`], [`budget`], [`cooldown`], [`call`], [`wire`] | writing a driver: the machine, the decoder, clocks, shared budgets and cooldowns, cancellation, decoder limits |
//!
//! # Features
//!
//! - `serde_json` (default): the reference decoding path the differential
//!   tests compare the fast scanner with; off in the wasm package.
//! - `test-util`: a virtual clock (`timing::ManualTiming`), scripted
//!   connectivity and the conformance vectors' types (`conformance`), for
//!   testing a driver.
//!
//! # Policy defaults
//!
//! | knob | default | builder method |
//! |---|---|---|
//! | physical sends, first included | 3 | `max_attempts` |
//! | backoff base / ceiling (full jitter) | 500 ms / 8 s | `backoff` |
//! | recovery budget, from the first failure | 60 s | `budget` |
//! | deadline, from the start of the request | none | `deadline` |
//! | retryable statuses | 408, 429, 500, 502, 503, 504, 529 | `retryable_statuses` |
//! | never retryable, whatever is selected | 400, 401, 403, 404, 413, 422 | — |
//! | retryable categories | transport, http, client_timeout, provider_response | `retryable_categories` |
//! | `Retry-After` ceiling / above it | 60 s / refuse (never shortened) | `retry_after_ceiling` |
//! | replay body cap | 64 MiB | `replay_body_cap` |
//! | hold-back cap (pre-commit prefix) | 1 MiB | `holdback_cap` |
//! | evidence cap (`inspect_*`) | 16 KiB | `evidence_cap` |
//! | event cap (a line, an event, a whole JSON answer) | 32 MiB | `max_event_bytes` |
//! | resumes | 1 | `max_resumes` |
//! | endpoint | remote (ambiguous resends allowed) | `endpoint` |
//! | head / idle / progress timeouts | 300 s (a whole answer's: 600 s) / 600 s / 600 s | `head_timeout`, `idle_timeout`, `progress_timeout` |
//!
//! Each driver also shares, between the requests of one client (a layer and
//! its clones, one recovering fetch), a [`RetryBudget`] (20 % of requests
//! plus 1 retry/s over 10 s: [`RetryBudgetConfig::default`]) and a
//! [`cooldown`] store (a `Retry-After` one request learns holds the others
//! bound for the same origin and model).
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use recovery_core::policy::{OverCeiling, RecoveryPolicy, DEFAULT_RETRYABLE_STATUSES};
//!
//! let defaults = RecoveryPolicy::default();
//! assert_eq!(defaults.max_attempts().get(), 3);
//! assert_eq!(defaults.backoff_base(), Duration::from_millis(500));
//! assert_eq!(defaults.backoff_ceiling(), Duration::from_secs(8));
//! assert_eq!(defaults.budget(), Some(Duration::from_secs(60)));
//! assert_eq!(defaults.retryable_statuses(), DEFAULT_RETRYABLE_STATUSES);
//! assert_eq!(defaults.retry_after_ceiling(), Duration::from_secs(60));
//! // Nothing hangs by default: a stalled head, a silent body and an endless
//! // run of keepalives are all bounded (undici's 300 s for a head, the
//! // SDKs' 600 s read timeout for a body: a model may think in silence).
//! assert_eq!(defaults.head_timeout(), Some(Duration::from_secs(300)));
//! assert_eq!(defaults.head_bound(true), Some(Duration::from_secs(600)));
//! assert_eq!(defaults.idle_timeout(), Some(Duration::from_secs(600)));
//! assert_eq!(defaults.progress_timeout(), Some(Duration::from_secs(600)));
//!
//! let policy = RecoveryPolicy::builder()
//!     .max_attempts(NonZeroU32::new(5).unwrap())
//!     .backoff(Duration::from_millis(250), Duration::from_secs(4))
//!     .retry_after_ceiling(Duration::from_secs(30), OverCeiling::Refuse)
//!     .idle_timeout(Some(Duration::from_secs(45)))
//!     .build()?;
//! assert_eq!(policy.max_attempts().get(), 5);
//!
//! // Permanent failures cannot be made retryable: a typed error, not a surprise later.
//! assert!(RecoveryPolicy::builder().retryable_statuses([401]).build().is_err());
//! # Ok::<(), recovery_core::policy::PolicyError>(())
//! ```
//!
//! # Lifecycle vocabulary
//!
//! Every logical request emits [`lifecycle::LifecycleEvent`]s in order and
//! ends in exactly one terminal event. The serde form is one flat JSON object
//! with `event`, `logical_id`, `attempt_id`, `wire_attempt`, `at_ms` and the
//! event's own fields; it never carries body text, header values or
//! credentials.
//!
//! | event | meaning |
//! |---|---|
//! | `attempt_started` | a physical send starts (`max_attempts`, `resume`) |
//! | `attempt_failed` | it failed (`category`, `phase`, `reason`, `status`) |
//! | `delay_scheduled` | a wait before the next send (`delay_ms`, `cause`: `backoff` or `retry_after`) |
//! | `retry_started` / `resume_started` | the wait is over; the next send follows |
//! | `parked_offline` | offline: waiting for the network |
//! | `admission_pending`, `_allowed`, `_rejected`, `_unresolved`, `_required` | the admission hook for ambiguous resends |
//! | `committed` | output flows to the consumer from now on (`trigger`: `semantic`, `holdback_cap`, `terminal`) |
//! | `attempt_succeeded` | the attempt ended with terminal proof (`proof`) |
//! | **`completed`** | terminal: finished with proof |
//! | **`exhausted`** | terminal: failed before commit (`outcome`) |
//! | **`interrupted`** | terminal: failed after commit (`outcome`) |
//! | **`cancelled`** | terminal: the caller cancelled (`phase`) |
//!
//! Drivers run one sans-IO machine per logical request
//! ([`exchange::Exchange`]): plain values in, what to do next out. Here a
//! 503 with `Retry-After: 2` on the first send:
//!
//! ```
//! use std::borrow::Cow;
//! use std::time::{Duration, SystemTime};
//! use recovery_core::budget::AttemptAllowance;
//! use recovery_core::exchange::{Exchange, Head, Io, RequestFacts};
//! use recovery_core::protocol::ProtocolChoice;
//! use recovery_core::timing::Instant;
//! use recovery_core::RecoveryPolicy;
//!
//! struct Overloaded;
//! impl Head for Overloaded {
//!     fn status(&self) -> u16 { 503 }
//!     fn header(&self, name: &str) -> Option<Cow<'_, str>> {
//!         (name == "retry-after").then_some(Cow::Borrowed("2"))
//!     }
//! }
//!
//! let now = Instant::from_origin(Duration::ZERO);
//! let request = RequestFacts::new("POST", "/v1/chat/completions", b"{}");
//! let mut ex: Exchange<Vec<u8>> = Exchange::new(
//!     RecoveryPolicy::default(),
//!     &ProtocolChoice::Auto,
//!     request,
//!     AttemptAllowance::new(3),
//!     7,
//!     now,
//! );
//! let online = true; // the platform's view, read where the machine decides
//! assert!(matches!(ex.poll(now, online), Io::Send(_)));
//! ex.on_sent(now);
//! ex.on_head(now, SystemTime::UNIX_EPOCH, &Overloaded, None);
//! assert!(matches!(ex.poll(now, online), Io::Read)); // the capped error body
//! ex.on_end(now);
//! assert!(matches!(ex.poll(now, online), Io::Release)); // done with that response
//! assert!(matches!(ex.poll(now, online), Io::Sleep)); // until the deadline below
//! assert_eq!(ex.poll_timeout(), Some(Instant::from_origin(Duration::from_secs(2))));
//!
//! let events: Vec<&str> = ex.drain_events().map(|e| e.kind.name()).collect();
//! assert_eq!(events, ["attempt_started", "attempt_failed", "delay_scheduled"]);
//! ```
//!
//! # What is guaranteed, and what is not
//!
//! Guaranteed, each by a test that can fail:
//!
//! - no replay once any semantic fragment (text, reasoning, a tool-call
//!   fragment, a server-side tool start) was *observed*, delivered or not;
//! - physical sends ≤ `max_attempts`, across nested layers and resumes;
//! - a stream is `completed` only on the protocol's terminal proof; a clean
//!   EOF without it is a failure (`UnexpectedEof`), never success;
//! - a `Retry-After` is a minimum: one above the ceiling or the remaining
//!   budget is refused, not shortened; permanent statuses and unsuccessful
//!   terminals (`length`, content filter) are never retried;
//! - every logical request ends in exactly one terminal event, and
//!   `Display`, `Debug`, events and reports carry no body text, credentials
//!   or header values outside an allowlist.
//!
//! Not guaranteed:
//!
//! - **No exactly-once tool journal.** Recovery prevents a *transport* replay
//!   from duplicating output; it does not record which tool calls an agent
//!   already executed. Execute a tool call only after `completed`, and keep
//!   your own journal if side effects must not repeat across *your* retries.
//! - **Closing a socket does not prove the remote generation stopped.** After
//!   a cancel or a reset the provider may still finish (and bill) the
//!   original request; an ambiguous resend to a local runner can overlap it
//!   (use `Endpoint::Local` and an admission hook there).
//! - **Headers can differ between attempts before commit.** The caller sees
//!   the committed attempt's status and headers only; request ids, rate-limit
//!   headers and the like come from that attempt, not the first one sent.
#![deny(unsafe_code, missing_docs, unreachable_pub)]
#![deny(unnameable_types)]
// A build with some protocols left out (the wasm package's one-protocol
// modules) leaves shared helpers unused; the full build is held to every
// lint.
#![cfg_attr(
    not(all(
        feature = "openai-chat",
        feature = "openai-responses",
        feature = "anthropic",
        feature = "gemini",
        feature = "ollama"
    )),
    allow(unused)
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The front door: what an application names.
pub use budget::{RetryBudget, RetryBudgetConfig};
pub use call::{Cancellation, RecoveryCall};
pub use error::RecoveryError;
pub use lifecycle::{LifecycleEvent, LifecycleObserver, RecoveryStatus};
pub use outcome::Outcome;
pub use policy::{Endpoint, OverCeiling, PolicyBuilder, PolicyError, RecoveryPolicy};
pub use protocol::ProtocolKind;
pub use report::RecoveryReport;
pub use timing::{Connectivity, Timing};

pub mod body_fields;
pub mod budget;
pub mod call;
pub mod continuation;
pub mod cooldown;
pub mod error;
pub mod exchange;
pub mod failover;
pub mod failure;
pub mod genai;
pub mod lifecycle;
pub mod observer;
pub mod outcome;
pub mod policy;
pub mod progress;
pub mod protocol;
pub mod report;
pub mod resume;
pub mod text;
pub mod timing;
pub mod wire;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod conformance;

mod backoff;
mod copy;
mod decision;
mod http_date;
pub(crate) mod json;
mod retry_after;
mod safe;
mod small_sort;

// The crate's own tests read every protocol's recorded streams.
#[cfg(all(
    test,
    feature = "openai-chat",
    feature = "openai-responses",
    feature = "anthropic",
    feature = "gemini",
    feature = "ollama"
))]
mod tests;
