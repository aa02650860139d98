//! Starting a proxy process and learning its address: the gateway binary
//! (and the load example's bare proxy) print `listening http://ADDR` as
//! their first line on stdout once bound.
//!
//! Shared by the socket tests (`support`) and the load example, which
//! includes this file by path.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Spawns `command` (stdout piped, stdin closed, killed on drop), waits at
/// most `limit` for its `listening` line and returns the child and the
/// address it names. Its later stdout is read and dropped so it never
/// blocks on a full pipe; its stderr is as `command` set it.
pub async fn listening(mut command: Command, limit: Duration) -> Result<(Child, String), String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("start: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(limit, lines.next_line())
        .await
        .map_err(|_| format!("no listening line within {limit:?}"))?
        .map_err(|e| format!("stdout: {e}"))?
        .unwrap_or_default();
    let addr = first
        .strip_prefix("listening http://")
        .ok_or_else(|| format!("first line {first:?}"))?
        .trim()
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, addr))
}
