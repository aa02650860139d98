//! Ollama `/api/chat` and `/api/generate` NDJSON streams.

use super::errors::classify_error_value;
use super::usage::OllamaMetrics;
use super::{
    Decode, EventClass, EventInfo, Evidence, Frame, Protocol, note, semantic_or_n, token, usage,
};
use crate::json::{JsonKind, JsonView, Parsed, Skim, Tape, Template};
use crate::progress::{
    Progress, Proof, ProviderError, SemanticKind, Terminal, Transience, UnsuccessfulReason,
};
use crate::wire::ProtocolViolation;

/// Ollama: one object per line, `done: true` ends it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ollama {
    tape: Tape,
    /// The shape of a plain delta line, once one was seen.
    template: Template,
    /// What the template's probe string carries.
    probe_kind: Option<SemanticKind>,
}

/// Top-level keys [`Ollama::line`] reads.
const LINE_KEYS: [&str; 14] = [
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
    "model",
];

/// Keys of `message` that [`Ollama::line`] reads.
const MESSAGE_KEYS: [&str; 3] = ["content", "thinking", "tool_calls"];

impl Ollama {
    /// A fresh stream.
    pub(crate) fn new() -> Self {
        Self::default()
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
            model,
        ] = root.fields(LINE_KEYS);
        if ev.generation.model.is_none()
            && let Some(m) = model.and_then(JsonView::text)
        {
            ev.generation.note_model(&m);
        }
        if let Some(err) = error.filter(|e| !e.is_null()) {
            return Ok(ev.set_error(line_error(err)));
        }
        let first = note_output(message, response, thinking, tool_calls, &mut ev.progress);
        if done.and_then(JsonView::as_bool) != Some(true) {
            return Ok(semantic_or_n(first));
        }
        usage::ollama(
            &mut ev.generation.usage,
            OllamaMetrics {
                prompt_eval_count,
                eval_count,
                total_duration,
                load_duration,
                prompt_eval_duration,
                eval_duration,
            },
        );
        let terminal = done_terminal(done_reason, ev);
        let class = ev.set_terminal(terminal);
        // A final line may carry content too; the terminal class wins for
        // the record, the content was counted above.
        Ok(class)
    }
}

/// The provider error an `error` member reports.
#[inline]
fn line_error<'a, V: JsonView<'a>>(err: V) -> ProviderError {
    let mut e = classify_error_value(err, None);
    if err.kind() == JsonKind::String {
        // Free text only: nothing says whether waiting helps.
        e.transience = Transience::Unknown;
    }
    e
}

/// Notes the output a line carries (content or response text, thinking,
/// whole tool calls, each counted complete) and returns the first kind
/// noted.
#[inline]
fn note_output<'a, V: JsonView<'a>>(
    message: Option<V>,
    response: Option<V>,
    thinking: Option<V>,
    tool_calls: Option<V>,
    p: &mut Progress,
) -> Option<SemanticKind> {
    let [m_content, m_thinking, m_tools] =
        message.map_or([None, None, None], |m| m.fields(MESSAGE_KEYS));
    let mut first = None;
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
    first
}

/// The terminal a `done: true` line proves by its `done_reason`; a line
/// without one still ends the stream well, and the evidence says so.
#[inline]
fn done_terminal<'a, V: JsonView<'a>>(done_reason: Option<V>, ev: &mut Evidence) -> Terminal {
    let reason = done_reason.and_then(JsonView::text);
    if let Some(r) = &reason {
        ev.generation.note_finish(r);
    }
    match reason.as_deref() {
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
    }
}

impl Ollama {
    /// Learns the template of a plain delta line from `root`, which
    /// [`line`](Self::line) has just classified: no error, not done, no
    /// tool calls, and at most one string (content, response or thinking)
    /// that can make the line semantic. For such a line `line` only notes
    /// that string's kind when it is non-empty (unless the stream settled).
    fn learn(&mut self, root: Skim<'_>) {
        let [error, message, response, thinking, tool_calls, done] = root.fields([
            "error",
            "message",
            "response",
            "thinking",
            "tool_calls",
            "done",
        ]);
        if error.is_some_and(|e| !e.is_null()) || done.and_then(JsonView::as_bool) == Some(true) {
            return;
        }
        let [m_content, m_thinking, m_tools] =
            message.map_or([None, None, None], |m| m.fields(MESSAGE_KEYS));
        if [m_tools, tool_calls]
            .into_iter()
            .flatten()
            .any(|c| c.kind() == JsonKind::Array && c.is_nonempty())
        {
            return;
        }
        let candidates = [
            (m_content, SemanticKind::Content),
            (response, SemanticKind::Content),
            (m_thinking, SemanticKind::Reasoning),
            (thinking, SemanticKind::Reasoning),
        ];
        let semantic = candidates.map(|c| c.0.is_some_and(JsonView::is_nonempty_str));
        let is_str = |v: Option<Skim<'_>>| v.is_some_and(|v| v.kind() == JsonKind::String);
        let pick = match semantic.iter().filter(|&&s| s).count() {
            0 => candidates.iter().position(|c| is_str(c.0)),
            1 => semantic.iter().position(|&s| s),
            _ => None,
        };
        let Some((Some(probe), kind)) = pick.map(|i| candidates[i]) else {
            return;
        };
        let mut spares = Vec::new();
        root.members(|key, value| {
            if key.is_some_and(|k| !LINE_KEYS.iter().any(|c| c.as_bytes() == k)) {
                spares.push(value);
            }
        });
        if let Some(m) = message.filter(|m| m.kind() == JsonKind::Object) {
            m.members(|key, value| {
                if key.is_some_and(|k| !MESSAGE_KEYS.iter().any(|c| c.as_bytes() == k)) {
                    spares.push(value);
                }
            });
        }
        self.template.learn(probe, spares);
        self.probe_kind = Some(kind);
    }
}

impl Ollama {
    /// A plain delta line of the learned shape at the start of `buf` (a
    /// line with whatever follows it in the read): its length and the kind
    /// of semantic output it shows, if any (none once the stream
    /// `settled`). Changes no evidence; applying what it found is the
    /// caller's part, and equals what [`on_frame`](Protocol::on_frame) does
    /// for that line.
    pub(crate) fn delta_prefix(
        &mut self,
        buf: &[u8],
        settled: bool,
    ) -> Option<(usize, Option<SemanticKind>)> {
        let kind = self.probe_kind?;
        let (nonempty, len) = self.template.check_prefix(buf)?;
        Some((len, (nonempty && !settled).then_some(kind)))
    }
}

impl Protocol for Ollama {
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        let class = match decode {
            Decode::Fast => {
                if let Some(kind) = self.probe_kind
                    && let Some(nonempty) = self.template.check(frame.data)
                {
                    // What `line` does for this shape.
                    if ev.is_settled() {
                        return Ok(EventInfo::of(EventClass::NonSemantic));
                    }
                    let mut first = None;
                    if nonempty {
                        note(&mut ev.progress, &mut first, kind);
                    }
                    return Ok(EventInfo::of(semantic_or_n(first)));
                }
                let mut tape = std::mem::take(&mut self.tape);
                let class = match tape.parse(frame.data) {
                    Ok(Parsed::Tape(root)) => {
                        let class = Self::line(root, ev);
                        if class.is_ok() {
                            self.learn(root);
                        }
                        class
                    }
                    Ok(Parsed::Lazy(root)) => Self::line(root, ev),
                    Err(e) => Err(e),
                };
                self.tape = tape;
                class
            }
            #[cfg(feature = "serde_json")]
            Decode::Reference => Self::line(&crate::json::parse_reference(frame.data)?, ev),
        };
        Ok(EventInfo::of(class?))
    }
}
