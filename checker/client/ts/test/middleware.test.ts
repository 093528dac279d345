// Each middleware served over real HTTP, its denials compared with the checker's forward-auth
// answer to the same subject in the same state.
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { after, describe, it } from "node:test";
import express from "express";
import Fastify from "fastify";
import { Hono } from "hono";
import { serve } from "@hono/node-server";
import { Client, type Decision } from "@quotaflow/client";
import { expressClientIP, expressRateLimit } from "@quotaflow/client/express";
import { fastifyRateLimit } from "@quotaflow/client/fastify";
import { honoRateLimit, type QuotaflowVariables } from "@quotaflow/client/hono";
import { assertSameDenial, checkerURL, denyThroughForwardAuth, quietLogger, uid } from "./helpers.js";

const client = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
const user = (h: { headers: Record<string, string | string[] | undefined> }) => h.headers["x-user-id"] as string | undefined;

/** Starts each framework's app on a loopback port: GET /mw/:x answers the decision it was given. */
interface App {
  url: string;
  close(): void;
}

async function expressApp(): Promise<App> {
  const app = express();
  app.use(expressRateLimit(client, { user, ip: expressClientIP(["127.0.0.1/32"]), dimensionHeaders: [{ dimension: "tenant", header: "X-Tenant" }] }));
  app.get("/{*any}", (req, res) => res.json({ decision: res.locals.quotaflow ?? null }));
  const srv = app.listen(0, "127.0.0.1");
  await new Promise((r) => srv.once("listening", r));
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, close: () => void srv.close() };
}

async function fastifyApp(): Promise<App> {
  const app = Fastify();
  await app.register(fastifyRateLimit(client, { user, dimensionHeaders: [{ dimension: "tenant", header: "X-Tenant" }] }));
  app.get("/*", async (req) => ({ decision: (req as unknown as { quotaflow: Decision | null }).quotaflow }));
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  return { url, close: () => void app.close() };
}

async function honoApp(): Promise<App> {
  const app = new Hono<{ Variables: QuotaflowVariables }>();
  app.use(honoRateLimit(client, { user: (c) => c.req.header("x-user-id"), dimensionHeaders: [{ dimension: "tenant", header: "X-Tenant" }] }));
  app.get("/*", (c) => c.json({ decision: c.get("quotaflow") ?? null }));
  const srv = serve({ fetch: app.fetch, port: 0, hostname: "127.0.0.1" });
  await new Promise((r) => srv.once("listening", r));
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, close: () => void srv.close() };
}

for (const [name, start] of Object.entries({ express: expressApp, fastify: fastifyApp, hono: honoApp })) {
  describe(`${name} middleware`, () => {
    let started: Promise<App> | undefined;
    const app = async () => (await (started ??= start())).url;
    after(async () => (await started)?.close());

    it("passes the decision to the handler, with the rate limit headers", async () => {
      const r = await fetch(`${await app()}/mw/a?q=1`, { headers: { "X-User-Id": uid(name) } });
      assert.equal(r.status, 200);
      const { decision } = (await r.json()) as { decision: Decision };
      assert.equal(decision.allowed, true);
      assert.equal(decision.ruleId, "ts-mw");
      assert.equal(r.headers.get("ratelimit-policy"), '"ts-mw";q=2;w=3600');
      assert.match(r.headers.get("ratelimit") ?? "", /^"ts-mw";r=1;t=\d+$/);
      assert.equal(r.headers.get("x-ratelimit-remaining"), "1");
    });

    it("answers a denial as forward-auth does: problem+json", async () => {
      const u = uid(name);
      const want = await denyThroughForwardAuth(u, "/mw/b", 2, "application/problem+json");
      const got = await fetch(`${await app()}/mw/b`, { headers: { "X-User-Id": u, Accept: "application/problem+json" } });
      await assertSameDenial(got, want);
    });

    it("answers a denial as forward-auth does: plain JSON", async () => {
      const u = uid(name);
      const want = await denyThroughForwardAuth(u, "/mw/c", 2);
      const got = await fetch(`${await app()}/mw/c`, { headers: { "X-User-Id": u } });
      await assertSameDenial(got, want);
    });

    it("counts a custom dimension", async () => {
      const tenant = uid("tenant");
      const codes = [];
      for (let i = 0; i < 3; i++) {
        const r = await fetch(`${await app()}/reports`, { headers: { "X-Tenant": tenant } });
        codes.push(r.status);
        await r.arrayBuffer();
      }
      assert.deepEqual(codes, [200, 200, 429]);
    });

    it("lets a request without a subject through unchecked", async () => {
      const r = await fetch(`${await app()}/mw/d`);
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("ratelimit"), null);
    });
  });
}

describe("express behind a trusted proxy", () => {
  it("counts the forwarded client's IP", async () => {
    const app = express();
    const seen: string[] = [];
    const ip = expressClientIP(["127.0.0.1"]);
    app.use(expressRateLimit(client, { ip: (req) => (seen.push(ip(req)), ip(req)) }));
    app.get("/{*any}", (_req, res) => res.end("ok"));
    const srv = app.listen(0, "127.0.0.1");
    await new Promise((r) => srv.once("listening", r));
    const url = `http://127.0.0.1:${(srv.address() as AddressInfo).port}/api/x`;
    await (await fetch(url, { headers: { "X-Forwarded-For": "198.51.100.7, 127.0.0.1" } })).text();
    await (await fetch(url)).text();
    srv.close();
    assert.deepEqual(seen, ["198.51.100.7", "127.0.0.1"]);
  });
});
