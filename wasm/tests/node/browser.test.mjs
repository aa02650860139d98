// The shared fetch cases and conformance vectors in headless Chromium, in a
// page and in a dedicated module worker (Playwright; Debian's chromium).
// The page is served from its own origin, so the fault provider and the
// plain server are cross-origin to it, as an application's provider is.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { prepared, check, NOT_FOR_FETCH } from './vectors.mjs';

const root = fileURLToPath(new URL('../../', import.meta.url));
const MIME = { '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.html': 'text/html' };
const fixture = (name) => readFile(new URL(`../../../tests/fixtures/${name}`, import.meta.url), 'utf8');

let server;
let browser;
let page;
let config;

before(async () => {
  server = createServer(async (req, res) => {
    const rel = normalize(decodeURIComponent(new URL(req.url, 'http://x').pathname)).replace(/^\/+/, '');
    if (rel.startsWith('..')) return res.writeHead(403).end();
    try {
      const body = await readFile(join(root, rel));
      res.writeHead(200, { 'content-type': MIME[extname(rel)] ?? 'application/octet-stream' }).end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] });
  page = await browser.newPage();
  await page.goto(`http://127.0.0.1:${server.address().port}/tests/browser/page.html`);
  await page.waitForFunction(() => window.ready === true);
  config = {
    FAULT: process.env.RECOVERY_FAULT_URL.replace(/\/$/, ''),
    PLAIN: process.env.RECOVERY_PLAIN_URL.replace(/\/$/, ''),
    REFUSED: process.env.RECOVERY_REFUSED_URL.replace(/\/$/, ''),
    HAPPY: await fixture('openai-chat/happy-usage.sse'),
    ANTHROPIC_HAPPY: await fixture('anthropic/happy.sse'),
    prepared: prepared(),
  };
});

after(async () => {
  await browser?.close();
  server?.close();
});

function verify(results) {
  assert.equal(results.error, undefined, results.error);
  const failed = results.fetch.filter((r) => r.error !== null);
  assert.deepEqual(failed, [], failed.map((r) => `${r.name}: ${r.error}`).join('\n'));
  assert.ok(results.fetch.length >= 20, `${results.fetch.length} cases`);
  const { observed, skipped, errors } = results.conformance;
  assert.deepEqual(errors, []);
  assert.deepEqual(skipped.map((s) => s.name), NOT_FOR_FETCH);
  assert.ok(observed.length >= 30, `${observed.length} vectors`);
  const { ok, output } = check(observed);
  assert.ok(ok, output);
}

test('Chromium page: every fetch case and conformance vector', { timeout: 120_000 }, async () => {
  verify(await page.evaluate((c) => window.runSuites(c), config));
});

test('Chromium dedicated worker: every fetch case and conformance vector', { timeout: 120_000 }, async () => {
  verify(await page.evaluate((c) => window.runInWorker(c), config));
});
