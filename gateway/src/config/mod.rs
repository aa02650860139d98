//! Configuration: flags, then environment, then a TOML file, then defaults.
//!
//! One [`Config`] value describes a gateway; the binary builds it from its
//! command line ([`parse`]), a program or a test builds it directly. Every
//! error is a one-line [`ConfigError`]: the binary prints it and exits 2.
//! Here the values; `args` reads the command line and the environment,
//! `file` the TOML, `merge` lays one over the other.

mod args;
mod file;
mod merge;

pub use args::{Command, HELP, USAGE, parse};
pub use file::upstream_uri;
pub use merge::{from_toml, from_toml_with_env};

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
pub use tower_recovery::https::Http2;

use http::{HeaderMap, HeaderName, Uri};
use recovery_core::budget::RetryBudgetConfig;
use recovery_core::continuation::Prefill;
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;

use crate::auth::Client;
use crate::downstream::numbering::Comments;
use crate::log::{Limits, StreamLog};
use crate::logs::Logger;

/// The environment variable of the stream secret (the file's
/// `stream_secret`; never a flag, so it stays out of process listings).
pub const STREAM_SECRET_VAR: &str = "RECOVERY_GATEWAY_STREAM_SECRET";

/// The address the gateway listens on by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8787";

/// A bad flag, variable or file: the text is one line, safe to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

pub(crate) fn err<T>(text: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(text.into()))
}

/// Which protocol a route's answers speak.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RouteProtocol {
    /// Guessed from each request's path
    /// ([`ProtocolChoice::Auto`](recovery_core::protocol::ProtocolChoice::Auto)).
    #[default]
    Auto,
    /// Always this one.
    Fixed(ProtocolKind),
}

impl RouteProtocol {
    /// Parses `openai-chat`, `openai-responses`, `anthropic`, `gemini`,
    /// `ollama` or `auto`.
    pub fn parse(name: &str) -> Result<Self, ConfigError> {
        match name {
            "auto" => Ok(RouteProtocol::Auto),
            "openai-chat" => Ok(RouteProtocol::Fixed(ProtocolKind::OpenAiChat)),
            "openai-responses" => Ok(RouteProtocol::Fixed(ProtocolKind::OpenAiResponses)),
            "anthropic" => Ok(RouteProtocol::Fixed(ProtocolKind::Anthropic)),
            "gemini" => Ok(RouteProtocol::Fixed(ProtocolKind::Gemini)),
            "ollama" => Ok(RouteProtocol::Fixed(ProtocolKind::Ollama)),
            other => err(format!(
                "unknown protocol {other:?} (openai-chat, openai-responses, anthropic, gemini, ollama, auto)"
            )),
        }
    }
}

/// A path prefix served by its own upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The path prefix (`/anthropic`); matches the prefix itself and paths
    /// under it. The longest matching prefix wins.
    pub prefix: String,
    /// The upstream origin, possibly with a base path.
    pub upstream: Uri,
    /// Whether the prefix is removed before the path is appended.
    pub strip_prefix: bool,
    /// The protocol of its answers.
    pub protocol: RouteProtocol,
    /// Whether its SSE answers are resumable (the gateway's ids and
    /// log); `false`: the client reads the upstream's bytes as they came.
    pub resumable: bool,
    /// The operator's headers for this upstream (its API key): sent for
    /// a known client (`[[clients]]`), or for anyone on a loopback
    /// listener without `[[clients]]`.
    pub headers: HeaderMap,
    /// A credential header of this upstream beside the usual ones
    /// (`authorization`, `x-api-key`, `x-goog-api-key`, `api-key`): a
    /// stream belongs to its value too.
    pub credential_header: Option<HeaderName>,
    /// The HTTP version its sends may use.
    pub http2: Http2,
    /// What it declares about its model.
    pub declared: Declared,
}

/// What an upstream declares about its model (`context_window`,
/// `continuation`), for the default upstream and each route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Declared {
    /// Its model's context window, in tokens: a prompt too long for it
    /// moves only to an alternate whose declared window is larger.
    pub context_window: Option<u64>,
    /// How it continues an assistant message it is given
    /// (`continuation = "prefill"`, `prefill_template`): an answer cut
    /// after text only is continued there from a prefill of that text.
    pub prefill: Option<Prefill>,
}

/// Where a request of one protocol may go when its upstream fails before
/// the first token ([`tower_recovery::Alternate`]).
#[derive(Debug, Clone)]
pub struct AlternateRoute {
    /// The protocol of the requests it serves (and of its answers).
    pub protocol: ProtocolKind,
    /// The alternate: its label, URL, model and headers.
    pub alternate: tower_recovery::Alternate,
}

/// Where stream logs are kept.
#[derive(Clone, Default)]
pub enum StreamLogChoice {
    /// In this process ([`MemoryLog`](crate::log::MemoryLog)).
    #[default]
    Memory,
    /// On Redis Streams at this URL (`redis://…`, `redis+unix://…`;
    /// feature `redis`).
    Redis(String),
    /// A log the caller built (shared between gateways in one process, or
    /// a store of its own).
    Custom(Arc<dyn StreamLog>),
}

impl fmt::Debug for StreamLogChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamLogChoice::Memory => f.write_str("memory"),
            // The URL may carry a password.
            StreamLogChoice::Redis(_) => f.write_str("redis"),
            StreamLogChoice::Custom(_) => f.write_str("custom"),
        }
    }
}

impl StreamLogChoice {
    /// Parses `memory` or a Redis URL.
    pub fn parse(value: &str) -> Result<Self, ConfigError> {
        if value == "memory" {
            Ok(StreamLogChoice::Memory)
        } else if value.starts_with("redis://")
            || value.starts_with("rediss://")
            || value.starts_with("redis+unix://")
            || value.starts_with("unix://")
        {
            Ok(StreamLogChoice::Redis(value.to_owned()))
        } else {
            err("--stream-log takes `memory` or a redis://… / redis+unix://… URL")
        }
    }
}

/// A secret from the configuration; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Everything a gateway needs.
#[derive(Debug, Clone)]
pub struct Config {
    /// The listening address (`127.0.0.1:0` picks a free port).
    pub listen: SocketAddr,
    /// Where requests that match no route go; without it they get a 404.
    pub upstream: Option<Uri>,
    /// Prefix routes, each to its own upstream.
    pub routes: Vec<Route>,
    /// Alternates, per protocol, in order.
    pub alternates: Vec<AlternateRoute>,
    /// Where stream logs are kept.
    pub stream_log: StreamLogChoice,
    /// Bounds of the stream log.
    pub log_limits: Limits,
    /// A Redis the instances of a fleet share the upstream's cooldowns and
    /// retry budget through (`recovery-redis`); `None`: this process's own.
    pub fleet_redis: Option<String>,
    /// Where spans and metrics are exported over OTLP/HTTP (the base URL:
    /// `/v1/traces` and `/v1/metrics` under it); `None`: not exported.
    /// The binary installs the export ([`crate::telemetry`], feature
    /// `otel`); an embedding application installs its own.
    pub otlp_endpoint: Option<http::Uri>,
    /// How long a generation goes on after its last reader left.
    pub keep_generating: Duration,
    /// Requests forwarded at once (streams included until they end); past
    /// it a request gets a 503 with `retry-after`.
    pub max_streams: usize,
    /// The largest request body forwarded; past it, a 413. A body is read
    /// whole and held for replays until its request ends.
    pub max_body_bytes: usize,
    /// Request body bytes held at once, in all; a body that does not fit
    /// gets a 503 with `retry-after` (load is shed, never queued).
    pub max_held_body_bytes: usize,
    /// The largest upload forwarded (the body of a request that is not a
    /// generation and not JSON: a file, audio), streamed upstream as it
    /// arrives, never held; past it, a 413 (declared) or a cut body.
    pub max_upload_bytes: usize,
    /// How long a client may take to send a request head.
    pub header_read_timeout: Duration,
    /// How long a request body may take, at the least.
    pub body_read_timeout: Duration,
    /// The rate that earns a body more time than `body_read_timeout`
    /// (bytes per second; 0: none).
    pub body_min_bytes_per_sec: u64,
    /// Generations kept going for clients that left, at once; past it a
    /// generation whose client left is cancelled at once.
    pub max_kept_streams: usize,
    /// Reconnected readers of one stream at once.
    pub max_readers_per_stream: usize,
    /// Reconnected readers in all, at once.
    pub max_readers: usize,
    /// The operator's headers for the default upstream.
    pub upstream_headers: HeaderMap,
    /// The HTTP version sends to the default upstream may use.
    pub upstream_http2: Http2,
    /// Streams one upstream HTTP/2 connection carries at once; past it the
    /// gateway opens another to the same upstream, instead of leaving the
    /// next stream queued behind the server's concurrent-stream limit.
    /// 100 by default; set it no higher than the lowest
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` of the HTTP/2 upstreams.
    pub http2_streams_per_connection: usize,
    /// How long an upstream HTTP/2 connection with streams open may
    /// receive nothing before it is pinged (and closed when the ping goes
    /// unanswered as long, 20 s at most, its streams failing as a broken
    /// connection does): a connection that died without a word is found
    /// within seconds instead of when TCP gives up. 30 s by default;
    /// `None` (`"off"`) never pings.
    pub http2_keep_alive: Option<Duration>,
    /// What the default upstream declares about its model.
    pub upstream_declared: Declared,
    /// Known clients; empty: requests spend their own credentials.
    pub clients: Vec<Client>,
    /// The secret stream keys are derived with (every instance on one
    /// Redis log needs the same); `None`: drawn per process.
    pub stream_secret: Option<Secret>,
    /// What becomes of upstream SSE comment blocks.
    pub sse_comments: Comments,
    /// How long a graceful shutdown waits for streams in flight.
    pub shutdown_grace: Duration,
    /// Threads that accept and serve connections: 1, the caller's runtime
    /// alone; N, the caller's runtime and N - 1 threads beside it, each
    /// with a single-threaded runtime and upstream connection pools of
    /// its own, so a stream's tasks (its connection, its upstream
    /// connection, its pump) wake one another on one thread. The streams,
    /// their log, the bounds, the retry budget and the cooldowns are
    /// shared by all. The command line's default is one per core.
    pub threads: usize,
    /// The recovery policy of the upstream leg.
    pub policy: RecoveryPolicy,
    /// The retry budget every request of the gateway (or of the fleet,
    /// with `fleet_redis`) shares: a bound on retry storms.
    pub retry_budget: RetryBudgetConfig,
    /// Where structured log lines go.
    pub logger: Logger,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN.parse().expect("a valid address"),
            upstream: None,
            routes: Vec::new(),
            alternates: Vec::new(),
            stream_log: StreamLogChoice::Memory,
            log_limits: Limits::default(),
            fleet_redis: None,
            otlp_endpoint: None,
            keep_generating: Duration::from_mins(1),
            max_streams: 1024,
            max_body_bytes: 64 << 20,
            max_held_body_bytes: 512 << 20,
            max_upload_bytes: 512 << 20,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            body_min_bytes_per_sec: 64 << 10,
            max_kept_streams: 256,
            max_readers_per_stream: 4,
            max_readers: 1024,
            upstream_headers: HeaderMap::new(),
            upstream_http2: Http2::Off,
            http2_streams_per_connection: tower_recovery::https::HTTP2_STREAMS_PER_CONNECTION,
            http2_keep_alive: Some(tower_recovery::https::HTTP2_KEEP_ALIVE_INTERVAL),
            upstream_declared: Declared::default(),
            clients: Vec::new(),
            stream_secret: None,
            sse_comments: Comments::Pass,
            shutdown_grace: Duration::from_secs(30),
            threads: 1,
            policy: RecoveryPolicy::default(),
            retry_budget: RetryBudgetConfig::default(),
            logger: Logger::stderr(),
        }
    }
}
