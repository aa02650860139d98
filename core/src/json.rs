//! Reading the few fields a classifier needs from a JSON event without
//! building a tree.
//!
//! A [`Tape`] validates an event in one pass (UTF-8, grammar, escapes,
//! number syntax, nesting depth: the same documents `serde_json` accepts)
//! and records the span of every value, so a [`Skim`] answers field look-ups
//! by jumping between spans. Documents larger than [`TAPE_MAX_DOC`] are
//! validated with constant memory and read [`Lazy`]ily instead. The
//! classifiers are written once against [`JsonView`] and run on [`Skim`]
//! (the hot path), [`Lazy`] or a full `serde_json::Value` (the reference the
//! differential tests compare against).

use std::borrow::Cow;

use memchr::memchr;
#[cfg(feature = "serde_json")]
#[cfg(feature = "serde_json")]
use serde_json::Value;

use crate::wire::ProtocolViolation;

/// The JSON type of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JsonKind {
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
pub(crate) trait JsonView<'a>: Copy + Sized {
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

/// A validated JSON value, read lazily from its bytes: constant memory,
/// but every look-up walks the bytes again. Used for documents too large
/// for a [`Tape`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lazy<'a>(&'a [u8]);

impl<'a> Lazy<'a> {
    /// Validates `doc` as one JSON document and returns its root value.
    pub(crate) fn parse(doc: &'a [u8]) -> Result<Self, ProtocolViolation> {
        if std::str::from_utf8(doc).is_err() {
            return Err(ProtocolViolation::InvalidUtf8);
        }
        let (start, end) = validate(doc).ok_or(ProtocolViolation::MalformedJson)?;
        Ok(Lazy(&doc[start..end]))
    }

    /// The value's bytes.
    pub(crate) fn as_bytes(self) -> &'a [u8] {
        self.0
    }
}

/// Parses `doc` the slow, reference way: a full `serde_json::Value`.
#[cfg(feature = "serde_json")]
pub(crate) fn parse_reference(doc: &[u8]) -> Result<Value, ProtocolViolation> {
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

/// The eight bytes of `s` at `i` as a word.
/// Written byte by byte, which the compiler fuses into one load at every
/// optimisation level (a `copy_from_slice` stays a call at opt-level "z").
/// Always inlined: at opt-level "z" (the wasm package) a call per word
/// costs the scanner a third of its speed (measured in Node).
#[allow(clippy::inline_always)]
#[inline(always)]
fn word_at(s: &[u8], i: usize) -> u64 {
    let w = &s[i..i + 8];
    u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])
}

/// The high bit of every byte of `x` that is `"`, `\` or a control byte
/// (exact for the lowest one flagged, which is all a scan reads).
/// Always inlined, as `word_at` is: it runs per word.
#[allow(clippy::inline_always)]
#[inline(always)]
fn specials(x: u64) -> u64 {
    let q = x ^ (LO * u64::from(b'"'));
    let bs = x ^ (LO * u64::from(b'\\'));
    ((q.wrapping_sub(LO) & !q) | (bs.wrapping_sub(LO) & !bs) | (x.wrapping_sub(LO * 0x20) & !x))
        & HI
}

/// Position of the first `"`, `\` or control byte, eight bytes at a time.
#[inline]
fn special_pos(s: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 8 <= s.len() {
        let mask = specials(word_at(s, i));
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
                if matches!(b.get(j), Some(b'\\')) && matches!(b.get(j + 1), Some(b'u')) {
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

/// Decodes a JSON string literal (quotes included): every escape, `\uXXXX`
/// surrogate pairs joined; `None` for anything that is not exactly one
/// valid literal (bad escape, lone surrogate, raw control byte or quote,
/// invalid UTF-8).
pub(crate) fn unescape(literal: &[u8]) -> Option<String> {
    let body = literal.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let c = body[i];
        i += 1;
        if c == b'"' || c < 0x20 {
            return None;
        }
        if c != b'\\' {
            out.push(c);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        out.push(match e {
            b'"' | b'\\' | b'/' => e,
            b'b' => 0x08,
            b'f' => 0x0C,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let mut cp = hex4(body, i)?;
                i += 4;
                if (0xD800..0xDC00).contains(&cp) {
                    if body.get(i..i + 2)? != b"\\u" {
                        return None;
                    }
                    let lo = hex4(body, i + 2)?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    i += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                // `None` for a lone low surrogate.
                let ch = char::from_u32(cp)?;
                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                continue;
            }
            _ => return None,
        });
    }
    String::from_utf8(out).ok()
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
    if matches!(b.get(i), Some(b'.')) {
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
    // serde_json refuses numbers that overflow to infinity.
    if (float || i - start > 19) && overflows(&b[start..i]) {
        return None;
    }
    Some(i)
}

/// The digits of 2^1024 − 2^970, halfway between `f64::MAX` and 2^1024:
/// the smallest magnitude that rounds to infinity (the tie goes to the even
/// 2^1024).
const HALF_PAST_MAX: &[u8; 309] = b"179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792";

/// Whether `text` (JSON number syntax) parses to an infinite `f64`, decided
/// on its digits: no float parsing.
fn overflows(text: &[u8]) -> bool {
    let text = text.strip_prefix(b"-").unwrap_or(text);
    let (mantissa, exp) = text.split_at(
        text.iter()
            .position(|b| matches!(b, b'e' | b'E'))
            .unwrap_or(text.len()),
    );
    let mut e: i64 = 0;
    if let Some(rest) = exp.get(1..) {
        let (negative, digits) = match rest.first() {
            Some(b'-') => (true, &rest[1..]),
            Some(b'+') => (false, &rest[1..]),
            _ => (false, rest),
        };
        for d in digits {
            e = (e * 10 + i64::from(d - b'0')).min(1 << 40);
        }
        if negative {
            e = -e;
        }
    }
    let int_len = mantissa
        .iter()
        .position(|&b| b == b'.')
        .unwrap_or(mantissa.len());
    let digits = mantissa.iter().copied().filter(u8::is_ascii_digit);
    let zeros = digits.clone().take_while(|&d| d == b'0').count();
    if zeros == digits.clone().count() {
        return false;
    }
    // The value is 0.D × 10^exp10, D the digits from the first non-zero one.
    let exp10 = i64::try_from(int_len).unwrap_or(i64::MAX) - i64::try_from(zeros).unwrap_or(0) + e;
    if exp10 != 309 {
        return exp10 > 309;
    }
    let mut significant = digits.skip(zeros);
    for &t in HALF_PAST_MAX {
        match significant.next() {
            // Padded with zeros, D is below: the bound's last digit is not 0.
            None => return false,
            Some(d) if d != t => return d > t,
            Some(_) => {}
        }
    }
    true
}

fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    (b.get(i..i + word.len())? == word).then_some(i + word.len())
}

/// Expects a key and its colon at `i`; returns where the value starts.
fn key(b: &[u8], i: usize) -> Option<usize> {
    if !matches!(b.get(i), Some(b'"')) {
        return None;
    }
    let i = ws(b, string(b, i + 1)?);
    if !matches!(b.get(i), Some(b':')) {
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

impl Lazy<'_> {
    /// [`JsonView::fields`] for any number of keys: one copy of the walk,
    /// not one per key count.
    #[cfg_attr(target_arch = "wasm32", inline(never))]
    #[cfg_attr(not(target_arch = "wasm32"), inline)]
    fn fields_into(self, keys: &[&str], out: &mut [Option<Self>]) {
        let b = self.0;
        if !matches!(b.first(), Some(b'{')) {
            return;
        }
        let mut i = ws(b, 1);
        while i < b.len() && b[i] == b'"' {
            let (key_end, escaped) = skip_str(b, i + 1);
            let key_span = &b[i..key_end];
            let colon = ws(b, key_end);
            let value_start = ws(b, colon + 1);
            let value_end = skip_value(b, value_start);
            let value = Lazy(&b[value_start..value_end]);
            if escaped {
                if let Some(name) = unescape(key_span) {
                    for (slot, want) in out.iter_mut().zip(keys.iter().copied()) {
                        if name == want {
                            *slot = Some(value);
                        }
                    }
                }
            } else {
                let raw = &key_span[1..key_span.len() - 1];
                for (slot, want) in out.iter_mut().zip(keys.iter().copied()) {
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
    }
}

impl<'a> JsonView<'a> for Lazy<'a> {
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
        self.fields_into(&keys, &mut out);
        out
    }

    fn for_each(self, mut f: impl FnMut(Self)) {
        let b = self.0;
        if !matches!(b.first(), Some(b'[')) {
            return;
        }
        let mut i = ws(b, 1);
        while i < b.len() && b[i] != b']' {
            let end = skip_value(b, i);
            f(Lazy(&b[i..end]));
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
        if !matches!(b.first(), Some(b'"')) {
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
        if !matches!(b.first(), Some(b'"')) {
            return None;
        }
        let raw = &b[1..b.len() - 1];
        if memchr(b'\\', raw).is_none() {
            std::str::from_utf8(raw).ok().map(Cow::Borrowed)
        } else {
            unescape(b).map(Cow::Owned)
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

// ------------------------------------------------------------------ tape

/// Largest document scanned onto a [`Tape`]; larger ones are read [`Lazy`]
/// so the tape stays bounded (at most ~`TAPE_MAX_DOC / 2` nodes).
pub(crate) const TAPE_MAX_DOC: usize = 64 * 1024;

/// No enclosing container (the root's parent).
const NONE: u32 = u32::MAX;

/// One value or object key of a scanned document, in document order.
#[derive(Debug, Clone, Copy)]
struct Node {
    /// First byte.
    start: u32,
    /// One past the last byte.
    end: u32,
    /// Index of the first node after this value and everything inside it.
    next: u32,
    /// Index of the enclosing container, [`NONE`] for the root.
    parent: u32,
    /// An object key rather than a value.
    key: bool,
    /// A string that holds at least one escape.
    escaped: bool,
}

/// Scratch space for reading the events of one stream: one validating pass
/// per event records every value's span, so look-ups jump instead of
/// re-scanning.
///
/// Events of one stream share long byte-exact prefixes (ids, model names,
/// the path to the delta). The tape keeps the last valid document; the next
/// one is compared with it word by word and scanning resumes at the last
/// value that starts inside the common prefix. Scanning is a pure function
/// of the bytes read so far, so the state there is the state a full scan
/// would reach, and the result is the same.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tape {
    nodes: Vec<Node>,
    /// The last document that scanned valid; `nodes` describes it.
    prev: Vec<u8>,
}

/// A document read through a [`Tape`]: on the tape, or lazily when large.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Parsed<'a> {
    /// Scanned onto the tape.
    Tape(Skim<'a>),
    /// Too large for the tape: validated, read lazily.
    Lazy(Lazy<'a>),
}

impl Tape {
    /// Validates `doc` exactly as `serde_json` would (after a UTF-8 check)
    /// and returns its root.
    pub(crate) fn parse<'a>(&'a mut self, doc: &'a [u8]) -> Result<Parsed<'a>, ProtocolViolation> {
        if doc.len() > TAPE_MAX_DOC {
            self.forget();
            return Lazy::parse(doc).map(Parsed::Lazy);
        }
        let (from, checked) = match self.resume_point(doc) {
            Some(at) => (at, self.nodes[at].start as usize),
            None => (0, 0),
        };
        if std::str::from_utf8(&doc[checked..]).is_err() {
            self.forget();
            return Err(ProtocolViolation::InvalidUtf8);
        }
        if scan(doc, &mut self.nodes, from).is_none() {
            self.forget();
            return Err(ProtocolViolation::MalformedJson);
        }
        self.prev.clear();
        self.prev.extend_from_slice(doc);
        Ok(Parsed::Tape(Skim {
            doc,
            nodes: &self.nodes,
            at: 0,
        }))
    }

    fn forget(&mut self) {
        self.nodes.clear();
        self.prev.clear();
    }

    /// The node to resume scanning at: the last value (not key) whose first
    /// byte lies inside the prefix `doc` shares with the previous document;
    /// `None` (a full scan) when there is none.
    ///
    /// The first byte must be shared too, not only the bytes before it: the
    /// scan looked at it before reaching the value (to see whether `[` or
    /// `{` closed at once, or where whitespace ended).
    fn resume_point(&self, doc: &[u8]) -> Option<usize> {
        if self.nodes.is_empty() {
            return None;
        }
        let same = common_prefix(&self.prev, doc);
        let after = self.nodes.partition_point(|n| (n.start as usize) < same);
        let mut at = after.checked_sub(1)?;
        if self.nodes[at].key {
            // A key's predecessor is its object or a value inside it.
            at -= 1;
        }
        Some(at)
    }
}

/// Length of the longest common prefix of `a` and `b`.
fn common_prefix(left: &[u8], right: &[u8]) -> usize {
    let len = left.len().min(right.len());
    let (left, right) = (&left[..len], &right[..len]);
    let mut at = 0;
    for (x, y) in left.chunks_exact(16).zip(right.chunks_exact(16)) {
        let mut wx = [0u8; 16];
        let mut wy = [0u8; 16];
        wx.copy_from_slice(x);
        wy.copy_from_slice(y);
        let diff = u128::from_le_bytes(wx) ^ u128::from_le_bytes(wy);
        if diff != 0 {
            return at + (diff.trailing_zeros() / 8) as usize;
        }
        at += 16;
    }
    while at < len && left[at] == right[at] {
        at += 1;
    }
    at
}

/// Validates a string body starting after its opening quote; returns the
/// index after the closing quote and whether the string holds escapes.
#[inline]
fn string_esc(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        i += special_pos(&b[i..])?;
        match b[i] {
            b'"' => return Some((i + 1, escaped)),
            b'\\' => {
                escaped = true;
                i = escape(b, i + 1)?;
            }
            _ => return None,
        }
    }
}

/// Expects a key at `i` (inside object node `parent`) and pushes it; returns
/// the index after its colon.
#[inline]
fn tape_key(b: &[u8], i: usize, nodes: &mut Vec<Node>, parent: u32) -> Option<usize> {
    if !matches!(b.get(i), Some(b'"')) {
        return None;
    }
    let (end, escaped) = string_esc(b, i + 1)?;
    let at = nodes.len() as u32;
    nodes.push(Node {
        start: i as u32,
        end: end as u32,
        next: at + 1,
        parent,
        key: true,
        escaped,
    });
    let j = ws(b, end);
    matches!(b.get(j), Some(b':')).then_some(j + 1)
}

/// The containers open where a scan stands.
#[derive(Debug, Clone, Copy)]
struct Open {
    /// The innermost one's node, [`NONE`] at the root.
    cur: u32,
    /// How many there are.
    depth: u32,
    /// One bit per open container, the innermost lowest; 1 = object.
    stack: u128,
}

impl Open {
    /// None open: the scan is at the root.
    const ROOT: Open = Open {
        cur: NONE,
        depth: 0,
        stack: 0,
    };

    /// The containers enclosing node `at` of a scanned document, rebuilt
    /// from its parents.
    fn around(b: &[u8], nodes: &[Node], at: usize) -> Open {
        let mut open = Open {
            cur: nodes[at].parent,
            ..Open::ROOT
        };
        let mut a = open.cur;
        while a != NONE {
            let n = nodes[a as usize];
            if b[n.start as usize] == b'{' {
                open.stack |= 1 << open.depth;
            }
            open.depth += 1;
            a = n.parent;
        }
        open
    }

    /// Whether the innermost container is an object.
    #[inline]
    fn in_object(self) -> bool {
        self.stack & 1 == 1
    }

    /// Steps into the container at node `at`.
    #[inline]
    fn enter(&mut self, at: u32, object: bool) {
        self.cur = at;
        self.depth += 1;
        self.stack = (self.stack << 1) | u128::from(object);
    }

    /// Steps out of the innermost container, whose parent is `parent`.
    #[inline]
    fn leave(&mut self, parent: u32) {
        self.cur = parent;
        self.stack >>= 1;
        self.depth -= 1;
    }
}

impl Node {
    /// A value that ends where it is scanned (no container opened), at
    /// index `at` of the tape.
    #[inline]
    fn leaf(start: usize, end: usize, at: u32, parent: u32, escaped: bool) -> Node {
        Node {
            start: start as u32,
            end: end as u32,
            next: at + 1,
            parent,
            key: false,
            escaped,
        }
    }
}

/// What follows a value, once the containers that close after it are
/// closed.
enum After {
    /// Another value, starting at this index.
    Value(usize),
    /// The end of the document.
    End,
}

/// Scans `b` onto `nodes`, resuming at node `from` (0: from the start) of
/// the previous document, whose bytes before that node's start equal `b`'s.
fn scan(b: &[u8], nodes: &mut Vec<Node>, from: usize) -> Option<()> {
    let (mut i, mut open) = if from == 0 {
        nodes.clear();
        (0, Open::ROOT)
    } else {
        let resumed = (nodes[from].start as usize, Open::around(b, nodes, from));
        nodes.truncate(from);
        resumed
    };
    'value: loop {
        i = ws(b, i);
        let at = nodes.len() as u32;
        let c = *b.get(i)?;
        match c {
            b'{' | b'[' => {
                if open.depth == MAX_DEPTH {
                    return None;
                }
                nodes.push(Node {
                    start: i as u32,
                    end: 0,
                    next: 0,
                    parent: open.cur,
                    key: false,
                    escaped: false,
                });
                let object = c == b'{';
                i = ws(b, i + 1);
                if *b.get(i)? == c + 2 {
                    // `}` and `]` are two past `{` and `[`.
                    i += 1;
                    let n = &mut nodes[at as usize];
                    n.end = i as u32;
                    n.next = at + 1;
                } else {
                    open.enter(at, object);
                    if object {
                        i = tape_key(b, i, nodes, open.cur)?;
                    }
                    continue 'value;
                }
            }
            b'"' => {
                let (end, escaped) = string_esc(b, i + 1)?;
                nodes.push(Node::leaf(i, end, at, open.cur, escaped));
                i = end;
            }
            _ => {
                let end = match c {
                    b't' => literal(b, i, b"true")?,
                    b'f' => literal(b, i, b"false")?,
                    b'n' => literal(b, i, b"null")?,
                    b'-' | b'0'..=b'9' => number(b, i)?,
                    _ => return None,
                };
                nodes.push(Node::leaf(i, end, at, open.cur, false));
                i = end;
            }
        }
        match after_value(b, nodes, i, &mut open)? {
            After::Value(next) => i = next,
            After::End => return Some(()),
        }
    }
}

/// Reads what follows a value that ends at `i`: closes the containers
/// that end there (recording their ends on `nodes`) up to a comma (and,
/// in an object, the next key) or the end of the document; `None` when
/// the bytes there are not JSON.
#[inline]
fn after_value(b: &[u8], nodes: &mut Vec<Node>, mut i: usize, open: &mut Open) -> Option<After> {
    loop {
        if open.cur == NONE {
            return (ws(b, i) == b.len()).then_some(After::End);
        }
        i = ws(b, i);
        match (open.in_object(), *b.get(i)?) {
            (true, b',') => {
                return Some(After::Value(tape_key(b, ws(b, i + 1), nodes, open.cur)?));
            }
            (false, b',') => return Some(After::Value(i + 1)),
            (true, b'}') | (false, b']') => {
                i += 1;
                let next = nodes.len() as u32;
                let n = &mut nodes[open.cur as usize];
                n.end = i as u32;
                n.next = next;
                open.leave(n.parent);
            }
            _ => return None,
        }
    }
}

/// A validated JSON value on a [`Tape`]: look-ups jump between recorded
/// spans.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Skim<'a> {
    doc: &'a [u8],
    nodes: &'a [Node],
    at: usize,
}

impl<'a> Skim<'a> {
    #[inline]
    fn node(self) -> Node {
        self.nodes[self.at]
    }

    #[inline]
    fn first(self) -> u8 {
        self.doc[self.node().start as usize]
    }

    #[inline]
    fn with(self, at: usize) -> Self {
        Skim { at, ..self }
    }

    /// The value's bytes.
    pub(crate) fn as_bytes(self) -> &'a [u8] {
        let n = self.node();
        &self.doc[n.start as usize..n.end as usize]
    }

    /// A string's bytes between its quotes.
    #[inline]
    fn raw_str(self) -> &'a [u8] {
        let n = self.node();
        &self.doc[n.start as usize + 1..n.end as usize - 1]
    }
}

impl Skim<'_> {
    /// [`JsonView::fields`] for any number of keys: one copy of the walk,
    /// not one per key count.
    #[cfg_attr(target_arch = "wasm32", inline(never))]
    #[cfg_attr(not(target_arch = "wasm32"), inline)]
    fn fields_into(self, keys: &[&str], out: &mut [Option<Self>]) {
        let n = self.node();
        if self.doc[n.start as usize] != b'{' {
            return;
        }
        let mut k = self.at + 1;
        let stop = n.next as usize;
        while k < stop {
            let key = self.with(k);
            let value = k + 1;
            if key.node().escaped {
                if let Some(name) = unescape(key.as_bytes()) {
                    for (slot, want) in out.iter_mut().zip(keys.iter().copied()) {
                        if name == want {
                            *slot = Some(self.with(value));
                        }
                    }
                }
            } else {
                let raw = key.raw_str();
                for (slot, want) in out.iter_mut().zip(keys.iter().copied()) {
                    let want = want.as_bytes();
                    if raw.len() == want.len() && raw.first() == want.first() && raw == want {
                        *slot = Some(self.with(value));
                    }
                }
            }
            k = self.nodes[value].next as usize;
        }
    }
}

impl<'a> JsonView<'a> for Skim<'a> {
    #[inline]
    fn kind(self) -> JsonKind {
        match self.first() {
            b'{' => JsonKind::Object,
            b'[' => JsonKind::Array,
            b'"' => JsonKind::String,
            b't' | b'f' => JsonKind::Bool,
            b'n' => JsonKind::Null,
            _ => JsonKind::Number,
        }
    }

    fn fields<const N: usize>(self, keys: [&str; N]) -> [Option<Self>; N] {
        let mut out = [None; N];
        self.fields_into(&keys, &mut out);
        out
    }

    fn for_each(self, mut f: impl FnMut(Self)) {
        let n = self.node();
        if self.doc[n.start as usize] != b'[' {
            return;
        }
        let mut k = self.at + 1;
        let stop = n.next as usize;
        while k < stop {
            f(self.with(k));
            k = self.nodes[k].next as usize;
        }
    }

    fn str_eq(self, s: &str) -> bool {
        if self.first() != b'"' {
            return false;
        }
        if self.node().escaped {
            self.text().is_some_and(|t| t == s)
        } else {
            self.raw_str() == s.as_bytes()
        }
    }

    fn text(self) -> Option<Cow<'a, str>> {
        if self.first() != b'"' {
            return None;
        }
        if self.node().escaped {
            unescape(self.as_bytes()).map(Cow::Owned)
        } else {
            std::str::from_utf8(self.raw_str()).ok().map(Cow::Borrowed)
        }
    }

    fn as_u64(self) -> Option<u64> {
        Lazy(self.as_bytes()).as_u64()
    }

    fn as_bool(self) -> Option<bool> {
        Lazy(self.as_bytes()).as_bool()
    }

    #[inline]
    fn is_nonempty(self) -> bool {
        let n = self.node();
        match self.doc[n.start as usize] {
            b'"' => n.end - n.start > 2,
            b'[' | b'{' => n.next > self.at as u32 + 1,
            _ => false,
        }
    }
}

impl<'a> Skim<'a> {
    /// Calls `f` with each member of an object: the key's bytes between its
    /// quotes (`None` when the key holds escapes) and the value.
    pub(crate) fn members(self, mut f: impl FnMut(Option<&'a [u8]>, Self)) {
        let n = self.node();
        if self.doc[n.start as usize] != b'{' {
            return;
        }
        let mut k = self.at + 1;
        let stop = n.next as usize;
        while k < stop {
            let key = self.with(k);
            let raw = (!key.node().escaped).then(|| key.raw_str());
            f(raw, self.with(k + 1));
            k = self.nodes[k + 1].next as usize;
        }
    }

    /// The value rebuilt as a `serde_json::Value` from the tape alone (for
    /// tests that compare the tape with `serde_json`).
    #[cfg(all(test, feature = "serde_json"))]
    pub(crate) fn to_value(self) -> Value {
        match self.kind() {
            JsonKind::Object => {
                let mut map = serde_json::Map::new();
                let n = self.node();
                let mut k = self.at + 1;
                while k < n.next as usize {
                    let key = self.with(k).text().map(Cow::into_owned).unwrap_or_default();
                    map.insert(key, self.with(k + 1).to_value());
                    k = self.nodes[k + 1].next as usize;
                }
                Value::Object(map)
            }
            JsonKind::Array => {
                let mut items = Vec::new();
                self.for_each(|v| items.push(v.to_value()));
                Value::Array(items)
            }
            JsonKind::String => Value::String(self.text().map(Cow::into_owned).unwrap_or_default()),
            _ => serde_json::from_slice(self.as_bytes()).unwrap_or(Value::Null),
        }
    }

    /// Body span (between the quotes) of a string value.
    fn body_span(self) -> (usize, usize) {
        let n = self.node();
        (n.start as usize + 1, n.end as usize - 1)
    }
}

// -------------------------------------------------------------- template

/// Most strings a [`Template`] lets vary.
const MAX_HOLES: usize = 8;

/// A learned event shape: the bytes of one event whose string values at
/// some places ("holes") may differ in later events.
///
/// Streams repeat one shape for nearly every event (a content delta whose
/// text changes). A protocol learns a template from an event it has just
/// classified on a [`Tape`], naming the string whose emptiness decided the
/// class (the probe) and strings its classifier never reads (spares). A
/// later event matches when it is byte-identical outside the holes and each
/// hole holds a valid JSON string body (escapes, no control bytes, UTF-8):
/// such a document is valid JSON with the same structure, and the
/// classifier would read the same values except the probe's emptiness.
///
/// A spare becomes a hole only once an event differs inside it, so strings
/// that never change are compared, not scanned. Events of other shapes in
/// between leave the template in place: what it proves does not depend on
/// them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Template {
    doc: Vec<u8>,
    /// Body spans (between the quotes) in `doc`, in document order.
    holes: Vec<(usize, usize)>,
    /// Index in `holes` of the probe.
    probe: usize,
    /// Body spans of unread strings not yet seen to differ.
    spare: Vec<(usize, usize)>,
    /// The document holds a line end (whitespace between tokens).
    multiline: bool,
}

impl Template {
    /// Forgets the learned shape.
    pub(crate) fn clear(&mut self) {
        self.doc.clear();
        self.holes.clear();
        self.probe = 0;
        self.spare.clear();
        self.multiline = false;
    }

    /// Learns the document `probe` belongs to, with `probe` (a string) as
    /// the value whose emptiness [`check`](Self::check) reports and
    /// `spares` (strings the classifier never reads) free to differ.
    pub(crate) fn learn<'a>(
        &mut self,
        probe: Skim<'a>,
        spares: impl IntoIterator<Item = Skim<'a>>,
    ) {
        self.clear();
        if probe.kind() != JsonKind::String {
            return;
        }
        self.doc.extend_from_slice(probe.doc);
        self.multiline = memchr::memchr2(b'\n', b'\r', probe.doc).is_some();
        self.holes.push(probe.body_span());
        for s in spares {
            if s.kind() == JsonKind::String && s.at != probe.at {
                self.spare.push(s.body_span());
            }
        }
    }

    /// Whether `doc` has the learned shape; if so, whether the probe's
    /// string is non-empty.
    pub(crate) fn check(&mut self, doc: &[u8]) -> Option<bool> {
        self.check_at(doc, true).map(|(nonempty, _)| nonempty)
    }

    /// Whether `buf` starts with a document of the learned shape; if so,
    /// whether the probe's string is non-empty and the document's length.
    /// Bytes after the document are not looked at. `None` also when the
    /// learned document spans lines, so that a match never crosses a line
    /// end of the framing around it.
    pub(crate) fn check_prefix(&mut self, buf: &[u8]) -> Option<(bool, usize)> {
        if self.multiline {
            return None;
        }
        self.check_at(buf, false)
    }

    fn check_at(&mut self, doc: &[u8], whole: bool) -> Option<(bool, usize)> {
        if self.doc.is_empty() {
            return None;
        }
        loop {
            match self.try_match(doc, whole) {
                Ok(found) => return Some(found),
                Err(Some(at)) => {
                    // A difference inside an unread string: let it vary.
                    let pos = self.spare.iter().position(|&(s, e)| s <= at && at <= e)?;
                    if self.holes.len() == MAX_HOLES {
                        return None;
                    }
                    let span = self.spare.swap_remove(pos);
                    let i = self.holes.partition_point(|h| h.0 < span.0);
                    self.holes.insert(i, span);
                    if i <= self.probe {
                        self.probe += 1;
                    }
                }
                Err(None) => return None,
            }
        }
    }

    /// Matches `doc` (the whole of it, or a prefix when `whole` is false);
    /// on a difference in the fixed bytes, its offset in the template
    /// (`None` when a hole did not hold a string body).
    #[inline]
    fn try_match(&self, doc: &[u8], whole: bool) -> Result<(bool, usize), Option<usize>> {
        let tpl = self.doc.as_slice();
        let mut t = 0; // position in the template
        let mut d = 0; // position in `doc`
        let mut nonempty = false;
        for (k, &(start, end)) in self.holes.iter().enumerate() {
            let fixed = &tpl[t..start];
            match doc.get(d..d + fixed.len()) {
                Some(theirs) if same(theirs, fixed) => {}
                _ => return Err(difference(fixed, &doc[d.min(doc.len())..], t)),
            }
            d += fixed.len();
            let close = hole_end(doc, d).ok_or(None)?;
            nonempty |= k == self.probe && close > d;
            d = close;
            t = end;
        }
        let fixed = &tpl[t..];
        let end = d + fixed.len();
        match doc.get(d..end) {
            Some(theirs) if same(theirs, fixed) && (!whole || end == doc.len()) => {
                Ok((nonempty, end))
            }
            _ => Err(difference(fixed, &doc[d.min(doc.len())..], t)),
        }
    }
}

/// Whether two slices of equal length hold the same bytes, sixteen at a
/// time in general-purpose and SSE2 registers (eight on wasm32, which has
/// 64-bit loads but no 128-bit registers, and whose `memcmp` goes byte by
/// byte). Template segments are a few hundred bytes; the C library's
/// wide-vector comparison costs more than it saves at that size when it
/// runs once per event between other work. Always inlined: at opt-level
/// "z" a call per segment cost the wasm module's template check ~10 %.
#[allow(clippy::inline_always)]
#[inline(always)]
fn same(a: &[u8], b: &[u8]) -> bool {
    fn word<const N: usize>(s: &[u8], at: usize) -> [u8; N] {
        let mut w = [0u8; N];
        w.copy_from_slice(&s[at..at + N]);
        w
    }
    let len = a.len();
    if len != b.len() {
        return false;
    }
    if cfg!(target_arch = "wasm32") && len >= 8 {
        let mut at = 0;
        while at + 8 <= len {
            if word_at(a, at) != word_at(b, at) {
                return false;
            }
            at += 8;
        }
        // The tail as the last eight bytes, overlapping what was compared.
        return at == len || word_at(a, len - 8) == word_at(b, len - 8);
    }
    if len >= 16 {
        let mut at = 0;
        while at + 16 <= len {
            if word::<16>(a, at) != word::<16>(b, at) {
                return false;
            }
            at += 16;
        }
        // The tail as the last sixteen bytes, overlapping what was compared.
        return at == len || word::<16>(a, len - 16) == word::<16>(b, len - 16);
    }
    if len >= 8 {
        return word::<8>(a, 0) == word::<8>(b, 0)
            && word::<8>(a, len - 8) == word::<8>(b, len - 8);
    }
    a.iter().zip(b).all(|(p, q)| p == q)
}

/// Where `theirs` first differs from the template bytes `fixed` (which
/// start at `t` in the template); `None` when `theirs` merely ends early (a
/// document cut short says nothing about which strings vary).
#[cold]
fn difference(fixed: &[u8], theirs: &[u8], t: usize) -> Option<usize> {
    let common = common_prefix(fixed, theirs);
    (common < theirs.len()).then_some(t + common)
}

/// Where the string body starting at `i` ends (the index of its closing
/// quote), when it is a valid body: escapes, no control bytes, UTF-8.
#[inline]
fn hole_end(doc: &[u8], i: usize) -> Option<usize> {
    // Plain ASCII without escapes, eight bytes at a time: the usual hole.
    let mut j = i;
    while j + 8 <= doc.len() {
        let x = word_at(doc, j);
        // Non-ASCII bytes stop the fast scan too.
        let stop = specials(x) | (x & HI);
        if stop != 0 {
            let at = j + (stop.trailing_zeros() / 8) as usize;
            if doc[at] == b'"' {
                return Some(at);
            }
            break;
        }
        j += 8;
    }
    // Fewer than eight bytes left (a hole near the document's end, as in an
    // Anthropic delta), or a byte that stopped the scan: byte by byte from
    // there, the plain case still without the general scan.
    while let Some(&c) = doc.get(j) {
        if c == b'"' {
            return Some(j);
        }
        if c == b'\\' || !(0x20..0x80).contains(&c) {
            break;
        }
        j += 1;
    }
    let (after, _) = string_esc(doc, i)?;
    let close = after - 1;
    let body = &doc[i..close];
    if !body.is_ascii() && std::str::from_utf8(body).is_err() {
        return None;
    }
    Some(close)
}

/// Writes `s` as a JSON string literal.
pub(crate) fn write_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            c if (c as u32) < 0x20 => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let n = c as usize;
                out.extend_from_slice(b"\\u00");
                out.push(HEX[n >> 4]);
                out.push(HEX[n & 15]);
            }
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Byte edits to one JSON document, applied together: a request or an
/// event rewritten in place keeps every byte it does not name, so what
/// the caller wrote (key order, spacing, fields this crate never reads)
/// reaches the server as it was.
pub(crate) struct Edits<'a> {
    doc: &'a [u8],
    /// `(start, end, replacement)`, in any order, never overlapping.
    edits: Vec<(usize, usize, Vec<u8>)>,
}

impl<'a> Edits<'a> {
    /// No edits yet to `doc`.
    pub(crate) fn new(doc: &'a [u8]) -> Self {
        Edits {
            doc,
            edits: Vec::new(),
        }
    }

    /// Where `part`, a slice of the document (a value [`Lazy`] read from
    /// it), starts.
    pub(crate) fn offset(&self, part: &[u8]) -> usize {
        (part.as_ptr() as usize).saturating_sub(self.doc.as_ptr() as usize)
    }

    /// Replaces `part`, a slice of the document, with `with`.
    pub(crate) fn replace(&mut self, part: &[u8], with: Vec<u8>) {
        let at = self.offset(part);
        self.edits.push((at, at + part.len(), with));
    }

    /// Inserts `bytes` at byte `at`.
    pub(crate) fn insert(&mut self, at: usize, bytes: Vec<u8>) {
        self.edits.push((at, at, bytes));
    }

    /// Sets member `key` of `object` (a value read from the document) to
    /// the JSON `value`: replaced when present, added first otherwise.
    pub(crate) fn set(&mut self, object: Lazy<'_>, key: &str, value: &[u8]) {
        if let Some(old) = object.get(key) {
            self.replace(old.as_bytes(), value.to_vec());
            return;
        }
        let mut member = Vec::with_capacity(key.len() + value.len() + 4);
        write_json_string(&mut member, key);
        member.push(b':');
        member.extend_from_slice(value);
        let empty = object.as_bytes()[1..]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_none_or(|b| *b == b'}');
        if !empty {
            member.push(b',');
        }
        self.insert(self.offset(object.as_bytes()) + 1, member);
    }

    /// Whether nothing was changed.
    pub(crate) fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// The edited document.
    pub(crate) fn apply(mut self) -> Vec<u8> {
        self.edits.sort_by_key(|e| (e.0, e.1));
        let grow: usize = self.edits.iter().map(|e| e.2.len()).sum();
        let mut out = Vec::with_capacity(self.doc.len() + grow);
        let mut at = 0;
        for (start, end, with) in self.edits {
            let start = start.clamp(at, self.doc.len());
            out.extend_from_slice(&self.doc[at..start]);
            out.extend_from_slice(&with);
            at = end.clamp(start, self.doc.len());
        }
        out.extend_from_slice(&self.doc[at..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_cut_short_never_widens_the_template() {
        let doc = br#"{"id":"chatcmpl-1","delta":{"content":"hi"}}"#;
        let mut tape = Tape::default();
        let Ok(Parsed::Tape(root)) = tape.parse(doc) else {
            panic!("a small document goes on the tape");
        };
        let id = root.get("id").unwrap();
        let content = root.get("delta").and_then(|d| d.get("content")).unwrap();
        let mut template = Template::default();
        template.learn(content, [id]);
        // A read cut inside the id says nothing about the id varying.
        assert_eq!(template.check_prefix(&doc[..12]), None);
        assert_eq!(template.holes.len(), 1, "the spare stays compared");
        // A whole document whose id differs lets it vary.
        let other = br#"{"id":"chatcmpl-2","delta":{"content":""}}"#;
        assert_eq!(template.check_prefix(other), Some((false, other.len())));
        assert_eq!(template.holes.len(), 2);
    }

    #[test]
    fn overflow_is_decided_as_a_float_parse_would() {
        let bound = std::str::from_utf8(HALF_PAST_MAX).unwrap();
        let below = format!("{}1", &bound[..308]);
        let cases = [
            "0",
            "-0.0",
            "1e308",
            "1.7976931348623157e308",
            "1.7976931348623158e308",
            "1.7976931348623159e308",
            "1.8e308",
            "2e308",
            "1e309",
            "-1e309",
            "1e-400",
            "0.0000e400",
            "0e999999999999999999999",
            "1e999999999999999999999",
            "1e-999999999999999999999",
            "0.001e311",
            "0.001e312",
            "17976931348623157e292",
            "100000000000000000000",
            "123456789012345678901234567890",
            "1E308",
            "1E+309",
            bound,
            &below,
            "0.5e-5",
        ];
        let exact = format!("{bound}.0");
        let more = format!("{bound}.0000001");
        let shifted = format!("0.{bound}e309");
        let minus = format!("-{bound}");
        for text in cases
            .iter()
            .copied()
            .chain([&*exact, &*more, &*shifted, &*minus])
        {
            let want = text.parse::<f64>().unwrap().is_infinite();
            assert_eq!(overflows(text.as_bytes()), want, "{text}");
        }
    }
}
