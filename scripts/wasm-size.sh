#!/usr/bin/env bash
# Sizes of the built npm package (wasm + JS glue, raw and gzip -9) and the
# throughput of the whole wasm driver in Node (observer + hold-back +
# stitched body) on an ~8 MiB OpenAI Chat corpus read in 16 KiB pieces from
# an in-memory fetch. The native observer figure on a comparable corpus is
# `cargo bench -p recovery-core --bench decode` (BENCHMARKS.md, Decoding).
# Build first: scripts/test-wasm.sh --build-only.
set -euo pipefail
cd "$(dirname "$0")/.."
gz() { gzip -9c "$1" | wc -c; }
printf '%-36s %10s %10s\n' file raw gzip
total_raw=0; total_gz=0
for f in wasm/pkg/recovery_wasm_bg.wasm wasm/pkg/web.js wasm/js/core.mjs wasm/js/web.mjs \
         wasm/pkg/node.mjs wasm/pkg/node.cjs wasm/pkg/core.cjs; do
  r=$(wc -c <"$f"); g=$(gz "$f")
  printf '%-36s %10d %10d\n' "$f" "$r" "$g"
done
for f in wasm/pkg/recovery_wasm_bg.wasm wasm/pkg/web.js wasm/js/core.mjs wasm/js/web.mjs; do
  total_raw=$((total_raw + $(wc -c <"$f"))); total_gz=$((total_gz + $(gz "$f")))
done
printf '%-36s %10d %10d  (target: gzip <= 61440)\n' "browser total (wasm + glue)" "$total_raw" "$total_gz"
node --input-type=module -e '
import { createRecoveringFetch } from "./wasm/js/node.mjs";
const event = (i) => `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","system_fingerprint":"fp_1","choices":[{"index":0,"delta":{"content":"token ${i} "},"logprobs":null,"finish_reason":null}]}\n\n`;
let text = "";
for (let i = 0; text.length < 8 << 20; i++) text += event(i);
text += `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n`;
const corpus = new TextEncoder().encode(text);
const PIECE = 16 << 10;
const memoryFetch = async () => new Response(new ReadableStream({
  start(c) { for (let o = 0; o < corpus.length; o += PIECE) c.enqueue(corpus.subarray(o, o + PIECE)); c.close(); },
}), { headers: { "content-type": "text/event-stream" } });
const rfetch = createRecoveringFetch({ protocol: "openai-chat", fetch: memoryFetch });
let best = 0;
for (let run = 0; run < 5; run++) {
  const t0 = performance.now();
  const res = await rfetch("http://bench.invalid/v1/chat/completions", { method: "POST", body: "{}" });
  const reader = res.body.getReader();
  let n = 0;
  for (;;) { const { done, value } = await reader.read(); if (done) break; n += value.length; }
  const secs = (performance.now() - t0) / 1000;
  if (n !== corpus.length || res.recovery.outcome().outcome !== "completed") throw new Error("bench stream did not complete");
  best = Math.max(best, corpus.length / secs / 1e6);
}
console.log(`wasm driver in Node (openai corpus ${(corpus.length / 1048576).toFixed(1)} MiB, 16 KiB reads): ${best.toFixed(0)} MB/s (best of 5)`);
'
