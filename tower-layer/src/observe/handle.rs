use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use recovery_core::failure::{EofEvidence, Violation};
use recovery_core::observer::StreamObserver;
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

/// Shared view of one observed body; cloned into the response extensions.
///
/// The decoder itself lives behind the handle: the body feeds it under the
/// lock and readers look at it under the same lock, so nothing is copied
/// per frame. The two facts a reader needs on every frame (the count of
/// semantic fragments and whether a provider error arrived) are also kept in
/// atomics, readable without the lock.
#[derive(Debug, Clone)]
pub struct ObserveHandle {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    protocol: ProtocolKind,
    state: Mutex<State>,
    semantic: AtomicU64,
    flags: AtomicU8,
}

/// A provider error was observed (set once, never cleared).
const PROVIDER_ERROR: u8 = 1;

/// The decoder and what happened to the body, under the handle's lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// The stream decoder; `None` for a body passed through undecoded.
    pub(crate) observer: Option<StreamObserver>,
    pub(crate) violation: Option<Violation>,
    pub(crate) unexpected_eof: Option<EofEvidence>,
    pub(crate) ended: bool,
    pub(crate) cancelled: bool,
}

impl ObserveHandle {
    pub(crate) fn new(protocol: ProtocolKind, observer: Option<StreamObserver>) -> Self {
        ObserveHandle {
            inner: Arc::new(Shared {
                protocol,
                state: Mutex::new(State {
                    observer,
                    ..State::default()
                }),
                semantic: AtomicU64::new(0),
                flags: AtomicU8::new(0),
            }),
        }
    }

    /// The protocol the body is decoded as.
    pub fn protocol(&self) -> &ProtocolKind {
        &self.inner.protocol
    }

    /// A copy of the observation now.
    pub fn snapshot(&self) -> Observation {
        let s = self.lock();
        let mut o = Observation {
            violation: s.violation,
            unexpected_eof: s.unexpected_eof,
            ended: s.ended,
            cancelled: s.cancelled,
            ..Observation::default()
        };
        if let Some(observer) = &s.observer {
            o.progress = *observer.progress();
            o.terminal = observer.terminal().cloned();
            o.provider_error = observer.provider_error().cloned();
            o.cursor = observer.cursor().clone();
        }
        o
    }

    /// Whether any semantic fragment was observed.
    pub fn semantic_observed(&self) -> bool {
        self.progress().semantic_observed()
    }

    /// The progress counters now (cheap: no clone of the rest).
    pub fn progress(&self) -> Progress {
        self.lock()
            .observer
            .as_ref()
            .map(|o| *o.progress())
            .unwrap_or_default()
    }

    /// The in-stream provider error, once seen.
    pub fn provider_error(&self) -> Option<ProviderError> {
        if !self.provider_error_seen() {
            return None;
        }
        self.lock()
            .observer
            .as_ref()
            .and_then(|o| o.provider_error().cloned())
    }

    /// The terminal proof, once seen.
    pub fn terminal(&self) -> Option<Terminal> {
        self.lock()
            .observer
            .as_ref()
            .and_then(|o| o.terminal().cloned())
    }

    /// Whether a provider error was observed, without taking the lock.
    #[inline]
    pub(crate) fn provider_error_seen(&self) -> bool {
        self.inner.flags.load(Ordering::Acquire) & PROVIDER_ERROR != 0
    }

    /// Semantic fragments observed so far, without taking the lock.
    #[inline]
    pub(crate) fn semantic_fragments(&self) -> u64 {
        self.inner.semantic.load(Ordering::Acquire)
    }

    /// Brings the lock-free facts up to date after the decoder moved.
    #[inline]
    pub(crate) fn publish(&self, observer: &StreamObserver) {
        let semantic = observer.progress().semantic_fragments();
        if semantic != self.inner.semantic.load(Ordering::Relaxed) {
            self.inner.semantic.store(semantic, Ordering::Release);
        }
        if observer.provider_error().is_some()
            && self.inner.flags.load(Ordering::Relaxed) & PROVIDER_ERROR == 0
        {
            self.inner.flags.fetch_or(PROVIDER_ERROR, Ordering::Release);
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
