//! What the machine and its driver say to each other: a response head
//! ([`Head`]), the request's facts ([`RequestFacts`]), and what the machine
//! asks for ([`Io`], [`Send`], [`Chunk`], [`AdmissionRequest`]).
//!
//! The driver's surroundings come in as plain values where they are read:
//! `now` (the monotonic clock) with every input, the wall clock with a
//! head (an HTTP-date `Retry-After` is judged against it), connectivity
//! with [`Exchange::poll`] (where every decision that depends on it is
//! taken), and the jitter once, at the start ([`super::Setup::jitter`]).

use std::borrow::Cow;

use bytes::Bytes;

#[cfg(doc)]
use super::Exchange;
use crate::body_fields::BodyFields;
use crate::failure::Failure;
use crate::outcome::Outcome;
pub use crate::report::Role;
use crate::resume::ResumeRequest;

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
        // A head is judged by a dozen names or more, most of them absent
        // (the rate-limit families): `HeaderMap::get` parses and hashes
        // each name, where one pass over a response's few headers compares
        // lengths first. The first value, as `get` gives it.
        self.headers
            .iter()
            .find(|(n, _)| n.as_str().eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.to_str().ok())
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
    /// The body's top-level fields, read once for every reader.
    fields: BodyFields<'a>,
}

impl<'a> RequestFacts<'a> {
    /// The facts of a request: its method, its URL (absolute, or a path with
    /// its query) and its buffered body (empty when it could not be
    /// buffered). The body is read here, once: [`RequestFacts::fields`].
    pub fn new(method: &'a str, url: &'a str, body: &'a [u8]) -> Self {
        RequestFacts {
            method,
            url,
            body,
            fields: BodyFields::read(body),
        }
    }

    /// [`RequestFacts::new`] with the body's fields as a reader before read
    /// them from the same bytes ([`ReadFields::fields_of`]).
    ///
    /// [`ReadFields::fields_of`]: crate::body_fields::ReadFields::fields_of
    pub fn with_fields(
        method: &'a str,
        url: &'a str,
        body: &'a [u8],
        fields: BodyFields<'a>,
    ) -> Self {
        RequestFacts {
            method,
            url,
            body,
            fields,
        }
    }

    /// The body's top-level fields (for [`cooldown::key_of`] and
    /// [`GenAiRequest::of`]), as [`RequestFacts::new`] read them.
    ///
    /// [`cooldown::key_of`]: crate::cooldown::key_of
    /// [`GenAiRequest::of`]: crate::genai::GenAiRequest::of
    pub fn fields(&self) -> BodyFields<'a> {
        self.fields
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
///
/// ```
/// use std::borrow::Cow;
/// use std::time::{Duration, SystemTime};
/// use recovery_core::budget::AttemptAllowance;
/// use recovery_core::exchange::{Exchange, Head, Io, RequestFacts, Send};
/// use recovery_core::policy::RecoveryPolicy;
/// use recovery_core::protocol::ProtocolChoice;
/// use recovery_core::timing::Instant;
///
/// struct Ok200;
/// impl Head for Ok200 {
///     fn status(&self) -> u16 { 200 }
///     fn header(&self, name: &str) -> Option<Cow<'_, str>> {
///         (name == "content-type").then_some(Cow::Borrowed("text/event-stream"))
///     }
/// }
///
/// let now = Instant::from_origin(Duration::ZERO);
/// let request = RequestFacts::new("POST", "/v1/chat/completions", b"{}");
/// let mut ex: Exchange<Vec<u8>> = Exchange::new(
///     RecoveryPolicy::default(),
///     &ProtocolChoice::Auto,
///     request,
///     AttemptAllowance::new(3),
///     7,
///     now,
/// );
/// assert!(matches!(ex.poll(now, true), Io::Send(Send::Original)));
/// ex.on_sent(now);
/// ex.on_head(now, SystemTime::UNIX_EPOCH, &Ok200, None);
/// let delta = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n".to_vec();
/// assert_eq!(ex.on_chunk(now, delta), None); // held back until commit...
/// assert!(matches!(ex.poll(now, true), Io::Respond)); // ...which this semantic delta is
/// assert!(matches!(ex.poll(now, true), Io::Deliver(_)));
/// assert!(matches!(ex.poll(now, true), Io::Read));
/// ```
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
    /// Start a hedge: send the original request to target `target` (0 for
    /// the request's own, `i` for alternate `i`) as a second attempt racing
    /// the one in flight. What happens to it goes in with the inputs that
    /// take a [`Role`] ([`Exchange::on_sent_of`] and the others) as
    /// [`Role::Hedge`].
    Hedge {
        /// The target it goes to.
        target: usize,
    },
    /// Two attempts race: wait for whichever has news first (a head, a
    /// chunk, an end, an error; each as its role) or
    /// [`Exchange::poll_timeout`].
    Race,
    /// Close the hedge's response: it lost its race, or left it.
    ReleaseHedge,
    /// The hedge won or outlasted its race (the attempt it raced was
    /// released just before): it is the request's attempt from now on, and
    /// its inputs come as [`Role::First`] again.
    Promote,
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

#[cfg(test)]
mod tests {
    use super::Head;

    #[test]
    fn a_response_head_gives_the_first_value_of_a_name_in_any_case() {
        let mut head = http::Response::builder()
            .status(429)
            .header("retry-after", "7")
            .header("x-ratelimit-remaining-requests", "0")
            .header("retry-after", "9")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        head.headers.insert(
            "content-type",
            http::HeaderValue::from_static("text/event-stream"),
        );
        assert_eq!(head.status(), 429);
        assert_eq!(head.header("retry-after").as_deref(), Some("7"));
        assert_eq!(head.header("Retry-After").as_deref(), Some("7"));
        assert_eq!(
            head.header("x-ratelimit-remaining-requests").as_deref(),
            Some("0")
        );
        assert_eq!(
            head.header("content-type").as_deref(),
            Some("text/event-stream")
        );
        assert_eq!(head.header("x-ratelimit-limit-requests"), None);
        assert_eq!(head.header("retry"), None);
    }
}
