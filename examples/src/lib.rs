//! Runnable examples of the project.
#![deny(unsafe_code, missing_docs)]
