//! The error of one send through reqwest, as the recovery layer sees it.

use std::error::Error as StdError;
use std::fmt;

use crate::BoxError;

/// Where a send through reqwest failed.
///
/// The kind is for the caller's logs and branches. Recovery does not read
/// it: it reads the [`source`](StdError::source) chain, which ends in the
/// same hyper and socket errors a hyper-util client produces, so a reset or
/// a refused connection is judged the same whichever client sent it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request could not be made into a reqwest request (a URL reqwest
    /// does not accept). Nothing was sent.
    Builder,
    /// Connecting failed: refused, unreachable, name resolution, TLS
    /// handshake, or reqwest's `connect_timeout`.
    Connect,
    /// One of reqwest's own timers fired (`timeout`, `read_timeout`).
    Timeout,
    /// The request failed after connecting and before a response head.
    Request,
    /// Reading the response body failed (a reset, a short body).
    Body,
    /// reqwest could not decode the response body.
    Decode,
    /// A middleware further down a `reqwest_middleware` chain failed.
    Middleware,
    /// A send was asked of a middleware chain that had already returned its
    /// response: a resume after commit through the middleware (see
    /// `RecoveryMiddleware`). Nothing was sent.
    ChainEnded,
    /// Anything else reqwest reported.
    Other,
}

impl ErrorKind {
    fn text(self) -> &'static str {
        match self {
            ErrorKind::Builder => "the request could not be built",
            ErrorKind::Connect => "connecting failed",
            ErrorKind::Timeout => "a reqwest timeout fired",
            ErrorKind::Request => "sending the request failed",
            ErrorKind::Body => "reading the response body failed",
            ErrorKind::Decode => "decoding the response body failed",
            ErrorKind::Middleware => "a middleware failed",
            ErrorKind::ChainEnded => "the middleware chain had already returned",
            ErrorKind::Other => "reqwest failed",
        }
    }
}

/// A failed send or body read through reqwest.
///
/// `Display` names the kind only: no URL (a query string may hold a key),
/// no text from the wire. The reqwest error, stripped of its URL, is the
/// [`source`](StdError::source).
pub struct Error {
    kind: ErrorKind,
    source: Option<BoxError>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, source: Option<BoxError>) -> Self {
        Error { kind, source }
    }

    /// An error of reqwest's, typed by what it says of itself.
    pub(crate) fn from_reqwest(err: reqwest::Error) -> Self {
        // Connecting first: a connect timeout is a connect failure.
        let kind = if err.is_connect() {
            ErrorKind::Connect
        } else if err.is_timeout() {
            ErrorKind::Timeout
        } else if err.is_decode() {
            ErrorKind::Decode
        } else if err.is_body() {
            ErrorKind::Body
        } else if err.is_request() {
            ErrorKind::Request
        } else if err.is_builder() {
            ErrorKind::Builder
        } else {
            ErrorKind::Other
        };
        Error::new(kind, Some(Box::new(err.without_url())))
    }

    /// Where the send failed.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.text())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}
