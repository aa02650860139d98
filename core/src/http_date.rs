//! HTTP-dates (RFC 9110 §5.6.7), read into seconds since the Unix epoch.
//!
//! `Retry-After` may carry a date instead of seconds. A recipient must
//! accept the three historical forms:
//!
//! - IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT` (what servers send today);
//! - RFC 850, `Sunday, 06-Nov-94 08:49:37 GMT` (two-digit year: 00–69 is
//!   20xx, 70–99 is 19xx);
//! - asctime, `Sun Nov  6 08:49:37 1994` (day padded with a space).
//!
//! Written here rather than borrowed so that the engine needs no
//! `SystemTime` arithmetic that can fail, and a browser module carries only
//! this small parser. Dates before 1970 or after 9999 are refused.

/// Seconds since 1970-01-01T00:00:00Z, or `None` when `value` is not an
/// HTTP-date.
pub(crate) fn parse(value: &str) -> Option<u64> {
    let b = value.as_bytes();
    let date = if b.len() == 29 && b[3] == b',' {
        imf_fixdate(b)
    } else if b.len() == 24 && b[3] == b' ' {
        asctime(b)
    } else {
        rfc850(b)
    }?;
    date.seconds()
}

struct Date {
    year: u64,
    month: u64,
    day: u64,
    hour: u64,
    minute: u64,
    second: u64,
}

const WEEKDAYS: [&[u8]; 7] = [
    b"Monday",
    b"Tuesday",
    b"Wednesday",
    b"Thursday",
    b"Friday",
    b"Saturday",
    b"Sunday",
];
const MONTHS: [&[u8; 3]; 12] = [
    b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec",
];

/// `Sun, 06 Nov 1994 08:49:37 GMT`
fn imf_fixdate(b: &[u8]) -> Option<Date> {
    short_weekday(&b[..3])?;
    if &b[3..5] != b", " || b[7] != b' ' || b[11] != b' ' || b[16] != b' ' || &b[25..] != b" GMT" {
        return None;
    }
    let (hour, minute, second) = time(&b[17..25])?;
    Some(Date {
        day: digits(&b[5..7])?,
        month: month(&b[8..11])?,
        year: digits(&b[12..16])?,
        hour,
        minute,
        second,
    })
}

/// `Sunday, 06-Nov-94 08:49:37 GMT`
fn rfc850(b: &[u8]) -> Option<Date> {
    let comma = b.iter().position(|&c| c == b',')?;
    if !WEEKDAYS.contains(&&b[..comma]) {
        return None;
    }
    let rest = &b[comma..];
    if rest.len() != 24
        || &rest[..2] != b", "
        || rest[4] != b'-'
        || rest[8] != b'-'
        || rest[11] != b' '
        || &rest[20..] != b" GMT"
    {
        return None;
    }
    let yy = digits(&rest[9..11])?;
    let (hour, minute, second) = time(&rest[12..20])?;
    Some(Date {
        day: digits(&rest[2..4])?,
        month: month(&rest[5..8])?,
        year: if yy < 70 { 2000 + yy } else { 1900 + yy },
        hour,
        minute,
        second,
    })
}

/// `Sun Nov  6 08:49:37 1994`
fn asctime(b: &[u8]) -> Option<Date> {
    short_weekday(&b[..3])?;
    if b[3] != b' ' || b[7] != b' ' || b[10] != b' ' || b[19] != b' ' {
        return None;
    }
    let day = match b[8] {
        b' ' => digits(&b[9..10])?,
        _ => digits(&b[8..10])?,
    };
    let (hour, minute, second) = time(&b[11..19])?;
    Some(Date {
        day,
        month: month(&b[4..7])?,
        year: digits(&b[20..24])?,
        hour,
        minute,
        second,
    })
}

fn short_weekday(b: &[u8]) -> Option<()> {
    WEEKDAYS.iter().any(|w| &w[..3] == b).then_some(())
}

fn month(b: &[u8]) -> Option<u64> {
    MONTHS
        .iter()
        .position(|m| &m[..] == b)
        .map(|i| i as u64 + 1)
}

/// `HH:MM:SS`
fn time(b: &[u8]) -> Option<(u64, u64, u64)> {
    if b[2] != b':' || b[5] != b':' {
        return None;
    }
    Some((digits(&b[..2])?, digits(&b[3..5])?, digits(&b[6..8])?))
}

fn digits(b: &[u8]) -> Option<u64> {
    b.iter().try_fold(0u64, |n, &c| {
        c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0'))
    })
}

impl Date {
    fn seconds(&self) -> Option<u64> {
        let leap = is_leap(self.year);
        let month_days = match self.month {
            2 if leap => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        if !(1970..=9999).contains(&self.year)
            || self.day == 0
            || self.day > month_days
            || self.hour > 23
            || self.minute > 59
            || self.second > 59
        {
            return None;
        }
        Some(
            days_since_epoch(self.year, self.month, self.day) * 86_400
                + self.hour * 3600
                + self.minute * 60
                + self.second,
        )
    }
}

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian), for
/// years from 1970: the count of days in the whole years before, then in
/// the whole months before, then the day.
fn days_since_epoch(year: u64, month: u64, day: u64) -> u64 {
    const BEFORE_MONTH: [u64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let y = year - 1;
    let leaps = |y: u64| y / 4 - y / 100 + y / 400;
    let leap = is_leap(year);
    let before = (year - 1970) * 365 + leaps(y) - leaps(1969);
    let in_year = BEFORE_MONTH[month as usize - 1] + u64::from(leap && month > 2) + day - 1;
    before + in_year
}

/// Gregorian: every fourth year, except centuries not divisible by 400.
fn is_leap(year: u64) -> bool {
    year.is_multiple_of(4) && (!year.is_multiple_of(100) || year.is_multiple_of(400))
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::{Duration, SystemTime};

    #[test]
    fn the_three_forms_of_rfc_9110() {
        for value in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(parse(value), Some(784_111_777), "{value}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_date() {
        for value in [
            "",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 31 Nov 1994 08:49:37 GMT",
            "Sun, 29 Feb 1900 08:49:37 GMT",
            "Sun, 06 Nov 1969 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:60:00 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Xyz, 06 Nov 1994 08:49:37 GMT",
            "Sun, 0x Nov 1994 08:49:37 GMT",
            "Someday, 06-Nov-94 08:49:37 GMT",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sun Nov 06 08:49:37 94",
            "Sun, 06 Nov 1994 08:49:37 GMT\u{e9}",
            "\u{e9}un, 06 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse(value), None, "{value}");
        }
    }

    /// Every day from 1970 to 2100 at a few times, in each form, against
    /// the `httpdate` crate, which formats the IMF-fixdate and parses all
    /// three.
    #[test]
    fn agrees_with_httpdate_on_every_day_of_130_years() {
        const MONTHS: [&str; 12] = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ];
        for day in 0..(130 * 366) {
            for second_of_day in [0, 43_199, 86_399] {
                let secs = day * 86_400 + second_of_day;
                let at = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
                let imf = httpdate::fmt_http_date(at);
                assert_eq!(parse(&imf), Some(secs), "{imf}");
                // The same instant in asctime, rebuilt from the IMF parts.
                let (wd, rest) = imf.split_at(3);
                let d: u32 = rest[2..4].parse().unwrap();
                let (month, year, time) = (&rest[5..8], &rest[9..13], &rest[14..22]);
                let asc = format!("{wd} {month} {d:>2} {time} {year}");
                assert_eq!(parse(&asc), Some(secs), "{asc}");
                assert_eq!(
                    httpdate::parse_http_date(&asc).ok(),
                    Some(at),
                    "httpdate reads {asc}"
                );
                assert!(MONTHS.contains(&month));
            }
        }
    }
}
