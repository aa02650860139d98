//! Incremental framing of response bodies (SSE, NDJSON).
