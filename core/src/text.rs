//! Numbers written into strings without `core::fmt`.
//!
//! The ids and URLs the engine builds on every request are plain digits;
//! writing them by hand keeps the formatting machinery (`fmt::write`,
//! `Formatter`, the padding paths) out of what the wasm module links, where
//! it would cost more than the rest of the id handling together.

/// Appends `n` in decimal.
pub fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in digits.get(at..).unwrap_or_default() {
        out.push(char::from(d));
    }
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
