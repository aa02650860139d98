//! Standalone loopback fault provider for the wasm and JS tests.
//!
//! `fault-provider --port N --script FILE [--fixtures DIR]`. With `--port 0`
//! the first stdout line is `listening http://127.0.0.1:PORT`, which a harness
//! reads to bake the URL into the wasm tests (scripts/test-wasm.sh). CORS is on
//! and the `/__fault/` control endpoint is served, so browser tests can load
//! scripts, read counters and release stalls without restarting the process.
//! It runs until killed.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use recovery_tests::fault::{FaultProvider, Options, ScriptSet, default_fixtures_dir};

const USAGE: &str = "usage: fault-provider [--port N] [--script FILE] [--fixtures DIR]\n\
    \n  --port N        port on 127.0.0.1 (default 0: pick a free one)\
    \n  --script FILE   JSON script set (object or array of scripts); default: none\
    \n  --fixtures DIR  where fixture writes are read (default: the crate's tests/fixtures)\
    \n\nControl: GET /__fault/count, GET /__fault/requests, POST /__fault/reset,\
    \n         POST /__fault/script (body: script JSON), POST /__fault/release[?n=N|?all],\
    \n         GET /__fault/wait?requests=N&stalls=N&waiting=N (long-poll)";

struct Args {
    port: u16,
    script: Option<PathBuf>,
    fixtures: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        port: 0,
        script: None,
        fixtures: default_fixtures_dir(),
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let mut value = || iter.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--port" => {
                let text = value()?;
                args.port = text.parse().map_err(|_| format!("bad port {text:?}"))?;
            }
            "--script" => args.script = Some(PathBuf::from(value()?)),
            "--fixtures" => args.fixtures = PathBuf::from(value()?),
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            if !message.is_empty() {
                eprintln!("fault-provider: {message}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let scripts = match &args.script {
        None => ScriptSet::default(),
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| ScriptSet::from_json(&text).map_err(|e| e.to_string()))
        {
            Ok(set) => set,
            Err(error) => {
                eprintln!("fault-provider: {}: {error}", path.display());
                return ExitCode::from(2);
            }
        },
    };
    let options = Options {
        scripts,
        fixtures_dir: args.fixtures,
        cors: true,
        control: true,
        port: args.port,
    };
    let provider = match FaultProvider::start_with(options).await {
        Ok(provider) => provider,
        Err(error) => {
            eprintln!("fault-provider: {error}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "listening {}", provider.base_url());
    let _ = stdout.flush();
    drop(stdout);
    std::future::pending::<()>().await;
    ExitCode::SUCCESS
}
