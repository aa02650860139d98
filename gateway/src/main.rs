//! `recovery-gateway`: a recovering gateway in front of LLM providers.
//!
//! ```sh
//! recovery-gateway --upstream https://api.openai.com
//! ```
//!
//! The first line on stdout is `listening http://IP:PORT`; structured JSON
//! log lines follow on stderr. Exit status: 0 after a graceful shutdown
//! (SIGTERM or SIGINT), 1 when it cannot start, 2 on bad usage or
//! configuration (one line on stderr).
//!
//! `recovery-gateway hash-key [--name NAME]` reads a client key on stdin and
//! prints its `[[clients]]` entry.
#![deny(unsafe_code, missing_docs)]

use std::io::Write as _;
use std::process::ExitCode;

use recovery_gateway::auth::{MIN_CLIENT_KEY_LEN, client_entry};
use recovery_gateway::config::{self, Command, HELP, USAGE};
use recovery_gateway::{Gateway, ShutdownHandle};

/// How long the exit waits for queued log lines at most.
const LOG_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

/// jemalloc's per-thread caches: a stream's many small, short allocations
/// (heads, events, the recovery state), made and freed on both runtime
/// workers, cost the gateway about a fifth of its CPU under glibc's
/// allocator, and mimalloc held 20 KiB more per held stream.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let command = config::parse(std::env::args().skip(1), |k| std::env::var(k).ok());
    let config = match command {
        Ok(Command::Run(c)) => c,
        Ok(Command::Help) => {
            println!("{USAGE}\n{HELP}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::Version) => {
            println!("recovery-gateway {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(Command::HashKey { name }) => return hash_key(&name),
        Err(e) => {
            eprintln!("recovery-gateway: {e}");
            return ExitCode::from(2);
        }
    };
    // The gateway's first serving thread is this one; `Gateway::bind`
    // starts the others (`threads`), each with a runtime like this.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("recovery-gateway: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    #[cfg(feature = "otel")]
    let telemetry = match &config.otlp_endpoint {
        Some(endpoint) => {
            match runtime
                .block_on(async { recovery_gateway::telemetry::Telemetry::install(endpoint) })
            {
                Ok(t) => Some(t),
                Err(e) => {
                    eprintln!("recovery-gateway: {e}");
                    return ExitCode::from(1);
                }
            }
        }
        None => None,
    };
    let code = runtime.block_on(async move {
        let code = serve(*config).await;
        // What the exporters still hold goes out before the process ends:
        // their last exports run on this runtime while it waits.
        #[cfg(feature = "otel")]
        if let Some(telemetry) = telemetry {
            let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
        }
        code
    });
    // The log lines still queued (the shutdown's among them) are written
    // before the process ends, unless standard error is not read.
    recovery_gateway::logs::flush(LOG_FLUSH);
    code
}

/// Serves until a signal's graceful shutdown ended.
async fn serve(config: recovery_gateway::Config) -> ExitCode {
    let gateway = match Gateway::bind(config).await {
        Ok(g) => g,
        Err(e) => {
            // What was logged on the way comes first.
            recovery_gateway::logs::flush(LOG_FLUSH);
            eprintln!("recovery-gateway: {e}");
            return ExitCode::from(1);
        }
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening http://{}", gateway.local_addr());
        let _ = out.flush();
    }
    if let Err(e) = on_signals(gateway.shutdown_handle()) {
        eprintln!("recovery-gateway: cannot listen for signals: {e}");
        gateway.shutdown().await;
        return ExitCode::from(1);
    }
    gateway.wait().await;
    ExitCode::SUCCESS
}

/// `hash-key`: one client key on stdin (its line end dropped), its
/// `[[clients]]` entry on stdout. Exit 2 for a key that is empty or short.
fn hash_key(name: &str) -> ExitCode {
    let mut key = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut key) {
        eprintln!("recovery-gateway: hash-key: cannot read the key on stdin: {e}");
        return ExitCode::from(2);
    }
    let key = key.trim_end_matches(['\r', '\n']);
    if key.len() < MIN_CLIENT_KEY_LEN {
        eprintln!(
            "recovery-gateway: hash-key: a client key must be at least {MIN_CLIENT_KEY_LEN} bytes (e.g. `openssl rand -hex 24`)"
        );
        return ExitCode::from(2);
    }
    print!("{}", client_entry(name, key));
    ExitCode::SUCCESS
}

/// Starts the graceful shutdown on SIGTERM or SIGINT.
fn on_signals(handle: ShutdownHandle) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            handle.shutdown();
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            handle.shutdown();
        }
    });
    Ok(())
}
