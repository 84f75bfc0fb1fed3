// test/runtimes.test.ts: the portable subset of the suite, run as it is on Deno and on Bun (their own test
// runners read node:test files) and, for the story, on Node without tsx. Each file's children run on the
// same runtime (test/helpers.ts). A runtime that is absent is skipped in one line; INBOX_REQUIRE_DENO=1 and
// INBOX_REQUIRE_BUN=1 (as .ci/run sets them) fail the run instead. Last, that no file but runtime.ts asks
// which runtime it runs on. Alone: npx node --import tsx --test test/runtimes.test.ts

import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { CONTRACT_FILES, ROOT, runtimeBinary } from "./helpers.ts";

/** One file of the subset, and the one test of it to run where not all of it is portable-subset material. */
interface Part {
  file: string;
  /** The files it runs, in one run of the runtime's test runner, where the part is several. @default [file] */
  files?: readonly string[];
  only?: string;
  why: string;
}

const SUBSET: readonly Part[] = [
  { file: "test/demo.test.ts", why: "the article's story through the real scripts, each a child on the same runtime" },
  {
    file: "test/durability.test.ts",
    why: "each runtime bundles its own SQLite: WAL, synchronous=FULL and the version, read back",
  },
  { file: "test/checkpoint.test.ts", why: "the checkpoint thread, on each runtime's node:worker_threads" },
  {
    file: "test/contract-*.test.ts",
    files: CONTRACT_FILES,
    why: "the store contract on SQLite and PostgreSQL (pg) in-process",
  },
  { file: "test/providers-http.test.ts", why: "each runtime's node:http server and the providers' signatures" },
  {
    file: "test/filter-bounds.test.ts",
    only: "regex filters run in linear time",
    why: "a filter's $regex on re2js (pure JavaScript): the same RE2 syntax and linear time on each runtime",
  },
  {
    file: "test/crash.test.ts",
    only: "a receiver killed with SIGKILL while senders send",
    why: "nothing acknowledged is lost across a SIGKILL",
  },
];

// filesOf is what a part hands the runner: its files, or the one.
const filesOf = (part: Part): readonly string[] => part.files ?? [part.file];

/** A runtime the subset runs on: where its binary is, and how its test runner runs one part. */
interface Runtime {
  name: string;
  binary: string | undefined;
  /** The parts it runs: all of them, or (Node, which runs the whole suite under tsx) the story alone. */
  parts: readonly Part[];
  args(part: Part): string[];
  /** How its runner's closing lines say that at least one test passed. */
  passed: RegExp;
}

const RUNTIMES: readonly Runtime[] = [
  {
    // Node's own type stripping, as `node receiver.ts` runs: the rest of npm test already runs every file under tsx.
    name: "node",
    binary: process.execPath,
    parts: SUBSET.filter((p) => p.file === "test/demo.test.ts"),
    args: (part) => ["--test", ...(part.only ? ["--test-name-pattern", part.only] : []), ...filesOf(part)],
    passed: /^ℹ pass [1-9]/m,
  },
  {
    // --no-check: tsc --noEmit is the type check; Deno's own would only repeat it, slower.
    name: "deno",
    binary: runtimeBinary("deno", "the portable subset on deno"),
    parts: SUBSET,
    args: (part) => ["test", "-A", "--no-check", ...(part.only ? ["--filter", part.only] : []), ...filesOf(part)],
    passed: /^ok \| [1-9]\d* passed/m,
  },
  {
    // Bun's runner gives each test 5 s unless told otherwise; the crash test takes longer. "./": a bare name is a filter.
    name: "bun",
    binary: runtimeBinary("bun", "the portable subset on bun"),
    parts: SUBSET,
    args: (part) => [
      "test",
      "--timeout",
      "300000",
      ...(part.only ? ["-t", part.only] : []),
      ...filesOf(part).map((f) => `./${f}`),
    ],
    passed: /^\s*[1-9]\d* pass$/m,
  },
];

function version(runtime: Runtime): string {
  if (!runtime.binary) return "absent";
  const out = spawnSync(runtime.binary, ["--version"], { encoding: "utf8" }).stdout ?? "";
  return /\d+\.\d+\.\d+/.exec(out)?.[0] ?? out.trim();
}

// runPart runs one file of the subset under a runtime's own test runner and returns its exit code and output.
function runPart(runtime: Runtime, part: Part): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    // Without NODE_TEST_CONTEXT, which this file's runner set: a `node --test` that inherits it reports to
    // a parent runner instead of running as its own, and exits 0 having run nothing.
    const { NODE_TEST_CONTEXT: _, ...env } = process.env;
    const child = spawn(runtime.binary!, runtime.args(part), {
      cwd: ROOT,
      env: { ...env, NO_COLOR: "1", FORCE_COLOR: "0" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (d) => (output += d));
    child.stderr.on("data", (d) => (output += d));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, output }));
  });
}

// The runtimes take their turns at once, each running its parts one after another: a part's children, temp
// folders, ports (0) and PostgreSQL schemas (named by process ID) are its own, so Deno's run and Bun's share
// nothing but the machine, and the wall time is the longest runtime's rather than the sum (~75 s before).
describe("the portable subset, on each runtime at once", { concurrency: true }, () => {
  for (const runtime of RUNTIMES) {
    const skip = runtime.binary ? false : `no ${runtime.name}`;
    describe(`the portable subset on ${runtime.name} ${skip ? "" : version(runtime)}`.trimEnd(), {
      skip,
      concurrency: 1,
    }, () => {
      for (const part of runtime.parts) {
        it(`${part.file}${part.only ? `: ${part.only}` : ""} (${part.why})`, async () => {
          const run = await runPart(runtime, part);
          const { code } = run;
          // Deno colours its report whatever NO_COLOR says.
          const output = run.output.replace(/\x1b\[[0-9;]*m/g, "");
          const lines = output.split("\n");
          const tail = lines.slice(-60).join("\n");
          // Bun prints a failure's error above its "(fail)" line, which a long run pushes out of the tail; its
          // summary then lists the same line again, after passes alone.
          const seen = new Set<string>();
          const failures = lines.flatMap((line, i) =>
            /^\(fail\)/.test(line) && !seen.has(line) && seen.add(line) ? lines.slice(Math.max(0, i - 25), i + 1) : [],
          );
          const why = failures.length > 0 ? `${failures.slice(0, 100).join("\n")}\n…\n` : "";
          assert.equal(code, 0, `${runtime.name} ${runtime.args(part).join(" ")} exited ${code}:\n${why}${tail}`);
          // A runner that ran nothing also exits 0: a filter that matches no test must not pass for one that does.
          assert.match(output, runtime.passed, `${runtime.name} ran no test of ${part.file}:\n${tail}`);
        });
      }
    });
  }
});

// askedWhichRuntime finds the lines of code (not comments) that ask which runtime they run on.
function askedWhichRuntime(source: string): string[] {
  return source
    .split("\n")
    .filter((line) => !/^\s*(\/\/|\*|\/\*)/.test(line))
    .filter((line) =>
      /\b(Deno|Bun)\s*[.!?]|typeof\s+(Deno|Bun)\b|versions\s*\.\s*(deno|bun)\b|versions\[["'](deno|bun)/.test(line),
    );
}

describe("the roles and scripts", () => {
  it("never ask which runtime they run on: runtime.ts is the one place that does", () => {
    const files = [
      ...readdirSync(ROOT),
      ...readdirSync(join(ROOT, "lib"), { recursive: true, encoding: "utf8" }).map((f) => `lib/${f}`),
    ].filter((f) => f.endsWith(".ts") && f !== "lib/runtime.ts");
    const asking = files.flatMap((f) =>
      askedWhichRuntime(readFileSync(join(ROOT, f), "utf8")).map((line) => `${f}: ${line.trim()}`),
    );
    assert.deepEqual(asking, []);
    assert.ok(askedWhichRuntime(readFileSync(join(ROOT, "lib", "runtime.ts"), "utf8")).length > 0, "runtime.ts asks");
  });

  it("(control) the check finds a runtime test in code, and not in a comment", () => {
    assert.equal(
      askedWhichRuntime('if (typeof Bun !== "undefined") serve();\nconst d = Deno.env;\n// on Deno.serve, see below')
        .length,
      2,
    );
    assert.equal(askedWhichRuntime("const v = process.versions.bun;").length, 1);
  });
});
