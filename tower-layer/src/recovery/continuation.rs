//! Prompt-level continuation: the caller's hook, and what it is given.

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use recovery_core::continuation::DeliveredPrefix;

/// What a continuation hook is given.
#[derive(Debug)]
#[non_exhaustive]
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
