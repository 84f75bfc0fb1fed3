// bench/observe.ts: what the observability costs. Ingest with metrics on (with /metrics scraped every
// BENCH_SCRAPE_MS, 1 s: fifteen times as often as Prometheus's default, and not scraped at all) against
// the same receiver with --no-metrics; the log line per request as JSON against text; side by side, in rounds, ratios within a
// round, the median reported. Then what one read of the queue's gauges costs at BENCH_GAUGE_ROWS (1M)
// deliveries, on SQLite and (when it answers) PostgreSQL, beside a status() that counts everything.
//   npm run bench -- observe          BENCH_SECONDS=4 BENCH_ROUNDS=3 BENCH_GAUGE_ROWS=1000000

import { spawn } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { connect } from "../inbox.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import {
  CONNECTIONS,
  cpuMs,
  f,
  flushFill,
  hammer,
  knob,
  ROOT,
  row,
  rssMb,
  tempDir,
  type Child,
  type Load,
  WARMUP_SECONDS,
} from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 4);
const ROUNDS = knob("BENCH_ROUNDS", 3);
const SCRAPE_MS = knob("BENCH_SCRAPE_MS", 1_000);
const GAUGE_ROWS = knob("BENCH_GAUGE_ROWS", 1_000_000);
const POSTGRES = process.env.INBOX_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

// receiver starts receiver.ts and waits for its address, in either log format (JSON's is a JSON line).
async function receiver(args: string[]): Promise<Child> {
  const child = spawn(process.execPath, ["--import", "tsx", join(ROOT, "receiver.ts"), "--port", "0", ...args], {
    cwd: ROOT,
    stdio: ["ignore", "pipe", "pipe"],
  });
  child.stderr!.resume();
  const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
  const url = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (line) => {
      const match = /Listening on (http:\/\/[^\s"]+)/.exec(line);
      if (match) resolve(match[1]!);
    });
    void exited.then(() => reject(new Error("receiver.ts exited before listening")));
  });
  let peak = 0;
  return {
    child,
    url,
    stderr: () => "",
    peakRssMb: () => (child.exitCode === null ? (peak = Math.max(peak, rssMb(child.pid!, true))) : peak),
    cpuMs: () => cpuMs(child.pid!),
    stop: async () => {
      if (child.exitCode === null) child.kill("SIGTERM");
      await exited;
    },
  };
}

// gaugeCost fills an inbox with rows deliveries, 1% of them still waiting, and times gauges() and status().
async function gaugeCost(target: string): Promise<{ gaugesMs: number; statusMs: number }> {
  const inbox = await connect(target);
  try {
    const times: number[] = [];
    for (let i = 0; i < 5; i++) {
      const t0 = performance.now();
      await inbox.gauges();
      times.push(performance.now() - t0);
    }
    const t0 = performance.now();
    await inbox.status();
    return { gaugesMs: median(times), statusMs: performance.now() - t0 };
  } finally {
    await inbox.close();
  }
}

function fillSqlite(path: string, n: number): void {
  openDatabase(path).close();
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  const insert = db.prepare(
    `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at, attempts, finished_at)
     VALUES (?, ?, ?, 'x', ?, ?, ?, 1, ?)`,
  );
  const body = Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: "Ann", amount: 5 }));
  const now = Date.now();
  for (let start = 0; start < n; start += 50_000) {
    db.exec("BEGIN");
    for (let i = start; i < Math.min(n, start + 50_000); i++) {
      const waiting = i >= n * 0.99;
      insert.run(
        `source${i % 4}`,
        `id_${i}`,
        body,
        now - n + i,
        waiting ? "received" : "done",
        now - n + i,
        waiting ? null : now,
      );
    }
    db.exec("COMMIT");
  }
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.close();
  flushFill(path);
}

async function fillPostgres(url: string, n: number): Promise<void> {
  (await connect(url)).close();
  const { default: pg } = await import("pg");
  const schema = new URL(url).searchParams.get("schema")!;
  const client = new pg.Client({ connectionString: POSTGRES });
  await client.connect();
  try {
    await client.query(`SET search_path = ${schema}`);
    await client.query(
      `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at, attempts, finished_at)
       SELECT 'source' || (i % 4), 'id_' || i, convert_to('{"type":"payment.succeeded","customer":"Ann","amount":5}', 'UTF8'), 'x',
              i, CASE WHEN i >= $1 * 0.99 THEN 'received' ELSE 'done' END, i, 1, CASE WHEN i >= $1 * 0.99 THEN NULL ELSE i END
       FROM generate_series(0, $1 - 1) AS i`,
      [n],
    );
    await client.query("VACUUM ANALYZE deliveries");
  } finally {
    await client.end();
  }
}

/** observe runs the comparison and returns its one-line summary. */
export async function observe(): Promise<string> {
  const { dir, cleanup } = tempDir();
  const variants = [
    {
      name: "receiver --quiet --no-metrics",
      args: ["--db", join(dir, "off.db"), "--quiet", "--no-metrics"],
      scrape: false,
    },
    { name: "receiver --quiet, metrics, scraped", args: ["--db", join(dir, "on.db"), "--quiet"], scrape: true },
    {
      name: "receiver --quiet, metrics, unscraped",
      args: ["--db", join(dir, "unscraped.db"), "--quiet"],
      scrape: false,
    },
    { name: "receiver text log, --no-metrics", args: ["--db", join(dir, "text.db"), "--no-metrics"], scrape: false },
    {
      name: "receiver json log, --no-metrics",
      args: ["--db", join(dir, "json.db"), "--no-metrics", "--log-format", "json"],
      scrape: false,
    },
  ];
  console.log(
    `observe: ${CONNECTIONS} connections, ${ROUNDS} round(s) of ${SECONDS} s per server, /metrics every ${SCRAPE_MS} ms`,
  );
  const children: Child[] = [];
  const loads = variants.map(() => [] as Load[]);
  const cpu = variants.map(() => [] as number[]);
  let scrapes = 0;
  let scrapeMs = 0;
  try {
    for (const v of variants) {
      const child = await receiver(v.args);
      children.push(child);
      await hammer(child.url, { seconds: WARMUP_SECONDS });
    }
    for (let round = 1; round <= ROUNDS; round++) {
      console.log(`  round ${round}`);
      // Every other round in reverse order, so neither of a pair always runs just after the other.
      const order = round % 2 === 1 ? [0, 1, 2, 3, 4] : [2, 1, 0, 4, 3];
      for (const i of order) {
        const v = variants[i]!;
        const c0 = children[i]!.cpuMs();
        const scraper = v.scrape
          ? setInterval(async () => {
              const t0 = performance.now();
              await (await fetch(`${children[i]!.url}/metrics`)).text();
              scrapeMs += performance.now() - t0;
              scrapes++;
            }, SCRAPE_MS)
          : undefined;
        const load = await hammer(children[i]!.url, { seconds: SECONDS });
        clearInterval(scraper);
        cpu[i]!.push(((children[i]!.cpuMs() - c0) * 1000) / (load.ok + load.non2xx));
        loads[i]!.push(load);
        row(`  ${v.name}`, load, `CPU ${f(cpu[i]!.at(-1)!)} µs/req`);
      }
    }
  } finally {
    for (const child of children) await child.stop();
  }
  const ratio = (i: number, base: number) => median(loads[i]!.map((l, round) => l.rps / loads[base]![round]!.rps));
  // CPU per request is steadier than throughput on a shared machine: the cost itself, whatever the load.
  const cpuRatio = (i: number, base: number) => median(cpu[i]!.map((c, round) => c / cpu[base]![round]!));
  const rps = (i: number) => median(loads[i]!.map((l) => l.rps));
  const us = (i: number) => median(cpu[i]!);

  console.log(`  gauges at ${GAUGE_ROWS} rows (1% waiting, 4 sources)`);
  const sqlitePath = join(dir, "gauges.db");
  fillSqlite(sqlitePath, GAUGE_ROWS);
  const sqlite = await gaugeCost(sqlitePath);
  console.log(
    `    sqlite: gauges() ${f(sqlite.gaugesMs, 1)} ms (on its own thread), status() ${f(sqlite.statusMs, 1)} ms`,
  );
  let pgLine = "";
  try {
    const url = new URL(POSTGRES);
    const schema = `bench_gauges_${process.pid}`;
    url.searchParams.set("schema", schema);
    await fillPostgres(url.toString(), GAUGE_ROWS);
    const postgres = await gaugeCost(url.toString());
    console.log(`    postgres: gauges() ${f(postgres.gaugesMs, 1)} ms, status() ${f(postgres.statusMs, 1)} ms`);
    pgLine = `, postgres ${f(postgres.gaugesMs, 1)} ms (status() ${f(postgres.statusMs, 0)} ms)`;
    const { default: pg } = await import("pg");
    const client = new pg.Client({ connectionString: POSTGRES });
    await client.connect();
    await client.query(`DROP SCHEMA ${schema} CASCADE`);
    await client.end();
  } catch (error) {
    console.log(`    postgres: skipped (${error instanceof Error ? error.message : String(error)})`);
  }
  cleanup();
  return (
    `observe (median of ${ROUNDS}): no metrics ${f(rps(0))} req/s (${f(us(0))} µs CPU/req)` +
    ` | metrics on, scraped every ${SCRAPE_MS} ms: throughput ×${f(ratio(1, 0), 2)}, CPU/req ×${f(cpuRatio(1, 0), 2)} (${f(us(1))} µs; a scrape answered in ${f(scrapeMs / Math.max(1, scrapes), 1)} ms)` +
    ` | unscraped ×${f(ratio(2, 0), 2)}, CPU/req ×${f(cpuRatio(2, 0), 2)}` +
    ` | json log against text log: throughput ×${f(ratio(4, 3), 2)}, CPU/req ×${f(cpuRatio(4, 3), 2)} (${f(us(4))} against ${f(us(3))} µs)` +
    ` | gauges at ${GAUGE_ROWS} rows: sqlite ${f(sqlite.gaugesMs, 1)} ms (status() ${f(sqlite.statusMs, 0)} ms)${pgLine}`
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await observe());
