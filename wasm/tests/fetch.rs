//! The fetch driver against the loopback fault provider, in every runtime
//! the runner offers (Node, a Chromium page, a dedicated worker): the WS
//! rows of the reliability matrix and the driver's replay/commit rules.
//! `scripts/test-wasm.sh` starts the servers and bakes their URLs in.
#![cfg(target_arch = "wasm32")]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::{Either, select};
use js_sys::{Array, Function, JSON, Object, Reflect, Uint8Array};
use recovery_core::timing::Timing;
use recovery_wasm::platform::{JsTiming, random_u64};
use recovery_wasm::{Call, RecoveryClient};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::wasm_bindgen_test;

const HAPPY: &[u8] = include_bytes!("../../tests/fixtures/openai-chat/happy-usage.sse");
const ROLE_ONLY_CUT: &str = "openai-chat/role-only-then-cut.sse";
const ANTHROPIC_HAPPY: &[u8] = include_bytes!("../../tests/fixtures/anthropic/happy.sse");

fn env_url(value: Option<&'static str>, name: &str) -> String {
    value
        .unwrap_or_else(|| panic!("{name} is not set: run scripts/test-wasm.sh"))
        .trim_end_matches('/')
        .to_owned()
}

fn fault_url() -> String {
    env_url(option_env!("RECOVERY_FAULT_URL"), "RECOVERY_FAULT_URL")
}

#[wasm_bindgen(inline_js = r#"
export function is_browser() {
  return typeof globalThis.document !== 'undefined' || typeof globalThis.WorkerGlobalScope !== 'undefined';
}
let online = true;
export function set_online(flag) {
  online = flag;
  if (typeof globalThis.navigator === 'undefined') {
    globalThis.navigator = {};
  }
  Object.defineProperty(globalThis.navigator, 'onLine', { get: () => online, configurable: true });
  if (typeof globalThis.addEventListener !== 'function') {
    const target = new EventTarget();
    globalThis.addEventListener = target.addEventListener.bind(target);
    globalThis.removeEventListener = target.removeEventListener.bind(target);
    globalThis.dispatchEvent = target.dispatchEvent.bind(target);
  }
}
export function go_online_soon() {
  setTimeout(() => { set_online(true); globalThis.dispatchEvent(new Event('online')); }, 0);
}
"#)]
extern "C" {
    fn is_browser() -> bool;
    fn set_online(flag: bool);
    fn go_online_soon();
}

fn global_fetch() -> Function {
    Reflect::get(&js_sys::global(), &"fetch".into())
        .unwrap()
        .unchecked_into()
}

async fn http(method: &str, url: &str, body: Option<&str>) -> JsValue {
    let init = Object::new();
    Reflect::set(&init, &"method".into(), &method.into()).unwrap();
    if let Some(b) = body {
        Reflect::set(&init, &"body".into(), &b.into()).unwrap();
    }
    let resp: web_sys::Response = JsFuture::from(js_sys::Promise::resolve(
        &global_fetch()
            .call2(&js_sys::global(), &url.into(), &init)
            .unwrap(),
    ))
    .await
    .unwrap()
    .unchecked_into();
    let text = JsFuture::from(resp.text().unwrap()).await.unwrap();
    JSON::parse(&text.as_string().unwrap()).unwrap_or(text)
}

/// A fresh path on the shared provider (unique per run and test).
fn path(test: &str, tail: &str) -> String {
    format!("/t/{:016x}/{test}{tail}", random_u64())
}

/// Loads per-path scripts without touching other paths or counters.
async fn load(scripts: &[(&str, serde_json::Value)]) {
    let mut paths = serde_json::Map::new();
    for (p, s) in scripts {
        paths.insert((*p).to_owned(), s.clone());
    }
    let body = serde_json::json!({ "paths": paths }).to_string();
    let answer = http(
        "POST",
        &format!("{}/__fault/script?merge", fault_url()),
        Some(&body),
    )
    .await;
    assert!(
        get(&answer, "error").is_undefined(),
        "script refused: {:?}",
        JSON::stringify(&answer)
    );
}

/// Releases one stall point of the provider.
async fn release() {
    http(
        "POST",
        &format!("{}/__fault/release?n=1", fault_url()),
        None,
    )
    .await;
}

async fn count(p: &str) -> u64 {
    let c = http("GET", &format!("{}/__fault/count", fault_url()), None).await;
    get(&get(&c, "paths"), p).as_f64().unwrap_or(0.0) as u64
}

fn get(v: &JsValue, key: &str) -> JsValue {
    if v.is_object() {
        Reflect::get(v, &key.into()).unwrap_or(JsValue::UNDEFINED)
    } else {
        JsValue::UNDEFINED
    }
}

fn s(v: &JsValue) -> String {
    v.as_string().unwrap_or_default()
}

/// Everything a test looks at after a request.
struct Run {
    call: Rc<Call>,
    events: Rc<RefCell<Vec<JsValue>>>,
}

impl Run {
    fn names(&self) -> Vec<String> {
        self.events
            .borrow()
            .iter()
            .map(|e| s(&get(e, "event")))
            .collect()
    }

    fn assert_one_terminal(&self) {
        let names = self.names();
        let terminals = names
            .iter()
            .filter(|n| {
                matches!(
                    n.as_str(),
                    "completed" | "exhausted" | "interrupted" | "cancelled"
                )
            })
            .count();
        assert_eq!(terminals, 1, "exactly one terminal event: {names:?}");
        assert!(
            matches!(
                names.last().map(String::as_str),
                Some("completed" | "exhausted" | "interrupted" | "cancelled")
            ),
            "terminal event last: {names:?}"
        );
    }

    fn outcome(&self) -> String {
        s(&get(&self.call.outcome(), "outcome"))
    }

    fn event(&self, name: &str) -> JsValue {
        self.events
            .borrow()
            .iter()
            .find(|e| s(&get(e, "event")) == name)
            .cloned()
            .unwrap_or(JsValue::UNDEFINED)
    }
}

/// Called with each event name (and the call, to cancel it from a callback).
type EventHook = Box<dyn Fn(&str, &Rc<Call>)>;
type Hook = Rc<RefCell<Option<EventHook>>>;

#[allow(clippy::needless_pass_by_value)]
fn start(options: serde_json::Value, url: &str, hook: Option<EventHook>) -> Run {
    start_with(&options, url, hook, global_fetch())
}

fn start_with(
    options: &serde_json::Value,
    url: &str,
    hook: Option<EventHook>,
    fetch: Function,
) -> Run {
    let client =
        RecoveryClient::new(&JsValue::from_str(&options.to_string())).expect("valid options");
    let events = Rc::new(RefCell::new(Vec::new()));
    let slot: Rc<RefCell<Option<Rc<Call>>>> = Rc::new(RefCell::new(None));
    let hook: Hook = Rc::new(RefCell::new(hook));
    let on_event = {
        let events = Rc::clone(&events);
        let slot = Rc::clone(&slot);
        Closure::<dyn FnMut(JsValue)>::new(move |e: JsValue| {
            let name = s(&get(&e, "event"));
            events.borrow_mut().push(e);
            if let (Some(h), Some(call)) = (hook.borrow().as_ref(), slot.borrow().as_ref()) {
                h(&name, call);
            }
        })
        .into_js_value()
        .unchecked_into::<Function>()
    };
    let headers = Array::of1(&Array::of2(
        &"content-type".into(),
        &"application/json".into(),
    ));
    let body = Uint8Array::from(&b"{\"stream\":true}"[..]);
    let call = Rc::new(client.call(
        fetch,
        url.to_owned(),
        "POST".into(),
        headers,
        Some(body),
        Some(on_event),
        None,
        None,
        None,
    ));
    *slot.borrow_mut() = Some(Rc::clone(&call));
    Run { call, events }
}

/// Awaits `start()`: `Ok(result object)` or `Err(failure object)`.
async fn begin(run: &Run) -> Result<JsValue, JsValue> {
    JsFuture::from(run.call.start()).await
}

/// Reads the stitched body to its end: the bytes and the error, if any.
async fn drain(run: &Run) -> (Vec<u8>, Option<JsValue>) {
    let mut out = Vec::new();
    loop {
        match JsFuture::from(run.call.next()).await {
            Ok(v) if v.is_undefined() => return (out, None),
            Ok(v) => out.extend(v.unchecked_into::<Uint8Array>().to_vec()),
            Err(e) => return (out, Some(e)),
        }
    }
}

fn fast() -> serde_json::Value {
    serde_json::json!({ "protocol": "openai-chat", "backoffBaseMs": 1, "backoffCeilingMs": 2 })
}

#[allow(clippy::needless_pass_by_value)]
fn sse(body: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "headers": {"content-type": "text/event-stream"}, "body": body })
}

fn happy() -> serde_json::Value {
    sse(serde_json::json!([{ "fixture": "openai-chat/happy-usage.sse" }]))
}

#[wasm_bindgen_test]
async fn happy_stream_completes_with_one_send() {
    let p = path("happy", "/v1/chat/completions");
    load(&[(&p, serde_json::json!([happy()]))]).await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    let head = begin(&run).await.expect("committed");
    assert_eq!(s(&get(&head, "kind")), "committed");
    assert_eq!(get(&get(&head, "response"), "status").as_f64(), Some(200.0));
    let (bytes, err) = drain(&run).await;
    assert!(err.is_none());
    assert_eq!(bytes, HAPPY);
    assert_eq!(run.outcome(), "completed");
    assert_eq!(
        run.names(),
        [
            "attempt_started",
            "committed",
            "attempt_succeeded",
            "completed"
        ]
    );
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 1);
    // Events carry the Rust serde field names.
    let started = run.event("attempt_started");
    for key in [
        "logical_id",
        "attempt_id",
        "wire_attempt",
        "at_ms",
        "event",
        "max_attempts",
        "resume",
    ] {
        assert!(
            Reflect::has(&started, &key.into()).unwrap(),
            "attempt_started.{key}"
        );
    }
    let report = run.call.report();
    assert_eq!(get(&report, "committed_attempt").as_f64(), Some(1.0));
    let progress = get(&Array::from(&get(&report, "attempts")).get(0), "progress");
    assert_eq!(
        get(&progress, "delivered_bytes").as_f64(),
        Some(HAPPY.len() as f64)
    );
}

#[wasm_bindgen_test]
async fn reset_before_the_first_token_is_replayed_invisibly() {
    let p = path("reset-before-token", "/v1/chat/completions");
    let cut = sse(serde_json::json!([{ "fixture": ROLE_ONLY_CUT }]));
    let mut cut = cut;
    cut["ending"] = "rst".into();
    load(&[(&p, serde_json::json!([cut, happy()]))]).await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    begin(&run).await.expect("committed on attempt 2");
    let (bytes, err) = drain(&run).await;
    assert!(err.is_none());
    // Nothing of the failed attempt reached the consumer.
    assert_eq!(bytes, HAPPY);
    assert_eq!(
        run.names(),
        [
            "attempt_started",
            "attempt_failed",
            "delay_scheduled",
            "retry_started",
            "attempt_started",
            "committed",
            "attempt_succeeded",
            "completed"
        ]
    );
    let failed = run.event("attempt_failed");
    assert_eq!(s(&get(&failed, "category")), "transport");
    assert_eq!(s(&get(&failed, "phase")), "streaming");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 2);
}

#[wasm_bindgen_test]
async fn cut_after_commit_ends_with_a_typed_interruption() {
    let p = path("cut-after-commit", "/v1/chat/completions");
    // Cut only once the client committed (some runtimes drop bytes that
    // arrive just before a reset): stall, release, then RST.
    let mut cut = sse(serde_json::json!([
        { "fixture": "openai-chat/happy-usage.sse", "end": 636 },
        { "text": ": tail\n\n", "stall": true }
    ]));
    cut["ending"] = "rst".into();
    load(&[(&p, serde_json::json!([cut, happy()]))]).await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    begin(&run).await.expect("committed");
    release().await;
    let (bytes, err) = drain(&run).await;
    let err = err.expect("the body fails after commit");
    assert!(
        bytes.len() >= 636 && bytes.starts_with(&HAPPY[..636]),
        "{}",
        bytes.len()
    );
    assert_eq!(s(&get(&get(&err, "outcome"), "outcome")), "interrupted");
    assert_eq!(get(&err, "committed").as_bool(), Some(true));
    assert!(s(&get(&err, "message")).starts_with("recovery failed"));
    assert_eq!(run.outcome(), "interrupted");
    let failed = run.event("attempt_failed");
    assert_eq!(s(&get(&failed, "phase")), "streaming");
    assert_eq!(s(&get(&failed, "reason")), "semantic_output");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 1, "no replay after semantic output");
}

#[wasm_bindgen_test]
async fn refused_connection_is_a_transport_failure_in_an_unknown_phase() {
    // WS1: fetch() rejects (TypeError in Node and Chromium); the driver cannot
    // tell connect from send, so the phase is `unknown`.
    let url = format!(
        "{}/v1/chat/completions",
        env_url(option_env!("RECOVERY_REFUSED_URL"), "RECOVERY_REFUSED_URL")
    );
    let mut options = fast();
    options["maxAttempts"] = 2.into();
    let run = start(options, &url, None);
    let err = begin(&run).await.expect_err("exhausted");
    let outcome = get(&err, "outcome");
    assert_eq!(s(&get(&outcome, "outcome")), "exhausted");
    assert_eq!(get(&outcome, "attempts").as_f64(), Some(2.0));
    assert_eq!(get(&err, "committed").as_bool(), Some(false));
    assert!(
        get(&err, "cause").is_object(),
        "the JS error is kept as the cause"
    );
    let attempts = Array::from(&get(&get(&err, "report"), "attempts"));
    assert_eq!(attempts.length(), 2);
    for a in attempts.iter() {
        assert_eq!(s(&get(&a, "category")), "transport");
        assert_eq!(s(&get(&a, "phase")), "unknown");
    }
    run.assert_one_terminal();
    assert_eq!(run.names().last().map(String::as_str), Some("exhausted"));
}

#[wasm_bindgen_test]
async fn retryable_status_then_happy_waits_at_least_the_hint() {
    let p = path("status-then-happy", "/v1/chat/completions");
    let busy = serde_json::json!({
        "status": 503,
        "headers": {"content-type": "application/json", "retry-after-ms": "15"},
        "transfer": "content_length",
        "body": ["{\"error\":{\"type\":\"server_error\",\"message\":\"busy\"}}"]
    });
    load(&[(&p, serde_json::json!([busy, happy()]))]).await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    begin(&run).await.expect("committed");
    let (bytes, err) = drain(&run).await;
    assert!(err.is_none());
    assert_eq!(bytes, HAPPY);
    let delay = run.event("delay_scheduled");
    assert!(get(&delay, "delay_ms").as_f64().unwrap() >= 15.0);
    assert_eq!(s(&get(&delay, "cause")), "retry_after");
    let failed = run.event("attempt_failed");
    assert_eq!(get(&failed, "status").as_f64(), Some(503.0));
    let report = run.call.report();
    let first = Array::from(&get(&report, "attempts")).get(0);
    assert_eq!(s(&get(&get(&first, "retry_after"), "state")), "millis");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 2);
}

#[wasm_bindgen_test]
async fn final_http_error_is_returned_as_that_response() {
    let p = path("final-503", "/v1/chat/completions");
    let busy = serde_json::json!({
        "status": 503,
        "headers": {"content-type": "application/json"},
        "transfer": "content_length",
        "body": ["{\"error\":{\"type\":\"server_error\",\"message\":\"still busy\"}}"]
    });
    load(&[(&p, serde_json::json!([busy]))]).await;
    let mut options = fast();
    options["maxAttempts"] = 2.into();
    let run = start(options, &format!("{}{p}", fault_url()), None);
    let result = begin(&run)
        .await
        .expect("the final error comes back as a response");
    assert_eq!(s(&get(&result, "kind")), "response");
    let response: web_sys::Response = get(&result, "response").unchecked_into();
    assert_eq!(response.status(), 503);
    let text = JsFuture::from(response.text().unwrap()).await.unwrap();
    assert!(s(&text).contains("still busy"), "the body is untouched");
    assert_eq!(run.outcome(), "exhausted");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 2);
}

#[wasm_bindgen_test]
async fn permanent_status_is_never_retried() {
    let p = path("permanent-400", "/v1/chat/completions");
    let bad = serde_json::json!({
        "status": 400,
        "headers": {"content-type": "application/json", "retry-after": "1"},
        "transfer": "content_length",
        "body": ["{\"error\":{\"type\":\"invalid_request_error\",\"message\":\"no\"}}"]
    });
    load(&[(&p, serde_json::json!([bad, happy()]))]).await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    let result = begin(&run).await.expect("response");
    let response: web_sys::Response = get(&result, "response").unchecked_into();
    assert_eq!(response.status(), 400);
    assert_eq!(run.outcome(), "permanent");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 1);
}

#[wasm_bindgen_test]
async fn redirect_is_never_followed() {
    // WS2: `redirect: "manual"`; Node hands back the 307 itself, browsers an
    // opaqueredirect with status 0. Either way a permanent redirect outcome
    // after one send, and zero requests to the Location.
    let p = path("redirect", "/v1/chat/completions");
    let target = path("redirect-target", "/v1/chat/completions");
    let redirect = serde_json::json!({
        "status": 307,
        "headers": {"location": format!("{}{target}", fault_url())},
        "transfer": "content_length",
        "body": []
    });
    load(&[
        (&p, serde_json::json!([redirect])),
        (&target, serde_json::json!([happy()])),
    ])
    .await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    let result = begin(&run).await.expect("the redirect response");
    assert_eq!(s(&get(&result, "kind")), "response");
    let response: web_sys::Response = get(&result, "response").unchecked_into();
    if is_browser() {
        assert_eq!(s(&get(&response, "type")), "opaqueredirect");
        assert_eq!(response.status(), 0);
    } else {
        assert_eq!(response.status(), 307);
    }
    let outcome = run.call.outcome();
    assert_eq!(s(&get(&outcome, "outcome")), "permanent");
    assert_eq!(s(&get(&outcome, "cause")), "redirect");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 1);
    assert_eq!(count(&target).await, 0, "the Location was never requested");
}

#[wasm_bindgen_test]
async fn overloaded_error_in_stream_before_commit_is_replayed() {
    let p = path("anthropic-overloaded", "/v1/messages");
    let first = sse(serde_json::json!([{ "fixture": "anthropic/error-first.sse" }]));
    let second = sse(serde_json::json!([{ "fixture": "anthropic/happy.sse" }]));
    load(&[(&p, serde_json::json!([first, second]))]).await;
    let mut options = fast();
    options["protocol"] = "auto".into();
    let run = start(options, &format!("{}{p}", fault_url()), None);
    assert_eq!(run.call.protocol(), "anthropic");
    begin(&run).await.expect("committed");
    let (bytes, err) = drain(&run).await;
    assert!(err.is_none(), "{err:?}");
    assert_eq!(bytes, ANTHROPIC_HAPPY);
    let failed = run.event("attempt_failed");
    assert_eq!(s(&get(&failed, "category")), "provider_response");
    assert_eq!(run.outcome(), "completed");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 2);
}

#[wasm_bindgen_test]
async fn holdback_cap_commits_early_and_forbids_replay() {
    let p = path("holdback-cap", "/v1/chat/completions");
    let mut cut = sse(serde_json::json!([
        ": pad pad pad pad pad pad pad pad pad pad pad pad\n\n",
        { "text": ": more\n\n", "stall": true }
    ]));
    cut["ending"] = "rst".into();
    load(&[(&p, serde_json::json!([cut, happy()]))]).await;
    let mut options = fast();
    options["holdbackCap"] = 16.into();
    let run = start(options, &format!("{}{p}", fault_url()), None);
    begin(&run).await.expect("committed at the cap");
    release().await;
    let committed = run.event("committed");
    assert_eq!(s(&get(&committed, "trigger")), "holdback_cap");
    let (_, err) = drain(&run).await;
    assert!(err.is_some());
    assert_eq!(run.outcome(), "interrupted");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 1);
}

#[wasm_bindgen_test]
async fn head_timeout_fires_and_the_retry_succeeds() {
    let p = path("head-timeout", "/v1/chat/completions");
    let silent = serde_json::json!({ "ending": "never_answer" });
    load(&[(&p, serde_json::json!([silent, happy()]))]).await;
    let mut options = fast();
    options["headTimeoutMs"] = 60.into();
    let run = start(options, &format!("{}{p}", fault_url()), None);
    begin(&run).await.expect("committed");
    let (bytes, _) = drain(&run).await;
    assert_eq!(bytes, HAPPY);
    let failed = run.event("attempt_failed");
    assert_eq!(s(&get(&failed, "category")), "client_timeout");
    assert_eq!(s(&get(&failed, "phase")), "awaiting_headers");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 2);
}

async fn wait_no_stalls() -> bool {
    for _ in 0..200 {
        let c = http("GET", &format!("{}/__fault/count", fault_url()), None).await;
        if get(&c, "stalls_waiting").as_f64() == Some(0.0) {
            return true;
        }
        gloo_timers::future::TimeoutFuture::new(10).await;
    }
    false
}

#[wasm_bindgen_test]
async fn consumer_cancel_mid_stream_aborts_the_fetch() {
    // WS4: cancelling the body ends the request `cancelled` and the server
    // sees the disconnect (its stall ends).
    let p = path("cancel-stream", "/v1/chat/completions");
    let stalled = sse(serde_json::json!([
        { "fixture": "openai-chat/happy-usage.sse", "end": 636 },
        { "text": "data: [DONE]\n\n", "stall": true }
    ]));
    load(&[(&p, serde_json::json!([stalled]))]).await;
    let before = stalls_entered().await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    begin(&run).await.expect("committed");
    http(
        "GET",
        &format!("{}/__fault/wait?stalls={}", fault_url(), before + 1),
        None,
    )
    .await;
    let first = JsFuture::from(run.call.next()).await.unwrap();
    assert!(first.is_instance_of::<Uint8Array>());
    // Read until the stream waits on the stall, then cancel.
    let pending = run.call.next();
    run.call.cancel();
    let after = JsFuture::from(pending).await.unwrap();
    assert!(after.is_undefined() || after.is_instance_of::<Uint8Array>());
    let outcome = run.call.outcome();
    assert_eq!(s(&get(&outcome, "outcome")), "cancelled");
    run.assert_one_terminal();
    assert!(wait_no_stalls().await, "the server saw the disconnect");
}

async fn stalls_entered() -> u64 {
    let c = http("GET", &format!("{}/__fault/count", fault_url()), None).await;
    get(&c, "stalls_entered").as_f64().unwrap_or(0.0) as u64
}

#[wasm_bindgen_test]
async fn cancel_while_awaiting_the_head() {
    let p = path("cancel-head", "/v1/chat/completions");
    load(&[(&p, serde_json::json!([{ "ending": "never_answer" }]))]).await;
    let before = stalls_entered().await;
    let run = start(fast(), &format!("{}{p}", fault_url()), None);
    let server_waits = async {
        // Cancel once the server holds the request (a server-side fact).
        http(
            "GET",
            &format!("{}/__fault/wait?stalls={}", fault_url(), before + 1),
            None,
        )
        .await;
        run.call.cancel();
    };
    let (result, ()) = futures_util::future::join(begin(&run), server_waits).await;
    let err = result.expect_err("cancelled");
    let outcome = get(&err, "outcome");
    assert_eq!(s(&get(&outcome, "outcome")), "cancelled");
    assert_eq!(s(&get(&outcome, "phase")), "awaiting_head");
    run.assert_one_terminal();
    assert!(wait_no_stalls().await, "the server saw the disconnect");
}

#[wasm_bindgen_test]
async fn cancel_during_backoff_wins_at_once() {
    let p = path("cancel-backoff", "/v1/chat/completions");
    let busy = serde_json::json!({
        "status": 429, "headers": {"retry-after": "30"}, "transfer": "content_length", "body": []
    });
    load(&[(&p, serde_json::json!([busy, happy()]))]).await;
    let hook: EventHook = Box::new(|name, call| {
        if name == "delay_scheduled" {
            call.cancel();
        }
    });
    let t0 = JsTiming.now();
    let run = start(fast(), &format!("{}{p}", fault_url()), Some(hook));
    let err = begin(&run).await.expect_err("cancelled");
    assert!(JsTiming.now().saturating_since(t0) < Duration::from_secs(10));
    assert_eq!(s(&get(&get(&err, "outcome"), "phase")), "waiting");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 1);
}

#[wasm_bindgen_test]
async fn clocks_timers_and_jitter_are_the_platforms() {
    // WS5: the clocks work (std's would trap here), jitter is fresh per draw,
    // and a delay beyond setTimeout's range is clamped, never passed through
    // (it would fire at once) and never a panic.
    let a = JsTiming.now();
    let b = JsTiming.now();
    assert!(b >= a);
    assert!(JsTiming.wall_now() > std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000));
    let draws: Vec<u64> = (0..4).map(|_| random_u64()).collect();
    assert!(draws.windows(2).all(|w| w[0] != w[1]), "{draws:?}");
    assert_ne!(JsTiming.jitter(), JsTiming.jitter());
    let huge = JsTiming.sleep(Duration::from_secs(u64::MAX / 4));
    let short = gloo_timers::future::TimeoutFuture::new(20);
    match select(huge, short).await {
        Either::Left(_) => panic!("an out-of-range delay fired early"),
        Either::Right(_) => {}
    }
    // Two requests get different logical ids.
    let r1 = start(fast(), "http://127.0.0.1:9/x", None);
    let r2 = start(fast(), "http://127.0.0.1:9/x", None);
    assert_ne!(
        s(&get(&r1.call.report(), "logical_id")),
        s(&get(&r2.call.report(), "logical_id"))
    );
}

#[wasm_bindgen_test]
async fn offline_parks_until_the_online_event() {
    // WS6: navigator.onLine false → parked; the `online` event → retry.
    let p = path("offline", "/v1/chat/completions");
    // A 503, not a reset before the head: Chromium transparently resends a
    // request whose reused keep-alive connection resets before the head.
    let busy = serde_json::json!({ "status": 503, "transfer": "content_length", "body": [] });
    load(&[(&p, serde_json::json!([busy, happy()]))]).await;
    set_online(false);
    let hook: EventHook = Box::new(|name, _| {
        if name == "parked_offline" {
            go_online_soon();
        }
    });
    let run = start(fast(), &format!("{}{p}", fault_url()), Some(hook));
    let result = begin(&run).await;
    set_online(true);
    result.expect("committed after coming back online");
    let (bytes, _) = drain(&run).await;
    assert_eq!(bytes, HAPPY);
    let names = run.names();
    let parked = names
        .iter()
        .position(|n| n == "parked_offline")
        .unwrap_or_else(|| panic!("parked: {names:?}"));
    let retried = names
        .iter()
        .position(|n| n == "retry_started")
        .expect("retried");
    assert!(parked < retried, "{names:?}");
    run.assert_one_terminal();
    assert_eq!(count(&p).await, 2);
}

#[wasm_bindgen_test]
async fn re_split_chunks_give_the_same_observation() {
    // WS7: the runtime (or the network) re-splits the body; the observation
    // is the same as for one event per chunk.
    let whole = path("split-whole", "/v1/chat/completions");
    let split = path("split-bytes", "/v1/chat/completions");
    let offsets: Vec<usize> = (1..HAPPY.len()).step_by(7).collect();
    let resplit =
        sse(serde_json::json!([{ "fixture": "openai-chat/happy-usage.sse", "split_at": offsets }]));
    load(&[
        (&whole, serde_json::json!([happy()])),
        (&split, serde_json::json!([resplit])),
    ])
    .await;
    let mut progress = Vec::new();
    for p in [&whole, &split] {
        let run = start(fast(), &format!("{}{p}", fault_url()), None);
        begin(&run).await.expect("committed");
        let (bytes, err) = drain(&run).await;
        assert!(err.is_none());
        assert_eq!(bytes, HAPPY);
        assert_eq!(run.outcome(), "completed");
        let attempt = Array::from(&get(&run.call.report(), "attempts")).get(0);
        let p = get(&attempt, "progress");
        progress.push(
            [
                "frames",
                "keepalives",
                "observed_content",
                "delivered_content",
                "delivered_bytes",
            ]
            .map(|k| get(&p, k).as_f64()),
        );
    }
    assert_eq!(progress[0], progress[1]);
}

fn plain_url() -> String {
    env_url(option_env!("RECOVERY_PLAIN_URL"), "RECOVERY_PLAIN_URL")
}

#[wasm_bindgen_test]
async fn missing_cors_header_looks_like_a_network_failure() {
    // WS3: in a browser a cross-origin answer without ACAO makes fetch reject
    // with a bare TypeError: a transport failure, retried, then exhausted.
    // Node has no CORS, so there the same server simply answers.
    let url = format!("{}/nocors/{:016x}", plain_url(), random_u64());
    let mut options = fast();
    options["maxAttempts"] = 2.into();
    let run = start(options, &url, None);
    let result = begin(&run).await;
    if is_browser() {
        let err = result.expect_err("CORS rejection");
        assert_eq!(s(&get(&get(&err, "outcome"), "outcome")), "exhausted");
        let cause = get(&err, "cause");
        assert_eq!(s(&get(&cause, "name")), "TypeError");
        let failed = run.event("attempt_failed");
        assert_eq!(s(&get(&failed, "category")), "transport");
        assert_eq!(s(&get(&failed, "phase")), "unknown");
    } else {
        result.expect("no CORS in Node");
        let (bytes, _) = drain(&run).await;
        assert_eq!(bytes, HAPPY);
    }
    run.assert_one_terminal();
}

#[wasm_bindgen_test]
async fn unexposed_retry_after_is_invisible_cross_origin() {
    // WS8: `retry-after-ms` not listed in Access-Control-Expose-Headers is
    // absent for the driver in a browser (policy backoff instead); Node sees it.
    let url = format!("{}/noexpose/{:016x}", plain_url(), random_u64());
    let run = start(fast(), &url, None);
    begin(&run).await.expect("committed after one retry");
    let (bytes, _) = drain(&run).await;
    assert_eq!(bytes, HAPPY);
    let first = Array::from(&get(&run.call.report(), "attempts")).get(0);
    let state = s(&get(&get(&first, "retry_after"), "state"));
    let delay = run.event("delay_scheduled");
    if is_browser() {
        assert_eq!(state, "absent");
        assert_eq!(s(&get(&delay, "cause")), "backoff");
    } else {
        assert_eq!(state, "millis");
        assert_eq!(s(&get(&delay, "cause")), "retry_after");
    }
    run.assert_one_terminal();
}

#[wasm_bindgen_test]
fn bad_options_are_typed_errors() {
    let err = RecoveryClient::new(&JsValue::from_str(r#"{"maxAttempts":0}"#))
        .err()
        .expect("range error");
    assert!(err.is_instance_of::<js_sys::RangeError>());
    assert_eq!(s(&get(&err, "code")), "invalid_option");
    let err = RecoveryClient::new(&JsValue::from_str(r#"{"maxAtempts":3}"#))
        .err()
        .expect("type error");
    assert!(err.is_instance_of::<js_sys::TypeError>());
}

#[wasm_bindgen_test]
async fn a_throwing_fetch_is_a_transport_failure() {
    let throwing: Function = Function::new_no_args("throw new TypeError('boom')");
    let mut options = fast();
    options["maxAttempts"] = 2.into();
    let run = start_with(&options, "http://127.0.0.1:9/x", None, throwing);
    let err = begin(&run).await.expect_err("exhausted");
    assert_eq!(s(&get(&get(&err, "outcome"), "outcome")), "exhausted");
    run.assert_one_terminal();
}
