//! The writer behind the logger on standard error: lines go through a
//! bounded queue to a thread of their own, which writes what has gathered
//! in one call.
//!
//! A write to standard error blocks for as long as its reader does not
//! read (a full pipe: a stalled log shipper, a terminal on hold). Made
//! from a runtime worker, that write would stop every stream the worker
//! serves; here it stops the writer thread alone. While the queue is
//! full, lines are dropped and counted, and a `log_lines_dropped` line
//! says how many once writing goes on. Under load the thread also
//! gathers many lines into one write.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::{Field, Level, line};

/// Lines queued at most; past it a line is dropped and counted.
pub(crate) const QUEUE: usize = 4096;

/// Bytes gathered into one write at most (a longer line goes whole).
const BATCH: usize = 64 * 1024;

/// What the sending side and the thread share.
#[derive(Default)]
struct Counts {
    /// Lines dropped since the last count was written.
    dropped: AtomicU64,
    /// Lines written so far.
    written: Mutex<u64>,
    /// Notified after each write.
    wrote: Condvar,
}

/// The sending side; the thread ends when it is dropped.
pub(crate) struct Lines {
    tx: SyncSender<String>,
    /// Lines queued so far.
    queued: AtomicU64,
    counts: Arc<Counts>,
}

impl Lines {
    /// A thread writing to `out`, behind a queue of `capacity` lines.
    pub(crate) fn spawn(out: Box<dyn Write + Send>, capacity: usize) -> std::io::Result<Lines> {
        let (tx, rx) = mpsc::sync_channel(capacity);
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        std::thread::Builder::new()
            .name("recovery-gateway-log".into())
            .spawn(move || run(&rx, out, &shared))?;
        Ok(Lines {
            tx,
            queued: AtomicU64::new(0),
            counts,
        })
    }

    /// Queues `text` (one line, without its end); never waits.
    pub(crate) fn send(&self, text: String) {
        match self.tx.try_send(text) {
            Ok(()) => {
                self.queued.fetch_add(1, Ordering::SeqCst);
            }
            Err(TrySendError::Full(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
            // The thread is gone (it does not panic: only at process end).
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Waits, at most `within`, until every line queued so far is
    /// written; whether it was.
    pub(crate) fn flush(&self, within: Duration) -> bool {
        let target = self.queued.load(Ordering::SeqCst);
        let written = self
            .counts
            .written
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (written, _) = self
            .counts
            .wrote
            .wait_timeout_while(written, within, |w| *w < target)
            .unwrap_or_else(PoisonError::into_inner);
        *written >= target
    }
}

fn run(rx: &Receiver<String>, mut out: Box<dyn Write + Send>, counts: &Counts) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Ok(first) = rx.recv() {
        let mut lines = 0;
        let mut next = Some(first);
        while let Some(text) = next {
            batch.extend_from_slice(text.as_bytes());
            batch.push(b'\n');
            lines += 1;
            next = if batch.len() < BATCH {
                rx.try_recv().ok()
            } else {
                None
            };
        }
        let lost = counts.dropped.swap(0, Ordering::Relaxed);
        if lost > 0 {
            let text = line(
                Level::Warn,
                "log_lines_dropped",
                "log lines dropped while standard error was not read",
                &[("lines", Field::U64(lost))],
            );
            batch.extend_from_slice(text.as_bytes());
            batch.push(b'\n');
        }
        // A closed standard error must not take the gateway down.
        let _ = out.write_all(&batch);
        let _ = out.flush();
        batch.clear();
        batch.shrink_to(BATCH);
        *counts
            .written
            .lock()
            .unwrap_or_else(PoisonError::into_inner) += lines;
        counts.wrote.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps what is written; blocks every write until `gate` lets one
    /// through, when it has one.
    #[derive(Clone)]
    struct Kept {
        bytes: Arc<Mutex<Vec<u8>>>,
        gate: Option<Arc<Mutex<Receiver<()>>>>,
    }

    impl Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Some(gate) = &self.gate {
                let _ = gate.lock().unwrap().recv();
            }
            self.bytes.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn lines_of(bytes: &Mutex<Vec<u8>>) -> Vec<String> {
        String::from_utf8(bytes.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn lines_are_written_in_order_and_a_flush_waits_for_them() {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let out = Kept {
            bytes: Arc::clone(&bytes),
            gate: None,
        };
        let lines = Lines::spawn(Box::new(out), 8).unwrap();
        for i in 0..5 {
            lines.send(format!("line {i}"));
        }
        assert!(lines.flush(Duration::from_secs(10)));
        assert_eq!(
            lines_of(&bytes),
            (0..5).map(|i| format!("line {i}")).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_reader_that_stops_costs_lines_never_a_wait() {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let (open, gate) = mpsc::channel();
        let out = Kept {
            bytes: Arc::clone(&bytes),
            gate: Some(Arc::new(Mutex::new(gate))),
        };
        let capacity = 4;
        let lines = Lines::spawn(Box::new(out), capacity).unwrap();
        // The writer takes the first line and blocks in its write; the
        // queue fills behind it, and each send past that returns at once.
        let sent = 50;
        for i in 0..sent {
            lines.send(format!("line {i}"));
        }
        // The writer is blocked: a flush gives up at its bound.
        assert!(!lines.flush(Duration::ZERO));
        // The reader is back.
        drop(open);
        assert!(lines.flush(Duration::from_secs(10)));
        let written = lines_of(&bytes);
        let (counts, kept): (Vec<_>, Vec<_>) = written
            .iter()
            .partition(|l| l.contains("log_lines_dropped"));
        assert_eq!(counts.len(), 1, "{written:?}");
        let count: serde_json::Value = serde_json::from_str(counts[0]).unwrap();
        let dropped = count["lines"].as_u64().unwrap();
        // What was kept is in order, and with what was dropped it is all.
        assert!(kept.len() <= capacity + 1, "{kept:?}");
        assert_eq!(kept.len() as u64 + dropped, sent);
        for (i, l) in kept.iter().enumerate() {
            assert_eq!(**l, format!("line {i}"));
        }
    }
}
