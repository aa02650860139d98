//! The first client's body of a resumable stream: it drives the stream's
//! pump while the client reads, and hands the pump to a task of its own
//! only when the client leaves before the end.
//!
//! A task per stream cost a wake of another worker on every stream (the
//! spawn notifies a parked worker, which here means a system call), on the
//! way to the client's first bytes. Most streams are read to their end by
//! the client that started them: for those, the connection's own task
//! reads the upstream, numbers, logs and writes, and no other task is
//! made. The pump is the same future either way, so a generation kept for
//! an absent client (the keep-generating window) goes on exactly as
//! before: it sees the client leave when its queue closes ([`super::direct`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::Stream;

use super::direct::DirectRx;
use crate::body::BoxError;

/// A stream's pump, run to its end by whoever holds it.
pub(crate) type Pumping = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The events the pump hands the first client, read as a body; polling it
/// polls the pump first.
pub(crate) struct FirstClient {
    pump: Option<Pumping>,
    /// `None` once the last read was handed out.
    rx: Option<DirectRx>,
}

impl FirstClient {
    /// The body over `rx`, driving `pump`.
    pub(crate) fn new(rx: DirectRx, pump: Pumping) -> Self {
        FirstClient {
            pump: Some(pump),
            rx: Some(rx),
        }
    }

    /// Runs the pump as far as it goes now, without waiting on it.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(pump) = &mut self.pump
            && pump.as_mut().poll(cx).is_ready()
        {
            self.pump = None;
        }
    }

    /// The pump's next read for the client: `None` when nothing follows.
    pub(crate) fn poll_handed(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.drive(cx);
        let Some(rx) = &mut self.rx else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(handed)) => {
                // After the last read the body ends without waiting for
                // the queue to close: hyper writes its end with them.
                if handed.last {
                    self.rx = None;
                }
                Poll::Ready(Some(handed.bytes))
            }
            Poll::Ready(None) => {
                self.rx = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Stream for FirstClient {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_handed(cx).map(|b| b.map(Ok))
    }
}

impl Drop for FirstClient {
    /// The client left before the pump ended: the pump goes on in a task
    /// of its own (it sees the queue close and keeps generating for the
    /// window, or stops). Without a runtime (it is shutting down) the pump
    /// ends here.
    fn drop(&mut self) {
        if let Some(pump) = self.pump.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // The queue closes first, so the pump's next poll sees it.
            drop(self.rx.take());
            runtime.spawn(pump);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use futures_util::StreamExt as _;

    use super::super::direct::direct;
    use super::super::registry::Handed;
    use super::*;

    fn handed(text: &'static str, last: bool) -> Handed {
        Handed {
            bytes: Bytes::from_static(text.as_bytes()),
            last,
        }
    }

    #[tokio::test]
    async fn reading_the_body_runs_the_pump_and_a_last_read_ends_it() {
        let (tx, rx) = direct(1);
        let pump = Box::pin(async move {
            // One at a time: the second send waits for the body's read.
            tx.send(handed("a", false)).await.unwrap();
            tx.send(handed("b", true)).await.unwrap();
            // The pump goes on after its last read (its closing work);
            // the body has ended without waiting for it.
            std::future::pending::<()>().await;
        });
        let body = FirstClient::new(rx, pump);
        let got = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            body.map(Result::unwrap).collect::<Vec<_>>(),
        )
        .await
        .expect("the body ends at its last read");
        assert_eq!(got, [Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
    }

    #[tokio::test]
    async fn a_client_that_leaves_hands_the_pump_to_a_task_that_sees_it_gone() {
        let (tx, rx) = direct(4);
        let (seen_tx, seen) = tokio::sync::oneshot::channel();
        let pump = Box::pin(async move {
            tx.send(handed("a", false)).await.unwrap();
            tx.closed().wait().await;
            let _ = seen_tx.send(());
        });
        let mut body = FirstClient::new(rx, pump);
        assert_eq!(body.next().await.unwrap().unwrap(), "a");
        drop(body);
        tokio::time::timeout(std::time::Duration::from_secs(5), seen)
            .await
            .expect("the pump runs on in a task of its own")
            .unwrap();
    }

    #[tokio::test]
    async fn a_pump_that_ended_is_not_run_again() {
        let (tx, rx) = direct(4);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&ran);
        let pump = Box::pin(async move {
            assert!(!flag.swap(true, Ordering::SeqCst), "polled after its end");
            drop(tx);
        });
        let mut body = FirstClient::new(rx, pump);
        assert!(body.next().await.is_none());
        assert!(body.next().await.is_none());
        drop(body);
        assert!(ran.load(Ordering::SeqCst));
    }
}
