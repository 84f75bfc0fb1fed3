// bench/worker.ts: how fast one worker drains a backlog, and whether that holds as the backlog grows.
// Fills backlogs of BENCH_SMALL (20k) and BENCH_LARGE (200k) deliveries straight into the table, drains
// each with the record-payment handler at BENCH_CONCURRENCY (128), and prints
// deliveries/s for each, large/small, and the worker's peak RSS for each.
//   npm run bench -- worker          BENCH_SMALL=20000 BENCH_LARGE=200000

import { spawn } from "node:child_process";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { ROOT, f, fillBacklog, knob, tempDir } from "./common.ts";

const SMALL = knob("BENCH_SMALL", 20_000);
const LARGE = knob("BENCH_LARGE", 200_000);
// 128, not the worker's default of 8: the handler here is synchronous, so the batch per commit is the
// concurrency, and one fsync per 8 deliveries caps the rate well below the target.
const CONCURRENCY = knob("BENCH_CONCURRENCY", 128);

/** Drain is what bench/drain.ts reports. */
export interface Drain {
  done: number;
  failed: number;
  ms: number;
  peakRssMb: number;
  quartersMb: number[];
}

/** drainChild runs bench/drain.ts on a database and returns its report. */
export async function drainChild(path: string, concurrency: number): Promise<Drain> {
  const child = spawn(process.execPath, ["--import", "tsx", join(ROOT, "bench/drain.ts"), path, String(concurrency)], {
    cwd: ROOT, stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  if (code !== 0) throw new Error(`bench/drain.ts exited with ${code}`);
  return JSON.parse(out.trim().split("\n").at(-1)!) as Drain;
}

/** worker runs both drains and returns the one-line summary. */
export async function worker(): Promise<string> {
  const { dir, cleanup } = tempDir();
  console.log(`worker: backlogs of ${SMALL} and ${LARGE}, concurrency ${CONCURRENCY}, record-payment handler`);
  const results: { n: number; rate: number; rss: number; quarters: number[] }[] = [];
  try {
    for (const n of [SMALL, LARGE]) {
      const path = join(dir, `backlog-${n}.db`);
      const t0 = performance.now();
      fillBacklog(path, n);
      const fill = performance.now() - t0;
      const d = await drainChild(path, CONCURRENCY);
      if (d.done !== n) throw new Error(`expected ${n} done, got ${d.done} (failed ${d.failed})`);
      const rate = (d.done / d.ms) * 1000;
      results.push({ n, rate, rss: d.peakRssMb, quarters: d.quartersMb });
      console.log(`  backlog ${String(n).padStart(7)}: filled in ${f(fill / 1000, 1)} s, drained in ${f(d.ms / 1000, 2)} s = ${f(rate)} deliveries/s,` +
        ` worker peak RSS ${f(d.peakRssMb)} MB (by quarter of the run: ${d.quartersMb.map((q) => f(q)).join(", ")} MB)`);
    }
  } finally {
    cleanup();
  }
  const [small, large] = results as [typeof results[0], typeof results[0]];
  return `worker: ${f(small.rate)} deliveries/s at ${small.n} | ${f(large.rate)} deliveries/s at ${large.n}` +
    ` | large/small ×${f(large.rate / small.rate, 2)} | peak RSS ${f(small.rss)} MB → ${f(large.rss)} MB` +
    ` (${large.n} run by quarter: ${large.quarters.map((q) => f(q)).join(" → ")} MB)`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await worker());
