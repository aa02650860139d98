//! The listener, its connections and a graceful shutdown.
//!
//! HTTP/1.1 from hyper with a header read timeout (a client that trickles
//! its head, slow-loris, is closed). On shutdown the listener closes first,
//! each connection finishes its response in flight and closes, and streams
//! still generating for a client that left get the rest of the grace
//! period; when it runs out they end with their error event and the
//! remaining connections are closed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::auth::{Clients, is_credential, operator_exposure};
use crate::config::{Config, StreamLogChoice};
use crate::downstream::{Bounds, Streams, raised};
use crate::forward::{Shared, Upstream};
use crate::identity::Keys;
use crate::log::{MemoryLog, StreamLog};
use crate::logs::{Field, Logger};
use crate::metrics::{Metrics, Snapshot};
use crate::phases::admit::Admit;
use crate::phases::client_auth::ClientAuth;
use crate::phases::limit::Limit;
use crate::phases::read_body::{BodyLimits, ReadBody};
use crate::phases::reserved::Reserved;
use crate::proxy::Proxy;
use crate::routes::Router;
use crate::stack::Phases;

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
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GatewayError::Bind(e) => write!(f, "cannot listen: {e}"),
            GatewayError::StreamLog(e) => write!(f, "cannot open the stream log: {e}"),
            GatewayError::Fleet(e) => write!(f, "cannot set up the fleet's shared stores: {e}"),
            GatewayError::Unsafe(e) => write!(f, "refusing to start: {e}"),
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
        None => Ok(Shared::local()),
        #[cfg(feature = "redis")]
        Some(url) => Shared::fleet(url).map_err(|e| GatewayError::Fleet(e.to_string())),
        #[cfg(not(feature = "redis"))]
        Some(_) => Err(GatewayError::Fleet(
            "this build has no Redis fleet stores (feature `redis`)".into(),
        )),
    }
}

impl Gateway {
    /// Binds `config.listen` and serves in the background (on the current
    /// tokio runtime) until [`ShutdownHandle::shutdown`].
    pub async fn bind(config: Config) -> Result<Gateway, GatewayError> {
        let clients = Clients::new(config.clients.clone());
        let operator = operator_credentials(&config);
        operator_exposure(config.listen, &clients, &operator).map_err(GatewayError::Unsafe)?;
        let log = open_log(&config).await?;
        let shared = shared_stores(&config)?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(GatewayError::Bind)?;
        let addr = listener.local_addr().map_err(GatewayError::Bind)?;
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
            },
            Arc::clone(&metrics),
            logger.clone(),
        ));
        metrics.set_bounds(&config);
        let router = Router::new(
            config.routes.clone(),
            config.upstream.clone(),
            config.upstream_headers.clone(),
        );
        let keys = Arc::new(Keys::new(
            config.stream_secret.as_ref().map(|s| s.0.as_slice()),
        ));
        let phases = Phases {
            admit: Admit {
                own_authorities: own_authorities(addr),
            },
            client_auth: ClientAuth(clients),
            reserved: Reserved {
                metrics: Arc::clone(&metrics),
                streams: Arc::clone(&streams),
                keys: Arc::clone(&keys),
                credential_headers: router.credential_header().to_vec(),
                logger: logger.clone(),
            },
            limit: Limit {
                slots: Arc::new(Semaphore::new(config.max_streams)),
                metrics: Arc::clone(&metrics),
            },
            read_body: ReadBody {
                limits: BodyLimits {
                    max_bytes: config.max_body_bytes,
                    timeout: config.body_read_timeout,
                    min_bytes_per_sec: config.body_min_bytes_per_sec,
                },
                metrics: Arc::clone(&metrics),
            },
            proxy: Proxy {
                router,
                upstream: Upstream::new(
                    &config.policy,
                    &shared,
                    &config.alternates,
                    &metrics,
                    &logger,
                ),
                streams: Arc::clone(&streams),
                keys,
                metrics: Arc::clone(&metrics),
                logger: logger.clone(),
                comments: config.sse_comments,
            },
        };
        let (tx, rx) = watch::channel(false);
        let serve = Serve {
            listener,
            phases,
            streams: Arc::clone(&streams),
            shutdown: rx,
            header_read_timeout: config.header_read_timeout,
            grace: config.shutdown_grace,
            logger: logger.clone(),
        };
        let task = tokio::spawn(serve.run());
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
    }
}

/// Where the configuration holds operator credentials: the credential
/// headers of the default upstream, of routes and of alternates.
fn operator_credentials(config: &Config) -> Vec<String> {
    let extra: Vec<_> = config
        .routes
        .iter()
        .filter_map(|r| r.credential_header.clone())
        .collect();
    let names = |h: &http::HeaderMap| -> Vec<String> {
        h.keys()
            .filter(|n| is_credential(n, &extra))
            .map(|n| n.as_str().to_owned())
            .collect()
    };
    let mut out = Vec::new();
    for n in names(&config.upstream_headers) {
        out.push(format!("upstream_headers: {n}"));
    }
    for r in &config.routes {
        for n in names(&r.headers) {
            out.push(format!("route {:?}: {n}", r.prefix));
        }
    }
    for a in &config.alternates {
        for n in a.alternate.header_names() {
            if is_credential(&n, &extra) {
                out.push(format!("alternate {:?}: {n}", a.alternate.label()));
            }
        }
    }
    out
}

/// The authorities an absolute-form request target may name: the bound
/// address, and `localhost` on its port.
fn own_authorities(addr: SocketAddr) -> Vec<String> {
    let mut out = vec![addr.to_string(), format!("localhost:{}", addr.port())];
    if addr.ip().is_unspecified() {
        out.push(format!("127.0.0.1:{}", addr.port()));
        out.push(format!("[::1]:{}", addr.port()));
    }
    out
}

struct Serve {
    listener: TcpListener,
    phases: Phases,
    streams: Arc<Streams>,
    shutdown: watch::Receiver<bool>,
    header_read_timeout: Duration,
    grace: Duration,
    logger: Logger,
}

impl Serve {
    async fn run(self) {
        let Serve {
            listener,
            phases,
            streams,
            mut shutdown,
            header_read_timeout,
            grace,
            logger,
        } = self;
        let service = crate::stack::server::<Incoming>(phases);
        let mut conns = JoinSet::new();
        // Told to every connection when the shutdown starts.
        let (closing_tx, closing_rx) = watch::channel(false);
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let _ = stream.set_nodelay(true);
                        conns.spawn(connection(
                            stream,
                            service.clone(),
                            header_read_timeout,
                            closing_rx.clone(),
                        ));
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
        let _ = closing_tx.send(true);
        logger.info(
            "shutdown_started",
            "no longer accepting; waiting for streams in flight",
            &[
                ("connections", Field::U64(conns.len() as u64)),
                ("streams", Field::U64(streams.active() as u64)),
            ],
        );
        let deadline = tokio::time::Instant::now() + grace;
        let drained = tokio::time::timeout_at(deadline, async {
            while conns.join_next().await.is_some() {}
            streams.wait_idle().await;
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
            conns.abort_all();
        }
        logger.info(
            "shutdown_finished",
            "gateway stopped",
            &[("graceful", Field::Bool(drained))],
        );
    }
}

async fn connection<S>(
    stream: tokio::net::TcpStream,
    stack: S,
    header_read_timeout: Duration,
    mut closing: watch::Receiver<bool>,
) where
    S: tower_service::Service<
            hyper::Request<Incoming>,
            Response = http::Response<crate::body::GatewayBody>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        tower::ServiceExt::oneshot(stack.clone(), req)
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = raised(&mut closing) => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
