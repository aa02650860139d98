// Browser and worker entry: fetches and instantiates the wasm next to the
// glue (top-level await), so the API is usable as soon as the import resolves.
import init, * as wasm from '../pkg/web.js';
import { _bind } from './core.mjs';

await init({ module_or_path: new URL('../pkg/recovery_wasm_bg.wasm', import.meta.url) });
_bind(wasm);

export { createRecoveringFetch, recoveryOf, RecoveryError } from './core.mjs';
