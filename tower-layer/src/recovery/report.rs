use std::sync::{Arc, Mutex, PoisonError};

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

    /// What `f` reads of the report now, without a copy of the whole
    /// report (attempt records, strings): a field or two, read while the
    /// request may still change it.
    pub fn inspect<T>(&self, f: impl FnOnce(&RecoveryReport) -> T) -> T {
        f(&self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn set(&self, report: &RecoveryReport) {
        report.clone_into(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner));
    }
}
