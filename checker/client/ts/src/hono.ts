// Hono 4 middleware: web-standard Request and Response, so it serves Node, Bun, Deno and
// Workers alike.
import type { Client } from "./client.js";
import { clientIP } from "./clientip.js";
import { decide, pathOf, validateHttpConfig, waitDelay, type HttpConfig } from "./http.js";
import type { Decision } from "./types.js";

/** The parts of Hono's Context the middleware uses. */
export interface HonoContextLike {
  req: { url: string; raw: Request; header(name: string): string | undefined };
  res: Response;
  set(key: "quotaflow", value: Decision): void;
}

/** The variables the middleware sets: `new Hono<{ Variables: QuotaflowVariables }>()`. */
export type QuotaflowVariables = { quotaflow: Decision };

/** Hono middleware: checks each request before the next handler, answers a denial 429 as the
 * checker's forward-auth does, and passes the decision on as c.get("quotaflow"). A lease is
 * released when the handler is done. */
export function honoRateLimit<C extends HonoContextLike = HonoContextLike>(client: Client, cfg: HttpConfig<C>) {
  validateHttpConfig(cfg, "honoRateLimit");
  return async function quotaflow(c: C, next: () => Promise<void>): Promise<Response | void> {
    const v = await decide(client, cfg, { req: c, header: (n) => c.req.header(n), path: pathOf(c.req.url), signal: c.req.raw.signal });
    if (v.kind === "skip") return next();
    if (v.kind !== "allow") {
      return new Response(v.body, { status: v.status, headers: { ...v.headers, "Content-Type": v.contentType } });
    }
    c.set("quotaflow", v.decision);
    try {
      await waitDelay(v.decision, c.req.raw.signal);
      await next();
    } finally {
      await client.releaseQuietly(v.decision);
    }
    try {
      for (const [k, val] of Object.entries(v.headers)) c.res.headers.set(k, val);
    } catch {
      // An immutable response (one fetch returned): copied once to carry the headers.
      c.res = new Response(c.res.body, c.res);
      for (const [k, val] of Object.entries(v.headers)) c.res.headers.set(k, val);
    }
  };
}

/** An ip function for Hono that believes X-Forwarded-For of trustedProxies only; peer returns
 * the connection's address (Hono's getConnInfo(c).remote.address for the runtime). */
export function honoClientIP<C extends HonoContextLike>(trustedProxies: string[], peer: (c: C) => string | undefined): (c: C) => string {
  const ip = clientIP(trustedProxies);
  return (c) => ip(peer(c), c.req.header("x-forwarded-for"));
}
