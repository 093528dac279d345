// Run by Bun and by Deno (test/runtimes.test.ts starts each): the package's ESM build, a check,
// and the Hono middleware served by the runtime's own server (Bun.serve, Deno.serve), its
// denial compared with forward-auth's. Exits non-zero on a failure.
import assert from "node:assert/strict";
import { Hono } from "hono";
import { Client, type Decision } from "../dist/esm/index.js";
import { honoRateLimit, type QuotaflowVariables } from "../dist/esm/hono.js";

declare const Bun: any, Deno: any;
const runtime = typeof Bun !== "undefined" ? `bun ${Bun.version}` : typeof Deno !== "undefined" ? `deno ${Deno.version.deno}` : "";
assert.ok(runtime, "run by Bun or Deno");
const checker = process.env.QF_CHECKER_URL!;
const run = `${runtime.split(" ")[0]}-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;

const client = new Client(checker, { timeoutMs: 10_000 });
const d = await client.check({ subjects: [{ dimension: "user", id: `${run}-check` }], endpoint: "/orders" });
assert.deepEqual([d.allowed, d.source, d.ruleId, d.remaining], [true, "checker", "ts-orders", 2]);

const app = new Hono<{ Variables: QuotaflowVariables }>();
app.use(honoRateLimit(client, { user: (c) => c.req.header("x-user-id") }));
app.get("/*", (c) => c.json({ decision: c.get("quotaflow") }));

// The runtime's own server, on a free loopback port.
let port: number;
let stop: () => Promise<unknown> | unknown;
if (typeof Bun !== "undefined") {
  const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
  [port, stop] = [s.port, () => s.stop(true)];
} else {
  const s = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, app.fetch);
  [port, stop] = [s.addr.port, () => s.shutdown()];
}
try {
  const user = `${run}-hono`;
  const ok = await fetch(`http://127.0.0.1:${port}/mw/rt`, { headers: { "X-User-Id": user } });
  assert.equal(ok.status, 200);
  assert.equal(((await ok.json()) as { decision: Decision }).decision.ruleId, "ts-mw");
  assert.equal(ok.headers.get("ratelimit-policy"), '"ts-mw";q=2;w=3600');
  // The second place through forward-auth, then one denial from each.
  const fa = (accept: string) => fetch(`${checker}/ratelimit/check`, { headers: { "X-User-Id": user, "X-Forwarded-Uri": "/mw/rt", Accept: accept } });
  const second = await fa("application/json");
  assert.equal(second.status, 200);
  await second.arrayBuffer();
  const want = await fa("application/problem+json");
  const got = await fetch(`http://127.0.0.1:${port}/mw/rt`, { headers: { "X-User-Id": user, Accept: "application/problem+json" } });
  assert.equal(got.status, 429);
  assert.equal(want.status, 429);
  for (const h of ["content-type", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-state"]) {
    assert.equal(got.headers.get(h), want.headers.get(h), h);
  }
  const gb = (await got.json()) as Record<string, unknown>, wb = (await want.json()) as Record<string, unknown>;
  for (const b of [gb, wb]) delete b.decision_id, delete b.retry_after, delete b.message;
  assert.deepEqual(gb, wb);
  console.log(`${runtime}: a check and the Hono middleware as forward-auth answers`);
} finally {
  await stop();
}
