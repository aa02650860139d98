// The fetch-shaped API over the wasm driver, shared by every entry point
// (web.mjs, node.mjs, workerd.mjs). Each entry initializes the wasm module
// its own way and binds it here before exporting this module's API.

let wasm;

/** @internal Called once by the entry point with the initialized module. */
export function _bind(module) {
  wasm = module;
}

const FUNCTION_OPTIONS = ['onEvent', 'onStatus', 'signal', 'fetch', 'admission', 'continuation'];
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

function isFailure(value) {
  return value !== null && typeof value === 'object' && 'outcome' in value && 'report' in value;
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
  if (!isFailure(failure)) return failure;
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

function handleOf(call) {
  return Object.freeze({
    report: () => call.report(),
    outcome: () => call.outcome(),
    protocol: call.protocol(),
  });
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
 * The recovery handle of a response returned by a recovering fetch
 * (`{ report(), outcome(), protocol }`), or `undefined`.
 */
export function recoveryOf(response) {
  return reports.get(response);
}

function checkOptions(options) {
  if (options === undefined || options === null) return {};
  if (typeof options !== 'object') {
    throw new TypeError('createRecoveringFetch: options must be an object');
  }
  for (const key of ['onEvent', 'onStatus', 'fetch', 'admission', 'continuation']) {
    if (options[key] !== undefined && typeof options[key] !== 'function') {
      const e = new TypeError(`invalid recovery option \`${key}\`: expected a function`);
      e.code = 'invalid_option';
      throw e;
    }
  }
  const signal = options.signal;
  if (signal !== undefined && (signal === null || typeof signal.addEventListener !== 'function' || typeof signal.aborted !== 'boolean')) {
    const e = new TypeError('invalid recovery option `signal`: expected an AbortSignal');
    e.code = 'invalid_option';
    throw e;
  }
  return options;
}

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
    const next = answer instanceof Request ? answer : new Request(answer);
    const nextBody = next.method === 'GET' || next.method === 'HEAD'
      ? undefined
      : new Uint8Array(await next.arrayBuffer());
    return { url: next.url, method: next.method, headers: [...next.headers], body: nextBody };
  };
}

/**
 * Returns a function with fetch's signature whose responses survive
 * network failures: see index.d.ts for the options and the semantics.
 */
export function createRecoveringFetch(options) {
  if (!wasm) throw new Error('recovery-wasm: the wasm module is not initialized');
  const opts = checkOptions(options);
  const data = {};
  for (const [key, value] of Object.entries(opts)) {
    if (!FUNCTION_OPTIONS.includes(key) && value !== undefined) data[key] = value;
  }
  if (opts.admission) data.admissionHook = true;
  if (opts.continuation) data.continuationHook = true;
  const client = new wasm.RecoveryClient(data);

  return async function recoveringFetch(input, init) {
    const request = new Request(input, init);
    const signals = [opts.signal, init && init.signal, input instanceof Request ? input.signal : undefined]
      .filter((s) => s != null);
    const early = abortReason(signals);
    if (early !== undefined) throw early;
    const method = request.method;
    const body = method === 'GET' || method === 'HEAD'
      ? undefined
      : new Uint8Array(await request.arrayBuffer());
    const fetchImpl = opts.fetch || globalThis.fetch;
    const continuation = opts.continuation && continuationOf(opts.continuation, request, body);
    const call = client.call(
      fetchImpl,
      request.url,
      method,
      [...request.headers],
      body,
      opts.onEvent,
      opts.onStatus,
      opts.admission,
      continuation,
    );
    const onAbort = () => call.cancel();
    for (const s of signals) s.addEventListener('abort', onAbort);
    const cleanup = () => {
      for (const s of signals) s.removeEventListener('abort', onAbort);
    };
    if (abortReason(signals) !== undefined) call.cancel();

    let started;
    try {
      started = await call.start();
    } catch (failure) {
      cleanup();
      throw toError(failure, signals);
    }
    const handle = handleOf(call);
    if (started.kind === 'response') {
      // The final HTTP error, returned as that response.
      cleanup();
      return attach(started.response, handle);
    }
    const head = started.response;
    const stream = new ReadableStream(
      {
        async pull(controller) {
          let chunk;
          try {
            chunk = await call.next();
          } catch (failure) {
            cleanup();
            controller.error(toError(failure, signals));
            return;
          }
          if (chunk !== undefined) {
            controller.enqueue(chunk);
            return;
          }
          cleanup();
          const outcome = call.outcome();
          if (outcome && outcome.outcome === 'completed') {
            controller.close();
          } else {
            controller.error(abortReason(signals) ?? new DOMException('The stream was cancelled', 'AbortError'));
          }
        },
        cancel() {
          cleanup();
          call.cancel();
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
}
