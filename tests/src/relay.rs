//! A loopback TCP relay whose connections can go silent: from a moment on
//! they pass no byte either way while staying open, with no FIN and no RST,
//! as when a NAT or a load balancer forgets a flow. Connections opened
//! after that moment pass bytes again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// A relay from `127.0.0.1:<port>` to an upstream address.
#[derive(Debug)]
pub struct SilentRelay {
    url: String,
    connections: Arc<AtomicUsize>,
    silenced: Arc<Mutex<Vec<Arc<AtomicBool>>>>,
}

impl SilentRelay {
    /// Starts a relay to `upstream` (`host:port`) on a port of its own.
    pub async fn start(upstream: String) -> std::io::Result<SilentRelay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let connections = Arc::new(AtomicUsize::new(0));
        let silenced: Arc<Mutex<Vec<Arc<AtomicBool>>>> = Arc::default();
        let (counted, flags) = (Arc::clone(&connections), Arc::clone(&silenced));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let flag = Arc::new(AtomicBool::new(false));
                flags
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(Arc::clone(&flag));
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pass(client_read, server_write, Arc::clone(&flag)));
                tokio::spawn(pass(server_read, client_write, flag));
            }
        });
        Ok(SilentRelay {
            url,
            connections,
            silenced,
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Every connection open now passes nothing more, either way.
    pub fn go_silent(&self) {
        for flag in self
            .silenced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            flag.store(true, Ordering::SeqCst);
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either closes, dropping what it reads once
/// `silent` is set.
async fn pass(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, silent: Arc<AtomicBool>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) if silent.load(Ordering::SeqCst) => {}
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}
