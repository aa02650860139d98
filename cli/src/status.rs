//! The live status line: one line on stderr, when stderr is a terminal,
//! saying what recovery is doing while the answer is not flowing
//! ("Reconnecting… attempt 2/3, retry in 1.2 s"). It follows
//! [`RecoveryStatus`], the status the engine derives from its events, and is
//! cleared as soon as output flows again or the request ends.

use std::fmt::Write as _;
use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use recovery_core::RecoveryStatus;
use recovery_core::lifecycle::{EventKind, LifecycleEvent};

/// What the status line says, from the lifecycle events.
#[derive(Debug, Clone)]
pub struct StatusLine {
    status: RecoveryStatus,
    /// The last attempt started, and how many the policy allows.
    attempt: u32,
    max_attempts: u32,
    /// The next send is a resume, not a replay.
    resuming: bool,
    /// The last attempt failed: the next one is being prepared.
    failed: bool,
    /// When the scheduled wait ends.
    retry_at: Option<Instant>,
    admission: bool,
}

impl Default for StatusLine {
    fn default() -> Self {
        StatusLine {
            status: RecoveryStatus::InProgress,
            attempt: 0,
            max_attempts: 0,
            resuming: false,
            failed: false,
            retry_at: None,
            admission: false,
        }
    }
}

impl StatusLine {
    /// Takes in `event`, seen at `now`.
    pub fn on_event(&mut self, event: &LifecycleEvent, now: Instant) {
        self.status = self.status.after(&event.kind);
        match &event.kind {
            EventKind::AttemptStarted {
                max_attempts,
                resume,
                ..
            } => {
                self.attempt = event.identity.wire_attempt;
                self.max_attempts = *max_attempts;
                self.resuming = *resume;
                self.failed = false;
                self.retry_at = None;
                self.admission = false;
            }
            EventKind::AttemptFailed { .. } => self.failed = true,
            EventKind::DelayScheduled { delay_ms, .. } => {
                self.retry_at = Some(now + *delay_ms);
            }
            EventKind::RetryStarted => {
                self.retry_at = None;
                self.resuming = false;
            }
            EventKind::ResumeStarted => {
                self.retry_at = None;
                self.resuming = true;
            }
            EventKind::AdmissionPending => self.admission = true,
            EventKind::AdmissionAllowed
            | EventKind::AdmissionRejected
            | EventKind::AdmissionUnresolved => self.admission = false,
            _ => {}
        }
    }

    /// The line to show at `now`, or `None` when nothing should be shown
    /// (output flows, or the request ended).
    pub fn text(&self, now: Instant) -> Option<String> {
        match self.status {
            RecoveryStatus::Reconnecting => {}
            RecoveryStatus::WaitingForNetwork => {
                return Some(String::from("Offline: waiting for the network…"));
            }
            _ => return None,
        }
        let verb = if self.resuming {
            "Resuming…"
        } else {
            "Reconnecting…"
        };
        let mut line = String::from(verb);
        // The attempt being prepared: the next one after a failure.
        let next = self.attempt.max(1) + u32::from(self.failed);
        if (1..=self.max_attempts).contains(&next) {
            let _ = write!(line, " attempt {next}/{}", self.max_attempts);
        }
        if self.admission {
            line.push_str(", waiting for admission");
        } else if let Some(at) = self.retry_at {
            let left = at.saturating_duration_since(now);
            let _ = write!(line, ", retry in {}", seconds(left));
        }
        Some(line)
    }
}

/// `1.2 s`: tenths of a second, rounded up so a wait never reads `0.0 s`
/// before it ends.
fn seconds(d: Duration) -> String {
    let tenths = d.as_millis().div_ceil(100);
    format!("{}.{} s", tenths / 10, tenths % 10)
}

/// Draws a [`StatusLine`] on stderr, when stderr is a terminal; does
/// nothing otherwise.
#[derive(Debug)]
pub struct Painter {
    line: StatusLine,
    enabled: bool,
    /// What is on the terminal now.
    shown: Option<String>,
    /// stdout is the same kind of terminal and its last byte was not a
    /// newline: a status must start on a line of its own.
    stdout_mid_line: bool,
    stdout_tty: bool,
}

impl Painter {
    /// A painter that draws only when stderr is a terminal.
    pub fn for_stderr() -> Self {
        Painter::new(io::stderr().is_terminal(), io::stdout().is_terminal())
    }

    /// A painter that draws when `enabled`; `stdout_tty` says whether the
    /// body goes to a terminal too (then a status never overwrites a
    /// half-written line of it).
    pub fn new(enabled: bool, stdout_tty: bool) -> Self {
        Painter {
            line: StatusLine::default(),
            enabled,
            shown: None,
            stdout_mid_line: false,
            stdout_tty,
        }
    }

    /// Takes in `event` and redraws.
    pub fn on_event(&mut self, event: &LifecycleEvent, out: &mut impl Write) {
        let now = Instant::now();
        self.line.on_event(event, now);
        self.redraw(now, out);
    }

    /// Redraws for `now` (a countdown moves).
    pub fn redraw(&mut self, now: Instant, out: &mut impl Write) {
        if !self.enabled {
            return;
        }
        let text = self.line.text(now);
        if text == self.shown {
            return;
        }
        match text {
            Some(text) => {
                if self.shown.is_none() && self.stdout_tty && self.stdout_mid_line {
                    let _ = out.write_all(b"\n");
                    self.stdout_mid_line = false;
                }
                let _ = write!(out, "\r\x1b[2K{text}");
                self.shown = Some(text);
            }
            None => self.clear(out),
        }
        let _ = out.flush();
    }

    /// Removes the line (before output, and at the end).
    pub fn clear(&mut self, out: &mut impl Write) {
        if self.enabled && self.shown.take().is_some() {
            let _ = out.write_all(b"\r\x1b[2K");
            let _ = out.flush();
        }
    }

    /// Notes that `chunk` is about to go to stdout: the line is cleared
    /// first.
    pub fn before_output(&mut self, chunk: &[u8], out: &mut impl Write) {
        self.clear(out);
        if let Some(last) = chunk.last() {
            self.stdout_mid_line = *last != b'\n';
        }
    }

    /// Whether a countdown is showing (worth redrawing on a tick).
    pub fn counting_down(&self) -> bool {
        self.enabled && self.line.retry_at.is_some() && self.shown.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(json: &str) -> LifecycleEvent {
        serde_json::from_str(json).unwrap()
    }

    fn started(n: u32) -> LifecycleEvent {
        event(&format!(
            r#"{{"event":"attempt_started","logical_id":"l","attempt_id":"l-{n}","wire_attempt":{n},"at_ms":0,"max_attempts":3,"resume":false}}"#
        ))
    }

    fn failed(n: u32) -> LifecycleEvent {
        event(&format!(
            r#"{{"event":"attempt_failed","logical_id":"l","wire_attempt":{n},"at_ms":0,"category":"http","phase":"awaiting_headers","reason":"transient","status":503}}"#
        ))
    }

    fn delay(ms: u64) -> LifecycleEvent {
        event(&format!(
            r#"{{"event":"delay_scheduled","logical_id":"l","wire_attempt":1,"at_ms":0,"delay_ms":{ms},"cause":"retry_after"}}"#
        ))
    }

    fn plain(name: &str) -> LifecycleEvent {
        event(&format!(
            r#"{{"event":"{name}","logical_id":"l","wire_attempt":1,"at_ms":0}}"#
        ))
    }

    #[test]
    fn a_retry_reads_as_reconnecting_with_the_next_attempt_and_a_countdown() {
        let t0 = Instant::now();
        let mut s = StatusLine::default();
        s.on_event(&started(1), t0);
        assert_eq!(s.text(t0), None, "nothing while the first attempt runs");
        s.on_event(&failed(1), t0);
        s.on_event(&delay(1200), t0);
        assert_eq!(
            s.text(t0).as_deref(),
            Some("Reconnecting… attempt 2/3, retry in 1.2 s")
        );
        assert_eq!(
            s.text(t0 + Duration::from_millis(1150)).as_deref(),
            Some("Reconnecting… attempt 2/3, retry in 0.1 s")
        );
        s.on_event(&plain("retry_started"), t0);
        s.on_event(&started(2), t0);
        assert_eq!(s.text(t0).as_deref(), Some("Reconnecting… attempt 2/3"));
        s.on_event(
            &event(r#"{"event":"committed","logical_id":"l","wire_attempt":2,"at_ms":0,"trigger":"semantic"}"#),
            t0,
        );
        assert_eq!(s.text(t0), None, "output flows again");
    }

    #[test]
    fn offline_and_resume_have_their_own_words() {
        let t0 = Instant::now();
        let mut s = StatusLine::default();
        s.on_event(&started(1), t0);
        s.on_event(&plain("parked_offline"), t0);
        assert_eq!(
            s.text(t0).as_deref(),
            Some("Offline: waiting for the network…")
        );
        s.on_event(&plain("resume_started"), t0);
        assert_eq!(s.text(t0).as_deref(), Some("Resuming… attempt 1/3"));
    }

    #[test]
    fn the_painter_draws_only_on_a_terminal_and_clears_before_output() {
        let mut quiet = Painter::new(false, false);
        let mut out = Vec::new();
        quiet.on_event(&started(1), &mut out);
        quiet.on_event(&failed(1), &mut out);
        quiet.on_event(&delay(500), &mut out);
        assert!(out.is_empty(), "silent when stderr is not a terminal");

        let mut p = Painter::new(true, true);
        let mut out = Vec::new();
        p.on_event(&started(1), &mut out);
        p.before_output(b"Hello", &mut out);
        p.on_event(&failed(1), &mut out);
        p.on_event(&delay(500), &mut out);
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(
            text.starts_with("\n\r\x1b[2KReconnecting… attempt 2/3")
                && text.ends_with("\r\x1b[2KReconnecting… attempt 2/3, retry in 0.5 s"),
            "a status starts on its own line after half a line of output: {text:?}"
        );
        out.clear();
        p.before_output(b" world\n", &mut out);
        assert_eq!(out, b"\r\x1b[2K");
        assert!(!p.counting_down());
    }
}
