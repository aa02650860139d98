//! A request that switches protocols: a WebSocket's opening handshake
//! (OpenAI's Realtime API, for one), carried to its route's upstream and,
//! once both sides switched, each side's bytes copied to the other unread.
//!
//! The handshake goes the way every request goes: through every phase
//! (the client's key checked, a stream slot taken), to its route's
//! upstream, with the credentials it may spend (a known client's replaced
//! by the operator's), over HTTP/1.1 (the switch is an HTTP/1.1
//! mechanism). An upstream that refuses the switch is answered as it
//! answered. Nothing is recovered in a tunnel: the gateway does not read
//! the frames of the protocol it carries, so it can prove neither a
//! commit point nor an end, and a replay could resend what a session
//! already did. A tunnel is bounded as a stream is: it keeps its stream
//! slot for its life, it is closed when no byte has crossed it either way
//! for the policy's idle timeout, and at the end of a graceful shutdown's
//! grace period (a session does not end on its own).
//!
//! `Upgrade: h2c` is not carried: it asks the gateway itself to speak
//! HTTP/2 on the connection, which it declines as RFC 9113 §3.1 allows,
//! and the request goes on as plain HTTP/1.1.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HeaderMap, HeaderValue, UPGRADE};
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use recovery_core::protocol::error_event::{ErrorClass, StreamFailure};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;
use tower_recovery::ReplayBody;
use tower_recovery::https::Http2;

use crate::body::{BoxError, GatewayBody, full};
use crate::downstream::raised;
use crate::forward::{HttpsClient, exact_response_headers, response_headers};
use crate::logs::{Field, Level, Logger};
use crate::metrics::Metrics;
use crate::respond::Refusal;

/// The protocol a request asks to switch to, when the gateway carries the
/// switch: an `Upgrade` header, `upgrade` named in `Connection` (RFC 9110
/// §7.8), and not `h2c`.
pub(crate) fn wanted(headers: &HeaderMap) -> Option<&HeaderValue> {
    let upgrade = headers.get(UPGRADE)?;
    let named = headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|token| token.trim_ascii().eq_ignore_ascii_case(b"upgrade"));
    let h2c = upgrade
        .as_bytes()
        .split(|b| *b == b',')
        .all(|token| token.trim_ascii().eq_ignore_ascii_case(b"h2c"));
    (named && !h2c).then_some(upgrade)
}

/// The stream slot a tunnel keeps for its life (the limit phase puts it in
/// the request's extensions instead of holding it with the response body,
/// which ends with the switch). Shared only because extensions are
/// clonable: the slot is free when the last copy goes.
#[derive(Clone)]
pub(crate) struct TunnelSlot {
    _held: Arc<OwnedSemaphorePermit>,
}

impl TunnelSlot {
    pub(crate) fn new(slot: OwnedSemaphorePermit) -> Self {
        TunnelSlot {
            _held: Arc::new(slot),
        }
    }
}

/// The tunnels open on every serving thread: a graceful shutdown waits
/// for them within its grace period.
#[derive(Debug)]
pub(crate) struct Tunnels {
    open: watch::Sender<usize>,
    metrics: Arc<Metrics>,
}

impl Tunnels {
    pub(crate) fn new(metrics: Arc<Metrics>) -> Self {
        Tunnels {
            open: watch::channel(0).0,
            metrics,
        }
    }

    /// Waits until no tunnel is open.
    pub(crate) async fn wait_idle(&self) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    fn opened(self: &Arc<Self>) -> Opened {
        self.open.send_modify(|n| *n += 1);
        self.metrics.tunnel_opened();
        Opened(Arc::clone(self))
    }
}

/// One open tunnel, counted until dropped.
struct Opened(Arc<Tunnels>);

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.metrics.tunnel_closed();
        self.0.open.send_modify(|n| *n -= 1);
    }
}

/// What a serving thread's proxy carries tunnels with.
pub(crate) struct Carrier {
    /// An HTTP/1.1 client of its own: a switched connection leaves its
    /// pool, and the upstream stacks' pools are for streams.
    pub(crate) client: HttpsClient,
    pub(crate) tunnels: Arc<Tunnels>,
    /// The policy's idle timeout; `None`: a silent tunnel stays open.
    pub(crate) idle: Option<Duration>,
    /// The policy's head timeout, for the upstream's answer.
    pub(crate) head_timeout: Option<Duration>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) grace: Duration,
    pub(crate) logger: Logger,
}

/// Why a tunnel closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    /// One side closed, and the other's rest went across.
    Ended,
    /// A side failed (a reset).
    Broken,
    /// No byte crossed it for the idle timeout.
    Idle,
    /// The graceful shutdown's grace period ran out.
    Shutdown,
}

impl Closed {
    fn name(self) -> &'static str {
        match self {
            Closed::Ended => "ended",
            Closed::Broken => "broken",
            Closed::Idle => "idle",
            Closed::Shutdown => "shutdown",
        }
    }
}

impl Carrier {
    /// Sends the handshake `upstream` (the client's request as the proxy
    /// rewrote it, with `upgrade`, the protocol asked for) and answers the
    /// client: the upstream's refusal as it came, or its switch, after
    /// which the bytes are carried by a task of their own until the
    /// tunnel closes.
    pub(crate) async fn open(
        &self,
        mut upstream: Request<ReplayBody>,
        upgrade: HeaderValue,
        client_side: OnUpgrade,
        slot: Option<TunnelSlot>,
    ) -> Result<Response<GatewayBody>, Refusal> {
        let headers = upstream.headers_mut();
        headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(UPGRADE, upgrade.clone());
        // What `request_headers` sets for a body the gateway reads: this
        // one it does not.
        headers.remove(http::header::ACCEPT_ENCODING);
        upstream.extensions_mut().insert(Http2::Off);
        let send = tower::ServiceExt::oneshot(self.client.clone(), upstream);
        let failed = |why: &str| {
            self.logger.warn(
                "tunnel_failed",
                "the upstream did not answer a protocol switch",
                &[("error", Field::Str(why))],
            );
            Refusal::Upstream(StreamFailure::new(
                ErrorClass::Server,
                "the upstream did not answer the protocol switch",
            ))
        };
        let answer = match self.head_timeout {
            Some(t) => match tokio::time::timeout(t, send).await {
                Ok(answer) => answer,
                Err(_) => return Err(failed("no answer within the head timeout")),
            },
            None => send.await,
        };
        let mut answer = answer.map_err(|e| failed(&e.to_string()))?;
        if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
            // Refused: its answer as it came (a body of its own length,
            // read as it arrives).
            let (parts, body) = answer.into_parts();
            let mut out = Response::new(body.map_err(BoxError::from).boxed_unsync());
            *out.status_mut() = parts.status;
            *out.headers_mut() = exact_response_headers(&parts.headers);
            return Ok(out);
        }
        let upstream_side = hyper::upgrade::on(&mut answer);
        let mut out = Response::new(full(Bytes::new()));
        *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        *out.headers_mut() = response_headers(answer.headers());
        // The protocol it switched to, or the one asked for when its
        // answer does not name it.
        let switched = answer.headers().get(UPGRADE).cloned().unwrap_or(upgrade);
        out.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        out.headers_mut().insert(UPGRADE, switched);
        let carry = Carry {
            _slot: slot,
            _opened: self.tunnels.opened(),
            idle: self.idle,
            shutdown: self.shutdown.clone(),
            grace: self.grace,
            logger: self.logger.clone(),
        };
        tokio::spawn(carry.run(client_side, upstream_side));
        Ok(out)
    }
}

/// A switched tunnel's task and what it keeps (dropped in this order when
/// it ends: the slot, then the count a shutdown waits on).
struct Carry {
    _slot: Option<TunnelSlot>,
    _opened: Opened,
    idle: Option<Duration>,
    shutdown: watch::Receiver<bool>,
    grace: Duration,
    logger: Logger,
}

impl Carry {
    async fn run(mut self, client_side: OnUpgrade, upstream_side: OnUpgrade) {
        // The client's side switches once the 101 went out.
        let (client, upstream) = match tokio::try_join!(client_side, upstream_side) {
            Ok(both) => both,
            Err(e) => {
                self.logger.info(
                    "tunnel_closed",
                    "a side left before the switch",
                    &[("error", Field::Str(&e.to_string()))],
                );
                return;
            }
        };
        let seen = Arc::new(Seen::new());
        // Both sides close at the end of this block.
        let closed = {
            let mut client = Watched {
                io: TokioIo::new(client),
                seen: Arc::clone(&seen),
                up: true,
            };
            let mut upstream = Watched {
                io: TokioIo::new(upstream),
                seen: Arc::clone(&seen),
                up: false,
            };
            let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
            tokio::pin!(copy);
            let mut idle_check = self.idle.map(|t| Instant::now() + t);
            let mut closing = self.shutdown.borrow().then(|| Instant::now() + self.grace);
            loop {
                // A branch whose guard is false is not polled: its deadline
                // stands in.
                let now = Instant::now();
                tokio::select! {
                    copied = &mut copy => break if copied.is_ok() { Closed::Ended } else { Closed::Broken },
                    () = tokio::time::sleep_until(idle_check.unwrap_or(now)), if idle_check.is_some() => {
                        let idle = self.idle.unwrap_or(Duration::MAX);
                        let last = seen.last();
                        if last.elapsed() >= idle {
                            break Closed::Idle;
                        }
                        idle_check = Some(last + idle);
                    }
                    () = raised(&mut self.shutdown), if closing.is_none() => {
                        closing = Some(Instant::now() + self.grace);
                    }
                    () = tokio::time::sleep_until(closing.unwrap_or(now)), if closing.is_some() => {
                        break Closed::Shutdown;
                    }
                }
            }
        };
        let level = match closed {
            Closed::Ended => Level::Debug,
            _ => Level::Info,
        };
        self.logger.log(
            level,
            "tunnel_closed",
            "a switched connection closed",
            &[
                ("why", Field::Str(closed.name())),
                ("bytes_up", Field::U64(seen.up.load(Ordering::Relaxed))),
                ("bytes_down", Field::U64(seen.down.load(Ordering::Relaxed))),
            ],
        );
    }
}

/// What crossed a tunnel: bytes each way, and when last.
struct Seen {
    start: Instant,
    /// Milliseconds from `start` to the last byte read on either side.
    last_ms: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
}

impl Seen {
    fn new() -> Self {
        Seen {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
        }
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }

    fn read(&self, n: usize, up: bool) {
        let count = if up { &self.up } else { &self.down };
        count.fetch_add(n as u64, Ordering::Relaxed);
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }
}

/// One side of a tunnel, noting what is read from it.
struct Watched<T> {
    io: T,
    seen: Arc<Seen>,
    /// Whether its bytes go upstream (the client's side).
    up: bool,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.seen.read(n, self.up);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn a_switch_is_wanted_only_with_upgrade_named_in_connection() {
        let ws = headers(&[("connection", "Upgrade"), ("upgrade", "websocket")]);
        assert_eq!(wanted(&ws).unwrap(), "websocket");
        let listed = headers(&[
            ("connection", "keep-alive"),
            ("connection", "x, upgrade "),
            ("upgrade", "websocket"),
        ]);
        assert!(wanted(&listed).is_some());
        assert!(wanted(&headers(&[("upgrade", "websocket")])).is_none());
        assert!(wanted(&headers(&[("connection", "upgrade")])).is_none());
        let h2c = headers(&[
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
        ]);
        assert!(wanted(&h2c).is_none());
    }
}
