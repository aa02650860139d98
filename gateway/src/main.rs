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
#![deny(unsafe_code, missing_docs)]

use std::io::Write as _;
use std::process::ExitCode;

use recovery_gateway::config::{self, Command, HELP, USAGE};
use recovery_gateway::{Gateway, ShutdownHandle};

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
        Err(e) => {
            eprintln!("recovery-gateway: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("recovery-gateway: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async move {
        let gateway = match Gateway::bind(*config).await {
            Ok(g) => g,
            Err(e) => {
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
    })
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
