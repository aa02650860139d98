// Hedging through the npm package: the shell runs the race the machine
// asks for with two fetches of its own, and a read that loses the race, or
// that a deadline interrupts, stays in flight for the next wait. Each send
// here is answered by the test (a scripted fetch that aborts as fetch
// does), on a virtual clock that moves only when the test says.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as wasm from '../../pkg/all/glue.node.mjs';
import { bind } from '../../js/shell.mjs';

const URL_ = 'https://api.example.invalid/v1/chat/completions';
const enc = new TextEncoder();
const role = (who) => `data: {"id":"${who}","choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n`;
const text = (who) => `data: {"id":"${who}","choices":[{"index":0,"delta":{"content":"from ${who}"}}]}\n\n`;
const done = (who) => `data: {"id":"${who}","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n`;

/** Lets every promise settle: a few turns of the event loop, no time. */
async function settle() {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
}

/** A platform on a virtual clock: `to(ms)` moves it, firing each timer due on the way. */
function virtual() {
  const timers = new Set();
  const p = {
    ms: 0,
    now: () => p.ms,
    wall: () => 1_000_000 + p.ms,
    random: () => 0.5,
    jitter: 0.5,
    online: () => true,
    timer(ms, fn) {
      const t = { at: p.ms + Math.max(0, ms), fn };
      timers.add(t);
      return () => timers.delete(t);
    },
    whenOnline: () => () => {},
    id: () => [0, 1],
    async to(ms) {
      for (;;) {
        const due = [...timers].filter((t) => t.at <= ms).sort((a, b) => a.at - b.at)[0];
        if (!due) break;
        timers.delete(due);
        p.ms = Math.max(p.ms, due.at);
        due.fn();
        await settle();
      }
      p.ms = ms;
      await settle();
    },
  };
  return p;
}

/**
 * A fetch whose sends the test answers: each send's URL, init and signal,
 * `head(headers)` to answer its head, `write(text)` and `end()` for its
 * body.
 * An abort rejects a head still due and errors the body, as fetch does.
 */
function scripted() {
  const sends = [];
  const fetch = (url, init) => new Promise((resolve, reject) => {
    let body;
    const stream = new ReadableStream({ start(c) { body = c; } }, { highWaterMark: 0 });
    const send = {
      url,
      init,
      signal: init.signal,
      head: (headers = {}) => resolve(new Response(stream, { status: 200, headers: { 'content-type': 'text/event-stream', ...headers } })),
      write: (t) => body.enqueue(enc.encode(t)),
      end: () => body.close(),
    };
    init.signal.addEventListener('abort', () => {
      const e = new DOMException('This operation was aborted', 'AbortError');
      reject(e);
      body.error(e);
    }, { once: true });
    sends.push(send);
  });
  return { sends, fetch };
}

/** A request hedged after 1 s, its first send streaming a role chunk, at the hedge's send. */
async function raced(extra = {}, init = {}) {
  const p = virtual();
  const s = scripted();
  const events = [];
  const rfetch = bind(wasm, p)({ hedgeAfterMs: 1000, fetch: s.fetch, onEvent: (e) => events.push(e), ...extra });
  const answer = rfetch(URL_, { method: 'POST', body: '{"model":"m","stream":true}', ...init });
  answer.catch(() => {});
  await settle();
  assert.equal(s.sends.length, 1);
  s.sends[0].head({ 'x-attempt': 'first' });
  s.sends[0].write(role('first'));
  await p.to(999);
  assert.equal(s.sends.length, 1, 'no hedge before hedgeAfterMs');
  await p.to(1000);
  assert.equal(s.sends.length, 2, 'the hedge goes out at 1 s');
  const [first, hedge] = s.sends;
  assert.ok(!first.signal.aborted && !hedge.signal.aborted);
  assert.notEqual(first.signal, hedge.signal, 'each send has its own AbortController');
  const started = events.find((e) => e.event === 'hedge_started');
  assert.deepEqual([started.hedge, started.after_ms], [2, 1000]);
  return { p, s, first, hedge, events, answer };
}

test('the first token of the first attempt wins: the hedge\'s fetch is aborted at once', async () => {
  const { p, first, hedge, events, answer } = await raced();
  let aborted = 0;
  hedge.signal.addEventListener('abort', () => { aborted += 1; });
  hedge.head();
  hedge.write(role('hedge'));
  await p.to(1100);
  assert.equal(aborted, 0, 'a role chunk wins nothing');
  first.write(text('first'));
  await settle();
  assert.equal(aborted, 1, "the losing hedge's signal fired");
  assert.ok(!first.signal.aborted);
  const res = await answer;
  assert.equal(res.headers.get('x-attempt'), 'first');
  first.write(done('first'));
  first.end();
  assert.equal(await res.text(), role('first') + text('first') + done('first'));
  const report = res.recovery.report();
  assert.deepEqual(report.attempts.map((a) => [a.role, a.result]), [['first', 'succeeded'], ['hedge', 'hedge_cancelled']]);
  assert.equal(report.attempts[1].reason, 'rival_won');
  assert.deepEqual(
    events.map((e) => e.event),
    ['attempt_started', 'hedge_started', 'attempt_started', 'committed', 'hedge_cancelled', 'attempt_succeeded', 'completed'],
  );
});

test('the first token of the hedge wins: the consumer reads the hedge\'s answer, the first is aborted', async () => {
  const { p, first, hedge, answer } = await raced();
  hedge.head({ 'x-attempt': 'hedge' });
  await p.to(1200);
  hedge.write(role('hedge'));
  hedge.write(text('hedge'));
  await settle();
  assert.ok(first.signal.aborted, "the first attempt's fetch is aborted");
  assert.ok(!hedge.signal.aborted);
  const res = await answer;
  assert.equal(res.headers.get('x-attempt'), 'hedge', "the hedge's head");
  const body = res.text();
  await settle();
  hedge.write(done('hedge'));
  hedge.end();
  assert.equal(await body, role('hedge') + text('hedge') + done('hedge'));
  assert.equal(res.recovery.outcome().outcome, 'completed');
  const report = res.recovery.report();
  assert.equal(report.committed_attempt, 2);
  assert.deepEqual(report.attempts.map((a) => [a.role, a.result]), [['first', 'hedge_cancelled'], ['hedge', 'succeeded']]);
});

test('a hedge to an alternate is written for it: its URL, its model, its headers, not the request\'s credentials', async () => {
  const alternates = [{
    label: 'alt',
    url: 'https://other.example.invalid/v1/chat/completions',
    model: 'alt-model',
    headers: { 'x-api-key': 'alt-key' },
  }];
  const controller = new AbortController();
  const init = { headers: { authorization: 'Bearer own', 'content-type': 'application/json' } };
  const { first, hedge, answer } = await raced({ alternates, signal: controller.signal }, init);
  assert.equal(new Headers(first.init.headers).get('authorization'), 'Bearer own');
  assert.equal(hedge.url, alternates[0].url);
  const headers = new Headers(hedge.init.headers);
  assert.equal(headers.get('authorization'), null, 'credentials stay on their origin');
  assert.equal(headers.get('x-api-key'), 'alt-key');
  assert.equal(headers.get('content-type'), 'application/json');
  assert.equal(new TextDecoder().decode(hedge.init.body), '{"model":"alt-model","stream":true}');
  controller.abort();
  await assert.rejects(answer, { name: 'AbortError' });
});

test('a cancellation during a race aborts both fetches and rejects like fetch', async () => {
  const controller = new AbortController();
  const { first, hedge, answer } = await raced({ signal: controller.signal });
  hedge.head();
  await settle();
  controller.abort();
  await settle();
  assert.ok(first.signal.aborted, 'the first attempt is aborted');
  assert.ok(hedge.signal.aborted, 'the hedge is aborted');
  await assert.rejects(answer, { name: 'AbortError' });
});

test('a read in flight when a deadline passes keeps its chunk: a stall-watch check mid-read loses nothing', async () => {
  const p = virtual();
  const s = scripted();
  const res = bind(wasm, p)({ fetch: s.fetch })(URL_, { method: 'POST', body: '{}' });
  await settle();
  s.sends[0].head();
  s.sends[0].write(text('a'));
  const body = (await res).text();
  await settle();
  // The idle watchdog (300 s) checks every 18.75 s after a chunk: the
  // check passes while the next read waits.
  await p.to(30_000);
  s.sends[0].write(text('b'));
  s.sends[0].write(done('b'));
  s.sends[0].end();
  assert.equal(await body, text('a') + text('b') + done('b'));
});
