// Real clients over createRecoveringFetch: the official openai and
// @anthropic-ai/sdk packages and the Vercel ai package's OpenAI provider,
// each with its own retries off, against the fault provider: a reset before
// the first token and an overloaded in-stream error are both recovered and
// the stream completes with the full text exactly once; an overloaded
// primary fails over to an alternate before the first token; a model list,
// an embedding and speech, which are not generations, pass through.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createRecoveringFetch } from '../../pkg/all/node.mjs';
import { FAULT, prefix, load, count, fixture, fast, terminals, openaiChatText, openaiClient } from './helpers.mjs';

const openaiFaults = (path) => ({
  [path]: [
    fixture('openai-chat/role-only-then-cut.sse', { ending: 'rst' }),
    fixture('openai-chat/error-first.sse'),
    fixture('openai-chat/happy-usage.sse'),
  ],
});

test('openai SDK: reset before the first token, then an in-stream server error', async () => {
  const base = prefix('openai');
  const path = `${base}/v1/chat/completions`;
  await load(openaiFaults(path));
  const events = [];
  const text = await openaiChatText(base, events);
  assert.equal(text, 'Hello world');
  assert.equal(await count(path), 3);
  assert.equal(terminals(events).length, 1);
  assert.equal(events.at(-1).event, 'completed');
});

test('anthropic SDK: reset before the first token, then overloaded_error in the stream', async () => {
  const base = prefix('anthropic');
  const path = `${base}/v1/messages`;
  await load({
    [path]: [
      fixture('anthropic/ping-only-then-cut.sse', { ending: 'rst' }),
      fixture('anthropic/error-first.sse'),
      fixture('anthropic/happy.sse'),
    ],
  });
  const events = [];
  const client = new Anthropic({
    apiKey: 'test-key',
    baseURL: `${FAULT}${base}`,
    maxRetries: 0,
    fetch: createRecoveringFetch({ ...fast, onEvent: (e) => events.push(e) }),
  });
  const stream = await client.messages.create({ model: 'm', max_tokens: 16, messages: [{ role: 'user', content: 'hi' }], stream: true });
  let text = '';
  for await (const event of stream) {
    if (event.type === 'content_block_delta' && event.delta.type === 'text_delta') text += event.delta.text;
  }
  assert.equal(text, 'Hello');
  assert.equal(await count(path), 3);
  assert.equal(terminals(events).length, 1);
  const failures = events.filter((e) => e.event === 'attempt_failed').map((e) => e.category);
  assert.deepEqual(failures, ['transport', 'provider_response']);
});

test('ai SDK (OpenAI chat provider): the same faults', async () => {
  const base = prefix('ai-sdk');
  const path = `${base}/v1/chat/completions`;
  await load(openaiFaults(path));
  const events = [];
  const openai = createOpenAI({
    apiKey: 'test-key',
    baseURL: `${FAULT}${base}/v1`,
    fetch: createRecoveringFetch({ ...fast, protocol: 'openai-chat', onEvent: (e) => events.push(e) }),
  });
  const result = streamText({ model: openai.chat('m'), prompt: 'hi', maxRetries: 0 });
  let text = '';
  for await (const part of result.textStream) text += part;
  assert.equal(text, 'Hello world');
  assert.equal(await count(path), 3);
  assert.equal(terminals(events).length, 1);
});

// Failover before the first token: the primary is overloaded, the request
// goes at once to an alternate on another origin (`localhost` instead of
// `127.0.0.1`: the same provider, another origin), which gets its own
// model and key and never the primary's.
test('openai SDK: primary overloaded before output, the alternate serves the whole answer', async () => {
  const base = prefix('failover');
  const primary = `${base}/v1/chat/completions`;
  const alternate = `${base}/alt/v1/chat/completions`;
  await load({
    [primary]: [{ status: 529, headers: { 'content-type': 'application/json' }, body: ['{"type":"error","error":{"type":"overloaded_error"}}'] }],
    [alternate]: [fixture('openai-chat/happy-usage.sse')],
  });
  const elsewhere = FAULT.replace('127.0.0.1', 'localhost');
  assert.notEqual(elsewhere, FAULT, 'the provider listens on 127.0.0.1');
  const events = [];
  const rfetch = createRecoveringFetch({
    ...fast,
    onEvent: (e) => events.push(e),
    alternates: [{ label: 'backup', url: `${elsewhere}${alternate}`, model: 'backup-model', headers: { 'x-api-key': 'alt-key' } }],
  });
  const client = new OpenAI({ apiKey: 'primary-key', baseURL: `${FAULT}${base}/v1`, maxRetries: 0, fetch: rfetch });
  const stream = await client.chat.completions.create({ model: 'main-model', messages: [{ role: 'user', content: 'hi' }], stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  assert.equal(text, 'Hello world');
  assert.equal(await count(primary), 1);
  assert.equal(await count(alternate), 1);
  const received = (await (await fetch(`${FAULT}/__fault/requests`)).json()).filter((r) => r.target === alternate);
  const body = JSON.parse(received[0].body);
  assert.equal(body.model, 'backup-model');
  assert.deepEqual(body.messages, [{ role: 'user', content: 'hi' }]);
  const headers = Object.fromEntries(received[0].headers.map(([n, v]) => [n.toLowerCase(), v]));
  assert.equal(headers['x-api-key'], 'alt-key');
  assert.equal(headers.authorization, undefined, "the primary's key never leaves its origin");
  const names = events.map((e) => e.event);
  assert.deepEqual(names, ['attempt_started', 'attempt_failed', 'failover', 'retry_started', 'attempt_started', 'committed', 'attempt_succeeded', 'completed']);
  const failover = events.find((e) => e.event === 'failover');
  assert.equal(failover.from, 'primary');
  assert.equal(failover.to, 'backup');
  assert.equal(events[0].target, 'primary');
  assert.equal(events[4].target, 'backup');
});

test('anthropic alternate behind an openai request: the caller writes its body, the answer is read as Anthropic', async () => {
  const base = prefix('failover-anthropic');
  const primary = `${base}/v1/chat/completions`;
  const messages = `${base}/v1/messages`;
  await load({
    [primary]: [{ ending: 'reset_before_head' }],
    [messages]: [fixture('anthropic/happy.sse')],
  });
  const rfetch = createRecoveringFetch({
    ...fast,
    alternates: [{
      label: 'claude',
      url: messages,
      protocol: 'anthropic',
      body: (text) => JSON.stringify({ ...JSON.parse(text), model: 'claude-sonnet', max_tokens: 64 }),
    }],
  });
  const res = await rfetch(`${FAULT}${primary}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"model":"gpt","stream":true}' });
  assert.equal(res.recovery.protocol, 'anthropic', 'the protocol of the answer handed out, not of the first send');
  const text = await res.text();
  assert.match(text, /message_stop/);
  assert.equal(res.recovery.protocol, 'anthropic');
  const report = res.recovery.report();
  assert.equal(report.served_by, 'claude');
  assert.deepEqual(report.attempts.map((a) => a.target), ['primary', 'claude']);
  assert.equal(res.recovery.outcome().outcome, 'completed');
  const received = (await (await fetch(`${FAULT}/__fault/requests`)).json()).filter((r) => r.target === messages);
  assert.deepEqual(JSON.parse(received[0].body), { model: 'claude-sonnet', stream: true, max_tokens: 64 });
});

test('bad alternates are typed option errors', () => {
  for (const [alternates, field] of [
    ['x', 'alternates'],
    [[{ label: 'a b' }], 'alternates[0].label'],
    [[{ label: 'a', url: 'ftp://x' }], 'alternates[0].url'],
    // A multibyte character where a scheme would end: refused, not a trap.
    [[{ label: 'a', url: 'http:/\u00e4x' }], 'alternates[0].url'],
    [[{ label: 'a', protocol: 'smtp' }], 'alternates[0].protocol'],
    [[{ label: 'a', body: 3 }], 'alternates[0].body'],
    [[{ label: 'a', colour: 'red' }], 'alternates[0].colour'],
  ]) {
    assert.throws(() => createRecoveringFetch({ alternates }), (e) => e.code === 'invalid_option' && e.message.includes(field), field);
  }
});

test('openai SDK: a model list, an embedding and speech pass through as they came', async () => {
  const base = prefix('openai-api');
  const json = { 'content-type': 'application/json' };
  const models = '{"object":"list","data":[{"id":"gpt-5","object":"model","created":0,"owned_by":"system"}]}';
  const embedding =
    '{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.25,-0.5]}],"model":"e","usage":{"prompt_tokens":2,"total_tokens":2}}';
  const speech = 'ID3 not a stream of events';
  await load({
    [`${base}/v1/models`]: [{ headers: json, body: [models] }],
    [`${base}/v1/embeddings`]: [{ headers: json, body: [embedding] }],
    [`${base}/v1/audio/speech`]: [{ headers: { 'content-type': 'audio/mpeg' }, body: [speech] }],
  });
  const events = [];
  const client = openaiClient(base, events);
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, ['gpt-5']);
  const e = await client.embeddings.create({ model: 'e', input: 'hi', encoding_format: 'float' });
  assert.deepEqual(e.data[0].embedding, [0.25, -0.5]);
  const audio = await client.audio.speech.create({ model: 'tts-1', voice: 'alloy', input: 'hi' });
  assert.equal(Buffer.from(await audio.arrayBuffer()).toString(), speech);
  for (const p of ['/v1/models', '/v1/embeddings', '/v1/audio/speech']) assert.equal(await count(`${base}${p}`), 1, p);
  assert.deepEqual(terminals(events).map((t) => t.event), ['completed', 'completed', 'completed']);
});
