//! Writing JSON: string literals, and byte edits to a document that keep
//! every byte they do not name.

use super::lazy::Lazy;
use super::view::JsonView;

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
        // A body gets a handful of edits; edits at one place go in the
        // order they were made.
        crate::small_sort::sort_by_key(&mut self.edits, |e| (e.0, e.1));
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
