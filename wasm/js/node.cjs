// Node CommonJS entry (`require('recovery-wasm')`): the nodejs glue
// instantiates the wasm at require time; the API is the CommonJS build of
// js/core.mjs (pkg/core.cjs, made by the package build).
'use strict';
const wasm = require('../pkg/node.cjs');
const core = require('../pkg/core.cjs');

core._bind(wasm);

exports.createRecoveringFetch = core.createRecoveringFetch;
exports.recoveryOf = core.recoveryOf;
exports.RecoveryError = core.RecoveryError;
