//! The tape: one validating pass per event records every value's span,
//! and [`Skim`] answers look-ups by jumping between them.

use std::borrow::Cow;

#[cfg(all(test, feature = "serde_json"))]
use serde_json::Value;

use super::lazy::Lazy;
use super::syntax::{MAX_DEPTH, escape, literal, number, special_pos, unescape, ws};
use super::view::{JsonKind, JsonView};
use crate::wire::ProtocolViolation;

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
pub(super) fn common_prefix(left: &[u8], right: &[u8]) -> usize {
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
pub(super) fn string_esc(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
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
    Next(usize),
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
            After::Next(next) => i = next,
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
                return Some(After::Next(tape_key(b, ws(b, i + 1), nodes, open.cur)?));
            }
            (false, b',') => return Some(After::Next(i + 1)),
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
    pub(super) doc: &'a [u8],
    nodes: &'a [Node],
    pub(super) at: usize,
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
    pub(super) fn body_span(self) -> (usize, usize) {
        let n = self.node();
        (n.start as usize + 1, n.end as usize - 1)
    }
}
