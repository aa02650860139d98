//! JSON's lexical pieces, checked byte by byte: whitespace, string bodies
//! and their escapes (eight bytes at a time), numbers (and whether one
//! overflows an `f64`), literals, keys; the string unescaper.

#[inline]
pub(super) fn ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

const LO: u64 = 0x0101_0101_0101_0101;
pub(super) const HI: u64 = 0x8080_8080_8080_8080;

/// The eight bytes of `s` at `i` as a word.
/// Written byte by byte, which the compiler fuses into one load at every
/// optimisation level (a `copy_from_slice` stays a call at opt-level "z").
/// Always inlined: at opt-level "z" (the wasm package) a call per word
/// costs the scanner a third of its speed (measured in Node).
#[allow(clippy::inline_always)]
#[inline(always)]
pub(super) fn word_at(s: &[u8], i: usize) -> u64 {
    let w = &s[i..i + 8];
    u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])
}

/// The high bit of every byte of `x` that is `"`, `\` or a control byte
/// (exact for the lowest one flagged, which is all a scan reads).
/// Always inlined, as `word_at` is: it runs per word.
#[allow(clippy::inline_always)]
#[inline(always)]
pub(super) fn specials(x: u64) -> u64 {
    let q = x ^ (LO * u64::from(b'"'));
    let bs = x ^ (LO * u64::from(b'\\'));
    ((q.wrapping_sub(LO) & !q) | (bs.wrapping_sub(LO) & !bs) | (x.wrapping_sub(LO * 0x20) & !x))
        & HI
}

/// Position of the first `"`, `\` or control byte, eight bytes at a time.
#[inline]
pub(super) fn special_pos(s: &[u8]) -> Option<usize> {
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

pub(super) fn escape(b: &[u8], i: usize) -> Option<usize> {
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
pub(super) fn string(b: &[u8], mut i: usize) -> Option<usize> {
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

pub(super) fn number(b: &[u8], start: usize) -> Option<usize> {
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

pub(super) fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    (b.get(i..i + word.len())? == word).then_some(i + word.len())
}

/// Expects a key and its colon at `i`; returns where the value starts.
pub(super) fn key(b: &[u8], i: usize) -> Option<usize> {
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
pub(super) const MAX_DEPTH: u32 = 127;

#[cfg(test)]
mod tests {
    use super::*;

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
