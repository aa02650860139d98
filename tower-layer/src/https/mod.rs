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

use http::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, Error};
use hyper_util::rt::TokioExecutor;

pub use body::ResponseBody;
pub use future::ResponseFuture;

use crate::ReplayBody;
use lanes::Lanes;
use stream::Connector;

/// Streams one HTTP/2 connection carries at once before the client opens
/// another to the same origin, unless [`client_with`] says otherwise: the
/// least RFC 9113 recommends a server allow.
pub const HTTP2_STREAMS_PER_CONNECTION: usize = 100;

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
}

impl Laned {
    fn new(streams_per_connection: usize, connector: Connector, http2_only: bool) -> Self {
        Laned {
            lanes: Lanes::new(streams_per_connection),
            connector,
            http2_only,
        }
    }

    fn call(&self, req: Request<ReplayBody>) -> ResponseFuture {
        let (pool, slot) = self.lanes.pick(req.uri(), || {
            Arc::new(
                Client::builder(TokioExecutor::new())
                    .http2_only(self.http2_only)
                    .build(self.connector.clone()),
            )
        });
        ResponseFuture::new(pool.request(req), slot)
    }
}

/// A new client, [`HTTP2_STREAMS_PER_CONNECTION`] streams per HTTP/2
/// connection.
pub fn client() -> HttpsClient {
    client_with(HTTP2_STREAMS_PER_CONNECTION)
}

/// A new client whose HTTP/2 connections carry `streams_per_connection`
/// streams each at once (at least 1; set it to the upstream's
/// `SETTINGS_MAX_CONCURRENT_STREAMS` where that is lower than the default).
pub fn client_with(streams_per_connection: usize) -> HttpsClient {
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
        http1: Client::builder(TokioExecutor::new()).build(Connector::new(
            builder().enable_http1().wrap_connector(tcp()),
        )),
        auto: Laned::new(
            streams_per_connection,
            Connector::new(builder().enable_all_versions().wrap_connector(tcp())),
            false,
        ),
        http2: Laned::new(
            streams_per_connection,
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
