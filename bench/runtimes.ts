// bench/runtimes.ts: the same scripts on Node, Deno and Bun, each against its own bare node:http server
// (bench/bare.ts on that runtime) in the same run. Ingest: receiver.ts --quiet on a fresh SQLite file, closed
// loop with wrk at BENCH_CONNECTIONS; every server is measured once per round, one after the other, so a
// shared machine's noise lands on all alike, and each ratio is taken within its round (medians reported).
// Drain: bench/drain.ts on each runtime over the same filled backlog, runtimes alternating per round.
// A runtime that is absent (deno and bun are dev dependencies) is left out, said in one line.
//   npm run bench -- runtimes        BENCH_SECONDS=2 BENCH_ROUNDS=1 BENCH_RUNTIME_BACKLOG=10000

import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { scriptCommand, type RuntimeName } from "../lib/runtime.ts";
import {
  CONNECTIONS,
  ROOT,
  WARMUP_SECONDS,
  f,
  fillBacklog,
  hammer,
  knob,
  row,
  startChild,
  tempDir,
  type Child,
  type Load,
} from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 4);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const BACKLOG = knob("BENCH_RUNTIME_BACKLOG", 50_000);
// As in bench/worker.ts: the handler is synchronous, so the batch per commit is the concurrency.
const CONCURRENCY = knob("BENCH_CONCURRENCY", 128);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Runtime is one runtime under test: its binary and version. */
interface Runtime {
  name: RuntimeName;
  binary: string;
  version: string;
}

// present finds the runtimes there are: this Node, and deno and bun in node_modules/.bin or on PATH.
function present(): Runtime[] {
  const found: Runtime[] = [{ name: "node", binary: process.execPath, version: process.versions.node }];
  for (const name of ["deno", "bun"] as const) {
    const local = join(ROOT, "node_modules", ".bin", name);
    const binary = existsSync(local) ? local : spawnSync("which", [name], { encoding: "utf8" }).stdout?.trim();
    if (!binary) {
      console.log(`  ${name}: not found in node_modules/.bin or on PATH, left out (npm install brings it)`);
      continue;
    }
    const version =
      /\d+\.\d+\.\d+/.exec(spawnSync(binary, ["--version"], { encoding: "utf8" }).stdout ?? "")?.[0] ?? "?";
    found.push({ name, binary, version });
  }
  return found;
}

/** Ingest is one runtime's pair of servers and what each round measured. */
interface Ingest {
  runtime: Runtime;
  bare?: Child;
  receiver?: Child;
  bareLoads: Load[];
  receiverLoads: Load[];
  receiverCpu: number[];
}

// drain runs bench/drain.ts on a runtime over a filled backlog and returns deliveries per second.
async function drain(runtime: Runtime, path: string): Promise<{ rate: number; cpuUs: number; rss: number }> {
  const { command, args } = scriptCommand(join(ROOT, "bench/drain.ts"), [path, String(CONCURRENCY)], runtime);
  const child = spawn(command, args, { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d));
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  if (code !== 0) throw new Error(`bench/drain.ts on ${runtime.name} exited with ${code}`);
  const d = JSON.parse(out.trim().split("\n").at(-1)!) as {
    done: number;
    failed: number;
    ms: number;
    cpuMs: number;
    peakRssMb: number;
  };
  if (d.done !== BACKLOG)
    throw new Error(`${runtime.name}: expected ${BACKLOG} done, got ${d.done} (failed ${d.failed})`);
  return { rate: (d.done / d.ms) * 1000, cpuUs: (d.cpuMs * 1000) / d.done, rss: d.peakRssMb };
}

/** runtimes runs the comparison and returns its summary. */
export async function runtimes(): Promise<string> {
  const { dir, cleanup } = tempDir();
  console.log(
    `runtimes: ingest at ${CONNECTIONS} connections, ${ROUNDS} round(s) of ${SECONDS} s per server; drain of ${BACKLOG} at concurrency ${CONCURRENCY}`,
  );
  const all = present();
  const ingests: Ingest[] = all.map((runtime) => ({ runtime, bareLoads: [], receiverLoads: [], receiverCpu: [] }));
  const drains = new Map<RuntimeName, { rate: number; cpuUs: number; rss: number }[]>(all.map((r) => [r.name, []]));
  try {
    for (const i of ingests) {
      i.bare = await startChild("bench/bare.ts", ["--port", "0"], false, i.runtime);
      i.receiver = await startChild(
        "receiver.ts",
        ["--port", "0", "--quiet", "--db", join(dir, `${i.runtime.name}.db`)],
        false,
        i.runtime,
      );
    }
    for (const i of ingests) for (const c of [i.bare!, i.receiver!]) await hammer(c.url, { seconds: WARMUP_SECONDS });
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(`  round ${round}`);
      for (const i of ingests) {
        const bare = await hammer(i.bare!.url, { seconds: SECONDS });
        i.bareLoads.push(bare);
        row(`  ${i.runtime.name} bare node:http`, bare);
        const c0 = i.receiver!.cpuMs();
        const load = await hammer(i.receiver!.url, { seconds: SECONDS });
        i.receiverCpu.push(((i.receiver!.cpuMs() - c0) * 1000) / Math.max(1, load.ok + load.non2xx));
        i.receiverLoads.push(load);
        row(
          `  ${i.runtime.name} receiver --quiet`,
          load,
          `×${f(load.rps / bare.rps, 2)} of its bare  CPU ${f(i.receiverCpu.at(-1)!)} µs/req`,
        );
      }
      // Each runtime drains a backlog of its own, filled the same way, one after the other.
      for (const runtime of all) {
        const path = join(dir, `drain-${runtime.name}-${round}.db`);
        fillBacklog(path, BACKLOG);
        const d = await drain(runtime, path);
        drains.get(runtime.name)!.push(d);
        console.log(
          `    ${runtime.name} drain: ${f(d.rate)} deliveries/s, CPU ${f(d.cpuUs, 1)} µs/delivery, peak RSS ${f(d.rss)} MB`,
        );
      }
    }
  } finally {
    for (const i of ingests) {
      await i.bare?.stop();
      await i.receiver?.stop();
    }
    cleanup();
  }
  const node = ingests[0]!;
  const rps = (loads: Load[]) => median(loads.map((l) => l.rps));
  // Ratios within a round, then the median: the rounds' noise is shared by the numbers divided.
  const within = (a: Load[], b: Load[]) => median(a.map((l, k) => l.rps / b[k]!.rps));
  const lines = ingests.map((i) => {
    const vsNode = i === node ? "" : `, ×${f(within(i.receiverLoads, node.receiverLoads), 2)} of node's receiver`;
    const d = drains.get(i.runtime.name)!;
    const nodeDrain = drains.get("node")!;
    const drainRatio = i === node ? "" : ` ×${f(median(d.map((x, k) => x.rate / nodeDrain[k]!.rate)), 2)} of node's`;
    return (
      `${`${i.runtime.name} ${i.runtime.version}`.padEnd(13)} ingest: bare ${f(rps(i.bareLoads))} req/s, receiver ${f(rps(i.receiverLoads))} req/s ` +
      `×${f(within(i.receiverLoads, i.bareLoads), 2)} of its bare${vsNode} (p99 ${f(median(i.receiverLoads.map((l) => l.p99)), 1)} ms, ` +
      `${f(median(i.receiverCpu))} µs CPU/req, peak RSS ${f(i.receiver?.peakRssMb() ?? NaN)} MB); ` +
      `drain: ${f(median(d.map((x) => x.rate)))} deliveries/s${drainRatio} (${f(median(d.map((x) => x.cpuUs)), 1)} µs CPU/delivery, peak RSS ${f(median(d.map((x) => x.rss)))} MB)`
    );
  });
  return `runtimes (median of ${ROUNDS}; ingest at ${CONNECTIONS} connections, drain of ${BACKLOG} at concurrency ${CONCURRENCY}):\n  ${lines.join("\n  ")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await runtimes());
