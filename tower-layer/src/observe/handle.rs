use std::sync::{Arc, Mutex, MutexGuard};

use recovery_core::failure::{EofEvidence, Violation};
use recovery_core::progress::{Progress, ProviderError, ResumeCursor, Terminal};
use recovery_core::protocol::ProtocolKind;

/// What the observer has seen of one response body so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    /// Counters of the stream.
    pub progress: Progress,
    /// Terminal proof, once seen.
    pub terminal: Option<Terminal>,
    /// An in-stream provider error, once seen.
    pub provider_error: Option<ProviderError>,
    /// A protocol violation, once seen.
    pub violation: Option<Violation>,
    /// The stream ended cleanly without terminal proof.
    pub unexpected_eof: Option<EofEvidence>,
    /// The body ended (any way).
    pub ended: bool,
    /// The consumer dropped the body before its end.
    pub cancelled: bool,
    /// Where a resumable stream could continue from.
    pub cursor: ResumeCursor,
}

/// Shared view of an [`Observation`]; cloned into the response extensions.
#[derive(Debug, Clone)]
pub struct ObserveHandle {
    inner: Arc<Mutex<Observation>>,
    protocol: Arc<ProtocolKind>,
}

impl ObserveHandle {
    pub(crate) fn new(protocol: ProtocolKind) -> Self {
        ObserveHandle {
            inner: Arc::default(),
            protocol: Arc::new(protocol),
        }
    }

    /// The protocol the body is decoded as.
    pub fn protocol(&self) -> &ProtocolKind {
        &self.protocol
    }

    /// A copy of the observation now.
    pub fn snapshot(&self) -> Observation {
        self.lock().clone()
    }

    /// Whether any semantic fragment was observed.
    pub fn semantic_observed(&self) -> bool {
        self.lock().progress.semantic_observed()
    }

    /// The progress counters now (cheap: no clone of the rest).
    pub fn progress(&self) -> Progress {
        self.lock().progress
    }

    /// The in-stream provider error, once seen.
    pub fn provider_error(&self) -> Option<ProviderError> {
        self.lock().provider_error.clone()
    }

    /// The terminal proof, once seen.
    pub fn terminal(&self) -> Option<Terminal> {
        self.lock().terminal.clone()
    }

    /// Reads the observation under one lock.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&Observation) -> R) -> R {
        f(&self.lock())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Observation> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
