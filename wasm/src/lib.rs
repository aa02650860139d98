//! The wasm driver over `fetch` (in progress).
#![deny(unsafe_code, missing_docs)]
