#!/usr/bin/env bash
# Every test of the project, in the order a failure is cheapest to read.
set -euo pipefail
cd "$(dirname "$0")/.."
# One build from scratch: incremental caches would only take disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step() { printf '\n== %s\n' "$*"; }

step "toolchain"
rustup component add rustfmt clippy >/dev/null 2>&1 || true
if ! rustup target list --installed | grep -qx wasm32-unknown-unknown; then
  rustup target add wasm32-unknown-unknown
fi

step "redis-server (the recovery-redis tests start their own, on a unix socket)"
command -v redis-server >/dev/null || {
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
  fi
}

step "format"
cargo fmt --all --check

step "lints"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy -p tower-recovery --all-targets --all-features -- -D warnings
cargo clippy -p recovery-tests --all-targets --features tracing -- -D warnings
cargo clippy -p recovery-wasm --target wasm32-unknown-unknown -- -D warnings

step "drivers only do I/O"
bash scripts/check-drivers.sh

step "no import circle"
python3 scripts/check-circles.py

step "core stays runtime-free (wasm32)"
cargo check -p recovery-core --target wasm32-unknown-unknown
if cargo tree -p recovery-core -e normal --prefix none | grep -Eq '^(tokio|web-sys|hyper) '; then
  echo "recovery-core depends on a runtime crate:" >&2
  cargo tree -p recovery-core -e normal >&2
  exit 1
fi

step "native tests"
cargo test --workspace
cargo test -p recovery-tests --features tracing --test tracing_spans

step "rig-core in-process (its own workspace: its serde_json features would change the workspace's)"
cargo test --manifest-path reqwest-recovery/rig-tests/Cargo.toml

step "gateway under the official SDKs (Python: openai, anthropic, google-genai, ollama, mistralai, groq; JS: openai, @anthropic-ai/sdk, @google/genai; pinned; fault provider upstream)"
bash scripts/setup-python.sh && bash scripts/test-gateway-sdks.sh

step "without a runtime feature, a layer needs an explicit timing"
# RecoveryLayer::new does not exist without `tokio` (a doctest that must
# fail to compile with E0599); the crate itself builds.
cargo check -p tower-recovery --no-default-features
cargo test -p tower-recovery --no-default-features --doc recovery::layer::RecoveryLayer

step "crates as published: cargo package, then cargo test inside each unpacked .crate"
bash scripts/package-check.sh

step "recover as installed: cargo install --path cli, --version, a recovered stream"
bash scripts/cli-install-check.sh

step "docs"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace

step "Python package recovery-llm (the wheel from maturin, every conformance vector, openai/anthropic/httpx in-process)"
bash scripts/test-python.sh

step "wasm package (Node, Chromium page + worker, workerd, real SDKs, types)"
bash scripts/setup-wasm.sh
bash scripts/test-wasm.sh
