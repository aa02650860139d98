//! The connections the client's pools hold: plain TCP inline, TLS boxed.
//!
//! hyper-rustls' stream is an enum as large as its TLS arm (a rustls
//! connection, about 1.1 KiB), and hyper keeps a connection's stream inline
//! in its connection task and in every future that carries it through the
//! handshake. A plain `http://` upstream (a model server on the host, a
//! sidecar) would pay that per connection for state it never has. Boxing the
//! TLS arm keeps a connection's stream at the size of a socket; a TLS
//! connection pays one allocation next to the ones rustls makes anyway.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

type Tcp = TokioIo<TcpStream>;
type Inner = HttpsConnector<HttpConnector>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// hyper-rustls' connector, answering with a [`Stream`].
#[derive(Clone, Debug)]
pub(super) struct Connector(Inner);

impl Connector {
    pub(super) fn new(inner: Inner) -> Self {
        Connector(inner)
    }
}

/// A connection to an upstream: a socket, or a socket under TLS.
#[derive(Debug)]
pub(super) enum Stream {
    /// `http://`.
    Plain(Tcp),
    /// `https://`, boxed: see the module's doc.
    Tls(Box<MaybeHttpsStream<Tcp>>),
}

impl From<MaybeHttpsStream<Tcp>> for Stream {
    fn from(stream: MaybeHttpsStream<Tcp>) -> Self {
        match stream {
            MaybeHttpsStream::Http(tcp) => Stream::Plain(tcp),
            tls @ MaybeHttpsStream::Https(_) => Stream::Tls(Box::new(tls)),
        }
    }
}

/// A connect in progress: hyper-rustls' (already boxed) future.
pub(super) struct Connecting(<Inner as tower_service::Service<Uri>>::Future);

impl Future for Connecting {
    type Output = Result<Stream, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(ready!(self.0.as_mut().poll(cx)).map(Stream::from))
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = Stream;
    type Error = BoxError;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Connecting(self.0.call(uri))
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(tcp) => tcp.connected(),
            Stream::Tls(tls) => tls.connected(),
        }
    }
}

impl Read for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl Write for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(tcp) => tcp.is_write_vectored(),
            Stream::Tls(tls) => tls.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Stream::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_is_the_size_of_a_socket_not_of_a_tls_session() {
        let stream = std::mem::size_of::<Stream>();
        assert!(
            stream <= std::mem::size_of::<Tcp>() + 8,
            "a connection takes {stream} bytes inline, a socket {}",
            std::mem::size_of::<Tcp>()
        );
    }
}
