//! The machine of one logical request, as the JS shell drives it: plain
//! numbers, strings and bytes in, an action code out. Every decision is
//! `recovery_core::exchange::Exchange`'s; this module only translates.
//!
//! Every input takes the platform's view at the moment of the call (`now`:
//! `performance.now()` ms; `wall`: `Date.now()` ms; a fresh `Math.random()`;
//! `navigator.onLine`) and answers the next action at once (the machine is
//! polled inside), so a steady stream costs one call per chunk.
//!
//! The answer is an action code (low byte) with flags:
//!
//! | code | action | payload |
//! |---:|---|---|
//! | 1 | send | `sendUrl`, `sendMethod`, `sendHeader`, `sendWithBody`, `sendKind` |
//! | 2 | await the head | |
//! | 3 | read the body | |
//! | 4 | release the attempt's response | |
//! | 5 | respond (commit) with the head | |
//! | 6 | respond with the final HTTP error | |
//! | 7 | deliver | `deliverId` (a chunk handed in) or `deliverBytes` |
//! | 8 | sleep until `deadline` | |
//! | 9 | wait until online | |
//! | 10 | ask the admission hook | `admissionJson` |
//! | 11 | await the admission hook | |
//! | 12 | ask the continuation hook | `prefixJson` |
//! | 13 | end: completed | |
//! | 14 | end: failed | `outcomeJson` |
//! | 15 | hedge: send the original request again, beside the attempt in flight | `sendKind` (its target), `retarget` |
//! | 16 | race: await either attempt's next head, chunk, end or error, or `deadline` | |
//! | 17 | release the hedge's response | |
//! | 18 | promote: the hedge's response becomes the attempt's | |
//!
//! | flag | meaning |
//! |---:|---|
//! | `0x100` | (from `onChunk`) hand the chunk just given to the consumer first |
//! | `0x200` | lifecycle events are waiting (`events`) |
//! | `0x400` | the deadline moved (`deadline`) |
//!
//! The inputs of an attempt (`onSent`, `onHead`, `onChunk`, `onEnd`,
//! `onError`) take its role last: 0 for the request's attempt, 1 for the
//! hedge racing it (from action 15 until action 17 or 18). After action 18
//! the hedge's response is the request's attempt, role 0.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use recovery_core::body_fields::BodyFields;
use recovery_core::budget::{AttemptAllowance, BudgetStore, RetryBudget, RetryBudgetConfig};
use recovery_core::continuation::Prefill;
use recovery_core::cooldown::{self, CooldownStore, Cooldowns};
use recovery_core::exchange::codes::Outgoing;
use recovery_core::exchange::{
    AdmissionAnswer, Chunk, Exchange, Head, Io, RequestFacts, Role, Setup,
};
use recovery_core::failover::Target;
use recovery_core::failure::{Failure, Phase, TransportKind};
use recovery_core::policy::{PolicyError, PolicySpec, field_by_camel_case};
use recovery_core::protocol::{ProtocolChoice, ProtocolKind, SseTerminal};
use recovery_core::timing::{Fraction, Instant, JitterSource};
use recovery_core::{RecoveryPolicy, RecoveryStatus};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen::prelude::*;

use crate::json::to_json;

/// Action codes (see the module docs): the machine's, shared with every
/// module that runs it under a shell.
pub use recovery_core::exchange::codes::action;

/// The role of an input's attempt: 1 the hedge racing the request's
/// attempt, anything else the request's attempt.
fn role(n: u32) -> Role {
    if n == 1 { Role::Hedge } else { Role::First }
}

/// `performance.now()` milliseconds as an [`Instant`] (microsecond grain).
fn instant(ms: f64) -> Instant {
    Instant::from_origin(Duration::from_micros((ms.max(0.0) * 1000.0) as u64))
}

/// An [`Instant`] as `performance.now()` milliseconds.
fn millis(at: Instant) -> f64 {
    at.saturating_since(Instant::from_origin(Duration::ZERO))
        .as_micros() as f64
        / 1000.0
}

/// A chunk the machine keeps: the shell's id for its `Uint8Array` (handed
/// on as it is when the machine delivers it) and its bytes.
struct Kept {
    id: u32,
    bytes: Vec<u8>,
}

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// A response head as the shell passes it: the status and the headers as
/// `name\nvalue\n` lines, names lowercase.
struct JsHead<'a> {
    status: u16,
    headers: &'a str,
    opaque_redirect: bool,
}

impl Head for JsHead<'_> {
    fn status(&self) -> u16 {
        self.status
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        let mut lines = self.headers.split('\n');
        while let (Some(n), Some(v)) = (lines.next(), lines.next()) {
            if n == name {
                return Some(Cow::Borrowed(v));
            }
        }
        None
    }
    fn opaque_redirect(&self) -> bool {
        self.opaque_redirect
    }
}

/// Indices of the numeric options in `Client::new`'s `numbers`: the
/// options that are not policy knobs (those come as text, by the names of
/// the policy table). `NaN` keeps the default.
mod slot {
    pub(super) const PROTOCOL: usize = 0;
    pub(super) const RESUMABLE_SSE: usize = 1;
    pub(super) const BUDGET_TTL_MS: usize = 2;
    pub(super) const BUDGET_MIN_PER_SEC: usize = 3;
    pub(super) const BUDGET_PERCENT: usize = 4;
    pub(super) const NO_COOLDOWNS: usize = 5;
    pub(super) const CONTEXT_WINDOW: usize = 6;
    pub(super) const PREFILL: usize = 7;
    #[cfg(test)]
    pub(super) const COUNT: usize = 8;
}

/// The policy spec the shell wrote: one `name=value` line per policy
/// option given, `name` the npm option (the policy table's name in
/// camelCase), `value` as `recover` takes it (`off`, digits, `true`, a
/// name, a comma-separated list).
fn spec_of(text: &str) -> Result<PolicySpec, PolicyError> {
    let mut spec = PolicySpec::new();
    for line in text.lines() {
        let (name, value) = line.split_once('=').unwrap_or((line, ""));
        let field =
            field_by_camel_case(name).ok_or_else(|| PolicyError::UnknownKnob(name.to_owned()))?;
        spec.set_text(field.name, value)?;
    }
    Ok(spec)
}

/// The prefill form of index `n` in `Prefill::ALL`; none for -1, NaN or
/// anything out of range.
fn prefill_of(n: f64) -> Option<Prefill> {
    if n.is_nan() || n < 0.0 {
        return None;
    }
    Prefill::ALL.get(n as usize).copied()
}

/// Protocol codes of `numbers[PROTOCOL]`, in `PROTOCOLS` order; `0` is
/// `auto`.
const PROTOCOLS: [&str; 7] = [
    "auto",
    "openai-chat",
    "openai-responses",
    "anthropic",
    "gemini",
    "ollama",
    "sse",
];

/// A flag or a two-way choice: 1 (the second way) or 0.
fn set(n: f64) -> bool {
    n > 0.5
}

fn given(n: f64) -> Option<f64> {
    (!n.is_nan()).then_some(n)
}

fn ms(n: f64) -> Duration {
    Duration::from_micros((n * 1000.0) as u64)
}

/// The protocols this module decodes, comma-separated (`auto` when it has
/// them all).
#[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = protocols))]
pub fn protocols() -> String {
    let all = cfg!(all(
        feature = "openai-chat",
        feature = "openai-responses",
        feature = "anthropic",
        feature = "gemini",
        feature = "ollama"
    ));
    let mut out = String::new();
    for (name, on) in [
        ("auto", all),
        ("openai-chat", cfg!(feature = "openai-chat")),
        ("openai-responses", cfg!(feature = "openai-responses")),
        ("anthropic", cfg!(feature = "anthropic")),
        ("gemini", cfg!(feature = "gemini")),
        ("ollama", cfg!(feature = "ollama")),
        ("sse", true),
    ] {
        if on {
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(name);
        }
    }
    out
}

/// The cooldown key of a request: the caller's, or its origin and model.
fn key_of(key: &str, url: &str, body: &BodyFields<'_>) -> String {
    if key.is_empty() {
        cooldown::key_of(url, body)
    } else {
        key.to_owned()
    }
}

/// What a `createRecoveringFetch` instance shares between its requests:
/// the policy, the protocol, the retry budget and the endpoint cooldowns.
#[cfg_attr(target_arch = "wasm32", wasm_bindgen)]
pub struct Client {
    policy: Option<RecoveryPolicy>,
    /// The policy options given, which `policyText` shows in force.
    spec: PolicySpec,
    protocol: ProtocolChoice,
    resumable_sse: bool,
    budget: Option<Arc<dyn BudgetStore>>,
    /// `None` with `cooldowns: false`.
    cooldowns: Option<Arc<Cooldowns>>,
    /// Where a request may go instead before commit, in order.
    alternates: Vec<Target>,
    /// The declared context window of the request's own endpoint.
    context_window: Option<u64>,
    /// The prefill form the request's own endpoint continues with.
    prefill: Option<Prefill>,
    /// Why the policy was refused (the policy error's text), or empty.
    error: String,
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen)]
impl Client {
    /// A client from options the shell already checked for types:
    /// `policy` the policy options given, one `name=value` line each (see
    /// `spec_of`); `numbers` the other options by `slot`; the generic SSE
    /// terminal (`sse_data` or `sse_event`, empty for none). A policy the
    /// spec refuses sets [`Client::error_text`].
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(constructor))]
    pub fn new(policy: &str, numbers: &[f64], sse_data: &str, sse_event: &str) -> Client {
        let n = |i: usize| numbers.get(i).copied().unwrap_or(f64::NAN);
        let terminal = if !sse_data.is_empty() {
            Some(SseTerminal::Data(sse_data.to_owned()))
        } else if !sse_event.is_empty() {
            Some(SseTerminal::Event(sse_event.to_owned()))
        } else {
            None
        };
        let code = given(n(slot::PROTOCOL)).map_or(0, |v| v as usize);
        let protocol = match PROTOCOLS.get(code).copied().unwrap_or("auto") {
            "sse" => ProtocolChoice::Fixed(ProtocolKind::Sse {
                terminal_sentinel: terminal,
            }),
            "auto" => ProtocolChoice::Auto,
            name => name
                .parse()
                .map_or(ProtocolChoice::Auto, ProtocolChoice::Fixed),
        };
        // The budget's ttl slot: absent = the default budget, negative = none.
        let ttl = given(n(slot::BUDGET_TTL_MS));
        let budget = (ttl.is_none_or(|t| t >= 0.0)).then(|| -> Arc<dyn BudgetStore> {
            let d = RetryBudgetConfig::default();
            Arc::new(RetryBudget::new(RetryBudgetConfig::new(
                ttl.map_or(d.ttl, ms),
                given(n(slot::BUDGET_MIN_PER_SEC)).map_or(d.min_retries_per_sec, |v| v as u32),
                given(n(slot::BUDGET_PERCENT)).unwrap_or(d.percent),
            )))
        });
        let built = spec_of(policy).and_then(|spec| Ok((spec.build()?, spec)));
        let (policy, spec, error) = match built {
            Ok((policy, spec)) => (Some(policy), spec, String::new()),
            Err(e) => (None, PolicySpec::new(), e.to_string()),
        };
        Client {
            policy,
            spec,
            protocol,
            resumable_sse: set(n(slot::RESUMABLE_SSE)),
            budget,
            cooldowns: (!given(n(slot::NO_COOLDOWNS)).is_some_and(set))
                .then(|| Arc::new(Cooldowns::new())),
            alternates: Vec::new(),
            context_window: given(n(slot::CONTEXT_WINDOW))
                .filter(|v| *v >= 1.0 && v.is_finite())
                .map(|v| v as u64),
            prefill: prefill_of(n(slot::PREFILL)),
            error,
        }
    }

    /// Why the policy was refused, in the words every front end uses for
    /// it (`idle_timeout_ms: 0 is not a duration; use "off" to turn it
    /// off`); empty when it was not.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = errorText))]
    pub fn error_text(&self) -> String {
        self.error.clone()
    }

    /// The policy in force, every knob, one `name=value` line each (the
    /// npm option's name; `off` for a bound that is off; lists
    /// comma-separated): what `rfetch.policy` shows.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = policyText))]
    pub fn policy_text(&self) -> String {
        let mut out = String::new();
        if self.policy.is_some() {
            for (field, value) in self.spec.in_force() {
                let _ = writeln!(out, "{}={value}", field.camel_case());
            }
        }
        out
    }

    /// Adds an alternate, after those added before ([`recovery_core::failover`]):
    /// `url` and `model` empty when not given, `protocol` an index of the
    /// protocol names or -1 for the request's own, `context_window` its
    /// declared window in tokens or -1 for none, `prefill` the index of
    /// its prefill form in `Prefill::ALL` or -1 for none. Answers 0, or why
    /// it is refused: 1 the label, 2 the URL, 3 the model.
    pub fn alternate(
        &mut self,
        label: &str,
        url: &str,
        model: &str,
        protocol: i32,
        context_window: f64,
        prefill: i32,
    ) -> u32 {
        let target = Target::new(label)
            .map_err(|_| 1)
            .and_then(|t| match url {
                "" => Ok(t),
                url => t.with_url(url).map_err(|_| 2),
            })
            .and_then(|t| match model {
                "" => Ok(t),
                model => t.with_model(model).map_err(|_| 3),
            });
        match target {
            Ok(mut t) => {
                let name = usize::try_from(protocol)
                    .ok()
                    .and_then(|i| PROTOCOLS.get(i));
                if let Some(name) = name {
                    t = t.with_protocol(match *name {
                        "auto" => ProtocolChoice::Auto,
                        name => name
                            .parse()
                            .map_or(ProtocolChoice::Auto, ProtocolChoice::Fixed),
                    });
                }
                if context_window >= 1.0 && context_window.is_finite() {
                    t = t.with_context_window(context_window as u64);
                }
                if let Some(p) = prefill_of(f64::from(prefill)) {
                    t = t.with_prefill(p);
                }
                self.alternates.push(t);
                0
            }
            Err(code) => code,
        }
    }

    /// Starts one logical request at `now_ms`: `body` is the buffered
    /// request body; `id_hi`/`id_lo` its random logical id; `admission` and
    /// `continuation` say which hooks the caller installed. `bodies` holds,
    /// one after the other, the request bodies the caller wrote for its
    /// alternates, `lengths[i]` bytes for alternate `i` (-1: the request's
    /// own body). `key` is the caller's cooldown key for the request (empty:
    /// its origin and model).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &self,
        method: &str,
        url: &str,
        body: &[u8],
        now_ms: f64,
        id_hi: u32,
        id_lo: u32,
        admission: bool,
        continuation: bool,
        bodies: &[u8],
        lengths: &[i32],
        key: &str,
        pinned_jitter: f64,
    ) -> Machine {
        let policy = self.policy.clone().unwrap_or_default();
        let allowance = AttemptAllowance::new(policy.max_attempts().get());
        let id = u64::from(id_hi) << 32 | u64::from(id_lo);
        let mut targets = self.alternates.clone();
        let mut at = 0;
        for (t, len) in targets.iter_mut().zip(lengths) {
            if let Some(own) = usize::try_from(*len)
                .ok()
                .and_then(|n| bodies.get(at..at + n))
            {
                at += own.len();
                *t = t.clone().with_body(own.to_vec());
            }
        }
        let request = RequestFacts::new(method, url, body);
        let mut setup = Setup::new(policy, &self.protocol, request, allowance, id)
            .admission_hook(admission)
            .resumable_sse(self.resumable_sse)
            .continuation_hook(continuation)
            .prefill(self.prefill)
            .alternates(&targets)
            .context_window(self.context_window);
        if let Some(budget) = &self.budget {
            setup = setup.retry_budget(Arc::clone(budget));
        }
        if let Some(cooldowns) = &self.cooldowns {
            let store: Arc<dyn CooldownStore> = cooldowns.clone();
            setup = setup.cooldown(store, key_of(key, url, &request.fields()));
        }
        if (0.0..=1.0).contains(&pinned_jitter) {
            setup = setup.jitter(JitterSource::pinned(Fraction::new(pinned_jitter)));
        }
        let ex = setup.start(instant(now_ms));
        Machine {
            ex,
            targets,
            io: None,
            deadline: None,
            status: RecoveryStatus::InProgress,
            send: None,
            deliver_id: 0,
            deliver_bytes: Vec::new(),
            admission: String::new(),
            online: true,
        }
    }
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen)]
impl Client {
    /// The shared cooldown of a request to `url` with `body`: notes at
    /// `now_ms` that its endpoint asked for no sends during `wait_ms` (when
    /// positive, as if a request had learned it from a `Retry-After`), then
    /// answers how long its sends must still wait (0 when they may go, or
    /// when the client shares no cooldowns). `key` is the caller's key for
    /// the request (empty: its origin and model).
    pub fn cooldown(&self, url: &str, body: &[u8], key: &str, now_ms: f64, wait_ms: f64) -> f64 {
        let Some(cooldowns) = &self.cooldowns else {
            return 0.0;
        };
        let key = key_of(key, url, &BodyFields::read(body));
        let now = instant(now_ms);
        if wait_ms > 0.0 {
            cooldowns.note(&key, now, ms(wait_ms));
        }
        cooldowns
            .remaining(&key, now)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }
}

impl Client {}

/// One logical request.
#[cfg_attr(target_arch = "wasm32", wasm_bindgen)]
pub struct Machine {
    ex: Exchange<Kept>,
    /// The request's alternates, with the bodies its caller wrote.
    targets: Vec<Target>,
    /// The action answered last (kept for its payload).
    io: Option<Io<Kept>>,
    /// The deadline the shell was last told.
    deadline: Option<Instant>,
    /// What `onStatus` was last told.
    status: RecoveryStatus,
    send: Option<Outgoing>,
    deliver_id: u32,
    deliver_bytes: Vec<u8>,
    admission: String,
    /// Whether the platform is online, as the shell last said
    /// ([`Machine::set_online`]); read where the machine decides.
    online: bool,
}

#[cfg_attr(target_arch = "wasm32", wasm_bindgen)]
impl Machine {
    /// What to do next.
    pub fn poll(&mut self, now: f64) -> u32 {
        self.next(instant(now))
    }

    /// The platform went offline or came back online (the shell says so
    /// when it sees a change, before its next call).
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = setOnline))]
    pub fn set_online(&mut self, online: bool) {
        self.online = online;
    }

    /// The send of action 1 (or, as `role` 1, of action 15) is on its way.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onSent))]
    pub fn on_sent(&mut self, now: f64, role: u32) -> u32 {
        let now = instant(now);
        self.ex.on_sent_of(self::role(role), now);
        self.next(now)
    }

    /// The response head at `now`, `wall` on the wall clock (`Date.now()`):
    /// `headers` as `name\nvalue\n` lines, names lowercase;
    /// `opaque_redirect` for a browser's `opaqueredirect`.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onHead))]
    pub fn on_head(
        &mut self,
        now: f64,
        wall: f64,
        status: u16,
        headers: &str,
        opaque_redirect: bool,
        role: u32,
    ) -> u32 {
        let now = instant(now);
        let wall = SystemTime::UNIX_EPOCH + Duration::from_millis(wall.max(0.0) as u64);
        let head = JsHead {
            status,
            headers,
            opaque_redirect,
        };
        self.ex.on_head_of(self::role(role), now, wall, &head, None);
        self.next(now)
    }

    /// A body chunk, which the shell knows as `id`. With flag `0x100` the
    /// shell hands that chunk on as it is, before the action.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onChunk))]
    pub fn on_chunk(&mut self, now: f64, bytes: &[u8], id: u32, role: u32) -> u32 {
        let now = instant(now);
        let kept = || Kept {
            id,
            bytes: bytes.to_vec(),
        };
        let role = self::role(role);
        let now_out = if role == Role::First && self.ex.is_passing_through() {
            self.ex.on_passing_chunk(bytes) || self.ex.on_kept_chunk(now, kept()).is_some()
        } else {
            self.ex.on_chunk_of(role, now, kept()).is_some()
        };
        let next = self.next(now);
        if now_out {
            next | action::DELIVER_THIS
        } else {
            next
        }
    }

    /// The body ended cleanly.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onEnd))]
    pub fn on_end(&mut self, now: f64, role: u32) -> u32 {
        let now = instant(now);
        self.ex.on_end_of(self::role(role), now);
        self.next(now)
    }

    /// The send or the read failed: `streaming` when a body read rejected,
    /// else a rejected `fetch()` (phase unknown: fetch cannot tell
    /// connecting from sending from awaiting the head).
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onError))]
    pub fn on_error(&mut self, now: f64, streaming: bool, role: u32) -> u32 {
        let now = instant(now);
        let phase = if streaming {
            Phase::Streaming
        } else {
            Phase::Unknown
        };
        self.ex.on_error_of(
            self::role(role),
            now,
            Failure::transport(TransportKind::Other, phase),
        );
        self.next(now)
    }

    /// The deadline passed.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onTimeout))]
    pub fn on_timeout(&mut self, now: f64) -> u32 {
        let now = instant(now);
        self.ex.handle_timeout(now);
        self.next(now)
    }

    /// The platform is online again.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onOnline))]
    pub fn on_online(&mut self, now: f64) -> u32 {
        let now = instant(now);
        self.online = true;
        self.ex.online(now);
        self.next(now)
    }

    /// The admission hook answered: 1 allow, 2 reject, anything else
    /// unresolved.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onAdmission))]
    pub fn on_admission(&mut self, now: f64, answer: u32) -> u32 {
        let now = instant(now);
        let answer = match answer {
            1 => AdmissionAnswer::Allow,
            2 => AdmissionAnswer::Reject,
            _ => AdmissionAnswer::Unresolved,
        };
        self.ex.admission(now, answer);
        self.next(now)
    }

    /// The continuation hook answered: `given` when it returned a request
    /// (which the shell keeps and sends at the next send of kind 2).
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onContinuation))]
    pub fn on_continuation(&mut self, now: f64, given: bool) -> u32 {
        let now = instant(now);
        self.ex.continuation(now, given);
        self.next(now)
    }

    /// The caller cancelled, or dropped the body.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = onCancel))]
    pub fn on_cancel(&mut self, now: f64) -> u32 {
        let now = instant(now);
        self.ex.cancel(now);
        self.next(now)
    }

    /// The deadline in `performance.now()` milliseconds, or `-1`.
    pub fn deadline(&self) -> f64 {
        self.deadline.map_or(-1.0, millis)
    }

    /// The lifecycle events since the last call, as a JSON array of `[event,
    /// status]` pairs: `status` is the `RecoveryStatus` (snake_case) when
    /// that event changed it, else `null`.
    pub fn events(&mut self) -> String {
        let mut out = String::from("[");
        for event in self.ex.drain_events() {
            if out.len() > 1 {
                out.push(',');
            }
            out.push('[');
            out.push_str(&to_json(&event));
            out.push(',');
            let status = self.status.after(&event.kind);
            if status == self.status {
                out.push_str("null");
            } else {
                self.status = status;
                out.push_str(&to_json(&status));
            }
            out.push(']');
        }
        out.push(']');
        out
    }

    /// The report so far, as JSON.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = reportJson))]
    pub fn report_json(&self) -> String {
        to_json(self.ex.ledger().report())
    }

    /// The outcome once the request ended, as JSON (`null` before).
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = outcomeJson))]
    pub fn outcome_json(&self) -> String {
        self.ex
            .ledger()
            .outcome()
            .map_or_else(|| String::from("null"), to_json)
    }

    /// Whether the head `role`'s attempt just received (0: the request's,
    /// 1: the hedge's) may be the final answer as sent: the shell then
    /// reads the body from a copy of the response.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = keepsResponse))]
    pub fn keeps_response(&self, role: u32) -> bool {
        self.ex.keeps_response_of(self::role(role))
    }

    /// The `Idempotency-Key` to set on the send about to go out (empty for
    /// none): `has_one` when its headers already carry one.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = idempotencyKey))]
    pub fn idempotency_key(&self, has_one: bool) -> String {
        self.ex.idempotency_key(has_one).unwrap_or_default()
    }

    /// Action 1 or 15 to an alternate (`sendKind() >> 8` is its number,
    /// from 1): the request to `url` with `body` and headers named `headers`
    /// (lowercase, newline-separated) as that alternate takes it. Answered
    /// as one buffer: the URL's length (u32, little-endian) and the URL, the
    /// length and the newline-separated names of the headers that stay
    /// behind, then the body.
    pub fn retarget(&self, url: &str, body: &[u8], headers: &str) -> Vec<u8> {
        let Some(t) = self.current_target() else {
            return Vec::new();
        };
        let url_out = t.rewrite_url(url);
        let mut left = String::new();
        for name in headers.split('\n').filter(|n| !t.keeps_header(url, n)) {
            if !left.is_empty() {
                left.push('\n');
            }
            left.push_str(name);
        }
        let body = t.rewrite_body(body);
        let mut out = Vec::with_capacity(8 + url_out.len() + left.len() + body.len());
        for part in [url_out.as_bytes(), left.as_bytes()] {
            out.extend_from_slice(&(part.len() as u32).to_le_bytes());
            out.extend_from_slice(part);
        }
        out.extend_from_slice(&body);
        out
    }

    /// The protocol the body is decoded as.
    pub fn protocol(&self) -> String {
        self.ex.protocol().name().to_owned()
    }

    /// Action 1: 0 the original request, 1 a resume, 2 the continuation,
    /// 3 a prefill continuation (its body: [`Machine::send_body`]);
    /// above the low byte, the alternate it goes to (0: the request's own
    /// endpoint; see [`Machine::retarget`]). Action 15: 0 (a hedge is the
    /// original request) and the hedge's target.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = sendKind))]
    pub fn send_kind(&self) -> u32 {
        let kind = match self.io {
            Some(Io::Hedge { .. }) => 0,
            _ => self.send.as_ref().map_or(0, |s| s.kind),
        };
        kind | (self.send_target() as u32) << 8
    }

    /// Action 1 of a resume: the URL to send to.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = sendUrl))]
    pub fn send_url(&self) -> String {
        self.send
            .as_ref()
            .map(|s| s.url.clone())
            .unwrap_or_default()
    }

    /// Action 1 of a resume: the method.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = sendMethod))]
    pub fn send_method(&self) -> String {
        self.send
            .as_ref()
            .map(|s| s.method.clone())
            .unwrap_or_default()
    }

    /// Action 1 of a resume: a header to set, `name\nvalue`, or empty.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = sendHeader))]
    pub fn send_header(&self) -> String {
        match self.send.as_ref().and_then(|s| s.header.as_ref()) {
            Some((name, value)) => {
                let mut out = String::from(*name);
                out.push('\n');
                out.push_str(value);
                out
            }
            None => String::new(),
        }
    }

    /// Action 1 of a prefill continuation (kind 3): the body to send, in
    /// place of the request's (taken: a second call answers nothing).
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = sendBody))]
    pub fn send_body(&mut self) -> Vec<u8> {
        self.send
            .as_mut()
            .map(|s| Vec::from(std::mem::take(&mut s.body)))
            .unwrap_or_default()
    }

    /// Action 1 of a resume: whether the original body goes again (without
    /// it, the shell drops the body's headers).
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = sendWithBody))]
    pub fn send_with_body(&self) -> bool {
        self.send.as_ref().is_none_or(|s| s.with_body)
    }

    /// Action 7: the id of the chunk to hand on, or 0 for `deliverBytes`.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = deliverId))]
    pub fn deliver_id(&self) -> u32 {
        self.deliver_id
    }

    /// Action 7 with id 0: the bytes the machine cut out of the stream.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = deliverBytes))]
    pub fn deliver_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.deliver_bytes)
    }

    /// Action 10: `{ logicalId, nextAttempt, failure }` as JSON.
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = admissionJson))]
    pub fn admission_json(&self) -> String {
        self.admission.clone()
    }

    /// Action 12: what the consumer received, `{ text, reasoning,
    /// toolFragments, truncated }` as JSON (response text: sensitive).
    #[cfg_attr(target_arch = "wasm32", wasm_bindgen(js_name = prefixJson))]
    pub fn prefix_json(&self) -> String {
        let Some(p) = self.ex.delivered_prefix() else {
            return String::from("null");
        };
        let mut out = String::from("{\"text\":");
        out.push_str(&to_json(&p.text));
        out.push_str(",\"reasoning\":");
        out.push_str(&to_json(&p.reasoning));
        out.push_str(",\"toolFragments\":");
        out.push_str(&to_json(&p.tool_fragments));
        out.push_str(",\"truncated\":");
        out.push_str(if p.truncated { "true" } else { "false" });
        out.push('}');
        out
    }
}

impl Machine {
    /// The target of the send asked for last: the hedge's after action
    /// 15, the request's otherwise.
    fn send_target(&self) -> usize {
        match self.io {
            Some(Io::Hedge { target }) => target,
            _ => self.ex.target(),
        }
    }

    fn current_target(&self) -> Option<&Target> {
        self.targets.get(self.send_target().checked_sub(1)?)
    }

    /// Polls the machine and answers the action code with its flags.
    fn next(&mut self, now: Instant) -> u32 {
        let io = self.ex.poll(now, self.online);
        let code = io.action();
        match &io {
            Io::Send(kind) => self.send = Some(Outgoing::from(kind.clone())),
            Io::Deliver(Chunk::Read(kept)) => self.deliver_id = kept.id,
            Io::Deliver(Chunk::Made(bytes)) => {
                self.deliver_id = 0;
                self.deliver_bytes = bytes.to_vec();
            }
            Io::AskAdmission(request) => {
                let mut out = String::from("{\"logicalId\":");
                out.push_str(&to_json(&request.logical_id));
                out.push_str(",\"nextAttempt\":");
                out.push_str(&to_json(&request.next_attempt));
                out.push_str(",\"failure\":");
                out.push_str(&to_json(&request.failure));
                out.push('}');
                self.admission = out;
            }
            _ => {}
        }
        self.io = Some(io);
        let mut flags = 0;
        if self.ex.has_events() {
            flags |= action::EVENTS;
        }
        let deadline = self.ex.poll_timeout();
        if deadline != self.deadline {
            self.deadline = deadline;
            flags |= action::DEADLINE;
        }
        code | flags
    }
}

/// Native tests of the translation: the machine driven through this
/// interface ends as the engine says, and what crosses is `serde_json`'s
/// text.
#[cfg(test)]
mod tests {
    use super::*;

    const NAN: f64 = f64::NAN;

    fn client(numbers: &[f64]) -> Client {
        let mut all = [NAN; slot::COUNT];
        all[..numbers.len()].copy_from_slice(numbers);
        Client::new("", &all, "", "")
    }

    fn start(c: &Client) -> Machine {
        c.start(
            "POST",
            "http://h/v1/chat/completions",
            b"{}",
            0.0,
            1,
            2,
            false,
            false,
            &[],
            &[],
            "",
            -1.0,
        )
    }

    const CHAT: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    #[test]
    fn a_503_with_retry_after_then_a_stream_completes() {
        let c = client(&[]);
        let mut m = start(&c);
        let t = |m: &mut Machine| m.poll(0.0) & 0xff;
        assert_eq!(t(&mut m), action::SEND);
        assert_eq!(m.on_sent(1.0, 0) & 0xff, action::AWAIT_HEAD);
        let a = m.on_head(
            2.0,
            0.0,
            503,
            "content-type\napplication/json\nretry-after\n2\n",
            false,
            0,
        );
        assert_eq!(a & 0xff, action::READ);
        assert_eq!(m.on_end(3.0, 0) & 0xff, action::RELEASE);
        let a = m.poll(3.0);
        assert_eq!(a & 0xff, action::SLEEP);
        assert!((m.deadline() - 2003.0).abs() < 1e-9, "{}", m.deadline());
        assert_eq!(m.on_timeout(2003.0) & 0xff, action::SEND);
        m.on_sent(2004.0, 0);
        let a = m.on_head(
            2005.0,
            0.0,
            200,
            "content-type\ntext/event-stream\n",
            false,
            0,
        );
        assert_eq!(a & 0xff, action::READ);
        let a = m.on_chunk(2006.0, CHAT, 7, 0);
        // The semantic delta commits: respond, then the kept chunk.
        assert_eq!(a & 0xff, action::RESPOND);
        assert_eq!(m.poll(2006.0) & 0xff, action::DELIVER);
        assert_eq!(m.deliver_id(), 7);
        let mut last = 0;
        for _ in 0..10 {
            last = m.poll(2007.0) & 0xff;
            if last == action::END_OK || last == action::READ {
                break;
            }
        }
        if last == action::READ {
            last = m.on_end(2008.0, 0) & 0xff;
        }
        assert_eq!(last, action::END_OK);
        let events: serde_json::Value = serde_json::from_str(&m.events()).unwrap();
        let names: Vec<&str> = events
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[0]["event"].as_str().unwrap())
            .collect();
        assert_eq!(names.first(), Some(&"attempt_started"));
        assert_eq!(names.last(), Some(&"completed"));
        let statuses: Vec<&str> = events
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p[1].as_str())
            .collect();
        assert_eq!(statuses, ["reconnecting", "in_progress", "completed"]);
        assert_eq!(
            m.report_json(),
            serde_json::to_string(m.ex.ledger().report()).unwrap()
        );
        assert_eq!(
            m.outcome_json(),
            serde_json::to_string(m.ex.ledger().outcome().unwrap()).unwrap()
        );
    }

    #[test]
    fn an_alternate_is_sent_its_own_url_and_body_after_a_529() {
        let mut c = client(&[]);
        assert_eq!(c.alternate("bad label", "", "", -1, -1.0, -1), 1);
        assert_eq!(c.alternate("b", "ftp://x", "", -1, -1.0, -1), 2);
        assert_eq!(c.alternate("b", "", "\u{1}", -1, -1.0, -1), 3);
        assert_eq!(
            c.alternate(
                "claude",
                "https://api.anthropic.com/v1/messages",
                "c-3",
                3,
                200_000.0,
                1
            ),
            0
        );
        assert_eq!(c.alternate("local", "/alt", "", -1, -1.0, -1), 0);
        let body = br#"{"model":"gpt","messages":[]}"#;
        let own = br#"{"max_tokens":5}"#;
        let mut m = c.start(
            "POST",
            "https://api.openai.com/v1/chat/completions",
            body,
            0.0,
            1,
            2,
            false,
            false,
            own,
            &[i32::try_from(own.len()).unwrap(), -1],
            "",
            -1.0,
        );
        assert_eq!(m.poll(0.0) & 0xff, action::SEND);
        assert_eq!(m.send_kind(), 0);
        m.on_sent(1.0, 0);
        m.on_head(2.0, 0.0, 529, "content-type\napplication/json\n", false, 0);
        assert_eq!(m.on_end(3.0, 0) & 0xff, action::RELEASE);
        assert_eq!(m.poll(3.0) & 0xff, action::SEND, "at once");
        assert_eq!(
            m.send_kind(),
            1 << 8,
            "the original request, to alternate 1"
        );
        let url = "https://api.openai.com/v1/chat/completions";
        let out = m.retarget(url, body, "authorization\ncontent-type\nhost");
        let part = |at: usize| {
            let n = u32::from_le_bytes(out[at..at + 4].try_into().unwrap()) as usize;
            (&out[at + 4..at + 4 + n], at + 4 + n)
        };
        let (new_url, at) = part(0);
        let (left, at) = part(at);
        assert_eq!(new_url, b"https://api.anthropic.com/v1/messages");
        assert_eq!(
            left, b"authorization\nhost",
            "credentials stay on their origin"
        );
        assert_eq!(&out[at..], br#"{"model":"c-3","max_tokens":5}"#);
        assert_eq!(m.protocol(), "anthropic");
        let events = m.events();
        assert!(
            events.contains(r#""event":"failover","from":"primary","to":"claude""#),
            "{events}"
        );
        assert!(events.contains(r#""target":"claude""#), "{events}");
    }

    #[test]
    fn a_steady_stream_is_one_call_per_chunk() {
        let c = client(&[]);
        let mut m = start(&c);
        m.poll(0.0);
        m.on_sent(0.0, 0);
        m.on_head(0.0, 0.0, 200, "content-type\ntext/event-stream\n", false, 0);
        let first = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
        let mut a = m.on_chunk(1.0, first, 1, 0);
        while a & 0xff != action::READ {
            a = m.poll(1.0);
        }
        m.events();
        // After commit, each delta passes through with the next read.
        for i in 2..50 {
            let a = m.on_chunk(f64::from(i), first, i, 0);
            assert_eq!(a & 0xff, action::READ, "chunk {i}");
            assert!(a & action::DELIVER_THIS != 0, "chunk {i}");
            assert!(a & action::EVENTS == 0, "chunk {i}");
        }
    }

    const SSE: &str = "content-type\ntext/event-stream\n";
    const ROLE: &[u8] =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
    const TEXT: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";

    /// A request hedged after 1 s (one alternate, `alt`), its first send
    /// streaming a role chunk until the hedge is due: answers the machine
    /// at the hedge's action.
    fn hedged(url: &str, body: &[u8]) -> Machine {
        let mut c = Client::new("hedgeAfterMs=1000\n", &[NAN; slot::COUNT], "", "");
        assert_eq!(c.error_text(), "");
        let alt = c.alternate("alt", "/alt/v1/chat/completions", "alt-model", -1, -1.0, -1);
        assert_eq!(alt, 0);
        let mut m = c.start(
            "POST",
            url,
            body,
            0.0,
            1,
            2,
            false,
            false,
            &[],
            &[-1],
            "",
            -1.0,
        );
        assert_eq!(m.poll(0.0) & 0xff, action::SEND);
        assert_eq!(m.send_kind(), 0);
        assert_eq!(m.on_sent(0.0, 0) & 0xff, action::AWAIT_HEAD);
        assert_eq!(m.on_head(0.0, 0.0, 200, SSE, false, 0) & 0xff, action::READ);
        assert_eq!(m.on_chunk(0.0, ROLE, 1, 0) & 0xff, action::READ);
        assert!((m.deadline() - 1000.0).abs() < 1e-9, "{}", m.deadline());
        assert_eq!(m.on_timeout(1000.0) & 0xff, action::HEDGE);
        m
    }

    /// The hedge's send names its target as a send does (`sendKind`,
    /// `retarget`), its inputs go in with role 1, and when it wins, the
    /// first attempt is released, the hedge promoted and its kept chunk
    /// delivered; the report names each attempt's role.
    #[test]
    fn a_hedge_is_written_for_its_target_and_wins_with_its_role() {
        let url = "http://h/v1/chat/completions";
        let body = br#"{"model":"m"}"#;
        let mut m = hedged(url, body);
        assert_eq!(
            m.send_kind(),
            1 << 8,
            "the original request, to alternate 1"
        );
        let out = m.retarget(url, body, "content-type");
        let n = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(&out[4..4 + n], b"http://h/alt/v1/chat/completions");
        assert!(out.ends_with(br#"{"model":"alt-model"}"#));
        assert_eq!(m.on_sent(1000.0, 1) & 0xff, action::RACE);
        assert_eq!(
            m.on_head(1100.0, 0.0, 200, SSE, false, 1) & 0xff,
            action::RACE
        );
        // The first attempt's role chunk changes nothing: the race goes on.
        assert_eq!(m.on_chunk(1150.0, ROLE, 2, 0) & 0xff, action::RACE);
        let a = m.on_chunk(1200.0, TEXT, 3, 1);
        assert_eq!(a & 0xff, action::RELEASE);
        assert_eq!(a & action::DELIVER_THIS, 0);
        assert_eq!(m.poll(1200.0) & 0xff, action::PROMOTE);
        assert_eq!(m.poll(1200.0) & 0xff, action::RESPOND);
        assert_eq!(m.poll(1200.0) & 0xff, action::DELIVER);
        assert_eq!(m.deliver_id(), 3, "the hedge's chunk");
        assert_eq!(m.poll(1200.0) & 0xff, action::READ);
        // The promoted hedge is the request's attempt: role 0 from now on.
        let done = b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        let a = m.on_chunk(1300.0, done, 4, 0);
        assert!(a & action::DELIVER_THIS != 0);
        let mut last = a & 0xff;
        if last == action::READ {
            last = m.on_end(1300.0, 0) & 0xff;
        }
        assert_eq!(last, action::END_OK);
        let report: serde_json::Value = serde_json::from_str(&m.report_json()).unwrap();
        assert_eq!(report["attempts"][0]["role"], "first");
        assert_eq!(report["attempts"][0]["result"], "hedge_cancelled");
        assert_eq!(report["attempts"][0]["reason"], "rival_won");
        assert_eq!(report["attempts"][1]["role"], "hedge");
        assert_eq!(report["served_by"], "alt");
        let events = m.events();
        assert!(
            events.contains(r#""event":"hedge_started","hedge":2,"after_ms":1000"#),
            "{events}"
        );
    }

    /// When the first attempt's token comes first, the hedge is released,
    /// and an input of the released hedge changes nothing.
    #[test]
    fn the_first_attempt_winning_releases_the_hedge() {
        let url = "http://h/v1/chat/completions";
        let mut m = hedged(url, b"{}");
        assert_eq!(m.on_sent(1000.0, 1) & 0xff, action::RACE);
        assert_eq!(m.on_chunk(1200.0, TEXT, 2, 0) & 0xff, action::RELEASE_HEDGE);
        assert_eq!(m.poll(1200.0) & 0xff, action::RESPOND);
        let events = m.events();
        assert!(events.contains(r#""event":"hedge_cancelled""#), "{events}");
        for id in [1, 2] {
            assert_eq!(m.poll(1200.0) & 0xff, action::DELIVER);
            assert_eq!(m.deliver_id(), id, "the first attempt's chunks");
        }
        assert_eq!(m.poll(1200.0) & 0xff, action::READ);
        let report = m.report_json();
        assert_eq!(m.on_end(1300.0, 1) & 0xff, action::READ);
        assert_eq!(m.on_error(1300.0, true, 1) & 0xff, action::READ);
        assert_eq!(m.report_json(), report, "the released hedge is gone");
    }

    #[test]
    fn a_refused_policy_names_its_reason() {
        let numbers = [NAN; slot::COUNT];
        let refused = |policy: &str| Client::new(policy, &numbers, "", "").error_text();
        assert_eq!(
            refused("retryableStatuses=401"),
            "status 401 cannot be made retryable"
        );
        assert_eq!(
            refused("backoffBaseMs=5000\nbackoffCeilingMs=10"),
            "backoff ceiling is below its base"
        );
        assert_eq!(
            refused("idleTimeoutMs=0"),
            "idle_timeout_ms: 0 is not a duration; use \"off\" to turn it off"
        );
        assert_eq!(refused("maxAttempts=0"), "max_attempts: must be at least 1");
        assert_eq!(refused("maxAtempts=3"), "unknown policy knob `maxAtempts`");
        assert!(refused("budgetMs=1.5").contains("got \"1.5\""));
        assert_eq!(client(&[]).error_text(), "");
    }

    #[test]
    fn options_map_onto_the_policy() {
        let mut n = [NAN; slot::COUNT];
        n[slot::PROTOCOL] = 3.0;
        let policy = "maxAttempts=5\nbudgetMs=off\nidleTimeoutMs=1500\nprogressTimeoutMs=off\n\
                      endpoint=local\nretryableCategories=transport,http\n\
                      retryableStatuses=503,429\n";
        let c = Client::new(policy, &n, "", "");
        let p = c.policy.as_ref().unwrap();
        assert_eq!(p.max_attempts().get(), 5);
        assert_eq!(p.budget(), None);
        assert_eq!(p.idle_timeout(), Some(Duration::from_millis(1500)));
        assert_eq!(p.progress_timeout(), None);
        assert_eq!(p.endpoint(), recovery_core::Endpoint::Local);
        assert_eq!(p.retryable_statuses(), &[429, 503]);
        assert!(p.categories().transport && p.categories().http);
        assert!(!p.categories().provider_response);
        assert_eq!(c.protocol, ProtocolChoice::Fixed(ProtocolKind::Anthropic));
        assert!(protocols().contains("openai-chat"));
        let text = c.policy_text();
        assert!(text.contains("budgetMs=off\n"), "{text}");
        assert!(text.contains("retryableStatuses=429,503\n"), "{text}");
        assert_eq!(
            Client::new(&text, &n, "", "").policy,
            c.policy,
            "the policy text reads back"
        );
    }

    /// The shell's list of the policy options is the policy table: every
    /// knob of `FIELDS`, camelCased, with its unit, in the table's order.
    /// A knob added to the table fails this test until the shell takes it.
    #[test]
    fn the_shells_policy_options_are_the_policy_table() {
        let shell = include_str!("../js/shell.mjs");
        let start = shell.find("const POLICY = {").expect("the shell's POLICY") + 16;
        let list = &shell[start..start + shell[start..].find("};").unwrap()];
        let shell_knobs: Vec<(String, String)> = list
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, unit) = e.split_once(':').expect("name: 'unit'");
                (
                    name.trim().to_owned(),
                    unit.trim().trim_matches('\'').to_owned(),
                )
            })
            .collect();
        let table: Vec<(String, String)> = recovery_core::policy::FIELDS
            .iter()
            .map(|f| (f.camel_case(), f.unit.name().to_owned()))
            .collect();
        assert_eq!(shell_knobs, table);
    }

    /// The shell's `NUMBER_SLOTS` puts each option where `slot` reads it.
    #[test]
    fn the_shells_number_slots_are_the_modules() {
        let shell = include_str!("../js/shell.mjs");
        let start = shell.find("const NUMBER_SLOTS = [").expect("NUMBER_SLOTS") + 22;
        let list = &shell[start..start + shell[start..].find("];").unwrap()];
        let names: Vec<&str> = list
            .split(',')
            .map(|e| e.trim().trim_matches('\''))
            .filter(|e| !e.is_empty())
            .collect();
        assert_eq!(
            names,
            [
                (slot::PROTOCOL, "protocol"),
                (slot::RESUMABLE_SSE, "resumableSse"),
                (slot::BUDGET_TTL_MS, "retryBudget.ttlMs"),
                (slot::BUDGET_MIN_PER_SEC, "retryBudget.minRetriesPerSec"),
                (slot::BUDGET_PERCENT, "retryBudget.percent"),
                (slot::NO_COOLDOWNS, "noCooldowns"),
                (slot::CONTEXT_WINDOW, "contextWindow"),
                (slot::PREFILL, "prefill"),
            ]
            .iter()
            .enumerate()
            .map(|(i, (at, name))| {
                assert_eq!(i, *at, "{name}");
                *name
            })
            .collect::<Vec<_>>()
        );
        assert_eq!(names.len(), slot::COUNT);
    }
}
