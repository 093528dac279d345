// Run by Bun (test/bun.test.ts starts it): the package's ESM build, a check, and the Hono
// middleware served by Bun.serve, its denial compared with forward-auth's. Exits 1 on a failure.
import assert from "node:assert/strict";
import { Hono } from "hono";
import { Client, type Decision } from "@quotaflow/client";
import { honoRateLimit, type QuotaflowVariables } from "@quotaflow/client/hono";

const checker = process.env.QF_CHECKER_URL!;
const run = `bun-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
assert.ok(typeof Bun !== "undefined", "run by Bun");

const client = new Client(checker, { timeoutMs: 10_000 });
const d = await client.check({ subjects: [{ dimension: "user", id: `${run}-check` }], endpoint: "/orders" });
assert.deepEqual([d.allowed, d.source, d.ruleId, d.remaining], [true, "checker", "ts-orders", 2]);

const app = new Hono<{ Variables: QuotaflowVariables }>();
app.use(honoRateLimit(client, { user: (c) => c.req.header("x-user-id") }));
app.get("/*", (c) => c.json({ decision: c.get("quotaflow") }));
const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
try {
  const user = `${run}-hono`;
  const ok = await fetch(`http://127.0.0.1:${server.port}/mw/bun`, { headers: { "X-User-Id": user } });
  assert.equal(ok.status, 200);
  assert.equal(((await ok.json()) as { decision: Decision }).decision.ruleId, "ts-mw");
  assert.equal(ok.headers.get("ratelimit-policy"), '"ts-mw";q=2;w=3600');
  // The second place through forward-auth, then one denial from each.
  const fa = (accept: string) => fetch(`${checker}/ratelimit/check`, { headers: { "X-User-Id": user, "X-Forwarded-Uri": "/mw/bun", Accept: accept } });
  assert.equal((await fa("application/json")).status, 200);
  const want = await fa("application/problem+json");
  const got = await fetch(`http://127.0.0.1:${server.port}/mw/bun`, { headers: { "X-User-Id": user, Accept: "application/problem+json" } });
  assert.equal(got.status, 429);
  assert.equal(want.status, 429);
  for (const h of ["content-type", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-state"]) {
    assert.equal(got.headers.get(h), want.headers.get(h), h);
  }
  const gb = (await got.json()) as Record<string, unknown>, wb = (await want.json()) as Record<string, unknown>;
  for (const b of [gb, wb]) delete b.decision_id, delete b.retry_after, delete b.message;
  assert.deepEqual(gb, wb);
  console.log(`bun ${Bun.version}: a check and the Hono middleware as forward-auth answers`);
} finally {
  server.stop(true);
}
