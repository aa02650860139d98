#!/usr/bin/env bash
# Load figures for recovery-gateway (BENCHMARKS.md): added latency per
# stream against the provider directly, throughput, slow streams held at
# once and the gateway's memory per stream. Release build; loopback only.
# Phases 1 and 2 also run through a bare hyper proxy (the floor).
# Extra arguments go to the example: --streams N --concurrency N --held N.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p recovery-gateway --bin recovery-gateway --example load --example bare_proxy
exec "${CARGO_TARGET_DIR:-target}/release/examples/load" "$@"
