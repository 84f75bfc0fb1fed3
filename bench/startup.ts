// bench/startup.ts: what the start-up quick_check costs a cron `worker.ts --once` on a full inbox. Fills
// BENCH_STARTUP_ROWS (200,000) done deliveries of about 400 bytes, then times `worker.ts --once` with
// nothing due, three ways, each the median of BENCH_STARTUP_RUNS (5): the check due (never checked), the
// check not due (checked today, stopped cleanly), and --skip-check, the baseline. Prints each, the check's
// ms per MB, and that cost scaled to a million rows of the same size (quick_check reads every page once).
//   npm run bench -- startup          BENCH_STARTUP_ROWS=200000 BENCH_STARTUP_RUNS=5

import { spawnSync } from "node:child_process";
import { rmSync, statSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { sha256 } from "../lib/rows.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import { f, flushFill, knob, ROOT, tempDir } from "./common.ts";

const ROWS = knob("BENCH_STARTUP_ROWS", 200_000);
const RUNS = knob("BENCH_STARTUP_RUNS", 5);

// fillDone writes n done deliveries straight into the table, as a month of traffic leaves them.
function fillDone(path: string, n: number): void {
  openDatabase(path).close();
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  const insert = db.prepare(
    `INSERT INTO deliveries (source, id, body, body_sha256, content_type, received_at, status, available_at, finished_at)
     VALUES ('default', ?, ?, ?, 'application/json', ?, 'done', ?, ?)`,
  );
  const now = Date.now();
  for (let start = 0; start < n; start += 50_000) {
    db.exec("BEGIN");
    for (let i = start; i < Math.min(n, start + 50_000); i++) {
      const body = Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i}`, pad: "x".repeat(330) }));
      insert.run(`st_${i}`, body, sha256(body), now - n + i, now - n + i, now - n + i);
    }
    db.exec("COMMIT");
  }
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.close();
  flushFill(path);
}

// once times one `worker.ts --once` on db, in ms.
function once(db: string, args: string[] = []): number {
  const t = performance.now();
  const r = spawnSync(
    process.execPath,
    ["--import", "tsx", join(ROOT, "worker.ts"), "--once", "--quiet", "--db", db, ...args],
    {
      cwd: ROOT,
      encoding: "utf8",
    },
  );
  if (r.status !== 0) throw new Error(`worker.ts --once exited with ${r.status}: ${r.stderr}`);
  return performance.now() - t;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** startupBench times a cron worker's start with the check due, not due and skipped, and returns the summary. */
export async function startupBench(): Promise<string> {
  const { dir, cleanup } = tempDir();
  try {
    const db = join(dir, "startup.db");
    fillDone(db, ROWS);
    const mb = statSync(db).size / 2 ** 20;
    once(db, ["--skip-check"]); // warm the page cache and tsx's, as a cron's every run after its first
    const skipped: number[] = [];
    const due: number[] = [];
    const notDue: number[] = [];
    for (let i = 0; i < RUNS; i++) {
      skipped.push(once(db, ["--skip-check"]));
      rmSync(`${db}-checked`, { force: true });
      due.push(once(db));
      notDue.push(once(db));
    }
    const [s, d, n] = [median(skipped), median(due), median(notDue)];
    const perMb = (d - s) / mb;
    const millionMb = (mb / ROWS) * 1_000_000;
    console.log(`  ${f(ROWS)} done deliveries, ${f(mb)} MB; worker.ts --once with nothing due, median of ${RUNS}:`);
    console.log(`    --skip-check (baseline)        ${f(s)} ms`);
    console.log(`    check due (never checked)      ${f(d)} ms  (×${f(d / s, 2)})`);
    console.log(`    check not due (checked today)  ${f(n)} ms  (×${f(n / s, 2)})`);
    console.log(
      `  the check: ${f(d - s)} ms, ${f(perMb, 1)} ms/MB; at a million such rows (${f(millionMb)} MB), about ${f((perMb * millionMb) / 1000, 1)} s, now paid once a day, not every run`,
    );
    return `startup: ${f(ROWS)} rows, ${f(mb)} MB | worker --once ${f(s)} ms skipped, ${f(d)} ms due (×${f(d / s, 2)}), ${f(n)} ms not due (×${f(n / s, 2)}) | ${f(perMb, 1)} ms/MB, ~${f((perMb * millionMb) / 1000, 1)} s at 1M rows`;
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await startupBench());
