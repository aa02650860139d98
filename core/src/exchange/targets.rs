//! The targets a request may be served from, as the course sees them: each
//! one's label (the safe name events and reports carry) and declared
//! context window, and the one the next send goes to ([`crate::failover`]).

/// The targets, by index: 0 the request's own, `i` its alternate `i`.
#[derive(Debug, Default)]
pub(crate) struct Targets {
    /// Labels, the request's own first; empty when it has no alternates.
    labels: Vec<String>,
    /// Each target's declared context window, in the order of `labels`.
    windows: Vec<Option<u64>>,
    /// The target the next (or current) send goes to.
    current: usize,
}

impl Targets {
    /// Targets named `labels` (the request's own first) with their
    /// declared `windows`; a request without alternates keeps none.
    pub(crate) fn new(labels: Vec<String>, windows: Vec<Option<u64>>) -> Self {
        Targets {
            labels: if labels.len() > 1 { labels } else { Vec::new() },
            windows,
            current: 0,
        }
    }

    /// The target the next (or current) send goes to.
    pub(crate) fn current(&self) -> usize {
        self.current
    }

    /// How many targets the request has (0 without alternates).
    pub(crate) fn len(&self) -> usize {
        self.labels.len()
    }

    /// The current target's label (none without alternates).
    pub(crate) fn label(&self) -> Option<String> {
        self.labels.get(self.current).cloned()
    }

    /// The labels up to the current target, in order.
    pub(crate) fn tried(&self) -> Vec<String> {
        self.labels[..=self.current.min(self.labels.len().saturating_sub(1))].to_vec()
    }

    /// Alternates after the current target.
    pub(crate) fn left(&self) -> u32 {
        self.labels.len().saturating_sub(self.current + 1) as u32
    }

    /// Takes target `i` as the current one, leaving the one it had (the
    /// lanes of a race change places).
    pub(crate) fn swap_current(&mut self, i: &mut usize) {
        std::mem::swap(&mut self.current, i);
    }

    /// The target a hedge of the current one goes to: the next, or with
    /// none after it, the same.
    pub(crate) fn hedge(&self) -> usize {
        if self.left() > 0 {
            self.current + 1
        } else {
            self.current
        }
    }

    /// Moves to target `i` (a continuation's).
    pub(crate) fn go_to(&mut self, i: usize) -> bool {
        let moved = i != self.current && i < self.labels.len();
        if moved {
            self.current = i;
        }
        moved
    }

    /// Moves to the next target, or, for a prompt too long for the current
    /// one (`larger`), to the next that may take it; the labels of both
    /// ends.
    pub(crate) fn switch(&mut self, larger: bool) -> (String, String) {
        let from = self.label().unwrap_or_default();
        let next = if larger { self.larger_window() } else { None };
        self.current = next.unwrap_or(self.current + 1);
        (from, self.label().unwrap_or_default())
    }

    /// The target after the current one that may take a prompt too long
    /// for it: the first whose declared context window is larger than the
    /// current one's (an undeclared current window counts as 0), or, when
    /// none after it declares one, the next target.
    pub(crate) fn larger_window(&self) -> Option<usize> {
        let rest = self.current + 1..self.labels.len();
        let window = |i: usize| self.windows.get(i).copied().flatten();
        if rest.clone().all(|i| window(i).is_none()) {
            return rest.clone().next();
        }
        let current = window(self.current).unwrap_or(0);
        rest.into_iter()
            .find(|&i| window(i).is_some_and(|w| w > current))
    }
}
