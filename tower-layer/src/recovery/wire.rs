//! An opt-in hook that sees the exact bytes on the wire: each request before
//! dispatch, each response head and each body chunk.
//!
//! It exists for capture and audit (record exactly what was sent and
//! received) and as a veto: an error from any method stops recovery before
//! anything more is delivered, with the permanent outcome
//! `observer_rejected`.

use bytes::Bytes;

use crate::BoxError;

/// Sees the raw exchange of every attempt. Every method defaults to a no-op.
pub trait WireObserver: Send + Sync {
    /// The request of attempt `attempt` (1-based), just before it is sent.
    fn on_request(
        &self,
        attempt: u32,
        head: &http::request::Parts,
        body: &Bytes,
    ) -> Result<(), BoxError> {
        let _ = (attempt, head, body);
        Ok(())
    }

    /// The response head of attempt `attempt`.
    fn on_response_head(&self, attempt: u32, head: &http::response::Parts) -> Result<(), BoxError> {
        let _ = (attempt, head);
        Ok(())
    }

    /// One chunk of attempt `attempt`'s response body, before delivery.
    fn on_body_chunk(&self, attempt: u32, chunk: &Bytes) -> Result<(), BoxError> {
        let _ = (attempt, chunk);
        Ok(())
    }
}

/// A shared observer, so the caller can keep a handle to what it captured.
impl<T: WireObserver + ?Sized> WireObserver for std::sync::Arc<T> {
    fn on_request(
        &self,
        attempt: u32,
        head: &http::request::Parts,
        body: &Bytes,
    ) -> Result<(), BoxError> {
        (**self).on_request(attempt, head, body)
    }

    fn on_response_head(&self, attempt: u32, head: &http::response::Parts) -> Result<(), BoxError> {
        (**self).on_response_head(attempt, head)
    }

    fn on_body_chunk(&self, attempt: u32, chunk: &Bytes) -> Result<(), BoxError> {
        (**self).on_body_chunk(attempt, chunk)
    }
}
