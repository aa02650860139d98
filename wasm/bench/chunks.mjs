// What `createRecoveringFetch` adds to a stream, measured in Node:
//
// 1. per chunk: 10,000 one-event OpenAI Chat chunks from an in-memory
//    `fetch`, read through plain `fetch` and through the recovering fetch in
//    alternating runs; the added cost is the difference of the medians over
//    the chunk count (target: <= 3 µs per chunk);
// 2. the decoding rate: the same stream from an in-memory `fetch` in 16 KiB
//    reads (what Node's fetch hands over from a socket), the added time of
//    the recovering fetch over plain `fetch` against the stream's size
//    (10th percentiles of 101 alternating runs: the machine's own rate,
//    less the noise of a shared host);
// 3. over loopback HTTP: the same stream served by a Node server in a child
//    process on 127.0.0.1 (one write per event), read through Node's fetch
//    and through the recovering fetch in alternating runs; the figure is
//    the ratio of the median wall times (target: <= 1.05).
//
// Usage: node wasm/bench/chunks.mjs [entry]   (default: the openai-chat
// entry of the built package, wasm/pkg/openai-chat/node.mjs)
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const ENTRY = process.argv[2] ?? new URL('../pkg/openai-chat/node.mjs', import.meta.url).pathname;
const { createRecoveringFetch } = await import(pathToFileURL(resolve(ENTRY)).href);

const CHUNKS = 10_000;
const WARMUP = 5;
const ROUNDS = 31;

const event = (i) =>
  `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"token ${i} "},"finish_reason":null}]}\n\n`;
const LAST =
  'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n';
const encoder = new TextEncoder();
const chunks = [];
for (let i = 0; i < CHUNKS - 1; i++) chunks.push(encoder.encode(event(i)));
chunks.push(encoder.encode(LAST));
const total = chunks.reduce((n, c) => n + c.length, 0);

/** Reads a response to its end; returns [bytes, milliseconds since t0]. */
async function drain(res, t0) {
  const reader = res.body.getReader();
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    n += value.length;
  }
  return [n, performance.now() - t0];
}

/** One request through `fetcher`, read to its end and checked; its milliseconds. */
async function timed(fetcher, url, init) {
  const t0 = performance.now();
  const res = await fetcher(url, init);
  const [n, ms] = await drain(res, t0);
  check(n, res);
  return ms;
}

/** The `q` quantile of `xs`. */
const quantile = (xs, q) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) * q)];

/**
 * Times `runA` and `runB` in alternating rounds; returns both medians (or
 * the `q` quantiles).
 */
async function alternate(runA, runB, rounds = ROUNDS, q = 0.5) {
  for (let i = 0; i < WARMUP; i++) {
    await runA();
    await runB();
  }
  const a = [];
  const b = [];
  for (let i = 0; i < rounds; i++) {
    // Alternate which goes first, so neither always runs on a warmer heap.
    if (i % 2 === 0) {
      a.push(await runA());
      b.push(await runB());
    } else {
      b.push(await runB());
      a.push(await runA());
    }
  }
  return [quantile(a, q), quantile(b, q)];
}

function check(n, res) {
  if (n !== total) throw new Error(`read ${n} bytes of ${total}`);
  if (res.recovery && res.recovery.outcome().outcome !== 'completed') {
    throw new Error(`outcome ${JSON.stringify(res.recovery.outcome())}`);
  }
}

// 1. In memory: every read is one chunk.
const memoryFetch = async () =>
  new Response(
    new ReadableStream({
      start(c) {
        for (const chunk of chunks) c.enqueue(chunk);
        c.close();
      },
    }),
    { headers: { 'content-type': 'text/event-stream' } },
  );
const inMemory = createRecoveringFetch({ protocol: 'openai-chat', fetch: memoryFetch });
const memoryInit = () => ({ method: 'POST', body: '{}' });
const [plainMs, recoveringMs] = await alternate(
  () => timed(memoryFetch, 'http://bench.invalid/v1/chat/completions', memoryInit()),
  () => timed(inMemory, 'http://bench.invalid/v1/chat/completions', memoryInit()),
);
const perChunkUs = ((recoveringMs - plainMs) * 1000) / CHUNKS;
console.log(
  `in-memory fetch, ${CHUNKS} one-event chunks: plain ${plainMs.toFixed(2)} ms, recovering ${recoveringMs.toFixed(2)} ms ` +
    `(medians of ${ROUNDS} alternating runs); added ${perChunkUs.toFixed(2)} µs per chunk (target: <= 3)`,
);

// 2. In memory, in 16 KiB reads: the decoding rate.
const whole = new Uint8Array(total);
chunks.reduce((at, c) => (whole.set(c, at), at + c.length), 0);
const reads = [];
for (let at = 0; at < total; at += 16384) reads.push(whole.subarray(at, at + 16384));
const readsFetch = async () =>
  new Response(
    new ReadableStream({
      start(c) {
        for (const r of reads) c.enqueue(r.slice());
        c.close();
      },
    }),
    { headers: { 'content-type': 'text/event-stream' } },
  );
const readsRecovering = createRecoveringFetch({ protocol: 'openai-chat', fetch: readsFetch });
const [plainReads, recoveringReads] = await alternate(
  () => timed(readsFetch, 'http://bench.invalid/v1/chat/completions', memoryInit()),
  () => timed(readsRecovering, 'http://bench.invalid/v1/chat/completions', memoryInit()),
  101,
  0.1,
);
console.log(
  `in-memory fetch, ${reads.length} reads of 16 KiB: plain ${plainReads.toFixed(2)} ms, recovering ${recoveringReads.toFixed(2)} ms ` +
    `(10th percentiles of 101 alternating runs); decoding ${(total / 1e6 / ((recoveringReads - plainReads) / 1e3)).toFixed(0)} MB/s`,
);

// 3. Loopback HTTP, the server in its own process.
const SERVER = `
const http = require('node:http');
const event = ${event.toString()};
const chunks = [];
for (let i = 0; i < ${CHUNKS - 1}; i++) chunks.push(event(i));
chunks.push(${JSON.stringify(LAST)});
const server = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    for (const c of chunks) res.write(c);
    res.end();
  });
});
server.listen(0, '127.0.0.1', () => console.log('listening ' + server.address().port));
`;
const server = spawn(process.execPath, ['-e', SERVER], { stdio: ['ignore', 'pipe', 'inherit'] });
try {
  const [line] = await once(server.stdout, 'data');
  const port = /listening (\d+)/.exec(String(line))?.[1];
  if (!port) throw new Error(`server said ${line}`);
  const url = `http://127.0.0.1:${port}/v1/chat/completions`;
  const overHttp = createRecoveringFetch({ protocol: 'openai-chat' });
  const init = () => ({ method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
  const [plainHttp, recoveringHttp] = await alternate(
    () => timed(fetch, url, init()),
    () => timed(overHttp, url, init()),
  );
  console.log(
    `loopback HTTP, ${CHUNKS} events (${(total / 1048576).toFixed(2)} MiB): plain ${plainHttp.toFixed(2)} ms, ` +
      `recovering ${recoveringHttp.toFixed(2)} ms (medians of ${ROUNDS} alternating runs); ` +
      `wall ratio ${(recoveringHttp / plainHttp).toFixed(3)} (target: <= 1.05)`,
  );
} finally {
  server.kill();
}
