//! Numbers written into strings without `core::fmt`.
//!
//! The ids and URLs the engine builds on every request are plain digits;
//! writing them by hand keeps the formatting machinery (`fmt::write`,
//! `Formatter`, the padding paths) out of what the wasm module links, where
//! it would cost more than the rest of the id handling together.

/// The ASCII digits of `n` in decimal, written at the end of `buf`.
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.get(at..).unwrap_or_default()
}

/// Appends `n` in decimal.
pub fn push_decimal(out: &mut String, n: u64) {
    for &d in decimal(n, &mut [0; 20]) {
        out.push(char::from(d));
    }
}

/// Writes `n` in decimal into `out` (a `Formatter` among others) without
/// integer `Display`, which the wasm module would otherwise link for the
/// policy's texts alone.
pub fn write_decimal(out: &mut impl core::fmt::Write, n: u64) -> core::fmt::Result {
    let mut digits = String::new();
    push_decimal(&mut digits, n);
    out.write_str(&digits)
}

/// `parts` one after the other, in one allocation (what `[..].concat()`
/// does, without the slice-joining machinery).
pub fn joined(parts: &[&str]) -> String {
    let mut out = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.push_str(part);
    }
    out
}

/// Whether `haystack` holds `needle`, ASCII letters compared without case
/// (`needle` written in lowercase). A plain scan: the texts it reads are
/// short (an error message's first 512 bytes), and it keeps str's
/// two-way searcher out of the wasm module.
pub fn contains_ignore_ascii_case(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty()
        || haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Appends `n` as sixteen lowercase hex digits (`{:016x}`).
pub fn push_hex16(out: &mut String, n: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for shift in (0..16).rev() {
        out.push(char::from(HEX[((n >> (shift * 4)) & 15) as usize]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joined_and_contains_read_as_std_does() {
        assert_eq!(
            joined(&["a", "", "bc", "/d"]),
            ["a", "", "bc", "/d"].concat()
        );
        assert_eq!(joined(&[]), "");
        let hay = b"This model's Maximum Context Length is 8192";
        assert!(contains_ignore_ascii_case(hay, b"maximum context length"));
        assert!(contains_ignore_ascii_case(hay, b""));
        assert!(!contains_ignore_ascii_case(hay, b"prompt is too long"));
        assert!(!contains_ignore_ascii_case(b"short", b"longer than it"));
    }

    #[test]
    fn numbers_are_written_as_format_writes_them() {
        for n in [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX] {
            let mut s = String::from("x");
            push_decimal(&mut s, n);
            assert_eq!(s, format!("x{n}"));
            let mut h = String::new();
            push_hex16(&mut h, n);
            assert_eq!(h, format!("{n:016x}"));
        }
    }
}
