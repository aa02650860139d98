//! Who may read a stream and whose keys a request may spend, over real
//! sockets: a stream is readable only with the credentials that created
//! it (memory and Redis logs), a request without a known client key never
//! spends an operator key, and a listener others can reach is refused when
//! it would spend operator keys for anyone.

mod support;

use std::process::Stdio;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::Full;
use recovery_gateway::auth::{Client, client_entry};
use recovery_gateway::{Gateway, GatewayError, Route, RouteProtocol, StreamLogChoice};
use recovery_tests::fault::{FaultProvider, Script};
use recovery_tests::redis::{RedisServer, TempDir};
use support::*;
use tokio::io::AsyncWriteExt;

const OTHER: &str = "Bearer sk-someone-else-9999";

fn post_as(url: String, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut b = Request::post(url).header("content-type", "application/json");
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(Full::new(Bytes::from_static(CHAT_BODY.as_bytes())))
        .unwrap()
}

/// Reads stream `sid` every way a stranger could, and as its owner.
async fn only_its_owner_reads(gw: &Gateway, sid: &str) {
    let unknown = send(get(
        gw.url(&format!("/streams/{}", recovery_gateway::new_stream_id()))
    ))
    .await;
    assert_eq!(unknown.status, 404);
    let strangers: [&[(&str, &str)]; 4] = [
        &[("authorization", OTHER)],
        &[],
        &[("x-api-key", "sk-test-secret-0123")],
        &[("authorization", AUTH), ("x-api-key", "extra")],
    ];
    for headers in strangers {
        let by_path = send(get_as(gw.url(&format!("/streams/{sid}?after=0")), headers)).await;
        assert_eq!(by_path.status, 404, "{headers:?}");
        assert_eq!(
            by_path.body, unknown.body,
            "exactly the 404 of an unknown id"
        );
        let mut with_id: Vec<(&str, &str)> = headers.to_vec();
        let last = format!("{sid}:1");
        with_id.push(("last-event-id", &last));
        for path in [CHAT, MESSAGES, "/anything"] {
            let r = send(post_as(gw.url(path), &with_id)).await;
            assert_eq!(r.status, 404, "{path} {headers:?}: {}", r.text());
        }
    }
    let owner = send(get(gw.url(&format!("/streams/{sid}?after=0")))).await;
    assert_eq!(owner.status, 200);
    assert!(owner.text().contains("[DONE]"), "{}", owner.text());
    let last = format!("{sid}:1");
    let other_path = send(post_as(
        gw.url(MESSAGES),
        &[("authorization", AUTH), ("last-event-id", &last)],
    ))
    .await;
    assert_eq!(other_path.status, 200, "the owner reconnects on any path");
}

#[tokio::test]
async fn another_key_no_key_or_another_path_cannot_read_a_stream_in_memory() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let first = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(first.status, 200);
    only_its_owner_reads(&gw, &first.stream_id()).await;
    assert_eq!(provider.count(), 1, "no reconnect went upstream");
    gw.shutdown().await;
}

#[tokio::test]
async fn another_key_no_key_or_another_path_cannot_read_a_stream_on_redis() {
    let dir = TempDir::new("gateway-tenancy");
    let redis = RedisServer::start(&dir);
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.stream_log = StreamLogChoice::Redis(redis.url());
    config.stream_secret = Some(recovery_gateway::Secret(b"tenancy-fleet-secret".to_vec()));
    let gw = gateway(config.clone()).await;
    let first = send(post(gw.url(CHAT), CHAT_BODY)).await;
    assert_eq!(first.status, 200);
    let sid = first.stream_id();
    only_its_owner_reads(&gw, &sid).await;
    // Another instance with the fleet's secret serves the owner only.
    let (mut other, _) = support::config(&provider);
    other.stream_log = StreamLogChoice::Redis(redis.url());
    other.stream_secret = config.stream_secret.clone();
    let gw2 = gateway(other).await;
    only_its_owner_reads(&gw2, &sid).await;
    gw.shutdown().await;
    gw2.shutdown().await;
}

#[tokio::test]
async fn a_stream_created_without_credentials_is_read_only_without() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (config, _) = config(&provider);
    let gw = gateway(config).await;
    let first = send(post_as(gw.url(CHAT), &[])).await;
    assert_eq!(first.status, 200);
    let sid = first.stream_id();
    let with_key = send(get(gw.url(&format!("/streams/{sid}")))).await;
    assert_eq!(with_key.status, 404);
    let without = send(get_as(gw.url(&format!("/streams/{sid}")), &[])).await;
    assert_eq!(without.status, 200);
    gw.shutdown().await;
}

fn known(name: &str, key: &str) -> Client {
    let entry = client_entry(name, key);
    let mut c = recovery_gateway::config::from_toml(&entry).unwrap();
    c.clients.remove(0)
}

fn operator(name: &str, value: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut v = HeaderValue::from_str(value).unwrap();
    v.set_sensitive(true);
    h.insert(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), v);
    h
}

#[tokio::test]
async fn without_a_known_client_key_no_operator_key_is_spent() {
    // The primary fails before its first token; the alternate holds the
    // operator's key.
    let primary = FaultProvider::start(vec![
        Script::status(503),
        Script::status(503),
        Script::status(503),
        Script::status(503),
    ])
    .await
    .unwrap();
    let alternate = FaultProvider::start(vec![happy(), happy()]).await.unwrap();
    let (mut config, _) = config(&primary);
    let alt = format!(
        "[[alternates]]\nlabel = \"b\"\nprotocol = \"openai-chat\"\nurl = \"{}\"\n\
         headers = {{ authorization = \"Bearer sk-operator-alternate\" }}\n",
        alternate.url(CHAT)
    );
    config.alternates = recovery_gateway::config::from_toml(&alt)
        .unwrap()
        .alternates;
    config.upstream_headers = operator("authorization", "Bearer sk-operator-primary");
    config.clients = vec![known("team-a", "ck-team-a-0123456789")];
    let gw = gateway(config).await;

    for headers in [
        &[][..],
        &[("authorization", "Bearer sk-provider-own")][..],
        &[("x-api-key", "ck-team-a-012345678")][..],
    ] {
        let r = send(post_as(gw.url(CHAT), headers)).await;
        assert_eq!(r.status, 401, "{headers:?}: {}", r.text());
        assert_eq!(r.json()["error"]["type"], "authentication_error");
    }
    let metrics = send(get_as(gw.url("/metrics"), &[])).await;
    assert_eq!(metrics.status, 401, "/metrics needs a client key too");
    let health = send(get_as(gw.url("/healthz"), &[])).await;
    assert_eq!(health.status, 200, "/healthz does not");
    assert_eq!(primary.count(), 0, "nothing went upstream");
    assert_eq!(
        alternate.count(),
        0,
        "the operator's alternate key was not spent"
    );

    let ok = send(post_as(
        gw.url(CHAT),
        &[("authorization", "Bearer ck-team-a-0123456789")],
    ))
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let to_primary = primary.requests();
    assert!(!to_primary.is_empty());
    for r in &to_primary {
        assert_eq!(
            r.header("authorization"),
            Some(&b"Bearer sk-operator-primary"[..]),
            "the client key is replaced by the operator's"
        );
    }
    let to_alt = alternate.requests();
    assert_eq!(to_alt.len(), 1);
    assert_eq!(
        to_alt[0].header("authorization"),
        Some(&b"Bearer sk-operator-alternate"[..])
    );
    for r in to_primary.iter().chain(&to_alt) {
        let all = format!("{:?}", r.headers);
        assert!(
            !all.contains("ck-team-a"),
            "the client key went upstream: {all}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_browsers_preflight_is_answered_and_its_keyed_request_checked() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.upstream_headers = operator("authorization", "Bearer sk-operator-primary");
    config.clients = vec![known("team-a", "ck-team-a-0123456789")];
    let gw = gateway(config).await;
    // A CORS preflight carries no credentials: answered here, nothing
    // upstream.
    let preflight = Request::options(gw.url(CHAT))
        .header("origin", "https://chat.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type, x-stainless-os",
        )
        .body(Full::new(Bytes::new()))
        .unwrap();
    let r = send(preflight).await;
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        r.headers["access-control-allow-origin"],
        "https://chat.example"
    );
    assert_eq!(r.headers["access-control-allow-methods"], "POST");
    assert_eq!(
        r.headers["access-control-allow-headers"],
        "authorization, content-type, x-stainless-os"
    );
    assert!(r.headers.contains_key("access-control-max-age"));
    // Any other OPTIONS still needs a key, and so does the request itself.
    let bare = Request::options(gw.url(CHAT))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(bare).await.status, 401);
    let stranger = send(post_as(gw.url(CHAT), &[("origin", "https://chat.example")])).await;
    assert_eq!(stranger.status, 401);
    assert_eq!(provider.count(), 0, "nothing went upstream");
    let ok = send(post_as(
        gw.url(CHAT),
        &[
            ("origin", "https://chat.example"),
            ("authorization", "Bearer ck-team-a-0123456789"),
        ],
    ))
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(provider.count(), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_known_client_on_a_route_sends_the_routes_operator_key() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, _) = config(&provider);
    config.upstream = None;
    config.routes = vec![Route {
        prefix: "/anthropic".into(),
        upstream: provider.base_url().parse().unwrap(),
        strip_prefix: true,
        protocol: RouteProtocol::Auto,
        resumable: true,
        headers: operator("x-api-key", "sk-ant-operator"),
        credential_header: None,
        http2: recovery_gateway::config::Http2::Off,
        declared: recovery_gateway::config::Declared::default(),
    }];
    config.clients = vec![known("team-b", "ck-team-b-0123456789")];
    let gw = gateway(config).await;
    let r = send(post_as(
        gw.url(&format!("/anthropic{CHAT}")),
        &[("x-api-key", "ck-team-b-0123456789")],
    ))
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = &provider.requests()[0];
    assert_eq!(got.header("x-api-key"), Some(&b"sk-ant-operator"[..]));
    gw.shutdown().await;
}

#[tokio::test]
async fn operator_keys_on_an_open_listener_without_clients_are_refused_at_start() {
    let provider = FaultProvider::start(vec![happy()]).await.unwrap();
    let (mut config, lines) = config(&provider);
    config.upstream_headers = operator("authorization", "Bearer sk-operator");
    let mut open = config.clone();
    open.listen = "0.0.0.0:0".parse().unwrap();
    match Gateway::bind(open.clone()).await {
        Err(GatewayError::Unsafe(text)) => {
            assert!(text.contains("[[clients]]"), "{text}");
            assert!(text.contains("hash-key"), "{text}");
            assert!(text.contains("upstream_headers: authorization"), "{text}");
            assert!(!text.contains("sk-operator"), "{text}");
        }
        other => panic!("started: {:?}", other.map(|g| g.local_addr())),
    }
    open.clients = vec![known("c", "ck-open-0123456789ab")];
    let gw = gateway(open).await;
    gw.shutdown().await;
    let gw = gateway(config).await;
    gw.shutdown().await;
    let notice = lines
        .lock()
        .unwrap()
        .iter()
        .any(|l| l.contains("\"operator_credentials\""));
    assert!(notice, "a start-up notice on loopback");
}

#[tokio::test]
async fn the_binary_refuses_an_open_listener_and_hash_key_prints_an_entry() {
    let bin = env!("CARGO_BIN_EXE_recovery-gateway");
    let dir = TempDir::new("gateway-hash-key");
    let file = dir.path().join("g.toml");
    std::fs::write(
        &file,
        "upstream = \"http://127.0.0.1:9\"\n[upstream_headers]\nauthorization = \"$OP_KEY\"\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(bin)
        .args(["--listen", "0.0.0.0:0", "--config"])
        .arg(&file)
        .env("OP_KEY", "Bearer sk-op")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refusing to start") && err.contains("[[clients]]"),
        "{err}"
    );

    let mut child = tokio::process::Command::new(bin)
        .args(["hash-key", "--name", "team-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"ck-team-c-0123456789\n").await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(out.status.success());
    let entry = String::from_utf8(out.stdout).unwrap();
    let c = recovery_gateway::config::from_toml(&entry).unwrap();
    assert_eq!(c.clients, vec![known("team-c", "ck-team-c-0123456789")]);

    let mut child = tokio::process::Command::new(bin)
        .arg("hash-key")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"short\n")
        .await
        .unwrap();
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(2), "a short key is refused");
}
