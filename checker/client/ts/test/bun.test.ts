// The web-standard path on another runtime: Bun, from the bun devDependency's binary, runs
// bun/hono.ts (a check, and the Hono middleware served by Bun.serve) against the checker.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { it } from "node:test";
import { checkerURL } from "./helpers.js";

const bun = new URL("../../node_modules/.bin/bun", import.meta.url).pathname;

it("Bun: a check and the Hono middleware", { skip: !existsSync(bun) && "no Bun binary for this platform in node_modules" }, () => {
  const r = spawnSync(bun, ["run", "bun/hono.ts"], {
    cwd: new URL("../..", import.meta.url).pathname,
    env: { ...process.env, QF_CHECKER_URL: checkerURL },
    encoding: "utf8",
    timeout: 60_000,
  });
  assert.equal(r.status, 0, `bun run bun/hono.ts:\n${r.stdout}\n${r.stderr}`);
});
