// What the Express, Fastify and Hono middleware share: checker/client/middleware.go's Middleware,
// answering a denial as the checker's forward-auth does.
import { Code, ConnectError } from "@connectrpc/connect";
import type { Client } from "./client.js";
import { acceptsProblem, denialBody, rateLimitHeaders } from "./headers.js";
import { ConfigError, type Decision, type FailMode, type Subject } from "./types.js";

/** A custom dimension read from a request header. */
export interface DimensionHeader {
  /** The custom dimension's name, as rules name it (dimension: tenant). */
  dimension: string;
  header: string;
}

/** Says how a middleware finds a request's subjects; R is the framework's request (Express's
 * req, Fastify's request, Hono's Context). A request with no subject at all is not checked.
 * At least one of user, ip, apiKeyHeader, dimensionHeaders or subjects must be set. */
export interface HttpConfig<R> {
  /** The request's user ("" or undefined for none), e.g. from what authentication stored. */
  user?: (req: R) => string | undefined;
  /** The client's IP: each middleware's clientIP(trustedProxies) believes X-Forwarded-For of
   * trusted proxies only. */
  ip?: (req: R) => string | undefined;
  /** The header carrying an API key. */
  apiKeyHeader?: string;
  /** Headers of custom dimensions ({ dimension: "tenant", header: "X-Tenant-Id" }). */
  dimensionHeaders?: DimensionHeader[];
  /** Any further subjects of the app's own. */
  subjects?: (req: R) => Subject[] | undefined;
  /** What the rules' endpoint patterns match; unset, the path as the client wrote it. */
  endpoint?: (req: R) => string;
  /** The request's cost; unset, 1. */
  cost?: (req: R) => number;
  /** The fail mode of these checks, instead of the client's. */
  failMode?: FailMode;
}

/** How a framework shows a request to the core. */
export interface RequestView<R> {
  req: R;
  header(name: string): string | undefined;
  /** The path as the client wrote it, without the query. */
  path: string;
  signal?: AbortSignal;
}

/** What the middleware does with a request. */
export type Verdict =
  | { kind: "skip" }
  | { kind: "allow"; decision: Decision; headers: Record<string, string> }
  | { kind: "deny" | "bad"; status: number; headers: Record<string, string>; contentType: string; body: string; decision?: Decision };

/** Checks cfg for mistakes once, when the middleware is made. */
export function validateHttpConfig<R>(cfg: HttpConfig<R>, what: string): void {
  if (!cfg || typeof cfg !== "object") throw new ConfigError("options", `${what} needs options`);
  const fns = ["user", "ip", "subjects", "endpoint", "cost"] as const;
  for (const f of fns) {
    if (cfg[f] !== undefined && typeof cfg[f] !== "function") throw new ConfigError(f, `want a function of the request, got ${typeof cfg[f]}`);
  }
  if (cfg.apiKeyHeader !== undefined && (typeof cfg.apiKeyHeader !== "string" || cfg.apiKeyHeader === "")) {
    throw new ConfigError("apiKeyHeader", "want a header name");
  }
  for (const d of cfg.dimensionHeaders ?? []) {
    if (!d?.dimension || !d?.header) throw new ConfigError("dimensionHeaders", `want { dimension, header }, got ${JSON.stringify(d)}`);
  }
  if (!cfg.user && !cfg.ip && !cfg.apiKeyHeader && !cfg.subjects && !(cfg.dimensionHeaders?.length)) {
    throw new ConfigError("user", `${what} needs a subject function: set user, ip, apiKeyHeader, dimensionHeaders or subjects`);
  }
}

/** Decides one request. A check the checker refuses (a misconfigured subject) is logged and the
 * request goes ahead, as the Go middleware does; an endpoint it refuses is answered 400. */
export async function decide<R>(client: Client, cfg: HttpConfig<R>, v: RequestView<R>): Promise<Verdict> {
  const subjects: Subject[] = [];
  const add = (dimension: Subject["dimension"], id: string | undefined) => id && subjects.push({ dimension, id });
  if (cfg.user) add("user", cfg.user(v.req));
  if (cfg.ip) add("ip", cfg.ip(v.req));
  if (cfg.apiKeyHeader) add("api_key", v.header(cfg.apiKeyHeader));
  for (const d of cfg.dimensionHeaders ?? []) {
    const val = v.header(d.header);
    if (val) subjects.push({ customDimension: d.dimension, id: val });
  }
  if (cfg.subjects) subjects.push(...(cfg.subjects(v.req) ?? []));
  if (subjects.length === 0) return { kind: "skip" };
  const endpoint = cfg.endpoint ? cfg.endpoint(v.req) : v.path;
  const cost = cfg.cost ? cfg.cost(v.req) : undefined;
  let d: Decision;
  try {
    d = await client.check({ subjects, endpoint, cost }, { signal: v.signal, failMode: cfg.failMode });
  } catch (err) {
    if (v.signal?.aborted) throw err; // the caller left
    const ce = err instanceof ConnectError ? err : undefined;
    if ((err instanceof ConfigError && err.option === "endpoint") || (ce?.code === Code.InvalidArgument && /endpoint/i.test(ce.rawMessage))) {
      const msg = err instanceof ConfigError ? err.message : ce!.rawMessage;
      return { kind: "bad", status: 400, headers: {}, contentType: "text/plain; charset=utf-8", body: `Bad request: the path ${msg}.\n` };
    }
    client.cfg.log.error(`quotaflow middleware: rate limit check failed, request let through: ${err instanceof Error ? err.message : String(err)}`);
    return { kind: "skip" };
  }
  const headers = rateLimitHeaders(d);
  if (d.allowed) return { kind: "allow", decision: d, headers };
  const problem = acceptsProblem(v.header("accept"));
  return {
    kind: "deny",
    status: 429,
    headers,
    decision: d,
    contentType: problem ? "application/problem+json" : "application/json",
    body: JSON.stringify(denialBody(d, problem)) + "\n",
  };
}

/** Waits an allowed decision's delay (a rule with on_limit: delay queued the request). */
export function waitDelay(d: Decision, signal?: AbortSignal): Promise<void> {
  if (d.delayMs <= 0) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => (signal?.removeEventListener("abort", onAbort), resolve()), d.delayMs);
    const onAbort = () => (clearTimeout(t), reject(signal!.reason));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The path of a request target as written: what precedes '?' or '#'. */
export function pathOf(target: string): string {
  let p = target;
  const q = p.search(/[?#]/);
  if (q >= 0) p = p.slice(0, q);
  if (/^https?:\/\//i.test(p)) {
    const i = p.indexOf("/", p.indexOf("//") + 2);
    p = i < 0 ? "/" : p.slice(i);
  }
  return p;
}
