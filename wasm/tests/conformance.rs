//! The shared conformance vectors (`tests/conformance/engine/*.json`, the
//! same files the engine and the tower driver run) through the fetch
//! driver (reliability matrix G13, LC3): each vector's sends are played by
//! a scripted JS `fetch` stub, the driver runs on core's virtual clock
//! (`ManualTiming`, every jitter draw pinned to the vector's value, the wall
//! clock where the format says), and the lifecycle events (`committed` left
//! out), the outcome's name, the sends and the scheduled delays must equal
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
use recovery_core::conformance::{AttemptSpec, Vector, WALL_CLOCK};
use recovery_core::failure::{Phase, TransportKind};
use recovery_core::outcome::CancelPhase;
use recovery_core::timing::{AlwaysOnline, Fraction, ManualTiming, Timing};
use recovery_wasm::RecoveryClient;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::{JsFuture, spawn_local};
use wasm_bindgen_test::{console_log, wasm_bindgen_test};

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
        let Some(f) = &a.fail else { continue };
        let (Some(kind), Some(phase)) = (f.transport, f.phase) else {
            continue;
        };
        let kind_ok = matches!(
            kind,
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
                serde_json::to_value(kind).unwrap().as_str().unwrap_or("?"),
                serde_json::to_value(phase).unwrap().as_str().unwrap_or("?"),
            ));
        }
    }
    None
}

#[wasm_bindgen(inline_js = r#"
const enc = new TextEncoder();
const ROLE = 'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n';
const HELLO = 'data: {"choices":[{"index":0,"delta":{"content":"Hello"}}]}\n\n';
const STOP = 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n';
const DONE = 'data: [DONE]\n\n';
const ERROR = {};
const PENDING = {};

function stream(pieces) {
  const body = new ReadableStream({
    pull(c) {
      const p = pieces.shift();
      if (p === undefined) c.close();
      else if (p === ERROR) c.error(new TypeError('network error'));
      else if (p === PENDING) return new Promise(() => {});
      else c.enqueue(enc.encode(p));
    },
  }, { highWaterMark: 0 });
  return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
}

function pendingHead(init) {
  return new Promise((_, reject) => {
    const signal = init && init.signal;
    if (signal) signal.addEventListener('abort', () => reject(new DOMException('aborted', 'AbortError')));
  });
}

// Plays a vector's `attempts` (JSON), one per send, the last one repeated.
export function stub_fetch(attemptsJson) {
  const attempts = JSON.parse(attemptsJson);
  const stub = { sends: 0 };
  stub.fetch = (url, init) => {
    const a = attempts[Math.min(stub.sends, attempts.length - 1)];
    stub.sends += 1;
    if (a.fail && a.fail.status !== undefined && a.fail.status !== null) {
      const headers = { 'content-type': 'application/json' };
      if (a.fail.retry_after != null) headers['retry-after'] = a.fail.retry_after;
      if (a.fail.should_retry != null) headers['x-should-retry'] = String(a.fail.should_retry);
      return Promise.resolve(new Response('{}', { status: a.fail.status, headers }));
    }
    if (a.fail) {
      if (a.fail.phase === 'streaming') {
        return Promise.resolve(stream(a.semantic ? [ROLE, HELLO, ERROR] : [ROLE, ERROR]));
      }
      return Promise.reject(new TypeError('fetch failed'));
    }
    if (a.succeed) {
      return Promise.resolve(stream(a.succeed === 'strong' ? [ROLE, HELLO, STOP, DONE] : [ROLE, HELLO, STOP]));
    }
    if (a.cancel === 'streaming') {
      return Promise.resolve(stream(a.semantic ? [ROLE, HELLO, PENDING] : [ROLE, PENDING]));
    }
    return pendingHead(init);
  };
  return stub;
}
"#)]
extern "C" {
    fn stub_fetch(attempts_json: &str) -> JsValue;
}

fn get(v: &JsValue, key: &str) -> JsValue {
    Reflect::get(v, &key.into()).unwrap_or(JsValue::UNDEFINED)
}

/// The vector's policy as npm options (the path `createRecoveringFetch`
/// takes), OpenAI Chat bodies.
fn options(v: &Vector) -> String {
    let p = &v.policy;
    serde_json::json!({
        "maxAttempts": p.max_attempts,
        "backoffBaseMs": p.backoff_base_ms,
        "backoffCeilingMs": p.backoff_ceiling_ms,
        "budgetMs": p.budget_ms,
        "deadlineMs": p.deadline_ms,
        "retryAfterCeilingMs": p.retry_after_ceiling_ms,
        "overCeiling": "refuse",
        "retryableStatuses": p.retryable_statuses,
        "endpoint": p.endpoint,
        "protocol": "openai-chat",
    })
    .to_string()
}

/// What one run produced.
#[derive(Debug, PartialEq)]
struct Observed {
    events: Vec<String>,
    outcome: String,
    sends: usize,
    delays_ms: Vec<u64>,
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

async fn run_vector(v: &Vector) -> Observed {
    let timing = ManualTiming::new(0)
        .with_pinned_jitter(Fraction::new(v.jitter))
        .with_wall_clock(WALL_CLOCK);
    let stub = stub_fetch(&serde_json::to_string(&v.attempts).unwrap());
    let client = RecoveryClient::new(&JsValue::from_str(&options(v)))
        .expect("the vector's policy is valid options");

    // The caller's cancellations, performed by the loop below.
    let cancel_now = Rc::new(Cell::new(false));
    let events: Rc<RefCell<Vec<JsValue>>> = Rc::default();
    let on_event = {
        let events = Rc::clone(&events);
        let cancel_now = Rc::clone(&cancel_now);
        let timing = timing.clone();
        let cancel_wait = v.cancel_during_wait;
        let mut waits = 0;
        function(move |e| {
            if get(&e, "event").as_string().as_deref() == Some("delay_scheduled") {
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
            events.borrow_mut().push(e);
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
                "cancel" => {
                    // The caller cancels while the hook is pending.
                    cancel_now.set(true);
                    Promise::new(&mut |_, _| {}).into()
                }
                other => panic!("unknown admission answer {other}"),
            }
        })
    });
    let body = Uint8Array::from(&b"{}"[..]);
    let call = Rc::new(client.call_with(
        get(&stub, "fetch").unchecked_into(),
        "http://vector.invalid/v1/chat/completions".into(),
        "POST".into(),
        Array::new(),
        Some(body),
        Some(on_event),
        admission,
        timing.clone(),
        AlwaysOnline,
    ));

    // The consumer: reads the committed body to its end, or cancels it
    // (a `cancel: streaming` vector); a send that never answers is
    // cancelled by the caller once everything else is idle.
    let cancel_streaming = v
        .attempts
        .iter()
        .any(|a| a.cancel == Some(CancelPhase::Streaming));
    let awaiting_cancel = v.attempts.iter().any(|a| {
        matches!(
            a.cancel,
            Some(CancelPhase::AwaitingHead | CancelPhase::Sending)
        )
    });
    let done = Rc::new(Cell::new(false));
    {
        let call = Rc::clone(&call);
        let done = Rc::clone(&done);
        spawn_local(async move {
            if let Ok(started) = JsFuture::from(call.start()).await {
                if get(&started, "kind").as_string().as_deref() == Some("committed") {
                    if cancel_streaming {
                        call.cancel();
                    }
                    while let Ok(chunk) = JsFuture::from(call.next()).await {
                        if chunk.is_undefined() {
                            break;
                        }
                    }
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
    for _ in 0..5000 {
        tick().await;
        if done.get() {
            break;
        }
        if cancel_now.replace(false) {
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
            timing.advance(deadline - timing.now());
            continue;
        }
        if awaiting_cancel {
            call.cancel();
            continue;
        }
        panic!("{}: stuck with no timer and nothing to do", v.name);
    }
    assert!(done.get(), "{}: did not end", v.name);

    let events = events.borrow();
    Observed {
        events: events
            .iter()
            .filter_map(|e| get(e, "event").as_string())
            .filter(|n| n != "committed")
            .collect(),
        outcome: get(&call.outcome(), "outcome")
            .as_string()
            .unwrap_or_else(|| "(none)".into()),
        sends: get(&stub, "sends").as_f64().unwrap_or(-1.0) as usize,
        delays_ms: events
            .iter()
            .filter(|e| get(e, "event").as_string().as_deref() == Some("delay_scheduled"))
            .map(|e| get(e, "delay_ms").as_f64().expect("delay_ms") as u64)
            .collect(),
    }
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
    let mut ran = 0;
    for v in vectors() {
        if let Some(reason) = not_for_fetch(&v) {
            console_log!("conformance: skipped {}: {reason}", v.name);
            skipped.push(v.name.clone());
            continue;
        }
        let observed = run_vector(&v).await;
        let expected = Observed {
            events: v.expected.events.clone(),
            outcome: v.expected.outcome.clone(),
            sends: v.expected.sends,
            delays_ms: v.expected.delays_ms.clone(),
        };
        assert_eq!(observed, expected, "{}", v.name);
        ran += 1;
    }
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
    let fail: &mut AttemptSpec = &mut refused.attempts[0];
    let spec = fail.fail.as_mut().unwrap();
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
    let observed = run_vector(&v).await;
    v.expected.delays_ms = vec![500];
    assert_ne!(observed.delays_ms, v.expected.delays_ms);
    v.jitter = 1.0;
    assert_eq!(
        run_vector(&v).await.delays_ms,
        vec![500],
        "jitter is pinned to the vector's"
    );
}
