// Real clients over createRecoveringFetch: the official openai and
// @anthropic-ai/sdk packages and the Vercel ai package's OpenAI provider,
// each with its own retries off, against the fault provider: a reset before
// the first token and an overloaded in-stream error are both recovered and
// the stream completes with the full text exactly once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { streamText } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';
import { createRecoveringFetch } from '../../pkg/all/node.mjs';
import { FAULT, prefix, load, count, fixture, fast, terminals, openaiChatText } from './helpers.mjs';

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
