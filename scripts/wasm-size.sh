#!/usr/bin/env bash
# What a browser downloads for each entry of the built npm package (raw and
# gzip -9): the module, its web glue, its entry file and the shared shell;
# then what the recovering fetch adds per chunk, its decoding rate and its
# wall ratio over loopback HTTP (wasm/bench/chunks.mjs). Targets: the openai-chat entry <= 61,440 B gzip
# (60 KiB), the all-protocol entry <= 92,160 B gzip (90 KiB), <= 3 µs per
# chunk, wall ratio <= 1.05.
# Build first: scripts/test-wasm.sh --build-only.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f wasm/pkg/shell.mjs ]; then
  echo "wasm-size: no wasm/pkg; run scripts/test-wasm.sh --build-only first" >&2
  exit 1
fi
gz() { gzip -9c "$1" | wc -c; }
row() { printf '%-34s %9s %9s %s\n' "$@"; }

row entry "raw" "gzip" ""
shell_raw=$(wc -c <wasm/pkg/shell.mjs); shell_gz=$(gz wasm/pkg/shell.mjs)
row "  shell.mjs (every entry)" "$shell_raw" "$shell_gz" ""
for m in openai-chat openai-responses anthropic gemini ollama sse all; do
  raw=$shell_raw; gzip=$shell_gz; parts=""
  for f in recovery_wasm_bg.wasm glue.web.js web.mjs; do
    r=$(wc -c <"wasm/pkg/$m/$f"); g=$(gz "wasm/pkg/$m/$f")
    raw=$((raw + r)); gzip=$((gzip + g)); parts="$parts $f $g"
  done
  case "$m" in
    openai-chat) target="(target: gzip <= 61440)" ;;
    all) target="(target: gzip <= 92160)" ;;
    *) target="" ;;
  esac
  row "$m" "$raw" "$gzip" "$target"
  row "   =$parts" "" "" ""
done
echo
node wasm/bench/chunks.mjs wasm/pkg/openai-chat/node.mjs
