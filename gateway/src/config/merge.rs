//! The flags and the environment laid over the file, over the defaults.

use std::collections::BTreeSet;

use http::HeaderName;

use super::file::{
    File, alternate, declared, from_env, header_map, ms, number, parse_file, policy, upstream_uri,
};
use super::{
    Config, ConfigError, Route, RouteProtocol, STREAM_SECRET_VAR, Secret, StreamLogChoice, err,
};
use crate::auth::Client;
use crate::downstream::numbering::Comments;

/// Serving threads at most: each is a runtime and connection pools of its
/// own, so a number far past the cores costs without serving faster.
const MAX_THREADS: usize = 1024;

/// Streams per upstream HTTP/2 connection at most: the largest
/// `SETTINGS_MAX_CONCURRENT_STREAMS` servers commonly advertise is far
/// below it.
const MAX_HTTP2_STREAMS: usize = 65_536;

pub(super) fn build(
    layer: &Layer,
    file: File,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let mut c = Config {
        // The command line serves on a thread per core unless told
        // otherwise.
        threads: std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        ..Config::default()
    };
    addresses(&mut c, layer, &file)?;
    bounds(&mut c, layer, &file)?;
    c.policy = policy(&file.policy)?;
    retry_budget(&mut c, &file)?;
    log_limits(&mut c, &file);
    credentials(&mut c, &file, env)?;
    upstreams(&mut c, file, env)?;
    Ok(c)
}

/// The most slots a count bound may hold (streams, kept generations,
/// readers): far beyond any machine, and within what a semaphore counts.
const MAX_COUNT: usize = 1 << 40;

/// Where it listens, its default upstream, its stores.
fn addresses(c: &mut Config, layer: &Layer, file: &File) -> Result<(), ConfigError> {
    let pick = |flag: &Option<String>, from_file: &Option<String>| {
        flag.clone().or_else(|| from_file.clone())
    };
    if let Some(listen) = pick(&layer.listen, &file.listen) {
        c.listen = listen
            .parse()
            .map_err(|_| ConfigError(format!("--listen {listen:?} is not an IP:PORT address")))?;
    }
    if let Some(up) = pick(&layer.upstream, &file.upstream) {
        c.upstream = Some(upstream_uri(&up)?);
    }
    if let Some(log) = pick(&layer.stream_log, &file.stream_log) {
        c.stream_log = StreamLogChoice::parse(&log)?;
        if matches!(c.stream_log, StreamLogChoice::Redis(_)) && !cfg!(feature = "redis") {
            return err("this build has no Redis stream log (feature `redis`)");
        }
    }
    if let Some(url) = pick(&layer.fleet_redis, &file.fleet_redis) {
        if !cfg!(feature = "redis") {
            return err("this build has no Redis fleet stores (feature `redis`)");
        }
        if !(url.starts_with("redis://") || url.starts_with("redis+unix://")) {
            return err("--fleet-redis: expected redis://HOST[:PORT][/DB] or redis+unix:///path");
        }
        c.fleet_redis = Some(url);
    }
    if let Some(url) = pick(&layer.otlp_endpoint, &file.otlp_endpoint) {
        if !cfg!(feature = "otel") {
            return err("this build has no OpenTelemetry export (feature `otel`)");
        }
        c.otlp_endpoint = Some(upstream_uri(&url).map_err(|_| {
            ConfigError(format!(
                "--otlp-endpoint {url:?}: expected an http:// or https:// URL without a query"
            ))
        })?);
    }
    if let Some(name) = pick(&layer.log_level, &file.log_level) {
        let Some(level) = crate::logs::Level::parse(&name) else {
            return err(format!(
                "--log-level {name:?}: expected debug, info, warn or error"
            ));
        };
        c.logger = c.logger.clone().from_level(level);
    }
    Ok(())
}

/// The bounds: slots, bodies, readers, deadlines.
fn bounds(c: &mut Config, layer: &Layer, file: &File) -> Result<(), ConfigError> {
    if let Some(n) = &layer.keep_generating_ms {
        c.keep_generating = ms(number("--keep-generating-ms", n)?);
    } else if let Some(n) = file.keep_generating_ms {
        c.keep_generating = ms(n);
    }
    if let Some(n) = &layer.max_streams {
        c.max_streams = number("--max-streams", n)?;
    } else if let Some(n) = file.max_streams {
        c.max_streams = n;
    }
    if c.max_streams == 0 {
        return err("--max-streams must be at least 1");
    }
    if c.max_streams > MAX_COUNT {
        return err(format!("--max-streams must be at most {MAX_COUNT}"));
    }
    if let Some(n) = &layer.max_body_bytes {
        c.max_body_bytes = number("--max-body-bytes", n)?;
    } else if let Some(n) = file.max_body_bytes {
        c.max_body_bytes = n;
    }
    if let Some(n) = file.max_upload_bytes {
        c.max_upload_bytes = n;
    }
    if let Some(n) = file.max_held_body_bytes {
        c.max_held_body_bytes = n;
    }
    if c.max_held_body_bytes > tokio::sync::Semaphore::MAX_PERMITS {
        return err(format!(
            "max_held_body_bytes must be at most {}",
            tokio::sync::Semaphore::MAX_PERMITS
        ));
    }
    if c.max_held_body_bytes < c.max_body_bytes {
        return err(
            "max_held_body_bytes must be at least max_body_bytes: a body of the largest size must fit",
        );
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
    if let Some(n) = file.threads {
        if !(1..=MAX_THREADS).contains(&n) {
            return err(format!("threads must be from 1 to {MAX_THREADS}"));
        }
        c.threads = n;
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
            if n > MAX_COUNT {
                return err(format!("{key} must be at most {MAX_COUNT}"));
            }
            *slot = n;
        }
    }
    Ok(())
}

/// Whose keys: the stream secret, the clients, the default upstream's
/// operator headers, what becomes of comment blocks.
fn credentials(
    c: &mut Config,
    file: &File,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let secret = env(STREAM_SECRET_VAR)
        .filter(|v| !v.is_empty())
        .map(Ok)
        .or_else(|| {
            file.stream_secret
                .clone()
                .map(|v| from_env("stream_secret", v, env))
        })
        .transpose()?;
    if let Some(secret) = secret {
        if secret.len() < 16 {
            return err("stream_secret must be at least 16 bytes");
        }
        c.stream_secret = Some(Secret(secret.into_bytes()));
    }
    if let Some(v) = &file.sse_comments {
        c.sse_comments = Comments::parse(v)
            .ok_or_else(|| ConfigError(format!("sse_comments: {v:?} is not pass or drop")))?;
    }
    c.upstream_headers = header_map("upstream_headers", file.upstream_headers.clone(), env)?;
    if let Some(mode) = &file.http2 {
        c.upstream_http2 = mode.mode("")?;
    }
    if let Some(n) = file.http2_streams_per_connection {
        if !(1..=MAX_HTTP2_STREAMS).contains(&n) {
            return err(format!(
                "http2_streams_per_connection must be from 1 to {MAX_HTTP2_STREAMS}"
            ));
        }
        c.http2_streams_per_connection = n;
    }
    if let Some(v) = &file.http2_keep_alive_ms {
        c.http2_keep_alive = v.duration("http2_keep_alive_ms")?;
    }
    c.upstream_declared = declared(
        "",
        file.context_window,
        file.continuation.as_deref(),
        file.prefill_template.as_deref(),
    )?;
    for client in &file.clients {
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
            name: client.name.clone(),
            key_hash,
        });
    }
    Ok(())
}

/// The shared retry budget.
fn retry_budget(c: &mut Config, file: &File) -> Result<(), ConfigError> {
    let b = &file.retry_budget;
    if let Some(p) = b.percent {
        if !(0.0..=10.0).contains(&p) {
            return err("retry_budget.percent must be between 0 and 10 (0.2 = 20 %)");
        }
        c.retry_budget.percent = p;
    }
    if let Some(n) = b.min_retries_per_sec {
        c.retry_budget.min_retries_per_sec = n;
    }
    if let Some(n) = b.ttl_ms {
        if n == 0 {
            return err("retry_budget.ttl_ms must be at least 1");
        }
        c.retry_budget.ttl = ms(n);
    }
    Ok(())
}

/// The stream log's bounds.
fn log_limits(c: &mut Config, file: &File) {
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
}

/// Alternates and routes.
fn upstreams(
    c: &mut Config,
    file: File,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
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
            http2: match &r.http2 {
                Some(mode) => mode.mode(&format!("{at}: "))?,
                None => super::Http2::Off,
            },
            declared: declared(
                &format!("{at}: "),
                r.context_window,
                r.continuation.as_deref(),
                r.prefill_template.as_deref(),
            )?,
        });
    }
    Ok(())
}

/// The keys the flags, the environment and the file share.
#[derive(Debug, Default, Clone)]
pub(super) struct Layer {
    pub(super) listen: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) config: Option<String>,
    pub(super) stream_log: Option<String>,
    pub(super) keep_generating_ms: Option<String>,
    pub(super) max_streams: Option<String>,
    pub(super) max_body_bytes: Option<String>,
    pub(super) fleet_redis: Option<String>,
    pub(super) otlp_endpoint: Option<String>,
    pub(super) log_level: Option<String>,
}

pub(super) const FLAGS: [(&str, &str); 10] = [
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
    ("--otlp-endpoint", "RECOVERY_GATEWAY_OTLP_ENDPOINT"),
    ("--log-level", "RECOVERY_GATEWAY_LOG_LEVEL"),
];

impl Layer {
    pub(super) fn slot(&mut self, i: usize) -> &mut Option<String> {
        match i {
            0 => &mut self.listen,
            1 => &mut self.upstream,
            2 => &mut self.config,
            3 => &mut self.stream_log,
            4 => &mut self.keep_generating_ms,
            5 => &mut self.max_streams,
            6 => &mut self.max_body_bytes,
            7 => &mut self.fleet_redis,
            8 => &mut self.otlp_endpoint,
            _ => &mut self.log_level,
        }
    }
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
    build(&Layer::default(), parse_file(text)?, env)
}
