//! A request that switches protocols (a WebSocket's opening handshake, as
//! OpenAI's Realtime API takes it) carried through the gateway: each
//! side's bytes reach the other, the credentials are the ones the caller
//! may spend, an upstream's refusal is answered as it came, and a tunnel
//! is bounded (its stream slot, the idle timeout, the shutdown's grace).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use recovery_core::policy::RecoveryPolicy;
use recovery_gateway::auth::{Client, client_entry};
use support::{LIMIT, gateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

const COMPLETION: &[u8] = br#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"plain"},"finish_reason":"stop"}]}"#;

/// What the upstream was asked: the target and the headers of each
/// request.
type Asked = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// A loopback upstream: `/v1/refuse` answers 403; a request that asks to
/// switch to `websocket` is switched (the accept header derived from the
/// key, the subprotocol echoed), greeted with `hello\n`, and each read
/// echoed back as `echo:<bytes>`; anything else gets a whole chat
/// completion.
async fn upstream() -> (SocketAddr, Asked) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let asked: Asked = Arc::default();
    let record = Arc::clone(&asked);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let record = Arc::clone(&record);
            tokio::spawn(async move {
                let service = service_fn(move |mut req: Request<Incoming>| {
                    record
                        .lock()
                        .unwrap()
                        .push((req.uri().to_string(), req.headers().clone()));
                    async move {
                        if req.uri().path() == "/v1/refuse" {
                            let mut resp = Response::new(Full::new(Bytes::from_static(
                                br#"{"error":{"message":"no realtime for you"}}"#,
                            )));
                            *resp.status_mut() = StatusCode::FORBIDDEN;
                            return Ok::<_, hyper::Error>(resp);
                        }
                        if req
                            .headers()
                            .get("upgrade")
                            .is_some_and(|v| v == "websocket")
                        {
                            let key = req.headers()["sec-websocket-key"].clone();
                            let protocol = req.headers().get("sec-websocket-protocol").cloned();
                            let switched = hyper::upgrade::on(&mut req);
                            tokio::spawn(async move {
                                let mut io = TokioIo::new(switched.await.unwrap());
                                io.write_all(b"hello\n").await.unwrap();
                                let mut buf = [0u8; 1024];
                                loop {
                                    match io.read(&mut buf).await {
                                        Ok(0) | Err(_) => return,
                                        Ok(n) => {
                                            let mut out = b"echo:".to_vec();
                                            out.extend_from_slice(&buf[..n]);
                                            if io.write_all(&out).await.is_err() {
                                                return;
                                            }
                                        }
                                    }
                                }
                            });
                            let mut resp = Response::new(Full::new(Bytes::new()));
                            *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                            let h = resp.headers_mut();
                            h.insert("upgrade", HeaderValue::from_static("websocket"));
                            h.insert("connection", HeaderValue::from_static("Upgrade"));
                            h.insert(
                                "sec-websocket-accept",
                                format!("accept-{}", key.to_str().unwrap()).parse().unwrap(),
                            );
                            if let Some(p) = protocol {
                                h.insert("sec-websocket-protocol", p);
                            }
                            return Ok(resp);
                        }
                        let mut resp = Response::new(Full::new(Bytes::from_static(COMPLETION)));
                        resp.headers_mut()
                            .insert("content-type", HeaderValue::from_static("application/json"));
                        Ok(resp)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    (addr, asked)
}

/// A client's opening handshake to `path` with `extra` header lines: the
/// connection, the answer's head, and what followed the head in the same
/// reads.
async fn handshake(gw: SocketAddr, path: &str, extra: &str) -> (TcpStream, String, Vec<u8>) {
    let mut s = TcpStream::connect(gw).await.unwrap();
    let head = format!(
        "GET {path} HTTP/1.1\r\nhost: gw\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\
         sec-websocket-key: {KEY}\r\nsec-websocket-version: 13\r\n{extra}\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let end = tokio::time::timeout(LIMIT, async {
        let mut buf = [0u8; 4096];
        loop {
            if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                return i + 4;
            }
            let n = s.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before the head: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the gateway answers the handshake");
    let rest = got.split_off(end);
    (s, String::from_utf8(got).unwrap(), rest)
}

/// Reads from `s` until what was read (after `have`) ends with `want`.
async fn read_until(s: &mut TcpStream, mut have: Vec<u8>, want: &[u8]) -> Vec<u8> {
    tokio::time::timeout(LIMIT, async {
        let mut buf = [0u8; 1024];
        while !have.ends_with(want) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&have));
            have.extend_from_slice(&buf[..n]);
        }
        have
    })
    .await
    .expect("the bytes cross the tunnel")
}

/// Waits for the end of `s` (what it still carries is dropped).
async fn closed(s: &mut TcpStream) {
    tokio::time::timeout(LIMIT, async {
        let mut buf = [0u8; 1024];
        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await
    .expect("the gateway closes the tunnel");
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

#[tokio::test]
async fn a_websocket_handshake_is_switched_and_bytes_cross_both_ways() {
    let (up, asked) = upstream().await;
    let gw = gateway(support::config_at(up)).await;
    let (mut s, head, rest) = handshake(
        gw.local_addr(),
        "/v1/realtime?model=gpt-realtime",
        "authorization: Bearer sk-own-key\r\nsec-websocket-protocol: realtime\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert_eq!(
        header(&head, "sec-websocket-accept"),
        Some(format!("accept-{KEY}").as_str())
    );
    assert_eq!(header(&head, "sec-websocket-protocol"), Some("realtime"));
    assert_eq!(header(&head, "upgrade"), Some("websocket"));
    // The upstream speaks first, then answers what the client says.
    let greeted = read_until(&mut s, rest, b"hello\n").await;
    assert_eq!(greeted, b"hello\n");
    s.write_all(b"ping").await.unwrap();
    assert_eq!(
        read_until(&mut s, Vec::new(), b"echo:ping").await,
        b"echo:ping"
    );
    s.write_all(b"two").await.unwrap();
    assert_eq!(
        read_until(&mut s, Vec::new(), b"echo:two").await,
        b"echo:two"
    );

    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let (target, headers) = &asked[0];
    assert_eq!(target, "/v1/realtime?model=gpt-realtime");
    assert_eq!(headers["authorization"], "Bearer sk-own-key");
    assert_eq!(headers["upgrade"], "websocket");
    assert_eq!(headers["connection"], "upgrade");
    assert_eq!(headers["sec-websocket-key"], KEY);
    assert_eq!(headers["sec-websocket-version"], "13");
    assert_eq!(headers["sec-websocket-protocol"], "realtime");
    drop(s);
    gw.shutdown().await;
}

fn known(name: &str, key: &str) -> Client {
    let mut c = recovery_gateway::config::from_toml(&client_entry(name, key)).unwrap();
    c.clients.remove(0)
}

#[tokio::test]
async fn a_known_clients_tunnel_spends_the_operators_key_and_a_stranger_gets_none() {
    let (up, asked) = upstream().await;
    let mut config = support::config_at(up);
    let mut operator = HeaderValue::from_static("Bearer sk-operator-key");
    operator.set_sensitive(true);
    config.upstream_headers.insert("authorization", operator);
    config.clients = vec![known("team-a", "ck-team-a-0123456789")];
    let gw = gateway(config).await;

    let (mut s, head, rest) = handshake(
        gw.local_addr(),
        "/v1/realtime",
        "authorization: Bearer ck-team-a-0123456789\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    read_until(&mut s, rest, b"hello\n").await;
    {
        let asked = asked.lock().unwrap();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].1["authorization"], "Bearer sk-operator-key");
        assert!(
            !format!("{:?}", asked[0].1).contains("ck-team-a"),
            "the client's own key never goes upstream"
        );
    }

    let (_s2, head, _) = handshake(
        gw.local_addr(),
        "/v1/realtime",
        "authorization: Bearer ck-nobody-0123456789\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    let (_s3, head, _) = handshake(gw.local_addr(), "/v1/realtime", "").await;
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    assert_eq!(
        asked.lock().unwrap().len(),
        1,
        "no stranger reached the upstream"
    );
    drop(s);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_refused_switch_is_answered_as_the_upstream_answered() {
    let (up, _) = upstream().await;
    let gw = gateway(support::config_at(up)).await;
    let (mut s, head, rest) = handshake(gw.local_addr(), "/v1/refuse", "").await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    let body = read_until(&mut s, rest, b"}}").await;
    assert_eq!(body, br#"{"error":{"message":"no realtime for you"}}"#);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_tunnel_keeps_its_stream_slot_until_it_closes() {
    let (up, _) = upstream().await;
    let mut config = support::config_at(up);
    config.max_streams = 1;
    let gw = gateway(config).await;
    let (mut s, head, rest) = handshake(gw.local_addr(), "/v1/realtime", "").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    read_until(&mut s, rest, b"hello\n").await;

    let plain = || support::send(support::post(gw.url(support::CHAT), "{}"));
    assert_eq!(plain().await.status, 503, "the tunnel holds the one slot");
    assert_eq!(gw.metrics().tunnels_active, 1);
    let exposed = support::send(support::get(gw.url("/metrics"))).await.text();
    assert!(
        exposed.contains("\nrecovery_gateway_tunnels_active 1\n"),
        "{exposed}"
    );
    drop(s);
    let freed = tokio::time::timeout(LIMIT, async {
        loop {
            let answer = plain().await;
            if answer.status != 503 {
                return answer;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the slot is free once the tunnel closed");
    assert_eq!(freed.status, 200);
    assert!(freed.text().contains("plain"), "{}", freed.text());
    assert_eq!(gw.metrics().tunnels_active, 0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_silent_tunnel_is_closed_after_the_idle_timeout() {
    let (up, _) = upstream().await;
    let mut config = support::config_at(up);
    config.policy = RecoveryPolicy::builder()
        .idle_timeout(Some(Duration::from_millis(300)))
        .build()
        .unwrap();
    let gw = gateway(config).await;
    let (mut s, head, rest) = handshake(gw.local_addr(), "/v1/realtime", "").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    read_until(&mut s, rest, b"hello\n").await;
    // Bytes keep it open past the timeout.
    for n in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let said = format!("k{n}");
        s.write_all(said.as_bytes()).await.unwrap();
        read_until(&mut s, Vec::new(), format!("echo:{said}").as_bytes()).await;
    }
    // Then silence closes it.
    let silent = std::time::Instant::now();
    closed(&mut s).await;
    assert!(silent.elapsed() >= Duration::from_millis(250));
    gw.shutdown().await;
}

#[tokio::test]
async fn a_shutdown_closes_an_open_tunnel_at_the_end_of_its_grace() {
    let (up, _) = upstream().await;
    let mut config = support::config_at(up);
    config.shutdown_grace = Duration::from_millis(300);
    let gw = gateway(config).await;
    let (mut s, head, rest) = handshake(gw.local_addr(), "/v1/realtime", "").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    read_until(&mut s, rest, b"hello\n").await;
    let handle = gw.shutdown_handle();
    let stopped = tokio::spawn(gw.wait());
    handle.shutdown();
    // Within the grace it still carries bytes.
    s.write_all(b"late").await.unwrap();
    read_until(&mut s, Vec::new(), b"echo:late").await;
    closed(&mut s).await;
    tokio::time::timeout(LIMIT, stopped)
        .await
        .expect("the gateway stops")
        .unwrap();
}

#[tokio::test]
async fn an_h2c_upgrade_is_declined_and_the_request_goes_on_as_http_1_1() {
    let (up, asked) = upstream().await;
    let gw = gateway(support::config_at(up)).await;
    let mut s = TcpStream::connect(gw.local_addr()).await.unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nconnection: Upgrade, HTTP2-Settings\r\n\
          upgrade: h2c\r\nhttp2-settings: AAMAAABkAAQCAAAAAAIAAAAA\r\ncontent-type: application/json\r\n\
          content-length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    let answer = read_until(&mut s, Vec::new(), b"0\r\n\r\n").await;
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    for gone in ["upgrade", "http2-settings", "connection"] {
        assert!(asked[0].1.get(gone).is_none(), "{gone} went upstream");
    }
    drop(s);
    gw.shutdown().await;
}

/// A WebSocket server (tungstenite): greets with a text message, answers
/// each text message in upper case and each binary one reversed, and
/// closes when asked; what the handshake carried as `authorization`.
async fn websocket_upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::handshake::server::{
        Request as WsRequest, Response as WsResponse,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = Arc::clone(&keys);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                // The callback's type is tungstenite's.
                #[allow(clippy::result_large_err)]
                let record = |req: &WsRequest, resp: WsResponse| {
                    let key = req
                        .headers()
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    seen.lock().unwrap().push(key);
                    Ok(resp)
                };
                let mut ws = tokio_tungstenite::accept_hdr_async(stream, record)
                    .await
                    .unwrap();
                ws.send(Message::text(r#"{"type":"session.created"}"#))
                    .await
                    .unwrap();
                while let Some(Ok(message)) = ws.next().await {
                    let answer = match message {
                        Message::Text(t) => Message::text(t.as_str().to_uppercase()),
                        Message::Binary(b) => {
                            Message::binary(b.iter().rev().copied().collect::<Vec<u8>>())
                        }
                        Message::Close(_) => break,
                        _ => continue,
                    };
                    if ws.send(answer).await.is_err() {
                        return;
                    }
                }
                let _ = ws.close(None).await;
            });
        }
    });
    (addr, keys)
}

#[tokio::test]
async fn a_websocket_client_and_server_speak_through_the_gateway() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let (up, keys) = websocket_upstream().await;
    let gw = gateway(support::config_at(up)).await;
    let mut request = format!("ws://{}/v1/realtime?model=gpt-realtime", gw.local_addr())
        .into_client_request()
        .unwrap();
    request.headers_mut().insert(
        "authorization",
        HeaderValue::from_static("Bearer sk-own-key"),
    );
    let tcp = TcpStream::connect(gw.local_addr()).await.unwrap();
    let (mut ws, answer) =
        tokio::time::timeout(LIMIT, tokio_tungstenite::client_async(request, tcp))
            .await
            .expect("the handshake is answered")
            .expect("the switch is accepted");
    assert_eq!(answer.status(), StatusCode::SWITCHING_PROTOCOLS);
    let greeting = tokio::time::timeout(LIMIT, ws.next())
        .await
        .expect("a message crosses")
        .expect("the socket is open")
        .unwrap();
    assert_eq!(greeting, Message::text(r#"{"type":"session.created"}"#));
    ws.send(Message::text("response.create")).await.unwrap();
    let reply = tokio::time::timeout(LIMIT, ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply, Message::text("RESPONSE.CREATE"));
    ws.send(Message::binary(vec![1u8, 2, 3, 255]))
        .await
        .unwrap();
    let reply = tokio::time::timeout(LIMIT, ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(reply, Message::binary(vec![255u8, 3, 2, 1]));
    // The closing handshake crosses too: the server's close frame comes
    // back, then the end.
    ws.close(None).await.unwrap();
    let rest = tokio::time::timeout(LIMIT, async {
        let mut rest = Vec::new();
        while let Some(Ok(m)) = ws.next().await {
            rest.push(m);
        }
        rest
    })
    .await
    .expect("the socket closes");
    assert!(rest.iter().all(Message::is_close), "{rest:?}");
    assert_eq!(keys.lock().unwrap().as_slice(), ["Bearer sk-own-key"]);
    drop(ws);
    gw.shutdown().await;
}
