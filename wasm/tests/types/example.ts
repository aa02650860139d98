// A typed use of the package, checked by `tsc --noEmit` (never run).
import { createRecoveringFetch, recoveryOf, RecoveryError, type HedgeCancelReason, type LifecycleEvent, type Proof, type RetryAfterHint, type RecoveryTypeError, type RecoveryStatus } from 'recovery-wasm';

const events: LifecycleEvent[] = [];
const controller = new AbortController();
const rfetch = createRecoveringFetch({
  maxAttempts: 4,
  backoffBaseMs: 250,
  budgetMs: null,
  idleTimeoutMs: 'off',
  retryableCategories: ['transport', 'http'],
  protocol: 'anthropic',
  onEvent: (e) => {
    events.push(e);
    if (e.event === 'completed') console.log(e.logical_id, e.at_ms);
  },
  onStatus: (s: RecoveryStatus) => {
    if (s === 'reconnecting' || s === 'waiting_for_network') console.log('Reconnecting…');
  },
  signal: controller.signal,
  admission: async (ctx) => ctx.nextAttempt <= 2,
});

const idle: number | 'off' = rfetch.policy.idleTimeoutMs;
console.log(idle, rfetch.policy.retryableStatuses.length);

export async function run(url: string): Promise<string> {
  try {
    const res = await rfetch(url, { method: 'POST', body: '{}' });
    const report = res.recovery.report();
    const attempts: number = report.attempts.length;
    const handle = recoveryOf(res);
    if (handle && handle.outcome()?.outcome === 'completed') console.log(attempts);
    const proof: Proof | undefined = report.outcome?.proof;
    const hint: RetryAfterHint = report.attempts[0].retry_after;
    const waited: number = hint.state === 'millis' || hint.state === 'seconds' || hint.state === 'date' ? hint.delay_ms : 0;
    console.log(proof, waited);
    return await res.text();
  } catch (e) {
    if (e instanceof RecoveryError) return e.outcome.outcome;
    if (e instanceof TypeError && 'report' in e) return (e as RecoveryTypeError).report.logical_id;
    throw e;
  }
}

// @ts-expect-error: unknown protocol names are rejected by the types.
createRecoveringFetch({ protocol: 'smtp' });

// @ts-expect-error: the hint carries delay_ms, never the old `delay`.
export const oldHint = (h: RetryAfterHint) => h.delay;

// Failover before the first token: alternates are typed, and so is what the
// report says of them.
export const failover = createRecoveringFetch({
  attemptsPerTarget: 1,
  alternates: [
    { label: 'backup', url: 'https://backup.example/v1/chat/completions', model: 'm2', headers: { authorization: 'Bearer k' } },
    { label: 'claude', url: 'https://api.anthropic.com/v1/messages', protocol: 'anthropic', body: (text) => text.replace('"gpt"', '"claude"') },
  ],
});
export const servedBy = async (url: string): Promise<string | undefined> => (await failover(url)).recovery.report().served_by;

// @ts-expect-error: an alternate needs a label.
createRecoveringFetch({ alternates: [{ url: '/x' }] });

// Hedging the first token: the options, the policy in force and what the
// report says of a race.
export const hedged = createRecoveringFetch({ hedgeAfterMs: 2000, maxHedges: 1 });
const hedgeAfter: number | 'off' = hedged.policy.hedgeAfterMs;
const maxHedges: number = hedged.policy.maxHedges;
console.log(hedgeAfter, maxHedges);
export const raced = async (url: string): Promise<Array<[string | undefined, HedgeCancelReason | undefined]>> =>
  (await hedged(url)).recovery.report().attempts.map((a) => [
    a.role,
    a.result === 'hedge_cancelled' ? (a.reason as HedgeCancelReason) : undefined,
  ]);
createRecoveringFetch({ hedgeAfterMs: 'off' });

// @ts-expect-error: a hedge count is a number.
createRecoveringFetch({ maxHedges: 'two' });
