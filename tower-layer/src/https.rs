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
//! `http://`). Each mode has its own connection pool, so the streams of one
//! HTTP/2 origin share one connection, and a refused stream
//! (`REFUSED_STREAM`, a `GOAWAY` below it) reaches the recovery layer as
//! the unprocessed send it is.
//!
//! Its own re-send of a request hyper handed back unwritten (a pooled
//! connection found closed) stays on: nothing was sent, so there is
//! nothing for recovery to decide, and turned off that request would be
//! counted as a failed attempt of unknown acceptance.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::{Client, Error, ResponseFuture};
use hyper_util::rt::TokioExecutor;

use crate::ReplayBody;

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

type Pool = Client<HttpsConnector<HttpConnector>, ReplayBody>;

/// The client [`client`] builds: one pool per [`Http2`] mode. Clones share
/// the pools.
///
/// Behind one `Arc`: a layer above clones its service for every request,
/// and a hyper-util `Client` is a dozen fields and reference counts, three
/// of them here.
#[derive(Clone, Debug)]
pub struct HttpsClient(Arc<Pools>);

#[derive(Debug)]
struct Pools {
    http1: Pool,
    auto: Pool,
    http2: Pool,
}

/// A new client.
pub fn client() -> HttpsClient {
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
    let executor = TokioExecutor::new;
    HttpsClient(Arc::new(Pools {
        http1: Client::builder(executor()).build(builder().enable_http1().wrap_connector(tcp())),
        auto: Client::builder(executor())
            .build(builder().enable_all_versions().wrap_connector(tcp())),
        http2: Client::builder(executor())
            .http2_only(true)
            .build(builder().enable_http2().wrap_connector(tcp())),
    }))
}

impl tower_service::Service<Request<ReplayBody>> for HttpsClient {
    type Response = Response<Incoming>;
    type Error = Error;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // hyper-util's client is always ready: a send waits for its
        // connection inside its own future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReplayBody>) -> Self::Future {
        let pool = match req.extensions().get::<Http2>().copied().unwrap_or_default() {
            Http2::Off => &self.0.http1,
            Http2::Auto => &self.0.auto,
            Http2::Always => &self.0.http2,
        };
        pool.request(req)
    }
}
