//! The proxy processes the load example drives: the gateway, and the bare
//! hyper proxy it is read against.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use super::listening::listening;

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
        let mut command = Command::new(program);
        command
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .args(["--max-streams", &(held * 2 + 100).to_string()])
            .args(extra)
            .env_remove("RECOVERY_GATEWAY_CONFIG")
            .stderr(Stdio::null());
        let (child, addr) = listening(command, Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", program.display()));
        let pid = child.id().expect("pid");
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
