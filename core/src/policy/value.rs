//! A knob's value as a front end reads it, before the knob's row judges it:
//! from TOML or JSON (serde), from `recover`'s text, from a Python object,
//! from the npm shell's text.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeSeq, Serializer};

/// A knob's value. In a spec it has passed its row's
/// [`check`](super::Field::check); read from a front end it may be
/// anything, and [`Value::Other`] keeps what fits no other form (a
/// negative or fractional number, `null`, a table) as written, so the
/// refusal can quote it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Value {
    /// `"off"`: the bound is off.
    Off,
    /// A whole number: milliseconds, a count, bytes or a status.
    Number(u64),
    /// `true` or `false`.
    Bool(bool),
    /// A name (a choice; `"off"` before its row turns it into [`Value::Off`]).
    Name(String),
    /// A list of values.
    List(Vec<Value>),
    /// Anything else, as written.
    Other(String),
}

impl Value {
    /// One value as `recover` writes it: `off`, `true`, `false`, digits,
    /// or else a name.
    pub fn from_text(text: &str) -> Value {
        match text {
            "off" => Value::Off,
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => t
                .bytes()
                .try_fold(0u64, |n, d| {
                    n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
                })
                .map_or_else(|| Value::Other(t.to_owned()), Value::Number),
            t => Value::Name(t.to_owned()),
        }
    }
}

/// The text `recover` takes for it: `off`, digits, `true`, a name; a list
/// comma-separated. A name is quoted inside an error
/// (`{:#}`: `"soon"`), so that `"off"` and `off` read differently.
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Off => f.write_str(if f.alternate() { "\"off\"" } else { "off" }),
            Value::Number(n) => crate::text::write_decimal(f, *n),
            Value::Bool(b) => f.write_str(if *b { "true" } else { "false" }),
            Value::Name(n) if f.alternate() => write!(f, "\"{n}\""),
            Value::Name(n) | Value::Other(n) => f.write_str(n),
            Value::List(items) => {
                if f.alternate() {
                    f.write_str("[")?;
                }
                for (i, item) in items.iter().enumerate() {
                    let sep = if i == 0 { "" } else { "," };
                    if f.alternate() {
                        write!(f, "{sep}{item:#}")?;
                    } else {
                        write!(f, "{sep}{item}")?;
                    }
                }
                if f.alternate() {
                    f.write_str("]")?;
                }
                Ok(())
            }
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Off => s.serialize_str("off"),
            Value::Number(n) => s.serialize_u64(*n),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Name(n) | Value::Other(n) => s.serialize_str(n),
            Value::List(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
        }
    }
}

/// Reads any self-describing value; what no knob could take becomes
/// [`Value::Other`] rather than an error, so that the knob's row refuses it
/// in its own words (a serde error here would not know the key).
impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

/// The largest integer a float holds exactly.
const EXACT_IN_F64: f64 = 9_007_199_254_740_992.0;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a policy value")
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Value, E> {
        Ok(Value::Number(n))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Value, E> {
        Ok(u64::try_from(n).map_or_else(|_| Value::Other(n.to_string()), Value::Number))
    }

    /// A float that is a whole number (`300.0`) is that number: a JSON
    /// writer or a TOML file may spell one so.
    fn visit_f64<E: de::Error>(self, x: f64) -> Result<Value, E> {
        if x.fract() == 0.0 && (0.0..=EXACT_IN_F64).contains(&x) {
            Ok(Value::Number(x as u64))
        } else {
            Ok(Value::Other(x.to_string()))
        }
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Value, E> {
        Ok(Value::Name(s.to_owned()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Other("null".into()))
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::List(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Other("a table".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_reads_as_recover_writes_it() {
        assert_eq!(Value::from_text("off"), Value::Off);
        assert_eq!(Value::from_text("300"), Value::Number(300));
        assert_eq!(Value::from_text("true"), Value::Bool(true));
        assert_eq!(Value::from_text("local"), Value::Name("local".into()));
        for kept in ["1e3", "-5", "1.5", "", " 5", "99999999999999999999999"] {
            let v = Value::from_text(kept);
            assert!(
                matches!(&v, Value::Name(t) | Value::Other(t) if t == kept),
                "{kept:?}: {v:?}"
            );
        }
    }

    #[test]
    fn json_values_that_fit_no_knob_are_kept_as_written() {
        let read = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert_eq!(read("300"), Value::Number(300));
        assert_eq!(read("300.0"), Value::Number(300));
        assert_eq!(read("-1"), Value::Other("-1".into()));
        assert_eq!(read("1.5"), Value::Other("1.5".into()));
        assert_eq!(read("null"), Value::Other("null".into()));
        assert_eq!(read("{\"a\":1}"), Value::Other("a table".into()));
        assert_eq!(
            read("[408, \"http\"]"),
            Value::List(vec![Value::Number(408), Value::Name("http".into())])
        );
        assert_eq!(read("\"off\""), Value::Name("off".into()));
    }

    #[test]
    fn display_is_recover_text_and_quotes_names_in_errors() {
        let list = Value::List(vec![Value::Number(408), Value::Number(429)]);
        assert_eq!(list.to_string(), "408,429");
        assert_eq!(format!("{list:#}"), "[408,429]");
        assert_eq!(format!("{:#}", Value::Name("soon".into())), "\"soon\"");
        assert_eq!(format!("{:#}", Value::Off), "\"off\"");
        assert_eq!(Value::Off.to_string(), "off");
    }
}
