//! Non-streamed (`stream: false`) bodies are evidence too: a complete JSON
//! answer with a finish reason is terminal proof, and content inside a
//! truncated one was observed all the same.

#[cfg(feature = "anthropic")]
use super::anthropic::{block_kind, stop_terminal};
use super::errors::classify_error_value;
use super::kind::ProtocolKind;
use super::{Evidence, SemanticOptions};
use crate::json::{JsonKind, JsonView, Lazy};
use crate::progress::{Proof, SemanticKind, Terminal, UnsuccessfulReason};
use crate::wire::ProtocolViolation;

/// Reads a complete non-streamed JSON body of protocol `kind` into `ev`.
///
/// An error body sets the provider error; an answer sets progress, usage and
/// terminal proof (strong: the document is complete). A body that does not
/// parse is a protocol violation; the caller decides whether it was
/// truncated (see [`partial_body_may_be_semantic`]).
pub(crate) fn classify_json_body(
    kind: &ProtocolKind,
    body: &[u8],
    options: SemanticOptions,
    ev: &mut Evidence,
) -> Result<(), ProtocolViolation> {
    let root = Lazy::parse(body)?;
    if root.kind() != JsonKind::Object {
        return Err(ProtocolViolation::UnexpectedShape);
    }
    let [error, object] = root.fields(["error", "object"]);
    if let Some(err) = error.filter(|e| !e.is_null()) {
        ev.set_error(classify_error_value(err, None));
        return Ok(());
    }
    if object.is_some_and(|o| o.str_eq("error")) {
        ev.set_error(classify_error_value(root, None));
        return Ok(());
    }
    match kind {
        #[cfg(feature = "openai-chat")]
        ProtocolKind::OpenAiChat => {
            let mut chat = super::OpenAiChat::new();
            chat.chunk(root, ev)?;
            let outcome = chat.body_outcome();
            ev.set_terminal(outcome);
        }
        #[cfg(feature = "gemini")]
        ProtocolKind::Gemini => {
            let mut gemini = super::Gemini::new();
            gemini.chunk(root, ev)?;
            if let Some(outcome) = gemini.body_outcome() {
                ev.set_terminal(outcome);
            }
        }
        #[cfg(feature = "ollama")]
        ProtocolKind::Ollama => {
            super::Ollama::line(root, ev)?;
        }
        #[cfg(feature = "openai-responses")]
        ProtocolKind::OpenAiResponses => responses_body(root, options, ev),
        #[cfg(feature = "anthropic")]
        ProtocolKind::Anthropic => anthropic_body(root, options, ev),
        // Generic SSE, or a protocol this build leaves out: no proof.
        _ => {}
    }
    Ok(())
}

#[cfg(feature = "openai-responses")]
fn responses_body<'a, V: JsonView<'a>>(root: V, options: SemanticOptions, ev: &mut Evidence) {
    let [id, status, output, usage_v] = root.fields(["id", "status", "output", "usage"]);
    if let Some(id) = id.and_then(JsonView::text) {
        ev.cursor.response_id = Some(id.into_owned());
    }
    if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
        super::usage::responses(&mut ev.generation.usage, u);
    }
    if let Some(output) = output {
        output.for_each(|item| {
            let [kind, content, summary] = item.fields(["type", "content", "summary"]);
            let Some(kind) = kind.and_then(JsonView::text) else {
                return;
            };
            let k = match kind.as_ref() {
                "message" => content
                    .is_some_and(JsonView::is_nonempty)
                    .then_some(SemanticKind::Content),
                "reasoning" => (options.opaque_reasoning_is_semantic
                    || summary.is_some_and(JsonView::is_nonempty)
                    || content.is_some_and(JsonView::is_nonempty))
                .then_some(SemanticKind::Reasoning),
                k if k.ends_with("_call") => {
                    if matches!(k, "function_call" | "custom_tool_call") {
                        ev.progress.completed_tool_calls += 1;
                    }
                    Some(SemanticKind::Tool)
                }
                _ => None,
            };
            if let Some(k) = k {
                ev.progress.observe(k);
            }
        });
    }
    let status = status.and_then(JsonView::text);
    if let Some(s) = status.as_deref() {
        super::OpenAiResponses::finished(s, Some(root), ev, Proof::Strong);
    }
}

#[cfg(feature = "anthropic")]
fn anthropic_body<'a, V: JsonView<'a>>(root: V, options: SemanticOptions, ev: &mut Evidence) {
    let [content, stop_reason, usage_v] = root.fields(["content", "stop_reason", "usage"]);
    if let Some(u) = usage_v.filter(|u| u.kind() == JsonKind::Object) {
        super::usage::anthropic(&mut ev.generation.usage, u);
    }
    if let Some(content) = content {
        content.for_each(|block| {
            let is_tool = block.get("type").is_some_and(|t| t.str_eq("tool_use"));
            if is_tool {
                ev.progress.completed_tool_calls += 1;
            }
            if let Some(k) = block_kind(block, options.opaque_reasoning_is_semantic) {
                ev.progress.observe(k);
            }
        });
    }
    let reason = stop_reason.and_then(JsonView::text);
    let terminal = match reason.as_deref() {
        None => Terminal::Unsuccessful {
            reason: UnsuccessfulReason::MissingFinishReason,
        },
        r => stop_terminal(r),
    };
    ev.set_terminal(terminal);
}

/// Keys whose value, once begun, is semantic output: a string with a first
/// character, or an array or object opened (conservative: an opened
/// container may hold a tool call).
const SEMANTIC_KEYS: &[&[u8]] = &[
    b"content",
    b"text",
    b"response",
    b"thinking",
    b"reasoning",
    b"reasoning_content",
    b"refusal",
    b"tool_calls",
    b"function_call",
    b"functionCall",
    b"arguments",
    b"output_text",
    b"summary",
    b"partial_json",
    b"name",
];

/// Keys that are semantic only as strings: a Responses `delta` is output
/// text, a Chat `delta` is the object the fields above live in.
const SEMANTIC_STRING_KEYS: &[&[u8]] = &[b"delta"];

/// Whether the JSON text of a frame cut short may already hold semantic
/// output: some key of `SEMANTIC_KEYS` whose value had begun (a string past
/// its opening quote that is not `""`, an array or object opened and not
/// closed empty), or a `delta` string begun.
///
/// Conservative by design: a value cut right after its opening quote or
/// bracket counts, since the next byte may have been output. A cut inside a
/// key, before any value, or inside values of other keys does not.
pub(crate) fn partial_body_may_be_semantic(body: &[u8]) -> bool {
    let mut i = 0;
    while i < body.len() {
        if body[i] != b'"' {
            i += 1;
            continue;
        }
        // A string: find its end.
        let start = i + 1;
        let mut j = start;
        while j < body.len() && body[j] != b'"' {
            j += if body[j] == b'\\' { 2 } else { 1 };
        }
        if j >= body.len() {
            return false;
        }
        let name = &body[start..j];
        let mut k = j + 1;
        while k < body.len() && body[k].is_ascii_whitespace() {
            k += 1;
        }
        let any = SEMANTIC_KEYS.contains(&name);
        let string_only = SEMANTIC_STRING_KEYS.contains(&name);
        if k < body.len() && body[k] == b':' && (any || string_only) {
            k += 1;
            while k < body.len() && body[k].is_ascii_whitespace() {
                k += 1;
            }
            match body.get(k) {
                Some(b'"') if !matches!(body.get(k + 1), Some(b'"')) => return true,
                Some(b'[' | b'{') if any => {
                    let mut m = k + 1;
                    while m < body.len() && body[m].is_ascii_whitespace() {
                        m += 1;
                    }
                    if !matches!(body.get(m), Some(b']' | b'}')) {
                        return true;
                    }
                }
                _ => {}
            }
        }
        i = j + 1;
    }
    false
}
