#!/usr/bin/env bash
# Builds the npm package (wasm/pkg) and runs every wasm test
# (node --test wasm/tests/node/), against the loopback fault provider
# (CORS on) and a plain server without CORS:
#   - the fetch cases and the conformance vectors in Node, and in headless
#     Chromium (page and dedicated worker) through Playwright; the vectors
#     are prepared and checked by the engine's own runner (conformance-js);
#   - the API, the real openai / @anthropic-ai/sdk / ai SDKs, workerd, the
#     examples/edge-worker proxy in workerd, the packed tarball;
#   - the TypeScript declarations (tsc --noEmit on a typed example).
# Run scripts/setup-wasm.sh once first. `--build-only` stops after the build.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WASM_OPT="$ROOT/wasm/node_modules/.bin/wasm-opt" # never Debian's binaryen
ESBUILD="$ROOT/wasm/node_modules/.bin/esbuild"
minify() { "$ESBUILD" "$1" --minify --log-level=warning "${@:3}" --outfile="$2"; }
step() { printf '\n== wasm: %s\n' "$*"; }

step "build the package"
# One module per protocol and one with all of them (`protocol: "auto"`),
# each in pkg/<name>/ with its three glues (web, Node ESM, Node CommonJS)
# and the entry points that bind it to the shell. What ships is minified
# (pkg/shell.mjs and pkg/shell.cjs from js/shell.mjs, and the glues):
# a browser downloads the shell and the web glue with every entry.
MODULES="all openai-chat openai-responses anthropic gemini ollama sse"
rm -rf wasm/pkg
mkdir -p wasm/pkg
IN="$TARGET_DIR/wasm32-unknown-unknown/wasm-release/recovery_wasm.wasm"
GLUE=$(mktemp -d)
for m in $MODULES; do
  case "$m" in
    all) features=() ;;
    sse) features=(--no-default-features) ;;
    *) features=(--no-default-features --features "$m") ;;
  esac
  cargo build -q --profile wasm-release -p recovery-wasm --target wasm32-unknown-unknown "${features[@]}"
  out="wasm/pkg/$m"
  mkdir -p "$out"
  rm -rf "$GLUE"/*
  wasm-bindgen --target web --out-dir "$GLUE/web" "$IN"
  wasm-bindgen --target experimental-nodejs-module --out-dir "$GLUE/node" "$IN"
  wasm-bindgen --target nodejs --out-dir "$GLUE/cjs" "$IN"
  # One module for every glue: the glues differ, the wasm does not.
  cmp "$GLUE/web/recovery_wasm_bg.wasm" "$GLUE/node/recovery_wasm_bg.wasm"
  cmp "$GLUE/web/recovery_wasm_bg.wasm" "$GLUE/cjs/recovery_wasm_bg.wasm"
  # Size first, the passes repeated while they still shrink the module
  # (--converge: ~430 B gzip off the openai-chat module); the module's
  # memory is its own (zero-filled at start) and nothing lives in its
  # first KiB, so binaryen may assume both.
  "$WASM_OPT" -Oz --converge --strip-debug --strip-producers --zero-filled-memory --low-memory-unused \
    "$GLUE/web/recovery_wasm_bg.wasm" -o "$out/recovery_wasm_bg.wasm"
  minify "$GLUE/web/recovery_wasm.js" "$out/glue.web.js" --format=esm
  minify "$GLUE/node/recovery_wasm.js" "$out/glue.node.mjs" --format=esm
  minify "$GLUE/cjs/recovery_wasm.js" "$out/glue.node.cjs" --format=cjs
  cat >"$out/web.mjs" <<'JS'
// Browsers and web workers: fetches and instantiates the module next to
// this file (top-level await), then binds the shell to it.
import init, * as wasm from './glue.web.js';
import { bind } from '../shell.mjs';

await init({ module_or_path: new URL('./recovery_wasm_bg.wasm', import.meta.url) });
export const createRecoveringFetch = bind(wasm);
export { recoveryOf, RecoveryError } from '../shell.mjs';
JS
  cat >"$out/node.mjs" <<'JS'
// Node, ESM: the glue reads and instantiates the module at import.
import * as wasm from './glue.node.mjs';
import { bind } from '../shell.mjs';

export const createRecoveringFetch = bind(wasm);
export { recoveryOf, RecoveryError } from '../shell.mjs';
JS
  cat >"$out/node.cjs" <<'JS'
// Node, CommonJS: the glue reads and instantiates the module at require.
'use strict';
const wasm = require('./glue.node.cjs');
const shell = require('../shell.cjs');

exports.createRecoveringFetch = shell.bind(wasm);
exports.recoveryOf = shell.recoveryOf;
exports.RecoveryError = shell.RecoveryError;
JS
  cat >"$out/workerd.mjs" <<'JS'
// workerd / Cloudflare Workers: deployed Workers refuse to compile wasm
// from bytes, so the module is imported compiled and instantiated at once.
import { initSync } from './glue.web.js';
import * as wasm from './glue.web.js';
import wasmModule from './recovery_wasm_bg.wasm';
import { bind } from '../shell.mjs';

initSync({ module: wasmModule });
export const createRecoveringFetch = bind(wasm);
export { recoveryOf, RecoveryError } from '../shell.mjs';
JS
done
rm -rf "$GLUE"
# The shell, for `import` and for `require`, and the CommonJS declarations.
minify wasm/js/shell.mjs wasm/pkg/shell.mjs --format=esm
minify wasm/js/shell.mjs wasm/pkg/shell.cjs --format=cjs
cp wasm/index.d.ts wasm/pkg/index.d.cts
if [ "${1:-}" = "--build-only" ]; then exit 0; fi

step "start the loopback servers"
cargo build -q -p recovery-tests --bin fault-provider --bin conformance-js
cargo build -q -p recovery-gateway --bin recovery-gateway
export RECOVERY_CONFORMANCE_JS="$TARGET_DIR/debug/conformance-js"
PIDS=()
LOGS=$(mktemp -d)
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$LOGS"
}
trap cleanup EXIT
"$TARGET_DIR/debug/fault-provider" --port 0 >"$LOGS/provider" 2>"$LOGS/provider.err" &
PIDS+=($!)
node wasm/tests/support/plain-server.mjs >"$LOGS/plain" 2>"$LOGS/plain.err" &
PIDS+=($!)
wait_line() {
  for _ in $(seq 1 300); do
    if grep -q '^listening ' "$1"; then sed -n 's/^listening //p' "$1" | head -n1; return 0; fi
    sleep 0.1
  done
  echo "no listening line in $1:" >&2; cat "$1" "$1.err" >&2; return 1
}
RECOVERY_FAULT_URL=$(wait_line "$LOGS/provider")
RECOVERY_PLAIN_URL=$(wait_line "$LOGS/plain")
RECOVERY_REFUSED_URL=$(node wasm/tests/support/refused-url.mjs)
# A recovery-gateway in front of the provider, for the resume-through-a-relay test.
"$TARGET_DIR/debug/recovery-gateway" --listen 127.0.0.1:0 --upstream "$RECOVERY_FAULT_URL" \
  >"$LOGS/gateway" 2>"$LOGS/gateway.err" &
PIDS+=($!)
RECOVERY_GATEWAY_URL=$(wait_line "$LOGS/gateway")
export RECOVERY_FAULT_URL RECOVERY_PLAIN_URL RECOVERY_REFUSED_URL RECOVERY_GATEWAY_URL
echo "provider $RECOVERY_FAULT_URL, plain $RECOVERY_PLAIN_URL, refused $RECOVERY_REFUSED_URL, gateway $RECOVERY_GATEWAY_URL"

step "npm package in Node, workerd and Chromium; real SDKs"
node --test --test-concurrency=1 wasm/tests/node/

step "TypeScript declarations"
"$ROOT/wasm/node_modules/.bin/tsc" --noEmit -p wasm/tests/types
echo "tsc: declarations check passed"
