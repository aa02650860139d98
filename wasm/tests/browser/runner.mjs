// Runs the shared fetch cases and conformance vectors in the page or the
// worker that imports this module, through the `browser` entry of the
// all-protocol module.
import { createRecoveringFetch } from '../../pkg/all/web.mjs';
import * as wasm from '../../pkg/all/glue.web.js';
import { bind, defaultPlatform } from '../../js/shell.mjs';
import { runAll as runCases } from '../shared/fetch-cases.mjs';
import { runAll as runVectors } from '../shared/conformance.mjs';

export async function runSuites(config) {
  const t = {
    ...config,
    create: createRecoveringFetch,
    bind,
    wasm,
    platform: defaultPlatform,
    browser: true,
  };
  const fetch = await runCases(t);
  const conformance = await runVectors(bind, wasm, config.prepared);
  return { fetch, conformance };
}
