//! The npm options object, validated into a policy and driver settings.
//!
//! The JS wrapper passes the options as JSON (functions and the signal are
//! handed over separately). Every knob mirrors [`RecoveryPolicy`]'s builder
//! in camelCase with durations in milliseconds; an unknown key, a wrong type
//! or an out-of-range value is a typed [`OptionsError`] naming the field,
//! never a silent default.

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use recovery_core::budget::RetryBudgetConfig;
use recovery_core::failure::Category;
use recovery_core::policy::{Endpoint, OverCeiling, PolicyError, RecoveryPolicy};
use recovery_core::protocol::ProtocolChoice;
use recovery_core::protocol::{ProtocolKind, SseTerminal};

/// Why an options object was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    /// The JSON did not have the expected shape (unknown key, wrong type).
    Shape(String),
    /// A value of `field` is out of range.
    Range {
        /// The camelCase option name.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The policy builder refused the combination.
    Policy(PolicyError),
}

impl OptionsError {
    /// Whether the error is about a value's range (`RangeError` in JS)
    /// rather than its type (`TypeError`).
    pub fn is_range(&self) -> bool {
        !matches!(self, OptionsError::Shape(_))
    }
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsError::Shape(m) => write!(f, "invalid recovery options: {m}"),
            OptionsError::Range { field, reason } => {
                write!(f, "invalid recovery option `{field}`: {reason}")
            }
            OptionsError::Policy(e) => write!(f, "invalid recovery policy: {e}"),
        }
    }
}

impl std::error::Error for OptionsError {}

/// An options value as it arrives: the JSON data model, built from the JS
/// options object on wasm (no JSON text, no serde: a derived deserializer
/// was a fifth of the module) and from JSON text in native tests.
#[derive(Debug, Clone, PartialEq)]
pub enum OptionValue {
    /// `null` (an `undefined` member is left out instead).
    Null,
    /// A boolean.
    Bool(bool),
    /// A number.
    Number(f64),
    /// A string.
    String(String),
    /// An array.
    Array(Vec<OptionValue>),
    /// An object's own enumerable members, in order.
    Object(Vec<(String, OptionValue)>),
}

impl OptionValue {
    fn kind(&self) -> &'static str {
        match self {
            OptionValue::Null => "null",
            OptionValue::Bool(_) => "a boolean",
            OptionValue::Number(_) => "a number",
            OptionValue::String(_) => "a string",
            OptionValue::Array(_) => "an array",
            OptionValue::Object(_) => "an object",
        }
    }
}

fn shape(field: &str, expected: &str, got: &OptionValue) -> OptionsError {
    OptionsError::Shape(format!(
        "`{field}`: expected {expected}, got {}",
        got.kind()
    ))
}

fn number(field: &str, v: &OptionValue) -> Result<f64, OptionsError> {
    match v {
        OptionValue::Number(n) => Ok(*n),
        other => Err(shape(field, "a number", other)),
    }
}

/// A whole number in `0..=max` (what serde accepts for an unsigned field).
fn whole(field: &str, v: &OptionValue, max: f64) -> Result<f64, OptionsError> {
    let n = number(field, v)?;
    if n.fract() != 0.0 || !(0.0..=max).contains(&n) {
        return Err(OptionsError::Shape(format!(
            "`{field}`: expected a whole number from 0 to {}",
            number_text(max)
        )));
    }
    Ok(n)
}

fn uint(field: &str, v: &OptionValue) -> Result<u32, OptionsError> {
    whole(field, v, f64::from(u32::MAX)).map(|n| n as u32)
}

fn string<'a>(field: &str, v: &'a OptionValue) -> Result<&'a str, OptionsError> {
    match v {
        OptionValue::String(s) => Ok(s),
        other => Err(shape(field, "a string", other)),
    }
}

fn array<'a>(field: &str, v: &'a OptionValue) -> Result<&'a [OptionValue], OptionsError> {
    match v {
        OptionValue::Array(a) => Ok(a),
        other => Err(shape(field, "an array", other)),
    }
}

fn object<'a>(
    field: &str,
    v: &'a OptionValue,
) -> Result<&'a [(String, OptionValue)], OptionsError> {
    match v {
        OptionValue::Object(o) => Ok(o),
        other => Err(shape(field, "an object", other)),
    }
}

fn unknown(field: &str) -> OptionsError {
    OptionsError::Shape(format!("unknown field `{field}`"))
}

/// One of `names` (the snake_case serde names of a core enum).
fn variant<T: Copy>(field: &str, v: &OptionValue, names: &[(&str, T)]) -> Result<T, OptionsError> {
    let name = string(field, v)?;
    names
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, t)| *t)
        .ok_or_else(|| OptionsError::Shape(format!("`{field}`: unknown variant `{name}`")))
}

const CATEGORIES: &[(&str, Category)] = &[
    ("transport", Category::Transport),
    ("http", Category::Http),
    ("provider_response", Category::ProviderResponse),
    ("protocol", Category::Protocol),
    ("cancellation", Category::Cancellation),
    ("client_timeout", Category::ClientTimeout),
];

/// `null` as absent, for plain optional fields (as serde reads `Option`).
fn present(v: &OptionValue) -> Option<&OptionValue> {
    (*v != OptionValue::Null).then_some(v)
}

/// The generic SSE terminal: `{ "data": "[DONE]" }` or `{ "event": "end" }`.
struct SseTerminalJson {
    data: Option<String>,
    event: Option<String>,
}

/// The cross-request retry budget options.
#[derive(Default)]
struct RetryBudgetJson {
    ttl_ms: Option<f64>,
    min_retries_per_sec: Option<u32>,
    percent: Option<f64>,
}

/// The options object. Absent keys keep the policy defaults; `null` for
/// `budgetMs`/`deadlineMs`/timeouts means "none".
#[derive(Default)]
struct OptionsJson {
    max_attempts: Option<u32>,
    backoff_base_ms: Option<f64>,
    backoff_ceiling_ms: Option<f64>,
    budget_ms: Nullable<f64>,
    deadline_ms: Nullable<f64>,
    retryable_statuses: Option<Vec<u16>>,
    retryable_categories: Option<Vec<Category>>,
    retry_after_ceiling_ms: Option<f64>,
    over_ceiling: Option<OverCeiling>,
    replay_body_cap: Option<f64>,
    holdback_cap: Option<f64>,
    evidence_cap: Option<f64>,
    max_resumes: Option<u32>,
    endpoint: Option<Endpoint>,
    idle_timeout_ms: Nullable<f64>,
    progress_timeout_ms: Nullable<f64>,
    head_timeout_ms: Nullable<f64>,
    protocol: Option<String>,
    sse_terminal: Option<SseTerminalJson>,
    retry_budget: Nullable<RetryBudgetJson>,
    /// Set by the wrapper when an `admission` function was given.
    admission_hook: Option<bool>,
    resumable_sse: Option<bool>,
    continuation_hook: Option<bool>,
}

fn nullable_number(field: &str, v: &OptionValue) -> Result<Nullable<f64>, OptionsError> {
    Ok(match v {
        OptionValue::Null => Nullable::Null,
        v => Nullable::Value(number(field, v)?),
    })
}

impl OptionsJson {
    /// Reads the options object: an unknown key or a wrong type is a
    /// [`OptionsError::Shape`].
    fn read(v: &OptionValue) -> Result<OptionsJson, OptionsError> {
        let OptionValue::Object(members) = v else {
            return Err(OptionsError::Shape(format!(
                "expected an object, got {}",
                v.kind()
            )));
        };
        let mut o = OptionsJson::default();
        for (key, value) in members {
            let k = key.as_str();
            if k == "budgetMs" {
                o.budget_ms = nullable_number(k, value)?;
                continue;
            }
            if k == "deadlineMs" {
                o.deadline_ms = nullable_number(k, value)?;
                continue;
            }
            if k == "idleTimeoutMs" {
                o.idle_timeout_ms = nullable_number(k, value)?;
                continue;
            }
            if k == "progressTimeoutMs" {
                o.progress_timeout_ms = nullable_number(k, value)?;
                continue;
            }
            if k == "headTimeoutMs" {
                o.head_timeout_ms = nullable_number(k, value)?;
                continue;
            }
            if k == "retryBudget" {
                o.retry_budget = match value {
                    OptionValue::Null => Nullable::Null,
                    v => Nullable::Value(read_retry_budget(v)?),
                };
                continue;
            }
            let Some(value) = present(value) else {
                if is_known(k) {
                    continue;
                }
                return Err(unknown(k));
            };
            match k {
                "maxAttempts" => o.max_attempts = Some(uint(k, value)?),
                "backoffBaseMs" => o.backoff_base_ms = Some(number(k, value)?),
                "backoffCeilingMs" => o.backoff_ceiling_ms = Some(number(k, value)?),
                "retryableStatuses" => {
                    o.retryable_statuses = Some(
                        array(k, value)?
                            .iter()
                            .map(|s| whole(k, s, f64::from(u16::MAX)).map(|n| n as u16))
                            .collect::<Result<_, _>>()?,
                    );
                }
                "retryableCategories" => {
                    o.retryable_categories = Some(
                        array(k, value)?
                            .iter()
                            .map(|c| variant(k, c, CATEGORIES))
                            .collect::<Result<_, _>>()?,
                    );
                }
                "retryAfterCeilingMs" => o.retry_after_ceiling_ms = Some(number(k, value)?),
                "overCeiling" => {
                    o.over_ceiling = Some(variant(
                        k,
                        value,
                        &[
                            ("refuse", OverCeiling::Refuse),
                            ("backoff", OverCeiling::Backoff),
                        ],
                    )?);
                }
                "replayBodyCap" => o.replay_body_cap = Some(number(k, value)?),
                "holdbackCap" => o.holdback_cap = Some(number(k, value)?),
                "evidenceCap" => o.evidence_cap = Some(number(k, value)?),
                "maxResumes" => o.max_resumes = Some(uint(k, value)?),
                "endpoint" => {
                    o.endpoint = Some(variant(
                        k,
                        value,
                        &[("remote", Endpoint::Remote), ("local", Endpoint::Local)],
                    )?);
                }
                "protocol" => o.protocol = Some(string(k, value)?.to_owned()),
                "sseTerminal" => {
                    let mut t = SseTerminalJson {
                        data: None,
                        event: None,
                    };
                    for (name, v) in object(k, value)? {
                        let slot = match name.as_str() {
                            "data" => &mut t.data,
                            "event" => &mut t.event,
                            other => return Err(unknown(other)),
                        };
                        *slot = present(v)
                            .map(|v| string(name, v).map(str::to_owned))
                            .transpose()?;
                    }
                    o.sse_terminal = Some(t);
                }
                "admissionHook" => o.admission_hook = Some(boolean(k, value)?),
                "resumableSse" => o.resumable_sse = Some(boolean(k, value)?),
                "continuationHook" => o.continuation_hook = Some(boolean(k, value)?),
                other => return Err(unknown(other)),
            }
        }
        Ok(o)
    }
}

fn boolean(field: &str, v: &OptionValue) -> Result<bool, OptionsError> {
    match v {
        OptionValue::Bool(b) => Ok(*b),
        other => Err(shape(field, "a boolean", other)),
    }
}

/// Whether `key` is an option name (a `null` for it keeps the default).
fn is_known(key: &str) -> bool {
    matches!(
        key,
        "maxAttempts"
            | "backoffBaseMs"
            | "backoffCeilingMs"
            | "retryableStatuses"
            | "retryableCategories"
            | "retryAfterCeilingMs"
            | "overCeiling"
            | "replayBodyCap"
            | "holdbackCap"
            | "evidenceCap"
            | "maxResumes"
            | "endpoint"
            | "protocol"
            | "sseTerminal"
            | "admissionHook"
            | "resumableSse"
            | "continuationHook"
    )
}

fn read_retry_budget(v: &OptionValue) -> Result<RetryBudgetJson, OptionsError> {
    let mut rb = RetryBudgetJson::default();
    for (name, value) in object("retryBudget", v)? {
        let Some(value) = present(value) else {
            continue;
        };
        match name.as_str() {
            "ttlMs" => rb.ttl_ms = Some(number(name, value)?),
            "minRetriesPerSec" => rb.min_retries_per_sec = Some(uint(name, value)?),
            "percent" => rb.percent = Some(number(name, value)?),
            other => return Err(unknown(other)),
        }
    }
    Ok(rb)
}

/// A key that may be absent (keep the default), `null` (none) or a value.
#[derive(Debug, Clone, Default)]
enum Nullable<T> {
    #[default]
    Absent,
    Null,
    Value(T),
}

impl<T> Nullable<T> {
    /// `None` when absent, else `Some(None | Some(value))` after `f`.
    #[allow(clippy::option_option)]
    fn map<U, E>(self, f: impl FnOnce(T) -> Result<U, E>) -> Result<Option<Option<U>>, E> {
        Ok(match self {
            Nullable::Absent => None,
            Nullable::Null => Some(None),
            Nullable::Value(v) => Some(Some(f(v)?)),
        })
    }
}

/// Validated settings of one `createRecoveringFetch` instance.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The policy every request of this instance runs under.
    pub policy: RecoveryPolicy,
    /// Which protocol the bodies speak.
    pub protocol: ProtocolChoice,
    /// The cross-request retry budget, if enabled.
    pub retry_budget: Option<RetryBudgetConfig>,
    /// Whether an admission hook is installed.
    pub admission_hook: bool,
    /// Whether the endpoint is declared an SSE server that honours
    /// `Last-Event-ID`.
    pub resumable_sse: bool,
    /// Whether a continuation hook is installed.
    pub continuation_hook: bool,
}

/// `n` as Rust's `{}` prints an `f64` (`1000000000000000000000`,
/// `0.0000001`, `inf`, `NaN`: never an exponent). On wasm the digits come
/// from JS's `String(n)`, which picks the same shortest round-trip digits,
/// so the module links no float formatting.
pub fn number_text(n: f64) -> String {
    #[cfg(target_arch = "wasm32")]
    {
        let js: String = js_sys::Number::from(n)
            .to_string_with_radix(10)
            .map(String::from)
            .unwrap_or_default();
        rust_layout(n, &js)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        n.to_string()
    }
}

/// Lays out JS's text of `n` (`js`, e.g. `1.5e+21`, `1e-7`, `123.45`) the
/// way Rust's `Display` for `f64` does.
///
/// Both print the shortest digits that read back as `n`; when two such
/// digit strings are equally close (an exact tie), JS takes the even one and
/// Rust the one above, so a tie is moved up here.
pub fn rust_layout(n: f64, js: &str) -> String {
    if n.is_nan() {
        return "NaN".into();
    }
    if n.is_infinite() {
        return if n > 0.0 { "inf" } else { "-inf" }.into();
    }
    let mut out = String::new();
    if n.is_sign_negative() {
        out.push('-');
    }
    if n == 0.0 {
        out.push('0');
        return out;
    }
    let text = js.trim_start_matches('-');
    let (mantissa, exp) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.trim_start_matches('+').parse::<i32>().unwrap_or(0)),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    // The value is 0.DIGITS × 10^point.
    let mut point = i32::try_from(int.len()).unwrap_or(i32::MAX) + exp;
    while digits.first() == Some(&b'0') {
        digits.remove(0);
        point -= 1;
    }
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    let len = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    if digits.last().is_some_and(|d| d % 2 == 0) && is_tie_above(n, &digits, point - len) {
        let mut at = digits.len();
        loop {
            if at == 0 {
                digits.insert(0, b'1');
                point += 1;
                break;
            }
            at -= 1;
            if digits[at] == b'9' {
                digits[at] = b'0';
            } else {
                digits[at] += 1;
                break;
            }
        }
        while digits.last() == Some(&b'0') {
            digits.pop();
        }
    }
    let digits = String::from_utf8(digits).unwrap_or_default();
    if point <= 0 {
        out.push_str("0.");
        for _ in 0..-point {
            out.push('0');
        }
        out.push_str(&digits);
    } else if point as usize >= digits.len() {
        out.push_str(&digits);
        for _ in digits.len()..point as usize {
            out.push('0');
        }
    } else {
        let (a, b) = digits.split_at(point as usize);
        out.push_str(a);
        out.push('.');
        out.push_str(b);
    }
    out
}

/// Whether `|n|` lies exactly halfway between `digits × 10^q` and the next
/// number of as many digits: `|n| = (2·digits + 1) · 5^q · 2^(q−1)`. With
/// `|n| = m · 2^e` (`m` odd) that is `e = q − 1` and `m · 5^−q = 2·digits + 1`
/// (`q < 0`) or `m = (2·digits + 1) · 5^q` (`q ≥ 0`); integer arithmetic.
fn is_tie_above(n: f64, digits: &[u8], q: i32) -> bool {
    let bits = n.abs().to_bits();
    let (raw_exp, frac) = ((bits >> 52) as i32, bits & ((1 << 52) - 1));
    let (m, e) = if raw_exp == 0 {
        (frac, -1074)
    } else {
        (frac | (1 << 52), raw_exp - 1075)
    };
    let shift = m.trailing_zeros();
    let (m, e) = (m >> shift, e + i32::try_from(shift).unwrap_or(0));
    // Shortest digits are at most 17: `2·digits + 1` fits in a u64.
    if e != q - 1 || digits.len() > 17 {
        return false;
    }
    let twice = digits
        .iter()
        .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'))
        * 2
        + 1;
    let five = 5u64.checked_pow(q.unsigned_abs());
    if q < 0 {
        five.and_then(|p| m.checked_mul(p)) == Some(twice)
    } else {
        five.and_then(|p| twice.checked_mul(p)) == Some(m)
    }
}

/// Largest millisecond value accepted for a duration (about 285 years).
const MAX_MS: f64 = 9.0e12;

fn millis(field: &'static str, ms: f64) -> Result<Duration, OptionsError> {
    if !ms.is_finite() || !(0.0..=MAX_MS).contains(&ms) {
        return Err(OptionsError::Range {
            field,
            reason: format!(
                "{} is not a duration in milliseconds (0 to {})",
                number_text(ms),
                number_text(MAX_MS)
            ),
        });
    }
    Ok(Duration::from_micros((ms * 1000.0).round() as u64))
}

fn positive_millis(field: &'static str, ms: f64) -> Result<Duration, OptionsError> {
    let d = millis(field, ms)?;
    if d.is_zero() {
        return Err(OptionsError::Range {
            field,
            reason: "must be greater than zero".into(),
        });
    }
    Ok(d)
}

fn bytes(field: &'static str, n: f64) -> Result<usize, OptionsError> {
    if !n.is_finite() || n.fract() != 0.0 || !(0.0..=4_294_967_295.0).contains(&n) {
        return Err(OptionsError::Range {
            field,
            reason: format!(
                "{} is not a whole number of bytes (0 to 2^32-1)",
                number_text(n)
            ),
        });
    }
    Ok(n as usize)
}

/// `None`: keep the default; `Some(None)`: none; `Some(Some(d))`: `d`.
#[allow(clippy::option_option)]
fn opt_millis(
    field: &'static str,
    v: Nullable<f64>,
) -> Result<Option<Option<Duration>>, OptionsError> {
    v.map(|ms| positive_millis(field, ms))
}

/// Parses the protocol name, `auto`, or fails naming the field.
pub fn parse_protocol(
    name: &str,
    terminal: Option<SseTerminal>,
) -> Result<ProtocolChoice, OptionsError> {
    if name.trim().eq_ignore_ascii_case("auto") {
        return Ok(ProtocolChoice::Auto);
    }
    let kind: ProtocolKind = name.parse().map_err(|_| OptionsError::Range {
        field: "protocol",
        reason: format!(
            "unknown protocol {name:?} (auto, openai-chat, openai-responses, anthropic, gemini, ollama, sse)"
        ),
    })?;
    Ok(ProtocolChoice::Fixed(match kind {
        ProtocolKind::Sse { .. } => ProtocolKind::Sse {
            terminal_sentinel: terminal,
        },
        other => other,
    }))
}

impl Settings {
    /// Validates the JSON text of the options (native tests; the wasm
    /// build reads the JS object directly with [`Settings::from_value`]).
    #[cfg(not(target_arch = "wasm32"))]
    pub fn from_json(json: &str) -> Result<Settings, OptionsError> {
        fn convert(v: serde_json::Value) -> OptionValue {
            match v {
                serde_json::Value::Null => OptionValue::Null,
                serde_json::Value::Bool(b) => OptionValue::Bool(b),
                serde_json::Value::Number(n) => OptionValue::Number(n.as_f64().unwrap_or(f64::NAN)),
                serde_json::Value::String(s) => OptionValue::String(s),
                serde_json::Value::Array(a) => {
                    OptionValue::Array(a.into_iter().map(convert).collect())
                }
                serde_json::Value::Object(o) => {
                    OptionValue::Object(o.into_iter().map(|(k, v)| (k, convert(v))).collect())
                }
            }
        }
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| OptionsError::Shape(e.to_string()))?;
        Settings::from_value(&convert(v))
    }

    /// Validates the options.
    pub fn from_value(value: &OptionValue) -> Result<Settings, OptionsError> {
        let o = OptionsJson::read(value)?;
        let mut b = RecoveryPolicy::builder();
        if let Some(n) = o.max_attempts {
            let n = NonZeroU32::new(n).ok_or(OptionsError::Range {
                field: "maxAttempts",
                reason: "must be at least 1 (the first send counts)".into(),
            })?;
            b = b.max_attempts(n);
        }
        if o.backoff_base_ms.is_some() || o.backoff_ceiling_ms.is_some() {
            let defaults = RecoveryPolicy::default();
            let base = o
                .backoff_base_ms
                .map(|ms| positive_millis("backoffBaseMs", ms))
                .transpose()?
                .unwrap_or(defaults.backoff_base());
            let ceiling = o
                .backoff_ceiling_ms
                .map(|ms| positive_millis("backoffCeilingMs", ms))
                .transpose()?
                .unwrap_or(defaults.backoff_ceiling().max(base));
            b = b.backoff(base, ceiling);
        }
        if let Some(budget) = opt_millis("budgetMs", o.budget_ms)? {
            b = b.budget(budget);
        }
        if let Some(deadline) = opt_millis("deadlineMs", o.deadline_ms)? {
            b = b.deadline(deadline);
        }
        if let Some(statuses) = o.retryable_statuses {
            b = b.retryable_statuses(statuses);
        }
        if let Some(categories) = o.retryable_categories {
            b = b.retryable_categories(categories);
        }
        if o.retry_after_ceiling_ms.is_some() || o.over_ceiling.is_some() {
            let defaults = RecoveryPolicy::default();
            let ceiling = o
                .retry_after_ceiling_ms
                .map(|ms| millis("retryAfterCeilingMs", ms))
                .transpose()?
                .unwrap_or(defaults.retry_after_ceiling());
            b = b.retry_after_ceiling(ceiling, o.over_ceiling.unwrap_or_default());
        }
        if let Some(n) = o.replay_body_cap {
            b = b.replay_body_cap(bytes("replayBodyCap", n)?);
        }
        if let Some(n) = o.holdback_cap {
            b = b.holdback_cap(bytes("holdbackCap", n)?);
        }
        if let Some(n) = o.evidence_cap {
            b = b.evidence_cap(bytes("evidenceCap", n)?);
        }
        if let Some(n) = o.max_resumes {
            b = b.max_resumes(n);
        }
        if let Some(e) = o.endpoint {
            b = b.endpoint(e);
        }
        if let Some(t) = opt_millis("idleTimeoutMs", o.idle_timeout_ms)? {
            b = b.idle_timeout(t);
        }
        if let Some(t) = opt_millis("progressTimeoutMs", o.progress_timeout_ms)? {
            b = b.progress_timeout(t);
        }
        if let Some(t) = opt_millis("headTimeoutMs", o.head_timeout_ms)? {
            b = b.head_timeout(t);
        }
        let policy = b.build().map_err(OptionsError::Policy)?;
        let terminal = match o.sse_terminal {
            None => None,
            Some(SseTerminalJson {
                data: Some(d),
                event: None,
            }) => Some(SseTerminal::Data(d)),
            Some(SseTerminalJson {
                data: None,
                event: Some(e),
            }) => Some(SseTerminal::Event(e)),
            Some(_) => {
                return Err(OptionsError::Range {
                    field: "sseTerminal",
                    reason: "give exactly one of `data` or `event`".into(),
                });
            }
        };
        let protocol = match o.protocol.as_deref() {
            None => ProtocolChoice::Auto,
            Some(name) => parse_protocol(name, terminal.clone())?,
        };
        if terminal.is_some()
            && !matches!(protocol, ProtocolChoice::Fixed(ProtocolKind::Sse { .. }))
        {
            return Err(OptionsError::Range {
                field: "sseTerminal",
                reason: "only applies with protocol \"sse\"".into(),
            });
        }
        let retry_budget = match o.retry_budget {
            Nullable::Absent | Nullable::Null => None,
            Nullable::Value(rb) => {
                let defaults = RetryBudgetConfig::default();
                let percent = rb.percent.unwrap_or(defaults.percent);
                if !percent.is_finite() || !(0.0..=10.0).contains(&percent) {
                    return Err(OptionsError::Range {
                        field: "retryBudget.percent",
                        reason: format!(
                            "{} is not a fraction between 0 and 10",
                            number_text(percent)
                        ),
                    });
                }
                let ttl = rb
                    .ttl_ms
                    .map(|ms| millis("retryBudget.ttlMs", ms))
                    .transpose()?
                    .unwrap_or(defaults.ttl);
                if !(Duration::from_secs(1)..=Duration::from_mins(1)).contains(&ttl) {
                    return Err(OptionsError::Range {
                        field: "retryBudget.ttlMs",
                        reason: "must be between 1000 and 60000".into(),
                    });
                }
                Some(RetryBudgetConfig::new(
                    ttl,
                    rb.min_retries_per_sec
                        .unwrap_or(defaults.min_retries_per_sec),
                    percent,
                ))
            }
        };
        Ok(Settings {
            policy,
            protocol,
            retry_budget,
            admission_hook: o.admission_hook.unwrap_or(false),
            resumable_sse: o.resumable_sse.unwrap_or(false),
            continuation_hook: o.continuation_hook.unwrap_or(false),
        })
    }
}

/// Largest delay a JS timer honours: browsers store it as a signed 32-bit
/// integer and fire at once above it; Node warns and uses 1 ms.
pub const MAX_TIMER_MS: u32 = (1 << 31) - 1;

/// A delay as whole milliseconds for `setTimeout`: rounded up (never wake
/// before the engine's delay) and clamped to [`MAX_TIMER_MS`].
pub fn timer_millis(d: Duration) -> u32 {
    let ms = d.as_micros().div_ceil(1000);
    u32::try_from(ms).map_or(MAX_TIMER_MS, |ms| ms.min(MAX_TIMER_MS))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn empty_options_are_the_policy_defaults() {
        let s = Settings::from_json("{}").unwrap();
        assert_eq!(s.policy, RecoveryPolicy::default());
        assert_eq!(s.protocol, ProtocolChoice::Auto);
        assert!(s.retry_budget.is_none());
        assert!(!s.admission_hook);
    }

    #[test]
    fn every_knob_maps_onto_the_builder() {
        let s = Settings::from_json(
            r#"{"maxAttempts":5,"backoffBaseMs":100,"backoffCeilingMs":2000,"budgetMs":null,
                "deadlineMs":30000,"retryableStatuses":[503,429],"retryableCategories":["transport","http"],
                "retryAfterCeilingMs":5000,"overCeiling":"backoff","replayBodyCap":1024,"holdbackCap":2048,
                "evidenceCap":512,"maxResumes":0,"endpoint":"local","idleTimeoutMs":1500,
                "progressTimeoutMs":null,"headTimeoutMs":900,"protocol":"anthropic",
                "retryBudget":{"ttlMs":5000,"minRetriesPerSec":2,"percent":0.2},"admissionHook":true}"#,
        )
        .unwrap();
        let p = &s.policy;
        assert_eq!(p.max_attempts().get(), 5);
        assert_eq!(p.backoff_base(), Duration::from_millis(100));
        assert_eq!(p.backoff_ceiling(), Duration::from_secs(2));
        assert_eq!(p.budget(), None);
        assert_eq!(p.deadline(), Some(Duration::from_secs(30)));
        assert_eq!(p.retryable_statuses(), &[429, 503]);
        assert!(p.categories().transport && p.categories().http);
        assert!(!p.categories().client_timeout && !p.categories().provider_response);
        assert_eq!(p.retry_after_ceiling(), Duration::from_secs(5));
        assert_eq!(p.over_ceiling(), OverCeiling::Backoff);
        assert_eq!(p.replay_body_cap(), 1024);
        assert_eq!(p.holdback_cap(), 2048);
        assert_eq!(p.evidence_cap(), 512);
        assert_eq!(p.max_resumes(), 0);
        assert_eq!(p.endpoint(), Endpoint::Local);
        assert_eq!(p.idle_timeout(), Some(Duration::from_millis(1500)));
        assert_eq!(p.progress_timeout(), None);
        assert_eq!(p.head_timeout(), Some(Duration::from_millis(900)));
        assert_eq!(s.protocol, ProtocolChoice::Fixed(ProtocolKind::Anthropic));
        let rb = s.retry_budget.unwrap();
        assert_eq!(rb.ttl, Duration::from_secs(5));
        assert_eq!(rb.min_retries_per_sec, 2);
        assert!((rb.percent - 0.2).abs() < 1e-12);
        assert!(s.admission_hook);
    }

    #[test]
    fn bad_input_is_a_typed_error_naming_the_field() {
        let cases: &[(&str, &str)] = &[
            (r#"{"maxAttempts":0}"#, "maxAttempts"),
            (r#"{"backoffBaseMs":-1}"#, "backoffBaseMs"),
            (r#"{"backoffBaseMs":0}"#, "backoffBaseMs"),
            (r#"{"headTimeoutMs":0}"#, "headTimeoutMs"),
            (r#"{"holdbackCap":1.5}"#, "holdbackCap"),
            (r#"{"protocol":"smtp"}"#, "protocol"),
            (r#"{"sseTerminal":{"data":"[DONE]"}}"#, "sseTerminal"),
            (r#"{"retryBudget":{"percent":11}}"#, "retryBudget.percent"),
            (r#"{"retryBudget":{"ttlMs":100}}"#, "retryBudget.ttlMs"),
        ];
        for (json, field) in cases {
            match Settings::from_json(json) {
                Err(OptionsError::Range { field: f, .. }) => assert_eq!(f, *field, "{json}"),
                other => panic!("{json}: {other:?}"),
            }
        }
        for json in [
            r#"{"maxAttempt":3}"#,
            r#"{"maxAttempts":"3"}"#,
            r#"{"retryableCategories":["protocoll"]}"#,
            "[]",
            "nope",
        ] {
            let e = Settings::from_json(json).unwrap_err();
            assert!(matches!(e, OptionsError::Shape(_)), "{json}: {e:?}");
            assert!(!e.is_range());
        }
        assert_eq!(
            Settings::from_json(r#"{"retryableStatuses":[401]}"#).unwrap_err(),
            OptionsError::Policy(PolicyError::InvalidStatus(401))
        );
        assert_eq!(
            Settings::from_json(r#"{"backoffBaseMs":2000,"backoffCeilingMs":1000}"#).unwrap_err(),
            OptionsError::Policy(PolicyError::CeilingBelowBase)
        );
        assert!(Settings::from_json(r#"{"retryableCategories":["protocol"]}"#).is_err());
    }

    #[test]
    fn sse_terminal_goes_with_the_generic_protocol() {
        let s = Settings::from_json(r#"{"protocol":"sse","sseTerminal":{"event":"end"}}"#).unwrap();
        assert_eq!(
            s.protocol,
            ProtocolChoice::Fixed(ProtocolKind::Sse {
                terminal_sentinel: Some(SseTerminal::Event("end".into()))
            })
        );
        assert!(Settings::from_json(r#"{"protocol":"sse","sseTerminal":{}}"#).is_err());
    }

    #[test]
    fn resume_and_continuation_options() {
        let s = Settings::from_json(r#"{"resumableSse":true,"continuationHook":true}"#).unwrap();
        assert!(s.resumable_sse && s.continuation_hook);
        let d = Settings::from_json("{}").unwrap();
        assert!(!d.resumable_sse && !d.continuation_hook);
        assert!(Settings::from_json(r#"{"resumableSse":"yes"}"#).is_err());
    }

    /// `Number.prototype.toString` of `x`, from Rust's shortest digits.
    fn js_text(x: f64) -> String {
        let exp_form = format!("{:e}", x.abs());
        let (mantissa, exp) = exp_form.split_once('e').unwrap();
        let exp: i32 = exp.parse().unwrap();
        let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
        let len = i32::try_from(digits.len()).unwrap();
        let point = exp + 1;
        let body = if len <= point && point <= 21 {
            format!("{digits}{}", "0".repeat((point - len) as usize))
        } else if 0 < point && point <= 21 {
            let (a, b) = digits.split_at(point as usize);
            format!("{a}.{b}")
        } else if -6 < point && point <= 0 {
            format!("0.{}{digits}", "0".repeat((-point) as usize))
        } else {
            let sign = if point - 1 < 0 { '-' } else { '+' };
            let lead = if len == 1 {
                digits.clone()
            } else {
                format!("{}.{}", &digits[..1], &digits[1..])
            };
            format!("{lead}e{sign}{}", (point - 1).abs())
        };
        if x < 0.0 { format!("-{body}") } else { body }
    }

    #[test]
    fn numbers_print_as_rust_prints_them() {
        let values = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            1.5,
            -2.25,
            0.1,
            0.3,
            100.0,
            9.0e12,
            1e21,
            1.5e21,
            1e22,
            1e300,
            -1e300,
            1e-6,
            1e-7,
            1.5e-7,
            1.2345e-10,
            5e-324,
            123_456.789,
            4_294_967_295.0,
            f64::MAX,
            f64::MIN_POSITIVE,
            0.000_123,
            12_345_678_901_234_567_890.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        for x in values {
            let js = if x.is_nan() {
                "NaN".to_owned()
            } else if x.is_infinite() {
                if x > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
            } else {
                js_text(x)
            };
            assert_eq!(rust_layout(x, &js), x.to_string(), "{x:e} as {js}");
        }
        assert_eq!(js_text(1e21), "1e+21");
        assert_eq!(js_text(1.5e-7), "1.5e-7");
        assert_eq!(js_text(123.45), "123.45");
        assert_eq!(js_text(0.001), "0.001");
        assert_eq!(number_text(-1.0), "-1");
    }

    #[test]
    fn timer_delays_round_up_and_clamp() {
        assert_eq!(timer_millis(Duration::ZERO), 0);
        assert_eq!(timer_millis(Duration::from_micros(1)), 1);
        assert_eq!(timer_millis(Duration::from_micros(1500)), 2);
        assert_eq!(timer_millis(Duration::from_millis(250)), 250);
        assert_eq!(
            timer_millis(Duration::from_millis(u64::from(MAX_TIMER_MS))),
            MAX_TIMER_MS
        );
        assert_eq!(
            timer_millis(Duration::from_millis(u64::from(MAX_TIMER_MS) + 1)),
            MAX_TIMER_MS
        );
        assert_eq!(timer_millis(Duration::from_secs(u64::MAX)), MAX_TIMER_MS);
    }
}

#[cfg(all(test, target_arch = "wasm32"))]
mod wasm_tests {
    use wasm_bindgen_test::wasm_bindgen_test;

    use super::number_text;

    #[wasm_bindgen_test]
    fn numbers_from_js_digits_print_as_rust_prints_them() {
        let mut values = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            1.5,
            0.1,
            0.3,
            100.0,
            9.0e12,
            1e21,
            1.5e21,
            1e300,
            -1e-7,
            5e-324,
            123_456.789,
            4_294_967_295.0,
            f64::MAX,
            f64::MIN_POSITIVE,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -1_149_636_667_324_797.2,
        ];
        // Exact ties between two shortest digit strings: quarters and halves
        // where the spacing of doubles is a quarter or a half, and large
        // integers.
        for k in 0..400u64 {
            let base = (1u64 << 50) + k * 977_777;
            values.push(base as f64 + 0.25);
            values.push(base as f64 + 0.75);
            values.push((base << 1) as f64 + 0.5);
            values.push(((base << 3) + k) as f64);
            values.push(((base << 14) + k * 3) as f64);
        }
        for k in 1..=64 {
            values.push(2f64.powi(k) + 0.5);
            values.push(2f64.powi(-k));
            values.push(5f64.powi(k % 23) * 2f64.powi(k));
        }
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if v.is_finite() {
                values.push(v);
            }
        }
        for v in values {
            assert_eq!(number_text(v), v.to_string(), "{v:e}");
        }
    }
}
