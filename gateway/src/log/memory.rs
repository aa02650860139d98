//! The stream log in this process: a bounded map of bounded streams.
//!
//! One lock guards the map; it is held for a lookup and a copy, never
//! across an await. A reader waiting on a live stream parks on the
//! stream's [`Notify`], registered while the lock is held, so an append
//! that lands between the check and the wait still wakes it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{BoxFuture, Entry, Limits, LogError, Read, StreamLog};

/// The most entries one read returns: a reader far behind catches up in
/// bounded steps instead of copying a whole stream at once.
const READ_BATCH: usize = 1024;

/// Stream logs kept in this process: readable only by this gateway, lost
/// when it stops. Bounded by its [`Limits`] per stream and in total (in
/// streams and in bytes); a stream is dropped `ttl` after it finished (or
/// after its last append). At a total bound, finished streams go first,
/// the longest finished first: a live stream is never dropped for
/// another, the stream that does not fit becomes unresumable instead (its
/// first client still gets all of it).
pub struct MemoryLog {
    limits: Limits,
    streams: Mutex<Held>,
}

/// How often every stream is checked for expiry. Finished streams leave
/// in the order they finished, from [`Held::finished`], as they expire; a
/// live stream expires from its last append, which no queue orders, so
/// the whole map is swept for those, at most this often: an open pays a
/// scan of every stream once per sweep, not once per stream.
const SWEEP: Duration = Duration::from_secs(1);

/// The streams and the bytes they hold.
#[derive(Default)]
struct Held {
    map: HashMap<String, Stream>,
    bytes: u64,
    /// Finished streams, the longest finished first (a finish is stamped
    /// under the lock, so the queue is in time order): the order expiry
    /// and eviction both take them in. An entry whose stream is gone, or
    /// is another stream under the same id, is skipped.
    finished: VecDeque<(Instant, String)>,
    /// When the whole map was last swept for expired streams.
    swept: Option<Instant>,
}

impl Held {
    fn remove(&mut self, id: &str) {
        if let Some(s) = self.map.remove(id) {
            self.bytes -= s.bytes;
        }
    }

    /// Whether the queue entry `(at, id)` still names a finished stream.
    fn is_current(&self, at: Instant, id: &str) -> bool {
        self.map
            .get(id)
            .is_some_and(|s| s.finished && s.touched == at)
    }

    fn drop_expired(&mut self, limits: &Limits, now: Instant) {
        while let Some((at, _)) = self.finished.front()
            && now.saturating_duration_since(*at) >= limits.ttl
        {
            if let Some((at, id)) = self.finished.pop_front()
                && self.is_current(at, &id)
            {
                self.remove(&id);
            }
        }
        if self
            .swept
            .is_none_or(|t| now.saturating_duration_since(t) >= SWEEP)
        {
            self.swept = Some(now);
            let mut freed = 0;
            self.map.retain(|_, s| {
                let keep = !s.expired(limits, now);
                if !keep {
                    freed += s.bytes;
                }
                keep
            });
            self.bytes -= freed;
            // Entries of streams gone by other ways leave with their
            // expiry; past twice the map, they go at once.
            if self.finished.len() > 2 * self.map.len() + 64 {
                let map = &self.map;
                self.finished
                    .retain(|(at, id)| map.get(id).is_some_and(|s| s.finished && s.touched == *at));
            }
        }
    }

    /// Drops the stream that finished longest ago; `false` when none has.
    fn evict_finished(&mut self) -> bool {
        while let Some((at, id)) = self.finished.pop_front() {
            if self.is_current(at, &id) {
                self.remove(&id);
                return true;
            }
        }
        false
    }
}

struct Stream {
    entries: Vec<Entry>,
    bytes: u64,
    finished: bool,
    /// An append was refused for the bound: what follows the last entry
    /// is not in the log, and a reader that reaches it is told so.
    full: bool,
    /// The last append, or the finish: the ttl runs from here.
    touched: Instant,
    notify: Arc<Notify>,
}

impl Stream {
    fn expired(&self, limits: &Limits, now: Instant) -> bool {
        now.saturating_duration_since(self.touched) >= limits.ttl
    }
}

impl std::fmt::Debug for MemoryLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLog")
            .field("limits", &self.limits)
            .field("streams", &self.lock().map.len())
            .finish()
    }
}

impl Default for MemoryLog {
    fn default() -> Self {
        MemoryLog::new(Limits::default())
    }
}

impl MemoryLog {
    /// An empty log with these bounds.
    pub fn new(limits: Limits) -> Self {
        MemoryLog {
            limits,
            streams: Mutex::new(Held::default()),
        }
    }

    /// Its bounds.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Streams held now (expired ones included until the next open).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Event bytes held now, in all streams.
    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    /// Whether it holds no stream.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        // The map stays consistent at every await-free step: a panic
        // elsewhere must not make every stream unreadable.
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open_now(&self, id: &str) -> Result<(), LogError> {
        let now = Instant::now();
        let mut held = self.lock();
        held.drop_expired(&self.limits, now);
        if held.map.contains_key(id) {
            return Err(LogError::Exists);
        }
        while held.map.len() >= self.limits.max_streams {
            if !held.evict_finished() {
                return Err(LogError::Full);
            }
        }
        held.map.insert(
            id.to_owned(),
            Stream {
                entries: Vec::new(),
                bytes: 0,
                finished: false,
                full: false,
                touched: now,
                notify: Arc::new(Notify::new()),
            },
        );
        Ok(())
    }

    fn append_now(&self, id: &str, entries: &[Entry]) -> Result<(), LogError> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let now = Instant::now();
        let mut held = self.lock();
        let len: u64 = entries.iter().map(|e| e.event.len() as u64).sum();
        if held.bytes.saturating_add(len) > self.limits.max_total_bytes {
            held.drop_expired(&self.limits, now);
            while held.bytes.saturating_add(len) > self.limits.max_total_bytes {
                if !held.evict_finished() {
                    break;
                }
            }
        }
        let over_total = held.bytes.saturating_add(len) > self.limits.max_total_bytes;
        let held = &mut *held;
        let Some(s) = held.map.get_mut(id) else {
            return Err(LogError::Unknown);
        };
        if s.expired(&self.limits, now) {
            held.remove(id);
            return Err(LogError::Unknown);
        }
        if s.finished {
            return Err(LogError::Store("append to a finished stream".into()));
        }
        if s.full {
            return Err(LogError::StreamFull);
        }
        let last = s.entries.len() as u64;
        if let Some((i, e)) = entries
            .iter()
            .enumerate()
            .find(|(i, e)| e.seq != last + 1 + *i as u64)
        {
            return Err(LogError::Store(format!(
                "append of {} after {}",
                e.seq,
                last + i as u64
            )));
        }
        if over_total
            || last + entries.len() as u64 > self.limits.max_entries
            || s.bytes.saturating_add(len) > self.limits.max_bytes
        {
            s.full = true;
            s.notify.notify_waiters();
            return Err(LogError::StreamFull);
        }
        debug_assert_eq!(first.seq, last + 1);
        s.bytes += len;
        held.bytes += len;
        s.entries.extend_from_slice(entries);
        s.touched = now;
        s.notify.notify_waiters();
        Ok(())
    }

    fn finish_now(&self, id: &str) -> Result<(), LogError> {
        let mut held = self.lock();
        let Some(s) = held.map.get_mut(id) else {
            return Err(LogError::Unknown);
        };
        let now = Instant::now();
        s.finished = true;
        s.touched = now;
        s.notify.notify_waiters();
        held.finished.push_back((now, id.to_owned()));
        Ok(())
    }

    async fn read_wait(&self, id: &str, after: u64, wait: Duration) -> Result<Read, LogError> {
        let deadline = Instant::now() + wait;
        loop {
            let notified = {
                let now = Instant::now();
                let mut held = self.lock();
                let Some(s) = held.map.get(id) else {
                    return Err(LogError::Unknown);
                };
                if s.expired(&self.limits, now) {
                    held.remove(id);
                    return Err(LogError::Unknown);
                }
                let start = usize::try_from(after)
                    .unwrap_or(usize::MAX)
                    .min(s.entries.len());
                let end = start.saturating_add(READ_BATCH).min(s.entries.len());
                let entries = s.entries[start..end].to_vec();
                // Past the bound the log lost the rest: never a silent end.
                if entries.is_empty() && s.full {
                    return Err(LogError::StreamFull);
                }
                let finished = s.finished && !s.full && end == s.entries.len();
                if !entries.is_empty() || finished {
                    return Ok(Read { entries, finished });
                }
                // Registered before the lock is released: an append from
                // here on wakes this waiter.
                let mut notified = Box::pin(Arc::clone(&s.notify).notified_owned());
                notified.as_mut().enable();
                notified
            };
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Ok(Read {
                    entries: Vec::new(),
                    finished: false,
                });
            }
        }
    }
}

impl StreamLog for MemoryLog {
    fn open<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move { self.open_now(id) })
    }

    fn append<'a>(
        &'a self,
        id: &'a str,
        entries: &'a [Entry],
    ) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move { self.append_now(id, entries) })
    }

    fn finish<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), LogError>> {
        Box::pin(async move { self.finish_now(id) })
    }

    fn read<'a>(
        &'a self,
        id: &'a str,
        after: u64,
        wait: Duration,
    ) -> BoxFuture<'a, Result<Read, LogError>> {
        Box::pin(self.read_wait(id, after, wait))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn entry(seq: u64, text: &'static str) -> Entry {
        Entry {
            seq,
            event: Bytes::from_static(text.as_bytes()),
        }
    }

    fn limits() -> Limits {
        Limits {
            max_entries: 3,
            max_bytes: 100,
            max_streams: 2,
            max_total_bytes: 1 << 20,
            ttl: Duration::from_mins(1),
        }
    }

    #[tokio::test]
    async fn the_total_bound_evicts_finished_streams_first_and_never_a_live_one() {
        let log = MemoryLog::new(Limits {
            max_entries: 100,
            max_bytes: 100,
            max_streams: 10,
            max_total_bytes: 20,
            ttl: Duration::from_mins(1),
        });
        log.open("done").await.unwrap();
        log.append("done", &[entry(1, "0123456789")]).await.unwrap();
        log.finish("done").await.unwrap();
        log.open("live").await.unwrap();
        log.append("live", &[entry(1, "0123456789")]).await.unwrap();
        assert_eq!(log.bytes(), 20);
        // A new stream's append needs room: the finished stream goes.
        log.open("new").await.unwrap();
        log.append("new", &[entry(1, "abcdefghij")]).await.unwrap();
        assert_eq!(
            log.read("done", 0, Duration::ZERO).await,
            Err(LogError::Unknown)
        );
        assert_eq!(
            log.read("live", 0, Duration::ZERO)
                .await
                .unwrap()
                .entries
                .len(),
            1
        );
        assert_eq!(log.bytes(), 20);
        // Nothing finished is left: the stream that does not fit is the
        // one that stops being resumable; the live ones keep everything.
        assert_eq!(
            log.append("new", &[entry(2, "x")]).await,
            Err(LogError::StreamFull)
        );
        assert_eq!(
            log.read("live", 0, Duration::ZERO)
                .await
                .unwrap()
                .entries
                .len(),
            1
        );
        log.append("live", &[entry(2, "")]).await.unwrap();
    }

    #[tokio::test]
    async fn the_stream_count_bound_evicts_the_longest_finished() {
        let log = MemoryLog::new(limits());
        log.open("a").await.unwrap();
        log.finish("a").await.unwrap();
        log.open("b").await.unwrap();
        log.open("c").await.unwrap();
        assert_eq!(
            log.read("a", 0, Duration::ZERO).await,
            Err(LogError::Unknown)
        );
        assert_eq!(log.open("d").await, Err(LogError::Full), "b and c are live");
    }

    #[tokio::test]
    async fn reads_after_a_sequence_number() {
        let log = MemoryLog::new(limits());
        log.open("s").await.unwrap();
        assert_eq!(log.open("s").await, Err(LogError::Exists));
        log.append("s", &[entry(1, "a\n\n")]).await.unwrap();
        log.append("s", &[entry(2, "b\n\n")]).await.unwrap();
        let r = log.read("s", 1, Duration::ZERO).await.unwrap();
        assert_eq!(r.entries, vec![entry(2, "b\n\n")]);
        assert!(!r.finished);
        let r = log.read("s", 2, Duration::ZERO).await.unwrap();
        assert!(r.entries.is_empty() && !r.finished);
        log.finish("s").await.unwrap();
        let r = log.read("s", 2, Duration::ZERO).await.unwrap();
        assert!(r.entries.is_empty() && r.finished);
        let r = log.read("s", 0, Duration::ZERO).await.unwrap();
        assert_eq!(r.entries.len(), 2);
        assert!(r.finished);
        assert_eq!(
            log.read("x", 0, Duration::ZERO).await,
            Err(LogError::Unknown)
        );
    }

    #[tokio::test]
    async fn bounds() {
        let log = MemoryLog::new(limits());
        log.open("a").await.unwrap();
        log.open("b").await.unwrap();
        assert_eq!(log.open("c").await, Err(LogError::Full));
        for i in 1..=3 {
            log.append("a", &[entry(i, "x\n\n")]).await.unwrap();
        }
        assert_eq!(
            log.append("a", &[entry(4, "x\n\n")]).await,
            Err(LogError::StreamFull)
        );
        let big = Entry {
            seq: 1,
            event: Bytes::from(vec![b'x'; 101]),
        };
        assert_eq!(log.append("b", &[big]).await, Err(LogError::StreamFull));
        assert!(matches!(
            log.append("b", &[entry(2, "x\n\n")]).await,
            Err(LogError::StreamFull)
        ));
        // A reader that reaches the bound is told, even once it finished.
        log.finish("a").await.unwrap();
        let r = log.read("a", 0, Duration::ZERO).await.unwrap();
        assert_eq!(r.entries.len(), 3);
        assert!(!r.finished, "the log does not hold the end");
        assert_eq!(
            log.read("a", 3, Duration::ZERO).await,
            Err(LogError::StreamFull)
        );
    }

    #[tokio::test]
    async fn a_batch_is_appended_whole_or_not_at_all() {
        let log = MemoryLog::new(limits());
        log.open("a").await.unwrap();
        log.append("a", &[]).await.unwrap();
        log.append("a", &[entry(1, "a\n\n"), entry(2, "b\n\n")])
            .await
            .unwrap();
        assert!(matches!(
            log.append("a", &[entry(3, "c\n\n"), entry(5, "e\n\n")])
                .await,
            Err(LogError::Store(_))
        ));
        // Past the bound of three entries: none of the two, and full.
        assert_eq!(
            log.append("a", &[entry(3, "c\n\n"), entry(4, "d\n\n")])
                .await,
            Err(LogError::StreamFull)
        );
        let r = log.read("a", 0, Duration::ZERO).await.unwrap();
        assert_eq!(r.entries, vec![entry(1, "a\n\n"), entry(2, "b\n\n")]);
        assert_eq!(log.bytes(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn expires_after_the_ttl() {
        let log = MemoryLog::new(limits());
        log.open("a").await.unwrap();
        log.finish("a").await.unwrap();
        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(log.read("a", 0, Duration::ZERO).await.is_ok());
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            log.read("a", 0, Duration::ZERO).await,
            Err(LogError::Unknown)
        );
        log.open("b").await.unwrap();
        log.open("c").await.unwrap();
        assert_eq!(log.len(), 2, "the expired stream made room");
    }

    #[tokio::test(start_paused = true)]
    async fn eviction_takes_streams_in_the_order_they_finished() {
        let log = MemoryLog::new(Limits {
            max_streams: 3,
            ..limits()
        });
        for id in ["a", "b", "c"] {
            log.open(id).await.unwrap();
        }
        for id in ["c", "a", "b"] {
            tokio::time::advance(Duration::from_millis(10)).await;
            log.finish(id).await.unwrap();
        }
        log.open("d").await.unwrap();
        assert_eq!(
            log.read("c", 0, Duration::ZERO).await,
            Err(LogError::Unknown)
        );
        log.open("e").await.unwrap();
        assert_eq!(
            log.read("a", 0, Duration::ZERO).await,
            Err(LogError::Unknown)
        );
        assert!(log.read("b", 0, Duration::ZERO).await.is_ok());
        // The last finished one goes next; then only live streams are
        // left, and none is taken for a new one.
        log.open("c").await.unwrap();
        assert_eq!(
            log.read("b", 0, Duration::ZERO).await,
            Err(LogError::Unknown)
        );
        assert_eq!(log.open("f").await, Err(LogError::Full));
        assert!(log.read("c", 0, Duration::ZERO).await.is_ok(), "c is live");
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_stream_idle_past_the_ttl_is_swept_and_its_bytes_freed() {
        let log = MemoryLog::new(limits());
        log.open("idle").await.unwrap();
        log.append("idle", &[entry(1, "x\n\n")]).await.unwrap();
        assert_eq!(log.bytes(), 3);
        tokio::time::advance(Duration::from_secs(61)).await;
        log.open("x").await.unwrap();
        assert_eq!(log.len(), 1, "only the new stream is left");
        assert_eq!(log.bytes(), 0);
    }

    #[tokio::test]
    async fn a_waiting_reader_wakes_on_append() {
        let log = Arc::new(MemoryLog::new(limits()));
        log.open("s").await.unwrap();
        let reader = {
            let log = Arc::clone(&log);
            tokio::spawn(async move { log.read("s", 0, Duration::from_secs(30)).await })
        };
        // The reader is parked (or about to be): either way the append
        // reaches it, well before its 30 s.
        tokio::task::yield_now().await;
        log.append("s", &[entry(1, "a\n\n")]).await.unwrap();
        let r = tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("woken by the append")
            .unwrap()
            .unwrap();
        assert_eq!(r.entries, vec![entry(1, "a\n\n")]);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_are_bounded() {
        let log = MemoryLog::new(limits());
        log.open("s").await.unwrap();
        let started = Instant::now();
        let r = log.read("s", 0, Duration::from_millis(250)).await.unwrap();
        assert!(r.entries.is_empty() && !r.finished);
        assert_eq!(started.elapsed(), Duration::from_millis(250));
    }
}
