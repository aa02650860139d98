//! The policy as data: [`PolicySpec`], the one form in which every front
//! end writes a [`RecoveryPolicy`] (the gateway's `[policy]`, `recover`'s
//! flags, the npm options, the Python keywords, the conformance vectors).
//!
//! A knob left out keeps its default; `"off"` turns off a knob that can be
//! off (the budget, the deadline, the four timeouts), and nothing else
//! does: 0 is refused wherever it would mean nothing, by
//! [`PolicySpec::build`], with one error ([`PolicyError::Zero`]) whatever
//! front end it came through. The knobs, their units, defaults and rules
//! are the rows of [`FIELDS`].

use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};

pub use super::fields::{FIELDS, Field, MAX_MS, Unit, field, field_by_camel_case};
pub use super::value::Value;
use super::{Categories, Endpoint, OverCeiling, PolicyError, RecoveryPolicy};
use crate::failure::Category;

/// The index in [`FIELDS`] of the knob named `name`, found as the crate
/// compiles: a name that is no row's does not build.
macro_rules! knob {
    ($name:literal) => {
        const { index($name) }
    };
}

/// A policy as written: the knobs given, each checked against its row of
/// [`FIELDS`] when set; every knob left out keeps the policy default (an
/// empty spec is the default policy). [`PolicySpec::build`] makes the
/// policy; [`PolicySpec::from_policy`] writes one back, so a spec
/// round-trips.
///
/// Its serde form is a flat map of the knobs' names (`{"max_attempts": 5,
/// "idle_timeout_ms": "off"}`, a TOML table), and a name it does not know
/// is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySpec {
    /// The value given for each row of [`FIELDS`], in its order.
    given: Vec<Option<Value>>,
}

impl Default for PolicySpec {
    fn default() -> Self {
        PolicySpec {
            given: vec![None; FIELDS.len()],
        }
    }
}

impl PolicySpec {
    /// The empty spec: the default policy.
    pub fn new() -> Self {
        PolicySpec::default()
    }

    /// Sets the knob `name` to `value`, if its row takes it.
    pub fn set(&mut self, name: &str, value: Value) -> Result<(), PolicyError> {
        let i = row(name)?;
        self.given[i] = Some(FIELDS[i].check(value)?);
        Ok(())
    }

    /// Sets the knob `name` from `text` as `recover` takes it
    /// ([`Field::parse`]).
    pub fn set_text(&mut self, name: &str, text: &str) -> Result<(), PolicyError> {
        let i = row(name)?;
        self.given[i] = Some(FIELDS[i].check(FIELDS[i].parse(text))?);
        Ok(())
    }

    /// This spec with the knob `name` set to `value`.
    pub fn with(mut self, name: &str, value: Value) -> Result<Self, PolicyError> {
        self.set(name, value)?;
        Ok(self)
    }

    /// The value given for the knob `name`, if one was.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.given[row(name).ok()?].as_ref()
    }

    /// The knobs given, in the order of [`FIELDS`].
    pub fn iter(&self) -> impl Iterator<Item = (&'static Field, &Value)> {
        FIELDS
            .iter()
            .zip(&self.given)
            .filter_map(|(f, v)| v.as_ref().map(|v| (f, v)))
    }

    /// Whether no knob is given (the default policy).
    pub fn is_empty(&self) -> bool {
        self.given.iter().all(Option::is_none)
    }

    /// The policy these knobs describe: each knob [in force](Self::in_force).
    /// 0 for a knob whose row refuses it is [`PolicyError::Zero`]; a
    /// combination the builder refuses (a ceiling below its base, a status
    /// that can never be retried) is the builder's error.
    pub fn build(&self) -> Result<RecoveryPolicy, PolicyError> {
        let over = match self.value(knob!("over_ceiling")) {
            Value::Name(n) if n == "backoff" => OverCeiling::Backoff,
            _ => OverCeiling::Refuse,
        };
        let endpoint = match self.value(knob!("endpoint")) {
            Value::Name(n) if n == "local" => Endpoint::Local,
            _ => Endpoint::Remote,
        };
        let statuses = self.list(knob!("retryable_statuses"));
        let categories = self.list(knob!("retryable_categories"));
        RecoveryPolicy::builder()
            .max_attempts(self.count(knob!("max_attempts"))?)
            .attempts_per_target(self.count(knob!("attempts_per_target"))?)
            .max_resumes(u32::try_from(self.number(knob!("max_resumes"))?).unwrap_or(u32::MAX))
            .budget(self.bound(knob!("budget_ms"))?)
            .deadline(self.bound(knob!("deadline_ms"))?)
            .backoff(
                self.ms(knob!("backoff_base_ms"))?,
                self.ms(knob!("backoff_ceiling_ms"))?,
            )
            .retry_after_ceiling(self.ms(knob!("retry_after_ceiling_ms"))?, over)
            .head_timeout(self.bound(knob!("head_timeout_ms"))?)
            .idle_timeout(self.bound(knob!("idle_timeout_ms"))?)
            .progress_timeout(self.bound(knob!("progress_timeout_ms"))?)
            .first_token_timeout(self.bound(knob!("first_token_timeout_ms"))?)
            .hedge_after(self.bound(knob!("hedge_after_ms"))?)
            .max_hedges(self.count(knob!("max_hedges"))?)
            .retryable_statuses(statuses.iter().filter_map(|s| match s {
                Value::Number(n) => u16::try_from(*n).ok(),
                _ => None,
            }))
            .retryable_categories(categories.iter().filter_map(|c| match c {
                Value::Name(n) => category(n),
                _ => None,
            }))
            .endpoint(endpoint)
            .replay_body_cap(self.bytes(knob!("replay_body_cap"))?)
            .holdback_cap(self.bytes(knob!("holdback_cap"))?)
            .evidence_cap(self.bytes(knob!("evidence_cap"))?)
            .max_event_bytes(self.bytes(knob!("max_event_bytes"))?)
            .idempotency_key(self.on(knob!("idempotency_key")))
            .retry_protocol_violations(self.on(knob!("retry_protocol_violations")))
            .build()
    }

    /// Every knob with the value in force: the one given, else its row's
    /// default; the backoff ceiling left out is the larger of its default
    /// and the base (a base alone above the default ceiling raises the
    /// ceiling rather than failing: the base is what was asked for). For a
    /// spec that builds these are the values of
    /// `from_policy(&spec.build()?)`, read without building: what the npm
    /// package's `rfetch.policy` shows.
    pub fn in_force(&self) -> impl Iterator<Item = (&'static Field, Value)> + '_ {
        FIELDS.iter().enumerate().map(|(k, f)| (f, self.value(k)))
    }

    /// Every knob of `policy`, so that `from_policy(p).build()` is `p`
    /// again (durations in whole milliseconds: a part below one is
    /// dropped).
    pub fn from_policy(policy: &RecoveryPolicy) -> PolicySpec {
        let p = policy;
        let ms = |d: Duration| Value::Number(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let bound = |d: Option<Duration>| d.map_or(Value::Off, ms);
        let number = |n: u64| Value::Number(n);
        let bytes = |n: usize| Value::Number(n as u64);
        let name = |n: &str| Value::Name(n.to_owned());
        let Categories {
            transport,
            http,
            client_timeout,
            provider_response,
        } = p.categories();
        let categories = [
            (transport, Category::Transport),
            (http, Category::Http),
            (client_timeout, Category::ClientTimeout),
            (provider_response, Category::ProviderResponse),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, c)| name(&c.to_string()))
        .collect();
        let mut spec = PolicySpec::default();
        for (knob, value) in [
            (knob!("max_attempts"), number(p.max_attempts().get().into())),
            (
                knob!("attempts_per_target"),
                number(p.attempts_per_target().get().into()),
            ),
            (knob!("max_resumes"), number(p.max_resumes().into())),
            (knob!("budget_ms"), bound(p.budget())),
            (knob!("deadline_ms"), bound(p.deadline())),
            (knob!("backoff_base_ms"), ms(p.backoff_base())),
            (knob!("backoff_ceiling_ms"), ms(p.backoff_ceiling())),
            (knob!("retry_after_ceiling_ms"), ms(p.retry_after_ceiling())),
            (
                knob!("over_ceiling"),
                name(match p.over_ceiling() {
                    OverCeiling::Backoff => "backoff",
                    _ => "refuse",
                }),
            ),
            (knob!("head_timeout_ms"), bound(p.head_timeout())),
            (knob!("idle_timeout_ms"), bound(p.idle_timeout())),
            (knob!("progress_timeout_ms"), bound(p.progress_timeout())),
            (
                knob!("first_token_timeout_ms"),
                bound(p.first_token_timeout()),
            ),
            (knob!("hedge_after_ms"), bound(p.hedge_after())),
            (knob!("max_hedges"), number(p.max_hedges().get().into())),
            (
                knob!("retryable_statuses"),
                Value::List(
                    p.retryable_statuses()
                        .iter()
                        .map(|s| number((*s).into()))
                        .collect(),
                ),
            ),
            (knob!("retryable_categories"), Value::List(categories)),
            (
                knob!("endpoint"),
                name(match p.endpoint() {
                    Endpoint::Local => "local",
                    _ => "remote",
                }),
            ),
            (knob!("replay_body_cap"), bytes(p.replay_body_cap())),
            (knob!("holdback_cap"), bytes(p.holdback_cap())),
            (knob!("evidence_cap"), bytes(p.evidence_cap())),
            (knob!("max_event_bytes"), bytes(p.max_event_bytes())),
            (knob!("idempotency_key"), Value::Bool(p.idempotency_key())),
            (
                knob!("retry_protocol_violations"),
                Value::Bool(p.retry_protocol_violations()),
            ),
        ] {
            spec.given[knob] = Some(value);
        }
        spec
    }

    /// The value in force for `knob` ([`PolicySpec::in_force`]).
    fn value(&self, knob: usize) -> Value {
        let f = &FIELDS[knob];
        if let Some(v) = &self.given[knob] {
            return v.clone();
        }
        match (f.parse(f.default), knob == knob!("backoff_ceiling_ms")) {
            (Value::Number(ceiling), true) => match self.value(knob!("backoff_base_ms")) {
                Value::Number(base) => Value::Number(ceiling.max(base)),
                _ => Value::Number(ceiling),
            },
            (default, _) => default,
        }
    }

    /// The number in force for `knob`; 0 refused when its row refuses it.
    fn number(&self, knob: usize) -> Result<u64, PolicyError> {
        let f = &FIELDS[knob];
        match self.value(knob) {
            Value::Number(0) if f.refuses_zero => Err(PolicyError::Zero(f)),
            Value::Number(n) => Ok(n),
            other => Err(f.refusal(&other)),
        }
    }

    fn count(&self, knob: usize) -> Result<NonZeroU32, PolicyError> {
        let n = u32::try_from(self.number(knob)?).unwrap_or(u32::MAX);
        NonZeroU32::new(n).ok_or(PolicyError::Zero(&FIELDS[knob]))
    }

    fn bytes(&self, knob: usize) -> Result<usize, PolicyError> {
        Ok(usize::try_from(self.number(knob)?).unwrap_or(usize::MAX))
    }

    fn ms(&self, knob: usize) -> Result<Duration, PolicyError> {
        Ok(Duration::from_millis(self.number(knob)?))
    }

    /// The bound in force for `knob`: `None` when it is off.
    fn bound(&self, knob: usize) -> Result<Option<Duration>, PolicyError> {
        if matches!(self.value(knob), Value::Off) {
            return Ok(None);
        }
        self.ms(knob).map(Some)
    }

    /// Whether the flag `knob` is on.
    fn on(&self, knob: usize) -> bool {
        matches!(self.value(knob), Value::Bool(true))
    }

    /// The items in force for the list `knob`.
    fn list(&self, knob: usize) -> Vec<Value> {
        match self.value(knob) {
            Value::List(items) => items,
            _ => Vec::new(),
        }
    }
}

/// The index in [`FIELDS`] of the knob named `name`.
fn row(name: &str) -> Result<usize, PolicyError> {
    FIELDS
        .iter()
        .position(|f| f.name == name)
        .ok_or_else(|| PolicyError::UnknownKnob(name.to_owned()))
}

const fn index(name: &str) -> usize {
    let mut i = 0;
    while i < FIELDS.len() {
        if same(FIELDS[i].name.as_bytes(), name.as_bytes()) {
            return i;
        }
        i += 1;
    }
    panic!("not a knob of the policy table");
}

const fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The category a choice of `retryable_categories` names (its serde and
/// `Display` name).
fn category(name: &str) -> Option<Category> {
    Some(match name {
        "transport" => Category::Transport,
        "http" => Category::Http,
        "client_timeout" => Category::ClientTimeout,
        "provider_response" => Category::ProviderResponse,
        _ => return None,
    })
}

/// The knobs as `recover` would take them, one `name=value` per line.
impl fmt::Display for PolicySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (field, value) in self.iter() {
            writeln!(f, "{}={value}", field.name)?;
        }
        Ok(())
    }
}

impl Serialize for PolicySpec {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.iter().count()))?;
        for (field, value) in self.iter() {
            map.serialize_entry(field.name, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for PolicySpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(SpecVisitor)
    }
}

struct SpecVisitor;

impl<'de> Visitor<'de> for SpecVisitor {
    type Value = PolicySpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of policy knobs")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PolicySpec, A::Error> {
        let mut spec = PolicySpec::default();
        while let Some(key) = map.next_key::<String>()? {
            let value: Value = map.next_value()?;
            if spec.get(&key).is_some() {
                return Err(de::Error::custom(format_args!("{key}: given twice")));
            }
            spec.set(&key, value).map_err(de::Error::custom)?;
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value of `f` other than its default.
    fn other(f: &Field) -> Value {
        match f.unit {
            Unit::Ms => Value::Number(1234),
            Unit::Count => Value::Number(7),
            Unit::Bytes => Value::Number(4096),
            Unit::Bool => Value::Bool(f.default != "true"),
            Unit::Choice => {
                Value::Name((*f.choices.iter().find(|c| **c != f.default).unwrap()).into())
            }
            Unit::List if f.choices.is_empty() => Value::List(vec![Value::Number(503)]),
            Unit::List => Value::List(vec![Value::Name(f.choices[1].into())]),
        }
    }

    #[test]
    fn every_row_is_named_once_and_has_its_rule() {
        let default = RecoveryPolicy::default();
        for (i, f) in FIELDS.iter().enumerate() {
            assert!(
                FIELDS[..i].iter().all(|g| g.name != f.name),
                "{} twice",
                f.name
            );
            let spec = PolicySpec::new().with(f.name, other(f)).unwrap();
            let built = spec.build().unwrap();
            assert_ne!(built, default, "{} changes nothing", f.name);
            assert_eq!(
                PolicySpec::from_policy(&built).get(f.name),
                spec.get(f.name),
                "{} reads back",
                f.name
            );
        }
    }

    #[test]
    fn the_table_defaults_are_the_policy_defaults() {
        let spec = PolicySpec::from_policy(&RecoveryPolicy::default());
        assert_eq!(spec.iter().count(), FIELDS.len());
        for (f, v) in spec.iter() {
            assert_eq!(v.to_string(), f.default, "{}", f.name);
            assert_eq!(f.parse(f.default), *v, "{}", f.name);
        }
        assert_eq!(PolicySpec::new().build(), Ok(RecoveryPolicy::default()));
    }

    #[test]
    fn a_spec_round_trips_through_its_policy_and_json() {
        let mut spec = PolicySpec::new();
        for f in FIELDS {
            spec.set(f.name, other(f)).unwrap();
        }
        let policy = spec.build().unwrap();
        assert_eq!(PolicySpec::from_policy(&policy), spec);
        let default = RecoveryPolicy::default();
        assert_eq!(PolicySpec::from_policy(&default).build(), Ok(default));
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<PolicySpec>(&json).unwrap(), spec);
        let text = spec.to_string();
        let mut read = PolicySpec::new();
        for line in text.lines() {
            let (name, value) = line.split_once('=').unwrap();
            read.set_text(name, value).unwrap();
        }
        assert_eq!(read, spec);
    }

    #[test]
    fn off_is_for_bounds_and_zero_is_refused_with_one_error() {
        for f in FIELDS {
            let off = PolicySpec::new().with(f.name, Value::Name("off".into()));
            assert_eq!(off.is_ok(), f.can_be_off, "{}", f.name);
            if let Ok(spec) = off {
                assert_eq!(spec.get(f.name), Some(&Value::Off));
                assert_eq!(spec.build().map(|_| ()), Ok(()));
            }
            if !matches!(f.unit, Unit::Ms | Unit::Count | Unit::Bytes) {
                continue;
            }
            let zero = PolicySpec::new()
                .with(f.name, Value::Number(0))
                .unwrap()
                .build();
            if f.refuses_zero {
                assert_eq!(zero, Err(PolicyError::Zero(f)), "{}", f.name);
            } else {
                assert!(zero.is_ok(), "{}: {zero:?}", f.name);
            }
        }
        let zero = |name: &str| {
            PolicySpec::new()
                .with(name, Value::Number(0))
                .unwrap()
                .build()
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            zero("idle_timeout_ms"),
            "idle_timeout_ms: 0 is not a duration; use \"off\" to turn it off"
        );
        assert_eq!(zero("max_attempts"), "max_attempts: must be at least 1");
        assert_eq!(
            zero("backoff_base_ms"),
            "backoff_base_ms: 0 is not a duration; give at least 1 ms"
        );
        assert_eq!(
            zero("holdback_cap"),
            "holdback_cap: must be at least 1 byte"
        );
        assert_eq!(
            zero("max_event_bytes"),
            "max_event_bytes: must be at least 1 byte"
        );
    }

    #[test]
    fn values_a_knob_does_not_take_are_refused_in_its_words() {
        let refused = |json: &str| {
            serde_json::from_str::<PolicySpec>(json)
                .unwrap_err()
                .to_string()
        };
        assert!(
            refused(r#"{"idle_timeout_ms": null}"#).starts_with(
                "idle_timeout_ms: expected a whole number of milliseconds up to 9000000000000 \
                 or \"off\", got null"
            ),
            "{}",
            refused(r#"{"idle_timeout_ms": null}"#)
        );
        assert!(refused(r#"{"max_attempts": "off"}"#).contains("got \"off\""));
        assert!(refused(r#"{"budget_ms": 1.5}"#).contains("got 1.5"));
        assert!(refused(r#"{"budget_ms": -1}"#).contains("got -1"));
        assert!(refused(r#"{"max_attempts": 4294967296}"#).contains("up to 4294967295"));
        assert!(refused(r#"{"endpoint": "lokal"}"#).contains("one of \"remote\", \"local\""));
        assert!(refused(r#"{"retryable_statuses": [503, "x"]}"#).contains("HTTP statuses"));
        assert!(refused(r#"{"retryable_categories": ["protocol"]}"#).contains("client_timeout"));
        assert!(refused(r#"{"max_atempts": 3}"#).contains("unknown policy knob `max_atempts`"));
        assert!(refused(r#"{"max_attempts": 3, "max_attempts": 4}"#).contains("given twice"));
        let spec: PolicySpec = serde_json::from_str(r#"{"budget_ms": 300.0}"#).unwrap();
        assert_eq!(spec.get("budget_ms"), Some(&Value::Number(300)));
        assert_eq!(
            PolicySpec::new()
                .with("retryable_statuses", Value::List(vec![Value::Number(401)]))
                .unwrap()
                .build(),
            Err(PolicyError::InvalidStatus(401))
        );
    }

    #[test]
    fn a_base_alone_raises_the_default_ceiling() {
        let p = PolicySpec::new()
            .with("backoff_base_ms", Value::Number(10_000))
            .unwrap()
            .build()
            .unwrap();
        assert_eq!(p.backoff_ceiling(), Duration::from_secs(10));
        let below = PolicySpec::new()
            .with("backoff_base_ms", Value::Number(5000))
            .unwrap()
            .with("backoff_ceiling_ms", Value::Number(10))
            .unwrap()
            .build();
        assert_eq!(below, Err(PolicyError::CeilingBelowBase));
    }

    #[test]
    fn names_for_the_other_front_ends() {
        let f = field("first_token_timeout_ms").unwrap();
        assert_eq!(f.camel_case(), "firstTokenTimeoutMs");
        assert_eq!(f.flag(), "--first-token-timeout-ms");
        assert_eq!(
            field_by_camel_case("retryProtocolViolations").map(|f| f.name),
            Some("retry_protocol_violations")
        );
        assert_eq!(
            field("retryable_statuses").unwrap().parse("408, 429"),
            Value::List(vec![Value::Number(408), Value::Number(429)])
        );
    }
}
