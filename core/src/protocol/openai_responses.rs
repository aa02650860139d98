//! OpenAI Responses streams: named events with sequence numbers.

use super::errors::classify_error_value;
use super::{Decode, EventClass, EventInfo, Evidence, Frame, Protocol, token, usage, with_json};
use crate::json::{JsonKind, JsonView, Tape};
use crate::progress::{Proof, SemanticKind, Terminal, UnsuccessfulReason};
use crate::wire::ProtocolViolation;

/// Responses: every event named, numbered, and typed in its JSON.
#[derive(Debug, Clone, Default)]
#[allow(clippy::case_sensitive_file_extension_comparisons)] // event names, not files
pub(crate) struct OpenAiResponses {
    opaque_reasoning: bool,
    tape: Tape,
}

/// Event types known to carry no semantic output (for BD3).
const NON_SEMANTIC: &[&str] = &[
    "keepalive",
    "response.created",
    "response.queued",
    "response.in_progress",
    "response.content_part.added",
    "response.reasoning_summary_part.added",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

/// Whether `needle` occurs in `event_type`: event types are short, and a
/// plain window scan keeps the two-way searcher out of the wasm module.
fn has(event_type: &str, needle: &str) -> bool {
    event_type
        .as_bytes()
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn kind_of(event_type: &str) -> SemanticKind {
    if has(event_type, "reasoning") {
        SemanticKind::Reasoning
    } else if has(event_type, "_call") || has(event_type, "tool") {
        SemanticKind::Tool
    } else {
        SemanticKind::Content
    }
}

fn side_effect(event_type: &str) -> bool {
    let Some(rest) = event_type.strip_prefix("response.") else {
        return false;
    };
    let Some((item, phase)) = rest.rsplit_once('.') else {
        return false;
    };
    item.ends_with("_call")
        && matches!(
            phase,
            "in_progress" | "searching" | "interpreting" | "generating"
        )
}

/// `incomplete_details.reason` of a response object.
fn incomplete_details<'a, V: JsonView<'a>>(
    response: Option<V>,
) -> Option<std::borrow::Cow<'a, str>> {
    response
        .and_then(|r| r.get("incomplete_details"))
        .and_then(|d| d.get("reason"))
        .and_then(JsonView::text)
}

fn incomplete_reason<'a, V: JsonView<'a>>(response: Option<V>) -> UnsuccessfulReason {
    match incomplete_details(response).as_deref() {
        Some("max_output_tokens") => UnsuccessfulReason::MaxTokens,
        Some("content_filter") => UnsuccessfulReason::ContentFilter,
        _ => UnsuccessfulReason::Incomplete,
    }
}

#[allow(clippy::case_sensitive_file_extension_comparisons)] // event names, not files
impl OpenAiResponses {
    /// A fresh stream; `opaque_reasoning` counts reasoning items without
    /// visible text as semantic.
    pub(crate) fn new(opaque_reasoning: bool) -> Self {
        OpenAiResponses {
            opaque_reasoning,
            ..Self::default()
        }
    }

    /// The class of an `output_item.added` / `.done` event from its item.
    fn item<'a, V: JsonView<'a>>(
        &self,
        item: Option<V>,
        done: bool,
        ev: &mut Evidence,
    ) -> EventClass {
        let Some(item) = item else {
            return EventClass::NonSemantic;
        };
        let [kind, content, summary, encrypted] =
            item.fields(["type", "content", "summary", "encrypted_content"]);
        let Some(kind) = kind.and_then(JsonView::text) else {
            return EventClass::NonSemantic;
        };
        let semantic = match kind.as_ref() {
            "message" => content
                .is_some_and(JsonView::is_nonempty)
                .then_some(SemanticKind::Content),
            "reasoning" => {
                let visible = summary.is_some_and(JsonView::is_nonempty)
                    || content.is_some_and(JsonView::is_nonempty);
                let opaque = done || encrypted.is_some_and(JsonView::is_nonempty_str);
                (visible || (opaque && self.opaque_reasoning)).then_some(SemanticKind::Reasoning)
            }
            k if k.ends_with("_call") || k == "mcp_approval_request" => {
                if done && matches!(k, "function_call" | "custom_tool_call") {
                    ev.progress.completed_tool_calls += 1;
                }
                Some(SemanticKind::Tool)
            }
            _ => None,
        };
        match semantic {
            Some(k) => {
                ev.progress.observe(k);
                EventClass::Semantic(k)
            }
            None => EventClass::NonSemantic,
        }
    }

    /// Records the response id and usage a response object carries.
    fn response_facts<'a, V: JsonView<'a>>(response: Option<V>, ev: &mut Evidence) {
        let Some(response) = response else { return };
        let [id, usage_v, model] = response.fields(["id", "usage", "model"]);
        if ev.generation.model.is_none()
            && let Some(m) = model.and_then(JsonView::text)
        {
            ev.generation.note_model(&m);
        }
        if ev.cursor.response_id.is_none()
            && let Some(id) = id.and_then(JsonView::text)
        {
            ev.cursor.response_id = Some(id.into_owned());
        }
        if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
            usage::responses(&mut ev.generation.usage, u);
        }
    }

    /// Classifies a response object that ended (`completed`, `incomplete`,
    /// `failed`, `cancelled`), as a terminal event or a non-streamed body.
    pub(crate) fn finished<'a, V: JsonView<'a>>(
        status: &str,
        response: Option<V>,
        ev: &mut Evidence,
        proof: Proof,
    ) -> Option<EventClass> {
        // Why the response ended, in its own words (its one finish
        // reason): the status, or for `incomplete` the reason it gives.
        match status {
            "completed" | "failed" | "cancelled" => ev.generation.note_finish(status),
            "incomplete" => ev
                .generation
                .note_finish(incomplete_details(response).as_deref().unwrap_or(status)),
            _ => {}
        }
        Some(match status {
            "completed" => ev.set_terminal(Terminal::Success { proof }),
            "incomplete" => ev.set_terminal(Terminal::Unsuccessful {
                reason: incomplete_reason(response),
            }),
            "failed" => {
                let err = response
                    .and_then(|r| r.get("error"))
                    .filter(|e| !e.is_null());
                match err {
                    Some(e) => ev.set_error(classify_error_value(e, None)),
                    None => ev.set_terminal(Terminal::Unsuccessful {
                        reason: UnsuccessfulReason::Failed(None),
                    }),
                }
            }
            "cancelled" => ev.set_terminal(Terminal::Unsuccessful {
                reason: UnsuccessfulReason::Other(token("cancelled")),
            }),
            _ => return None,
        })
    }

    fn event<'a, V: JsonView<'a>>(
        &mut self,
        frame: Frame<'_>,
        root: V,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        if root.kind() != JsonKind::Object {
            return Err(ProtocolViolation::UnexpectedShape);
        }
        let [
            kind,
            seq,
            response,
            item,
            code,
            error,
            text,
            arguments,
            refusal,
            part,
            input,
            code_text,
            transcript,
        ] = root.fields(EVENT_KEYS);
        let sequence_number = seq.and_then(JsonView::as_u64);
        if !next_in_sequence(sequence_number, ev) {
            return Ok(EventInfo {
                class: EventClass::NonSemantic,
                sequence_number,
                duplicate: true,
            });
        }
        let info = |class| EventInfo {
            class,
            sequence_number,
            duplicate: false,
        };
        if ev.is_settled() {
            return Ok(info(EventClass::NonSemantic));
        }
        let name = match kind.and_then(JsonView::text) {
            Some(t) => t,
            None => String::from_utf8_lossy(frame.event_type),
        };
        let t = name.as_ref();
        let class = match t {
            "keepalive" => EventClass::Keepalive,
            "response.created" | "response.queued" | "response.in_progress" => {
                Self::response_facts(response, ev);
                EventClass::NonSemantic
            }
            "response.completed" | "response.incomplete" | "response.failed" | "response.done" => {
                Self::ended(t, response, ev)
            }
            "error" => error_event(root, code, error, ev),
            "response.output_item.added" => self.item(item, false, ev),
            "response.output_item.done" => self.item(item, true, ev),
            "response.output_text.annotation.added" => observed(ev, SemanticKind::Content),
            t if side_effect(t) => observed(ev, SemanticKind::SideEffect),
            t if t.ends_with(".delta")
                || has(t, "partial")
                || t.starts_with("response.shell_call_command.") =>
            {
                observed(ev, kind_of(t))
            }
            t if t.ends_with(".done")
                && carries_output(
                    [text, arguments, refusal, input, code_text, transcript],
                    part,
                ) =>
            {
                observed(ev, kind_of(t))
            }
            _ => EventClass::NonSemantic,
        };
        Ok(info(class))
    }

    /// A response that ended (`response.completed`, `.incomplete`,
    /// `.failed`, or `.done` with its status inside): its facts, then the
    /// terminal its status proves.
    #[inline]
    fn ended<'a, V: JsonView<'a>>(
        event_type: &str,
        response: Option<V>,
        ev: &mut Evidence,
    ) -> EventClass {
        Self::response_facts(response, ev);
        let status = match event_type {
            "response.completed" => Some("completed".into()),
            "response.incomplete" => Some("incomplete".into()),
            "response.failed" => Some("failed".into()),
            _ => response
                .and_then(|r| r.get("status"))
                .and_then(JsonView::text),
        };
        status
            .and_then(|s| Self::finished(&s, response, ev, Proof::Strong))
            .unwrap_or(EventClass::NonSemantic)
    }
}

/// Top-level keys [`OpenAiResponses::event`] reads; `code` twice: the
/// error code of an `error` event, and the code text of a code
/// interpreter's `.done`.
const EVENT_KEYS: [&str; 13] = [
    "type",
    "sequence_number",
    "response",
    "item",
    "code",
    "error",
    "text",
    "arguments",
    "refusal",
    "part",
    "input",
    "code",
    "transcript",
];

/// Takes the event's sequence number into the cursor; `false` for a
/// duplicate (a number not past the last one), which is counted and
/// changes nothing else. A number past the next one counts a gap.
#[inline]
fn next_in_sequence(sequence_number: Option<u64>, ev: &mut Evidence) -> bool {
    let Some(n) = sequence_number else {
        return true;
    };
    match ev.cursor.sequence_number {
        Some(last) if n <= last => {
            ev.duplicate_events += 1;
            return false;
        }
        Some(last) if n > last + 1 => ev.sequence_gaps += 1,
        _ => {}
    }
    ev.cursor.sequence_number = Some(n);
    true
}

/// The provider error an `error` event reports: flat, with `code` at the
/// top, or nested inside `error`.
#[inline]
fn error_event<'a, V: JsonView<'a>>(
    root: V,
    code: Option<V>,
    error: Option<V>,
    ev: &mut Evidence,
) -> EventClass {
    let source = if code.is_some_and(JsonView::is_nonempty_str) {
        Some(root)
    } else {
        error.filter(|e| e.kind() == JsonKind::Object)
    };
    ev.set_error(classify_error_value(source.unwrap_or(root), None))
}

/// Whether a `.done` event carries output: one of its strings, or its
/// content part's text, refusal or transcript, is non-empty.
#[inline]
fn carries_output<'a, V: JsonView<'a>>(strings: [Option<V>; 6], part: Option<V>) -> bool {
    strings.into_iter().flatten().any(JsonView::is_nonempty_str)
        || part.is_some_and(|p| {
            p.fields(["text", "refusal", "transcript"])
                .into_iter()
                .flatten()
                .any(JsonView::is_nonempty_str)
        })
}

/// Counts `kind` as observed output and classes the event by it.
#[inline]
fn observed(ev: &mut Evidence, kind: SemanticKind) -> EventClass {
    ev.progress.observe(kind);
    EventClass::Semantic(kind)
}

impl Protocol for OpenAiResponses {
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        if frame.data.starts_with(b"[DONE]") {
            // Some gateways append it; the spec defines no sentinel.
            return Ok(EventInfo::of(EventClass::NonSemantic));
        }
        let mut tape = std::mem::take(&mut self.tape);
        let info = with_json!(tape, frame.data, decode, |root| self.event(frame, root, ev));
        self.tape = tape;
        info
    }

    fn non_semantic_event_type(&self, event_type: &[u8]) -> bool {
        NON_SEMANTIC.iter().any(|n| n.as_bytes() == event_type)
    }
}
