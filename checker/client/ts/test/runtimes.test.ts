// The web-standard path on other runtimes: Bun and Deno, from the bun and deno devDependencies'
// binaries (npm brings them, nothing else is downloaded), each run runtimes/hono.ts (a check,
// and the Hono middleware on the runtime's own server) against the checker.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { it } from "node:test";
import { checkerURL } from "./helpers.js";

const root = new URL("../..", import.meta.url).pathname;
const runtimes: Record<string, string[]> = {
  bun: ["run", "runtimes/hono.ts"],
  // node_modules as npm laid it out, and nothing remote: Deno fetches no package of its own.
  deno: ["run", "--node-modules-dir=manual", "--no-remote", "--no-lock", "--allow-net", "--allow-env", "--allow-read", "runtimes/hono.ts"],
};

for (const [name, args] of Object.entries(runtimes)) {
  const bin = join(root, "node_modules", ".bin", name);
  it(`${name}: a check and the Hono middleware`, { skip: !existsSync(bin) && `no ${name} binary for this platform in node_modules` }, () => {
    const cache = mkdtempSync(join(tmpdir(), `quotaflow-${name}-`));
    try {
      const r = spawnSync(bin, args, {
        cwd: root,
        env: { ...process.env, QF_CHECKER_URL: checkerURL, DENO_DIR: cache, DENO_NO_UPDATE_CHECK: "1", BUN_INSTALL_CACHE_DIR: cache, NO_COLOR: "1" },
        encoding: "utf8",
        timeout: 60_000,
      });
      assert.equal(r.status, 0, `${name} ${args.join(" ")}:\n${r.stdout}\n${r.stderr}`);
      assert.match(r.stdout, /a check and the Hono middleware as forward-auth answers/);
    } finally {
      rmSync(cache, { recursive: true, force: true });
    }
  });
}
