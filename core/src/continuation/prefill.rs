//! A declared continuation: the target continues an assistant message it is
//! given.
//!
//! When a committed answer is cut (a reset, an end without proof, a stall)
//! and what the consumer has is text only, the request can be sent again
//! with that text as the final assistant message, and the model writes the
//! rest of it. Anthropic Messages does so natively; OpenAI-compatible
//! servers do it when told: DeepSeek and Mistral take `"prefix": true` on
//! the message, vLLM takes `"continue_final_message": true` with
//! `"add_generation_prompt": false` on the request. Which form a target
//! takes is declared ([`Prefill`]); the request's body is rewritten here,
//! once, for every driver.

use std::fmt;
use std::str::FromStr;

use crate::json::{Edits, JsonKind, JsonView, Lazy, write_json_string};
use crate::protocol::ProtocolKind;

/// How a target takes the delivered text back as an assistant prefill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Prefill {
    /// The protocol's own form: [`Prefill::Assistant`] for Anthropic
    /// Messages, [`Prefill::Prefix`] for OpenAI Chat.
    #[default]
    Auto,
    /// A final assistant message as it is (Anthropic Messages, and servers
    /// that continue a trailing assistant message, such as llama.cpp).
    Assistant,
    /// A final assistant message marked `"prefix": true` (DeepSeek,
    /// Mistral).
    Prefix,
    /// A final assistant message, with `"continue_final_message": true` and
    /// `"add_generation_prompt": false` on the request (vLLM).
    ContinueFinalMessage,
}

impl Prefill {
    /// Every form, by name.
    pub const ALL: [Prefill; 4] = [
        Prefill::Auto,
        Prefill::Assistant,
        Prefill::Prefix,
        Prefill::ContinueFinalMessage,
    ];

    /// The form's name in configuration (`auto`, `assistant`, `prefix`,
    /// `continue_final_message`).
    pub fn name(self) -> &'static str {
        match self {
            Prefill::Auto => "auto",
            Prefill::Assistant => "assistant",
            Prefill::Prefix => "prefix",
            Prefill::ContinueFinalMessage => "continue_final_message",
        }
    }

    /// The form a target speaking `protocol` takes; `None` when the
    /// protocol has no prefill (Responses, Gemini, Ollama's native API, a
    /// generic stream): such a target is never continued.
    pub fn resolve(self, protocol: &ProtocolKind) -> Option<Prefill> {
        match protocol {
            ProtocolKind::Anthropic => Some(match self {
                Prefill::Auto => Prefill::Assistant,
                other => other,
            }),
            ProtocolKind::OpenAiChat => Some(match self {
                Prefill::Auto => Prefill::Prefix,
                other => other,
            }),
            _ => None,
        }
    }
}

impl fmt::Display for Prefill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`Prefill`] form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPrefill;

impl fmt::Display for UnknownPrefill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a prefill template is one of auto, assistant, prefix, continue_final_message")
    }
}

impl std::error::Error for UnknownPrefill {}

impl FromStr for Prefill {
    type Err = UnknownPrefill;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Prefill::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or(UnknownPrefill)
    }
}

/// A continuation request's body, and what its answer must be spliced with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefilled {
    /// The body to send.
    pub body: Vec<u8>,
    /// Whitespace cut from the end of the prefill (Anthropic refuses a
    /// final assistant message that ends with whitespace): the
    /// continuation's first text repeats it, and the splice drops it there.
    pub trimmed: String,
}

/// `body` (a JSON request with a `messages` array) rewritten so that its
/// final assistant message is `text`, in the form `prefill` takes for
/// `protocol`: a final assistant message of the request (the caller's own
/// prefill) is extended, otherwise one is appended. `None` when the body
/// has no `messages` array or the protocol has no prefill.
pub fn prefill_body(
    body: &[u8],
    protocol: &ProtocolKind,
    prefill: Prefill,
    text: &str,
) -> Option<Prefilled> {
    let form = prefill.resolve(protocol)?;
    let root = Lazy::parse(body).ok()?;
    let messages = root.get("messages")?;
    if root.kind() != JsonKind::Object || messages.kind() != JsonKind::Array {
        return None;
    }
    let mut last = None;
    let mut count = 0usize;
    messages.for_each(|m| {
        last = Some(m);
        count += 1;
    });
    let mut edits = Edits::new(body);
    let own = last.filter(|m| m.get("role").is_some_and(|r| r.str_eq("assistant")));
    // What the final assistant message already says (the caller's own
    // prefill) is part of what the model continues.
    let (before, slot) = match own.and_then(final_text) {
        Some((before, slot)) => (before, Some(slot)),
        None => (String::new(), None),
    };
    let mut whole = before;
    whole.push_str(text);
    let trimmed = if matches!(protocol, ProtocolKind::Anthropic) {
        let kept = whole.trim_end().len();
        whole.split_off(kept)
    } else {
        String::new()
    };
    let mut literal = Vec::with_capacity(whole.len() + 2);
    write_json_string(&mut literal, &whole);
    if let (Some(message), Some(slot)) = (own, slot) {
        edits.replace(slot.as_bytes(), literal);
        if form == Prefill::Prefix {
            edits.set(message, "prefix", b"true");
        }
    } else {
        {
            let mut message = b"{\"role\":\"assistant\",\"content\":".to_vec();
            message.extend_from_slice(&literal);
            if form == Prefill::Prefix {
                message.extend_from_slice(b",\"prefix\":true");
            }
            message.push(b'}');
            if count > 0 {
                message.insert(0, b',');
            }
            let close = edits.offset(messages.as_bytes()) + messages.as_bytes().len() - 1;
            edits.insert(close, message);
        }
    }
    if form == Prefill::ContinueFinalMessage {
        edits.set(root, "continue_final_message", b"true");
        edits.set(root, "add_generation_prompt", b"false");
    }
    Some(Prefilled {
        body: edits.apply(),
        trimmed,
    })
}

/// The text of a final assistant message and the value holding it: its
/// string content, or the text of its last content block.
fn final_text(message: Lazy<'_>) -> Option<(String, Lazy<'_>)> {
    let content = message.get("content")?;
    match content.kind() {
        JsonKind::String => Some((content.text()?.into_owned(), content)),
        JsonKind::Array => {
            let mut last = None;
            content.for_each(|b| last = Some(b));
            let block = last?;
            if !block.get("type").is_some_and(|t| t.str_eq("text")) {
                return None;
            }
            let text = block.get("text")?;
            Some((text.text()?.into_owned(), text))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(b: &str, protocol: &ProtocolKind, prefill: Prefill, text: &str) -> (String, String) {
        let p = prefill_body(b.as_bytes(), protocol, prefill, text).expect("prefilled");
        (String::from_utf8(p.body).unwrap(), p.trimmed)
    }

    #[test]
    fn openai_chat_appends_a_prefix_message_by_default() {
        let (b, trimmed) = body(
            r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Count"}]}"#,
            &ProtocolKind::OpenAiChat,
            Prefill::Auto,
            "one two \"three\"\n",
        );
        assert_eq!(
            b,
            r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Count"},{"role":"assistant","content":"one two \"three\"\n","prefix":true}]}"#
        );
        assert_eq!(trimmed, "", "only Anthropic refuses trailing whitespace");
    }

    #[test]
    fn vllm_form_sets_the_request_flags() {
        let (b, _) = body(
            r#"{"add_generation_prompt":true,"messages":[ ]}"#,
            &ProtocolKind::OpenAiChat,
            Prefill::ContinueFinalMessage,
            "Hi",
        );
        assert_eq!(
            b,
            r#"{"continue_final_message":true,"add_generation_prompt":false,"messages":[ {"role":"assistant","content":"Hi"}]}"#
        );
    }

    #[test]
    fn anthropic_extends_the_callers_own_prefill_and_trims_the_end() {
        let (b, trimmed) = body(
            r#"{"messages":[{"role":"user","content":"Tell"},{"role":"assistant","content":"Once"}],"max_tokens":9}"#,
            &ProtocolKind::Anthropic,
            Prefill::Auto,
            " upon a \n",
        );
        assert_eq!(
            b,
            r#"{"messages":[{"role":"user","content":"Tell"},{"role":"assistant","content":"Once upon a"}],"max_tokens":9}"#
        );
        assert_eq!(trimmed, " \n");
    }

    #[test]
    fn a_final_text_block_is_extended() {
        let (b, _) = body(
            r#"{"messages":[{"role":"assistant","content":[{"type":"text","text":"A"}]}]}"#,
            &ProtocolKind::OpenAiChat,
            Prefill::Prefix,
            "B",
        );
        assert_eq!(
            b,
            r#"{"messages":[{"prefix":true,"role":"assistant","content":[{"type":"text","text":"AB"}]}]}"#
        );
    }

    #[test]
    fn protocols_without_a_prefill_and_bodies_without_messages_are_refused() {
        for p in [
            ProtocolKind::OpenAiResponses,
            ProtocolKind::Gemini,
            ProtocolKind::Ollama,
        ] {
            assert_eq!(Prefill::Auto.resolve(&p), None);
            assert!(prefill_body(br#"{"messages":[]}"#, &p, Prefill::Auto, "x").is_none());
        }
        let chat = ProtocolKind::OpenAiChat;
        assert!(prefill_body(br#"{"input":"x"}"#, &chat, Prefill::Auto, "x").is_none());
        assert!(prefill_body(br#"{"messages":{}}"#, &chat, Prefill::Auto, "x").is_none());
        assert!(prefill_body(b"not json", &chat, Prefill::Auto, "x").is_none());
    }

    #[test]
    fn names_round_trip() {
        for p in Prefill::ALL {
            assert_eq!(p.name().parse::<Prefill>(), Ok(p));
        }
        assert_eq!("prefill".parse::<Prefill>(), Err(UnknownPrefill));
    }
}
