//! Anthropic Messages streams.

use super::errors::classify_error_value;
use super::{Decode, EventClass, EventInfo, Evidence, Frame, Protocol, token, usage};
use crate::json::{JsonKind, JsonView, Parsed, Skim, Tape, Template};
use crate::progress::{Proof, SemanticKind, Terminal, UnsuccessfulReason};
use crate::wire::ProtocolViolation;

/// Messages: `message_start`, content blocks, `message_delta`, `message_stop`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Anthropic {
    opaque_reasoning: bool,
    message_id: Option<String>,
    open: bool,
    stop_reason: Option<String>,
    /// Indexes of open `tool_use` blocks, completed at their stop.
    open_tools: Vec<u64>,
    tape: Tape,
    /// The shape of a plain `content_block_delta`, once one was seen.
    template: Template,
    /// The kinds such a delta shows with an empty and a non-empty probe.
    probe_kinds: Option<[Option<SemanticKind>; 2]>,
}

/// Top-level keys [`Anthropic::event`] reads.
const EVENT_KEYS: [&str; 7] = [
    "type",
    "message",
    "index",
    "content_block",
    "delta",
    "usage",
    "error",
];

/// Most open tool blocks tracked.
const MAX_OPEN_TOOLS: usize = 1024;

const NON_SEMANTIC: &[&str] = &[
    "ping",
    "message_start",
    "message_delta",
    "message_stop",
    "content_block_stop",
    "error",
];

/// Maps a `message_delta` stop reason to the terminal it proves.
pub(crate) fn stop_terminal(stop_reason: Option<&str>) -> Terminal {
    let unsuccessful = |reason| Terminal::Unsuccessful { reason };
    match stop_reason {
        Some("end_turn" | "stop_sequence" | "tool_use" | "pause_turn") => Terminal::Success {
            proof: Proof::Strong,
        },
        Some("max_tokens") => unsuccessful(UnsuccessfulReason::MaxTokens),
        Some("refusal") => unsuccessful(UnsuccessfulReason::Refusal),
        Some("model_context_window_exceeded") => {
            unsuccessful(UnsuccessfulReason::ContextWindowExceeded)
        }
        Some(other) => unsuccessful(UnsuccessfulReason::Other(token(other))),
        None => unsuccessful(UnsuccessfulReason::MissingFinishReason),
    }
}

/// The semantic kind a content block reveals when it starts (`None`: N).
pub(crate) fn block_kind<'a, V: JsonView<'a>>(block: V, opaque: bool) -> Option<SemanticKind> {
    let [kind, text, thinking] = block.fields(["type", "text", "thinking"]);
    let kind = kind.and_then(JsonView::text)?;
    match kind.as_ref() {
        "text" => text
            .is_some_and(JsonView::is_nonempty_str)
            .then_some(SemanticKind::Content),
        "tool_use" => Some(SemanticKind::Tool),
        "thinking" => (opaque || thinking.is_some_and(JsonView::is_nonempty_str))
            .then_some(SemanticKind::Reasoning),
        "redacted_thinking" => opaque.then_some(SemanticKind::Reasoning),
        "server_tool_use" | "mcp_tool_use" => Some(SemanticKind::SideEffect),
        k if k.ends_with("_tool_result") => Some(SemanticKind::Tool),
        _ => None,
    }
}

impl Anthropic {
    /// A fresh stream; `opaque_reasoning` counts thinking without visible
    /// text (omitted thinking, signatures, redacted thinking) as semantic.
    pub(crate) fn new(opaque_reasoning: bool) -> Self {
        Anthropic {
            opaque_reasoning,
            ..Self::default()
        }
    }

    fn event<'a, V: JsonView<'a>>(
        &mut self,
        root: V,
        ev: &mut Evidence,
    ) -> Result<EventClass, ProtocolViolation> {
        if root.kind() != JsonKind::Object {
            return Err(ProtocolViolation::UnexpectedShape);
        }
        let [kind, message, index, block, delta, usage_v, error] = root.fields(EVENT_KEYS);
        let Some(kind) = kind.and_then(JsonView::text) else {
            return Ok(EventClass::NonSemantic);
        };
        if kind == "ping" {
            return Ok(EventClass::Keepalive);
        }
        if ev.is_settled() {
            return Ok(EventClass::NonSemantic);
        }
        Ok(match kind.as_ref() {
            "message_start" => return self.message_start(message, ev),
            "content_block_start" => {
                let k = block.and_then(|b| block_kind(b, self.opaque_reasoning));
                self.open_tool(block, index)?;
                observed(ev, k)
            }
            "content_block_delta" => observed(ev, delta.and_then(|d| self.delta_kind(d))),
            "content_block_stop" => {
                let i = index.and_then(JsonView::as_u64).unwrap_or(0);
                if let Some(pos) = self.open_tools.iter().position(|&t| t == i) {
                    self.open_tools.swap_remove(pos);
                    ev.progress.completed_tool_calls += 1;
                }
                EventClass::NonSemantic
            }
            "message_delta" => {
                if let Some(reason) = delta
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(JsonView::text)
                {
                    if self.stop_reason.is_none() {
                        ev.generation.note_finish(&reason);
                    }
                    self.stop_reason = Some(reason.into_owned());
                }
                if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
                    usage::anthropic(&mut ev.generation.usage, u);
                }
                EventClass::NonSemantic
            }
            "message_stop" => {
                self.open = false;
                ev.set_terminal(stop_terminal(self.stop_reason.as_deref()))
            }
            "error" => ev.set_error(classify_error_value(error.unwrap_or(root), None)),
            _ => EventClass::NonSemantic,
        })
    }

    /// Opens the message (its id and the usage it starts with); a second
    /// start of the open message is ignored, one of another message is a
    /// splice of two answers.
    #[inline]
    fn message_start<'a, V: JsonView<'a>>(
        &mut self,
        message: Option<V>,
        ev: &mut Evidence,
    ) -> Result<EventClass, ProtocolViolation> {
        let [id, usage_v, model] =
            message.map_or([None, None, None], |m| m.fields(["id", "usage", "model"]));
        let id = id.and_then(JsonView::text);
        if self.open {
            if id.as_deref() != self.message_id.as_deref() {
                return Err(ProtocolViolation::SplicedMessage);
            }
            // A duplicate of the open message's start: ignored.
            return Ok(EventClass::NonSemantic);
        }
        self.open = true;
        self.message_id = id.map(std::borrow::Cow::into_owned);
        if let Some(m) = model.and_then(JsonView::text) {
            ev.generation.note_model(&m);
        }
        if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
            usage::anthropic(&mut ev.generation.usage, u);
        }
        Ok(EventClass::NonSemantic)
    }

    /// Tracks a `tool_use` block that starts at `index`, so that its stop
    /// completes a tool call (at most [`MAX_OPEN_TOOLS`] open at once).
    #[inline]
    fn open_tool<'a, V: JsonView<'a>>(
        &mut self,
        block: Option<V>,
        index: Option<V>,
    ) -> Result<(), ProtocolViolation> {
        let is_tool = block
            .and_then(|b| b.get("type"))
            .is_some_and(|t| t.str_eq("tool_use"));
        if is_tool {
            if self.open_tools.len() == MAX_OPEN_TOOLS {
                return Err(ProtocolViolation::TooManyParallelItems);
            }
            self.open_tools
                .push(index.and_then(JsonView::as_u64).unwrap_or(0));
        }
        Ok(())
    }

    /// The semantic kind a `content_block_delta`'s delta shows (`None`: N).
    #[inline]
    fn delta_kind<'a, V: JsonView<'a>>(&self, delta: V) -> Option<SemanticKind> {
        let [t, text, thinking] = delta.fields(["type", "text", "thinking"]);
        let t = t.and_then(JsonView::text)?;
        match t.as_ref() {
            "text_delta" => text
                .is_some_and(JsonView::is_nonempty_str)
                .then_some(SemanticKind::Content),
            "input_json_delta" => Some(SemanticKind::Tool),
            "thinking_delta" => (self.opaque_reasoning
                || thinking.is_some_and(JsonView::is_nonempty_str))
            .then_some(SemanticKind::Reasoning),
            "signature_delta" => self.opaque_reasoning.then_some(SemanticKind::Reasoning),
            // citations_delta and unknown deltas: conservatively content.
            _ => Some(SemanticKind::Content),
        }
    }
}

/// Counts `kind` as observed output and classes the event by it (`None`:
/// non-semantic).
#[inline]
fn observed(ev: &mut Evidence, kind: Option<SemanticKind>) -> EventClass {
    match kind {
        Some(k) => {
            ev.progress.observe(k);
            EventClass::Semantic(k)
        }
        None => EventClass::NonSemantic,
    }
}

impl Anthropic {
    /// Learns the template of a plain `content_block_delta` from `root`,
    /// which [`event`](Self::event) has just classified. For such an event
    /// `event` shows a kind that depends only on the delta's type (fixed
    /// bytes) and on whether one string of it (the probe) is empty.
    fn learn(&mut self, root: Skim<'_>) {
        let [kind, delta] = root.fields(["type", "delta"]);
        if !kind.is_some_and(|k| k.str_eq("content_block_delta")) {
            return;
        }
        let Some(delta) = delta.filter(|d| d.kind() == JsonKind::Object) else {
            return;
        };
        let [t, text, thinking, partial, signature] =
            delta.fields(["type", "text", "thinking", "partial_json", "signature"]);
        let opaque = self.opaque_reasoning.then_some(SemanticKind::Reasoning);
        let Some(t) = t.and_then(JsonView::text) else {
            return;
        };
        let (probe, kinds) = match t.as_ref() {
            "text_delta" => (text, [None, Some(SemanticKind::Content)]),
            "thinking_delta" => (thinking, [opaque, Some(SemanticKind::Reasoning)]),
            "input_json_delta" => (partial, [Some(SemanticKind::Tool); 2]),
            "signature_delta" => (signature, [opaque; 2]),
            _ => return,
        };
        let Some(probe) = probe else {
            return;
        };
        let mut spares = Vec::new();
        root.members(|key, value| {
            if key.is_some_and(|k| !EVENT_KEYS.iter().any(|c| c.as_bytes() == k)) {
                spares.push(value);
            }
        });
        self.template.learn(probe, spares);
        self.probe_kinds = Some(kinds);
    }
}

impl Anthropic {
    /// A plain `content_block_delta` of the learned shape at the start of
    /// `buf` (an event's data with whatever follows it in the read): its
    /// length and the kind of semantic output it shows, if any (none once
    /// the stream `settled`). Changes no evidence; applying what it found is
    /// the caller's part, and equals what [`on_frame`](Protocol::on_frame)
    /// does for that event.
    pub(crate) fn delta_prefix(
        &mut self,
        buf: &[u8],
        settled: bool,
    ) -> Option<(usize, Option<SemanticKind>)> {
        let kinds = self.probe_kinds?;
        let (nonempty, len) = self.template.check_prefix(buf)?;
        Some((
            len,
            if settled {
                None
            } else {
                kinds[usize::from(nonempty)]
            },
        ))
    }
}

impl Protocol for Anthropic {
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        let class = match decode {
            Decode::Fast => {
                if let Some(kinds) = self.probe_kinds
                    && let Some(nonempty) = self.template.check(frame.data)
                {
                    // What `event` does for this shape.
                    if ev.is_settled() {
                        return Ok(EventInfo::of(EventClass::NonSemantic));
                    }
                    let class = match kinds[usize::from(nonempty)] {
                        Some(k) => {
                            ev.progress.observe(k);
                            EventClass::Semantic(k)
                        }
                        None => EventClass::NonSemantic,
                    };
                    return Ok(EventInfo::of(class));
                }
                let mut tape = std::mem::take(&mut self.tape);
                let class = match tape.parse(frame.data) {
                    Ok(Parsed::Tape(root)) => {
                        let class = self.event(root, ev);
                        if class.is_ok() {
                            self.learn(root);
                        }
                        class
                    }
                    Ok(Parsed::Lazy(root)) => self.event(root, ev),
                    Err(e) => Err(e),
                };
                self.tape = tape;
                class
            }
            #[cfg(feature = "serde_json")]
            Decode::Reference => self.event(&crate::json::parse_reference(frame.data)?, ev),
        };
        Ok(EventInfo::of(class?))
    }

    fn non_semantic_event_type(&self, event_type: &[u8]) -> bool {
        NON_SEMANTIC.iter().any(|n| n.as_bytes() == event_type)
    }
}
