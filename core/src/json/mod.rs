//! Reading the few fields a classifier needs from a JSON event without
//! building a tree.
//!
//! A [`Tape`] validates an event in one pass (UTF-8, grammar, escapes,
//! number syntax, nesting depth: the same documents `serde_json` accepts)
//! and records the span of every value, so a [`Skim`] answers field look-ups
//! by jumping between spans. Documents larger than
//! [`TAPE_MAX_DOC`](tape::TAPE_MAX_DOC) are validated with constant memory
//! and read [`Lazy`]ily instead. The
//! classifiers are written once against [`JsonView`] and run on [`Skim`]
//! (the hot path), [`Lazy`] or a full `serde_json::Value` (the reference the
//! differential tests compare against).
//!
//! One file per idea: [`view`] the read access, [`syntax`] the lexical
//! pieces (strings, escapes, numbers), [`lazy`] the constant-memory reader,
//! [`tape`] the scanner and [`Skim`], [`template`] learned event shapes,
//! [`edit`] writing and in-place edits, `reference` the `serde_json` path.

mod edit;
mod lazy;
#[cfg(feature = "serde_json")]
mod reference;
mod syntax;
mod tape;
mod template;
mod view;

pub(crate) use edit::{Edits, write_json_string};
pub(crate) use lazy::Lazy;
#[cfg(feature = "serde_json")]
pub(crate) use reference::parse_reference;
#[cfg(test)]
pub(crate) use syntax::unescape;
pub(crate) use tape::{Parsed, Skim, Tape};
pub(crate) use template::Template;
pub(crate) use view::{JsonKind, JsonView};
