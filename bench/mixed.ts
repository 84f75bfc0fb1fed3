// bench/mixed.ts: the receiver under closed-loop load while a worker drains the same inbox. Measures
// each alone first, in the same run, on the same database, then both at once, and prints both rates
// and their ratios to running alone.
//   npm run bench -- mixed          BENCH_SECONDS=8 BENCH_MIXED_BACKLOG=200000 BENCH_CONCURRENCY=128

import { spawn } from "node:child_process";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import {
  CONNECTIONS,
  ROOT,
  SECONDS,
  WARMUP_SECONDS,
  f,
  fillBacklog,
  hammer,
  knob,
  row,
  startChild,
  tempDir,
} from "./common.ts";

const BACKLOG = knob("BENCH_MIXED_BACKLOG", 200_000);
const CONCURRENCY = knob("BENCH_CONCURRENCY", 128);

function doneCount(path: string): number {
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    return (db.prepare("SELECT count(*) AS n FROM deliveries WHERE status = 'done'").get() as { n: number }).n;
  } finally {
    db.close();
  }
}

// drainFor runs worker.ts (the real CLI) for `seconds` while `during` runs, and returns deliveries/s.
async function drainFor(
  path: string,
  seconds: number,
  during: Promise<unknown> = new Promise((r) => setTimeout(r, seconds * 1000)),
): Promise<number> {
  // --skip-check: the start-up quick_check reads the whole file, which is start-up, not drain.
  const child = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      join(ROOT, "worker.ts"),
      "--db",
      path,
      "--quiet",
      "--skip-check",
      "--concurrency",
      String(CONCURRENCY),
    ],
    {
      cwd: ROOT,
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  let err = "";
  child.stderr.on("data", (d: Buffer) => (err += d));
  const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
  // Let it load and make its first claim before the clock starts.
  await new Promise((r) => setTimeout(r, 1_000));
  const before = doneCount(path);
  const t0 = performance.now();
  await during;
  const done = doneCount(path) - before;
  const ms = performance.now() - t0;
  child.kill("SIGTERM");
  if ((await exited) !== 0) throw new Error(`worker.ts failed: ${err}`);
  return (done / ms) * 1000;
}

/** mixed runs the three measurements and returns the one-line summary. */
export async function mixed(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const path = join(dir, "mixed.db");
  try {
    console.log(
      `mixed: backlog ${BACKLOG}, worker concurrency ${CONCURRENCY}, ${CONNECTIONS} connections, ${SECONDS} s per run`,
    );
    fillBacklog(path, BACKLOG);
    const workerAlone = await drainFor(path, SECONDS);
    console.log(`  worker alone                       ${f(workerAlone).padStart(7)} deliveries/s`);

    const receiver = await startChild("receiver.ts", ["--port", "0", "--db", path, "--quiet"]);
    await hammer(receiver.url, { seconds: WARMUP_SECONDS });
    const ingestAlone = await hammer(receiver.url, { seconds: SECONDS });
    row("receiver alone", ingestAlone);

    const load = hammer(receiver.url, { seconds: SECONDS });
    const workerBoth = await drainFor(path, SECONDS, load);
    const ingestBoth = await load;
    row("receiver while the worker drains", ingestBoth, `×${f(ingestBoth.rps / ingestAlone.rps, 2)}`);
    console.log(
      `  worker while the receiver ingests  ${f(workerBoth).padStart(7)} deliveries/s  ×${f(workerBoth / workerAlone, 2)}`,
    );
    const rss = receiver.peakRssMb();
    await receiver.stop();
    return (
      `mixed: ingest ${f(ingestBoth.rps)} req/s while draining (×${f(ingestBoth.rps / ingestAlone.rps, 2)} of ${f(ingestAlone.rps)} alone, p99 ${f(ingestBoth.p99, 1)} ms)` +
      ` | worker ${f(workerBoth)} deliveries/s while ingesting (×${f(workerBoth / workerAlone, 2)} of ${f(workerAlone)} alone)` +
      ` | together ${f(ingestBoth.rps + workerBoth)} rows/s | receiver peak RSS ${f(rss)} MB`
    );
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await mixed());
