//! What the machine has for its driver: outputs due, in order, and the
//! chunks for the consumer (held back before commit, queued after).

use std::collections::VecDeque;

use super::io::Chunk;
use crate::failure::Failure;

/// An output due to the driver, before any chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Due {
    /// Close the current attempt's response.
    Release,
    /// Hand the committed attempt's head to the caller.
    Respond,
    /// Hand the final error response to the caller, as the server sent it.
    RespondError,
    /// Close the hedge's response: it lost, or left the race.
    ReleaseHedge,
    /// The hedge takes the place of the attempt it raced.
    Promote,
}

/// What the chunks held before commit are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    /// A streamed answer's prefix.
    Answer,
    /// An error response: the request's answer if no send follows.
    ErrorResponse,
}

/// Outputs due and chunks for the consumer. See the module docs.
#[derive(Debug)]
pub(super) struct Outbox<C> {
    due: VecDeque<Due>,
    chunks: VecDeque<Chunk<C>>,
    /// Bytes held back in this attempt, before commit.
    held_bytes: usize,
    /// Bytes handed to the consumer.
    delivered: u64,
    /// The caller has the head: chunks go out from now on.
    responded: bool,
    holds: Holds,
    /// A failure to act on once the queued chunks are delivered (a
    /// provider error arrives inside a chunk the consumer still gets).
    then: Option<Box<Failure>>,
}

impl<C: AsRef<[u8]>> Outbox<C> {
    pub(super) fn new() -> Self {
        Outbox {
            due: VecDeque::new(),
            chunks: VecDeque::new(),
            held_bytes: 0,
            delivered: 0,
            responded: false,
            holds: Holds::Answer,
            then: None,
        }
    }

    /// A new attempt: what the last one held is dropped.
    pub(super) fn new_attempt(&mut self) {
        self.chunks.clear();
        self.held_bytes = 0;
        self.holds = Holds::Answer;
    }

    /// The current response is closed, before anything else is handed out.
    pub(super) fn release(&mut self) {
        if !self.due.contains(&Due::Release) {
            self.due.push_front(Due::Release);
        }
    }

    /// The hedge lost or left its race: its response is closed, before
    /// anything else.
    pub(super) fn release_hedge(&mut self) {
        if !self.due.contains(&Due::ReleaseHedge) {
            self.due.push_front(Due::ReleaseHedge);
        }
    }

    /// The hedge (whose outbox this is) won or outlasted its race: the
    /// response of the attempt it raced is closed, then it takes that
    /// attempt's place, before anything else.
    pub(super) fn promote(&mut self) {
        self.due.push_front(Due::Promote);
        self.due.push_front(Due::Release);
    }

    /// The head goes to the caller (once).
    pub(super) fn respond(&mut self) {
        if !self.responded && !self.due.contains(&Due::Respond) {
            self.due.push_back(Due::Respond);
        }
    }

    /// The request ended: a held error response is its answer.
    pub(super) fn end(&mut self) {
        self.then = None;
        if self.holds == Holds::ErrorResponse && !self.due.contains(&Due::RespondError) {
            self.due.push_back(Due::RespondError);
        }
    }

    /// The next output due, if any.
    pub(super) fn next_due(&mut self) -> Option<Due> {
        let due = self.due.pop_front()?;
        match due {
            Due::Respond => self.responded = true,
            Due::RespondError => self.holds = Holds::Answer,
            Due::Release | Due::ReleaseHedge | Due::Promote => {}
        }
        Some(due)
    }

    /// The next chunk for the consumer, once it has the head; `true` with
    /// it when nothing is queued after it.
    pub(super) fn next_chunk(&mut self) -> Option<(Chunk<C>, bool)> {
        if !self.responded {
            return None;
        }
        let chunk = self.chunks.pop_front()?;
        self.delivered += size(&chunk);
        Some((chunk, self.chunks.is_empty()))
    }

    /// Whether a chunk of `len` bytes goes out at once, as it is (counted
    /// delivered): the caller has the head and nothing is queued.
    #[inline]
    pub(super) fn pass(&mut self, len: usize) -> bool {
        if self.responded && self.chunks.is_empty() {
            self.delivered += len as u64;
            true
        } else {
            false
        }
    }

    /// Counts a chunk handed out outside the queue.
    #[inline]
    pub(super) fn passed(&mut self, len: usize) {
        self.delivered += len as u64;
    }

    /// Queues (or, before commit, holds) `chunk` for the consumer.
    pub(super) fn push(&mut self, chunk: Chunk<C>) {
        self.chunks.push_back(chunk);
    }

    /// Counts `len` bytes held back before commit; the total so far.
    pub(super) fn hold_bytes(&mut self, len: usize) -> usize {
        self.held_bytes += len;
        self.held_bytes
    }

    /// Drops what is held or queued.
    pub(super) fn clear(&mut self) {
        self.chunks.clear();
    }

    /// What is held or queued, taken out.
    pub(super) fn take(&mut self) -> VecDeque<Chunk<C>> {
        std::mem::take(&mut self.chunks)
    }

    /// Bytes queued and not yet handed out.
    pub(super) fn queued_bytes(&self) -> u64 {
        self.chunks.iter().map(size).sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    pub(super) fn responded(&self) -> bool {
        self.responded
    }

    pub(super) fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Whether nothing but chunks passing through is due.
    #[inline]
    pub(super) fn is_idle(&self) -> bool {
        self.responded && self.chunks.is_empty() && self.then.is_none() && self.due.is_empty()
    }

    pub(super) fn holds(&self) -> Holds {
        self.holds
    }

    pub(super) fn set_holds(&mut self, holds: Holds) {
        self.holds = holds;
    }

    /// Whether the final error response is due.
    pub(super) fn error_response_due(&self) -> bool {
        self.due.contains(&Due::RespondError)
    }

    /// Acts on `failure` once the queued chunks are delivered.
    pub(super) fn defer(&mut self, failure: Failure) {
        self.then = Some(Box::new(failure));
    }

    pub(super) fn deferred(&self) -> bool {
        self.then.is_some()
    }

    /// The deferred failure, once nothing is queued before it.
    pub(super) fn take_deferred(&mut self) -> Option<Failure> {
        if self.responded && !self.chunks.is_empty() {
            return None;
        }
        self.then.take().map(|f| *f)
    }
}

fn size<C: AsRef<[u8]>>(chunk: &Chunk<C>) -> u64 {
    match chunk {
        Chunk::Read(c) => c.as_ref().len() as u64,
        Chunk::Made(b) => b.len() as u64,
    }
}
