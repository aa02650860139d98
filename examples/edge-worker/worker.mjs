// A module worker that proxies streaming completions with recovery.
//
// A client POSTs an OpenAI-style (or Anthropic, Gemini, ...) request to this
// worker, under the upstream's own path (`/v1/chat/completions`,
// `/v1/messages`, ...). The worker forwards it to the upstream through
// `createRecoveringFetch`, with the upstream key from a secret, and streams
// the stitched body back: a failure before the first token (a reset, a 503,
// an overloaded error) is replayed invisibly, so the client sees one clean
// stream; a failure after content was delivered ends the stream with one
// in-band SSE error event instead of a silent truncation.
//
// Bindings (see config.capnp for workerd, wrangler.toml for Cloudflare):
//   UPSTREAM_URL      base URL of the provider, e.g. https://api.openai.com
//   UPSTREAM_API_KEY  secret; sent as `Authorization: Bearer …` (or
//                     `x-api-key` when the path ends in /messages)
//   UPSTREAM          optional service binding; when present the upstream
//                     is reached through it (workerd's external service),
//                     otherwise through the global fetch
//   MAX_ATTEMPTS      optional, default 3
import { createRecoveringFetch } from 'recovery-wasm';

const FORWARDED_REQUEST_HEADERS = ['content-type', 'accept', 'anthropic-version', 'anthropic-beta', 'openai-beta'];
const FORWARDED_RESPONSE_HEADERS = ['content-type', 'x-request-id', 'request-id', 'openai-processing-ms'];

function upstreamHeaders(request, env, path) {
  const headers = new Headers();
  for (const name of FORWARDED_REQUEST_HEADERS) {
    const value = request.headers.get(name);
    if (value !== null) headers.set(name, value);
  }
  if (env.UPSTREAM_API_KEY) {
    // The client's own credentials are never forwarded.
    if (path.endsWith('/messages')) headers.set('x-api-key', env.UPSTREAM_API_KEY);
    else headers.set('authorization', `Bearer ${env.UPSTREAM_API_KEY}`);
  }
  return headers;
}

// The stitched body, passed through; a failure after commit (a RecoveryError)
// becomes one SSE error event so SDK clients raise instead of hanging on a
// truncated stream.
function relay(body, isSse) {
  const reader = body.getReader();
  const encoder = new TextEncoder();
  return new ReadableStream({
    async pull(controller) {
      try {
        const { done, value } = await reader.read();
        if (done) controller.close();
        else controller.enqueue(value);
      } catch (error) {
        if (!isSse) {
          controller.error(error);
          return;
        }
        const event = {
          error: {
            type: 'stream_interrupted',
            message: String(error && error.message),
            outcome: error && error.outcome ? error.outcome.outcome : null,
          },
        };
        controller.enqueue(encoder.encode(`event: error\ndata: ${JSON.stringify(event)}\n\n`));
        controller.close();
      }
    },
    cancel(reason) {
      // The client went away: cancels the upstream request too.
      return reader.cancel(reason);
    },
  }, { highWaterMark: 0 });
}

export default {
  async fetch(request, env) {
    if (request.method !== 'POST') {
      return new Response('POST a streaming completion request\n', { status: 405, headers: { allow: 'POST' } });
    }
    if (!env.UPSTREAM_URL) {
      return Response.json({ error: { type: 'misconfigured', message: 'UPSTREAM_URL is not set' } }, { status: 500 });
    }
    const incoming = new URL(request.url);
    const target = new URL(incoming.pathname + incoming.search, env.UPSTREAM_URL);
    const attempts = [];
    const rfetch = createRecoveringFetch({
      maxAttempts: Number(env.MAX_ATTEMPTS ?? 3),
      protocol: 'auto', // guessed from the path: /chat/completions, /responses, /messages, ...
      fetch: env.UPSTREAM ? (url, init) => env.UPSTREAM.fetch(url, init) : undefined,
      onEvent: (e) => {
        if (e.event === 'attempt_failed') attempts.push({ attempt: e.wire_attempt, reason: e.reason, status: e.status });
        if (['completed', 'exhausted', 'interrupted', 'cancelled'].includes(e.event)) {
          console.log(JSON.stringify({ recovery: e.event, logical_id: e.logical_id, failed_attempts: attempts }));
        }
      },
    });

    let upstream;
    try {
      upstream = await rfetch(target, {
        method: 'POST',
        headers: upstreamHeaders(request, env, incoming.pathname),
        body: await request.arrayBuffer(),
        signal: request.signal,
      });
    } catch (error) {
      // Transport failures on every attempt: no response to pass on.
      return Response.json(
        { error: { type: 'upstream_unreachable', message: String(error && error.message), outcome: error.outcome ? error.outcome.outcome : null } },
        { status: 502 },
      );
    }

    const headers = new Headers({ 'cache-control': 'no-cache' });
    for (const name of FORWARDED_RESPONSE_HEADERS) {
      const value = upstream.headers.get(name);
      if (value !== null) headers.set(name, value);
    }
    const report = upstream.recovery.report();
    headers.set('x-recovery-logical-id', report.logical_id);
    headers.set('x-recovery-attempts', String(report.attempts.length));
    const isSse = (upstream.headers.get('content-type') ?? '').includes('text/event-stream');
    // A final HTTP error (attempts ran out on statuses) is passed on as is.
    const body = upstream.body === null ? null : relay(upstream.body, isSse && upstream.ok);
    return new Response(body, { status: upstream.status, headers });
  },
};
