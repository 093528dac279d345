// Express 5 middleware (works with Express 4 too, and any connect-style framework).
import type { Client } from "./client.js";
import { clientIP } from "./clientip.js";
import { decide, pathOf, validateHttpConfig, waitDelay, type HttpConfig } from "./http.js";

/** The parts of Express's request the middleware reads. */
export interface ExpressRequest {
  originalUrl?: string;
  url?: string;
  headers: Record<string, string | string[] | undefined>;
  socket?: { remoteAddress?: string };
  quotaflow?: unknown;
}

/** The parts of Express's response the middleware writes. */
export interface ExpressResponse {
  locals?: Record<string, unknown>;
  statusCode: number;
  setHeader(name: string, value: string): unknown;
  end(body?: string): unknown;
  once(event: "close", fn: () => void): unknown;
}

/** Express middleware: checks each request before the next handler, answers a denial 429 as
 * the checker's forward-auth does, and passes the decision on as req.quotaflow and
 * res.locals.quotaflow. A lease (concurrency rules) is released when the response closes. */
export function expressRateLimit<R extends ExpressRequest = ExpressRequest>(client: Client, cfg: HttpConfig<R>) {
  validateHttpConfig(cfg, "expressRateLimit");
  return async function quotaflow(req: R, res: ExpressResponse, next: (err?: unknown) => void): Promise<void> {
    try {
      const header = (n: string) => {
        const v = req.headers[n.toLowerCase()];
        return Array.isArray(v) ? v.join(", ") : v;
      };
      const v = await decide(client, cfg, { req, header, path: pathOf(req.originalUrl ?? req.url ?? "/") });
      if (v.kind === "skip") return next();
      for (const [k, val] of Object.entries(v.headers)) res.setHeader(k, val);
      if (v.kind !== "allow") {
        res.statusCode = v.status;
        res.setHeader("Content-Type", v.contentType);
        res.end(v.body);
        return;
      }
      req.quotaflow = v.decision;
      if (res.locals) res.locals.quotaflow = v.decision;
      if (v.decision.leaseId) res.once("close", () => void client.releaseQuietly(v.decision));
      await waitDelay(v.decision);
      next();
    } catch (err) {
      next(err);
    }
  };
}

/** An ip function for Express that believes X-Forwarded-For of trustedProxies only. */
export function expressClientIP(trustedProxies: string[] = []): (req: ExpressRequest) => string {
  const ip = clientIP(trustedProxies);
  return (req) => ip(req.socket?.remoteAddress, req.headers["x-forwarded-for"]);
}
