//! Worker threads that serve connections, one current-thread runtime each.
//!
//! A connection is handed to one worker when it is accepted, and
//! everything it starts runs there: its head, the upstream send (the
//! client's connection task is spawned where the send is made), the
//! stream's pump and the client's reads. An event then crosses no thread
//! on its way through the gateway. On a multi-threaded runtime the same
//! work is spread by stealing, and each hand-over between the tasks of a
//! stream is a wake-up on another thread: measured on two cores, a third
//! of the gateway's CPU went to those context switches (BENCHMARKS.md).
//!
//! What the connections share (the stream registry and log, the metrics,
//! the upstream pool, the retry budget) is thread-safe already; a pooled
//! upstream connection made on one worker serves a send from another
//! through its dispatch channel.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The running workers; dropping them stops every worker, and the tasks
/// still on one end with its runtime.
pub(crate) struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    /// Dropped to stop: each worker runs until its receiver sees it.
    _stop: Vec<oneshot::Sender<()>>,
}

impl Workers {
    /// `n` workers, each a thread with its own current-thread runtime.
    pub(crate) fn start(n: usize) -> std::io::Result<Workers> {
        let mut handles = Vec::with_capacity(n);
        let mut stops = Vec::with_capacity(n);
        for i in 0..n {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            std::thread::Builder::new()
                .name(format!("recovery-gateway-worker-{i}"))
                .spawn(move || {
                    // Drives the worker's tasks until the stop; the
                    // runtime is dropped here, on its own thread.
                    let _ = runtime.block_on(stopped);
                })?;
        }
        Ok(Workers {
            handles,
            next: AtomicUsize::new(0),
            _stop: stops,
        })
    }

    /// The worker for the next connection, in turn.
    pub(crate) fn next(&self) -> &Handle {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        &self.handles[i]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connections_go_to_each_worker_in_turn_and_run_there() {
        let workers = Workers::start(2).unwrap();
        let mut threads = Vec::new();
        for _ in 0..4 {
            let name = workers
                .next()
                .spawn(async { std::thread::current().name().map(str::to_owned) })
                .await
                .unwrap();
            threads.push(name.unwrap());
        }
        assert_eq!(
            threads,
            [
                "recovery-gateway-worker-0",
                "recovery-gateway-worker-1",
                "recovery-gateway-worker-0",
                "recovery-gateway-worker-1",
            ]
        );
        // A task a worker's task spawns stays on that worker.
        let inner = workers
            .next()
            .spawn(async {
                tokio::spawn(async { std::thread::current().name().map(str::to_owned) })
                    .await
                    .unwrap()
            })
            .await
            .unwrap();
        assert_eq!(inner.as_deref(), Some("recovery-gateway-worker-0"));
    }

    #[tokio::test]
    async fn dropping_the_workers_ends_their_tasks() {
        let workers = Workers::start(1).unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let task = workers.next().spawn(async move {
            // Never sent: only the runtime's end stops this task.
            let _keep = tx;
            std::future::pending::<()>().await;
        });
        drop(workers);
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the task ends with its runtime");
        assert!(ended.unwrap_err().is_cancelled());
        assert!(rx.await.is_err(), "its sender was dropped with it");
    }
}
