// What the tests share: the checker the Go test started (QF_CHECKER_URL), the control server
// that starts and kills checkers of a test's own (QF_CONTROL_URL), and subjects of this run.
import assert from "node:assert/strict";

export const checkerURL = env("QF_CHECKER_URL");
const controlURL = env("QF_CONTROL_URL");
const runID = process.env.QF_RUN_ID ?? Date.now().toString(36);

function env(name: string): string {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is unset: run these tests through go test ./checker/client/ts/ (make test), which starts a checker`);
  return v;
}

/** A subject id of this run, apart from other runs' on the same Redis. */
export function uid(name: string): string {
  return `ts-${runID}-${name}-${Math.random().toString(36).slice(2, 8)}`;
}

/** A checker process of the test's own, which it may kill and start again on the same port. */
export interface OwnChecker {
  url: string;
  kill(): Promise<void>;
  start(): Promise<void>;
}

export async function ownChecker(): Promise<OwnChecker> {
  const r = await fetch(`${controlURL}/checkers`, { method: "POST" });
  assert.equal(r.status, 200, await r.clone().text());
  const { id, url } = (await r.json()) as { id: number; url: string };
  const post = async (what: string) => {
    const r = await fetch(`${controlURL}/checkers/${id}/${what}`, { method: "POST" });
    assert.equal(r.status, 204, await r.text());
  };
  return { url, kill: () => post("kill"), start: () => post("start") };
}

/** The checker's forward-auth answer (GET /ratelimit/check) for user on endpoint. */
export async function forwardAuth(user: string, endpoint: string, accept?: string): Promise<Response> {
  const headers: Record<string, string> = { "X-User-Id": user, "X-Forwarded-Uri": endpoint };
  if (accept) headers.Accept = accept;
  return fetch(`${checkerURL}/ratelimit/check`, { headers });
}

/** The headers a denial is compared by. */
export const comparedHeaders = ["retry-after", "ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "x-ratelimit-state", "content-type"];

/** Asserts that a middleware's denial (got) is forward-auth's (want) for the same subject and
 * state: status, headers and body, but for the decision's id and the seconds that may tick
 * between the two answers. */
export async function assertSameDenial(got: Response, want: Response): Promise<void> {
  assert.equal(got.status, 429);
  assert.equal(want.status, 429);
  for (const h of comparedHeaders) {
    const g = got.headers.get(h), w = want.headers.get(h);
    if (h === "retry-after" || h === "ratelimit") {
      assert.ok(g && w, `${h}: ${g} vs ${w}`);
      assert.ok(Math.abs(lastNumber(g) - lastNumber(w)) <= 1, `${h}: middleware ${g}, forward-auth ${w}`);
      assert.equal(g.replace(/\d+$/, ""), w.replace(/\d+$/, ""), h);
    } else {
      assert.equal(g, w, `${h}: middleware ${g}, forward-auth ${w}`);
    }
  }
  assert.ok(got.headers.get("x-quotaflow-decision-id"), "the middleware's answer names its decision");
  const gb = (await got.json()) as Record<string, unknown>, wb = (await want.json()) as Record<string, unknown>;
  assert.ok(gb.decision_id && wb.decision_id);
  assert.ok(Math.abs(Number(gb.retry_after) - Number(wb.retry_after)) <= 1, `retry_after ${gb.retry_after} vs ${wb.retry_after}`);
  for (const b of [gb, wb]) {
    delete b.decision_id;
    b.message = String(b.message).replace(/\d+ seconds/, `${wb.retry_after} seconds`);
    b.retry_after = wb.retry_after;
  }
  assert.deepEqual(Object.keys(gb), Object.keys(wb), "the body's members, in order");
  assert.deepEqual(gb, wb);
}

function lastNumber(s: string): number {
  return Number(/(\d+)$/.exec(s)![1]);
}

/** Exhausts user's limit on endpoint through forward-auth and returns its denial. */
export async function denyThroughForwardAuth(user: string, endpoint: string, limit: number, accept?: string): Promise<Response> {
  for (let i = 0; i < limit; i++) {
    const r = await forwardAuth(user, endpoint);
    assert.equal(r.status, 200, `forward-auth check ${i + 1} of ${limit}`);
    await r.arrayBuffer();
  }
  return forwardAuth(user, endpoint, accept);
}

export const quietLogger = { info() {}, warn() {}, error() {} };
