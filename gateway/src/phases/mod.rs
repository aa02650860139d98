//! The server side, phase by phase, in the order a request meets them
//! (`stack` builds them into one `ServiceBuilder`):
//!
//! 1. [`admit`]: methods never forwarded (`CONNECT`, `TRACE`), absolute
//!    targets naming another authority, paths that could leave a route's
//!    base;
//! 2. [`client_auth`]: with `[[clients]]`, a known client key (all but
//!    `GET /healthz`; a browser's CORS preflight is answered here);
//! 3. [`reserved`]: the gateway's own paths and reconnects, answered here;
//! 4. [`limit`]: a stream slot, held from the head to the end of the
//!    client's read, or a `503` at once (load shed, never a queue);
//! 5. [`read_body`]: the body, bounded in size and time, and JSON when it
//!    says it is;
//!
//! then the proxy (`proxy`). A phase refuses with a
//! [`Refusal`](crate::respond::Refusal); the rescue layer on top is the only
//! place it becomes a response.

pub(crate) mod admit;
pub(crate) mod client_auth;
pub(crate) mod limit;
pub(crate) mod read_body;
pub(crate) mod reserved;
