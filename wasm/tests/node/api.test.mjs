// The npm API in Node: fetch-shaped, stitched body, final HTTP error as the
// response, TypeError on transport exhaustion, typed errors after commit,
// abort, events with the Rust serde fields, report on the response.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { createRecoveringFetch, recoveryOf, RecoveryError } from '../../pkg/all/node.mjs';
import { FAULT, prefix, load, count, fixture, fast, terminals } from './helpers.mjs';

const HAPPY = await readFile(new URL('../../../tests/fixtures/openai-chat/happy-usage.sse', import.meta.url), 'utf8');

test('a reset before the first token is replayed; the body is the second attempt exactly', async () => {
  const path = `${prefix('reset')}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/role-only-then-cut.sse', { ending: 'rst' }), fixture('openai-chat/happy-usage.sse')] });
  const events = [];
  const rfetch = createRecoveringFetch({ ...fast, onEvent: (e) => events.push(e) });
  const res = await rfetch(`${FAULT}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"stream":true}' });
  assert.equal(res.status, 200);
  assert.equal(res.headers.get('content-type'), 'text/event-stream');
  assert.equal(await res.text(), HAPPY);
  assert.equal(await count(path), 2);
  assert.equal(terminals(events).length, 1);
  assert.equal(events.at(-1).event, 'completed');
  const failed = events.find((e) => e.event === 'attempt_failed');
  assert.deepEqual(
    Object.keys(failed).sort(),
    ['at_ms', 'attempt_id', 'category', 'event', 'logical_id', 'phase', 'reason', 'status', 'wire_attempt'],
  );
  const report = res.recovery.report();
  assert.equal(report.attempts.length, 2);
  assert.equal(report.outcome.outcome, 'completed');
  assert.equal(recoveryOf(res), res.recovery);
  assert.equal(res.recovery.protocol, 'openai-chat');
});

test('the report and outcome read at any moment are the machine\'s as of the last event', async () => {
  const path = `${prefix('report-moments')}/v1/chat/completions`;
  // The second attempt holds its last event until released.
  await load({ [path]: [
    fixture('openai-chat/role-only-then-cut.sse', { ending: 'rst' }),
    fixture('x', { body: [{ fixture: 'openai-chat/happy-usage.sse', end: 636 }, { fixture: 'openai-chat/happy-usage.sse', start: 636, stall: true }] }),
  ] });
  let res;
  const seen = [];
  const rfetch = createRecoveringFetch({
    ...fast,
    onEvent: (e) => {
      if (res) seen.push([e.event, res.recovery.outcome()?.outcome ?? null, res.recovery.report().attempts.length]);
    },
  });
  res = await rfetch(`${FAULT}${path}`, { method: 'POST', body: '{"stream":true}' });
  // Read while the stream is open: no outcome yet.
  assert.equal(res.recovery.outcome(), null);
  assert.equal(res.recovery.report().attempts.length, 2);
  assert.equal(res.recovery.report().outcome, null);
  const text = res.text();
  await fetch(`${FAULT}/__fault/release`, { method: 'POST' });
  assert.equal(await text, HAPPY);
  // Read again after the end: what the end changed, not the earlier reading.
  assert.equal(res.recovery.outcome().outcome, 'completed');
  assert.equal(res.recovery.report().outcome.outcome, 'completed');
  assert.deepEqual(seen.at(-1), ['completed', 'completed', 2]);
});

test('the request body is replayed byte for byte', async () => {
  const path = `${prefix('replay-body')}/v1/chat/completions`;
  await load({ [path]: [{ ending: 'reset_before_head' }, fixture('openai-chat/happy-usage.sse')] });
  const body = JSON.stringify({ model: 'm', stream: true, messages: [{ role: 'user', content: 'hi ✓' }] });
  const res = await createRecoveringFetch(fast)(`${FAULT}${path}`, { method: 'POST', body });
  await res.text();
  const requests = (await (await fetch(`${FAULT}/__fault/requests`)).json()).filter((r) => r.target === path);
  assert.equal(requests.length, 2);
  assert.equal(requests[0].body, body);
  assert.equal(requests[1].body, body);
});

test('a final HTTP error comes back as that response', async () => {
  const path = `${prefix('final-429')}/v1/chat/completions`;
  await load({ [path]: [{ status: 429, headers: { 'content-type': 'application/json' }, transfer: 'content_length', body: ['{"error":{"type":"rate_limit_error","message":"slow down"}}'] }] });
  const res = await createRecoveringFetch({ ...fast, maxAttempts: 2 })(`${FAULT}${path}`, { method: 'POST', body: '{}' });
  assert.equal(res.status, 429);
  assert.equal((await res.json()).error.message, 'slow down');
  assert.equal(res.recovery.outcome().outcome, 'exhausted');
  assert.equal(await count(path), 2);
});

test('transport exhaustion rejects with a TypeError carrying the report', async () => {
  const events = [];
  const rfetch = createRecoveringFetch({ ...fast, maxAttempts: 2, onEvent: (e) => events.push(e) });
  await assert.rejects(rfetch(`${process.env.RECOVERY_REFUSED_URL}/v1/chat/completions`, { method: 'POST', body: '{}' }), (e) => {
    assert.ok(e instanceof TypeError);
    assert.equal(e.outcome.outcome, 'exhausted');
    assert.equal(e.report.attempts.length, 2);
    assert.equal(e.report.attempts[0].phase, 'unknown');
    assert.ok(e.cause instanceof TypeError, 'the fetch error is the cause');
    return true;
  });
  assert.equal(terminals(events).length, 1);
});

test('a cut after commit errors the body with a RecoveryError', async () => {
  const path = `${prefix('cut')}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/happy-usage.sse', { body: [{ fixture: 'openai-chat/happy-usage.sse', end: 636 }, { text: ': x\n\n', stall: true }], ending: 'rst' })] });
  const res = await createRecoveringFetch(fast)(`${FAULT}${path}`, { method: 'POST', body: '{}' });
  const reader = res.body.getReader();
  const first = await reader.read();
  assert.ok(first.value.length > 0);
  await fetch(`${FAULT}/__fault/release?n=1`, { method: 'POST' });
  let error;
  try {
    for (;;) {
      const { done } = await reader.read();
      if (done) break;
    }
  } catch (e) {
    error = e;
  }
  assert.ok(error instanceof RecoveryError, String(error));
  assert.equal(error.outcome.outcome, 'interrupted');
  assert.equal(await count(path), 1);
});

test('aborting the signal mid-stream rejects the read with the reason and ends cancelled', async () => {
  const path = `${prefix('abort')}/v1/chat/completions`;
  await load({ [path]: [fixture('x', { body: [{ fixture: 'openai-chat/happy-usage.sse', end: 636 }, { text: 'data: [DONE]\n\n', stall: true }] })] });
  const events = [];
  const controller = new AbortController();
  const res = await createRecoveringFetch({ ...fast, onEvent: (e) => events.push(e) })(`${FAULT}${path}`, { method: 'POST', body: '{}', signal: controller.signal });
  const reader = res.body.getReader();
  await reader.read();
  const pending = reader.read().then(() => reader.read());
  controller.abort(new Error('user stop'));
  await assert.rejects(pending, /user stop/);
  assert.equal(events.at(-1).event, 'cancelled');
  assert.equal(terminals(events).length, 1);
});

test('an aborted signal rejects before any send', async () => {
  const controller = new AbortController();
  controller.abort();
  await assert.rejects(createRecoveringFetch(fast)(`${FAULT}/never`, { signal: controller.signal }), { name: 'AbortError' });
});

test('bad options are typed errors', () => {
  assert.throws(() => createRecoveringFetch({ maxAttempts: 0 }), (e) => e instanceof RangeError && e.code === 'invalid_option');
  assert.throws(() => createRecoveringFetch({ maxAtempts: 3 }), (e) => e instanceof TypeError && e.code === 'invalid_option');
  assert.throws(() => createRecoveringFetch({ onEvent: 'nope' }), TypeError);
  assert.throws(() => createRecoveringFetch({ protocol: 'smtp' }), RangeError);
});

test('a Retry-After hint is reported as state and delay_ms; the proof by its stable name', async () => {
  const path = `${prefix('retry-after')}/v1/chat/completions`;
  await load({ [path]: [
    { status: 429, headers: { 'content-type': 'application/json', 'retry-after-ms': '5' }, transfer: 'content_length', body: ['{"error":{"type":"rate_limit_error","message":"slow down"}}'] },
    fixture('openai-chat/happy-usage.sse'),
  ] });
  const res = await createRecoveringFetch(fast)(`${FAULT}${path}`, { method: 'POST', body: '{}' });
  assert.equal(await res.text(), HAPPY);
  const report = res.recovery.report();
  assert.deepEqual(report.attempts[0].retry_after, { state: 'millis', delay_ms: 5 });
  assert.deepEqual(report.attempts[1].retry_after, { state: 'absent' });
  assert.ok(report.delays[0].delay_ms >= 5, JSON.stringify(report.delays));
  assert.equal(report.delays[0].cause, 'retry_after');
  assert.deepEqual(res.recovery.outcome(), { outcome: 'completed', proof: 'strong' });
});

test('onStatus tells a UI what to show: reconnecting, then in progress, then completed', async () => {
  const path = `${prefix('status')}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/role-only-then-cut.sse', { ending: 'rst' }), fixture('openai-chat/happy-usage.sse')] });
  const statuses = [];
  const rfetch = createRecoveringFetch({ ...fast, onStatus: (s) => statuses.push(s) });
  const res = await rfetch(`${FAULT}${path}`, { method: 'POST', body: '{"stream":true}' });
  assert.equal(await res.text(), HAPPY);
  assert.deepEqual(statuses, ['reconnecting', 'in_progress', 'completed']);

  const failing = `${prefix('status-failed')}/v1/chat/completions`;
  await load({ [failing]: [{ ending: 'reset_before_head' }, { ending: 'reset_before_head' }] });
  const seen = [];
  const once = createRecoveringFetch({ ...fast, maxAttempts: 2, onStatus: (s) => seen.push(s) });
  await assert.rejects(once(`${FAULT}${failing}`, { method: 'POST', body: '{}' }), TypeError);
  assert.deepEqual(seen, ['reconnecting', 'failed']);
  assert.throws(() => createRecoveringFetch({ onStatus: 'yes' }), { code: 'invalid_option' });
});

test('the cooldown store is shared by the requests of one function, keyed by origin and model, and can be turned off', () => {
  const url = 'https://api.example/v1/chat/completions';
  const rfetch = createRecoveringFetch();
  rfetch.cooldowns.note(url, '{"model":"a"}', 5000);
  const left = rfetch.cooldowns.remaining(url, '{"model":"a","stream":true}');
  assert.ok(left > 4000 && left <= 5000, `${left}`);
  assert.equal(rfetch.cooldowns.remaining(url, '{"model":"b"}'), 0, 'another model');
  assert.equal(createRecoveringFetch().cooldowns.remaining(url, '{"model":"a"}'), 0, 'another function');
  const off = createRecoveringFetch({ cooldowns: false });
  off.cooldowns.note(url, '{"model":"a"}', 5000);
  assert.equal(off.cooldowns.remaining(url, '{"model":"a"}'), 0);
  assert.throws(() => createRecoveringFetch({ cooldowns: 'no' }), (e) => e instanceof TypeError && e.code === 'invalid_option');
  assert.throws(() => rfetch.cooldowns.note(url, '', -1), RangeError);
});

test("a caller's cooldown key shares one limit across models, for notes and for requests", async () => {
  const path = `${prefix('account')}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/happy-usage.sse')] });
  const url = `${FAULT}${path}`;
  const seen = [];
  const rfetch = createRecoveringFetch({
    ...fast,
    maxAttempts: 1,
    cooldownKey: (u, body) => { seen.push([u, body]); return 'account-1'; },
  });
  rfetch.cooldowns.note(url, '{"model":"a"}', 120000);
  assert.ok(rfetch.cooldowns.remaining(url, '{"model":"b"}') > 100000, 'one key for every model');
  // A request for model b is held by the account's cooldown: beyond the
  // Retry-After ceiling, it is refused without a send.
  await assert.rejects(rfetch(url, { method: 'POST', body: '{"model":"b","stream":true}' }), (e) => e.outcome?.outcome === 'retry_after_refused');
  assert.equal(await count(path), 0);
  assert.deepEqual(seen.at(-1), [url, '{"model":"b","stream":true}']);
  const bad = createRecoveringFetch({ cooldownKey: () => 42 });
  await assert.rejects(bad(url, { method: 'POST', body: '{}' }), (e) => e instanceof TypeError && e.code === 'invalid_option');
  assert.throws(() => createRecoveringFetch({ cooldownKey: 'x' }), (e) => e.code === 'invalid_option');
});
