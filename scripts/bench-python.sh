#!/usr/bin/env bash
# Overhead of recovery-llm's transports (python/bench/bench.py): the
# per-chunk cost added to the plain httpx2 transport (10,000 one-event
# chunks from an in-memory inner transport, sync and async), the wall ratio
# over loopback HTTP against the fault provider, the memory of an
# in-flight stream, and the cost added per short request. Uses the venv and wheel of scripts/test-python.sh.
# Figures go to BENCHMARKS.md ("Python"); never asserted.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
case "$TARGET" in /*) ;; *) TARGET="$PWD/$TARGET" ;; esac
PY="target/python-llm-venv/bin/python"
[ -x "$PY" ] || { echo "run scripts/test-python.sh first" >&2; exit 2; }
cargo build --quiet --release -p recovery-tests --bin fault-provider
work="$(mktemp -d)"
"$TARGET/release/fault-provider" --port 0 >"$work/out" 2>"$work/err" &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  line="$(head -n 1 "$work/out" 2>/dev/null || true)"
  [[ "$line" == listening\ * ]] && break
  sleep 0.1
done
cd python/bench
"$OLDPWD/$PY" bench.py "${line#listening }"
