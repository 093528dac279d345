// The deny cache and FailLocal's token buckets, as checker/client/local.go keeps them.
import type { Decision, Request } from "./types.js";

/** Bounds the deny cache and the local buckets: past it expired entries are swept, and a cache
 * still full stores nothing new (the checker decides those checks). */
export const maxEntries = 100_000;

/** What a check counts against: its subjects, endpoint, tier and entitlement. */
export function subjectKey(r: Request): string {
  const subs = r.subjects.map((s) => `${s.customDimension ? "c" + s.customDimension : s.dimension ?? ""}:${s.id}`).sort();
  return [r.tier ?? "", r.entitlement ?? "", r.endpoint, ...subs].join("\x00");
}

export const costOf = (c: number | undefined): number => Math.max(c ?? 0, 1);

interface Denial {
  until: number;
  cost: number;
  d: Decision;
}

/** Remembers the checker's denials until their retry_after: a check of the same subjects,
 * endpoint and tier costing at least as much would be denied again, so it is denied here
 * without a call. It can only repeat a denial the checker made. */
export class DenyCache {
  private m = new Map<string, Denial>();

  get(key: string, cost: number | undefined, now: number): Decision | undefined {
    const e = this.m.get(key);
    if (!e || now >= e.until || costOf(cost) < e.cost) return undefined;
    return { ...e.d, source: "deny-cache", replayed: false, retryAfterMs: e.until - now };
  }

  put(key: string, cost: number | undefined, d: Decision, until: number): void {
    if (this.m.size >= maxEntries) {
      const now = Date.now();
      for (const [k, e] of this.m) if (now >= e.until) this.m.delete(k);
      if (this.m.size >= maxEntries) return;
    }
    this.m.set(key, { until, cost: costOf(cost), d });
  }
}

/** FailLocal's token buckets, one per subject key. */
export class LocalBuckets {
  private m = new Map<string, { tokens: number; last: number }>();
  constructor(private rate: number, private burst: number) {}

  /** Takes one token of key's bucket: allowed, or denied with the wait for the next token. */
  take(key: string, now: number): [allowed: boolean, retryAfterMs: number] {
    let b = this.m.get(key);
    if (!b) {
      // Forgetting every bucket only lets more through, which a fail mode may.
      if (this.m.size >= maxEntries) this.m.clear();
      b = { tokens: this.burst, last: now };
      this.m.set(key, b);
    }
    b.tokens = Math.min(this.burst, b.tokens + ((now - b.last) / 1000) * this.rate);
    b.last = now;
    if (b.tokens >= 1) {
      b.tokens--;
      return [true, 0];
    }
    return [false, Math.ceil(((1 - b.tokens) / this.rate) * 1000)];
  }
}
