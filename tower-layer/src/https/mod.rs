//! The HTTP client the project's binaries send through (`recover`,
//! `recovery-gateway`, the examples): hyper-util's pooled client over
//! `http://` and `https://`, rustls with the ring provider and the webpki
//! roots, sending the replayable bodies the recovery layer hands it.
//!
//! Each request says which HTTP version it may use with an [`Http2`]
//! request extension (the recovery layer keeps it on every send of the
//! request): HTTP/1.1 by default; [`Http2::Auto`] offers `h2` and
//! `http/1.1` by ALPN on `https://` (HTTP/1.1 on `http://`);
//! [`Http2::Always`] speaks HTTP/2 only (ALPN `h2`, or prior knowledge on
//! `http://`). Each mode has its own connection pools, so the streams of one
//! HTTP/2 origin share a connection, up to a bound per connection past
//! which another opens (see [`lanes`](self#lanes)); a refused stream
//! (`REFUSED_STREAM`, a `GOAWAY` below it) reaches the recovery layer as
//! the unprocessed send it is.
//!
//! # Lanes
//!
//! A server takes a bounded number of streams at once on one HTTP/2
//! connection, and hyper queues a request past that bound until a stream
//! ends: for streamed answers that last minutes, a hang. So the modes that
//! may speak HTTP/2 send through lanes, each a pool of its own with at most
//! one HTTP/2 connection per origin; a request takes the first lane with
//! fewer than [`HTTP2_STREAMS_PER_CONNECTION`] (or the bound given to
//! [`client_with`]) streams open to its origin, and a new lane opens when
//! all are full. A stream holds its place until its body ends, fails or is
//! dropped.
//!
//! # Keep-alive
//!
//! A connection can die without a word (a NAT or a load balancer forgets
//! the flow): no FIN, no RST, and every stream on it waits for bytes that
//! never come, while the pool still hands the connection to new requests.
//! On HTTP/1.1 that costs the one stream on it; on HTTP/2 it costs every
//! stream the connection carries, and each replay sent to it. So an
//! HTTP/2 connection with streams open that has received nothing for
//! [`HTTP2_KEEP_ALIVE_INTERVAL`] is pinged, and closed when the ping is not
//! answered within [`HTTP2_KEEP_ALIVE_TIMEOUT`]: its streams fail as the
//! broken connection they are (the recovery layer replays or resumes them
//! on a new one). A connection that streams bytes is never pinged, and an
//! idle pooled one neither (the first stream sent on it is, at once, when
//! it has been quiet for longer than the interval).
//!
//! # Idle connections
//!
//! A connection back in its pool is closed once it has been idle for
//! [`POOL_IDLE_TIMEOUT`], checked by a timer (hyper-util checks only at the
//! next send to the same origin without one): after a burst, the
//! connections it opened do not outlive it by more than twice that, sent
//! to or not.
//!
//! Its own re-send of a request hyper handed back unwritten (a pooled
//! connection found closed) stays on: nothing was sent, so there is
//! nothing for recovery to decide, and turned off that request would be
//! counted as a failed attempt of unknown acceptance.

mod body;
mod future;
mod lanes;
mod stream;

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, Error};
use hyper_util::rt::{TokioExecutor, TokioTimer};

pub use body::ResponseBody;
pub use future::ResponseFuture;

use crate::ReplayBody;
use lanes::Lanes;
use stream::Connector;

/// Streams one HTTP/2 connection carries at once before the client opens
/// another to the same origin, unless [`client_with`] says otherwise: the
/// least RFC 9113 recommends a server allow.
pub const HTTP2_STREAMS_PER_CONNECTION: usize = 100;

/// How long an HTTP/2 connection with streams open may receive nothing
/// before it is pinged, unless [`Http2Settings`] says otherwise (see
/// [keep-alive](self#keep-alive)). Kubernetes' client pings after 30 s too;
/// a stream that sends anything, even a comment, within it is never
/// pinged.
pub const HTTP2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// How long a ping may go unanswered before its connection is closed.
pub const HTTP2_KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// How long a pooled connection may stay idle before it is closed (see
/// [idle connections](self#idle-connections)): hyper-util's default, kept
/// by a timer.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A pool's builder: its connections closed after [`POOL_IDLE_TIMEOUT`]
/// idle.
fn pool_builder() -> hyper_util::client::legacy::Builder {
    let mut builder = Client::builder(TokioExecutor::new());
    builder
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(POOL_IDLE_TIMEOUT);
    builder
}

/// How the client uses and watches its HTTP/2 connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2Settings {
    /// Streams one connection carries at once before another opens to the
    /// same origin (at least 1; set it to the upstream's
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` where that is lower than the
    /// default, [`HTTP2_STREAMS_PER_CONNECTION`]).
    pub streams_per_connection: usize,
    /// How long a connection with streams open may receive nothing before
    /// it is pinged ([`HTTP2_KEEP_ALIVE_INTERVAL`] by default); `None`
    /// never pings, and leaves a silently dead connection to TCP.
    pub keep_alive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed
    /// ([`HTTP2_KEEP_ALIVE_TIMEOUT`] by default).
    pub keep_alive_timeout: Duration,
}

impl Default for Http2Settings {
    fn default() -> Self {
        Http2Settings {
            streams_per_connection: HTTP2_STREAMS_PER_CONNECTION,
            keep_alive_interval: Some(HTTP2_KEEP_ALIVE_INTERVAL),
            keep_alive_timeout: HTTP2_KEEP_ALIVE_TIMEOUT,
        }
    }
}

/// Which HTTP version a request may use: a request extension read by
/// [`HttpsClient`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Http2 {
    /// HTTP/1.1 only (the default).
    #[default]
    Off,
    /// HTTP/2 when the server offers it by ALPN (`https://`), else
    /// HTTP/1.1.
    Auto,
    /// HTTP/2 only: ALPN `h2` on `https://`, prior knowledge (h2c) on
    /// `http://`.
    Always,
}

type Pool = Client<Connector, ReplayBody>;

/// The client [`client`] builds: a pool for HTTP/1.1 and lanes of pools
/// for each mode that may speak HTTP/2. Clones share them.
///
/// Behind one `Arc`: a layer above clones its service for every request,
/// and a hyper-util `Client` is a dozen fields and reference counts.
#[derive(Clone, Debug)]
pub struct HttpsClient(Arc<Pools>);

#[derive(Debug)]
struct Pools {
    http1: Pool,
    auto: Laned,
    http2: Laned,
}

/// The lanes of a mode that may speak HTTP/2, and how a lane's pool is
/// built.
#[derive(Debug)]
struct Laned {
    lanes: Lanes<Arc<Pool>>,
    connector: Connector,
    http2_only: bool,
    settings: Http2Settings,
}

impl Laned {
    fn new(settings: Http2Settings, connector: Connector, http2_only: bool) -> Self {
        Laned {
            lanes: Lanes::new(settings.streams_per_connection),
            connector,
            http2_only,
            settings,
        }
    }

    fn call(&self, req: Request<ReplayBody>) -> ResponseFuture {
        let (pool, slot) = self.lanes.pick(req.uri(), || {
            let mut builder = pool_builder();
            builder
                .http2_only(self.http2_only)
                .timer(TokioTimer::new())
                .http2_keep_alive_interval(self.settings.keep_alive_interval)
                .http2_keep_alive_timeout(self.settings.keep_alive_timeout)
                .http2_keep_alive_while_idle(false);
            Arc::new(builder.build(self.connector.clone()))
        });
        ResponseFuture::new(pool.request(req), slot)
    }
}

/// A new client with the default [`Http2Settings`].
pub fn client() -> HttpsClient {
    client_with(Http2Settings::default())
}

/// A new client whose HTTP/2 connections are used and watched as
/// `settings` says.
pub fn client_with(settings: Http2Settings) -> HttpsClient {
    let builder = || {
        hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
            .expect("the ring provider supports the default protocol versions")
            .https_or_http()
    };
    // Small writes leave at once: a request's head and body, or an h2
    // frame, must not wait for the acknowledgement of the write before
    // (Nagle's algorithm against the peer's delayed ACK can hold one for
    // tens of milliseconds).
    let tcp = || {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http
    };
    HttpsClient(Arc::new(Pools {
        http1: pool_builder().build(Connector::new(
            builder().enable_http1().wrap_connector(tcp()),
        )),
        auto: Laned::new(
            settings,
            Connector::new(builder().enable_all_versions().wrap_connector(tcp())),
            false,
        ),
        http2: Laned::new(
            settings,
            Connector::new(builder().enable_http2().wrap_connector(tcp())),
            true,
        ),
    }))
}

impl tower_service::Service<Request<ReplayBody>> for HttpsClient {
    type Response = Response<ResponseBody>;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper-util's client is always ready: a send waits for its
        // connection inside its own future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReplayBody>) -> Self::Future {
        match req.extensions().get::<Http2>().copied().unwrap_or_default() {
            Http2::Off => ResponseFuture::new(self.0.http1.request(req), None),
            Http2::Auto => self.0.auto.call(req),
            Http2::Always => self.0.http2.call(req),
        }
    }
}
