//! A running gateway: start-up (the checks that refuse an unsafe
//! configuration, the stores, the stack), its address, its counters and
//! its shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use tokio::sync::{oneshot, watch};

use crate::auth::{Clients, operator_credentials, operator_exposure};
use crate::config::{Config, StreamLogChoice};
use crate::downstream::{Bounds, Streams};
use crate::forward::Shared;
use crate::log::{MemoryLog, StreamLog};
use crate::logs::Field;
use crate::metrics::{Metrics, Snapshot};
use crate::server::Serve;

/// Why a gateway could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum GatewayError {
    /// The address could not be bound.
    Bind(std::io::Error),
    /// The stream log could not be set up (the text is safe to print).
    StreamLog(String),
    /// The fleet's shared stores could not be set up (the text is safe to
    /// print: no credentials).
    Fleet(String),
    /// The configuration would be unsafe on this listener (the text names
    /// the fix).
    Unsafe(String),
    /// A serving thread (`Config::threads`) or its runtime could not be
    /// started.
    Thread(std::io::Error),
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Bind(e) => write!(f, "cannot listen: {e}"),
            GatewayError::StreamLog(e) => write!(f, "cannot open the stream log: {e}"),
            GatewayError::Fleet(e) => write!(f, "cannot set up the fleet's shared stores: {e}"),
            GatewayError::Unsafe(e) => write!(f, "refusing to start: {e}"),
            GatewayError::Thread(e) => write!(f, "cannot start a serving thread: {e}"),
        }
    }
}

impl std::error::Error for GatewayError {}

/// Starts a graceful shutdown of the gateway it came from; clones share it.
#[derive(Debug, Clone)]
pub struct ShutdownHandle(Arc<watch::Sender<bool>>);

impl ShutdownHandle {
    /// Stops accepting and lets streams in flight finish within the grace
    /// period. Returns at once; [`Gateway::wait`] waits for the end.
    pub fn shutdown(&self) {
        let _ = self.0.send(true);
    }
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    shutdown: ShutdownHandle,
    metrics: Arc<Metrics>,
    streams: Arc<Streams>,
    task: tokio::task::JoinHandle<()>,
    /// One per serving thread beside the caller's runtime: closed when
    /// that thread's server stopped.
    threads: Vec<oneshot::Receiver<()>>,
}

impl std::fmt::Debug for Streams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Streams")
            .field("active", &self.active())
            .finish_non_exhaustive()
    }
}

#[cfg_attr(not(feature = "redis"), allow(clippy::unused_async))]
async fn open_log(config: &Config) -> Result<Arc<dyn StreamLog>, GatewayError> {
    Ok(match &config.stream_log {
        StreamLogChoice::Memory => Arc::new(MemoryLog::new(config.log_limits)),
        StreamLogChoice::Custom(log) => Arc::clone(log),
        #[cfg(feature = "redis")]
        StreamLogChoice::Redis(url) => {
            let log = crate::log::RedisLog::builder(config.log_limits)
                .connect(url)
                .await
                .map_err(|e| GatewayError::StreamLog(e.to_string()))?;
            Arc::new(log)
        }
        #[cfg(not(feature = "redis"))]
        StreamLogChoice::Redis(_) => {
            return Err(GatewayError::StreamLog(
                "this build has no Redis stream log (feature `redis`)".into(),
            ));
        }
    })
}

/// The retry budget and cooldowns the upstream stacks share: the fleet's
/// when `fleet_redis` is set.
fn shared_stores(config: &Config) -> Result<Shared, GatewayError> {
    match &config.fleet_redis {
        None => Ok(Shared::local(config.retry_budget)),
        #[cfg(feature = "redis")]
        Some(url) => {
            Shared::fleet(url, config.retry_budget).map_err(|e| GatewayError::Fleet(e.to_string()))
        }
        #[cfg(not(feature = "redis"))]
        Some(_) => Err(GatewayError::Fleet(
            "this build has no Redis fleet stores (feature `redis`)".into(),
        )),
    }
}

impl Gateway {
    /// Binds `config.listen` and serves in the background until
    /// [`ShutdownHandle::shutdown`]: on the current tokio runtime, and on
    /// `config.threads - 1` threads of its own beside it.
    pub async fn bind(config: Config) -> Result<Gateway, GatewayError> {
        let clients = Clients::new(config.clients.clone());
        let operator = operator_credentials(&config);
        operator_exposure(config.listen, &clients, &operator).map_err(GatewayError::Unsafe)?;
        let log = open_log(&config).await?;
        let shared = shared_stores(&config)?;
        let mut listeners = listeners(config.listen, config.threads.max(1))
            .map_err(GatewayError::Bind)?
            .into_iter();
        let first = listeners.next().expect("at least one listener");
        let addr = first.local_addr().map_err(GatewayError::Bind)?;
        let metrics = Arc::new(Metrics::default());
        let logger = config.logger.clone();
        let streams = Arc::new(Streams::new(
            log,
            Bounds {
                keep_generating: config.keep_generating,
                ttl: config.log_limits.ttl,
                max_kept: config.max_kept_streams,
                max_readers_per_stream: config.max_readers_per_stream,
                max_readers: config.max_readers,
                max_event: config.policy.max_event_bytes(),
            },
            Arc::clone(&metrics),
            logger.clone(),
        ));
        metrics.set_bounds(&config);
        let (tx, rx) = watch::channel(false);
        let common = crate::stack::Common::new(
            &config,
            addr,
            clients,
            shared,
            &metrics,
            &streams,
            rx.clone(),
        );
        let open = Arc::new(AtomicUsize::new(0));
        let serve = |listener, first| Serve {
            listener,
            phases: crate::stack::phases(&config, &common),
            streams: Arc::clone(&streams),
            tunnels: Arc::clone(common.tunnels()),
            shutdown: rx.clone(),
            header_read_timeout: config.header_read_timeout,
            grace: config.shutdown_grace,
            logger: logger.clone(),
            open: Arc::clone(&open),
            first,
        };
        let mut threads = Vec::new();
        for (n, own) in listeners.enumerate() {
            threads.push(serve_on_thread(n + 1, serve(own, false))?);
        }
        let task = tokio::spawn(serve(first, true).run());
        if !operator.is_empty() && config.clients.is_empty() {
            logger.info(
                "operator_credentials",
                "operator credentials are configured without [[clients]]: any caller of this loopback listener spends them",
                &[("where", Field::Str(&operator.join(", ")))],
            );
        }
        if config.stream_secret.is_none() && matches!(config.stream_log, StreamLogChoice::Redis(_))
        {
            logger.warn(
                "stream_secret_unset",
                "no stream_secret: stream keys are this process's own, so another instance on this Redis log cannot serve a reconnect",
                &[],
            );
        }
        let addr_text = addr.to_string();
        logger.info(
            "listening",
            "gateway listening",
            &[
                ("addr", Field::Str(&addr_text)),
                ("routes", Field::U64(config.routes.len() as u64)),
                ("threads", Field::U64(config.threads.max(1) as u64)),
                (
                    "stream_log",
                    Field::Str(&format!("{:?}", config.stream_log)),
                ),
            ],
        );
        Ok(Gateway {
            addr,
            shutdown: ShutdownHandle(Arc::new(tx)),
            metrics,
            streams,
            task,
            threads,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The counters now.
    pub fn metrics(&self) -> Snapshot {
        self.metrics.snapshot()
    }

    /// Waits until no stream is generating (every upstream read ended).
    pub async fn wait_streams_idle(&self) {
        self.streams.wait_idle().await;
    }

    /// A handle that starts the graceful shutdown.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Starts the graceful shutdown and waits for its end.
    pub async fn shutdown(self) {
        self.shutdown.shutdown();
        self.wait().await;
    }

    /// Waits until the gateway stopped (after a shutdown was started).
    pub async fn wait(self) {
        let _ = self.task.await;
        for stopped in self.threads {
            let _ = stopped.await;
        }
    }
}

/// `n` listening sockets on `addr` (nonblocking), one per serving thread.
///
/// Where the system has `SO_REUSEPORT` (Linux, the BSDs, macOS), each is
/// a socket of its own on the one port, and the kernel spreads the
/// incoming connections over them, so the connections of clients that
/// connect all at once (an SDK's pool) are not all accepted by the thread
/// that woke first; `0` as the port picks one free port for all. Elsewhere
/// they are clones of one socket.
fn listeners(addr: SocketAddr, n: usize) -> std::io::Result<Vec<std::net::TcpListener>> {
    #[cfg(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    ))]
    {
        /// Connections waiting to be accepted, per socket.
        const BACKLOG: u32 = 1024;
        let mut addr = addr;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let socket = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            socket.set_reuseaddr(true)?;
            if n > 1 {
                socket.set_reuseport(true)?;
            }
            socket.bind(addr)?;
            let listener = socket.listen(BACKLOG)?;
            addr = listener.local_addr()?;
            out.push(listener.into_std()?);
        }
        Ok(out)
    }
    #[cfg(not(all(
        unix,
        not(any(target_os = "solaris", target_os = "illumos", target_os = "cygwin"))
    )))]
    {
        let first = std::net::TcpListener::bind(addr)?;
        first.set_nonblocking(true)?;
        let mut out = Vec::with_capacity(n);
        for _ in 1..n {
            out.push(first.try_clone()?);
        }
        out.insert(0, first);
        Ok(out)
    }
}

/// Starts serving thread `n`: a single-threaded runtime that runs `serve`
/// (its listener, a clone of the one socket, is registered there). The
/// receiver closes when it stopped.
fn serve_on_thread(n: usize, serve: Serve) -> Result<oneshot::Receiver<()>, GatewayError> {
    let (stopped, on_stop) = oneshot::channel::<()>();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(GatewayError::Thread)?;
    std::thread::Builder::new()
        .name(format!("recovery-gateway-{n}"))
        .spawn(move || {
            runtime.block_on(serve.run());
            drop(stopped);
        })
        .map_err(GatewayError::Thread)?;
    Ok(on_stop)
}
