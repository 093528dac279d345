// Bad configuration throws a ConfigError naming the option; the pure parts (headers, client IP).
import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Client, ConfigError, clientIP, rateLimitHeaders, denialBody, type Decision } from "@quotaflow/client";
import { expressRateLimit } from "@quotaflow/client/express";
import { fastifyRateLimit } from "@quotaflow/client/fastify";
import { honoRateLimit } from "@quotaflow/client/hono";
import { quietLogger } from "./helpers.js";

const names = (option: string) => (e: unknown) => {
  assert.ok(e instanceof ConfigError, `a ConfigError, got ${e}`);
  assert.equal(e.option, option);
  assert.ok(e.message.includes(option), `the message names ${option}: ${e.message}`);
  return true;
};

describe("bad configuration", () => {
  const c = new Client("http://127.0.0.1:1", { logger: quietLogger });
  it("a middleware without a subject function", () => {
    assert.throws(() => expressRateLimit(c, {}), names("user"));
    assert.throws(() => fastifyRateLimit(c, {}), names("user"));
    assert.throws(() => honoRateLimit(c, {}), names("user"));
    assert.throws(() => expressRateLimit(c, { user: "alice" as never }), names("user"));
  });
  it("a negative cost", async () => {
    await assert.rejects(c.check({ subjects: [{ dimension: "user", id: "a" }], endpoint: "/x", cost: -1 }), names("cost"));
  });
  it("a check without subjects, or a subject without a dimension", async () => {
    await assert.rejects(c.check({ subjects: [], endpoint: "/x" }), names("subjects"));
    await assert.rejects(c.check({ subjects: [{ id: "a" }], endpoint: "/x" }), names("subjects"));
    await assert.rejects(c.check({ subjects: [{ dimension: "planet" as never, id: "a" }], endpoint: "/x" }), names("subjects"));
  });
  it("an endpoint that is no path", async () => {
    await assert.rejects(c.check({ subjects: [{ dimension: "user", id: "a" }], endpoint: "orders" }), names("endpoint"));
    // One the checker would refuse is refused before it is sent, with the checker's reason.
    await assert.rejects(c.check({ subjects: [{ dimension: "user", id: "a" }], endpoint: "/a%2Fb" }), (e: unknown) =>
      names("endpoint")(e) && (e as Error).message.includes("encoded slash"));
    await assert.rejects(c.reserve({ subjects: [{ dimension: "user", id: "a" }], endpoint: "/../x" }, 5), names("endpoint"));
    // Past the checker's 1,024 bytes (its query aside), counted in UTF-8 as the checker counts.
    for (const endpoint of ["/" + "a".repeat(1024), "/" + "é".repeat(600), "/" + "a".repeat(1 << 20)]) {
      await assert.rejects(c.check({ subjects: [{ dimension: "user", id: "a" }], endpoint }), (e: unknown) =>
        names("endpoint")(e) && (e as Error).message.includes("at most 1024 bytes"));
    }
  });
  it("client options", () => {
    assert.throws(() => new Client("http://x", { failMode: "ajar" as never }), names("failMode"));
    assert.throws(() => new Client("http://x", { timeoutMs: -5 }), names("timeoutMs"));
    assert.throws(() => new Client("http://x", { batchMax: -1 }), names("batchMax"));
    assert.throws(() => new Client("checker:8080"), names("baseUrl"));
    assert.throws(() => new Client("http://x", { localRate: -1 }), names("localRate"));
    assert.throws(() => new Client("http://x", { retries: "3" as never }), names("retries"));
  });
  it("reserve with a cost, a bad estimate, a negative actual", async () => {
    await assert.rejects(c.reserve({ subjects: [{ dimension: "user", id: "a" }], endpoint: "/x", cost: 3 }, 10), names("cost"));
    await assert.rejects(c.reserve({ subjects: [{ dimension: "user", id: "a" }], endpoint: "/x" }, -10), names("estimate"));
    await assert.rejects(c.settle("r", -1), names("actual"));
  });
  it("RecordUsage without an amount", async () => {
    await assert.rejects(c.recordUsage({ entitlement: "tokens", subject: "a", amount: 0 }), names("amount"));
  });
  it("a trusted proxy that is neither a CIDR nor an address", () => {
    assert.throws(() => clientIP(["10.0.0.0/8", "proxy.internal"]), names("trustedProxies"));
  });
});

describe("clientIP", () => {
  const ip = clientIP(["10.0.0.0/8", "::1", "2001:db8::/32"]);
  const cases: [string, string | undefined, string][] = [
    ["203.0.113.9", "198.51.100.1", "203.0.113.9"], // an untrusted peer: its own address, the header ignored
    ["10.1.2.3", "198.51.100.1, 10.9.9.9", "198.51.100.1"],
    ["10.1.2.3", "1.2.3.4, 198.51.100.1", "198.51.100.1"], // a client can prepend, never append
    ["10.1.2.3", "garbage, 10.0.0.5", "10.0.0.5"], // a broken hop: nothing left of it is believed
    ["::ffff:10.1.2.3", "192.0.2.1", "192.0.2.1"], // IPv4-mapped peers unmapped
    ["::1", "2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"],
    ["::1", "2001:0db8:0000:0000:0000:0000:0000:0001, 2a00::5", "2a00::5"],
  ];
  for (const [peer, xff, want] of cases) it(`${peer} with X-Forwarded-For ${xff}`, () => assert.equal(ip(peer, xff), want));
});

describe("headers", () => {
  const d: Decision = {
    allowed: false, ruleId: 'a"b', limit: 10, remaining: 0, resetAt: 2_000, retryAfterMs: 1_001, delayMs: 0,
    policies: [{ ruleId: 'a"b', limit: 10, windowMs: 60_000, burst: 10 }, { ruleId: "burst", limit: 10, windowMs: 500, burst: 4 }],
    violated: ['a"b'], replayed: false, degraded: false, source: "checker", state: "throttled", tier: "free", decisionId: "d1", leaseId: "", leaseExpiresAtMs: 0,
  };
  it("as internal/ratelimitheader renders them", () => {
    const h = rateLimitHeaders(d, 1_000_500);
    assert.equal(h["RateLimit"], '"a\\"b";r=0;t=1000');
    assert.equal(h["RateLimit-Policy"], '"a\\"b";q=10;w=60, "burst";q=10;w=1;burst=4');
    assert.equal(h["Retry-After"], "2");
  });
  it("a fail mode's denial: Retry-After and X-RateLimit-Degraded only", () => {
    const h = rateLimitHeaders({ ...d, ruleId: "", policies: [], degraded: true, source: "fail-mode", decisionId: "" });
    assert.deepEqual(Object.keys(h).sort(), ["Retry-After", "X-RateLimit-Degraded"]);
  });
  it("the problem body", () => {
    const b = denialBody(d, true);
    assert.equal(b.type, "https://iana.org/assignments/http-problem-types#quota-exceeded");
    assert.deepEqual(b["violated-policies"], ['a"b']);
    assert.equal(b.status, 429);
  });
});
