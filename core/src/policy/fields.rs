//! The policy's knobs as a table: one row per knob, read by every front end.
//!
//! The gateway's `[policy]`, `recover`'s flags, the npm options, the Python
//! keywords and the conformance vectors all name the same knobs with the
//! same units and rules; the rows below are where those names, units,
//! defaults and rules are written once. A front end generates its options
//! from [`FIELDS`] (`recover --help` prints it) or is held equal to it by a
//! test (the npm shell's option list, the Python keywords).

use std::fmt;

use super::PolicyError;
use super::value::Value;

/// How a knob's value is written. Not `non_exhaustive`: a new unit is one
/// every front end must learn to read, so a `match` on it should stop
/// compiling until it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Whole milliseconds, up to [`MAX_MS`].
    Ms,
    /// A whole number of sends or resumes, up to `u32::MAX`.
    Count,
    /// A whole number of bytes.
    Bytes,
    /// `true` or `false`.
    Bool,
    /// A list: of HTTP statuses when the row has no choices, else of its
    /// choices.
    List,
    /// One of the row's choices.
    Choice,
}

impl Unit {
    /// Its name in the table (`ms`, `count`, `bytes`, `bool`, `list`,
    /// `choice`), as the npm shell's option list writes it.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Ms => "ms",
            Unit::Count => "count",
            Unit::Bytes => "bytes",
            Unit::Bool => "bool",
            Unit::List => "list",
            Unit::Choice => "choice",
        }
    }
}

/// The longest duration a knob may name: about 285 years. Past it a
/// deadline would no longer fit the clocks of every front end (a JS
/// number's exact integers, Python's event loops).
pub const MAX_MS: u64 = 9_000_000_000_000;

/// One knob of the policy.
#[derive(Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Field {
    /// Its name: the TOML and JSON key, the Python keyword; `recover`'s flag
    /// with dashes, the npm option in camelCase.
    pub name: &'static str,
    /// How its value is written.
    pub unit: Unit,
    /// The default, written as `recover` takes it (lists comma-separated).
    pub default: &'static str,
    /// Whether `"off"` turns it off.
    pub can_be_off: bool,
    /// Whether 0 is refused (a duration, a count or a cap that 0 would
    /// make meaningless); where it is allowed the doc says what it means.
    pub refuses_zero: bool,
    /// The names a [`Unit::Choice`] or a list of names takes.
    pub choices: &'static [&'static str],
}

const fn row(
    name: &'static str,
    unit: Unit,
    default: &'static str,
    can_be_off: bool,
    refuses_zero: bool,
) -> Field {
    Field {
        name,
        unit,
        default,
        can_be_off,
        refuses_zero,
        choices: &[],
    }
}

const fn choice(
    name: &'static str,
    unit: Unit,
    default: &'static str,
    choices: &'static [&'static str],
) -> Field {
    Field {
        name,
        unit,
        default,
        can_be_off: false,
        refuses_zero: false,
        choices,
    }
}

/// The knobs, one row each (name, unit, default, whether `"off"` turns it
/// off, whether 0 is refused) with its line of doc: the rows become
/// [`FIELDS`], the docs a table of their own by the same order, read
/// through [`Field::doc`] (so a module that never shows them, the wasm
/// one, does not carry them).
macro_rules! knobs {
    ($($row:expr => $doc:literal,)*) => {
        /// Every knob of [`RecoveryPolicy`](super::RecoveryPolicy), in the
        /// order front ends list them. Adding a knob is one row here and
        /// its rule in [`PolicySpec::build`](super::PolicySpec::build) and
        /// [`PolicySpec::from_policy`](super::PolicySpec::from_policy).
        pub const FIELDS: &[Field] = &[$($row),*];
        const DOCS: &[&str] = &[$($doc),*];
    };
}

#[rustfmt::skip]
knobs! {
    //  name                         unit         default     off    no 0
    row("max_attempts",              Unit::Count, "3",        false, true)
        => "physical sends, the first included",
    row("attempts_per_target",       Unit::Count, "1",        false, true)
        => "sends a target gets before a request with alternates moves on",
    row("max_resumes",               Unit::Count, "1",        false, false)
        => "resumes of a committed answer, each also a send; 0: none",
    row("budget_ms",                 Unit::Ms,    "60000",    true,  true)
        => "time for recovery, from the first failure",
    row("deadline_ms",               Unit::Ms,    "off",      true,  true)
        => "time for the whole request, from its start",
    row("backoff_base_ms",           Unit::Ms,    "500",      false, true)
        => "bound of the first retry's full-jitter wait, doubling per retry",
    row("backoff_ceiling_ms",        Unit::Ms,    "8000",     false, true)
        => "largest full-jitter bound; left out, the default or the base if larger",
    row("retry_after_ceiling_ms",    Unit::Ms,    "60000",    false, false)
        => "longest Retry-After honoured; 0: any wait asked is above it",
    choice("over_ceiling",           Unit::Choice, "refuse",  &["refuse", "backoff"])
        => "above that ceiling: refuse (fail with the wait asked) or backoff (ignore it)",
    row("head_timeout_ms",           Unit::Ms,    "300000",   true,  true)
        => "from a send to its response head (a whole answer's: the longer of this and progress_timeout_ms)",
    row("idle_timeout_ms",           Unit::Ms,    "600000",   true,  true)
        => "a body silent this long has stalled",
    row("progress_timeout_ms",       Unit::Ms,    "600000",   true,  true)
        => "no output this long, keepalives aside, has stalled",
    row("first_token_timeout_ms",    Unit::Ms,    "off",      true,  true)
        => "from a streamed head to its first token, before any output: past it the next send goes on",
    row("hedge_after_ms",            Unit::Ms,    "off",      true,  true)
        => "no token this long after a send, before any output: a second send races it",
    row("max_hedges",                Unit::Count, "1",        false, true)
        => "hedges a request may start in all",
    row("retryable_statuses",        Unit::List,  "408,429,500,502,503,504,529", false, false)
        => "statuses a retry is allowed for (408, 409, 429 and 5xx only)",
    choice("retryable_categories",   Unit::List,
        "transport,http,client_timeout,provider_response",
        &["transport", "http", "client_timeout", "provider_response"])
        => "failure categories a retry is allowed for",
    choice("endpoint",               Unit::Choice, "remote",  &["remote", "local"])
        => "local: a resend that may overlap inference needs the admission hook",
    row("replay_body_cap",           Unit::Bytes, "67108864", false, false)
        => "largest request body kept for a replay; 0: no body is replayed",
    row("holdback_cap",              Unit::Bytes, "1048576",  false, true)
        => "largest prefix held back before the first token commits the answer",
    row("evidence_cap",              Unit::Bytes, "16384",    false, false)
        => "largest evidence kept for inspection; 0: none",
    row("max_event_bytes",           Unit::Bytes, "33554432", false, true)
        => "largest line, event or whole JSON answer read; past it the answer breaks its protocol",
    row("idempotency_key",           Unit::Bool,  "false",    false, false)
        => "one Idempotency-Key on every send, replay and resume of a request",
    row("retry_protocol_violations", Unit::Bool,  "false",    false, false)
        => "replay a stream that breaks its protocol before any output, as a reset",
}

/// The knob named `name` (its TOML, JSON and Python name).
pub fn field(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name)
}

/// The knob whose npm option is `name` (camelCase).
pub fn field_by_camel_case(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.camel_case() == name)
}

impl Field {
    /// What it does, in one line.
    pub fn doc(&self) -> &'static str {
        FIELDS
            .iter()
            .position(|f| f.name == self.name)
            .and_then(|i| DOCS.get(i))
            .copied()
            .unwrap_or("")
    }

    /// Its npm option name: `idle_timeout_ms` is `idleTimeoutMs`.
    pub fn camel_case(&self) -> String {
        let mut out = String::with_capacity(self.name.len());
        let mut upper = false;
        for c in self.name.chars() {
            if c == '_' {
                upper = true;
            } else if upper {
                out.push(c.to_ascii_uppercase());
                upper = false;
            } else {
                out.push(c);
            }
        }
        out
    }

    /// `recover`'s flag for it: `idle_timeout_ms` is `--idle-timeout-ms`.
    pub fn flag(&self) -> String {
        format!("--{}", self.name.replace('_', "-"))
    }

    /// Reads `text` as a value of this knob the way `recover` writes it:
    /// `off`, `true`, `false`, digits, a name; for a list, its items
    /// comma-separated (none: empty text). What it cannot be is kept as
    /// written, for [`Field::check`] to refuse with this knob's words.
    pub fn parse(&self, text: &str) -> Value {
        if self.unit != Unit::List {
            return Value::from_text(text);
        }
        if text.trim().is_empty() {
            return Value::List(Vec::new());
        }
        Value::List(
            text.split(',')
                .map(|item| Value::from_text(item.trim()))
                .collect(),
        )
    }

    /// `value` if it is one this knob takes (`"off"` written as a name
    /// becomes [`Value::Off`]); 0 is left for
    /// [`PolicySpec::build`](super::PolicySpec::build) to refuse, so that
    /// every front end refuses it with the same error.
    pub fn check(&'static self, value: Value) -> Result<Value, PolicyError> {
        let fits = match (self.unit, &value) {
            (Unit::Ms, Value::Off) if self.can_be_off => true,
            (Unit::Ms, Value::Name(n)) if self.can_be_off && n == "off" => {
                return Ok(Value::Off);
            }
            (Unit::Ms, Value::Number(n)) => *n <= MAX_MS,
            (Unit::Count, Value::Number(n)) => u32::try_from(*n).is_ok(),
            (Unit::Bytes, Value::Number(_)) | (Unit::Bool, Value::Bool(_)) => true,
            (Unit::Choice, Value::Name(n)) => self.choices.contains(&n.as_str()),
            (Unit::List, Value::List(items)) => items.iter().all(|item| match item {
                Value::Number(s) if self.choices.is_empty() => u16::try_from(*s).is_ok(),
                Value::Name(n) => self.choices.contains(&n.as_str()),
                _ => false,
            }),
            _ => false,
        };
        match value {
            _ if !fits => Err(self.refusal(&value)),
            Value::List(items) => Ok(Value::List(self.as_set(items))),
            value => Ok(value),
        }
    }

    /// A list's items as the set they stand for: statuses in ascending
    /// order, names in the order of the row's choices, each once (the
    /// order and the repeats a front end wrote mean nothing).
    fn as_set(&self, mut items: Vec<Value>) -> Vec<Value> {
        let rank = |v: &Value| match v {
            Value::Number(n) => *n,
            Value::Name(n) => self.choices.iter().position(|c| c == n).unwrap_or(0) as u64,
            _ => 0,
        };
        crate::small_sort::sort_by_key(&mut items, rank);
        items.dedup();
        items
    }

    /// The error refusing `value` for this knob.
    pub(super) fn refusal(&'static self, value: &Value) -> PolicyError {
        // Written with `write!` into a string, not `format!`: the wasm
        // module then links no `alloc::fmt::format`.
        let mut got = String::new();
        let _ = fmt::Write::write_fmt(&mut got, format_args!("{value:#}"));
        PolicyError::Invalid { field: self, got }
    }

    /// What a value of this knob is, for an error that refuses one.
    pub(super) fn expected(&self) -> Expected<'_> {
        Expected(self)
    }
}

/// The words for what a knob takes (`a whole number of milliseconds up to
/// … or "off"`).
pub(super) struct Expected<'a>(&'a Field);

impl fmt::Display for Expected<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.0;
        let names = |f: &mut fmt::Formatter<'_>| {
            for (i, c) in field.choices.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                write!(f, "{sep}\"{c}\"")?;
            }
            Ok(())
        };
        match field.unit {
            Unit::Ms => {
                f.write_str("a whole number of milliseconds up to ")?;
                crate::text::write_decimal(f, MAX_MS)?;
            }
            Unit::Count => {
                f.write_str("a whole number up to ")?;
                crate::text::write_decimal(f, u32::MAX.into())?;
            }
            Unit::Bytes => f.write_str("a whole number of bytes")?,
            Unit::Bool => f.write_str("true or false")?,
            Unit::List if field.choices.is_empty() => f.write_str("a list of HTTP statuses")?,
            Unit::List => {
                f.write_str("a list of ")?;
                names(f)?;
            }
            Unit::Choice => {
                f.write_str("one of ")?;
                names(f)?;
            }
        }
        if field.can_be_off {
            f.write_str(" or \"off\"")?;
        }
        Ok(())
    }
}
