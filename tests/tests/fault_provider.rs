//! The fault provider does what its scripts say, over real loopback sockets,
//! as seen by a hyper-util legacy client (the client the tower layer wraps).
//!
//! Expected client results are what a hyper-util client reports for each
//! framing and ending (CONTRIBUTING.md, "Test names").
//! Synchronisation is on server-side counters and stall gates; the only
//! timeouts are guards that turn a hang into a failure.

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use recovery_tests::fault::{Ending, FaultProvider, Options, Script, ScriptSet, Transfer, Write};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// A guard against hangs, not a synchronisation device.
const LIMIT: Duration = Duration::from_secs(20);

const EVENT: &str = "data: {\"a\":1}\n\n"; // 15 bytes, like the §6.1 measurements

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("timed out: the provider or client hung")
}

async fn start(scripts: impl Into<ScriptSet>) -> FaultProvider {
    FaultProvider::start(scripts)
        .await
        .expect("provider starts")
}

async fn get(client: &HttpClient, url: &str) -> Result<Response<Incoming>, BoxError> {
    send(client, Method::GET, url, Bytes::new(), &[]).await
}

type BoxError = Box<dyn StdError + Send + Sync>;

async fn send(
    client: &HttpClient,
    method: Method,
    url: &str,
    body: Bytes,
    headers: &[(&str, &str)],
) -> Result<Response<Incoming>, BoxError> {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(Full::new(body)).expect("valid request");
    within(client.request(request)).await.map_err(Into::into)
}

/// Read the body frame by frame: the bytes that arrived, then how it ended.
async fn drain(body: Incoming) -> (Vec<u8>, Result<(), hyper::Error>) {
    within(async move {
        let mut body = body;
        let mut bytes = Vec::new();
        loop {
            match body.frame().await {
                None => return (bytes, Ok(())),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        bytes.extend_from_slice(data);
                    }
                }
                Some(Err(err)) => return (bytes, Err(err)),
            }
        }
    })
    .await
}

/// The first `io::Error` in an error's source chain.
fn io_kind(err: &(dyn StdError + 'static)) -> Option<io::ErrorKind> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        current = e.source();
    }
    None
}

/// The `hyper::Error` in an error's source chain.
fn hyper_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a hyper::Error> {
    let mut current = Some(err);
    while let Some(e) = current {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            return Some(h);
        }
        current = e.source();
    }
    None
}

/// Teardown: the client goes away, and every server connection must close.
async fn finish(provider: &FaultProvider, client: HttpClient) {
    drop(client);
    let stats = within(provider.wait_idle()).await;
    assert_eq!(stats.open_connections, 0);
    assert_eq!(stats.stalls_waiting, 0, "a stall point is still waiting");
}

fn sse(text: &str) -> Script {
    Script::sse(text)
}

// ---------------------------------------------------------------------------
// Framing and endings

#[tokio::test]
async fn content_length_clean_keeps_the_connection_alive() {
    let provider = start(vec![
        sse(EVENT).transfer(Transfer::ContentLength),
        sse("data: [DONE]\n\n").transfer(Transfer::ContentLength),
    ])
    .await;
    let client = client();
    let first = get(&client, &provider.url("/one")).await.unwrap();
    assert_eq!(first.headers()["content-length"], "15");
    assert!(first.headers().get("transfer-encoding").is_none());
    let (bytes, end) = drain(first.into_body()).await;
    assert_eq!(bytes, EVENT.as_bytes());
    end.unwrap();
    let second = get(&client, &provider.url("/two")).await.unwrap();
    let (bytes, end) = drain(second.into_body()).await;
    assert_eq!(bytes, b"data: [DONE]\n\n");
    end.unwrap();

    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].connection, requests[1].connection,
        "the second request reused the pooled connection"
    );
    assert_eq!(provider.stats().connections_accepted, 1);
    finish(&provider, client).await;
}

#[tokio::test]
async fn chunked_clean_delivers_every_write_and_terminates() {
    let provider = start(vec![
        sse(EVENT)
            .write(Write::text("data: [DONE]\n\n").split_at([3, 7]))
            .transfer(Transfer::Chunked),
    ])
    .await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(response.headers()["transfer-encoding"], "chunked");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (bytes, end) = drain(response.into_body()).await;
    end.unwrap();
    assert_eq!(bytes, format!("{EVENT}data: [DONE]\n\n").as_bytes());
    finish(&provider, client).await;
}

#[tokio::test]
async fn close_delimited_then_fin_is_a_clean_end_of_body() {
    let provider = start(vec![sse(EVENT).transfer(Transfer::CloseDelimited)]).await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(response.headers()["connection"], "close");
    assert!(response.headers().get("content-length").is_none());
    assert!(response.headers().get("transfer-encoding").is_none());
    let (bytes, end) = drain(response.into_body()).await;
    assert_eq!(bytes, EVENT.as_bytes());
    end.expect("close-delimited + FIN: the transport cannot see truncation");
    // The server closed its side itself: idle even while the client lives.
    within(provider.wait_idle()).await;
    finish(&provider, client).await;
}

#[tokio::test]
async fn chunked_fin_before_last_chunk_is_a_body_error() {
    let provider = start(vec![sse(EVENT).ending(Ending::Fin)]).await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (bytes, end) = drain(response.into_body()).await;
    assert_eq!(bytes, EVENT.as_bytes(), "bytes sent before the FIN arrive");
    let err = end.expect_err("FIN before the terminator must be a body error");
    assert_eq!(io_kind(&err), Some(io::ErrorKind::UnexpectedEof), "{err:?}");
    finish(&provider, client).await;
}

#[tokio::test]
async fn chunked_rst_is_connection_reset_after_the_bytes_sent() {
    let provider = start(vec![sse(EVENT).ending(Ending::Rst)]).await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    let (bytes, end) = drain(response.into_body()).await;
    assert_eq!(bytes, EVENT.as_bytes());
    let err = end.expect_err("RST must be a body error");
    assert_eq!(
        io_kind(&err),
        Some(io::ErrorKind::ConnectionReset),
        "{err:?}"
    );
    finish(&provider, client).await;
}

#[tokio::test]
async fn close_delimited_rst_is_connection_reset() {
    let provider = start(vec![
        sse(EVENT)
            .transfer(Transfer::CloseDelimited)
            .ending(Ending::Rst),
    ])
    .await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    let (bytes, end) = drain(response.into_body()).await;
    assert_eq!(bytes, EVENT.as_bytes());
    let err = end.expect_err("RST is not a clean end, even close-delimited");
    assert_eq!(io_kind(&err), Some(io::ErrorKind::ConnectionReset));
    finish(&provider, client).await;
}

#[tokio::test]
async fn short_content_length_is_incomplete_body() {
    let provider = start(vec![
        sse(EVENT)
            .content_length(1000)
            .ending(Ending::ShortContentLength),
        // Without an override the declared length is one byte too many.
        sse(EVENT).ending(Ending::ShortContentLength),
    ])
    .await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(response.headers()["content-length"], "1000");
    let (bytes, end) = drain(response.into_body()).await;
    assert_eq!(bytes.len(), 15);
    let err = end.expect_err("short body must be an error");
    assert_eq!(io_kind(&err), Some(io::ErrorKind::UnexpectedEof));
    assert!(format!("{err:?}").contains("IncompleteBody"), "{err:?}");

    let response = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(response.headers()["content-length"], "16");
    let (bytes, end) = drain(response.into_body()).await;
    assert_eq!(bytes, EVENT.as_bytes());
    assert!(end.is_err());
    finish(&provider, client).await;
}

#[tokio::test]
async fn reset_before_head_fails_the_request_after_it_was_read() {
    let provider = start(vec![Script::just(Ending::ResetBeforeHead)]).await;
    let client = client();
    let err = send(
        &client,
        Method::POST,
        &provider.url("/v1/chat/completions"),
        Bytes::from_static(b"{\"stream\":true}"),
        &[("content-type", "application/json")],
    )
    .await
    .expect_err("no response head");
    assert_eq!(
        io_kind(&*err),
        Some(io::ErrorKind::ConnectionReset),
        "{err:?}"
    );
    assert_eq!(provider.count(), 1, "the request reached the server once");
    assert_eq!(&provider.requests()[0].body[..], b"{\"stream\":true}");
    finish(&provider, client).await;
}

#[tokio::test]
async fn fin_before_head_is_an_incomplete_message() {
    let provider = start(vec![Script::just(Ending::FinBeforeHead)]).await;
    let client = client();
    let err = get(&client, &provider.base_url())
        .await
        .expect_err("no response head");
    let hyper_err = hyper_error(&*err).expect("a hyper error in the chain");
    assert!(hyper_err.is_incomplete_message(), "{err:?}");
    assert_eq!(provider.count(), 1);
    finish(&provider, client).await;
}

#[tokio::test]
async fn bodyless_status_has_no_framing_and_keeps_alive() {
    let provider = start(vec![Script::status(204), sse(EVENT)]).await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let (bytes, end) = drain(response.into_body()).await;
    assert!(bytes.is_empty());
    end.unwrap();
    let response = get(&client, &provider.base_url()).await.unwrap();
    let (bytes, _) = drain(response.into_body()).await;
    assert_eq!(bytes, EVENT.as_bytes());
    assert_eq!(provider.stats().connections_accepted, 1);
    finish(&provider, client).await;
}

#[tokio::test]
async fn no_keep_alive_closes_after_a_clean_response() {
    let provider = start(vec![sse(EVENT).no_keep_alive()]).await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    let (_, end) = drain(response.into_body()).await;
    end.unwrap();
    // Closed by the server although the client would have pooled it.
    within(provider.wait_idle()).await;
    finish(&provider, client).await;
}

// ---------------------------------------------------------------------------
// Stalls

#[tokio::test]
async fn never_answer_holds_the_request_until_released() {
    let provider = start(vec![Script::just(Ending::NeverAnswer)]).await;
    let client = client();
    let url = provider.base_url();
    let pending = tokio::spawn({
        let client = client.clone();
        async move { get(&client, &url).await }
    });
    let stats = within(provider.wait_for_stalls(1)).await;
    assert_eq!(stats.stalls_waiting, 1);
    assert_eq!(stats.requests, 1);
    assert!(!pending.is_finished(), "no head was sent yet");
    provider.release(1);
    let err = within(pending)
        .await
        .unwrap()
        .expect_err("FIN without a head");
    assert!(hyper_error(&*err).unwrap().is_incomplete_message());
    finish(&provider, client).await;
}

#[tokio::test]
async fn stall_ending_waits_for_its_handle_then_ends_the_body() {
    let provider = start(vec![sse(EVENT).ending(Ending::Stall)]).await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    let mut body = response.into_body();
    let first = within(body.frame()).await.unwrap().unwrap();
    assert_eq!(first.data_ref().unwrap(), EVENT.as_bytes());
    let next = tokio::spawn(async move { body.frame().await.map(|f| f.map(|_| ())) });
    within(provider.wait_for_stalls(1)).await;
    assert!(!next.is_finished(), "the body stalls until released");
    provider.release(1);
    let end = within(next).await.unwrap().expect("an end, not None");
    let err = end.expect_err("chunked body ended by FIN without terminator");
    assert_eq!(io_kind(&err), Some(io::ErrorKind::UnexpectedEof));
    finish(&provider, client).await;
}

#[tokio::test]
async fn stall_write_gates_the_rest_of_the_body() {
    let provider = start(vec![
        sse(EVENT)
            .write(Write::stall())
            .write(Write::text("data: [DONE]\n\n")),
    ])
    .await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    let mut body = response.into_body();
    let first = within(body.frame()).await.unwrap().unwrap();
    assert_eq!(first.data_ref().unwrap(), EVENT.as_bytes());
    within(provider.wait_for_stalls(1)).await;
    provider.release(1);
    let (rest, end) = drain(body).await;
    end.unwrap();
    assert_eq!(rest, b"data: [DONE]\n\n");
    finish(&provider, client).await;
}

#[tokio::test]
async fn released_permits_and_release_all_pass_later_stalls() {
    let provider = start(vec![sse(EVENT).ending(Ending::Stall)]).await;
    let client = client();
    // A permit given before the stall is reached is not lost.
    provider.release(1);
    let response = get(&client, &provider.base_url()).await.unwrap();
    let (_, end) = drain(response.into_body()).await;
    assert!(end.is_err());
    provider.release_all();
    for _ in 0..3 {
        let response = get(&client, &provider.base_url()).await.unwrap();
        let (bytes, end) = drain(response.into_body()).await;
        assert_eq!(bytes, EVENT.as_bytes());
        assert!(end.is_err());
    }
    assert_eq!(provider.stats().stalls_entered, 4);
    finish(&provider, client).await;
}

#[tokio::test]
async fn a_stall_ends_when_the_client_disconnects() {
    let provider = start(vec![sse(EVENT).ending(Ending::Stall)]).await;
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    within(provider.wait_for_stalls(1)).await;
    drop(response);
    // Never released: the client going away must free the connection.
    finish(&provider, client).await;
}

#[tokio::test]
async fn shutdown_closes_stalled_connections() {
    let provider = start(vec![Script::just(Ending::NeverAnswer)]).await;
    let client = client();
    let url = provider.base_url();
    let pending = tokio::spawn({
        let client = client.clone();
        async move { get(&client, &url).await }
    });
    within(provider.wait_for_stalls(1)).await;
    let observer = provider.clone();
    within(provider.shutdown()).await;
    assert_eq!(observer.open_connections(), 0);
    assert!(within(pending).await.unwrap().is_err());
    drop(client);
}

#[test]
fn a_dedicated_provider_runs_on_its_own_thread() {
    let provider =
        FaultProvider::start_dedicated(Options::new(vec![sse(EVENT).ending(Ending::Stall)]))
            .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let client = client();
        let response = get(&client, &provider.base_url()).await.unwrap();
        within(provider.wait_for_stalls(1)).await;
        provider.release(1);
        let (bytes, end) = drain(response.into_body()).await;
        assert_eq!(bytes, EVENT.as_bytes());
        assert!(end.is_err());
        finish(&provider, client).await;
        within(provider.clone().shutdown()).await;
    });
}

/// Documents a hazard for tests on tokio's paused clock: while the test
/// waits on loopback I/O, the idle runtime auto-advances to its next timer,
/// so a timer armed across a socket wait fires at once, in virtual time.
#[tokio::test(start_paused = true)]
async fn paused_clock_auto_advances_while_waiting_on_sockets() {
    let provider =
        FaultProvider::start_dedicated(Options::new(vec![Script::just(Ending::NeverAnswer)]))
            .unwrap();
    let client = client();
    let request = Request::get(provider.base_url())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let started = tokio::time::Instant::now();
    let virtual_wait = Duration::from_secs(50);
    let outcome = tokio::time::timeout(virtual_wait, client.request(request)).await;
    assert!(outcome.is_err(), "the timer fired while the request waited");
    assert!(started.elapsed() >= virtual_wait);
    drop(client);
    provider.release_all();
}

// ---------------------------------------------------------------------------
// Counters, recorded requests, sequences

#[tokio::test]
async fn counts_per_path_and_keeps_request_bytes() {
    let set = ScriptSet::new(vec![Script::status(404)]).path(
        "/v1/chat/completions",
        vec![Script::status(503), sse(EVENT)],
    );
    let provider = start(set).await;
    let client = client();
    let body = Bytes::from_static(b"{\"model\":\"m\",\"stream\":true,\"x\":\"\xc3\xa9\"}");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer test"),
    ];
    let url = provider.url("/v1/chat/completions?beta=1");
    let first = send(&client, Method::POST, &url, body.clone(), &headers)
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    drain(first.into_body()).await.1.unwrap();
    let second = send(&client, Method::POST, &url, body.clone(), &headers)
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    drain(second.into_body()).await.1.unwrap();
    let other = get(&client, &provider.url("/other")).await.unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);

    assert_eq!(provider.count(), 3);
    assert_eq!(provider.count_path("/v1/chat/completions"), 2);
    assert_eq!(provider.count_path("/other"), 1);
    assert_eq!(provider.count_path("/missing"), 0);
    let sends = provider.requests_for("/v1/chat/completions");
    assert_eq!(sends.len(), 2);
    assert_eq!(sends[0].target, "/v1/chat/completions?beta=1");
    assert_eq!(sends[0].method, "POST");
    assert_eq!(sends[0].body, body);
    assert_eq!(sends[0].body, sends[1].body, "resend is byte-identical");
    assert_eq!(sends[0].headers, sends[1].headers);
    assert_eq!(sends[0].raw_head, sends[1].raw_head);
    assert_eq!(sends[0].header("Authorization"), Some(&b"Bearer test"[..]));
    assert_eq!(
        (sends[0].script_index, sends[1].script_index),
        (0, 1),
        "path sequence consumed in order"
    );
    assert_eq!(provider.requests()[2].path(), "/other");
    finish(&provider, client).await;
}

#[tokio::test]
async fn last_script_repeats_unless_a_default_is_set() {
    let provider = start(vec![Script::status(503), Script::status(200)]).await;
    let client = client();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get(&client, &provider.base_url()).await.unwrap().status());
    }
    assert_eq!(statuses, [503, 200, 200, 200]);

    provider
        .set_scripts(&ScriptSet::new(vec![Script::status(429)]).with_default(Script::status(418)))
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(get(&client, &provider.base_url()).await.unwrap().status());
    }
    assert_eq!(statuses, [429, 418, 418]);
    assert_eq!(provider.count(), 7, "set_scripts keeps the counters");

    provider.reset();
    assert_eq!(provider.count(), 0);
    assert!(provider.requests().is_empty());
    assert_eq!(
        get(&client, &provider.base_url()).await.unwrap().status(),
        429,
        "reset restarts the sequence"
    );
    finish(&provider, client).await;
}

#[tokio::test]
async fn an_empty_script_set_answers_500_no_script() {
    let provider = start(ScriptSet::default()).await;
    let client = client();
    let response = get(&client, &provider.url("/x")).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(response.headers()["x-fault-provider"], "no-script");
    assert_eq!(provider.count(), 1);
    finish(&provider, client).await;
}

#[tokio::test]
async fn hint_headers_arrive_verbatim() {
    let provider = start(vec![
        Script::status(429)
            .header("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT")
            .header("retry-after-ms", "1500")
            .header("x-should-retry", "true")
            .header("x-request-id", "req_123"),
        Script::status(503).header("Retry-After", "2"),
        Script::status(307).header("Location", "/elsewhere"),
    ])
    .await;
    let client = client();
    let r = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.headers()["retry-after"], "Wed, 21 Oct 2015 07:28:00 GMT");
    assert_eq!(r.headers()["retry-after-ms"], "1500");
    assert_eq!(r.headers()["x-should-retry"], "true");
    assert_eq!(r.headers()["x-request-id"], "req_123");
    drain(r.into_body()).await.1.unwrap();
    let r = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "2");
    drain(r.into_body()).await.1.unwrap();
    let r = get(&client, &provider.base_url()).await.unwrap();
    assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(r.headers()["location"], "/elsewhere");
    drain(r.into_body()).await.1.unwrap();
    assert_eq!(
        provider.count_path("/elsewhere"),
        0,
        "the client never followed it"
    );
    finish(&provider, client).await;
}

// ---------------------------------------------------------------------------
// Fixtures, cuts and splits

fn temp_fixtures(name: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("recovery-fault-{name}-{}", std::process::id()));
    for (path, bytes) in files {
        let file = dir.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }
    dir
}

const FIXTURE: &[u8] = b"event: ping\ndata: {}\n\ndata: {\"delta\":\"hello\"}\n\ndata: [DONE]\n\n";

#[tokio::test]
async fn a_fixture_cut_at_any_offset_delivers_exactly_the_prefix() {
    let dir = temp_fixtures("cut", &[("proto/happy.sse", FIXTURE)]);
    let offsets = [0, 1, 11, 21, FIXTURE.len() - 1];
    let mut scripts = Vec::new();
    for &offset in &offsets {
        for ending in [Ending::Rst, Ending::Fin] {
            scripts.push(
                Script::ok()
                    .write(Write::fixture("proto/happy.sse").split_lines())
                    .cut_at(offset)
                    .ending(ending),
            );
        }
    }
    let provider = FaultProvider::start_with(Options {
        fixtures_dir: dir.clone(),
        ..Options::new(scripts)
    })
    .await
    .unwrap();
    let client = client();
    for &offset in &offsets {
        for expected in [io::ErrorKind::ConnectionReset, io::ErrorKind::UnexpectedEof] {
            let response = get(&client, &provider.base_url()).await.unwrap();
            let (bytes, end) = drain(response.into_body()).await;
            assert_eq!(bytes, &FIXTURE[..offset], "cut at {offset}");
            let err = end.expect_err("cut body is an error under chunked framing");
            assert_eq!(io_kind(&err), Some(expected), "cut at {offset}: {err:?}");
        }
    }
    assert_eq!(provider.count(), offsets.len() as u64 * 2);
    finish(&provider, client).await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn fixture_ranges_repeats_and_raw_bytes() {
    let dir = temp_fixtures("range", &[("f.ndjson", b"{\"a\":1}\n{\"b\":2}\n")]);
    let provider = FaultProvider::start_with(Options {
        fixtures_dir: dir.clone(),
        ..Options::new(vec![
            Script::ok()
                .write(Write::text(": keepalive\n\n").repeat(3))
                .write(Write::fixture("f.ndjson").range(8, 16))
                .write(Write::bytes(vec![0xff, 0xfe])),
            // Raw bytes bypass chunked framing: a chunk header promising 16
            // bytes followed by 3, then FIN.
            Script::ok()
                .write(Write::text("10\r\nabc").raw())
                .ending(Ending::Fin),
        ])
    })
    .await
    .unwrap();
    let client = client();
    let response = get(&client, &provider.base_url()).await.unwrap();
    let (bytes, end) = drain(response.into_body()).await;
    end.unwrap();
    let mut expected = b": keepalive\n\n".repeat(3);
    expected.extend_from_slice(b"{\"b\":2}\n");
    expected.extend_from_slice(&[0xff, 0xfe]);
    assert_eq!(bytes, expected);

    let response = get(&client, &provider.base_url()).await.unwrap();
    let (bytes, end) = drain(response.into_body()).await;
    assert_eq!(bytes, b"abc", "hyper hands out the partial chunk");
    assert_eq!(
        io_kind(&end.unwrap_err()),
        Some(io::ErrorKind::UnexpectedEof)
    );
    finish(&provider, client).await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_missing_fixture_or_bad_offset_fails_at_start() {
    let err = FaultProvider::start(vec![Script::ok().write(Write::fixture("no/such.sse"))])
        .await
        .expect_err("missing fixture");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    let err = FaultProvider::start(vec![sse(EVENT).cut_at(99)])
        .await
        .expect_err("cut past the body");
    assert!(err.to_string().contains("cut_at"), "{err}");
    let err = FaultProvider::start(vec![Script::ok().write(Write::text("ab").split_at([5]))])
        .await
        .expect_err("split past the bytes");
    assert!(err.to_string().contains("split"), "{err}");
}

// ---------------------------------------------------------------------------
// Raw-socket checks: chunked request bodies and byte-exact heads

#[tokio::test]
async fn chunked_request_bodies_are_decoded_and_heads_kept_verbatim() {
    let provider = start(vec![Script::status(200)]).await;
    let mut socket = tokio::net::TcpStream::connect(provider.addr())
        .await
        .unwrap();
    let head = "POST /v1/messages HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nX-Case: Kept\r\n\r\n";
    let request = format!("{head}5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\ntrailer: t\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    within(provider.wait_for_requests(1)).await;
    let received = &provider.requests()[0];
    assert_eq!(&received.body[..], b"hello world");
    assert_eq!(&received.raw_head[..], head.as_bytes());
    assert_eq!(received.header("x-case"), Some(&b"Kept"[..]));
    let mut response = Vec::new();
    socket.shutdown().await.unwrap();
    within(socket.read_to_end(&mut response)).await.unwrap();
    let text = String::from_utf8(response).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.ends_with("0\r\n\r\n"), "{text}");
    within(provider.wait_idle()).await;
}

#[tokio::test]
async fn expect_continue_is_answered_before_the_body() {
    let provider = start(vec![Script::status(200)]).await;
    let mut socket = tokio::net::TcpStream::connect(provider.addr())
        .await
        .unwrap();
    socket
        .write_all(
            b"POST /up HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n",
        )
        .await
        .unwrap();
    let mut interim = [0_u8; 25];
    within(socket.read_exact(&mut interim)).await.unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    socket.write_all(b"abc").await.unwrap();
    within(provider.wait_for_requests(1)).await;
    assert_eq!(&provider.requests()[0].body[..], b"abc");
    drop(socket);
    within(provider.wait_idle()).await;
}

#[tokio::test]
async fn refused_addr_refuses_connections() {
    let addr = recovery_tests::fault::refused_addr().unwrap();
    let client = client();
    let err = get(&client, &format!("http://{addr}/"))
        .await
        .expect_err("nothing listens");
    let legacy = err
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .expect("a client error");
    assert!(legacy.is_connect(), "{err:?}");
    assert_eq!(io_kind(&*err), Some(io::ErrorKind::ConnectionRefused));
}

// ---------------------------------------------------------------------------
// Script JSON

#[test]
fn script_json_round_trips_and_accepts_shorthands() {
    let json = r#"{
        "scripts": [
            {"status": 429, "headers": {"retry-after": "2"}},
            {"headers": [["content-type", "text/event-stream"], ["x-a", "1"], ["x-a", "2"]],
             "transfer": "close_delimited",
             "body": ["data: hi\n\n", {"fixture": "anthropic/happy.sse", "start": 0, "end": 40, "split_at": [10], "delay_ms": 0}],
             "cut_at": 30,
             "ending": "rst"}
        ],
        "paths": {"/v1/messages": [{"ending": "never_answer"}]},
        "default": {"status": 404}
    }"#;
    let set = ScriptSet::from_json(json).unwrap();
    assert_eq!(set.scripts[0].status, 429);
    assert_eq!(set.scripts[0].ending, Ending::Clean);
    assert_eq!(set.scripts[1].status, 200);
    assert_eq!(set.scripts[1].headers.0.len(), 3);
    assert_eq!(set.scripts[1].body[0].0, Write::text("data: hi\n\n"));
    assert_eq!(
        set.scripts[1].body[1].0.fixture.as_deref(),
        Some("anthropic/happy.sse")
    );
    assert_eq!(set.paths["/v1/messages"][0].ending, Ending::NeverAnswer);
    assert_eq!(set.default.as_ref().unwrap().status, 404);
    let again = ScriptSet::from_json(&serde_json::to_string(&set).unwrap()).unwrap();
    assert_eq!(again, set);

    let bare = ScriptSet::from_json(r#"[{"status": 503}, {}]"#).unwrap();
    assert_eq!(bare.scripts.len(), 2);

    let err = ScriptSet::from_json(r#"[{"body": [{"fixtur": "x"}]}]"#).unwrap_err();
    assert!(err.0.contains("fixtur"), "{err}");
    let err = ScriptSet::from_json(r#"[{"ending": "explode"}]"#).unwrap_err();
    assert!(err.0.contains("explode"), "{err}");
}

#[test]
fn shipped_example_scripts_parse() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path).unwrap();
            ScriptSet::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(seen > 0, "no example scripts in {}", dir.display());
}

// ---------------------------------------------------------------------------
// The standalone binary: CORS and the control endpoint

struct Standalone {
    child: tokio::process::Child,
    base: String,
}

async fn standalone(script: &str) -> Standalone {
    let file = std::env::temp_dir().join(format!(
        "recovery-fault-script-{}-{}.json",
        std::process::id(),
        script.len()
    ));
    std::fs::write(&file, script).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_fault-provider"))
        .args(["--port", "0", "--script"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("binary starts");
    let stdout = child.stdout.take().unwrap();
    let line = within(BufReader::new(stdout).lines().next_line())
        .await
        .unwrap()
        .expect("a first stdout line");
    let base = line
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");
    std::fs::remove_file(file).unwrap();
    Standalone { child, base }
}

async fn json(client: &HttpClient, method: Method, url: &str, body: &str) -> serde_json::Value {
    let response = send(client, method, url, Bytes::from(body.to_owned()), &[])
        .await
        .unwrap();
    assert_eq!(response.headers()["access-control-allow-origin"], "*");
    let (bytes, end) = drain(response.into_body()).await;
    end.unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn standalone_binary_serves_cors_and_control() {
    let mut server = standalone(
        r#"[{"status": 429, "headers": {"Retry-After": "1", "retry-after-ms": "900"}}, {"body": ["data: hi\n\n"]}]"#,
    )
    .await;
    let base = server.base.clone();
    let client = client();

    // Preflight: answered, not counted, no script consumed.
    let preflight = send(
        &client,
        Method::OPTIONS,
        &format!("{base}/v1/chat/completions"),
        Bytes::new(),
        &[
            ("origin", "http://localhost:8000"),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "content-type, authorization",
            ),
        ],
    )
    .await
    .unwrap();
    assert_eq!(preflight.status(), StatusCode::NO_CONTENT);
    let h = preflight.headers();
    assert_eq!(h["access-control-allow-origin"], "*");
    assert!(
        h["access-control-allow-methods"]
            .to_str()
            .unwrap()
            .contains("POST")
    );
    assert_eq!(
        h["access-control-allow-headers"],
        "content-type, authorization"
    );
    let count = json(&client, Method::GET, &format!("{base}/__fault/count"), "").await;
    assert_eq!(count["requests"], 0);
    assert_eq!(count["preflights"], 1);

    // Scripted requests carry CORS headers, the exposed hint headers, and count.
    let response = send(
        &client,
        Method::POST,
        &format!("{base}/v1/chat/completions"),
        Bytes::from_static(b"{}"),
        &[("content-type", "application/json")],
    )
    .await
    .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = response.headers();
    assert_eq!(h["access-control-allow-origin"], "*");
    let exposed = h["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_owned();
    for name in [
        "retry-after",
        "retry-after-ms",
        "x-request-id",
        "x-should-retry",
    ] {
        assert!(exposed.contains(name), "{name} not exposed: {exposed}");
    }
    assert_eq!(h["retry-after"], "1");
    assert_eq!(h["retry-after-ms"], "900");
    drain(response.into_body()).await.1.unwrap();

    let count = json(&client, Method::GET, &format!("{base}/__fault/count"), "").await;
    assert_eq!(count["requests"], 1);
    assert_eq!(count["paths"]["/v1/chat/completions"], 1);
    let requests = json(
        &client,
        Method::GET,
        &format!("{base}/__fault/requests"),
        "",
    )
    .await;
    assert_eq!(requests[0]["method"], "POST");
    assert_eq!(requests[0]["body"], "{}");

    // Load a new script list without restarting; it also resets the counters.
    let loaded = json(
        &client,
        Method::POST,
        &format!("{base}/__fault/script"),
        r#"{"scripts": [{"status": 201, "body": ["new"]}]}"#,
    )
    .await;
    assert_eq!(loaded["ok"], true);
    let bad = send(
        &client,
        Method::POST,
        &format!("{base}/__fault/script"),
        Bytes::from_static(b"[{\"ending\": \"nope\"}]"),
        &[],
    )
    .await
    .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    drain(bad.into_body()).await.1.unwrap();
    let response = get(&client, &format!("{base}/anything")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(drain(response.into_body()).await.0, b"new");
    let count = json(&client, Method::GET, &format!("{base}/__fault/count"), "").await;
    assert_eq!(count["requests"], 1);

    // Merge one path's sequence: the default sequence and counters survive.
    json(
        &client,
        Method::POST,
        &format!("{base}/__fault/script?merge"),
        r#"{"paths": {"/mine": [{"status": 202}]}}"#,
    )
    .await;
    let mine = get(&client, &format!("{base}/mine")).await.unwrap();
    assert_eq!(mine.status(), StatusCode::ACCEPTED);
    let other = get(&client, &format!("{base}/other")).await.unwrap();
    assert_eq!(other.status(), StatusCode::CREATED, "default sequence kept");
    let count = json(&client, Method::GET, &format!("{base}/__fault/count"), "").await;
    assert_eq!(count["requests"], 3);
    assert_eq!(count["paths"]["/mine"], 1);

    let reset = json(&client, Method::POST, &format!("{base}/__fault/reset"), "").await;
    assert_eq!(reset["ok"], true);
    let count = json(&client, Method::GET, &format!("{base}/__fault/count"), "").await;
    assert_eq!(count["requests"], 0);
    assert_eq!(count["preflights"], 0);

    // Stall gates over HTTP.
    json(
        &client,
        Method::POST,
        &format!("{base}/__fault/script"),
        r#"[{"ending": "never_answer"}]"#,
    )
    .await;
    let pending = tokio::spawn({
        let client = client.clone();
        let url = format!("{base}/stalled");
        async move { get(&client, &url).await }
    });
    let count = json(
        &client,
        Method::GET,
        &format!("{base}/__fault/wait?stalls=1"),
        "",
    )
    .await;
    assert_eq!(count["stalls_waiting"], 1);
    assert_eq!(count["requests"], 1);
    json(
        &client,
        Method::POST,
        &format!("{base}/__fault/release?n=1"),
        "",
    )
    .await;
    assert!(within(pending).await.unwrap().is_err());

    drop(client);
    server.child.kill().await.unwrap();
}
