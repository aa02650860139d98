//! What one attempt's response stream has shown so far: progress counters,
//! terminal proof, in-stream provider errors and the resume cursor.
//!
//! These are the facts the decision function reasons about. Decoders produce
//! them; drivers copy them into reports. None of them carries body text.

use serde::{Deserialize, Serialize};

use crate::safe::SafeToken;

/// Which kind of semantic output a fragment was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SemanticKind {
    /// Visible text or a refusal.
    Content,
    /// Reasoning, including opaque or signed reasoning that shows no text.
    Reasoning,
    /// Any fragment of a tool call (a revealed tool name counts).
    Tool,
    /// A server-side tool started executing (web search, code interpreter).
    SideEffect,
}

/// Counters of what an attempt's stream carried.
///
/// `observed_*` counts what the decoder saw; `delivered_*` counts what reached
/// the consumer. Both block a replay on their own once non-zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Progress {
    /// Whether the response head was received.
    pub headers_received: bool,
    /// Bytes of response body read from the wire.
    pub raw_bytes: u64,
    /// Complete frames decoded (SSE events or NDJSON lines).
    pub frames: u64,
    /// Keepalive frames (SSE comments, `ping`, `keepalive`).
    pub keepalives: u64,
    /// Content fragments observed.
    pub observed_content: u64,
    /// Reasoning fragments observed.
    pub observed_reasoning: u64,
    /// Tool-call fragments observed.
    pub observed_tool_fragments: u64,
    /// Server-side tool executions observed.
    pub observed_side_effects: u64,
    /// Tool calls seen complete (executable only after terminal success).
    pub completed_tool_calls: u64,
    /// Content fragments delivered to the consumer.
    pub delivered_content: u64,
    /// Reasoning fragments delivered to the consumer.
    pub delivered_reasoning: u64,
    /// Tool-call fragments delivered to the consumer.
    pub delivered_tool_fragments: u64,
    /// Server-side tool executions delivered to the consumer.
    pub delivered_side_effects: u64,
    /// Body bytes delivered to the consumer.
    pub delivered_bytes: u64,
}

impl Progress {
    /// Semantic fragments observed so far (content, reasoning, tool, side
    /// effect): what the progress watchdog counts.
    pub fn semantic_fragments(&self) -> u64 {
        self.observed_content
            + self.observed_reasoning
            + self.observed_tool_fragments
            + self.observed_side_effects
    }

    /// Whether any semantic fragment (or side effect) was observed.
    /// Always inlined: it runs per event, and at opt-level "z" (the wasm
    /// package) it would stay a call.
    #[allow(clippy::inline_always)]
    #[inline(always)]
    pub fn semantic_observed(&self) -> bool {
        self.observed_content
            + self.observed_reasoning
            + self.observed_tool_fragments
            + self.observed_side_effects
            + self.completed_tool_calls
            > 0
    }

    /// Whether any semantic fragment reached the consumer.
    pub fn semantic_delivered(&self) -> bool {
        self.delivered_content
            + self.delivered_reasoning
            + self.delivered_tool_fragments
            + self.delivered_side_effects
            > 0
    }

    /// Whether a resend would repeat or change output somebody already saw.
    pub fn blocks_replay(&self) -> bool {
        self.semantic_observed() || self.semantic_delivered()
    }

    /// Counts one observed fragment of `kind`.
    pub fn observe(&mut self, kind: SemanticKind) {
        match kind {
            SemanticKind::Content => self.observed_content += 1,
            SemanticKind::Reasoning => self.observed_reasoning += 1,
            SemanticKind::Tool => self.observed_tool_fragments += 1,
            SemanticKind::SideEffect => self.observed_side_effects += 1,
        }
    }

    /// Marks everything observed so far as delivered (used when held-back
    /// frames are released to the consumer).
    pub fn deliver_observed(&mut self) {
        self.delivered_content = self.observed_content;
        self.delivered_reasoning = self.observed_reasoning;
        self.delivered_tool_fragments = self.observed_tool_fragments;
        self.delivered_side_effects = self.observed_side_effects;
    }
}

/// How strong a success proof is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Proof {
    /// An explicit end marker the protocol defines (`[DONE]`, `message_stop`,
    /// `response.completed`, Ollama `done`).
    Strong,
    /// A finish marker on every choice followed by a clean end of body, with
    /// no sentinel (Chat without `[DONE]`, Gemini).
    FinishReasonOnly,
}

impl std::fmt::Display for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Proof::Strong => "strong",
            Proof::FinishReasonOnly => "finish_reason_only",
        })
    }
}

/// Why a generation ended without success, by the provider's decision.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
#[non_exhaustive]
pub enum UnsuccessfulReason {
    /// Output token limit (`length`).
    Length,
    /// `max_tokens` / `MAX_TOKENS` / `max_output_tokens`.
    MaxTokens,
    /// Content filter or safety block.
    ContentFilter,
    /// The model refused.
    Refusal,
    /// The provider marked the response incomplete.
    Incomplete,
    /// A sentinel arrived but a choice never carried a finish reason.
    MissingFinishReason,
    /// The context window was exceeded.
    ContextWindowExceeded,
    /// The provider reported the response failed (`response.failed`).
    Failed(Option<SafeToken>),
    /// A terminal reason this crate does not know, kept when its shape is safe.
    Other(Option<SafeToken>),
}

/// Protocol proof of how a stream ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "terminal")]
#[non_exhaustive]
pub enum Terminal {
    /// The generation finished normally.
    Success {
        /// Strength of the proof.
        proof: Proof,
    },
    /// The generation ended by the provider's decision; never retried.
    Unsuccessful {
        /// Why.
        reason: UnsuccessfulReason,
    },
}

impl Terminal {
    /// Whether this is a success terminal.
    pub fn is_success(&self) -> bool {
        matches!(self, Terminal::Success { .. })
    }
}

/// Whether an error is expected to go away on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Transience {
    /// Overload, rate limit, server error: a later attempt may succeed.
    Transient,
    /// Invalid request, auth, quota, billing: a resend cannot help.
    Permanent,
    /// The provider does not say (Ollama's free-text errors).
    Unknown,
}

/// An error the provider reported inside a stream (or in an error body).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ProviderError {
    /// The provider's code when it is on the allowlist, else `None`.
    pub code: Option<SafeToken>,
    /// The numeric code some providers put in the body (Gemini, OpenRouter).
    pub status: Option<u16>,
    /// Classification of the code.
    pub transience: Transience,
}

/// Where a resumable stream can be continued from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ResumeCursor {
    /// The last SSE `id:` seen (the `Last-Event-ID` to send).
    pub last_event_id: Option<String>,
    /// The Responses API response id (`resp_…`).
    pub response_id: Option<String>,
    /// The last Responses `sequence_number` seen.
    pub sequence_number: Option<u64>,
}

impl ResumeCursor {
    /// Whether the cursor carries nothing to resume from.
    pub fn is_empty(&self) -> bool {
        self.last_event_id.as_deref().is_none_or(str::is_empty)
            && self.response_id.is_none()
            && self.sequence_number.is_none()
    }
}

/// What the provider said of a generation beside its output: the model
/// that answered, why each choice ended and what it counted
/// (OpenTelemetry `gen_ai.response.model`,
/// `gen_ai.response.finish_reasons`, `gen_ai.usage.*`).
#[derive(Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Generation {
    /// The model that answered, as the stream names it (of a safe shape).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub model: Option<String>,
    /// Why each choice ended, in the provider's words (`stop`,
    /// `end_turn`, `STOP`, ...), of a safe shape, at most
    /// [`Generation::MAX_FINISH_REASONS`].
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub finish_reasons: Vec<SafeToken>,
    /// The token use the provider reported.
    #[serde(skip_serializing_if = "Usage::is_empty", default)]
    pub usage: Usage,
}

/// `clone_from` keeps the target's buffers (see
/// [`crate::report::RecoveryReport`]).
impl Clone for Generation {
    fn clone(&self) -> Self {
        let mut copy = Generation::default();
        copy.clone_from(self);
        copy
    }

    fn clone_from(&mut self, source: &Self) {
        let Generation {
            model,
            finish_reasons,
            usage,
        } = source;
        self.model.clone_from(model);
        crate::copy::exact(&mut self.finish_reasons, finish_reasons);
        self.usage = *usage;
    }
}

impl Generation {
    /// The most finish reasons kept (one per choice).
    pub const MAX_FINISH_REASONS: usize = 16;
    /// The longest model name kept.
    pub const MAX_MODEL_LEN: usize = 128;

    /// Whether the provider said nothing of it.
    pub fn is_empty(&self) -> bool {
        self.model.is_none() && self.finish_reasons.is_empty() && self.usage.is_empty()
    }

    /// Keeps `raw` as the answering model when none is known yet and it
    /// has a safe shape: printable ASCII without spaces, quotes or angle
    /// brackets, at most [`Generation::MAX_MODEL_LEN`] bytes (model ids
    /// carry `/`, `@` and `:`, which a [`SafeToken`] does not).
    pub(crate) fn note_model(&mut self, raw: &str) {
        if self.model.is_none() && is_model_name(raw) {
            self.model = Some(raw.to_owned());
        }
    }

    /// Keeps one choice's finish reason, when it has a token's shape and
    /// there is room.
    pub(crate) fn note_finish(&mut self, raw: &str) {
        if self.finish_reasons.len() < Self::MAX_FINISH_REASONS
            && let Some(reason) = SafeToken::new(raw)
        {
            self.finish_reasons.push(reason);
        }
    }
}

/// Whether `m` may stand as a model name in a report or an attribute.
pub(crate) fn is_model_name(m: &str) -> bool {
    !m.is_empty()
        && m.len() <= Generation::MAX_MODEL_LEN
        && m.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\'' | b'\\' | b'<' | b'>'))
}

/// Token usage and timings as the provider reported them for one attempt.
///
/// Never invented: a field the provider did not send stays `None`, so a
/// report summing attempts can say what is known and what is not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Usage {
    /// Prompt / input tokens.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub input_tokens: Option<u64>,
    /// Completion / output tokens.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub output_tokens: Option<u64>,
    /// Total tokens, when the provider states it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub total_tokens: Option<u64>,
    /// Reasoning / thinking tokens.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reasoning_tokens: Option<u64>,
    /// Input tokens served from a prompt cache.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cached_input_tokens: Option<u64>,
    /// Input tokens written to a prompt cache (Anthropic).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cache_creation_input_tokens: Option<u64>,
    /// Whole request duration in nanoseconds (Ollama `total_duration`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub total_duration_ns: Option<u64>,
    /// Model load time in nanoseconds (Ollama).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub load_duration_ns: Option<u64>,
    /// Prompt evaluation time in nanoseconds (Ollama).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub prompt_eval_duration_ns: Option<u64>,
    /// Generation time in nanoseconds (Ollama).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub eval_duration_ns: Option<u64>,
}

impl Usage {
    /// Whether the provider reported nothing.
    pub fn is_empty(&self) -> bool {
        *self == Usage::default()
    }
}
