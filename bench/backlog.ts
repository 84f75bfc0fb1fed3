// bench/backlog.ts: does the drain on PostgreSQL hold as the backlog grows? For each backlog of
// BENCH_BACKLOGS (50k, 100k and 200k; BENCH_MILLION=1 adds 1,000,000, about two minutes a round), the real
// `worker.ts --once` at its defaults drains a fresh inbox on PostgreSQL, and pg-boss (bench/peers) the same
// backlog with the same record-payment handler, alternating, BENCH_DRAIN_ROUNDS rounds, medians. Each claim
// and finish statement of the worker is timed (bench/claim-timer.ts): p50 and p99 in the first and the last
// tenth of the drain say whether a claim grows with what has been drained.
// BENCH_COMPARE=/path/to/another/checkout adds that checkout's worker as one more row, filled and run by its
// own bench/fill.ts and worker.ts (an A/B of two commits in the same run; `git worktree add` makes one).
//   BENCH_MILLION=1 npm run bench -- backlog
//   BENCH_BACKLOGS=50000,200000 BENCH_DRAIN_ROUNDS=3 BENCH_COMPARE=/tmp/main npm run bench -- backlog

import { spawn, spawnSync } from "node:child_process";
import { existsSync, readFileSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import pg from "pg";
import { ROOT, cpuMs, f, knob, tempDir } from "./common.ts";
import { PG_URL } from "./peers/pgdb.ts";
import { label as peerLabel, peers, type Peer } from "./peers/index.ts";
import type { Drained } from "./peers/shared.ts";
import { inboxTargets } from "./targets.ts";

const BACKLOGS = (process.env.BENCH_BACKLOGS ?? "50000,100000,200000").split(",").map((s) => {
  if (!/^\d+$/.test(s.trim()) || Number(s) < 1)
    throw new TypeError(`BENCH_BACKLOGS: expected backlog sizes like 50000,200000, got ${process.env.BENCH_BACKLOGS}`);
  return Number(s);
});
if (process.env.BENCH_MILLION === "1" && !BACKLOGS.includes(1_000_000)) BACKLOGS.push(1_000_000);
const ROUNDS = knob("BENCH_DRAIN_ROUNDS", 1);
const COMPARE = process.env.BENCH_COMPARE;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const pct = (xs: number[], p: number) =>
  [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * p))] ?? NaN;

/** Timed is one claim or finish statement: kind, ms since the worker started, its round trip in ms, rows. */
type Timed = [kind: "claim" | "finish", at: number, ms: number, rows: number];

/** Drain is one drain of one backlog: its rate, and its claims' and finishes' times early and late. */
interface Drain {
  rate: number;
  calls: Timed[];
  /** CPU per delivery, in µs, of the worker and of the PostgreSQL backends serving it. */
  workerUs: number;
  postgresUs: number;
  /** WAL written per delivery, in bytes: the server's, so others' writes during the drain count too. */
  walBytes: number;
}

/** Checkout is a tree whose worker is measured: this one, or BENCH_COMPARE's. */
interface Checkout {
  name: string;
  root: string;
}

function checkout(root: string): Checkout {
  const head = spawnSync("git", ["-C", root, "log", "-1", "--format=%h"], { encoding: "utf8" }).stdout.trim();
  const dirty = spawnSync("git", ["-C", root, "status", "--porcelain", "--untracked-files=no"], {
    encoding: "utf8",
  }).stdout.trim();
  // A worktree made for the comparison shares this checkout's packages.
  if (!existsSync(join(root, "node_modules"))) symlinkSync(join(ROOT, "node_modules"), join(root, "node_modules"));
  return { name: `${head || root}${dirty ? "+changes" : ""}`, root };
}

/**
 * run runs a script of a checkout under this Node and resolves with its stdout and stderr, or fails with
 * its stderr. With `database`, it also samples, every 100 ms from /proc, the CPU time of the script and of
 * the PostgreSQL backends serving that database (so up to 100 ms of each is missed at the end): a figure
 * the machine's other load moves far less than a rate.
 */
async function run(
  root: string,
  args: string[],
  env: Record<string, string> = {},
  database?: string,
): Promise<{ out: string; err: string; cpu: Cpu[] }> {
  const child = spawn(process.execPath, ["--import", "tsx", ...args], {
    cwd: root,
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, ...env },
  });
  let [out, err] = ["", ""];
  child.stdout.on("data", (d: Buffer) => (out += d));
  child.stderr.on("data", (d: Buffer) => (err += d));
  const started = performance.now();
  const seen = new Map<number, number>();
  let own = 0;
  const cpu: Cpu[] = [];
  let sampling: Promise<void> = Promise.resolve();
  const sample = async () => {
    try {
      own = cpuMs(child.pid!);
    } catch {
      // The script has exited; its last sample stands.
    }
    if (database === undefined) return;
    const { rows } = await PG.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE datname = $1", [database]);
    for (const { pid } of rows) {
      try {
        seen.set(pid, cpuMs(pid));
      } catch {
        // A backend that ended between the query and the read keeps its last sample.
      }
    }
    cpu.push({
      at: performance.now() - started,
      scriptMs: own,
      postgresMs: [...seen.values()].reduce((a, b) => a + b, 0),
    });
  };
  const timer = setInterval(() => void (sampling = sampling.then(sample, sample)), 100);
  const code = await new Promise<number | null>((resolve) => child.on("exit", resolve));
  clearInterval(timer);
  await sampling.catch(() => {});
  if (code !== 0) throw new Error(`${args.join(" ")} (in ${root}): exit ${code}: ${err.slice(-800)}`);
  return { out, err, cpu };
}

/** Cpu is one sample of the CPU time a run has taken so far: the script's, and its PostgreSQL backends'. */
interface Cpu {
  at: number;
  scriptMs: number;
  postgresMs: number;
}

/** cpuPer is the CPU per delivery, in µs, from the sample nearest `from` ms to the last. */
function cpuPer(cpu: Cpu[], n: number, from = 0): { scriptUs: number; postgresUs: number } {
  const last = cpu.at(-1) ?? { at: 0, scriptMs: NaN, postgresMs: NaN };
  const first =
    from === 0
      ? { at: 0, scriptMs: 0, postgresMs: 0 }
      : cpu.reduce((a, b) => (Math.abs(b.at - from) < Math.abs(a.at - from) ? b : a), last);
  return {
    scriptUs: ((last.scriptMs - first.scriptMs) * 1000) / n,
    postgresUs: ((last.postgresMs - first.postgresMs) * 1000) / n,
  };
}

/** walBytes is how far the server's WAL has come since it began, in bytes. */
async function walBytes(): Promise<number> {
  return Number((await PG.query<{ b: string }>("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn AS b")).rows[0]!.b);
}

// One connection for reading pg_stat_activity during the drains.
const PG = new pg.Pool({ connectionString: PG_URL, max: 1 });

/** drainInbox fills a fresh inbox on PostgreSQL with n deliveries and times `worker.ts --once` draining it. */
async function drainInbox(at: Checkout, dir: string, n: number, label: string, start: Startup): Promise<Drain> {
  const [, target] = await inboxTargets();
  const fresh = await target!.fresh(dir, label);
  const log = join(dir, `${label}.jsonl`);
  try {
    await run(at.root, [join(at.root, "bench/fill.ts"), fresh.db, String(n)]);
    const timer = join(at.root, "bench/claim-timer.ts");
    const wal0 = await walBytes();
    const t0 = performance.now();
    const { err, cpu } = await run(
      at.root,
      [
        ...(existsSync(timer) ? ["--import", timer] : []),
        join(at.root, "worker.ts"),
        "--once",
        "--quiet",
        "--db",
        fresh.db,
      ],
      { BENCH_CLAIM_LOG: log },
      new URL(fresh.db).pathname.slice(1),
    );
    const wall = performance.now() - t0;
    const wal = (await walBytes()) - wal0;
    const done = Number(/worker: (\d+) done/.exec(err)?.[1]);
    if (done !== n)
      throw new Error(`worker.ts --once (in ${at.root}): expected ${n} done, got ${done}: ${err.slice(-500)}`);
    const calls = existsSync(log)
      ? readFileSync(log, "utf8")
          .trim()
          .split("\n")
          .filter(Boolean)
          .map((l) => JSON.parse(l) as Timed)
      : [];
    // The drain is from the first claim's start to the last done mark's end, on the worker's own clock, and
    // its CPU from the sample nearest that first claim: the start-up (loading modules, connecting) comes
    // before it. Subtracting a start-up measured once on an empty inbox, as before, moved each round's rate
    // with that one measurement, which the machine's load moved by seconds (2.6 and 8.4 s in two runs).
    const first = calls.find((c) => c[0] === "claim");
    if (first === undefined) {
      const last = cpu.at(-1);
      if (last)
        cpu.push({
          ...last,
          scriptMs: last.scriptMs - start.cpu.scriptMs,
          postgresMs: last.postgresMs - start.cpu.postgresMs,
        });
    }
    const ms = first === undefined ? wall - start.ms : Math.max(...calls.map((c) => c[1] + c[2])) - first[1];
    const per = cpuPer(cpu, n, first?.[1]);
    return { rate: (n / ms) * 1000, calls, workerUs: per.scriptUs, postgresUs: per.postgresUs, walBytes: wal / n };
  } finally {
    await fresh.drop();
  }
}

/** drainBoss fills a fresh database with n pg-boss jobs and drains them with its fixture, with CPU and WAL as drainInbox has them. */
async function drainBoss(peer: Peer, dir: string, n: number, label: string): Promise<Drain & { fillMs: number }> {
  const store = await peer.store(dir, label);
  try {
    const wal0 = await walBytes();
    const { out, cpu } = await run(
      ROOT,
      [join(ROOT, peer.script), "drain", store.target, String(n)],
      {},
      new URL(store.target).pathname.slice(1),
    );
    const wal = (await walBytes()) - wal0;
    const drained = JSON.parse(out.trim().split("\n").at(-1)!) as Drained;
    if (drained.done !== n) throw new Error(`${peer.script}: expected ${n} done, got ${drained.done}`);
    // The fixture fills, then drains in the same process: the drain's CPU is what came in its last ms.
    const per = cpuPer(cpu, n, cpu.at(-1)!.at - drained.ms);
    return {
      rate: (n / drained.ms) * 1000,
      calls: [],
      workerUs: per.scriptUs,
      postgresUs: per.postgresUs,
      walBytes: wal / n,
      fillMs: drained.fillMs,
    };
  } finally {
    await store.drop();
  }
}

/** Startup is what `worker.ts --once` takes on an empty inbox (module loading, connecting): not drain time. */
interface Startup {
  ms: number;
  cpu: Cpu;
}

async function startup(at: Checkout, dir: string): Promise<Startup> {
  const [, target] = await inboxTargets();
  const empty = await target!.fresh(dir, "backlog_empty");
  try {
    const t0 = performance.now();
    const { cpu } = await run(
      at.root,
      [join(at.root, "worker.ts"), "--once", "--quiet", "--db", empty.db],
      {},
      new URL(empty.db).pathname.slice(1),
    );
    return { ms: performance.now() - t0, cpu: cpu.at(-1) ?? { at: 0, scriptMs: 0, postgresMs: 0 } };
  } finally {
    await empty.drop();
  }
}

/** spread says p50 and p99 of a kind of statement in the first and the last tenth of a drain's calls. */
function spread(calls: Timed[], kind: Timed[0]): string {
  const mine = calls.filter((c) => c[0] === kind);
  if (mine.length < 20) return `${kind} n/a`;
  const tenth = Math.floor(mine.length / 10);
  const part = (xs: Timed[]) =>
    `p50 ${f(
      pct(
        xs.map((c) => c[2]),
        0.5,
      ),
      1,
    )} p99 ${f(
      pct(
        xs.map((c) => c[2]),
        0.99,
      ),
      1,
    )}`;
  return `${kind} ${part(mine.slice(0, tenth))} → ${part(mine.slice(-tenth))} ms`;
}

/** backlog drains every backlog size with the inbox on PostgreSQL and with pg-boss, and returns the summary. */
export async function backlog(): Promise<string> {
  const targets = await inboxTargets();
  if (targets.length < 2) return "backlog: skipped, the inbox on PostgreSQL is not available (see above)";
  const boss = (await peers()).find((p) => p.name.startsWith("pg-boss"));
  const checkouts = [checkout(ROOT), ...(COMPARE ? [checkout(COMPARE)] : [])];
  // Two trees at the same commit, one with changes, would share a name: their folders tell them apart.
  if (checkouts.length > 1 && checkouts[0]!.name === checkouts[1]!.name)
    for (const c of checkouts) c.name += ` in ${c.root}`;
  const { dir, cleanup } = tempDir();
  const rows = new Map<string, { rates: number[]; calls: Timed[]; workerUs: number[]; postgresUs: number[] }>();
  const startups = new Map<Checkout, Startup>();
  const add = (name: string, rate: number, d?: Drain) => {
    const r = rows.get(name) ?? { rates: [], calls: [], workerUs: [], postgresUs: [] };
    r.rates.push(rate);
    // The median round's timings would need every round's kept; the last round's say the same.
    if (d) {
      r.calls = d.calls;
      r.workerUs.push(d.workerUs);
      r.postgresUs.push(d.postgresUs);
    }
    rows.set(name, r);
  };
  const inboxName = (c: Checkout, n: number) =>
    `worker.ts --once [PostgreSQL${checkouts.length > 1 ? ` ${c.name}` : ""}] at ${n}`;
  console.log(
    `backlog: ${BACKLOGS.join(", ")} deliveries, record-payment handler, ${ROUNDS} round(s), systems alternating`,
  );
  try {
    for (const c of checkouts) startups.set(c, await startup(c, dir));
    for (const n of BACKLOGS) {
      for (let round = 1; round <= ROUNDS; round++) {
        for (const [i, c] of checkouts.entries()) {
          const d = await drainInbox(c, dir, n, `backlog_${n}_${round}_${i}`, startups.get(c)!);
          add(inboxName(c, n), d.rate, d);
          console.log(
            `  round ${round} ${inboxName(c, n).padEnd(50)} ${f(d.rate).padStart(7)} deliveries/s  CPU µs/delivery: worker ${f(d.workerUs)}, PostgreSQL ${f(d.postgresUs)}; WAL ${f(d.walBytes)} B/delivery;` +
              ` ${spread(d.calls, "claim")}, ${spread(d.calls, "finish")}`,
          );
        }
        if (boss) {
          const d = await drainBoss(boss, dir, n, `backlog_${n}_${round}`);
          add(`${peerLabel(boss)} at ${n}`, d.rate, d);
          console.log(
            `  round ${round} ${`${peerLabel(boss)} at ${n}`.padEnd(50)} ${f(d.rate).padStart(7)} deliveries/s  CPU µs/delivery: worker ${f(d.workerUs)},` +
              ` PostgreSQL ${f(d.postgresUs)}; WAL ${f(d.walBytes)} B/delivery (the fill's WAL too)  (${boss.settings}; filled in ${f(d.fillMs / 1000, 1)} s)`,
          );
        }
      }
    }
  } finally {
    cleanup();
    await PG.end();
  }
  const rate = (name: string) => median(rows.get(name)?.rates ?? [NaN]);
  const lines: string[] = [];
  for (const n of BACKLOGS) {
    const mine = inboxName(checkouts[0]!, n);
    const parts = checkouts.map((c) => {
      const r = rows.get(inboxName(c, n))!;
      return `${inboxName(c, n)} ${f(rate(inboxName(c, n)))}/s (CPU µs/delivery: worker ${f(median(r.workerUs))}, PostgreSQL ${f(median(r.postgresUs))}; ${spread(r.calls, "claim")})`;
    });
    if (checkouts.length > 1) parts.push(`A/B ×${f(rate(mine) / rate(inboxName(checkouts[1]!, n)), 2)}`);
    if (boss) {
      const r = rows.get(`${peerLabel(boss)} at ${n}`)!;
      parts.push(
        `pg-boss ${f(rate(`${peerLabel(boss)} at ${n}`))}/s (CPU µs/delivery: worker ${f(median(r.workerUs))}, PostgreSQL ${f(median(r.postgresUs))}),` +
          ` inbox ×${f(rate(mine) / rate(`${peerLabel(boss)} at ${n}`), 2)}`,
      );
    }
    lines.push(parts.join(" | "));
  }
  // The fixed cost of a run (loading modules, connecting, migrating an empty schema, stopping), which the
  // rates above leave out, and which a short drain pays in full.
  lines.push(
    `start-up of worker.ts --once on an empty inbox: ${checkouts
      .map((c) => {
        const s = startups.get(c)!;
        return `${checkouts.length > 1 ? `${c.name} ` : ""}${f(s.ms)} ms (CPU: worker ${f(s.cpu.scriptMs)} ms, PostgreSQL ${f(s.cpu.postgresMs)} ms)`;
      })
      .join(", ")}`,
  );
  const [least, most] = [Math.min(...BACKLOGS), Math.max(...BACKLOGS)];
  const reference = BACKLOGS.includes(100_000) ? 100_000 : least;
  if (most !== reference) {
    lines.push(
      `inbox at ${most} against itself at ${reference}: ×${f(rate(inboxName(checkouts[0]!, most)) / rate(inboxName(checkouts[0]!, reference)), 2)}`,
    );
  }
  return `backlog (median of ${ROUNDS}; the inbox's drain from its first claim to its last done mark, the CLI's start-up printed apart; claim and finish times in the first → last tenth of the drain):\n  ${lines.join("\n  ")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await backlog());
