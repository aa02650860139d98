//! Incremental framing of response bodies (SSE, NDJSON).
//!
//! The framers see every read of the body exactly as it arrived and never
//! change a byte: the driver forwards the same bytes it fed. They copy only a
//! line or event that straddles two reads, and every buffer is capped
//! ([`Limits`]) so a hostile stream ends in a typed [`ProtocolViolation`]
//! rather than unbounded growth.

mod limits;
mod ndjson;
mod sse;
mod sse_blocks;
mod violation;

pub use limits::Limits;
pub(crate) use ndjson::{NdjsonDecoder, NdjsonItem, NdjsonSink};
pub(crate) use sse::data_value_start;
pub(crate) use sse::{SseDecoder, SseItem, SseSink};
pub use sse_blocks::{EventTooLarge, SseBlock, SseBlocks, block_lines};
pub use violation::ProtocolViolation;
