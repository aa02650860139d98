// Shared helpers of the JS-level tests: the provider URL exported by
// scripts/test-wasm.sh, per-test paths and the provider's control endpoint.
import { randomBytes } from 'node:crypto';
import OpenAI from 'openai';
import { createRecoveringFetch } from '../../pkg/all/node.mjs';

export const FAULT = (process.env.RECOVERY_FAULT_URL ?? '').replace(/\/$/, '');
if (!FAULT) throw new Error('RECOVERY_FAULT_URL is not set: run scripts/test-wasm.sh');

export function prefix(name) {
  return `/js/${randomBytes(8).toString('hex')}/${name}`;
}

export async function load(paths) {
  const res = await fetch(`${FAULT}/__fault/script?merge`, { method: 'POST', body: JSON.stringify({ paths }) });
  if (!res.ok) throw new Error(`script refused: ${await res.text()}`);
}

export async function count(path) {
  const c = await (await fetch(`${FAULT}/__fault/count`)).json();
  return c.paths[path] ?? 0;
}

export const sse = (body, extra = {}) => ({ headers: { 'content-type': 'text/event-stream' }, body, ...extra });
export const fixture = (name, extra = {}) => sse([{ fixture: name }], extra);
export const fast = { backoffBaseMs: 1, backoffCeilingMs: 2 };

export function terminals(events) {
  return events.filter((e) => ['completed', 'exhausted', 'interrupted', 'cancelled'].includes(e.event));
}

// The official OpenAI SDK (its own retries off) over createRecoveringFetch
// against `${FAULT}${base}/v1`, pushing every lifecycle event to `events`.
export function openaiClient(base, events) {
  return new OpenAI({
    apiKey: 'test-key',
    baseURL: `${FAULT}${base}/v1`,
    maxRetries: 0,
    fetch: createRecoveringFetch({ ...fast, onEvent: (e) => events.push(e) }),
  });
}

// Streams one OpenAI Chat answer with openaiClient; returns the text the
// SDK yielded.
export async function openaiChatText(base, events) {
  const client = openaiClient(base, events);
  const stream = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }], stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  return text;
}
