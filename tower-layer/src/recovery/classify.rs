//! Turning what a driver saw (an inner service error, a body error) into core
//! failure evidence, without keeping any text.

use std::io;

use recovery_core::failure::{Failure, FailureKind, Phase, TransportKind};

use crate::BoxError;
use crate::observe::ObserveError;

/// Classifies an error of the inner service (no response head came back).
pub(crate) fn head_error(err: &BoxError) -> Failure {
    let err = err.as_ref();
    if refused_stream(err) {
        return Failure::transport(TransportKind::RefusedStream, Phase::AwaitingHeaders);
    }
    let never_connected = connect_failure(err);
    match io_kind(err) {
        Some(io::ErrorKind::ConnectionRefused) => {
            Failure::transport(TransportKind::Refused, Phase::Connecting)
        }
        _ if mentions_tls(err) => Failure::transport(TransportKind::Tls, Phase::Connecting),
        // Refused, unresolved or out of time before a connection: nothing
        // went out, whatever the socket said.
        _ if never_connected == Some(Connect::Unresolved) => {
            Failure::transport(TransportKind::Dns, Phase::Connecting)
        }
        _ if never_connected.is_some() => {
            Failure::transport(TransportKind::Other, Phase::Connecting)
        }
        Some(io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => {
            Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders)
        }
        Some(io::ErrorKind::UnexpectedEof) => {
            Failure::transport(TransportKind::Closed, Phase::AwaitingHeaders)
        }
        _ => Failure::transport(TransportKind::Other, Phase::Unknown),
    }
}

/// How a connection that was never made failed, as far as it matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "hyper-util"), allow(dead_code))]
enum Connect {
    /// The name did not resolve.
    Unresolved,
    /// Anything else before the connection (a connect timeout, say).
    Failed,
}

/// A connection hyper-util's client never made: its connector failed, so
/// the request never went out. reqwest's errors carry hyper-util's, so
/// this reads them too. A name that did not resolve is told by the
/// connector's own fixed text for it (`"dns error"`), never by text from
/// the wire or the resolver.
#[cfg(feature = "hyper-util")]
fn connect_failure(err: &(dyn std::error::Error + 'static)) -> Option<Connect> {
    use std::error::Error as _;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(client) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            if !client.is_connect() {
                return None;
            }
            let mut cause = client.source();
            while let Some(c) = cause {
                if c.to_string() == "dns error" {
                    return Some(Connect::Unresolved);
                }
                cause = c.source();
            }
            return Some(Connect::Failed);
        }
        cur = e.source();
    }
    None
}

/// Without the `hyper-util` feature a failed connect is told apart only by
/// a refused socket.
#[cfg(not(feature = "hyper-util"))]
fn connect_failure(_err: &(dyn std::error::Error + 'static)) -> Option<Connect> {
    None
}

/// Classifies an error of the response body.
pub(crate) fn body_error(err: &BoxError) -> Failure {
    if let Some(observe) = err.downcast_ref::<ObserveError>() {
        match observe {
            ObserveError::Protocol(v) => {
                return Failure::new(FailureKind::Protocol { violation: *v }, Phase::Decoding);
            }
            ObserveError::UnexpectedEof(unfinished) => {
                return Failure::new(FailureKind::UnexpectedEof, Phase::Streaming)
                    .with_unfinished(unfinished.unwrap_or_default());
            }
            ObserveError::Body(inner) => return body_error(inner),
        }
    }
    let kind = match io_kind(err.as_ref()) {
        Some(io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => {
            TransportKind::Reset
        }
        Some(io::ErrorKind::UnexpectedEof) => TransportKind::Closed,
        _ => TransportKind::Other,
    };
    Failure::transport(kind, Phase::Streaming)
}

fn io_kind(err: &(dyn std::error::Error + 'static)) -> Option<io::ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        cur = e.source();
    }
    None
}

/// An HTTP/2 stream the server provably did not process (RFC 9113 §8.7,
/// §6.8): reset by the peer with `REFUSED_STREAM`, or failed by the peer's
/// `GOAWAY`. The `h2` crate fails a stream with the remote `GOAWAY` only when
/// its id is above the frame's last-stream-id, or when it is opened after the
/// frame (never sent); streams the server kept end with their own result.
#[cfg(feature = "h2")]
fn refused_stream(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_remote()
                && (h2.is_go_away()
                    || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM)));
        }
        cur = e.source();
    }
    false
}

/// Without the `h2` feature no HTTP/2 error can be told apart: a refused
/// stream stays a transport failure of unknown acceptance.
#[cfg(not(feature = "h2"))]
fn refused_stream(_err: &(dyn std::error::Error + 'static)) -> bool {
    false
}

/// Certificate failures are configuration errors: permanent. Only the error
/// type names are consulted, never message text from the wire.
fn mentions_tls(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        let debug = format!("{e:?}");
        if debug.starts_with("InvalidCertificate") || debug.contains("InvalidCertificate(") {
            return true;
        }
        cur = e.source();
    }
    false
}
