//! The course's hedges: how many a request started, when the next may
//! race the attempt in flight, and what a hedge's send takes from the books.
//! A lane of a race sits in the course on a [`Seat`]: its target, the sends
//! that target had, and its record; the lane the machine judges takes the
//! course's seat.

use std::mem;
use std::time::Duration;

use super::ledger::{Ledger, Slot};
use super::targets::Targets;
use crate::budget::RetryPermit;
use crate::decision::AttemptState;
use crate::lifecycle::EventKind;
use crate::policy::{Endpoint, RecoveryPolicy};
use crate::timing::Instant;

/// The hedges of a request. See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Hedging {
    started: u32,
}

impl Hedging {
    /// How long after a send (a resume when `resumed`) a hedge races it,
    /// when one may: hedging is on, the request has not `committed`,
    /// hedges are left, and the endpoint is remote (on a local runner a
    /// second inference needs the admission hook, which a hedge does not
    /// ask).
    pub(crate) fn delay(
        &self,
        policy: &RecoveryPolicy,
        committed: bool,
        resumed: bool,
    ) -> Option<Duration> {
        if resumed
            || committed
            || self.started >= policy.max_hedges().get()
            || policy.endpoint() == Endpoint::Local
        {
            return None;
        }
        policy.hedge_after()
    }

    /// Counts a hedge's send at `now` with the retry `permit` taken for it,
    /// when the allowance has a send left: emits `hedge_started` (naming
    /// the attempt it races, which showed nothing for `after`). `false`:
    /// nothing was counted (a permit not spent is dropped, so refunded).
    pub(crate) fn begin(
        &mut self,
        now: Instant,
        after: Duration,
        ledger: &mut Ledger,
        permit: Option<RetryPermit>,
    ) -> bool {
        if !ledger.debit_hedge() {
            return false;
        }
        if let Some(permit) = permit {
            permit.spend();
        }
        self.started += 1;
        let hedge = ledger.wire_attempt() + 1;
        let after_ms = after;
        ledger.emit(now, EventKind::HedgeStarted { hedge, after_ms });
        true
    }
}

/// Where a lane of a race sits in the course. See the module docs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seat {
    target: usize,
    target_sends: u32,
    slot: Slot,
}

impl Seat {
    /// The seat of a hedge of the current target's attempt, which has had
    /// `target_sends`: the next target, or with none after the current
    /// one, the same.
    pub(super) fn for_hedge(targets: &Targets, target_sends: u32) -> Self {
        let target = targets.hedge();
        Seat {
            target,
            target_sends: if target == targets.current() {
                target_sends
            } else {
                0
            },
            slot: Slot::default(),
        }
    }

    /// The target the lane sends to.
    pub(super) fn target(&self) -> usize {
        self.target
    }

    /// The lane's record.
    pub(super) fn slot(&self) -> Slot {
        self.slot
    }

    /// Changes places with the seat the course holds.
    pub(super) fn swap(
        &mut self,
        targets: &mut Targets,
        state: &mut AttemptState,
        ledger: &mut Ledger,
    ) {
        targets.swap_current(&mut self.target);
        mem::swap(&mut state.target_sends, &mut self.target_sends);
        if let Some(left) = state.alternates_left.as_mut() {
            *left = targets.left();
        }
        ledger.swap_slot(&mut self.slot);
    }
}
