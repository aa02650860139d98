//! What a client reads is what the upstream sent, except a failed attempt
//! before commit (invisible), the final error when the gateway cannot
//! recover, and resumable ids where every SDK of the protocol reads them.

mod support;

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
