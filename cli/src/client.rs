//! The HTTP client under the recovery stack, and one exchange through it.

use std::io;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use recovery_core::call::Cancellation;
use recovery_core::error::RecoveryError;
use recovery_core::report::RecoveryReport;
use tower_recovery::{BoxError, RecoveryBody, ReportHandle};
use tower_service::Service;

pub use tower_recovery::https::HttpsClient;

/// The client (`tower_recovery::https::client`).
pub fn https_client() -> HttpsClient {
    tower_recovery::https::client()
}

/// How one exchange through the recovery stack ended.
#[derive(Debug)]
pub struct Exchange {
    /// The status of the response that reached the consumer, if any did.
    pub status: Option<u16>,
    /// The final report.
    pub report: RecoveryReport,
    /// Whether `cancel` was raised before the exchange ended.
    pub cancelled: bool,
    /// The sink refused bytes (for example a closed stdout); the body was
    /// dropped, which the report records as a cancellation.
    pub sink_error: Option<io::Error>,
}

impl Exchange {
    /// Whether the stream completed with terminal proof.
    pub fn completed(&self) -> bool {
        self.report
            .outcome
            .as_ref()
            .is_some_and(recovery_core::outcome::Outcome::is_completed)
    }
}

/// Sends `req` through `svc` and hands every delivered body chunk to `sink`
/// as it arrives. Raising `cancel` stops the exchange: before commit the
/// layer sees it through the request's `RecoveryCall`; after commit the body
/// is dropped, which the engine records as a cancellation while streaming.
///
/// The request should carry a `RecoveryCall` with the same `cancel`.
pub async fn exchange<S, B>(
    svc: &mut S,
    req: Request<Full<Bytes>>,
    cancel: &Cancellation,
    mut sink: impl FnMut(&[u8]) -> io::Result<()>,
) -> Exchange
where
    S: Service<Request<Full<Bytes>>, Response = Response<RecoveryBody<B>>, Error = RecoveryError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let response = match svc.call(req).await {
        Ok(response) => response,
        Err(error) => {
            return Exchange {
                status: None,
                report: error.report().clone(),
                cancelled: cancel.is_cancelled(),
                sink_error: None,
            };
        }
    };
    let status = Some(response.status().as_u16());
    let handle = response.extensions().get::<ReportHandle>().cloned();
    let mut body = response.into_body();
    let mut from_error = None;
    let mut sink_error = None;
    loop {
        let frame = tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            frame = body.frame() => frame,
        };
        match frame {
            None => break,
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref()
                    && let Err(e) = sink(data)
                {
                    sink_error = Some(e);
                    break;
                }
            }
            Some(Err(error)) => {
                from_error = Some(error.report().clone());
                break;
            }
        }
    }
    // Dropping an unfinished body is how a consumer cancels: the engine
    // records it before the drop returns.
    drop(body);
    let report = match (handle, from_error) {
        (Some(h), _) => h.report(),
        (None, Some(r)) => r,
        (None, None) => RecoveryReport::new(String::new()),
    };
    Exchange {
        status,
        report,
        cancelled: cancel.is_cancelled(),
        sink_error,
    }
}
