use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use recovery_core::engine::Recovery;
use recovery_core::error::{Evidence, RecoveryError};
use recovery_core::lifecycle::LifecycleObserver;
use recovery_core::outcome::Outcome;
use recovery_core::report::RecoveryReport;

/// The report of a logical request, in the response extensions. It is
/// complete once the response body has ended.
#[derive(Debug, Clone)]
pub struct ReportHandle {
    inner: Arc<Mutex<RecoveryReport>>,
}

impl ReportHandle {
    pub(crate) fn new(report: RecoveryReport) -> Self {
        ReportHandle {
            inner: Arc::new(Mutex::new(report)),
        }
    }

    /// A copy of the report now.
    pub fn report(&self) -> RecoveryReport {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, report: &RecoveryReport) {
        report.clone_into(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// The engine of one logical request and where its events go; shared by the
/// response future (before commit) and the body (after).
pub(crate) struct Shared {
    pub(crate) engine: Recovery,
    pub(crate) observer: Arc<dyn LifecycleObserver + Send + Sync>,
    pub(crate) report: ReportHandle,
    pub(crate) evidence: Evidence,
}

impl Shared {
    /// Delivers pending events and refreshes the published report.
    pub(crate) fn flush(&mut self) {
        for event in self.engine.drain_events() {
            self.observer.on_event(&event);
        }
        self.report.set(self.engine.report());
    }

    pub(crate) fn error(&self, outcome: Outcome) -> RecoveryError {
        RecoveryError::new(outcome, self.engine.report().clone(), self.evidence.clone())
    }
}

pub(crate) type SharedRef = Arc<Mutex<Shared>>;

pub(crate) fn lock(shared: &SharedRef) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}
