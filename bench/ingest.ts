// bench/ingest.ts: durable ingest against the bare node:http baseline, same Node, same load, same run.
// Closed loop at BENCH_CONNECTIONS (32): the receiver with unique IDs, with 30% duplicates, and with a
// log line per request to a pipe (the default; the others use --quiet), and with SQLite's checkpoints
// inside commits (--inline-checkpoints) instead of on their own thread. All five servers run side by
// side, and each round measures them one after the other, so that the noise of a shared machine lands
// on the baseline and the receiver alike; ratios are taken within a round, and the median round is
// reported. Also the CPU each server spends per request.
//   npm run bench -- ingest          BENCH_SECONDS=4 BENCH_ROUNDS=3 BENCH_CONNECTIONS=32

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { CONNECTIONS, WARMUP_SECONDS, f, hammer, knob, row, startChild, tempDir, type Child, type Load } from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 4);
const ROUNDS = knob("BENCH_ROUNDS", 3);

interface Variant {
  name: string;
  script: string;
  args: string[];
  duplicates?: number;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** ingest runs the comparison and returns its one-line summary. */
export async function ingest(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const variants: Variant[] = [
    { name: "bare node:http", script: "bench/bare.ts", args: [] },
    { name: "receiver --quiet, unique IDs", script: "receiver.ts", args: ["--db", join(dir, "quiet.db"), "--quiet"] },
    { name: "receiver --quiet, 30% duplicates", script: "receiver.ts", args: ["--db", join(dir, "dup.db"), "--quiet"], duplicates: 0.3 },
    { name: "receiver logging to a pipe", script: "receiver.ts", args: ["--db", join(dir, "logged.db")] },
    { name: "receiver --inline-checkpoints", script: "receiver.ts", args: ["--db", join(dir, "inline.db"), "--quiet", "--inline-checkpoints"] },
  ];
  console.log(`ingest: ${CONNECTIONS} connections, ${ROUNDS} round(s) of ${SECONDS} s per server`);
  const children: Child[] = [];
  const loads = variants.map(() => [] as Load[]);
  const cpu = variants.map(() => [] as number[]);
  try {
    for (const v of variants) {
      const child = await startChild(v.script, ["--port", "0", ...v.args]);
      children.push(child);
      await hammer(child.url, { seconds: WARMUP_SECONDS, duplicates: v.duplicates });
    }
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(`  round ${round}`);
      for (const [i, v] of variants.entries()) {
        const c0 = children[i]!.cpuMs();
        const load = await hammer(children[i]!.url, { seconds: SECONDS, duplicates: v.duplicates });
        cpu[i]!.push(((children[i]!.cpuMs() - c0) * 1000) / (load.ok + load.non2xx));
        loads[i]!.push(load);
        const ratio = i === 0 ? "" : `×${f(load.rps / loads[0]![round - 1]!.rps, 2)}  `;
        row(`  ${v.name}`, load, `${ratio}CPU ${f(cpu[i]!.at(-1)!)} µs/req`);
      }
    }
    const rss = children.map((c) => c.peakRssMb());
    const ratio = (i: number) => median(loads[i]!.map((l, round) => l.rps / loads[0]![round]!.rps));
    const rps = (i: number) => median(loads[i]!.map((l) => l.rps));
    const p = (i: number, key: "p50" | "p99") => median(loads[i]!.map((l) => l[key]));
    const us = (i: number) => median(cpu[i]!);
    console.log(`  peak RSS: ${variants.map((v, i) => `${v.name} ${f(rss[i]!)} MB`).join(", ")}`);
    return `ingest (median of ${ROUNDS}): bare ${f(rps(0))} req/s (p50 ${f(p(0, "p50"), 1)} p99 ${f(p(0, "p99"), 1)} ms, ${f(us(0))} µs CPU/req)` +
      ` | receiver unique ${f(rps(1))} req/s ×${f(ratio(1), 2)} (p50 ${f(p(1, "p50"), 1)} p99 ${f(p(1, "p99"), 1)} ms, ${f(us(1))} µs CPU/req)` +
      ` | 30% dup ×${f(ratio(2), 2)} | logging ×${f(ratio(3), 2)} | inline checkpoints ×${f(ratio(4), 2)} (${f(us(4))} µs CPU/req)` +
      ` | receiver peak RSS ${f(Math.max(...rss.slice(1)))} MB`;
  } finally {
    for (const child of children) await child.stop();
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await ingest());
