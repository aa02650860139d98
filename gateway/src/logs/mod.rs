//! Structured logs: one JSON object per line on stderr.
//!
//! At the default level (`info`) a stream that goes well writes one line,
//! at its end; the steps on its way (forwarded, answered, numbered,
//! completed upstream) are `debug`, written at `--log-level debug`. Faults
//! (a replay, a failover, a failed attempt) and what an operator acts on
//! stay `info` and above.
//!
//! Lines reach standard error through a bounded queue and a thread of
//! their own (`logs/writer.rs`): a reader of standard error that stops reading
//! costs lines (counted in a `log_lines_dropped` line), never a stalled
//! worker. [`flush`] waits for what is queued, as the binary does before
//! it exits.
//!
//! Lines carry names, ids, counts and statuses only. Nothing here takes a
//! header map, a body or a request: a field is a `&str` or a number the
//! caller chose, so a credential or a prompt can only reach a log line if a
//! call site names it, and none does.

mod writer;

use std::io::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use writer::Lines;

/// The writer thread of standard error, started by the first line; `None`
/// when no thread could be made (lines are then written where they are
/// logged).
static STDERR: OnceLock<Option<Lines>> = OnceLock::new();

fn stderr_lines() -> Option<&'static Lines> {
    STDERR
        .get_or_init(|| Lines::spawn(Box::new(std::io::stderr()), writer::QUEUE).ok())
        .as_ref()
}

/// Waits, at most `within`, until every line logged to standard error so
/// far is written; whether it was.
pub fn flush(within: Duration) -> bool {
    STDERR
        .get()
        .and_then(Option::as_ref)
        .is_none_or(|lines| lines.flush(within))
}

/// The severity of a line, the least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The steps of a request that goes well.
    Debug,
    /// Lifecycle facts.
    Info,
    /// Something degraded (a stream no longer resumable, a failed stream).
    Warn,
    /// Something the gateway could not do.
    Error,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

impl Level {
    /// The level named `name` (`debug`, `info`, `warn`, `error`).
    pub fn parse(name: &str) -> Option<Level> {
        match name {
            "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" => Some(Level::Warn),
            "error" => Some(Level::Error),
            _ => None,
        }
    }
}

/// Where log lines go, and the least level written.
#[derive(Clone)]
pub struct Logger {
    sink: Sink,
    min: Level,
}

#[derive(Clone)]
enum Sink {
    Stderr,
    Off,
    Memory(Arc<Mutex<Vec<String>>>),
}

impl Default for Logger {
    /// Standard error, from `info`.
    fn default() -> Self {
        Logger::stderr()
    }
}

impl std::fmt::Debug for Logger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sink = match self.sink {
            Sink::Stderr => "stderr",
            Sink::Off => "off",
            Sink::Memory(_) => "memory",
        };
        write!(f, "Logger({sink}, from {})", self.min.name())
    }
}

/// A field value: text the call site chose, or a number.
#[derive(Debug, Clone)]
pub enum Field<'a> {
    /// A string.
    Str(&'a str),
    /// An unsigned number.
    U64(u64),
    /// A flag.
    Bool(bool),
}

impl<'a> From<&'a str> for Field<'a> {
    fn from(s: &'a str) -> Self {
        Field::Str(s)
    }
}

impl<'a> From<&'a String> for Field<'a> {
    fn from(s: &'a String) -> Self {
        Field::Str(s)
    }
}

impl From<u64> for Field<'_> {
    fn from(n: u64) -> Self {
        Field::U64(n)
    }
}

impl From<u16> for Field<'_> {
    fn from(n: u16) -> Self {
        Field::U64(u64::from(n))
    }
}

impl From<bool> for Field<'_> {
    fn from(b: bool) -> Self {
        Field::Bool(b)
    }
}

impl Logger {
    /// Standard error (the binary), from `info`.
    pub fn stderr() -> Logger {
        Logger {
            sink: Sink::Stderr,
            min: Level::Info,
        }
    }

    /// Nowhere.
    pub fn off() -> Logger {
        Logger {
            sink: Sink::Off,
            min: Level::Error,
        }
    }

    /// A logger that keeps every line (`debug` too), and the lines it
    /// keeps: for tests that assert on them.
    pub fn memory() -> (Logger, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let logger = Logger {
            sink: Sink::Memory(Arc::clone(&lines)),
            min: Level::Debug,
        };
        (logger, lines)
    }

    /// The same sink, writing from `min` up.
    pub fn from_level(self, min: Level) -> Logger {
        Logger { min, ..self }
    }

    /// The least level written.
    pub fn level(&self) -> Level {
        self.min
    }

    /// Writes one line: `ts` (RFC 3339, UTC), `level`, `msg`, `event` and
    /// `fields`, when `level` is at least the logger's.
    pub fn log(&self, level: Level, event: &str, msg: &str, fields: &[(&str, Field<'_>)]) {
        if level < self.min || matches!(self.sink, Sink::Off) {
            return;
        }
        let text = line(level, event, msg, fields);
        match &self.sink {
            Sink::Off => {}
            Sink::Stderr => {
                if let Some(lines) = stderr_lines() {
                    lines.send(text);
                } else {
                    let mut text = text;
                    text.push('\n');
                    // A closed stderr must not take the gateway down.
                    let _ = std::io::stderr().lock().write_all(text.as_bytes());
                }
            }
            Sink::Memory(lines) => lines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(text),
        }
    }

    /// [`Logger::log`] at [`Level::Debug`].
    pub fn debug(&self, event: &str, msg: &str, fields: &[(&str, Field<'_>)]) {
        self.log(Level::Debug, event, msg, fields);
    }

    /// [`Logger::log`] at [`Level::Info`].
    pub fn info(&self, event: &str, msg: &str, fields: &[(&str, Field<'_>)]) {
        self.log(Level::Info, event, msg, fields);
    }

    /// [`Logger::log`] at [`Level::Warn`].
    pub fn warn(&self, event: &str, msg: &str, fields: &[(&str, Field<'_>)]) {
        self.log(Level::Warn, event, msg, fields);
    }
}

/// One line's JSON object, written out directly: `ts`, `level`, `msg` and
/// `event`, then the fields in the order given (a field named as one of
/// the first four is left out, so a key is never written twice).
fn line(level: Level, event: &str, msg: &str, fields: &[(&str, Field<'_>)]) -> String {
    const OWN: [&str; 4] = ["ts", "level", "msg", "event"];
    let mut out = String::with_capacity(160 + 32 * fields.len());
    out.push_str("{\"ts\":\"");
    out.push_str(&now_rfc3339());
    out.push_str("\",\"level\":\"");
    out.push_str(level.name());
    out.push_str("\",\"msg\":");
    push_json_str(&mut out, msg);
    out.push_str(",\"event\":");
    push_json_str(&mut out, event);
    for (name, value) in fields.iter().filter(|(n, _)| !OWN.contains(n)) {
        out.push(',');
        push_json_str(&mut out, name);
        out.push(':');
        match value {
            Field::Str(s) => push_json_str(&mut out, s),
            Field::U64(n) => recovery_core::text::push_decimal(&mut out, *n),
            Field::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
    out.push('}');
    out
}

/// `s` as a JSON string: quoted, with `"`, `\` and control characters
/// escaped.
fn push_json_str(out: &mut String, s: &str) {
    out.push('"');
    let mut rest = s;
    while let Some(at) = rest.find(|c: char| c == '"' || c == '\\' || c < ' ') {
        out.push_str(&rest[..at]);
        let c = rest[at..].chars().next().unwrap_or_default();
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            other => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                let n = u32::from(other) as usize;
                out.push_str("\\u00");
                out.push(char::from(HEX[n >> 4]));
                out.push(char::from(HEX[n & 0xf]));
            }
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.push_str(rest);
    out.push('"');
}

/// The current time as RFC 3339 UTC with milliseconds, without a date
/// crate: days to a civil date by Howard Hinnant's algorithm.
fn now_rfc3339() -> String {
    rfc3339(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// `since` the Unix epoch as RFC 3339 UTC with milliseconds.
fn rfc3339(since: std::time::Duration) -> String {
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let mut out = String::with_capacity(24);
    // Each part zero-padded to its width, written digit by digit (the
    // formatting machinery cost more than the rest of a log line).
    let mut digits = |n: u64, width: u32, after: char| {
        for at in (0..width).rev() {
            let digit = n / 10u64.pow(at) % 10;
            out.push(char::from(b'0' + digit as u8));
        }
        out.push(after);
    };
    digits(u64::try_from(y).unwrap_or(0), 4, '-');
    digits(u64::try_from(m).unwrap_or(0), 2, '-');
    digits(u64::try_from(d).unwrap_or(0), 2, 'T');
    digits(rem / 3600, 2, ':');
    digits(rem % 3600 / 60, 2, ':');
    digits(rem % 60, 2, '.');
    digits(u64::from(since.subsec_millis()), 3, 'Z');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn one_json_object_per_line() {
        let (logger, lines) = Logger::memory();
        logger.info("request", "forwarded", &[("status", 200u16.into())]);
        let lines = lines.lock().unwrap();
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["event"], "request");
        assert_eq!(v["status"], 200);
        let ts = v["ts"].as_str().unwrap();
        assert_eq!(ts.len(), 24, "{ts}");
        assert!(ts.ends_with('Z') && ts.starts_with("20"), "{ts}");
        assert_eq!(&ts[4..5], "-");
        assert_eq!(&ts[10..11], "T");
        assert_eq!(&ts[19..20], ".");
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_milliseconds() {
        use std::time::Duration;
        assert_eq!(rfc3339(Duration::ZERO), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(Duration::from_millis(1_700_000_000_123)),
            "2023-11-14T22:13:20.123Z"
        );
        assert_eq!(
            rfc3339(Duration::from_millis(951_782_400_007)),
            "2000-02-29T00:00:00.007Z"
        );
        assert_eq!(
            rfc3339(Duration::from_millis(4_102_444_799_999)),
            "2099-12-31T23:59:59.999Z"
        );
    }

    #[test]
    fn text_is_escaped_and_keys_are_written_once() {
        let (logger, lines) = Logger::memory();
        let odd = "a \"quote\", a \\ backslash,\na newline, \u{1} and ünïcode";
        logger.warn(
            "odd",
            odd,
            &[
                ("detail", Field::Str(odd)),
                ("level", Field::Str("not the level")),
                ("count", Field::U64(u64::MAX)),
                ("flag", Field::Bool(false)),
            ],
        );
        let lines = lines.lock().unwrap();
        assert!(!lines[0].contains('\n'), "{}", lines[0]);
        let v: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(v["msg"], odd);
        assert_eq!(v["detail"], odd);
        assert_eq!(v["level"], "warn");
        assert_eq!(v["count"], u64::MAX);
        assert_eq!(v["flag"], false);
        assert_eq!(lines[0].matches("\"level\"").count(), 1, "{}", lines[0]);
    }

    #[test]
    fn lines_below_the_level_are_not_written() {
        let (logger, lines) = Logger::memory();
        logger.debug("step", "a step", &[]);
        let logger = logger.from_level(Level::Info);
        logger.debug("step", "another step", &[]);
        logger.info("end", "the end", &[]);
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("\"level\":\"debug\""));
        assert!(lines[1].contains("\"event\":\"end\""));
        assert_eq!(Level::parse("warn"), Some(Level::Warn));
        assert_eq!(Level::parse("verbose"), None);
    }
}
