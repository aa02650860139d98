use std::sync::atomic::{AtomicU8, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, MutexGuard};

use recovery_core::exchange::Decoded;
use recovery_core::failure::{Unfinished, Violation};
use recovery_core::observer::{EndOfStream, StreamObserver};
use recovery_core::progress::{Generation, Progress, ProviderError, ResumeCursor, Terminal};
use recovery_core::protocol::ProtocolKind;

/// What the observer has seen of one response body so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Observation {
    /// Counters of the stream.
    pub progress: Progress,
    /// Terminal proof, once seen.
    pub terminal: Option<Terminal>,
    /// An in-stream provider error, once seen.
    pub provider_error: Option<ProviderError>,
    /// A protocol violation, once seen.
    pub violation: Option<Violation>,
    /// The stream ended cleanly without terminal proof (with the frame it
    /// ended inside, if any).
    pub unexpected_eof: Option<Unfinished>,
    /// The body ended (any way).
    pub ended: bool,
    /// The consumer dropped the body before its end.
    pub cancelled: bool,
    /// Where a resumable stream could continue from.
    pub cursor: ResumeCursor,
}

/// Shared view of one observed body; cloned into the response extensions.
///
/// The body owns its decoder and publishes what it saw after every frame:
/// the counters as atomics under a sequence number (plain stores, no lock on
/// the frame path; a reader sees one frame's counters, never a mix), and
/// the facts that change rarely (terminal proof, a provider error, the
/// resume cursor, how the body ended) under a lock, only when they change.
#[derive(Debug, Clone)]
pub struct ObserveHandle {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    protocol: ProtocolKind,
    counters: Counters,
    flags: AtomicU8,
    state: Mutex<State>,
}

/// A provider error was observed (set once, never cleared).
const PROVIDER_ERROR: u8 = 1;
/// Terminal proof was observed (set once, never cleared).
const TERMINAL: u8 = 2;

/// The decoder's counters, published as one consistent set: a sequence
/// number, odd while the body writes, lets a reader on another thread retry
/// instead of mixing two frames' counters (a sequence lock; the body is the
/// only writer, and on x86-64 its fences cost nothing).
#[derive(Debug, Default)]
struct Counters {
    seq: AtomicU64,
    raw_bytes: AtomicU64,
    frames: AtomicU64,
    keepalives: AtomicU64,
    observed_content: AtomicU64,
    observed_reasoning: AtomicU64,
    observed_tool_fragments: AtomicU64,
    observed_side_effects: AtomicU64,
    completed_tool_calls: AtomicU64,
}

impl Counters {
    /// Publishes `p`. Only the observed body calls it, from one task at a time.
    fn store(&self, p: &Progress) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        let set = |a: &AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&self.raw_bytes, p.raw_bytes);
        set(&self.frames, p.frames);
        set(&self.keepalives, p.keepalives);
        set(&self.observed_content, p.observed_content);
        set(&self.observed_reasoning, p.observed_reasoning);
        set(&self.observed_tool_fragments, p.observed_tool_fragments);
        set(&self.observed_side_effects, p.observed_side_effects);
        set(&self.completed_tool_calls, p.completed_tool_calls);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The counters of one publication, never a mix of two.
    fn load(&self) -> Progress {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let p = self.read();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    return p;
                }
            }
            std::hint::spin_loop();
        }
    }

    fn read(&self) -> Progress {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut p = Progress::default();
        p.raw_bytes = get(&self.raw_bytes);
        p.frames = get(&self.frames);
        p.keepalives = get(&self.keepalives);
        p.observed_content = get(&self.observed_content);
        p.observed_reasoning = get(&self.observed_reasoning);
        p.observed_tool_fragments = get(&self.observed_tool_fragments);
        p.observed_side_effects = get(&self.observed_side_effects);
        p.completed_tool_calls = get(&self.completed_tool_calls);
        p
    }

    /// Semantic fragments observed so far.
    fn semantic(&self) -> u64 {
        let p = self.load();
        p.observed_content
            + p.observed_reasoning
            + p.observed_tool_fragments
            + p.observed_side_effects
    }
}

/// The rarely changing facts, under the handle's lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) terminal: Option<Terminal>,
    /// Boxed: most streams never carry one, and every held stream keeps
    /// this state (unboxed, its allocation takes the next size class).
    pub(crate) provider_error: Option<Box<ProviderError>>,
    pub(crate) cursor: ResumeCursor,
    /// What the provider said of the generation (model, finish reasons,
    /// usage), as of the last publication of these facts (a stream says
    /// the last of it just before or with its terminal).
    pub(crate) generation: Generation,
    /// The decoder's verdict on the clean end of the body.
    pub(crate) end: Option<EndOfStream>,
    /// The frame the body ended inside, when it failed.
    pub(crate) unfinished: Option<Unfinished>,
    pub(crate) ended: bool,
    pub(crate) cancelled: bool,
}

impl ObserveHandle {
    pub(crate) fn new(protocol: ProtocolKind) -> Self {
        ObserveHandle {
            inner: Arc::new(Shared {
                protocol,
                counters: Counters::default(),
                flags: AtomicU8::new(0),
                state: Mutex::default(),
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
        Observation {
            progress: self.inner.counters.load(),
            terminal: s.terminal.clone(),
            provider_error: s.provider_error.as_deref().cloned(),
            violation: match &s.end {
                Some(EndOfStream::Violation { violation }) => Some(Violation::from(*violation)),
                _ => None,
            },
            unexpected_eof: match &s.end {
                Some(EndOfStream::UnexpectedEof { pending }) => Some(pending.unwrap_or_default()),
                _ => None,
            },
            ended: s.ended,
            cancelled: s.cancelled,
            cursor: s.cursor.clone(),
        }
    }

    /// Whether any semantic fragment was observed.
    pub fn semantic_observed(&self) -> bool {
        self.progress().semantic_observed()
    }

    /// The progress counters now, as one frame left them (without the lock;
    /// consistent from any thread).
    pub fn progress(&self) -> Progress {
        self.inner.counters.load()
    }

    /// The in-stream provider error, once seen.
    pub fn provider_error(&self) -> Option<ProviderError> {
        if !self.provider_error_seen() {
            return None;
        }
        self.lock().provider_error.as_deref().cloned()
    }

    /// Whether terminal proof was observed, without taking the lock: a
    /// body past its proof has its end close behind.
    #[inline]
    pub fn terminal_seen(&self) -> bool {
        self.inner.flags.load(Ordering::Acquire) & TERMINAL != 0
    }

    /// The terminal proof, once seen.
    pub fn terminal(&self) -> Option<Terminal> {
        self.lock().terminal.clone()
    }

    /// Whether a provider error was observed, without taking the lock.
    #[inline]
    pub(crate) fn provider_error_seen(&self) -> bool {
        self.inner.flags.load(Ordering::Acquire) & PROVIDER_ERROR != 0
    }

    /// Publishes what the decoder saw. `seen` is what the body published
    /// before: the lock is taken only when a rarely changing fact moved.
    #[inline]
    pub(crate) fn publish(&self, observer: &StreamObserver, seen: &mut Published) {
        self.inner.counters.store(observer.progress());
        let moved = seen.terminal != observer.terminal().is_some()
            || seen.provider_error != observer.provider_error().is_some()
            || seen.cursor != *observer.cursor();
        if moved {
            self.publish_facts(observer, seen);
        }
    }

    #[cold]
    fn publish_facts(&self, observer: &StreamObserver, seen: &mut Published) {
        let mut s = self.lock();
        s.terminal = observer.terminal().cloned();
        s.provider_error = observer.provider_error().cloned().map(Box::new);
        s.cursor.clone_from(observer.cursor());
        s.generation.clone_from(observer.generation());
        drop(s);
        seen.terminal = observer.terminal().is_some();
        seen.provider_error = observer.provider_error().is_some();
        seen.cursor.clone_from(observer.cursor());
        if seen.provider_error {
            self.inner.flags.fetch_or(PROVIDER_ERROR, Ordering::Release);
        }
        if seen.terminal {
            self.inner.flags.fetch_or(TERMINAL, Ordering::Release);
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The evidence the recovery layer reads instead of decoding the body again.
impl Decoded for ObserveHandle {
    fn progress(&self) -> Progress {
        self.inner.counters.load()
    }
    fn semantic_fragments(&self) -> u64 {
        self.inner.counters.semantic()
    }
    fn terminal(&self) -> Option<Terminal> {
        if self.terminal_seen() {
            self.lock().terminal.clone()
        } else {
            None
        }
    }
    fn terminal_seen(&self) -> bool {
        ObserveHandle::terminal_seen(self)
    }
    fn provider_error_seen(&self) -> bool {
        ObserveHandle::provider_error_seen(self)
    }
    fn flagged(&self) -> bool {
        self.inner.flags.load(Ordering::Acquire) != 0
    }
    fn provider_error(&self) -> Option<ProviderError> {
        ObserveHandle::provider_error(self)
    }
    fn cursor(&self) -> ResumeCursor {
        self.lock().cursor.clone()
    }
    fn generation(&self) -> Generation {
        self.lock().generation.clone()
    }
    fn end(&self) -> Option<EndOfStream> {
        self.lock().end.clone()
    }
    fn unfinished(&self) -> Option<Unfinished> {
        let s = self.lock();
        match &s.end {
            Some(EndOfStream::UnexpectedEof { pending }) => *pending,
            _ => s.unfinished,
        }
    }
    fn protocol(&self) -> Option<&ProtocolKind> {
        Some(ObserveHandle::protocol(self))
    }
}

/// What a body last published of the rarely changing facts.
#[derive(Debug, Default)]
pub(crate) struct Published {
    terminal: bool,
    provider_error: bool,
    cursor: ResumeCursor,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn uniform(v: u64) -> Progress {
        let mut p = Progress::default();
        p.raw_bytes = v;
        p.frames = v;
        p.keepalives = v;
        p.observed_content = v;
        p.observed_reasoning = v;
        p.observed_tool_fragments = v;
        p.observed_side_effects = v;
        p.completed_tool_calls = v;
        p
    }

    /// A reader on another thread sees the counters of one publication:
    /// every publication below has all counters equal, so a mix shows.
    #[test]
    fn a_reader_on_another_thread_never_sees_two_frames_mixed() {
        let counters = Arc::new(Counters::default());
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let (counters, done) = (Arc::clone(&counters), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut reads = 0u64;
                let mut last = 0;
                while !done.load(Ordering::Acquire) {
                    let p = counters.load();
                    assert_eq!(p, uniform(p.raw_bytes), "counters of two frames mixed");
                    assert!(p.raw_bytes >= last, "counters went back");
                    last = p.raw_bytes;
                    reads += 1;
                }
                reads
            })
        };
        for v in 1..=200_000 {
            counters.store(&uniform(v));
        }
        done.store(true, Ordering::Release);
        let reads = reader.join().expect("reader");
        assert!(reads > 0);
        assert_eq!(counters.load(), uniform(200_000));
        assert_eq!(counters.semantic(), 4 * 200_000);
    }
}
