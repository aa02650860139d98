//! The pieces of `recover`, kept apart from its `main` so each is tested
//! without spawning a process: the command line ([`args`]), the HTTPS
//! client and one exchange through the recovery stack ([`client`]),
//! readable output ([`show`]) and the live status line ([`status`]).
#![deny(unsafe_code, missing_docs, unreachable_pub)]

pub mod args;
pub mod client;
pub mod show;
pub mod status;
