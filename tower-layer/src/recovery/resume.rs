//! What a committed body needs to continue its stream with a resume: the
//! original request, a way to send through the inner service again, and an
//! event-granular gate so that a seam never splits an event.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use recovery_core::call::{RecoveryCall, SendCredit};
use recovery_core::observer::{ObserverConfig, StreamObserver};
use recovery_core::progress::ResumeCursor;
use recovery_core::protocol::ProtocolKind;
use recovery_core::resume::{ResumePlan, may_resume, plan};
use recovery_core::wire::{Limits, ProtocolViolation};

use crate::BoxError;
use crate::request_body::ReplayBody;

pub(crate) type Inner = UnsyncBoxBody<Bytes, BoxError>;
pub(crate) type Sent = Pin<Box<dyn Future<Output = Result<Response<Inner>, BoxError>> + Send>>;
pub(crate) type SendFn = Box<dyn FnMut(Request<ReplayBody>) -> Sent + Send>;
pub(crate) type OnlineFn = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Forwards a stream one complete event at a time, dropping events a resumed
/// server repeats (at or below the resume cursor).
pub(crate) struct Gate {
    observer: StreamObserver,
    pending: BytesMut,
    /// Stream offset of `pending`'s first byte.
    offset: u64,
}

impl Gate {
    pub(crate) fn new(protocol: &ProtocolKind, limits: Limits, after_sequence: Option<u64>) -> Self {
        let config = ObserverConfig {
            limits,
            resume_after_sequence: after_sequence,
            ..ObserverConfig::default()
        };
        Gate {
            observer: StreamObserver::with_config(protocol.clone(), config),
            pending: BytesMut::new(),
            offset: 0,
        }
    }

    /// Takes a chunk; returns the complete, new events it finished.
    pub(crate) fn push(&mut self, chunk: &[u8]) -> Result<Vec<Bytes>, ProtocolViolation> {
        self.pending.extend_from_slice(chunk);
        let mut ends = Vec::new();
        self.observer
            .feed_with(chunk, |e| ends.push((e.end_offset, e.info.duplicate)))?;
        let mut out = Vec::with_capacity(ends.len());
        for (end, duplicate) in ends {
            let len = usize::try_from(end.saturating_sub(self.offset)).unwrap_or(usize::MAX);
            let event = self.pending.split_to(len.min(self.pending.len())).freeze();
            self.offset = end;
            if !duplicate && !event.is_empty() {
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
pub(crate) struct ResumeCtx {
    pub(crate) protocol: ProtocolKind,
    pub(crate) limits: Limits,
    pub(crate) sse_resumable: bool,
    pub(crate) head: http::request::Parts,
    pub(crate) body: Bytes,
    pub(crate) call: RecoveryCall,
    pub(crate) send: SendFn,
    pub(crate) wait_online: OnlineFn,
    /// The cursor reached over every attempt so far (a resumed stream does
    /// not repeat the response id, so it is carried over).
    pub(crate) cursor: ResumeCursor,
}

impl ResumeCtx {
    /// Whether a strategy could apply to this request at all (decides
    /// whether delivery must be event-granular).
    pub(crate) fn applies(&self) -> bool {
        may_resume(&self.protocol, self.sse_resumable, &self.body)
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
    pub(crate) fn send(&mut self, plan: &ResumePlan) -> Result<Sent, BoxError> {
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
