//! The way from a stream's pump to its first client: a bounded queue of
//! the reads handed on, the client's end dropped when it leaves.
//!
//! While the first client reads, both ends live in one task (its body
//! drives the pump, [`super::first_client`]); once it left, the pump runs
//! in a task of its own and only needs to see the client gone. A general
//! channel pays for more than that: tokio's bounded channel allocates a
//! block of 32 slots with the channel, about 2.4 KiB per held stream that
//! mostly stays empty. This queue allocates only what is queued, a few
//! slots at most (the pump is polled by the body that drains it), and
//! keeps the bound: a client that does not read stops the pump at
//! `capacity` reads, as a slow client slows the upstream read.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use super::registry::Handed;

/// The queue and who waits on it.
struct State {
    queue: VecDeque<Handed>,
    capacity: usize,
    /// The client's end was dropped: nothing more is taken.
    client_gone: bool,
    /// The pump's end was dropped: nothing more comes.
    pump_gone: bool,
    /// The client, waiting for a read.
    client: Option<Waker>,
    /// The pump, waiting for room.
    room: Option<Waker>,
    /// The pump, waiting for the client to leave.
    leaving: Option<Waker>,
}

type Shared = Arc<Mutex<State>>;

fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // Nothing here can leave the state half-changed: a poisoned lock
    // still holds a whole one.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A queue for `capacity` reads (at least one).
pub(crate) fn direct(capacity: usize) -> (DirectTx, DirectRx) {
    let shared = Arc::new(Mutex::new(State {
        queue: VecDeque::new(),
        capacity: capacity.max(1),
        client_gone: false,
        pump_gone: false,
        client: None,
        room: None,
        leaving: None,
    }));
    (DirectTx(Arc::clone(&shared)), DirectRx(shared))
}

/// The pump's end.
pub(crate) struct DirectTx(Shared);

/// The client's end.
pub(crate) struct DirectRx(Shared);

/// Resolves once the client's end is gone; made by [`DirectTx::closed`].
pub(crate) struct Closed(Shared);

impl DirectTx {
    /// Queues `handed`, waiting while the queue is full; `Err` with it
    /// back when the client is gone.
    pub(crate) async fn send(&self, handed: Handed) -> Result<(), Handed> {
        let mut handed = Some(handed);
        poll_fn(|cx| {
            let mut state = lock(&self.0);
            if state.client_gone {
                return Poll::Ready(Err(handed.take().expect("sent once")));
            }
            if state.queue.len() >= state.capacity {
                state.room = Some(cx.waker().clone());
                return Poll::Pending;
            }
            state.queue.push_back(handed.take().expect("sent once"));
            if let Some(client) = state.client.take() {
                drop(state);
                client.wake();
            }
            Poll::Ready(Ok(()))
        })
        .await
    }

    /// A future that resolves once the client's end is gone; it does not
    /// hold the pump's end open.
    pub(crate) fn closed(&self) -> Closed {
        Closed(Arc::clone(&self.0))
    }
}

impl Closed {
    /// Waits for the client to leave.
    pub(crate) async fn wait(self) {
        poll_fn(|cx| {
            let mut state = lock(&self.0);
            if state.client_gone {
                Poll::Ready(())
            } else {
                state.leaving = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
    }
}

impl Drop for DirectTx {
    fn drop(&mut self) {
        let mut state = lock(&self.0);
        state.pump_gone = true;
        if let Some(client) = state.client.take() {
            drop(state);
            client.wake();
        }
    }
}

impl DirectRx {
    /// The next read: `None` once the pump's end is gone and the queue
    /// is empty.
    pub(crate) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Handed>> {
        let mut state = lock(&self.0);
        if let Some(handed) = state.queue.pop_front() {
            if let Some(pump) = state.room.take() {
                drop(state);
                pump.wake();
            }
            return Poll::Ready(Some(handed));
        }
        if state.pump_gone {
            return Poll::Ready(None);
        }
        state.client = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for DirectRx {
    fn drop(&mut self) {
        let mut state = lock(&self.0);
        state.client_gone = true;
        // What the client did not read goes with it.
        state.queue = VecDeque::new();
        let wakers = [state.room.take(), state.leaving.take()];
        drop(state);
        for pump in wakers.into_iter().flatten() {
            pump.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use futures_util::FutureExt as _;

    use super::*;

    fn handed(text: &'static str) -> Handed {
        Handed {
            bytes: Bytes::from_static(text.as_bytes()),
            last: false,
        }
    }

    /// What the client gets now, without waiting.
    fn recv(rx: &mut DirectRx) -> Poll<Option<Handed>> {
        poll_fn(|cx| Poll::Ready(rx.poll_recv(cx)))
            .now_or_never()
            .expect("polled once")
    }

    /// The bytes of a read the client got.
    fn read(got: Poll<Option<Handed>>) -> Bytes {
        match got {
            Poll::Ready(Some(handed)) => handed.bytes,
            Poll::Ready(None) => panic!("the end, not a read"),
            Poll::Pending => panic!("nothing to read"),
        }
    }

    #[tokio::test]
    async fn reads_come_in_order_and_end_when_the_pump_is_gone() {
        let (tx, mut rx) = direct(4);
        tx.send(handed("a")).await.unwrap();
        tx.send(handed("b")).await.unwrap();
        assert_eq!(read(recv(&mut rx)), "a");
        assert_eq!(read(recv(&mut rx)), "b");
        assert!(
            recv(&mut rx).is_pending(),
            "nothing queued: the client waits"
        );
        drop(tx);
        assert!(
            matches!(recv(&mut rx), Poll::Ready(None)),
            "the pump is gone: the end"
        );
    }

    #[tokio::test]
    async fn a_full_queue_holds_the_pump_until_the_client_reads() {
        let (tx, mut rx) = direct(1);
        tx.send(handed("a")).await.unwrap();
        // The pump waits in a task of its own: only a wake resumes it.
        let second = tokio::spawn(async move {
            tx.send(handed("b")).await.unwrap();
            tx
        });
        tokio::task::yield_now().await;
        assert!(!second.is_finished(), "the bound holds");
        assert_eq!(read(recv(&mut rx)), "a");
        let _tx = tokio::time::timeout(Duration::from_secs(5), second)
            .await
            .expect("a read makes room and wakes the pump")
            .unwrap();
        assert_eq!(read(recv(&mut rx)), "b");
    }

    #[tokio::test]
    async fn a_client_that_leaves_wakes_the_waiting_pump_and_refuses_more() {
        let (tx, rx) = direct(1);
        tx.send(handed("a")).await.unwrap();
        let closed = tokio::spawn(tx.closed().wait());
        tokio::task::yield_now().await;
        assert!(!closed.is_finished(), "the client is still there");
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), closed)
            .await
            .expect("the pump sees the client gone")
            .unwrap();
        let back = tx.send(handed("b")).await.expect_err("nobody takes it");
        assert_eq!(back.bytes, "b");
    }

    #[tokio::test]
    async fn a_pump_waiting_for_room_sees_the_client_leave() {
        let (tx, rx) = direct(1);
        tx.send(handed("a")).await.unwrap();
        let waiting = tokio::spawn(async move { tx.send(handed("b")).await.is_err() });
        tokio::task::yield_now().await;
        drop(rx);
        let refused = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by the client's leaving")
            .unwrap();
        assert!(refused);
    }
}
