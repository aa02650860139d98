//! Helpers shared by the tower test binaries.

use http::Response;
use http_body_util::BodyExt;
use recovery_core::error::RecoveryError;
use recovery_core::report::RecoveryReport;
use tower_recovery::{BoxError, RecoveryBody, ReportHandle};

/// What a committed response delivered, read to its end.
pub struct Delivered {
    pub status: u16,
    /// The body bytes the consumer received.
    pub bytes: Vec<u8>,
    /// The typed error that ended the body, if one did.
    pub body_error: Option<RecoveryError>,
    /// The report from the response extensions, completed by the body's end.
    pub report: Option<RecoveryReport>,
}

/// Reads `resp` to its end (or its first error), then drops the body.
pub async fn read_to_end<B>(resp: Response<RecoveryBody<B>>) -> Delivered
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let status = resp.status().as_u16();
    let report = resp.extensions().get::<ReportHandle>().cloned();
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    let mut body_error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    bytes.extend_from_slice(d);
                }
            }
            Err(e) => {
                body_error = Some(e);
                break;
            }
        }
    }
    drop(body);
    Delivered {
        status,
        bytes,
        body_error,
        report: report.map(|h| h.report()),
    }
}
