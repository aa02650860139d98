//! What a committed body needs to continue its stream with a resume: the
//! original request, a way to send through the inner service again, and an
//! event-granular gate so that a seam never splits an event.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use recovery_core::call::{RecoveryCall, SendCredit};
use recovery_core::continuation::DeliveredPrefix;
use recovery_core::observer::{ObserverConfig, StreamObserver};
use recovery_core::progress::ResumeCursor;
use recovery_core::protocol::{EventClass, ProtocolKind};
use recovery_core::report::SeamStrategy;
use recovery_core::resume::{ResumePlan, may_resume, plan};
use recovery_core::wire::{Limits, ProtocolViolation};

use crate::BoxError;
use crate::request_body::ReplayBody;

/// A resume request on its way: the inner service's response.
pub(crate) type Sent<B> = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;
pub(crate) type SendFn<B> = Box<dyn FnMut(Request<ReplayBody>) -> Sent<B> + Send>;
pub(crate) type OnlineFn = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Forwards a stream one complete event at a time, dropping events a resumed
/// server repeats (at or below the resume cursor) and, for a continuation,
/// the new generation's own preamble (everything before its first semantic
/// event).
pub(crate) struct Gate {
    observer: StreamObserver,
    pending: BytesMut,
    /// Stream offset of `pending`'s first byte.
    offset: u64,
    skip_until_semantic: bool,
}

impl Gate {
    pub(crate) fn new(
        protocol: &ProtocolKind,
        limits: Limits,
        after_sequence: Option<u64>,
    ) -> Self {
        let config = ObserverConfig {
            limits,
            resume_after_sequence: after_sequence,
            ..ObserverConfig::default()
        };
        Gate {
            observer: StreamObserver::with_config(protocol.clone(), config),
            pending: BytesMut::new(),
            offset: 0,
            skip_until_semantic: false,
        }
    }

    /// A gate for a continuation's stream: its preamble is dropped.
    pub(crate) fn splicing(mut self) -> Self {
        self.skip_until_semantic = true;
        self
    }

    /// Takes a chunk; returns the complete, new events it finished.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<Vec<Bytes>, ProtocolViolation> {
        self.pending.extend_from_slice(chunk);
        let mut ends = Vec::new();
        self.observer.feed_with(chunk, |e| {
            let semantic = matches!(e.info.class, EventClass::Semantic(_));
            ends.push((e.end_offset, e.info.duplicate, semantic));
        })?;
        let mut out = Vec::with_capacity(ends.len());
        for (end, duplicate, semantic) in ends {
            let len = usize::try_from(end.saturating_sub(self.offset)).unwrap_or(usize::MAX);
            let event = self.pending.split_to(len.min(self.pending.len())).freeze();
            self.offset = end;
            self.skip_until_semantic &= !semantic;
            if !duplicate && !self.skip_until_semantic && !event.is_empty() {
                out.push(event);
            }
        }
        Ok(out)
    }

    /// What is left after the last complete event (forwarded only when the
    /// stream ended with proof: a trailing line ending).
    pub(crate) fn rest(&mut self) -> Bytes {
        self.pending.split().freeze()
    }

    /// The cursor of the last complete event.
    pub(crate) fn cursor(&self) -> &ResumeCursor {
        self.observer.cursor()
    }
}

/// The resume context of one logical request.
pub(crate) struct ResumeCtx<B> {
    pub(crate) protocol: ProtocolKind,
    pub(crate) limits: Limits,
    pub(crate) sse_resumable: bool,
    pub(crate) head: http::request::Parts,
    pub(crate) body: Bytes,
    pub(crate) call: RecoveryCall,
    pub(crate) send: SendFn<B>,
    pub(crate) wait_online: OnlineFn,
    pub(crate) is_online: Arc<dyn Fn() -> bool + Send + Sync>,
    /// The cursor reached over every attempt so far (a resumed stream does
    /// not repeat the response id, so it is carried over).
    pub(crate) cursor: ResumeCursor,
    /// The caller's continuation hook, and what it is given.
    pub(crate) continuation: Option<ContinuationHook>,
    pub(crate) delivered: Option<DeliveredPrefix>,
    /// The continuation request the hook returned for the next resume.
    pub(crate) next_continuation: Option<(http::request::Parts, Bytes)>,
}

/// What a continuation hook is given.
#[derive(Debug)]
pub struct ContinuationContext<'a> {
    /// The original request's head.
    pub head: &'a http::request::Parts,
    /// The original request's body.
    pub body: &'a Bytes,
    /// What the consumer already received, as text, reasoning and tool
    /// fragments (sensitive: response text).
    pub delivered: &'a DeliveredPrefix,
}

/// A caller hook that continues a broken answer at the prompt level (an
/// assistant prefill, a "continue" turn): it returns the continuation
/// request, or `None` to decline. The continuation's output is spliced after
/// the delivered prefix, its own preamble dropped.
pub type ContinuationHook =
    Arc<dyn Fn(&ContinuationContext<'_>) -> Option<Request<Bytes>> + Send + Sync>;

impl<B> ResumeCtx<B> {
    /// Whether a strategy could apply to this request at all (decides
    /// whether delivery must be event-granular).
    pub(crate) fn applies(&self) -> bool {
        self.continuation.is_some() || may_resume(&self.protocol, self.sse_resumable, &self.body)
    }

    /// Whether a resume can be made now, asking the continuation hook when
    /// no native plan exists.
    pub(crate) fn prepare(&mut self) -> bool {
        self.plan().is_some() || self.prepare_continuation().is_some()
    }

    fn prepare_continuation(&mut self) -> Option<()> {
        let hook = self.continuation.as_ref()?;
        let delivered = self.delivered.as_ref()?;
        let ctx = ContinuationContext {
            head: &self.head,
            body: &self.body,
            delivered,
        };
        let req = hook(&ctx)?;
        let (head, body) = req.into_parts();
        self.next_continuation = Some((head, body));
        Some(())
    }

    /// Feeds delivered events to the prefix the continuation hook sees.
    pub(crate) fn delivered(&mut self, events: &[Bytes]) {
        if let Some(d) = self.delivered.as_mut() {
            for e in events {
                d.absorb(e);
            }
        }
    }

    /// Sends the prepared resume; returns the strategy and the gate for the
    /// resumed stream.
    pub(crate) fn send_next(&mut self) -> Result<(Sent<B>, SeamStrategy, Gate), BoxError> {
        if let Some(plan) = self.plan() {
            let strategy = match plan {
                ResumePlan::ResponsesBackground { .. } => SeamStrategy::ResponsesBackground,
                ResumePlan::LastEventId { .. } => SeamStrategy::LastEventId,
            };
            let gate = Gate::new(&self.protocol, self.limits, plan.after_sequence());
            return Ok((self.send(&plan)?, strategy, gate));
        }
        let (head, body) = self
            .next_continuation
            .take()
            .ok_or_else(|| BoxError::from("no resume prepared"))?;
        let mut req = Request::from_parts(head, ReplayBody::full(body));
        req.extensions_mut().insert(self.call.clone());
        req.extensions_mut().insert(SendCredit);
        let gate = Gate::new(&self.protocol, self.limits, None).splicing();
        Ok(((self.send)(req), SeamStrategy::Continuation, gate))
    }

    /// Folds a gate's cursor into the request's cursor.
    pub(crate) fn advance(&mut self, cursor: &ResumeCursor) {
        if cursor.response_id.is_some() {
            self.cursor.response_id.clone_from(&cursor.response_id);
        }
        if cursor.sequence_number.is_some() {
            self.cursor.sequence_number = cursor.sequence_number;
        }
        if cursor.last_event_id.is_some() {
            self.cursor.last_event_id.clone_from(&cursor.last_event_id);
        }
    }

    /// The plan for the current cursor.
    pub(crate) fn plan(&self) -> Option<ResumePlan> {
        plan(&self.protocol, self.sse_resumable, &self.body, &self.cursor)
    }

    /// Sends the resume request of `plan` through the inner service.
    pub(crate) fn send(&mut self, plan: &ResumePlan) -> Result<Sent<B>, BoxError> {
        let (head, with_body) = plan.request_head(&self.head)?;
        let body = if with_body {
            ReplayBody::full(self.body.clone())
        } else {
            ReplayBody::full(Bytes::new())
        };
        let mut req = Request::from_parts(head, body);
        req.extensions_mut().insert(self.call.clone());
        req.extensions_mut().insert(SendCredit);
        Ok((self.send)(req))
    }
}
