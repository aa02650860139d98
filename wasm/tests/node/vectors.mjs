// The conformance vectors for the JS runners: `conformance-js` prepares
// them and checks what a runner observed against their expectations.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const TOOL = process.env.RECOVERY_CONFORMANCE_JS
  ?? fileURLToPath(new URL('../../../target/debug/conformance-js', import.meta.url));

/** The vectors, prepared for a JS runner. */
export function prepared() {
  return JSON.parse(execFileSync(TOOL, ['prepare'], { encoding: 'utf8', maxBuffer: 1 << 26 }));
}

/** Checks `observed` against the vectors: `{ ok, output }`. */
export function check(observed) {
  const file = join(mkdtempSync(join(tmpdir(), 'recovery-conformance-')), 'observed.json');
  writeFileSync(file, JSON.stringify(observed));
  const r = spawnSync(TOOL, ['check', file], { encoding: 'utf8' });
  return { ok: r.status === 0, output: `${r.stdout}${r.stderr}` };
}

// Vectors fetch cannot express (a failure it cannot show), by name: none
// today. A vector the rule refuses must be listed here and in README.md.
export const NOT_FOR_FETCH = [];

