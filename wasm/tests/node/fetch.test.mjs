// The shared fetch cases (tests/shared/fetch-cases.mjs) in Node, through
// the `node` entry of the all-protocol module.
import { test } from 'node:test';
import { readFile } from 'node:fs/promises';
import * as wasm from '../../pkg/all/glue.node.mjs';
import { createRecoveringFetch } from '../../pkg/all/node.mjs';
import { bind, defaultPlatform } from '../../js/shell.mjs';
import { cases } from '../shared/fetch-cases.mjs';

const fixture = (name) => readFile(new URL(`../../../tests/fixtures/${name}`, import.meta.url), 'utf8');
const t = {
  create: createRecoveringFetch,
  bind,
  wasm,
  platform: defaultPlatform,
  FAULT: process.env.RECOVERY_FAULT_URL.replace(/\/$/, ''),
  PLAIN: process.env.RECOVERY_PLAIN_URL.replace(/\/$/, ''),
  REFUSED: process.env.RECOVERY_REFUSED_URL.replace(/\/$/, ''),
  HAPPY: await fixture('openai-chat/happy-usage.sse'),
  ANTHROPIC_HAPPY: await fixture('anthropic/happy.sse'),
  browser: false,
};

for (const [name, fn] of Object.entries(cases)) {
  test(name, () => fn(t));
}
