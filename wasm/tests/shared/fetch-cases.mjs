// The package against the loopback servers, written once for every
// runtime: Node (tests/node/fetch.test.mjs), a Chromium page and a module
// worker (tests/node/browser.test.mjs). Each case takes the harness `t`:
//   t.create      createRecoveringFetch of the runtime's entry
//   t.bind        the shell's bind, t.wasm the module (to inject a platform)
//   t.platform    the shell's default platform
//   t.FAULT, t.PLAIN, t.REFUSED   the servers' origins
//   t.HAPPY, t.ANTHROPIC_HAPPY     fixture texts
//   t.browser     whether CORS applies
// and throws on a mismatch.

const fast = { backoffBaseMs: 1, backoffCeilingMs: 2 };
const ROLE_ONLY_CUT = 'openai-chat/role-only-then-cut.sse';
const sse = (body, extra = {}) => ({ headers: { 'content-type': 'text/event-stream' }, body, ...extra });
const happy = () => sse([{ fixture: 'openai-chat/happy-usage.sse' }]);

function check(cond, message) {
  if (!cond) throw new Error(message);
}

function equal(actual, expected, what) {
  const a = JSON.stringify(actual);
  const e = JSON.stringify(expected);
  if (a !== e) throw new Error(`${what}: expected ${e}, got ${a}`);
}

function path(name) {
  const id = Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) => b.toString(16).padStart(2, '0')).join('');
  return `/wasm/${id}/${name}/v1/chat/completions`;
}

async function control(t, method, tail, body) {
  const res = await fetch(`${t.FAULT}/__fault/${tail}`, { method, body });
  return res.json().catch(() => null);
}

const load = (t, paths) => control(t, 'POST', 'script?merge', JSON.stringify({ paths }));
const count = async (t, p) => (await control(t, 'GET', 'count')).paths[p] ?? 0;
const counters = (t) => control(t, 'GET', 'count');
/** Releases the stall the server entered after `before` stalls, once it has. */
async function release(t, before) {
  await control(t, 'GET', `wait?stalls=${before + 1}`);
  await control(t, 'POST', 'release');
}

/** A request with every event recorded. */
function run(t, options, url, extra = {}) {
  const events = [];
  const rfetch = (extra.create ?? t.create)({
    ...fast,
    ...options,
    onEvent: (e) => {
      events.push(e);
      extra.onEvent?.(e);
    },
  });
  const names = () => events.map((e) => e.event);
  const event = (name) => {
    const e = events.find((x) => x.event === name);
    check(e, `no ${name} event in ${names()}`);
    return e;
  };
  const oneTerminal = () => {
    const terminal = names().filter((n) => ['completed', 'exhausted', 'interrupted', 'cancelled'].includes(n));
    equal(terminal.length, 1, `terminal events in ${names()}`);
    equal(names().at(-1), terminal[0], 'the terminal event comes last');
  };
  return { rfetch, events, names, event, oneTerminal, url };
}

async function text(res) {
  return new TextDecoder().decode(new Uint8Array(await res.arrayBuffer()));
}

/** Reads a body to its end: the text and the error it ended with, if any. */
async function drain(res) {
  const reader = res.body.getReader();
  const parts = [];
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      parts.push(value);
    }
  } catch (error) {
    return { text: new TextDecoder().decode(concat(parts)), error };
  }
  return { text: new TextDecoder().decode(concat(parts)), error: null };
}

function concat(parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const post = { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"stream":true}' };

export const cases = {
  async happy_stream_completes_with_one_send(t) {
    const p = path('happy');
    await load(t, { [p]: [happy()] });
    const r = run(t, {}, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(res.status, 200, 'status');
    equal(await text(res), t.HAPPY, 'body');
    equal(res.recovery.outcome().outcome, 'completed', 'outcome');
    equal(r.names(), ['attempt_started', 'committed', 'attempt_succeeded', 'completed'], 'events');
    r.oneTerminal();
    equal(await count(t, p), 1, 'sends');
    const started = r.event('attempt_started');
    for (const key of ['logical_id', 'attempt_id', 'wire_attempt', 'at_ms', 'event', 'max_attempts', 'resume']) {
      check(key in started, `attempt_started.${key}`);
    }
    const report = res.recovery.report();
    equal(report.committed_attempt, 1, 'committed attempt');
    equal(report.attempts[0].progress.delivered_bytes, new TextEncoder().encode(t.HAPPY).length, 'delivered bytes');
  },

  async reset_before_the_first_token_is_replayed_invisibly(t) {
    const p = path('reset-before-token');
    await load(t, { [p]: [sse([{ fixture: ROLE_ONLY_CUT }], { ending: 'rst' }), happy()] });
    const r = run(t, {}, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(await text(res), t.HAPPY, 'nothing of the failed attempt reached the consumer');
    equal(r.names(), ['attempt_started', 'attempt_failed', 'delay_scheduled', 'retry_started', 'attempt_started',
      'committed', 'attempt_succeeded', 'completed'], 'events');
    equal(r.event('attempt_failed').category, 'transport', 'category');
    equal(r.event('attempt_failed').phase, 'streaming', 'phase');
    r.oneTerminal();
    equal(await count(t, p), 2, 'sends');
  },

  async cut_after_commit_ends_with_a_typed_interruption(t) {
    const p = path('cut-after-commit');
    // Cut only once the client committed: stall, release, then RST.
    const cut = sse([{ fixture: 'openai-chat/happy-usage.sse', end: 636 }, { text: ': tail\n\n', stall: true }], { ending: 'rst' });
    await load(t, { [p]: [cut, happy()] });
    const before = (await counters(t)).stalls_entered;
    const r = run(t, {}, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    await release(t, before);
    const { text: got, error } = await drain(res);
    check(error, 'the body fails after commit');
    check(got.length >= 636 && t.HAPPY.startsWith(got.slice(0, 636)), `delivered ${got.length} bytes`);
    equal(error.name, 'RecoveryError', 'error');
    equal(error.outcome.outcome, 'interrupted', 'outcome');
    check(error.message.startsWith('recovery failed'), error.message);
    equal(r.event('attempt_failed').phase, 'streaming', 'phase');
    equal(r.event('attempt_failed').reason, 'semantic_output', 'reason');
    r.oneTerminal();
    equal(await count(t, p), 1, 'no replay after semantic output');
  },

  async refused_connection_is_a_transport_failure_in_an_unknown_phase(t) {
    const r = run(t, { maxAttempts: 2 }, `${t.REFUSED}/v1/chat/completions`);
    let error;
    try {
      await r.rfetch(r.url, post);
    } catch (e) {
      error = e;
    }
    check(error instanceof TypeError, `a TypeError: ${error}`);
    equal(error.outcome.outcome, 'exhausted', 'outcome');
    equal(error.outcome.attempts, 2, 'attempts');
    check(typeof error.cause === 'object' && error.cause !== null, 'the JS error is kept as the cause');
    equal(error.report.attempts.length, 2, 'attempts in the report');
    for (const a of error.report.attempts) {
      equal([a.category, a.phase], ['transport', 'unknown'], 'attempt');
    }
    r.oneTerminal();
    equal(r.names().at(-1), 'exhausted', 'last event');
  },

  async retryable_status_then_happy_waits_at_least_the_hint(t) {
    const p = path('status-then-happy');
    const busy = { status: 503, headers: { 'content-type': 'application/json', 'retry-after-ms': '15',
      'x-ratelimit-remaining-requests': '0', 'x-ratelimit-reset-requests': '6m0s' }, transfer: 'content_length',
      body: ['{"error":{"type":"server_error","message":"busy"}}'] };
    await load(t, { [p]: [busy, happy()] });
    const r = run(t, {}, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(await text(res), t.HAPPY, 'body');
    check(r.event('delay_scheduled').delay_ms >= 15, 'the hint is a floor');
    equal(r.event('delay_scheduled').cause, 'retry_after', 'cause');
    equal(r.event('attempt_failed').status, 503, 'status');
    equal(res.recovery.report().attempts[0].retry_after.state, 'millis', 'hint');
    equal(res.recovery.report().attempts[0].rate_limits, { requests_remaining: 0, requests_reset: '6m0s' }, 'rate limits');
    r.oneTerminal();
    equal(await count(t, p), 2, 'sends');
  },

  async final_http_error_is_returned_as_that_response(t) {
    const p = path('final-503');
    const busy = { status: 503, headers: { 'content-type': 'application/json' }, transfer: 'content_length',
      body: ['{"error":{"type":"server_error","message":"still busy"}}'] };
    await load(t, { [p]: [busy] });
    const r = run(t, { maxAttempts: 2 }, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(res.status, 503, 'status');
    check((await text(res)).includes('still busy'), 'the body is untouched');
    equal(res.recovery.outcome().outcome, 'exhausted', 'outcome');
    r.oneTerminal();
    equal(await count(t, p), 2, 'sends');
  },

  async a_storm_is_bounded_by_the_default_retry_budget(t) {
    // 50 concurrent requests through one function, every answer 503: the
    // default budget allows 20 % of the requests plus its reserve of 10
    // retries; without it every request sends three times.
    const N = 50;
    const busy = { status: 503, headers: { 'content-type': 'application/json' }, transfer: 'content_length',
      body: ['{"error":{"type":"server_error","message":"busy"}}'] };
    for (const [budget, want] of [[undefined, N + N / 5 + 10], [null, 3 * N]]) {
      const p = path(`storm-${budget === null ? 'off' : 'on'}`);
      await load(t, { [p]: [busy] });
      const rfetch = t.create({ ...fast, retryBudget: budget });
      const ends = await Promise.all(Array.from({ length: N }, () =>
        rfetch(`${t.FAULT}${p}`, post).then(
          async (res) => { await res.arrayBuffer(); return res.recovery.outcome().outcome; },
          (e) => e.outcome?.outcome ?? String(e))));
      equal(await count(t, p), want, `sends with retryBudget ${budget}`);
      check(ends.every((o) => o === 'exhausted' || o === 'budget_exhausted'), `outcomes ${[...new Set(ends)]}`);
      if (budget === undefined) check(ends.includes('budget_exhausted'), 'some requests hit the budget');
    }
  },

  async a_learned_retry_after_holds_the_other_requests(t) {
    // One request learns `retry-after-ms: 1500` from a 429; ten more
    // through the same function start while it is in force: the server
    // sees none of them until it ends, then every request completes.
    const p = path('cooldown');
    const limited = { status: 429, headers: { 'content-type': 'application/json', 'retry-after-ms': '1500' },
      transfer: 'content_length', body: ['{}'] };
    await load(t, { [p]: [limited, happy()] });
    const causes = [];
    const rfetch = t.create({ onEvent: (e) => { if (e.event === 'delay_scheduled') causes.push(e.cause); } });
    const one = () => rfetch(`${t.FAULT}${p}`, post).then((res) => text(res));
    const first = one();
    while ((await count(t, p)) === 0) await new Promise((r) => setTimeout(r, 5));
    await new Promise((r) => setTimeout(r, 100));
    const learned = Date.now();
    const others = Array.from({ length: 10 }, one);
    await new Promise((r) => setTimeout(r, 800));
    check(Date.now() - learned < 1300, 'the window is still open');
    equal(await count(t, p), 1, 'sends while the cooldown is in force');
    for (const body of await Promise.all([first, ...others])) check(body === t.HAPPY, 'every answer whole');
    equal(await count(t, p), 12, 'sends in all');
    equal(causes.filter((c) => c === 'cooldown').length, 10, `waits ${causes}`);
  },

  async permanent_status_is_never_retried(t) {
    const p = path('permanent-400');
    const bad = { status: 400, headers: { 'content-type': 'application/json', 'retry-after': '1' }, transfer: 'content_length',
      body: ['{"error":{"type":"invalid_request_error","message":"no"}}'] };
    await load(t, { [p]: [bad, happy()] });
    const r = run(t, {}, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(res.status, 400, 'status');
    equal(res.recovery.outcome().outcome, 'permanent', 'outcome');
    r.oneTerminal();
    equal(await count(t, p), 1, 'sends');
  },

  async redirect_is_never_followed(t) {
    // `redirect: "manual"`: Node hands back the 307 itself, browsers an
    // opaqueredirect with status 0; either way a permanent outcome after one
    // send and nothing sent to the Location.
    const p = path('redirect');
    const target = path('redirect-target');
    await load(t, {
      [p]: [{ status: 307, headers: { location: `${t.FAULT}${target}` }, transfer: 'content_length', body: [] }],
      [target]: [happy()],
    });
    const r = run(t, {}, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    if (t.browser) {
      equal([res.type, res.status], ['opaqueredirect', 0], 'opaque redirect');
    } else {
      equal(res.status, 307, 'status');
    }
    equal(res.recovery.outcome().outcome, 'permanent', 'outcome');
    equal(res.recovery.outcome().cause, 'redirect', 'cause');
    r.oneTerminal();
    equal(await count(t, p), 1, 'sends');
    equal(await count(t, target), 0, 'the Location was never requested');
  },

  async overloaded_error_in_stream_before_commit_is_replayed(t) {
    const p = path('anthropic-overloaded').replace('/v1/chat/completions', '/v1/messages');
    await load(t, { [p]: [sse([{ fixture: 'anthropic/error-first.sse' }]), sse([{ fixture: 'anthropic/happy.sse' }])] });
    const r = run(t, { protocol: 'auto' }, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(res.recovery.protocol, 'anthropic', 'protocol from the URL');
    equal(await text(res), t.ANTHROPIC_HAPPY, 'body');
    equal(r.event('attempt_failed').category, 'provider_response', 'category');
    equal(res.recovery.outcome().outcome, 'completed', 'outcome');
    r.oneTerminal();
    equal(await count(t, p), 2, 'sends');
  },

  async permanent_error_in_stream_before_commit_is_the_answer(t) {
    // The provider's own stream through its error event, then the typed
    // error: an SDK reading the body raises the provider's error. The
    // message is core's text, word for word (tower-layer's
    // `a_permanent_stream_error_before_output_is_the_answer` checks the same).
    const p = path('anthropic-permanent').replace('/v1/chat/completions', '/v1/messages');
    const start = 'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":{"input_tokens":5,"output_tokens":0}}}\n\n';
    const error = 'event: error\ndata: {"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: must be at least 1"}}\n\n';
    await load(t, { [p]: [sse([start + error]), happy()] });
    const r = run(t, { protocol: 'anthropic' }, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(res.status, 200, 'the provider\'s status');
    const got = await drain(res);
    equal(got.text, start + error, 'the provider\'s stream through its error event');
    check(got.error, 'then the body fails');
    equal(got.error.message, 'recovery failed: permanent failure (provider error invalid_request_error) (1 attempt(s), last status 200)', 'message');
    equal(res.recovery.outcome().outcome, 'permanent', 'outcome');
    r.oneTerminal();
    equal(await count(t, p), 1, 'never resent');
  },

  async holdback_cap_commits_early_and_forbids_replay(t) {
    const p = path('holdback-cap');
    const cut = sse([': pad pad pad pad pad pad pad pad pad pad pad pad\n\n', { text: ': more\n\n', stall: true }], { ending: 'rst' });
    await load(t, { [p]: [cut, happy()] });
    const before = (await counters(t)).stalls_entered;
    const r = run(t, { holdbackCap: 16 }, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    await release(t, before);
    equal(r.event('committed').trigger, 'holdback_cap', 'trigger');
    const { error } = await drain(res);
    check(error, 'the body fails');
    equal(res.recovery.outcome().outcome, 'interrupted', 'outcome');
    r.oneTerminal();
    equal(await count(t, p), 1, 'sends');
  },

  async head_timeout_fires_and_the_retry_succeeds(t) {
    const p = path('head-timeout');
    await load(t, { [p]: [{ ending: 'never_answer' }, happy()] });
    const r = run(t, { headTimeoutMs: 60 }, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    equal(await text(res), t.HAPPY, 'body');
    equal(r.event('attempt_failed').category, 'client_timeout', 'category');
    equal(r.event('attempt_failed').phase, 'awaiting_headers', 'phase');
    r.oneTerminal();
    equal(await count(t, p), 2, 'sends');
  },

  async consumer_cancel_mid_stream_aborts_the_fetch(t) {
    const p = path('cancel-stream');
    const stalled = sse([{ fixture: 'openai-chat/happy-usage.sse', end: 636 }, { text: 'data: [DONE]\n\n', stall: true }]);
    await load(t, { [p]: [stalled] });
    const before = (await counters(t)).stalls_entered;
    const r = run(t, {}, `${t.FAULT}${p}`);
    const res = await r.rfetch(r.url, post);
    await control(t, 'GET', `wait?stalls=${before + 1}`);
    const reader = res.body.getReader();
    const first = await reader.read();
    check(first.value instanceof Uint8Array, 'a first chunk');
    await reader.cancel();
    equal(res.recovery.outcome().outcome, 'cancelled', 'outcome');
    r.oneTerminal();
    await noStalls(t);
  },

  async cancel_while_awaiting_the_head(t) {
    const p = path('cancel-head');
    await load(t, { [p]: [{ ending: 'never_answer' }] });
    const before = (await counters(t)).stalls_entered;
    const controller = new AbortController();
    const r = run(t, { signal: controller.signal }, `${t.FAULT}${p}`);
    const pending = r.rfetch(r.url, post);
    // Cancel once the server holds the request (a server-side fact).
    await control(t, 'GET', `wait?stalls=${before + 1}`);
    controller.abort();
    let error;
    try {
      await pending;
    } catch (e) {
      error = e;
    }
    equal(error?.name, 'AbortError', 'rejects with the abort reason');
    equal(r.event('cancelled').phase, 'awaiting_head', 'phase');
    r.oneTerminal();
    await noStalls(t);
  },

  async cancel_during_backoff_wins_at_once(t) {
    const p = path('cancel-backoff');
    await load(t, { [p]: [{ status: 429, headers: { 'retry-after': '30' }, transfer: 'content_length', body: [] }, happy()] });
    const controller = new AbortController();
    const r = run(t, { signal: controller.signal }, `${t.FAULT}${p}`, {
      onEvent: (e) => { if (e.event === 'delay_scheduled') controller.abort(); },
    });
    const t0 = performance.now();
    let error;
    try {
      await r.rfetch(r.url, post);
    } catch (e) {
      error = e;
    }
    check(error, 'cancelled');
    check(performance.now() - t0 < 10000, 'at once, not after the 30 s hint');
    equal(r.event('cancelled').phase, 'waiting', 'phase');
    r.oneTerminal();
    equal(await count(t, p), 1, 'sends');
  },

  async clocks_timers_and_jitter_are_the_platforms(t) {
    const p = t.platform;
    const a = p.now();
    check(p.now() >= a, 'monotonic');
    check(p.wall() > 1.6e12, 'wall clock');
    check(p.random() !== p.random(), 'jitter is fresh per draw');
    const [x, y] = [p.id(), p.id()];
    check(x[0] !== y[0] || x[1] !== y[1], 'ids differ');
    // A delay beyond setTimeout's range is clamped, never passed through
    // (it would fire at once).
    let fired = false;
    const cancel = p.timer(2 ** 60, () => { fired = true; });
    await new Promise((resolve) => setTimeout(resolve, 20));
    cancel();
    check(!fired, 'an out-of-range delay fired early');
  },

  async offline_parks_until_the_online_event(t) {
    const p = path('offline');
    await load(t, { [p]: [{ status: 503, transfer: 'content_length', body: [] }, happy()] });
    let online = false;
    let listener = null;
    const create = t.bind(t.wasm, {
      ...t.platform,
      online: () => online,
      whenOnline(fn) {
        listener = fn;
        return () => { listener = null; };
      },
    });
    const r = run(t, {}, `${t.FAULT}${p}`, {
      create,
      onEvent: (e) => {
        if (e.event === 'parked_offline') {
          setTimeout(() => { online = true; listener?.(); }, 20);
        }
      },
    });
    const res = await r.rfetch(r.url, post);
    equal(await text(res), t.HAPPY, 'body');
    const names = r.names();
    check(names.indexOf('parked_offline') >= 0 && names.indexOf('parked_offline') < names.indexOf('retry_started'), `${names}`);
    r.oneTerminal();
    equal(await count(t, p), 2, 'sends');
    if (t.browser) equal(t.platform.online(), navigator.onLine, 'the platform reads navigator.onLine');
  },

  async re_split_chunks_give_the_same_observation(t) {
    const whole = path('split-whole');
    const split = path('split-bytes');
    const offsets = [];
    for (let i = 1; i < new TextEncoder().encode(t.HAPPY).length; i += 7) offsets.push(i);
    await load(t, { [whole]: [happy()], [split]: [sse([{ fixture: 'openai-chat/happy-usage.sse', split_at: offsets }])] });
    const seen = [];
    for (const p of [whole, split]) {
      const r = run(t, {}, `${t.FAULT}${p}`);
      const res = await r.rfetch(r.url, post);
      equal(await text(res), t.HAPPY, 'body');
      equal(res.recovery.outcome().outcome, 'completed', 'outcome');
      const g = res.recovery.report().attempts[0].progress;
      seen.push(['frames', 'keepalives', 'observed_content', 'delivered_content', 'delivered_bytes'].map((k) => g[k]));
    }
    equal(seen[0], seen[1], 'the same observation');
  },

  async missing_cors_header_looks_like_a_network_failure(t) {
    // In a browser a cross-origin answer without ACAO makes fetch reject with
    // a bare TypeError: a transport failure, retried, then exhausted. Node
    // has no CORS, so there the same server simply answers.
    const r = run(t, { maxAttempts: 2 }, `${t.PLAIN}/nocors/${Math.random().toString(16).slice(2)}`);
    if (t.browser) {
      let error;
      try {
        await r.rfetch(r.url, post);
      } catch (e) {
        error = e;
      }
      equal(error?.outcome?.outcome, 'exhausted', 'outcome');
      equal(error.cause?.name, 'TypeError', 'cause');
      equal([r.event('attempt_failed').category, r.event('attempt_failed').phase], ['transport', 'unknown'], 'failure');
    } else {
      const res = await r.rfetch(r.url, post);
      equal(await text(res), t.HAPPY, 'body');
    }
    r.oneTerminal();
  },

  async unexposed_retry_after_is_invisible_cross_origin(t) {
    // A hint not listed in Access-Control-Expose-Headers is absent for the
    // driver in a browser (policy backoff instead); Node sees it.
    const r = run(t, {}, `${t.PLAIN}/noexpose/${Math.random().toString(16).slice(2)}`);
    const res = await r.rfetch(r.url, post);
    equal(await text(res), t.HAPPY, 'body');
    const state = res.recovery.report().attempts[0].retry_after.state;
    const cause = r.event('delay_scheduled').cause;
    equal([state, cause], t.browser ? ['absent', 'backoff'] : ['millis', 'retry_after'], 'hint');
    r.oneTerminal();
  },

  async bad_options_are_typed_errors(t) {
    const refused = (options) => {
      try {
        t.create(options);
      } catch (e) {
        return e;
      }
      throw new Error(`accepted ${JSON.stringify(options)}`);
    };
    let e = refused({ maxAttempts: 0 });
    check(e instanceof RangeError && e.code === 'invalid_option', `${e}`);
    e = refused({ maxAtempts: 3 });
    check(e instanceof TypeError && e.code === 'invalid_option', `${e}`);
    check(e.message.includes('maxAtempts'), e.message);
    e = refused({ retryableStatuses: [401] });
    check(e instanceof RangeError && e.message === 'invalid recovery policy: status 401 cannot be made retryable', e.message);
  },

  async a_throwing_fetch_is_a_transport_failure(t) {
    const r = run(t, { maxAttempts: 2, fetch: () => { throw new TypeError('boom'); } }, 'http://127.0.0.1:9/x');
    let error;
    try {
      await r.rfetch(r.url, post);
    } catch (e) {
      error = e;
    }
    equal(error?.outcome?.outcome, 'exhausted', 'outcome');
    r.oneTerminal();
  },
};

async function noStalls(t) {
  for (let i = 0; i < 200; i++) {
    if ((await counters(t)).stalls_waiting === 0) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error('the server never saw the disconnect');
}

/** Runs every case; resolves `[{ name, error }]` (`error` null when it passed). */
export async function runAll(t) {
  const results = [];
  for (const [name, fn] of Object.entries(cases)) {
    try {
      await fn(t);
      results.push({ name, error: null });
    } catch (e) {
      results.push({ name, error: `${e && e.stack ? e.stack : e}` });
    }
  }
  return results;
}
