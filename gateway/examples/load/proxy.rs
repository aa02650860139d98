//! The proxy processes the load example drives: the gateway, and the bare
//! hyper proxy it is read against.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// A proxy process of this run: the gateway, or the bare hyper proxy.
pub(super) struct Proxy {
    child: tokio::process::Child,
    pub(super) pid: u32,
    pub(super) addr: String,
}

impl Proxy {
    /// Starts `program` on `127.0.0.1:0` in front of `upstream`, with room
    /// for `held` streams and `extra` arguments, and waits for its
    /// `listening` line.
    pub(super) async fn start(
        program: &std::path::Path,
        upstream: &str,
        held: usize,
        extra: &[&str],
    ) -> Proxy {
        let mut child = Command::new(program)
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .args(["--max-streams", &(held * 2 + 100).to_string()])
            .args(extra)
            .env_remove("RECOVERY_GATEWAY_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        let pid = child.id().expect("pid");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("the proxy starts")
            .expect("stdout")
            .unwrap_or_default();
        let addr = first
            .strip_prefix("listening http://")
            .unwrap_or_else(|| panic!("first line {first:?}"))
            .trim()
            .to_owned();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Proxy { child, pid, addr }
    }

    /// SIGTERM, then at most 20 s for the process to end.
    pub(super) async fn stop(mut self) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await;
        tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .ok()
            .and_then(Result::ok)
    }
}
