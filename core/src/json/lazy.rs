//! The constant-memory reader: a document validated once, then walked
//! again from its bytes at every look-up.

use std::borrow::Cow;

use memchr::memchr;

use super::syntax::{MAX_DEPTH, key, literal, number, special_pos, string, unescape, ws};
use super::view::{JsonKind, JsonView};
use crate::wire::ProtocolViolation;

/// A validated JSON value, read lazily from its bytes: constant memory,
/// but every look-up walks the bytes again. Used for documents too large
/// for a [`Tape`](super::Tape).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lazy<'a>(pub(super) &'a [u8]);

impl<'a> Lazy<'a> {
    /// Validates `doc` as one JSON document and returns its root value.
    pub(crate) fn parse(doc: &'a [u8]) -> Result<Self, ProtocolViolation> {
        // One walk in the binary (the wasm module's size): no fields asked.
        Self::parse_fields(doc, &[], &mut [])
    }

    /// [`Lazy::parse`], and `root.fields(keys)` of its root object in the
    /// same pass: a look-up after `parse` walks the document a second
    /// time. `out` holds the fields of a document that parsed, else none.
    pub(crate) fn parse_fields(
        doc: &'a [u8],
        keys: &[&str],
        out: &mut [Option<Self>],
    ) -> Result<Self, ProtocolViolation> {
        out.fill(None);
        if std::str::from_utf8(doc).is_err() {
            return Err(ProtocolViolation::InvalidUtf8);
        }
        let found = validate(doc, |key, start, end| {
            offer(key, Lazy(&doc[start..end]), keys, out);
        });
        let Some((start, end)) = found else {
            out.fill(None);
            return Err(ProtocolViolation::MalformedJson);
        };
        Ok(Lazy(&doc[start..end]))
    }

    /// A value whose bytes a validation already took as one value: a
    /// span [`Lazy::parse_fields`] gave, over the same bytes.
    pub(crate) fn validated(bytes: &'a [u8]) -> Self {
        Lazy(bytes)
    }

    /// The value's bytes.
    pub(crate) fn as_bytes(self) -> &'a [u8] {
        self.0
    }
}

/// Validates one JSON document; returns the span of its root value. When
/// the root is an object, `field` is told each of its members as the pass
/// completes it: the key's literal (quotes included) and the span of its
/// value.
fn validate(b: &[u8], mut field: impl FnMut(&[u8], usize, usize)) -> Option<(usize, usize)> {
    let mut stack: u128 = 0; // one bit per open container, 1 = object
    let mut depth: u32 = 0;
    let mut i = ws(b, 0);
    let start = i;
    // The root's member being read: its key's span and where its value starts.
    let mut member: Option<(usize, usize, usize)> = None;
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
                    let at = i;
                    i = key(b, i)?;
                    if depth == 1 {
                        member = Some(root_member(b, at, i));
                    }
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
            if depth == 1
                && let Some((key_start, key_end, value_start)) = member.take()
            {
                field(&b[key_start..key_end], value_start, i);
            }
            if depth == 0 {
                return (ws(b, i) == b.len()).then_some((start, i));
            }
            i = ws(b, i);
            let in_object = stack & 1 == 1;
            match (in_object, *b.get(i)?) {
                (true, b',') => {
                    let at = ws(b, i + 1);
                    i = key(b, at)?;
                    if depth == 1 {
                        member = Some(root_member(b, at, i));
                    }
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

/// A member of the root object whose key starts at `at` (its quote) and
/// whose value starts at `value`: the key's span and the value's start.
/// Only the root's members come here, so the key is walked twice at most
/// a few times per document.
#[cold]
fn root_member(b: &[u8], at: usize, value: usize) -> (usize, usize, usize) {
    (at, skip_str(b, at + 1).0, value)
}

/// Gives `value` to the slots of `keys` that `key` (a key's literal,
/// quotes included) names; a later member of the same name replaces an
/// earlier one, as in `serde_json`.
#[inline]
fn offer<'a>(key: &[u8], value: Lazy<'a>, keys: &[&str], out: &mut [Option<Lazy<'a>>]) {
    if keys.is_empty() {
        return;
    }
    let raw = &key[1..key.len() - 1];
    if memchr(b'\\', raw).is_some() {
        if let Some(name) = unescape(key) {
            for (slot, want) in out.iter_mut().zip(keys.iter().copied()) {
                if name == want {
                    *slot = Some(value);
                }
            }
        }
        return;
    }
    for (slot, want) in out.iter_mut().zip(keys.iter().copied()) {
        let want = want.as_bytes();
        // Length and first byte first: most keys differ there, and a
        // library memcmp call costs more than a short key.
        if raw.len() == want.len() && raw.first() == want.first() && raw == want {
            *slot = Some(value);
        }
    }
}

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
            let (key_end, _) = skip_str(b, i + 1);
            let colon = ws(b, key_end);
            let value_start = ws(b, colon + 1);
            let value_end = skip_value(b, value_start);
            offer(&b[i..key_end], Lazy(&b[value_start..value_end]), keys, out);
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
