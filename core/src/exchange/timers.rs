//! When the machine must be woken: one deadline per timer, the earliest
//! of which is [`Exchange::poll_timeout`](super::Exchange::poll_timeout).
//!
//! Each stage arms the timers it needs when it is entered (every other one
//! is stopped), so a timer that fires always belongs to the stage the
//! request is in. The stall watchdogs of a body being read are one timer,
//! planned by the [`Watch`]: chunks only count, the clock is read at
//! checks, and a check moves the last-activity marks to its time when
//! something came since the previous one.

use std::time::Duration;

use crate::timing::Instant;

/// How long a completed body may stay silent before the driver stops
/// reading it: bytes that follow strong proof (a `data: [DONE]` after
/// `response.completed`, the end of the chunked body) come at once; an SDK
/// that reads to the end must not wait on a server that never closes.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// How many checks a stall timer makes over its timeout: activity is
/// noticed at the next check, so a stall is detected between the timeout
/// and the timeout plus a sixteenth of it after the last byte, never
/// before. A chunk costs a counter, not a clock read (undici keeps coarse
/// timers for the same reason).
pub const CHECKS_PER_TIMEOUT: u32 = 16;

/// A deadline the machine keeps, in the order they are handled when
/// several have passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Timer {
    /// The response head is due (sending, awaiting the head).
    Head,
    /// A streamed answer's first semantic fragment is due (before commit).
    FirstToken,
    /// The body's stall watchdogs: a check, or a stall.
    Watch,
    /// No semantic fragment since the send for the policy's
    /// `hedge_after`: a hedge races the attempt (before commit).
    Hedge,
    /// A wait before the next send ends.
    Wait,
    /// A park offline or an admission wait runs out (the recovery budget or
    /// the deadline).
    Bound,
}

const TIMERS: [Timer; 6] = [
    Timer::Head,
    Timer::FirstToken,
    Timer::Watch,
    Timer::Hedge,
    Timer::Wait,
    Timer::Bound,
];

/// What the watchdogs watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Watching {
    /// An error body: idle only.
    ErrorBody,
    /// A streamed answer: idle, and progress until terminal proof.
    Stream {
        /// Terminal proof was seen: progress no longer matters.
        proven: bool,
    },
    /// What follows strong proof, for [`DRAIN_GRACE`].
    Drain,
}

/// The timer table, and the watch that plans the stall timer.
#[derive(Debug, Clone)]
pub(super) struct Timers {
    at: [Option<Instant>; TIMERS.len()],
    watch: Watch,
}

/// The stall watchdogs' marks. See the module docs.
#[derive(Debug, Clone, Copy)]
struct Watch {
    idle: Option<Duration>,
    progress: Option<Duration>,
    /// No activity after this (as of the last check).
    idle_since: Instant,
    /// No new semantic fragment after this (as of the last check).
    progress_since: Instant,
    checked_at: Instant,
    chunks_checked: u64,
    semantic_checked: u64,
    /// The stall deadline with something new since the last check (the
    /// next check, when it comes first); the table holds the one with
    /// nothing new.
    active: Option<Instant>,
}

impl Timers {
    /// No timer armed; the watchdogs' timeouts (`None`: off).
    pub(super) fn new(idle: Option<Duration>, progress: Option<Duration>, now: Instant) -> Self {
        Timers {
            at: [None; TIMERS.len()],
            watch: Watch {
                idle,
                progress,
                idle_since: now,
                progress_since: now,
                checked_at: now,
                chunks_checked: 0,
                semantic_checked: 0,
                active: None,
            },
        }
    }

    /// Arms (or, with `None`, stops) `timer`.
    pub(super) fn set(&mut self, timer: Timer, at: Option<Instant>) {
        self.at[timer as usize] = at;
    }

    /// Stops `timer`.
    pub(super) fn stop(&mut self, timer: Timer) {
        self.at[timer as usize] = None;
    }

    /// When `timer` fires, if armed.
    pub(super) fn get(&self, timer: Timer) -> Option<Instant> {
        self.at[timer as usize]
    }

    /// Stops every timer (a new stage arms its own).
    pub(super) fn clear(&mut self) {
        self.at = [None; TIMERS.len()];
    }

    /// Stops the timers of the attempt's reading (its head, its first
    /// token, the stall watch), as a new phase of it arms its own: a hedge
    /// due runs on through the phases of the attempt it races.
    pub(super) fn clear_reading(&mut self) {
        for t in [Timer::Head, Timer::FirstToken, Timer::Watch] {
            self.stop(t);
        }
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        self.at.iter().flatten().min().copied()
    }

    /// The first timer, in handling order, that has fired by `now`.
    pub(super) fn expired(&self, now: Instant) -> Option<Timer> {
        TIMERS
            .into_iter()
            .find(|t| self.at[*t as usize].is_some_and(|at| at <= now))
    }

    /// A chunk came (`chunks` read so far): the first since the last check
    /// brings the stall timer to the next check, when that comes first.
    #[inline]
    pub(super) fn chunk_came(&mut self, chunks: u64) {
        if chunks == self.watch.chunks_checked + 1 && self.at[Timer::Watch as usize].is_some() {
            self.at[Timer::Watch as usize] = self.watch.active;
        }
    }

    /// Starts the watchdogs at `now` for what is read from now on.
    pub(super) fn restart_watch(&mut self, now: Instant, chunks: u64, watching: Watching) {
        let w = &mut self.watch;
        w.idle_since = now;
        w.progress_since = now;
        w.checked_at = now;
        w.chunks_checked = chunks;
        w.semantic_checked = 0;
        self.plan(watching);
    }

    /// A check at `now`: notes what came since the last one (`chunks` read,
    /// `semantic` fragments seen) and plans the stall timer again.
    pub(super) fn check_watch(
        &mut self,
        now: Instant,
        chunks: u64,
        semantic: u64,
        watching: Watching,
    ) {
        let w = &mut self.watch;
        if chunks != w.chunks_checked {
            w.chunks_checked = chunks;
            w.idle_since = now;
        }
        if semantic != w.semantic_checked {
            w.semantic_checked = semantic;
            w.progress_since = now;
        }
        w.checked_at = now;
        self.plan(watching);
    }

    /// Whether the idle watchdog has run out at `now` (as of the last
    /// check).
    pub(super) fn idle_due(&self, now: Instant) -> bool {
        let w = &self.watch;
        w.idle.is_some_and(|d| now >= w.idle_since + d)
    }

    /// Plans the stall timer for `watching`: the idle or progress timeout
    /// with nothing new, and, with something new, the next check when it
    /// comes first (so that asking costs a comparison).
    fn plan(&mut self, watching: Watching) {
        let w = &mut self.watch;
        let (idle, progress) = match watching {
            Watching::ErrorBody => (w.idle, None),
            Watching::Drain => (Some(DRAIN_GRACE), None),
            Watching::Stream { proven } => (w.idle, w.progress.filter(|_| !proven)),
        };
        let quiet = earliest(
            idle.map(|d| w.idle_since + d),
            progress.map(|d| w.progress_since + d),
        );
        w.active = earliest(idle, progress).map(|finest| {
            let check = w.checked_at + (finest / CHECKS_PER_TIMEOUT).max(Duration::from_millis(1));
            quiet.map_or(check, |q| q.min(check))
        });
        // Planned at a check (or a restart): nothing new since.
        self.at[Timer::Watch as usize] = quiet;
    }
}

fn earliest<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
