// bench/purge.ts: does a purge make acks wait? Fills an inbox with BENCH_PURGE_ROWS (200k) done deliveries
// of 1 KB received 8 days ago, then paces POSTs at BENCH_PURGE_RATE (1000/s) into a receiver on it, open
// loop, in 2-second windows: for BENCH_SECONDS with no purge, all through `inbox.ts purge` dropping those
// bodies in a process of its own (batches of BENCH_PURGE_BATCH, default DEFAULTS.purgeBatch, each its own
// transaction, resting BENCH_PURGE_REST times as long after each, default DEFAULTS.purgeRest), and for
// BENCH_SECONDS with no purge again. Prints the purge's own time and rate, and the ack p99 during against
// the worse of before and after, three ways: the worst window's, the median window's, and every ack's. On PostgreSQL (when
// bench/targets.ts has it) the same, twice, on a day of BENCH_PURGE_ROWS: released whole by dropping the
// day's partition of bodies, and, as the baseline in the same run, row by row from the default partition.
// The purge runs in a process started before the windows (BENCH_PURGE_WARM=0: `inbox.ts purge` started in them).
//   npm run bench -- purge           BENCH_PURGE_ROWS=200000 BENCH_PURGE_RATE=1000 BENCH_SECONDS=8 BENCH_PURGE_ROW_BY_ROW=0

import { spawn } from "node:child_process";
import { statSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { DEFAULTS } from "../lib/defaults.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { f, flushFill, knob, mountOf, ROOT, SECONDS, startChild, tempDir } from "./common.ts";
import { paced, type Paced } from "./latency.ts";
import { connect } from "../inbox.ts";
import { periodOf } from "../lib/postgres/periods.ts";
import { fillPostgres } from "./stored.ts";
import { inboxTargets } from "./targets.ts";

// The knobs, shared with bench/purgetrace.ts, which takes the same run apart.
export const ROWS = knob("BENCH_PURGE_ROWS", 200_000);
export const RATE = knob("BENCH_PURGE_RATE", 1_000);
export const BATCH = knob("BENCH_PURGE_BATCH", DEFAULTS.purgeBatch);
export const REST = process.env.BENCH_PURGE_REST ? Number(process.env.BENCH_PURGE_REST) : DEFAULTS.purgeRest;

/** fillDone inserts n done deliveries of about 1 KB, received days ago, straight into the table. */
export function fillDone(path: string, n: number, daysAgo: number): void {
  openDatabase(path).close();
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  const insert = db.prepare(
    `INSERT INTO deliveries (source, id, body, body_sha256, content_type, received_at, status, attempts, available_at, finished_at)
     VALUES ('default', ?, ?, ?, 'application/json', ?, 'done', 1, ?, ?)`,
  );
  const then = Date.now() - daysAgo * 86_400_000;
  const pad = "x".repeat(960);
  for (let start = 0; start < n; start += 50_000) {
    db.exec("BEGIN");
    for (let i = start; i < Math.min(n, start + 50_000); i++) {
      const body = Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i}`, amount: 5, pad }));
      insert.run(`old_${i}`, body, sha256(body), then + i, then + i, then + i);
    }
    db.exec("COMMIT");
  }
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.close();
  flushFill(path);
}

/**
 * WARM (BENCH_PURGE_WARM, on by default) purges in a process started and connected before the acks' "during"
 * windows begin (bench/purge-warm.ts), as `worker.ts --purge-every` does; 0 starts `inbox.ts purge` inside
 * them, its start-up measured with the purge, as every figure before 2026-12-07 13:00 UTC was.
 */
export const WARM = process.env.BENCH_PURGE_WARM !== "0";

/**
 * purgeChild starts a purge of the database in a process of its own and resolves, once it has exited, with
 * its wall time from go(); cold (`inbox.ts purge`) it goes at once, warm (bench/purge-warm.ts) ready resolves
 * when the process has opened the inbox, and go() starts the purge.
 */
export function purgeChild(
  path: string,
  warm = false,
): { pid: number; ready: Promise<void>; go: () => void; done: Promise<{ ms: number; out: string }> } {
  let started = performance.now();
  const args = warm
    ? [join(ROOT, "bench", "purge-warm.ts"), path, String(BATCH), String(REST)]
    : [join(ROOT, "inbox.ts"), "purge", "--db", path, "--batch", String(BATCH), "--rest", String(REST)];
  const child = spawn(process.execPath, ["--import", "tsx", ...args], {
    cwd: ROOT,
    stdio: [warm ? "pipe" : "ignore", "pipe", "pipe"],
  });
  let out = "";
  let ready!: () => void;
  const isReady = new Promise<void>((resolve) => (ready = resolve));
  if (!warm) ready();
  child.stdout!.on("data", (d: Buffer) => {
    out += d;
    if (warm && out.startsWith("ready\n")) ready();
  });
  child.stderr!.on("data", (d: Buffer) => (out += d));
  const done = new Promise<{ ms: number; out: string }>((resolve, reject) =>
    child.on("exit", (code) =>
      code === 0
        ? resolve({ ms: performance.now() - started, out })
        : reject(new Error(`${warm ? "bench/purge-warm.ts" : "inbox.ts purge"} exited with ${code}: ${out}`)),
    ),
  );
  // A child that dies before it is ready fails ready too, not only done.
  void done.catch(() => {});
  return {
    pid: child.pid!,
    ready: Promise.race([isReady, done.then(() => {})]),
    go: () => {
      started = performance.now();
      if (warm) child.stdin!.end("go\n");
    },
    done,
  };
}

// Windows are consecutive paced runs of WINDOW seconds each: a purge on PostgreSQL takes longer than one paced
// run, and its one DETACH comes at its end. Their worst p99 is read on each side of the comparison alike.
const WINDOW = 2;
interface Windows {
  worstP99: number;
  /** The median window's p99: the worst of many windows is worse than the worst of a few by chance alone. */
  medianP99: number;
  medianP50: number;
  /** The p99 of every ack of every window together: the issue's own measure, though a noisy minute weighs in it whole. */
  p99: number;
  count: number;
}
async function windows(url: string, until: () => boolean): Promise<Windows> {
  const runs: Paced[] = [];
  do runs.push(await paced(url, RATE, WINDOW));
  while (!until());
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const all = new Float64Array(runs.reduce((n, r) => n + r.latencies.length, 0));
  runs.reduce((at, r) => (all.set(r.latencies, at), at + r.latencies.length), 0);
  all.sort();
  return {
    p99: all[Math.floor(0.99 * all.length)]!,
    worstP99: Math.max(...runs.map((r) => r.p99)),
    medianP99: median(runs.map((r) => r.p99)),
    medianP50: median(runs.map((r) => r.p50)),
    count: runs.length,
  };
}

// aroundPurge paces acks into a receiver on db before, during (all of it) and after one `inbox.ts purge` of it.
async function aroundPurge(
  db: string,
): Promise<{ before: Windows; during: Windows; after: Windows; ms: number; out: string }> {
  const receiver = await startChild("receiver.ts", ["--port", "0", "--db", db, "--quiet"]);
  try {
    await paced(receiver.url, RATE, Math.min(2, SECONDS)); // warm-up
    const timed = (seconds: number) => {
      const end = performance.now() + seconds * 1000;
      return () => performance.now() >= end;
    };
    const running = purgeChild(db, WARM);
    await running.ready;
    const before = await windows(receiver.url, timed(SECONDS));
    running.go();
    let finished = false;
    void running.done.finally(() => (finished = true)).catch(() => {});
    const during = await windows(receiver.url, () => finished);
    const { ms, out } = await running.done;
    const after = await windows(receiver.url, timed(SECONDS));
    return { before, during, after, ms, out };
  } finally {
    await receiver.stop();
  }
}

// around says how one purge went beside the acks: its time, and the worst and the median window's ack p99
// during it against those before and after, each as a ratio to the worse side.
function around(r: { before: Windows; during: Windows; after: Windows; ms: number }): string {
  return (
    `${f(ROWS)} bodies of one day in ${f(r.ms / 1000, 1)} s (${WARM ? "a process started before" : "inbox.ts purge started"}) at ${f(RATE)} acks/s | worst ${WINDOW} s window's ack p99 ` +
    `${f(r.during.worstP99, 2)} ms during (${r.during.count} windows, median p50 ${f(r.during.medianP50, 2)} ms), ` +
    `${f(r.before.worstP99, 2)}/${f(r.after.worstP99, 2)} before/after: ×${f(r.during.worstP99 / Math.max(r.before.worstP99, r.after.worstP99), 2)}; ` +
    `the median window's p99 ${f(r.during.medianP99, 2)} ms during, ${f(r.before.medianP99, 2)}/${f(r.after.medianP99, 2)} before/after: ` +
    `×${f(r.during.medianP99 / Math.max(r.before.medianP99, r.after.medianP99), 2)}; every ack's p99 ${f(r.during.p99, 2)} ms during, ` +
    `${f(r.before.p99, 2)}/${f(r.after.p99, 2)} before/after: ×${f(r.during.p99 / Math.max(r.before.p99, r.after.p99), 2)}`
  );
}

/**
 * purgePostgres releases one day of ROWS done deliveries on PostgreSQL twice, each on a fresh database: with
 * the day's partition made before the fill (its bodies dropped whole: docs/operations.md#retention-by-period),
 * and without it (the bodies in the default partition, deleted row by row as before), acks paced around each.
 */
async function purgePostgres(dir: string): Promise<string[]> {
  const target = (await inboxTargets()).find((t) => t.name === "PostgreSQL");
  if (!target) return [];
  const lines: string[] = [];
  // BENCH_PURGE_ROW_BY_ROW=0 leaves out the row-by-row run, which at a million rows is most of half an hour.
  for (const whole of process.env.BENCH_PURGE_ROW_BY_ROW === "0" ? [true] : [true, false]) {
    const { db, drop } = await target.fresh(dir, `purge_${whole ? "day" : "rows"}`);
    try {
      const inbox = await connect(db);
      // One UTC day, eight days ago: every row of it past the default --bodies-after of 7 days.
      const day = periodOf(Date.now() - 8 * 86_400_000);
      if (whole)
        await inbox.query(
          `CREATE TABLE ${day.name} PARTITION OF delivery_bodies FOR VALUES FROM (${day.from}) TO (${day.until})`,
        );
      await fillPostgres(inbox, ROWS, day.until - 1, 1, whole);
      // A day's DROP waits for the file system's discard, when it is mounted so (docs/production.md#the-file-system).
      const [data] = await inbox.query("SELECT current_setting('data_directory') AS d");
      await inbox.close();
      const r = await aroundPurge(db);
      const line = `  ${whole ? "PostgreSQL, the day dropped" : "PostgreSQL, row by row"}: ${around(r)} | data directory on ${mountOf(String(data!.d))}`;
      console.log(line);
      lines.push(line);
    } finally {
      await drop();
    }
  }
  return lines;
}

/** purge runs the three paced runs around one purge and returns the one-line summary. */
export async function purge(): Promise<string> {
  const { dir, cleanup } = tempDir();
  try {
    if (process.env.BENCH_SQLITE === "0") return `purge on PostgreSQL alone:\n${(await purgePostgres(dir)).join("\n")}`;
    const path = join(dir, "purge.db");
    fillDone(path, ROWS, 8);
    const sizeBefore = statSync(path).size;
    const r = await aroundPurge(path);
    const db = new DatabaseSync(path);
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
    const { n } = db.prepare("SELECT count(*) AS n FROM deliveries WHERE purged_at IS NOT NULL").get() as { n: number };
    db.close();
    const sizeAfter = statSync(path).size;
    const line =
      `  SQLite (batches of ${BATCH}, rest ×${REST}): ${around(r)} | ${f(n)} tombstones, ${f(n / (r.ms / 1000))}/s; ` +
      `file ${f(sizeBefore / 2 ** 20)} MB → ${f(sizeAfter / 2 ** 20)} MB`;
    console.log(line);
    console.log(`  ${r.out.trim().split("\n").join("\n  ")}`);
    const postgres = await purgePostgres(dir);
    return `purge:\n${line}${postgres.map((l) => `\n${l}`).join("")}`;
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await purge());
