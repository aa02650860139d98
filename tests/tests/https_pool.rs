//! `tower_recovery::https`'s pools close a connection idle past
//! `POOL_IDLE_TIMEOUT` by a timer, with no further request to its origin
//! (hyper-util without a timer would close it only at the next send there).
//!
//! The client runs on tokio's paused clock, so the idle timeout passes in
//! virtual time; the server runs on a thread and a clock of its own (a
//! paused runtime auto-advances while it waits on sockets: no timer of the
//! client's is armed across the request's I/O).

use std::convert::Infallible;
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tower_recovery::ReplayBody;
use tower_recovery::https::{POOL_IDLE_TIMEOUT, client};
use tower_service::Service;

/// An HTTP/1.1 server on its own thread answering `ok`: its address, and
/// a channel that says when a connection closed.
fn server() -> (String, mpsc::Receiver<()>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (closed, closes) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            while let Ok((socket, _)) = listener.accept().await {
                let closed = closed.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|_req| async {
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                            b"ok\n",
                        ))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(socket), service)
                        .await;
                    let _ = closed.send(());
                });
            }
        });
    });
    (url, closes)
}

#[tokio::test(start_paused = true)]
async fn an_idle_pooled_connection_is_closed_after_the_idle_timeout_with_no_request_after_it() {
    let (url, closes) = server();
    let mut client = client();
    let req = Request::get(format!("{url}/"))
        .body(ReplayBody::full(Bytes::new()))
        .unwrap();
    let answer = client.call(req).await.expect("a response");
    let text = answer.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, Bytes::from_static(b"ok\n"));

    // Kept alive in the pool while it is young.
    tokio::time::sleep(POOL_IDLE_TIMEOUT / 2).await;
    assert!(
        closes.recv_timeout(Duration::from_millis(100)).is_err(),
        "closed before its idle timeout"
    );
    // The pool's timer checks once per timeout: closed within two.
    tokio::time::sleep(POOL_IDLE_TIMEOUT * 2).await;
    assert!(
        closes.recv_timeout(Duration::from_secs(10)).is_ok(),
        "an idle connection outlived its timeout with no request to its origin"
    );
}
