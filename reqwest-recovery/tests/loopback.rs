//! The reqwest drivers against the loopback fault provider, over real
//! sockets: the tower stack over `ReqwestService` and `RecoveryMiddleware`
//! in a `ClientWithMiddleware`, each run on the same script as the tower
//! stack over a hyper-util client. Every scenario checks what the consumer
//! got and what the server received, and that the report and the lifecycle
//! events are those of the hyper-util run (timings and jitter aside).

use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use recovery_core::error::RecoveryError;
use recovery_core::failure::Phase;
use recovery_core::outcome::{InterruptCause, Outcome};
use recovery_core::policy::RecoveryPolicy;
use recovery_core::protocol::{ProtocolKind, SseTerminal};
use recovery_core::report::RecoveryReport;
use recovery_tests::fault::{Ending, FaultProvider, Script, ScriptSet, Write};
use reqwest_middleware::{Middleware, Next};
use reqwest_recovery::{
    ErrorKind, RecoveryMiddleware, ReqwestService, client_builder, middleware_error, recovery_error,
};
use tower::ServiceExt;
use tower_recovery::{ObserveLayer, RecoveryLayer, ReplayBody, ReportHandle};

#[path = "support/sdk.rs"]
mod sdk;

use sdk::{Events, HAPPY, LIMIT, PATH, after_events, failed_phases, layer};

const PROMPT: &str =
    r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"canary-prompt"}]}"#;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// The reference: the tower stack over a hyper-util client.
    Hyper,
    /// The tower stack over `ReqwestService`.
    Service,
    /// `RecoveryMiddleware` in a `ClientWithMiddleware`.
    Middleware,
}

/// What one request through one driver came to.
#[derive(Debug)]
struct Run {
    driver: Driver,
    /// The response status, when the call resolved with a response.
    status: Option<u16>,
    /// The body bytes the consumer received.
    body: Vec<u8>,
    /// The typed error that ended the body.
    body_error: Option<RecoveryError>,
    /// The typed error the call itself failed with (no response).
    call_error: Option<RecoveryError>,
    report: RecoveryReport,
    events: Vec<String>,
    /// What the server received on `PATH`.
    sends: u64,
}

fn request(url: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-canary-secret")
        .body(Full::new(Bytes::from_static(PROMPT.as_bytes())))
        .unwrap()
}

/// Reads a tower response to its end (or its first error).
async fn drain<B>(
    response: http::Response<B>,
) -> (u16, Vec<u8>, Option<RecoveryError>, RecoveryReport)
where
    B: http_body::Body<Data = Bytes, Error = RecoveryError> + Unpin,
{
    let status = response.status().as_u16();
    let report = response
        .extensions()
        .get::<ReportHandle>()
        .cloned()
        .expect("report handle");
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    let mut error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => bytes.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    drop(body);
    (status, bytes, error, report.report())
}

async fn run(driver: Driver, url: &str) -> Run {
    let events: Events = Arc::default();
    let layer = layer(&events);
    let outcome = tokio::time::timeout(LIMIT, async {
        match driver {
            Driver::Hyper => {
                let client = Client::builder(TokioExecutor::new()).build_http::<ReplayBody>();
                let svc = tower::ServiceBuilder::new()
                    .layer(layer)
                    .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
                    .service(client);
                match svc.oneshot(request(url)).await {
                    Ok(response) => Ok(drain(response).await),
                    Err(e) => Err(e),
                }
            }
            Driver::Service => {
                let client = ReqwestService::new(client_builder().build().unwrap());
                let svc = tower::ServiceBuilder::new()
                    .layer(layer)
                    .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
                    .service(client);
                match svc.oneshot(request(url)).await {
                    Ok(response) => Ok(drain(response).await),
                    Err(e) => Err(e),
                }
            }
            Driver::Middleware => {
                let client =
                    reqwest_middleware::ClientBuilder::new(client_builder().build().unwrap())
                        .with(
                            RecoveryMiddleware::new(layer)
                                .observe(ObserveLayer::new(ProtocolKind::OpenAiChat)),
                        )
                        .build();
                let sent = client
                    .post(url)
                    .header("content-type", "application/json")
                    .header("authorization", "Bearer sk-canary-secret")
                    .body(PROMPT)
                    .send()
                    .await;
                match sent {
                    Ok(response) => Ok(read_reqwest(response).await),
                    Err(e) => Err(middleware_error(&e)
                        .cloned()
                        .unwrap_or_else(|| panic!("not a recovery error: {e:?}"))),
                }
            }
        }
    })
    .await
    .expect("hung");
    let events = events.lock().unwrap().clone();
    let terminal = events
        .iter()
        .filter(|n| {
            matches!(
                n.as_str(),
                "completed" | "exhausted" | "interrupted" | "cancelled"
            )
        })
        .count();
    assert_eq!(
        terminal, 1,
        "{driver:?}: exactly one terminal event: {events:?}"
    );
    match outcome {
        Ok((status, body, body_error, report)) => Run {
            driver,
            status: Some(status),
            body,
            body_error,
            call_error: None,
            report,
            events,
            sends: 0,
        },
        Err(e) => Run {
            driver,
            status: None,
            body: Vec::new(),
            body_error: None,
            report: e.report().clone(),
            call_error: Some(e),
            events,
            sends: 0,
        },
    }
}

/// Reads a `reqwest::Response` as a reqwest caller does, with `chunk`.
async fn read_reqwest(
    mut response: reqwest::Response,
) -> (u16, Vec<u8>, Option<RecoveryError>, RecoveryReport) {
    let status = response.status().as_u16();
    let report = response
        .extensions()
        .get::<ReportHandle>()
        .cloned()
        .expect("report handle");
    let mut bytes = Vec::new();
    let mut error = None;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => {
                let typed = recovery_error(&e)
                    .cloned()
                    .unwrap_or_else(|| panic!("a body error without its recovery error: {e:?}"));
                error = Some(typed);
                break;
            }
        }
    }
    drop(response);
    (status, bytes, error, report.report())
}

/// Runs `scripts` through every driver, each on a fresh provider, and
/// checks the invariants every run shares.
async fn every_driver(scripts: impl Fn() -> ScriptSet) -> Vec<Run> {
    let mut runs = Vec::new();
    for driver in [Driver::Hyper, Driver::Service, Driver::Middleware] {
        let provider = FaultProvider::start(scripts()).await.unwrap();
        let mut run = run(driver, &provider.url(PATH)).await;
        let stats = tokio::time::timeout(LIMIT, provider.wait_idle())
            .await
            .expect("connections left open");
        assert_eq!(stats.open_connections, 0, "{driver:?}");
        run.sends = provider.count_path(PATH);
        let sent = provider.requests_for(PATH);
        for r in &sent {
            assert_eq!(
                r.body,
                PROMPT.as_bytes(),
                "{driver:?}: every send carries the prompt"
            );
            assert_eq!(r.method, "POST");
        }
        assert_eq!(
            u64::from(run.report.attempt_count()),
            run.sends,
            "{driver:?}: the report counts what the server received"
        );
        runs.push(run);
    }
    same_as_hyper(&runs);
    runs
}

/// The report without what differs from run to run (times, jitter, ids).
fn shape(report: &RecoveryReport) -> serde_json::Value {
    let mut v = serde_json::to_value(report).unwrap();
    let obj = v.as_object_mut().unwrap();
    obj.remove("logical_id");
    obj.remove("metrics");
    for a in obj["attempts"].as_array_mut().unwrap() {
        let a = a.as_object_mut().unwrap();
        a.remove("started_ms");
        a.remove("ended_ms");
    }
    for d in obj["delays"].as_array_mut().unwrap() {
        d.as_object_mut().unwrap().remove("delay_ms");
    }
    v
}

/// Both reqwest drivers say what the hyper-util driver says.
fn same_as_hyper(runs: &[Run]) {
    let hyper = &runs[0];
    assert_eq!(hyper.driver, Driver::Hyper);
    for run in &runs[1..] {
        let d = run.driver;
        assert_eq!(run.status, hyper.status, "{d:?}: status");
        assert_eq!(run.body, hyper.body, "{d:?}: delivered bytes");
        assert_eq!(run.sends, hyper.sends, "{d:?}: sends");
        assert_eq!(shape(&run.report), shape(&hyper.report), "{d:?}: report");
        assert_eq!(run.events, hyper.events, "{d:?}: lifecycle events");
        assert_eq!(
            run.body_error.as_ref().map(RecoveryError::outcome),
            hyper.body_error.as_ref().map(RecoveryError::outcome),
            "{d:?}: body error"
        );
        assert_eq!(
            run.call_error.as_ref().map(RecoveryError::outcome),
            hyper.call_error.as_ref().map(RecoveryError::outcome),
            "{d:?}: call error"
        );
    }
}

/// The kind of the reqwest error recovery kept as the cause.
fn cause_kind(err: &RecoveryError) -> Option<ErrorKind> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = err.inspect_cause().map(|c| c as _);
    while let Some(e) = cur {
        if let Some(ours) = e.downcast_ref::<reqwest_recovery::Error>() {
            return Some(ours.kind());
        }
        cur = e.source();
    }
    None
}

#[tokio::test]
async fn reset_before_the_head_is_replayed_and_the_answer_arrives_once() {
    let runs = every_driver(|| {
        ScriptSet::new(vec![]).path(
            PATH,
            vec![
                Script::just(Ending::ResetBeforeHead),
                Script::event_stream(Write::fixture(HAPPY).split_lines()),
            ],
        )
    })
    .await;
    for run in &runs {
        let d = run.driver;
        assert_eq!(run.status, Some(200), "{d:?}");
        assert_eq!(
            run.body,
            recovery_tests::process::fixture(HAPPY),
            "{d:?}: the whole answer, once"
        );
        assert!(run.body_error.is_none(), "{d:?}: {:?}", run.body_error);
        assert_eq!(run.sends, 2, "{d:?}");
        assert!(
            matches!(run.report.outcome, Some(Outcome::Completed { .. })),
            "{d:?}"
        );
        assert_eq!(run.report.resend_count, 1, "{d:?}");
        assert_eq!(
            failed_phases(&run.report),
            [Phase::AwaitingHeaders],
            "{d:?}"
        );
    }
}

#[tokio::test]
async fn body_reset_before_the_first_token_replays_without_repeating_the_prefix() {
    // The first attempt sends its head and the role-only event (no
    // semantic output), then resets: held back, invisible, replayed.
    let cut = after_events(1);
    let runs = every_driver(|| {
        ScriptSet::new(vec![]).path(
            PATH,
            vec![
                Script::event_stream(Write::fixture(HAPPY).split_lines())
                    .cut_at(cut)
                    .ending(Ending::Rst),
                Script::event_stream(Write::fixture(HAPPY).split_lines()),
            ],
        )
    })
    .await;
    for run in &runs {
        let d = run.driver;
        assert_eq!(
            run.body,
            recovery_tests::process::fixture(HAPPY),
            "{d:?}: the prefix is not repeated"
        );
        assert_eq!(run.sends, 2, "{d:?}");
        assert!(
            matches!(run.report.outcome, Some(Outcome::Completed { .. })),
            "{d:?}"
        );
        assert_eq!(failed_phases(&run.report), [Phase::Streaming], "{d:?}");
    }
}

#[tokio::test]
async fn status_503_then_success_is_invisible() {
    let runs = every_driver(|| {
        ScriptSet::new(vec![]).path(
            PATH,
            vec![
                Script::status(503)
                    .header("retry-after-ms", "10")
                    .write(Write::text(r#"{"error":{"message":"overloaded"}}"#)),
                Script::event_stream(Write::fixture(HAPPY)),
            ],
        )
    })
    .await;
    for run in &runs {
        let d = run.driver;
        assert_eq!(
            run.status,
            Some(200),
            "{d:?}: the 503 never reaches the caller"
        );
        assert_eq!(run.body, recovery_tests::process::fixture(HAPPY), "{d:?}");
        assert_eq!(run.sends, 2, "{d:?}");
        assert_eq!(run.report.attempts[0].status, Some(503), "{d:?}");
        assert!(
            matches!(run.report.outcome, Some(Outcome::Completed { .. })),
            "{d:?}"
        );
    }
}

#[tokio::test]
async fn reset_after_the_first_token_is_a_typed_body_error_not_a_truncation() {
    let cut = after_events(2);
    let runs = every_driver(|| {
        ScriptSet::new(vec![]).path(
            PATH,
            vec![
                Script::event_stream(Write::fixture(HAPPY).split_lines())
                    .cut_at(cut)
                    .ending(Ending::Rst),
            ],
        )
    })
    .await;
    for run in &runs {
        let d = run.driver;
        assert_eq!(run.status, Some(200), "{d:?}");
        assert_eq!(
            run.body,
            &recovery_tests::process::fixture(HAPPY)[..cut],
            "{d:?}: the committed prefix, nothing more"
        );
        let err = run
            .body_error
            .as_ref()
            .expect("a typed error ends the body");
        assert!(
            matches!(
                err.outcome(),
                Outcome::Interrupted {
                    committed: true,
                    ..
                }
            ),
            "{d:?}: {err}"
        );
        assert_eq!(run.sends, 1, "{d:?}: no replay after semantic output");
        assert_eq!(run.events.last().map(String::as_str), Some("interrupted"));
        if d != Driver::Hyper {
            assert_eq!(
                cause_kind(err),
                Some(ErrorKind::Body),
                "{d:?}: reqwest's body error kept"
            );
        }
    }
}

#[tokio::test]
async fn refused_connections_exhaust_with_a_typed_error_like_hyper_util() {
    let addr = recovery_tests::fault::refused_addr().unwrap();
    let url = format!("http://{addr}{PATH}");
    let mut runs = Vec::new();
    for driver in [Driver::Hyper, Driver::Service, Driver::Middleware] {
        runs.push(run(driver, &url).await);
    }
    same_as_hyper(&runs);
    for run in &runs {
        let d = run.driver;
        let err = run.call_error.as_ref().expect("no response at all");
        assert_eq!(err.outcome(), &Outcome::Exhausted { attempts: 3 }, "{d:?}");
        assert_eq!(
            failed_phases(&run.report),
            [Phase::Connecting; 3],
            "{d:?}: refused, not sent"
        );
        let rendered = format!("{err} {err:?} {}", serde_json::to_string(err).unwrap());
        assert!(!rendered.contains("canary"), "{d:?}: redacted: {rendered}");
        if d != Driver::Hyper {
            assert_eq!(cause_kind(err), Some(ErrorKind::Connect), "{d:?}");
        }
    }
}

#[tokio::test]
async fn a_redirect_is_handed_back_not_followed() {
    let runs = every_driver(|| {
        ScriptSet::new(vec![])
            .path(
                PATH,
                vec![Script::status(307).header("location", "/elsewhere")],
            )
            .path(
                "/elsewhere",
                vec![Script::event_stream(Write::fixture(HAPPY))],
            )
    })
    .await;
    for run in &runs {
        let d = run.driver;
        assert_eq!(run.status, Some(307), "{d:?}");
        assert_eq!(run.sends, 1, "{d:?}");
        assert!(
            matches!(run.report.outcome, Some(Outcome::Permanent { .. })),
            "{d:?}"
        );
    }
}

/// Counts the sends that reach it, further down the middleware chain.
struct Counting(Arc<AtomicU32>);

#[async_trait::async_trait]
impl Middleware for Counting {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        self.0.fetch_add(1, SeqCst);
        next.run(req, extensions).await
    }
}

#[tokio::test]
async fn every_send_runs_the_rest_of_the_middleware_chain() {
    let provider = FaultProvider::start(ScriptSet::new(vec![]).path(
        PATH,
        vec![
            Script::just(Ending::ResetBeforeHead),
            Script::status(503).header("retry-after-ms", "10"),
            Script::event_stream(Write::fixture(HAPPY)),
        ],
    ))
    .await
    .unwrap();
    let counted = Arc::new(AtomicU32::new(0));
    let events: Events = Arc::default();
    let client = reqwest_middleware::ClientBuilder::new(client_builder().build().unwrap())
        .with(RecoveryMiddleware::new(layer(&events)))
        .with(Counting(Arc::clone(&counted)))
        .build();
    let response = tokio::time::timeout(LIMIT, client.post(provider.url(PATH)).body(PROMPT).send())
        .await
        .expect("hung")
        .expect("a response");
    let (status, body, error, report) = read_reqwest(response).await;
    assert_eq!(status, 200);
    assert!(error.is_none());
    assert_eq!(body, recovery_tests::process::fixture(HAPPY));
    assert_eq!(
        counted.load(SeqCst),
        3,
        "each send went through the next middleware"
    );
    assert_eq!(provider.count_path(PATH), 3);
    assert_eq!(report.attempt_count(), 3);
}

/// A generic SSE stream that proves its end with `[DONE]`.
fn sse_kind() -> ProtocolKind {
    ProtocolKind::Sse {
        terminal_sentinel: Some(SseTerminal::Data("[DONE]".into())),
    }
}

#[tokio::test]
async fn a_resume_after_commit_through_the_middleware_fails_typed_without_a_send() {
    // A stream declared resumable: through the tower stack over reqwest it
    // is resumed with Last-Event-ID; through the middleware the chain has
    // returned by then, so the resume is refused before anything is sent.
    const EVENTS: &str = "/events";
    let first = "id: 1\ndata: one\n\n";
    let rest = "id: 2\ndata: two\n\ndata: [DONE]\n\n";
    let scripts = || {
        ScriptSet::new(vec![]).path(
            EVENTS,
            vec![
                Script::event_stream(Write::text(first)).ending(Ending::Rst),
                Script::event_stream(Write::text(rest)),
            ],
        )
    };

    let provider = FaultProvider::start(scripts()).await.unwrap();
    let events: Events = Arc::default();
    let svc = tower::ServiceBuilder::new()
        .layer(layer(&events).with_resumable_sse(true))
        .layer(ObserveLayer::new(sse_kind()))
        .service(ReqwestService::new(client_builder().build().unwrap()));
    let response = tokio::time::timeout(LIMIT, svc.oneshot(request(&provider.url(EVENTS))))
        .await
        .expect("hung")
        .expect("a response");
    let (_, body, error, report) = drain(response).await;
    assert!(error.is_none(), "{error:?}");
    assert_eq!(body, format!("{first}{rest}").as_bytes());
    assert_eq!(report.resumes, 1);
    assert_eq!(provider.count_path(EVENTS), 2);
    let resumed = &provider.requests_for(EVENTS)[1];
    assert_eq!(resumed.header("last-event-id"), Some(&b"1"[..]));

    let provider = FaultProvider::start(scripts()).await.unwrap();
    let events: Events = Arc::default();
    let client = reqwest_middleware::ClientBuilder::new(client_builder().build().unwrap())
        .with(
            RecoveryMiddleware::new(layer(&events).with_resumable_sse(true))
                .observe(ObserveLayer::new(sse_kind())),
        )
        .build();
    let response =
        tokio::time::timeout(LIMIT, client.post(provider.url(EVENTS)).body(PROMPT).send())
            .await
            .expect("hung")
            .expect("a response");
    let (_, body, error, report) = read_reqwest(response).await;
    assert_eq!(body, first.as_bytes(), "the committed prefix, nothing more");
    let error = error.expect("a typed error ends the body");
    assert_eq!(cause_kind(&error), Some(ErrorKind::ChainEnded), "{error:?}");
    assert_eq!(
        provider.count_path(EVENTS),
        1,
        "the refused resume sent nothing"
    );
    // The machine debits a send before it is made: the refused resume is
    // on record as an attempt that failed connecting, never accepted.
    assert_eq!(report.attempt_count(), 2);
    let resume = &report.attempts[1];
    assert!(resume.resume);
    assert_eq!(resume.status, None);
    assert_eq!(
        resume.acceptance,
        Some(recovery_core::failure::Acceptance::No)
    );
    assert_eq!(
        failed_phases(&report),
        [Phase::Streaming, Phase::Connecting]
    );
    assert!(matches!(
        report.outcome,
        Some(Outcome::Interrupted {
            cause: InterruptCause::ResumeFailed,
            committed: true,
            ..
        })
    ));
    assert_eq!(
        events.lock().unwrap().last().map(String::as_str),
        Some("interrupted")
    );
}

/// reqwest's `connect_timeout` fires before a connection: the request
/// never went out, so a local endpoint's request is retried (not refused
/// for want of an admission hook), in both reqwest drivers.
#[tokio::test]
async fn a_connect_timeout_never_sent_the_request_and_is_retried() {
    let listener = recovery_tests::fault::UnansweredListener::new().unwrap();
    let addr = listener.addr();
    let url = format!("http://{addr}{PATH}");
    let policy = RecoveryPolicy::builder()
        .max_attempts(NonZeroU32::new(2).unwrap())
        .backoff(Duration::from_millis(5), Duration::from_millis(20))
        .endpoint(recovery_core::policy::Endpoint::Local)
        .build()
        .unwrap();
    let reqwest = || {
        client_builder()
            .connect_timeout(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let through_service = tower::ServiceBuilder::new()
        .layer(RecoveryLayer::new(policy.clone()))
        .layer(ObserveLayer::new(ProtocolKind::OpenAiChat))
        .service(ReqwestService::new(reqwest()))
        .oneshot(request(&url));
    let service_err = tokio::time::timeout(LIMIT, through_service)
        .await
        .expect("hung")
        .expect_err("no connection can be made");
    let middleware = reqwest_middleware::ClientBuilder::new(reqwest())
        .with(RecoveryMiddleware::new(RecoveryLayer::new(policy)))
        .build();
    let sent = tokio::time::timeout(LIMIT, middleware.post(&url).body(PROMPT).send())
        .await
        .expect("hung")
        .expect_err("no connection can be made");
    let middleware_err = middleware_error(&sent).expect("a recovery error").clone();
    for err in [service_err, middleware_err] {
        assert_eq!(err.outcome(), &Outcome::Exhausted { attempts: 2 });
        assert_eq!(failed_phases(err.report()), [Phase::Connecting; 2]);
        assert_eq!(cause_kind(&err), Some(ErrorKind::Connect));
    }
    drop(listener);
}
