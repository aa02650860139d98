// The JavaScript shell of recovery-wasm: everything that touches the
// platform. The wasm module (a `Machine` per logical request) decides every
// step from plain values; this shell does what it answers with `fetch`,
// `ReadableStream`, `AbortController`, timers and `navigator.onLine`, checks
// the options and writes the texts of errors. Each entry point instantiates
// its wasm module its own way and calls `bind` with it.

// Action codes and flags of the machine (wasm/src/machine.rs).
const SEND = 1;
const AWAIT_HEAD = 2;
const READ = 3;
const RELEASE = 4;
const RESPOND = 5;
const RESPOND_ERROR = 6;
const DELIVER = 7;
const SLEEP = 8;
const WAIT_ONLINE = 9;
const ASK_ADMISSION = 10;
const AWAIT_ADMISSION = 11;
const ASK_CONTINUATION = 12;
const END_OK = 13;
const END_ERR = 14;
const HEDGE = 15;
const RACE = 16;
const RELEASE_HEDGE = 17;
const PROMOTE = 18;
const DELIVER_THIS = 0x100;
const EVENTS = 0x200;
const DEADLINE = 0x400;
// The role of an attempt's inputs: the request's attempt, or the hedge racing it.
const FIRST = 0;
const HEDGED = 1;

// Headers that describe a request body, dropped with it on a resume.
const BODY_HEADERS = ['content-type', 'content-length', 'transfer-encoding'];
const NO_BODIES = [new Uint8Array(0), new Int32Array(0)];
// Browsers store a timer's delay as a signed 32-bit integer.
const MAX_TIMER_MS = 2 ** 31 - 1;

const reports = new WeakMap();

/**
 * A logical request that failed after its response was handed out: the
 * stitched body errors with this. `outcome` and `report` have the Rust
 * serde shapes.
 */
export class RecoveryError extends Error {
  constructor(failure) {
    super(failure.message, failure.cause === undefined ? undefined : { cause: failure.cause });
    this.name = 'RecoveryError';
    this.outcome = failure.outcome;
    this.report = failure.report;
  }
}

/**
 * The recovery handle of a response returned by a recovering fetch
 * (`{ report(), outcome(), protocol }`), or `undefined`.
 */
export function recoveryOf(response) {
  return reports.get(response);
}

// ---------------------------------------------------------------- options

// The policy's knobs (recovery-core's policy table, `FIELDS`, camelCased)
// and their units, in the table's order. The module reads them by these
// names; a wasm unit test holds this list equal to the table.
const POLICY = {
  maxAttempts: 'count', attemptsPerTarget: 'count', maxResumes: 'count', budgetMs: 'ms', deadlineMs: 'ms',
  backoffBaseMs: 'ms', backoffCeilingMs: 'ms', retryAfterCeilingMs: 'ms', overCeiling: 'choice',
  headTimeoutMs: 'ms', idleTimeoutMs: 'ms', progressTimeoutMs: 'ms', firstTokenTimeoutMs: 'ms', hedgeAfterMs: 'ms',
  maxHedges: 'count', retryableStatuses: 'list', retryableCategories: 'list', endpoint: 'choice', replayBodyCap: 'bytes',
  holdbackCap: 'bytes', evidenceCap: 'bytes', maxEventBytes: 'bytes', idempotencyKey: 'bool',
  retryProtocolViolations: 'bool',
};
// The other options the module reads as numbers, by index (wasm/src/machine.rs, `mod slot`).
const NUMBER_SLOTS = [
  'protocol', 'resumableSse', 'retryBudget.ttlMs', 'retryBudget.minRetriesPerSec', 'retryBudget.percent',
  'noCooldowns', 'contextWindow', 'prefill',
];
const slot = (name) => NUMBER_SLOTS.indexOf(name);
const FUNCTIONS = ['onEvent', 'onStatus', 'fetch', 'admission', 'continuation', 'cooldownKey'];
// The prefill forms, in the module's order (`Prefill::ALL`).
const PREFILLS = ['auto', 'assistant', 'prefix', 'continue_final_message'];
const PROTOCOLS = ['auto', 'openai-chat', 'openai-responses', 'anthropic', 'gemini', 'ollama', 'sse'];
// About 285 years: the largest duration an option may name.
const MAX_MS = 9e12;

function optionError(Kind, message) {
  const e = new Kind(message);
  e.code = 'invalid_option';
  return e;
}
const shape = (message) => optionError(TypeError, `invalid recovery options: ${message}`);
const range = (field, reason) => optionError(RangeError, `invalid recovery option \`${field}\`: ${reason}`);

function kindOf(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  switch (typeof v) {
    case 'boolean': return 'a boolean';
    case 'number': return 'a number';
    case 'string': return 'a string';
    case 'object': return 'an object';
    default: return typeof v;
  }
}

function expect(field, v, type, what) {
  if (typeof v !== type || (type === 'object' && (v === null || Array.isArray(v)))) {
    throw shape(`\`${field}\`: expected ${what}, got ${kindOf(v)}`);
  }
  return v;
}

function whole(field, v, max) {
  expect(field, v, 'number', 'a number');
  if (!Number.isInteger(v) || v < 0 || v > max) {
    throw shape(`\`${field}\`: expected a whole number from 0 to ${max}`);
  }
  return v;
}

function millis(field, v, positive) {
  expect(field, v, 'number', 'a number');
  if (!Number.isFinite(v) || v < 0 || v > MAX_MS) {
    throw range(field, `${v} is not a duration in milliseconds (0 to ${MAX_MS})`);
  }
  if (positive && v === 0) throw range(field, 'must be greater than zero');
  return v;
}

/**
 * One policy option as the module reads it (`recover`'s text: `off`,
 * digits, `true`, a name, a comma-separated list), after the check of its
 * JS type; `null` is `'off'` for a bound. The module judges the value.
 */
function knob(key, unit, v) {
  const text = (x) => {
    if (typeof x === 'number') return String(x);
    if (/[\n,]/.test(x)) throw range(key, `${JSON.stringify(x)} is not a value of it`);
    return x;
  };
  switch (unit) {
    case 'ms':
      if (v === null) return 'off';
      if (typeof v !== 'number' && v !== 'off') throw shape(`\`${key}\`: expected a number, 'off' or null, got ${kindOf(v)}`);
      return text(v);
    case 'count': case 'bytes':
      return text(expect(key, v, 'number', 'a number'));
    case 'bool':
      return String(expect(key, v, 'boolean', 'a boolean'));
    case 'choice':
      return text(expect(key, v, 'string', 'a string'));
    default:
      if (!Array.isArray(v)) throw shape(`\`${key}\`: expected an array, got ${kindOf(v)}`);
      for (const x of v) {
        if (typeof x !== 'number' && typeof x !== 'string') throw shape(`\`${key}\`: expected numbers or strings, got ${kindOf(x)}`);
      }
      return v.map(text).join(',');
  }
}

/** The policy text of the module (`name=value` lines) as npm options. */
function policyOf(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const at = line.indexOf('=');
    if (at < 0) continue;
    const key = line.slice(0, at);
    const value = line.slice(at + 1);
    const read = (x) => {
      if (/^[0-9]+$/.test(x)) return Number(x);
      if (x === 'true' || x === 'false') return x === 'true';
      return x;
    };
    out[key] = POLICY[key] === 'list' ? (value === '' ? [] : value.split(',').map(read)) : read(value);
  }
  return Object.freeze(out);
}

/**
 * Checks `options` and builds the module's client; throws a TypeError (a
 * wrong key or type) or RangeError (a value out of range, a policy the
 * engine refuses) with `code: "invalid_option"`.
 */
function client(wasm, options, available) {
  if (options === undefined || options === null) options = {};
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw optionError(TypeError, 'createRecoveringFetch: options must be an object');
  }
  for (const key of FUNCTIONS) {
    // `continuation: 'prefill'` declares a prefill instead of a hook.
    if (key === 'continuation' && options[key] === 'prefill') continue;
    if (options[key] !== undefined && typeof options[key] !== 'function') {
      throw optionError(TypeError, `invalid recovery option \`${key}\`: expected a function${key === 'continuation' ? " or 'prefill'" : ''}`);
    }
  }
  const signal = options.signal;
  if (signal !== undefined && (signal === null || typeof signal.addEventListener !== 'function' || typeof signal.aborted !== 'boolean')) {
    throw optionError(TypeError, 'invalid recovery option `signal`: expected an AbortSignal');
  }
  const n = new Float64Array(NUMBER_SLOTS.length).fill(NaN);
  let policy = '';
  let protocol = available.includes('auto') ? 'auto' : available[0];
  let sseData = '';
  let sseEvent = '';
  let terminal = false;
  let alternates = [];
  for (const [key, v] of Object.entries(options)) {
    if (v === undefined || FUNCTIONS.includes(key) || key === 'signal') continue;
    if (Object.prototype.hasOwnProperty.call(POLICY, key)) {
      // null keeps the default, except for a bound, which it turns off.
      if (v !== null || POLICY[key] === 'ms') policy += `${key}=${knob(key, POLICY[key], v)}\n`;
      continue;
    }
    switch (key) {
      case 'retryBudget':
        // Absent: the engine's default budget; null: none.
        if (v === null) {
          n[slot('retryBudget.ttlMs')] = -1;
          continue;
        }
        expect(key, v, 'object', 'an object');
        for (const [k, x] of Object.entries(v)) {
          if (x === undefined || x === null) continue;
          if (k === 'ttlMs') {
            const ttl = millis('retryBudget.ttlMs', x, false);
            if (ttl < 1000 || ttl > 60000) throw range('retryBudget.ttlMs', 'must be between 1000 and 60000');
            n[slot('retryBudget.ttlMs')] = ttl;
          } else if (k === 'minRetriesPerSec') {
            n[slot('retryBudget.minRetriesPerSec')] = whole(k, x, 4294967295);
          } else if (k === 'percent') {
            expect(k, x, 'number', 'a number');
            if (!Number.isFinite(x) || x < 0 || x > 10) throw range('retryBudget.percent', `${x} is not a fraction between 0 and 10`);
            n[slot('retryBudget.percent')] = x;
          } else {
            throw shape(`unknown field \`${k}\``);
          }
        }
        continue;
    }
    if (v === null) {
      if (['protocol', 'resumableSse', 'contextWindow', 'sseTerminal', 'prefillTemplate'].includes(key)) continue;
      throw shape(`unknown field \`${key}\``);
    }
    switch (key) {
      case 'contextWindow':
        expect(key, v, 'number', 'a number');
        if (!Number.isSafeInteger(v) || v < 1) throw range(key, 'must be a whole number of tokens, at least 1');
        n[slot(key)] = v;
        break;
      case 'prefillTemplate':
        if (options.continuation !== 'prefill') throw range(key, "applies only with continuation: 'prefill'");
        n[slot('prefill')] = prefillTemplate(key, v);
        break;
      case 'protocol': {
        expect(key, v, 'string', 'a string');
        const name = v.trim().toLowerCase();
        if (!PROTOCOLS.includes(name)) {
          throw range(key, `unknown protocol ${JSON.stringify(v)} (${PROTOCOLS.join(', ')})`);
        }
        if (!available.includes(name)) {
          throw range(key, `this entry decodes ${available.join(', ')}; import "recovery-wasm" for ${JSON.stringify(name)}`);
        }
        protocol = name;
        break;
      }
      case 'sseTerminal':
        expect(key, v, 'object', 'an object');
        for (const [k, x] of Object.entries(v)) {
          if (x === undefined || x === null) continue;
          if (k !== 'data' && k !== 'event') throw shape(`unknown field \`${k}\``);
          expect(k, x, 'string', 'a string');
          if (k === 'data') sseData = x; else sseEvent = x;
        }
        if ((sseData === '') === (sseEvent === '')) throw range(key, 'give exactly one of `data` or `event`');
        terminal = true;
        break;
      case 'resumableSse':
        n[slot(key)] = expect(key, v, 'boolean', 'a boolean') ? 1 : 0;
        break;
      case 'cooldowns':
        n[slot('noCooldowns')] = expect(key, v, 'boolean', 'a boolean') ? 0 : 1;
        break;
      case 'alternates':
        if (!Array.isArray(v)) throw shape(`\`${key}\`: expected an array, got ${kindOf(v)}`);
        alternates = v.map((a, i) => alternate(a, i, available));
        break;
      default:
        throw shape(`unknown field \`${key}\``);
    }
  }
  if (terminal && protocol !== 'sse') throw range('sseTerminal', 'only applies with protocol "sse"');
  n[slot('protocol')] = PROTOCOLS.indexOf(protocol);
  if (options.continuation === 'prefill' && Number.isNaN(n[slot('prefill')])) n[slot('prefill')] = 0;
  const c = new wasm.Client(policy, n, sseData, sseEvent);
  const refused = c.errorText();
  if (refused !== '') {
    c.free();
    throw optionError(RangeError, `invalid recovery policy: ${refused}`);
  }
  for (const [i, a] of alternates.entries()) {
    const refused = c.alternate(a.label, a.url, a.model, a.protocol, a.contextWindow, a.prefill);
    if (refused !== 0) {
      c.free();
      throw range(`alternates[${i}].${ALTERNATE_ERRORS[refused]}`, ALTERNATE_TEXTS[refused]);
    }
  }
  return [c, alternates];
}

const ALTERNATE_ERRORS = ['', 'label', 'url', 'model'];
const ALTERNATE_TEXTS = [
  '',
  'must be 1 to 64 of A-Z a-z 0-9 . _ - (reports and events carry it)',
  'must be absolute http(s)://... or a path starting with /',
  'must be 1 to 256 characters, none of them a control character',
];

/** A prefill form's index, from its name. */
function prefillTemplate(field, v) {
  expect(field, v, 'string', 'a string');
  const i = PREFILLS.indexOf(v);
  if (i < 0) throw range(field, `unknown prefill template ${JSON.stringify(v)} (${PREFILLS.join(', ')})`);
  return i;
}

/**
 * Checks one entry of `alternates`: `{ label, url, model, protocol,
 * contextWindow, continuation, prefillTemplate, headers, body }`.
 */
function alternate(a, i, available) {
  const at = `alternates[${i}]`;
  if (a === null || typeof a !== 'object' || Array.isArray(a)) {
    throw shape(`\`${at}\`: expected an object, got ${kindOf(a)}`);
  }
  const out = { label: '', url: '', model: '', protocol: -1, contextWindow: -1, prefill: -1, headers: [], body: undefined };
  if (a.prefillTemplate != null && a.continuation !== 'prefill') {
    throw range(`${at}.prefillTemplate`, "applies only with continuation: 'prefill'");
  }
  for (const [k, x] of Object.entries(a)) {
    if (x === undefined || x === null) continue;
    switch (k) {
      case 'label': case 'url': case 'model':
        out[k] = expect(`${at}.${k}`, x, 'string', 'a string');
        break;
      case 'protocol': {
        expect(`${at}.protocol`, x, 'string', 'a string');
        const p = x.trim().toLowerCase();
        if (!PROTOCOLS.includes(p)) throw range(`${at}.protocol`, `unknown protocol ${JSON.stringify(x)} (${PROTOCOLS.join(', ')})`);
        if (!available.includes(p)) throw range(`${at}.protocol`, `this entry decodes ${available.join(', ')}; import "recovery-wasm" for ${JSON.stringify(p)}`);
        out.protocol = PROTOCOLS.indexOf(p);
        break;
      }
      case 'contextWindow':
        expect(`${at}.contextWindow`, x, 'number', 'a number');
        if (!Number.isSafeInteger(x) || x < 1) throw range(`${at}.contextWindow`, 'must be a whole number of tokens, at least 1');
        out.contextWindow = x;
        break;
      case 'continuation':
        if (x !== 'prefill') throw range(`${at}.continuation`, "must be 'prefill'");
        if (out.prefill < 0) out.prefill = 0;
        break;
      case 'prefillTemplate':
        out.prefill = prefillTemplate(`${at}.prefillTemplate`, x);
        break;
      case 'headers':
        try {
          out.headers = [...new Headers(x)];
        } catch (e) {
          throw shape(`\`${at}.headers\`: ${e.message}`);
        }
        break;
      case 'body':
        if (typeof x !== 'string' && typeof x !== 'function') {
          throw shape(`\`${at}.body\`: expected a string or a function, got ${kindOf(x)}`);
        }
        out.body = x;
        break;
      default:
        throw shape(`unknown field \`${at}.${k}\``);
    }
  }
  return out;
}

/**
 * The bodies a request's caller wrote for its alternates, one after the
 * other, and each one's length (-1: the request's own body).
 */
function alternateBodies(alternates, body) {
  const lengths = new Int32Array(alternates.length).fill(-1);
  const parts = [];
  let text;
  for (const [i, a] of alternates.entries()) {
    if (a.body === undefined) continue;
    let own = a.body;
    if (typeof own === 'function') {
      text ??= body ? new TextDecoder().decode(body) : '';
      own = own(text);
    }
    if (typeof own === 'string') own = new TextEncoder().encode(own);
    if (!(own instanceof Uint8Array)) {
      throw optionError(TypeError, `alternates[${i}].body returned ${kindOf(own)}; expected a string or a Uint8Array`);
    }
    lengths[i] = own.length;
    parts.push(own);
  }
  const bytes = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  return [bytes, lengths];
}

// --------------------------------------------------------------- platform

/** The platform of the runtime the shell runs in. */
export const defaultPlatform = {
  now: () => performance.now(),
  wall: () => Date.now(),
  random: Math.random,
  online: () => globalThis.navigator?.onLine ?? true,
  /** Calls `fn` once after `ms`; returns a cancel function. */
  timer(ms, fn) {
    const t = setTimeout(fn, Math.min(Math.max(Math.ceil(ms), 0), MAX_TIMER_MS));
    return () => clearTimeout(t);
  },
  /** Calls `fn` once when the platform comes online; returns a cancel function. */
  whenOnline(fn) {
    const target = globalThis;
    if (typeof target.addEventListener !== 'function') return () => {};
    const once = () => { target.removeEventListener('online', once); fn(); };
    target.addEventListener('online', once);
    return () => target.removeEventListener('online', once);
  },
  /** 64 random bits as two 32-bit halves. */
  id() {
    const c = globalThis.crypto;
    if (c && typeof c.getRandomValues === 'function') return c.getRandomValues(new Uint32Array(2));
    return [Math.floor(Math.random() * 2 ** 32), Math.floor(Math.random() * 2 ** 32)];
  },
};

// ----------------------------------------------------------------- errors

const snake = (v) => (typeof v === 'string' ? v : JSON.stringify(v));
const name = (v) => (typeof v === 'object' && v !== null ? Object.keys(v)[0] ?? snake(v) : snake(v));

/** The text of an outcome (the Rust `Display` of `Outcome`). */
/**
 * Mirrors core's `Display` of `PermanentCause`, whose fields the outcome
 * carries beside its `cause` tag.
 */
function permanentText(c) {
  switch (c.cause) {
    case 'status': return `status ${c.status}`;
    case 'redirect': return `redirect ${c.status}, not followed`;
    case 'tls': return 'TLS error';
    case 'provider': return c.code == null ? 'provider error' : `provider error ${c.code}`;
    case 'unsuccessful': return `unsuccessful terminal ${name(c.reason)}`;
    case 'protocol': return `protocol violation ${name(c.violation)}`;
    case 'observer_rejected': return 'the wire observer refused';
    case 'not_ready': return 'the inner service was not ready';
    case 'server_vetoed': return 'the server vetoed retries';
    default: return snake(c.cause);
  }
}

function outcomeText(o) {
  switch (o.outcome) {
    case 'completed': return `completed (${o.proof} proof)`;
    case 'unsuccessful': return `unsuccessful terminal (${name(o.reason)})`;
    case 'permanent': return `permanent failure (${permanentText(o)})`;
    case 'not_retryable': return o.status == null ? `${o.category} failure is not retryable` : `${o.category} failure with status ${o.status} is not retryable`;
    case 'exhausted': return `exhausted after ${o.attempts} attempt(s)`;
    case 'alternates_exhausted': return `every target failed before output (${o.targets.join(', ')}) after ${o.attempts} attempt(s)`;
    case 'budget_exhausted': return `${snake(o.budget)} budget exhausted`;
    case 'deadline_exceeded': return 'deadline exceeded';
    case 'retry_after_refused': return `Retry-After of ${o.value_ms} ms refused (above the ${snake(o.limit)} limit)`;
    case 'interrupted': return o.committed === false
      ? `stopped before commit: the attempt may have shown output, so it was not replayed (${name(o.cause)})`
      : `interrupted after commit (${name(o.cause)})`;
    case 'protocol': return `protocol violation (${name(o.violation)})`;
    case 'admission_required': return 'resend needs admission and no hook was set';
    case 'admission_rejected': return 'admission hook rejected the resend';
    case 'admission_unresolved': return 'admission hook could not decide';
    case 'replay_disabled': return `replay disabled (${snake(o.reason)})`;
    case 'cancelled': return `cancelled while ${snake(o.phase)}`;
    default: return o.outcome;
  }
}

function lastStatus(report) {
  for (let i = report.attempts.length - 1; i >= 0; i--) {
    if (report.attempts[i].status != null) return report.attempts[i].status;
  }
  return null;
}

function failureValue(outcome, report, cause) {
  let message = `recovery failed: ${outcomeText(outcome)} (${report.attempts.length} attempt(s)`;
  const status = lastStatus(report);
  if (status !== null) message += `, last status ${status}`;
  message += ')';
  return { message, outcome, report, cause, committed: report.committed_attempt != null };
}

function abortReason(signals) {
  for (const s of signals) {
    if (s.aborted) {
      return s.reason === undefined ? new DOMException('This operation was aborted', 'AbortError') : s.reason;
    }
  }
  return undefined;
}

function toError(failure, signals) {
  const reason = abortReason(signals);
  if (reason !== undefined && failure.outcome && failure.outcome.outcome === 'cancelled') {
    // Aborted like fetch: reject with the signal's reason.
    return reason;
  }
  if (failure.committed) return new RecoveryError(failure);
  // Before commit, no response: reject like fetch does, with a TypeError
  // that carries the typed outcome and report.
  const error = new TypeError(failure.message, failure.cause === undefined ? undefined : { cause: failure.cause });
  error.outcome = failure.outcome;
  error.report = failure.report;
  return error;
}

// ----------------------------------------------------------------- driver

/** How a wait ended. */
const DEADLINE_PASSED = { deadline: true };
const CANCELLED = { cancelled: true };
/** No deadline armed. */
const NO_ALARM = Object.freeze({ at: -1, fired: false, cancel: null });
/** The read of an attempt with no body left. */
const NO_BODY = Promise.resolve({ done: true, value: undefined });
// What an attempt's I/O holds: its fetch's controller, the fetch until its
// head, the body's reader and the read in flight, the head, and the chunks
// the machine keeps (by id).
const LANE = ['controller', 'fetching', 'reader', 'pending', 'head', 'kept'];
const lane = () => ({ controller: null, fetching: null, reader: null, pending: null, head: null, kept: new Map() });

/**
 * Does the machine's I/O for one logical request: what `poll` answers, the
 * shell does, and tells the machine what happened.
 */
class Driver {
  constructor(m, spec, platform) {
    this.m = m;
    this.spec = spec;
    this.p = platform;
    this.online = true;
    this.action = 0;
    this.fetching = null;
    this.controller = null;
    this.reader = null;
    // A read of `reader` in flight: kept across a wait that ended
    // otherwise, so that no chunk is lost.
    this.pending = null;
    this.head = null;
    this.kept = new Map();
    // A hedge racing the attempt (its own fields of `LANE`), and whose
    // the attempt's fields are now: the hedge's inside `asHedge`.
    this.hedge = null;
    this.role = FIRST;
    this.nextId = 1;
    this.continuation = null;
    this.cause = undefined;
    this.cancelled = false;
    this.ended = false;
    this.wake = null;
    this.alarm = NO_ALARM;
    // The report and the outcome as last read from the machine, and
    // whether the machine changed them since.
    this.snapshot = null;
    this.last = null;
    this.staleReport = true;
    this.staleOutcome = true;
  }

  /**
   * The report and the outcome are read from the machine when asked for,
   * once per change: a request nobody asks about pays for neither.
   */
  get report() {
    if (this.staleReport) {
      this.snapshot = JSON.parse(this.m.reportJson());
      this.staleReport = false;
    }
    return this.snapshot;
  }

  get outcome() {
    if (this.staleOutcome) {
      this.last = JSON.parse(this.m.outcomeJson());
      this.staleOutcome = false;
    }
    return this.last;
  }

  /**
   * Now, as every machine input takes it; a change of connectivity is told
   * to the machine first (it reads connectivity where it decides).
   */
  now() {
    const p = this.p;
    const online = p.online();
    if (online !== this.online) {
      this.online = online;
      this.m.setOnline(online);
    }
    return p.now();
  }

  /** Takes in the action code: events, deadline, the action. */
  take(code) {
    if (code & EVENTS) this.flush();
    if (code & DEADLINE) this.arm();
    this.action = code & 0xff;
    return code;
  }

  flush() {
    const pairs = JSON.parse(this.m.events());
    if (pairs.length === 0) return;
    // Published first: the callbacks may read the report.
    this.publish();
    const { onEvent, onStatus } = this.spec;
    for (const [event, status] of pairs) {
      if (onEvent) try { onEvent(event); } catch { /* a throwing callback changes nothing */ }
      if (status !== null && onStatus) try { onStatus(status); } catch { /* ditto */ }
    }
  }

  /** The machine's report and outcome changed. */
  publish() {
    this.staleReport = true;
    this.staleOutcome = true;
  }

  /**
   * Arms one timer for the machine's deadline. When it fires it ends the
   * wait in progress; with none in progress it stays fired, and the next
   * wait ends at once.
   */
  arm() {
    const at = this.m.deadline();
    if (at === this.alarm.at) return;
    if (this.alarm.cancel) this.alarm.cancel();
    const alarm = { at, fired: false, cancel: null };
    this.alarm = alarm;
    if (at < 0) return;
    const fire = () => {
      const left = at - this.p.now();
      // A timer may fire early (a clamped delay): wait the rest.
      if (left > 0) {
        alarm.cancel = this.p.timer(left, fire);
        return;
      }
      alarm.fired = true;
      alarm.cancel = null;
      if (this.alarm !== alarm) return;
      if (this.wake) this.wake(DEADLINE_PASSED);
      else this.idleDeadline();
    };
    alarm.cancel = this.p.timer(at - this.p.now(), fire);
  }

  /**
   * The deadline passed while nothing awaits it. Only a completed request
   * acts on it: its drain ends, which lets the connection go even when the
   * consumer stopped reading at its own end marker and never pulls again
   * (the Ollama and Mistral SDKs do). Before completion a deadline is judged
   * when the consumer next reads, as a body it does not read is not stalled.
   */
  idleDeadline() {
    if (this.busy || this.ended || !this.outcome || this.outcome.outcome !== 'completed') return;
    this.alarm = NO_ALARM;
    this.take(this.m.onTimeout(this.now()));
    if (this.action === RELEASE) {
      this.release();
      this.take(this.m.poll(this.now()));
    }
    if (this.action === END_OK) this.end(null);
  }

  /**
   * Waits for `promise`, the deadline or a cancel, whichever comes first:
   * `{ value }` or `{ error }` from `promise`, or `DEADLINE_PASSED` or
   * `CANCELLED` once the machine was told. One promise per wait: this runs
   * for every chunk.
   */
  wait(promise) {
    if (this.cancelled) return Promise.resolve(this.settled(CANCELLED));
    if (this.alarm.fired) return Promise.resolve(this.settled(DEADLINE_PASSED));
    return new Promise((resolve, reject) => {
      let done = false;
      const settle = (won) => {
        if (done) return;
        done = true;
        if (this.wake === settle) this.wake = null;
        try {
          resolve(this.settled(won));
        } catch (e) {
          reject(e);
        }
      };
      this.wake = settle;
      if (promise) promise.then((value) => settle({ value }), (error) => settle({ error }));
    });
  }

  /** Tells the machine how a wait ended, when that is news to it. */
  settled(won) {
    if (won === DEADLINE_PASSED) {
      this.alarm = NO_ALARM;
      this.take(this.m.onTimeout(this.now()));
      return won;
    }
    // A rejection the caller's abort caused is the cancellation.
    if (won === CANCELLED || (won.error !== undefined && this.cancelled)) {
      this.take(this.m.onCancel(this.now()));
      return CANCELLED;
    }
    return won;
  }

  /** Cancels the request wherever it is: both attempts of a race. */
  cancel() {
    if (this.cancelled) return;
    this.cancelled = true;
    if (this.controller) this.controller.abort();
    if (this.hedge && this.hedge.controller) this.hedge.controller.abort();
    if (this.wake) this.wake(CANCELLED);
    else if (!this.busy && !this.ended) this.finishCancel();
  }

  /** A cancel while nothing runs: the machine decides at once. */
  finishCancel() {
    this.take(this.m.onCancel(this.now()));
    this.release();
    this.releaseHedge();
    this.ended = true;
    this.publish();
    this.stop();
  }

  release() {
    if (this.controller) this.controller.abort();
    this.controller = null;
    if (this.reader) this.reader.cancel().catch(() => {});
    this.reader = null;
    this.fetching = null;
    this.pending = null;
  }

  releaseHedge() {
    if (this.hedge) this.asHedge(() => this.release());
    this.hedge = null;
  }

  /**
   * Does `io` with the attempt's fields holding the hedge's, its inputs
   * told to the machine as the hedge's: a hedge's I/O is an attempt's.
   */
  asHedge(io) {
    const h = this.hedge;
    const swap = () => {
      for (const k of LANE) {
        const v = this[k];
        this[k] = h[k];
        h[k] = v;
      }
    };
    swap();
    this.role = HEDGED;
    try {
      return io();
    } finally {
      this.role = FIRST;
      swap();
    }
  }

  /** The hedge takes the place of the attempt (released just before). */
  promote() {
    const h = this.hedge;
    if (!h) return;
    for (const k of LANE) this[k] = h[k];
    this.hedge = null;
  }

  /**
   * The attempts race: waits for the first news of either (its head, or
   * its next read) or the deadline, and tells the machine as that
   * attempt's. The other's fetch or read stays in flight for the next
   * wait. Returns a chunk that goes out at once, if any.
   */
  async race() {
    const first = this.news();
    const hedge = this.asHedge(() => this.news());
    const woke = await this.wait(Promise.race([
      first.then((value) => ({ value }), (error) => ({ error })),
      hedge.then((value) => ({ value, hedge: true }), (error) => ({ error, hedge: true })),
    ]));
    if (woke === DEADLINE_PASSED || woke === CANCELLED) return null;
    const news = woke.value.error === undefined ? woke.value : this.settled(woke.value);
    if (news === CANCELLED) return null;
    return news.hedge ? this.asHedge(() => this.heard(news)) : this.heard(news);
  }

  /** What the attempt waits on next: its head, or its next read. */
  news() {
    if (this.fetching) return this.fetching;
    return this.reader ? this.readNext() : NO_BODY;
  }

  /** Tells the machine what `news()` brought. */
  heard(woke) {
    if (!this.fetching) return this.afterRead(woke);
    this.gotHead(woke);
    return null;
  }

  stop() {
    if (this.alarm.cancel) this.alarm.cancel();
    this.alarm = NO_ALARM;
  }

  failure() {
    this.publish();
    const outcome = this.outcome ?? { outcome: 'exhausted', attempts: this.report.attempts.length };
    return failureValue(outcome, this.report, this.cause);
  }

  /**
   * Runs the machine until it has something for the consumer: `{ respond:
   * Response }`, `{ error: Response }` (the final HTTP error), a chunk
   * (the `Uint8Array` itself), `{ end: true }` or `{ failure }`.
   */
  async advance() {
    if (this.ended) return { end: true };
    this.busy = true;
    try {
      if (this.action === 0) this.take(this.m.poll(this.now()));
      for (;;) {
        switch (this.action) {
          case SEND: this.send(); break;
          case AWAIT_HEAD: await this.awaitHead(); break;
          case READ: {
            const chunk = await this.read();
            if (chunk) return chunk;
            break;
          }
          case RELEASE: this.release(); this.take(this.m.poll(this.now())); break;
          case HEDGE:
            this.hedge = lane();
            this.asHedge(() => this.send());
            break;
          case RACE: {
            const chunk = await this.race();
            if (chunk) return chunk;
            break;
          }
          case RELEASE_HEDGE: this.releaseHedge(); this.take(this.m.poll(this.now())); break;
          case PROMOTE: this.promote(); this.take(this.m.poll(this.now())); break;
          case RESPOND: {
            const head = this.head;
            this.head = null;
            this.take(this.m.poll(this.now()));
            return head ? { respond: head } : this.end(this.failure());
          }
          case RESPOND_ERROR: {
            const head = this.head;
            this.head = null;
            if (this.reader) this.reader.cancel().catch(() => {});
            this.reader = null;
            this.releaseHedge();
            this.ended = true;
            this.publish();
            this.stop();
            return head ? { error: head } : { failure: this.failure() };
          }
          case DELIVER: {
            const id = this.m.deliverId();
            let chunk;
            if (id !== 0) {
              chunk = this.kept.get(id);
              this.kept.delete(id);
            } else {
              chunk = this.m.deliverBytes();
            }
            this.take(this.m.poll(this.now()));
            if (chunk) return chunk;
            break;
          }
          case SLEEP: case AWAIT_ADMISSION: {
            const woke = await this.wait(null);
            if (woke !== DEADLINE_PASSED && woke !== CANCELLED) this.take(this.m.poll(this.now()));
            break;
          }
          case WAIT_ONLINE: {
            let stop;
            const online = new Promise((resolve) => { stop = this.p.whenOnline(resolve); });
            const woke = await this.wait(online);
            stop();
            if (woke !== DEADLINE_PASSED && woke !== CANCELLED) {
              this.take(this.m.onOnline(this.now()));
              this.online = true;
            }
            break;
          }
          case ASK_ADMISSION: await this.askAdmission(); break;
          case ASK_CONTINUATION: await this.askContinuation(); break;
          case END_OK: return this.end(null);
          case END_ERR: return this.end(this.failure());
          default: return this.end(this.failure());
        }
      }
    } finally {
      this.busy = false;
    }
  }

  end(failure) {
    this.ended = true;
    this.release();
    this.releaseHedge();
    this.stop();
    // The final report, with what followed the last event.
    this.publish();
    return failure ? { failure } : { end: true };
  }

  /**
   * The request as alternate `target - 1` takes it: the machine rewrites
   * its URL and body and names the headers that stay behind (the
   * request's credentials, when it leaves the origin); the alternate's
   * own headers go over the rest.
   */
  retarget(target) {
    const spec = this.spec;
    const alt = spec.alternates[target - 1];
    const out = this.m.retarget(spec.url, spec.body ?? new Uint8Array(0), spec.headers.map(([n]) => n.toLowerCase()).join('\n'));
    const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
    const text = new TextDecoder();
    const urlLength = view.getUint32(0, true);
    const url = text.decode(out.subarray(4, 4 + urlLength));
    const at = 4 + urlLength;
    const leftLength = view.getUint32(at, true);
    const left = new Set(text.decode(out.subarray(at + 4, at + 4 + leftLength)).split('\n'));
    const own = new Set(alt.headers.map(([n]) => n));
    const headers = spec.headers.filter(([n]) => !own.has(n.toLowerCase()) && !left.has(n.toLowerCase()));
    headers.push(...alt.headers);
    const body = spec.body === undefined ? undefined : out.subarray(at + 4 + leftLength);
    return { url, method: spec.method, headers, body };
  }

  /**
   * Starts the send the machine asked for (a hedge's, as the hedge), with
   * a fresh AbortController.
   */
  send() {
    const code = this.m.sendKind();
    const kind = code & 0xff;
    const spec = code >> 8 === 0 ? this.spec : this.retarget(code >> 8);
    let out;
    if (kind === 1) {
      const header = this.m.sendHeader();
      const [hname, hvalue] = header ? header.split('\n') : [];
      const withBody = this.m.sendWithBody();
      const headers = spec.headers.filter(([n]) => {
        const lower = n.toLowerCase();
        return lower !== hname && (withBody || !BODY_HEADERS.includes(lower));
      });
      if (hname) headers.push([hname, hvalue]);
      out = { url: this.m.sendUrl(), method: this.m.sendMethod(), headers, body: withBody ? spec.body : undefined };
    } else if (kind === 2) {
      out = this.continuation;
      this.continuation = null;
    } else if (kind === 3) {
      // A prefill continuation: the target's request, the machine's body.
      out = { ...spec, body: this.m.sendBody() };
    } else {
      out = spec;
    }
    // Chunks kept for a failed attempt are never delivered.
    this.kept.clear();
    this.head = null;
    if (!out) {
      this.take(this.m.onError(this.now(), false, this.role));
      return;
    }
    this.controller = typeof AbortController === 'function' ? new AbortController() : null;
    if (this.cancelled && this.controller) this.controller.abort();
    // The machine names the key when the send has none of its own.
    let headers = out.headers;
    const key = this.m.idempotencyKey(headers.some(([n]) => n.toLowerCase() === 'idempotency-key'));
    if (key) headers = [...headers, ['idempotency-key', key]];
    const init = { method: out.method, headers, redirect: 'manual' };
    if (out.body !== undefined) init.body = out.body;
    if (this.controller) init.signal = this.controller.signal;
    try {
      this.fetching = Promise.resolve(this.spec.fetch.call(globalThis, out.url, init));
    } catch (e) {
      this.fetching = Promise.reject(e);
    }
    this.fetching.catch(() => {});
    this.take(this.m.onSent(this.now(), this.role));
  }

  async awaitHead() {
    const fetching = this.fetching;
    if (!fetching) {
      this.take(this.m.onError(this.now(), false, this.role));
      return;
    }
    const woke = await this.wait(fetching);
    if (woke === DEADLINE_PASSED || woke === CANCELLED) return;
    this.gotHead(woke);
  }

  /** What the fetch brought: its response head, or its rejection. */
  gotHead(woke) {
    this.fetching = null;
    if (woke.error !== undefined) {
      // A hedge's failure is no cause of the request's.
      if (this.role === FIRST) this.cause = woke.error;
      this.take(this.m.onError(this.now(), false, this.role));
      return;
    }
    const response = woke.value;
    let headers = '';
    response.headers.forEach((value, key) => { headers += `${key.toLowerCase()}\n${value}\n`; });
    const code = this.m.onHead(this.now(), this.p.wall(), response.status, headers, response.type === 'opaqueredirect', this.role);
    // A head that may be the final answer is kept untouched: its body is
    // read from a copy.
    let body = null;
    try {
      body = this.m.keepsResponse(this.role) ? response.clone().body : response.body;
    } catch {
      body = null;
    }
    this.reader = body ? body.getReader() : null;
    this.head = response;
    this.take(code);
  }

  /**
   * The consumer's pull: a chunk, `{ end: true }` or `{ failure }`. Mid-
   * stream the machine is waiting for a read and the chunk read goes out at
   * once; that path, taken for every chunk, skips the general loop.
   */
  next() {
    if (this.action !== READ || this.ended || !this.reader) return this.advance();
    this.busy = true;
    return this.wait(this.readNext()).then(
      (woke) => {
        this.busy = false;
        return this.afterRead(woke) ?? this.advance();
      },
      (e) => {
        this.busy = false;
        throw e;
      },
    );
  }

  /** One chunk of the attempt's body; returned when it goes out at once. */
  async read() {
    if (!this.reader) {
      this.take(this.m.onEnd(this.now(), this.role));
      return null;
    }
    return this.afterRead(await this.wait(this.readNext()));
  }

  /** The read in flight, or a new one. */
  readNext() {
    return (this.pending ??= this.reader.read());
  }

  /** What a read brought, told to the machine; the chunk if it goes out now. */
  afterRead(woke) {
    if (woke === DEADLINE_PASSED || woke === CANCELLED) return null;
    this.pending = null;
    if (woke.error !== undefined) {
      if (this.role === FIRST) this.cause = woke.error;
      this.reader = null;
      this.take(this.m.onError(this.now(), true, this.role));
      return null;
    }
    const { done, value } = woke.value;
    if (done) {
      this.reader = null;
      this.take(this.m.onEnd(this.now(), this.role));
      return null;
    }
    const chunk = value instanceof Uint8Array ? value : new Uint8Array(value);
    const id = this.nextId++;
    const code = this.take(this.m.onChunk(this.now(), chunk, id, this.role));
    if (code & DELIVER_THIS) return chunk;
    this.kept.set(id, chunk);
    return null;
  }

  /**
   * Calls the admission hook with `{ logicalId, nextAttempt, failure }`: it
   * may answer `"allow"`, `"reject"`, `true`/`false` or a promise of those.
   * Anything else (or a throw) is unresolved: pending is not approval, and
   * the machine's deadline bounds the wait.
   */
  async askAdmission() {
    const hook = this.spec.admission;
    const context = JSON.parse(this.m.admissionJson());
    let value;
    try {
      value = hook(context);
    } catch {
      value = undefined;
    }
    if (value && typeof value.then === 'function') {
      const woke = await this.wait(Promise.resolve(value));
      if (woke === DEADLINE_PASSED || woke === CANCELLED) return;
      value = woke.value;
    }
    const answer = value === true || value === 'allow' ? 1 : value === false || value === 'reject' ? 2 : 0;
    this.take(this.m.onAdmission(this.now(), answer));
  }

  /** Calls the continuation hook with the delivered prefix. */
  async askContinuation() {
    const hook = this.spec.continuation;
    let given = null;
    if (hook) {
      const prefix = JSON.parse(this.m.prefixJson());
      const woke = await this.wait(Promise.resolve().then(() => hook(prefix)));
      if (woke === DEADLINE_PASSED || woke === CANCELLED) return;
      given = woke.value ?? null;
    }
    this.continuation = given;
    this.take(this.m.onContinuation(this.now(), given !== null));
  }
}

// -------------------------------------------------------------------- API

/**
 * The continuation hook as the driver calls it: given the delivered prefix,
 * the caller's hook gets `{ delivered, request }` (a copy of the original
 * request) and returns a `Request` (or what `new Request()` takes), `null`
 * to decline, or a promise of either; the driver gets `{ url, method,
 * headers, body }` or `null`.
 */
function continuationOf(hook, original, body) {
  return async (delivered) => {
    const request = new Request(original.url, {
      method: original.method,
      headers: original.headers,
      body: body === undefined ? undefined : body.slice(),
    });
    const answer = await hook({ delivered, request });
    if (answer === null || answer === undefined) return null;
    const next = answer instanceof Request ? answer : new Request(answer.url, answer);
    const nextBody = next.method === 'GET' || next.method === 'HEAD'
      ? undefined
      : new Uint8Array(await next.arrayBuffer());
    return { url: next.url, method: next.method, headers: [...next.headers], body: nextBody };
  };
}

function attach(response, handle) {
  reports.set(response, handle);
  try {
    Object.defineProperty(response, 'recovery', { value: handle, enumerable: false, configurable: true });
  } catch {
    // A frozen response still has recoveryOf().
  }
  return response;
}

/**
 * Binds the API to an initialized wasm module: returns
 * `createRecoveringFetch`. `platform` replaces the runtime's clocks, timers
 * and connectivity (tests run on a virtual clock).
 */
export function bind(wasm, platform = defaultPlatform) {
  const available = wasm.protocols().split(',');

  /**
   * Returns a function with fetch's signature whose responses survive
   * network failures: see index.d.ts for the options and the semantics.
   */
  return function createRecoveringFetch(options) {
    const [c, alternates] = client(wasm, options, available);
    const opts = options ?? {};
    // The caller's cooldown key of a request (its URL, its body bytes), or
    // '' for its origin and model.
    const cooldownKey = (url, body) => {
      if (typeof opts.cooldownKey !== 'function') return '';
      const k = opts.cooldownKey(url, body ? new TextDecoder().decode(body) : '');
      if (typeof k !== 'string' || k === '') throw optionError(TypeError, `cooldownKey returned ${kindOf(k)}; expected a non-empty string`);
      return k;
    };

    const recoveringFetch = async function recoveringFetch(input, init) {
      const request = new Request(input, init);
      const signals = [opts.signal, init && init.signal, input instanceof Request ? input.signal : undefined]
        .filter((s) => s != null);
      const early = abortReason(signals);
      if (early !== undefined) throw early;
      const method = request.method;
      const body = method === 'GET' || method === 'HEAD'
        ? undefined
        : new Uint8Array(await request.arrayBuffer());
      const [hi, lo] = platform.id();
      const [bodies, lengths] = alternates.length ? alternateBodies(alternates, body) : NO_BODIES;
      const m = c.start(method, request.url, body ?? new Uint8Array(0), platform.now(), hi, lo,
        typeof opts.admission === 'function', typeof opts.continuation === 'function', bodies, lengths,
        cooldownKey(request.url, body), typeof platform.jitter === 'number' ? platform.jitter : -1);
      const driver = new Driver(m, {
        fetch: opts.fetch || platform.fetch || globalThis.fetch,
        url: request.url,
        method,
        headers: [...request.headers],
        body,
        onEvent: opts.onEvent,
        onStatus: opts.onStatus,
        alternates,
        admission: opts.admission,
        continuation: typeof opts.continuation === 'function' ? continuationOf(opts.continuation, request, body) : undefined,
      }, platform);
      const handle = Object.freeze({
        report: () => driver.report,
        outcome: () => driver.outcome,
        // Read when asked: a failover or a hedge may hand out an answer
        // in another protocol than the first send's.
        get protocol() { return m.protocol(); },
      });
      // A test platform watches every request from its start.
      if (platform.started) platform.started(handle);
      const onAbort = () => driver.cancel();
      for (const s of signals) s.addEventListener('abort', onAbort);
      const cleanup = () => {
        for (const s of signals) s.removeEventListener('abort', onAbort);
      };
      if (abortReason(signals) !== undefined) driver.cancel();

      const started = await driver.advance();
      if (started.failure) {
        cleanup();
        throw toError(started.failure, signals);
      }
      if (started.error) {
        // The final HTTP error, returned as that response.
        cleanup();
        return attach(started.error, handle);
      }
      if (!started.respond) {
        cleanup();
        throw toError(driver.failure(), signals);
      }
      const head = started.respond;
      const stream = new ReadableStream(
        {
          async pull(controller) {
            const next = await driver.next();
            if (next instanceof Uint8Array) {
              controller.enqueue(next);
              return;
            }
            cleanup();
            if (next.failure) {
              controller.error(toError(next.failure, signals));
              return;
            }
            const outcome = driver.outcome;
            if (outcome && outcome.outcome === 'completed') {
              controller.close();
            } else {
              controller.error(abortReason(signals) ?? new DOMException('The stream was cancelled', 'AbortError'));
            }
          },
          cancel() {
            cleanup();
            driver.cancel();
          },
        },
        { highWaterMark: 0 },
      );
      const response = new Response(stream, {
        status: head.status,
        statusText: head.statusText,
        headers: head.headers,
      });
      try {
        Object.defineProperty(response, 'url', { value: head.url, configurable: true });
      } catch {
        // keep the default
      }
      return attach(response, handle);
    };
    // The policy in force, every knob (npm names; 'off' for a bound that is off).
    recoveringFetch.policy = policyOf(c.policyText());
    // The endpoint cooldowns this function's requests share.
    const key = (url, body) => {
      const u = new Request(url).url;
      const b = typeof body === 'string' ? new TextEncoder().encode(body) : body ?? new Uint8Array(0);
      return [u, b, cooldownKey(u, b)];
    };
    recoveringFetch.cooldowns = Object.freeze({
      note(url, body, ms) {
        if (typeof ms !== 'number' || !(ms >= 0)) throw optionError(RangeError, 'cooldowns.note: ms must be a number >= 0');
        const [u, b, k] = key(url, body);
        c.cooldown(u, b, k, platform.now(), ms);
      },
      remaining(url, body) {
        const [u, b, k] = key(url, body);
        return c.cooldown(u, b, k, platform.now(), 0);
      },
    });
    return recoveringFetch;
  };
}
