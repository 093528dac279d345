// The checker killed (SIGKILL) and started again on its port: retries across the restart, each
// fail mode while it is down, and the way back.
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Client } from "@quotaflow/client";
import { ownChecker, quietLogger, uid } from "./helpers.js";

describe("the checker killed", () => {
  it("each fail mode decides while it is down, per client and per call, and the checker again once it is back", async () => {
    const ck = await ownChecker();
    const subjects = [{ dimension: "user" as const, id: uid("fm") }];
    const make = (failMode: "open" | "closed" | "local") =>
      new Client(ck.url, { failMode, timeoutMs: 2_000, retries: 1, backoffMs: 5, probeIntervalMs: 200, localRate: 1, localBurst: 2, logger: quietLogger });
    const open = make("open"), closed = make("closed"), local = make("local");
    for (const c of [open, closed, local]) assert.equal((await c.check({ subjects, endpoint: "/exact" })).source, "checker");
    await ck.kill();

    const o = await open.check({ subjects, endpoint: "/exact" });
    assert.deepEqual([o.allowed, o.degraded, o.source], [true, true, "fail-mode"]);
    assert.ok(o.error, "the decision says why");

    const c = await closed.check({ subjects, endpoint: "/exact" });
    assert.deepEqual([c.allowed, c.degraded, c.source, c.retryAfterMs], [false, true, "fail-mode", 200]);

    const l = [];
    for (let i = 0; i < 3; i++) l.push(await local.check({ subjects, endpoint: "/exact" }));
    assert.deepEqual(l.map((d) => d.allowed), [true, true, false], "the local bucket of burst 2");
    assert.ok(l[2].retryAfterMs > 0 && l[2].source === "fail-mode");

    // Per call: the closed client asked to fail open for this check.
    const perCall = await closed.check({ subjects, endpoint: "/exact" }, { failMode: "open" });
    assert.deepEqual([perCall.allowed, perCall.source], [true, "fail-mode"]);

    // Within the probe interval no call is made: the fail mode answers at once.
    const t0 = performance.now();
    await closed.check({ subjects, endpoint: "/exact" });
    assert.ok(performance.now() - t0 < 50, "an outage does not cost each check its deadline");

    await ck.start();
    await new Promise((r) => setTimeout(r, 250)); // past the probe interval
    for (const cl of [open, closed, local]) {
      const d = await cl.check({ subjects, endpoint: "/exact" });
      assert.deepEqual([d.source, d.degraded], ["checker", false]);
    }
  });

  it("a check retried across a restart is answered by the checker and charged once", async () => {
    const ck = await ownChecker();
    let attempts = 0;
    const c = new Client(ck.url, {
      timeoutMs: 2_000, retries: 12, backoffMs: 50, batchWaitMs: -1, logger: quietLogger,
      interceptors: [(next) => (req) => (attempts++, next(req))],
    });
    const user = uid("restart");
    const req = { subjects: [{ dimension: "user" as const, id: user }], endpoint: "/orders" };
    assert.ok((await c.check(req)).allowed);
    await ck.kill();
    attempts = 0;
    const pending = c.check(req, { timeoutMs: 30_000 });
    await new Promise((r) => setTimeout(r, 300));
    await ck.start();
    const d = await pending;
    assert.equal(d.source, "checker");
    assert.ok(d.allowed);
    assert.ok(attempts > 1, `retried (${attempts} attempts)`);
    assert.equal(d.remaining, 1, "charged once: 3 allowed, 2 checks made");
  });

  it("a denial is never retried", async () => {
    const ck = await ownChecker();
    let attempts = 0;
    const c = new Client(ck.url, { timeoutMs: 2_000, noDenyCache: true, batchWaitMs: -1, logger: quietLogger, interceptors: [(next) => (req) => (attempts++, next(req))] });
    const req = { subjects: [{ dimension: "user" as const, id: uid("noretry") }], endpoint: "/orders" };
    for (let i = 0; i < 3; i++) await c.check(req);
    attempts = 0;
    const d = await c.check(req);
    assert.equal(d.allowed, false);
    assert.equal(attempts, 1);
  });

  it("the caller's deadline bounds the retries", async () => {
    const ck = await ownChecker();
    await ck.kill();
    const c = new Client(ck.url, { timeoutMs: 1_000, retries: 4, backoffMs: 100, logger: quietLogger });
    const t0 = performance.now();
    await assert.rejects(c.check({ subjects: [{ dimension: "user", id: uid("deadline") }], endpoint: "/orders" }, { timeoutMs: 300 }), (e: Error) => e.name === "TimeoutError");
    const took = performance.now() - t0;
    assert.ok(took < 1_000, `gave up at the caller's deadline (${took.toFixed(0)} ms)`);
  });
});
