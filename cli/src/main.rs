//! `recover`: a curl-like client that keeps a streamed response whole.
//!
//! ```sh
//! cargo install --path cli
//! echo '{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"Hi"}]}' |
//!   recover --protocol openai-chat \
//!     --header "authorization: Bearer $OPENAI_API_KEY" \
//!     --events events.jsonl --report report.json \
//!     https://api.openai.com/v1/chat/completions
//! ```
//!
//! The JSON request body comes from stdin and is POSTed to URL through
//! `RecoveryLayer` and `ObserveLayer`; the delivered body bytes go to stdout
//! as they arrive; lifecycle events go to `--events` as JSON lines and the
//! final report to `--report` as JSON (also after a failure or Ctrl-C).
//! When stderr is a terminal, a status line says what recovery is doing
//! while the answer is not flowing.
//!
//! Exit status: 0 when the stream completed with terminal proof, 1 when
//! recovery failed (the report says how), 2 on a usage error, 130 on Ctrl-C.

use std::fs::File;
use std::io::{self, Write as _};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Request};
use http_body_util::Full;
use recovery_cli::args::{self, Command, RecoverArgs, USAGE, UsageError};
use recovery_cli::client::{Exchange, exchange, https_client};
use recovery_cli::show;
use recovery_cli::status::Painter;
use recovery_core::lifecycle::LifecycleEvent;
use recovery_core::report::RecoveryReport;
use recovery_core::{Cancellation, RecoveryCall, RecoveryPolicy};
use tokio::io::AsyncReadExt as _;
use tower_layer::Layer as _;
use tower_recovery::{ObserveLayer, RecoveryLayer};

const USAGE_ERROR: u8 = 2;
const FAILED: u8 = 1;
const INTERRUPTED: u8 = 130;

fn main() -> ExitCode {
    let args = match args::parse(std::env::args_os().skip(1)) {
        Ok(Command::Run(args)) => args,
        Ok(Command::Help) => {
            println!("{USAGE}{}", args::help());
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("recover {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => return usage_error(&e),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("recover: cannot start the runtime: {e}");
            return ExitCode::from(FAILED);
        }
    };
    ExitCode::from(runtime.block_on(run(args)))
}

fn usage_error(e: &UsageError) -> ExitCode {
    eprintln!("recover: {e}");
    eprintln!("{USAGE}");
    ExitCode::from(USAGE_ERROR)
}

fn create(flag: &str, path: &Path) -> Result<File, UsageError> {
    File::create(path)
        .map_err(|e| UsageError(format!("cannot write {flag} {}: {e}", path.display())))
}

/// Raises `cancel` on the first Ctrl-C; a second one ends the process.
fn on_interrupt(cancel: Cancellation) -> io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigint = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            sigint.recv().await;
            cancel.cancel();
            sigint.recv().await;
            std::process::exit(i32::from(INTERRUPTED));
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(i32::from(INTERRUPTED));
        }
    });
    Ok(())
}

async fn read_body(cancel: &Cancellation) -> Result<Option<Vec<u8>>, UsageError> {
    let mut body = Vec::new();
    let read = async { tokio::io::stdin().read_to_end(&mut body).await };
    tokio::select! {
        biased;
        () = cancel.cancelled() => return Ok(None),
        r = read => r.map_err(|e| UsageError(format!("cannot read the request body from stdin: {e}")))?,
    };
    if !body.iter().all(u8::is_ascii_whitespace)
        && let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body)
    {
        return Err(UsageError(format!(
            "the request body on stdin is not JSON: {e}"
        )));
    }
    Ok(Some(body))
}

async fn run(args: Box<RecoverArgs>) -> u8 {
    let cancel = Cancellation::new();
    if let Err(e) = on_interrupt(cancel.clone()) {
        eprintln!("recover: cannot listen for Ctrl-C: {e}");
        return FAILED;
    }
    let (policy, events, report_file) = match outputs(&args) {
        Ok(p) => p,
        Err(e) => {
            usage_error(&e);
            return USAGE_ERROR;
        }
    };
    let body = match read_body(&cancel).await {
        Ok(Some(body)) => body,
        Ok(None) => {
            eprintln!("recover: interrupted before the request was sent");
            return INTERRUPTED;
        }
        Err(e) => {
            usage_error(&e);
            return USAGE_ERROR;
        }
    };

    let log = EventLog::new(events);
    let painter = Arc::new(Mutex::new(Painter::for_stderr()));
    let ticker = tokio::spawn(count_down(Arc::clone(&painter)));
    let mut svc = RecoveryLayer::new(policy)
        .with_resumable_sse(args.resumable_sse)
        .on_event(observer(Arc::clone(&painter), log.clone()))
        .layer(ObserveLayer::new(args.protocol.clone()).layer(https_client()));
    let request = match request(&args, body, &cancel) {
        Ok(r) => r,
        Err(e) => {
            usage_error(&e);
            return USAGE_ERROR;
        }
    };

    let stdout = io::stdout();
    let result = exchange(&mut svc, request, &cancel, |chunk| {
        lock(&painter).before_output(chunk, &mut io::stderr());
        let mut out = stdout.lock();
        out.write_all(chunk)?;
        out.flush()
    })
    .await;
    drop(svc);
    ticker.abort();
    lock(&painter).clear(&mut io::stderr());

    let code = exit_code(&result);
    written(code, report_file, &result.report, &log)
}

/// The policy and the files `--events` and `--report` name, created
/// before anything is read or sent so that a bad flag costs no request.
fn outputs(args: &RecoverArgs) -> Result<(RecoveryPolicy, Option<File>, Option<File>), UsageError> {
    let policy = args.policy()?;
    let events = args
        .events
        .as_deref()
        .map(|p| create("--events", p))
        .transpose()?;
    let report = args
        .report
        .as_deref()
        .map(|p| create("--report", p))
        .transpose()?;
    Ok((policy, events, report))
}

/// The mutex's value, also after a panic elsewhere: the status line and
/// the event file stay usable to the end of the run.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `--events` file, shared with the layer's observer, and the first
/// error writing to it, which the exit status reports once the run ends.
#[derive(Clone)]
struct EventLog {
    file: Option<Arc<Mutex<File>>>,
    error: Arc<Mutex<Option<io::Error>>>,
}

impl EventLog {
    fn new(file: Option<File>) -> Self {
        EventLog {
            file: file.map(|f| Arc::new(Mutex::new(f))),
            error: Arc::default(),
        }
    }

    /// Appends `event` as one JSON line; a failure is kept, not shown
    /// mid-stream.
    fn write(&self, event: &LifecycleEvent) {
        let Some(file) = &self.file else { return };
        let line = match serde_json::to_string(event) {
            Ok(mut line) => {
                line.push('\n');
                line
            }
            Err(e) => {
                self.keep_error(io::Error::other(e));
                return;
            }
        };
        let mut file = lock(file);
        if let Err(e) = file.write_all(line.as_bytes()).and_then(|()| file.flush()) {
            self.keep_error(e);
        }
    }

    fn keep_error(&self, e: io::Error) {
        lock(&self.error).get_or_insert(e);
    }

    fn take_error(&self) -> Option<io::Error> {
        lock(&self.error).take()
    }
}

/// The layer's observer: every event moves the status line and goes to
/// the event log.
fn observer(
    painter: Arc<Mutex<Painter>>,
    log: EventLog,
) -> impl Fn(&LifecycleEvent) + Send + Sync + 'static {
    move |event: &LifecycleEvent| {
        lock(&painter).on_event(event, &mut io::stderr());
        log.write(event);
    }
}

/// The POST of `body` to the URL with the given headers (JSON unless a
/// content type is given), cancelled by `cancel`.
fn request(
    args: &RecoverArgs,
    body: Vec<u8>,
    cancel: &Cancellation,
) -> Result<Request<Full<Bytes>>, UsageError> {
    let mut builder = Request::post(args.url.clone());
    let has_content_type = args.headers.iter().any(|(name, _)| name == CONTENT_TYPE);
    if !has_content_type {
        builder = builder.header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    for (name, value) in &args.headers {
        builder = builder.header(name, value);
    }
    let mut request = builder
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| UsageError(format!("cannot build the request: {e}")))?;
    request
        .extensions_mut()
        .insert(RecoveryCall::new().with_cancellation(cancel.clone()));
    Ok(request)
}

/// The exit status the exchange earns, its reason said on stderr when it
/// did not complete.
fn exit_code(result: &Exchange) -> u8 {
    if result.cancelled {
        eprintln!(
            "recover: interrupted; {}",
            result
                .report
                .outcome
                .as_ref()
                .map_or_else(|| String::from("no outcome recorded"), ToString::to_string)
        );
        INTERRUPTED
    } else if let Some(e) = &result.sink_error {
        eprintln!("recover: cannot write the body to stdout: {e}");
        FAILED
    } else if result.completed() {
        0
    } else {
        eprintln!("recover: {}", show::failure_line(&result.report));
        FAILED
    }
}

/// `code` once the report is written to `--report` and the event log's
/// error is read: a run that succeeded fails when either was lost.
fn written(mut code: u8, report_file: Option<File>, report: &RecoveryReport, log: &EventLog) -> u8 {
    if let Some(file) = report_file
        && let Err(e) = write_report(file, report)
    {
        eprintln!("recover: cannot write the report: {e}");
        if code == 0 {
            code = FAILED;
        }
    }
    if let Some(e) = log.take_error() {
        eprintln!("recover: cannot write the events: {e}");
        if code == 0 {
            code = FAILED;
        }
    }
    code
}

/// `report` as pretty JSON and a newline.
fn write_report(mut file: File, report: &RecoveryReport) -> io::Result<()> {
    let mut json = serde_json::to_vec_pretty(report).map_err(io::Error::other)?;
    json.push(b'\n');
    file.write_all(&json)?;
    file.flush()
}

/// Moves the countdown of a scheduled retry on the status line.
async fn count_down(painter: Arc<Mutex<Painter>>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        tick.tick().await;
        let mut p = lock(&painter);
        if p.counting_down() {
            p.redraw(std::time::Instant::now(), &mut io::stderr());
        }
    }
}
