//! The reference path: a full `serde_json::Value`, which the differential
//! tests compare the scanner with.

use std::borrow::Cow;

use serde_json::Value;

use super::view::{JsonKind, JsonView};
use crate::wire::ProtocolViolation;

/// Parses `doc` the slow, reference way: a full `serde_json::Value`.
#[cfg(feature = "serde_json")]
pub(crate) fn parse_reference(doc: &[u8]) -> Result<Value, ProtocolViolation> {
    if std::str::from_utf8(doc).is_err() {
        return Err(ProtocolViolation::InvalidUtf8);
    }
    serde_json::from_slice(doc).map_err(|_| ProtocolViolation::MalformedJson)
}

#[cfg(feature = "serde_json")]
impl<'a> JsonView<'a> for &'a Value {
    fn kind(self) -> JsonKind {
        match self {
            Value::Null => JsonKind::Null,
            Value::Bool(_) => JsonKind::Bool,
            Value::Number(_) => JsonKind::Number,
            Value::String(_) => JsonKind::String,
            Value::Array(_) => JsonKind::Array,
            Value::Object(_) => JsonKind::Object,
        }
    }

    fn fields<const N: usize>(self, keys: [&str; N]) -> [Option<Self>; N] {
        match self {
            Value::Object(map) => keys.map(|k| map.get(k)),
            _ => [None; N],
        }
    }

    fn for_each(self, f: impl FnMut(Self)) {
        if let Value::Array(items) = self {
            items.iter().for_each(f);
        }
    }

    fn str_eq(self, s: &str) -> bool {
        self.as_str() == Some(s)
    }

    fn text(self) -> Option<Cow<'a, str>> {
        self.as_str().map(Cow::Borrowed)
    }

    fn as_u64(self) -> Option<u64> {
        Value::as_u64(self)
    }

    fn as_bool(self) -> Option<bool> {
        Value::as_bool(self)
    }

    fn is_nonempty(self) -> bool {
        match self {
            Value::String(s) => !s.is_empty(),
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => false,
        }
    }
}
