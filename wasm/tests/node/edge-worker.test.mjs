// examples/edge-worker in workerd, exactly as its README runs it (only the
// socket and the upstream address are overridden), against the loopback
// fault provider: the client of the proxy must receive the full stream
// exactly once when the upstream resets before the first token.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { FAULT, prefix, load, count, fixture } from './helpers.mjs';

const example = fileURLToPath(new URL('../../../examples/edge-worker/', import.meta.url));
const bin = fileURLToPath(new URL('../../node_modules/.bin/workerd', import.meta.url));
const HAPPY = await readFile(new URL('../../../tests/fixtures/openai-chat/happy-usage.sse', import.meta.url), 'utf8');
const KEY = 'sk-edge-test-key';

const port = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
});
const child = spawn(
  bin,
  ['serve', 'config.capnp', '--socket-addr', `http=127.0.0.1:${port}`, '--external-addr', `upstream=${new URL(FAULT).host}`],
  { cwd: example, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, UPSTREAM_API_KEY: KEY } },
);
let logs = '';
child.stdout.on('data', (d) => { logs += d; });
child.stderr.on('data', (d) => { logs += d; });
after(() => child.kill());

/** A request to the proxy, retried while workerd starts. */
async function request(path, init) {
  for (let i = 0; i < 100; i++) {
    try {
      return await fetch(`http://127.0.0.1:${port}${path}`, init);
    } catch {
      if (child.exitCode !== null) throw new Error(`workerd exited: ${logs}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  throw new Error(`workerd did not answer: ${logs}`);
}

const post = (path, body) => request(path, {
  method: 'POST',
  headers: { 'content-type': 'application/json', authorization: 'Bearer client-secret' },
  body,
});

const occurrences = (text, needle) => text.split(needle).length - 1;

test('edge worker: a reset before the first token reaches the client as one whole stream', async () => {
  const path = `${prefix('edge')}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/role-only-then-cut.sse', { ending: 'rst' }), fixture('openai-chat/happy-usage.sse')] });
  const body = JSON.stringify({ model: 'gpt-4o-mini', stream: true, messages: [{ role: 'user', content: 'hi' }] });
  const res = await post(path, body);
  assert.equal(res.status, 200, logs);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  assert.equal(res.headers.get('x-recovery-attempts'), '2');
  const text = await res.text();
  // Exactly once: byte for byte the successful attempt, nothing of the
  // failed one (its role chunk), one terminator.
  assert.equal(text, HAPPY);
  assert.equal(occurrences(text, 'data: [DONE]'), 1);
  assert.equal(occurrences(text, '"content":"Hello"'), 1);
  assert.equal(await count(path), 2);
  // The upstream got the client's body twice, with the worker's key and
  // never the client's credentials.
  const requests = (await (await fetch(`${FAULT}/__fault/requests`)).json()).filter((r) => r.target === path);
  assert.equal(requests.length, 2);
  for (const r of requests) {
    assert.equal(r.body, body);
    const headers = Object.fromEntries(
      (Array.isArray(r.headers) ? r.headers : Object.entries(r.headers)).map(([k, v]) => [k.toLowerCase(), v]),
    );
    assert.equal(headers.authorization, `Bearer ${KEY}`);
  }
  assert.match(logs, /"recovery":"completed"/);
});

test('edge worker: a cut after the first token ends the stream with one SSE error event', async () => {
  const path = `${prefix('edge-cut')}/v1/chat/completions`;
  await load({ [path]: [fixture('x', { body: [{ fixture: 'openai-chat/happy-usage.sse', end: 636 }, { text: ': x\n\n', stall: true }], ending: 'rst' })] });
  const res = await post(path, '{"stream":true}');
  assert.equal(res.status, 200, logs);
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let text = decoder.decode((await reader.read()).value, { stream: true });
  await fetch(`${FAULT}/__fault/release?n=1`, { method: 'POST' });
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  assert.ok(text.startsWith(HAPPY.slice(0, 636)), text);
  assert.equal(occurrences(text, 'event: error'), 1, text);
  assert.match(text, /"type":"stream_interrupted"/);
  assert.match(text, /"outcome":"interrupted"/);
  assert.equal(occurrences(text, 'data: [DONE]'), 0);
  assert.equal(await count(path), 1);
});

test('edge worker: only POST is proxied', async () => {
  const res = await request('/v1/chat/completions', { method: 'GET' });
  assert.equal(res.status, 405);
});
