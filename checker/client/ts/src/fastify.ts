// Fastify 5 plugin.
import type { Client } from "./client.js";
import { clientIP } from "./clientip.js";
import { decide, pathOf, validateHttpConfig, waitDelay, type HttpConfig } from "./http.js";
import type { Decision } from "./types.js";

/** The parts of Fastify's request the plugin reads. */
export interface FastifyRequestLike {
  url: string;
  headers: Record<string, string | string[] | undefined>;
  raw?: { socket?: { remoteAddress?: string } };
  quotaflow?: Decision | null;
}

/** The parts of Fastify's reply the plugin writes. */
export interface FastifyReplyLike {
  code(status: number): FastifyReplyLike;
  header(name: string, value: string): FastifyReplyLike;
  send(body?: Uint8Array): FastifyReplyLike;
}

/** The parts of a Fastify instance the plugin uses. */
export interface FastifyLike {
  decorateRequest(name: string, value: unknown): unknown;
  addHook(name: "onRequest", fn: (req: any, reply: any) => Promise<unknown>): unknown;
  addHook(name: "onResponse", fn: (req: any, reply: any) => Promise<unknown>): unknown;
}

/** A Fastify plugin (register it with `app.register(fastifyRateLimit(client, options))`): checks
 * each request in onRequest, answers a denial 429 as the checker's forward-auth does, and passes
 * the decision on as request.quotaflow. A lease is released in onResponse. */
export function fastifyRateLimit<R extends FastifyRequestLike = FastifyRequestLike>(client: Client, cfg: HttpConfig<R>) {
  validateHttpConfig(cfg, "fastifyRateLimit");
  const plugin = async function quotaflow(app: FastifyLike): Promise<void> {
    app.decorateRequest("quotaflow", null);
    app.addHook("onRequest", async (req: R, reply: FastifyReplyLike) => {
      const header = (n: string) => {
        const v = req.headers[n.toLowerCase()];
        return Array.isArray(v) ? v.join(", ") : v;
      };
      const v = await decide(client, cfg, { req, header, path: pathOf(req.url) });
      if (v.kind === "skip") return;
      for (const [k, val] of Object.entries(v.headers)) reply.header(k, val);
      if (v.kind !== "allow") {
        // Bytes: given a string, Fastify would add "; charset=utf-8" to the type forward-auth sends bare.
        reply.code(v.status).header("Content-Type", v.contentType).send(new TextEncoder().encode(v.body));
        return reply;
      }
      req.quotaflow = v.decision;
      await waitDelay(v.decision);
    });
    app.addHook("onResponse", async (req: R) => {
      if (req.quotaflow?.leaseId) await client.releaseQuietly(req.quotaflow);
    });
  };
  // What fastify-plugin does: the hooks apply to the routes of the registering scope.
  (plugin as unknown as Record<symbol, boolean>)[Symbol.for("skip-override")] = true;
  return plugin;
}

/** An ip function for Fastify that believes X-Forwarded-For of trustedProxies only. */
export function fastifyClientIP(trustedProxies: string[] = []): (req: FastifyRequestLike) => string {
  const ip = clientIP(trustedProxies);
  return (req) => ip(req.raw?.socket?.remoteAddress, req.headers["x-forwarded-for"]);
}
