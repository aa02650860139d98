//! The HTTP client the project's binaries send through (`recover`,
//! `recovery-gateway`, the examples): hyper-util's pooled client over
//! `http://` and `https://`, rustls with the ring provider and the webpki
//! roots, HTTP/1.1, sending the replayable bodies the recovery layer hands
//! it.
//!
//! Its own re-send of a request hyper handed back unwritten (a pooled
//! connection found closed) stays on: nothing was sent, so there is
//! nothing for recovery to decide, and turned off that request would be
//! counted as a failed attempt of unknown acceptance.

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::ReplayBody;

/// The client type: what [`client`] builds.
pub type HttpsClient = Client<HttpsConnector<HttpConnector>, ReplayBody>;

/// A new client (one connection pool; clones share it).
pub fn client() -> HttpsClient {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .expect("the ring provider supports the default protocol versions")
        .https_or_http()
        .enable_http1()
        .build();
    Client::builder(TokioExecutor::new()).build(connector)
}
