//! The listener, its connections and a graceful drain; nothing else.
//!
//! HTTP/1.1 from hyper with a header read timeout (a client that trickles
//! its head, slow-loris, is closed); each connection serves the one stack
//! (`stack`). On shutdown the listener closes first, each connection is
//! told to finish its response in flight and close, and streams still
//! generating for a client that left and tunnels (`tunnel`) get the rest
//! of the grace period; when it runs out streams end with their error
//! event, tunnels close, and the remaining connections are closed.
//!
//! With more than one serving thread, each runs a [`Serve`] of its own,
//! with a listening socket of its own on the one port; the first writes
//! the shutdown's log lines, counting the connections of all.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::downstream::{Streams, raised};
use crate::logs::{Field, Logger};
use crate::stack::Phases;
use crate::tunnel::Tunnels;

/// How far off the runtime's next timer wake may be (see [`Serve::run`]).
const HEARTBEAT: Duration = Duration::from_secs(1);

pub(crate) struct Serve {
    /// The listening socket (nonblocking), registered with the runtime
    /// `run` runs on.
    pub(crate) listener: std::net::TcpListener,
    pub(crate) phases: Phases,
    pub(crate) streams: Arc<Streams>,
    pub(crate) tunnels: Arc<Tunnels>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) header_read_timeout: Duration,
    pub(crate) grace: Duration,
    pub(crate) logger: Logger,
    /// Connections open on every serving thread.
    pub(crate) open: Arc<AtomicUsize>,
    /// Whether this one writes the shutdown's log lines (the first does).
    pub(crate) first: bool,
}

impl Serve {
    pub(crate) async fn run(self) {
        let Serve {
            listener,
            phases,
            streams,
            tunnels,
            mut shutdown,
            header_read_timeout,
            grace,
            logger,
            open,
            first,
        } = self;
        let listener = match TcpListener::from_std(listener) {
            Ok(l) => l,
            Err(e) => {
                logger.log(
                    crate::logs::Level::Error,
                    "listener_failed",
                    "cannot serve on the listening socket",
                    &[("error", Field::Str(&e.to_string()))],
                );
                return;
            }
        };
        let service = crate::stack::server::<Incoming>(phases);
        let mut conns = JoinSet::new();
        // A timer that falls before the runtime's next timer wake has to
        // wake the worker parked on the driver (a system call and a
        // context switch). Each request arms such timers (the header read,
        // the recovery layer's deadlines), and between requests the wheel
        // is often empty, so each would. A tick every second keeps the
        // next wake at most that far off, before every deadline of a second
        // or more.
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = heartbeat.tick() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let _ = stream.set_nodelay(true);
                        let service = service.clone();
                        let hyper_service = service_fn(move |req: hyper::Request<Incoming>| {
                            tower::ServiceExt::oneshot(service.clone(), req)
                        });
                        let conn = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(header_read_timeout)
                            .serve_connection(TokioIo::new(stream), hyper_service)
                            // A request that switches protocols leaves hyper
                            // for a tunnel (`tunnel`).
                            .with_upgrades();
                        let open = Arc::clone(&open);
                        let mut stop = shutdown.clone();
                        open.fetch_add(1, Ordering::Relaxed);
                        conns.spawn(async move {
                            tokio::pin!(conn);
                            tokio::select! {
                                _ = conn.as_mut() => {}
                                // Its response in flight finishes, then it
                                // closes.
                                () = raised(&mut stop) => {
                                    conn.as_mut().graceful_shutdown();
                                    let _ = conn.await;
                                }
                            }
                            open.fetch_sub(1, Ordering::Relaxed);
                        });
                    }
                    Err(e) => {
                        // Out of descriptors and the like: back off a little
                        // instead of spinning.
                        logger.warn("accept_error", "cannot accept a connection", &[("error", Field::Str(&e.to_string()))]);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                () = raised(&mut shutdown) => break,
            }
        }
        drop(listener);
        if first {
            logger.info(
                "shutdown_started",
                "no longer accepting; waiting for streams in flight",
                &[
                    (
                        "connections",
                        Field::U64(open.load(Ordering::Relaxed) as u64),
                    ),
                    ("streams", Field::U64(streams.active() as u64)),
                ],
            );
        }
        let deadline = tokio::time::Instant::now() + grace;
        let drained = tokio::time::timeout_at(deadline, async {
            while conns.join_next().await.is_some() {}
            streams.wait_idle().await;
            tunnels.wait_idle().await;
        })
        .await
        .is_ok();
        if !drained {
            // Streams still going end with their error event; then the
            // connections left are closed.
            streams.stop_all();
            let _ = tokio::time::timeout(Duration::from_secs(2), streams.wait_idle()).await;
            let _ = tokio::time::timeout(Duration::from_secs(1), async {
                while conns.join_next().await.is_some() {}
            })
            .await;
        }
        conns.abort_all();
        if first {
            logger.info(
                "shutdown_finished",
                "gateway stopped",
                &[("graceful", Field::Bool(drained))],
            );
        }
    }
}
