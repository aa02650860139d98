// The suites in a dedicated module worker. The module initialises the wasm
// with a top-level await, so a message posted before that finishes may
// reach no handler: the worker says when it listens.
import { runSuites } from './runner.mjs';

self.onmessage = async (e) => {
  try {
    self.postMessage(await runSuites(e.data));
  } catch (error) {
    self.postMessage({ error: `${error && error.stack ? error.stack : error}` });
  }
};
self.postMessage('listening');
