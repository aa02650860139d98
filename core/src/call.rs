//! Per-call handle: cancellation, the shared attempt allowance and per-call
//! policy overrides, carried in request extensions by the drivers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::budget::AttemptAllowance;
use crate::continuation::Prefill;
use crate::policy::RecoveryPolicy;
use crate::protocol::ProtocolKind;

#[derive(Debug, Default)]
struct CancelState {
    cancelled: bool,
    wakers: Vec<Waker>,
}

/// A runtime-free cancellation signal. Clones share it.
#[derive(Clone, Default)]
pub struct Cancellation {
    state: Arc<Mutex<CancelState>>,
}

impl fmt::Debug for Cancellation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancellation")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

impl Cancellation {
    /// A signal not yet raised.
    pub fn new() -> Self {
        Cancellation::default()
    }

    /// Raises the signal and wakes every waiter.
    pub fn cancel(&self) {
        let wakers = {
            let mut s = self.state.lock().expect("cancellation");
            s.cancelled = true;
            std::mem::take(&mut s.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Whether the signal was raised.
    pub fn is_cancelled(&self) -> bool {
        self.state.lock().expect("cancellation").cancelled
    }

    /// A future that completes once the signal is raised.
    pub fn cancelled(&self) -> Cancelled {
        Cancelled {
            state: Arc::clone(&self.state),
        }
    }
}

/// Future of [`Cancellation::cancelled`].
#[derive(Debug)]
pub struct Cancelled {
    state: Arc<Mutex<CancelState>>,
}

impl Future for Cancelled {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.state.lock().expect("cancellation");
        if s.cancelled {
            Poll::Ready(())
        } else {
            if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                s.wakers.push(cx.waker().clone());
            }
            Poll::Pending
        }
    }
}

/// What a caller (or an outer recovery layer) attaches to one logical request.
///
/// A nested recovery layer that finds a `RecoveryCall` joins its allowance
/// instead of starting its own, so two stacked layers make at most
/// `max_attempts` physical sends in total, not the product.
#[derive(Debug, Clone, Default)]
pub struct RecoveryCall {
    cancellation: Cancellation,
    policy: Option<Arc<RecoveryPolicy>>,
    allowance: Option<AttemptAllowance>,
    logical_id: Option<u64>,
    stream_body: bool,
    protocol: Option<ProtocolKind>,
    context_window: Option<u64>,
    prefill: Option<Prefill>,
}

impl RecoveryCall {
    /// A call with nothing overridden.
    pub fn new() -> Self {
        RecoveryCall::default()
    }

    /// Uses `policy` for this call instead of the layer's.
    #[must_use]
    pub fn with_policy(mut self, policy: RecoveryPolicy) -> Self {
        self.policy = Some(Arc::new(policy));
        self
    }

    /// Decodes this call's answer as `protocol` instead of the layer's (one
    /// layer in front of several protocols: a gateway's upstream leg).
    #[must_use]
    pub fn with_protocol(mut self, protocol: ProtocolKind) -> Self {
        self.protocol = Some(protocol);
        self
    }

    /// The per-call protocol, if any.
    pub fn protocol(&self) -> Option<&ProtocolKind> {
        self.protocol.as_ref()
    }

    /// Declares the context window, in tokens, of the endpoint this call is
    /// sent to: a prompt too long for it moves only to an alternate whose
    /// declared window is larger ([`crate::failover::Target::with_context_window`]).
    #[must_use]
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// The declared context window of this call's own endpoint.
    pub fn context_window(&self) -> Option<u64> {
        self.context_window
    }

    /// Declares that the endpoint this call is sent to continues an
    /// assistant message it is given, in the form `prefill`
    /// ([`crate::continuation`]): a committed answer cut after text only is
    /// sent there again with the delivered text as that message, and the
    /// continuation is spliced after it (bounded by the policy's
    /// `max_resumes`).
    #[must_use]
    pub fn with_prefill(mut self, prefill: Prefill) -> Self {
        self.prefill = Some(prefill);
        self
    }

    /// The declared prefill form of this call's own endpoint.
    pub fn prefill(&self) -> Option<Prefill> {
        self.prefill
    }

    /// Streams the request body through once instead of buffering it (a body
    /// too large or too slow to hold): the request is sent once and a
    /// failure before commit ends with `replay_disabled(not_replayable)`.
    #[must_use]
    pub fn streaming_body(mut self) -> Self {
        self.stream_body = true;
        self
    }

    /// Whether the body must be streamed through once, never buffered.
    pub fn streams_body(&self) -> bool {
        self.stream_body
    }

    /// Cancels this call when `cancellation` is raised.
    #[must_use]
    pub fn with_cancellation(mut self, cancellation: Cancellation) -> Self {
        self.cancellation = cancellation;
        self
    }

    /// The call's cancellation signal.
    pub fn cancellation(&self) -> &Cancellation {
        &self.cancellation
    }

    /// The per-call policy override, if any.
    pub fn policy(&self) -> Option<&RecoveryPolicy> {
        self.policy.as_deref()
    }

    /// The shared allowance, once a recovery layer has joined the call.
    pub fn allowance(&self) -> Option<&AttemptAllowance> {
        self.allowance.as_ref()
    }

    /// The logical request id, once a recovery layer has joined the call.
    pub fn logical_id(&self) -> Option<u64> {
        self.logical_id
    }

    /// Joins the call: returns the allowance already shared by an outer layer,
    /// or creates one of `max_attempts` and records it (with `logical_id`) so
    /// inner layers join it.
    pub fn join(&mut self, max_attempts: u32, logical_id: u64) -> (AttemptAllowance, u64) {
        let allowance = self
            .allowance
            .get_or_insert_with(|| AttemptAllowance::new(max_attempts))
            .clone();
        let id = *self.logical_id.get_or_insert(logical_id);
        (allowance, id)
    }
}

/// Marks a request whose send was already debited by an outer recovery layer:
/// an inner layer takes it out of the request extensions and does not debit
/// its first send again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendCredit;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_join_shares_one_allowance() {
        let mut outer = RecoveryCall::new();
        let (a, id) = outer.join(3, 7);
        let mut inner = outer.clone();
        let (b, inner_id) = inner.join(5, 9);
        assert_eq!(id, inner_id);
        assert!(a.try_debit());
        assert!(b.try_debit());
        assert!(a.try_debit());
        assert!(!b.try_debit(), "inner layer cannot multiply sends");
    }

    #[test]
    fn cancellation_is_shared_by_clones() {
        let c = Cancellation::new();
        let call = RecoveryCall::new().with_cancellation(c.clone());
        assert!(!call.cancellation().is_cancelled());
        c.cancel();
        assert!(call.cancellation().is_cancelled());
    }
}
