//! Raw HTTP/1.1 on a `TcpStream`: reading requests with `httparse`, writing
//! response heads and chunk frames byte by byte.

use std::io;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::script::Transfer;

/// A request head is refused past this size: the provider is a test fixture,
/// not a general server, and a bound keeps a broken client from growing it.
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body kept (LLM requests are small; replay tests use a few MiB).
const MAX_BODY: usize = 64 * 1024 * 1024;
const MAX_HEADERS: usize = 128;

/// One parsed request, as received.
#[derive(Debug, Clone)]
pub(crate) struct Parsed {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, Bytes)>,
    pub raw_head: Bytes,
    pub body: Bytes,
    /// The client asked to close after this exchange (`connection: close` or HTTP/1.0).
    pub wants_close: bool,
}

impl Parsed {
    /// First value of a header, by case-insensitive name.
    pub(super) fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_ref())
    }

    /// The path without its query string.
    pub(super) fn path(&self) -> &str {
        path_of(&self.target)
    }
}

/// The path part of a request target.
pub(crate) fn path_of(target: &str) -> &str {
    target.split_once('?').map_or(target, |(path, _)| path)
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_owned())
}

/// Read more bytes into `buf`; `Ok(false)` on EOF.
async fn fill(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<bool> {
    buf.reserve(8 * 1024);
    Ok(stream.read_buf(buf).await? > 0)
}

/// Read one request. `Ok(None)` when the client closed cleanly between requests.
pub(crate) async fn read_request(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
) -> io::Result<Option<Parsed>> {
    let (head_len, method, target, headers, version) = loop {
        if !buf.is_empty() {
            let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut request = httparse::Request::new(&mut slots);
            match request.parse(buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let headers = request
                        .headers
                        .iter()
                        .map(|h| (h.name.to_owned(), Bytes::copy_from_slice(h.value)))
                        .collect::<Vec<_>>();
                    break (
                        len,
                        request.method.unwrap_or_default().to_owned(),
                        request.path.unwrap_or_default().to_owned(),
                        headers,
                        request.version.unwrap_or(1),
                    );
                }
                Ok(httparse::Status::Partial) => {}
                Err(err) => return Err(invalid(&format!("request head: {err}"))),
            }
            if buf.len() > MAX_HEAD {
                return Err(invalid("request head too large"));
            }
        }
        if !fill(stream, buf).await? {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    };
    let raw_head = buf.split_to(head_len).freeze();
    let expects_continue = headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("expect") && v.eq_ignore_ascii_case(b"100-continue"));
    if expects_continue && buf.is_empty() {
        // curl waits for this before sending a larger body.
        send(stream, b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
    });
    let body = if chunked {
        read_chunked(stream, buf).await?
    } else if let Some(len) = find("content-length") {
        let len: usize = std::str::from_utf8(&len)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| invalid("bad content-length"))?;
        if len > MAX_BODY {
            return Err(invalid("request body too large"));
        }
        while buf.len() < len {
            if !fill(stream, buf).await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        buf.split_to(len).freeze()
    } else {
        Bytes::new()
    };
    let connection_close = find("connection").is_some_and(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    });
    Ok(Some(Parsed {
        method,
        target,
        headers,
        raw_head,
        body,
        wants_close: connection_close || version == 0,
    }))
}

/// Decode a chunked request body (size lines, data, optional trailers).
async fn read_chunked(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<Bytes> {
    let mut body = BytesMut::new();
    loop {
        let line = read_line(stream, buf).await?;
        let size_text = line.split(|&b| b == b';').next().unwrap_or_default();
        let size = std::str::from_utf8(size_text)
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok())
            .ok_or_else(|| invalid("bad chunk size"))?;
        if size == 0 {
            // Trailers until the empty line.
            while !read_line(stream, buf).await?.is_empty() {}
            return Ok(body.freeze());
        }
        if body.len() + size > MAX_BODY {
            return Err(invalid("request body too large"));
        }
        while buf.len() < size + 2 {
            if !fill(stream, buf).await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        body.extend_from_slice(&buf[..size]);
        if &buf[size..size + 2] != b"\r\n" {
            return Err(invalid("chunk not followed by CRLF"));
        }
        let _ = buf.split_to(size + 2);
    }
}

/// One CRLF-terminated line, without the CRLF.
async fn read_line(stream: &mut TcpStream, buf: &mut BytesMut) -> io::Result<Bytes> {
    loop {
        if let Some(pos) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = buf.split_to(pos + 2).freeze();
            return Ok(line.slice(..pos));
        }
        if buf.len() > MAX_HEAD {
            return Err(invalid("chunk line too long"));
        }
        if !fill(stream, buf).await? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

/// The framing header the provider writes for a response.
pub(crate) enum Framing {
    Chunked,
    Length(u64),
    Close,
    /// 1xx, 204 and 304 carry no body and no framing header.
    None,
}

impl Framing {
    pub(crate) fn for_transfer(transfer: Transfer, length: u64) -> Self {
        match transfer {
            Transfer::Chunked => Self::Chunked,
            Transfer::ContentLength => Self::Length(length),
            Transfer::CloseDelimited => Self::Close,
        }
    }
}

/// Serialise a response head.
pub(crate) fn head(status: u16, framing: &Framing, headers: &[(String, String)]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    match framing {
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Length(len) => {
            out.extend_from_slice(format!("content-length: {len}\r\n").as_bytes());
        }
        Framing::Close => out.extend_from_slice(b"connection: close\r\n"),
        Framing::None => {}
    }
    for (name, value) in headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// One chunk frame: size line, data, CRLF, in a single buffer so it is one write.
pub(crate) fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

/// The last-chunk and empty trailer section.
pub(crate) const CHUNKED_END: &[u8] = b"0\r\n\r\n";

/// Statuses that never carry a body (RFC 9110 §6.4.1).
pub(crate) fn bodyless(status: u16) -> bool {
    status < 200 || status == 204 || status == 304
}

/// A short reason phrase; clients ignore it, humans reading captures do not.
fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        409 => "Conflict",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        529 => "Overloaded",
        _ => "Status",
    }
}

/// Half-close (FIN), then read until the client closes so the kernel does not
/// turn the close into an RST because of unread bytes.
pub(crate) async fn fin_and_drain(stream: &mut TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut scratch = [0_u8; 4096];
    while let Ok(n) = stream.read(&mut scratch).await {
        if n == 0 {
            break;
        }
    }
}

/// Abortive close: `SO_LINGER` 0 makes the close send RST instead of FIN.
pub(crate) fn rst(stream: TcpStream) {
    let _ = socket2::SockRef::from(&stream).set_linger(Some(std::time::Duration::ZERO));
    drop(stream);
}

/// Write all of `bytes`.
pub(crate) async fn send(stream: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}
