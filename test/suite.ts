// test/suite.ts: what npm test runs after the checks: every test/*.test.ts file, two at a time as
// `node --test --test-concurrency=2` runs them, with the spec reporter, but the longest files first. Node's
// runner sorts the files it is given by name, so runtimes.test.ts (Deno and Bun, four to five minutes) started
// near the end and ran alone while the other core idled. Files named on the command line run instead of all.
//   node test/suite.ts [test/x.test.ts …]

import { readdirSync } from "node:fs";
import { run } from "node:test";
import { spec } from "node:test/reporters";

// FIRST are the files that take longest (a CI run's per-file times), started before the rest.
const FIRST = [
  "test/runtimes.test.ts",
  "test/pgbouncer.test.ts",
  "test/docs-run.test.ts",
  "test/contract-ops.test.ts",
  "test/consume-crash.test.ts",
  "test/admin-browser.test.ts",
  "test/admin-config-browser.test.ts",
  "test/brokers-crash.test.ts",
  "test/package.test.ts",
];

const named = process.argv.slice(2);
const all = readdirSync(new URL(".", import.meta.url))
  .filter((f) => f.endsWith(".test.ts"))
  .map((f) => `test/${f}`)
  .sort();
const files =
  named.length > 0 ? named : [...FIRST.filter((f) => all.includes(f)), ...all.filter((f) => !FIRST.includes(f))];

run({ files, concurrency: 2 })
  .on("test:fail", () => {
    process.exitCode = 1;
  })
  .compose(new spec())
  .pipe(process.stdout);
