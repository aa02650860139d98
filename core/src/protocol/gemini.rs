//! Google Gemini `streamGenerateContent?alt=sse`: whole responses per event,
//! no sentinel, finish reasons per candidate.

use super::errors::classify_error_value;
use super::{
    ChoiceEnd, Choices, Decode, EventClass, EventInfo, Evidence, Frame, Protocol, note,
    semantic_or_n, token, usage, with_json,
};
use crate::json::{JsonKind, JsonView, Tape};
use crate::progress::{Proof, SemanticKind, Terminal, UnsuccessfulReason};
use crate::wire::ProtocolViolation;

/// Gemini: proof is weak only (every candidate finished, then clean EOF).
#[derive(Debug, Clone, Default)]
pub(crate) struct Gemini {
    candidates: Choices,
    tape: Tape,
}

/// Maps a `finishReason` or `blockReason`.
fn reason_end(raw: &str) -> ChoiceEnd {
    match raw {
        "STOP" => ChoiceEnd::Success,
        "MAX_TOKENS" => ChoiceEnd::Unsuccessful(UnsuccessfulReason::MaxTokens),
        "SAFETY"
        | "IMAGE_SAFETY"
        | "PROHIBITED_CONTENT"
        | "IMAGE_PROHIBITED_CONTENT"
        | "BLOCKLIST"
        | "SPII" => ChoiceEnd::Unsuccessful(UnsuccessfulReason::ContentFilter),
        other => ChoiceEnd::Unsuccessful(UnsuccessfulReason::Other(token(other))),
    }
}

impl Gemini {
    /// A fresh stream.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn chunk<'a, V: JsonView<'a>>(
        &mut self,
        root: V,
        ev: &mut Evidence,
    ) -> Result<EventClass, ProtocolViolation> {
        if root.kind() != JsonKind::Object {
            return Err(ProtocolViolation::UnexpectedShape);
        }
        if ev.is_settled() {
            return Ok(EventClass::NonSemantic);
        }
        let [candidates, feedback, usage_v, error, model] = root.fields([
            "candidates",
            "promptFeedback",
            "usageMetadata",
            "error",
            "modelVersion",
        ]);
        if ev.generation.model.is_none()
            && let Some(m) = model.and_then(JsonView::text)
        {
            ev.generation.note_model(&m);
        }
        if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
            usage::gemini(&mut ev.generation.usage, u);
        }
        if let Some(err) = error.filter(|e| e.kind() == JsonKind::Object) {
            return Ok(ev.set_error(classify_error_value(err, None)));
        }
        let mut first = None;
        let mut result = Ok(());
        if let Some(candidates) = candidates {
            candidates.for_each(|c| {
                if result.is_ok() {
                    result = self.candidate(c, ev, &mut first);
                }
            });
        }
        result?;
        if let Some(block) = feedback
            .and_then(|f| f.get("blockReason"))
            .and_then(JsonView::text)
        {
            let reason = match reason_end(&block) {
                ChoiceEnd::Unsuccessful(r) => r,
                ChoiceEnd::Success => UnsuccessfulReason::Other(token(&block)),
            };
            return Ok(ev.set_terminal(Terminal::Unsuccessful { reason }));
        }
        Ok(semantic_or_n(first))
    }

    fn candidate<'a, V: JsonView<'a>>(
        &mut self,
        candidate: V,
        ev: &mut Evidence,
        first: &mut Option<SemanticKind>,
    ) -> Result<(), ProtocolViolation> {
        let [content, finish, index] = candidate.fields(["content", "finishReason", "index"]);
        let slot = self
            .candidates
            .slot(index.and_then(JsonView::as_u64).unwrap_or(0))?;
        if let Some(parts) = content.and_then(|c| c.get("parts")) {
            parts.for_each(|part| {
                let [text, thought, call, code, code_result, inline, file] = part.fields([
                    "text",
                    "thought",
                    "functionCall",
                    "executableCode",
                    "codeExecutionResult",
                    "inlineData",
                    "fileData",
                ]);
                let p = &mut ev.progress;
                if text.is_some_and(JsonView::is_nonempty_str) {
                    let k = if thought.and_then(JsonView::as_bool) == Some(true) {
                        SemanticKind::Reasoning
                    } else {
                        SemanticKind::Content
                    };
                    note(p, first, k);
                }
                if let Some(call) = call.filter(|c| c.kind() == JsonKind::Object) {
                    note(p, first, SemanticKind::Tool);
                    let more = call.get("willContinue").and_then(JsonView::as_bool) == Some(true);
                    if !more {
                        slot.2 += 1;
                    }
                }
                if code.is_some_and(|c| !c.is_null()) || code_result.is_some_and(|c| !c.is_null()) {
                    note(p, first, SemanticKind::Tool);
                }
                if inline.is_some_and(|c| !c.is_null()) || file.is_some_and(|c| !c.is_null()) {
                    note(p, first, SemanticKind::Content);
                }
            });
        }
        if slot.1.is_none()
            && let Some(raw) = finish.and_then(JsonView::text)
        {
            ev.generation.note_finish(&raw);
            let end = reason_end(&raw);
            ev.progress.completed_tool_calls += slot.2;
            slot.1 = Some(end);
        }
        Ok(())
    }

    /// The outcome of a complete non-streamed body.
    pub(crate) fn body_outcome(&self) -> Option<Terminal> {
        self.candidates.outcome(Proof::Strong)
    }
}

impl Protocol for Gemini {
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        let mut tape = std::mem::take(&mut self.tape);
        let class = with_json!(tape, frame.data, decode, |root| self.chunk(root, ev));
        self.tape = tape;
        Ok(EventInfo::of(class?))
    }

    fn on_eof(&mut self, _ev: &Evidence, pending: bool) -> Option<Terminal> {
        match self.candidates.outcome(Proof::FinishReasonOnly)? {
            t if t.is_success() && pending => None,
            t => Some(t),
        }
    }
}
