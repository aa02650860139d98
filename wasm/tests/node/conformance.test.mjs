// The shared conformance vectors through the npm package in Node, on a
// virtual clock (tests/shared/conformance.mjs); `conformance-js` prepares
// them and checks what was observed against their expectations.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as wasm from '../../pkg/all/glue.node.mjs';
import { bind } from '../../js/shell.mjs';
import { runAll, runVector } from '../shared/conformance.mjs';
import { prepared, check, NOT_FOR_FETCH } from './vectors.mjs';

test('every engine vector runs through the npm package and matches', async () => {
  const vectors = prepared();
  assert.ok(vectors.length >= 30, `the vectors: ${vectors.length}`);
  const { observed, skipped, errors } = await runAll(bind, wasm, vectors);
  assert.deepEqual(errors, []);
  assert.deepEqual(skipped.map((s) => s.name), NOT_FOR_FETCH);
  const { ok, output } = check(observed);
  assert.ok(ok, output);
});

test('the runner can fail: a vector run with another jitter does not match', async () => {
  const v = prepared().find((x) => x.name === '503_then_success');
  assert.ok(check([await runVector(bind, wasm, v)]).ok);
  const { ok, output } = check([await runVector(bind, wasm, { ...v, jitter: 1 })]);
  assert.ok(!ok);
  assert.match(output, /delays_ms/);
});
