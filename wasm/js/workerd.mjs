// workerd / Cloudflare Workers entry: deployed Workers refuse to compile wasm
// from bytes, so the module is imported as a compiled WebAssembly.Module and
// instantiated synchronously.
import { initSync } from '../pkg/web.js';
import wasmModule from '../pkg/recovery_wasm_bg.wasm';
import * as wasm from '../pkg/web.js';
import { _bind } from './core.mjs';

initSync({ module: wasmModule });
_bind(wasm);

export { createRecoveringFetch, recoveryOf, RecoveryError } from './core.mjs';
