// bench/pgstore.ts: what one stored delivery costs the inbox on PostgreSQL, without HTTP in the way: the real
// PostgresInbox.store() from BENCH_PGSTORE_STREAMS (4) streams of 32 deliveries a turn (the receiver's
// batches at 128 connections), into a fresh database each run, for a small payload (68 bytes; the ingest bench sends 56)
// and one of 4 KB (a Stripe event's size). It prints the rate and the CPU per delivery of this process and
// of the PostgreSQL backends serving it (from /proc): the figure a shared machine moves least.
// BENCH_COMPARE=/path/to/another/checkout runs that checkout's lib/postgres/postgres.ts too, alternating, round by
// round: an A/B of two commits in one run.
//   npm run bench -- pgstore        BENCH_PGSTORE_N=20000 BENCH_ROUNDS=3 BENCH_COMPARE=/tmp/before npm run bench -- pgstore

import { spawnSync } from "node:child_process";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import pg from "pg";
import type { Inbox } from "../lib/store.ts";
import { ROOT, cpuMs, f, knob } from "./common.ts";
import { freshDatabase, pgReachable } from "./peers/pgdb.ts";

const N = knob("BENCH_PGSTORE_N", 20_000);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const STREAMS = knob("BENCH_PGSTORE_STREAMS", 4);
const BATCH = 32;
const COMPARE = process.env.BENCH_COMPARE;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const SMALL = Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: "Maria Lopez", amount: 24.99 }));
const LARGE = Buffer.from(
  JSON.stringify({ type: "payment.succeeded", customer: "Maria Lopez", amount: 24.99, pad: "x".repeat(4000) }),
);

/** Measured is one run of one checkout: rate, and µs of CPU per delivery here and in PostgreSQL. */
interface Measured {
  rate: number;
  clientUs: number;
  postgresUs: number;
}

type Open = (url: string) => Promise<Inbox>;

async function once(open: Open, label: string, body: Buffer): Promise<Measured> {
  const db = await freshDatabase(label);
  const inbox = await open(`${db.url}?schema=inbox`);
  const watch = new pg.Client({ connectionString: db.url });
  await watch.connect();
  const backends = async () => {
    const { rows } = await watch.query<{ pid: number }>(
      "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
      [label],
    );
    return rows.map((r) => r.pid);
  };
  try {
    // Warm every connection and its prepared statement.
    await Promise.all(Array.from({ length: STREAMS * BATCH }, (_, i) => inbox.store({ id: `warm_${i}`, body })));
    const pids = await backends();
    const server0 = pids.reduce((sum, pid) => sum + cpuMs(pid), 0);
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const per = Math.ceil(N / STREAMS);
    await Promise.all(
      Array.from({ length: STREAMS }, async (_, s) => {
        for (let i = 0; i < per; i += BATCH) {
          await Promise.all(
            Array.from({ length: Math.min(BATCH, per - i) }, (_, j) => inbox.store({ id: `evt_${s}_${i + j}`, body })),
          );
        }
      }),
    );
    const ms = performance.now() - t0;
    const cpu = process.cpuUsage(cpu0);
    const server = pids.reduce((sum, pid) => sum + cpuMs(pid), 0) - server0;
    const n = per * STREAMS;
    return { rate: (n / ms) * 1000, clientUs: (cpu.user + cpu.system) / n, postgresUs: (server * 1000) / n };
  } finally {
    await watch.end();
    await inbox.close();
    await db.drop();
  }
}

/** pgstore measures store() on PostgreSQL (and BENCH_COMPARE's) and returns its summary. */
export async function pgstore(): Promise<string> {
  if (!(await pgReachable())) return "pgstore: skipped, no PostgreSQL answers";
  const trees = [ROOT, ...(COMPARE ? [resolve(COMPARE)] : [])];
  const name = (root: string) =>
    spawnSync("git", ["-C", root, "log", "-1", "--format=%h"], { encoding: "utf8" }).stdout.trim() || root;
  const opens = new Map<string, Open>();
  for (const root of trees) {
    const mod = (await import(pathToFileURL(resolve(root, "lib/postgres/postgres.ts")).href)) as {
      PostgresInbox: { open: Open };
    };
    opens.set(root, (url) => mod.PostgresInbox.open(url));
  }
  console.log(
    `pgstore: ${N} deliveries a run, ${STREAMS} streams of ${BATCH} a turn, ${ROUNDS} round(s), ${trees.map(name).join(" and ")} alternating`,
  );
  const lines: string[] = [];
  for (const [size, body] of [
    ["small", SMALL],
    ["4 KB", LARGE],
  ] as const) {
    const runs = new Map<string, Measured[]>(trees.map((t) => [t, []]));
    for (let round = 1; round <= ROUNDS; round++) {
      for (const [i, root] of trees.entries()) {
        const m = await once(opens.get(root)!, `bench_pgstore_${i}`, body);
        runs.get(root)!.push(m);
        console.log(
          `  round ${round} ${size} body (${body.length} B) ${name(root).padEnd(10)} ${f(m.rate).padStart(6)} deliveries/s  CPU µs/delivery: this process ${f(m.clientUs)}, PostgreSQL ${f(m.postgresUs)}`,
        );
      }
    }
    const at = (root: string, k: keyof Measured) => median(runs.get(root)!.map((m) => m[k]));
    const part = (root: string) =>
      `${name(root)} ${f(at(root, "rate"))}/s (CPU µs/delivery: client ${f(at(root, "clientUs"))}, PostgreSQL ${f(at(root, "postgresUs"))})`;
    let line = `${size} body (${body.length} B): ${trees.map(part).join(" | ")}`;
    if (trees.length > 1) {
      const [a, b] = trees as [string, string];
      const ratio = (k: keyof Measured) => median(runs.get(a)!.map((m, r) => m[k] / runs.get(b)!.at(r)![k]));
      line += ` | A/B rate ×${f(ratio("rate"), 2)}, client CPU ×${f(ratio("clientUs"), 2)}, PostgreSQL CPU ×${f(ratio("postgresUs"), 2)}`;
    }
    lines.push(line);
  }
  return `pgstore (median of ${ROUNDS}):\n  ${lines.join("\n  ")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await pgstore());
