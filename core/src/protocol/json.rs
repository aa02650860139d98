//! Reading the few fields a classifier needs from a JSON event without
//! building a tree.
//!
//! [`Skim`] validates an event in one pass (UTF-8, grammar, escapes, number
//! syntax, nesting depth: the same documents `serde_json` accepts) and then
//! answers field look-ups by jumping over values it does not need. The
//! classifiers are written once against [`JsonView`] and run either on
//! [`Skim`] (the hot path) or on a full `serde_json::Value` (the reference the
//! differential tests compare against).

use std::borrow::Cow;

use memchr::memchr;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::wire::ProtocolViolation;

/// The JSON type of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonKind {
    /// `null`
    Null,
    /// `true` / `false`
    Bool,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

/// Read access to a parsed JSON value, as much as classifiers need.
pub trait JsonView<'a>: Copy + Sized {
    /// The value's type.
    fn kind(self) -> JsonKind;
    /// The values of `keys` when this is an object (last duplicate wins, as in
    /// `serde_json::Value`); all `None` otherwise.
    fn fields<const N: usize>(self, keys: [&str; N]) -> [Option<Self>; N];
    /// Calls `f` on each element when this is an array.
    fn for_each(self, f: impl FnMut(Self));
    /// Whether this is a string equal to `s` (after unescaping).
    fn str_eq(self, s: &str) -> bool;
    /// The unescaped string, when this is a string.
    fn text(self) -> Option<Cow<'a, str>>;
    /// The value as an unsigned integer, as `Value::as_u64` reads it.
    fn as_u64(self) -> Option<u64>;
    /// The value as a boolean.
    fn as_bool(self) -> Option<bool>;
    /// Whether this is a non-empty string, array or object.
    fn is_nonempty(self) -> bool;
    /// A full typed decode, for the rare events that need one.
    fn decode<T: DeserializeOwned>(self) -> Option<T>;

    /// One field of an object.
    fn get(self, key: &str) -> Option<Self> {
        let [v] = self.fields([key]);
        v
    }
    /// Whether this is a string that is not empty.
    fn is_nonempty_str(self) -> bool {
        self.kind() == JsonKind::String && self.is_nonempty()
    }
    /// Whether this is `null`.
    fn is_null(self) -> bool {
        self.kind() == JsonKind::Null
    }
}

/// A validated JSON value, read lazily from its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Skim<'a>(&'a [u8]);

impl<'a> Skim<'a> {
    /// Validates `doc` as one JSON document and returns its root value.
    pub fn parse(doc: &'a [u8]) -> Result<Self, ProtocolViolation> {
        if std::str::from_utf8(doc).is_err() {
            return Err(ProtocolViolation::InvalidUtf8);
        }
        let (start, end) = validate(doc).ok_or(ProtocolViolation::MalformedJson)?;
        Ok(Skim(&doc[start..end]))
    }

    /// The value's bytes.
    pub fn as_bytes(self) -> &'a [u8] {
        self.0
    }
}

/// Parses `doc` the slow, reference way: a full `serde_json::Value`.
pub fn parse_reference(doc: &[u8]) -> Result<Value, ProtocolViolation> {
    if std::str::from_utf8(doc).is_err() {
        return Err(ProtocolViolation::InvalidUtf8);
    }
    serde_json::from_slice(doc).map_err(|_| ProtocolViolation::MalformedJson)
}

// ---------------------------------------------------------------- scanning

#[inline]
fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Position of the first `"`, `\` or control byte, eight bytes at a time.
#[inline]
fn special_pos(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 8 <= s.len() {
        let mut word = [0u8; 8];
        word.copy_from_slice(&s[i..i + 8]);
        let x = u64::from_le_bytes(word);
        let q = x ^ (LO * u64::from(b'"'));
        let bs = x ^ (LO * u64::from(b'\\'));
        let mask = (q.wrapping_sub(LO) & !q)
            | (bs.wrapping_sub(LO) & !bs)
            | (x.wrapping_sub(LO * 0x20) & !x);
        let mask = mask & HI;
        if mask != 0 {
            return Some(i + (mask.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    while i < s.len() {
        let c = s[i];
        if c == b'"' || c == b'\\' || c < 0x20 {
            return Some(i);
        }
        i += 1;
    }
    None
}

fn hex4(b: &[u8], i: usize) -> Option<u32> {
    let digits = b.get(i..i + 4)?;
    let mut v = 0u32;
    for d in digits {
        v = v * 16 + char::from(*d).to_digit(16)?;
    }
    Some(v)
}

fn escape(b: &[u8], i: usize) -> Option<usize> {
    match *b.get(i)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(i + 1),
        b'u' => {
            let cp = hex4(b, i + 1)?;
            let j = i + 5;
            if (0xD800..0xDC00).contains(&cp) {
                if b.get(j) == Some(&b'\\') && b.get(j + 1) == Some(&b'u') {
                    let lo = hex4(b, j + 2)?;
                    (0xDC00..0xE000).contains(&lo).then_some(j + 6)
                } else {
                    None
                }
            } else if (0xDC00..0xE000).contains(&cp) {
                None
            } else {
                Some(j)
            }
        }
        _ => None,
    }
}

/// Validates a string body starting after its opening quote.
fn string(b: &[u8], mut i: usize) -> Option<usize> {
    loop {
        i += special_pos(&b[i..])?;
        match b[i] {
            b'"' => return Some(i + 1),
            b'\\' => i = escape(b, i + 1)?,
            _ => return None,
        }
    }
}

fn digits(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    i
}

fn number(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    if b[i] == b'-' {
        i += 1;
    }
    match *b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i + 1),
        _ => return None,
    }
    let mut float = false;
    if b.get(i) == Some(&b'.') {
        let j = digits(b, i + 1);
        if j == i + 1 {
            return None;
        }
        i = j;
        float = true;
    }
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let j = digits(b, i);
        if j == i {
            return None;
        }
        i = j;
        float = true;
    }
    if float || i - start > 19 {
        // serde_json refuses numbers that overflow to infinity.
        let text = std::str::from_utf8(&b[start..i]).ok()?;
        let f: f64 = text.parse().ok()?;
        if !f.is_finite() {
            return None;
        }
    }
    Some(i)
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    (b.get(i..i + word.len())? == word).then_some(i + word.len())
}

/// Expects a key and its colon at `i`; returns where the value starts.
fn key(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'"') {
        return None;
    }
    let i = ws(b, string(b, i + 1)?);
    if b.get(i) != Some(&b':') {
        return None;
    }
    Some(ws(b, i + 1))
}

/// Deepest nesting `serde_json` accepts.
const MAX_DEPTH: u32 = 127;

/// Validates one JSON document; returns the span of its root value.
fn validate(b: &[u8]) -> Option<(usize, usize)> {
    let mut stack: u128 = 0; // one bit per open container, 1 = object
    let mut depth: u32 = 0;
    let mut i = ws(b, 0);
    let start = i;
    'value: loop {
        match *b.get(i)? {
            b'{' => {
                if depth == MAX_DEPTH {
                    return None;
                }
                i = ws(b, i + 1);
                if *b.get(i)? == b'}' {
                    i += 1;
                } else {
                    stack = (stack << 1) | 1;
                    depth += 1;
                    i = key(b, i)?;
                    continue 'value;
                }
            }
            b'[' => {
                if depth == MAX_DEPTH {
                    return None;
                }
                i = ws(b, i + 1);
                if *b.get(i)? == b']' {
                    i += 1;
                } else {
                    stack <<= 1;
                    depth += 1;
                    continue 'value;
                }
            }
            b'"' => i = string(b, i + 1)?,
            b't' => i = literal(b, i, b"true")?,
            b'f' => i = literal(b, i, b"false")?,
            b'n' => i = literal(b, i, b"null")?,
            b'-' | b'0'..=b'9' => i = number(b, i)?,
            _ => return None,
        }
        loop {
            if depth == 0 {
                return (ws(b, i) == b.len()).then_some((start, i));
            }
            i = ws(b, i);
            let in_object = stack & 1 == 1;
            match (in_object, *b.get(i)?) {
                (true, b',') => {
                    i = key(b, ws(b, i + 1))?;
                    continue 'value;
                }
                (false, b',') => {
                    i = ws(b, i + 1);
                    continue 'value;
                }
                (true, b'}') | (false, b']') => {
                    i += 1;
                    stack >>= 1;
                    depth -= 1;
                }
                _ => return None,
            }
        }
    }
}

// ------------------------------------------- skipping (input already valid)

/// Skips a string body starting after its opening quote; returns the index
/// after the closing quote and whether the string holds escapes.
#[inline]
fn skip_str(b: &[u8], mut i: usize) -> (usize, bool) {
    let mut escaped = false;
    loop {
        match special_pos(&b[i..]) {
            Some(p) if b[i + p] == b'\\' => {
                escaped = true;
                i += p + 2;
            }
            Some(p) => return (i + p + 1, escaped),
            None => return (b.len(), escaped),
        }
    }
}

#[inline]
fn skip_value(b: &[u8], i: usize) -> usize {
    match b[i] {
        b'"' => skip_str(b, i + 1).0,
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = skip_str(b, j + 1).0;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return j + 1;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            b.len()
        }
        _ => {
            let mut j = i;
            while j < b.len() && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            j
        }
    }
}

impl<'a> JsonView<'a> for Skim<'a> {
    fn kind(self) -> JsonKind {
        match self.0.first() {
            Some(b'{') => JsonKind::Object,
            Some(b'[') => JsonKind::Array,
            Some(b'"') => JsonKind::String,
            Some(b't' | b'f') => JsonKind::Bool,
            Some(b'n') => JsonKind::Null,
            _ => JsonKind::Number,
        }
    }

    fn fields<const N: usize>(self, keys: [&str; N]) -> [Option<Self>; N] {
        let mut out = [None; N];
        let b = self.0;
        if b.first() != Some(&b'{') {
            return out;
        }
        let mut i = ws(b, 1);
        while i < b.len() && b[i] == b'"' {
            let (key_end, escaped) = skip_str(b, i + 1);
            let key_span = &b[i..key_end];
            let colon = ws(b, key_end);
            let value_start = ws(b, colon + 1);
            let value_end = skip_value(b, value_start);
            let value = Skim(&b[value_start..value_end]);
            if escaped {
                if let Ok(name) = serde_json::from_slice::<String>(key_span) {
                    for (slot, want) in out.iter_mut().zip(keys) {
                        if name == want {
                            *slot = Some(value);
                        }
                    }
                }
            } else {
                let raw = &key_span[1..key_span.len() - 1];
                for (slot, want) in out.iter_mut().zip(keys) {
                    let want = want.as_bytes();
                    // Length and first byte first: most keys differ there, and
                    // a library memcmp call costs more than a short key.
                    if raw.len() == want.len() && raw.first() == want.first() && raw == want {
                        *slot = Some(value);
                    }
                }
            }
            i = ws(b, value_end);
            if i < b.len() && b[i] == b',' {
                i = ws(b, i + 1);
            } else {
                break;
            }
        }
        out
    }

    fn for_each(self, mut f: impl FnMut(Self)) {
        let b = self.0;
        if b.first() != Some(&b'[') {
            return;
        }
        let mut i = ws(b, 1);
        while i < b.len() && b[i] != b']' {
            let end = skip_value(b, i);
            f(Skim(&b[i..end]));
            i = ws(b, end);
            if i < b.len() && b[i] == b',' {
                i = ws(b, i + 1);
            } else {
                break;
            }
        }
    }

    fn str_eq(self, s: &str) -> bool {
        let b = self.0;
        if b.first() != Some(&b'"') {
            return false;
        }
        let raw = &b[1..b.len() - 1];
        if memchr(b'\\', raw).is_none() {
            raw == s.as_bytes()
        } else {
            self.text().is_some_and(|t| t == s)
        }
    }

    fn text(self) -> Option<Cow<'a, str>> {
        let b = self.0;
        if b.first() != Some(&b'"') {
            return None;
        }
        let raw = &b[1..b.len() - 1];
        if memchr(b'\\', raw).is_none() {
            std::str::from_utf8(raw).ok().map(Cow::Borrowed)
        } else {
            serde_json::from_slice::<String>(b).ok().map(Cow::Owned)
        }
    }

    fn as_u64(self) -> Option<u64> {
        let b = self.0;
        if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
            return None;
        }
        b.iter().try_fold(0u64, |acc, d| {
            acc.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })
    }

    fn as_bool(self) -> Option<bool> {
        match self.0 {
            b"true" => Some(true),
            b"false" => Some(false),
            _ => None,
        }
    }

    fn is_nonempty(self) -> bool {
        let b = self.0;
        match b.first() {
            Some(b'"') => b.len() > 2,
            Some(b'[' | b'{') => {
                let i = ws(b, 1);
                i < b.len() && b[i] != b']' && b[i] != b'}'
            }
            _ => false,
        }
    }

    fn decode<T: DeserializeOwned>(self) -> Option<T> {
        serde_json::from_slice(self.0).ok()
    }
}

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

    fn decode<T: DeserializeOwned>(self) -> Option<T> {
        T::deserialize(self).ok()
    }
}
