//! Generic SSE: no provider knowledge, so every event with data is treated
//! as semantic, and only a configured sentinel proves success.

use super::kind::SseTerminal;
use super::{Decode, EventClass, EventInfo, Evidence, Frame, Protocol};
use crate::progress::{Proof, SemanticKind, Terminal};
use crate::wire::ProtocolViolation;

/// Any SSE stream, with an optional success sentinel.
#[derive(Debug, Clone, Default)]
pub(crate) struct GenericSse {
    sentinel: Option<SseTerminal>,
}

impl GenericSse {
    /// A fresh stream ended successfully only by `sentinel`.
    pub(crate) fn new(sentinel: Option<SseTerminal>) -> Self {
        GenericSse { sentinel }
    }
}

impl Protocol for GenericSse {
    fn on_frame(
        &mut self,
        frame: Frame<'_>,
        _decode: Decode,
        ev: &mut Evidence,
    ) -> Result<EventInfo, ProtocolViolation> {
        let is_sentinel = match &self.sentinel {
            Some(SseTerminal::Data(d)) => frame.data == d.as_bytes(),
            Some(SseTerminal::Event(e)) => frame.event_type == e.as_bytes(),
            None => false,
        };
        if is_sentinel {
            return Ok(EventInfo::of(ev.set_terminal(Terminal::Success {
                proof: Proof::Strong,
            })));
        }
        if ev.is_settled() || frame.data.is_empty() {
            return Ok(EventInfo::of(EventClass::NonSemantic));
        }
        ev.progress.observe(SemanticKind::Content);
        Ok(EventInfo::of(EventClass::Semantic(SemanticKind::Content)))
    }
}
