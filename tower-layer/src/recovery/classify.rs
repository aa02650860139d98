//! Turning what a driver saw (an inner service error, a body error) into core
//! failure evidence, without keeping any text.

use std::io;

use recovery_core::failure::{Failure, FailureKind, Phase, TransportKind};

use crate::BoxError;
use crate::observe::ObserveError;

/// Classifies an error of the inner service (no response head came back).
pub(crate) fn head_error(err: &BoxError) -> Failure {
    if refused_stream(err.as_ref()) {
        return Failure::transport(TransportKind::RefusedStream, Phase::AwaitingHeaders);
    }
    match io_kind(err.as_ref()) {
        Some(io::ErrorKind::ConnectionRefused) => {
            Failure::transport(TransportKind::Refused, Phase::Connecting)
        }
        Some(io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) => {
            Failure::transport(TransportKind::Reset, Phase::AwaitingHeaders)
        }
        Some(io::ErrorKind::UnexpectedEof) => {
            Failure::transport(TransportKind::Closed, Phase::AwaitingHeaders)
        }
        _ if mentions_tls(err.as_ref()) => {
            Failure::transport(TransportKind::Tls, Phase::Connecting)
        }
        _ => Failure::transport(TransportKind::Other, Phase::Unknown),
    }
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
