//! Size caps on what a framer may buffer.

use serde::{Deserialize, Serialize};

/// Default cap on one line and on one event: 32 MiB. One event may carry a
/// whole image as base64 (a Responses `partial_image` of 1.3 to 4 MB, a
/// Gemini 4K image of up to 10 MB), so a cap of a few MiB would fail real
/// answers; the cap is met only by an event that large, never reserved.
pub(super) const DEFAULT_CAP: usize = 32 << 20;

/// Caps on buffered bytes per stream.
///
/// Real events are large (Responses events embed the whole response object,
/// image partials carry base64), but no legitimate event is unbounded, so past
/// a cap the stream is treated as hostile or broken and fails typed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Limits {
    /// Longest line (without its terminator), in bytes.
    pub max_line: usize,
    /// Largest event (data plus event type, or one NDJSON line, or a whole
    /// non-streamed JSON body), in bytes.
    pub max_event: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_line: DEFAULT_CAP,
            max_event: DEFAULT_CAP,
        }
    }
}

impl Limits {
    /// Both caps set to `cap` bytes.
    pub const fn uniform(cap: usize) -> Self {
        Limits {
            max_line: cap,
            max_event: cap,
        }
    }
}
