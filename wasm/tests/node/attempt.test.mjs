// One attempt judged the same way in every driver (reliability matrix AT),
// at the level where users met the differences: real SDKs over
// createRecoveringFetch against the fault provider.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Ollama } from 'ollama';
import { createRecoveringFetch } from '../../pkg/all/node.mjs';
import { FAULT, prefix, load, count, fixture, fast, terminals, openaiChatText, openaiClient } from './helpers.mjs';

const fixtures = new URL('../../../tests/fixtures/', import.meta.url);
const read = (name) => readFileSync(new URL(name, fixtures), 'utf8');

/** The client closed the connection a stall held open: no stall waits. */
async function closedByClient() {
  const res = await fetch(`${FAULT}/__fault/wait?waiting=0`, { signal: AbortSignal.timeout(10_000) });
  assert.equal((await res.json()).stalls_waiting, 0);
}

test('AT2: the ollama SDK stops at `done: true`; the request is completed, not cancelled', async () => {
  const base = prefix('ollama');
  const path = `${base}/api/chat`;
  // The whole answer, then the connection stays open: only the SDK's own
  // end marker ends its reading.
  await load({
    [path]: [{
      headers: { 'content-type': 'application/x-ndjson' },
      body: [{ fixture: 'ollama/chat-happy.ndjson' }],
      ending: 'stall',
    }],
  });
  const events = [];
  const ollama = new Ollama({
    host: `${FAULT}${base}`,
    fetch: createRecoveringFetch({ ...fast, onEvent: (e) => events.push(e) }),
  });
  const stream = await ollama.chat({ model: 'llama3', messages: [{ role: 'user', content: 'hi' }], stream: true });
  let text = '';
  let done = false;
  for await (const part of stream) {
    text += part.message.content;
    done ||= part.done;
  }
  assert.equal(text, 'Hello');
  assert.ok(done);
  // Decided when the proof was handed out, whatever the SDK does with the
  // body afterwards.
  assert.deepEqual(terminals(events).map((e) => e.event), ['completed']);
  assert.equal(await count(path), 1);
  await closedByClient();
});

test('AT1: the openai SDK reads a stream reset right after [DONE]: completed, no error', async () => {
  const base = prefix('at1');
  const path = `${base}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/happy-usage.sse', { ending: 'rst' })] });
  const events = [];
  const text = await openaiChatText(base, events);
  assert.equal(text, 'Hello world');
  assert.deepEqual(terminals(events).map((e) => e.event), ['completed']);
  assert.equal(await count(path), 1);
});

test('AT8: the openai SDK reads a stream that stalls after [DONE]: completed at once', async () => {
  const base = prefix('at8');
  const path = `${base}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/happy-usage.sse', { ending: 'stall' })] });
  const events = [];
  const text = await openaiChatText(base, events);
  assert.equal(text, 'Hello world');
  assert.deepEqual(terminals(events).map((e) => e.event), ['completed']);
  assert.ok(!events.some((e) => e.event === 'attempt_failed'), 'no stall');
  await closedByClient();
});

test('AT10: the openai SDK gets a Responses background stream whole, resumed after a reset', async () => {
  const base = prefix('at10');
  const post = `${base}/v1/responses`;
  const full = read('openai-responses/happy.sse');
  // Cut right after the first text delta: output was delivered, so only a
  // resume can continue it.
  const delta = full.indexOf('response.output_text.delta');
  const cut = full.indexOf('\n\n', delta) + 2;
  await load({
    [post]: [{ headers: { 'content-type': 'text/event-stream' }, body: [{ text: full.slice(0, cut) }], ending: 'rst' }],
    // The resumed stream repeats everything from the start: the driver
    // drops the events at or below the cursor.
    [`${base}/v1/responses/resp_1`]: [fixture('openai-responses/happy.sse')],
  });
  const events = [];
  const client = openaiClient(base, events);
  const stream = await client.responses.create({ model: 'm', input: 'hi', stream: true, background: true });
  let text = '';
  let completed = 0;
  const sequence = [];
  for await (const event of stream) {
    sequence.push(event.sequence_number);
    if (event.type === 'response.output_text.delta') text += event.delta;
    if (event.type === 'response.completed') completed += 1;
  }
  assert.equal(completed, 1);
  assert.deepEqual(sequence, [...new Set(sequence)], 'no event twice');
  assert.deepEqual(sequence, [...sequence].sort((a, b) => a - b), 'in order');
  const expected = [...full.matchAll(/"delta":"([^"]*)"/g)].map((m) => m[1]).join('');
  assert.equal(text, expected);
  assert.ok(events.some((e) => e.event === 'resume_started'));
  assert.deepEqual(terminals(events).map((e) => e.event), ['completed']);
  assert.equal(await count(post), 1, 'the POST is never replayed');
});
