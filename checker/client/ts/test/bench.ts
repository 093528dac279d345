// npm run bench: checks/s and latency percentiles of one Node process against the checker at
// QF_CHECKER_URL, each check its own subject on /bench, from QF_BENCH_CONCURRENCY callers
// (default 32) for QF_BENCH_SECONDS (default 5) per configuration. Prints one JSON line each.
// The Go test TestBenchmark (QUOTAFLOW_TS_BENCH=1, make bench-ts) runs it beside the Go client.
import { Client } from "@quotaflow/client";
import { createNodeClient } from "@quotaflow/client/node";

const url = process.env.QF_CHECKER_URL;
if (!url) throw new Error("QF_CHECKER_URL is unset: the URL of a checker whose rules have /bench (see ts_test.go)");
const seconds = Number(process.env.QF_BENCH_SECONDS ?? 5);
const callers = Number(process.env.QF_BENCH_CONCURRENCY ?? 32);
const run = Date.now().toString(36);

const configs: Record<string, () => Client> = {
  "ts fetch coalesced": () => new Client(url, { timeoutMs: 5_000 }),
  "ts fetch single": () => new Client(url, { timeoutMs: 5_000, batchWaitMs: -1 }),
  "ts connect-node coalesced": () => createNodeClient(url, { timeoutMs: 5_000 }),
  "ts connect-node single": () => createNodeClient(url, { timeoutMs: 5_000, batchWaitMs: -1 }),
};
const only = process.env.QF_BENCH_ONLY;

for (const [name, make] of Object.entries(configs)) {
  if (only && !name.includes(only)) continue;
  const c = make();
  let n = 0, errors = 0;
  const lat: number[] = [];
  // A second of warm-up: connections made, code optimised.
  for (const measure of [false, true]) {
    const end = performance.now() + (measure ? seconds : 1) * 1000;
    const start = performance.now();
    await Promise.all(Array.from({ length: callers }, async () => {
      while (performance.now() < end) {
        const t0 = performance.now();
        const d = await c.check({ subjects: [{ dimension: "user", id: `bench-${run}-${n++}` }], endpoint: "/bench" });
        if (!d.allowed || d.source !== "checker") errors++;
        if (measure) lat.push(performance.now() - t0);
      }
    }));
    if (measure) {
      const took = (performance.now() - start) / 1000;
      lat.sort((a, b) => a - b);
      const q = (p: number) => Number(lat[Math.min(lat.length - 1, Math.floor(p * lat.length))].toFixed(2));
      console.log(JSON.stringify({ name, callers, checks_per_sec: Math.round(lat.length / took), p50_ms: q(0.5), p99_ms: q(0.99), errors }));
    }
  }
  c.close();
}
