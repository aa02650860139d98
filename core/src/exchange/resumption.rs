//! How a committed stream can be continued, and where it is: a native
//! resume (Responses background, a declared `Last-Event-ID` server), the
//! caller's continuation hook, or a declared prefill
//! ([`crate::continuation`]).

use bytes::Bytes;

use super::io::Send;
use super::route::Route;
use crate::continuation::splice::Splice;
use crate::continuation::{DeliveredPrefix, Prefill, prefill_body};
use crate::progress::ResumeCursor;
use crate::protocol::ProtocolKind;
use crate::report::SeamStrategy;
use crate::resume::{ResumePlan, native_resume, plan_at};

/// The request's ways on after commit. See the module docs.
#[derive(Debug)]
pub(super) struct Resumption {
    /// A native strategy may apply (Responses background, declared SSE).
    pub(super) native: bool,
    /// The caller installed a continuation hook.
    pub(super) hook: bool,
    /// The cursor reached over every attempt so far.
    cursor: ResumeCursor,
    /// What the consumer has, for a continuation.
    pub(super) prefix: Option<DeliveredPrefix>,
    /// The hook gave a continuation for the next send.
    pub(super) continuation_ready: bool,
    /// The targets that continue a prefill, by index (0: the request's
    /// own), with the body each sends.
    prefill: Vec<Option<(Prefill, Bytes)>>,
    /// A prefill continuation is the next send: its body and the splice of
    /// its stream.
    prefill_ready: Option<(Bytes, Box<Splice>)>,
    /// The gate for the next attempt's stream: the sequence it resumes
    /// after, and the splice of a continuation.
    pub(super) next_gate: Option<(Option<u64>, Option<Box<Splice>>)>,
}

/// The send that continues a committed stream.
pub(super) enum Continue {
    /// This send, whose seam is recorded as this strategy.
    Send(Send, SeamStrategy),
    /// No request can carry it (the cursor does not fit a URL or header,
    /// or the hook's continuation is gone).
    Impossible,
}

impl Resumption {
    pub(super) fn new(native: bool) -> Box<Self> {
        Box::new(Resumption {
            native,
            hook: false,
            cursor: ResumeCursor::default(),
            prefix: None,
            continuation_ready: false,
            prefill: Vec::new(),
            prefill_ready: None,
            next_gate: None,
        })
    }

    /// The same ways on for a hedge's lane, whose answer is read as
    /// `protocol`: what the request declared (a hook, prefills), with
    /// nothing of the other lane's stream (before commit the cursor and
    /// the pending continuations are empty anyway).
    pub(super) fn for_lane(&self, protocol: &ProtocolKind) -> Box<Self> {
        Box::new(Resumption {
            native: self.native,
            hook: self.hook,
            cursor: self.cursor.clone(),
            prefix: self
                .prefix
                .as_ref()
                .map(|_| DeliveredPrefix::new(protocol.clone())),
            continuation_ready: false,
            prefill: self.prefill.clone(),
            prefill_ready: None,
            next_gate: Some((None, None)),
        })
    }

    /// Whether nothing can continue a stream: no native strategy, no hook,
    /// no prefill.
    pub(super) fn is_idle(&self) -> bool {
        !self.native && !self.hook && !self.prefill.iter().any(Option::is_some)
    }

    /// Whether a continuation at the prompt level may come (a hook, or a
    /// declared prefill): what the consumer receives is kept for it.
    pub(super) fn continues_by_prompt(&self) -> bool {
        self.hook || self.prefill.iter().any(Option::is_some)
    }

    /// Keeps what the consumer receives, read as `protocol`.
    pub(super) fn keep_prefix(&mut self, protocol: &ProtocolKind) {
        if self.prefix.is_none() {
            self.prefix = Some(DeliveredPrefix::new(protocol.clone()));
        }
    }

    /// Declares target `i`'s prefill form and the body it sends.
    pub(super) fn declare_prefill(&mut self, i: usize, prefill: Prefill, body: &[u8]) {
        if self.prefill.len() <= i {
            self.prefill.resize_with(i + 1, || None);
        }
        self.prefill[i] = Some((prefill, Bytes::copy_from_slice(body)));
    }

    /// Folds an attempt's `cursor` into the request's.
    pub(super) fn fold(&mut self, cursor: Option<&ResumeCursor>) {
        if let Some(c) = cursor {
            if c.response_id.is_some() {
                self.cursor.response_id.clone_from(&c.response_id);
            }
            if c.sequence_number.is_some() {
                self.cursor.sequence_number = c.sequence_number;
            }
            if c.last_event_id.is_some() {
                self.cursor.last_event_id.clone_from(&c.last_event_id);
            }
        }
    }

    /// The native resume plan for the cursor reached, if any.
    pub(super) fn plan(&self, protocol: &ProtocolKind, background: bool) -> Option<ResumePlan> {
        if self.native {
            plan_at(protocol, background, &self.cursor)
        } else {
            None
        }
    }

    /// A committed answer read as `protocol` was cut: when what the
    /// consumer has is text only and target `serving`, or the next one
    /// that `speaks` the same protocol, declares a prefill, the
    /// continuation's body is written; the target it goes to, then.
    pub(super) fn prepare_prefill(
        &mut self,
        serving: usize,
        protocol: &ProtocolKind,
        speaks: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let prefix = self.prefix.as_ref().filter(|p| p.is_text_only())?;
        let (target, prefilled) = self
            .prefill
            .iter()
            .enumerate()
            .skip(serving)
            .filter(|(i, _)| speaks(*i))
            .find_map(|(i, p)| {
                let (prefill, body) = p.as_ref()?;
                Some((i, prefill_body(body, protocol, *prefill, &prefix.text)?))
            })?;
        let splice = Splice::new(protocol, prefix.seam.clone(), &prefilled.trimmed);
        self.prefill_ready = Some((Bytes::from(prefilled.body), Box::new(splice)));
        Some(target)
    }

    /// The request is read as `protocol` from now on, on `route`: whether a
    /// native resume applies is judged again, and a prefix kept for a
    /// continuation starts again when the protocol changes (what was
    /// delivered was read as the protocol it spoke). `None` stays `None`
    /// unless a native resume now applies.
    #[cold]
    pub(super) fn adopt(
        slot: &mut Option<Box<Resumption>>,
        route: &Route,
        from: &ProtocolKind,
        protocol: &ProtocolKind,
    ) {
        let native = native_resume(protocol, route.sse_resumable, route.background);
        if let Some(r) = slot.as_deref_mut() {
            r.native = native;
            if r.prefix.is_some() && protocol != from {
                r.prefix = Some(DeliveredPrefix::new(protocol.clone()));
            }
        } else if native {
            let mut r = Resumption::new(true);
            r.next_gate = Some((None, None));
            *slot = Some(r);
        }
    }

    /// The send that continues the committed stream now, to `route`: a
    /// native resume, else the hook's continuation, else a prepared
    /// prefill.
    pub(super) fn next_send(&mut self, route: &Route, protocol: &ProtocolKind) -> Continue {
        if let Some(plan) = self.plan(protocol, route.background) {
            let strategy = match plan {
                ResumePlan::ResponsesBackground { .. } => SeamStrategy::ResponsesBackground,
                ResumePlan::LastEventId { .. } => SeamStrategy::LastEventId,
            };
            self.next_gate = Some((plan.after_sequence(), None));
            return match plan.request(&route.method, &route.url) {
                Ok(request) => Continue::Send(Send::Resume(request), strategy),
                Err(_) => Continue::Impossible,
            };
        }
        if std::mem::take(&mut self.continuation_ready) {
            let facts = self.prefix.as_ref().map(|p| p.seam.clone());
            let splice = Splice::new(protocol, facts.unwrap_or_default(), "");
            self.next_gate = Some((None, Some(Box::new(splice))));
            return Continue::Send(Send::Continuation, SeamStrategy::Continuation);
        }
        match self.prefill_ready.take() {
            Some((body, splice)) => {
                self.next_gate = Some((None, Some(splice)));
                Continue::Send(Send::Prefill(body), SeamStrategy::Prefill)
            }
            None => Continue::Impossible,
        }
    }
}
