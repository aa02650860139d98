//! The JS platform behind the engine's traits: clocks, timers, randomness,
//! connectivity and one-shot event listeners, all reached through
//! `globalThis` so the same code runs in a Window, any Worker, Node and
//! workerd.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use js_sys::{Function, Reflect, Uint8Array};
use recovery_core::exchange::Env;
use recovery_core::timing::{Connectivity, Fraction, Instant, Timing};
use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;

use crate::options::timer_millis;

/// `globalThis[name]`, or `undefined`.
pub(crate) fn global_get(name: &str) -> JsValue {
    Reflect::get(&js_sys::global(), &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

/// `target[name]`, or `undefined`.
pub(crate) fn get(target: &JsValue, name: &str) -> JsValue {
    if target.is_object() || target.is_function() {
        Reflect::get(target, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
    } else {
        JsValue::UNDEFINED
    }
}

/// Milliseconds on the monotonic clock: `performance.now()`, falling back to
/// `Date.now()` where there is no `performance` object.
fn now_ms() -> f64 {
    let perf = global_get("performance");
    if let Some(now) = get(&perf, "now").dyn_ref::<Function>()
        && let Some(ms) = now.call0(&perf).ok().and_then(|v| v.as_f64())
    {
        return ms;
    }
    js_sys::Date::now()
}

fn ms_to_duration(ms: f64) -> Duration {
    if ms.is_finite() && ms > 0.0 {
        Duration::from_micros((ms * 1000.0) as u64)
    } else {
        Duration::ZERO
    }
}

/// The engine's [`Timing`] on JS: `performance.now()` for the monotonic
/// clock, `Date.now()` for the wall clock, `setTimeout` (via gloo-timers)
/// for sleeps with the delay rounded up and clamped to the timer range, and
/// `crypto.getRandomValues` for jitter.
///
/// Deployed Cloudflare Workers advance clocks only across I/O; every wait
/// here is a timer, so backoff still waits its full delay there.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsTiming;

impl Timing for JsTiming {
    type Sleep = gloo_timers::future::TimeoutFuture;

    fn now(&self) -> Instant {
        Instant::from_origin(ms_to_duration(now_ms()))
    }

    fn wall_now(&self) -> SystemTime {
        UNIX_EPOCH + ms_to_duration(js_sys::Date::now())
    }

    fn sleep(&self, duration: Duration) -> Self::Sleep {
        gloo_timers::future::TimeoutFuture::new(timer_millis(duration))
    }

    fn jitter(&self) -> Fraction {
        Fraction::from_bits(random_u64())
    }
}

/// 64 random bits from `crypto.getRandomValues`; `Math.random()` where the
/// runtime has no Web Crypto. Never a fixed seed.
pub fn random_u64() -> u64 {
    let crypto = global_get("crypto");
    if let Some(f) = get(&crypto, "getRandomValues").dyn_ref::<Function>() {
        let buf = Uint8Array::new_with_length(8);
        if f.call1(&crypto, &buf).is_ok() {
            let mut bytes = [0u8; 8];
            buf.copy_to(&mut bytes);
            return u64::from_le_bytes(bytes);
        }
    }
    let hi = (js_sys::Math::random() * 4_294_967_296.0) as u64;
    let lo = (js_sys::Math::random() * 4_294_967_296.0) as u64;
    (hi << 32) | lo
}

/// A future that completes when `target` dispatches `event` once. The
/// listener is removed when the future completes or is dropped.
pub struct EventOnce {
    target: JsValue,
    event: &'static str,
    state: Rc<EventState>,
    listener: Option<Closure<dyn FnMut()>>,
}

#[derive(Default)]
struct EventState {
    fired: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl EventOnce {
    /// Listens on `target` (anything with `addEventListener`); `None` when
    /// it cannot be listened to.
    pub(crate) fn listen(target: &JsValue, event: &'static str) -> Option<EventOnce> {
        let add = get(target, "addEventListener")
            .dyn_into::<Function>()
            .ok()?;
        let state = Rc::new(EventState::default());
        let st = Rc::clone(&state);
        let listener = Closure::<dyn FnMut()>::new(move || {
            st.fired.set(true);
            if let Some(w) = st.waker.borrow_mut().take() {
                w.wake();
            }
        });
        add.call2(target, &JsValue::from_str(event), listener.as_ref())
            .ok()?;
        Some(EventOnce {
            target: target.clone(),
            event,
            state,
            listener: Some(listener),
        })
    }

    fn detach(&mut self) {
        if let Some(listener) = self.listener.take()
            && let Ok(remove) = get(&self.target, "removeEventListener").dyn_into::<Function>()
        {
            let _ = remove.call2(
                &self.target,
                &JsValue::from_str(self.event),
                listener.as_ref(),
            );
        }
    }
}

impl Future for EventOnce {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.state.fired.get() {
            self.detach();
            return Poll::Ready(());
        }
        *self.state.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for EventOnce {
    fn drop(&mut self) {
        self.detach();
    }
}

/// The engine's [`Connectivity`] on JS: `navigator.onLine` and the global
/// `online` event (a Window's or a WorkerGlobalScope's). Where the runtime
/// has no `navigator.onLine` (Node, workerd) it is always online.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsConnectivity;

/// What [`JsConnectivity::wait_until_online`] returns.
pub enum OnlineWait {
    /// Already online (or the platform cannot tell).
    Ready,
    /// Waiting for the `online` event.
    Event(EventOnce),
}

impl Future for OnlineWait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut() {
            OnlineWait::Ready => Poll::Ready(()),
            OnlineWait::Event(e) => Pin::new(e).poll(cx),
        }
    }
}

impl Connectivity for JsConnectivity {
    type Online = OnlineWait;

    fn is_online(&self) -> bool {
        get(&global_get("navigator"), "onLine")
            .as_bool()
            .unwrap_or(true)
    }

    fn wait_until_online(&self) -> OnlineWait {
        if self.is_online() {
            return OnlineWait::Ready;
        }
        match EventOnce::listen(&js_sys::global(), "online") {
            Some(e) => OnlineWait::Event(e),
            None => OnlineWait::Ready,
        }
    }
}

/// A boxed, `!Send` future of the driver's waits.
pub(crate) type Wait = Pin<Box<dyn Future<Output = ()>>>;

/// What the driver needs of the platform, object-safe: the engine's
/// [`Timing`] and [`Connectivity`] behind one `Rc<dyn Platform>`, so one
/// copy of the driver runs on the JS platform and on whatever a test
/// injects (a virtual clock, pinned jitter, scripted connectivity).
pub(crate) trait Platform: Env {
    fn sleep(&self, duration: Duration) -> Wait;
    fn wait_until_online(&self) -> Wait;
}

/// A [`Timing`] and a [`Connectivity`] (an [`Env`] as a pair) as a
/// [`Platform`].
impl<T, C> Platform for (T, C)
where
    T: Timing,
    T::Sleep: 'static,
    C: Connectivity,
    C::Online: 'static,
{
    fn sleep(&self, duration: Duration) -> Wait {
        Box::pin(self.0.sleep(duration))
    }

    fn wait_until_online(&self) -> Wait {
        Box::pin(self.1.wait_until_online())
    }
}
