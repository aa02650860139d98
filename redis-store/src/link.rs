//! The connection side of a store: connecting with timeouts, reconnecting
//! with a bounded backoff, and ending with the store.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, FromRedisValue, RedisError};
use tokio::sync::watch;

use crate::RedisOptions;

/// Why a connect or a command failed.
#[derive(Debug)]
pub(crate) enum LinkError {
    /// Redis answered with an error, or the connection failed.
    Redis(Refused),
    /// A connect or a command took longer than its timeout.
    Timeout,
}

/// What Redis refused, said safely: the kind of failure or the server's
/// error code, never the URL or a password.
#[derive(Debug)]
pub(crate) struct Refused {
    /// Safe to log and to show a client.
    pub(crate) text: &'static str,
    /// The server's error code (`NOSCRIPT`, `WRONGPASS`, ...), if any.
    pub(crate) code: Option<String>,
    /// The connection may be broken: open another.
    pub(crate) breaks: bool,
}

impl LinkError {
    /// A connection that ended on its own (a subscription closed).
    pub(crate) fn closed() -> Self {
        LinkError::Redis(Refused {
            text: "redis connection lost",
            code: None,
            breaks: true,
        })
    }

    /// Whether the connection it came on may be broken.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            LinkError::Redis(r) => r.breaks,
            LinkError::Timeout => true,
        }
    }
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::Redis(Refused {
                text,
                code: Some(code),
                ..
            }) => write!(f, "{text} ({code})"),
            LinkError::Redis(r) => f.write_str(r.text),
            LinkError::Timeout => f.write_str("redis timed out"),
        }
    }
}

impl From<RedisError> for LinkError {
    fn from(e: RedisError) -> Self {
        if e.is_timeout() {
            return LinkError::Timeout;
        }
        let text = if e.is_connection_refusal() {
            "redis connection refused"
        } else if e.is_connection_dropped() {
            "redis connection lost"
        } else if e.code().is_some() {
            "redis answered with an error"
        } else if e.is_io_error() {
            "redis i/o error"
        } else {
            "redis command failed"
        };
        LinkError::Redis(Refused {
            text,
            // A code is a word of the protocol (`NOAUTH`, `WRONGPASS`),
            // never the detail that may follow it.
            code: e
                .code()
                .filter(|c| c.len() <= 32 && c.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'))
                .map(str::to_owned),
            breaks: e.is_io_error()
                || e.is_connection_dropped()
                || e.is_unrecoverable_error()
                || e.is_connection_refusal(),
        })
    }
}

/// What a store can say about its link to Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LinkStatus {
    /// Connected, subscribed and caught up (a cooldown store has read the
    /// cooldowns in force; a budget has read the fleet's counts once).
    pub connected: bool,
    /// Sessions established so far.
    pub connects: u64,
    /// Connect attempts that failed and sessions that broke, so far.
    pub failures: u64,
}

/// The link's state, shared by a store and its task.
#[derive(Debug)]
pub(crate) struct Health {
    connected: watch::Sender<bool>,
    connects: AtomicU64,
    failures: AtomicU64,
}

impl Health {
    pub(crate) fn new() -> Self {
        Health {
            connected: watch::Sender::new(false),
            connects: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    pub(crate) fn up(&self) {
        self.connects.fetch_add(1, Ordering::Relaxed);
        self.connected.send_replace(true);
    }

    pub(crate) fn down(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.connected.send_replace(false);
    }

    pub(crate) fn status(&self) -> LinkStatus {
        LinkStatus {
            connected: *self.connected.borrow(),
            connects: self.connects.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
        }
    }

    /// Waits until connected, at most `timeout`; whether it is.
    pub(crate) async fn wait_connected(&self, timeout: Duration) -> bool {
        let mut rx = self.connected.subscribe();
        let wait = rx.wait_for(|up| *up);
        matches!(tokio::time::timeout(timeout, wait).await, Ok(Ok(_)))
    }
}

/// Ends a store's task when the last handle on the store is dropped.
#[derive(Debug)]
pub(crate) struct Guard(#[allow(dead_code)] watch::Sender<()>);

/// The task's side of the [`Guard`].
pub(crate) struct Stop(watch::Receiver<()>);

pub(crate) fn guard() -> (Guard, Stop) {
    let (tx, rx) = watch::channel(());
    (Guard(tx), Stop(rx))
}

/// Starts a store's background task on the current tokio runtime: `task`
/// gets the link to the Redis at `url` and its [`Stop`]; the [`Guard`]
/// returned ends it when the store's last clone is dropped. Fails on a URL
/// that cannot work, or outside a runtime (the options were checked).
pub(crate) fn start<F>(
    url: &str,
    options: RedisOptions,
    task: impl FnOnce(Link, Stop) -> F,
) -> Result<Guard, crate::RedisStoreError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let client = crate::error::open(url)?;
    let runtime =
        tokio::runtime::Handle::try_current().map_err(|_| crate::RedisStoreError::NoRuntime)?;
    let (guard, stop) = guard();
    runtime.spawn(task(Link::new(client, Arc::new(options)), stop));
    Ok(guard)
}

impl Stop {
    /// Runs `f` until it ends or the store is gone (`None`).
    pub(crate) async fn or_stop<F: Future>(&mut self, f: F) -> Option<F::Output> {
        tokio::select! {
            out = f => Some(out),
            _ = self.0.changed() => None,
        }
    }
}

/// Pauses between reconnect attempts: from 100 ms doubling up to the
/// options' `max_backoff`, each drawn between half and all of it so a
/// fleet that lost Redis together does not come back in lockstep.
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
    random: RandomState,
    draws: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(100);

    pub(crate) fn new(max: Duration) -> Self {
        Backoff {
            next: Self::FIRST.min(max),
            max,
            random: RandomState::new(),
            draws: 0,
        }
    }

    pub(crate) fn reset(&mut self) {
        self.next = Self::FIRST.min(self.max);
    }

    pub(crate) fn next_pause(&mut self) -> Duration {
        let full = self.next;
        self.next = (self.next * 2).min(self.max);
        self.draws += 1;
        let mut h = self.random.build_hasher();
        h.write_u64(self.draws);
        let fraction = (h.finish() >> 11) as f64 / (1u64 << 53) as f64;
        full / 2 + (full / 2).mul_f64(fraction)
    }
}

/// A Redis client with the options' timeouts.
#[derive(Clone)]
pub(crate) struct Link {
    client: redis::Client,
    pub(crate) options: Arc<RedisOptions>,
}

impl Link {
    pub(crate) fn new(client: redis::Client, options: Arc<RedisOptions>) -> Self {
        Link { client, options }
    }

    /// A multiplexed connection for commands.
    pub(crate) async fn commands(&self) -> Result<MultiplexedConnection, LinkError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.options.connect_timeout))
            .set_response_timeout(Some(self.options.command_timeout));
        let connect = self
            .client
            .get_multiplexed_async_connection_with_config(&config);
        let limit = self.options.connect_timeout + self.options.command_timeout;
        Ok(tokio::time::timeout(limit, connect)
            .await
            .map_err(|_| LinkError::Timeout)??)
    }

    /// A connection of its own for commands that block (`XREAD BLOCK`):
    /// no response timeout, the caller bounds each command. `None` when
    /// `deadline` comes first.
    pub(crate) async fn blocking(
        &self,
        deadline: tokio::time::Instant,
    ) -> Result<Option<MultiplexedConnection>, LinkError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.options.connect_timeout))
            .set_response_timeout(None);
        let connect = self
            .client
            .get_multiplexed_async_connection_with_config(&config);
        let limit = tokio::time::Instant::now() + self.options.connect_timeout;
        match tokio::time::timeout_at(limit.min(deadline), connect).await {
            Ok(conn) => Ok(Some(conn?)),
            Err(_) if deadline <= limit => Ok(None),
            Err(_) => Err(LinkError::Timeout),
        }
    }

    /// Runs `script` (`EVALSHA`, loading it when Redis does not know it)
    /// within the command timeout.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut MultiplexedConnection,
        script: &redis::ScriptInvocation<'_>,
    ) -> Result<T, LinkError> {
        Ok(
            tokio::time::timeout(self.options.command_timeout, script.invoke_async::<T>(conn))
                .await
                .map_err(|_| LinkError::Timeout)??,
        )
    }

    /// A connection subscribed to `channel`.
    pub(crate) async fn subscribed(&self, channel: &str) -> Result<PubSub, LinkError> {
        let limit = self.options.connect_timeout + self.options.command_timeout;
        let subscribe = async {
            let mut pubsub = self.client.get_async_pubsub().await?;
            pubsub.subscribe(channel).await?;
            Ok::<_, RedisError>(pubsub)
        };
        Ok(tokio::time::timeout(limit, subscribe)
            .await
            .map_err(|_| LinkError::Timeout)??)
    }

    /// Runs a command or pipeline within the command timeout.
    pub(crate) async fn run<T: FromRedisValue>(
        &self,
        conn: &mut MultiplexedConnection,
        query: &QueryKind<'_>,
    ) -> Result<T, LinkError> {
        let work = async {
            match query {
                QueryKind::Cmd(cmd) => cmd.query_async::<T>(conn).await,
                QueryKind::Pipe(pipe) => pipe.query_async::<T>(conn).await,
            }
        };
        Ok(tokio::time::timeout(self.options.command_timeout, work)
            .await
            .map_err(|_| LinkError::Timeout)??)
    }

    /// Loads `script` and returns its SHA1 for `EVALSHA`.
    pub(crate) async fn load(
        &self,
        conn: &mut MultiplexedConnection,
        script: &str,
    ) -> Result<String, LinkError> {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(script);
        self.run(conn, &QueryKind::Cmd(&cmd)).await
    }
}

/// One command or one pipeline: either is one round trip.
pub(crate) enum QueryKind<'a> {
    Cmd(&'a redis::Cmd),
    Pipe(&'a redis::Pipeline),
}

/// Escapes the glob characters of `text` for a `SCAN MATCH` pattern.
pub(crate) fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A random identity for one store, so it can tell its own messages.
pub(crate) fn instance_id() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded_and_grows() {
        let mut b = Backoff::new(Duration::from_secs(1));
        let pauses: Vec<Duration> = (0..8).map(|_| b.next_pause()).collect();
        assert!(pauses[0] >= Duration::from_millis(50) && pauses[0] <= Duration::from_millis(100));
        assert!(pauses.iter().all(|p| *p <= Duration::from_secs(1)));
        assert!(pauses[7] >= Duration::from_millis(500), "{pauses:?}");
        b.reset();
        assert!(b.next_pause() <= Duration::from_millis(100));
        let mut tiny = Backoff::new(Duration::from_millis(20));
        assert!(tiny.next_pause() <= Duration::from_millis(20));
    }

    #[test]
    fn globs_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("recovery:"), "recovery:");
    }
}
