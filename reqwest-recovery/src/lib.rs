//! Recovery for reqwest: streamed LLM responses kept whole when the network
//! is not, for clients built on [`reqwest`].
//!
//! Most Rust LLM clients send with a `reqwest::Client`, and few take a
//! tower layer (async-openai's `with_http_service` and rig's
//! `HttpClientExt` do: README, "Rust LLM SDKs"). This crate brings them the
//! recovery of
//! [`tower_recovery`] (replay while no semantic output was observed, the
//! pre-commit prefix held back so a failed attempt is invisible, a typed
//! [`RecoveryError`] after commit, a report of every attempt), the same
//! engine and decisions, in two shapes:
//!
//! - [`ReqwestService`]: a `reqwest::Client` as the tower service under
//!   [`RecoveryLayer`](tower_recovery::RecoveryLayer) and
//!   [`ObserveLayer`](tower_recovery::ObserveLayer), in place of a
//!   hyper-util client. The sends use reqwest's TLS, proxies and pools.
//! - [`RecoveryMiddleware`] (feature `middleware`, on by default): the same
//!   layers as a [`reqwest_middleware::Middleware`], for code built on
//!   `ClientWithMiddleware`; the response is a `reqwest::Response` whose
//!   body is the recovering one.
//!
//! # Over a tower stack
//!
//! ```no_run
//! use http_body_util::{BodyExt, Full};
//! use reqwest_recovery::{ReqwestService, client_builder};
//! use tower::{ServiceBuilder, ServiceExt};
//! use tower_recovery::core::{policy::RecoveryPolicy, protocol::ProtocolKind};
//! use tower_recovery::{ObserveLayer, RecoveryLayer, ReportHandle};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = client_builder().build()?;
//! let svc = ServiceBuilder::new()
//!     .layer(RecoveryLayer::new(RecoveryPolicy::default()))
//!     .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
//!     .service(ReqwestService::new(client));
//! let req = http::Request::post("http://127.0.0.1:11434/v1/chat/completions")
//!     .header("content-type", "application/json")
//!     .body(Full::new(bytes::Bytes::from_static(br#"{"model":"m","stream":true,"messages":[]}"#)))?;
//! let response = svc.oneshot(req).await?;
//! let report = response.extensions().get::<ReportHandle>().cloned();
//! let mut body = response.into_body();
//! while let Some(frame) = body.frame().await {
//!     let frame = frame?; // after commit a failure is a typed RecoveryError
//!     if let Some(bytes) = frame.data_ref() {
//!         print!("{}", String::from_utf8_lossy(bytes));
//!     }
//! }
//! if let Some(report) = report {
//!     eprintln!("{:?}", report.report().outcome);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # The client underneath
//!
//! Recovery must own every resend and see every failure, so the client
//! should decide nothing on its own:
//!
//! - **No redirects.** reqwest follows up to ten by default, re-sending a
//!   POST after a `307`/`308` and turning it into a GET after a
//!   `301`/`302`; recovery never follows one. [`client_builder`] turns
//!   them off.
//! - **No total `timeout`** on streamed requests: it would cut a long
//!   generation. The policy's head, idle and progress timers bound a
//!   stalled exchange and say so in the outcome; `connect_timeout` is fine.
//! - **No retry middleware** behind [`RecoveryMiddleware`]: two retry loops
//!   multiply sends and hide the evidence recovery decides from. reqwest's
//!   own resend of an HTTP/2 stream the server refused unprocessed (its
//!   default retry policy) is not such a loop, like hyper-util's resend of
//!   an unwritten request: it stays on, and counts as one attempt.
//!
//! # Errors
//!
//! A send's failure is an [`Error`] typed by where it happened; its source
//! chain is reqwest's, hyper's and the socket's, which recovery reads to
//! tell a refused connection (not accepted, resent) from a reset after
//! the request went out (acceptance unknown) or a reset of the body. After
//! commit the body ends with a [`RecoveryError`]: through a `reqwest::Response`
//! it arrives inside a `reqwest::Error`, and [`recovery_error`] finds it.
#![deny(unsafe_code, missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod body;
mod error;
#[cfg(feature = "middleware")]
mod middleware;
mod service;

pub use body::ResponseBody;
pub use error::{Error, ErrorKind};
#[cfg(feature = "middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "middleware")))]
pub use middleware::{RecoveryMiddleware, middleware_error};
pub use service::{ReqwestService, ResponseFuture};

pub use recovery_core::error::RecoveryError;
pub use tower_recovery;

/// A type-erased error, as tower, hyper and reqwest use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A [`reqwest::ClientBuilder`] for a client under recovery: redirects off
/// (recovery never follows one: a `307`/`308` would re-send a POST, a
/// `301`/`302` turn it into a GET). Everything else is reqwest's default
/// and can be set on the builder as usual.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none())
}

/// The [`RecoveryError`] in `err`'s source chain, if any: how a failure
/// after commit reaches a caller that reads a `reqwest::Response` (inside
/// the `reqwest::Error` of `chunk`, `bytes_stream`, `text`).
pub fn recovery_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a RecoveryError> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<RecoveryError>() {
            return Some(found);
        }
        cur = e.source();
    }
    None
}
