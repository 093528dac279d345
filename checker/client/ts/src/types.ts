// The client's public types: the Go client's (checker/client), in TypeScript's spelling.
import type { Interceptor, Transport } from "@connectrpc/connect";

/** What decides when the checker cannot be reached: "open" allows, "closed" denies, "local"
 * runs a token bucket per subject and endpoint in this process. */
export type FailMode = "open" | "closed" | "local";

/** The kind of a subject; a custom dimension is named by Subject.customDimension instead. */
export type Dimension = "user" | "ip" | "api_key";

/** One party a check counts against. */
export interface Subject {
  dimension?: Dimension;
  id: string;
  /** Names a custom dimension ("tenant"): rules of `dimension: tenant` count it. */
  customDimension?: string;
}

/** The subject of custom dimension name ("tenant") with value ("acme"). */
export function custom(name: string, value: string): Subject {
  return { customDimension: name, id: value };
}

/** One check. */
export interface Request {
  /** The parties of the call, at most one per dimension; every matching limit must allow. */
  subjects: Subject[];
  /** The path called. */
  endpoint: string;
  /** What the call consumes; 0 or unset means 1. */
  cost?: number;
  /** Decides under that tier (needs the assert-tier permission). */
  tier?: string;
  /** Makes a retried check count once; unset, the client draws one for this check, so that its
   * own retries never charge twice. */
  idempotencyKey?: string;
  /** An entitlement whose balance the check burns by cost. */
  entitlement?: string;
}

/** Who made a Decision. */
export type Source = "checker" | "deny-cache" | "fail-mode";

/** One evaluated limit, for RateLimit-Policy headers. */
export interface Policy {
  ruleId: string;
  limit: number;
  windowMs: number;
  /** What a bucket algorithm admits at once (0 when it is the limit). */
  burst: number;
}

/** The answer to a check. A denial is a Decision with allowed false, never an error. */
export interface Decision {
  allowed: boolean;
  /** ruleId, limit, remaining and resetAt are the deciding limit's ("" and 0 when none). */
  ruleId: string;
  limit: number;
  remaining: number;
  /** Unix seconds; 0 when unknown. */
  resetAt: number;
  /** How long to wait when denied; 0 when allowed. */
  retryAfterMs: number;
  /** When allowed, how long to wait before going on (a rule with on_limit: delay). */
  delayMs: number;
  policies: Policy[];
  /** The evaluated limits' ids that denied (enforced ones only). */
  violated: string[];
  /** The checker had seen the idempotency key and charged nothing. */
  replayed: boolean;
  /** A fail mode decided: the client's (source "fail-mode") or the checker's own. */
  degraded: boolean;
  source: Source;
  /** Why the fail mode decided. */
  error?: unknown;
  /** "normal", "warning" or "throttled" ("" from the fail mode). */
  state: string;
  tier: string;
  decisionId: string;
  /** Set when an allowed check matched concurrency rules: release it when done. */
  leaseId: string;
  leaseExpiresAtMs: number;
}

/** A minimal logger; console is the default. */
export interface Logger {
  info(msg: string, ...args: unknown[]): void;
  warn(msg: string, ...args: unknown[]): void;
  error(msg: string, ...args: unknown[]): void;
}

/** Configures a Client. Every field is optional: Connect over fetch, 250 ms per attempt, 2
 * retries, fail open, the deny cache on, coalescing within 1 ms up to 64 checks. */
export interface ClientConfig {
  /** Carries the calls; unset, a fetch-based Connect transport of baseUrl (Node 20+, Bun,
   * Deno, Workers). `@quotaflow/client/node` makes a faster one for Node. */
  transport?: Transport;
  /** "connect" (the default) or "grpc-web", for the default transport. */
  protocol?: "connect" | "grpc-web";
  /** The fetch the default transport uses; unset, globalThis.fetch. */
  fetch?: typeof globalThis.fetch;
  /** Sent as "Authorization: Bearer <token>" (a caller of --callers-file). */
  token?: string;
  /** Further Connect interceptors. */
  interceptors?: Interceptor[];
  /** Bounds each attempt; default 250. The caller's signal or timeoutMs bounds them all. */
  timeoutMs?: number;
  /** Retries of a call that failed transiently, with the same idempotency keys; default 2,
   * negative none. */
  retries?: number;
  /** The wait before the first retry, doubled before each next one, with jitter; default 10. */
  backoffMs?: number;
  /** Default "open"; each call may name its own. */
  failMode?: FailMode;
  /** FailLocal's buckets: checks per second and at most how many at once; default 10 and 20. */
  localRate?: number;
  localBurst?: number;
  /** After a failed call checks go straight to the fail mode for this long; default 1000. */
  probeIntervalMs?: number;
  /** Turns the deny cache off: every check asks the checker. */
  noDenyCache?: boolean;
  /** How long a check that arrives while a batch is in flight waits at most for others to
   * travel with it in one CheckRateLimits; default 1, negative turns coalescing off. */
  batchWaitMs?: number;
  /** A batch leaves as soon as it holds this many checks; default 64. */
  batchMax?: number;
  /** Default console. */
  logger?: Logger;
}

/** Options of one call. */
export interface CallOptions {
  /** Ends the call (and its retries) when aborted, as a Go context does. */
  signal?: AbortSignal;
  /** The caller's deadline for the whole call, retries included. */
  timeoutMs?: number;
  /** This call's fail mode, instead of the client's. */
  failMode?: FailMode;
}

/** What an allowed reserve holds: estimate charged until settle or cancel, or until expiresAtMs. */
export interface Reservation {
  id: string;
  expiresAtMs: number;
  estimate: number;
}

/** What a settle did. */
export interface Settlement {
  estimate: number;
  actual: number;
  /** Actual exceeded the estimate by more than a limit had left: charged all the same. */
  overage: boolean;
  /** The least any of the reservation's limits has left. */
  remaining: number;
}

/** Usage measured outside a check that burns a balance (RecordUsage). */
export interface Usage {
  entitlement: string;
  subject: string;
  amount: number;
  /** Identifies the usage; unset, the client draws one so that its own retries burn once. */
  eventId?: string;
  endpoint?: string;
}

export interface GrantBalance {
  id: string;
  amount: number;
  remaining: number;
  priority: number;
  effectiveAtMs: number;
  expiresAtMs: number;
  recurring: boolean;
  live: boolean;
  voidedAtMs: number;
  reason: string;
}

/** A subject's balance of an entitlement (GetBalance). */
export interface Balance {
  entitlement: string;
  dimension: string;
  subject: string;
  periodStartMs: number;
  periodEndMs: number;
  used: number;
  overage: number;
  remaining: number;
  grants: GrantBalance[];
}

/** What RecordUsage did. */
export interface UsageResult {
  decisionId: string;
  replayed: boolean;
  taken: number;
  excess: number;
  balance?: Balance;
}

/** Thrown for a bad configuration or argument; option names the field at fault. */
export class ConfigError extends Error {
  readonly option: string;
  constructor(option: string, message: string) {
    super(`quotaflow: ${option}: ${message}`);
    this.name = "ConfigError";
    this.option = option;
  }
}
