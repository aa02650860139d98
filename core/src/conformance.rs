//! The conformance vector format: one logical request as data (a policy, what
//! each physical send does, and what must come out), run by every driver so
//! the same evidence gives the same decisions everywhere.
//!
//! The files live in `tests/conformance/engine/*.json`; the format is
//! documented in `tests/conformance/README.md`. This module is the one
//! reading of that format, shared by the engine's runner, the tower runner
//! and the wasm runner.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::continuation::{Prefill, UnknownPrefill};
use crate::failure::{Failure, Phase, TransportKind};
use crate::outcome::CancelPhase;
/// The policy knobs of a vector: the spec every front end reads
/// (`"policy": {}` is the default policy; `"off"` turns a bound off).
pub use crate::policy::PolicySpec;
use crate::progress::Proof;
use crate::protocol::{ProtocolKind, SseTerminal};
use crate::retry_after::{RetryAfter, parse_retry_after};

/// The wall clock every vector starts at: 1000 s after the Unix epoch.
pub const WALL_CLOCK: Duration = Duration::from_secs(1000);

/// One scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Vector {
    /// Short name (the file name without `.json`).
    pub name: String,
    /// What it shows.
    pub description: String,
    /// The policy knobs ([`PolicySpec`]).
    pub policy: PolicySpec,
    /// Every jitter draw, as a fraction of the backoff bound.
    pub jitter: f64,
    /// An admission hook's answers in order (`allow`, `reject`,
    /// `unresolved`, `cancel`); absent: no hook.
    pub admission: Option<Vec<String>>,
    /// The caller cancels during a wait.
    pub cancel_during_wait: Option<CancelSpec>,
    /// What each send does, in order.
    pub attempts: Vec<AttemptSpec>,
    /// What must come out.
    pub expected: Expected,
    /// The protocol the answers speak (default `openai-chat`).
    #[serde(default)]
    pub protocol: Option<String>,
    /// The logical request (default `POST /v1/chat/completions` with `{}`).
    #[serde(default)]
    pub request: Option<RequestSpec>,
    /// The endpoint is declared an SSE server that honours `Last-Event-ID`.
    #[serde(default)]
    pub resumable_sse: bool,
    /// A continuation hook is installed and returns this request.
    #[serde(default)]
    pub continuation: Option<RequestSpec>,
    /// The success terminal of a generic `sse` stream.
    #[serde(default)]
    pub sse_terminal: Option<SseTerminal>,
    /// A cooldown another request learned for this request's endpoint, in
    /// force for this long when the request starts (the runner notes it in
    /// the store its driver shares, under [`crate::cooldown::key_for`] of
    /// the request).
    #[serde(default)]
    pub cooldown_ms: Option<u64>,
    /// The request's alternates, in order ([`crate::failover`]).
    #[serde(default)]
    pub alternates: Vec<AlternateSpec>,
    /// The declared context window of the request's own target, in tokens.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The prefill form the request's own target continues with
    /// ([`crate::continuation::Prefill`] by name).
    #[serde(default)]
    pub prefill: Option<String>,
    /// The retry budget the request draws from, when not its driver's
    /// default.
    #[serde(default)]
    pub retry_budget: Option<BudgetSpec>,
}

/// A retry budget of a vector ([`crate::budget::RetryBudgetConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetSpec {
    /// How long a deposit counts, in ms.
    pub ttl_ms: u64,
    /// Retries per second always allowed.
    pub min_retries_per_sec: u32,
    /// The fraction of requests that may be retried (0.1: 10 %).
    pub percent: f64,
}

impl BudgetSpec {
    /// The budget itself, fresh.
    pub fn budget(&self) -> crate::budget::RetryBudget {
        crate::budget::RetryBudget::new(crate::budget::RetryBudgetConfig::new(
            Duration::from_millis(self.ttl_ms),
            self.min_retries_per_sec,
            self.percent,
        ))
    }
}

/// An alternate of a vector's request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlternateSpec {
    /// Its label.
    pub label: String,
    /// Its URL: a path on the runner's origin (or absolute).
    #[serde(default)]
    pub url: Option<String>,
    /// The model it asks for.
    #[serde(default)]
    pub model: Option<String>,
    /// The protocol its answers speak (default: the request's).
    #[serde(default)]
    pub protocol: Option<String>,
    /// Its declared context window, in tokens.
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The prefill form it continues with.
    #[serde(default)]
    pub prefill: Option<String>,
}

impl AlternateSpec {
    /// The target it describes.
    pub fn target(&self) -> Result<crate::failover::Target, String> {
        let mut t = crate::failover::Target::new(&self.label).map_err(|e| e.to_string())?;
        if let Some(url) = &self.url {
            t = t.with_url(url).map_err(|e| e.to_string())?;
        }
        if let Some(model) = &self.model {
            t = t.with_model(model).map_err(|e| e.to_string())?;
        }
        if let Some(p) = &self.protocol {
            let kind: ProtocolKind = p.parse().map_err(|_| format!("unknown protocol {p:?}"))?;
            t = t.with_protocol(kind.into());
        }
        if let Some(tokens) = self.context_window {
            t = t.with_context_window(tokens);
        }
        if let Some(p) = &self.prefill {
            t = t.with_prefill(p.parse().map_err(|e: UnknownPrefill| e.to_string())?);
        }
        Ok(t)
    }
}

/// A request of a vector: method, path (with its query) and body text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpec {
    /// The method.
    pub method: String,
    /// The path and query (runners put their own origin before it).
    pub path: String,
    /// The body text (written as [`text`] takes it).
    #[serde(default, deserialize_with = "text::one")]
    pub body: String,
}

impl Vector {
    /// The protocol's name (`openai-chat` by default).
    pub fn protocol_name(&self) -> &str {
        self.protocol.as_deref().unwrap_or("openai-chat")
    }

    /// The protocol the answers speak.
    pub fn protocol(&self) -> Result<ProtocolKind, String> {
        let kind: ProtocolKind = self
            .protocol_name()
            .parse()
            .map_err(|_| format!("unknown protocol {:?}", self.protocol_name()))?;
        Ok(match kind {
            ProtocolKind::Sse { .. } => ProtocolKind::Sse {
                terminal_sentinel: self.sse_terminal.clone(),
            },
            other => other,
        })
    }

    /// The prefill form of the request's own target.
    pub fn own_prefill(&self) -> Result<Option<Prefill>, String> {
        self.prefill
            .as_deref()
            .map(|p| p.parse().map_err(|e: UnknownPrefill| e.to_string()))
            .transpose()
    }

    /// The request's alternates.
    pub fn targets(&self) -> Result<Vec<crate::failover::Target>, String> {
        self.alternates.iter().map(AlternateSpec::target).collect()
    }

    /// The logical request.
    pub fn request(&self) -> RequestSpec {
        self.request.clone().unwrap_or_else(|| RequestSpec {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            body: r#"{"stream":true}"#.into(),
        })
    }
}

/// A cancellation during a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelSpec {
    /// Which wait (0-based).
    pub wait: usize,
    /// How far into it.
    pub after_ms: u64,
}

/// What one send does: exactly one of `fail`, `succeed`, `cancel`, `wire`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttemptSpec {
    /// The exchange on the wire, byte for byte.
    #[serde(default)]
    pub wire: Option<WireSpec>,
    /// The platform goes offline when this send fails, and stays offline.
    #[serde(default)]
    pub offline: bool,
    /// The send fails.
    pub fail: Option<FailSpec>,
    /// The send ends with terminal proof.
    pub succeed: Option<Proof>,
    /// The consumer cancels in this phase.
    pub cancel: Option<CancelPhase>,
    /// The attempt delivered a semantic fragment (it commits) before it ended.
    #[serde(default)]
    pub semantic: bool,
}

/// A failed send: a status or a transport error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailSpec {
    /// The response status.
    pub status: Option<u16>,
    /// The `Retry-After` header value.
    pub retry_after: Option<String>,
    /// The `x-should-retry` header.
    pub should_retry: Option<bool>,
    /// The transport error.
    pub transport: Option<TransportKind>,
    /// Where the transport error happened.
    pub phase: Option<Phase>,
}

impl FailSpec {
    /// The failure evidence, `None` when the spec is neither a status nor a
    /// transport error with a phase.
    pub fn failure(&self) -> Option<Failure> {
        match (self.status, self.transport, self.phase) {
            (Some(status), None, _) => {
                let hint = self.retry_after.as_deref().map_or(RetryAfter::Absent, |v| {
                    parse_retry_after(v, SystemTime::UNIX_EPOCH + WALL_CLOCK)
                });
                Some(Failure::status(status, hint, self.should_retry))
            }
            (None, Some(kind), Some(phase)) => Some(Failure::transport(kind, phase)),
            _ => None,
        }
    }
}

/// One send as the server plays it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireSpec {
    /// The response status; absent with `head`.
    #[serde(default)]
    pub status: Option<u16>,
    /// Response headers (lowercase names).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// No head: `never` (the server stalls inside the head) or `reset`.
    #[serde(default)]
    pub head: Option<HeadFault>,
    /// Body chunks, each sent as one write (each written as [`text`] takes
    /// it).
    #[serde(default, deserialize_with = "text::chunks")]
    pub chunks: Vec<String>,
    /// After the chunks, a keepalive comment every this many ms, forever.
    #[serde(default)]
    pub keepalive_every_ms: Option<u64>,
    /// How the body ends.
    #[serde(default)]
    pub end: WireEnd,
    /// When the head comes, in ms after the send (at once by default).
    #[serde(default)]
    pub head_at_ms: u64,
    /// When each chunk is written, in ms after the send, in order (each
    /// with its head by default); the end follows the last.
    #[serde(default)]
    pub chunks_at_ms: Vec<u64>,
}

/// A send that gets no head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadFault {
    /// The server stalls: no head ever comes.
    Never,
    /// The connection is reset before the head.
    Reset,
}

/// How a body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireEnd {
    /// A clean end of body.
    #[default]
    Eof,
    /// The connection is reset.
    Reset,
    /// Nothing more ever comes.
    Hang,
    /// Nothing more comes; the consumer drops the body once it has read
    /// everything (as an SDK does after its end marker).
    ConsumerDrop,
    /// Nothing more comes; the caller cancels once the consumer has read
    /// everything.
    ConsumerCancel,
}

/// What a runner plays for one send, whatever form the vector used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Played {
    /// The head (or why there is none).
    pub head: PlayedHead,
    /// Body chunks.
    pub chunks: Vec<String>,
    /// A keepalive every this many ms after the chunks, forever.
    pub keepalive_every_ms: Option<u64>,
    /// How the body ends.
    pub end: WireEnd,
    /// When the head comes, in ms after the send.
    pub head_at_ms: u64,
    /// When each chunk is written, in ms after the send (one per chunk,
    /// none before the head, in order).
    pub chunks_at_ms: Vec<u64>,
    /// The caller cancels while this send awaits its head.
    pub cancel_awaiting: bool,
    /// The platform goes offline when this send fails.
    pub offline: bool,
}

/// The head of a played send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum PlayedHead {
    /// A head.
    Status {
        /// The status.
        status: u16,
        /// Headers, lowercase names.
        headers: Vec<(String, String)>,
    },
    /// The send fails before any head.
    Fails {
        /// How.
        transport: TransportKind,
        /// Where.
        phase: Phase,
    },
    /// No head ever comes.
    Never,
}

/// A vector's text: one string, or pieces joined, each a string or
/// `{"repeat": "…", "times": n}`, so that an event of several MiB (an
/// image as base64) is one line of a vector.
pub mod text {
    use serde::{Deserialize, Deserializer, de::Error};

    /// The most text one value may spell out.
    const MAX: usize = 64 << 20;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        One(String),
        Pieces(Vec<Piece>),
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Piece {
        Text(String),
        Repeat { repeat: String, times: usize },
    }

    impl Form {
        fn spelled(self) -> Result<String, String> {
            let pieces = match self {
                Form::One(s) => return Ok(s),
                Form::Pieces(p) => p,
            };
            let mut out = String::new();
            for piece in pieces {
                let (s, times) = match piece {
                    Piece::Text(s) => (s, 1),
                    Piece::Repeat { repeat, times } => (repeat, times),
                };
                match s.len().checked_mul(times) {
                    Some(n) if out.len() + n <= MAX => out.push_str(&s.repeat(times)),
                    _ => return Err(format!("a text longer than {MAX} bytes")),
                }
            }
            Ok(out)
        }
    }

    /// Chunks, each a text.
    pub fn chunks<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        Vec::<Form>::deserialize(d)?
            .into_iter()
            .map(|f| f.spelled().map_err(D::Error::custom))
            .collect()
    }

    /// A text.
    pub fn one<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        Form::deserialize(d)?.spelled().map_err(D::Error::custom)
    }

    /// A text, if given.
    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        Option::<Form>::deserialize(d)?
            .map(|f| f.spelled().map_err(D::Error::custom))
            .transpose()
    }
}

/// The OpenAI Chat events the abstract attempt forms are played with.
pub mod chat {
    /// A role-only delta (not semantic).
    pub const ROLE: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    /// A content delta (semantic).
    pub const HELLO: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n";
    /// The finish reason.
    pub const STOP: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    /// The strong terminal proof.
    pub const DONE: &str = "data: [DONE]\n\n";
}

impl AttemptSpec {
    /// What a runner plays for this send.
    pub fn played(&self) -> Result<Played, String> {
        use chat::{DONE, HELLO, ROLE, STOP};
        let sse = || vec![("content-type".to_owned(), "text/event-stream".to_owned())];
        let ok = |chunks: Vec<&str>, end| Played {
            head: PlayedHead::Status {
                status: 200,
                headers: sse(),
            },
            chunks: chunks.into_iter().map(str::to_owned).collect(),
            keepalive_every_ms: None,
            end,
            head_at_ms: 0,
            chunks_at_ms: Vec::new(),
            cancel_awaiting: false,
            offline: self.offline,
        };
        let played = match (&self.wire, &self.fail, self.succeed, self.cancel) {
            (Some(w), None, None, None) => Played {
                head: match (w.status, w.head) {
                    (Some(status), None) => PlayedHead::Status {
                        status,
                        headers: w.headers.clone().into_iter().collect(),
                    },
                    (None, Some(HeadFault::Never)) => PlayedHead::Never,
                    (None, Some(HeadFault::Reset)) => PlayedHead::Fails {
                        transport: TransportKind::Reset,
                        phase: Phase::AwaitingHeaders,
                    },
                    _ => return Err("a wire send has a status or a head fault".into()),
                },
                chunks: w.chunks.clone(),
                keepalive_every_ms: w.keepalive_every_ms,
                end: w.end,
                head_at_ms: w.head_at_ms,
                chunks_at_ms: w.chunks_at_ms.clone(),
                cancel_awaiting: false,
                offline: self.offline,
            },
            (None, Some(f), None, None) => match (f.status, f.transport, f.phase) {
                (Some(status), None, _) => {
                    let mut headers =
                        vec![("content-type".to_owned(), "application/json".to_owned())];
                    if let Some(ra) = &f.retry_after {
                        headers.push(("retry-after".into(), ra.clone()));
                    }
                    if let Some(sr) = f.should_retry {
                        headers.push(("x-should-retry".into(), sr.to_string()));
                    }
                    Played {
                        head: PlayedHead::Status { status, headers },
                        chunks: vec!["{}".into()],
                        keepalive_every_ms: None,
                        end: WireEnd::Eof,
                        head_at_ms: 0,
                        chunks_at_ms: Vec::new(),
                        cancel_awaiting: false,
                        offline: self.offline,
                    }
                }
                (None, Some(_), Some(Phase::Streaming)) if self.semantic => {
                    ok(vec![ROLE, HELLO], WireEnd::Reset)
                }
                (None, Some(_), Some(Phase::Streaming)) => ok(vec![ROLE], WireEnd::Reset),
                (None, Some(transport), Some(phase)) => Played {
                    head: PlayedHead::Fails { transport, phase },
                    chunks: Vec::new(),
                    keepalive_every_ms: None,
                    end: WireEnd::Eof,
                    head_at_ms: 0,
                    chunks_at_ms: Vec::new(),
                    cancel_awaiting: false,
                    offline: self.offline,
                },
                _ => return Err("a failure is a status or a transport error with a phase".into()),
            },
            (None, None, Some(proof), None) => match proof {
                Proof::Strong => ok(vec![ROLE, HELLO, STOP, DONE], WireEnd::Eof),
                Proof::FinishReasonOnly => ok(vec![ROLE, HELLO, STOP], WireEnd::Eof),
            },
            (None, None, None, Some(CancelPhase::Streaming)) if self.semantic => {
                ok(vec![ROLE, HELLO], WireEnd::ConsumerCancel)
            }
            (None, None, None, Some(CancelPhase::Streaming)) => {
                ok(vec![ROLE], WireEnd::ConsumerCancel)
            }
            (None, None, None, Some(_)) => Played {
                head: PlayedHead::Never,
                chunks: Vec::new(),
                keepalive_every_ms: None,
                end: WireEnd::Eof,
                head_at_ms: 0,
                chunks_at_ms: Vec::new(),
                cancel_awaiting: true,
                offline: self.offline,
            },
            _ => return Err("an attempt is exactly one of fail, succeed, cancel, wire".into()),
        };
        played.timed()
    }
}

impl Played {
    /// Every chunk's time filled in (each with the head when none is
    /// given), and checked: one per chunk, none before the head, in order.
    fn timed(mut self) -> Result<Self, String> {
        if self.chunks_at_ms.is_empty() {
            self.chunks_at_ms = vec![self.head_at_ms; self.chunks.len()];
        }
        if self.chunks_at_ms.len() != self.chunks.len() {
            return Err("chunks_at_ms gives one time per chunk".into());
        }
        let mut last = self.head_at_ms;
        for &at in &self.chunks_at_ms {
            if at < last {
                return Err("chunks_at_ms runs forward, from head_at_ms".into());
            }
            last = at;
        }
        Ok(self)
    }
}

/// What must come out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// Lifecycle event names in order, `committed` left out.
    pub events: Vec<String>,
    /// The outcome's stable name.
    pub outcome: String,
    /// Physical sends made.
    pub sends: usize,
    /// Every wait scheduled, in ms, in order.
    pub delays_ms: Vec<u64>,
    /// The bytes the consumer received, exactly (written as [`text`]
    /// takes it).
    #[serde(default, deserialize_with = "text::optional")]
    pub delivered: Option<String>,
    /// The interruption's cause (`partial_frame`, `stall`, ...).
    #[serde(default)]
    pub cause: Option<String>,
    /// Whether the request committed (a response reached the caller).
    #[serde(default)]
    pub committed: Option<bool>,
    /// Virtual time of the terminal event, in ms from the start.
    #[serde(default)]
    pub end_ms: Option<u64>,
    /// Each send as `METHOD path`, plus ` last-event-id=<id>` and
    /// ` idempotency-key=<key>` (the logical id in it written `{id}`) when
    /// set.
    #[serde(default)]
    pub requests: Option<Vec<String>>,
    /// A transport error arrived after terminal proof.
    #[serde(default)]
    pub late_error: Option<bool>,
    /// What the shared cooldown store holds for the request's key when it
    /// ended, in ms (0: nothing in force).
    #[serde(default)]
    pub cooldown_left_ms: Option<u64>,
    /// Each attempt's rate-limit evidence, in order (`null`: none).
    #[serde(default)]
    pub rate_limits: Option<Vec<Option<crate::report::RateLimits>>>,
    /// Each attempt's target label, in order (`null`: none named).
    #[serde(default)]
    pub targets: Option<Vec<Option<String>>>,
    /// The target whose answer reached the caller.
    #[serde(default)]
    pub served_by: Option<String>,
    /// Each send's body, as text.
    #[serde(default)]
    pub bodies: Option<Vec<String>>,
    /// Each attempt's role in a hedging race (`first`, `hedge`; `null`:
    /// in none), in order.
    #[serde(default)]
    pub roles: Option<Vec<Option<String>>>,
    /// What the report keeps of the generation that succeeded: the model,
    /// finish reasons, usage.
    #[serde(default)]
    pub generation: Option<crate::progress::Generation>,
}

/// What a runner observed of one vector, compared with [`Expected`] by
/// [`Expected::check`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Event names in order, `committed` left out.
    pub events: Vec<String>,
    /// The outcome's name.
    pub outcome: String,
    /// The interruption cause, when interrupted.
    pub cause: Option<String>,
    /// Whether the report names a committed attempt.
    pub committed: bool,
    /// Sends made.
    pub sends: usize,
    /// Delays scheduled, in ms.
    pub delays_ms: Vec<u64>,
    /// Bytes the consumer received.
    pub delivered: Vec<u8>,
    /// Virtual time of the terminal event, in ms.
    pub end_ms: u64,
    /// Each send as `METHOD path[ last-event-id=<id>]`.
    pub requests: Vec<String>,
    /// The report's late-error flag.
    pub late_error: bool,
    /// What the cooldown store held for the request's key at its end, in ms.
    pub cooldown_left_ms: u64,
    /// Each attempt's rate-limit evidence.
    pub rate_limits: Vec<Option<crate::report::RateLimits>>,
    /// Each attempt's target label.
    pub targets: Vec<Option<String>>,
    /// The report's serving target.
    pub served_by: Option<String>,
    /// Each send's body.
    pub bodies: Vec<String>,
    /// Each attempt's role in a hedging race.
    pub roles: Vec<Option<String>>,
    /// The report's generation facts.
    pub generation: crate::progress::Generation,
}

impl Observed {
    /// Fills the fields a report holds: outcome, cause, commit, delays and
    /// the terminal time.
    pub fn from_report(&mut self, report: &crate::report::RecoveryReport) {
        if let Some(outcome) = &report.outcome {
            outcome.name().clone_into(&mut self.outcome);
            if let crate::outcome::Outcome::Interrupted { cause, .. } = outcome {
                self.cause = Some(cause.name().to_owned());
            }
        }
        self.committed = report.committed_attempt.is_some();
        self.delays_ms = report
            .delays
            .iter()
            .map(|d| d.delay_ms.as_millis() as u64)
            .collect();
        self.end_ms = report.metrics.total_ms.unwrap_or_default();
        self.late_error = report.late_error;
        self.rate_limits = report
            .attempts
            .iter()
            .map(|a| a.rate_limits.clone())
            .collect();
        self.targets = report.attempts.iter().map(|a| a.target.clone()).collect();
        self.roles = report
            .attempts
            .iter()
            .map(|a| {
                a.role.map(|r| match r {
                    crate::report::Role::First => "first".to_owned(),
                    crate::report::Role::Hedge => "hedge".to_owned(),
                })
            })
            .collect();
        self.served_by.clone_from(&report.served_by);
        self.generation.clone_from(&report.generation);
    }
}

impl Expected {
    /// Compares what a runner observed with this expectation; the error
    /// names the first field that differs.
    pub fn check(&self, name: &str, o: &Observed) -> Result<(), String> {
        let differ = |field: &str, want: &dyn std::fmt::Debug, got: &dyn std::fmt::Debug| {
            Err(format!("{name}: {field}: expected {want:?}, got {got:?}"))
        };
        if o.events != self.events {
            return differ("events", &self.events, &o.events);
        }
        if o.outcome != self.outcome {
            return differ("outcome", &self.outcome, &o.outcome);
        }
        if o.sends != self.sends {
            return differ("sends", &self.sends, &o.sends);
        }
        if o.delays_ms != self.delays_ms {
            return differ("delays_ms", &self.delays_ms, &o.delays_ms);
        }
        if let Some(d) = &self.delivered
            && o.delivered != d.as_bytes()
        {
            return differ("delivered", d, &String::from_utf8_lossy(&o.delivered));
        }
        if self.cause.is_some() && o.cause != self.cause {
            return differ("cause", &self.cause, &o.cause);
        }
        if let Some(c) = self.committed
            && o.committed != c
        {
            return differ("committed", &c, &o.committed);
        }
        if let Some(t) = self.end_ms
            && o.end_ms != t
        {
            return differ("end_ms", &t, &o.end_ms);
        }
        if let Some(r) = &self.requests
            && &o.requests != r
        {
            return differ("requests", r, &o.requests);
        }
        if let Some(l) = self.late_error
            && o.late_error != l
        {
            return differ("late_error", &l, &o.late_error);
        }
        if let Some(c) = self.cooldown_left_ms
            && o.cooldown_left_ms != c
        {
            return differ("cooldown_left_ms", &c, &o.cooldown_left_ms);
        }
        if let Some(r) = &self.rate_limits
            && &o.rate_limits != r
        {
            return differ("rate_limits", r, &o.rate_limits);
        }
        if let Some(t) = &self.targets
            && &o.targets != t
        {
            return differ("targets", t, &o.targets);
        }
        if self.served_by.is_some() && o.served_by != self.served_by {
            return differ("served_by", &self.served_by, &o.served_by);
        }
        if let Some(b) = &self.bodies
            && &o.bodies != b
        {
            return differ("bodies", b, &o.bodies);
        }
        if let Some(r) = &self.roles
            && &o.roles != r
        {
            return differ("roles", r, &o.roles);
        }
        if let Some(g) = &self.generation
            && &o.generation != g
        {
            return differ("generation", g, &o.generation);
        }
        Ok(())
    }
}
