// Removes dist and dist-test before a build: tsc never deletes the output of a source that is gone.
import { rmSync } from "node:fs";
for (const d of ["dist", "dist-test"]) rmSync(new URL(`../${d}`, import.meta.url), { recursive: true, force: true });
