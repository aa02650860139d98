//! Provider protocols: which wire protocol an answer speaks
//! ([`ProtocolKind`], or [`ProtocolChoice::Auto`] to guess it from the URL),
//! and whether a body is a stream or whole JSON ([`BodyForm`]).
//!
//! Inside the crate, one small type per provider classifies each decoded
//! frame into progress, terminal proof, provider errors and resume cursors;
//! the classifiers read JSON through one view trait, so the same rules run
//! on the fast scanner and on a full `serde_json::Value` in differential
//! tests. What a protocol proves and resumes is listed in
//! [`resume::capabilities`](crate::resume::capabilities).

#[cfg(feature = "anthropic")]
mod anthropic;
mod body;
pub mod error_event;
mod errors;
#[cfg(feature = "gemini")]
mod gemini;
mod generic;
mod kind;
#[cfg(feature = "ollama")]
mod ollama;
#[cfg(feature = "openai-chat")]
mod openai_chat;
#[cfg(feature = "openai-responses")]
mod openai_responses;
mod usage;

use serde::{Deserialize, Serialize};

#[cfg(feature = "anthropic")]
pub(crate) use anthropic::Anthropic;
pub(crate) use body::{classify_json_body, partial_body_may_be_semantic};
pub(crate) use errors::classify_error_body;
#[cfg(feature = "gemini")]
pub(crate) use gemini::Gemini;
pub(crate) use generic::GenericSse;
pub use kind::{
    BodyForm, ProtocolChoice, ProtocolKind, SseTerminal, UnknownProtocol, is_generation,
};
#[cfg(feature = "ollama")]
pub(crate) use ollama::Ollama;
#[cfg(feature = "openai-chat")]
pub(crate) use openai_chat::OpenAiChat;
#[cfg(feature = "openai-responses")]
pub(crate) use openai_responses::OpenAiResponses;

use crate::progress::{
    Generation, Progress, ProviderError, ResumeCursor, SemanticKind, Terminal, UnsuccessfulReason,
};
use crate::wire::ProtocolViolation;

/// One decoded frame: an SSE event or an NDJSON line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    /// The SSE `event:` value; empty for NDJSON and unnamed events.
    pub event_type: &'a [u8],
    /// The SSE data (or the NDJSON line).
    pub data: &'a [u8],
}

/// How JSON payloads are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Decode {
    /// Purpose-built validating scan (the hot path).
    #[default]
    Fast,
    /// A full `serde_json::Value` per event: the reference the fast path is
    /// tested against (feature `serde_json`).
    #[cfg(feature = "serde_json")]
    Reference,
}

impl Decode {
    /// [`Decode::Reference`] when `reference` is set and the reference path
    /// is built (feature `serde_json`), else [`Decode::Fast`].
    pub(crate) fn new(reference: bool) -> Self {
        #[cfg(feature = "serde_json")]
        if reference {
            return Decode::Reference;
        }
        let _ = reference;
        Decode::Fast
    }
}

/// Per-protocol choices that change what counts as semantic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SemanticOptions {
    /// Reasoning that shows no text (Anthropic omitted thinking, signatures,
    /// redacted thinking, empty Responses reasoning items) was still produced
    /// and billed, so by default it commits the attempt. Set `false` to treat
    /// it as non-semantic.
    pub opaque_reasoning_is_semantic: bool,
}

impl Default for SemanticOptions {
    fn default() -> Self {
        SemanticOptions {
            opaque_reasoning_is_semantic: true,
        }
    }
}

/// The class of one decoded frame: semantic output (S, or X for a
/// server-side tool start), non-semantic (N), keepalive (K), a successful
/// or unsuccessful terminal (T+, T-), a provider error (E).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "class", content = "kind")]
pub(crate) enum EventClass {
    /// S (or X when the kind is [`SemanticKind::SideEffect`]): a commit point.
    Semantic(SemanticKind),
    /// N: structure and metadata.
    NonSemantic,
    /// K: keepalive.
    Keepalive,
    /// T+: the protocol's proof of a normal finish.
    TerminalSuccess,
    /// T−: the provider ended the generation unsuccessfully.
    TerminalUnsuccessful,
    /// E: an in-stream provider error.
    Error,
}

/// What a protocol says about one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct EventInfo {
    /// The frame's class.
    pub class: EventClass,
    /// Responses `sequence_number`, when the frame carried one.
    pub sequence_number: Option<u64>,
    /// The frame repeats a sequence number at or below the resume cursor
    /// (a resumed stream replaying): the driver must drop its bytes. It
    /// changed no evidence.
    pub duplicate: bool,
}

impl EventInfo {
    /// A frame of class `class` without a sequence number.
    pub(crate) const fn of(class: EventClass) -> Self {
        EventInfo {
            class,
            sequence_number: None,
            duplicate: false,
        }
    }
}

/// Everything one attempt's stream has shown so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Evidence {
    /// Counters.
    pub progress: Progress,
    /// Terminal proof, once reached (first one wins).
    pub terminal: Option<Terminal>,
    /// The first in-stream provider error.
    pub provider_error: Option<ProviderError>,
    /// Where a resumable stream can continue from.
    pub cursor: ResumeCursor,
    /// What the provider said of the generation: model, finish reasons,
    /// usage and timings.
    pub generation: Generation,
    /// Frames dropped as duplicates of already-seen sequence numbers.
    pub duplicate_events: u64,
    /// Jumps in the sequence numbers (recorded, not a failure).
    pub sequence_gaps: u64,
    /// An NDJSON stream ended with a complete object but no final newline.
    pub unterminated_final_line: bool,
    /// Ollama ended with `done: true` but no `done_reason` (older servers).
    pub done_without_reason: bool,
    /// What was pending at EOF, when something was.
    pub pending_at_eof: Option<crate::failure::Unfinished>,
}

impl Evidence {
    /// Whether the stream is over as far as the protocol is concerned: a
    /// terminal or a provider error was seen. Later frames change nothing.
    pub(crate) fn is_settled(&self) -> bool {
        self.terminal.is_some() || self.provider_error.is_some()
    }

    /// Records terminal proof unless the stream already settled.
    pub(crate) fn set_terminal(&mut self, terminal: Terminal) -> EventClass {
        let class = if terminal.is_success() {
            EventClass::TerminalSuccess
        } else {
            EventClass::TerminalUnsuccessful
        };
        if !self.is_settled() {
            self.terminal = Some(terminal);
        }
        class
    }

    /// Records a provider error unless the stream already settled.
    pub(crate) fn set_error(&mut self, error: ProviderError) -> EventClass {
        if !self.is_settled() {
            self.provider_error = Some(error);
        }
        EventClass::Error
    }

    /// Completed tool calls that may be executed: only after terminal
    /// success proof.
    pub(crate) fn executable_tool_calls(&self) -> u64 {
        match &self.terminal {
            Some(t) if t.is_success() => self.progress.completed_tool_calls,
            _ => 0,
        }
    }
}

/// A provider protocol: frames in, evidence and classes out.
pub(crate) trait Protocol {
    /// Classifies one frame and updates `evidence`.
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        evidence: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation>;

    /// The terminal a clean end of body proves when no terminal event came
    /// (weak proof: every choice finished), given whether bytes were pending.
    fn on_eof(&mut self, _evidence: &Evidence, _pending: bool) -> Option<Terminal> {
        None
    }

    /// Whether an SSE event whose `event:` line named `event_type` is known
    /// not to carry semantic output (used for BD3 at EOF).
    fn non_semantic_event_type(&self, _event_type: &[u8]) -> bool {
        false
    }
}

/// Evaluates `$body` (a `Result`) with `$root` bound to the parsed JSON of
/// `$data`, read the fast way (through `$tape`, a [`json::Tape`] taken out
/// of the protocol for the call) or the reference way.
macro_rules! with_json {
    ($tape:expr, $data:expr, $decode:expr, |$root:ident| $body:expr) => {
        match $decode {
            $crate::protocol::Decode::Fast => match $tape.parse($data) {
                Ok($crate::json::Parsed::Tape($root)) => $body,
                Ok($crate::json::Parsed::Lazy($root)) => $body,
                Err(e) => Err(e),
            },
            #[cfg(feature = "serde_json")]
            $crate::protocol::Decode::Reference => match $crate::json::parse_reference($data) {
                Ok(value) => {
                    let $root = &value;
                    $body
                }
                Err(e) => Err(e),
            },
        }
    };
}
pub(crate) use with_json;

/// How one choice (Chat) or candidate (Gemini) ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChoiceEnd {
    Success,
    Unsuccessful(UnsuccessfulReason),
}

/// Per-choice state for protocols with parallel choices.
#[derive(Debug, Clone, Default)]
pub(crate) struct Choices {
    items: Vec<(u64, Option<ChoiceEnd>, u64)>,
}

/// Most parallel choices tracked; more is treated as hostile.
const MAX_CHOICES: usize = 256;

impl Choices {
    /// The slot of choice `index`, created on first sight.
    pub(crate) fn slot(
        &mut self,
        index: u64,
    ) -> Result<&mut (u64, Option<ChoiceEnd>, u64), ProtocolViolation> {
        if let Some(pos) = self.items.iter().position(|c| c.0 == index) {
            return Ok(&mut self.items[pos]);
        }
        if self.items.len() == MAX_CHOICES {
            return Err(ProtocolViolation::TooManyParallelItems);
        }
        self.items.push((index, None, 0));
        let last = self.items.len() - 1;
        Ok(&mut self.items[last])
    }

    /// Whether at least one choice was seen and all have ended.
    pub(crate) fn all_ended(&self) -> bool {
        !self.items.is_empty() && self.items.iter().all(|c| c.1.is_some())
    }

    /// The outcome once all choices ended: the first unsuccessful reason,
    /// else success with `proof`.
    pub(crate) fn outcome(&self, proof: crate::progress::Proof) -> Option<Terminal> {
        if !self.all_ended() {
            return None;
        }
        for c in &self.items {
            if let Some(ChoiceEnd::Unsuccessful(reason)) = &c.1 {
                return Some(Terminal::Unsuccessful {
                    reason: reason.clone(),
                });
            }
        }
        Some(Terminal::Success { proof })
    }
}

/// Counts `kind` once and remembers the first kind seen in a frame.
pub(crate) fn note(progress: &mut Progress, first: &mut Option<SemanticKind>, kind: SemanticKind) {
    progress.observe(kind);
    first.get_or_insert(kind);
}

/// The class of a frame that carried `first` (if any) and nothing stronger.
pub(crate) fn semantic_or_n(first: Option<SemanticKind>) -> EventClass {
    first.map_or(EventClass::NonSemantic, EventClass::Semantic)
}

/// A raw provider value kept only when it is token-shaped.
pub(crate) fn token(raw: &str) -> Option<crate::safe::SafeToken> {
    crate::safe::SafeToken::new(raw)
}
