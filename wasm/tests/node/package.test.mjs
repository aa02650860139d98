// The npm package as a user gets it: `npm pack` (its prepack builds the
// wasm), installed from the tarball into an empty directory, then used from
// Node ESM, Node CommonJS, an esbuild browser bundle in headless Chromium,
// and an esbuild worker bundle in workerd. Each one recovers a stream reset
// before its first token against the loopback fault provider.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, mkdir, readFile, writeFile, copyFile, readdir, rm } from 'node:fs/promises';
import { createServer } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, extname } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';
import { FAULT, prefix, load, count, fixture } from './helpers.mjs';

const run = promisify(execFile);
const wasmDir = fileURLToPath(new URL('../../', import.meta.url));
const bin = (name) => join(wasmDir, 'node_modules', '.bin', name);
const HAPPY = await readFile(new URL('../../../tests/fixtures/openai-chat/happy-usage.sse', import.meta.url), 'utf8');

let work;
let app;
let tarball;

before(async () => {
  work = await mkdtemp(join(tmpdir(), 'recovery-pack-'));
  await run('npm', ['pack', '--pack-destination', work, '--silent'], { cwd: wasmDir, maxBuffer: 1 << 26 });
  const packed = (await readdir(work)).filter((f) => f.endsWith('.tgz'));
  assert.equal(packed.length, 1, `one tarball: ${packed}`);
  tarball = join(work, packed[0]);
  app = join(work, 'app');
  await mkdir(app);
  await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'app', private: true, type: 'module' }));
  await run('npm', ['install', '--no-audit', '--no-fund', '--no-package-lock', tarball], { cwd: app });
});

after(async () => {
  if (work) await rm(work, { recursive: true, force: true });
});

/** A path on the provider whose first answer resets before any output. */
async function resetThenHappy(name) {
  const path = `${prefix(name)}/v1/chat/completions`;
  await load({ [path]: [fixture('openai-chat/role-only-then-cut.sse', { ending: 'rst' }), fixture('openai-chat/happy-usage.sse')] });
  return path;
}

const CLIENT = (importLine) => `${importLine}
const events = [];
const rfetch = createRecoveringFetch({ backoffBaseMs: 1, backoffCeilingMs: 2, onEvent: (e) => events.push(e.event) });
const res = await rfetch(process.argv[2], { method: 'POST', body: '{"stream":true}' });
const text = await res.text();
console.log(JSON.stringify({ text, last: events.at(-1), attempts: res.recovery.report().attempts.length }));
`;

test('the tarball holds the built wasm, both entries, the types and the licenses, and nothing else', async () => {
  const { stdout } = await run('tar', ['-tzf', tarball]);
  const files = stdout.split('\n').filter(Boolean).map((f) => f.replace(/^package\//, '')).sort();
  for (const f of ['package.json', 'README.md', 'LICENSE-MIT', 'LICENSE-APACHE', 'index.d.ts', 'pkg/index.d.cts',
    'pkg/shell.mjs', 'pkg/shell.cjs',
    ...['all', 'openai-chat', 'openai-responses', 'anthropic', 'gemini', 'ollama', 'sse'].flatMap((m) => [
      'recovery_wasm_bg.wasm', 'glue.web.js', 'glue.node.mjs', 'glue.node.cjs', 'web.mjs', 'node.mjs', 'node.cjs', 'workerd.mjs',
    ].map((f) => `pkg/${m}/${f}`))]) {
    assert.ok(files.includes(f), `${f} missing from ${files}`);
  }
  assert.ok(!files.some((f) => f.startsWith('tests/') || f.startsWith('js/') || f.startsWith('src/') || f.startsWith('node_modules/')), `${files}`);
  const manifest = JSON.parse(await readFile(join(app, 'node_modules', 'recovery-wasm', 'package.json'), 'utf8'));
  assert.equal(manifest.private, undefined, 'publishable');
});

test('Node ESM: import from the installed package', async () => {
  const path = await resetThenHappy('pack-esm');
  await writeFile(join(app, 'esm.mjs'), CLIENT("import { createRecoveringFetch } from 'recovery-wasm';"));
  const { stdout } = await run('node', ['esm.mjs', `${FAULT}${path}`], { cwd: app });
  const out = JSON.parse(stdout);
  assert.equal(out.text, HAPPY);
  assert.equal(out.last, 'completed');
  assert.equal(out.attempts, 2);
  assert.equal(await count(path), 2);
});

test('Node CommonJS: require the installed package', async () => {
  const path = await resetThenHappy('pack-cjs');
  const body = CLIENT("const { createRecoveringFetch } = require('recovery-wasm');");
  // CommonJS has no top-level await.
  await writeFile(join(app, 'cjs.cjs'), `(async () => {\n${body}\n})().catch((e) => { console.error(e); process.exit(1); });\n`);
  const { stdout } = await run('node', ['cjs.cjs', `${FAULT}${path}`], { cwd: app });
  const out = JSON.parse(stdout);
  assert.equal(out.text, HAPPY);
  assert.equal(out.last, 'completed');
  assert.equal(await count(path), 2);
});

const TYPES = {
  '.html': 'text/html',
  '.js': 'text/javascript',
  '.wasm': 'application/wasm',
};

test('browser: an esbuild bundle of the installed package in headless Chromium', async () => {
  const path = await resetThenHappy('pack-browser');
  const site = join(app, 'site');
  await mkdir(site, { recursive: true });
  await writeFile(join(app, 'browser.mjs'), `import { createRecoveringFetch } from 'recovery-wasm';
window.run = async (url) => {
  const events = [];
  const rfetch = createRecoveringFetch({ backoffBaseMs: 1, backoffCeilingMs: 2, onEvent: (e) => events.push(e.event) });
  const res = await rfetch(url, { method: 'POST', body: '{"stream":true}' });
  return { text: await res.text(), last: events.at(-1) };
};
`);
  await run(bin('esbuild'), ['browser.mjs', '--bundle', '--format=esm', '--platform=browser', '--log-level=warning',
    '--outfile=site/dist/app.js'], { cwd: app });
  // esbuild leaves `new URL('./recovery_wasm_bg.wasm', import.meta.url)`
  // as it is: the module is served next to the bundle.
  await copyFile(join(app, 'node_modules', 'recovery-wasm', 'pkg', 'all', 'recovery_wasm_bg.wasm'), join(site, 'dist', 'recovery_wasm_bg.wasm'));
  await writeFile(join(site, 'index.html'), '<!doctype html><script type="module" src="/dist/app.js"></script>');
  const server = createServer(async (req, res) => {
    try {
      const file = join(site, new URL(req.url, 'http://x').pathname.replace(/^\/$/, '/index.html'));
      const data = await readFile(file);
      res.writeHead(200, { 'content-type': TYPES[extname(file)] ?? 'application/octet-stream' }).end(data);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${server.address().port}/`);
    await page.waitForFunction(() => typeof window.run === 'function');
    const out = await page.evaluate((url) => window.run(url), `${FAULT}${path}`);
    assert.equal(out.text, HAPPY);
    assert.equal(out.last, 'completed');
    assert.equal(await count(path), 2);
  } finally {
    await browser.close();
    server.close();
  }
});

test('workerd: an esbuild worker bundle of the installed package', async () => {
  const path = await resetThenHappy('pack-workerd');
  await writeFile(join(app, 'worker.mjs'), `import { createRecoveringFetch } from 'recovery-wasm';
export default {
  async fetch(request) {
    const upstream = new URL(request.url).searchParams.get('upstream');
    const events = [];
    const rfetch = createRecoveringFetch({ backoffBaseMs: 1, backoffCeilingMs: 2, onEvent: (e) => events.push(e.event) });
    const res = await rfetch(upstream, { method: 'POST', body: '{"stream":true}' });
    return Response.json({ text: await res.text(), last: events.at(-1) });
  },
};
`);
  // As wrangler bundles it: the \`workerd\` condition, the .wasm left as a
  // module import that the runtime compiles ahead of time.
  await run(bin('esbuild'), ['worker.mjs', '--bundle', '--format=esm', '--platform=browser', '--conditions=workerd,worker',
    '--external:*.wasm', '--log-level=warning', '--outfile=bundle/worker.mjs'], { cwd: app });
  const bundled = await readFile(join(app, 'bundle', 'worker.mjs'), 'utf8');
  const wasmImport = bundled.match(/from\s+"([^"]+\.wasm)"/);
  assert.ok(wasmImport, 'the bundle imports the wasm module');
  const wasmName = new URL(wasmImport[1], 'file:///bundle/worker.mjs').pathname.slice(1);
  await writeFile(join(app, 'config.capnp'), `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [ (name = "main", worker = .w), (name = "internet", network = (allow = ["local"])) ],
  sockets = [ (name = "http", address = "127.0.0.1:0", http = (), service = "main") ],
);
const w :Workerd.Worker = (
  modules = [
    (name = "bundle/worker.mjs", esModule = embed "bundle/worker.mjs"),
    (name = "${wasmName}", wasm = embed "node_modules/recovery-wasm/pkg/all/recovery_wasm_bg.wasm"),
  ],
  compatibilityDate = "2025-09-01",
);
`);
  const port = await new Promise((resolve) => {
    const s = createNetServer();
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
  const child = spawn(bin('workerd'), ['serve', 'config.capnp', '--socket-addr', `http=127.0.0.1:${port}`], { cwd: app, stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => { stderr += d; });
  try {
    let out;
    for (let i = 0; i < 200 && out === undefined; i++) {
      try {
        const res = await fetch(`http://127.0.0.1:${port}/?upstream=${encodeURIComponent(`${FAULT}${path}`)}`);
        out = await res.json();
      } catch {
        if (child.exitCode !== null) throw new Error(`workerd exited: ${stderr}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    assert.ok(out, `workerd did not answer: ${stderr}`);
    assert.equal(out.text, HAPPY);
    assert.equal(out.last, 'completed');
    assert.equal(await count(path), 2);
  } finally {
    child.kill();
  }
});
