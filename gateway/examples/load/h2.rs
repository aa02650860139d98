//! Held streams through a gateway whose upstream speaks HTTP/2 (prior
//! knowledge, `http2 = true`): every stream upstream shares one
//! connection, so a held stream costs the gateway its downstream
//! connection and the recovery state only.
//!
//! The upstream is a loopback HTTP/2-only server in this process: each
//! answer sends its head, the role chunk and the first token, holds until
//! released, then sends the rest of the fixture.

use std::convert::Infallible;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::sync::watch;

use super::{CHAT, FIXTURE, Holding, Proxy, event_ends, rss_kib};

/// An answer body: `first`, then (once released) `rest`.
struct Held {
    first: Option<Bytes>,
    rest: Option<Bytes>,
    released: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if self.rest.is_none() {
            return Poll::Ready(None);
        }
        if self.released.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready(self.rest.take().map(|rest| Ok(Frame::data(rest))))
    }
}

/// The HTTP/2 upstream: its URL, its release switch and the connections
/// it accepted.
async fn upstream() -> (String, watch::Sender<bool>, Arc<AtomicUsize>) {
    let full = Bytes::from(
        std::fs::read(recovery_tests::fault::default_fixtures_dir().join(FIXTURE))
            .expect("the fixture"),
    );
    let first_token = event_ends(&full)[1];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (release, released) = watch::channel(false);
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            let (full, released) = (full.clone(), released.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let mut released = released.clone();
                    let body = Held {
                        first: Some(full.slice(..first_token)),
                        rest: Some(full.slice(first_token..)),
                        released: Box::pin(async move {
                            let _ = released.wait_for(|r| *r).await;
                        }),
                    };
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "text/event-stream")
                                .body(body)
                                .expect("response"),
                        )
                    }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .max_concurrent_streams(None)
                    .serve_connection(TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    (url, release, connections)
}

/// Streams through the gateway before its memory is measured.
const WARM_UP: usize = 64;

/// Holds `held` streams through a gateway started from `binary` in front
/// of the HTTP/2 upstream, and prints its memory per held stream.
pub(super) async fn held(binary: &Path, held: usize) -> bool {
    let (url, release, connections) = upstream().await;
    let dir = std::env::temp_dir().join(format!("recovery-load-h2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = dir.join("gateway.toml");
    std::fs::write(&config, "http2 = true\n").expect("config");
    let config_arg = config.display().to_string();
    let gateway = Proxy::start(binary, &url, held, &["--config", &config_arg]).await;
    let (pid, addr) = (gateway.pid, gateway.addr.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Warm the gateway first, as phases 1 and 2 warm the one of phase 3:
    // 64 streams at once (the throughput phases' clients), held, released
    // and finished. What a process pays once (the runtime's and the
    // allocator's first pages, the upstream connection) is then not
    // counted per stream; it is printed apart.
    let idle = rss_kib(pid);
    let warm = Holding::open(&addr, CHAT, WARM_UP).await;
    let _ = release.send(true);
    let (warmed, _) = warm.finish().await;
    let _ = release.send(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let holding = Holding::open(&addr, CHAT, held).await;
    let (held_now, opened_in) = (holding.held, holding.opened_in);
    let during = rss_kib(pid);
    let _ = release.send(true);
    let (finished, _) = holding.finish().await;
    println!(
        "  held at once: {held_now} of {held} (first token on every one within {:.2} s); upstream connections: {}",
        opened_in.as_secs_f64(),
        connections.load(Ordering::Relaxed)
    );
    println!(
        "  gateway VmRSS: idle at start {idle} KiB, after {warmed} streams to warm it {before} KiB, while held {during} KiB"
    );
    println!(
        "  memory per held stream: {:.1} KiB ({:.1} MiB for {held_now})",
        during.saturating_sub(before) as f64 / held_now.max(1) as f64,
        during.saturating_sub(before) as f64 / 1024.0
    );
    println!(
        "  from the idle start instead: {:.1} KiB per held stream",
        during.saturating_sub(idle) as f64 / held_now.max(1) as f64
    );
    println!("  finished after release: {finished} of {held}");
    gateway.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    warmed == WARM_UP && held_now == held && finished == held
}
