//! The wasm-bindgen surface used by the npm wrapper (`js/core.mjs`). It is
//! not the public API: JS code calls `createRecoveringFetch`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use js_sys::{Array, Function, Object, Reflect, Uint8Array};
use recovery_core::budget::RetryBudget;
use recovery_core::timing::{Connectivity, Timing};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::driver::{Cancel, Client, Driver, Out, Published, RequestSpec};
use crate::options::{OptionValue, OptionsError, Settings};
use crate::platform::{JsConnectivity, JsTiming, Platform};

/// A validated set of options; one per `createRecoveringFetch` call. Its
/// retry budget (if any) is shared by every request it starts.
#[wasm_bindgen]
pub struct RecoveryClient {
    client: Rc<Client>,
}

#[wasm_bindgen]
impl RecoveryClient {
    /// Validates the options: a plain object (functions already taken out
    /// by the wrapper), or its JSON text. Throws a `TypeError` for a wrong
    /// shape or a `RangeError` for a value out of range, with `code =
    /// "invalid_option"`.
    #[wasm_bindgen(constructor)]
    pub fn new(options: &JsValue) -> Result<RecoveryClient, JsValue> {
        let parsed = match options.as_string() {
            Some(text) => js_sys::JSON::parse(&text)
                .map_err(|_| OptionsError::Shape("the options are not valid JSON".into())),
            None => Ok(options.clone()),
        };
        let settings = parsed
            .and_then(|v| option_value(&v, 0))
            .and_then(|v| Settings::from_value(&v))
            .map_err(|e| {
                let message = e.to_string();
                let error: JsValue = if e.is_range() {
                    js_sys::RangeError::new(&message).into()
                } else {
                    js_sys::TypeError::new(&message).into()
                };
                let _ = Reflect::set(&error, &"code".into(), &"invalid_option".into());
                error
            })?;
        let budget = settings.retry_budget.map(RetryBudget::new);
        Ok(RecoveryClient {
            client: Rc::new(Client { settings, budget }),
        })
    }

    /// Prepares one logical request. `headers` is an array of `[name,
    /// value]` pairs; `body` the buffered request body.
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &self,
        fetch: Function,
        url: String,
        method: String,
        headers: Array,
        body: Option<Uint8Array>,
        on_event: Option<Function>,
        on_status: Option<Function>,
        admission: Option<Function>,
        continuation: Option<Function>,
    ) -> Call {
        let spec = RequestSpec {
            fetch,
            url,
            method,
            headers,
            body,
            on_event,
            on_status,
            admission,
            continuation,
        };
        self.start(spec, Rc::new((JsTiming, JsConnectivity)))
    }
}

impl RecoveryClient {
    fn start(&self, spec: RequestSpec, platform: Rc<dyn Platform>) -> Call {
        let driver = Driver::new(&self.client, spec, platform);
        Call {
            inner: Rc::new(CallInner {
                published: Rc::clone(&driver.published),
                protocol: driver.ex.protocol().name(),
                driver: RefCell::new(Some(driver)),
                cancel: Cancel::default(),
                busy: Cell::new(false),
                started: Cell::new(false),
            }),
        }
    }

    /// [`call`](RecoveryClient::call) on an injected clock, timer, jitter
    /// source and connectivity instead of the JS platform's: the same
    /// driver, so a test can run it on a virtual clock with pinned jitter
    /// (the shared conformance vectors do). Not exported to JS.
    #[allow(clippy::too_many_arguments)]
    pub fn call_with<T, C>(
        &self,
        fetch: Function,
        url: String,
        method: String,
        headers: Array,
        body: Option<Uint8Array>,
        on_event: Option<Function>,
        on_status: Option<Function>,
        admission: Option<Function>,
        continuation: Option<Function>,
        timing: T,
        connectivity: C,
    ) -> Call
    where
        T: Timing + 'static,
        T::Sleep: 'static,
        C: Connectivity + 'static,
        C::Online: 'static,
    {
        let spec = RequestSpec {
            fetch,
            url,
            method,
            headers,
            body,
            on_event,
            on_status,
            admission,
            continuation,
        };
        self.start(spec, Rc::new((timing, connectivity)))
    }
}

/// The JS options value in the JSON data model: `undefined` members are
/// left out (as `JSON.stringify` would), functions and symbols refused.
fn option_value(v: &JsValue, depth: u32) -> Result<OptionValue, OptionsError> {
    if depth > 8 {
        return Err(OptionsError::Shape("the options nest too deeply".into()));
    }
    Ok(if v.is_null() || v.is_undefined() {
        OptionValue::Null
    } else if let Some(b) = v.as_bool() {
        OptionValue::Bool(b)
    } else if let Some(n) = v.as_f64() {
        OptionValue::Number(n)
    } else if let Some(s) = v.as_string() {
        OptionValue::String(s)
    } else if Array::is_array(v) {
        let a: &Array = v.unchecked_ref();
        let mut items = Vec::new();
        for item in a.iter() {
            items.push(option_value(&item, depth + 1)?);
        }
        OptionValue::Array(items)
    } else if v.is_object() {
        let mut members = Vec::new();
        for entry in Object::entries(v.unchecked_ref()).iter() {
            let pair: Array = entry.unchecked_into();
            let value = pair.get(1);
            if value.is_undefined() {
                continue;
            }
            let key = pair.get(0).as_string().unwrap_or_default();
            members.push((key, option_value(&value, depth + 1)?));
        }
        OptionValue::Object(members)
    } else {
        return Err(OptionsError::Shape(
            "options hold only numbers, strings, booleans, arrays and objects".into(),
        ));
    })
}

struct CallInner {
    /// The driver, taken out while a `start()` or `next()` runs it.
    driver: RefCell<Option<Driver>>,
    published: Rc<Published>,
    protocol: &'static str,
    cancel: Cancel,
    busy: Cell<bool>,
    started: Cell<bool>,
}

impl CallInner {
    /// Runs the driver until it has something for JS.
    async fn advance(&self) -> Result<Out, JsValue> {
        if self.busy.replace(true) {
            return Err(js_sys::Error::new("concurrent use of a recovered request").into());
        }
        let taken = self.driver.borrow_mut().take();
        let Some(mut driver) = taken else {
            self.busy.set(false);
            return Ok(Out::End(Ok(())));
        };
        let out = driver.advance(&self.cancel).await;
        if self.cancel.is_cancelled() {
            // Cancelled while this step was settling: what it brought is not
            // handed further.
            driver.cancel(&self.cancel);
        }
        *self.driver.borrow_mut() = Some(driver);
        self.busy.set(false);
        Ok(out)
    }
}

impl Drop for CallInner {
    fn drop(&mut self) {
        // Dropped before the end (the JS object was freed or collected):
        // the machine decides (cancellation, or a completion after proof);
        // aborts the fetch.
        self.cancel.cancel();
        if let Some(driver) = self.driver.get_mut().as_mut() {
            driver.cancel(&self.cancel);
        }
    }
}

/// One logical request: `start()` resolves at commit (or with the final
/// HTTP error response), `next()` reads the stitched body, `cancel()` ends
/// it, `report()` tells what happened.
#[wasm_bindgen]
pub struct Call {
    inner: Rc<CallInner>,
}

#[wasm_bindgen]
impl Call {
    /// Runs the request up to commit. Resolves `{ kind: "committed" |
    /// "response", response }` (the committed attempt's or the final error
    /// `Response`); rejects with `{ message, outcome, report, cause }`.
    pub fn start(&self) -> js_sys::Promise {
        let inner = Rc::clone(&self.inner);
        future_to_promise(async move {
            if inner.started.replace(true) {
                return Err(js_sys::Error::new("request already started").into());
            }
            let (kind, response) = match inner.advance().await? {
                Out::Respond(response) => ("committed", response),
                Out::RespondError(response) => ("response", response),
                Out::End(Err(failure)) => return Err(failure),
                Out::Deliver(_) | Out::End(Ok(())) => {
                    return Err(js_sys::Error::new("no response").into());
                }
            };
            let out = Object::new();
            Reflect::set(&out, &"kind".into(), &kind.into())?;
            Reflect::set(&out, &"response".into(), &response)?;
            Ok(out.into())
        })
    }

    /// The next chunk of the stitched body (`Uint8Array`), or `undefined`
    /// at its end; rejects with `{ message, outcome, report, cause }` when
    /// the stream fails after commit.
    pub fn next(&self) -> js_sys::Promise {
        let inner = Rc::clone(&self.inner);
        future_to_promise(async move {
            // After the caller's cancel the body just ends: the wrapper
            // errors the stream with the abort reason.
            match inner.advance().await? {
                _ if inner.cancel.is_cancelled() => Ok(JsValue::UNDEFINED),
                Out::Deliver(chunk) => Ok(chunk.into()),
                Out::End(Err(failure)) => Err(failure),
                _ => Ok(JsValue::UNDEFINED),
            }
        })
    }

    /// Cancels the request wherever it is: aborts the fetch, lets the
    /// machine end it (once), and lets a pending `start()` or `next()`
    /// settle.
    pub fn cancel(&self) {
        self.inner.cancel.cancel();
        if !self.inner.busy.get()
            && let Some(driver) = self.inner.driver.borrow_mut().as_mut()
        {
            driver.cancel(&self.inner.cancel);
        }
    }

    /// The report so far (complete once the body ended), as a plain object
    /// with the Rust serde field names.
    pub fn report(&self) -> JsValue {
        self.inner.published.report.borrow().clone()
    }

    /// The outcome once the request ended, else `null`.
    pub fn outcome(&self) -> JsValue {
        self.inner.published.outcome.borrow().clone()
    }

    /// The last JS error seen (it may carry text from the wire: never log
    /// it blindly).
    #[wasm_bindgen(js_name = inspectCause)]
    pub fn inspect_cause(&self) -> JsValue {
        self.inner.published.cause.borrow().clone()
    }

    /// The protocol the body is decoded as.
    pub fn protocol(&self) -> String {
        self.inner.protocol.to_owned()
    }
}
