//! The tower driver: `ObserveLayer` and `RecoveryLayer` (in progress).
#![deny(unsafe_code, missing_docs)]
