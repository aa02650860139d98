//! A recovering gateway in front of LLM providers.
//!
//! Any client that speaks OpenAI (Chat Completions, Responses), Anthropic,
//! Gemini or Ollama points its base URL at the gateway. Each request goes
//! upstream through [`tower_recovery::RecoveryLayer`] and an
//! [`ObserveLayer`](tower_recovery::ObserveLayer) of its protocol, so the
//! gateway takes the same decisions as the library: a failure before the
//! first token is replayed, an OpenAI Responses background stream is
//! resumed, and a failure it cannot hide reaches the client in the
//! provider's own words (its HTTP error, or its in-stream error event once
//! the stream began), never as a silent truncation.
//!
//! Downstream, a streamed SSE answer is resumable: it carries
//! `x-recovery-stream-id`, each event an `id: <stream>:<seq>` line where
//! every official SDK of the protocol reads one (not Gemini's), every event
//! is kept in a [`log::StreamLog`] before it is sent, the upstream
//! generation goes on when the client leaves (for a keep-generating
//! window), and a reconnect with `Last-Event-ID` (or
//! `GET /streams/<id>?after=<seq>`) with the credentials that created the
//! stream gets the rest without gap or duplicate.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use recovery_gateway::{Config, Gateway};
//!
//! let mut config = Config::default();
//! config.listen = "127.0.0.1:0".parse()?;
//! config.upstream = Some("https://api.openai.com".parse()?);
//! let gateway = Gateway::bind(config).await?;
//! println!("base URL: {}", gateway.url("/v1"));
//! gateway.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! The tree is the request's way: `gateway` (start-up and the running
//! handle), `server` (accept and drain), `stack`
//! (the server side as one `ServiceBuilder`), `phase` (the mechanism every
//! phase shares, and the rescue layer: the only place a refusal becomes a
//! response, `respond`), `phases` (admit, client_auth, reserved, limit,
//! read_body), `proxy` (route, credentials, the upstream call), `forward`
//! (the upstream stacks and proxy header rules), `downstream` (first
//! bytes, the registry, the pump, readers, numbering). Beside them:
//! [`config`], `routes`, [`auth`] (client keys), `identity` (stream ids,
//! owners, log keys), [`log`], [`metrics`], [`logs`].
#![deny(unsafe_code, missing_docs, unreachable_pub)]

pub mod auth;
mod body;
pub mod config;
mod downstream;
mod forward;
mod gateway;
mod identity;
pub mod log;
pub mod logs;
pub mod metrics;
mod phase;
mod phases;
mod proxy;
mod request_body;
mod respond;
mod routes;
mod server;
mod stack;
#[cfg(feature = "otel")]
pub mod telemetry;
mod tunnel;

pub use config::{
    AlternateRoute, Config, ConfigError, Route, RouteProtocol, Secret, StreamLogChoice,
};
pub use downstream::numbering::Comments;
pub use downstream::{RESUMABLE_HEADER, STREAM_ID_HEADER};
pub use gateway::{Gateway, GatewayError, ShutdownHandle};
pub use identity::{looks_like_stream_id, new_stream_id};
