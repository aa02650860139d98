//! What the machine and its driver say to each other: the surroundings a
//! driver reports ([`Env`]), a response head ([`Head`]), the request's facts
//! ([`RequestFacts`]), and what the machine asks for ([`Io`], [`Send`],
//! [`Chunk`], [`AdmissionRequest`]).

use std::borrow::Cow;
use std::time::SystemTime;

use bytes::Bytes;

#[cfg(doc)]
use super::Exchange;
use crate::failure::Failure;
use crate::outcome::Outcome;
use crate::resume::ResumeRequest;
use crate::timing::{Connectivity, Fraction, Instant, Timing};

/// What the driver's surroundings say now: the clocks, a jitter draw and
/// connectivity. Every [`Timing`] with a [`Connectivity`] is one.
pub trait Env {
    /// Now, on the monotonic clock.
    fn now(&self) -> Instant;
    /// Now, on the wall clock (for HTTP-date `Retry-After` values).
    fn wall_now(&self) -> SystemTime;
    /// A jitter draw.
    fn jitter(&self) -> Fraction;
    /// Whether the platform believes it is online.
    fn online(&self) -> bool;
}

impl<E: Env + ?Sized> Env for &E {
    fn now(&self) -> Instant {
        (**self).now()
    }
    fn wall_now(&self) -> SystemTime {
        (**self).wall_now()
    }
    fn jitter(&self) -> Fraction {
        (**self).jitter()
    }
    fn online(&self) -> bool {
        (**self).online()
    }
}

/// A [`Timing`] and a [`Connectivity`] together are an environment.
impl<T: Timing, C: Connectivity> Env for (T, C) {
    fn now(&self) -> Instant {
        self.0.now()
    }
    fn wall_now(&self) -> SystemTime {
        self.0.wall_now()
    }
    fn jitter(&self) -> Fraction {
        self.0.jitter()
    }
    fn online(&self) -> bool {
        self.1.is_online()
    }
}

/// A response head as the driver received it.
pub trait Head {
    /// The status code (0 for a browser's opaque redirect).
    fn status(&self) -> u16;
    /// A header's value by lowercase name; the first one when repeated.
    fn header(&self, name: &str) -> Option<Cow<'_, str>>;
    /// A browser hid a redirect behind an `opaqueredirect` response.
    fn opaque_redirect(&self) -> bool {
        false
    }
}

impl Head for http::response::Parts {
    fn status(&self) -> u16 {
        self.status.as_u16()
    }
    fn header(&self, name: &str) -> Option<Cow<'_, str>> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(Cow::Borrowed)
    }
}

/// What the machine needs to know of the logical request.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestFacts<'a> {
    /// The method.
    pub method: &'a str,
    /// The URL (absolute, or a path with its query).
    pub url: &'a str,
    /// The buffered body (empty when it could not be buffered).
    pub body: &'a [u8],
}

impl<'a> RequestFacts<'a> {
    /// The facts of a request: its method, its URL (absolute, or a path with
    /// its query) and its buffered body (empty when it could not be
    /// buffered).
    pub fn new(method: &'a str, url: &'a str, body: &'a [u8]) -> Self {
        RequestFacts { method, url, body }
    }
}

/// A chunk for the consumer: one the driver read, as it was, or one the
/// machine cut out of the stream (a complete event, when delivery is event
/// by event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk<C> {
    /// A chunk the driver read.
    Read(C),
    /// A complete event the machine cut out.
    Made(Bytes),
}

/// Which request a send carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Send {
    /// The original request (the first send, or a replay).
    Original,
    /// A provider-native resume of the committed stream.
    Resume(ResumeRequest),
    /// The continuation the caller's hook returned.
    Continuation,
    /// A declared prefill continuation of the committed answer on
    /// [`Exchange::target`]: that target's request (URL, headers) with this
    /// body, which carries the delivered text as the final assistant
    /// message ([`crate::continuation::Prefill`]).
    Prefill(Bytes),
}

/// What an admission hook is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionRequest {
    /// The logical request.
    pub logical_id: String,
    /// The send number the resend would be.
    pub next_attempt: u32,
    /// The failure that prompted it (safe evidence only).
    pub failure: Failure,
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Io<C> {
    /// Send a request (the attempt is counted already); call
    /// [`Exchange::on_sent`] once it is on its way.
    Send(Send),
    /// Keep waiting for the response head.
    AwaitHead,
    /// Read the next chunk of the body.
    Read,
    /// Close the current attempt's response: it is not used any more.
    Release,
    /// Hand the committed attempt's head to the caller; its body follows as
    /// [`Io::Deliver`] chunks.
    Respond,
    /// Hand the final error response to the caller as the server sent it:
    /// [`Exchange::take_held`] first, then the rest of its body untouched.
    RespondError,
    /// Hand this chunk to the consumer.
    Deliver(Chunk<C>),
    /// Sleep until [`Exchange::poll_timeout`].
    Sleep,
    /// Wait until the platform is online ([`Exchange::online`]) or
    /// [`Exchange::poll_timeout`].
    WaitOnline,
    /// Ask the admission hook; answer with [`Exchange::admission`]. Pending
    /// is not approval: [`Exchange::poll_timeout`] bounds the wait.
    AskAdmission(AdmissionRequest),
    /// Keep waiting for the admission hook.
    AwaitAdmission,
    /// Ask the continuation hook for a continuation of
    /// [`Exchange::delivered_prefix`]; answer with [`Exchange::continuation`].
    AskContinuation,
    /// The request ended: the body's clean end (`Ok`), or the typed outcome
    /// it fails with. Before [`Io::Respond`], the request fails.
    End(Result<(), Outcome>),
}
