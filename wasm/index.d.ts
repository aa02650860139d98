// Hand-written declarations of the recovery-wasm npm package.

/** A lifecycle event: the Rust serde form (flattened identity, `at_ms`, `event` tag). */
export interface LifecycleEvent {
  /** The logical request, 16 hex digits. */
  logical_id: string;
  /** `<logical_id>-<n>`; `null` before the first send. */
  attempt_id: string | null;
  /** 1-based physical send number; 0 before the first send. */
  wire_attempt: number;
  /** Milliseconds since the logical request started. */
  at_ms: number;
  event:
    | 'attempt_started' | 'attempt_succeeded' | 'attempt_failed'
    | 'admission_pending' | 'admission_allowed' | 'admission_rejected' | 'admission_unresolved' | 'admission_required'
    | 'delay_scheduled' | 'failover' | 'retry_started' | 'resume_started' | 'parked_offline' | 'committed'
    | 'hedge_started' | 'hedge_cancelled'
    | 'completed' | 'exhausted' | 'interrupted' | 'cancelled';
  /**
   * Event-specific fields (`category`, `phase`, `reason`, `status`, `stall` (which watchdog, on a timed-out attempt), `delay_ms`, `cause`, `trigger`, `outcome`,
   * `attempts`, ...; `target` on `attempt_started` and `from` / `to` / `reason` on `failover` when the request has alternates;
   * `hedge` (the hedge's send number) and `after_ms` on `hedge_started`, which names the attempt raced;
   * `role` (`'first'` or `'hedge'`) and `reason` (a `HedgeCancelReason`) on `hedge_cancelled`, which names the attempt released;
   * `role` on `committed` when the committing attempt was in a hedging race: `'hedge'` when the hedge's answer is served).
   */
  [field: string]: unknown;
}

/** How a logical request ended (Rust `Outcome`, tagged by `outcome`). */
export interface Outcome {
  outcome:
    | 'completed' | 'unsuccessful' | 'permanent' | 'not_retryable' | 'exhausted' | 'alternates_exhausted' | 'budget_exhausted'
    | 'deadline_exceeded' | 'retry_after_refused' | 'interrupted' | 'protocol' | 'admission_required'
    | 'admission_rejected' | 'admission_unresolved' | 'replay_disabled' | 'cancelled';
  /** Present on `completed`. */
  proof?: Proof;
  /** Present on `alternates_exhausted`: the label of every target tried, in order. */
  targets?: string[];
  [field: string]: unknown;
}

/** A parsed `Retry-After` (or `retry-after-ms`) hint: where it came from and, when usable, the delay. */
export type RetryAfterHint =
  | { state: 'absent' | 'invalid' }
  | { state: 'millis' | 'seconds' | 'date'; delay_ms: number };

/** How strong the proof of a completed stream is (Rust `Proof`, shown by this name). */
export type Proof = 'strong' | 'finish_reason_only';

/**
 * Why an attempt left a hedging race without failing: its rival's first
 * token came first, it ended with no output, or it held back more than
 * `holdbackCap` with no token.
 */
export type HedgeCancelReason = 'rival_won' | 'ended_empty' | 'holdback_cap';

/** One physical send in a report. */
export interface AttemptRecord {
  wire_attempt: number;
  resume: boolean;
  started_ms: number;
  ended_ms: number | null;
  status: number | null;
  /** `hedge_cancelled`: it left a hedging race without failing and was released (`reason`). */
  result: 'in_progress' | 'succeeded' | 'failed' | 'hedge_cancelled';
  /** Why: on `hedge_cancelled` a `HedgeCancelReason`; on `failed` the failure's reason (`transient`, `permanent`, ...). */
  reason?: string;
  /** On a failed attempt: whether the server may have accepted the request (`no`: provably not processed). */
  acceptance?: 'no' | 'yes' | 'unknown';
  retry_after: RetryAfterHint;
  progress: Record<string, number | boolean>;
  request_id: string | null;
  /** The answer's rate-limit headers (`x-ratelimit-*`, `anthropic-ratelimit-*`): numbers and reset tokens only. */
  rate_limits?: {
    requests_limit?: number;
    requests_remaining?: number;
    requests_reset?: string;
    tokens_limit?: number;
    tokens_remaining?: number;
    tokens_reset?: string;
  };
  /** The label of the target it went to, when the request has alternates (`primary` for its own). */
  target?: string;
  /** What it was in a hedging race, when it was in one: the attempt raced, or the hedge racing it. */
  role?: 'first' | 'hedge';
  [field: string]: unknown;
}

/** The safe report of one logical request (Rust `RecoveryReport`). */
export interface RecoveryReport {
  logical_id: string;
  outcome: Outcome | null;
  attempts: AttemptRecord[];
  delays: Array<{ after_attempt: number; delay_ms: number; cause: 'backoff' | 'retry_after' | 'cooldown' }>;
  resend_count: number;
  resumes: number;
  committed_attempt: number | null;
  replay_disabled: 'body_too_large' | 'not_replayable' | null;
  metrics: { time_to_headers_ms: number | null; time_to_first_semantic_ms: number | null; total_ms: number | null };
  /** The label of the target whose answer reached the caller, when the request has alternates. */
  served_by?: string;
  [field: string]: unknown;
}

/**
 * Where a request may go instead of its own endpoint, before its first
 * token: tried in order when the current target fails with something the
 * policy retries (after `attemptsPerTarget` sends), asks for a wait the
 * request may not give, or has a cooldown in force. After output began a
 * failure never switches target.
 */
export interface Alternate {
  /** 1 to 64 of `A-Z a-z 0-9 . _ -`: events and reports carry it. */
  label: string;
  /** Where to send instead: absolute, or a path on the request's origin (default: the request's URL). */
  url?: string;
  /** The top-level `"model"` of the JSON body, replaced (or added). */
  model?: string;
  /** The protocol its answers speak (default: the request's). */
  protocol?: ProtocolName;
  /**
   * Its model's context window, in tokens: a prompt too long for a target
   * moves to the next alternate whose window is larger (or, when none
   * after it declares one, to the next alternate).
   */
  contextWindow?: number;
  /**
   * `'prefill'`: it continues an assistant message it is given; a committed
   * answer cut after text only is continued here (when the endpoint that
   * served it declares no prefill), the delivered text as that message.
   */
  continuation?: 'prefill';
  /** The form it takes the prefill in (with `continuation: 'prefill'`; default `'auto'`). */
  prefillTemplate?: PrefillTemplate;
  /**
   * Headers set on every send to it (its API key). A send to another origin
   * goes without the request's own credentials (`authorization`,
   * `x-api-key`, `api-key`, `x-goog-api-key`, `proxy-authorization`, `cookie`).
   */
  headers?: HeadersInit;
  /** The body to send instead: a string, or a function of the request's body text (called once per request). */
  body?: string | ((body: string) => string | Uint8Array);
}

/** What the admission hook is asked before an ambiguous resend. */
export interface AdmissionContext {
  logicalId: string;
  nextAttempt: number;
  failure: Record<string, unknown>;
}

/** What a UI shows about a request (Rust `RecoveryStatus`), derived from the lifecycle events. */
export type RecoveryStatus = 'in_progress' | 'reconnecting' | 'waiting_for_network' | 'completed' | 'failed' | 'cancelled';

export type ProtocolName = 'auto' | 'openai-chat' | 'openai-responses' | 'anthropic' | 'gemini' | 'ollama' | 'sse';
export type Category = 'transport' | 'http' | 'client_timeout' | 'provider_response';

/**
 * A bound in milliseconds, or `'off'` (`null` is its synonym): the budget,
 * the deadline and the four timeouts. 0 is refused.
 */
export type Bound = number | 'off' | null;

/**
 * Options: the policy spec every front end reads (the gateway's `[policy]`,
 * `recover`'s flags, the Python keywords), in camelCase, with durations in
 * whole milliseconds; plus the JS hooks. A knob left out keeps its default;
 * 0 is refused where it would mean nothing, with the words every front end
 * uses (`invalid recovery policy: idle_timeout_ms: 0 is not a duration; use
 * "off" to turn it off`).
 */
export interface RecoveringFetchOptions {
  /** Physical sends allowed, the first included (default 3). */
  maxAttempts?: number;
  /** Full-jitter backoff base and ceiling (defaults 500 / 8000). */
  backoffBaseMs?: number;
  backoffCeilingMs?: number;
  /** Recovery budget from the first failure; `'off'` for unbounded (default 60000). */
  budgetMs?: Bound;
  /** Deadline from the start of the request; `'off'` for none (the default). */
  deadlineMs?: Bound;
  retryableStatuses?: number[];
  retryableCategories?: Category[];
  /** Largest Retry-After honoured (default 60000) and what to do above it. */
  retryAfterCeilingMs?: number;
  overCeiling?: 'refuse' | 'backoff';
  replayBodyCap?: number;
  holdbackCap?: number;
  evidenceCap?: number;
  /** Largest line, event or whole JSON answer read (default 33554432: an image arrives as one event of several MiB). */
  maxEventBytes?: number;
  maxResumes?: number;
  endpoint?: 'remote' | 'local';
  /** Bound on a silence with no byte at all; `'off'` for none (default 300000). */
  idleTimeoutMs?: Bound;
  /** Bound on a time without a semantic fragment, keepalives aside; `'off'` for none (default 600000). */
  progressTimeoutMs?: Bound;
  /** Bound from a send to its response head; `'off'` for none (default 300000). */
  headTimeoutMs?: Bound;
  /**
   * Bound from a streamed answer's head to its first semantic fragment,
   * before commit; `'off'` for none (the default). Past it the attempt is
   * released and the next send goes to the next alternate, else the same
   * target.
   */
  firstTokenTimeoutMs?: Bound;
  /**
   * Hedges the first token: an attempt that showed no token this long after
   * its send, before any output, is raced by a second send of the request
   * (to the next alternate, else the same target). The first token wins;
   * the other attempt's fetch is aborted at once. `'off'` (the default)
   * never hedges; a `local` endpoint is never hedged. Each hedge is a send
   * (`maxAttempts` and the retry budget bound it).
   */
  hedgeAfterMs?: Bound;
  /** Hedges a request may start in all (default 1). */
  maxHedges?: number;
  /**
   * The context window, in tokens, of the endpoint a request is sent to: a
   * prompt too long for it moves only to an alternate whose declared
   * `contextWindow` is larger.
   */
  contextWindow?: number;
  /** The endpoint is an SSE server that honours `Last-Event-ID` (such as recovery-gateway, whatever SSE protocol it relays): a broken stream is resumed from the last delivered id. */
  resumableSse?: boolean;
  /**
   * Replays a stream that breaks its protocol (malformed or spliced SSE,
   * invalid JSON) before any output, as a reset would be. Default false;
   * after output a violation still fails the request.
   */
  retryProtocolViolations?: boolean;
  /**
   * Sends an `Idempotency-Key` on every send: one key per logical request
   * (`recovery-` and its logical id), the same on every replay and resume.
   * A key the caller set is kept instead. Default false.
   */
  idempotencyKey?: boolean;
  /**
   * The key a request's cooldown is shared under (default: its origin and
   * model): for example one key per provider account, when several models
   * share one organisation's limit. Called with the request's URL and body
   * text; returns a non-empty string.
   */
  cooldownKey?: (url: string, body: string) => string;
  /** Where a request may go instead, before its first token, in order (see `Alternate`). */
  alternates?: Alternate[];
  /** Sends each target gets before the next alternate (default 1). */
  attemptsPerTarget?: number;
  /**
   * Whether the requests of this function share what endpoints ask
   * (`Retry-After`) through `rfetch.cooldowns` (default true).
   */
  cooldowns?: boolean;
  /**
   * Cross-request retry budget shared by every request of this function.
   * On by default (20 % of requests plus 1 retry/s over 10 s); `null`
   * turns it off, an object changes its numbers.
   */
  retryBudget?: { ttlMs?: number; minRetriesPerSec?: number; percent?: number } | null;
  /** The body's protocol; `auto` (default) guesses from the URL path. */
  protocol?: ProtocolName;
  /** Success terminal of a generic `sse` stream. */
  sseTerminal?: { data: string } | { event: string };
  /** Receives every lifecycle event. */
  onEvent?: (event: LifecycleEvent) => void;
  /**
   * Called when what a UI should show changes: `reconnecting` while a
   * failed attempt is retried or resumed ("Reconnecting…"), `waiting_for_network`
   * while parked offline, `in_progress` once output flows again, then one of
   * `completed`, `failed`, `cancelled`.
   */
  onStatus?: (status: RecoveryStatus) => void;
  /** Cancels every request of this function when aborted. */
  signal?: AbortSignal;
  /** The underlying fetch (default: the global `fetch`). */
  fetch?: (input: string, init: RequestInit) => Promise<Response>;
  /** Asked before an ambiguous resend; anything but allow is a refusal. */
  admission?: (context: AdmissionContext) => boolean | 'allow' | 'reject' | Promise<boolean | 'allow' | 'reject'>;
  /**
   * Continues a committed answer no native resume can continue: gets what the
   * consumer already has and a copy of the original request, returns the
   * continuation request (an assistant prefill, a "continue" turn) or `null`.
   * Its output is spliced after the delivered prefix, its own preamble dropped.
   * `'prefill'` declares instead that the endpoint continues an assistant
   * message it is given: an answer cut after text only is sent again with
   * the delivered text as that message (see `prefillTemplate`).
   */
  continuation?: 'prefill' | ((context: ContinuationContext) => Request | RequestInit & { url: string } | null | Promise<Request | null>);
  /**
   * The form of a declared prefill (with `continuation: 'prefill'`):
   * `'auto'` (the default: a plain assistant message on Anthropic,
   * `"prefix": true` on OpenAI Chat), `'assistant'`, `'prefix'` (DeepSeek,
   * Mistral) or `'continue_final_message'` (vLLM).
   */
  prefillTemplate?: PrefillTemplate;
}

/** How a target takes the delivered text back as an assistant prefill. */
export type PrefillTemplate = 'auto' | 'assistant' | 'prefix' | 'continue_final_message';

/** What the continuation hook is given. The delivered text is response text: sensitive. */
export interface ContinuationContext {
  delivered: { text: string; reasoning: string; toolFragments: string[]; truncated: boolean };
  request: Request;
}

/** Reachable from every response: `response.recovery` or `recoveryOf(response)`. */
export interface RecoveryHandle {
  /** The report so far; complete once the body ended. */
  report(): RecoveryReport;
  /** The outcome once the request ended, else `null`. */
  outcome(): Outcome | null;
  /** The protocol the body is decoded as: the answering target's (after a failover or a hedge, an alternate's), read when asked. */
  readonly protocol: string;
}

/** A recovering fetch: `fetch`'s signature; responses carry `recovery`. */
/**
 * The endpoint cooldowns a recovering fetch's requests share: when one
 * learns a `Retry-After` (or `retry-after-ms`), the others bound for the
 * same origin and model (the body's top-level `"model"`, or the URL path
 * when there is none) hold their next send until the same instant, or
 * fail at once refused when they may not wait that long.
 */
export interface Cooldowns {
  /** Notes that the endpoint of a request to `url` with `body` asked for no sends during `ms`. */
  note(url: string, body: string | Uint8Array | undefined, ms: number): void;
  /** Milliseconds sends of a request to `url` with `body` must still wait (0: none). */
  remaining(url: string, body?: string | Uint8Array): number;
}

/**
 * The policy a recovering fetch runs under, every knob of the policy spec
 * (camelCase; `'off'` for a bound that is off): options that build it again.
 */
export interface PolicyInForce {
  readonly maxAttempts: number;
  readonly attemptsPerTarget: number;
  readonly maxResumes: number;
  readonly budgetMs: number | 'off';
  readonly deadlineMs: number | 'off';
  readonly backoffBaseMs: number;
  readonly backoffCeilingMs: number;
  readonly retryAfterCeilingMs: number;
  readonly overCeiling: 'refuse' | 'backoff';
  readonly headTimeoutMs: number | 'off';
  readonly idleTimeoutMs: number | 'off';
  readonly progressTimeoutMs: number | 'off';
  readonly firstTokenTimeoutMs: number | 'off';
  readonly hedgeAfterMs: number | 'off';
  readonly maxHedges: number;
  readonly retryableStatuses: readonly number[];
  readonly retryableCategories: readonly Category[];
  readonly endpoint: 'remote' | 'local';
  readonly replayBodyCap: number;
  readonly holdbackCap: number;
  readonly evidenceCap: number;
  readonly maxEventBytes: number;
  readonly idempotencyKey: boolean;
  readonly retryProtocolViolations: boolean;
}

export type RecoveringFetch = ((input: RequestInfo | URL, init?: RequestInit) => Promise<Response & { readonly recovery: RecoveryHandle }>) & {
  readonly cooldowns: Cooldowns;
  readonly policy: PolicyInForce;
};

/** Thrown (rejected) before any response when attempts run out without an HTTP answer. */
export interface RecoveryTypeError extends TypeError {
  readonly outcome: Outcome;
  readonly report: RecoveryReport;
}

/** The stitched body errors with this when the stream fails after commit. */
export declare class RecoveryError extends Error {
  readonly name: 'RecoveryError';
  readonly outcome: Outcome;
  readonly report: RecoveryReport;
}

/** Builds a recovering fetch. Throws a TypeError/RangeError (`code: "invalid_option"`) on bad options. */
export declare function createRecoveringFetch(options?: RecoveringFetchOptions): RecoveringFetch;

/** The recovery handle of a response returned by a recovering fetch. */
export declare function recoveryOf(response: Response): RecoveryHandle | undefined;
