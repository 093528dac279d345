// dist/cjs holds CommonJS: this package is "type": "module", so its CommonJS half says so in a
// package.json of its own, the one file tsc cannot write.
import { writeFileSync } from "node:fs";
writeFileSync(new URL("../dist/cjs/package.json", import.meta.url), '{"type":"commonjs"}\n');
