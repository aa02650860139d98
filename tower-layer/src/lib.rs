//! Tower layers that keep streamed LLM responses whole when the network does
//! not.
//!
//! [`ObserveLayer`] decodes every response body as it passes (SSE or NDJSON,
//! per provider protocol) and publishes progress and terminal proof.
//! [`RecoveryLayer`] replays the request while no semantic output was
//! observed, holds the pre-commit prefix back so a failed attempt is
//! invisible, resolves the response at commit, and ends the body with a typed
//! [`RecoveryError`](recovery_core::error::RecoveryError) when a committed
//! stream fails. Decisions come from `recovery-core`, the same engine the
//! wasm driver runs.
//!
//! # Layer order
//!
//! ```text
//! ServiceBuilder::new()
//!     .layer(RecoveryLayer::new(policy))      // outermost: replay, hold-back, typed errors
//!     .layer(ConcurrencyLimitLayer::new(8))   // limits inside: each send takes a permit
//!     .layer(ObserveLayer::new(protocol))     // decodes the stream, publishes evidence
//!     .service(client)                        // hyper-util client (re-sends only unwritten requests)
//! ```
//!
//! - **`RecoveryLayer` outermost.** It must see every attempt's failure and
//!   own every resend; a retry layer outside it would replay committed
//!   streams, and one inside it would multiply sends behind its back.
//! - **Limits and the observer inside.** Rate and concurrency limits sit
//!   between recovery and the client so every physical send is counted; no
//!   permit is held while backing off. `ObserveLayer` sits next to the client
//!   so it sees the bytes of every attempt.
//! - **Turn off the inner SDK's own retries** (`max_retries = 0`). Two retry
//!   loops multiply sends and hide the evidence this one decides from.
//!   hyper-util's `retry_canceled_requests` (on by default) is not such a
//!   loop: it re-sends only a request that hyper handed back unwritten from
//!   a pooled connection found closed, so leave it on; turned off, that
//!   request reaches recovery as a failed attempt of unknown acceptance and
//!   is counted although nothing was sent.
//!
//! A complete stack, here over an in-process service that answers `503` once
//! and then streams:
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tower::limit::ConcurrencyLimitLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_recovery::core::policy::RecoveryPolicy;
//! use tower_recovery::core::protocol::ProtocolKind;
//! use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};
//!
//! const STREAM: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
//!                       data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
//!                       data: [DONE]\n\n";
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! // Stands in for the HTTP client: 503 with Retry-After first, then the stream.
//! let sends = Arc::new(AtomicU32::new(0));
//! let counter = Arc::clone(&sends);
//! let client = tower::service_fn(move |_req: Request<ReplayBody>| {
//!     let n = counter.fetch_add(1, Ordering::SeqCst);
//!     async move {
//!         let response = if n == 0 {
//!             Response::builder().status(503).header("retry-after-ms", "5").body(Full::new(Bytes::new()))
//!         } else {
//!             Response::builder()
//!                 .header("content-type", "text/event-stream")
//!                 .body(Full::new(Bytes::from_static(STREAM.as_bytes())))
//!         };
//!         Ok::<_, Infallible>(response.unwrap())
//!     }
//! });
//!
//! let events = Arc::new(Mutex::new(Vec::new()));
//! let sink = Arc::clone(&events);
//! let policy = RecoveryPolicy::builder()
//!     .backoff(Duration::from_millis(1), Duration::from_millis(10))
//!     .build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(RecoveryLayer::new(policy).on_event(move |e| {
//!         sink.lock().unwrap().push(e.kind.name());
//!     }))
//!     .layer(ConcurrencyLimitLayer::new(8))
//!     .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
//!     .service(client);
//!
//! let request = Request::post("http://provider.invalid/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(Bytes::from_static(b"{\"stream\":true}")))?;
//! let response = svc.oneshot(request).await?;
//! assert_eq!(response.status(), 200, "the 503 never reaches the caller");
//! let report = response.extensions().get::<ReportHandle>().cloned().unwrap();
//! let body = response.into_body().collect().await?.to_bytes();
//! assert_eq!(body, STREAM.as_bytes());
//!
//! let report = report.report();
//! assert!(report.outcome.as_ref().is_some_and(|o| o.is_completed()));
//! assert_eq!(report.attempt_count(), 2);
//! assert_eq!(sends.load(Ordering::SeqCst), 2);
//! assert_eq!(events.lock().unwrap().last(), Some(&"completed"));
//! # Ok(())
//! # }
//! ```
//!
//! Over a real connection the inner service is a hyper-util client (any
//! `Service<Request<ReplayBody>>` returning `Response<impl Body<Data = Bytes>>`
//! works):
//!
//! ```no_run
//! use hyper_util::client::legacy::Client;
//! use hyper_util::client::legacy::connect::HttpConnector;
//! use hyper_util::rt::TokioExecutor;
//! use tower::ServiceBuilder;
//! use tower_recovery::core::policy::RecoveryPolicy;
//! use tower_recovery::core::protocol::ProtocolKind;
//! use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody};
//!
//! let client: Client<HttpConnector, ReplayBody> =
//!     Client::builder(TokioExecutor::new()).build_http();
//! let svc = ServiceBuilder::new()
//!     .layer(RecoveryLayer::new(RecoveryPolicy::default()))
//!     .layer(ObserveLayer::new(ProtocolKind::Anthropic))
//!     .service(client);
//! # let _ = svc;
//! ```
//!
//! # What reaches the caller
//!
//! - **Before commit** (no semantic output yet) a failed attempt is invisible:
//!   its status, headers and bytes are dropped and the request is replayed.
//!   A final HTTP error (retries exhausted, or a permanent status) is
//!   returned as that response, with the report in its extensions.
//! - **At commit** the response future resolves with the committed attempt's
//!   head and a [`RecoveryBody`] that yields the held-back prefix, then
//!   streams.
//! - **After commit** a failure ends the body with a typed
//!   [`RecoveryError`](recovery_core::error::RecoveryError) (`interrupted`),
//!   and a clean end without terminal proof is a failure too. Dropping the
//!   body is cancellation, never an EOF.
//! - The [`ReportHandle`] in the response extensions holds the
//!   [`RecoveryReport`](recovery_core::report::RecoveryReport), complete once
//!   the body has ended; lifecycle events go to
//!   [`RecoveryLayer::on_event`]. Cancel a call with a
//!   [`RecoveryCall`](recovery_core::call::RecoveryCall) in the request
//!   extensions.
//!
//! # Features
//!
//! - `tokio` (default): [`TokioTiming`], the timing of the layers' waits.
//! - `tracing`: a span per logical request, named and described by the
//!   OpenTelemetry GenAI conventions (`{operation} {model}`, `gen_ai.*`,
//!   `http.request.resend_count`, `error.type`, `recovery.*`), and one per
//!   send. Nothing is read of the request when no subscriber takes it.
//! - `opentelemetry` (with `tracing`): the GenAI client inference metrics
//!   (`gen_ai.client.inference.duration`, `…time_to_first_chunk` at the
//!   first frame the consumer gets, after hold-back,
//!   `…time_per_output_chunk`, `gen_ai.client.token.usage`) on the meter
//!   of `opentelemetry::global`, made at the first request (install the
//!   provider before it), and each send's W3C `traceparent`, from its span
//!   through `tracing-opentelemetry` and the global propagator.
//! - `hyper-util` (default): tells a connection hyper-util's client never
//!   made from a request that went out. Its connector's errors (refused,
//!   timed out, a name that did not resolve), and reqwest's, which carry
//!   them, are failures before the connection: provably not accepted, so
//!   resent even where an ambiguous failure needs admission. Without the
//!   feature only a refused socket is told apart; a connect timeout or a
//!   resolver failure is a transport failure of unknown acceptance.
//! - `h2`: tells HTTP/2 refusals apart. A stream the server reset with
//!   `REFUSED_STREAM`, or failed by its `GOAWAY` (a stream above the last
//!   one it processes), provably did not reach the application: it is
//!   resent even where an ambiguous failure needs admission, and it counts
//!   as an attempt. Without the feature it is a transport failure of unknown
//!   acceptance. Enable it when the inner client speaks HTTP/2.
//! - `redis`: `tower_recovery::redis`, cooldowns and a retry budget shared
//!   by a fleet of processes through Redis.
//!
//! What is guaranteed and what is not (no exactly-once tool journal; closing
//! a socket does not prove remote termination; headers can differ between
//! attempts before commit), the policy defaults and the lifecycle vocabulary
//! are documented in [`recovery_core`].
#![deny(unsafe_code, missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "https")]
#[cfg_attr(docsrs, doc(cfg(feature = "https")))]
pub mod https;
pub mod observe;
pub mod recovery;
mod request_body;
#[cfg(feature = "tokio")]
mod timing;

pub use observe::{ObserveHandle, ObserveLayer};
pub use recovery::{Alternate, RecoveryBody, RecoveryLayer, ReportHandle};
pub use request_body::ReplayBody;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub use timing::TokioTiming;

pub use recovery_core as core;

/// Cooldown and retry-budget stores that a fleet of processes shares
/// through Redis (the `recovery-redis` crate):
/// `RecoveryLayer::new(policy).with_cooldowns(Arc::new(redis::RedisCooldowns::connect(url, options)?))`.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use recovery_redis as redis;

/// A type-erased error, as tower and hyper use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
