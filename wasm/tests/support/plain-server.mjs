// A loopback server for what the fault provider never does: answers without
// CORS headers (WS3) or with CORS but without Access-Control-Expose-Headers
// (WS8). It also serves the wasm package's files for the Playwright pages.
// Prints `listening http://127.0.0.1:PORT` first; runs until killed.
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';

const wasmDir = fileURLToPath(new URL('../../', import.meta.url));
const happy = await readFile(new URL('../../../tests/fixtures/openai-chat/happy-usage.sse', import.meta.url));
const counts = new Map();
const MIME = { '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.html': 'text/html', '.json': 'application/json' };

const server = createServer(async (req, res) => {
  const url = new URL(req.url, 'http://x');
  if (req.method === 'OPTIONS') {
    res.writeHead(204, {
      'access-control-allow-origin': '*',
      'access-control-allow-methods': 'GET, POST, OPTIONS',
      'access-control-allow-headers': req.headers['access-control-request-headers'] ?? '*',
    });
    res.end();
    return;
  }
  req.resume();
  const n = (counts.get(req.url) ?? 0) + 1;
  counts.set(req.url, n);
  if (url.pathname === '/count') {
    res.writeHead(200, { 'content-type': 'application/json', 'access-control-allow-origin': '*' });
    res.end(JSON.stringify({ count: counts.get(url.searchParams.get('of')) ?? 0 }));
    return;
  }
  if (url.pathname.startsWith('/nocors/')) {
    // No Access-Control-Allow-Origin at all: browsers reject the fetch.
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(happy);
    return;
  }
  if (url.pathname.startsWith('/noexpose/')) {
    // First request: 503 whose hint is not exposed; then the stream.
    if (n === 1) {
      res.writeHead(503, { 'access-control-allow-origin': '*', 'retry-after-ms': '30', 'content-type': 'text/plain' });
      res.end('busy');
    } else {
      res.writeHead(200, { 'access-control-allow-origin': '*', 'content-type': 'text/event-stream' });
      res.end(happy);
    }
    return;
  }
  if (url.pathname.startsWith('/files/')) {
    const rel = normalize(url.pathname.slice('/files/'.length));
    if (rel.startsWith('..')) { res.writeHead(403); res.end(); return; }
    try {
      const body = await readFile(join(wasmDir, rel));
      res.writeHead(200, { 'content-type': MIME[extname(rel)] ?? 'application/octet-stream' });
      res.end(body);
    } catch {
      res.writeHead(404);
      res.end();
    }
    return;
  }
  res.writeHead(404, { 'access-control-allow-origin': '*' });
  res.end();
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`listening http://127.0.0.1:${server.address().port}\n`);
});
