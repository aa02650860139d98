//! The writer behind the logger on standard error: lines go through a
//! bounded queue to a thread of their own, which writes what has gathered
//! in one call.
//!
//! The thread is not woken for each line (a wake is a system call on the
//! logging side, and a context switch): it looks at the queue every
//! [`BUSY`] while lines come, less often while none do, and at once when
//! a flush asks. Once its looks have found nothing for a while (about
//! 0.3 s), it sleeps until the next line wakes it: an idle gateway's log
//! thread wakes once per [`SLEEP`] instead of four times a second, and
//! only the first line after a quiet spell pays a wake.
//!
//! A write to standard error blocks for as long as its reader does not
//! read (a full pipe: a stalled log shipper, a terminal on hold). Made
//! from a runtime worker, that write would stop every stream the worker
//! serves; here it stops the writer thread alone. While the queue is
//! full, lines are dropped and counted, and a `log_lines_dropped` line
//! says how many once writing goes on. Under load the thread also
//! gathers many lines into one write.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use super::{Field, Level, line};

/// Lines queued at most; past it a line is dropped and counted.
pub(crate) const QUEUE: usize = 4096;

/// Bytes gathered into one write at most (a longer line goes whole).
const BATCH: usize = 64 * 1024;

/// How long the thread waits between looks at the queue while lines
/// come: the queue holds [`QUEUE`] lines for that long.
const BUSY: Duration = Duration::from_millis(10);

/// The longest wait between timed looks while none come; past it, the
/// thread sleeps until a line wakes it.
const IDLE: Duration = Duration::from_millis(250);

/// How long the thread sleeps when no line wakes it: it notices within
/// this that its sending side is gone.
const SLEEP: Duration = Duration::from_secs(10);

/// What the sending side and the thread share.
#[derive(Default)]
struct Counts {
    /// Lines queued so far.
    queued: AtomicU64,
    /// The thread sleeps until a line wakes it (set by the thread, taken
    /// by the send that wakes it).
    asleep: AtomicBool,
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
    counts: Arc<Counts>,
    /// The writer thread, unparked by a flush and by the first line after
    /// it fell asleep.
    thread: std::thread::Thread,
}

impl Lines {
    /// A thread writing to `out`, behind a queue of `capacity` lines.
    pub(crate) fn spawn(out: Box<dyn Write + Send>, capacity: usize) -> std::io::Result<Lines> {
        let (tx, rx) = mpsc::sync_channel(capacity);
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        let thread = std::thread::Builder::new()
            .name("recovery-gateway-log".into())
            .spawn(move || run(&rx, out, &shared))?
            .thread()
            .clone();
        Ok(Lines { tx, counts, thread })
    }

    /// Queues `text` (one line, without its end); never waits.
    pub(crate) fn send(&self, text: String) {
        match self.tx.try_send(text) {
            Ok(()) => {
                self.counts.queued.fetch_add(1, Ordering::SeqCst);
                // After the count: a thread falling asleep either sees this
                // line counted or is seen asleep here (both SeqCst).
                if self.counts.asleep.load(Ordering::SeqCst)
                    && self.counts.asleep.swap(false, Ordering::SeqCst)
                {
                    self.thread.unpark();
                }
            }
            Err(TrySendError::Full(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::SeqCst);
            }
            // The thread is gone (it does not panic: only at process end).
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Waits, at most `within`, until every line queued so far is
    /// written, and the count of those dropped; whether they were.
    pub(crate) fn flush(&self, within: Duration) -> bool {
        let target = self.counts.queued.load(Ordering::SeqCst);
        self.thread.unpark();
        let pending =
            |written: &mut u64| *written < target || self.counts.dropped.load(Ordering::SeqCst) > 0;
        let written = self
            .counts
            .written
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (mut written, _) = self
            .counts
            .wrote
            .wait_timeout_while(written, within, pending)
            .unwrap_or_else(PoisonError::into_inner);
        !pending(&mut written)
    }
}

fn run(rx: &Receiver<String>, mut out: Box<dyn Write + Send>, counts: &Counts) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut pause = BUSY;
    // Lines taken off the queue so far.
    let mut received = 0u64;
    loop {
        if pause < IDLE {
            std::thread::park_timeout(pause);
        } else {
            // Nothing came for a while: asleep until a send or a flush
            // wakes it (or SLEEP passes), unless a line came since the
            // last look.
            counts.asleep.store(true, Ordering::SeqCst);
            if counts.queued.load(Ordering::SeqCst) <= received {
                std::thread::park_timeout(SLEEP);
            }
            counts.asleep.store(false, Ordering::SeqCst);
        }
        let mut wrote = false;
        let mut open = true;
        // Everything queued, in writes of at most BATCH bytes.
        while open {
            let mut lines = 0;
            while batch.len() < BATCH {
                match rx.try_recv() {
                    Ok(text) => {
                        batch.extend_from_slice(text.as_bytes());
                        batch.push(b'\n');
                        lines += 1;
                        received += 1;
                    }
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            // Taken off the count once its line is written, so a flush
            // waits for that line too.
            let lost = counts.dropped.load(Ordering::SeqCst);
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
            if batch.is_empty() {
                break;
            }
            let full = batch.len() >= BATCH;
            // A closed standard error must not take the gateway down.
            let _ = out.write_all(&batch);
            let _ = out.flush();
            batch.clear();
            batch.shrink_to(BATCH);
            {
                let mut written = counts
                    .written
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                *written += lines;
                counts.dropped.fetch_sub(lost, Ordering::SeqCst);
            }
            counts.wrote.notify_all();
            wrote = true;
            if !full {
                break;
            }
        }
        if !open {
            return;
        }
        pause = if wrote { BUSY } else { (pause * 2).min(IDLE) };
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
    fn a_line_sent_while_the_thread_sleeps_wakes_it() {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let out = Kept {
            bytes: Arc::clone(&bytes),
            gate: None,
        };
        let lines = Lines::spawn(Box::new(out), 8).unwrap();
        lines.send("first".into());
        assert!(lines.flush(Duration::from_secs(10)));
        // Quiet for a while, the thread falls asleep.
        let since = std::time::Instant::now();
        while !lines.counts.asleep.load(Ordering::SeqCst) {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "never fell asleep"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // No flush here (a flush wakes it too): the line itself must.
        lines.send("second".into());
        let written = lines.counts.written.lock().unwrap();
        let (written, _) = lines
            .counts
            .wrote
            .wait_timeout_while(written, SLEEP / 2, |w| *w < 2)
            .unwrap();
        assert_eq!(*written, 2, "the line waited for the thread's sleep to end");
        drop(written);
        assert_eq!(lines_of(&bytes), ["first", "second"]);
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
        // The writer takes what is queued and blocks in its write; the
        // queue fills behind it, and each send past that returns at once.
        let sent = 50;
        let lines = Arc::new(lines);
        let sender = Arc::clone(&lines);
        let (done, sending) = mpsc::channel();
        std::thread::spawn(move || {
            for i in 0..sent {
                sender.send(format!("line {i}"));
            }
            let _ = done.send(());
        });
        // A send that waited for the writer would never get here.
        assert!(sending.recv_timeout(Duration::from_secs(10)).is_ok());
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
        assert!(kept.len() <= 2 * capacity, "{kept:?}");
        assert_eq!(kept.len() as u64 + dropped, sent);
        for (i, l) in kept.iter().enumerate() {
            assert_eq!(**l, format!("line {i}"));
        }
    }
}
