// The npm package against recovery-gateway: a downstream connection cut
// mid-stream is resumed with Last-Event-ID from the gateway's stream log,
// while the upstream generation goes on; the consumer gets the whole
// answer once and the provider one request.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { readFileSync } from 'node:fs';
import { createRecoveringFetch } from '../../pkg/all/node.mjs';
import { FAULT, prefix, load, count } from './helpers.mjs';

const GATEWAY = (process.env.RECOVERY_GATEWAY_URL ?? '').replace(/\/$/, '');
if (!GATEWAY) throw new Error('RECOVERY_GATEWAY_URL is not set: run scripts/test-wasm.sh');

const FIXTURE = 'openai-chat/happy-usage.sse';
const EVENTS = readFileSync(new URL(`../../../tests/fixtures/${FIXTURE}`, import.meta.url), 'utf8')
  .split('\n\n')
  .filter((e) => e.trim() !== '')
  .map((e) => `${e}\n\n`);

/**
 * A TCP proxy to the gateway that cuts its first connection once the
 * gateway's event `:cutAfter` went through; later connections pass.
 */
async function cuttingProxy(target, cutAfter, onCut) {
  const { hostname, port } = new URL(target);
  let connections = 0;
  const server = net.createServer((client) => {
    const first = connections++ === 0;
    const upstream = net.connect(Number(port), hostname);
    client.pipe(upstream);
    let seen = '';
    upstream.on('data', (data) => {
      client.write(data);
      if (!first) return;
      seen += data.toString('latin1');
      const at = seen.indexOf(`:${cutAfter}\n`);
      if (at >= 0 && seen.indexOf('\n\n', at) >= 0) {
        client.destroy();
        upstream.destroy();
        onCut();
      }
    });
    upstream.on('end', () => client.end());
    upstream.on('error', () => client.destroy());
    client.on('error', () => upstream.destroy());
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${server.address().port}`, close: () => server.close() };
}

test('resumableSse through recovery-gateway: a cut downstream connection resumes from the stream log', async () => {
  const base = prefix('gateway-resume');
  const path = `${base}/v1/chat/completions`;
  // Three events, then the provider waits for a permit before the rest.
  const body = EVENTS.map((text, i) => (i === 3 ? { text, stall: true } : { text }));
  await load({ [path]: [{ headers: { 'content-type': 'text/event-stream' }, body }] });
  let cut = false;
  const proxy = await cuttingProxy(GATEWAY, 3, () => {
    cut = true;
    // The generation goes on upstream while nobody is connected.
    fetch(`${FAULT}/__fault/release?all`, { method: 'POST' }).catch(() => {});
  });
  try {
    const events = [];
    const rfetch = createRecoveringFetch({
      protocol: 'openai-chat',
      resumableSse: true,
      backoffBaseMs: 1,
      backoffCeilingMs: 2,
      onEvent: (e) => events.push(e),
    });
    const res = await rfetch(`${proxy.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: '{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}',
    });
    assert.ok(res.headers.get('x-recovery-stream-id'), 'the gateway names the stream');
    const text = await res.text();
    assert.ok(cut, 'the proxy cut the first connection');
    assert.equal(text.replace(/^id: .*\n/gm, ''), EVENTS.join(''), 'the whole answer, once');
    const ids = [...text.matchAll(/^id: [^:\n]+:(\d+)$/gm)].map((m) => Number(m[1]));
    assert.deepEqual(ids, EVENTS.map((_, i) => i + 1), 'no gap, no duplicate');
    const report = res.recovery.report();
    assert.equal(report.outcome.outcome, 'completed');
    assert.equal(report.seams.length, 1);
    assert.equal(report.seams[0].strategy, 'last_event_id');
    assert.ok(events.some((e) => e.event === 'resume_started'));
    assert.equal(await count(path), 1, 'the resume was served from the log, not the provider');
  } finally {
    proxy.close();
  }
});
