//! The upstream leg: `tower_recovery::https`'s client under
//! `RecoveryLayer` and `ObserveLayer`, one stack for every protocol (each
//! request names its own), and the header rules of a proxy.
//!
//! Every decision (replay before commit, resume, the typed failure after)
//! is the recovery layer's, the same as for a library user: this module
//! only builds the stack and the request. One stack means one retry budget
//! and one cooldown store, so the protocol a request speaks does not change
//! how much the gateway may retry an origin.

use crate::config::{AlternateRoute, Declared};
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri};
use recovery_core::budget::{RetryBudget, RetryBudgetConfig};
use recovery_core::call::RecoveryCall;
use recovery_core::cooldown::{CooldownStore, Cooldowns};
use recovery_core::lifecycle::{EventKind, LifecycleEvent};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::ProtocolKind;
use recovery_core::timing::AlwaysOnline;
use tower_layer::Layer as _;
use tower_recovery::https::{Http2Settings, ResponseBody};
use tower_recovery::observe::{Observe, ObservedBody};
use tower_recovery::recovery::Recover;
use tower_recovery::{ObserveLayer, RecoveryBody, RecoveryLayer, TokioTiming};

use crate::logs::{Field, Level, Logger};
use crate::metrics::Metrics;
use crate::request_body::RequestBody;

/// The HTTP client under the stacks (`tower_recovery::https`).
pub(crate) type HttpsClient = tower_recovery::https::HttpsClient;

/// The upstream stack.
pub(crate) type Stack = Recover<Observe<HttpsClient>, TokioTiming, AlwaysOnline>;

/// The body of an upstream answer as the stack hands it out.
pub(crate) type UpstreamBody = RecoveryBody<ObservedBody<ResponseBody>>;

/// What the requests of every stack share: the retry budget and the
/// cooldown store, of this process or of the fleet.
pub(crate) struct Shared {
    cooldowns: Arc<dyn CooldownStore>,
    budget: Budget,
}

enum Budget {
    Local(RetryBudget),
    #[cfg(feature = "redis")]
    Fleet(tower_recovery::redis::RedisBudget),
}

impl Shared {
    /// This process's own (the in-memory stores).
    pub(crate) fn local(budget: RetryBudgetConfig) -> Self {
        Shared {
            cooldowns: Arc::new(Cooldowns::new()),
            budget: Budget::Local(RetryBudget::new(budget)),
        }
    }

    /// The fleet's, through the Redis at `url` (connected in the
    /// background; local until it is up, and while it is down).
    #[cfg(feature = "redis")]
    pub(crate) fn fleet(
        url: &str,
        budget: RetryBudgetConfig,
    ) -> Result<Self, tower_recovery::redis::RedisStoreError> {
        use tower_recovery::redis::{RedisBudget, RedisCooldowns, RedisOptions};
        Ok(Shared {
            cooldowns: Arc::new(RedisCooldowns::connect(url, RedisOptions::default())?),
            budget: Budget::Fleet(RedisBudget::connect(url, budget, RedisOptions::default())?),
        })
    }

    fn apply(&self, layer: RecoveryLayer) -> RecoveryLayer {
        match &self.budget {
            Budget::Local(b) => layer.with_retry_budget(b.clone()),
            #[cfg(feature = "redis")]
            Budget::Fleet(b) => layer.with_retry_budget(b.clone()),
        }
    }
}

/// The one upstream stack: every request names its protocol on its call
/// ([`RecoveryCall::with_protocol`]), and each alternate serves the
/// requests of its own protocol only.
pub(crate) struct Upstream {
    stack: Stack,
}

impl Upstream {
    /// The stack with `policy`, counting into `metrics` and logging
    /// lifecycle events (names, ids and statuses only) to `logger`, with
    /// one retry budget and one cooldown store: this process's, or the
    /// fleet's (`shared`); its HTTP/2 connections are used and watched as
    /// `http2` says.
    pub(crate) fn new(
        policy: &RecoveryPolicy,
        shared: &Shared,
        alternates: &[AlternateRoute],
        http2: Http2Settings,
        metrics: &Arc<Metrics>,
        logger: &Logger,
    ) -> Self {
        let metrics = Arc::clone(metrics);
        let logger = logger.clone();
        let layer = alternates.iter().fold(
            RecoveryLayer::new(policy.clone()).with_protocol(ProtocolKind::OpenAiChat),
            |l, a| l.with_alternate(a.alternate.clone().serving(a.protocol.clone())),
        );
        let layer = shared
            .apply(layer)
            .with_cooldowns(Arc::clone(&shared.cooldowns))
            .on_event(move |e| {
                metrics.on_event(e);
                log_event(&logger, e);
            });
        let observe = ObserveLayer::new(ProtocolKind::OpenAiChat);
        Upstream {
            stack: layer.layer(observe.layer(tower_recovery::https::client_with(http2))),
        }
    }

    /// A request to the stack, decoded as `protocol`, sent to an upstream
    /// that declares `declared` of its model.
    pub(crate) fn call(
        &self,
        mut req: Request<RequestBody>,
        protocol: &ProtocolKind,
        declared: Declared,
    ) -> tower::util::Oneshot<Stack, Request<RequestBody>> {
        let mut call = RecoveryCall::new().with_protocol(protocol.clone());
        if req.body().is_upload() {
            // Sent once as it arrives, never held (`request_body`).
            call = call.streaming_body();
        }
        if let Some(tokens) = declared.context_window {
            call = call.with_context_window(tokens);
        }
        if let Some(prefill) = declared.prefill {
            call = call.with_prefill(prefill);
        }
        req.extensions_mut().insert(call);
        tower::ServiceExt::oneshot(self.stack.clone(), req)
    }
}

/// Lifecycle events that say something an operator acts on.
fn log_event(logger: &Logger, e: &LifecycleEvent) {
    let mut fields: Vec<(&str, Field<'_>)> = vec![
        ("logical_id", Field::Str(&e.identity.logical_id)),
        ("attempt", Field::U64(u64::from(e.identity.wire_attempt))),
    ];
    let msg = match &e.kind {
        EventKind::AttemptFailed { status, .. } => {
            if let Some(s) = status {
                fields.push(("status", Field::U64(u64::from(*s))));
            }
            "upstream attempt failed"
        }
        EventKind::RetryStarted => "replaying the request upstream",
        EventKind::ResumeStarted => "resuming the stream upstream",
        EventKind::Failover { .. } => "failing over",
        EventKind::HedgeStarted { .. } => "hedging the request upstream",
        EventKind::HedgeCancelled { .. } => "closing the attempt that lost the race",
        EventKind::Exhausted { outcome, .. } | EventKind::Interrupted { outcome, .. } => {
            fields.push(("outcome", Field::Str(outcome.name())));
            "upstream request failed"
        }
        EventKind::Completed { .. } => "upstream request completed",
        EventKind::Cancelled { .. } => "upstream request cancelled",
        _ => return,
    };
    // A request that went well says so once, where its stream ends.
    let level = match e.kind {
        EventKind::Completed { .. } => Level::Debug,
        _ => Level::Info,
    };
    logger.log(level, e.kind.name(), msg, &fields);
}

/// Headers that belong to one connection (RFC 9110 §7.6.1), never
/// forwarded either way, plus those a proxy sets itself.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip(headers: &HeaderMap, also: &[HeaderName]) -> HeaderMap {
    // Names listed in `Connection` are hop-by-hop too.
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || named.iter().any(|c| c == n) || also.contains(name) {
            continue;
        }
        // The value copied, not shared: hyper's parsed header values are
        // slices of the connection's read buffer, and the upstream request
        // (kept for replays) would hold that whole buffer for the stream's
        // life. Names are hyper's own (a known one, or a copy of it).
        let mut copy = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
        copy.set_sensitive(value.is_sensitive());
        out.append(name.clone(), copy);
    }
    out
}

/// The headers sent upstream: the client's, less hop-by-hop ones, `host`
/// (the client's pointed at the gateway), `content-length` (the body is
/// re-framed). Credentials pass untouched (a known client's are replaced
/// by the proxy, which also takes the gateway's own request headers out). `accept-encoding: identity`
/// replaces the client's: the gateway reads the stream to recover it, and
/// a compressed body could not be decoded event by event.
pub(crate) fn request_headers(src: &HeaderMap) -> HeaderMap {
    let mut out = strip(
        src,
        &[
            header::HOST,
            header::CONTENT_LENGTH,
            header::ACCEPT_ENCODING,
        ],
    );
    out.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    out
}

/// The headers sent back: the upstream's, less hop-by-hop ones and
/// `content-length` (the gateway frames the body itself).
pub(crate) fn response_headers(src: &HeaderMap) -> HeaderMap {
    strip(src, &[header::CONTENT_LENGTH])
}

/// The headers of an answer whose bytes pass on exactly as they came (one
/// that is not a generation): the upstream's, less hop-by-hop ones, its
/// length kept (a download's progress is read from it; a body cut short
/// of it ends broken, as upstream).
pub(crate) fn exact_response_headers(src: &HeaderMap) -> HeaderMap {
    strip(src, &[])
}

/// The upstream request: `method`, `uri`, the filtered headers and the
/// body.
pub(crate) fn upstream_request(
    parts: &http::request::Parts,
    uri: Uri,
    body: RequestBody,
) -> Result<Request<RequestBody>, http::Error> {
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(body)?;
    *req.headers_mut() = request_headers(&parts.headers);
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_host_are_dropped_credentials_kept() {
        let mut h = HeaderMap::new();
        h.insert("host", "gw".parse().unwrap());
        h.insert("connection", "keep-alive, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("content-length", "3".parse().unwrap());
        h.insert("accept-encoding", "gzip".parse().unwrap());
        h.insert("authorization", "Bearer sk-1".parse().unwrap());
        h.insert("x-api-key", "k".parse().unwrap());
        h.append("x-multi", "a".parse().unwrap());
        h.append("x-multi", "b".parse().unwrap());
        let out = request_headers(&h);
        for gone in ["host", "connection", "x-private", "te", "content-length"] {
            assert!(out.get(gone).is_none(), "{gone}");
        }
        assert_eq!(out["authorization"], "Bearer sk-1");
        assert_eq!(out["x-api-key"], "k");
        assert_eq!(out["accept-encoding"], "identity");
        assert_eq!(out.get_all("x-multi").iter().count(), 2);
    }
}
