//! The provider: listener, shared state, per-connection script execution and
//! the control endpoint.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

use super::script::{Compiled, CompiledSet, Ending, ScriptError, ScriptSet, Transfer};
use super::wire::{self, Framing, Parsed};

/// Path prefix of the control endpoint (never counted, never scripted).
pub const CONTROL_PREFIX: &str = "/__fault/";

/// Headers a browser may read cross-origin: the hint headers the driver needs
/// (`Access-Control-Expose-Headers`). Without this list a cross-origin
/// `fetch` reports them absent.
const EXPOSE_HEADERS: &str = "retry-after, retry-after-ms, x-should-retry, x-request-id, request-id, \
     location, x-ratelimit-limit-requests, x-ratelimit-remaining-requests, \
     x-ratelimit-reset-requests, x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, \
     x-ratelimit-reset-tokens";

/// The fixtures directory of this crate, used unless [`Options::fixtures_dir`] says otherwise.
pub fn default_fixtures_dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures"))
}

/// An address on 127.0.0.1 where nothing listens (a port bound, noted and
/// released), for connection-refused rows. Another process could take the
/// port in between; on a test machine that is rare enough to accept.
pub fn refused_addr() -> io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    listener.local_addr()
}

/// A listener on 127.0.0.1 that answers no connect: it never accepts and
/// its queue is full, so a further SYN goes unanswered and a connect times
/// out (the connect-timeout rows). Connects go nowhere while it lives.
#[derive(Debug)]
pub struct UnansweredListener {
    addr: SocketAddr,
    _listener: socket2::Socket,
    _queued: Vec<std::net::TcpStream>,
}

impl UnansweredListener {
    /// Binds port 0, listens with a queue of one, and fills the queue.
    pub fn new() -> io::Result<Self> {
        use socket2::{Domain, Socket, Type};
        let listener = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        listener.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())?;
        listener.listen(1)?;
        let addr = listener
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("not an IP socket"))?;
        let mut queued = Vec::new();
        loop {
            match std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200))
            {
                Ok(s) if queued.len() < 16 => queued.push(s),
                Ok(_) => return Err(io::Error::other("the listen queue never filled")),
                Err(e) if e.kind() == io::ErrorKind::TimedOut => break,
                Err(e) => return Err(e),
            }
        }
        Ok(UnansweredListener {
            addr,
            _listener: listener,
            _queued: queued,
        })
    }

    /// Where connects go unanswered.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// How to start a [`FaultProvider`].
#[derive(Debug, Clone)]
pub struct Options {
    /// The scripts to serve.
    pub scripts: ScriptSet,
    /// Where `fixture` writes are read from (default `tests/fixtures/`).
    pub fixtures_dir: PathBuf,
    /// Add CORS headers to every response and answer `OPTIONS` preflights
    /// itself (not counted, no script consumed). On for the standalone binary.
    pub cors: bool,
    /// Serve the `/__fault/` control endpoint. On for the standalone binary.
    pub control: bool,
    /// Port on 127.0.0.1; 0 (the default) picks a free one. Only the binary
    /// should set it: in-process tests always use 0.
    pub port: u16,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            scripts: ScriptSet::default(),
            fixtures_dir: default_fixtures_dir(),
            cors: false,
            control: false,
            port: 0,
        }
    }
}

impl Options {
    /// Options serving these scripts, everything else default.
    pub fn new(scripts: impl Into<ScriptSet>) -> Self {
        Self {
            scripts: scripts.into(),
            ..Self::default()
        }
    }
}

/// A request as the provider received it, bytes intact, so tests can assert
/// that a resend is byte-identical to the first send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedRequest {
    /// 0-based position among all counted requests.
    pub seq: u64,
    /// Which accepted connection carried it (0-based, in accept order).
    pub connection: u64,
    /// Position within its script sequence (the script it got, unless the
    /// sequence was used up).
    pub script_index: usize,
    /// Request method.
    pub method: String,
    /// Request target as sent: path and query.
    pub target: String,
    /// Headers in order, values as bytes.
    pub headers: Vec<(String, Bytes)>,
    /// The head exactly as read, request line to the blank line.
    pub raw_head: Bytes,
    /// The body, de-chunked if it was sent chunked.
    pub body: Bytes,
}

impl ReceivedRequest {
    /// The path without its query string.
    pub fn path(&self) -> &str {
        wire::path_of(&self.target)
    }

    /// First value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }
}

/// A snapshot of the provider's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Counted requests (control requests and CORS preflights excluded).
    pub requests: u64,
    /// Connections currently open.
    pub open_connections: u64,
    /// Connections accepted since start (or the last reset).
    pub connections_accepted: u64,
    /// Stall points entered (each `stall` write, `stall` ending or `never_answer`).
    pub stalls_entered: u64,
    /// Stall points currently waiting for a permit.
    pub stalls_waiting: u64,
    /// CORS preflights answered (not counted in `requests`).
    pub preflights: u64,
}

struct State {
    scripts: CompiledSet,
    cursors: HashMap<Option<String>, usize>,
    requests: Vec<ReceivedRequest>,
    per_path: BTreeMap<String, u64>,
    /// When each body piece of a request (by `seq`) was written.
    pieces: HashMap<u64, Vec<std::time::Instant>>,
    /// When each connection (by accept order) ended: the peer closed it,
    /// or the provider did.
    closed: HashMap<u64, std::time::Instant>,
}

struct Shared {
    state: Mutex<State>,
    /// When the provider started: the origin of the times it reports.
    started: std::time::Instant,
    stats: watch::Sender<Stats>,
    /// Permits for stall points; closed by `release_all`, replaced by `reset`.
    gate: Mutex<Arc<Semaphore>>,
    shutdown: watch::Receiver<bool>,
    fixtures_dir: PathBuf,
    cors: bool,
    control: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test thread must not turn every later assertion into a
    // poison error that hides the first failure.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sends the shutdown signal when the last [`FaultProvider`] clone is dropped.
struct ShutdownGuard(watch::Sender<bool>);

impl Drop for ShutdownGuard {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

/// A scripted HTTP/1.1 server on `127.0.0.1`, for tests over real sockets.
///
/// Clones share the server; it shuts down (listener and every connection)
/// when the last clone is dropped or [`FaultProvider::shutdown`] is called.
#[derive(Clone)]
pub struct FaultProvider {
    shared: Arc<Shared>,
    guard: Arc<ShutdownGuard>,
    addr: SocketAddr,
}

impl std::fmt::Debug for FaultProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProvider")
            .field("addr", &self.addr)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl FaultProvider {
    /// Start on `127.0.0.1:0` serving `scripts`, fixtures from `tests/fixtures/`.
    pub async fn start(scripts: impl Into<ScriptSet>) -> io::Result<Self> {
        Self::start_with(Options::new(scripts)).await
    }

    /// Start with explicit options. Must run inside a tokio runtime: the
    /// accept loop and connections are tasks on it (hence `async`, although
    /// nothing is awaited: it states where it must be called).
    #[allow(clippy::unused_async)]
    pub async fn start_with(options: Options) -> io::Result<Self> {
        let (listener, shared, shutdown) = prepare(options)?;
        let listener = TcpListener::from_std(listener)?;
        let addr = listener.local_addr()?;
        tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self {
            shared,
            guard: Arc::new(ShutdownGuard(shutdown)),
            addr,
        })
    }

    /// Start on a thread of its own with its own runtime; callable outside
    /// any runtime. The server's tasks then never show up in the test
    /// runtime's task accounting, and its script delays run on real time even
    /// when the test's clock is paused. The thread ends after shutdown, once
    /// every connection is closed.
    pub fn start_dedicated(options: Options) -> io::Result<Self> {
        let (listener, shared, shutdown) = prepare(options)?;
        let addr = listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let server = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("fault-provider-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::spawn(accept_loop(listener, Arc::clone(&server)));
                    let mut stop = server.shutdown.clone();
                    let _ = stop.wait_for(|stop| *stop).await;
                    let mut stats = server.stats.subscribe();
                    let _ = stats.wait_for(|s| s.open_connections == 0).await;
                });
            })?;
        Ok(Self {
            shared,
            guard: Arc::new(ShutdownGuard(shutdown)),
            addr,
        })
    }

    /// The bound address (always 127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `base_url()` followed by `path` (which should start with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A snapshot of all counters.
    pub fn stats(&self) -> Stats {
        *self.shared.stats.borrow()
    }

    /// Counted requests received so far.
    pub fn count(&self) -> u64 {
        self.stats().requests
    }

    /// Counted requests received for one path (query ignored).
    pub fn count_path(&self, path: &str) -> u64 {
        lock(&self.shared.state)
            .per_path
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Counted requests per path.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        lock(&self.shared.state).per_path.clone()
    }

    /// Every counted request, in arrival order.
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        lock(&self.shared.state).requests.clone()
    }

    /// The counted requests for one path, in arrival order.
    pub fn requests_for(&self, path: &str) -> Vec<ReceivedRequest> {
        lock(&self.shared.state)
            .requests
            .iter()
            .filter(|r| r.path() == path)
            .cloned()
            .collect()
    }

    /// When each body piece of request `seq` was written (a delayed
    /// piece's time is after its delay).
    pub fn pieces_at(&self, seq: u64) -> Vec<std::time::Instant> {
        lock(&self.shared.state)
            .pieces
            .get(&seq)
            .cloned()
            .unwrap_or_default()
    }

    /// When connection `connection` (0-based, in accept order) ended: its
    /// peer hung up (noticed at once, also during a script's delay) or the
    /// provider closed it. `None` while it is open.
    pub fn closed_at(&self, connection: u64) -> Option<std::time::Instant> {
        lock(&self.shared.state).closed.get(&connection).copied()
    }

    /// Connections currently open (accepted and not yet closed by either side).
    pub fn open_connections(&self) -> u64 {
        self.stats().open_connections
    }

    /// Wait until the counters satisfy `condition`. Never times out on its
    /// own: wrap it in `tokio::time::timeout` so a broken test fails instead
    /// of hanging.
    pub async fn wait_until(&self, mut condition: impl FnMut(&Stats) -> bool) -> Stats {
        let mut rx = self.shared.stats.subscribe();
        *rx.wait_for(|s| condition(s))
            .await
            .expect("the provider owns the sender")
    }

    /// Wait until at least `n` requests were counted.
    pub async fn wait_for_requests(&self, n: u64) -> Stats {
        self.wait_until(|s| s.requests >= n).await
    }

    /// Wait until at least `n` stall points were entered.
    pub async fn wait_for_stalls(&self, n: u64) -> Stats {
        self.wait_until(|s| s.stalls_entered >= n).await
    }

    /// Wait until no connection is open.
    pub async fn wait_idle(&self) -> Stats {
        self.wait_until(|s| s.open_connections == 0).await
    }

    /// Release `n` stall points: waiting ones first, in arrival order; any
    /// permits left over let later stall points pass at once.
    pub fn release(&self, n: usize) {
        lock(&self.shared.gate).add_permits(n);
    }

    /// Release every stall point, now and until the next [`reset`](Self::reset).
    pub fn release_all(&self) {
        lock(&self.shared.gate).close();
    }

    /// Replace the scripts and restart every sequence from its first script.
    /// Counters and recorded requests are kept.
    pub fn set_scripts(&self, scripts: &ScriptSet) -> Result<(), ScriptError> {
        self.shared.set_scripts(scripts)
    }

    /// Add or replace the sequences of the paths in `scripts.paths`, restarting
    /// only those; the default sequence, other paths and counters are kept.
    pub fn merge_paths(&self, scripts: &ScriptSet) -> Result<(), ScriptError> {
        self.shared.merge_paths(scripts)
    }

    /// Clear counters (except open connections), recorded requests, script
    /// cursors and stall permits. Scripts are kept.
    pub fn reset(&self) {
        self.shared.reset();
    }

    /// Stop accepting, close every connection, and wait until all are closed.
    pub async fn shutdown(self) {
        let _ = self.guard.0.send(true);
        self.wait_idle().await;
    }
}

/// Compile the scripts and bind, synchronously, so both start paths share it.
fn prepare(
    options: Options,
) -> io::Result<(std::net::TcpListener, Arc<Shared>, watch::Sender<bool>)> {
    let compiled = options
        .scripts
        .compile(&options.fixtures_dir)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, options.port))?;
    listener.set_nonblocking(true)?;
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            scripts: compiled,
            cursors: HashMap::new(),
            requests: Vec::new(),
            per_path: BTreeMap::new(),
            pieces: HashMap::new(),
            closed: HashMap::new(),
        }),
        started: std::time::Instant::now(),
        stats: watch::Sender::new(Stats::default()),
        gate: Mutex::new(Arc::new(Semaphore::new(0))),
        shutdown: shutdown_rx,
        fixtures_dir: options.fixtures_dir,
        cors: options.cors,
        control: options.control,
    });
    Ok((listener, shared, shutdown_tx))
}

impl Shared {
    fn set_scripts(&self, scripts: &ScriptSet) -> Result<(), ScriptError> {
        let compiled = scripts.compile(&self.fixtures_dir)?;
        let mut state = lock(&self.state);
        state.scripts = compiled;
        state.cursors.clear();
        Ok(())
    }

    fn merge_paths(&self, scripts: &ScriptSet) -> Result<(), ScriptError> {
        let compiled = scripts.compile(&self.fixtures_dir)?;
        let mut state = lock(&self.state);
        for (path, list) in compiled.paths {
            state.cursors.remove(&Some(path.clone()));
            state.scripts.paths.insert(path, list);
        }
        Ok(())
    }

    fn reset(&self) {
        let mut state = lock(&self.state);
        state.cursors.clear();
        state.requests.clear();
        state.per_path.clear();
        state.pieces.clear();
        state.closed.clear();
        *lock(&self.gate) = Arc::new(Semaphore::new(0));
        self.stats.send_modify(|s| {
            *s = Stats {
                open_connections: s.open_connections,
                ..Stats::default()
            };
        });
    }

    /// Count and keep the request, and pick its script.
    fn record(&self, request: &Parsed, connection: u64) -> (Option<Compiled>, u64) {
        let mut state = lock(&self.state);
        let path = request.path().to_owned();
        let key = state.scripts.key(&path).map(str::to_owned);
        let cursor = state.cursors.entry(key).or_insert(0);
        let index = *cursor;
        *cursor += 1;
        let script = state.scripts.pick(&path, index).cloned();
        let seq = state.requests.len() as u64;
        state.requests.push(ReceivedRequest {
            seq,
            connection,
            script_index: index,
            method: request.method.clone(),
            target: request.target.clone(),
            headers: request.headers.clone(),
            raw_head: request.raw_head.clone(),
            body: request.body.clone(),
        });
        *state.per_path.entry(path).or_insert(0) += 1;
        // Published while the state lock is held so a waiter that wakes on
        // the counter also sees the request in `requests()`.
        self.stats.send_modify(|s| s.requests += 1);
        (script, seq)
    }

    fn cors_headers(&self) -> Vec<(String, String)> {
        if self.cors {
            vec![
                ("access-control-allow-origin".into(), "*".into()),
                (
                    "access-control-expose-headers".into(),
                    EXPOSE_HEADERS.into(),
                ),
            ]
        } else {
            Vec::new()
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.clone();
    let mut next_id = 0_u64;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let id = next_id;
        next_id += 1;
        shared.stats.send_modify(|s| {
            s.open_connections += 1;
            s.connections_accepted += 1;
        });
        let guard = OpenGuard(Arc::clone(&shared), id);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _guard = guard;
            let mut shutdown = shared.shutdown.clone();
            tokio::select! {
                () = serve_connection(&shared, stream, id) => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
        });
    }
}

/// Decrements the open-connection count when a connection task ends,
/// however it ends, and notes when.
struct OpenGuard(Arc<Shared>, u64);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        lock(&self.0.state)
            .closed
            .insert(self.1, std::time::Instant::now());
        self.0.stats.send_modify(|s| s.open_connections -= 1);
    }
}

/// What to do with the connection after a response.
enum Next {
    /// Read the next request (unless the client asked to close).
    KeepAlive,
    /// Already closed (FIN sent and drained) or broken: just drop it.
    Close,
    /// Close abortively (RST).
    Reset,
}

async fn serve_connection(shared: &Shared, mut stream: TcpStream, id: u64) {
    // Each write should leave as its own segment so chunk boundaries on the
    // wire follow the script.
    let _ = stream.set_nodelay(true);
    let mut buf = BytesMut::with_capacity(8 * 1024);
    loop {
        let Ok(Some(request)) = wire::read_request(&mut stream, &mut buf).await else {
            return;
        };
        let next = if shared.cors && request.method.eq_ignore_ascii_case("OPTIONS") {
            preflight(shared, &mut stream, &request).await
        } else if shared.control && request.path().starts_with(CONTROL_PREFIX) {
            control(shared, &mut stream, &request).await
        } else {
            match shared.record(&request, id) {
                (Some(script), seq) => {
                    respond(shared, &mut stream, &mut buf, &script, &request, seq).await
                }
                (None, _) => no_script(shared, &mut stream, &request).await,
            }
        };
        match next {
            Next::KeepAlive if !request.wants_close => {}
            Next::KeepAlive => {
                wire::fin_and_drain(&mut stream).await;
                return;
            }
            Next::Close => return,
            Next::Reset => {
                wire::rst(stream);
                return;
            }
        }
    }
}

async fn preflight(shared: &Shared, stream: &mut TcpStream, request: &Parsed) -> Next {
    shared.stats.send_modify(|s| s.preflights += 1);
    let allow_headers = request
        .header("access-control-request-headers")
        .and_then(|v| std::str::from_utf8(v).ok())
        .unwrap_or("content-type, authorization, last-event-id")
        .to_owned();
    let headers = vec![
        ("access-control-allow-origin".to_owned(), "*".to_owned()),
        (
            "access-control-allow-methods".to_owned(),
            "GET, POST, OPTIONS".to_owned(),
        ),
        ("access-control-allow-headers".to_owned(), allow_headers),
        ("access-control-max-age".to_owned(), "600".to_owned()),
    ];
    let head = wire::head(204, &Framing::None, &headers);
    sent(wire::send(stream, &head).await)
}

/// Map a write result: a client that went away ends the connection.
fn sent(result: io::Result<()>) -> Next {
    result.map_or(Next::Close, |()| Next::KeepAlive)
}

/// Answer a counted request whose sequence is empty and has no default.
async fn no_script(shared: &Shared, stream: &mut TcpStream, request: &Parsed) -> Next {
    let body = format!("fault-provider: no script for {}\n", request.path());
    let mut headers = shared.cors_headers();
    headers.push(("content-type".into(), "text/plain".into()));
    headers.push(("x-fault-provider".into(), "no-script".into()));
    json_or_text(stream, 500, &headers, body.as_bytes()).await
}

async fn json_or_text(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) -> Next {
    let mut out = wire::head(status, &Framing::Length(body.len() as u64), headers);
    out.extend_from_slice(body);
    sent(wire::send(stream, &out).await)
}

/// Wait for a stall permit. Returns `false` when the client disconnected (or
/// sent garbage) first: the caller then drops the connection.
async fn stall(shared: &Shared, stream: &mut TcpStream, buf: &mut BytesMut) -> bool {
    let gate = Arc::clone(&lock(&shared.gate));
    shared.stats.send_modify(|s| {
        s.stalls_entered += 1;
        s.stalls_waiting += 1;
    });
    let released = loop {
        tokio::select! {
            permit = gate.acquire() => {
                // A closed gate (`release_all`) releases as well.
                if let Ok(permit) = permit {
                    permit.forget();
                }
                break true;
            }
            read = stream.read_buf(buf) => {
                // hyper never pipelines, so any read result while we stall is
                // either EOF/error (client gone) or bytes we keep for later.
                match read {
                    Ok(0) | Err(_) => break false,
                    Ok(_) => {}
                }
            }
        }
    };
    shared.stats.send_modify(|s| s.stalls_waiting -= 1);
    released
}

/// A script's delay: `false` when the client disconnected (or sent
/// garbage) meanwhile, so that the provider notes the hang-up when it
/// happens, not at its next write.
async fn pause(stream: &mut TcpStream, buf: &mut BytesMut, ms: u64) -> bool {
    let sleep = tokio::time::sleep(Duration::from_millis(ms));
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return true,
            read = stream.read_buf(buf) => match read {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            },
        }
    }
}

/// Execute one script on the connection.
async fn respond(
    shared: &Shared,
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    script: &Compiled,
    request: &Parsed,
    seq: u64,
) -> Next {
    match script.ending {
        Ending::ResetBeforeHead => return Next::Reset,
        Ending::FinBeforeHead => {
            wire::fin_and_drain(stream).await;
            return Next::Close;
        }
        Ending::NeverAnswer => {
            if stall(shared, stream, buf).await {
                wire::fin_and_drain(stream).await;
            }
            return Next::Close;
        }
        _ => {}
    }
    let bodyless = wire::bodyless(script.status) || request.method.eq_ignore_ascii_case("HEAD");
    let framing = if wire::bodyless(script.status) {
        Framing::None
    } else if script.ending == Ending::ShortContentLength {
        Framing::Length(script.content_length.unwrap_or(script.body_len + 1))
    } else {
        Framing::for_transfer(
            script.transfer,
            script.content_length.unwrap_or(script.body_len),
        )
    };
    let chunked = matches!(framing, Framing::Chunked);
    let mut headers = shared.cors_headers();
    headers.extend(script.headers.iter().cloned());
    if wire::send(stream, &wire::head(script.status, &framing, &headers))
        .await
        .is_err()
    {
        return Next::Close;
    }
    if !bodyless {
        for piece in &script.pieces {
            if piece.delay_ms > 0 && !pause(stream, buf, piece.delay_ms).await {
                return Next::Close;
            }
            if piece.stall && !stall(shared, stream, buf).await {
                return Next::Close;
            }
            if piece.bytes.is_empty() {
                // An empty chunk would be the terminator: skip it.
                continue;
            }
            let result = if chunked && !piece.raw {
                wire::send(stream, &wire::chunk(&piece.bytes)).await
            } else {
                wire::send(stream, &piece.bytes).await
            };
            if result.is_err() {
                return Next::Close;
            }
            let written = std::time::Instant::now();
            lock(&shared.state)
                .pieces
                .entry(seq)
                .or_default()
                .push(written);
        }
    }
    match script.ending {
        Ending::Clean => {
            if chunked && !bodyless && wire::send(stream, wire::CHUNKED_END).await.is_err() {
                return Next::Close;
            }
            let close_delimited = matches!(framing, Framing::Close);
            let length_mismatch = script.transfer == Transfer::ContentLength
                && script
                    .content_length
                    .is_some_and(|len| len != script.body_len);
            if close_delimited || !script.keep_alive || length_mismatch {
                wire::fin_and_drain(stream).await;
                Next::Close
            } else {
                Next::KeepAlive
            }
        }
        Ending::Rst => Next::Reset,
        Ending::Stall => {
            if stall(shared, stream, buf).await {
                wire::fin_and_drain(stream).await;
            }
            Next::Close
        }
        Ending::Fin
        | Ending::ShortContentLength
        | Ending::ResetBeforeHead
        | Ending::FinBeforeHead
        | Ending::NeverAnswer => {
            wire::fin_and_drain(stream).await;
            Next::Close
        }
    }
}

/// The `/__fault/` endpoint, so JS tests can script and inspect the
/// standalone provider without restarting it.
async fn control(shared: &Shared, stream: &mut TcpStream, request: &Parsed) -> Next {
    let route = request.path().trim_start_matches(CONTROL_PREFIX);
    let query = request.target.split_once('?').map_or("", |(_, q)| q);
    let method = request.method.to_ascii_uppercase();
    let (status, body) = match (method.as_str(), route) {
        ("GET", "count" | "stats") => (200, count_json(shared)),
        ("GET", "requests") => (200, requests_json(shared)),
        ("GET", "wait") => {
            // Long-poll until the counters reach the asked values, so JS tests
            // synchronise on server facts instead of sleeping.
            let want = |key: &str| {
                query
                    .split('&')
                    .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
                    .and_then(|n| n.parse::<u64>().ok())
            };
            let (requests, stalls) = (want("requests").unwrap_or(0), want("stalls").unwrap_or(0));
            // `waiting=N`: until at most N stall points are waiting, e.g. 0
            // once the client closed the connection a stall held open.
            let waiting = want("waiting").unwrap_or(u64::MAX);
            let mut rx = shared.stats.subscribe();
            let _ = rx
                .wait_for(|s| {
                    s.requests >= requests
                        && s.stalls_entered >= stalls
                        && s.stalls_waiting <= waiting
                })
                .await;
            (200, count_json(shared))
        }
        ("POST", "reset") => {
            shared.reset();
            (200, serde_json::json!({"ok": true}))
        }
        ("POST", "script") => {
            // `?merge` adds per-path sequences without touching the others or
            // the counters, so concurrent JS tests on distinct paths can each
            // script their own path on one shared server.
            let merge = query.split('&').any(|p| p == "merge");
            match std::str::from_utf8(&request.body)
                .map_err(|e| e.to_string())
                .and_then(|text| ScriptSet::from_json(text).map_err(|e| e.0))
                .and_then(|set| {
                    if merge {
                        shared.merge_paths(&set)
                    } else {
                        shared.set_scripts(&set)
                    }
                    .map_err(|e| e.0)
                }) {
                Ok(()) => {
                    if !merge {
                        shared.reset();
                    }
                    (200, serde_json::json!({"ok": true}))
                }
                Err(error) => (400, serde_json::json!({"ok": false, "error": error})),
            }
        }
        ("POST", "release") => {
            let gate = Arc::clone(&lock(&shared.gate));
            if query.split('&').any(|p| p == "all") {
                gate.close();
            } else {
                let n = query
                    .split('&')
                    .find_map(|p| p.strip_prefix("n="))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(1);
                gate.add_permits(n);
            }
            (200, serde_json::json!({"ok": true}))
        }
        _ => (
            404,
            serde_json::json!({"ok": false, "error": format!("no control route {method} {route}")}),
        ),
    };
    let mut headers = shared.cors_headers();
    headers.push(("content-type".into(), "application/json".into()));
    headers.push(("cache-control".into(), "no-store".into()));
    json_or_text(stream, status, &headers, body.to_string().as_bytes()).await
}

fn count_json(shared: &Shared) -> serde_json::Value {
    let stats = *shared.stats.borrow();
    let paths = lock(&shared.state).per_path.clone();
    serde_json::json!({
        "requests": stats.requests,
        "paths": paths,
        "open_connections": stats.open_connections,
        "connections_accepted": stats.connections_accepted,
        "stalls_entered": stats.stalls_entered,
        "stalls_waiting": stats.stalls_waiting,
        "preflights": stats.preflights,
    })
}

fn requests_json(shared: &Shared) -> serde_json::Value {
    let state = lock(&shared.state);
    let list: Vec<serde_json::Value> = state
        .requests
        .iter()
        .map(|r| {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            let ms = |at: &std::time::Instant| {
                at.saturating_duration_since(shared.started).as_secs_f64() * 1000.0
            };
            serde_json::json!({
                "seq": r.seq,
                "connection": r.connection,
                "pieces_at_ms": state.pieces.get(&r.seq).map_or_else(Vec::new, |p| p.iter().map(ms).collect()),
                "closed_at_ms": state.closed.get(&r.connection).map(ms),
                "script_index": r.script_index,
                "method": r.method,
                "target": r.target,
                "headers": headers,
                "body": String::from_utf8_lossy(&r.body),
                "body_len": r.body.len(),
            })
        })
        .collect();
    serde_json::Value::Array(list)
}
