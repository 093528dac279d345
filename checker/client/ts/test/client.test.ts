// The client against a real checker: counts, the deny cache, idempotency, reserve and settle,
// leases, balances, both transports and both module systems.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { describe, it } from "node:test";
import { Client, type Decision } from "@quotaflow/client";
import { createNodeClient } from "@quotaflow/client/node";
import { checkerURL, quietLogger, uid } from "./helpers.js";

const clients: Record<string, () => Client> = {
  "fetch, coalesced": () => new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger }),
  "fetch, one call per check": () => new Client(checkerURL, { timeoutMs: 10_000, batchWaitMs: -1, logger: quietLogger }),
  "connect-node, coalesced": () => createNodeClient(checkerURL, { timeoutMs: 10_000, logger: quietLogger }),
  "grpc-web over fetch": () => new Client(checkerURL, { timeoutMs: 10_000, protocol: "grpc-web", logger: quietLogger }),
};

describe("exact counts at a limit under concurrency", () => {
  for (const [name, make] of Object.entries(clients)) {
    it(name, async (t) => {
      const c = make();
      const user = uid("exact");
      const ds = await Promise.all(Array.from({ length: 200 }, () => c.check({ subjects: [{ dimension: "user", id: user }], endpoint: "/exact" })));
      assert.ok(!ds.some((d) => d.source === "fail-mode"), `the client's fail mode decided: ${ds.find((d) => d.error)?.error}`);
      const degraded = ds.filter((d) => d.degraded);
      assert.equal(degraded.length, 0, `decided by the checker's fail mode: ${JSON.stringify(degraded.slice(0, 2))}`);
      const allowed = ds.filter((d) => d.allowed).length;
      assert.equal(allowed, 50, "allowed of 200 concurrent checks at a limit of 50");
      for (const d of ds.filter((d) => !d.allowed)) {
        assert.equal(d.ruleId, "ts-exact");
        assert.ok(d.retryAfterMs > 0);
      }
      // Every denial after the first answer came from the checker or repeats one it made.
      assert.ok(ds.every((d) => d.source === "checker" || d.source === "deny-cache"));
      c.close();
    });
  }
});

describe("the deny cache", () => {
  it("repeats a denial of the checker until its retry_after, for a cost at least as high", async () => {
    let calls = 0;
    const c = new Client(checkerURL, { timeoutMs: 10_000, batchWaitMs: -1, logger: quietLogger, interceptors: [(next) => (req) => (calls++, next(req))] });
    const req = { subjects: [{ dimension: "user" as const, id: uid("deny") }], endpoint: "/orders" };
    for (let i = 0; i < 3; i++) assert.ok((await c.check(req)).allowed);
    const denied = await c.check(req);
    assert.equal(denied.allowed, false);
    assert.equal(denied.source, "checker");
    assert.equal(calls, 4);
    const cached = await c.check(req);
    assert.equal(cached.allowed, false);
    assert.equal(cached.source, "deny-cache");
    assert.equal(cached.ruleId, "ts-orders");
    assert.ok(cached.retryAfterMs > 0 && cached.retryAfterMs <= denied.retryAfterMs);
    assert.equal((await c.check({ ...req, cost: 5 })).source, "deny-cache", "a dearer check is denied too");
    assert.equal(calls, 4, "the cache answered without a call");
    // Another spelling of the path is the same endpoint to the checker, so to the cache.
    for (const endpoint of ["/ORDERS/", "//orders;v=2?page=1", "/x/../%6Frders"]) {
      assert.equal((await c.check({ ...req, endpoint })).source, "deny-cache", endpoint);
    }
    assert.equal(calls, 4, "the cache answered every spelling without a call");
    // Another endpoint, another subject, always ask.
    assert.equal((await c.check({ ...req, endpoint: "/exact" })).source, "checker");
    assert.equal(calls, 5);
  });

  it("asks the checker again once retry_after has passed", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const req = { subjects: [{ dimension: "user" as const, id: uid("short") }], endpoint: "/short" };
    let d = await c.check(req);
    if (!d.allowed) {
      // The one-second window ended between two checks: start over in the next one.
      await new Promise((r) => setTimeout(r, d.retryAfterMs + 20));
      d = await c.check(req);
    }
    assert.ok(d.allowed);
    const denied = await c.check(req);
    assert.deepEqual([denied.allowed, denied.source], [false, "checker"]);
    assert.ok(denied.retryAfterMs > 0 && denied.retryAfterMs <= 1_000);
    assert.equal((await c.check(req)).source, "deny-cache");
    await new Promise((r) => setTimeout(r, denied.retryAfterMs + 20));
    const after = await c.check(req);
    assert.deepEqual([after.allowed, after.source], [true, "checker"], "the window is new: the checker allows");
  });

  it("is off with noDenyCache", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, noDenyCache: true, logger: quietLogger });
    const req = { subjects: [{ dimension: "user" as const, id: uid("nocache") }], endpoint: "/orders" };
    for (let i = 0; i < 3; i++) await c.check(req);
    for (let i = 0; i < 2; i++) {
      const d = await c.check(req);
      assert.equal(d.allowed, false);
      assert.equal(d.source, "checker");
    }
  });
});

describe("idempotency", () => {
  it("a check sent again with its key is replayed, not charged", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const req = { subjects: [{ dimension: "user" as const, id: uid("idem") }], endpoint: "/orders", idempotencyKey: uid("key") };
    const first = await c.check(req);
    const again = await c.check(req);
    assert.equal(first.replayed, false);
    assert.equal(again.replayed, true);
    assert.equal(again.remaining, first.remaining, "charged once");
  });
});

describe("reserve and settle", () => {
  const remaining = async (c: Client, user: string) => {
    const r = await c.rpc.getRemainingQuota({ identifier: user, dimension: 1, endpoint: "/llm" });
    return Number(r.remaining);
  };

  it("reserved settles at what fn reports, refunding the rest", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const user = uid("llm");
    const req = { subjects: [{ dimension: "user" as const, id: user }], endpoint: "/llm" };
    let during = -1;
    const r = await c.reserved(req, 100, async () => {
      during = await remaining(c, user);
      return { actual: 30, value: "tokens" };
    });
    assert.ok(r.decision.allowed);
    assert.equal(during, 900, "the estimate is held while fn runs");
    assert.equal(r.value, "tokens");
    assert.equal(r.settlement?.actual, 30);
    assert.equal(await remaining(c, user), 970, "settled at the actual cost");
  });

  it("reserved cancels when fn throws: the whole estimate is refunded", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const user = uid("llm-throw");
    const req = { subjects: [{ dimension: "user" as const, id: user }], endpoint: "/llm" };
    await assert.rejects(c.reserved(req, 400, async () => { throw new Error("model failed"); }), /model failed/);
    assert.equal(await remaining(c, user), 1000);
  });

  it("a denied reserve runs nothing", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const req = { subjects: [{ dimension: "user" as const, id: uid("llm-deny") }], endpoint: "/llm" };
    let ran = false;
    assert.ok((await c.reserve(req, 600)).reservation);
    const r = await c.reserved(req, 600, async () => ((ran = true), 1));
    assert.equal(r.decision.allowed, false);
    assert.equal(ran, false);
  });

  it("settle twice: the checker's FailedPrecondition", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const { reservation } = await c.reserve({ subjects: [{ dimension: "user", id: uid("llm-twice") }], endpoint: "/llm" }, 10);
    assert.ok(reservation);
    const s = await c.settle(reservation.id, 4);
    assert.deepEqual([s.estimate, s.actual], [10, 4]);
    await assert.rejects(c.settle(reservation.id, 4), /failed_precondition/);
  });
});

describe("leases", () => {
  it("await using releases the place when the block ends", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const req = { subjects: [{ dimension: "user" as const, id: uid("lease") }], endpoint: "/stream" };
    {
      await using lease = await c.acquire(req);
      assert.ok(lease.decision.allowed);
      assert.ok(lease.decision.leaseId);
      const second = await c.check(req);
      assert.equal(second.allowed, false, "the one place is held");
      assert.equal((await c.check(req)).source, "checker", "a concurrency denial is never cached");
    }
    const after = await c.acquire(req);
    assert.ok(after.decision.allowed, "released at the end of the block");
    assert.ok((await after.renew()) > Date.now());
    await after.release();
    await after.release(); // a second release does nothing
  });

  it("withLease releases after fn, even when it throws", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const req = { subjects: [{ dimension: "user" as const, id: uid("lease-fn") }], endpoint: "/stream" };
    await assert.rejects(c.withLease(req, () => { throw new Error("boom"); }), /boom/);
    const r = await c.withLease(req, (d: Decision) => d.leaseId);
    assert.ok(r.decision.allowed && r.value);
  });
});

describe("balances", () => {
  it("RecordUsage burns once per event id; GetBalance reads it", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const user = uid("bal");
    const eventId = uid("event");
    const first = await c.recordUsage({ entitlement: "tokens", subject: user, amount: 5, eventId });
    const again = await c.recordUsage({ entitlement: "tokens", subject: user, amount: 5, eventId });
    assert.equal(first.replayed, false);
    assert.equal(again.replayed, true);
    const b = await c.balance("tokens", user);
    assert.equal(b.entitlement, "tokens");
    assert.equal(b.subject, user);
    assert.equal(b.used, 5, "burned once");
    await assert.rejects(c.balance("no-such-entitlement", user), /not_found/);
  });
});

describe("a refused request is an error, never a decision", () => {
  it("an unknown tier is the checker's error", async () => {
    const c = new Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    await assert.rejects(c.check({ subjects: [{ dimension: "user", id: uid("tier") }], endpoint: "/orders", tier: "platinum" }), (e: Error) => e.name === "ConnectError");
  });
});

describe("CommonJS", () => {
  it("require() finds the same API", async () => {
    const require = createRequire(import.meta.url);
    const cjs = require("@quotaflow/client") as typeof import("@quotaflow/client");
    const c = new cjs.Client(checkerURL, { timeoutMs: 10_000, logger: quietLogger });
    const d = await c.check({ subjects: [{ dimension: "user", id: uid("cjs") }], endpoint: "/orders" });
    assert.ok(d.allowed);
    assert.equal(typeof require("@quotaflow/client/express").expressRateLimit, "function");
  });
});
