//! The shared conformance vectors (`tests/conformance/engine/*.json`, the
//! same files the engine and the tower driver run) through the fetch
//! driver (reliability matrix G13): each vector's sends are played byte for
//! byte by a scripted JS `fetch` stub, the driver runs on core's virtual
//! clock (`ManualTiming`, every jitter draw pinned to the vector's value,
//! the wall clock where the format says), and what comes out (events,
//! outcome, sends, delays, delivered bytes, requests, end time) must equal
//! the vector's.
//!
//! A vector that `fetch` cannot express is skipped with its reason printed,
//! and the skipped set must equal [`NOT_FOR_FETCH`] (also listed in
//! `wasm/README.md`), so nothing is skipped silently.
#![cfg(target_arch = "wasm32")]

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use js_sys::{Array, Function, Promise, Reflect, Uint8Array};
use recovery_core::conformance::{Observed, PlayedHead, Vector, WALL_CLOCK};
use recovery_core::failure::{Phase, TransportKind};
use recovery_core::report::RecoveryReport;
use recovery_core::timing::{Fraction, ManualTiming, ScriptedConnectivity, Timing};
use recovery_wasm::RecoveryClient;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{JsFuture, future_to_promise, spawn_local};
use wasm_bindgen_test::{console_log, wasm_bindgen_test};

const ORIGIN: &str = "http://vector.invalid";

include!(concat!(env!("OUT_DIR"), "/engine_vectors.rs"));

/// Vectors that cannot apply to `fetch`, by name. Empty today: every
/// transport failure in the shared set is one `fetch` can produce (a reset
/// while awaiting the head is a rejected `fetch()`, which the driver records
/// as phase `unknown` — acceptance unknown, as for `awaiting_headers`; a
/// reset while streaming is a rejected `read()`). [`not_for_fetch`] is the
/// rule; a vector it refuses must be added here and to `wasm/README.md`.
const NOT_FOR_FETCH: &[&str] = &[];

/// Why `v` cannot run through `fetch`, if it cannot.
///
/// `fetch` hides where a request failed: every rejected `fetch()` reaches
/// the driver as a transport failure of kind `other` in phase `unknown`, and
/// every rejected `read()` as kind `other` in phase `streaming`. A vector
/// whose decision rests on the finer evidence — a failure known to be
/// before the request was sent (`connecting`, `sending`; kinds `dns`,
/// `refused`, `tls`, `refused_stream`, which prove the request was not
/// processed), or a transport error while decoding — cannot be reproduced.
fn not_for_fetch(v: &Vector) -> Option<String> {
    for (i, a) in v.attempts.iter().enumerate() {
        let Ok(played) = a.played() else { continue };
        let PlayedHead::Fails { transport, phase } = played.head else {
            continue;
        };
        let kind_ok = matches!(
            transport,
            TransportKind::Reset | TransportKind::Closed | TransportKind::Other
        );
        let phase_ok = matches!(
            phase,
            Phase::AwaitingHeaders | Phase::Unknown | Phase::Streaming
        );
        if !(kind_ok && phase_ok) {
            return Some(format!(
                "send {}: a `{}` failure in phase `{}`; fetch cannot tell connect from send \
                 from awaiting headers, and every transport kind is `other` (a rejected \
                 fetch() is phase `unknown`, a rejected read() phase `streaming`)",
                i + 1,
                serde_json::to_value(transport)
                    .unwrap()
                    .as_str()
                    .unwrap_or("?"),
                serde_json::to_value(phase).unwrap().as_str().unwrap_or("?"),
            ));
        }
    }
    None
}

#[wasm_bindgen(inline_js = r#"
const enc = new TextEncoder();

// Plays a vector's sends (JSON of `Played`), one per send, the last one
// repeated. `hooks` has `sleep(ms)` (a promise on the virtual clock),
// `offline()` and `stop()` (the consumer has everything: stop reading).
export function stub_fetch(playedJson, hooks) {
  const played = JSON.parse(playedJson);
  const stub = { sends: 0, requests: [] };
  stub.fetch = (url, init) => {
    const p = played[Math.min(stub.sends, played.length - 1)];
    stub.sends += 1;
    const u = new URL(url);
    const headers = new Headers(init && init.headers);
    const id = headers.get('last-event-id');
    stub.requests.push(`${(init && init.method) || 'GET'} ${u.pathname}${u.search}` + (id === null ? '' : ` last-event-id=${id}`));
    const signal = init && init.signal;
    if (p.head.kind === 'fails') {
      if (p.offline) hooks.offline();
      return Promise.reject(new TypeError('fetch failed'));
    }
    if (p.head.kind === 'never') {
      if (p.offline) hooks.offline();
      if (p.cancel_awaiting) hooks.cancel_awaiting();
      return new Promise((_, reject) => {
        if (signal) signal.addEventListener('abort', () => reject(new DOMException('aborted', 'AbortError')));
      });
    }
    const chunks = p.chunks.slice();
    let keepalives = p.keepalive_every_ms;
    const body = new ReadableStream({
      async pull(c) {
        if (chunks.length > 0) { c.enqueue(enc.encode(chunks.shift())); return; }
        if (keepalives) { await hooks.sleep(keepalives); c.enqueue(enc.encode(': keepalive\n\n')); return; }
        if (p.offline) hooks.offline();
        switch (p.end) {
          case 'eof': c.close(); return;
          case 'reset': c.error(new TypeError('network error')); return;
          case 'consumer_drop': case 'consumer_cancel': hooks.stop(); return new Promise(() => {});
          default: return new Promise(() => {});
        }
      },
    }, { highWaterMark: 0 });
    const status = p.head.status;
    const hs = new Headers();
    for (const [k, v] of p.head.headers) hs.append(k, v);
    const nullBody = status === 204 || status === 304;
    return Promise.resolve(new Response(nullBody ? null : body, { status, headers: hs }));
  };
  return stub;
}

export function report_json(report) {
  return JSON.stringify(report);
}
"#)]
extern "C" {
    fn stub_fetch(played_json: &str, hooks: &JsValue) -> JsValue;
    fn report_json(report: &JsValue) -> String;
}

fn get(v: &JsValue, key: &str) -> JsValue {
    Reflect::get(v, &key.into()).unwrap_or(JsValue::UNDEFINED)
}

/// The vector's policy as npm options (the path `createRecoveringFetch`
/// takes).
fn options(v: &Vector) -> String {
    let p = &v.policy;
    let mut o = serde_json::json!({
        "maxAttempts": p.max_attempts,
        "backoffBaseMs": p.backoff_base_ms,
        "backoffCeilingMs": p.backoff_ceiling_ms,
        "budgetMs": p.budget_ms,
        "deadlineMs": p.deadline_ms,
        "retryAfterCeilingMs": p.retry_after_ceiling_ms,
        "overCeiling": "refuse",
        "retryableStatuses": p.retryable_statuses,
        "endpoint": p.endpoint,
        "maxResumes": p.max_resumes,
        "headTimeoutMs": p.head_timeout_ms,
        "idleTimeoutMs": p.idle_timeout_ms,
        "progressTimeoutMs": p.progress_timeout_ms,
        "protocol": v.protocol_name(),
        "resumableSse": v.resumable_sse,
    });
    if let Some(t) = &v.sse_terminal {
        o["sseTerminal"] = serde_json::to_value(t).unwrap();
    }
    o.to_string()
}

/// A JS function backed by a Rust closure; the closure lives as long as
/// the test (leaked into the JS heap on purpose).
fn function(f: impl FnMut(JsValue) -> JsValue + 'static) -> Function {
    Closure::<dyn FnMut(JsValue) -> JsValue>::new(f)
        .into_js_value()
        .unchecked_into()
}

async fn tick() {
    gloo_timers::future::TimeoutFuture::new(0).await;
}

async fn run_vector(v: &Vector) -> Result<(), String> {
    let played = v
        .attempts
        .iter()
        .map(recovery_core::conformance::AttemptSpec::played)
        .collect::<Result<Vec<_>, _>>()?;
    let timing = ManualTiming::new(0)
        .with_pinned_jitter(Fraction::new(v.jitter))
        .with_wall_clock(WALL_CLOCK);
    let net = ScriptedConnectivity::new(true);
    let stop = Rc::new(Cell::new(false));
    let cancel_now = Rc::new(Cell::new(false));
    let hooks = js_sys::Object::new();
    {
        let timing = timing.clone();
        let sleep = function(move |ms| {
            let sleep = timing.sleep(Duration::from_millis(ms.as_f64().unwrap_or(0.0) as u64));
            future_to_promise(async move {
                sleep.await;
                Ok(JsValue::UNDEFINED)
            })
            .into()
        });
        let net = net.clone();
        let offline = function(move |_| {
            net.set_online(false);
            JsValue::UNDEFINED
        });
        let stop_flag = Rc::clone(&stop);
        let stop_fn = function(move |_| {
            stop_flag.set(true);
            JsValue::UNDEFINED
        });
        let cancel_flag = Rc::clone(&cancel_now);
        let cancel_awaiting = function(move |_| {
            cancel_flag.set(true);
            JsValue::UNDEFINED
        });
        for (k, f) in [
            ("sleep", sleep),
            ("offline", offline),
            ("stop", stop_fn),
            ("cancel_awaiting", cancel_awaiting),
        ] {
            Reflect::set(&hooks, &k.into(), &f).unwrap();
        }
    }
    let stub = stub_fetch(&serde_json::to_string(&played).unwrap(), &hooks);
    let client = RecoveryClient::new(&JsValue::from_str(&options(v))).map_err(|e| {
        format!(
            "{}: the vector's policy is not valid options: {e:?}",
            v.name
        )
    })?;

    let events: Rc<RefCell<Vec<String>>> = Rc::default();
    let on_event = {
        let events = Rc::clone(&events);
        let cancel_now = Rc::clone(&cancel_now);
        let timing = timing.clone();
        let cancel_wait = v.cancel_during_wait;
        let mut waits = 0;
        function(move |e| {
            let name = get(&e, "event").as_string().unwrap_or_default();
            if name == "delay_scheduled" {
                if let Some(c) = cancel_wait.filter(|c| c.wait == waits) {
                    // Cancel `after_ms` into this wait, on the virtual clock.
                    let sleep = timing.sleep(Duration::from_millis(c.after_ms));
                    let cancel_now = Rc::clone(&cancel_now);
                    spawn_local(async move {
                        sleep.await;
                        cancel_now.set(true);
                    });
                }
                waits += 1;
            }
            events.borrow_mut().push(name);
            JsValue::UNDEFINED
        })
    };
    let admission = v.admission.as_ref().map(|answers| {
        let answers = Rc::new(RefCell::new(answers.clone().into_iter()));
        let cancel_now = Rc::clone(&cancel_now);
        function(move |_ctx| {
            let answer = answers.borrow_mut().next().expect("an answer per ask");
            match answer.as_str() {
                "allow" => JsValue::from_str("allow"),
                "reject" => JsValue::from_str("reject"),
                // Anything else is `unresolved` to the driver.
                "unresolved" => JsValue::from_str("maybe"),
                "never" => Promise::new(&mut |_, _| {}).into(),
                "cancel" => {
                    // The caller cancels while the hook is pending.
                    cancel_now.set(true);
                    Promise::new(&mut |_, _| {}).into()
                }
                other => panic!("unknown admission answer {other}"),
            }
        })
    });
    let continuation = v.continuation.clone().map(|c| {
        function(move |_prefix| {
            let answer = js_sys::Object::new();
            let set = |k: &str, v: &JsValue| Reflect::set(&answer, &k.into(), v).unwrap();
            set("url", &format!("{ORIGIN}{}", c.path).into());
            set("method", &c.method.as_str().into());
            set("headers", &Array::new());
            set("body", &Uint8Array::from(c.body.as_bytes()));
            Promise::resolve(&answer).into()
        })
    });
    let request = v.request();
    let body = (!request.body.is_empty()).then(|| Uint8Array::from(request.body.as_bytes()));
    let call = Rc::new(client.call_with(
        get(&stub, "fetch").unchecked_into(),
        format!("{ORIGIN}{}", request.path),
        request.method.clone(),
        Array::new(),
        body,
        Some(on_event),
        None,
        admission,
        continuation,
        timing.clone(),
        net.clone(),
    ));

    // The consumer: reads the committed body to its end, or stops (cancels)
    // once the played body has nothing more for it.
    let done = Rc::new(Cell::new(false));
    let delivered: Rc<RefCell<Vec<u8>>> = Rc::default();
    {
        let call = Rc::clone(&call);
        let done = Rc::clone(&done);
        let delivered = Rc::clone(&delivered);
        spawn_local(async move {
            if let Ok(started) = JsFuture::from(call.start()).await
                && get(&started, "kind").as_string().as_deref() == Some("committed")
            {
                while let Ok(chunk) = JsFuture::from(call.next()).await {
                    if chunk.is_undefined() {
                        break;
                    }
                    delivered
                        .borrow_mut()
                        .extend(chunk.unchecked_into::<Uint8Array>().to_vec());
                }
            }
            done.set(true);
        });
    }

    // Settle every promise (a browser may need several macrotasks to move
    // a body along), then let the caller act, then move the virtual clock
    // to the next deadline; a run that stays idle with none of these to do
    // is stuck.
    let mut idle = 0;
    for _ in 0..20_000 {
        tick().await;
        if done.get() {
            break;
        }
        if cancel_now.replace(false) || stop.replace(false) {
            call.cancel();
            idle = 0;
            continue;
        }
        idle += 1;
        if idle < 20 {
            continue;
        }
        idle = 0;
        if let Some(deadline) = timing.next_deadline() {
            timing.advance(deadline.saturating_since(timing.now()));
            continue;
        }
        return Err(format!("{}: stuck with no timer and nothing to do", v.name));
    }
    if !done.get() {
        return Err(format!("{}: did not end", v.name));
    }
    let report: RecoveryReport = serde_json::from_str(&report_json(&call.report()))
        .map_err(|e| format!("{}: report: {e}", v.name))?;
    let requests = get(&stub, "requests");
    let mut observed = Observed {
        events: events
            .borrow()
            .iter()
            .filter(|n| *n != "committed")
            .cloned()
            .collect(),
        sends: get(&stub, "sends").as_f64().unwrap_or(-1.0) as usize,
        delivered: delivered.borrow().clone(),
        requests: Array::from(&requests)
            .iter()
            .filter_map(|r| r.as_string())
            .collect(),
        ..Observed::default()
    };
    observed.from_report(&report);
    v.expected.check(&v.name, &observed)
}

fn vectors() -> Vec<Vector> {
    assert!(
        ENGINE_VECTORS.len() >= 10,
        "expected the lifecycle vectors, found {}",
        ENGINE_VECTORS.len()
    );
    ENGINE_VECTORS
        .iter()
        .map(|(file, text)| {
            let v: Vector = serde_json::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(
                file.strip_suffix(".json"),
                Some(v.name.as_str()),
                "file name = vector name"
            );
            v
        })
        .collect()
}

#[wasm_bindgen_test]
async fn every_engine_vector_runs_through_the_fetch_driver() {
    let mut skipped = Vec::new();
    let mut failures = Vec::new();
    let mut ran = 0;
    for v in vectors() {
        if let Some(reason) = not_for_fetch(&v) {
            console_log!("conformance: skipped {}: {reason}", v.name);
            skipped.push(v.name.clone());
            continue;
        }
        if let Err(e) = run_vector(&v).await {
            failures.push(e);
        }
        ran += 1;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(skipped, NOT_FOR_FETCH, "the vectors fetch cannot express");
    console_log!("conformance: {ran} vectors ran, {} skipped", skipped.len());
}

/// The rule skips what fetch cannot show, and only that.
#[wasm_bindgen_test]
fn the_skip_rule_names_what_fetch_cannot_show() {
    let base = vectors()
        .into_iter()
        .find(|v| v.name == "ambiguous_resend_admission_rejected")
        .expect("the reset-before-head vector");
    assert_eq!(not_for_fetch(&base), None);
    let mut refused = base.clone();
    let spec = refused.attempts[0].fail.as_mut().unwrap();
    spec.transport = Some(TransportKind::Refused);
    spec.phase = Some(Phase::Connecting);
    let reason = not_for_fetch(&refused).expect("a refused connect is not visible to fetch");
    assert!(
        reason.contains("`refused` failure in phase `connecting`"),
        "{reason}"
    );
    let mut sending = base;
    let spec = sending.attempts[0].fail.as_mut().unwrap();
    spec.phase = Some(Phase::Sending);
    assert!(not_for_fetch(&sending).is_some());
}

/// The runner itself can fail: a vector whose expectations are altered
/// must not pass.
#[wasm_bindgen_test]
async fn an_altered_vector_is_caught() {
    let mut v = vectors()
        .into_iter()
        .find(|v| v.name == "503_then_success")
        .expect("503_then_success");
    run_vector(&v).await.unwrap();
    v.expected.delays_ms = vec![500];
    assert!(run_vector(&v).await.unwrap_err().contains("delays_ms"));
    v.jitter = 1.0;
    run_vector(&v).await.unwrap();
}
