//! Counters and histograms, fed by the recovery layer's lifecycle events,
//! served as Prometheus text (format 0.0.4) on `GET /metrics`.
//!
//! Plain atomics: every label set is known in advance (the four terminal
//! events), so there is no map to lock on the hot path and the output's
//! cardinality is fixed.
//!
//! The histograms follow the OpenTelemetry GenAI client conventions,
//! named as OpenTelemetry's Prometheus exporter names them (dots to
//! underscores, the unit `s` as `_seconds`, `{token}` dropped):
//! `gen_ai.client.inference.duration` (from the request to its terminal
//! event; `error_type` names a terminal other than `completed`),
//! `gen_ai.client.inference.time_to_first_chunk` (to the commit: the first
//! output the client receives, after the hold-back of a replayable
//! prefix), `gen_ai.client.inference.time_per_output_chunk` (from one
//! event the gateway hands on to the next, numbered or passed through) and
//! `gen_ai.client.token.usage`
//! (`gen_ai_token_type` `input` or `output`, as the provider reported them
//! for a stream, at its end).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use recovery_core::lifecycle::{EventKind, LifecycleEvent};
use recovery_core::report::Role;

/// The terminal events, as the `outcome` label.
const OUTCOMES: [&str; 4] = ["completed", "exhausted", "interrupted", "cancelled"];

/// The gateway's counters.
#[derive(Debug)]
pub struct Metrics {
    requests: AtomicU64,
    attempts: AtomicU64,
    resends: AtomicU64,
    resumes: AtomicU64,
    commits: AtomicU64,
    hedges: AtomicU64,
    hedges_won: AtomicU64,
    hedges_cancelled: AtomicU64,
    outcomes: [AtomicU64; 4],
    reconnects: AtomicU64,
    streams_active: AtomicU64,
    tunnels_active: AtomicU64,
    rejected: AtomicU64,
    body_timeouts: AtomicU64,
    /// Request durations, one histogram per terminal outcome.
    durations: [Histogram; 4],
    time_to_first_chunk: Histogram,
    /// The time from one event the client receives to the next.
    time_per_output_chunk: Histogram,
    /// Input and output tokens the provider reported.
    token_usage: [Histogram; 2],
    /// The configured bounds, by name, shown as gauges.
    bounds: std::sync::OnceLock<Vec<(&'static str, u64)>>,
}

/// A copy of the counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Requests forwarded upstream.
    pub requests: u64,
    /// Physical sends upstream.
    pub attempts: u64,
    /// Sends that replayed a request before commit.
    pub resends: u64,
    /// Sends that resumed a committed stream.
    pub resumes: u64,
    /// Requests that committed (output reached the client).
    pub commits: u64,
    /// Hedges sent (a second send racing one that showed no token).
    pub hedges: u64,
    /// Hedges whose answer reached the client.
    pub hedges_won: u64,
    /// Attempts of a race closed because they could not win.
    pub hedges_cancelled: u64,
    /// Terminal outcomes `completed`.
    pub completed: u64,
    /// Terminal outcomes `exhausted`.
    pub exhausted: u64,
    /// Terminal outcomes `interrupted`.
    pub interrupted: u64,
    /// Terminal outcomes `cancelled`.
    pub cancelled: u64,
    /// Reconnects served from a stream log.
    pub downstream_reconnects: u64,
    /// Streams running now (upstream generations the gateway reads).
    pub streams_active: u64,
    /// Tunnels open now (switched protocols, a WebSocket's).
    pub tunnels_active: u64,
    /// Requests refused at the stream limit.
    pub rejected: u64,
    /// Request bodies that missed their read deadline.
    pub body_timeouts: u64,
}

impl Default for Metrics {
    fn default() -> Self {
        let zero = || AtomicU64::new(0);
        Metrics {
            requests: zero(),
            attempts: zero(),
            resends: zero(),
            resumes: zero(),
            commits: zero(),
            hedges: zero(),
            hedges_won: zero(),
            hedges_cancelled: zero(),
            outcomes: Default::default(),
            reconnects: zero(),
            streams_active: zero(),
            tunnels_active: zero(),
            rejected: zero(),
            body_timeouts: zero(),
            durations: std::array::from_fn(|_| Histogram::seconds(SECONDS)),
            time_to_first_chunk: Histogram::seconds(SECONDS),
            time_per_output_chunk: Histogram::seconds(CHUNK_SECONDS),
            token_usage: std::array::from_fn(|_| Histogram::counts(TOKENS)),
            bounds: std::sync::OnceLock::new(),
        }
    }
}

impl Metrics {
    /// Counts one lifecycle event of the recovery layer.
    pub fn on_event(&self, event: &LifecycleEvent) {
        match &event.kind {
            EventKind::AttemptStarted { resume, .. } => {
                self.attempts.fetch_add(1, Ordering::Relaxed);
                if !*resume && event.identity.wire_attempt > 1 {
                    self.resends.fetch_add(1, Ordering::Relaxed);
                }
            }
            EventKind::ResumeStarted => {
                self.resumes.fetch_add(1, Ordering::Relaxed);
            }
            EventKind::Committed { role, .. } => {
                self.commits.fetch_add(1, Ordering::Relaxed);
                if *role == Some(Role::Hedge) {
                    self.hedges_won.fetch_add(1, Ordering::Relaxed);
                }
                self.time_to_first_chunk.observe(event.at);
            }
            EventKind::HedgeStarted { .. } => {
                self.hedges.fetch_add(1, Ordering::Relaxed);
            }
            EventKind::HedgeCancelled { .. } => {
                self.hedges_cancelled.fetch_add(1, Ordering::Relaxed);
            }
            kind if kind.is_terminal() => {
                if let Some(i) = OUTCOMES.iter().position(|o| *o == kind.name()) {
                    self.outcomes[i].fetch_add(1, Ordering::Relaxed);
                    self.durations[i].observe(event.at);
                }
            }
            _ => {}
        }
    }

    /// The time from one event a client receives to the next.
    pub(crate) fn output_chunk(&self, gap: std::time::Duration) {
        self.time_per_output_chunk.observe(gap);
    }

    /// The token use a finished stream's provider reported.
    pub(crate) fn tokens(&self, usage: &recovery_core::progress::Usage) {
        for (h, n) in self
            .token_usage
            .iter()
            .zip([usage.input_tokens, usage.output_tokens])
        {
            if let Some(n) = n {
                h.observe_value(n as f64);
            }
        }
    }

    /// Counts a request forwarded upstream.
    pub fn request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a reconnect served from a log.
    pub fn reconnect(&self) {
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused at the stream limit.
    pub fn rejected(&self) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request body that missed its read deadline.
    pub(crate) fn body_timeout(&self) {
        self.body_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the bounds of `config` (once).
    pub(crate) fn set_bounds(&self, config: &crate::Config) {
        let l = &config.log_limits;
        let _ = self.bounds.set(vec![
            ("max_streams", config.max_streams as u64),
            ("max_kept_streams", config.max_kept_streams as u64),
            ("max_readers", config.max_readers as u64),
            (
                "max_readers_per_stream",
                config.max_readers_per_stream as u64,
            ),
            ("max_body_bytes", config.max_body_bytes as u64),
            ("max_upload_bytes", config.max_upload_bytes as u64),
            ("max_held_body_bytes", config.max_held_body_bytes as u64),
            (
                "body_read_timeout_ms",
                config.body_read_timeout.as_millis() as u64,
            ),
            ("body_min_bytes_per_sec", config.body_min_bytes_per_sec),
            (
                "header_read_timeout_ms",
                config.header_read_timeout.as_millis() as u64,
            ),
            (
                "keep_generating_ms",
                config.keep_generating.as_millis() as u64,
            ),
            ("log_max_streams", l.max_streams as u64),
            ("log_max_total_bytes", l.max_total_bytes),
            ("log_max_bytes_per_stream", l.max_bytes),
            ("log_max_entries_per_stream", l.max_entries),
            ("log_ttl_ms", l.ttl.as_millis() as u64),
        ]);
    }

    /// A stream started (`+1`) or ended (`-1`).
    pub(crate) fn stream_started(&self) {
        self.streams_active.fetch_add(1, Ordering::Relaxed);
    }

    /// See [`Metrics::stream_started`].
    pub(crate) fn stream_ended(&self) {
        self.streams_active.fetch_sub(1, Ordering::Relaxed);
    }

    /// A tunnel opened (`+1`) or closed (`-1`).
    pub(crate) fn tunnel_opened(&self) {
        self.tunnels_active.fetch_add(1, Ordering::Relaxed);
    }

    /// See [`Metrics::tunnel_opened`].
    pub(crate) fn tunnel_closed(&self) {
        self.tunnels_active.fetch_sub(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            requests: get(&self.requests),
            attempts: get(&self.attempts),
            resends: get(&self.resends),
            resumes: get(&self.resumes),
            commits: get(&self.commits),
            hedges: get(&self.hedges),
            hedges_won: get(&self.hedges_won),
            hedges_cancelled: get(&self.hedges_cancelled),
            completed: get(&self.outcomes[0]),
            exhausted: get(&self.outcomes[1]),
            interrupted: get(&self.outcomes[2]),
            cancelled: get(&self.outcomes[3]),
            downstream_reconnects: get(&self.reconnects),
            streams_active: get(&self.streams_active),
            tunnels_active: get(&self.tunnels_active),
            rejected: get(&self.rejected),
            body_timeouts: get(&self.body_timeouts),
        }
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let s = self.snapshot();
        let mut out = String::with_capacity(2048);
        render_counters(&mut out, &s);
        render_outcomes(&mut out, &s);
        let _ = write!(
            out,
            "# HELP recovery_gateway_streams_active Upstream generations running now.\n\
             # TYPE recovery_gateway_streams_active gauge\n\
             recovery_gateway_streams_active {}\n\
             # HELP recovery_gateway_tunnels_active Switched connections (WebSockets) carried now.\n\
             # TYPE recovery_gateway_tunnels_active gauge\n\
             recovery_gateway_tunnels_active {}\n",
            s.streams_active, s.tunnels_active
        );
        self.render_histograms(&mut out);
        self.render_bounds(&mut out);
        out
    }

    /// The GenAI histograms: durations labelled by the terminal other than
    /// `completed`, the time to the first chunk, the time between chunks,
    /// and the token use.
    fn render_histograms(&self, out: &mut String) {
        let name = "gen_ai_client_inference_duration_seconds";
        let _ = write!(
            out,
            "# HELP {name} GenAI inference duration: from the request to its end (OpenTelemetry gen_ai.client.inference.duration).\n\
             # TYPE {name} histogram\n"
        );
        for (outcome, h) in OUTCOMES.iter().zip(&self.durations) {
            let label = match *outcome {
                "completed" => String::new(),
                other => format!("error_type=\"{other}\""),
            };
            h.render(out, name, &label);
        }
        let name = "gen_ai_client_inference_time_to_first_chunk_seconds";
        let _ = write!(
            out,
            "# HELP {name} Time to the first output the client receives, after hold-back (OpenTelemetry gen_ai.client.inference.time_to_first_chunk).\n\
             # TYPE {name} histogram\n"
        );
        self.time_to_first_chunk.render(out, name, "");
        let name = "gen_ai_client_inference_time_per_output_chunk_seconds";
        let _ = write!(
            out,
            "# HELP {name} Time from one event the client receives to the next (OpenTelemetry gen_ai.client.inference.time_per_output_chunk).\n\
             # TYPE {name} histogram\n"
        );
        self.time_per_output_chunk.render(out, name, "");
        let name = "gen_ai_client_token_usage";
        let _ = write!(
            out,
            "# HELP {name} Input and output tokens the provider reported for a stream (OpenTelemetry gen_ai.client.token.usage).\n\
             # TYPE {name} histogram\n"
        );
        for (kind, h) in ["input", "output"].iter().zip(&self.token_usage) {
            h.render(out, name, &format!("gen_ai_token_type=\"{kind}\""));
        }
    }

    /// The configured bounds as gauges, once they were set.
    fn render_bounds(&self, out: &mut String) {
        let Some(bounds) = self.bounds.get() else {
            return;
        };
        let _ = write!(
            out,
            "# HELP recovery_gateway_bound A configured bound, by name.\n\
             # TYPE recovery_gateway_bound gauge\n"
        );
        for (name, value) in bounds {
            let _ = writeln!(out, "recovery_gateway_bound{{name=\"{name}\"}} {value}");
        }
    }
}

/// The plain counters, each with its help text, in the exposition's order.
fn render_counters(out: &mut String, s: &Snapshot) {
    let counters = [
        (
            "recovery_gateway_requests_total",
            "Requests forwarded upstream.",
            s.requests,
        ),
        (
            "recovery_gateway_attempts_total",
            "Physical sends upstream, first sends included.",
            s.attempts,
        ),
        (
            "recovery_gateway_resends_total",
            "Sends that replayed a request before any output.",
            s.resends,
        ),
        (
            "recovery_gateway_resumes_total",
            "Sends that resumed a committed stream.",
            s.resumes,
        ),
        (
            "recovery_gateway_commits_total",
            "Requests whose output began to reach the client.",
            s.commits,
        ),
        (
            "recovery_gateway_hedges_total",
            "Hedges sent: a second send racing one that showed no token in time.",
            s.hedges,
        ),
        (
            "recovery_gateway_hedges_won_total",
            "Hedges whose answer reached the client.",
            s.hedges_won,
        ),
        (
            "recovery_gateway_hedges_cancelled_total",
            "Attempts of a hedging race closed because they could not win.",
            s.hedges_cancelled,
        ),
        (
            "recovery_gateway_downstream_reconnects_total",
            "Client reconnects served from a stream log.",
            s.downstream_reconnects,
        ),
        (
            "recovery_gateway_rejected_total",
            "Requests refused at the concurrent stream limit.",
            s.rejected,
        ),
        (
            "recovery_gateway_body_timeouts_total",
            "Requests refused because their body missed its read deadline.",
            s.body_timeouts,
        ),
    ];
    for (name, help, value) in counters {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}\n"
        );
    }
}

/// One counter of requests by terminal outcome, a sample per outcome.
fn render_outcomes(out: &mut String, s: &Snapshot) {
    let _ = write!(
        out,
        "# HELP recovery_gateway_outcomes_total Requests by terminal outcome.\n\
         # TYPE recovery_gateway_outcomes_total counter\n"
    );
    for (name, value) in OUTCOMES
        .iter()
        .zip([s.completed, s.exhausted, s.interrupted, s.cancelled])
    {
        let _ = writeln!(
            out,
            "recovery_gateway_outcomes_total{{outcome=\"{name}\"}} {value}"
        );
    }
}

/// Bucket bounds in seconds: the OpenTelemetry GenAI conventions'
/// advice for durations, from 10 ms to about 82 s, doubling.
/// Bounds of the latency histograms, in seconds (the conventions'
/// advice for `gen_ai.client.inference.duration`).
const SECONDS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// Bounds of the time between two chunks, in seconds (the conventions'
/// advice for `gen_ai.client.inference.time_per_output_chunk`).
const CHUNK_SECONDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
];

/// Bounds of the token counts: powers of 4 from 1 to 4^13 (the
/// conventions' advice for `gen_ai.client.token.usage`).
const TOKENS: &[f64] = &[
    1.0,
    4.0,
    16.0,
    64.0,
    256.0,
    1_024.0,
    4_096.0,
    16_384.0,
    65_536.0,
    262_144.0,
    1_048_576.0,
    4_194_304.0,
    16_777_216.0,
    67_108_864.0,
];

/// A fixed-bucket histogram on atomics: per-bucket counts (not yet
/// cumulative), the count and the sum in units of `1 / scale` (micro-
/// seconds for times, whole tokens for counts).
#[derive(Debug)]
struct Histogram {
    bounds: &'static [f64],
    scale: f64,
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum: AtomicU64,
}

impl Histogram {
    /// Of times, in seconds.
    fn seconds(bounds: &'static [f64]) -> Self {
        Histogram::new(bounds, 1e6)
    }

    /// Of counts.
    fn counts(bounds: &'static [f64]) -> Self {
        Histogram::new(bounds, 1.0)
    }

    fn new(bounds: &'static [f64], scale: f64) -> Self {
        Histogram {
            bounds,
            scale,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0),
        }
    }

    fn observe(&self, d: std::time::Duration) {
        self.observe_value(d.as_secs_f64());
    }

    fn observe_value(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        // Saturating: a float past u64 converts to u64::MAX.
        let units = (value * self.scale).round() as u64;
        self.sum.fetch_add(units, Ordering::Relaxed);
    }

    /// Writes the series of `name` with `label` (empty: none).
    fn render(&self, out: &mut String, name: &str, label: &str) {
        let sep = if label.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(self.buckets.iter()) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{label}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{label}{sep}le=\"+Inf\"}} {count}");
        let braces = if label.is_empty() {
            String::new()
        } else {
            format!("{{{label}}}")
        };
        let sum = self.sum.load(Ordering::Relaxed) as f64 / self.scale;
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_names_every_series_once() {
        let m = Metrics::default();
        m.request();
        let text = m.render();
        for name in [
            "recovery_gateway_requests_total 1",
            "recovery_gateway_attempts_total 0",
            "recovery_gateway_resends_total 0",
            "recovery_gateway_resumes_total 0",
            "recovery_gateway_commits_total 0",
            "recovery_gateway_outcomes_total{outcome=\"completed\"} 0",
            "recovery_gateway_downstream_reconnects_total 0",
            "recovery_gateway_streams_active 0",
            "recovery_gateway_tunnels_active 0",
        ] {
            assert_eq!(text.lines().filter(|l| *l == name).count(), 1, "{name}");
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn histograms_count_into_their_buckets() {
        let h = Histogram::seconds(SECONDS);
        h.observe(std::time::Duration::from_millis(15));
        h.observe(std::time::Duration::from_millis(300));
        h.observe(std::time::Duration::from_secs(100));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "error_type=\"exhausted\"");
        for line in [
            "x_seconds_bucket{error_type=\"exhausted\",le=\"0.01\"} 0",
            "x_seconds_bucket{error_type=\"exhausted\",le=\"0.02\"} 1",
            "x_seconds_bucket{error_type=\"exhausted\",le=\"0.32\"} 2",
            "x_seconds_bucket{error_type=\"exhausted\",le=\"81.92\"} 2",
            "x_seconds_bucket{error_type=\"exhausted\",le=\"+Inf\"} 3",
            "x_seconds_sum{error_type=\"exhausted\"} 100.315",
            "x_seconds_count{error_type=\"exhausted\"} 3",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
        let mut bare = String::new();
        Histogram::seconds(SECONDS).render(&mut bare, "y", "");
        assert!(
            bare.contains("y_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n"),
            "{bare}"
        );
    }
}
