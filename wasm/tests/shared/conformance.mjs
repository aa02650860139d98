// The shared conformance vectors through the npm package, on a virtual
// clock, for every runtime (Node: tests/node/conformance.test.mjs; a
// Chromium page and a module worker: tests/node/browser.test.mjs).
//
// The vectors come prepared by `conformance-js prepare` (the one Rust
// translation of each vector into the sends played byte for byte, its npm
// options and its hooks); what a run observed goes back to `conformance-js
// check`, which holds the vectors' expectations. Each send is played by a
// scripted `fetch`; the shell runs on a virtual platform whose clock moves
// only when nothing else can happen, with every jitter draw pinned to the
// vector's value.

const ORIGIN = 'http://vector.invalid';
const enc = new TextEncoder();

/** Timers on a virtual clock. */
class Clock {
  constructor() {
    this.now = 0;
    this.timers = new Map();
    this.next = 1;
  }

  timer(ms, fn) {
    const id = this.next++;
    this.timers.set(id, { at: this.now + Math.max(0, ms), fn });
    return () => this.timers.delete(id);
  }

  sleep(ms) {
    return new Promise((resolve) => this.timer(ms, resolve));
  }

  /** Moves to the earliest timer and fires every timer due; false when none. */
  advance() {
    if (this.timers.size === 0) return false;
    const at = Math.min(...[...this.timers.values()].map((t) => t.at));
    this.now = Math.max(this.now, at);
    for (const [id, t] of [...this.timers]) {
      if (t.at <= this.now) {
        this.timers.delete(id);
        t.fn();
      }
    }
    return true;
  }
}

/** One macrotask (a MessageChannel message: no timer clamping). */
function tick() {
  return new Promise((resolve) => {
    const channel = new MessageChannel();
    channel.port1.onmessage = () => {
      channel.port1.close();
      resolve();
    };
    channel.port2.postMessage(0);
  });
}

/**
 * A `fetch` that plays `played`, one per send in send order (a hedge's
 * included), the last one repeated. Each send is timed from the moment it
 * is made on the virtual clock: its head `head_at_ms` later, each chunk
 * at its `chunks_at_ms`, the end right after the last chunk. An aborted
 * send behaves as fetch's: a head still due rejects, a body being read
 * errors, with an `AbortError`.
 */
function stubFetch(played, hooks) {
  const stub = { sends: 0, requests: [], bodies: [] };
  stub.fetch = (url, init) => {
    const p = played[Math.min(stub.sends, played.length - 1)];
    stub.sends += 1;
    const sentAt = hooks.now();
    const u = new URL(url);
    const headers = new Headers(init && init.headers);
    const id = headers.get('last-event-id');
    const key = headers.get('idempotency-key');
    stub.requests.push(`${(init && init.method) || 'GET'} ${u.pathname}${u.search}` + (id === null ? '' : ` last-event-id=${id}`)
      + (key === null ? '' : ` idempotency-key=${key}`));
    const sent = init && init.body;
    stub.bodies.push(sent == null ? '' : typeof sent === 'string' ? sent : new TextDecoder().decode(sent));
    const signal = init && init.signal;
    const aborted = () => new DOMException('aborted', 'AbortError');
    if (p.head.kind === 'fails') {
      if (p.offline) hooks.offline();
      return Promise.reject(new TypeError('fetch failed'));
    }
    if (p.head.kind === 'never') {
      if (p.offline) hooks.offline();
      if (p.cancel_awaiting) hooks.cancelNow();
      return new Promise((_, reject) => {
        if (signal) signal.addEventListener('abort', () => reject(aborted()));
      });
    }
    // Resolves `ms` after the send on the virtual clock (at once when that
    // has passed: no timer), or rejects when the send is aborted first.
    const until = (ms) => {
      if (signal && signal.aborted) return Promise.reject(aborted());
      const left = sentAt + ms - hooks.now();
      if (left <= 0) return null;
      return new Promise((resolve, reject) => {
        const onAbort = () => {
          stop();
          reject(aborted());
        };
        const stop = hooks.timer(left, () => {
          if (signal) signal.removeEventListener('abort', onAbort);
          resolve();
        });
        if (signal) signal.addEventListener('abort', onAbort, { once: true });
      });
    };
    const chunks = p.chunks.slice();
    const times = p.chunks_at_ms.slice();
    const keepalives = p.keepalive_every_ms;
    let body;
    const stream = new ReadableStream({
      start(c) {
        body = c;
      },
      async pull(c) {
        if (chunks.length > 0) {
          const due = until(times.shift());
          if (due) {
            try {
              await due;
            } catch (e) {
              c.error(e);
              return undefined;
            }
          }
          c.enqueue(enc.encode(chunks.shift()));
          return undefined;
        }
        if (keepalives) {
          await hooks.sleep(keepalives);
          c.enqueue(enc.encode(': keepalive\n\n'));
          return undefined;
        }
        if (p.offline) hooks.offline();
        switch (p.end) {
          case 'eof': c.close(); return undefined;
          case 'reset': c.error(new TypeError('network error')); return undefined;
          case 'consumer_drop': case 'consumer_cancel': hooks.stop(); return new Promise(() => {});
          default: return new Promise(() => {});
        }
      },
    }, { highWaterMark: 0 });
    // An abort errors the body, as fetch's does.
    if (signal) signal.addEventListener('abort', () => body.error(aborted()), { once: true });
    const status = p.head.status;
    const hs = new Headers();
    for (const [k, v] of p.head.headers) hs.append(k, v);
    const nullBody = status === 204 || status === 304;
    const response = () => new Response(nullBody ? null : stream, { status, headers: hs });
    const head = until(p.head_at_ms);
    return head ? head.then(response) : Promise.resolve(response());
  };
  return stub;
}

/**
 * Runs one prepared vector through `bind(wasm, platform)`; resolves what it
 * observed: `{ name, events, sends, delivered, requests, cooldownLeftMs,
 * report }`.
 */
export async function runVector(bind, wasm, v) {
  const clock = new Clock();
  let online = true;
  let cancelNow = false;
  let stop = false;
  let handle = null;
  const hooks = {
    now: () => clock.now,
    timer: (ms, fn) => clock.timer(ms, fn),
    sleep: (ms) => clock.sleep(ms),
    offline: () => { online = false; },
    stop: () => { stop = true; },
    cancelNow: () => { cancelNow = true; },
  };
  const stub = stubFetch(v.played, hooks);
  const platform = {
    now: () => clock.now,
    wall: () => v.wallOriginMs + clock.now,
    random: () => v.jitter,
    jitter: v.jitter,
    online: () => online,
    timer: (ms, fn) => clock.timer(ms, fn),
    whenOnline: () => () => {},
    id: () => [0, 1],
    started: (h) => { handle = h; },
  };
  const events = [];
  let waits = 0;
  const controller = new AbortController();
  const options = {
    ...v.options,
    fetch: stub.fetch,
    signal: controller.signal,
    onEvent: (e) => {
      if (e.event === 'delay_scheduled') {
        const c = v.cancelDuringWait;
        if (c && c.wait === waits) clock.timer(c.after_ms, () => { cancelNow = true; });
        waits += 1;
      }
      events.push(e.event);
    },
  };
  if (v.admission) {
    const answers = v.admission.slice();
    options.admission = () => {
      const answer = answers.shift();
      switch (answer) {
        case 'allow': return 'allow';
        case 'reject': return 'reject';
        // Anything else is unresolved to the machine.
        case 'unresolved': return 'maybe';
        case 'never': return new Promise(() => {});
        case 'cancel':
          cancelNow = true;
          return new Promise(() => {});
        default: throw new Error(`unknown admission answer ${answer}`);
      }
    };
  }
  if (v.continuation) {
    const c = v.continuation;
    options.continuation = () => ({ url: `${ORIGIN}${c.path}`, method: c.method, body: c.body });
  }
  const rfetch = bind(wasm, platform)(options);
  const request = v.request;
  const url = `${ORIGIN}${request.path}`;
  const init = { method: request.method };
  if (request.body !== '' && request.method !== 'GET') init.body = request.body;
  // A cooldown another request learned, in force as this one starts.
  if (v.cooldownMs != null) rfetch.cooldowns.note(url, init.body, v.cooldownMs);

  // The consumer: reads the answer's body to its end, or stops (cancels
  // its read) once the played body has nothing more for it.
  let done = false;
  let reader = null;
  const delivered = [];
  (async () => {
    try {
      const res = await rfetch(url, init);
      // Whatever answer came is read: a committed one, a final HTTP error,
      // or a final in-stream error as the provider streamed it.
      if (res.body) {
        reader = res.body.getReader();
        for (;;) {
          const { done: end, value } = await reader.read();
          if (end) break;
          for (const b of value) delivered.push(b);
        }
      }
    } catch {
      // the report says how it ended
    } finally {
      done = true;
    }
  })();

  // Settle every promise, let the caller act, then move the virtual clock
  // to the next timer; a run with none of these to do is stuck.
  let idle = 0;
  for (let i = 0; i < 20000 && !done; i++) {
    await tick();
    if (done) break;
    if (cancelNow) {
      cancelNow = false;
      controller.abort();
      idle = 0;
      continue;
    }
    if (stop) {
      stop = false;
      if (reader) reader.cancel().catch(() => {});
      else controller.abort();
      idle = 0;
      continue;
    }
    if (++idle < 20) continue;
    idle = 0;
    if (clock.advance()) continue;
    throw new Error(`${v.name}: stuck with no timer and nothing to do`);
  }
  if (!done) throw new Error(`${v.name}: did not end`);
  return {
    name: v.name,
    events,
    sends: stub.sends,
    delivered,
    requests: stub.requests,
    bodies: stub.bodies,
    cooldownLeftMs: rfetch.cooldowns.remaining(url, init.body),
    report: handle ? handle.report() : null,
  };
}

/** Runs every vector `fetch` can express; resolves `{ observed, skipped, errors }`. */
export async function runAll(bind, wasm, prepared) {
  const observed = [];
  const skipped = [];
  const errors = [];
  for (const v of prepared) {
    if (v.skip) {
      skipped.push({ name: v.name, reason: v.skip });
      continue;
    }
    try {
      observed.push(await runVector(bind, wasm, v));
    } catch (e) {
      errors.push(`${e && e.stack ? e.stack : e}`);
    }
  }
  return { observed, skipped, errors };
}
