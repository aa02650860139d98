//! Server retry hints: `retry-after-ms`, `Retry-After` in seconds, and
//! `Retry-After` as an HTTP-date in its three forms.
//!
//! A valid hint is a *minimum*: the retry waits `max(hint, jittered backoff)`.
//! A hint above the policy's ceiling or beyond the remaining budget refuses the
//! retry; it is never shortened (that would retry earlier than the server
//! asked). Invalid values are ignored and reported as such.

use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// The parsed hint and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(into = "Repr", try_from = "Repr")]
#[non_exhaustive]
pub enum RetryAfter {
    /// No hint was sent.
    #[default]
    Absent,
    /// A hint was sent but could not be parsed; it is ignored.
    Invalid,
    /// `retry-after-ms`.
    Millis(Duration),
    /// `Retry-After: <seconds>`.
    Seconds(Duration),
    /// `Retry-After: <HTTP-date>`, as a delay from the wall clock (0 if past).
    Date(Duration),
}

impl RetryAfter {
    /// The delay the hint asks for, if it is valid.
    pub fn delay(self) -> Option<Duration> {
        match self {
            RetryAfter::Millis(d) | RetryAfter::Seconds(d) | RetryAfter::Date(d) => Some(d),
            RetryAfter::Absent | RetryAfter::Invalid => None,
        }
    }

    /// The state name used in reports: `absent`, `invalid`, `millis`,
    /// `seconds` or `date`.
    pub fn state(self) -> &'static str {
        match self {
            RetryAfter::Absent => "absent",
            RetryAfter::Invalid => "invalid",
            RetryAfter::Millis(_) => "millis",
            RetryAfter::Seconds(_) => "seconds",
            RetryAfter::Date(_) => "date",
        }
    }

    /// Reads the hint from response headers. `retry-after-ms` wins over
    /// `Retry-After` when it is valid.
    pub fn from_headers(headers: &http::HeaderMap, wall_now: SystemTime) -> Self {
        // A value that is not visible ASCII is present but unreadable.
        let value = |name| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
        RetryAfter::from_values(value("retry-after-ms"), value("retry-after"), wall_now)
    }

    /// Reads the hint from the raw values of `retry-after-ms` and
    /// `Retry-After` (for drivers whose headers are not an `http::HeaderMap`,
    /// such as fetch). `retry-after-ms` wins when it is valid.
    pub fn from_values(
        retry_after_ms: Option<&str>,
        retry_after: Option<&str>,
        wall_now: SystemTime,
    ) -> Self {
        let ms = retry_after_ms.map(parse_millis);
        if let Some(hint @ RetryAfter::Millis(_)) = ms {
            return hint;
        }
        let secs = retry_after.map(|v| parse_retry_after(v, wall_now));
        match (secs, ms) {
            (Some(hint), _) if hint.delay().is_some() => hint,
            (Some(_), _) | (None, Some(_)) => RetryAfter::Invalid,
            (None, None) => RetryAfter::Absent,
        }
    }
}

/// Reads `x-should-retry`: `true` or `false` (surrounding spaces allowed);
/// anything else is no hint.
pub(crate) fn parse_should_retry(value: &str) -> Option<bool> {
    match value.trim() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// The serde form: `{"state": "seconds", "delay_ms": 2000}`.
#[derive(Serialize, Deserialize)]
struct Repr {
    state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    delay_ms: Option<u64>,
}

impl From<RetryAfter> for Repr {
    fn from(r: RetryAfter) -> Self {
        Repr {
            state: r.state().to_owned(),
            delay_ms: r.delay().map(|d| d.as_millis() as u64),
        }
    }
}

impl TryFrom<Repr> for RetryAfter {
    type Error = String;
    fn try_from(r: Repr) -> Result<Self, String> {
        let delay = || {
            r.delay_ms
                .map(Duration::from_millis)
                .ok_or_else(|| format!("state {} needs delay_ms", r.state))
        };
        Ok(match r.state.as_str() {
            "absent" => RetryAfter::Absent,
            "invalid" => RetryAfter::Invalid,
            "millis" => RetryAfter::Millis(delay()?),
            "seconds" => RetryAfter::Seconds(delay()?),
            "date" => RetryAfter::Date(delay()?),
            other => return Err(format!("unknown Retry-After state {other}")),
        })
    }
}

/// Longest hint representable without overflow concerns (about 31 years).
const MAX_SECONDS: u64 = 1 << 30;

/// Parses a `Retry-After` value: `1*DIGIT` seconds or an HTTP-date
/// (IMF-fixdate, RFC 850, asctime) compared with `wall_now`.
pub(crate) fn parse_retry_after(value: &str, wall_now: SystemTime) -> RetryAfter {
    let value = value.trim();
    if value.is_empty() {
        return RetryAfter::Invalid;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        return match value.parse::<u64>() {
            Ok(s) if s <= MAX_SECONDS => RetryAfter::Seconds(Duration::from_secs(s)),
            _ => RetryAfter::Invalid,
        };
    }
    match crate::http_date::parse(value) {
        Some(at) => {
            let now = wall_now
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or(Duration::ZERO);
            RetryAfter::Date(Duration::from_secs(at).saturating_sub(now))
        }
        None => RetryAfter::Invalid,
    }
}

/// Parses `retry-after-ms`: decimal milliseconds (fractions accepted, as the
/// provider SDKs do), non-negative and finite.
pub(crate) fn parse_millis(value: &str) -> RetryAfter {
    let value = value.trim();
    let well_formed = !value.is_empty()
        && value.len() <= 24
        && value.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && value.bytes().filter(|b| *b == b'.').count() <= 1
        && value.bytes().next().is_some_and(|b| b.is_ascii_digit());
    if !well_formed {
        return RetryAfter::Invalid;
    }
    match decimal_f64(value) {
        Some(ms) if ms.is_finite() && ms >= 0.0 && ms <= (MAX_SECONDS * 1000) as f64 => {
            RetryAfter::Millis(Duration::from_micros((ms * 1000.0) as u64))
        }
        _ => RetryAfter::Invalid,
    }
}

/// `digits[.digits]` (at most 38 digits in all) as the nearest `f64`, ties
/// to even: what `str::parse::<f64>` gives, with integer arithmetic only.
fn decimal_f64(text: &str) -> Option<f64> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if int.len() + frac.len() > 38 {
        return None;
    }
    let mut n: u128 = 0;
    for d in int.bytes().chain(frac.bytes()) {
        n = n * 10 + u128::from(d.checked_sub(b'0').filter(|d| *d < 10)?);
    }
    if n == 0 {
        return Some(0.0);
    }
    let den = 10u128.pow(frac.len() as u32);
    // n / den = (q + r / den) × 2^e, q brought to 54 bits (53 and a guard).
    let (mut q, mut r, mut e) = (n / den, n % den, 0i32);
    let mut sticky = false;
    while q >= 1 << 54 {
        sticky |= q & 1 == 1;
        q >>= 1;
        e += 1;
    }
    while q < 1 << 53 {
        let twice = r * 2;
        q = q * 2 + u128::from(twice >= den);
        r = if twice >= den { twice - den } else { twice };
        e -= 1;
    }
    sticky |= r != 0;
    let mut mantissa = (q >> 1) as u64;
    if q & 1 == 1 && (sticky || mantissa & 1 == 1) {
        mantissa += 1;
    }
    // 2^(e + 1), exact: the exponent stays far inside the normal range.
    let scale = f64::from_bits(((1023 + e + 1) as u64) << 52);
    Some(mantissa as f64 * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_round_as_a_float_parse_does() {
        let mut cases: Vec<String> = [
            "0",
            "0.0",
            "1",
            "1.",
            "0.5",
            "2.5",
            "0.1",
            "0.3",
            "1000",
            "1500.5",
            "9007199254740992",
            "9007199254740993",
            "9007199254740995",
            "9007199254740993.0000001",
            "18014398509481983",
            "123456789012345678901234",
            "0.00000000000000000000001",
            "99999999999999999999999",
            "1.7976931348623157",
            "4.9406564584124654",
            "2.2250738585072014",
            "31536000000",
            "31536000000.000001",
            "0.0000000000000000000000",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = 1 + (x % 23) as usize;
            let mut s: String = (0..len)
                .map(|i| char::from(b'0' + ((x >> (i % 60)) ^ (i as u64 * 7)) as u8 % 10))
                .collect();
            let dot = (x >> 40) as usize % (len + 1);
            if dot < len {
                s.insert(dot.max(1), '.');
            }
            cases.push(s);
        }
        for s in &cases {
            assert_eq!(decimal_f64(s), s.parse::<f64>().ok(), "{s}");
        }
    }

    fn wall() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1000)
    }

    #[test]
    fn parse_vectors_of_the_protocol_sheet() {
        let nines = "9".repeat(5000);
        let table: &[(&str, RetryAfter)] = &[
            ("2", RetryAfter::Seconds(Duration::from_secs(2))),
            ("0", RetryAfter::Seconds(Duration::ZERO)),
            (
                "Thu, 01 Jan 1970 00:16:42 GMT",
                RetryAfter::Date(Duration::from_secs(2)),
            ),
            (
                "Thursday, 01-Jan-70 00:16:42 GMT",
                RetryAfter::Date(Duration::from_secs(2)),
            ),
            (
                "Thu Jan  1 00:16:42 1970",
                RetryAfter::Date(Duration::from_secs(2)),
            ),
            (
                "Thu, 01 Jan 1970 00:16:39 GMT",
                RetryAfter::Date(Duration::ZERO),
            ),
            ("1.5", RetryAfter::Invalid),
            ("-1", RetryAfter::Invalid),
            (&nines, RetryAfter::Invalid),
            ("", RetryAfter::Invalid),
            ("Thu, 99 Foo 1970 00:16:39 GMT", RetryAfter::Invalid),
            ("soon", RetryAfter::Invalid),
        ];
        for (value, want) in table {
            assert_eq!(
                parse_retry_after(value, wall()),
                *want,
                "Retry-After: {value:.40}"
            );
        }
    }

    #[test]
    fn serde_form_is_state_and_milliseconds() {
        let json = serde_json::to_string(&RetryAfter::Seconds(Duration::from_secs(2))).unwrap();
        assert_eq!(json, r#"{"state":"seconds","delay_ms":2000}"#);
        assert_eq!(
            serde_json::to_string(&RetryAfter::Absent).unwrap(),
            r#"{"state":"absent"}"#
        );
        for r in [
            RetryAfter::Absent,
            RetryAfter::Invalid,
            RetryAfter::Millis(Duration::from_millis(1500)),
            RetryAfter::Date(Duration::ZERO),
        ] {
            let back: RetryAfter =
                serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
            assert_eq!(back, r);
        }
    }

    #[test]
    fn should_retry_reads_only_true_and_false() {
        assert_eq!(parse_should_retry(" true"), Some(true));
        assert_eq!(parse_should_retry("false"), Some(false));
        assert_eq!(parse_should_retry("yes"), None);
        assert_eq!(
            RetryAfter::from_values(Some("1500"), Some("2"), wall()),
            RetryAfter::Millis(Duration::from_millis(1500))
        );
        assert_eq!(
            RetryAfter::from_values(None, Some("\u{fffd}"), wall()),
            RetryAfter::Invalid
        );
    }

    #[test]
    fn millis_win_over_seconds() {
        let mut h = http::HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        h.insert("retry-after-ms", "1500".parse().unwrap());
        assert_eq!(
            RetryAfter::from_headers(&h, wall()),
            RetryAfter::Millis(Duration::from_millis(1500))
        );
    }

    #[test]
    fn invalid_millis_fall_back_to_seconds() {
        let mut h = http::HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        h.insert("retry-after-ms", "-5".parse().unwrap());
        assert_eq!(
            RetryAfter::from_headers(&h, wall()),
            RetryAfter::Seconds(Duration::from_secs(2))
        );
    }

    #[test]
    fn absent_and_invalid_headers() {
        let h = http::HeaderMap::new();
        assert_eq!(RetryAfter::from_headers(&h, wall()), RetryAfter::Absent);
        let mut h = http::HeaderMap::new();
        h.insert("retry-after", "later".parse().unwrap());
        assert_eq!(RetryAfter::from_headers(&h, wall()), RetryAfter::Invalid);
        assert_eq!(parse_millis("1e3"), RetryAfter::Invalid);
        assert_eq!(parse_millis("NaN"), RetryAfter::Invalid);
        assert_eq!(
            parse_millis("1500.5"),
            RetryAfter::Millis(Duration::from_micros(1_500_500))
        );
    }
}
