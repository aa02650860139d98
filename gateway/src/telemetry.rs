//! OpenTelemetry export over OTLP/HTTP (protobuf), on when an endpoint is
//! configured (`--otlp-endpoint`): the spans of every request (the
//! gateway's server span, the recovery layer's GenAI span and one span per
//! upstream send) and the GenAI client inference metrics the recovery
//! layer records.
//!
//! One trace per logical request across both legs: the client's W3C
//! `traceparent` is the parent of the server span, and each upstream send
//! carries its own span's `traceparent` (the recovery layer writes it).
//!
//! The exporters send through the project's HTTP client on the gateway's
//! runtime: the SDK's batch processors run on their own threads and hand
//! each export to the runtime, so no second runtime or HTTP stack is
//! started. [`Telemetry::shutdown`] exports what is left (the graceful
//! shutdown calls it); a process that exits otherwise may lose the last
//! batch.

use std::convert::Infallible;
use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;
use http::{HeaderMap, Request, Response, Uri};
use http_body_util::BodyExt as _;
use opentelemetry::propagation::Extractor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tower_service::Service;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::body::{BoxError, GatewayBody};
use crate::phase::BoxFuture;

/// The longest answer an OTLP receiver's reply may be (a partial-success
/// message at most).
const MAX_REPLY_BYTES: usize = 64 * 1024;

/// How long one export may take, its reply included.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The installed pipeline; [`Telemetry::shutdown`] flushes it.
pub struct Telemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

/// Why the pipeline could not be installed.
#[derive(Debug)]
pub struct TelemetryError(String);

impl fmt::Display for TelemetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpenTelemetry export: {}", self.0)
    }
}

impl std::error::Error for TelemetryError {}

impl Telemetry {
    /// Installs the process-wide pipeline exporting to `endpoint` (the
    /// OTLP/HTTP base: signals go to `/v1/traces` and `/v1/metrics` under
    /// it), the W3C trace-context propagator and the tracing subscriber.
    /// Call it on the gateway's runtime, before [`crate::Gateway::bind`]
    /// (the recovery layer makes its instruments on the first request).
    /// Metrics are exported every `OTEL_METRIC_EXPORT_INTERVAL` ms (60 s by
    /// default) and at shutdown.
    pub fn install(endpoint: &Uri) -> Result<Self, TelemetryError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| TelemetryError("install it on a Tokio runtime".into()))?;
        let base = endpoint.to_string();
        let base = base.trim_end_matches('/');
        let client = RuntimeClient {
            runtime,
            client: tower_recovery::https::client(),
        };
        let spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_endpoint(format!("{base}/v1/traces"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TelemetryError(e.to_string()))?;
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(format!("{base}/v1/metrics"))
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TelemetryError(e.to_string()))?;
        let resource = opentelemetry_sdk::Resource::builder()
            .with_service_name("recovery-gateway")
            .build();
        let tracer = SdkTracerProvider::builder()
            .with_batch_exporter(spans)
            .with_resource(resource.clone())
            .build();
        let meter = SdkMeterProvider::builder()
            .with_periodic_exporter(metrics)
            .with_resource(resource)
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_meter_provider(meter.clone());
        opentelemetry::global::set_tracer_provider(tracer.clone());
        // The spans carry their conventions' attributes only, not the
        // source location, thread or poll times of each.
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer.tracer("recovery-gateway"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false);
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .map_err(|_| TelemetryError("a tracing subscriber is already installed".into()))?;
        Ok(Telemetry { tracer, meter })
    }

    /// Exports what is left and stops the exporters. Blocking: call it
    /// off the runtime's worker threads (or after the runtime is done).
    pub fn shutdown(self) {
        let _ = self.tracer.shutdown();
        let _ = self.meter.shutdown();
    }
}

/// Request headers as the propagator's carrier.
struct HeaderCarrier<'a>(&'a HeaderMap);

impl Extractor for HeaderCarrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// The exporters' HTTP client: each export runs on the gateway's runtime
/// through the project's client, bounded in time and in reply size.
#[derive(Clone)]
struct RuntimeClient {
    runtime: tokio::runtime::Handle,
    client: tower_recovery::https::HttpsClient,
}

impl fmt::Debug for RuntimeClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RuntimeClient").finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for RuntimeClient {
    async fn send_bytes(
        &self,
        request: Request<Bytes>,
    ) -> Result<Response<Bytes>, opentelemetry_http::HttpError> {
        let client = self.client.clone();
        let export = async move {
            let request = request.map(tower_recovery::ReplayBody::full);
            let response = tower::ServiceExt::oneshot(client, request).await?;
            let (head, body) = response.into_parts();
            let body = http_body_util::Limited::new(body, MAX_REPLY_BYTES)
                .collect()
                .await?
                .to_bytes();
            Ok::<_, opentelemetry_http::HttpError>(Response::from_parts(head, body))
        };
        // The timer is made on the runtime: the caller is an exporter's
        // thread, outside it.
        self.runtime
            .spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, export).await })
            .await?
            .map_err(|_| "the OTLP export timed out")?
    }
}

/// The server span of every request, the outermost layer (a refusal is
/// a response here too): named `{method}` as the HTTP conventions name a
/// server span without a low-cardinality route (a path may hold a stream
/// id), the child of the client's `traceparent` when it sent a valid
/// one, with the response's status, and open until the response body's
/// last frame (the body is read inside it: a span ends where it was last
/// left). Without an export nothing is made and the inner future is
/// returned as it is.
#[derive(Clone)]
pub(crate) struct ServerSpan<S>(pub(crate) S);

impl<S, B> Service<Request<B>> for ServerSpan<S>
where
    S: Service<Request<B>, Response = Response<GatewayBody>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<GatewayBody>;
    type Error = Infallible;
    type Future = Either<S::Future, BoxFuture<Result<Response<GatewayBody>, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let span = server_span(req.method(), req.uri().path(), req.headers());
        if span.is_disabled() {
            return Either::Left(self.0.call(req));
        }
        let answer = span.in_scope(|| self.0.call(req));
        Either::Right(Box::pin(async move {
            let Ok(resp) = tracing::Instrument::instrument(answer, span.clone()).await;
            let status = resp.status();
            // As a signed integer: the exporter writes an unsigned one as a string.
            span.record("http.response.status_code", i64::from(status.as_u16()));
            if status.is_server_error() {
                span.record("error.type", status.as_str());
                span.record("otel.status_code", "ERROR");
            }
            Ok(resp.map(|inner| SpannedBody { inner, span }.boxed_unsync()))
        }))
    }
}

/// [`ServerSpan`] as a layer.
#[derive(Clone, Copy)]
pub(crate) struct ServerSpanLayer;

impl<S> tower_layer::Layer<S> for ServerSpanLayer {
    type Service = ServerSpan<S>;

    fn layer(&self, inner: S) -> ServerSpan<S> {
        ServerSpan(inner)
    }
}

/// The server span of a request with `headers`: a child of the client's
/// `traceparent`, when it sent a valid one.
fn server_span(method: &http::Method, path: &str, headers: &HeaderMap) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let span = tracing::info_span!(
        "recovery_gateway.request",
        otel.name = method.as_str(),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = method.as_str(),
        url.path = path,
        http.response.status_code = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    // Without an export nothing takes the span: nothing more to do.
    if span.is_disabled() {
        return span;
    }
    let parent =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderCarrier(headers)));
    let _ = span.set_parent(parent);
    span
}

/// A response body read inside the server span it answers for.
struct SpannedBody {
    inner: GatewayBody,
    span: tracing::Span,
}

impl http_body::Body for SpannedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let _inside = this.span.enter();
        std::pin::Pin::new(&mut this.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt as _;
    use recovery_tests::spans::Spans;

    use super::*;

    /// The spans made while answering with `status`, the body read to the
    /// end.
    async fn served(status: u16) -> Spans {
        let spans = Spans::default();
        let subscriber = tracing_subscriber::registry().with(spans.clone());
        let _default = tracing::subscriber::set_default(subscriber);
        let inner = tower::service_fn(
            move |_: Request<()>| -> BoxFuture<Result<Response<GatewayBody>, Infallible>> {
                Box::pin(async move {
                    let mut resp = Response::new(crate::body::full("x"));
                    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
                    Ok(resp)
                })
            },
        );
        let req = Request::post("/v1/chat/completions").body(()).unwrap();
        let Ok(resp) = ServerSpan(inner).call(req).await;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"x");
        spans
    }

    #[tokio::test]
    async fn a_server_error_is_the_spans_error_and_a_client_error_is_not() {
        let field = |spans: &Spans, name: &str| spans.field("recovery_gateway.request", name);
        let failed = served(503).await;
        assert_eq!(field(&failed, "otel.name").as_deref(), Some("\"POST\""));
        assert_eq!(
            field(&failed, "url.path").as_deref(),
            Some("\"/v1/chat/completions\"")
        );
        assert_eq!(
            field(&failed, "http.response.status_code").as_deref(),
            Some("503")
        );
        assert_eq!(field(&failed, "error.type").as_deref(), Some("\"503\""));
        assert_eq!(
            field(&failed, "otel.status_code").as_deref(),
            Some("\"ERROR\"")
        );
        for status in [400, 200] {
            let answered = served(status).await;
            let code = status.to_string();
            assert_eq!(
                field(&answered, "http.response.status_code").as_deref(),
                Some(code.as_str())
            );
            assert_eq!(field(&answered, "error.type"), None, "{status}");
            assert_eq!(field(&answered, "otel.status_code"), None, "{status}");
        }
    }
}
