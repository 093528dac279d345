// normalizePath against the checker's own normal form: test/urlpath-cases.json holds paths and
// what Go's internal/urlpath makes of them (ts_test.go's TestPathCases checks the file against
// Go), so that the two cannot drift apart.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, it } from "node:test";
import { normalizePath, PathError } from "@quotaflow/client";

interface PathCase {
  in: string;
  out?: string;
  err?: string;
}

const cases: PathCase[] = JSON.parse(readFileSync(new URL("../../test/urlpath-cases.json", import.meta.url), "utf8"));

describe("normalizePath, as the checker normalizes", () => {
  it("has cases", () => assert.ok(cases.length > 80, `${cases.length} cases`));
  for (const c of cases) {
    it(JSON.stringify(c.in), () => {
      if (c.err === undefined) {
        assert.equal(normalizePath(c.in), c.out);
        return;
      }
      assert.throws(() => normalizePath(c.in), (e: unknown) => e instanceof PathError && e.message === c.err);
    });
  }
});
