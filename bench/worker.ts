// bench/worker.ts: how fast one worker drains a backlog, whether that holds as the backlog grows, and
// how it compares with the peers. First the worker's loop in a process of its own (bench/drain.ts) on
// backlogs of BENCH_SMALL (20k) and BENCH_LARGE (200k) at BENCH_CONCURRENCY (128): deliveries/s,
// large/small, peak RSS. Then the real CLI, `worker.ts --once`, at its defaults and at --concurrency 128,
// on every inbox target (bench/targets.ts), beside each peer (bench/peers) draining the same BENCH_LARGE
// backlog with the same record-payment handler; BENCH_DRAIN_ROUNDS rounds, systems alternating, medians.
// BENCH_COMPARE=/path/to/another/checkout runs only the loop's drain of BENCH_SMALL, this tree's bench/drain.ts
// and that checkout's taking turns, each on the same backlog filled by its own bench/common.ts (its schema and
// where it keeps bodies), for BENCH_ROUNDS (3) rounds, the first of each round alternating, and prints each
// one's CPU per delivery (the worker process's, steadier than its rate on a shared machine), its rate, and the
// ratios within each round: an A/B in one run.
//   npm run bench -- worker          BENCH_SMALL=20000 BENCH_LARGE=200000 BENCH_DRAIN_ROUNDS=1 BENCH_PEERS=0
//   BENCH_COMPARE=/tmp/before BENCH_ROUNDS=5 npm run bench -- worker

import { spawn, spawnSync } from "node:child_process";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { ROOT, f, fillBacklog, knob, tempDir } from "./common.ts";
import { drainPeer, label as peerLabel, peers as availablePeers, type Peer } from "./peers/index.ts";
import { inboxTargets, type InboxTarget } from "./targets.ts";

const SMALL = knob("BENCH_SMALL", 20_000);
const LARGE = knob("BENCH_LARGE", 200_000);
// 128, not the worker's default of 8: the handler here is synchronous, so the batch per commit is the
// concurrency, and one fsync per 8 deliveries caps the rate well below the target.
const CONCURRENCY = knob("BENCH_CONCURRENCY", 128);
const ROUNDS = knob("BENCH_DRAIN_ROUNDS", 1);
const COMPARE = process.env.BENCH_COMPARE;
const COMPARE_ROUNDS = knob("BENCH_ROUNDS", 3);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Drain is what bench/drain.ts reports. */
export interface Drain {
  done: number;
  failed: number;
  ms: number;
  /** The worker process's CPU, its threads included, in ms. */
  cpuMs: number;
  peakRssMb: number;
  quartersMb: number[];
}

/** drainChild runs bench/drain.ts (of this checkout, or of root's) on a database and returns its report. */
export async function drainChild(path: string, concurrency: number, root = ROOT): Promise<Drain> {
  const child = spawn(process.execPath, ["--import", "tsx", join(root, "bench/drain.ts"), path, String(concurrency)], {
    cwd: root,
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  if (code !== 0) throw new Error(`bench/drain.ts exited with ${code}`);
  return JSON.parse(out.trim().split("\n").at(-1)!) as Drain;
}

/** loop runs both drains of the worker's loop and returns their summary line. */
async function loop(): Promise<string> {
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
      console.log(
        `  backlog ${String(n).padStart(7)}: filled in ${f(fill / 1000, 1)} s, drained in ${f(d.ms / 1000, 2)} s = ${f(rate)} deliveries/s,` +
          ` worker peak RSS ${f(d.peakRssMb)} MB (by quarter of the run: ${d.quartersMb.map((q) => f(q)).join(", ")} MB)`,
      );
    }
  } finally {
    cleanup();
  }
  const [small, large] = results as [(typeof results)[0], (typeof results)[0]];
  return (
    `worker: ${f(small.rate)} deliveries/s at ${small.n} | ${f(large.rate)} deliveries/s at ${large.n}` +
    ` | large/small ×${f(large.rate / small.rate, 2)} | peak RSS ${f(small.rss)} MB → ${f(large.rss)} MB` +
    ` (${large.n} run by quarter: ${large.quarters.map((q) => f(q)).join(" → ")} MB)`
  );
}

/** cli runs `worker.ts --once --quiet --db db` plus args to its end and returns its wall time in ms. */
async function cli(db: string, args: string[], expected: number): Promise<number> {
  const t0 = performance.now();
  // --skip-check: the start-up quick_check reads the whole file, a start-up cost that the empty inbox the
  // start-up is measured on (versus()) would not show, so it would count as drain time.
  const child = spawn(
    process.execPath,
    ["--import", "tsx", join(ROOT, "worker.ts"), "--once", "--quiet", "--skip-check", "--db", db, ...args],
    {
      cwd: ROOT,
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  let err = "";
  child.stderr.on("data", (d: Buffer) => (err += d));
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  const ms = performance.now() - t0;
  const done = Number(/worker: (\d+) done/.exec(err)?.[1]);
  if (code !== 0 || done !== expected)
    throw new Error(`worker.ts ${args.join(" ")}: exit ${code}, expected ${expected} done: ${err.slice(-500)}`);
  return ms;
}

/** fill puts n due deliveries into a fresh inbox: straight into the file for SQLite, through store() elsewhere. */
async function fill(target: InboxTarget, db: string, n: number): Promise<void> {
  if (target.name === "SQLite") return fillBacklog(db, n);
  const child = spawn(process.execPath, ["--import", "tsx", join(ROOT, "bench/fill.ts"), db, String(n)], {
    cwd: ROOT,
    stdio: ["ignore", "inherit", "inherit"],
  });
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  if (code !== 0) throw new Error(`bench/fill.ts exited with ${code}`);
}

/** System is one drain row: the inbox's CLI on a target with some flags, or a peer. */
interface System {
  name: string;
  drain: (dir: string, label: string) => Promise<number>;
  peer?: Peer;
  rates: number[];
}

/** versus drains BENCH_LARGE with the inbox's CLI and with every peer, and returns the summary line. */
async function versus(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const systems: System[] = [];
  const startup = new Map<InboxTarget, number>();
  for (const target of await inboxTargets()) {
    for (const [flags, args] of [
      ["defaults", []],
      [`--concurrency ${CONCURRENCY}`, ["--concurrency", String(CONCURRENCY)]],
    ] as const) {
      systems.push({
        name: `worker.ts --once ${flags} [${target.name}]`,
        rates: [],
        drain: async (dir, label) => {
          // What the CLI takes to start and stop, measured on an empty inbox, is not drain time.
          if (!startup.has(target)) {
            const empty = await target.fresh(dir, "drain_empty");
            try {
              startup.set(target, await cli(empty.db, [], 0));
            } finally {
              await empty.drop();
            }
          }
          const fresh = await target.fresh(dir, label);
          try {
            await fill(target, fresh.db, LARGE);
            return (LARGE / ((await cli(fresh.db, [...args], LARGE)) - startup.get(target)!)) * 1000;
          } finally {
            await fresh.drop();
          }
        },
      });
    }
  }
  for (const peer of await availablePeers()) {
    const n = peer.backlog ?? LARGE;
    systems.push({
      name: `${peerLabel(peer)}${n !== LARGE ? ` at ${n}` : ""}`,
      peer,
      rates: [],
      drain: async (dir, label) => {
        const d = await drainPeer(peer, dir, n, label);
        return (d.done / d.ms) * 1000;
      },
    });
  }
  console.log(`drain: backlog of ${LARGE}, record-payment handler, ${ROUNDS} round(s), systems alternating`);
  try {
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [i, s] of systems.entries()) {
        s.rates.push(await s.drain(dir, `drain${round}_${i}`));
        console.log(
          `  round ${round} ${s.name.padEnd(62)} ${f(s.rates.at(-1)!).padStart(7)} deliveries/s${s.peer ? `  (${s.peer.settings})` : ""}`,
        );
      }
    }
  } finally {
    cleanup();
  }
  const rate = (s: System) => median(s.rates);
  const inbox = systems.filter((s) => !s.peer);
  const durable = systems.filter((s) => s.peer?.durable);
  const best = durable.length > 0 ? durable.reduce((a, b) => (rate(a) >= rate(b) ? a : b)) : undefined;
  const parts = [
    ...inbox.map((s) => `${s.name} ${f(rate(s))}/s`),
    ...systems
      .filter((s) => s.peer)
      .map(
        (s) => `${s.name} ${f(rate(s))}/s (${s.peer!.settings}), inbox defaults ×${f(rate(inbox[0]!) / rate(s), 2)}`,
      ),
  ];
  if (best)
    parts.push(
      `inbox against the best durable peer (${best.name}): defaults ×${f(rate(inbox[0]!) / rate(best), 2)}, --concurrency ${CONCURRENCY} ×${f(rate(inbox[1]!) / rate(best), 2)}`,
    );
  return `drain of ${LARGE} (median of ${ROUNDS}; CLI start-up ${[...startup.values()].map((ms) => f(ms)).join("/")} ms subtracted):\n  ${parts.join("\n  ")}`;
}

// fillIn fills a backlog with a tree's own bench/common.ts, in a child of its own: the other tree's schema may be
// older than this one's (its inbox would not open a file this tree made) and its layout is part of what is compared.
function fillIn(root: string, path: string, n: number): void {
  if (root === ROOT) {
    fillBacklog(path, n);
    return;
  }
  const script = `const { fillBacklog } = await import(${JSON.stringify(pathToFileURL(join(root, "bench/common.ts")).href)});
                  fillBacklog(${JSON.stringify(path)}, ${n});`;
  const child = spawnSync(process.execPath, ["--input-type=module", "-e", script], { cwd: root, encoding: "utf8" });
  if (child.status !== 0) throw new Error(`fill with ${root}: ${child.stderr}`);
}

/** compared drains BENCH_SMALL with this tree's loop and BENCH_COMPARE's, round by round, and returns the summary. */
async function compared(other: string): Promise<string> {
  const { dir, cleanup } = tempDir();
  const name = spawnSync("git", ["-C", other, "log", "-1", "--format=%h"], { encoding: "utf8" }).stdout.trim() || other;
  const trees = [
    { name: "this tree", root: ROOT, cpuUs: [] as number[], rates: [] as number[] },
    { name, root: resolve(other), cpuUs: [] as number[], rates: [] as number[] },
  ];
  const ratios: { cpu: number; rate: number }[] = [];
  console.log(
    `worker: backlog of ${SMALL}, concurrency ${CONCURRENCY}, this tree against ${name} (${resolve(other)}), ${COMPARE_ROUNDS} round(s)`,
  );
  try {
    for (let round = 1; round <= COMPARE_ROUNDS; round++) {
      const order = round % 2 === 1 ? trees : [...trees].reverse();
      for (const tree of order) {
        const path = join(dir, `r${round}-${tree === trees[0] ? "this" : "other"}.db`);
        fillIn(tree.root, path, SMALL);
        const d = await drainChild(path, CONCURRENCY, tree.root);
        if (d.done !== SMALL)
          throw new Error(`${tree.name}: expected ${SMALL} done, got ${d.done} (failed ${d.failed})`);
        tree.cpuUs.push((d.cpuMs * 1000) / d.done);
        tree.rates.push((d.done / d.ms) * 1000);
      }
      const [a, b] = trees as [(typeof trees)[0], (typeof trees)[0]];
      ratios.push({ cpu: a.cpuUs.at(-1)! / b.cpuUs.at(-1)!, rate: a.rates.at(-1)! / b.rates.at(-1)! });
      console.log(
        `  round ${round}: ${trees.map((t) => `${t.name} ${f(t.cpuUs.at(-1)!, 1)} µs CPU/delivery, ${f(t.rates.at(-1)!)}/s`).join(" | ")}` +
          ` | CPU ×${f(ratios.at(-1)!.cpu, 3)}, rate ×${f(ratios.at(-1)!.rate, 3)}`,
      );
    }
  } finally {
    cleanup();
  }
  const cpu = ratios.map((r) => r.cpu);
  const rate = ratios.map((r) => r.rate);
  return (
    `worker vs ${name}: CPU per delivery ×${f(median(cpu), 3)} (rounds ${f(Math.min(...cpu), 3)}–${f(Math.max(...cpu), 3)}),` +
    ` rate ×${f(median(rate), 3)} (${f(Math.min(...rate), 3)}–${f(Math.max(...rate), 3)}), median of ${COMPARE_ROUNDS}`
  );
}

/** worker runs the loop's drains, then the CLI against the peers, and returns both summaries; with BENCH_COMPARE, the A/B alone. */
export async function worker(): Promise<string> {
  if (COMPARE) return compared(COMPARE);
  const first = await loop();
  return `${first}\n${await versus()}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await worker());
