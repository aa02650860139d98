//! A loopback fault provider: a scripted HTTP/1.1 server on `127.0.0.1:0`
//! that fails in exactly the ways LLM streams fail in the field.
//!
//! Each request gets the next [`Script`] of its sequence (see [`ScriptSet`]):
//! a status, verbatim headers, body writes (inline text, bytes or fixture
//! slices, split, repeated, delayed or gated), a [`Transfer`] framing and an
//! [`Ending`]: clean, FIN, RST, stall until released, a short
//! `content-length`, or a fault before the head. The provider counts what it
//! receives (in total and per path), keeps every request byte for byte, tracks
//! open connections, and exposes stall gates that tests release explicitly, so
//! tests synchronise on server-side facts and never on wall-clock sleeps.
//!
//! # Why raw HTTP/1.1 instead of a hyper server
//!
//! The faults under test live *below* HTTP semantics: a chunked body that
//! ends with FIN before the last chunk, a `content-length` that promises more
//! than is sent, a close-delimited body, an RST after a given byte, FIN before
//! any head, a chunk boundary at a chosen offset. A hyper server exists to
//! make these impossible: it frames bodies itself, completes or aborts
//! messages on its own terms, coalesces writes, and gives no hook for
//! `SO_LINGER` 0 at a chosen moment. Writing the response bytes directly on a
//! `tokio::net::TcpStream` (requests parsed with `httparse`) gives byte-exact
//! control of framing and of how and when the connection ends, which is what
//! the framing tests measure clients against (a short chunked or
//! `content-length` body is a body error, a close-delimited one cut by FIN a
//! clean end). Keep-alive is kept for
//! the happy paths so pooled-connection behaviour is exercised too.
//!
//! # Script JSON
//!
//! A script set is `{"scripts": [...], "paths": {"/path": [...]}, "default": {...}}`
//! or a bare array of scripts. Every field of a script is optional:
//!
//! ```json
//! {
//!   "name": "Retry once, then a stream cut by RST after the first event",
//!   "status": 200,
//!   "headers": {"content-type": "text/event-stream", "retry-after": "2"},
//!   "transfer": "chunked",
//!   "body": [
//!     ": keepalive\n\n",
//!     {"fixture": "openai-chat/happy-usage.sse", "start": 0, "end": 200,
//!      "split_at": [17], "split_lines": false, "repeat": 1,
//!      "delay_ms": 0, "stall": false, "raw": false}
//!   ],
//!   "cut_at": 150,
//!   "content_length": null,
//!   "keep_alive": true,
//!   "ending": "rst"
//! }
//! ```
//!
//! `transfer`: `chunked` (default; one chunk per write) | `content_length` |
//! `close_delimited`. `ending`: `clean` (default) | `fin` | `rst` | `stall` |
//! `short_content_length` | `reset_before_head` | `fin_before_head` |
//! `never_answer`. `headers` may also be a list of `[name, value]` pairs.
//! A body write is a string (inline text) or an object with one of `text`,
//! `bytes` (array of numbers) or `fixture` (path under `tests/fixtures/`).
//!
//! # Stalls
//!
//! Stall points (`stall` writes, the `stall` ending, `never_answer`) wait for
//! a permit: [`FaultProvider::release`] adds permits, and
//! [`FaultProvider::release_all`] opens every gate until the next reset. A
//! stall also ends when the client disconnects. Wait for the server to reach a
//! stall with [`FaultProvider::wait_for_stalls`] before asserting on the
//! client side.
//!
//! # Example
//!
//! ```no_run
//! use recovery_tests::fault::{Ending, FaultProvider, Script, Write};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let provider = FaultProvider::start(vec![
//!     Script::status(503).header("retry-after", "1"),
//!     Script::sse("data: {}\n\n").write(Write::text("data: [DONE]\n\n")),
//! ])
//! .await?;
//! let url = provider.url("/v1/chat/completions");
//! // ... drive a client at `url`, then:
//! assert_eq!(provider.count(), 2);
//! provider.wait_idle().await;
//! # let _ = (url, Ending::Clean);
//! # Ok(())
//! # }
//! ```

mod script;
mod server;
mod wire;

pub use script::{
    Compiled, CompiledSet, Ending, Headers, Piece, Script, ScriptError, ScriptSet, Transfer, Write,
    WriteSpec,
};
pub use server::{
    CONTROL_PREFIX, FaultProvider, Options, ReceivedRequest, Stats, UnansweredListener,
    default_fixtures_dir, refused_addr,
};
