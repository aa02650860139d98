//! The fetch driver: does the machine's I/O for one logical request.
//!
//! Every decision is the core machine's ([`Exchange`]); this module asks it
//! what to do ([`Exchange::poll`]) and does it with JS: `fetch` with a fresh
//! `AbortController` per send, `ReadableStream` reads, `setTimeout` for the
//! machine's one deadline, `navigator.onLine` and the `online` event, the
//! admission and continuation hooks, and `onEvent`.
//!
//! `fetch` hides where a request failed (connect, send or awaiting the
//! head): a rejected `fetch()` is a transport failure in phase `unknown`
//! (acceptance unknown), a rejected `read()` one in phase `streaming`.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use js_sys::{Array, Function, Object, Reflect, Uint8Array};
use recovery_core::RecoveryStatus;
use recovery_core::budget::{AttemptAllowance, RetryBudget};
use recovery_core::exchange::AdmissionAnswer;
use recovery_core::exchange::{
    AdmissionRequest, Chunk, Exchange, Head, Io, RequestFacts, Send as SendKind,
};
use recovery_core::failure::{Failure, Phase, TransportKind};
use recovery_core::outcome::{Outcome, ReplayDisabled};
use recovery_core::resume::BODY_HEADERS;
use recovery_core::timing::Instant;
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::JsFuture;
use web_sys::{AbortController, ReadableStreamDefaultReader, ReadableStreamReadResult, Response};

use crate::js_value::to_js;
use crate::options::Settings;
use crate::platform::{Platform, Wait, get, random_u64};

/// What a `createRecoveringFetch` instance shares between its requests.
pub(crate) struct Client {
    pub(crate) settings: Settings,
    pub(crate) budget: Option<RetryBudget>,
}

/// One logical request as the wrapper hands it over: the body is already
/// buffered so it can be replayed.
pub(crate) struct RequestSpec {
    pub(crate) fetch: Function,
    pub(crate) url: String,
    pub(crate) method: String,
    /// `[name, value]` pairs.
    pub(crate) headers: Array,
    pub(crate) body: Option<Uint8Array>,
    pub(crate) on_event: Option<Function>,
    /// Called with the new `RecoveryStatus` (snake_case) when it changes.
    pub(crate) on_status: Option<Function>,
    pub(crate) admission: Option<Function>,
    /// `(prefix) => Promise<{ url, method, headers, body } | null>`.
    pub(crate) continuation: Option<Function>,
}

/// A request the driver sends: the original, a resume, or a continuation.
struct Outgoing {
    url: String,
    method: String,
    headers: Array,
    body: Option<Uint8Array>,
}

/// Caller cancellation: a flag, the in-flight attempt's `AbortController`
/// (aborted on cancel) and the waker of whoever is waiting.
#[derive(Default)]
pub(crate) struct Cancel {
    cancelled: Cell<bool>,
    waker: RefCell<Option<Waker>>,
    controller: RefCell<Option<AbortController>>,
}

impl Cancel {
    pub(crate) fn cancel(&self) {
        if self.cancelled.replace(true) {
            return;
        }
        if let Some(c) = self.controller.borrow().as_ref() {
            c.abort();
        }
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.get()
    }

    fn set_controller(&self, c: Option<&AbortController>) {
        *self.controller.borrow_mut() = c.cloned();
        if let (true, Some(c)) = (self.is_cancelled(), c) {
            c.abort();
        }
    }

    fn abort_current(&self) {
        if let Some(c) = self.controller.borrow_mut().take() {
            c.abort();
        }
    }

    fn poll_cancelled(&self, cx: &mut Context<'_>) -> bool {
        if self.is_cancelled() {
            return true;
        }
        *self.waker.borrow_mut() = Some(cx.waker().clone());
        false
    }
}

/// How a driver wait ended.
enum Woke {
    /// The promise settled.
    Settled(Result<JsValue, JsValue>),
    /// The platform wait (connectivity) completed.
    Done,
    /// The machine's deadline passed.
    Deadline,
    /// The caller cancelled first.
    Cancelled,
}

/// What the driver waits on: a JS promise, a platform wait, or only the
/// deadline.
enum Awaited {
    Promise(JsFuture),
    Wait(Wait),
    Nothing,
}

/// The machine's one deadline, armed lazily: a new timer only when the
/// deadline moved earlier or the old timer fired.
#[derive(Default)]
struct Alarm {
    armed: Option<(Instant, Wait)>,
}

impl Alarm {
    fn poll(
        &mut self,
        deadline: Option<Instant>,
        platform: &dyn Platform,
        cx: &mut Context<'_>,
    ) -> bool {
        let Some(deadline) = deadline else {
            self.armed = None;
            return false;
        };
        if self.armed.as_ref().is_none_or(|(at, _)| deadline < *at) {
            let wait = platform.sleep(deadline.saturating_since(platform.now()));
            self.armed = Some((deadline, wait));
        }
        let Some((_, wait)) = self.armed.as_mut() else {
            return false;
        };
        if wait.as_mut().poll(cx).is_ready() {
            self.armed = None;
            return true;
        }
        false
    }
}

/// The one wait every await of the driver goes through: `awaited`, raced
/// against the machine's deadline and cancellation, polled in that order (a
/// result that already arrived wins).
struct WaitOn<'a> {
    awaited: Awaited,
    deadline: Option<Instant>,
    alarm: &'a mut Alarm,
    platform: &'a dyn Platform,
    cancel: &'a Cancel,
}

impl Future for WaitOn<'_> {
    type Output = Woke;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Woke> {
        let this = self.get_mut();
        let ready = match &mut this.awaited {
            Awaited::Promise(p) => match Pin::new(p).poll(cx) {
                Poll::Ready(r) => Some(Woke::Settled(r)),
                Poll::Pending => None,
            },
            Awaited::Wait(w) => w.as_mut().poll(cx).is_ready().then_some(Woke::Done),
            Awaited::Nothing => None,
        };
        if let Some(woke) = ready {
            return Poll::Ready(woke);
        }
        if this.alarm.poll(this.deadline, this.platform, cx) {
            return Poll::Ready(Woke::Deadline);
        }
        if this.cancel.poll_cancelled(cx) {
            return Poll::Ready(Woke::Cancelled);
        }
        Poll::Pending
    }
}

/// A chunk as the machine holds it: the JS array (handed on as it is) and
/// its bytes in wasm memory (what the machine reads).
pub(crate) struct JsChunk {
    array: Uint8Array,
    bytes: Vec<u8>,
}

impl AsRef<[u8]> for JsChunk {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// A fetch `Response` as the machine's [`Head`].
struct JsHead<'a>(&'a Response);

impl Head for JsHead<'_> {
    fn status(&self) -> u16 {
        self.0.status()
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        self.0.headers().get(name).ok().flatten().map(Cow::Owned)
    }
    fn opaque_redirect(&self) -> bool {
        get(self.0, "type").as_string().as_deref() == Some("opaqueredirect")
    }
}

/// What the loop hands to the JS call.
pub(crate) enum Out {
    /// The committed attempt's head; its body follows from `next`.
    Respond(Response),
    /// The final HTTP error response, as the server sent it.
    RespondError(Response),
    /// A chunk for the consumer.
    Deliver(Uint8Array),
    /// The clean end (`Ok`) or the rejection value of a failure.
    End(Result<(), JsValue>),
}

/// What a call shows while its driver is busy: the report and outcome as
/// of the last event.
#[derive(Default)]
pub(crate) struct Published {
    pub(crate) report: RefCell<JsValue>,
    pub(crate) outcome: RefCell<JsValue>,
    pub(crate) cause: RefCell<JsValue>,
}

/// The driver of one logical request.
pub(crate) struct Driver {
    pub(crate) published: Rc<Published>,
    pub(crate) ex: Exchange<JsChunk>,
    spec: RequestSpec,
    pub(crate) platform: Rc<dyn Platform>,
    /// The last JS error seen (may carry text from the wire).
    pub(crate) cause: JsValue,
    alarm: Alarm,
    fetching: Option<js_sys::Promise>,
    reader: Option<ReadableStreamDefaultReader>,
    head: Option<Response>,
    continuation: Option<Outgoing>,
    ended: bool,
    /// What `onStatus` was last told.
    status: RecoveryStatus,
}

/// Marks a promise we do not wait for as handled, so its rejection is not
/// an unhandled rejection (which ends a Node process).
fn settle(promise: js_sys::Promise) {
    drop(JsFuture::from(promise));
}

fn set(obj: &Object, key: &str, value: &JsValue) {
    let _ = Reflect::set(obj, &JsValue::from_str(key), value);
}

/// A settled `read()`: `Ok(Some(bytes))`, `Ok(None)` at the end, `Err(js)`
/// when the read rejected.
fn chunk_of(settled: Result<JsValue, JsValue>) -> Result<Option<Uint8Array>, JsValue> {
    let result: ReadableStreamReadResult = settled?.unchecked_into();
    if result.get_done().unwrap_or(false) {
        return Ok(None);
    }
    let value = result.get_value();
    Ok(Some(if value.is_instance_of::<Uint8Array>() {
        value.unchecked_into()
    } else {
        Uint8Array::new(&value)
    }))
}

impl Driver {
    /// Starts the machine for one logical request.
    pub(crate) fn new(client: &Client, spec: RequestSpec, platform: Rc<dyn Platform>) -> Self {
        let settings = &client.settings;
        let policy = settings.policy.clone();
        let body = spec
            .body
            .as_ref()
            .map(Uint8Array::to_vec)
            .unwrap_or_default();
        let too_large = body.len() > policy.replay_body_cap();
        let allowance = AttemptAllowance::new(policy.max_attempts().get());
        let request = RequestFacts::new(&spec.method, &spec.url, &body);
        let mut ex = Exchange::new(
            policy,
            &settings.protocol,
            request,
            allowance,
            random_u64(),
            platform.now(),
        )
        .with_admission_hook(spec.admission.is_some())
        .with_resumable_sse(settings.resumable_sse)
        .with_continuation_hook(spec.continuation.is_some());
        if let Some(budget) = &client.budget {
            ex = ex.with_retry_budget(budget.clone());
        }
        if too_large {
            ex = ex.without_replay(ReplayDisabled::BodyTooLarge);
        }
        let driver = Driver {
            published: Rc::default(),
            ex,
            spec,
            platform,
            cause: JsValue::UNDEFINED,
            alarm: Alarm::default(),
            fetching: None,
            reader: None,
            head: None,
            continuation: None,
            ended: false,
            status: RecoveryStatus::InProgress,
        };
        driver.publish();
        driver
    }

    /// Delivers pending lifecycle events to `onEvent` as plain objects with
    /// the Rust serde field names; what the callback throws is ignored.
    pub(crate) fn flush(&mut self) {
        let events: Vec<_> = self.ex.drain_events().collect();
        if events.is_empty() {
            return;
        }
        // Published first: the callbacks may read the report.
        self.publish();
        for event in events {
            if let Some(callback) = &self.spec.on_event {
                let _ = callback.call1(&JsValue::UNDEFINED, &to_js(&event));
            }
            let status = self.status.after(&event.kind);
            if status != self.status {
                self.status = status;
                if let Some(callback) = &self.spec.on_status {
                    let _ = callback.call1(&JsValue::UNDEFINED, &to_js(&status));
                }
            }
        }
    }

    fn publish(&self) {
        *self.published.report.borrow_mut() = to_js(self.ex.report());
        *self.published.outcome.borrow_mut() = match self.ex.outcome() {
            Some(o) => to_js(o),
            None => JsValue::NULL,
        };
        *self.published.cause.borrow_mut() = self.cause.clone();
    }

    /// The rejection value for a request that ended without a (complete)
    /// response: `{ message, outcome, report, cause, committed }`; the
    /// wrapper turns it into a `TypeError` (before commit) or a
    /// `RecoveryError` (after).
    pub(crate) fn failure_value(&self, outcome: &Outcome) -> JsValue {
        let report = self.ex.report();
        let obj = Object::new();
        let mut message = format!(
            "recovery failed: {outcome} ({} attempt(s)",
            report.attempt_count()
        );
        if let Some(status) = report.last_status() {
            let _ = write!(message, ", last status {status}");
        }
        message.push(')');
        let committed = report.committed_attempt.is_some();
        set(&obj, "message", &JsValue::from_str(&message));
        set(&obj, "outcome", &to_js(outcome));
        set(&obj, "report", &to_js(report));
        set(&obj, "cause", &self.cause);
        set(&obj, "committed", &JsValue::from_bool(committed));
        obj.into()
    }

    /// The request was cancelled, or its body dropped: the machine says
    /// what that means (after proof was handed out, a completion).
    pub(crate) fn cancel(&mut self, cancel: &Cancel) {
        if self.ended {
            return;
        }
        let env = &*self.platform;
        self.ex.cancel(&env);
        self.release(cancel);
        self.ended = true;
        self.flush();
    }

    fn release(&mut self, cancel: &Cancel) {
        cancel.abort_current();
        if let Some(reader) = self.reader.take() {
            settle(reader.cancel());
        }
        self.fetching = None;
    }

    /// Runs the machine until it has something for the JS call.
    pub(crate) async fn advance(&mut self, cancel: &Cancel) -> Out {
        loop {
            let io = self.ex.poll(&&*self.platform);
            self.flush();
            match io {
                Io::Send(kind) => self.send(kind, cancel),
                Io::AwaitHead => self.await_head(cancel).await,
                Io::Read => {
                    if let Some(chunk) = self.read(cancel).await {
                        return Out::Deliver(chunk);
                    }
                }
                Io::Release => self.release(cancel),
                Io::Respond => match self.head.take() {
                    Some(head) => return Out::Respond(head),
                    None => return Out::End(Err(self.failure_now())),
                },
                Io::RespondError => {
                    self.ended = true;
                    if let Some(reader) = self.reader.take() {
                        // The copy read for its provider code.
                        settle(reader.cancel());
                    }
                    match self.head.take() {
                        Some(head) => return Out::RespondError(head),
                        None => return Out::End(Err(self.failure_now())),
                    }
                }
                Io::Deliver(Chunk::Read(c)) => return Out::Deliver(c.array),
                Io::Deliver(Chunk::Made(b)) => return Out::Deliver(Uint8Array::from(&b[..])),
                Io::Sleep | Io::AwaitAdmission => {
                    self.wait(Awaited::Nothing, cancel).await;
                }
                Io::WaitOnline => {
                    let wait = self.platform.wait_until_online();
                    if let Some(Woke::Done) = self.wait(Awaited::Wait(wait), cancel).await {
                        self.ex.online(&&*self.platform);
                    }
                }
                Io::AskAdmission(request) => self.ask_admission(request, cancel).await,
                Io::AskContinuation => self.ask_continuation(cancel).await,
                Io::End(result) => {
                    self.ended = true;
                    self.release(cancel);
                    // The final report, with what followed the last event
                    // (a late error after proof).
                    self.publish();
                    return Out::End(result.map_err(|o| self.failure_value(&o)));
                }
            }
        }
    }

    fn failure_now(&self) -> JsValue {
        let outcome = self.ex.outcome().cloned().unwrap_or(Outcome::Exhausted {
            attempts: self.ex.wire_attempt(),
        });
        self.failure_value(&outcome)
    }

    /// Waits on `awaited`, the machine's deadline and cancellation; tells
    /// the machine when the deadline or cancellation came first. `None`
    /// then, else what settled.
    async fn wait(&mut self, awaited: Awaited, cancel: &Cancel) -> Option<Woke> {
        let woke = WaitOn {
            awaited,
            deadline: self.ex.poll_timeout(),
            alarm: &mut self.alarm,
            platform: &*self.platform,
            cancel,
        }
        .await;
        match woke {
            Woke::Deadline => {
                self.ex.handle_timeout(&&*self.platform);
                None
            }
            // A rejection the caller's abort caused is the cancellation.
            Woke::Cancelled | Woke::Settled(Err(_)) if cancel.is_cancelled() => {
                let env = &*self.platform;
                self.ex.cancel(&env);
                None
            }
            other => Some(other),
        }
    }

    /// Starts the send with a fresh `AbortController`.
    fn send(&mut self, kind: SendKind, cancel: &Cancel) {
        let out = match kind {
            SendKind::Original => Outgoing {
                url: self.spec.url.clone(),
                method: self.spec.method.clone(),
                headers: self.spec.headers.clone(),
                body: self.spec.body.clone(),
            },
            SendKind::Resume(resume) => {
                let headers = Array::new();
                for pair in self.spec.headers.iter() {
                    let pair: Array = pair.unchecked_into();
                    let name = pair
                        .get(0)
                        .as_string()
                        .unwrap_or_default()
                        .to_ascii_lowercase();
                    let replaced = resume.header.as_ref().is_some_and(|(n, _)| *n == name);
                    let body_header = !resume.with_body && BODY_HEADERS.contains(&name.as_str());
                    if !replaced && !body_header {
                        headers.push(&pair);
                    }
                }
                if let Some((name, value)) = &resume.header {
                    headers.push(&Array::of2(
                        &JsValue::from_str(name),
                        &JsValue::from_str(value),
                    ));
                }
                Outgoing {
                    url: resume.url,
                    method: resume.method,
                    headers,
                    body: if resume.with_body {
                        self.spec.body.clone()
                    } else {
                        None
                    },
                }
            }
            SendKind::Continuation => {
                let Some(out) = self.continuation.take() else {
                    let failure = Failure::transport(TransportKind::Other, Phase::Sending);
                    self.ex.on_error(&&*self.platform, failure);
                    return;
                };
                out
            }
        };
        let controller = AbortController::new().ok();
        cancel.set_controller(controller.as_ref());
        let init = Object::new();
        set(&init, "method", &JsValue::from_str(&out.method));
        set(&init, "headers", &out.headers);
        if let Some(body) = &out.body {
            set(&init, "body", body);
        }
        set(&init, "redirect", &JsValue::from_str("manual"));
        if let Some(c) = &controller {
            set(&init, "signal", &c.signal());
        }
        let promise =
            match self
                .spec
                .fetch
                .call2(&js_sys::global(), &JsValue::from_str(&out.url), &init)
            {
                Ok(p) => js_sys::Promise::resolve(&p),
                Err(e) => js_sys::Promise::reject(&e),
            };
        self.fetching = Some(promise);
        self.head = None;
        // fetch cannot tell connecting from sending from awaiting the head.
        self.ex.on_sent(&&*self.platform);
    }

    async fn await_head(&mut self, cancel: &Cancel) {
        let Some(promise) = self.fetching.clone() else {
            let failure = Failure::transport(TransportKind::Other, Phase::Unknown);
            self.ex.on_error(&&*self.platform, failure);
            return;
        };
        let settled = self
            .wait(Awaited::Promise(JsFuture::from(promise)), cancel)
            .await;
        let Some(Woke::Settled(settled)) = settled else {
            return;
        };
        self.fetching = None;
        let env = &*self.platform;
        match settled {
            Err(e) => {
                self.cause = e;
                let failure = Failure::transport(TransportKind::Other, Phase::Unknown);
                self.ex.on_error(&env, failure);
            }
            Ok(response) => {
                let response: Response = response.unchecked_into();
                self.ex.on_head(&env, &JsHead(&response), None);
                // A head that may be the final answer is kept untouched: its
                // body is read from a copy.
                let read_from: Option<Response> = if self.ex.keeps_response() {
                    response.clone().ok()
                } else {
                    Some(Clone::clone(&response))
                };
                self.reader = read_from
                    .and_then(|r| r.body())
                    .map(|s| s.get_reader().unchecked_into());
                self.head = Some(response);
            }
        }
    }

    /// One chunk of the current attempt's body; `Some` when it goes to the
    /// consumer at once.
    async fn read(&mut self, cancel: &Cancel) -> Option<Uint8Array> {
        let Some(reader) = self.reader.clone() else {
            self.ex.on_end(&&*self.platform);
            return None;
        };
        let settled = self
            .wait(Awaited::Promise(JsFuture::from(reader.read())), cancel)
            .await;
        let Some(Woke::Settled(settled)) = settled else {
            return None;
        };
        let env = &*self.platform;
        match chunk_of(settled) {
            Err(e) => {
                self.cause = e;
                self.reader = None;
                let failure = Failure::transport(TransportKind::Other, Phase::Streaming);
                self.ex.on_error(&env, failure);
                None
            }
            Ok(None) => {
                self.reader = None;
                self.ex.on_end(&env);
                None
            }
            Ok(Some(array)) => {
                let chunk = JsChunk {
                    bytes: array.to_vec(),
                    array,
                };
                self.ex.on_chunk(&env, chunk).map(|c| c.array)
            }
        }
    }

    /// Calls the admission hook with `{ logicalId, nextAttempt, failure }`;
    /// it may answer `"allow"`, `"reject"`, `true`/`false` or a promise of
    /// those. Anything else (or a throw) is `unresolved`: pending is not
    /// approval, and the machine's deadline bounds the wait.
    async fn ask_admission(&mut self, request: AdmissionRequest, cancel: &Cancel) {
        let Some(hook) = self.spec.admission.clone() else {
            return;
        };
        let ctx = Object::new();
        set(&ctx, "logicalId", &JsValue::from_str(&request.logical_id));
        set(&ctx, "nextAttempt", &JsValue::from(request.next_attempt));
        set(&ctx, "failure", &to_js(&request.failure));
        let value = match hook.call1(&JsValue::UNDEFINED, &ctx) {
            Err(_) => JsValue::UNDEFINED,
            Ok(value) => match value.dyn_into::<js_sys::Promise>() {
                Ok(p) => match self.wait(Awaited::Promise(JsFuture::from(p)), cancel).await {
                    Some(Woke::Settled(Ok(v))) => v,
                    Some(_) => JsValue::UNDEFINED,
                    // The deadline or a cancel came first: the machine has it.
                    None => return,
                },
                Err(v) => v,
            },
        };
        let answer = match (value.as_bool(), value.as_string().as_deref()) {
            (Some(true), _) | (_, Some("allow")) => AdmissionAnswer::Allow,
            (Some(false), _) | (_, Some("reject")) => AdmissionAnswer::Reject,
            _ => AdmissionAnswer::Unresolved,
        };
        self.ex.admission(&&*self.platform, answer);
    }

    /// Calls the continuation hook with the delivered prefix `{ text,
    /// reasoning, toolFragments, truncated }`; it answers (or promises) `{
    /// url, method, headers, body }` or `null`.
    async fn ask_continuation(&mut self, cancel: &Cancel) {
        let given = match (&self.spec.continuation, self.ex.delivered_prefix()) {
            (Some(hook), Some(prefix)) => {
                let obj = Object::new();
                set(&obj, "text", &JsValue::from_str(&prefix.text));
                set(&obj, "reasoning", &JsValue::from_str(&prefix.reasoning));
                let tools = Array::new();
                for t in &prefix.tool_fragments {
                    tools.push(&JsValue::from_str(t));
                }
                set(&obj, "toolFragments", &tools);
                set(&obj, "truncated", &JsValue::from_bool(prefix.truncated));
                let hook = hook.clone();
                match hook.call1(&JsValue::UNDEFINED, &obj) {
                    Ok(v) => {
                        let p = js_sys::Promise::resolve(&v);
                        match self.wait(Awaited::Promise(JsFuture::from(p)), cancel).await {
                            Some(Woke::Settled(Ok(v))) => outgoing(&v),
                            Some(_) => None,
                            None => return,
                        }
                    }
                    Err(_) => None,
                }
            }
            _ => None,
        };
        self.ex.continuation(&&*self.platform, given.is_some());
        self.continuation = given;
    }
}

/// A continuation request as the wrapper normalized it, or `None`.
fn outgoing(v: &JsValue) -> Option<Outgoing> {
    if v.is_null() || v.is_undefined() {
        return None;
    }
    let url = get(v, "url").as_string()?;
    let method = get(v, "method")
        .as_string()
        .unwrap_or_else(|| "POST".into());
    let headers = get(v, "headers");
    let headers = if Array::is_array(&headers) {
        headers.unchecked_into()
    } else {
        Array::new()
    };
    let body = get(v, "body").dyn_into::<Uint8Array>().ok();
    Some(Outgoing {
        url,
        method,
        headers,
        body,
    })
}
