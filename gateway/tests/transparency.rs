//! What a client reads is what the upstream sent, except a failed attempt
//! before commit (invisible), the final error when the gateway cannot
//! recover, and resumable ids where every SDK of the protocol reads them.

mod support;

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use recovery_gateway::Comments;
use recovery_gateway::{Route, RouteProtocol};
use recovery_tests::fault::{FaultProvider, Write};
use support::*;

const GEMINI: &str = "/v1beta/models/gemini-x:streamGenerateContent?alt=sse";
const GEMINI_BODY: &str = r#"{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}"#;

#[tokio::test]
async fn gemini_streams_carry_no_ids_and_resume_by_the_events_received() {
    let name = "gemini/lf-happy.sse";
    let provider = FaultProvider::start(vec![sse(Write::fixture(name))])
        .await
        .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(GEMINI), GEMINI_BODY)).await;
    assert_eq!(a.status, 200);
    let full = fixture(name);
    assert_eq!(
        a.text(),
        String::from_utf8_lossy(&full),
        "only data lines, as the upstream sent them"
    );
    let sid = a.stream_id();
    let rest = send(get(gw.url(&format!("/streams/{sid}?after=1")))).await;
    assert_eq!(rest.status, 200);
    assert_eq!(
        rest.body,
        &full[after_event(&full, 1)..],
        "events 2.. of the log"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn comment_blocks_reach_the_client_as_comments_and_never_dispatch() {
    let name = "openai-chat/keepalive-comments.sse";
    let provider = FaultProvider::start(vec![sse(Write::fixture(name))])
        .await
        .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(a.status, 200);
    let text = a.text();
    for comment in [": keep-alive\n", ": OPENROUTER PROCESSING\n"] {
        assert!(text.contains(comment), "{comment:?} kept: {text}");
    }
    // Every block a reader dispatches has data: none is a comment's empty
    // event (an SDK that kept the last id would decode it and raise).
    for event in events(&text) {
        assert!(
            event.lines().any(|l| l.starts_with("data: ")),
            "an empty event: {event:?}"
        );
    }
    let data = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("data: "))
            .map(str::to_owned)
            .collect()
    };
    let upstream = String::from_utf8(fixture(name)).unwrap();
    assert_eq!(data(&text), data(&upstream));
    gw.shutdown().await;
}

#[tokio::test]
async fn comment_blocks_can_be_dropped_by_config() {
    let name = "openai-chat/keepalive-comments.sse";
    let provider = FaultProvider::start(vec![sse(Write::fixture(name))])
        .await
        .unwrap();
    let (mut config, _) = config(&provider);
    config.sse_comments = Comments::Drop;
    let gw = gateway(config).await;
    let a = send(post(gw.url(CHAT), CHAT_BODY)).await;
    let text = a.text();
    assert!(!text.lines().any(|l| l.starts_with(':')), "{text}");
    assert!(text.contains("[DONE]"));
    gw.shutdown().await;
}

/// An upstream stream with its own ids and a comment block.
const OWN_IDS: &str = ": hello\n\nid: up-1\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\nid: up-2\ndata: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

#[tokio::test]
async fn resumable_off_by_header_or_route_passes_the_upstreams_bytes_exactly() {
    let provider = FaultProvider::start(vec![
        sse(Write::text(OWN_IDS)),
        sse(Write::text(OWN_IDS)),
        sse(Write::text(OWN_IDS)),
    ])
    .await
    .unwrap();
    let (mut config, _) = config(&provider);
    config.routes = vec![Route {
        prefix: "/raw".into(),
        upstream: provider.base_url().parse().unwrap(),
        strip_prefix: true,
        protocol: RouteProtocol::Auto,
        resumable: false,
        headers: http::HeaderMap::new(),
        credential_header: None,
        http2: recovery_gateway::config::Http2::Off,
        declared: recovery_gateway::config::Declared::default(),
    }];
    let gw = gateway(config).await;
    let by_header = Request::post(gw.url(CHAT))
        .header("content-type", "application/json")
        .header("authorization", AUTH)
        .header("x-recovery-resumable", "off")
        .body(Full::new(Bytes::from_static(CHAT_BODY.as_bytes())))
        .unwrap();
    for req in [by_header, post(gw.url(&format!("/raw{CHAT}")), CHAT_BODY)] {
        let a = send(req).await;
        assert_eq!(a.status, 200);
        assert_eq!(a.text(), OWN_IDS);
        assert!(a.headers.get("x-recovery-stream-id").is_none());
    }
    let sent = provider.requests();
    assert!(
        sent[0].header("x-recovery-resumable").is_none(),
        "not forwarded"
    );
    // Resumable (the default): the gateway's ids replace the upstream's.
    let a = send(post(gw.url(CHAT), CHAT_BODY)).await;
    let sid = a.stream_id();
    assert!(a.text().contains(&format!("id: {sid}:1\n")), "{}", a.text());
    assert!(!a.text().contains("up-1"));
    gw.shutdown().await;
}

#[tokio::test]
async fn a_stream_error_before_the_first_token_is_the_providers_own() {
    // Every attempt ends with an in-stream overloaded error before output:
    // the failed attempts stay invisible and the last one is the answer,
    // as the provider streamed it, so the SDK raises the provider's error.
    let anthropic = "anthropic/error-first.sse";
    let provider = FaultProvider::start(vec![
        sse(Write::fixture(anthropic)),
        sse(Write::fixture(anthropic)),
        sse(Write::fixture(anthropic)),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url(MESSAGES), r#"{"stream":true}"#)).await;
    assert_eq!(provider.count(), 3);
    assert_eq!(a.status, 200, "the provider's status");
    let text = a.text();
    let provider_error = r#"data: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}"#;
    assert_eq!(text.matches(provider_error).count(), 1, "{text}");
    assert_eq!(text.matches("event: message_start").count(), 1, "{text}");
    let first_error = text.find("event: error").unwrap();
    assert!(
        text[first_error..].starts_with(&format!("event: error\n{provider_error}")),
        "the provider's error event comes first: {text}"
    );
    gw.shutdown().await;
}

/// Serves `service` on a loopback port, a connection at a time each on a
/// task of its own; its address.
async fn serve<S, B>(service: S) -> std::net::SocketAddr
where
    S: hyper::service::Service<Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A loopback upstream answering the endpoints of an API that are not
/// generations: each path its own body and content type;
/// `/v1/files/cut/content` declares 100 bytes, sends 10 and fails.
async fn api_upstream() -> std::net::SocketAddr {
    use http::Response;
    use http_body_util::BodyExt as _;
    use hyper::body::{Frame, Incoming};
    type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;
    serve(hyper::service::service_fn(
        |req: Request<Incoming>| async move {
            let whole = |b: &'static [u8]| -> Body {
                Full::new(Bytes::from_static(b))
                    .map_err(|e| match e {})
                    .boxed()
            };
            let (status, ct, body): (u16, &str, Body) =
                match (req.method().as_str(), req.uri().path()) {
                    ("GET", "/v1/models") => (200, "application/json", whole(MODELS)),
                    ("POST", "/v1/embeddings") => (200, "application/json", whole(EMBEDDING)),
                    ("GET", "/v1/files/file-1/content") => {
                        (200, "application/octet-stream", whole(FILE))
                    }
                    ("POST", "/v1/audio/speech") => (200, "audio/mpeg", whole(AUDIO)),
                    ("DELETE", "/v1/files/file-1") => (200, "application/json", whole(DELETED)),
                    ("GET", "/v1/files/cut/content") => {
                        // The first part leaves before the failure.
                        let parts = futures_util::stream::unfold(0, |n| async move {
                            match n {
                                0 => Some((Ok(Frame::data(Bytes::from_static(b"first part"))), 1)),
                                1 => {
                                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                                    Some((Err(std::io::Error::other("cut")), 2))
                                }
                                _ => None,
                            }
                        });
                        let body = http_body_util::StreamBody::new(parts);
                        (200, "application/octet-stream", body.boxed())
                    }
                    _ => (
                        404,
                        "application/json",
                        whole(br#"{"error":{"message":"no"}}"#),
                    ),
                };
            let mut resp = Response::new(body);
            *resp.status_mut() = http::StatusCode::from_u16(status).unwrap();
            resp.headers_mut()
                .insert("content-type", ct.parse().unwrap());
            if req.uri().path() == "/v1/files/cut/content" {
                resp.headers_mut()
                    .insert("content-length", "100".parse().unwrap());
            }
            Ok::<_, hyper::Error>(resp)
        },
    ))
    .await
}

const MODELS: &[u8] = br#"{"object":"list","data":[{"id":"gpt-5","object":"model","created":0,"owned_by":"system"}]}"#;
const EMBEDDING: &[u8] = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.25]}],"model":"e","usage":{"prompt_tokens":1,"total_tokens":1}}"#;
const FILE: &[u8] = b"line one\nline two\n\x00\xff raw bytes";
const AUDIO: &[u8] = b"ID3\x04\x00\x00\x00\x00\x00\x00\xff\xfb\x90\x64 mp3 frames";
const DELETED: &[u8] = br#"{"id":"file-1","object":"file","deleted":true}"#;

#[tokio::test]
async fn what_is_not_a_generation_passes_through_as_the_upstream_sent_it() {
    let upstream = api_upstream().await;
    let gw = gateway(config_at(upstream)).await;
    let send_as = |method: &str, path: &str, body: &'static str| {
        Request::builder()
            .method(method)
            .uri(gw.url(path))
            .header("authorization", AUTH)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap()
    };
    for (method, path, body, want, ct) in [
        ("GET", "/v1/models", "", MODELS, "application/json"),
        (
            "POST",
            "/v1/embeddings",
            r#"{"model":"e","input":"hi"}"#,
            EMBEDDING,
            "application/json",
        ),
        (
            "GET",
            "/v1/files/file-1/content",
            "",
            FILE,
            "application/octet-stream",
        ),
        (
            "POST",
            "/v1/audio/speech",
            r#"{"model":"t","voice":"alloy","input":"hi"}"#,
            AUDIO,
            "audio/mpeg",
        ),
        (
            "DELETE",
            "/v1/files/file-1",
            "",
            DELETED,
            "application/json",
        ),
    ] {
        let answer = send(send_as(method, path, body)).await;
        assert_eq!(answer.status, 200, "{method} {path}: {}", answer.text());
        assert_eq!(&answer.body[..], want, "{method} {path}");
        assert_eq!(answer.headers["content-type"], ct, "{method} {path}");
        assert_eq!(
            answer.headers["content-length"],
            want.len().to_string().as_str(),
            "{method} {path}: the length passes on"
        );
        assert!(
            answer.headers.get("x-recovery-stream-id").is_none(),
            "{method} {path} is no stream"
        );
    }
    // A download cut after its first bytes ends broken, as it did
    // upstream: no stream error event is written into a file.
    let resp = tokio::time::timeout(
        LIMIT,
        client().request(send_as("GET", "/v1/files/cut/content", "")),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(resp.status(), 200);
    let read = tokio::time::timeout(LIMIT, http_body_util::BodyExt::collect(resp.into_body()))
        .await
        .expect("the body ends");
    assert!(read.is_err(), "a cut download is not a clean end");
    gw.shutdown().await;
}

/// A loopback upstream that counts the bytes of each request body as they
/// arrive and answers, at the body's end, with their number and a sum.
async fn counting_upstream() -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use http::Response;
    use http_body_util::BodyExt as _;
    use hyper::body::Incoming;
    use std::sync::atomic::Ordering;
    let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = Arc::clone(&arrived);
    let addr = serve(hyper::service::service_fn(move |req: Request<Incoming>| {
        let seen = Arc::clone(&seen);
        async move {
            let mut body = req.into_body();
            let (mut n, mut sum) = (0usize, 0u64);
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    n += data.len();
                    sum += data.iter().map(|b| u64::from(*b)).sum::<u64>();
                    seen.store(n, Ordering::SeqCst);
                }
            }
            let mut resp = Response::new(Full::new(Bytes::from(format!(
                r#"{{"id":"file-1","object":"file","bytes":{n},"sum":{sum}}}"#
            ))));
            resp.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            Ok::<_, hyper::Error>(resp)
        }
    }))
    .await;
    (addr, arrived)
}

#[tokio::test]
async fn an_upload_streams_upstream_as_it_arrives_past_the_body_cap() {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (upstream, arrived) = counting_upstream().await;
    let gw = gateway(recovery_gateway::Config {
        max_body_bytes: 1 << 20,
        max_upload_bytes: 16 << 20,
        ..config_at(upstream)
    })
    .await;
    // 12 MiB, over the 1 MiB body cap: the first half is written, and
    // reaches the upstream before the second is sent.
    let body: Vec<u8> = (0..12 << 20).map(|i: usize| (i % 251) as u8).collect();
    let sum: u64 = body.iter().map(|b| u64::from(*b)).sum();
    let mut s = tokio::net::TcpStream::connect(gw.local_addr())
        .await
        .unwrap();
    let head = format!(
        "POST /v1/files HTTP/1.1\r\nhost: gw\r\nauthorization: {AUTH}\r\n\
         content-type: multipart/form-data; boundary=x\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let half = body.len() / 2;
    s.write_all(&body[..half]).await.unwrap();
    tokio::time::timeout(LIMIT, async {
        while arrived.load(Ordering::SeqCst) < half - (64 << 10) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the upload's first half reaches the upstream before its end is sent");
    s.write_all(&body[half..]).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(LIMIT, async {
        let mut buf = [0u8; 4096];
        while !answer.ends_with(b"}") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the upstream's answer comes back");
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.ends_with(&format!(r#""bytes":{},"sum":{sum}}}"#, body.len())),
        "{answer}"
    );

    // A generation over the body cap is still refused whole, and an
    // upload declared over its own cap too; neither goes upstream.
    let before = arrived.load(Ordering::SeqCst);
    let big_chat = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(2 << 20)
    );
    let refused = send(post(gw.url(CHAT), &big_chat)).await;
    assert_eq!(refused.status, 413);
    let mut raw = tokio::net::TcpStream::connect(gw.local_addr())
        .await
        .unwrap();
    raw.write_all(
        format!(
            "POST /v1/files HTTP/1.1\r\nhost: gw\r\nauthorization: {AUTH}\r\n\
             content-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
            17u64 << 20
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut refused = vec![0u8; 64];
    let n = tokio::time::timeout(LIMIT, raw.read(&mut refused))
        .await
        .unwrap()
        .unwrap();
    assert!(
        refused[..n].starts_with(b"HTTP/1.1 413"),
        "{}",
        String::from_utf8_lossy(&refused[..n])
    );
    assert_eq!(arrived.load(Ordering::SeqCst), before);
    gw.shutdown().await;
}

/// A Responses stream of an image generation: its partial image, and then
/// the completed response carrying the image, each one event of `size`
/// bytes of base64.
fn image_stream(size: usize) -> String {
    let b64 = "iVBO".repeat(size / 4);
    format!(
        "event: response.created\ndata: {{\"type\":\"response.created\",\"sequence_number\":0,\"response\":{{\"id\":\"resp_1\",\"status\":\"in_progress\",\"output\":[]}}}}\n\n\
         event: response.image_generation_call.partial_image\ndata: {{\"type\":\"response.image_generation_call.partial_image\",\"sequence_number\":1,\"output_index\":0,\"item_id\":\"ig_1\",\"partial_image_index\":0,\"partial_image_b64\":\"{b64}\"}}\n\n\
         event: response.completed\ndata: {{\"type\":\"response.completed\",\"sequence_number\":2,\"response\":{{\"id\":\"resp_1\",\"status\":\"completed\",\"output\":[{{\"id\":\"ig_1\",\"type\":\"image_generation_call\",\"status\":\"completed\",\"result\":\"{b64}\"}}]}}}}\n\n"
    )
}

const IMAGE_BODY: &str = r#"{"model":"m","stream":true,"input":"Draw a cat","tools":[{"type":"image_generation","partial_images":1}]}"#;

#[tokio::test]
async fn an_image_of_several_mib_streams_whole_and_is_read_again_from_the_log() {
    // 9 MB events: above the 1 MiB that decoders commonly cap a line at,
    // and above the 4 MiB this gateway once cut an event at; 18 MB in all,
    // above the 16 MiB its log once kept of a stream.
    let stream = image_stream(9 << 20);
    let gemini_image = format!(
        "{{\"candidates\":[{{\"content\":{{\"role\":\"model\",\"parts\":[{{\"inlineData\":{{\"mimeType\":\"image/png\",\"data\":\"{}\"}}}}]}},\"finishReason\":\"STOP\",\"index\":0}}]}}",
        "iVBO".repeat(2 << 20)
    );
    let provider = FaultProvider::start(vec![
        sse(Write::text(stream.clone())),
        recovery_tests::fault::Script::ok()
            .header("content-type", "application/json")
            .write(Write::text(gemini_image.clone())),
    ])
    .await
    .unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let a = send(post(gw.url("/v1/responses"), IMAGE_BODY)).await;
    assert_eq!(a.status, 200);
    assert!(
        without_ids(&a.text()) == stream,
        "the image stream as it came ({} of {} bytes)",
        a.body.len(),
        stream.len()
    );
    // Both events were logged whole: a reconnect reads them again.
    let sid = a.stream_id();
    let rest = send(get(gw.url(&format!("/streams/{sid}?after=1")))).await;
    assert_eq!(rest.status, 200);
    assert!(
        without_ids(&rest.text()).as_bytes()
            == &stream.as_bytes()[after_event(stream.as_bytes(), 1)..],
        "events 2 and 3 of the log"
    );
    // One whole JSON answer of 8 MiB (a Gemini image, not streamed).
    let g = send(post(
        gw.url("/v1beta/models/m:generateContent"),
        r#"{"contents":[{"role":"user","parts":[{"text":"Draw a cat"}]}]}"#,
    ))
    .await;
    assert_eq!(g.status, 200);
    assert!(
        g.body == gemini_image.as_bytes(),
        "the JSON answer as it came"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn the_policys_event_cap_bounds_what_the_gateway_reads() {
    let stream = image_stream(2 << 20);
    let provider = FaultProvider::start(vec![sse(Write::text(stream.clone()))])
        .await
        .unwrap();
    let (mut config, _) = config(&provider);
    config.policy = policy()
        .to_builder()
        .max_event_bytes(1 << 20)
        .build()
        .unwrap();
    let gw = gateway(config).await;
    let a = send(post(gw.url("/v1/responses"), IMAGE_BODY)).await;
    let text = a.text();
    assert!(
        !text.contains("response.completed") && text.len() < 1 << 20,
        "nothing past a line over the cap is read ({} bytes)",
        text.len()
    );
    assert_eq!(
        provider.requests().len(),
        1,
        "a broken protocol is not replayed"
    );
    gw.shutdown().await;
}
