// bench/ingest.ts: durable ingest against the bare node:http baseline, same Node, same load, same run.
// Closed loop at BENCH_CONNECTIONS (32): unique IDs, then 30% duplicates, then unique with commits on
// a writer thread (--writer-thread), then unique with a log line per request to a pipe (the default; the
// other runs use --quiet). Prints req/s, p50/p99, receiver/bare, and the receiver's peak RSS.
//   npm run bench -- ingest          BENCH_SECONDS=8 BENCH_ROUNDS=1 BENCH_CONNECTIONS=32

import { pathToFileURL } from "node:url";
import { join } from "node:path";
import { CONNECTIONS, SECONDS, WARMUP_SECONDS, f, hammer, knob, row, startChild, tempDir, type Load } from "./common.ts";

const ROUNDS = knob("BENCH_ROUNDS", 1);

/** ingest runs the comparison and returns its one-line summary. */
export async function ingest(): Promise<string> {
  const { dir, cleanup } = tempDir();
  console.log(`ingest: ${CONNECTIONS} connections, ${SECONDS} s per run, ${ROUNDS} round(s)`);
  const bare: Load[] = [];
  const unique: Load[] = [];
  const dupes: Load[] = [];
  const logged: Load[] = [];
  const threaded: Load[] = [];
  let peakRss = 0;
  try {
    for (let round = 1; round <= ROUNDS; round++) {
      // Baseline and receiver alternate, so a noisy neighbour hurts both rather than one.
      const b = await startChild("bench/bare.ts", []);
      await hammer(b.url, { seconds: WARMUP_SECONDS });
      bare.push(await hammer(b.url, { seconds: SECONDS }));
      row("bare node:http", bare.at(-1)!, `RSS ${f(b.peakRssMb())} MB`);
      await b.stop();

      const r = await startChild("receiver.ts", ["--port", "0", "--db", join(dir, `quiet${round}.db`), "--quiet"]);
      await hammer(r.url, { seconds: WARMUP_SECONDS });
      unique.push(await hammer(r.url, { seconds: SECONDS }));
      row("receiver --quiet, unique IDs", unique.at(-1)!, `×${f(unique.at(-1)!.rps / bare.at(-1)!.rps, 2)}`);
      dupes.push(await hammer(r.url, { seconds: SECONDS, duplicates: 0.3 }));
      row("receiver --quiet, 30% duplicates", dupes.at(-1)!, `×${f(dupes.at(-1)!.rps / bare.at(-1)!.rps, 2)}  RSS ${f(r.peakRssMb())} MB`);
      peakRss = Math.max(peakRss, r.peakRssMb());
      await r.stop();

      const w = await startChild("receiver.ts", ["--port", "0", "--db", join(dir, `thread${round}.db`), "--quiet", "--writer-thread"]);
      await hammer(w.url, { seconds: WARMUP_SECONDS });
      threaded.push(await hammer(w.url, { seconds: SECONDS }));
      row("receiver --quiet --writer-thread", threaded.at(-1)!, `×${f(threaded.at(-1)!.rps / bare.at(-1)!.rps, 2)}  RSS ${f(w.peakRssMb())} MB`);
      peakRss = Math.max(peakRss, w.peakRssMb());
      await w.stop();

      const l = await startChild("receiver.ts", ["--port", "0", "--db", join(dir, `logged${round}.db`)]);
      await hammer(l.url, { seconds: WARMUP_SECONDS });
      logged.push(await hammer(l.url, { seconds: SECONDS }));
      row("receiver logging to a pipe", logged.at(-1)!, `×${f(logged.at(-1)!.rps / bare.at(-1)!.rps, 2)}`);
      peakRss = Math.max(peakRss, l.peakRssMb());
      await l.stop();
    }
  } finally {
    cleanup();
  }
  const rps = (loads: Load[]) => loads.reduce((s, l) => s + l.rps, 0) / loads.length;
  const worst = (loads: Load[], key: "p50" | "p99") => Math.max(...loads.map((l) => l[key]));
  const base = rps(bare);
  return `ingest: bare ${f(base)} req/s (p50 ${f(worst(bare, "p50"), 1)} p99 ${f(worst(bare, "p99"), 1)} ms)` +
    ` | receiver unique ${f(rps(unique))} req/s ×${f(rps(unique) / base, 2)} (p50 ${f(worst(unique, "p50"), 1)} p99 ${f(worst(unique, "p99"), 1)} ms)` +
    ` | 30% dup ${f(rps(dupes))} ×${f(rps(dupes) / base, 2)}` +
    ` | writer thread ${f(rps(threaded))} ×${f(rps(threaded) / base, 2)}` +
    ` | logging ${f(rps(logged))} ×${f(rps(logged) / base, 2)}` +
    ` | receiver peak RSS ${f(peakRss)} MB`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await ingest());
