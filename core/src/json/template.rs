//! Learned event shapes: a later event of the same shape is checked, not
//! scanned.

use super::syntax::{HI, specials, word_at};
use super::tape::{Skim, common_prefix, string_esc};
use super::view::{JsonKind, JsonView};

/// Most strings a [`Template`] lets vary.
const MAX_HOLES: usize = 8;

/// A learned event shape: the bytes of one event whose string values at
/// some places ("holes") may differ in later events.
///
/// Streams repeat one shape for nearly every event (a content delta whose
/// text changes). A protocol learns a template from an event it has just
/// classified on a [`Tape`](super::Tape), naming the string whose emptiness decided the
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

#[cfg(test)]
mod tests {
    use super::super::tape::{Parsed, Tape};
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
}
