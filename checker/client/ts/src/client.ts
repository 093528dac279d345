// Client checks rate limits against a quotaflow checker: checker/client/client.go's semantics.
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient, type Client as RPCClient, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";
import {
  CheckRateLimitRequestSchema,
  CheckRateLimitResponseSchema,
  Dimension as PbDimension,
  RateLimiter,
  State,
  SubjectSchema,
  type CheckRateLimitRequest,
  type CheckRateLimitResponse,
  type GetBalanceResponse,
} from "./gen/quotaflow/v1/ratelimit_pb.js";
import { Batcher } from "./batch.js";
import { DenyCache, LocalBuckets, subjectKey } from "./local.js";
import { normalizePath, PathError } from "./urlpath.js";
import {
  ConfigError,
  type Balance,
  type CallOptions,
  type ClientConfig,
  type Decision,
  type FailMode,
  type Logger,
  type Request,
  type Reservation,
  type Settlement,
  type Usage,
  type UsageResult,
} from "./types.js";

/** The per-call options Connect takes. */
interface RPCOptions {
  signal?: AbortSignal;
  timeoutMs: number;
  headers?: Record<string, string>;
}

const dimensions = { user: PbDimension.USER, ip: PbDimension.IP, api_key: PbDimension.API_KEY } as const;
const stateNames: Record<number, string> = { [State.NORMAL]: "normal", [State.WARNING]: "warning", [State.THROTTLED]: "throttled" };
const failModes: readonly FailMode[] = ["open", "closed", "local"];

/** The resolved ClientConfig. */
interface Settings {
  timeoutMs: number;
  retries: number;
  backoffMs: number;
  failMode: FailMode;
  localRate: number;
  localBurst: number;
  probeIntervalMs: number;
  batchWaitMs: number;
  batchMax: number;
  log: Logger;
}

/** A lease's handle: `await using lease = await client.acquire(req)` releases it when the
 * block ends, as `finally { await lease.release() }` does. */
export interface Lease extends AsyncDisposable {
  readonly decision: Decision;
  /** Frees the places in flight now; a second call does nothing. */
  release(options?: CallOptions): Promise<void>;
  /** Holds them for their rules' windows from now; returns the new expiry (unix ms). */
  renew(options?: CallOptions): Promise<number>;
}

/** Checks rate limits. One Client per process and checker: it coalesces concurrent checks. */
export class Client {
  /** The generated Connect client, for the calls this one does not wrap. */
  readonly rpc: RPCClient<typeof RateLimiter>;
  /** @internal */
  readonly cfg: Settings;
  private headers?: Record<string, string>;
  private deny?: DenyCache;
  private local: LocalBuckets;
  private batch?: Batcher;
  private up = true;
  private downUntil = 0;

  /** A client of the checker at baseUrl ("http://checker:8080"); config.transport, when set,
   * replaces the fetch transport and baseUrl goes unused. */
  constructor(baseUrl: string, config: ClientConfig = {}) {
    const cfg = resolve(config);
    this.cfg = cfg;
    if (config.transport === undefined && !/^https?:\/\//.test(baseUrl ?? "")) {
      throw new ConfigError("baseUrl", `want http://host:port or https://host:port, got ${JSON.stringify(baseUrl)}`);
    }
    const transport: Transport =
      config.transport ??
      (config.protocol === "grpc-web" ? createGrpcWebTransport : createConnectTransport)({
        baseUrl,
        useBinaryFormat: true,
        fetch: config.fetch,
        interceptors: config.interceptors,
      });
    this.rpc = createClient(RateLimiter, transport);
    if (config.token) this.headers = { authorization: `Bearer ${config.token}` };
    this.local = new LocalBuckets(cfg.localRate, cfg.localBurst);
    if (!config.noDenyCache) this.deny = new DenyCache();
    if (cfg.batchWaitMs > 0) this.batch = new Batcher(this);
  }

  /** Sends the checks waiting to be coalesced at once. */
  close(): void {
    this.batch?.flushNow();
  }

  /** Asks whether req may go ahead. A denial is a Decision with allowed false, never an error;
   * when the checker cannot be reached the fail mode decides (degraded). It throws for a
   * request the checker refused (a ConnectError: an invalid field, a missing permission) and,
   * with the signal's reason, when the caller's signal ends first. */
  async check(req: Request, options: CallOptions = {}): Promise<Decision> {
    req = validateRequest(req, "check");
    const signal = callSignal(options);
    const now = Date.now();
    const key = subjectKey(req);
    const cached = this.deny?.get(key, req.cost, now);
    if (cached) return cached;
    if (now < this.downUntil) {
      return this.failMode(key, new Error("quotaflow client: checker unreachable, probing again later"), options.failMode);
    }
    const msg = toProto(req);
    let resp: CheckRateLimitResponse;
    try {
      resp = this.batch ? await this.batch.check(msg, signal) : await this.checkOne(msg, signal);
    } catch (err) {
      if (signal?.aborted) throw signal.reason ?? err;
      if (transient(err)) {
        if (this.markDown()) {
          // Once per outage, not once per check of a failed batch.
          this.cfg.log.warn(`quotaflow client: checker unreachable, fail mode ${options.failMode ?? this.cfg.failMode} decides: ${errorText(err)}`);
        }
        return this.failMode(key, err, options.failMode);
      }
      throw err;
    }
    this.markUp();
    const [d, endsEarly] = decision(resp);
    // A fail mode's denial says nothing of the buckets: only a real one is cached.
    if (this.deny && !d.allowed && d.retryAfterMs > 0 && !d.degraded && !endsEarly) {
      this.deny.put(key, req.cost, d, now + d.retryAfterMs);
    }
    return d;
  }

  /** @internal One CheckRateLimit, retried while it fails transiently. */
  async checkOne(msg: CheckRateLimitRequest, signal?: AbortSignal): Promise<CheckRateLimitResponse> {
    return this.retry(signal, (o) => this.rpc.checkRateLimit(msg, o));
  }

  /** @internal Calls f, each attempt bounded by timeoutMs, until it succeeds, fails for good,
   * or `retries` retries failed transiently. The requests f sends carry idempotency keys, so a
   * retry of a check the checker did decide is replayed, not charged again. */
  async retry<T>(signal: AbortSignal | undefined, f: (o: RPCOptions) => Promise<T>): Promise<T> {
    let backoff = this.cfg.backoffMs;
    for (let attempt = 0; ; attempt++) {
      try {
        return await f({ signal, timeoutMs: this.cfg.timeoutMs, headers: this.headers });
      } catch (err) {
        if (!transient(err) || signal?.aborted || attempt >= this.cfg.retries) throw err;
        // Jitter: half the wait fixed, half drawn, so that the clients of one outage do not
        // come back in step.
        const wait = backoff / 2 + (Math.random() * backoff) / 2;
        backoff *= 2;
        if (!(await sleep(wait, signal))) throw err;
      }
    }
  }

  private markDown(): boolean {
    const was = this.up;
    this.up = false;
    this.downUntil = Date.now() + this.cfg.probeIntervalMs;
    return was;
  }

  private markUp(): void {
    if (!this.up) this.cfg.log.info("quotaflow client: checker reachable");
    this.up = true;
    this.downUntil = 0;
  }

  /** The Decision of the fail mode for a check of key that could not reach the checker. */
  private failMode(key: string, err: unknown, mode: FailMode = this.cfg.failMode): Decision {
    const d = emptyDecision(true);
    d.degraded = true;
    d.source = "fail-mode";
    d.error = err;
    if (mode === "closed") {
      d.allowed = false;
      d.retryAfterMs = this.cfg.probeIntervalMs;
    } else if (mode === "local") {
      [d.allowed, d.retryAfterMs] = this.local.take(key, Date.now());
      d.limit = this.cfg.localBurst;
    }
    return d;
  }

  /** Checks req and returns a Lease of its places in flight (concurrency rules), released when
   * an `await using` block ends or by lease.release(). A denied or lease-less check's release
   * does nothing. */
  async acquire(req: Request, options: CallOptions = {}): Promise<Lease> {
    const d = await this.check(req, options);
    let released = false;
    const release = async (o: CallOptions = {}) => {
      if (released || !d.leaseId) return;
      released = true;
      await this.releaseLease(d.leaseId, o);
    };
    return {
      decision: d,
      release,
      renew: (o: CallOptions = {}) => this.renewLease(d.leaseId, o),
      [Symbol.asyncDispose]: () => this.releaseQuietly(d, release),
    };
  }

  /** Checks req and, when allowed, runs fn and releases the check's lease (if any) after it,
   * whether it returns or throws. A denial returns the Decision without running fn. */
  async withLease<T>(req: Request, fn: (d: Decision) => Promise<T> | T, options: CallOptions = {}): Promise<{ decision: Decision; value?: T }> {
    const lease = await this.acquire(req, options);
    if (!lease.decision.allowed) return { decision: lease.decision };
    try {
      return { decision: lease.decision, value: await fn(lease.decision) };
    } finally {
      await lease[Symbol.asyncDispose]();
    }
  }

  /** @internal Releases d's lease with a deadline of its own; a failure is logged: the places
   * then free themselves at their expiry. */
  async releaseQuietly(d: Decision, release?: () => Promise<void>): Promise<void> {
    if (!d.leaseId) return;
    try {
      await (release ? release() : this.releaseLease(d.leaseId));
    } catch (err) {
      this.cfg.log.warn(`quotaflow client: lease not released, its places free themselves at ${new Date(d.leaseExpiresAtMs).toISOString()}: ${errorText(err)}`);
    }
  }

  /** Frees the places in flight of an allowed check (Decision.leaseId). The checker answers
   * NotFound for an id that holds nothing and FailedPrecondition for one that expired. */
  async releaseLease(id: string, options: CallOptions = {}): Promise<void> {
    await this.retry(callSignal(options), (o) => this.rpc.releaseLease({ leaseId: id }, o));
  }

  /** Holds a check's places for their rules' windows from now; returns the new expiry (unix ms). */
  async renewLease(id: string, options: CallOptions = {}): Promise<number> {
    const r = await this.retry(callSignal(options), (o) => this.rpc.renewLease({ leaseId: id }, o));
    return Number(r.expiresAtMs);
  }

  /** Asks whether req may go ahead at an estimated cost (req.cost unset), charging the
   * estimate until settle or cancel, or for ttlMs (0: the checker's default, 5 minutes). Sent
   * once, never retried: a reservation has no idempotency key. When the checker cannot be
   * reached the fail mode decides, with no reservation (nothing was charged). */
  async reserve(req: Request, estimate: number, options: CallOptions & { ttlMs?: number } = {}): Promise<{ decision: Decision; reservation?: Reservation }> {
    req = validateRequest(req, "reserve");
    if (req.cost || req.idempotencyKey) {
      throw new ConfigError("cost", "leave cost and idempotencyKey unset in a reserve: the estimate is the cost");
    }
    if (!Number.isSafeInteger(estimate) || estimate < 1) throw new ConfigError("estimate", `want a whole number of 1 or more, got ${estimate}`);
    const signal = callSignal(options);
    const msg = toProto(req);
    msg.idempotencyKey = "";
    let resp;
    try {
      resp = await this.rpc.reserve(
        { check: msg, estimate: BigInt(estimate), ttlMs: BigInt(Math.round(options.ttlMs ?? 0)) },
        { signal, timeoutMs: this.cfg.timeoutMs, headers: this.headers },
      );
    } catch (err) {
      if (signal?.aborted) throw signal.reason ?? err;
      if (transient(err)) return { decision: this.failMode(subjectKey(req), err, options.failMode) };
      throw err;
    }
    const [d] = decision(resp.result ?? create(CheckRateLimitResponseSchema));
    if (!resp.reservationId) return { decision: d };
    return { decision: d, reservation: { id: resp.reservationId, expiresAtMs: Number(resp.expiresAtMs), estimate } };
  }

  /** Charges (or refunds) the difference between actual and the reservation's estimate,
   * retried while it fails transiently: a retry whose first attempt did settle is told
   * FailedPrecondition, taken for success. */
  async settle(id: string, actual: number, options: CallOptions = {}): Promise<Settlement> {
    if (!Number.isSafeInteger(actual) || actual < 0) throw new ConfigError("actual", `want a whole number of 0 or more, got ${actual}`);
    let attempts = 0;
    try {
      const m = await this.retry(callSignal(options), (o) => {
        attempts++;
        return this.rpc.settle({ reservationId: id, actual: BigInt(actual) }, o);
      });
      return { estimate: Number(m.estimate), actual: Number(m.actual), overage: m.overage, remaining: Number(m.remaining) };
    } catch (err) {
      if (attempts > 1 && codeOf(err) === Code.FailedPrecondition) return { estimate: 0, actual, overage: false, remaining: 0 };
      throw err;
    }
  }

  /** Refunds a reservation's whole estimate; errors as settle's. */
  async cancel(id: string, options: CallOptions = {}): Promise<void> {
    let attempts = 0;
    try {
      await this.retry(callSignal(options), (o) => {
        attempts++;
        return this.rpc.cancel({ reservationId: id }, o);
      });
    } catch (err) {
      if (!(attempts > 1 && codeOf(err) === Code.FailedPrecondition)) throw err;
    }
  }

  /** Reserves estimate for req and, when allowed, runs fn and settles the reservation at the
   * cost fn reports (a number, or { actual, value }); when fn throws, the reservation is
   * cancelled (its estimate refunded) and the error rethrown. A denial returns the Decision
   * without running fn. The settle is not bounded by the caller's signal: the charge must not
   * stay at the estimate because the caller gave up. */
  async reserved<T = undefined>(
    req: Request,
    estimate: number,
    fn: (r: { decision: Decision; reservation?: Reservation; signal?: AbortSignal }) => Promise<number | { actual: number; value: T }>,
    options: CallOptions = {},
  ): Promise<{ decision: Decision; value?: T; settlement?: Settlement }> {
    const { decision: d, reservation: r } = await this.reserve(req, estimate, options);
    if (!d.allowed) return { decision: d };
    let out: number | { actual: number; value: T };
    try {
      out = await fn({ decision: d, reservation: r, signal: options.signal });
    } catch (err) {
      if (r) {
        await this.cancel(r.id).catch((cerr) => this.cfg.log.warn(`quotaflow client: reservation ${r.id} not cancelled, its estimate stands until ${new Date(r.expiresAtMs).toISOString()}: ${errorText(cerr)}`));
      }
      throw err;
    }
    const [actual, value] = typeof out === "number" ? [out, undefined] : [out.actual, out.value];
    if (!r) return { decision: d, value }; // a fail mode's admission: nothing to settle
    const settlement = await this.settle(r.id, Math.max(0, Math.round(actual)));
    return { decision: d, value, settlement };
  }

  /** A subject's balance of an entitlement (GetBalance), retried like a check. */
  async balance(entitlement: string, subject: string, options: CallOptions = {}): Promise<Balance> {
    if (!entitlement) throw new ConfigError("entitlement", "required");
    if (!subject) throw new ConfigError("subject", "required");
    const r = await this.retry(callSignal(options), (o) => this.rpc.getBalance({ entitlement, subject }, o));
    return balanceOf(r);
  }

  /** Burns usage from its subject's balance, once per event id (drawn when unset, so that the
   * client's own retries burn once). */
  async recordUsage(u: Usage, options: CallOptions = {}): Promise<UsageResult> {
    if (!u.entitlement) throw new ConfigError("entitlement", "required");
    if (!u.subject) throw new ConfigError("subject", "required");
    if (!Number.isSafeInteger(u.amount) || u.amount < 1) throw new ConfigError("amount", `want a whole number of 1 or more, got ${u.amount}`);
    const req = { entitlement: u.entitlement, subject: u.subject, amount: BigInt(u.amount), eventId: u.eventId || newKey(), endpoint: u.endpoint ?? "" };
    const r = await this.retry(callSignal(options), (o) => this.rpc.recordUsage(req, o));
    return { decisionId: r.decisionId, replayed: r.replayed, taken: Number(r.taken), excess: Number(r.excess), balance: r.balance && balanceOf(r.balance) };
  }
}

function resolve(c: ClientConfig): Settings {
  const num = (name: keyof ClientConfig, v: number | undefined, def: number, min: number) => {
    if (v === undefined || v === 0) return def;
    if (typeof v !== "number" || !Number.isFinite(v) || v < min) throw new ConfigError(name, `want a number of at least ${min}, got ${v}`);
    return v;
  };
  if (c.failMode !== undefined && !failModes.includes(c.failMode)) {
    throw new ConfigError("failMode", `want "open", "closed" or "local", got ${JSON.stringify(c.failMode)}`);
  }
  if (c.protocol !== undefined && c.protocol !== "connect" && c.protocol !== "grpc-web") {
    throw new ConfigError("protocol", `want "connect" or "grpc-web", got ${JSON.stringify(c.protocol)}`);
  }
  return {
    localRate: num("localRate", c.localRate, 10, Number.MIN_VALUE),
    timeoutMs: num("timeoutMs", c.timeoutMs, 250, 1),
    retries: retriesOf(c.retries),
    backoffMs: num("backoffMs", c.backoffMs, 10, 0),
    failMode: c.failMode ?? "open",
    localBurst: num("localBurst", c.localBurst, 20, 1),
    probeIntervalMs: num("probeIntervalMs", c.probeIntervalMs, 1000, 1),
    batchWaitMs: c.batchWaitMs === undefined || c.batchWaitMs === 0 ? 1 : c.batchWaitMs,
    batchMax: num("batchMax", c.batchMax, 64, 1),
    log: c.logger ?? console,
  };
}

function retriesOf(r: number | undefined): number {
  if (r === undefined || r === 0) return 2;
  if (typeof r !== "number" || Number.isNaN(r)) throw new ConfigError("retries", `want a number, got ${r}`);
  return r < 0 ? 0 : Math.floor(r);
}

/** The longest endpoint path the checker takes (its MaxEndpointLen), in bytes of UTF-8. */
const maxEndpointBytes = 1024;
const utf8 = new TextEncoder();

/** Checks req and returns it with its endpoint in the checker's normal form, as the checker
 * matches it: the deny cache and the local buckets key on that form, so that another spelling
 * of a denied path finds the denial. A path the checker would refuse is refused here. */
function validateRequest(req: Request, what: string): Request {
  if (!req || typeof req !== "object") throw new ConfigError("request", `${what} needs a request`);
  if (!Array.isArray(req.subjects) || req.subjects.length === 0) throw new ConfigError("subjects", `${what} needs at least one subject`);
  for (const s of req.subjects) {
    if (!s.id) throw new ConfigError("subjects", "a subject without an id");
    if (s.dimension && !(s.dimension in dimensions)) throw new ConfigError("subjects", `unknown dimension ${JSON.stringify(s.dimension)}: want user, ip or api_key, or a customDimension`);
    if (!s.dimension && !s.customDimension) throw new ConfigError("subjects", `subject ${JSON.stringify(s.id)} has neither a dimension nor a customDimension`);
  }
  if (typeof req.endpoint !== "string") throw new ConfigError("endpoint", `want a path starting with /, got ${JSON.stringify(req.endpoint)}`);
  if (req.cost !== undefined && (!Number.isSafeInteger(req.cost) || req.cost < 0)) throw new ConfigError("cost", `want a whole number of 0 or more, got ${req.cost}`);
  const path = req.endpoint.split(/[?#]/, 1)[0];
  // A UTF-16 unit is at most 3 bytes of UTF-8: most paths are measured without encoding them.
  if (path.length > maxEndpointBytes || (path.length * 3 > maxEndpointBytes && utf8.encode(path).length > maxEndpointBytes)) {
    throw new ConfigError("endpoint", `must be at most ${maxEndpointBytes} bytes, got ${utf8.encode(path).length}`);
  }
  try {
    return { ...req, endpoint: normalizePath(req.endpoint) };
  } catch (err) {
    if (err instanceof PathError) throw new ConfigError("endpoint", `${JSON.stringify(req.endpoint)} ${err.message}`);
    throw err;
  }
}

/** A signal ending at the caller's signal or timeoutMs, whichever is first. */
function callSignal(o: CallOptions): AbortSignal | undefined {
  if (o.timeoutMs === undefined) return o.signal;
  if (!(o.timeoutMs > 0)) throw new ConfigError("timeoutMs", `want a positive number of milliseconds, got ${o.timeoutMs}`);
  const t = AbortSignal.timeout(o.timeoutMs);
  return o.signal ? AbortSignal.any([o.signal, t]) : t;
}

/** @internal */
export function toProto(r: Request): CheckRateLimitRequest {
  const m = create(CheckRateLimitRequestSchema, {
    endpoint: r.endpoint,
    cost: BigInt(r.cost ?? 0),
    tier: r.tier ?? "",
    idempotencyKey: r.idempotencyKey || newKey(),
    timestamp: BigInt(Date.now()),
    entitlement: r.entitlement ?? "",
  });
  r.subjects.forEach((s, i) => {
    if (i === 0 && !s.customDimension) {
      m.identifier = s.id;
      m.dimension = dimensions[s.dimension!];
      return;
    }
    m.subjects.push(create(SubjectSchema, { dimension: s.customDimension ? PbDimension.UNSPECIFIED : dimensions[s.dimension!], identifier: s.id, customDimension: s.customDimension ?? "" }));
  });
  return m;
}

/** A random idempotency key: 128 bits, so that two checks never share one. */
export function newKey(): string {
  const b = new Uint8Array(16);
  crypto.getRandomValues(b);
  let s = "qfc-";
  for (const x of b) s += x.toString(16).padStart(2, "0");
  return s;
}

/** Whether a call that failed with err may succeed if sent again. Canceled is among them, as a
 * broken connection may be reported so; a caller that did cancel is told apart by its signal. */
export function transient(err: unknown): boolean {
  switch (codeOf(err)) {
    case Code.Unavailable:
    case Code.DeadlineExceeded:
    case Code.Aborted:
    case Code.Unknown:
    case Code.Canceled:
      return true;
  }
  return false;
}

function codeOf(err: unknown): Code {
  return err instanceof ConnectError ? err.code : ConnectError.from(err).code;
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Waits ms, or until signal aborts; reports whether the whole wait passed. */
function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      resolve(false);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** @internal */
export function emptyDecision(allowed: boolean): Decision {
  return {
    allowed, ruleId: "", limit: 0, remaining: 0, resetAt: 0, retryAfterMs: 0, delayMs: 0, policies: [], violated: [],
    replayed: false, degraded: false, source: "checker", state: "", tier: "", decisionId: "", leaseId: "", leaseExpiresAtMs: 0,
  };
}

/** The Decision of a checker's answer, and whether its denial may end before its retry (a
 * concurrency place released, a balance topped up): such a denial is not cached. */
function decision(r: CheckRateLimitResponse): [Decision, boolean] {
  const d = emptyDecision(r.allowed);
  d.ruleId = r.ruleId;
  d.limit = Number(r.limit);
  d.remaining = Number(r.remaining);
  d.resetAt = Number(r.resetAt);
  d.retryAfterMs = Number(r.retryAfterMs);
  d.delayMs = Number(r.delayUs) / 1000;
  d.replayed = r.replayed;
  d.degraded = r.degraded;
  d.state = stateNames[r.state] ?? "";
  d.tier = r.tier;
  d.decisionId = r.decisionId;
  d.leaseId = r.leaseId;
  d.leaseExpiresAtMs = Number(r.leaseExpiresAtMs);
  let endsEarly = false;
  for (const l of r.limits) {
    if (l.ruleId === r.ruleId && (l.algorithm === "concurrency" || l.algorithm === "balance")) endsEarly = true;
    if (l.shadow) continue; // never enforced, so no policy a caller must respect
    d.policies.push({ ruleId: l.ruleId, limit: Number(l.limit), windowMs: Number(l.windowMs), burst: Number(l.burst) });
    if (!l.allowed && !d.violated.includes(l.ruleId)) d.violated.push(l.ruleId);
  }
  return [d, endsEarly];
}

function balanceOf(r: GetBalanceResponse): Balance {
  return {
    entitlement: r.entitlement, dimension: r.dimension, subject: r.subject, periodStartMs: Number(r.periodStartMs), periodEndMs: Number(r.periodEndMs),
    used: Number(r.used), overage: Number(r.overage), remaining: Number(r.remaining),
    grants: r.grants.map((g) => ({
      id: g.id, amount: Number(g.amount), remaining: Number(g.remaining), priority: g.priority, effectiveAtMs: Number(g.effectiveAtMs),
      expiresAtMs: Number(g.expiresAtMs), recurring: g.recurring, live: g.live, voidedAtMs: Number(g.voidedAtMs), reason: g.reason,
    })),
  };
}
