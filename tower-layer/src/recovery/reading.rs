//! How an [`ObserveLayer`](crate::ObserveLayer) inside reads a send's
//! answer: as the request's machine reads it, whatever the observer was
//! built with, so that one policy decides for the whole stack.

use recovery_core::protocol::ProtocolKind;
use recovery_core::wire::Limits;

/// Put on every send: the observer inside decodes the answer as
/// `protocol` when given (an alternate's own, or the call's, when not the
/// layer's), under `limits` (the policy's `max_event_bytes`).
#[derive(Debug, Clone)]
pub(crate) struct SendReading {
    pub(crate) protocol: Option<ProtocolKind>,
    pub(crate) limits: Limits,
}
