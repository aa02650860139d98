//! OpenAI Chat Completions streams (and the compatible dialects).

use super::errors::classify_error_value;
use super::{
    ChoiceEnd, Choices, Decode, EventClass, EventInfo, Evidence, Frame, Protocol, note,
    semantic_or_n, token, usage,
};
use crate::json::{JsonKind, JsonView, Parsed, Skim, Tape, Template};
use crate::progress::{
    Proof, ProviderError, SemanticKind, Terminal, Transience, UnsuccessfulReason,
};
use crate::wire::ProtocolViolation;

/// The delta (or message) keys a chunk is classified by, in the order the
/// classifier destructures them.
const DELTA_KEYS: [&str; 8] = [
    "content",
    "refusal",
    "tool_calls",
    "function_call",
    "audio",
    "reasoning_content",
    "reasoning",
    "reasoning_details",
];

/// Chat Completions: `data:` chunks, `[DONE]`, finish reasons per choice.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenAiChat {
    choices: Choices,
    done: bool,
    tape: Tape,
    /// The shape of a plain delta chunk, once one was seen.
    template: Template,
    /// What the template's probe string carries.
    probe_kind: Option<SemanticKind>,
}

/// Top-level keys [`OpenAiChat::chunk`] reads.
const CHUNK_KEYS: [&str; 5] = ["error", "object", "choices", "usage", "model"];

/// How a `finish_reason` ends its choice: `stop`, `tool_calls` and
/// `function_call` succeed; `length`, `content_filter` (`sensitive` on some
/// compatible servers) and any unknown reason end it unsuccessfully;
/// `error` (OpenRouter) is classified by its error object; `network_error`
/// and `insufficient_system_resource` are transient provider errors.
enum Finish {
    End(ChoiceEnd),
    Error(Transience),
    /// `error` (OpenRouter): the accompanying error object classifies it.
    ErrorObject,
}

fn finish(raw: &str) -> Finish {
    match raw {
        "stop" | "tool_calls" | "function_call" => Finish::End(ChoiceEnd::Success),
        "length" => Finish::End(ChoiceEnd::Unsuccessful(UnsuccessfulReason::Length)),
        "content_filter" | "sensitive" => {
            Finish::End(ChoiceEnd::Unsuccessful(UnsuccessfulReason::ContentFilter))
        }
        "error" => Finish::ErrorObject,
        "network_error" | "insufficient_system_resource" => Finish::Error(Transience::Transient),
        other => Finish::End(ChoiceEnd::Unsuccessful(UnsuccessfulReason::Other(token(
            other,
        )))),
    }
}

impl OpenAiChat {
    /// A fresh stream.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Classifies one chunk object (also used for a non-streamed body, whose
    /// choices carry `message` instead of `delta`).
    pub(crate) fn chunk<'a, V: JsonView<'a>>(
        &mut self,
        root: V,
        ev: &mut Evidence,
    ) -> Result<EventClass, ProtocolViolation> {
        if root.kind() != JsonKind::Object {
            return Err(ProtocolViolation::UnexpectedShape);
        }
        let [error, object, choices, usage_v, model] = root.fields(CHUNK_KEYS);
        if ev.generation.model.is_none()
            && let Some(m) = model.and_then(JsonView::text)
        {
            ev.generation.note_model(&m);
        }
        if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
            usage::chat(&mut ev.generation.usage, u);
        }
        if let Some(err) = error.filter(|e| e.kind() == JsonKind::Object) {
            return Ok(ev.set_error(classify_error_value(err, None)));
        }
        if object.is_some_and(|o| o.str_eq("error")) {
            return Ok(ev.set_error(classify_error_value(root, None)));
        }
        let mut first = None;
        let mut error = None;
        let mut result = Ok(());
        if let Some(choices) = choices {
            choices.for_each(|choice| {
                if result.is_ok() {
                    result = self.choice(choice, ev, &mut first, &mut error);
                }
            });
        }
        result?;
        if let Some(e) = error {
            return Ok(ev.set_error(e));
        }
        Ok(semantic_or_n(first))
    }

    fn choice<'a, V: JsonView<'a>>(
        &mut self,
        choice: V,
        ev: &mut Evidence,
        first: &mut Option<SemanticKind>,
        error: &mut Option<ProviderError>,
    ) -> Result<(), ProtocolViolation> {
        let [index, delta, message, finish_reason] =
            choice.fields(["index", "delta", "message", "finish_reason"]);
        let index = index.and_then(JsonView::as_u64).unwrap_or(0);
        let slot = self.choices.slot(index)?;
        if let Some(delta) = delta.or(message).filter(|d| d.kind() == JsonKind::Object) {
            let [
                content,
                refusal,
                tool_calls,
                function_call,
                audio,
                r_content,
                reasoning,
                r_details,
            ] = delta.fields(DELTA_KEYS);
            let p = &mut ev.progress;
            if content.is_some_and(|c| c.kind() != JsonKind::Object && c.is_nonempty()) {
                note(p, first, SemanticKind::Content);
            }
            if refusal.is_some_and(JsonView::is_nonempty_str) {
                note(p, first, SemanticKind::Content);
            }
            if audio.is_some_and(JsonView::is_nonempty) {
                note(p, first, SemanticKind::Content);
            }
            if r_content.is_some_and(JsonView::is_nonempty_str)
                || reasoning.is_some_and(JsonView::is_nonempty_str)
                || r_details.is_some_and(|d| d.kind() == JsonKind::Array && d.is_nonempty())
            {
                note(p, first, SemanticKind::Reasoning);
            }
            if let Some(calls) =
                tool_calls.filter(|t| t.kind() == JsonKind::Array && t.is_nonempty())
            {
                note(p, first, SemanticKind::Tool);
                calls.for_each(|call| {
                    let [id, function] = call.fields(["id", "function"]);
                    let named = function
                        .and_then(|f| f.get("name"))
                        .is_some_and(JsonView::is_nonempty_str);
                    if id.is_some_and(JsonView::is_nonempty_str) || named {
                        slot.2 += 1;
                    }
                });
            }
            if function_call.is_some_and(|f| f.kind() == JsonKind::Object && f.is_nonempty()) {
                note(p, first, SemanticKind::Tool);
                if function_call
                    .and_then(|f| f.get("name"))
                    .is_some_and(JsonView::is_nonempty_str)
                {
                    slot.2 += 1;
                }
            }
        }
        if slot.1.is_some() {
            return Ok(());
        }
        if let Some(raw) = finish_reason.and_then(JsonView::text) {
            ev.generation.note_finish(&raw);
            match finish(&raw) {
                Finish::End(end) => {
                    ev.progress.completed_tool_calls += slot.2;
                    slot.1 = Some(end);
                }
                Finish::Error(transience) => {
                    error.get_or_insert(ProviderError {
                        code: None,
                        status: None,
                        transience,
                    });
                }
                Finish::ErrorObject => {
                    error.get_or_insert(ProviderError {
                        code: None,
                        status: None,
                        transience: Transience::Unknown,
                    });
                }
            }
        }
        Ok(())
    }

    /// Learns the template of a plain delta chunk from `root`, which
    /// [`chunk`](Self::chunk) has just classified: one choice, no finish
    /// reason, no error, no usage, and at most one string (content,
    /// refusal or reasoning) that can make the chunk semantic. For such a
    /// chunk `chunk` only notes that string's kind when it is non-empty.
    fn learn(&mut self, root: Skim<'_>) {
        let [error, object, choices, usage_v, _] = root.fields(CHUNK_KEYS);
        if error.is_some_and(|e| e.kind() == JsonKind::Object)
            || object.is_some_and(|o| o.str_eq("error"))
            || usage_v.is_some_and(|u| u.kind() == JsonKind::Object)
        {
            return;
        }
        let mut count = 0;
        let mut only = None;
        if let Some(choices) = choices {
            choices.for_each(|c| {
                count += 1;
                only = Some(c);
            });
        }
        let (1, Some(choice)) = (count, only) else {
            return;
        };
        let [_, delta, _, finish_reason] =
            choice.fields(["index", "delta", "message", "finish_reason"]);
        let Some(delta) = delta.filter(|d| d.kind() == JsonKind::Object) else {
            return;
        };
        if finish_reason.is_some_and(|f| f.kind() == JsonKind::String) {
            return;
        }
        let [
            content,
            refusal,
            tool_calls,
            function_call,
            audio,
            r_content,
            reasoning,
            r_details,
        ] = delta.fields(DELTA_KEYS);
        if tool_calls.is_some_and(|t| t.kind() == JsonKind::Array && t.is_nonempty())
            || function_call.is_some_and(|f| f.kind() == JsonKind::Object && f.is_nonempty())
            || audio.is_some_and(JsonView::is_nonempty)
            || r_details.is_some_and(|d| d.kind() == JsonKind::Array && d.is_nonempty())
        {
            return;
        }
        // Content counts when it is any non-empty non-object; the others
        // only as non-empty strings.
        let semantic = [
            content.is_some_and(|c| c.kind() != JsonKind::Object && c.is_nonempty()),
            refusal.is_some_and(JsonView::is_nonempty_str),
            r_content.is_some_and(JsonView::is_nonempty_str),
            reasoning.is_some_and(JsonView::is_nonempty_str),
        ];
        let candidates = [
            (content, SemanticKind::Content),
            (refusal, SemanticKind::Content),
            (r_content, SemanticKind::Reasoning),
            (reasoning, SemanticKind::Reasoning),
        ];
        let is_str = |v: Option<Skim<'_>>| v.is_some_and(|v| v.kind() == JsonKind::String);
        // The probe: the semantic string if there is one, else the first string.
        let pick = match semantic.iter().filter(|&&s| s).count() {
            0 => candidates.iter().position(|c| is_str(c.0)),
            1 => semantic
                .iter()
                .position(|&s| s)
                .filter(|&i| is_str(candidates[i].0)),
            _ => None,
        };
        let Some(pick) = pick else {
            return;
        };
        let (Some(probe), kind) = candidates[pick] else {
            return;
        };
        let mut spares = Vec::new();
        root.members(|key, value| {
            if key.is_some_and(|k| !CHUNK_KEYS.iter().any(|c| c.as_bytes() == k)) {
                spares.push(value);
            }
        });
        self.template.learn(probe, spares);
        self.probe_kind = Some(kind);
    }

    /// A plain delta of the learned shape at the start of `buf` (an event's
    /// data with whatever follows it in the read): its length and the kind
    /// of semantic output it carries, if any. Changes no evidence; applying
    /// what it found is the caller's part, and equals what
    /// [`on_frame`](Protocol::on_frame) does for that event.
    pub(crate) fn delta_prefix(&mut self, buf: &[u8]) -> Option<(usize, Option<SemanticKind>)> {
        if self.done {
            return None;
        }
        let kind = self.probe_kind?;
        let (nonempty, len) = self.template.check_prefix(buf)?;
        Some((len, nonempty.then_some(kind)))
    }

    /// The outcome of a complete non-streamed body.
    pub(crate) fn body_outcome(&self) -> Terminal {
        self.choices
            .outcome(Proof::Strong)
            .unwrap_or(Terminal::Unsuccessful {
                reason: UnsuccessfulReason::MissingFinishReason,
            })
    }
}

impl Protocol for OpenAiChat {
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        if self.done {
            // Anything after `[DONE]` is ignored.
            return Ok(EventInfo::of(EventClass::NonSemantic));
        }
        if frame.data.starts_with(b"[DONE]") {
            self.done = true;
            if ev.is_settled() {
                return Ok(EventInfo::of(EventClass::NonSemantic));
            }
            let terminal = self
                .choices
                .outcome(Proof::Strong)
                .unwrap_or(Terminal::Unsuccessful {
                    reason: UnsuccessfulReason::MissingFinishReason,
                });
            return Ok(EventInfo::of(ev.set_terminal(terminal)));
        }
        let class = match decode {
            Decode::Fast => {
                if let Some(kind) = self.probe_kind
                    && let Some(nonempty) = self.template.check(frame.data)
                {
                    // What `chunk` does for this shape.
                    let mut first = None;
                    if nonempty {
                        note(&mut ev.progress, &mut first, kind);
                    }
                    return Ok(EventInfo::of(semantic_or_n(first)));
                }
                let mut tape = std::mem::take(&mut self.tape);
                let class = match tape.parse(frame.data) {
                    Ok(Parsed::Tape(root)) => {
                        let class = self.chunk(root, ev);
                        if class.is_ok() {
                            self.learn(root);
                        }
                        class
                    }
                    Ok(Parsed::Lazy(root)) => self.chunk(root, ev),
                    Err(e) => Err(e),
                };
                self.tape = tape;
                class
            }
            #[cfg(feature = "serde_json")]
            Decode::Reference => self.chunk(&crate::json::parse_reference(frame.data)?, ev),
        };
        Ok(EventInfo::of(class?))
    }

    fn on_eof(&mut self, _ev: &Evidence, pending: bool) -> Option<Terminal> {
        if self.done {
            return None;
        }
        match self.choices.outcome(Proof::FinishReasonOnly)? {
            t if t.is_success() && pending => None,
            t => Some(t),
        }
    }
}
