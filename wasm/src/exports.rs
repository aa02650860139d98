//! The wasm-bindgen surface used by the npm wrapper (`js/core.mjs`). It is
//! not the public API: JS code calls `createRecoveringFetch`.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Array, Function, Object, Reflect, Uint8Array};
use recovery_core::budget::RetryBudget;
use recovery_core::timing::{Connectivity, Timing};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::driver::{
    Cancel, Client, Live, RequestSpec, Resolved, SharedRef, cancel_live, drive, flush, next_chunk,
    now, start_engine,
};
use crate::js_value::to_js;
use crate::options::{OptionValue, OptionsError, Settings};
use crate::platform::{Injected, JsConnectivity, JsTiming, Platform};

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
        admission: Option<Function>,
    ) -> Call {
        let spec = RequestSpec {
            fetch,
            url,
            method,
            headers,
            body,
            on_event,
            admission,
        };
        self.start(
            spec,
            Rc::new(Injected {
                timing: JsTiming,
                connectivity: JsConnectivity,
            }),
        )
    }
}

impl RecoveryClient {
    fn start(&self, spec: RequestSpec, platform: Rc<dyn Platform>) -> Call {
        let shared = start_engine(&self.client, &spec, platform);
        Call {
            inner: Rc::new(CallInner {
                spec,
                shared,
                cancel: Cancel::default(),
                live: RefCell::new(None),
                busy: std::cell::Cell::new(false),
                started: std::cell::Cell::new(false),
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
        admission: Option<Function>,
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
            admission,
        };
        self.start(
            spec,
            Rc::new(Injected {
                timing,
                connectivity,
            }),
        )
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
    spec: RequestSpec,
    shared: SharedRef,
    cancel: Cancel,
    live: RefCell<Option<Live>>,
    busy: std::cell::Cell<bool>,
    started: std::cell::Cell<bool>,
}

impl Drop for CallInner {
    fn drop(&mut self) {
        // Dropped before the end (the JS object was freed or collected):
        // cancellation, never an EOF; aborts the fetch.
        self.cancel.cancel();
        if let Some(live) = self.live.get_mut().as_mut() {
            cancel_live(live, &self.shared);
        }
        let ended = self.shared.borrow().engine.outcome().is_some();
        if !ended {
            let now = now(&self.shared);
            self.shared
                .borrow_mut()
                .engine
                .cancel(now, recovery_core::outcome::CancelPhase::Sending);
            flush(&self.shared);
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
            let resolved = drive(&inner.spec, &inner.shared, &inner.cancel).await?;
            let out = Object::new();
            let (kind, response) = match resolved {
                Resolved::Committed(response, live) => {
                    *inner.live.borrow_mut() = Some(*live);
                    ("committed", response)
                }
                Resolved::ErrorResponse(response) => ("response", response),
            };
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
            if inner.busy.replace(true) {
                return Err(js_sys::Error::new("concurrent read of a recovered body").into());
            }
            let taken = inner.live.borrow_mut().take();
            let Some(mut live) = taken else {
                inner.busy.set(false);
                return Ok(JsValue::UNDEFINED);
            };
            let result = next_chunk(&mut live, &inner.shared, &inner.cancel).await;
            if inner.cancel.is_cancelled() && !live.done {
                // Cancelled while this read was settling: the chunk is not
                // delivered further and the request ends `cancelled`.
                cancel_live(&mut live, &inner.shared);
            }
            if !live.done {
                *inner.live.borrow_mut() = Some(live);
            }
            inner.busy.set(false);
            result.map(|c| c.map_or(JsValue::UNDEFINED, JsValue::from))
        })
    }

    /// Cancels the request wherever it is: aborts the fetch, ends the
    /// engine with `cancelled` (once), and lets a pending `start()` or
    /// `next()` settle.
    pub fn cancel(&self) {
        self.inner.cancel.cancel();
        if !self.inner.busy.get() {
            let taken = self.inner.live.borrow_mut().take();
            if let Some(mut live) = taken {
                cancel_live(&mut live, &self.inner.shared);
            }
        }
    }

    /// The report so far (complete once the body ended), as a plain object
    /// with the Rust serde field names.
    pub fn report(&self) -> JsValue {
        to_js(self.inner.shared.borrow().engine.report())
    }

    /// The outcome once the request ended, else `null`.
    pub fn outcome(&self) -> JsValue {
        match self.inner.shared.borrow().engine.outcome() {
            Some(o) => to_js(o),
            None => JsValue::NULL,
        }
    }

    /// The last JS error seen (it may carry text from the wire: never log
    /// it blindly).
    #[wasm_bindgen(js_name = inspectCause)]
    pub fn inspect_cause(&self) -> JsValue {
        self.inner.shared.borrow().cause.clone()
    }

    /// The protocol the body is decoded as.
    pub fn protocol(&self) -> String {
        self.inner.shared.borrow().protocol.name().to_owned()
    }
}
