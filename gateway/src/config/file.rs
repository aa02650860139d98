//! The TOML file: its shape (unknown keys are errors, so a typo is not
//! ignored) and the conversions of its values.

use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use recovery_core::policy::{PolicyError, PolicySpec, RecoveryPolicy};
use serde::Deserialize;

use recovery_core::continuation::Prefill;

use super::{AlternateRoute, ConfigError, Declared, RouteProtocol, err};

/// The file's shape; unknown keys are errors, so a typo is not ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub(super) listen: Option<String>,
    pub(super) upstream: Option<String>,
    pub(super) stream_log: Option<String>,
    pub(super) keep_generating_ms: Option<u64>,
    pub(super) max_streams: Option<usize>,
    pub(super) max_body_bytes: Option<usize>,
    pub(super) max_upload_bytes: Option<usize>,
    pub(super) max_held_body_bytes: Option<usize>,
    pub(super) fleet_redis: Option<String>,
    pub(super) otlp_endpoint: Option<String>,
    pub(super) log_level: Option<String>,
    pub(super) header_read_timeout_ms: Option<u64>,
    pub(super) body_read_timeout_ms: Option<u64>,
    pub(super) body_min_bytes_per_sec: Option<u64>,
    pub(super) max_kept_streams: Option<usize>,
    pub(super) max_readers_per_stream: Option<usize>,
    pub(super) max_readers: Option<usize>,
    pub(super) shutdown_grace_ms: Option<u64>,
    pub(super) threads: Option<usize>,
    pub(super) stream_secret: Option<String>,
    pub(super) sse_comments: Option<String>,
    #[serde(default)]
    pub(super) http2: Option<Http2File>,
    pub(super) http2_streams_per_connection: Option<usize>,
    #[serde(default)]
    pub(super) http2_keep_alive_ms: Option<MsOrOff>,
    #[serde(default)]
    pub(super) context_window: Option<u64>,
    #[serde(default)]
    pub(super) continuation: Option<String>,
    #[serde(default)]
    pub(super) prefill_template: Option<String>,
    #[serde(default)]
    pub(super) upstream_headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub(super) clients: Vec<ClientFile>,
    /// `[policy]`: the knobs of [`PolicySpec`] (an absent key keeps its
    /// default; `"off"` turns a bound off; 0 is refused).
    #[serde(default)]
    pub(super) policy: PolicySpec,
    #[serde(default)]
    pub(super) log: LogFile,
    #[serde(default)]
    pub(super) retry_budget: RetryBudgetFile,
    #[serde(default)]
    pub(super) routes: Vec<RouteFile>,
    #[serde(default)]
    pub(super) alternates: Vec<AlternateFile>,
}

/// `[[clients]]`: a caller the gateway knows, by the SHA-256 of its key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClientFile {
    pub(super) name: String,
    pub(super) key_hash: String,
}

/// `[[alternates]]`: where a request of `protocol` may go when its upstream
/// fails before the first token. A header value `"$NAME"` is read from the
/// environment variable `NAME`, so keys stay out of the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AlternateFile {
    pub(super) label: String,
    pub(super) protocol: String,
    pub(super) url: String,
    #[serde(default)]
    pub(super) model: Option<String>,
    /// The model's context window, in tokens.
    #[serde(default)]
    pub(super) context_window: Option<u64>,
    /// `"prefill"`: it continues an assistant message it is given.
    #[serde(default)]
    pub(super) continuation: Option<String>,
    /// The form it takes the prefill in (`auto` by default).
    #[serde(default)]
    pub(super) prefill_template: Option<String>,
    #[serde(default)]
    pub(super) headers: std::collections::BTreeMap<String, String>,
}

/// `[retry_budget]`: the budget every request shares (20 % of requests
/// plus 1 retry/s over 10 s by default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryBudgetFile {
    pub(super) percent: Option<f64>,
    pub(super) min_retries_per_sec: Option<u32>,
    pub(super) ttl_ms: Option<u64>,
}

/// `[log]`: the stream log's bounds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LogFile {
    pub(super) max_entries: Option<u64>,
    pub(super) max_bytes: Option<u64>,
    pub(super) max_streams: Option<usize>,
    pub(super) max_total_bytes: Option<u64>,
    pub(super) ttl_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    pub(super) prefix: String,
    pub(super) upstream: String,
    #[serde(default)]
    pub(super) strip_prefix: bool,
    #[serde(default)]
    pub(super) protocol: Option<String>,
    #[serde(default)]
    pub(super) resumable: Option<bool>,
    #[serde(default)]
    pub(super) headers: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub(super) credential_header: Option<String>,
    #[serde(default)]
    pub(super) http2: Option<Http2File>,
    #[serde(default)]
    pub(super) context_window: Option<u64>,
    #[serde(default)]
    pub(super) continuation: Option<String>,
    #[serde(default)]
    pub(super) prefill_template: Option<String>,
}

/// A time in milliseconds, or `"off"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum MsOrOff {
    Ms(u64),
    Named(String),
}

impl MsOrOff {
    /// The time, `None` for `"off"`; 0 and other names are refused,
    /// naming `key`.
    pub(super) fn duration(&self, key: &str) -> Result<Option<std::time::Duration>, ConfigError> {
        match self {
            MsOrOff::Ms(0) => Err(ConfigError(format!(
                "{key}: 0 is not a duration; use \"off\" to turn it off"
            ))),
            MsOrOff::Ms(ms) => Ok(Some(std::time::Duration::from_millis(*ms))),
            MsOrOff::Named(s) if s == "off" => Ok(None),
            MsOrOff::Named(s) => Err(ConfigError(format!(
                "{key}: {s:?} is not a number of milliseconds or \"off\""
            ))),
        }
    }
}

/// `http2 = true | false | "auto"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum Http2File {
    On(bool),
    Named(String),
}

impl Http2File {
    pub(super) fn mode(&self, at: &str) -> Result<super::Http2, ConfigError> {
        match self {
            Http2File::On(true) => Ok(super::Http2::Always),
            Http2File::On(false) => Ok(super::Http2::Off),
            Http2File::Named(s) if s.eq_ignore_ascii_case("auto") => Ok(super::Http2::Auto),
            Http2File::Named(s) => Err(ConfigError(format!(
                "{at}http2: {s:?} is not true, false or \"auto\""
            ))),
        }
    }
}

pub(super) fn read_file(path: &PathBuf) -> Result<File, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
    parse_file(&text).map_err(|e| ConfigError(format!("{}: {e}", path.display())))
}

pub(super) fn parse_file(text: &str) -> Result<File, ConfigError> {
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

pub(super) fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, ConfigError> {
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

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `value`, or the environment variable it names as `$NAME`.
pub(super) fn from_env(
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
pub(super) fn header_map(
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
pub(super) fn alternate(
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
    let declared = declared(
        &format!("{at}: "),
        a.context_window,
        a.continuation.as_deref(),
        a.prefill_template.as_deref(),
    )?;
    if let Some(tokens) = declared.context_window {
        alt = alt.context_window(tokens);
    }
    if let Some(prefill) = declared.prefill {
        if prefill.resolve(&protocol).is_none() {
            return err(format!(
                "{at}: continuation = \"prefill\" needs protocol openai-chat or anthropic"
            ));
        }
        alt = alt.prefill(prefill);
    }
    for (name, value) in &header_map(&at, a.headers, env)? {
        alt = alt.header(name.clone(), value.clone());
    }
    Ok(AlternateRoute {
        protocol: protocol.clone(),
        alternate: alt.protocol(protocol),
    })
}

/// What an upstream declares of its model: `context_window` (at least 1
/// token), `continuation` (only `"prefill"`) and `prefill_template`
/// (with `continuation` only).
pub(super) fn declared(
    at: &str,
    context_window: Option<u64>,
    continuation: Option<&str>,
    template: Option<&str>,
) -> Result<Declared, ConfigError> {
    if context_window == Some(0) {
        return err(format!("{at}context_window must be at least 1 token"));
    }
    let prefill = match (continuation, template) {
        (None, None) => None,
        (None, Some(_)) => {
            return err(format!(
                "{at}prefill_template applies only with continuation = \"prefill\""
            ));
        }
        (Some("prefill"), template) => Some(match template {
            None => Prefill::Auto,
            Some(t) => t.parse().map_err(|e| ConfigError(format!("{at}{e}")))?,
        }),
        (Some(other), _) => {
            return err(format!(
                "{at}continuation {other:?} is not \"prefill\" (the only declarative continuation)"
            ));
        }
    };
    Ok(Declared {
        context_window,
        prefill,
    })
}

/// The policy of `[policy]`. A 0 is refused naming its key
/// (`policy.idle_timeout_ms: 0 is not a duration; use "off" to turn it
/// off`); a combination the policy refuses names the table.
pub(super) fn policy(spec: &PolicySpec) -> Result<RecoveryPolicy, ConfigError> {
    spec.build().map_err(|e| match e {
        PolicyError::Zero(_) | PolicyError::Invalid { .. } => ConfigError(format!("policy.{e}")),
        e => ConfigError(format!("[policy]: {e}").replace('\n', " ")),
    })
}
