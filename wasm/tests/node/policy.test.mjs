// The policy spec through the npm options: the cases of
// tests/conformance/policy/knobs.json (the file the gateway, recover, the
// Python package and the vectors are held to) build the same policy here,
// by the same names in camelCase, with 'off' or null turning a bound off;
// a refused spec throws with the same words; `rfetch.policy` shows it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { createRecoveringFetch } from '../../pkg/all/node.mjs';

const KNOBS = JSON.parse(await readFile(new URL('../../../tests/conformance/policy/knobs.json', import.meta.url), 'utf8'));
const camel = (name) => name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
const options = (spec, off = 'off') =>
  Object.fromEntries(Object.entries(spec).map(([k, v]) => [camel(k), v === 'off' ? off : v]));

test('every case builds the policy it says, in camelCase', () => {
  for (const c of KNOBS.cases) {
    const rfetch = createRecoveringFetch(options(c.spec));
    assert.deepEqual(rfetch.policy, options({ ...KNOBS.defaults, ...c.policy }), JSON.stringify(c.spec));
  }
});

test("null turns a bound off as 'off' does", () => {
  const off = KNOBS.cases.filter((c) => Object.values(c.spec).includes('off'));
  assert.ok(off.length >= 4);
  for (const c of off) {
    const rfetch = createRecoveringFetch(options(c.spec, null));
    assert.deepEqual(rfetch.policy, options({ ...KNOBS.defaults, ...c.policy }), JSON.stringify(c.spec));
  }
});

test('a refused spec throws a RangeError with the same words', () => {
  for (const r of KNOBS.refused) {
    assert.throws(
      () => createRecoveringFetch(options(r.spec)),
      (e) => e instanceof RangeError && e.code === 'invalid_option' && e.message === `invalid recovery policy: ${r.error}`,
      JSON.stringify(r.spec),
    );
  }
});

test('a value of the wrong type is a TypeError; one out of range a RangeError naming the knob', () => {
  for (const bad of [{ maxAttempts: '3' }, { idleTimeoutMs: 'soon' }, { idempotencyKey: 1 }, { retryableStatuses: 503 }]) {
    assert.throws(() => createRecoveringFetch(bad), (e) => e instanceof TypeError && e.code === 'invalid_option', JSON.stringify(bad));
  }
  assert.throws(() => createRecoveringFetch({ budgetMs: 1.5 }), /budget_ms: expected a whole number of milliseconds/);
  assert.throws(() => createRecoveringFetch({ endpoint: 'lokal' }), /endpoint: expected one of "remote", "local"/);
  assert.deepEqual(createRecoveringFetch({ maxAttempts: null }).policy.maxAttempts, KNOBS.defaults.max_attempts);
});
