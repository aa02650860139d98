//! rig-core sending through reqwest-recovery's tower stack in-process: the
//! tests are in `tests/rig.rs`. This crate is its own workspace (see its
//! Cargo.toml) and publishes nothing.
