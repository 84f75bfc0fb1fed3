// bench/backup.ts: what a backup costs the receiver, and what the start-up quick_check costs. Fills an inbox
// with BENCH_BACKUP_ROWS (a million) deliveries, times quick_check against the file's own open (the
// baseline), then paces POSTs at BENCH_BACKUP_RATE (1000/s) into a receiver on it, open loop, three times in
// one run: with no backup, while `inbox.ts backup` copies the live file in a process of its own, and while
// it does so under `nice -n 10 ionice -c 3` (as the systemd unit's Nice= and IOSchedulingClass=idle). The
// longest wait for a 200 (max) in each, and their ratios, are the figures docs/production.md quotes.
//   npm run bench -- backup          BENCH_BACKUP_ROWS=1000000 BENCH_BACKUP_RATE=1000 BENCH_SECONDS=8

import { spawn } from "node:child_process";
import { statSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { healthProblem } from "../lib/sqlite/backup.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import { ROOT, SECONDS, f, fillBacklog, knob, startChild, tempDir } from "./common.ts";
import { paced, type Paced } from "./latency.ts";

const ROWS = knob("BENCH_BACKUP_ROWS", 1_000_000);
const RATE = knob("BENCH_BACKUP_RATE", 1_000);

// backupChild runs `inbox.ts backup` and resolves with its wall time and its report once it exits.
function backupChild(db: string, file: string, gentle = false): Promise<{ ms: number; out: string }> {
  const started = performance.now();
  const argv = [process.execPath, "--import", "tsx", join(ROOT, "inbox.ts"), "backup", file, "--db", db];
  const [command, ...args] = gentle ? ["nice", "-n", "10", "ionice", "-c", "3", ...argv] : argv;
  const child = spawn(command!, args, { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d));
  child.stderr.on("data", (d: Buffer) => (out += d));
  return new Promise((resolve, reject) =>
    child.on("exit", (code) =>
      code === 0
        ? resolve({ ms: performance.now() - started, out })
        : reject(new Error(`inbox.ts backup exited with ${code}: ${out}`)),
    ),
  );
}

function show(label: string, p: Paced): void {
  console.log(
    `  ${label.padEnd(22)} ${f(p.rate)} req/s open loop: p50 ${f(p.p50, 2)} ms  p99 ${f(p.p99, 2)} ms  max ${f(p.max, 1)} ms  (${p.ok}/${p.sent} answered 200)`,
  );
}

/** backupBench runs the quick_check timing and the two paced runs, and returns the one-line summary. */
export async function backupBench(): Promise<string> {
  const { dir, cleanup } = tempDir();
  try {
    const path = join(dir, "backup.db");
    fillBacklog(path, ROWS);
    const bytes = statSync(path).size;
    // The baseline: opening the file as every script does (PRAGMAs, migrations checked, a rolled-back write).
    let t = performance.now();
    openDatabase(path).close();
    const openMs = performance.now() - t;
    t = performance.now();
    const problem = healthProblem(path);
    const checkMs = performance.now() - t;
    if (problem !== undefined) throw new Error(`quick_check failed on a fresh file: ${problem}`);
    console.log(
      `  ${f(ROWS)} deliveries, ${f(bytes / 2 ** 20)} MB: open ${f(openMs, 1)} ms, quick_check ${f(checkMs)} ms (×${f(checkMs / openMs)} of the open), once at start-up`,
    );

    const receiver = await startChild("receiver.ts", ["--port", "0", "--db", path, "--quiet"]);
    await paced(receiver.url, RATE, Math.min(2, SECONDS)); // warm-up
    const before = await paced(receiver.url, RATE, SECONDS);
    const during = async (gentle: boolean) => {
      const started = performance.now();
      const running = backupChild(path, join(dir, gentle ? "gentle.db" : "copy.db"), gentle);
      const load = await paced(receiver.url, RATE, SECONDS);
      const { ms, out } = await running;
      return { paced: load, ms, out, overlap: Math.min(1, ms / (performance.now() - started)) };
    };
    const plain = await during(false);
    const gentle = await during(true);
    await receiver.stop();
    show("no backup", before);
    show("during the backup", plain.paced);
    show("… at nice 10, idle I/O", gentle.paced);
    for (const [label, r] of [
      ["backup", plain],
      ["backup at nice 10", gentle],
    ] as const) {
      console.log(
        `  ${label}: ${f(r.ms / 1000, 1)} s for ${f(bytes / 2 ** 20)} MB (the check included), covering ${f(r.overlap * 100)}% of the paced run`,
      );
      console.log(`    ${r.out.trim().split("\n").join("\n    ")}`);
    }
    return (
      `backup: ${f(ROWS)} rows, ${f(bytes / 2 ** 20)} MB (${f(bytes / ROWS)} B/delivery), ${f(RATE)} req/s open loop | longest wait for a 200 ${f(plain.paced.max)} ms during a backup, ` +
      `${f(gentle.paced.max)} ms at nice 10, ${f(before.max)} ms without (×${f(plain.paced.max / before.max, 2)}, ×${f(gentle.paced.max / before.max, 2)}) | ` +
      `p99 ${f(plain.paced.p99, 1)}/${f(gentle.paced.p99, 1)}/${f(before.p99, 1)} ms | backup ${f(plain.ms / 1000, 1)} s, ${f(gentle.ms / 1000, 1)} s at nice 10 | ` +
      `quick_check ${f(checkMs)} ms, ×${f(checkMs / openMs)} of the open`
    );
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await backupBench());
