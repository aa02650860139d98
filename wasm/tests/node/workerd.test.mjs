// The package in workerd: a module worker importing the wasm as a compiled
// module (initSync), reaching the loopback provider (`allow = ["local"]`).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { FAULT, prefix, load, count, fixture } from './helpers.mjs';

const dir = fileURLToPath(new URL('../workerd/', import.meta.url));
const bin = fileURLToPath(new URL('../../node_modules/.bin/workerd', import.meta.url));

const port = await new Promise((resolve) => {
  const s = createServer();
  s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
});
const child = spawn(bin, ['serve', 'config.capnp', '--socket-addr', `http=127.0.0.1:${port}`], { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
let stderr = '';
child.stderr.on('data', (d) => { stderr += d; });
after(() => child.kill());

async function ask(upstream) {
  for (let i = 0; i < 100; i++) {
    try {
      const res = await fetch(`http://127.0.0.1:${port}/?upstream=${encodeURIComponent(upstream)}`);
      return await res.json();
    } catch {
      if (child.exitCode !== null) throw new Error(`workerd exited: ${stderr}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  throw new Error(`workerd did not answer: ${stderr}`);
}

test('workerd: a reset before the first token is replayed', async () => {
  const path = `${prefix('workerd')}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/role-only-then-cut.sse', { ending: 'rst' }), fixture('openai-chat/happy-usage.sse')] });
  const out = await ask(`${FAULT}${path}`);
  assert.equal(out.status, 200, JSON.stringify(out));
  assert.match(out.text, /data: \[DONE\]/);
  assert.equal(out.events.at(-1), 'completed');
  assert.equal(out.report.attempts[0].phase, 'streaming');
  assert.equal(await count(path), 2);
});

test('workerd: refused connections exhaust with a TypeError', async () => {
  const out = await ask(`${process.env.RECOVERY_REFUSED_URL}/v1/chat/completions`);
  assert.equal(out.error, 'TypeError', JSON.stringify(out));
  assert.equal(out.outcome.outcome, 'exhausted');
  assert.equal(out.report.attempts[0].category, 'transport');
});
