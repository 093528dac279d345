// The HTTP answer of a decision, as the checker's forward-auth gives it
// (checker/transport/forwardauth.go, internal/ratelimitheader): Retry-After, X-RateLimit-*, the
// IETF RateLimit and RateLimit-Policy fields (draft-ietf-httpapi-ratelimit-headers-11) and the
// JSON or problem+json body of a denial.
import type { Decision, Policy } from "./types.js";

/** The draft's quota-exceeded problem type. */
export const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded";
export const quotaExceededTitle = "Request cannot be satisfied as assigned quota has been exceeded";

/** A structured-field string: quoted, '"' and '\' escaped, bytes outside printable ASCII '?'. */
function sfString(s: string): string {
  let out = '"';
  for (const b of new TextEncoder().encode(s)) {
    if (b === 0x22 || b === 0x5c) out += "\\" + String.fromCharCode(b);
    else if (b < 0x20 || b > 0x7e) out += "?";
    else out += String.fromCharCode(b);
  }
  return out + '"';
}

/** The RateLimit field: `"policy";r=<remaining>;t=<seconds to reset>`. */
export function rateLimitField(policy: string, remaining: number, resetSeconds: number): string {
  return `${sfString(policy)};r=${Math.max(0, remaining)};t=${Math.max(0, resetSeconds)}`;
}

/** The RateLimit-Policy field: one item per enforced limit. */
export function rateLimitPolicyField(ps: Policy[]): string {
  return ps
    .map((p) => {
      let s = `${sfString(p.ruleId)};q=${p.limit};w=${Math.max(1, Math.floor(p.windowMs / 1000))}`;
      if (p.burst !== 0 && p.burst !== p.limit) s += `;burst=${p.burst}`;
      return s;
    })
    .join(", ");
}

const ceilSeconds = (ms: number) => Math.ceil(ms / 1000);

/** The rate limit headers of d: those of forward-auth for a checker's decision; a fail mode's
 * has no limit of the checker's and sets Retry-After (when denied) and X-RateLimit-Degraded. */
export function rateLimitHeaders(d: Decision, nowMs = Date.now()): Record<string, string> {
  const h: Record<string, string> = {};
  if (d.decisionId) h["X-Quotaflow-Decision-Id"] = d.decisionId;
  if (d.ruleId) {
    h["X-RateLimit-Limit"] = String(d.limit);
    h["X-RateLimit-Remaining"] = String(d.remaining);
    h["X-RateLimit-Reset"] = String(d.resetAt);
    if (d.state) h["X-RateLimit-State"] = d.state;
    h["RateLimit"] = rateLimitField(d.ruleId, d.remaining, d.resetAt > 0 ? Math.max(0, ceilSeconds(d.resetAt * 1000 - nowMs)) : 0);
    const p = rateLimitPolicyField(d.policies);
    if (p) h["RateLimit-Policy"] = p;
  }
  if (!d.allowed) h["Retry-After"] = String(ceilSeconds(d.retryAfterMs));
  if (d.degraded) h["X-RateLimit-Degraded"] = "true";
  return h;
}

/** Whether an Accept header asks for application/problem+json. */
export function acceptsProblem(accept: string | string[] | undefined | null): boolean {
  const vs = Array.isArray(accept) ? accept : accept ? [accept] : [];
  return vs.some((v) => v.split(",").some((item) => item.split(";")[0].trim().toLowerCase() === "application/problem+json"));
}

/** The body of a denial, member for member forward-auth's: the plain JSON answer, and with
 * problem the quota-exceeded problem's members too. */
export function denialBody(d: Decision, problem: boolean, status = 429): Record<string, unknown> {
  const retryAfter = ceilSeconds(d.retryAfterMs);
  const b: Record<string, unknown> = {
    error: "rate_limit_exceeded",
    message: `Too many requests. Please retry after ${retryAfter} seconds.`,
    allowed: false,
    limit: d.limit,
    remaining: d.ruleId ? d.remaining : 0,
    reset_at: d.resetAt,
    retry_after: retryAfter,
  };
  if (d.ruleId) b.rule_id = d.ruleId;
  if (d.state) b.state = d.state;
  if (d.tier) b.tier = d.tier;
  if (d.degraded) b.degraded = true;
  if (d.decisionId) b.decision_id = d.decisionId;
  if (problem) {
    b.type = quotaExceededType;
    b.title = quotaExceededTitle;
    b.status = status;
    if (d.violated.length > 0) b["violated-policies"] = d.violated;
  }
  return b;
}
