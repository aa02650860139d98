//! OpenAI Chat Completions streams (and the compatible dialects).

use super::errors::classify_error_value;
use super::json::{JsonKind, JsonView};
use super::{
    ChoiceEnd, Choices, Decode, EventClass, EventInfo, Evidence, Frame, Protocol, note,
    semantic_or_n, token, usage, with_json,
};
use crate::progress::{
    Proof, ProviderError, SemanticKind, Terminal, Transience, UnsuccessfulReason,
};
use crate::wire::ProtocolViolation;

/// Chat Completions: `data:` chunks, `[DONE]`, finish reasons per choice.
#[derive(Debug, Clone, Default)]
pub struct OpenAiChat {
    choices: Choices,
    done: bool,
}

/// How a `finish_reason` ends its choice (protocols.md §4.3).
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
    pub fn new() -> Self {
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
        let [error, object, choices, usage_v] =
            root.fields(["error", "object", "choices", "usage"]);
        if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
            usage::chat(&mut ev.usage, u);
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
            ] = delta.fields([
                "content",
                "refusal",
                "tool_calls",
                "function_call",
                "audio",
                "reasoning_content",
                "reasoning",
                "reasoning_details",
            ]);
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
        let class = with_json!(frame.data, decode, |root| self.chunk(root, ev))?;
        Ok(EventInfo::of(class))
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
