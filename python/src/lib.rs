//! `recovery_llm._machine`: the machine of one logical request as the
//! Python shell (`recovery_llm`) drives it. Plain numbers, strings and bytes
//! in, an action code out; every decision is
//! `recovery_core::exchange::Exchange`'s, and this module only translates
//! between Python values and the machine, as `recovery-wasm` does for
//! JavaScript.
//!
//! Every input takes the shell's monotonic clock reading `now` (seconds, a
//! float: `time.monotonic()`, or the event loop's clock) and answers the next
//! action at once (the machine is polled inside), so a steady stream costs
//! one call per chunk. The wall clock is the one read when the request
//! started, moved on by the monotonic clock; jitter draws come from a
//! generator seeded with the request's random id (or a pinned fraction).
//!
//! The answer is an action code (low byte) with flags:
//!
//! | code | action | payload |
//! |---:|---|---|
//! | 1 | send | `Machine.send_info`, `Machine.retarget`, `Machine.idempotency_key` |
//! | 2 | await the head | |
//! | 3 | read the body | |
//! | 4 | release the attempt's response | |
//! | 5 | respond (commit) with the head | |
//! | 6 | respond with the final HTTP error | `Machine.take_held` |
//! | 7 | deliver | `Machine.deliver` |
//! | 8 | sleep until `Machine.deadline` | |
//! | 9 | wait until online | |
//! | 10 | ask the admission hook | `Machine.admission_request` |
//! | 11 | await the admission hook | |
//! | 12 | ask the continuation hook | `Machine.prefix` |
//! | 13 | end: completed | |
//! | 14 | end: failed | `Machine.outcome`, `Machine.error_text` |
//! | 15 | send a hedge: the original request to `Machine.hedge_target` | `Machine.retarget` |
//! | 16 | race: await the first of either attempt's news, or `Machine.deadline` | |
//! | 17 | release the hedge's response | |
//! | 18 | promote: the hedge's response becomes the first attempt's | |
//!
//! | flag | meaning |
//! |---:|---|
//! | `0x100` | (from `on_chunk`) hand the chunk just given to the consumer first |
//! | `0x200` | lifecycle events are waiting (`Machine.events`) |
//! | `0x400` | the deadline moved (`Machine.deadline`) |
//!
//! While a hedge races the first attempt (after action 15), what happens to
//! each goes in through the inputs that take a role (`on_sent_of`,
//! `on_head_of`, `on_chunk_of`, `on_end_of`, `on_error_of`): `ROLE_FIRST`
//! (0, the same as the inputs without one) or `ROLE_HEDGE` (1). After
//! action 18 the hedge's inputs come as the first's again.
//!
//! While the machine asks for nothing but reads, a sync shell reads the body
//! through a `Reader` (`Reader(machine, iterator, clock)`), which pulls each
//! chunk and gives it to `on_chunk` itself, and hands back to the shell at
//! anything else.
//!
//! # Unsafe code
//!
//! None: the workspace's `unsafe_code = "forbid"` holds for this crate too
//! (PyO3's macros expand to calls into PyO3, whose own FFI is its
//! business).
#![deny(unreachable_pub)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use pyo3::IntoPyObjectExt;
use pyo3::exceptions::{PyStopIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyIterator, PyList, PyString};
use recovery_core::body_fields::BodyFields;
use recovery_core::budget::{AttemptAllowance, BudgetStore, RetryBudget, RetryBudgetConfig};
use recovery_core::continuation::Prefill;
use recovery_core::cooldown::{self, CooldownStore, Cooldowns};
use recovery_core::error::{Evidence, RecoveryError};
use recovery_core::exchange::codes::Outgoing;
use recovery_core::exchange::{
    AdmissionAnswer, AdmissionRequest, Chunk, DRAIN_GRACE, Exchange, Head, Io, RequestFacts, Role,
    Setup,
};
use recovery_core::failover::Target;
use recovery_core::failure::{Failure, Phase, TransportKind};
use recovery_core::outcome::ReplayDisabled;
use recovery_core::policy::{self, FIELDS, Field, PolicyError, PolicySpec, Unit, field};
use recovery_core::protocol::{ProtocolChoice, ProtocolKind, SseTerminal};
use recovery_core::timing::{Fraction, Instant, JitterSource};
use recovery_core::{RecoveryPolicy, RecoveryStatus};
use serde::Serialize;
use serde_json::Value;

/// Action codes (see the module docs): the machine's, shared with every
/// module that runs it under a shell.
pub use recovery_core::exchange::codes::action;

/// The roles an input of a race takes (see the module docs).
pub mod role {
    /// The first attempt (the one the hedge races, or the only one).
    pub const FIRST: u8 = 0;
    /// The hedge.
    pub const HEDGE: u8 = 1;
}

/// A role's number as the machine's [`Role`].
fn role_of(n: u8) -> PyResult<Role> {
    match n {
        role::FIRST => Ok(Role::First),
        role::HEDGE => Ok(Role::Hedge),
        _ => Err(PyValueError::new_err(format!(
            "unknown role {n} (0: the first attempt, 1: the hedge)"
        ))),
    }
}

/// The protocol names the `protocol` option takes.
const PROTOCOLS: [&str; 7] = [
    "auto",
    "openai-chat",
    "openai-responses",
    "anthropic",
    "gemini",
    "ollama",
    "sse",
];

/// About 285 years: the largest duration an option may name.
const MAX_MS: f64 = 9e12;

/// A monotonic reading in seconds as an [`Instant`] (microsecond grain).
fn instant(seconds: f64) -> Instant {
    Instant::from_origin(Duration::from_micros((seconds.max(0.0) * 1e6) as u64))
}

/// An [`Instant`] as seconds on the shell's clock.
fn seconds(at: Instant) -> f64 {
    at.saturating_since(Instant::from_origin(Duration::ZERO))
        .as_micros() as f64
        / 1e6
}

fn invalid(field: &str, reason: &str) -> PyErr {
    PyValueError::new_err(format!("invalid recovery option `{field}`: {reason}"))
}

fn wrong_type(field: &str, what: &str, v: &Bound<'_, PyAny>) -> PyErr {
    let got = v
        .get_type()
        .name()
        .map_or_else(|_| String::from("?"), |n| n.to_string());
    PyTypeError::new_err(format!(
        "invalid recovery option `{field}`: expected {what}, got {got}"
    ))
}

/// A whole number (not a bool) from `lo` to `hi`.
fn whole(field: &str, v: &Bound<'_, PyAny>, lo: u64, hi: u64) -> PyResult<u64> {
    if v.is_instance_of::<PyBool>() {
        return Err(wrong_type(field, "an int", v));
    }
    let n: i128 = v.extract().map_err(|_| wrong_type(field, "an int", v))?;
    if n < i128::from(lo) || n > i128::from(hi) {
        return Err(invalid(
            field,
            &format!("{n} is out of range ({lo} to {hi})"),
        ));
    }
    Ok(n as u64)
}

/// A duration in milliseconds (an int or a float); `positive`: 0 refused.
fn millis(field: &str, v: &Bound<'_, PyAny>, positive: bool) -> PyResult<Duration> {
    if v.is_instance_of::<PyBool>() {
        return Err(wrong_type(field, "a number of milliseconds", v));
    }
    let n: f64 = v
        .extract()
        .map_err(|_| wrong_type(field, "a number of milliseconds", v))?;
    if !n.is_finite() || !(0.0..=MAX_MS).contains(&n) {
        return Err(invalid(
            field,
            &format!("{n} is not a duration in milliseconds (0 to {MAX_MS:e})"),
        ));
    }
    if positive && n == 0.0 {
        return Err(invalid(
            field,
            "must be greater than zero (None turns a timeout off)",
        ));
    }
    Ok(Duration::from_micros((n * 1000.0) as u64))
}

/// A policy keyword's value as the policy spec reads it, once its Python
/// type is right for its unit (`TypeError` otherwise): `None` is `"off"`
/// for a bound, as `"off"` is; an int, or a float that is a whole number,
/// is its number; what no knob takes (a negative or fractional number, an
/// unknown name) is left for the spec to refuse with its own words.
fn knob(f: &Field, v: &Bound<'_, PyAny>) -> PyResult<policy::Value> {
    let statuses = f.unit == Unit::List && f.choices.is_empty();
    let what = match f.unit {
        Unit::Ms => "an int, \"off\" or None",
        Unit::Count | Unit::Bytes => "an int",
        Unit::Bool => "a bool",
        Unit::Choice => "a str",
        Unit::List if statuses => "a list of ints",
        Unit::List => "a list of str",
    };
    let is_str = v.is_instance_of::<PyString>();
    let value = match f.unit {
        Unit::Ms if v.is_none() && f.can_be_off => Some(policy::Value::Off),
        Unit::Ms | Unit::Choice if is_str => Some(policy::Value::Name(v.extract()?)),
        Unit::Ms | Unit::Count | Unit::Bytes => number(v),
        Unit::Bool if v.is_instance_of::<PyBool>() => Some(policy::Value::Bool(v.extract()?)),
        Unit::List if !is_str => {
            let items = v.try_iter().map_err(|_| wrong_type(f.name, what, v))?;
            let mut list = Vec::new();
            for item in items {
                let item = item?;
                let one = if statuses {
                    number(&item)
                } else if item.is_instance_of::<PyString>() {
                    Some(policy::Value::Name(item.extract()?))
                } else {
                    None
                };
                list.push(one.ok_or_else(|| wrong_type(f.name, what, &item))?);
            }
            Some(policy::Value::List(list))
        }
        _ => None,
    };
    value.ok_or_else(|| wrong_type(f.name, what, v))
}

/// An int (not a bool) or a float as a policy number; one that is not a
/// whole number from 0 is kept as written.
fn number(v: &Bound<'_, PyAny>) -> Option<policy::Value> {
    if v.is_instance_of::<PyBool>() {
        return None;
    }
    if v.is_instance_of::<PyInt>() {
        let n: i128 = v.extract().ok()?;
        return Some(u64::try_from(n).map_or_else(
            |_| policy::Value::Other(n.to_string()),
            policy::Value::Number,
        ));
    }
    if v.is_instance_of::<PyFloat>() {
        let x: f64 = v.extract().ok()?;
        let whole = x.fract() == 0.0 && (0.0..=9_007_199_254_740_992.0).contains(&x);
        return Some(if whole {
            policy::Value::Number(x as u64)
        } else {
            policy::Value::Other(x.to_string())
        });
    }
    None
}

/// A value of the policy spec as Python shows it (`"off"`, an int, a bool,
/// a str, a list).
fn py_value<'py>(py: Python<'py>, v: &policy::Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        policy::Value::Number(n) => n.into_pyobject(py)?.into_any(),
        policy::Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        policy::Value::List(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(py_value(py, item)?)?;
            }
            list.into_any()
        }
        other => PyString::new(py, &other.to_string()).into_any(),
    })
}

fn invalid_policy(e: &PolicyError) -> PyErr {
    PyValueError::new_err(format!("invalid recovery policy: {e}"))
}

fn flag(field: &str, v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if !v.is_instance_of::<PyBool>() {
        return Err(wrong_type(field, "a bool", v));
    }
    v.extract()
}

fn text(field: &str, v: &Bound<'_, PyAny>) -> PyResult<String> {
    if !v.is_instance_of::<PyString>() {
        return Err(wrong_type(field, "a str", v));
    }
    v.extract()
}

fn variant<'a>(field: &str, v: &Bound<'_, PyAny>, names: &[&'a str]) -> PyResult<&'a str> {
    let s = text(field, v)?;
    names
        .iter()
        .find(|n| **n == s.as_str())
        .copied()
        .ok_or_else(|| {
            invalid(
                field,
                &format!("unknown value {s:?} ({})", names.join(", ")),
            )
        })
}

/// A protocol name (`auto` or a [`ProtocolKind`]).
fn protocol_choice(field: &str, v: &Bound<'_, PyAny>) -> PyResult<ProtocolChoice> {
    let name = text(field, v)?.trim().to_ascii_lowercase();
    if name == "auto" {
        return Ok(ProtocolChoice::Auto);
    }
    if !PROTOCOLS.contains(&name.as_str()) {
        return Err(invalid(
            field,
            &format!("unknown protocol {name:?} ({})", PROTOCOLS.join(", ")),
        ));
    }
    name.parse::<ProtocolKind>()
        .map(ProtocolChoice::Fixed)
        .map_err(|_| invalid(field, &format!("unknown protocol {name:?}")))
}

/// The options of a transport, read into a policy and the rest.
struct Options {
    policy: RecoveryPolicy,
    protocol: ProtocolChoice,
    resumable_sse: bool,
    budget: Option<Arc<dyn BudgetStore>>,
    cooldowns: bool,
    context_window: Option<u64>,
    prefill: Option<Prefill>,
}

fn read_options(options: &Bound<'_, PyDict>) -> PyResult<Options> {
    let mut spec = PolicySpec::new();
    let mut protocol = ProtocolChoice::Auto;
    let mut terminal: Option<SseTerminal> = None;
    let mut resumable_sse = false;
    let mut budget: Option<RetryBudgetConfig> = Some(RetryBudgetConfig::default());
    let mut cooldowns = true;
    let mut context_window = None;
    let mut prefill = None;
    for (key, v) in options.iter() {
        let key: String = key.extract()?;
        let k = key.as_str();
        if let Some(f) = field(k) {
            spec.set(f.name, knob(f, &v)?)
                .map_err(|e| invalid_policy(&e))?;
            continue;
        }
        match k {
            "protocol" => protocol = protocol_choice(k, &v)?,
            "sse_terminal" => terminal = sse_terminal(&v)?,
            "resumable_sse" => resumable_sse = flag(k, &v)?,
            "cooldowns" => cooldowns = flag(k, &v)?,
            "context_window" => {
                context_window = if v.is_none() {
                    None
                } else {
                    Some(whole(k, &v, 1, u64::MAX)?)
                };
            }
            "retry_budget" => budget = retry_budget(&v)?,
            "prefill_template" => prefill = Some(prefill_of(k, &v)?),
            _ => {
                return Err(PyTypeError::new_err(format!(
                    "unknown recovery option `{k}`"
                )));
            }
        }
    }
    if terminal.is_some() {
        if !matches!(protocol, ProtocolChoice::Fixed(ProtocolKind::Sse { .. })) {
            return Err(invalid(
                "sse_terminal",
                "only applies with protocol \"sse\"",
            ));
        }
        protocol = ProtocolChoice::Fixed(ProtocolKind::Sse {
            terminal_sentinel: terminal,
        });
    }
    Ok(Options {
        policy: spec.build().map_err(|e| invalid_policy(&e))?,
        protocol,
        resumable_sse,
        budget: budget.map(|c| -> Arc<dyn BudgetStore> { Arc::new(RetryBudget::new(c)) }),
        cooldowns,
        context_window,
        prefill,
    })
}

/// `sse_terminal`: `None`, or a dict of exactly one of `data`, `event`.
fn sse_terminal(v: &Bound<'_, PyAny>) -> PyResult<Option<SseTerminal>> {
    let k = "sse_terminal";
    if v.is_none() {
        return Ok(None);
    }
    let d = v
        .cast::<PyDict>()
        .map_err(|_| wrong_type(k, "a dict with `data` or `event`", v))?;
    let data = d.get_item("data")?.filter(|x| !x.is_none());
    let event = d.get_item("event")?.filter(|x| !x.is_none());
    if d.len() != usize::from(data.is_some()) + usize::from(event.is_some()) {
        return Err(invalid(k, "only `data` or `event` may be given"));
    }
    Ok(Some(match (data, event) {
        (Some(x), None) => SseTerminal::Data(text("sse_terminal.data", &x)?),
        (None, Some(x)) => SseTerminal::Event(text("sse_terminal.event", &x)?),
        _ => return Err(invalid(k, "give exactly one of `data` or `event`")),
    }))
}

/// A prefill form by name (`auto`, `assistant`, `prefix`,
/// `continue_final_message`).
fn prefill_of(field: &str, v: &Bound<'_, PyAny>) -> PyResult<Prefill> {
    let names: Vec<&str> = Prefill::ALL.iter().map(|p| p.name()).collect();
    let name = variant(field, v, &names)?;
    name.parse()
        .map_err(|_| invalid(field, &format!("unknown prefill template {name:?}")))
}

/// `retry_budget`: `None` (no budget), `True` (the default one) or a dict
/// of `ttl_ms`, `min_retries_per_sec`, `percent`.
fn retry_budget(value: &Bound<'_, PyAny>) -> PyResult<Option<RetryBudgetConfig>> {
    let field = "retry_budget";
    if value.is_none() {
        return Ok(None);
    }
    if value.is_instance_of::<PyBool>() {
        return Ok(flag(field, value)?.then(RetryBudgetConfig::default));
    }
    let given = value
        .cast::<PyDict>()
        .map_err(|_| wrong_type(field, "None, a bool or a dict", value))?;
    let mut c = RetryBudgetConfig::default();
    for (key, x) in given.iter() {
        let key: String = key.extract()?;
        match key.as_str() {
            "ttl_ms" => {
                let ttl = millis("retry_budget.ttl_ms", &x, true)?;
                if ttl < Duration::from_secs(1) || ttl > Duration::from_mins(1) {
                    return Err(invalid(
                        "retry_budget.ttl_ms",
                        "must be between 1000 and 60000",
                    ));
                }
                c = RetryBudgetConfig::new(ttl, c.min_retries_per_sec, c.percent);
            }
            "min_retries_per_sec" => {
                let n = whole(
                    "retry_budget.min_retries_per_sec",
                    &x,
                    0,
                    u64::from(u32::MAX),
                )?;
                c = RetryBudgetConfig::new(c.ttl, n as u32, c.percent);
            }
            "percent" => {
                let p: f64 = x
                    .extract()
                    .map_err(|_| wrong_type("retry_budget.percent", "a number", &x))?;
                if !(0.0..=10.0).contains(&p) {
                    return Err(invalid("retry_budget.percent", "must be between 0 and 10"));
                }
                c = RetryBudgetConfig::new(c.ttl, c.min_retries_per_sec, p);
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "unknown recovery option `retry_budget.{other}`"
                )));
            }
        }
    }
    Ok(Some(c))
}

/// One alternate from its dict: `label`, `url`, `model`, `protocol`,
/// `context_window` (the shell keeps `headers` and `body`).
fn read_alternate(i: usize, d: &Bound<'_, PyDict>) -> PyResult<Target> {
    let at = |f: &str| format!("alternates[{i}].{f}");
    let get = |name: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(d.get_item(name)?.filter(|v| !v.is_none()))
    };
    let label = get("label")?.ok_or_else(|| invalid(&at("label"), "is required"))?;
    let mut t = Target::new(text(&at("label"), &label)?).map_err(|_| {
        invalid(
            &at("label"),
            "must be 1 to 64 of A-Z a-z 0-9 . _ - (reports and events carry it)",
        )
    })?;
    if let Some(url) = get("url")? {
        t = t.with_url(text(&at("url"), &url)?).map_err(|_| {
            invalid(
                &at("url"),
                "must be absolute http(s)://... or a path starting with /",
            )
        })?;
    }
    if let Some(model) = get("model")? {
        t = t.with_model(text(&at("model"), &model)?).map_err(|_| {
            invalid(
                &at("model"),
                "must be 1 to 256 characters, none of them a control character",
            )
        })?;
    }
    if let Some(p) = get("protocol")? {
        t = t.with_protocol(protocol_choice(&at("protocol"), &p)?);
    }
    if let Some(w) = get("context_window")? {
        t = t.with_context_window(whole(&at("context_window"), &w, 1, u64::MAX)?);
    }
    if let Some(p) = get("prefill_template")? {
        t = t.with_prefill(prefill_of(&at("prefill_template"), &p)?);
    }
    Ok(t)
}

/// What the requests of one transport share: the policy, the protocol, the
/// retry budget, the endpoint cooldowns and the alternates.
#[pyclass(frozen, module = "recovery_llm._machine")]
pub struct Client {
    policy: RecoveryPolicy,
    protocol: ProtocolChoice,
    resumable_sse: bool,
    budget: Option<Arc<dyn BudgetStore>>,
    cooldowns: Option<Arc<Cooldowns>>,
    alternates: Vec<Target>,
    context_window: Option<u64>,
    /// The prefill form the request's own endpoint continues with.
    prefill: Option<Prefill>,
    /// Every jitter draw pinned to this fraction (tests), else random.
    jitter: Option<f64>,
    online: Arc<AtomicBool>,
}

#[pymethods]
impl Client {
    /// A client from the transport's options (only those given), its
    /// alternates (dicts) and, for tests, a pinned jitter fraction. Raises
    /// `TypeError` for an unknown option or a wrong type and `ValueError`
    /// for a value out of range or a policy the engine refuses.
    #[new]
    #[pyo3(signature = (options, alternates, jitter=None))]
    fn new(
        options: &Bound<'_, PyDict>,
        alternates: &Bound<'_, PyList>,
        jitter: Option<f64>,
    ) -> PyResult<Self> {
        let o = read_options(options)?;
        let mut targets = Vec::with_capacity(alternates.len());
        for (i, a) in alternates.iter().enumerate() {
            let d = a
                .cast::<PyDict>()
                .map_err(|_| wrong_type(&format!("alternates[{i}]"), "a dict", &a))?;
            targets.push(read_alternate(i, d)?);
        }
        Ok(Client {
            policy: o.policy,
            protocol: o.protocol,
            resumable_sse: o.resumable_sse,
            budget: o.budget,
            cooldowns: o.cooldowns.then(|| Arc::new(Cooldowns::new())),
            alternates: targets,
            context_window: o.context_window,
            prefill: o.prefill,
            jitter,
            online: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Whether the platform is online (the shell assumes it is unless told).
    fn set_online(&self, online: bool) {
        self.online.store(online, Ordering::Relaxed);
    }

    /// The policy in force, every knob of the policy table by its name
    /// (milliseconds; `"off"` for a bound that is off): keywords that
    /// build this policy again.
    fn policy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (field, value) in PolicySpec::from_policy(&self.policy).iter() {
            d.set_item(field.name, py_value(py, value)?)?;
        }
        Ok(d)
    }

    /// The protocol option's name (`auto` or a protocol).
    fn protocol(&self) -> &'static str {
        match &self.protocol {
            ProtocolChoice::Fixed(kind) => kind.name(),
            _ => "auto",
        }
    }

    /// The shared cooldown of a request to `url` with `body`: notes at
    /// `now` that its endpoint asked for no sends during `wait_ms` (when
    /// positive), then answers how long its sends must still wait, in ms
    /// (0 when they may go, or when the client shares no cooldowns). `key`
    /// is the caller's key for the request (`None`: its origin and model).
    #[pyo3(signature = (url, body, key, now, wait_ms=0.0))]
    fn cooldown(&self, url: &str, body: &[u8], key: Option<&str>, now: f64, wait_ms: f64) -> f64 {
        let Some(cooldowns) = &self.cooldowns else {
            return 0.0;
        };
        let key = key_of(key, url, &BodyFields::read(body));
        let now = instant(now);
        if wait_ms > 0.0 {
            cooldowns.note(&key, now, Duration::from_micros((wait_ms * 1000.0) as u64));
        }
        cooldowns
            .remaining(&key, now)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }

    /// Starts one logical request at `now`: `body` is the buffered request
    /// body (`None` when it could not be buffered); `logical_id` 64 random
    /// bits; `wall` the wall clock now (seconds since the epoch); `admission`
    /// and `continuation` say which hooks the caller installed; `bodies` the
    /// bodies the caller wrote for its alternates, in order (`None`: the
    /// request's own); `key` the caller's cooldown key (`None`: the
    /// request's origin and model).
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)]
    #[pyo3(signature = (method, url, body, now, wall, logical_id, admission=false, continuation=false, bodies=None, key=None))]
    fn start(
        &self,
        method: &str,
        url: &str,
        body: Option<&[u8]>,
        now: f64,
        wall: f64,
        logical_id: u64,
        admission: bool,
        continuation: bool,
        bodies: Option<Vec<Option<Vec<u8>>>>,
        key: Option<&str>,
    ) -> Machine {
        let policy = self.policy.clone();
        let replay = body.is_none().then_some(ReplayDisabled::NotReplayable);
        let body = body.unwrap_or_default();
        let allowance = AttemptAllowance::new(policy.max_attempts().get());
        let start = instant(now);
        let mut targets = self.alternates.clone();
        for (t, own) in targets.iter_mut().zip(bodies.unwrap_or_default()) {
            if let Some(own) = own {
                *t = t.clone().with_body(own);
            }
        }
        let request = RequestFacts::new(method, url, body);
        let mut setup = Setup::new(policy, &self.protocol, request, allowance, logical_id)
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
        if let Some(reason) = replay {
            setup = setup.without_replay(reason);
        }
        if let Some(pinned) = self.jitter {
            setup = setup.jitter(JitterSource::pinned(Fraction::new(pinned)));
        }
        let ex = setup.start(start);
        let wall = SystemTime::UNIX_EPOCH + Duration::from_micros((wall.max(0.0) * 1e6) as u64);
        Machine {
            inner: Mutex::new(Inner {
                ex,
                targets,
                io_send: None,
                deliver: None,
                hedge_target: 0,
                admission: None,
                deadline: None,
                deadline_s: None,
                status: RecoveryStatus::InProgress,
                start,
                wall,
                online: Arc::clone(&self.online),
                fed_since_check: false,
                hedge_fed: false,
                action: 0,
            }),
        }
    }
}

/// The cooldown key of a request: the caller's, or its origin and model.
fn key_of(key: Option<&str>, url: &str, body: &BodyFields<'_>) -> String {
    match key {
        Some(k) if !k.is_empty() => k.to_owned(),
        _ => cooldown::key_of(url, body),
    }
}

/// A chunk the machine keeps: the shell's `bytes` object (handed on as it
/// is when the machine delivers it) and a copy of its bytes.
struct Kept {
    object: Py<PyBytes>,
    bytes: Vec<u8>,
}

impl AsRef<[u8]> for Kept {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// A response head: its status and its headers, names lowercase.
struct PyHead<'a> {
    status: u16,
    headers: &'a [(String, String)],
}

impl Head for PyHead<'_> {
    fn status(&self) -> u16 {
        self.status
    }
    fn header(&self, name: &str) -> Option<std::borrow::Cow<'_, str>> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| std::borrow::Cow::Borrowed(v.as_str()))
    }
}

struct Inner {
    ex: Exchange<Kept>,
    targets: Vec<Target>,
    io_send: Option<Outgoing>,
    deliver: Option<Chunk<Kept>>,
    /// The target of the hedge to send (after `HEDGE`).
    hedge_target: usize,
    admission: Option<AdmissionRequest>,
    /// The deadline the shell was last told, and the same in seconds on
    /// its clock (`Machine.deadline`; a `Reader` compares each chunk's
    /// clock reading with it).
    deadline: Option<Instant>,
    deadline_s: Option<f64>,
    /// What the status was after the last event drained.
    status: RecoveryStatus,
    /// The monotonic and wall clocks when the request started.
    start: Instant,
    wall: SystemTime,
    online: Arc<AtomicBool>,
    /// Chunks were read since the machine last judged its timers.
    fed_since_check: bool,
    /// The same of a hedge's chunks: the first's once it is promoted.
    hedge_fed: bool,
    /// The action last answered (without its flags): a `Reader` reads on
    /// only while it is a read.
    action: u32,
}

impl Inner {
    /// The wall clock at `now`, moved on from the start by the monotonic
    /// clock.
    fn wall_at(&self, now: Instant) -> SystemTime {
        self.wall + now.saturating_since(self.start)
    }

    /// Whether the deadline may come before the quiet window a body's
    /// reads were given: before commit, when nothing came since the
    /// timers were judged (a stall then certain at the deadline), or
    /// after the outcome (the drain). Otherwise the slack
    /// ([`Inner::read_slack`]) is that window and a read's own timeout
    /// keeps the deadline.
    fn exact_deadline(&self) -> bool {
        !self.fed_since_check || !self.ex.is_committed() || self.ex.ledger().outcome().is_some()
    }

    /// `Machine.read_slack`.
    fn read_slack(&self, always: bool) -> Option<f64> {
        if !always && !self.fed_since_check {
            return None;
        }
        let p = self.ex.policy();
        if !self.ex.is_committed() && p.first_token_timeout().is_some() && !always {
            // The first token's deadline is due as it stands.
            return None;
        }
        let quiet = if self.ex.ledger().outcome().is_some() {
            Some(DRAIN_GRACE)
        } else if self.ex.keeps_response() {
            p.idle_timeout()
        } else {
            match (p.idle_timeout(), p.progress_timeout()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        quiet.map(|d| d.as_secs_f64())
    }

    /// A body chunk of the first attempt (`Machine.on_chunk`).
    fn chunk(&mut self, now: Instant, chunk: &Bound<'_, PyBytes>) -> u32 {
        let bytes = chunk.as_bytes();
        self.fed_since_check = true;
        let keep = || Kept {
            object: chunk.clone().unbind(),
            bytes: bytes.to_vec(),
        };
        let now_out = if self.ex.is_passing_through() {
            self.ex.on_passing_chunk(bytes) || self.ex.on_kept_chunk(now, keep()).is_some()
        } else {
            self.ex.on_chunk(now, keep()).is_some()
        };
        let next = self.next(now);
        if now_out {
            next | action::DELIVER_THIS
        } else {
            next
        }
    }

    /// Polls the machine and answers the action code with its flags.
    fn next(&mut self, now: Instant) -> u32 {
        let io = self.ex.poll(now, self.online.load(Ordering::Relaxed));
        let code = io.action();
        match io {
            Io::Send(kind) => self.io_send = Some(Outgoing::from(kind)),
            Io::Hedge { target } => {
                self.hedge_target = target;
                self.hedge_fed = false;
            }
            Io::Promote => self.fed_since_check = self.hedge_fed,
            Io::Deliver(chunk) => self.deliver = Some(chunk),
            Io::AskAdmission(request) => self.admission = Some(request),
            _ => {}
        }
        let mut flags = 0;
        if self.ex.has_events() {
            flags |= action::EVENTS;
        }
        let deadline = self.ex.poll_timeout();
        if deadline != self.deadline {
            self.deadline = deadline;
            self.deadline_s = deadline.map(seconds);
            flags |= action::DEADLINE;
        }
        self.action = code;
        code | flags
    }
}

/// A `serde_json` value as the Python value `json.loads` would give.
fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(0.0).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(to_py(py, x)?)?;
            }
            list.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}

fn serde_py<'py, T: Serialize + ?Sized>(py: Python<'py>, v: &T) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(v).map_err(|e| PyValueError::new_err(e.to_string()))?;
    to_py(py, &value)
}

/// A snake_case name as the variant of a serde enum.
fn named<T: serde::de::DeserializeOwned>(what: &str, name: &str) -> PyResult<T> {
    serde_json::from_value(Value::String(name.to_owned()))
        .map_err(|_| PyValueError::new_err(format!("unknown {what} {name:?}")))
}

/// One logical request.
#[pyclass(frozen, module = "recovery_llm._machine")]
pub struct Machine {
    inner: Mutex<Inner>,
}

impl Machine {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[pymethods]
impl Machine {
    /// What to do next.
    fn poll(&self, now: f64) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        m.next(now)
    }

    /// The send of action 1 is on its way.
    fn on_sent(&self, now: f64) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        m.ex.on_sent(now);
        m.next(now)
    }

    /// The response head: `headers` as `(name, value)` pairs, names
    /// lowercase.
    #[allow(clippy::needless_pass_by_value)]
    fn on_head(&self, now: f64, status: u16, headers: Vec<(String, String)>) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        let head = PyHead {
            status,
            headers: &headers,
        };
        let wall = m.wall_at(now);
        m.ex.on_head(now, wall, &head, None);
        m.fed_since_check = false;
        m.next(now)
    }

    /// A body chunk. With flag `0x100` the shell hands that same chunk on
    /// as it is, before the action.
    fn on_chunk(&self, now: f64, chunk: &Bound<'_, PyBytes>) -> u32 {
        self.lock().chunk(instant(now), chunk)
    }

    /// The body ended cleanly.
    fn on_end(&self, now: f64) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        m.ex.on_end(now);
        m.next(now)
    }

    /// The send or the read failed: `kind` a transport kind (`dns`,
    /// `refused`, `reset`, `closed`, `refused_stream`, `tls`, `other`),
    /// `phase` where (`connecting`, `sending`, `awaiting_headers`,
    /// `streaming`, `decoding`, `unknown`).
    fn on_error(&self, now: f64, kind: &str, phase: &str) -> PyResult<u32> {
        let kind: TransportKind = named("transport kind", kind)?;
        let phase: Phase = named("phase", phase)?;
        let mut m = self.lock();
        let now = instant(now);
        m.ex.on_error(now, Failure::transport(kind, phase));
        Ok(m.next(now))
    }

    /// `Machine.on_sent` of `role`'s attempt (`ROLE_FIRST`, `ROLE_HEDGE`).
    fn on_sent_of(&self, role: u8, now: f64) -> PyResult<u32> {
        let role = role_of(role)?;
        let mut m = self.lock();
        let now = instant(now);
        m.ex.on_sent_of(role, now);
        Ok(m.next(now))
    }

    /// `Machine.on_head` of `role`'s attempt.
    #[allow(clippy::needless_pass_by_value)]
    fn on_head_of(
        &self,
        role: u8,
        now: f64,
        status: u16,
        headers: Vec<(String, String)>,
    ) -> PyResult<u32> {
        let role = role_of(role)?;
        if role == Role::First {
            return Ok(self.on_head(now, status, headers));
        }
        let mut m = self.lock();
        let now = instant(now);
        let head = PyHead {
            status,
            headers: &headers,
        };
        let wall = m.wall_at(now);
        m.ex.on_head_of(role, now, wall, &head, None);
        m.hedge_fed = false;
        Ok(m.next(now))
    }

    /// `Machine.on_chunk` of `role`'s attempt (with flag `0x100` the shell
    /// hands that chunk on; a hedge's never is, before it is promoted).
    fn on_chunk_of(&self, role: u8, now: f64, chunk: &Bound<'_, PyBytes>) -> PyResult<u32> {
        let role = role_of(role)?;
        if role == Role::First {
            return Ok(self.on_chunk(now, chunk));
        }
        let mut m = self.lock();
        let now = instant(now);
        m.hedge_fed = true;
        let kept = Kept {
            object: chunk.clone().unbind(),
            bytes: chunk.as_bytes().to_vec(),
        };
        let now_out = m.ex.on_chunk_of(role, now, kept).is_some();
        let next = m.next(now);
        Ok(if now_out {
            next | action::DELIVER_THIS
        } else {
            next
        })
    }

    /// `Machine.on_end` of `role`'s attempt.
    fn on_end_of(&self, role: u8, now: f64) -> PyResult<u32> {
        let role = role_of(role)?;
        let mut m = self.lock();
        let now = instant(now);
        m.ex.on_end_of(role, now);
        Ok(m.next(now))
    }

    /// `Machine.on_error` of `role`'s attempt.
    fn on_error_of(&self, role: u8, now: f64, kind: &str, phase: &str) -> PyResult<u32> {
        let role = role_of(role)?;
        let kind: TransportKind = named("transport kind", kind)?;
        let phase: Phase = named("phase", phase)?;
        let mut m = self.lock();
        let now = instant(now);
        m.ex.on_error_of(role, now, Failure::transport(kind, phase));
        Ok(m.next(now))
    }

    /// The deadline may have passed: the machine judges its timers at `now`
    /// (both attempts' during a race).
    fn on_timeout(&self, now: f64) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        m.ex.handle_timeout(now);
        m.fed_since_check = false;
        m.hedge_fed = false;
        m.next(now)
    }

    /// The platform is online again.
    fn on_online(&self, now: f64) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        m.ex.online(now);
        m.next(now)
    }

    /// The admission hook answered: `"allow"`, `"reject"`, anything else
    /// unresolved.
    fn on_admission(&self, now: f64, answer: &str) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        let answer = match answer {
            "allow" => AdmissionAnswer::Allow,
            "reject" => AdmissionAnswer::Reject,
            _ => AdmissionAnswer::Unresolved,
        };
        m.ex.admission(now, answer);
        m.next(now)
    }

    /// The continuation hook answered: `given` when it returned a request
    /// (which the shell keeps and sends at the next send of kind 2).
    fn on_continuation(&self, now: f64, given: bool) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        m.ex.continuation(now, given);
        m.next(now)
    }

    /// The caller cancelled, or closed the body.
    fn on_cancel(&self, now: f64) -> u32 {
        let mut m = self.lock();
        let now = instant(now);
        m.ex.cancel(now);
        m.next(now)
    }

    /// When the machine must be woken (`Machine.on_timeout`) if nothing
    /// else happens first, in seconds on the shell's clock; `None` for never.
    fn deadline(&self) -> Option<f64> {
        self.lock().deadline_s
    }

    /// How long a read may block past `Machine.deadline` before the
    /// machine's next deadline has certainly passed, when chunks came since
    /// its timers were last judged (the deadline may then be only a check
    /// of its stall timers, which moves their marks): in seconds, or `None`
    /// when the deadline is the one to wait for. A shell whose read cannot
    /// outlive a timer waits that much longer, then reports the check at
    /// the deadline and the time after.
    /// With `always`, the window whatever came (a shell that can bound a
    /// read only once per attempt bounds each by it).
    fn read_slack(&self, always: bool) -> Option<f64> {
        self.lock().read_slack(always)
    }

    /// The lifecycle events since the last call, as `(event, status)`
    /// pairs: `event` the documented JSON form as a dict, `status` the
    /// `RecoveryStatus` (snake_case) when that event changed it, else `None`.
    fn events<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut m = self.lock();
        let out = PyList::empty(py);
        let mut status = m.status;
        let drained: Vec<_> = m.ex.drain_events().collect();
        for event in drained {
            let after = status.after(&event.kind);
            let changed = if after == status {
                py.None().into_bound(py)
            } else {
                status = after;
                serde_py(py, &after)?
            };
            out.append((serde_py(py, &event)?, changed))?;
        }
        m.status = status;
        Ok(out)
    }

    /// Drops the lifecycle events since the last call, keeping the status
    /// they lead to: a shell with no one listening builds no dict for them.
    fn skip_events(&self) {
        let mut m = self.lock();
        let mut status = m.status;
        for event in m.ex.drain_events() {
            status = status.after(&event.kind);
        }
        m.status = status;
    }

    /// The report so far, as a dict (the documented JSON form).
    fn report<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        serde_py(py, self.lock().ex.ledger().report())
    }

    /// The outcome once the request ended, as a dict (`None` before).
    fn outcome<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.lock()
            .ex
            .ledger()
            .outcome()
            .map(|o| serde_py(py, o))
            .transpose()
    }

    /// The text of the request's failure (`recovery failed: ...`), or
    /// `None` while it has not failed.
    fn error_text(&self) -> Option<String> {
        let m = self.lock();
        let outcome = m.ex.ledger().outcome()?;
        if outcome.name() == "completed" {
            return None;
        }
        let e = RecoveryError::new(
            outcome.clone(),
            m.ex.ledger().report().clone(),
            Evidence::default(),
        );
        Some(e.to_string())
    }

    /// Whether a response reached the caller (the request committed).
    fn committed(&self) -> bool {
        self.lock().ex.is_committed()
    }

    /// Action 1: `(kind, target, url, method, header, with_body)`: `kind`
    /// 0 the original request, 1 a resume, 2 the continuation, 3 a prefill
    /// continuation (`Machine.send_body`); `target`
    /// the alternate it goes to (0: the request's own endpoint; then see
    /// `Machine.retarget`); for a resume its URL, its method, a header
    /// to set (`(name, value)` or `None`) and whether the original body
    /// goes again (without it the shell drops the body's headers).
    #[allow(clippy::type_complexity)]
    fn send_info(
        &self,
    ) -> (
        u32,
        usize,
        String,
        String,
        Option<(&'static str, String)>,
        bool,
    ) {
        let m = self.lock();
        let target = m.ex.target();
        match &m.io_send {
            Some(s) => (
                s.kind,
                target,
                s.url.clone(),
                s.method.clone(),
                s.header.clone(),
                s.with_body,
            ),
            None => (0, target, String::new(), String::new(), None, true),
        }
    }

    /// Action 1 of a prefill continuation (kind 3): the body to send in
    /// place of the request's (taken: a second call answers `None`).
    fn send_body<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let body = std::mem::take(&mut self.lock().io_send.as_mut()?.body);
        (!body.is_empty()).then(|| PyBytes::new(py, &body))
    }

    /// Action 1 (or 15, with `target` `Machine.hedge_target()`) to an
    /// alternate: the request to `url` with `body` and headers named
    /// `headers` (lowercase) as that alternate takes it: `(url, headers that
    /// stay behind, body)`; `None` for the request's own target. `target`
    /// left out: the send's (`Machine.send_info`).
    #[pyo3(signature = (url, body, headers, target=None))]
    fn retarget<'py>(
        &self,
        py: Python<'py>,
        url: &str,
        body: &[u8],
        headers: Vec<String>,
        target: Option<usize>,
    ) -> Option<(String, Vec<String>, Bound<'py, PyBytes>)> {
        let m = self.lock();
        let target = target.unwrap_or_else(|| m.ex.target());
        let t = m.targets.get(target.checked_sub(1)?)?;
        let left = headers
            .into_iter()
            .filter(|n| !t.keeps_header(url, n))
            .collect();
        Some((
            t.rewrite_url(url).into_owned(),
            left,
            PyBytes::new(py, &t.rewrite_body(body)),
        ))
    }

    /// Action 15: the target the hedge goes to (0: the request's own
    /// endpoint; `i`: alternate `i`, written by `Machine.retarget`). A
    /// hedge is always the original request.
    fn hedge_target(&self) -> usize {
        self.lock().hedge_target
    }

    /// The `Idempotency-Key` to set on the send about to go out (`None`
    /// for none): `has_one` when its headers already carry one.
    fn idempotency_key(&self, has_one: bool) -> Option<String> {
        self.lock().ex.idempotency_key(has_one)
    }

    /// Action 7: the chunk to hand on.
    fn deliver<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        match self.lock().deliver.take()? {
            Chunk::Read(kept) => Some(kept.object.into_bound(py)),
            Chunk::Made(bytes) => Some(PyBytes::new(py, &bytes)),
        }
    }

    /// Action 6: the first chunks of the final error response, which the
    /// machine held; the rest of its body follows untouched.
    fn take_held<'py>(&self, py: Python<'py>) -> Vec<Bound<'py, PyBytes>> {
        self.lock()
            .ex
            .take_held()
            .into_iter()
            .map(|c| match c {
                Chunk::Read(kept) => kept.object.into_bound(py),
                Chunk::Made(bytes) => PyBytes::new(py, &bytes),
            })
            .collect()
    }

    /// Action 10: `{logical_id, next_attempt, failure}`.
    fn admission_request<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let m = self.lock();
        let Some(r) = &m.admission else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("logical_id", &r.logical_id)?;
        d.set_item("next_attempt", r.next_attempt)?;
        d.set_item("failure", serde_py(py, &r.failure)?)?;
        Ok(Some(d))
    }

    /// Action 12: what the consumer received, `{text, reasoning,
    /// tool_fragments, truncated}` (response text: sensitive).
    fn prefix<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let m = self.lock();
        let Some(p) = m.ex.delivered_prefix() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("text", &p.text)?;
        d.set_item("reasoning", &p.reasoning)?;
        d.set_item("tool_fragments", p.tool_fragments.clone())?;
        d.set_item("truncated", p.truncated)?;
        Ok(Some(d))
    }

    /// The protocol the answer of `role`'s attempt is decoded as (a hedge
    /// to an alternate may speak another).
    #[pyo3(signature = (role=role::FIRST))]
    fn protocol(&self, role: u8) -> PyResult<&'static str> {
        let role = role_of(role)?;
        Ok(self.lock().ex.protocol_of(role).name())
    }

    /// The request's logical id, as events show it.
    fn logical_id(&self) -> String {
        self.lock().ex.ledger().logical_id().to_owned()
    }
}

/// The reads of an attempt's body while the machine asks for nothing but
/// reads: each step judges the deadline, pulls the next chunk from the
/// inner byte iterator and gives it to the machine (`Machine.on_chunk`),
/// and hands it on when the machine passes it on as it is. The shell hands
/// it to [`Stitched`], which steps it without a Python frame of the shell
/// per chunk: over a socket, where the inner stream's own Python code runs
/// between chunks, each frame of ours costs twice what it does in a tight
/// loop.
///
/// It decides nothing either: it stops at anything but a read answered
/// with the chunk handed on, and the shell takes it from there with the
/// value it stopped with:
///
/// - `None`: nothing was read (the deadline has passed, or the read's
///   timeout would let it run past the machine's bound, which the shell
///   keeps by cutting the connection there; the machine asks for something
///   else; or the reader was closed);
/// - `("end", None)`: the inner iterator ended;
/// - `("read", chunk)`: a chunk read but not given to the machine (it is
///   not `bytes`: `Machine.on_chunk` refuses it);
/// - `("answer", chunk, code)`: the machine's answer to `chunk`
///   (`Machine.on_chunk`), which has flags or another action.
///
/// An exception of the inner iterator is raised as it is, with `raised`
/// then true (an exception of the clock leaves it false).
#[pyclass(module = "recovery_llm._machine")]
pub struct Reader {
    machine: Py<Machine>,
    /// The inner byte iterator; `None` once it ended, failed or was closed.
    it: Option<Py<PyIterator>>,
    /// The object the reader was made over (`Reader.source`).
    source: Py<PyAny>,
    /// The shell's clock, as the reader reads it.
    clock: ReaderClock,
    /// The longest one read of `it` blocks (the read timeout its body was
    /// given), in seconds: infinite when unknown.
    read_bound: f64,
    raised: bool,
}

/// The clock a [`Reader`] reads for each chunk.
///
/// The sync shell's clock is `time.monotonic` unless a test put a virtual
/// clock in its place. On Linux and macOS, `time.monotonic` and
/// [`std::time::Instant`] read the same system clock (`CLOCK_MONOTONIC`;
/// the uptime clock), so there the reader reads it once through Python when
/// it is made and from Rust afterwards: two calls into Python per chunk
/// fewer, the same seconds. Elsewhere (Windows before CPython 3.13 reads
/// another clock than Rust's) every reading goes through Python.
enum ReaderClock {
    /// `time.monotonic`, as `at_python` seconds at `at`.
    Monotonic {
        at: std::time::Instant,
        at_python: f64,
    },
    /// Any other clock, called per read.
    Python(Py<PyAny>),
}

impl ReaderClock {
    fn of(py: Python<'_>, clock: Py<PyAny>) -> PyResult<Self> {
        let monotonic = py.import("time")?.getattr("monotonic")?;
        let same_clock = cfg!(any(target_os = "linux", target_os = "macos"));
        if !same_clock || !clock.bind(py).is(&monotonic) {
            return Ok(Self::Python(clock));
        }
        let at = std::time::Instant::now();
        let at_python = monotonic.call0()?.extract()?;
        Ok(Self::Monotonic { at, at_python })
    }

    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        match self {
            Self::Monotonic { at, at_python } => Ok(at_python + at.elapsed().as_secs_f64()),
            Self::Python(clock) => clock.bind(py).call0()?.extract(),
        }
    }
}

/// Where one step of a [`Reader`] ended.
enum Step {
    /// A chunk the machine passes on as it is: the consumer's.
    Chunk(Py<PyAny>),
    /// The reader stopped; the shell goes on with this value.
    Stopped(Py<PyAny>),
}

impl Reader {
    /// Whether a read now, bounded by its own timeout only, would run past
    /// the machine's bound (its deadline `d` plus the slack it names).
    #[inline(never)]
    fn outlives(&self, machine: &Machine, d: f64, now: f64) -> bool {
        self.read_bound.is_finite()
            && d + machine.lock().read_slack(false).unwrap_or(0.0) < now + self.read_bound
    }

    /// Reads until a chunk is the consumer's or the reader stops.
    fn step(&mut self, py: Python<'_>) -> PyResult<Step> {
        let machine = self.machine.get();
        let stopped = |value: Bound<'_, PyAny>| Ok(Step::Stopped(value.unbind()));
        loop {
            let Some(it) = &self.it else {
                return stopped(py.None().into_bound(py));
            };
            let mut it = it.bind(py).clone();
            let (action, deadline, exact) = {
                let m = machine.lock();
                (m.action, m.deadline_s, m.exact_deadline())
            };
            if action != action::READ {
                return stopped(py.None().into_bound(py));
            }
            if let Some(d) = deadline {
                let now = self.clock.now(py)?;
                // As `Exchange.due` in the shell: a deadline passed is
                // judged before the read, by the shell. And as
                // `SyncExchange.cut_at_bound`: a read its own timeout would
                // let run past the machine's bound (the drain after proof,
                // a stall certain at its deadline) is the shell's, which
                // cuts the connection at that bound.
                if now >= d || exact && self.outlives(machine, d, now) {
                    return stopped(py.None().into_bound(py));
                }
            }
            let chunk = match it.next() {
                None => {
                    self.it = None;
                    return stopped(("end", py.None()).into_bound_py_any(py)?);
                }
                Some(Err(e)) => {
                    self.it = None;
                    self.raised = true;
                    return Err(e);
                }
                Some(Ok(chunk)) => chunk,
            };
            let Ok(bytes) = chunk.cast::<PyBytes>() else {
                // Not bytes: the shell gives it to the machine, which
                // refuses it as its `on_chunk` does.
                return stopped(("read", chunk).into_bound_py_any(py)?);
            };
            let now = instant(self.clock.now(py)?);
            let code = machine.lock().chunk(now, bytes);
            if code == action::READ | action::DELIVER_THIS {
                return Ok(Step::Chunk(chunk.unbind()));
            }
            if code != action::READ {
                return stopped(("answer", chunk, code).into_bound_py_any(py)?);
            }
            // Kept by the machine, which reads on.
        }
    }
}

#[pymethods]
impl Reader {
    /// A reader of `it` (an iterator of `bytes`) for `machine`, on `clock`;
    /// `read_bound`: the read timeout `it`'s reads were given, in seconds
    /// (none known: infinite, and no read is the shell's for it).
    #[new]
    #[pyo3(signature = (machine, it, clock, read_bound=f64::INFINITY))]
    fn new(
        machine: Py<Machine>,
        it: &Bound<'_, PyAny>,
        clock: Py<PyAny>,
        read_bound: f64,
    ) -> PyResult<Self> {
        Ok(Reader {
            machine,
            it: Some(PyIterator::from_object(it)?.unbind()),
            source: it.clone().unbind(),
            clock: ReaderClock::of(it.py(), clock)?,
            read_bound,
            raised: false,
        })
    }

    /// The iterator the reader was made over.
    #[getter]
    fn source(&self, py: Python<'_>) -> Py<PyAny> {
        self.source.clone_ref(py)
    }

    /// The clock reading the reader gives the machine now (seconds on the
    /// shell's clock).
    fn now(&self, py: Python<'_>) -> PyResult<f64> {
        self.clock.now(py)
    }

    /// Whether the last step raised the inner iterator's exception.
    #[getter]
    fn raised(&self) -> bool {
        self.raised
    }

    /// No read any more: the attempt's response was released.
    fn close(&mut self) {
        self.it = None;
    }
}

/// The iterator of a committed response's body: the chunks a [`Reader`]
/// hands on while the machine asks for nothing but reads, and the shell's
/// generator for everything else.
///
/// The generator yields a chunk for the consumer, or a `Reader` to read
/// with. Given a reader, this iterator steps it on each `__next__` until it
/// stops, then resumes the generator with what it stopped with (`send`), or
/// with the inner iterator's exception (`throw`). A chunk passed through so
/// costs the consumer one call into this module and no frame of the shell,
/// which still makes every choice but that one.
#[pyclass(module = "recovery_llm._machine")]
pub struct Stitched {
    /// The shell's generator of the body.
    shell: Py<PyAny>,
    /// The reader the shell last handed over, while it reads.
    reader: Option<Py<Reader>>,
}

/// How the shell's generator is resumed.
enum Resume {
    Next,
    Send(Py<PyAny>),
    Throw(PyErr),
}

#[pymethods]
impl Stitched {
    /// The body of `shell`, a generator of the shell (see above).
    #[new]
    fn new(shell: Py<PyAny>) -> Self {
        Stitched {
            shell,
            reader: None,
        }
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let mut resume = Resume::Next;
        loop {
            if let Some(reader) = self.reader.take() {
                let step = reader.bind(py).borrow_mut().step(py);
                match step {
                    Ok(Step::Chunk(chunk)) => {
                        self.reader = Some(reader);
                        return Ok(Some(chunk));
                    }
                    Ok(Step::Stopped(value)) => resume = Resume::Send(value),
                    Err(e) => resume = Resume::Throw(e),
                }
            }
            let shell = self.shell.bind(py);
            let out = match std::mem::replace(&mut resume, Resume::Next) {
                Resume::Next => shell.call_method0(pyo3::intern!(py, "__next__")),
                Resume::Send(value) => shell.call_method1(pyo3::intern!(py, "send"), (value,)),
                Resume::Throw(e) => {
                    shell.call_method1(pyo3::intern!(py, "throw"), (e.into_value(py),))
                }
            };
            let out = match out {
                Ok(out) => out,
                Err(e) if e.is_instance_of::<PyStopIteration>(py) => return Ok(None),
                Err(e) => return Err(e),
            };
            match out.cast_into::<Reader>() {
                Ok(reader) => self.reader = Some(reader.unbind()),
                Err(e) => return Ok(Some(e.into_inner().unbind())),
            }
        }
    }

    /// Closes the shell's generator (its `finally` cancels a request not
    /// ended), as closing the generator itself would.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(reader) = self.reader.take() {
            reader.bind(py).borrow_mut().close();
        }
        self.shell
            .bind(py)
            .call_method0(pyo3::intern!(py, "close"))?;
        Ok(())
    }
}

/// The protocol names the `protocol` option takes.
#[pyfunction]
fn protocols() -> Vec<&'static str> {
    PROTOCOLS.to_vec()
}

/// The policy table: one `(name, unit, default, can_be_off, refuses_zero,
/// doc)` per knob, in order; the transports' policy keywords are these
/// names (a test holds them equal).
#[pyfunction]
fn policy_fields() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    bool,
    bool,
    &'static str,
)> {
    FIELDS
        .iter()
        .map(|f| {
            (
                f.name,
                f.unit.name(),
                f.default,
                f.can_be_off,
                f.refuses_zero,
                f.doc(),
            )
        })
        .collect()
}

/// The machine of one logical request for the `recovery_llm` shell.
#[pymodule]
fn _machine(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Machine>()?;
    m.add_class::<Reader>()?;
    m.add_class::<Stitched>()?;
    m.add_function(wrap_pyfunction!(protocols, m)?)?;
    m.add_function(wrap_pyfunction!(policy_fields, m)?)?;
    for (name, value) in [
        ("SEND", action::SEND),
        ("AWAIT_HEAD", action::AWAIT_HEAD),
        ("READ", action::READ),
        ("RELEASE", action::RELEASE),
        ("RESPOND", action::RESPOND),
        ("RESPOND_ERROR", action::RESPOND_ERROR),
        ("DELIVER", action::DELIVER),
        ("SLEEP", action::SLEEP),
        ("WAIT_ONLINE", action::WAIT_ONLINE),
        ("ASK_ADMISSION", action::ASK_ADMISSION),
        ("AWAIT_ADMISSION", action::AWAIT_ADMISSION),
        ("ASK_CONTINUATION", action::ASK_CONTINUATION),
        ("END_OK", action::END_OK),
        ("END_ERR", action::END_ERR),
        ("HEDGE", action::HEDGE),
        ("RACE", action::RACE),
        ("RELEASE_HEDGE", action::RELEASE_HEDGE),
        ("PROMOTE", action::PROMOTE),
        ("DELIVER_THIS", action::DELIVER_THIS),
        ("EVENTS", action::EVENTS),
        ("DEADLINE", action::DEADLINE),
    ] {
        m.add(name, value)?;
    }
    for (name, value) in [("ROLE_FIRST", role::FIRST), ("ROLE_HEDGE", role::HEDGE)] {
        m.add(name, value)?;
    }
    m.add("DRAIN_GRACE", DRAIN_GRACE.as_secs_f64())?;
    Ok(())
}
