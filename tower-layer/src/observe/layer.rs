use recovery_core::protocol::ProtocolKind;
use recovery_core::wire::Limits;
use tower_layer::Layer;

use super::service::Observe;

/// Applies [`Observe`] to a service: decodes each streamed response body with
/// `protocol` and publishes an [`ObserveHandle`](super::ObserveHandle).
#[derive(Debug, Clone)]
pub struct ObserveLayer {
    protocol: ProtocolKind,
    limits: Limits,
}

impl ObserveLayer {
    /// Observes bodies of `protocol` with the default limits (32 MiB per
    /// line and per event, the policy's default `max_event_bytes`).
    pub fn new(protocol: ProtocolKind) -> Self {
        ObserveLayer {
            protocol,
            limits: Limits::default(),
        }
    }

    /// Uses `limits` for line and event sizes. Under a `RecoveryLayer`, each
    /// send is read under its policy's `max_event_bytes` instead.
    #[must_use]
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observe {
            inner,
            protocol: self.protocol.clone(),
            limits: self.limits,
        }
    }
}
