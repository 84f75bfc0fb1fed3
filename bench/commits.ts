// bench/commits.ts: what one SQLite group commit costs the receiver, without HTTP. store() in batches of
// BENCH_COMMIT_SIZES (1, 14, 25, 64: one request, and the batches the receiver's commits carried at 32
// connections with its fdatasync off the event loop, with --sync-in-commit, and at 128), each batch awaited
// before the next, on a fresh file at the receiver's settings: its own fdatasync on libuv's pool (the
// default), the fsync inside COMMIT (--sync-in-commit), and, as a yardstick only, no sync at all (acked at
// COMMIT, which the receiver never does). Prints the process's CPU per stored row (user and system), and
// the WAL frames a commit writes (SQLite writes each as two pwrite calls).
//   npm run bench -- commits          BENCH_COMMIT_SIZES=1,14,25,64 BENCH_SECONDS=3

import { readFileSync } from "node:fs";
import { join } from "node:path";
import { cpuUsage } from "node:process";
import { DEFAULTS } from "../lib/defaults.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { BODY, f, knob, tempDir } from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 3);
const SIZES = (process.env.BENCH_COMMIT_SIZES ?? "1,14,25,64").split(",").map(Number);
const MODES = ["own fdatasync", "sync in commit", "no sync (yardstick)"] as const;

/** commits measures every mode at every batch size and returns the one-line summary. */
export async function commits(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const body = Buffer.from(BODY);
  const lines: string[] = [];
  console.log(`commits: store() in batches of ${SIZES.join(", ")}, ${SECONDS} s each, receiver settings, no HTTP`);
  try {
    let files = 0;
    for (const size of SIZES) {
      for (const mode of MODES) {
        const path = join(dir, `commits${++files}.db`);
        const inbox = new SqliteInbox(path, {
          syncOffLoop: mode === "own fdatasync",
          backgroundCheckpoints: true,
          pageCacheKb: DEFAULTS.receiverPageCacheKb,
        });
        // The yardstick: the receiver's NORMAL without the fdatasync it owes before each ack.
        if (mode === "no sync (yardstick)") inbox.db.exec("PRAGMA synchronous = NORMAL");
        let n = 0;
        const batch = () =>
          Promise.all(
            Array.from({ length: size }, () => inbox.store({ id: `c-${n++}`, body, contentType: "application/json" })),
          );
        // A second of warm-up, so the JIT and the WAL's first growth are behind.
        for (const until = performance.now() + 1000; performance.now() < until; ) await batch();
        const c0 = cpuUsage();
        const n0 = n;
        for (const until = performance.now() + SECONDS * 1000; performance.now() < until; ) await batch();
        const cpu = cpuUsage(c0);
        const rows = n - n0;
        const frames = mode === "own fdatasync" ? await framesPerCommit(inbox, batch) : undefined;
        await inbox.close();
        const line =
          `batch ${size} ${mode}: ${f(rows / SECONDS)} rows/s, CPU ${f((cpu.user + cpu.system) / rows)} µs a row (user ${f(cpu.user / rows)}, system ${f(cpu.system / rows)})` +
          (frames === undefined ? "" : `, ${f(frames, 1)} WAL frames a commit`);
        console.log(`  ${line}`);
        if (mode !== "no sync (yardstick)") lines.push(line);
      }
    }
  } finally {
    cleanup();
  }
  return `commits:\n  ${lines.join("\n  ")}`;
}

// framesPerCommit reads the WAL frames of 20 commits written after a checkpoint emptied it: each frame's
// header says whether it ends a commit. Frames of an older generation (other salts) are left out, should
// the checkpoint thread's pass restart the WAL meanwhile.
async function framesPerCommit(inbox: SqliteInbox, batch: () => Promise<unknown>): Promise<number> {
  inbox.db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  for (let i = 0; i < 20; i++) await batch();
  const wal = readFileSync(`${inbox.path}-wal`);
  const pageSize = wal.readUInt32BE(8);
  let frames = 0;
  let ends = 0;
  for (let at = 32; at + 24 + pageSize <= wal.length; at += 24 + pageSize) {
    if (wal.readUInt32BE(at + 8) !== wal.readUInt32BE(16) || wal.readUInt32BE(at + 12) !== wal.readUInt32BE(20)) break;
    frames++;
    if (wal.readUInt32BE(at + 4) !== 0) ends++;
  }
  return frames / Math.max(1, ends);
}
