// Node entry: the experimental-nodejs-module glue instantiates the wasm at
// import time.
import * as wasm from '../pkg/node.mjs';
import { _bind } from './core.mjs';

_bind(wasm);

export { createRecoveringFetch, recoveryOf, RecoveryError } from './core.mjs';
