//! Configuration: flags, then environment, then a TOML file, then defaults.
//!
//! One [`Config`] value describes a gateway; the binary builds it from its
//! command line ([`parse`]), a program or a test builds it directly. Every
//! error is a one-line [`ConfigError`]: the binary prints it and exits 2.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use serde::Deserialize;

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

fn err<T>(text: impl Into<String>) -> Result<T, ConfigError> {
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
    /// How long a generation goes on after its last reader left.
    pub keep_generating: Duration,
    /// Requests forwarded at once (streams included until they end); past
    /// it a request gets a 503 with `retry-after`.
    pub max_streams: usize,
    /// The largest request body forwarded; past it, a 413.
    pub max_body_bytes: usize,
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
    /// Known clients; empty: requests spend their own credentials.
    pub clients: Vec<Client>,
    /// The secret stream keys are derived with (every instance on one
    /// Redis log needs the same); `None`: drawn per process.
    pub stream_secret: Option<Secret>,
    /// What becomes of upstream SSE comment blocks.
    pub sse_comments: Comments,
    /// How long a graceful shutdown waits for streams in flight.
    pub shutdown_grace: Duration,
    /// The recovery policy of the upstream leg.
    pub policy: RecoveryPolicy,
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
            keep_generating: Duration::from_mins(1),
            max_streams: 1024,
            max_body_bytes: 8 << 20,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(10),
            body_min_bytes_per_sec: 64 << 10,
            max_kept_streams: 256,
            max_readers_per_stream: 4,
            max_readers: 1024,
            upstream_headers: HeaderMap::new(),
            clients: Vec::new(),
            stream_secret: None,
            sse_comments: Comments::Pass,
            shutdown_grace: Duration::from_secs(30),
            policy: RecoveryPolicy::default(),
            logger: Logger::Stderr,
        }
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    /// Run with this configuration.
    Run(Box<Config>),
    /// Print the help.
    Help,
    /// Print the version.
    Version,
    /// Read a client key on stdin and print its `[[clients]]` entry.
    HashKey {
        /// The entry's name.
        name: String,
    },
}

/// The usage line.
pub const USAGE: &str = "usage: recovery-gateway [--listen ADDR] [--upstream URL] [--config FILE] \
[--stream-log memory|redis://...|redis+unix://...] [--keep-generating-ms N] [--max-streams N] \
[--max-body-bytes N] [--fleet-redis redis://...|redis+unix://...] [--help] [--version]
       recovery-gateway hash-key [--name NAME] < key";

/// The help text after the usage line.
pub const HELP: &str = "
A recovering gateway in front of LLM providers. Point an SDK's base URL at it:
upstream faults before the first token are replayed, Responses background
streams are resumed, failures after are the provider's own error event, and a
client that disconnects resumes its SSE stream with Last-Event-ID.

Options (each also from an environment variable; flags win over the
environment, the environment over the file):
  --listen ADDR            listen address (RECOVERY_GATEWAY_LISTEN; default 127.0.0.1:8787)
  --upstream URL           default upstream, e.g. https://api.openai.com (RECOVERY_GATEWAY_UPSTREAM)
  --config FILE            TOML file: these keys, [policy], [log], [[routes]], [[alternates]] (RECOVERY_GATEWAY_CONFIG)
  --stream-log LOG         memory, or redis://HOST/ or redis+unix:///path (RECOVERY_GATEWAY_STREAM_LOG)
  --keep-generating-ms N   generation kept after the client left, ms (RECOVERY_GATEWAY_KEEP_GENERATING_MS; 60000)
  --max-streams N          concurrent forwarded requests (RECOVERY_GATEWAY_MAX_STREAMS; 1024)
  --max-body-bytes N       largest request body (RECOVERY_GATEWAY_MAX_BODY_BYTES; 8388608)
  --fleet-redis URL        share upstream cooldowns and the retry budget with the other instances
                           through this Redis (RECOVERY_GATEWAY_FLEET_REDIS; default: this process's)
  --help, --version

File-only keys: [[clients]] (name, key_hash), upstream_headers, stream_secret
(or RECOVERY_GATEWAY_STREAM_SECRET; the same on every instance of one Redis log),
sse_comments (pass|drop), header_read_timeout_ms, body_read_timeout_ms,
body_min_bytes_per_sec, max_kept_streams, max_readers, max_readers_per_stream,
shutdown_grace_ms; [[routes]] take resumable, headers, credential_header.
Header values \"$NAME\" are read from the environment.

Bounds (defaults; each breach is an HTTP error in the provider's shape, and
each is a gauge recovery_gateway_bound{name=...} in /metrics):
  max_streams 1024 (head to the end of the client's read), max_kept_streams 256
  (generations kept for clients that left), max_readers 1024 and
  max_readers_per_stream 4 (reconnects), header_read_timeout_ms 10000,
  body_read_timeout_ms 10000 plus 1 s per body_min_bytes_per_sec 65536 bytes,
  max_body_bytes 8388608, [log] max_total_bytes 268435456 (finished streams
  evicted first), max_bytes 16777216 per stream, max_streams 10000, ttl_ms 300000.

Client keys: with [[clients]], every request but GET /healthz needs a known key
in its SDK's API-key header and is sent with the operator's headers; without,
requests spend their own keys, and operator keys are refused on a listener
that is not loopback. `recovery-gateway hash-key --name team < key` prints an entry.

Reserved paths: GET /healthz, GET /metrics, GET /streams/<id>?after=<seq>.
Streams are readable only with the credentials that created them; a request
with `x-recovery-resumable: off` gets the upstream's bytes as they came.
Exit status: 0 after a graceful shutdown (SIGTERM, SIGINT), 2 on bad usage or configuration.

Example:
  recovery-gateway --upstream https://api.openai.com
  # then: OpenAI(base_url=\"http://127.0.0.1:8787/v1\")
";

/// The keys the flags, the environment and the file share.
#[derive(Debug, Default, Clone)]
struct Layer {
    listen: Option<String>,
    upstream: Option<String>,
    config: Option<String>,
    stream_log: Option<String>,
    keep_generating_ms: Option<String>,
    max_streams: Option<String>,
    max_body_bytes: Option<String>,
    fleet_redis: Option<String>,
}

const FLAGS: [(&str, &str); 8] = [
    ("--listen", "RECOVERY_GATEWAY_LISTEN"),
    ("--upstream", "RECOVERY_GATEWAY_UPSTREAM"),
    ("--config", "RECOVERY_GATEWAY_CONFIG"),
    ("--stream-log", "RECOVERY_GATEWAY_STREAM_LOG"),
    (
        "--keep-generating-ms",
        "RECOVERY_GATEWAY_KEEP_GENERATING_MS",
    ),
    ("--max-streams", "RECOVERY_GATEWAY_MAX_STREAMS"),
    ("--max-body-bytes", "RECOVERY_GATEWAY_MAX_BODY_BYTES"),
    ("--fleet-redis", "RECOVERY_GATEWAY_FLEET_REDIS"),
];

impl Layer {
    fn slot(&mut self, i: usize) -> &mut Option<String> {
        match i {
            0 => &mut self.listen,
            1 => &mut self.upstream,
            2 => &mut self.config,
            3 => &mut self.stream_log,
            4 => &mut self.keep_generating_ms,
            5 => &mut self.max_streams,
            6 => &mut self.max_body_bytes,
            _ => &mut self.fleet_redis,
        }
    }
}

/// The file's shape; unknown keys are errors, so a typo is not ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    upstream: Option<String>,
    stream_log: Option<String>,
    keep_generating_ms: Option<u64>,
    max_streams: Option<usize>,
    max_body_bytes: Option<usize>,
    fleet_redis: Option<String>,
    header_read_timeout_ms: Option<u64>,
    body_read_timeout_ms: Option<u64>,
    body_min_bytes_per_sec: Option<u64>,
    max_kept_streams: Option<usize>,
    max_readers_per_stream: Option<usize>,
    max_readers: Option<usize>,
    shutdown_grace_ms: Option<u64>,
    stream_secret: Option<String>,
    sse_comments: Option<String>,
    #[serde(default)]
    upstream_headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    clients: Vec<ClientFile>,
    #[serde(default)]
    policy: PolicyFile,
    #[serde(default)]
    log: LogFile,
    #[serde(default)]
    routes: Vec<RouteFile>,
    #[serde(default)]
    alternates: Vec<AlternateFile>,
}

/// `[[clients]]`: a caller the gateway knows, by the SHA-256 of its key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientFile {
    name: String,
    key_hash: String,
}

/// `[[alternates]]`: where a request of `protocol` may go when its upstream
/// fails before the first token. A header value `"$NAME"` is read from the
/// environment variable `NAME`, so keys stay out of the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AlternateFile {
    label: String,
    protocol: String,
    url: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
}

/// `[policy]`: the main knobs of [`RecoveryPolicy`]; a missing key keeps
/// its default. A timeout of 0 turns that watchdog off.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    max_attempts: Option<u32>,
    max_resumes: Option<u32>,
    budget_ms: Option<u64>,
    deadline_ms: Option<u64>,
    backoff_base_ms: Option<u64>,
    backoff_ceiling_ms: Option<u64>,
    retry_after_ceiling_ms: Option<u64>,
    head_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    progress_timeout_ms: Option<u64>,
    retryable_statuses: Option<Vec<u16>>,
    idempotency_key: Option<bool>,
    retry_protocol_violations: Option<bool>,
}

/// `[log]`: the stream log's bounds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogFile {
    max_entries: Option<u64>,
    max_bytes: Option<u64>,
    max_streams: Option<usize>,
    max_total_bytes: Option<u64>,
    ttl_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    prefix: String,
    upstream: String,
    #[serde(default)]
    strip_prefix: bool,
    #[serde(default)]
    protocol: Option<String>,
    #[serde(default)]
    resumable: Option<bool>,
    #[serde(default)]
    headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    credential_header: Option<String>,
}

/// Parses the command line (without the program name), with `env` as the
/// environment and files read from disk.
pub fn parse(
    args: impl IntoIterator<Item = String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Command, ConfigError> {
    let mut flags = Layer::default();
    let mut args = args.into_iter().peekable();
    if args.peek().map(String::as_str) == Some("hash-key") {
        args.next();
        return hash_key_args(args);
    }
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            _ => {}
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let Some(i) = FLAGS.iter().position(|(f, _)| *f == name) else {
            return err(format!("unknown argument {arg:?}"));
        };
        let value = match inline {
            Some(v) => v,
            None => match args.next() {
                Some(v) => v,
                None => return err(format!("{name} needs a value")),
            },
        };
        *flags.slot(i) = Some(value);
    }
    let mut merged = Layer::default();
    for (i, (_, var)) in FLAGS.iter().enumerate() {
        let from_flag = flags.slot(i).clone();
        *merged.slot(i) = from_flag.or_else(|| env(var).filter(|v| !v.is_empty()));
    }
    let file = match &merged.config {
        Some(path) => read_file(&PathBuf::from(path))?,
        None => File::default(),
    };
    build(merged, file, &env).map(|c| Command::Run(Box::new(c)))
}

/// `hash-key [--name NAME]`.
fn hash_key_args(mut args: impl Iterator<Item = String>) -> Result<Command, ConfigError> {
    let mut name = "client".to_owned();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--name" => {
                name = args
                    .next()
                    .ok_or_else(|| ConfigError("--name needs a value".into()))?;
            }
            other => match other.strip_prefix("--name=") {
                Some(v) => v.clone_into(&mut name),
                None => return err(format!("hash-key: unknown argument {other:?}")),
            },
        }
    }
    if name.is_empty() {
        return err("hash-key: --name must not be empty");
    }
    Ok(Command::HashKey { name })
}

fn read_file(path: &PathBuf) -> Result<File, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    parse_file(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))
}

fn parse_file(text: &str) -> Result<File, ConfigError> {
    toml::from_str(text).map_err(|e| {
        // toml's message spans lines (it quotes the source): keep one.
        let msg = e.message().replace('\n', " ");
        ConfigError(match e.span() {
            Some(span) => {
                // Counted in bytes: a span is never trusted to fall on a
                // character boundary.
                let before = text.as_bytes().get(..span.start).unwrap_or(text.as_bytes());
                let line = before.split(|&b| b == b'\n').count();
                format!("line {line}: {msg}")
            }
            None => msg,
        })
    })
}

/// A [`Config`] from a TOML text alone (the `--config` file's format),
/// `$NAME` header values of `[[alternates]]` read from the process's
/// environment.
pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
    from_toml_with_env(text, &|var| std::env::var(var).ok())
}

/// The same, `$NAME` values read from `env`.
pub fn from_toml_with_env(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    build(Layer::default(), parse_file(text)?, env)
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, ConfigError> {
    value
        .trim()
        .parse()
        .map_err(|_| ConfigError(format!("{name}: {value:?} is not a valid number")))
}

/// An upstream URL: absolute `http` or `https`, no query.
pub fn upstream_uri(value: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = value
        .parse()
        .map_err(|_| ConfigError(format!("upstream {value:?} is not a URL")))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.authority().is_some() => {}
        _ => {
            return err(format!(
                "upstream {value:?} must be an http:// or https:// URL"
            ));
        }
    }
    if uri.query().is_some() {
        return err(format!("upstream {value:?} must not have a query"));
    }
    Ok(uri)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A timeout in ms where 0 means none.
fn watchdog(n: u64) -> Option<Duration> {
    (n > 0).then(|| ms(n))
}

fn build(
    layer: Layer,
    file: File,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let mut c = Config::default();
    let pick = |flag: Option<String>, from_file: Option<String>| flag.or(from_file);
    if let Some(listen) = pick(layer.listen, file.listen) {
        c.listen = listen
            .parse()
            .map_err(|_| ConfigError(format!("--listen {listen:?} is not an IP:PORT address")))?;
    }
    if let Some(up) = pick(layer.upstream, file.upstream) {
        c.upstream = Some(upstream_uri(&up)?);
    }
    if let Some(log) = pick(layer.stream_log, file.stream_log) {
        c.stream_log = StreamLogChoice::parse(&log)?;
        if matches!(c.stream_log, StreamLogChoice::Redis(_)) && !cfg!(feature = "redis") {
            return err("this build has no Redis stream log (feature `redis`)");
        }
    }
    if let Some(url) = pick(layer.fleet_redis, file.fleet_redis) {
        if !cfg!(feature = "redis") {
            return err("this build has no Redis fleet stores (feature `redis`)");
        }
        if !(url.starts_with("redis://") || url.starts_with("redis+unix://")) {
            return err("--fleet-redis: expected redis://HOST[:PORT][/DB] or redis+unix:///path");
        }
        c.fleet_redis = Some(url);
    }
    if let Some(n) = layer.keep_generating_ms {
        c.keep_generating = ms(number("--keep-generating-ms", &n)?);
    } else if let Some(n) = file.keep_generating_ms {
        c.keep_generating = ms(n);
    }
    if let Some(n) = layer.max_streams {
        c.max_streams = number("--max-streams", &n)?;
    } else if let Some(n) = file.max_streams {
        c.max_streams = n;
    }
    if c.max_streams == 0 {
        return err("--max-streams must be at least 1");
    }
    if let Some(n) = layer.max_body_bytes {
        c.max_body_bytes = number("--max-body-bytes", &n)?;
    } else if let Some(n) = file.max_body_bytes {
        c.max_body_bytes = n;
    }
    if let Some(n) = file.header_read_timeout_ms {
        if n == 0 {
            return err("header_read_timeout_ms must be at least 1");
        }
        c.header_read_timeout = ms(n);
    }
    if let Some(n) = file.shutdown_grace_ms {
        c.shutdown_grace = ms(n);
    }
    if let Some(n) = file.body_read_timeout_ms {
        if n == 0 {
            return err("body_read_timeout_ms must be at least 1");
        }
        c.body_read_timeout = ms(n);
    }
    if let Some(n) = file.body_min_bytes_per_sec {
        c.body_min_bytes_per_sec = n;
    }
    for (key, value, slot) in [
        (
            "max_kept_streams",
            file.max_kept_streams,
            &mut c.max_kept_streams,
        ),
        (
            "max_readers_per_stream",
            file.max_readers_per_stream,
            &mut c.max_readers_per_stream,
        ),
        ("max_readers", file.max_readers, &mut c.max_readers),
    ] {
        if let Some(n) = value {
            if n == 0 {
                return err(format!("{key} must be at least 1"));
            }
            *slot = n;
        }
    }
    let secret = env(STREAM_SECRET_VAR)
        .filter(|v| !v.is_empty())
        .map(Ok)
        .or_else(|| {
            file.stream_secret
                .map(|v| from_env("stream_secret", v, env))
        })
        .transpose()?;
    if let Some(secret) = secret {
        if secret.len() < 16 {
            return err("stream_secret must be at least 16 bytes");
        }
        c.stream_secret = Some(Secret(secret.into_bytes()));
    }
    if let Some(v) = file.sse_comments {
        c.sse_comments = Comments::parse(&v)
            .ok_or_else(|| ConfigError(format!("sse_comments: {v:?} is not pass or drop")))?;
    }
    c.upstream_headers = header_map("upstream_headers", file.upstream_headers, env)?;
    for client in file.clients {
        let key_hash = Client::parse_hash(&client.key_hash).ok_or_else(|| {
            ConfigError(format!(
                "client {:?}: key_hash must be sha256:<64 hex digits> (recovery-gateway hash-key prints one)",
                client.name
            ))
        })?;
        if c.clients.iter().any(|k: &Client| k.name == client.name) {
            return err(format!("client {:?} is given twice", client.name));
        }
        c.clients.push(Client {
            name: client.name,
            key_hash,
        });
    }
    c.policy = policy(&file.policy)?;
    let l = &file.log;
    if let Some(n) = l.max_entries {
        c.log_limits.max_entries = n;
    }
    if let Some(n) = l.max_bytes {
        c.log_limits.max_bytes = n;
    }
    if let Some(n) = l.max_streams {
        c.log_limits.max_streams = n;
    }
    if let Some(n) = l.max_total_bytes {
        c.log_limits.max_total_bytes = n;
    }
    if let Some(n) = l.ttl_ms {
        c.log_limits.ttl = ms(n);
    }
    for a in file.alternates {
        c.alternates.push(alternate(a, env)?);
    }
    let mut seen = BTreeSet::new();
    for r in file.routes {
        if !r.prefix.starts_with('/') {
            return err(format!("route prefix {:?} must start with /", r.prefix));
        }
        let prefix = if r.prefix.len() > 1 {
            r.prefix.trim_end_matches('/').to_owned()
        } else {
            r.prefix.clone()
        };
        if !seen.insert(prefix.clone()) {
            return err(format!("route prefix {prefix:?} is given twice"));
        }
        let at = format!("route {prefix:?}");
        let credential_header = match r.credential_header {
            Some(name) => Some(HeaderName::try_from(name.as_str()).map_err(|_| {
                ConfigError(format!(
                    "{at}: credential_header {name:?} is not a header name"
                ))
            })?),
            None => None,
        };
        c.routes.push(Route {
            headers: header_map(&at, r.headers, env)?,
            prefix,
            upstream: upstream_uri(&r.upstream)?,
            strip_prefix: r.strip_prefix,
            protocol: RouteProtocol::parse(r.protocol.as_deref().unwrap_or("auto"))?,
            resumable: r.resumable.unwrap_or(true),
            credential_header,
        });
    }
    Ok(c)
}

/// `value`, or the environment variable it names as `$NAME`.
fn from_env(
    at: &str,
    value: String,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    match value.strip_prefix('$') {
        Some(var) => env(var).ok_or_else(|| ConfigError(format!("{at}: ${var} is not set"))),
        None => Ok(value),
    }
}

/// Configured headers, `$NAME` values read from `env`, each value marked
/// sensitive (they are credentials); errors never show a value.
fn header_map(
    at: &str,
    headers: std::collections::BTreeMap<String, String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<HeaderMap, ConfigError> {
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        let value = from_env(&format!("{at}: header {name}"), value, env)?;
        let name = HeaderName::try_from(name.as_str())
            .map_err(|_| ConfigError(format!("{at}: {name:?} is not a header name")))?;
        let mut value = HeaderValue::try_from(value)
            .map_err(|_| ConfigError(format!("{at}: header {name} has an invalid value")))?;
        value.set_sensitive(true);
        out.insert(name, value);
    }
    Ok(out)
}

/// One `[[alternates]]` entry, its `$NAME` header values read from `env`.
fn alternate(
    a: AlternateFile,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<AlternateRoute, ConfigError> {
    let at = format!("alternate {:?}", a.label);
    let RouteProtocol::Fixed(protocol) = RouteProtocol::parse(&a.protocol)? else {
        return err(format!("{at}: name its protocol (auto is not one)"));
    };
    let bad = |e: recovery_core::failover::TargetError| ConfigError(format!("{at}: {e}"));
    let mut alt = tower_recovery::Alternate::new(a.label.clone())
        .and_then(|t| t.url(a.url))
        .map_err(bad)?;
    if let Some(model) = a.model {
        alt = alt.model(model).map_err(bad)?;
    }
    for (name, value) in &header_map(&at, a.headers, env)? {
        alt = alt.header(name.clone(), value.clone());
    }
    Ok(AlternateRoute {
        protocol: protocol.clone(),
        alternate: alt.protocol(protocol),
    })
}

fn policy(p: &PolicyFile) -> Result<RecoveryPolicy, ConfigError> {
    let base = RecoveryPolicy::default();
    let mut b = RecoveryPolicy::builder();
    if let Some(n) = p.max_attempts {
        let n = NonZeroU32::new(n)
            .ok_or_else(|| ConfigError("policy.max_attempts must be at least 1".into()))?;
        b = b.max_attempts(n);
    }
    if let Some(n) = p.max_resumes {
        b = b.max_resumes(n);
    }
    if let Some(n) = p.budget_ms {
        b = b.budget(watchdog(n));
    }
    if let Some(n) = p.deadline_ms {
        b = b.deadline(watchdog(n));
    }
    if p.backoff_base_ms.is_some() || p.backoff_ceiling_ms.is_some() {
        let lo = p.backoff_base_ms.map_or(base.backoff_base(), ms);
        let hi = p.backoff_ceiling_ms.map_or(base.backoff_ceiling(), ms);
        b = b.backoff(lo, hi);
    }
    if let Some(n) = p.retry_after_ceiling_ms {
        b = b.retry_after_ceiling(ms(n), base.over_ceiling());
    }
    if let Some(n) = p.head_timeout_ms {
        b = b.head_timeout(watchdog(n));
    }
    if let Some(n) = p.idle_timeout_ms {
        b = b.idle_timeout(watchdog(n));
    }
    if let Some(n) = p.progress_timeout_ms {
        b = b.progress_timeout(watchdog(n));
    }
    if let Some(s) = &p.retryable_statuses {
        b = b.retryable_statuses(s.iter().copied());
    }
    if let Some(k) = p.idempotency_key {
        b = b.idempotency_key(k);
    }
    if let Some(v) = p.retry_protocol_violations {
        b = b.retry_protocol_violations(v);
    }
    b.build()
        .map_err(|e| ConfigError(format!("[policy]: {e}").replace('\n', " ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        match parse(args.iter().map(|s| (*s).to_owned()), |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })? {
            Command::Run(c) => Ok(*c),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults() {
        let c = run(&[], &[]).unwrap();
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert!(matches!(c.stream_log, StreamLogChoice::Memory));
        assert_eq!(c.keep_generating, Duration::from_mins(1));
        assert_eq!(c.max_streams, 1024);
        assert_eq!(c.max_body_bytes, 8 << 20);
    }

    #[test]
    fn flags_win_over_env() {
        let c = run(
            &["--listen", "127.0.0.1:0", "--max-streams=7"],
            &[
                ("RECOVERY_GATEWAY_LISTEN", "127.0.0.1:9"),
                ("RECOVERY_GATEWAY_MAX_STREAMS", "3"),
                ("RECOVERY_GATEWAY_UPSTREAM", "http://127.0.0.1:1"),
            ],
        )
        .unwrap();
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.max_streams, 7);
        assert_eq!(c.upstream.unwrap().to_string(), "http://127.0.0.1:1/");
    }

    #[test]
    fn env_wins_over_file() {
        let dir = std::env::temp_dir().join(format!("gw-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("g.toml");
        std::fs::write(
            &path,
            "max_streams = 5\nmax_body_bytes = 10\nkeep_generating_ms = 7\n\
             [policy]\nmax_attempts = 4\nidle_timeout_ms = 0\n\
             [[routes]]\nprefix = \"/a/\"\nupstream = \"https://api.anthropic.com\"\nstrip_prefix = true\nprotocol = \"anthropic\"\n",
        )
        .unwrap();
        let c = run(
            &["--config", path.to_str().unwrap()],
            &[("RECOVERY_GATEWAY_MAX_STREAMS", "9")],
        )
        .unwrap();
        assert_eq!(c.max_streams, 9);
        assert_eq!(c.max_body_bytes, 10);
        assert_eq!(c.keep_generating, Duration::from_millis(7));
        assert_eq!(c.policy.max_attempts().get(), 4);
        assert_eq!(c.policy.idle_timeout(), None);
        assert_eq!(c.routes[0].prefix, "/a");
        assert!(c.routes[0].strip_prefix);
        assert_eq!(
            c.routes[0].protocol,
            RouteProtocol::Fixed(ProtocolKind::Anthropic)
        );
    }

    #[test]
    fn the_fleet_redis_is_a_flag_an_env_or_a_file_key() {
        let c = run(&["--fleet-redis", "redis+unix:///run/r.sock"], &[]).unwrap();
        assert_eq!(c.fleet_redis.as_deref(), Some("redis+unix:///run/r.sock"));
        let c = run(&[], &[("RECOVERY_GATEWAY_FLEET_REDIS", "redis://h:6379/0")]).unwrap();
        assert_eq!(c.fleet_redis.as_deref(), Some("redis://h:6379/0"));
        let c = from_toml("fleet_redis = \"redis://f/1\"\n").unwrap();
        assert_eq!(c.fleet_redis.as_deref(), Some("redis://f/1"));
        assert_eq!(run(&[], &[]).unwrap().fleet_redis, None);
    }

    #[test]
    fn alternates_name_their_protocol_and_keep_keys_out_of_errors() {
        let base =
            "[[alternates]]\nlabel = \"b\"\nurl = \"https://b.example/v1/chat/completions\"\n";
        let none = |_: &str| None;
        let e = from_toml_with_env(&format!("{base}protocol = \"auto\"\n"), &none).unwrap_err();
        assert!(e.0.contains("name its protocol"), "{e}");
        let missing = format!(
            "{base}protocol = \"openai-chat\"\nheaders = {{ x-api-key = \"$NOPE_KEY\" }}\n"
        );
        let e = from_toml_with_env(&missing, &none).unwrap_err();
        assert!(e.0.contains("$NOPE_KEY is not set"), "{e}");
        let bad = format!(
            "{base}protocol = \"openai-chat\"\nheaders = {{ x-api-key = \"sk-1\\u0001\" }}\n"
        );
        let e = from_toml_with_env(&bad, &none).unwrap_err();
        assert!(!e.0.contains("sk-1"), "no credential in the error: {e}");
        let label = "[[alternates]]\nlabel = \"a b\"\nprotocol = \"openai-chat\"\nurl = \"/x\"\n";
        assert!(
            from_toml_with_env(label, &none)
                .unwrap_err()
                .0
                .contains("label")
        );
        let ok = format!("{base}protocol = \"openai-chat\"\nmodel = \"m\"\n");
        let c = from_toml_with_env(&ok, &none).unwrap();
        assert_eq!(c.alternates.len(), 1);
        assert_eq!(c.alternates[0].protocol, ProtocolKind::OpenAiChat);
        assert_eq!(c.alternates[0].alternate.label(), "b");
    }

    #[test]
    fn bad_input_is_one_line() {
        for (args, want) in [
            (vec!["--bogus"], "unknown argument"),
            (vec!["--listen"], "needs a value"),
            (vec!["--listen", "nope"], "IP:PORT"),
            (vec!["--upstream", "ftp://x"], "http:// or https://"),
            (vec!["--max-streams", "x"], "not a valid number"),
            (vec!["--stream-log", "disk"], "memory"),
            (vec!["--config", "/nonexistent/g.toml"], "cannot read"),
            (vec!["--fleet-redis", "http://h"], "redis://"),
        ] {
            let e = run(&args, &[]).unwrap_err();
            assert!(e.0.contains(want), "{args:?}: {e}");
            assert!(!e.0.contains('\n'), "{e}");
        }
        let e = from_toml("bogus = 1\n").unwrap_err();
        assert!(e.0.contains("line 1"), "{e}");
        assert!(!e.0.contains('\n'), "{e}");
        let e = from_toml("# caf\u{e9} \u{1f600}\n\nbogus = 1\n").unwrap_err();
        assert!(e.0.contains("line 3"), "{e}");
        let e =
            from_toml("[[routes]]\nprefix = \"/x\"\nupstream = \"http://h\"\nprotocol = \"x\"\n")
                .unwrap_err();
        assert!(e.0.contains("unknown protocol"), "{e}");
    }
}
