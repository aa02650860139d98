//! Ollama `/api/chat` and `/api/generate` NDJSON streams.

use super::errors::classify_error_value;
use super::json::{JsonKind, JsonView};
use super::usage::OllamaMetrics;
use super::{
    Decode, EventClass, EventInfo, Evidence, Frame, Protocol, note, semantic_or_n, token, usage,
    with_json,
};
use crate::progress::{Proof, SemanticKind, Terminal, Transience, UnsuccessfulReason};
use crate::wire::ProtocolViolation;

/// Ollama: one object per line, `done: true` ends it.
#[derive(Debug, Clone, Default)]
pub struct Ollama;

impl Ollama {
    /// A fresh stream.
    pub fn new() -> Self {
        Ollama
    }

    pub(crate) fn line<'a, V: JsonView<'a>>(
        root: V,
        ev: &mut Evidence,
    ) -> Result<EventClass, ProtocolViolation> {
        if root.kind() != JsonKind::Object {
            return Err(ProtocolViolation::UnexpectedShape);
        }
        if ev.is_settled() {
            return Ok(EventClass::NonSemantic);
        }
        let [
            error,
            message,
            response,
            thinking,
            tool_calls,
            done,
            done_reason,
            total_duration,
            load_duration,
            prompt_eval_count,
            prompt_eval_duration,
            eval_count,
            eval_duration,
        ] = root.fields([
            "error",
            "message",
            "response",
            "thinking",
            "tool_calls",
            "done",
            "done_reason",
            "total_duration",
            "load_duration",
            "prompt_eval_count",
            "prompt_eval_duration",
            "eval_count",
            "eval_duration",
        ]);
        if let Some(err) = error.filter(|e| !e.is_null()) {
            let mut e = classify_error_value(err, None);
            if err.kind() == JsonKind::String {
                // Free text only: nothing says whether waiting helps.
                e.transience = Transience::Unknown;
            }
            return Ok(ev.set_error(e));
        }
        let [m_content, m_thinking, m_tools] = message.map_or([None, None, None], |m| {
            m.fields(["content", "thinking", "tool_calls"])
        });
        let mut first = None;
        let p = &mut ev.progress;
        if m_content.is_some_and(JsonView::is_nonempty_str)
            || response.is_some_and(JsonView::is_nonempty_str)
        {
            note(p, &mut first, SemanticKind::Content);
        }
        if m_thinking.is_some_and(JsonView::is_nonempty_str)
            || thinking.is_some_and(JsonView::is_nonempty_str)
        {
            note(p, &mut first, SemanticKind::Reasoning);
        }
        for calls in [m_tools, tool_calls].into_iter().flatten() {
            if calls.kind() == JsonKind::Array && calls.is_nonempty() {
                note(p, &mut first, SemanticKind::Tool);
                // Ollama sends tool calls whole.
                calls.for_each(|_| p.completed_tool_calls += 1);
            }
        }
        if done.and_then(JsonView::as_bool) != Some(true) {
            return Ok(semantic_or_n(first));
        }
        usage::ollama(
            &mut ev.usage,
            OllamaMetrics {
                prompt_eval_count,
                eval_count,
                total_duration,
                load_duration,
                prompt_eval_duration,
                eval_duration,
            },
        );
        let reason = done_reason.and_then(JsonView::text);
        let terminal = match reason.as_deref() {
            Some("stop" | "load" | "unload") => Terminal::Success {
                proof: Proof::Strong,
            },
            None => {
                ev.done_without_reason = true;
                Terminal::Success {
                    proof: Proof::Strong,
                }
            }
            Some("length") => Terminal::Unsuccessful {
                reason: UnsuccessfulReason::Length,
            },
            Some(other) => Terminal::Unsuccessful {
                reason: UnsuccessfulReason::Other(token(other)),
            },
        };
        let class = ev.set_terminal(terminal);
        // A final line may carry content too; the terminal class wins for
        // the record, the content was counted above.
        Ok(class)
    }
}

impl Protocol for Ollama {
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        let class = with_json!(frame.data, decode, |root| Self::line(root, ev))?;
        Ok(EventInfo::of(class))
    }
}
