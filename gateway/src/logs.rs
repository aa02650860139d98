//! Structured logs: one JSON object per line on stderr.
//!
//! Lines carry names, ids, counts and statuses only. Nothing here takes a
//! header map, a body or a request: a field is a `&str` or a number the
//! caller chose, so a credential or a prompt can only reach a log line if a
//! call site names it, and none does.

use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// The severity of a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
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
            Level::Info => "info",
            Level::Warn => "warn",
            Level::Error => "error",
        }
    }
}

/// Where log lines go.
#[derive(Clone, Default)]
pub enum Logger {
    /// Standard error (the binary).
    #[default]
    Stderr,
    /// Nowhere.
    Off,
    /// Kept in memory, for tests that assert on them.
    Memory(Arc<Mutex<Vec<String>>>),
}

impl std::fmt::Debug for Logger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Logger::Stderr => "Logger::Stderr",
            Logger::Off => "Logger::Off",
            Logger::Memory(_) => "Logger::Memory",
        })
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
    /// A logger that keeps its lines, and the lines it keeps.
    pub fn memory() -> (Logger, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        (Logger::Memory(Arc::clone(&lines)), lines)
    }

    /// Writes one line: `ts` (RFC 3339, UTC), `level`, `msg`, `event` and
    /// `fields`.
    pub fn log(&self, level: Level, event: &str, msg: &str, fields: &[(&str, Field<'_>)]) {
        if matches!(self, Logger::Off) {
            return;
        }
        let mut line = Map::new();
        line.insert("ts".into(), Value::String(now_rfc3339()));
        line.insert("level".into(), Value::String(level.name().into()));
        line.insert("msg".into(), Value::String(msg.into()));
        line.insert("event".into(), Value::String(event.into()));
        for (name, value) in fields {
            let v = match value {
                Field::Str(s) => Value::String((*s).to_owned()),
                Field::U64(n) => Value::from(*n),
                Field::Bool(b) => Value::Bool(*b),
            };
            line.insert((*name).to_owned(), v);
        }
        let text = Value::Object(line).to_string();
        match self {
            Logger::Off => {}
            Logger::Stderr => {
                let mut err = std::io::stderr().lock();
                // A closed stderr must not take the gateway down.
                let _ = writeln!(err, "{text}");
            }
            Logger::Memory(lines) => lines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(text),
        }
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

/// The current time as RFC 3339 UTC with milliseconds, without a date
/// crate: days to a civil date by Howard Hinnant's algorithm.
fn now_rfc3339() -> String {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
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
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
