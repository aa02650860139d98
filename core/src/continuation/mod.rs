//! Continuing a committed answer at the prompt level, where no provider
//! resume exists.
//!
//! Once output reached the consumer a replay would duplicate it; a
//! continuation instead sends the request again with what was delivered as
//! the assistant's own words, and splices the new generation after it.
//! Two ways lead there: the caller's hook, given the [`DeliveredPrefix`],
//! writes the continuation request itself; or a target declares a
//! [`Prefill`] form and the machine writes it ([`prefill_body`]). Either
//! way the continuation's stream is joined to the delivered one by the
//! same splice.

mod delivered;
mod prefill;
pub(crate) mod splice;

pub use delivered::{DeliveredPrefix, MAX_PREFIX};
pub use prefill::{Prefill, Prefilled, UnknownPrefill, prefill_body};
