//! The server side as one stack, read top to bottom in the order a request
//! meets it: the server span (with an OpenTelemetry export), the rescue
//! layer (the only place a refusal becomes a response), then each phase
//! (`phases`), then the proxy.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use tower::ServiceBuilder;
#[cfg(feature = "otel")]
use tower_layer::Layer as _;
use tower_recovery::https::{HTTP2_KEEP_ALIVE_TIMEOUT, Http2Settings};
use tower_service::Service;

use crate::auth::Clients;
use crate::body::GatewayBody;
use crate::config::Config;
use crate::downstream::Streams;
use crate::forward::{Shared, Upstream};
use crate::identity::Keys;
use crate::metrics::Metrics;
use crate::phase::{PhaseLayer, RescueLayer};
use crate::phases::admit::{Admit, own_authorities};
use crate::phases::client_auth::ClientAuth;
use crate::phases::limit::Limit;
use crate::phases::read_body::{BodyLimits, ReadBody};
use crate::phases::reserved::Reserved;
use crate::proxy::{Proxy, ProxyService};
use crate::routes::Router;
use crate::tunnel::{Carrier, Tunnels};
use tokio::sync::watch;

/// Every phase and the proxy, as `Gateway::bind` builds them.
pub(crate) struct Phases {
    pub(crate) admit: Admit,
    pub(crate) client_auth: ClientAuth,
    pub(crate) reserved: Reserved,
    pub(crate) limit: Limit,
    pub(crate) read_body: ReadBody,
    pub(crate) proxy: Proxy,
}

/// What the phases of every serving thread share: the upstream stacks
/// (and their connection pools) are each thread's own, everything a
/// stream or a bound is counted in is one.
pub(crate) struct Common {
    addr: SocketAddr,
    clients: Clients,
    shared: Shared,
    metrics: Arc<Metrics>,
    streams: Arc<Streams>,
    keys: Arc<Keys>,
    slots: Arc<tokio::sync::Semaphore>,
    /// Request body bytes held at once (`max_held_body_bytes`).
    held: Arc<tokio::sync::Semaphore>,
    tunnels: Arc<Tunnels>,
    shutdown: watch::Receiver<bool>,
}

impl Common {
    /// The shared parts of `config`'s phases, on the listener `addr`.
    pub(crate) fn new(
        config: &Config,
        addr: SocketAddr,
        clients: Clients,
        shared: Shared,
        metrics: &Arc<Metrics>,
        streams: &Arc<Streams>,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        Common {
            addr,
            clients,
            shared,
            metrics: Arc::clone(metrics),
            streams: Arc::clone(streams),
            keys: Arc::new(Keys::new(
                config.stream_secret.as_ref().map(|s| s.0.as_slice()),
            )),
            slots: Arc::new(tokio::sync::Semaphore::new(config.max_streams)),
            held: Arc::new(tokio::sync::Semaphore::new(config.max_held_body_bytes)),
            tunnels: Arc::new(Tunnels::new(Arc::clone(metrics))),
            shutdown,
        }
    }

    /// The tunnels open on every serving thread.
    pub(crate) fn tunnels(&self) -> &Arc<Tunnels> {
        &self.tunnels
    }
}

/// The phases and the proxy of `config` for one serving thread.
pub(crate) fn phases(config: &Config, common: &Common) -> Phases {
    let logger = &config.logger;
    let Common {
        addr,
        clients,
        shared,
        metrics,
        streams,
        keys,
        slots,
        held,
        tunnels,
        shutdown,
    } = common;
    let router = Router::new(
        config.routes.clone(),
        config.upstream.clone(),
        config.upstream_headers.clone(),
        config.upstream_http2,
        config.upstream_declared,
    );
    Phases {
        admit: Admit {
            own_authorities: own_authorities(*addr),
        },
        client_auth: ClientAuth(clients.clone()),
        reserved: Reserved {
            metrics: Arc::clone(metrics),
            streams: Arc::clone(streams),
            keys: Arc::clone(keys),
            credential_headers: router.credential_header().to_vec(),
            logger: logger.clone(),
        },
        limit: Limit {
            slots: Arc::clone(slots),
            metrics: Arc::clone(metrics),
        },
        read_body: ReadBody {
            limits: BodyLimits {
                max_bytes: config.max_body_bytes,
                max_upload_bytes: config.max_upload_bytes,
                timeout: config.body_read_timeout,
                min_bytes_per_sec: config.body_min_bytes_per_sec,
            },
            held: Arc::clone(held),
            metrics: Arc::clone(metrics),
        },
        proxy: Proxy {
            upstream: Upstream::new(
                &config.policy,
                shared,
                &config.alternates,
                Http2Settings {
                    streams_per_connection: config.http2_streams_per_connection,
                    keep_alive_interval: config.http2_keep_alive,
                    // A ping may go unanswered as long as the silence
                    // before it, and 20 s at most.
                    keep_alive_timeout: config
                        .http2_keep_alive
                        .map_or(HTTP2_KEEP_ALIVE_TIMEOUT, |i| {
                            i.min(HTTP2_KEEP_ALIVE_TIMEOUT)
                        }),
                },
                metrics,
                logger,
            ),
            router,
            streams: Arc::clone(streams),
            keys: Arc::clone(keys),
            metrics: Arc::clone(metrics),
            logger: logger.clone(),
            comments: config.sse_comments,
            carrier: Carrier {
                client: tower_recovery::https::client(),
                tunnels: Arc::clone(tunnels),
                idle: config.policy.idle_timeout(),
                head_timeout: config.policy.head_timeout(),
                shutdown: shutdown.clone(),
                grace: config.shutdown_grace,
                logger: logger.clone(),
            },
        },
    }
}

/// The stack a connection serves requests with.
pub(crate) fn server<B>(
    phases: Phases,
) -> impl Service<
    Request<B>,
    Response = Response<GatewayBody>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<GatewayBody>, Infallible>> + Send + 'static,
> + Clone
+ Send
+ 'static
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<crate::body::BoxError>,
{
    let stack = ServiceBuilder::new()
        .layer(RescueLayer)
        .layer(PhaseLayer::new(phases.admit))
        .layer(PhaseLayer::new(phases.client_auth))
        .layer(PhaseLayer::new(phases.reserved))
        .layer(PhaseLayer::new(phases.limit))
        .layer(PhaseLayer::new(phases.read_body))
        .service(ProxyService(Arc::new(phases.proxy)));
    // Above the rescue: a refused request has its server span too.
    #[cfg(feature = "otel")]
    let stack = crate::telemetry::ServerSpanLayer.layer(stack);
    stack
}
