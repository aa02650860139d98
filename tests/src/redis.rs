//! A real `redis-server` for the tests that share state through Redis (the
//! fleet stores, the gateway's stream log): a child process on a unix
//! socket in a temporary directory, never a TCP port, killed on drop.
//! `scripts/test.sh` installs Debian's `redis-server` when it is missing.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A directory removed on drop, where one Redis keeps its socket.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory named after `what`, this process and a counter.
    pub fn new(what: &str) -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "recovery-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The socket a Redis of this directory listens on.
    pub fn socket(&self) -> PathBuf {
        self.0.join("redis.sock")
    }

    /// The URL of that socket.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `redis-server` child on its directory's socket, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    socket: PathBuf,
}

impl RedisServer {
    /// Starts one on `dir`'s socket and waits (at most 10 s) until it
    /// answers.
    pub fn start(dir: &TempDir) -> Self {
        Self::start_with(dir, &[])
    }

    /// The same with `extra` arguments (`--requirepass`, say).
    pub fn start_with(dir: &TempDir, extra: &[&str]) -> Self {
        let socket = dir.socket();
        let _ = std::fs::remove_file(&socket);
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args([
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(dir.path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)");
        let server = RedisServer {
            child: Some(child),
            socket,
        };
        let until = Instant::now() + Duration::from_secs(10);
        while !server.answers() {
            assert!(
                Instant::now() < until,
                "redis-server did not answer in 10 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    /// Whether it answers a `PING` (`+PONG`, or `-NOAUTH` when it wants a
    /// password: it is up either way).
    pub fn answers(&self) -> bool {
        let Ok(mut s) = UnixStream::connect(&self.socket) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut first = [0u8; 1];
        s.write_all(b"PING\r\n").is_ok()
            && s.read_exact(&mut first).is_ok()
            && matches!(first[0], b'+' | b'-')
    }

    /// The URL of its socket.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket.display())
    }

    /// Sends `signal` (`STOP`, `CONT`) to it: a stopped Redis still accepts
    /// connections (the kernel queues them) but answers nothing.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Kills it, as a crash would (a stopped one too).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
