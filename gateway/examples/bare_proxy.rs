//! The floor the load figures are read against: a reverse proxy with
//! nothing but hyper in it, started the way the gateway is.
//!
//! ```sh
//! target/release/examples/bare_proxy --listen 127.0.0.1:0 --upstream http://127.0.0.1:PORT
//! ```
//!
//! It prints `listening http://ADDR` and forwards every request, head and
//! body as they come, to the same path on the upstream, through one pooled
//! HTTP/1.1 client, and the answer back as it comes: no recovery, no
//! reframing, no log, no authentication, no bounds. It is served as the
//! gateway's binary serves: a thread per core, each with a single-threaded
//! runtime, a listening socket of its own on the one port (`SO_REUSEPORT`)
//! and a client (a connection pool) of its own. The `load`
//! example drives it beside the gateway, so that what a stream costs through
//! the gateway splits into what any hyper proxy pays on the machine (two
//! connections, two HTTP/1.1 exchanges, the kernel's wake-ups between three
//! processes) and what the gateway adds above it.
//!
//! Arguments it does not know (the gateway's) are skipped with their value;
//! SIGTERM ends it.
//! Not a product: a measuring stick.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::Uri;
use http_body_util::BodyExt;
use http_body_util::combinators::BoxBody;
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Body = BoxBody<Bytes, hyper::Error>;

fn main() -> std::process::ExitCode {
    let mut listen = "127.0.0.1:0".to_owned();
    let mut upstream = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        match (flag.as_str(), value) {
            ("--listen", Some(v)) => listen = v,
            ("--upstream", Some(v)) => upstream = Some(v),
            (_, Some(_)) => {}
            (flag, None) => {
                eprintln!("bare_proxy: {flag} needs a value");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let Some(upstream) = upstream.and_then(|u| u.trim_end_matches('/').parse::<Uri>().ok()) else {
        eprintln!("usage: bare_proxy --listen ADDR --upstream http://HOST:PORT");
        return std::process::ExitCode::from(2);
    };
    let Ok(listen) = listen.parse::<SocketAddr>() else {
        eprintln!("bare_proxy: --listen takes an address, e.g. 127.0.0.1:0");
        return std::process::ExitCode::from(2);
    };
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    runtime().block_on(serve(listen, upstream, threads))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn serve(listen: SocketAddr, upstream: Uri, threads: usize) -> std::process::ExitCode {
    let mut addr = listen;
    let mut listeners = Vec::new();
    for _ in 0..threads {
        match reuse_port(addr) {
            Ok(l) => {
                addr = l.local_addr().expect("local address");
                listeners.push(l);
            }
            Err(e) => {
                eprintln!("bare_proxy: bind {addr}: {e}");
                return std::process::ExitCode::from(1);
            }
        }
    }
    println!("listening http://{addr}");
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("bare_proxy: SIGTERM: {e}");
                return std::process::ExitCode::from(1);
            }
        };
    let first = listeners.remove(0);
    for listener in listeners {
        let upstream = upstream.clone();
        std::thread::spawn(move || runtime().block_on(accept(listener, upstream)));
    }
    tokio::select! {
        _ = terminate.recv() => std::process::ExitCode::SUCCESS,
        () = accept(first, upstream) => std::process::ExitCode::SUCCESS,
    }
}

/// A listening socket on `addr` that shares its port with the others.
fn reuse_port(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseport(true)?;
    socket.bind(addr)?;
    socket.listen(1024)?.into_std()
}

/// Serves the connections of `listener` on this thread's runtime, through
/// a pool of its own.
async fn accept(listener: std::net::TcpListener, upstream: Uri) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("a listener");
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let Ok((socket, _)) = listener.accept().await else {
            continue;
        };
        let _ = socket.set_nodelay(true);
        let client = client.clone();
        let upstream = upstream.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| forward(client.clone(), upstream.clone(), req));
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: Uri,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (mut head, body) = req.into_parts();
    let path = head
        .uri
        .path_and_query()
        .map_or("/", http::uri::PathAndQuery::as_str);
    let mut parts = upstream.into_parts();
    parts.path_and_query = path.parse().ok();
    let Ok(uri) = Uri::from_parts(parts) else {
        return Ok(status(400));
    };
    head.uri = uri;
    head.headers.remove(http::header::HOST);
    match client.request(Request::from_parts(head, body)).await {
        Ok(response) => Ok(response.map(BodyExt::boxed)),
        Err(_) => Ok(status(502)),
    }
}

fn status(code: u16) -> Response<Body> {
    let mut response = Response::new(
        http_body_util::Empty::new()
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = http::StatusCode::from_u16(code).expect("a status code");
    response
}
