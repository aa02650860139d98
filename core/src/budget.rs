//! Budgets that bound sends: the per-request attempt allowance and the
//! cross-request retry budget.
//!
//! The allowance makes "physical sends ≤ `max_attempts`" hold across nested
//! layers and resumes: every send is debited *before* it is made, from one
//! counter shared by everything serving the same logical request. The retry
//! budget keeps an outage from becoming a retry storm: retries are allowed
//! only while they stay a fraction of recent requests (plus a small reserve),
//! in the shape of Finagle's `RetryBudget` and gRPC's throttling.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::timing::Instant;

/// Physical sends left for one logical request, shared by every layer that
/// serves it.
#[derive(Debug, Clone)]
pub struct AttemptAllowance {
    left: Arc<AtomicU32>,
    total: u32,
}

impl AttemptAllowance {
    /// An allowance of `total` sends.
    pub fn new(total: u32) -> Self {
        AttemptAllowance {
            left: Arc::new(AtomicU32::new(total)),
            total,
        }
    }

    /// Takes one send; `false` (and nothing taken) when none is left.
    pub fn try_debit(&self) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Sends left.
    pub fn remaining(&self) -> u32 {
        self.left.load(Ordering::Acquire)
    }

    /// Sends made so far.
    pub fn used(&self) -> u32 {
        self.total - self.remaining()
    }

    /// The allowance's size.
    pub fn total(&self) -> u32 {
        self.total
    }
}

/// Settings of the cross-request retry budget.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct RetryBudgetConfig {
    /// How long a deposit counts.
    pub ttl: Duration,
    /// Retries per second always allowed, whatever the traffic.
    pub min_retries_per_sec: u32,
    /// Fraction of requests that may be retried (0.1 = 10 %).
    pub percent: f64,
}

impl RetryBudgetConfig {
    /// A budget where deposits count for `ttl`, `min_retries_per_sec`
    /// retries per second are always allowed, and `percent` of requests
    /// (0.1 = 10 %) may be retried.
    pub fn new(ttl: Duration, min_retries_per_sec: u32, percent: f64) -> Self {
        RetryBudgetConfig {
            ttl,
            min_retries_per_sec,
            percent,
        }
    }
}

impl Default for RetryBudgetConfig {
    /// 20 % of requests plus a reserve of 1 retry/s over a 10 s window: the
    /// budget every driver runs with unless told otherwise.
    ///
    /// Why these numbers: 20 % is Envoy's default retry budget and
    /// Finagle's; retries then add at most a fifth to the load an outage
    /// already sees. The reserve lets a quiet client (an agent with a few
    /// requests in flight) retry each of them twice whatever the ratio,
    /// while a burst stays bounded: 500 requests that all fail send at
    /// most 500 + 0.2 · 500 + 10 = 610 times (1.22 sends per request;
    /// Finagle's reserve of 10/s would allow 1.4).
    fn default() -> Self {
        RetryBudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 1,
            percent: 0.2,
        }
    }
}

/// Slots the window is divided into; deposits expire slot by slot.
const SLOTS: usize = 10;
/// Fixed-point scale: one retry costs this many units.
const UNIT: i64 = 1000;

#[derive(Debug)]
struct BudgetState {
    slot_len: Duration,
    /// Index of the slot `current` refers to, counted from the clock origin.
    current: u64,
    deposits: [i64; SLOTS],
    withdrawals: [i64; SLOTS],
}

/// A cross-request retry budget on the injected clock. Clones share it.
///
/// Each request deposits `percent` of a retry; each retry withdraws one; the
/// reserve `min_retries_per_sec · ttl` is always available. Deposits and
/// withdrawals older than `ttl` expire. A refused withdrawal changes nothing.
#[derive(Debug, Clone)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    deposit_units: i64,
    reserve_units: i64,
    state: Arc<Mutex<BudgetState>>,
}

impl RetryBudget {
    /// A budget with `config` (ttl clamped to 1–60 s, percent to 0–10).
    pub fn new(config: RetryBudgetConfig) -> Self {
        let ttl = config
            .ttl
            .clamp(Duration::from_secs(1), Duration::from_mins(1));
        let percent = if config.percent.is_finite() {
            config.percent.clamp(0.0, 10.0)
        } else {
            0.0
        };
        let config = RetryBudgetConfig {
            ttl,
            percent,
            ..config
        };
        RetryBudget {
            deposit_units: (percent * UNIT as f64).round() as i64,
            reserve_units: i64::from(config.min_retries_per_sec)
                * i64::try_from(ttl.as_secs()).unwrap_or(60)
                * UNIT,
            state: Arc::new(Mutex::new(BudgetState {
                slot_len: ttl / SLOTS as u32,
                current: 0,
                deposits: [0; SLOTS],
                withdrawals: [0; SLOTS],
            })),
            config,
        }
    }

    /// The budget's settings.
    pub fn config(&self) -> RetryBudgetConfig {
        self.config
    }

    fn rotate(state: &mut BudgetState, now: Instant) -> usize {
        let slot = (now.since_origin().as_nanos() / state.slot_len.as_nanos().max(1)) as u64;
        if slot > state.current {
            let stale = (slot - state.current).min(SLOTS as u64);
            for i in 1..=stale {
                let idx = ((state.current + i) % SLOTS as u64) as usize;
                state.deposits[idx] = 0;
                state.withdrawals[idx] = 0;
            }
            state.current = slot;
        }
        (state.current % SLOTS as u64) as usize
    }

    fn balance_units(&self, state: &BudgetState) -> i64 {
        let deposits: i64 = state.deposits.iter().sum();
        let withdrawals: i64 = state.withdrawals.iter().sum();
        self.reserve_units + deposits - withdrawals
    }

    /// Records one logical request.
    pub fn deposit(&self, now: Instant) {
        let mut s = self.state.lock().expect("retry budget");
        let idx = Self::rotate(&mut s, now);
        s.deposits[idx] += self.deposit_units;
    }

    /// Takes one retry, or `None` when the budget is empty (and then nothing
    /// changes). Dropping the permit unspent returns it.
    pub fn try_withdraw(&self, now: Instant) -> Option<RetryPermit> {
        RetryPermit::take(Arc::new(self.clone()), now)
    }

    /// Retries available now (whole retries).
    pub fn balance(&self, now: Instant) -> i64 {
        let mut s = self.state.lock().expect("retry budget");
        Self::rotate(&mut s, now);
        self.balance_units(&s) / UNIT
    }
}

/// Where a retry budget keeps its deposits and withdrawals: the seam for a
/// budget shared beyond one process (a fleet of agents on one provider
/// key). [`RetryBudget`] is the in-memory one, shared by its clones.
pub trait BudgetStore: Send + Sync {
    /// Records one logical request at `now`.
    fn deposit(&self, now: Instant);
    /// Takes one retry at `now`: a token for [`BudgetStore::refund`], or
    /// `None` when the budget is empty (and then nothing changes).
    fn withdraw(&self, now: Instant) -> Option<u64>;
    /// Gives back a retry taken with `token` and never sent.
    fn refund(&self, token: u64);
}

/// Named only: a store's state may live elsewhere.
impl std::fmt::Debug for dyn BudgetStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BudgetStore")
    }
}

impl BudgetStore for RetryBudget {
    fn deposit(&self, now: Instant) {
        RetryBudget::deposit(self, now);
    }

    /// The token is the window slot the withdrawal was counted in.
    fn withdraw(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().expect("retry budget");
        let idx = Self::rotate(&mut s, now);
        if self.balance_units(&s) < UNIT {
            return None;
        }
        s.withdrawals[idx] += UNIT;
        Some(s.current)
    }

    fn refund(&self, slot: u64) {
        let mut s = self.state.lock().expect("retry budget");
        // A withdrawal that already expired has nothing left to refund.
        if slot + (SLOTS as u64) > s.current {
            let idx = (slot % SLOTS as u64) as usize;
            s.withdrawals[idx] = (s.withdrawals[idx] - UNIT).max(0);
        }
    }
}

/// One retry taken from a [`RetryBudget`]. Call [`RetryPermit::spend`] when the
/// retry is actually sent; dropped unspent (cancelled during backoff, refused
/// at the last check) it is returned to the budget.
#[must_use = "an unspent permit is refunded when dropped"]
pub struct RetryPermit {
    store: Arc<dyn BudgetStore>,
    token: u64,
    spent: bool,
}

impl std::fmt::Debug for RetryPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryPermit")
            .field("spent", &self.spent)
            .finish_non_exhaustive()
    }
}

impl RetryPermit {
    /// Takes one retry from `store` at `now`, or `None` when it is empty.
    pub fn take(store: Arc<dyn BudgetStore>, now: Instant) -> Option<Self> {
        let token = store.withdraw(now)?;
        Some(RetryPermit {
            store,
            token,
            spent: false,
        })
    }

    /// Marks the retry as sent: the withdrawal stands.
    pub fn spend(mut self) {
        self.spent = true;
    }
}

impl Drop for RetryPermit {
    fn drop(&mut self) {
        if !self.spent {
            self.store.refund(self.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_origin(Duration::from_millis(ms))
    }

    #[test]
    fn allowance_debits_before_each_send_and_stops_at_zero() {
        let a = AttemptAllowance::new(3);
        let shared = a.clone();
        assert!(a.try_debit());
        assert!(shared.try_debit());
        assert!(a.try_debit());
        assert!(!shared.try_debit());
        assert_eq!((a.used(), a.remaining()), (3, 0));
    }

    /// Token accounting, one row per step: (action, expected balance after).
    #[test]
    fn token_accounting_table() {
        enum Step {
            Deposit,
            Withdraw(bool),
        }
        let b = RetryBudget::new(RetryBudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 0,
            percent: 0.5,
        });
        let rows = [
            (Step::Withdraw(false), 0),
            (Step::Deposit, 0),
            (Step::Deposit, 1),
            (Step::Withdraw(true), 0),
            (Step::Withdraw(false), 0),
            (Step::Deposit, 0),
            (Step::Deposit, 1),
            (Step::Deposit, 1),
            (Step::Deposit, 2),
            (Step::Withdraw(true), 1),
            (Step::Withdraw(true), 0),
            (Step::Withdraw(false), 0),
        ];
        for (i, (step, want)) in rows.into_iter().enumerate() {
            match step {
                Step::Deposit => b.deposit(at(i as u64)),
                Step::Withdraw(ok) => {
                    let p = b.try_withdraw(at(i as u64));
                    assert_eq!(p.is_some(), ok, "row {i}");
                    if let Some(p) = p {
                        p.spend();
                    }
                }
            }
            assert_eq!(b.balance(at(i as u64)), want, "row {i}");
        }
    }

    #[test]
    fn reserve_then_deposits_expire_after_ttl() {
        let b = RetryBudget::new(RetryBudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 1,
            percent: 1.0,
        });
        assert_eq!(b.balance(at(0)), 10, "reserve = 1/s × 10 s");
        for _ in 0..5 {
            b.deposit(at(0));
        }
        assert_eq!(b.balance(at(0)), 15);
        assert_eq!(b.balance(at(9_999)), 15);
        assert_eq!(b.balance(at(10_000)), 10, "deposits of slot 0 expired");
    }

    #[test]
    fn unspent_permit_is_refunded_and_spent_one_is_not() {
        let b = RetryBudget::new(RetryBudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_sec: 0,
            percent: 1.0,
        });
        b.deposit(at(0));
        let p = b.try_withdraw(at(0)).expect("one retry");
        assert_eq!(b.balance(at(0)), 0);
        drop(p);
        assert_eq!(b.balance(at(0)), 1, "cancelled retry refunded");
        b.try_withdraw(at(0)).expect("again").spend();
        assert_eq!(b.balance(at(0)), 0);
        assert!(b.try_withdraw(at(0)).is_none());
    }

    /// A store kept elsewhere: the permit asks it, and gives back what it
    /// did not spend.
    #[test]
    fn a_permit_works_with_any_store() {
        #[derive(Default)]
        struct Counted {
            left: Mutex<i64>,
            refunded: Mutex<Vec<u64>>,
        }
        impl BudgetStore for Counted {
            fn deposit(&self, _: Instant) {
                *self.left.lock().unwrap() += 1;
            }
            fn withdraw(&self, now: Instant) -> Option<u64> {
                let mut left = self.left.lock().unwrap();
                (*left > 0).then(|| {
                    *left -= 1;
                    now.since_origin().as_secs()
                })
            }
            fn refund(&self, token: u64) {
                self.refunded.lock().unwrap().push(token);
                *self.left.lock().unwrap() += 1;
            }
        }
        let store = Arc::new(Counted::default());
        let shared: Arc<dyn BudgetStore> = store.clone();
        assert!(
            RetryPermit::take(Arc::clone(&shared), at(0)).is_none(),
            "empty"
        );
        shared.deposit(at(0));
        RetryPermit::take(Arc::clone(&shared), at(7_000))
            .expect("one")
            .spend();
        assert!(store.refunded.lock().unwrap().is_empty());
        shared.deposit(at(0));
        drop(RetryPermit::take(Arc::clone(&shared), at(9_000)).expect("one"));
        assert_eq!(
            *store.refunded.lock().unwrap(),
            [9],
            "unspent: refunded with its token"
        );
        assert_eq!(*store.left.lock().unwrap(), 1);
    }

    #[test]
    fn budget_recovers_after_an_outage() {
        let b = RetryBudget::new(RetryBudgetConfig::default());
        // An outage drains the reserve.
        let mut granted = 0;
        for _ in 0..1000 {
            b.deposit(at(0));
            if let Some(p) = b.try_withdraw(at(0)) {
                p.spend();
                granted += 1;
            }
        }
        assert_eq!(granted, 10 + 200, "reserve 10 plus 20 % of 1000");
        assert!(b.try_withdraw(at(0)).is_none());
        // Ten seconds later the window has rolled over.
        assert!(b.try_withdraw(at(10_000)).is_some());
    }
}
