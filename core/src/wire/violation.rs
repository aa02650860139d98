//! The typed protocol failure: what went wrong, never what the body said.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A stream broke the rules of its wire format or provider protocol.
///
/// It is not retried: a resend of the same request to the same server would
/// most likely break the same way. `Display` names the rule only; body text
/// never appears in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "violation")]
#[non_exhaustive]
pub enum ProtocolViolation {
    /// A line grew past [`Limits::max_line`](super::Limits::max_line).
    LineTooLong {
        /// The cap in force.
        cap: usize,
    },
    /// An event (or a non-streamed body) grew past
    /// [`Limits::max_event`](super::Limits::max_event).
    EventTooLarge {
        /// The cap in force.
        cap: usize,
    },
    /// An event's payload is not valid JSON.
    MalformedJson,
    /// An event's payload is not valid UTF-8.
    InvalidUtf8,
    /// A JSON event has a shape the protocol does not allow (for example an
    /// array where an object is required).
    UnexpectedShape,
    /// A second Anthropic `message_start` with a different id arrived while a
    /// message was open: two generations spliced into one stream.
    SplicedMessage,
    /// More parallel choices or content blocks than the decoder tracks.
    TooManyParallelItems,
}

impl ProtocolViolation {
    /// A short stable name (`line_too_long`, `malformed_json`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            ProtocolViolation::LineTooLong { .. } => "line_too_long",
            ProtocolViolation::EventTooLarge { .. } => "event_too_large",
            ProtocolViolation::MalformedJson => "malformed_json",
            ProtocolViolation::InvalidUtf8 => "invalid_utf8",
            ProtocolViolation::UnexpectedShape => "unexpected_shape",
            ProtocolViolation::SplicedMessage => "spliced_message",
            ProtocolViolation::TooManyParallelItems => "too_many_parallel_items",
        }
    }
}

impl fmt::Display for ProtocolViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolViolation::LineTooLong { cap } => {
                write!(f, "protocol violation: line longer than {cap} bytes")
            }
            ProtocolViolation::EventTooLarge { cap } => {
                write!(f, "protocol violation: event larger than {cap} bytes")
            }
            other => write!(f, "protocol violation: {}", other.name()),
        }
    }
}

impl std::error::Error for ProtocolViolation {}
