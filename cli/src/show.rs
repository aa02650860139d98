//! Human-readable lifecycle events and report summaries, colored on a
//! terminal and plain elsewhere.

use std::fmt::Write as _;
use std::io::IsTerminal;

use recovery_core::lifecycle::{EventKind, LifecycleEvent};
use recovery_core::outcome::Outcome;
use recovery_core::report::{AttemptResult, RecoveryReport, Role};
use serde::Serialize;

/// How to paint text: ANSI colors, or plain when the output is not a terminal
/// (or `NO_COLOR` is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    color: bool,
}

const RESET: &str = "\x1b[0m";
/// Dim gray.
pub const DIM: &str = "\x1b[2m";
/// Bold.
pub const BOLD: &str = "\x1b[1m";
/// Red.
pub const RED: &str = "\x1b[31m";
/// Green.
pub const GREEN: &str = "\x1b[32m";
/// Yellow.
pub const YELLOW: &str = "\x1b[33m";
/// Blue.
pub const BLUE: &str = "\x1b[34m";
/// Cyan.
pub const CYAN: &str = "\x1b[36m";

impl Style {
    /// Colors only when stdout is a terminal and `NO_COLOR` is unset.
    pub fn for_stdout() -> Self {
        Style {
            color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    /// Colors only when stderr is a terminal and `NO_COLOR` is unset.
    pub fn for_stderr() -> Self {
        Style {
            color: std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        }
    }

    /// A style that never colors.
    pub fn plain() -> Self {
        Style { color: false }
    }

    /// Whether this style emits ANSI codes.
    pub fn is_color(self) -> bool {
        self.color
    }

    /// `text` wrapped in `code` when coloring.
    pub fn paint(self, code: &str, text: &str) -> String {
        if self.color {
            format!("{code}{text}{RESET}")
        } else {
            text.to_owned()
        }
    }
}

/// The snake_case serde name of a unit-like enum value (`retry_after`, ...).
pub fn snake<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::from("?"),
    }
}

/// One line describing `event`, e.g. `✗ attempt 1 failed: http 503 (transient)`.
pub fn describe(event: &LifecycleEvent, style: Style) -> String {
    let at = style.paint(DIM, &format!("{:>6} ms", event.at.as_millis()));
    let (code, mark) = look(&event.kind);
    let text = what_happened(&event.kind, event.identity.wire_attempt);
    format!("{at}  {}", style.paint(code, &format!("{mark} {text}")))
}

/// The color and the mark an event's line starts with: blue for a send,
/// yellow for trouble, cyan for the commit, green for success, red for a
/// failure, dim for the rest.
fn look(kind: &EventKind) -> (&'static str, &'static str) {
    match kind {
        EventKind::AttemptStarted { .. } => (BLUE, "→"),
        EventKind::Failover { .. } => (YELLOW, "⇄"),
        EventKind::HedgeStarted { .. } => (BLUE, "⇉"),
        EventKind::HedgeCancelled { .. } => (DIM, "⊘"),
        EventKind::AttemptFailed { .. } => (YELLOW, "✗"),
        EventKind::DelayScheduled { .. } => (DIM, "…"),
        EventKind::RetryStarted | EventKind::ResumeStarted => (BLUE, "↻"),
        EventKind::ParkedOffline => (YELLOW, "⏸"),
        EventKind::Committed { .. } => (CYAN, "●"),
        EventKind::AttemptSucceeded { .. } => (GREEN, "✓"),
        EventKind::Completed { .. } => (GREEN, "✔"),
        EventKind::Exhausted { .. } | EventKind::Interrupted { .. } => (RED, "✘"),
        EventKind::Cancelled { .. } => (YELLOW, "■"),
        _ => (DIM, "·"),
    }
}

/// What an event says, in words; `n` is the attempt it belongs to.
fn what_happened(kind: &EventKind, n: u32) -> String {
    match kind {
        EventKind::AttemptStarted {
            max_attempts,
            resume,
            target,
        } => format!(
            "attempt {n}/{max_attempts} sent{}{}",
            target
                .as_ref()
                .map(|t| format!(" to {t}"))
                .unwrap_or_default(),
            if *resume { " (resume)" } else { "" }
        ),
        EventKind::Failover { from, to, .. } => {
            format!("failing over from {from} to {to} (no output yet)")
        }
        EventKind::AttemptFailed {
            category,
            phase,
            reason,
            status,
            ..
        } => format!(
            "attempt {n} failed: {category}{} while {phase} ({})",
            status.map(|s| format!(" {s}")).unwrap_or_default(),
            snake(reason)
        ),
        EventKind::DelayScheduled { delay_ms, cause } => {
            format!("waiting {} ms ({})", delay_ms.as_millis(), snake(cause))
        }
        EventKind::RetryStarted => String::from("retrying"),
        EventKind::ResumeStarted => String::from("resuming the stream"),
        EventKind::ParkedOffline => String::from("offline: waiting for the network"),
        EventKind::Committed { trigger, role } => format!(
            "attempt {n} committed ({}){}: output flows to the consumer",
            snake(trigger),
            if *role == Some(Role::Hedge) {
                ", the hedge won"
            } else {
                ""
            }
        ),
        EventKind::HedgeStarted { hedge, after_ms } => format!(
            "no token from attempt {n} in {} ms: attempt {hedge} races it",
            after_ms.as_millis()
        ),
        EventKind::HedgeCancelled { reason, .. } => {
            format!(
                "attempt {n} left the race ({})",
                reason.name().replace('_', " ")
            )
        }
        EventKind::AttemptSucceeded { proof } => {
            format!("attempt {n} ended with {} terminal proof", snake(proof))
        }
        EventKind::Completed { proof, attempts } => format!(
            "completed ({} proof) after {attempts} attempt(s)",
            snake(proof)
        ),
        EventKind::Exhausted { outcome, attempts } => {
            format!("failed before any output after {attempts} attempt(s): {outcome}")
        }
        EventKind::Interrupted { outcome, attempts } => {
            format!("interrupted after output was delivered ({attempts} attempt(s)): {outcome}")
        }
        EventKind::Cancelled { phase, attempts } => format!(
            "cancelled while {} after {attempts} attempt(s)",
            snake(phase)
        ),
        other => other.name().replace('_', " "),
    }
}

/// A short multi-line summary of `report`: outcome, attempts, delays and
/// timings.
pub fn summary(report: &RecoveryReport, style: Style) -> String {
    let mut out = String::new();
    let label = |s: &str| style.paint(DIM, &format!("  {s:<20}"));
    let outcome = match &report.outcome {
        Some(o @ Outcome::Completed { .. }) => style.paint(GREEN, &o.to_string()),
        Some(o) => style.paint(RED, &o.to_string()),
        None => style.paint(YELLOW, "still running"),
    };
    let _ = writeln!(out, "{}", style.paint(BOLD, "report"));
    let _ = writeln!(out, "{}{outcome}", label("outcome"));
    let _ = writeln!(
        out,
        "{}{} ({} resend(s))",
        label("attempts"),
        report.attempt_count(),
        report.resend_count
    );
    for a in &report.attempts {
        let status = a
            .status
            .map_or_else(|| String::from("---"), |s| s.to_string());
        let result = match &a.result {
            AttemptResult::InProgress => String::from("in progress"),
            AttemptResult::Succeeded { proof } => format!("succeeded ({} proof)", snake(proof)),
            AttemptResult::Failed {
                category,
                phase,
                reason,
            } => format!("{category} failure while {phase} ({})", snake(reason)),
            other => snake(other),
        };
        let target = a
            .target
            .as_ref()
            .map(|t| format!("  to {t}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{}#{} at {} ms{target}  status {status}  {result}",
            label(""),
            a.wire_attempt,
            a.started_ms.as_millis()
        );
    }
    if let Some(served) = &report.served_by {
        let _ = writeln!(out, "{}{served}", label("served by"));
    }
    let delays = if report.delays.is_empty() {
        String::from("none")
    } else {
        report
            .delays
            .iter()
            .map(|d| format!("{} ms ({})", d.delay_ms.as_millis(), snake(&d.cause)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "{}{delays}", label("delays"));
    let ms = |v: Option<u64>| v.map_or_else(|| String::from("---"), |v| format!("{v} ms"));
    let m = &report.metrics;
    let _ = writeln!(
        out,
        "{}{}",
        label("time to headers"),
        ms(m.time_to_headers_ms)
    );
    let _ = writeln!(
        out,
        "{}{}",
        label("time to first token"),
        ms(m.time_to_first_semantic_ms)
    );
    let _ = writeln!(out, "{}{}", label("total"), ms(m.total_ms));
    let p = report.total_progress();
    let _ = write!(
        out,
        "{}{} content fragment(s)",
        label("delivered"),
        p.delivered_content
    );
    out
}

/// One readable line for a request that did not complete, e.g.
/// `recovery failed: exhausted after 3 attempt(s) (last status 503)`.
pub fn failure_line(report: &RecoveryReport) -> String {
    let mut line = match &report.outcome {
        Some(o) => format!("recovery failed: {o}"),
        None => String::from("recovery failed: no outcome recorded"),
    };
    if !matches!(report.outcome, Some(Outcome::Exhausted { .. })) {
        let _ = write!(line, " after {} attempt(s)", report.attempt_count());
    }
    if let Some(status) = report.last_status() {
        let _ = write!(line, " (last status {status})");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_style_has_no_escape_codes_and_color_does() {
        let event: LifecycleEvent = serde_json::from_str(
            r#"{"event":"retry_started","logical_id":"0123456789abcdef","attempt_id":"0123456789abcdef-1","wire_attempt":1,"at_ms":12}"#,
        )
        .unwrap();
        assert_eq!(event.kind, EventKind::RetryStarted);
        let plain = describe(&event, Style::plain());
        assert!(!plain.contains('\x1b'), "{plain:?}");
        assert!(plain.contains("retrying"));
        assert!(describe(&event, Style { color: true }).contains('\x1b'));
    }

    #[test]
    fn summary_names_outcome_attempts_and_first_token() {
        let report = RecoveryReport::new(String::from("0123456789abcdef"));
        let text = summary(&report, Style::plain());
        assert!(text.contains("still running"));
        assert!(text.contains("time to first token"));
        assert!(failure_line(&report).starts_with("recovery failed"));
    }
}
