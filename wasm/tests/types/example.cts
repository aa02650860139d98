// The CommonJS declarations (`require`), checked by `tsc --noEmit`.
import recovery = require('recovery-wasm');

const rfetch = recovery.createRecoveringFetch({
  maxAttempts: 2,
  onStatus: (s: recovery.RecoveryStatus) => console.log(s),
});

export async function run(url: string): Promise<number> {
  const res = await rfetch(url, { method: 'POST', body: '{}' });
  return res.recovery.report().attempts.length;
}
