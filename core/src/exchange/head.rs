//! The rules of a response head, judged once: a browser's hidden redirect,
//! an error head (its `Retry-After` in every form against the wall clock,
//! `retry-after-ms`, `x-should-retry`, then its capped body for the
//! provider's code), or a 2xx whose content type says how to read it.

use std::borrow::Cow;
use std::time::SystemTime;

use super::io::Head;
use crate::failure::{Acceptance, Failure, FailureKind, Phase};
use crate::protocol::{BodyForm, ProtocolKind, classify_error_body};
use crate::retry_after::{RetryAfter, parse_should_retry};
use crate::safe::{RateLimits, SafeToken, rate_limits_with, request_id_with};

/// What a head is.
#[derive(Debug)]
pub(super) enum Verdict {
    /// A browser hid a redirect: the attempt failed, and the opaque
    /// response is the answer if nothing follows.
    Redirect(Failure),
    /// An error head: its body is read (capped) before it is judged.
    Error(Box<ErrorHead>),
    /// A successful answer, read as this form.
    Answer(BodyForm),
}

/// The evidence every head carries.
pub(super) struct Seen {
    pub(super) status: u16,
    pub(super) request_id: Option<SafeToken>,
    pub(super) rate_limits: Option<RateLimits>,
}

/// Judges `head`, a `Retry-After` date against `wall`.
pub(super) fn judge<H: Head + ?Sized>(head: &H, wall: SystemTime) -> (Verdict, Seen) {
    let status = head.status();
    let owned = |name: &str| head.header(name).map(Cow::into_owned);
    let seen = Seen {
        status,
        request_id: request_id_with(owned),
        rate_limits: rate_limits_with(owned),
    };
    if head.opaque_redirect() {
        let mut failure = Failure::new(FailureKind::Redirect { status }, Phase::AwaitingHeaders);
        failure.acceptance = Acceptance::Yes;
        failure.status = Some(status);
        return (Verdict::Redirect(failure), seen);
    }
    if !(200..300).contains(&status) {
        let header = |name| head.header(name);
        let retry_after = RetryAfter::from_values(
            header("retry-after-ms").as_deref(),
            header("retry-after").as_deref(),
            wall,
        );
        let should_retry = header("x-should-retry")
            .as_deref()
            .and_then(parse_should_retry);
        let error = ErrorHead {
            status,
            retry_after,
            should_retry,
            body: Vec::new(),
            read: 0,
        };
        return (Verdict::Error(Box::new(error)), seen);
    }
    let form = BodyForm::of(head.header("content-type").as_deref());
    (Verdict::Answer(form), seen)
}

/// An error head whose body is being read for its provider code.
#[derive(Debug)]
pub(super) struct ErrorHead {
    status: u16,
    retry_after: RetryAfter,
    should_retry: Option<bool>,
    body: Vec<u8>,
    read: usize,
}

impl ErrorHead {
    /// Keeps what fits of `bytes` under `cap`; `true` once the cap is
    /// reached (the rest of the body is not needed).
    pub(super) fn take(&mut self, bytes: &[u8], cap: usize) -> bool {
        let room = cap.saturating_sub(self.body.len());
        self.body.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.read += bytes.len();
        self.read >= cap
    }

    /// The failure the head and its body show, read as `protocol`, and the
    /// body kept (sensitive evidence).
    pub(super) fn judge(self, protocol: &ProtocolKind) -> (Failure, Vec<u8>) {
        let mut failure = Failure::status(self.status, self.retry_after, self.should_retry);
        if !(300..400).contains(&self.status)
            && let Some(error) = classify_error_body(protocol, Some(self.status), &self.body)
        {
            failure.kind = FailureKind::Provider { error };
        }
        (failure, self.body)
    }
}
