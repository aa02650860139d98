//! What a logical request shows an operator, in the OpenTelemetry GenAI
//! conventions: a span per logical request named `{operation} {model}`
//! (`gen_ai.*` attributes, `http.request.resend_count`, `error.type` and
//! this project's `recovery.*`), a span per send, and, with the
//! `opentelemetry` feature, the client inference metrics and the W3C
//! `traceparent` of each send.
//!
//! Times are the surroundings' clock, so a virtual clock drives them in
//! tests. The time to the first chunk is taken when the consumer gets its
//! first body frame: after the hold-back of a replayable prefix, which is
//! what the caller waited for.

use recovery_core::body_fields::BodyFields;
use recovery_core::genai::GenAiRequest;
use recovery_core::lifecycle::EventKind;
use recovery_core::protocol::ProtocolKind;
use recovery_core::report::RecoveryReport;
use recovery_core::timing::Instant;

/// The spans and timings of one logical request.
pub(crate) struct Telemetry {
    pub(crate) request: tracing::Span,
    pub(crate) attempt: Option<tracing::Span>,
    active: bool,
    started: Instant,
    last_chunk: Option<Instant>,
    #[cfg(feature = "opentelemetry")]
    attributes: Vec<opentelemetry::KeyValue>,
    #[cfg(feature = "opentelemetry")]
    stream: bool,
    /// What the request's end tells, measured when the driver closes,
    /// after the consumer got the end.
    /// Boxed: it is only there between the end and the close.
    #[cfg(feature = "opentelemetry")]
    ended: Option<Box<metrics::Ended>>,
}

impl Telemetry {
    /// The request span of a request to `url` whose body has `fields`,
    /// answered in `protocol`, started at `now`. Nothing is read of the
    /// request, and nothing is measured, when no subscriber takes the span.
    pub(crate) fn start(
        protocol: &ProtocolKind,
        url: &str,
        fields: &BodyFields<'_>,
        now: Instant,
    ) -> Self {
        let request = tracing::info_span!(
            "recovery.request",
            otel.name = tracing::field::Empty,
            otel.kind = "client",
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = tracing::field::Empty,
            gen_ai.provider.name = tracing::field::Empty,
            gen_ai.request.model = tracing::field::Empty,
            gen_ai.request.stream = tracing::field::Empty,
            gen_ai.response.model = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            error.type = tracing::field::Empty,
            http.request.resend_count = tracing::field::Empty,
            recovery.logical_id = tracing::field::Empty,
            recovery.outcome = tracing::field::Empty,
            recovery.committed = tracing::field::Empty,
            recovery.resends = tracing::field::Empty,
            recovery.resumes = tracing::field::Empty,
            recovery.failovers = tracing::field::Empty,
            recovery.hedges = tracing::field::Empty,
            recovery.seams = tracing::field::Empty,
            recovery.time_to_first_chunk_ms = tracing::field::Empty,
        );
        let active = !request.is_disabled();
        let genai = if active {
            GenAiRequest::of(protocol, url, fields)
        } else {
            GenAiRequest::default()
        };
        if active {
            request.record("otel.name", genai.span_name());
            request.record("gen_ai.operation.name", genai.operation);
            request.record("gen_ai.provider.name", genai.provider);
            if let Some(model) = &genai.model {
                request.record("gen_ai.request.model", model.as_str());
            }
            request.record("gen_ai.request.stream", genai.stream);
        }
        Telemetry {
            request,
            attempt: None,
            active,
            started: now,
            last_chunk: None,
            #[cfg(feature = "opentelemetry")]
            attributes: if active {
                metrics::attributes(&genai)
            } else {
                Vec::new()
            },
            #[cfg(feature = "opentelemetry")]
            stream: genai.stream,
            #[cfg(feature = "opentelemetry")]
            ended: None,
        }
    }

    /// Whether a subscriber takes the request's span: when not, nothing is
    /// measured.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.active
    }

    /// The span of send number `attempt` (1 for the first), a child of the
    /// request's.
    pub(crate) fn send(&mut self, logical_id: &str, attempt: u32) {
        let span = tracing::info_span!(
            parent: &self.request,
            "recovery.attempt",
            otel.kind = "client",
            recovery.logical_id = logical_id,
            recovery.attempt = i64::from(attempt),
            http.request.resend_count = tracing::field::Empty,
        );
        if attempt > 1 {
            span.record("http.request.resend_count", i64::from(attempt - 1));
        }
        self.attempt = Some(span);
    }

    /// Writes the send span's trace context into `headers` as W3C
    /// `traceparent` (and `tracestate`), with the propagator installed in
    /// `opentelemetry::global`; nothing without a valid context.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn inject(&self, headers: &mut http::HeaderMap) {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let Some(span) = &self.attempt else { return };
        let cx = span.context();
        opentelemetry::global::get_text_map_propagator(|p| {
            p.inject_context(&cx, &mut metrics::Headers(headers));
        });
    }

    /// A body frame reached the consumer at `now`.
    #[inline]
    pub(crate) fn chunk(&mut self, now: Instant) {
        if self.last_chunk.is_none() {
            let waited = now.saturating_since(self.started);
            self.request
                .record("recovery.time_to_first_chunk_ms", int(waited.as_millis()));
        }
        #[cfg(feature = "opentelemetry")]
        if self.stream {
            let m = metrics::instruments();
            match self.last_chunk {
                None => m.time_to_first_chunk.record(
                    seconds(now.saturating_since(self.started)),
                    &self.attributes,
                ),
                Some(last) => m
                    .time_per_output_chunk
                    .record(seconds(now.saturating_since(last)), &self.attributes),
            }
        }
        self.last_chunk = Some(now);
    }

    /// The request ended with `terminal`, as `report` tells.
    pub(crate) fn end(&mut self, terminal: &EventKind, report: &RecoveryReport) {
        if !self.active {
            return;
        }
        let span = &self.request;
        let error = match terminal {
            EventKind::Exhausted { outcome, .. } | EventKind::Interrupted { outcome, .. } => {
                Some(outcome.name())
            }
            EventKind::Cancelled { .. } => Some("cancelled"),
            _ => None,
        };
        span.record("recovery.logical_id", report.logical_id.as_str());
        span.record("recovery.outcome", terminal.name());
        span.record("http.request.resend_count", i64::from(report.resend_count));
        span.record("recovery.committed", report.committed_attempt.is_some());
        // Numbers as `i64`: OpenTelemetry's integer attribute type (an
        // unsigned one reaches it as text).
        span.record(
            "recovery.resends",
            i64::from(report.resend_count.saturating_sub(report.resumes)),
        );
        span.record("recovery.resumes", i64::from(report.resumes));
        span.record("recovery.failovers", int(failovers(report)));
        span.record("recovery.hedges", i64::from(report.hedges().started));
        span.record("recovery.seams", int(report.seams.len()));
        let generation = &report.generation;
        if let Some(model) = &generation.model {
            span.record("gen_ai.response.model", model.as_str());
        }
        if !generation.finish_reasons.is_empty() {
            finish_reasons(span, &generation.finish_reasons);
        }
        if let Some(n) = report.generation.usage.input_tokens {
            span.record("gen_ai.usage.input_tokens", int(n));
        }
        if let Some(n) = report.generation.usage.output_tokens {
            span.record("gen_ai.usage.output_tokens", int(n));
        }
        if let Some(kind) = error {
            span.record("error.type", kind);
            span.record("otel.status_code", "ERROR");
        }
        #[cfg(feature = "opentelemetry")]
        {
            self.ended = Some(Box::new(metrics::Ended {
                error,
                usage: report.generation.usage,
                model: report.generation.model.clone(),
            }));
        }
    }

    /// The driver closes at `now`: the request's duration (to the end the
    /// consumer read, or to when it gave up) and its token use.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn close(&mut self, now: Instant) {
        if let Some(ended) = self.ended.take() {
            metrics::end(
                &self.attributes,
                &ended,
                seconds(now.saturating_since(self.started)),
            );
        }
    }
}

/// `gen_ai.response.finish_reasons`: a string array for OpenTelemetry,
/// the reasons joined by `,` for another subscriber.
fn finish_reasons(span: &tracing::Span, reasons: &[recovery_core::report::SafeToken]) {
    #[cfg(feature = "opentelemetry")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let list = reasons
            .iter()
            .map(|r| opentelemetry::StringValue::from(r.to_string()))
            .collect();
        span.set_attribute(
            "gen_ai.response.finish_reasons",
            opentelemetry::Value::Array(opentelemetry::Array::String(list)),
        );
    }
    #[cfg(not(feature = "opentelemetry"))]
    {
        let joined: Vec<&str> = reasons
            .iter()
            .map(recovery_core::report::SafeToken::as_str)
            .collect();
        span.record("gen_ai.response.finish_reasons", joined.join(","));
    }
}

/// A count as OpenTelemetry's integer attribute type (an unsigned one
/// reaches it as text); saturated, never wrapped.
fn int<T: TryInto<i64>>(n: T) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Sends that went to another target than the one before.
fn failovers(report: &RecoveryReport) -> usize {
    report
        .attempts
        .windows(2)
        .filter(|w| w[0].target != w[1].target)
        .count()
}

#[cfg(feature = "opentelemetry")]
fn seconds(d: std::time::Duration) -> f64 {
    d.as_secs_f64()
}

/// The client inference metrics, on the meter of `opentelemetry::global`.
#[cfg(feature = "opentelemetry")]
mod metrics {
    use std::sync::OnceLock;

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::Histogram;
    use recovery_core::genai::GenAiRequest;
    use recovery_core::progress::Usage;

    /// The instruments, made on first use: install the global meter
    /// provider before the first request.
    pub(super) struct Instruments {
        pub(super) duration: Histogram<f64>,
        pub(super) time_to_first_chunk: Histogram<f64>,
        pub(super) time_per_output_chunk: Histogram<f64>,
        pub(super) token_usage: Histogram<u64>,
    }

    pub(super) fn instruments() -> &'static Instruments {
        static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
        INSTRUMENTS.get_or_init(|| {
            let meter = opentelemetry::global::meter("tower-recovery");
            Instruments {
                duration: meter
                    .f64_histogram("gen_ai.client.inference.duration")
                    .with_unit("s")
                    .with_description("Duration of a GenAI inference request, recoveries included.")
                    .with_boundaries(vec![
                        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                        40.96, 81.92,
                    ])
                    .build(),
                time_to_first_chunk: meter
                    .f64_histogram("gen_ai.client.inference.time_to_first_chunk")
                    .with_unit("s")
                    .with_description("Time to the first chunk the caller receives, after hold-back.")
                    .with_boundaries(vec![
                        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                        2.5, 5.0, 7.5, 10.0,
                    ])
                    .build(),
                time_per_output_chunk: meter
                    .f64_histogram("gen_ai.client.inference.time_per_output_chunk")
                    .with_unit("s")
                    .with_description("Time from the end of one chunk the caller receives to the end of the next.")
                    .with_boundaries(vec![
                        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                    ])
                    .build(),
                token_usage: meter
                    .u64_histogram("gen_ai.client.token.usage")
                    .with_unit("{token}")
                    .with_description("Input and output tokens the provider reported.")
                    // Powers of 4 from 1 to 4^13, as the conventions advise.
                    .with_boundaries((0..14).map(|i| 4f64.powi(i)).collect())
                    .build(),
            }
        })
    }

    /// The attributes every measurement of a request carries.
    pub(super) fn attributes(genai: &GenAiRequest) -> Vec<KeyValue> {
        let mut kv = vec![
            KeyValue::new("gen_ai.operation.name", genai.operation),
            KeyValue::new("gen_ai.provider.name", genai.provider),
        ];
        if let Some(model) = &genai.model {
            kv.push(KeyValue::new("gen_ai.request.model", model.clone()));
        }
        kv
    }

    /// What a request's end tells its last measurements.
    pub(crate) struct Ended {
        /// The terminal's error type, if it failed.
        pub(crate) error: Option<&'static str>,
        /// The token use the answer stated.
        pub(crate) usage: Usage,
        /// The model that answered, as the answer named it.
        pub(crate) model: Option<String>,
    }

    /// The request's duration and its token use, at its end, with the
    /// answering model (`gen_ai.response.model`) once the answer named it.
    pub(super) fn end(attributes: &[KeyValue], ended: &Ended, seconds: f64) {
        let m = instruments();
        let mut kv = attributes.to_vec();
        if let Some(model) = &ended.model {
            kv.push(KeyValue::new("gen_ai.response.model", model.clone()));
        }
        let common = kv.len();
        if let Some(kind) = ended.error {
            kv.push(KeyValue::new("error.type", kind));
        }
        m.duration.record(seconds, &kv);
        for (kind, n) in [
            ("input", ended.usage.input_tokens),
            ("output", ended.usage.output_tokens),
        ] {
            if let Some(n) = n {
                kv.truncate(common);
                kv.push(KeyValue::new("gen_ai.token.type", kind));
                m.token_usage.record(n, &kv);
            }
        }
    }

    /// A header map as the propagator's carrier.
    pub(super) struct Headers<'a>(pub(super) &'a mut http::HeaderMap);

    impl opentelemetry::propagation::Injector for Headers<'_> {
        fn set(&mut self, key: &str, value: String) {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(key.as_bytes()),
                http::HeaderValue::from_str(&value),
            ) {
                self.0.insert(name, value);
            }
        }
    }
}
