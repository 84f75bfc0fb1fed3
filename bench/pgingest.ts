// bench/pgingest.ts: the front door on PostgreSQL, taken apart: `receiver.ts --quiet --db postgres://…` at
// 32 and 128 connections (wrk, unique IDs), with the CPU per request of the receiver and of the PostgreSQL
// backends serving it (from /proc), the commits per request (pg_stat_database), and the committer's own
// batches: how many requests share one, and how long one takes from its start to its COMMIT's answer
// (the receiver's /metrics). BENCH_COMPARE=/path/to/another/checkout adds that checkout's receiver, and
// BENCH_PGINGEST_SET=commit_delay=1000,commit_siblings=1 a row of this one on a database with those server
// settings (ALTER DATABASE … SET: the bench's role must be a superuser for commit_delay). Every row runs in
// each round, one after the other; ratios are taken within a round.
//   npm run bench -- pgingest     BENCH_COMPARE=/tmp/before BENCH_ROUNDS=5 npm run bench -- pgingest

import { spawnSync } from "node:child_process";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import pg from "pg";
import { CONNECTIONS, ROOT, WARMUP_SECONDS, cpuMs, f, hammer, knob, startChild, type Child } from "./common.ts";
import { PG_URL, freshDatabase, pgReachable } from "./peers/pgdb.ts";

const SECONDS = knob("BENCH_SECONDS", 4);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const HIGH = knob("BENCH_CONNECTIONS_HIGH", 128);
const COMPARE = process.env.BENCH_COMPARE;
const SETTINGS = (process.env.BENCH_PGINGEST_SET ?? "").split(",").filter(Boolean);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

/** Measured is one row's round: rate, CPU per request on each side, commits per request, the committer's batches. */
interface Measured {
  rps: number;
  receiverUs: number;
  postgresUs: number;
  perCommit: number;
  batch: number;
  batchMs: number;
}

/** Row is one receiver at one connection count, on a database of its own. */
interface Row {
  name: string;
  connections: number;
  database: string;
  child: Child;
  drop: () => Promise<void>;
  rounds: Measured[];
}

/** pgingest runs the rows and returns the summary. */
export async function pgingest(): Promise<string> {
  if (!(await pgReachable())) return "pgingest: skipped, no PostgreSQL answers";
  const name = (root: string) =>
    spawnSync("git", ["-C", root, "log", "-1", "--format=%h"], { encoding: "utf8" }).stdout.trim() || root;
  const variants = [
    { name: name(ROOT), root: ROOT, settings: [] as string[] },
    ...(COMPARE ? [{ name: name(resolve(COMPARE)), root: resolve(COMPARE), settings: [] }] : []),
    ...(SETTINGS.length > 0 ? [{ name: `${name(ROOT)} ${SETTINGS.join(" ")}`, root: ROOT, settings: SETTINGS }] : []),
  ];
  const admin = new pg.Client({ connectionString: new URL("/postgres", PG_URL).toString() });
  await admin.connect();
  const rows: Row[] = [];
  const backends = async (database: string) =>
    (await admin.query<{ pid: number }>("SELECT pid FROM pg_stat_activity WHERE datname = $1", [database])).rows.map(
      (r) => r.pid,
    );
  const commits = async (database: string) =>
    Number(
      (await admin.query<{ n: string }>("SELECT xact_commit AS n FROM pg_stat_database WHERE datname = $1", [database]))
        .rows[0]!.n,
    );
  const batches = async (url: string) => {
    const text = await (await fetch(`${url}/metrics`)).text();
    const get = (metric: string) =>
      Number(new RegExp(`^${metric}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(text)?.[1] ?? NaN);
    return {
      n: get("inbox_commit_batch_size_count"),
      size: get("inbox_commit_batch_size_sum"),
      seconds: get("inbox_commit_duration_seconds_sum"),
    };
  };
  console.log(
    `pgingest: ${variants.map((v) => v.name).join(", ")} at ${CONNECTIONS} and ${HIGH} connections, ${ROUNDS} round(s) of ${SECONDS} s`,
  );
  try {
    for (const connections of [CONNECTIONS, HIGH]) {
      for (const [i, v] of variants.entries()) {
        const database = `bench_pgingest_${i}_${connections}`;
        const db = await freshDatabase(database);
        for (const setting of v.settings) {
          const [key, value] = setting.split("=");
          if (!/^[a-z_]+$/.test(key ?? "") || !/^[\w.]+$/.test(value ?? ""))
            throw new TypeError(`BENCH_PGINGEST_SET: expected name=value,…, got ${setting}`);
          await admin.query(`ALTER DATABASE ${database} SET ${key} = '${value}'`);
        }
        const child = await startChild(resolve(v.root, "receiver.ts"), [
          "--port",
          "0",
          "--db",
          `${db.url}?schema=inbox`,
          "--quiet",
        ]);
        rows.push({ name: v.name, connections, database, child, drop: db.drop, rounds: [] });
      }
    }
    for (const r of rows) await hammer(r.child.url, { seconds: WARMUP_SECONDS, connections: r.connections });
    for (let round = 1; round <= ROUNDS; round++) {
      for (const r of rows) {
        // A moment of load first: the pool closes connections idle for 10 s, and the backends counted
        // are the ones open when the measurement starts.
        await hammer(r.child.url, { seconds: 1, connections: r.connections });
        const pids = await backends(r.database);
        const server0 = new Map(pids.map((pid) => [pid, cpuMs(pid)]));
        const [c0, x0, b0] = [r.child.cpuMs(), await commits(r.database), await batches(r.child.url)];
        const load = await hammer(r.child.url, { seconds: SECONDS, connections: r.connections });
        const [b1, x1] = [await batches(r.child.url), await commits(r.database)];
        const n = load.ok + load.non2xx;
        // A backend opened during the run counts whole; one closed during it is lost (rare under load).
        const server = (await backends(r.database)).reduce((sum, pid) => sum + cpuMs(pid) - (server0.get(pid) ?? 0), 0);
        const m: Measured = {
          rps: load.rps,
          receiverUs: ((r.child.cpuMs() - c0) * 1000) / n,
          postgresUs: (server * 1000) / n,
          perCommit: n / Math.max(1, x1 - x0),
          batch: (b1.size - b0.size) / (b1.n - b0.n),
          batchMs: ((b1.seconds - b0.seconds) * 1000) / (b1.n - b0.n),
        };
        r.rounds.push(m);
        console.log(
          `  round ${round} ${r.name.padEnd(12)} @${r.connections} ${f(m.rps).padStart(6)} req/s  p50 ${f(load.p50, 1)} p99 ${f(load.p99, 1)} ms  ` +
            `CPU µs/req: receiver ${f(m.receiverUs)}, PostgreSQL ${f(m.postgresUs)}  requests a commit ${f(m.perCommit, 1)}  ` +
            `batch ${f(m.batch, 1)} requests, ${f(m.batchMs, 2)} ms${load.non2xx ? `  non-2xx ${load.non2xx}` : ""}`,
        );
      }
    }
  } finally {
    for (const r of rows) await r.child.stop();
    for (const r of rows) await r.drop();
    await admin.end();
  }
  const lines: string[] = [];
  for (const connections of [CONNECTIONS, HIGH]) {
    const at = rows.filter((r) => r.connections === connections);
    const med = (r: Row, k: keyof Measured) => median(r.rounds.map((m) => m[k]));
    for (const r of at) {
      lines.push(
        `${connections} conn: ${r.name} ${f(med(r, "rps"))} req/s (CPU µs/req: receiver ${f(med(r, "receiverUs"))}, PostgreSQL ${f(med(r, "postgresUs"))}; ` +
          `${f(med(r, "perCommit"), 1)} requests a commit; batch ${f(med(r, "batch"), 1)} requests in ${f(med(r, "batchMs"), 2)} ms)`,
      );
    }
    for (const r of at.slice(1)) {
      const ratio = (k: keyof Measured) => median(at[0]!.rounds.map((m, i) => m[k] / r.rounds[i]![k]));
      lines.push(
        `${connections} conn: A/B ${at[0]!.name} against ${r.name}: rate ×${f(ratio("rps"), 2)}, receiver CPU ×${f(ratio("receiverUs"), 2)}, PostgreSQL CPU ×${f(ratio("postgresUs"), 2)}`,
      );
    }
  }
  return `pgingest (median of ${ROUNDS}):\n  ${lines.join("\n  ")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await pgingest());
