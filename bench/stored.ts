// bench/stored.ts: does a full inbox slow its hot paths? On each backend (bench/targets.ts), an inbox is
// filled with STORED done deliveries through the backend's bulk path (SQLite: one prepared INSERT in
// transactions of 50,000 with synchronous off; PostgreSQL: INSERT … SELECT FROM generate_series, 100,000 a
// statement), Stripe-shaped bodies of about 1 KB received over the past week; then BENCH_STORED_N (20,000)
// new deliveries are stored through the real store() (streams of 32 a turn, as the receiver batches them)
// and drained by the real worker loop (run() of worker.ts, the record-payment handler, --once). Each size is
// measured against an empty inbox in the same run (ratios printed), and the disk the stored rows take is
// given per million deliveries (SQLite: the file; PostgreSQL: the table with its indexes and TOAST). Beside each
// rate, the CPU a delivery (this process's and PostgreSQL's), which a shared machine's load moves less. On
// PostgreSQL it then times the upgrades of an inbox that main's schema filled at the largest size (to bodies apart,
// and to a hot queue and a history: the split alone, and with its keys copied ahead, an old host storing beside each;
// and to the failed rows' index in the page's order: its migration alone, and with the index built ahead, a host
// storing and marking done beside each; and to the search indexes with periods, every row indexed: the same two
// ways, a searcher and a host storing beside each).
// Sizes: BENCH_STORED (default 0,200000); BENCH_MILLION=1 adds 1,000,000; BENCH_TEN_MILLION=1 adds 10,000,000;
// BENCH_UPGRADE_ROWS (default the largest) the upgrade's; BENCH_UPGRADES (default bodies,history,failed,dated,sqlite) which:
// sqlite times a SQLite inbox's upgrade to bodies apart, filled by the schema before it.
//   npm run bench -- stored
//   BENCH_MILLION=1 BENCH_POSTGRES=0 npm run bench -- stored

import { statSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { connect } from "../inbox.ts";
import { sha256 } from "../lib/rows.ts";
import { MIGRATIONS as SQLITE_MIGRATIONS, openDatabase } from "../lib/sqlite/schema.ts";
import type { Inbox } from "../lib/store.ts";
import { toPg } from "../lib/postgres/commit.ts";
import { prepareDatedSearch, prepareFailedIndex, prepareKeys } from "../lib/postgres/migrate.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import { historyOf, periodOf } from "../lib/postgres/periods.ts";
import pg from "pg";
import { freshDatabase } from "./peers/pgdb.ts";
import { ensurePayments, recordPayment, run } from "../worker.ts";
import { cpuMs, f, flushFill, knob, tempDir } from "./common.ts";
import { inboxTargets } from "./targets.ts";

const SIZES = (process.env.BENCH_STORED ?? "0,200000").split(",").map((s) => {
  if (!/^\d+$/.test(s.trim())) throw new TypeError(`BENCH_STORED: expected sizes like 0,200000, got ${s}`);
  return Number(s);
});
if (!SIZES.includes(0)) SIZES.unshift(0); // the baseline every ratio is taken against
if (process.env.BENCH_MILLION === "1" && !SIZES.includes(1_000_000)) SIZES.push(1_000_000);
if (process.env.BENCH_TEN_MILLION === "1" && !SIZES.includes(10_000_000)) SIZES.push(10_000_000);
const N = knob("BENCH_STORED_N", 20_000);
const STREAMS = 4;
const DAY = 86_400_000;

// stripeLike is a charge.succeeded event of about 1 KB, as Stripe sends it, its IDs made from i, with the
// top-level customer and amount the record-payment handler reads.
export function stripeLike(i: number): Buffer {
  return Buffer.from(
    JSON.stringify({
      id: `evt_${i}`,
      customer: `cus_${i % 50_000}`,
      amount: (i % 9_000) + 100,
      object: "event",
      api_version: "2024-06-20",
      created: 1_700_000_000 + i,
      type: "charge.succeeded",
      livemode: false,
      pending_webhooks: 1,
      request: { id: `req_${i}`, idempotency_key: `ik_${i}` },
      data: {
        object: {
          id: `ch_${i}`,
          object: "charge",
          amount: (i % 9_000) + 100,
          currency: "usd",
          customer: `cus_${i % 50_000}`,
          description: `Order ${i} for the spring catalogue`,
          payment_method: `pm_${i}`,
          receipt_email: `customer${i % 50_000}@example.com`,
          status: "succeeded",
          billing_details: {
            address: { city: "Lisbon", country: "PT", line1: "Rua Augusta 1", postal_code: "1100-048" },
          },
          metadata: { order_id: `ord_${i}`, cart: `cart_${i % 7_777}` },
          outcome: { network_status: "approved_by_network", risk_level: "normal", seller_message: "Payment complete." },
        },
      },
    }),
  );
}

// fillSqlite writes n done deliveries straight into the file, as SQLite's bulk path, into the schema make leaves
// (by default this tree's whole schema).
function fillSqlite(path: string, n: number, now: number, make = (p: string) => openDatabase(p).close()): void {
  make(path);
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  const insert = db.prepare(
    `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, received_at, status, attempts,
                             available_at, finished_at)
     VALUES ('default', ?, ?, ?, 'application/json', 'charge.succeeded', ?, 'done', 1, ?, ?)`,
  );
  for (let start = 0; start < n; start += 50_000) {
    db.exec("BEGIN");
    for (let i = start; i < Math.min(n, start + 50_000); i++) {
      const body = stripeLike(i);
      const at = now - 7 * DAY + Math.floor((i * 7 * DAY) / n);
      insert.run(`old_${i}`, body, sha256(body), at, at, at + 50);
    }
    db.exec("COMMIT");
  }
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.close();
  flushFill(path);
}

/**
 * fillPostgres writes n done deliveries received over the days days before now, with one INSERT … SELECT per
 * 100,000, the body made by the server in the shape of stripeLike (the same size, give or take the digits), into
 * the day partitions of those days (made first) unless partitioned is false (then the default partition).
 */
export async function fillPostgres(
  inbox: Pick<Inbox, "query">,
  n: number,
  now: number,
  days = 7,
  partitioned = true,
): Promise<void> {
  const sample = stripeLike(0).toString("utf8");
  const [head, tail] = [sample.slice(0, sample.indexOf('"evt_0"')), sample.slice(sample.indexOf('"evt_0"') + 7)];
  // Where bodies have a table of their own (docs/table.md#bodies-apart), the rows and the bodies are written
  // straight into their tables, as store() writes them, rather than a row at a time through the view's trigger.
  const [{ apart, keyed }] = (await inbox.query(
    "SELECT to_regclass('delivery_bodies') IS NOT NULL AS apart, to_regclass('delivery_keys') IS NOT NULL AS keyed",
  )) as [{ apart: boolean; keyed: boolean }];
  if (apart && partitioned) await makeDays(inbox, now - days * DAY, now);
  for (let start = 0; start < n; start += 100_000) {
    await inbox.query(
      `WITH g AS (
         SELECT i, ?::bigint - ?::bigint * 86400000 + (i * ?::bigint * 86400000) / ?::bigint AS t,
                convert_to(? || '"evt_' || i || '"' || replace(?, '_0"', '_' || i || '"'), 'UTF8') AS b
         FROM generate_series(?::bigint, ?::bigint) AS i),
       r AS (
         INSERT INTO ${apart ? "delivery_rows" : "deliveries"} (source, id, body, body_sha256, content_type, event_type,
                                 received_at, status, attempts, available_at, finished_at)
         SELECT 'default', 'old_' || i, ${apart ? "'\\x'::bytea" : "b"}, encode(sha256(b), 'hex'), 'application/json',
                'charge.succeeded', t, 'done', 1, t, t + 50
         FROM g),
       -- Each row's key, where duplicates are answered from a table of their own (docs/table.md#hot-and-cold).
       k AS (${keyed ? "INSERT INTO delivery_keys (source, id, route, received_at) SELECT 'default', 'old_' || i, 0, t FROM g" : "SELECT 1"})
       ${apart ? "INSERT INTO delivery_bodies (source, id, route, received_at, body) SELECT 'default', 'old_' || i, 0, t, b FROM g" : "SELECT 1"}`,
      now,
      days,
      days,
      n,
      head,
      tail,
      start,
      Math.min(n, start + 100_000) - 1,
    );
  }
  // A partitioned delivery_rows: VACUUM of it goes through its partitions.
  await inbox.query(`VACUUM (ANALYZE) ${apart ? "delivery_rows" : "deliveries"}`);
  if (keyed) await inbox.query("VACUUM (ANALYZE) delivery_keys");
  if (apart) await inbox.query("VACUUM (ANALYZE) delivery_bodies");
  // As on SQLite: the fill's dirty buffers written out now, not by a checkpoint in the middle of the measure.
  await inbox.query("CHECKPOINT");
}

/**
 * makeDays makes the day partitions of delivery_bodies from from to until before a fill writes bodies of those
 * days, as an inbox that lived through them would have them (the worker's purge makes each ahead): filled into
 * the default partition, they would be read and purged there, and each day made later would scan them all.
 */
export async function makeDays(inbox: Pick<Inbox, "query">, from: number, until: number): Promise<void> {
  for (let at = from; at <= until; at += DAY) {
    const day = periodOf(at);
    // DDL takes no bound parameters: the name and bounds come from periodOf, from a number.
    await inbox.query(
      `CREATE TABLE IF NOT EXISTS ${day.name} PARTITION OF delivery_bodies FOR VALUES FROM (${day.from}) TO (${day.until})`,
    );
    // The day's history beside it, where delivery_rows is partitioned (docs/table.md#hot-and-cold), as
    // makePeriods makes it: done rows filled into the default partition would be read there instead.
    const [{ history }] = (await inbox.query("SELECT to_regclass('delivery_history') IS NOT NULL AS history")) as [
      { history: boolean },
    ];
    if (history) {
      const name = historyOf(day);
      await inbox.query(
        `CREATE TABLE IF NOT EXISTS ${name} PARTITION OF delivery_history FOR VALUES FROM (${day.from}) TO (${day.until})`,
      );
      await inbox.query(`CREATE UNIQUE INDEX IF NOT EXISTS ${name}_key ON ${name} (source, id, route)`);
      await inbox.query(
        `CREATE INDEX IF NOT EXISTS ${name}_open ON ${name} (status, received_at, source, destination) WHERE status <> 'done'`,
      );
    }
  }
}

// diskBytes is what the inbox takes on disk now.
async function diskBytes(inbox: Inbox, path: string): Promise<number> {
  if (inbox.backend === "postgres") {
    // The table with its indexes and TOAST, and the bodies' table where they have one of their own.
    const [row] = await inbox.query(
      `SELECT coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree(to_regclass('delivery_rows'))),
                       pg_total_relation_size('deliveries'))
              + coalesce(pg_total_relation_size(to_regclass('delivery_keys')), 0)
              + (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree(to_regclass('delivery_bodies'))) AS bytes`,
    );
    return Number(row!.bytes);
  }
  const size = (p: string) => {
    try {
      return statSync(p).size;
    } catch {
      return 0;
    }
  };
  return size(path) + size(`${path}-wal`);
}

/** Round is one size on one backend: store() and drain rates of N new deliveries, and the fill's disk. */
interface Round {
  stored: number;
  fillS: number;
  bytes: number;
  ingest: number;
  drain: number;
  /** CPU a delivery, in µs: this process's and, on PostgreSQL, its server processes', which a loaded machine shifts less than a rate. */
  ingestCpu: number;
  drainCpu: number;
}

// cpuNow is this process's CPU so far and, on PostgreSQL, that of the server processes serving this database, in
// ms; a connection opened during a phase counts whole, as it served that phase. bench/common.ts's cpuMs reads them.
// The inbox's connections only: an autovacuum the fill set off is the fill's, not the next 20,000 deliveries'.
// The reading connection counts too: left out once and read the next time, it brought the fill's CPU with it.
async function cpuNow(inbox: Inbox, seen: Map<number, number>): Promise<number> {
  const own = process.cpuUsage();
  let sum = (own.user + own.system) / 1000;
  if (inbox.backend === "postgres") {
    const rows = await inbox.query(
      "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'",
    );
    for (const { pid } of rows as { pid: number }[]) {
      try {
        seen.set(pid, cpuMs(pid));
      } catch {
        // gone since: its last reading stands
      }
    }
    for (const ms of seen.values()) sum += ms;
  }
  return sum;
}

async function once(db: string, stored: number): Promise<Round> {
  const now = Date.now();
  let started = performance.now();
  if (!db.startsWith("postgres") && stored > 0) fillSqlite(db, stored, now);
  const inbox = await connect(db);
  try {
    if (inbox.backend === "postgres" && stored > 0) await fillPostgres(inbox, stored, now);
    const fillS = (performance.now() - started) / 1000;
    const bytes = await diskBytes(inbox, db);
    await ensurePayments(inbox);
    const seen = new Map<number, number>();
    let cpu = await cpuNow(inbox, seen);
    // Ingest: STREAMS streams, each storing 32 at a time and waiting for their commit, as the receiver does.
    started = performance.now();
    let next = 0;
    await Promise.all(
      Array.from({ length: STREAMS }, async () => {
        while (next < N) {
          const from = next;
          next = Math.min(N, next + 32);
          const turn: Promise<unknown>[] = [];
          for (let i = from; i < next; i++)
            turn.push(inbox.store({ id: `new_${i}`, body: stripeLike(stored + i), contentType: "application/json" }));
          await Promise.all(turn);
        }
      }),
    );
    const ingest = N / ((performance.now() - started) / 1000);
    const ingestCpu = ((await cpuNow(inbox, seen)) - cpu) * (1000 / N);
    cpu = await cpuNow(inbox, seen);
    started = performance.now();
    const stats = await run(recordPayment, { inbox, once: true, log: () => {} });
    const drain = N / ((performance.now() - started) / 1000);
    const drainCpu = ((await cpuNow(inbox, seen)) - cpu) * (1000 / N);
    if (stats.done !== N) throw new Error(`bench stored: drained ${stats.done} of ${N}`);
    return { stored, fillS, bytes, ingest, drain, ingestCpu, drainCpu };
  } finally {
    await inbox.close();
  }
}

// The upgrades upgradeCost times: the migration each starts at (its first line's mark), and what it is called.
const UPGRADES = {
  bodies: { mark: "CREATE TABLE delivery_bodies", name: "bodies apart" },
  history: { mark: "CREATE TABLE delivery_rows_hot", name: "a hot queue and a history" },
  failed: { mark: "DROP INDEX delivery_rows_failed;", name: "the failed rows' index in the page's order" },
  dated: { mark: "deliveries_search_json_dated", name: "the search indexes with periods" },
} as const;

/**
 * sqliteUpgradeCost times the upgrade of a SQLite inbox that the schema before bodies apart filled with rows done
 * deliveries (their bodies in their rows): the first open of this tree runs the migration in its own write
 * transaction, which a receiver storing beside it would wait for; the second open, with nothing to migrate, is
 * the baseline.
 */
function sqliteUpgradeCost(rows: number, dir: string): string {
  const path = join(dir, "upgrade.db");
  const before = SQLITE_MIGRATIONS.slice(
    0,
    SQLITE_MIGRATIONS.findIndex((m) => m.includes("CREATE TABLE delivery_bodies")),
  );
  fillSqlite(path, rows, Date.now(), (p) => {
    const db = new DatabaseSync(p);
    db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    db.exec("PRAGMA journal_mode = WAL");
    for (const m of before) db.exec(m);
    db.exec(`PRAGMA user_version = ${before.length}`);
    db.close();
  });
  const timed = () => {
    const started = performance.now();
    openDatabase(path).close();
    return performance.now() - started;
  };
  const [upgrade, again] = [timed(), timed()];
  const db = new DatabaseSync(path, { readOnly: true });
  const { n } = db.prepare("SELECT count(*) AS n FROM deliveries WHERE length(body) > 0").get() as { n: number };
  db.close();
  if (n !== rows) throw new Error(`SQLite upgrade: ${n} of ${rows} bodies read back through the view`);
  return `  SQLite upgrade to bodies apart at ${f(rows)} stored: its open ${f(upgrade, 1)} ms, the next open ${f(again, 1)} ms; every body read back`;
}

/** filledBefore makes a database whose inbox schema main's migrations before mark made, filled with rows done deliveries. */
async function filledBefore(rows: number, mark: string): Promise<{ url: string; drop: () => Promise<void> }> {
  const db = await freshDatabase("bench_inbox_upgrade");
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    await client.query("CREATE SCHEMA inbox; SET search_path = inbox");
    await client.query(
      "CREATE TABLE inbox_migrations (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())",
    );
    const before = MIGRATIONS.findIndex((m) => m.includes(mark));
    for (let i = 0; i < before; i++) {
      await client.query(MIGRATIONS[i]!);
      await client.query("INSERT INTO inbox_migrations (version) VALUES ($1)", [i + 1]);
    }
    await fillPostgres(
      { query: async (sql, ...params) => (await client.query(toPg(sql), params)).rows },
      rows,
      Date.now(),
    );
  } catch (error) {
    await db.drop();
    throw error;
  } finally {
    await client.end();
  }
  return db;
}

/**
 * oldHost stores one delivery at a time into an inbox at the schema before the split, as a host of the old code
 * beside the upgrade would (main's INSERT through the view), each store its own transaction, and keeps each
 * store's time under the phase the bench says it is in; with marks, a worker beside it marks each one done, each
 * mark timed the same way; stop() ends it and gives them back.
 */
async function oldHost(
  url: string,
  marks = false,
): Promise<{ phase: (name: string) => void; stop: () => Promise<Map<string, number[]>> }> {
  const client = new pg.Client({ connectionString: url, options: "-c search_path=inbox" });
  await client.connect();
  const times = new Map<string, number[]>();
  const errors = new Map<string, number>();
  let phase = "before";
  let running = true;
  // Runs one statement and keeps its time under the phase it began in (a store that waited for the split's lock
  // is the split's) and what it is; one that failed is counted under its error's code, not timed.
  const timed = async (what: string, run: () => Promise<unknown>) => {
    const during = `${phase}${what}`;
    const started = performance.now();
    const failed = await run().then(
      () => undefined,
      (error: { code?: string }) => error.code ?? "?",
    );
    if (failed) return void errors.set(`${during} ${failed}`, (errors.get(`${during} ${failed}`) ?? 0) + 1);
    const list = times.get(during) ?? [];
    list.push(performance.now() - started);
    times.set(during, list);
  };
  const stored: string[] = [];
  const loop = (async () => {
    for (let n = 0; running; n++) {
      const body = stripeLike(n);
      const at = Date.now();
      await timed("", () =>
        client.query(
          `INSERT INTO deliveries (source, id, body, body_sha256, content_type, received_at, status, available_at)
           VALUES ('default', $1, $2, $3, 'application/json', $4, 'received', $4)`,
          [`beside_${n}`, body, sha256(body), at],
        ),
      );
      stored.push(`beside_${n}`);
    }
  })();
  // With marks, a worker of its own beside it finishes each delivery stored (one in 50 failed), on a connection of
  // its own, through the view as a done mark moves its row into the day's history, timed under the phase's ":mark".
  const marker = new pg.Client({ connectionString: url, options: "-c search_path=inbox" });
  if (marks) await marker.connect();
  const marking = (async () => {
    for (let n = 1; marks && (running || stored.length > 0); n++) {
      const id = stored.shift();
      if (id === undefined) {
        await new Promise((resolve) => setTimeout(resolve, 1));
        continue;
      }
      await timed(":mark", () =>
        marker.query(
          n % 50 === 0
            ? "UPDATE deliveries SET status = 'failed', error = 'HTTP 500', finished_at = $2 WHERE source = 'default' AND id = $1"
            : "UPDATE deliveries SET status = 'done', finished_at = $2 WHERE source = 'default' AND id = $1",
          [id, Date.now()],
        ),
      );
    }
  })();
  return {
    phase: (name) => void (phase = name),
    stop: async () => {
      running = false;
      await loop;
      await marking;
      await client.end();
      if (marks) await marker.end();
      for (const [what, n] of errors) console.log(`    stores failed, phase and code: ${what} ×${n}`);
      return times;
    },
  };
}

// latencies sums up a phase's store times: how many, p50, p99 and the longest, in ms.
function latencies(ms: number[] | undefined, what = "stores"): string {
  if (!ms || ms.length === 0) return `no ${what}`;
  const sorted = [...ms].sort((a, b) => a - b);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
  return `${f(sorted.length)} ${what}, p50 ${f(at(0.5), 1)} ms, p99 ${f(at(0.99), 1)} ms, longest ${f(sorted.at(-1)!, 1)} ms`;
}

/**
 * upgradeCost times the upgrade of a PostgreSQL inbox that main's schema filled with rows done deliveries to
 * bodies apart (docs/table.md#bodies-apart), or, from the schema before it, to a hot queue and a history
 * (docs/table.md#hot-and-cold): the first connect() runs the migrations after it. The split is timed twice, on
 * two fills, with an old host storing beside it: run as the list of migrations alone (its keys copied in its
 * transaction, the table locked), and as connect() runs it, its keys copied ahead (prepareKeys, timed apart).
 */
async function upgradeCost(rows: number, to: keyof typeof UPGRADES): Promise<string[]> {
  const lines: string[] = [];
  const say = (line: string) => void (console.log(line), lines.push(line));
  const name = `PostgreSQL upgrade to ${UPGRADES[to].name} at ${f(rows)} stored`;
  if (to === "bodies") {
    const db = await filledBefore(rows, UPGRADES[to].mark);
    try {
      const started = performance.now();
      const inbox = await connect(`${db.url}?schema=inbox`);
      const ms = performance.now() - started;
      await inbox.close();
      say(`  ${name}: ${f(ms)} ms (the first connect(), its migrations and the day partitions made)`);
    } finally {
      await db.drop();
    }
    return lines;
  }
  const split = MIGRATIONS.findIndex((m) => m.includes(UPGRADES[to].mark));
  // The copy inline: the split alone, in one transaction, as it ran before the copy ahead.
  {
    const db = await filledBefore(rows, UPGRADES[to].mark);
    try {
      const host = await oldHost(db.url);
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      const client = new pg.Client({ connectionString: db.url, options: "-c search_path=inbox" });
      await client.connect();
      host.phase("split");
      // As migrate() runs it: the view locked first, as a write through it takes it.
      const ms = await migrationAlone(client, split, "LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE");
      host.phase("after");
      await client.end();
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      const times = await host.stop();
      say(`  ${name}, its keys copied in its transaction: the split ${f(ms)} ms`);
      say(`    an old host's stores before: ${latencies(times.get("before"))}`);
      say(`    begun during the split: ${latencies(times.get("split"))}`);
    } finally {
      await db.drop();
    }
  }
  // The copy ahead, then the split with no copy left, as connect() runs them.
  const db = await filledBefore(rows, UPGRADES[to].mark);
  try {
    const host = await oldHost(db.url);
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    const session = new pg.Client({ connectionString: db.url, options: "-c search_path=inbox" });
    await session.connect();
    host.phase("ahead");
    let started = performance.now();
    const copied = await prepareKeys(session, "inbox");
    const aheadMs = performance.now() - started;
    await session.end();
    host.phase("split");
    started = performance.now();
    const inbox = await connect(`${db.url}?schema=inbox`);
    const ms = performance.now() - started;
    host.phase("after");
    await inbox.close();
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    const times = await host.stop();
    say(
      `  ${name}, its keys copied ahead: the copy ${f(aheadMs)} ms (${f(copied)} keys), then the first connect() ${f(ms)} ms (the split and the day partitions made)`,
    );
    say(`    an old host's stores before: ${latencies(times.get("before"))}`);
    say(`    during the copy ahead: ${latencies(times.get("ahead"))}`);
    say(`    begun during the connect(): ${latencies(times.get("split"))}`);
  } finally {
    await db.drop();
  }
  return lines;
}

// migrationAlone runs one migration in a transaction of its own on client, first after BEGIN (the lock migrateTo
// or migrate() takes), and says how long the transaction took, in ms.
async function migrationAlone(client: pg.Client, version: number, first: string): Promise<number> {
  const started = performance.now();
  await client.query("BEGIN");
  await client.query(first);
  await client.query(MIGRATIONS[version]!);
  await client.query("INSERT INTO inbox_migrations (version) VALUES ($1)", [version + 1]);
  await client.query("COMMIT");
  return performance.now() - started;
}

// onInbox runs run on a connection of its own to the inbox schema of the database at url, and ends it.
async function onInbox<T>(url: string, run: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: url, options: "-c search_path=inbox" });
  await client.connect();
  try {
    return await run(client);
  } finally {
    await client.end();
  }
}

/**
 * failedIndexCost times the migration that makes the failed rows' index again in the page's order
 * (docs/table.md#the-failed-rows-index) on an inbox at the version before it, filled with rows deliveries (one in 50
 * failed), a host storing one delivery at a time and marking the one before it done beside it, twice, on two fills:
 * the migration alone in its transaction, as migrateTo runs it (the index built with delivery_rows locked), and
 * after prepareFailedIndex built the index ahead (timed apart), then the first connect().
 */
async function failedIndexCost(rows: number): Promise<string[]> {
  const lines: string[] = [];
  const say = (line: string) => void (console.log(line), lines.push(line));
  const name = `PostgreSQL upgrade to ${UPGRADES.failed.name} at ${f(rows)} stored`;
  const version = MIGRATIONS.findIndex((m) => m.startsWith(UPGRADES.failed.mark));
  const filled = async () => {
    const db = await filledBefore(rows, UPGRADES.failed.mark);
    await onInbox(db.url, async (client) => {
      // One in 50 failed, as bench/listing.ts fills them: what the index holds.
      await client.query(
        "UPDATE delivery_rows SET status = 'failed', error = 'HTTP 500' WHERE substr(id, 5)::bigint % 50 = 0",
      );
      await client.query("VACUUM (ANALYZE) delivery_rows");
      await client.query("CHECKPOINT");
    });
    return db;
  };
  // The migration's transaction as migrateTo runs it: the migrations' lock, the migration, its version.
  const migration = (url: string) =>
    onInbox(url, (client) =>
      migrationAlone(client, version, "SELECT pg_advisory_xact_lock(hashtext('webhook-inbox:inbox'))"),
    );
  const report = (times: Map<string, number[]>, phases: [string, string][]) => {
    for (const [phase, what] of phases) {
      say(`    ${what}: ${latencies(times.get(phase))}`);
      say(`    ${" ".repeat(what.length)}  ${latencies(times.get(`${phase}:mark`), "done marks")}`);
    }
  };
  for (const ahead of [false, true]) {
    const db = await filled();
    try {
      const host = await oldHost(db.url, true);
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      let aheadMs = 0;
      let built = 0;
      if (ahead) {
        host.phase("ahead");
        const started = performance.now();
        built = await onInbox(db.url, (session) => prepareFailedIndex(session, "inbox"));
        aheadMs = performance.now() - started;
        host.phase("between");
        await new Promise((resolve) => setTimeout(resolve, 1_000));
      }
      host.phase("migration");
      const ms = await migration(db.url);
      host.phase("connect");
      const started = performance.now();
      const inbox = await connect(`${db.url}?schema=inbox`);
      const connectMs = performance.now() - started;
      host.phase("after");
      await inbox.close();
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      const times = await host.stop();
      if (ahead) {
        say(
          `  ${name}, built ahead: the build ${f(aheadMs)} ms (${built} partitions), then the migration's transaction ${f(ms)} ms, then the first connect() ${f(connectMs)} ms`,
        );
        report(times, [
          ["before", "before"],
          ["ahead", "during the build ahead"],
          ["migration", "begun during the migration"],
        ]);
      } else {
        say(
          `  ${name}, built in its migration: the migration's transaction ${f(ms)} ms, then the first connect() ${f(connectMs)} ms`,
        );
        report(times, [
          ["before", "before"],
          ["migration", "begun during the migration"],
        ]);
      }
    } finally {
      await db.drop();
    }
  }
  return lines;
}

/**
 * datedSearchCost times the migration that gives both body search indexes the periods
 * (docs/performance.md#the-newest-matches-first) on an inbox at the version before it, its rows all indexed (the
 * search table filled, both indexes without the periods built over it), twice, on two fills: the migration alone in
 * its transaction, as migrateTo runs it (both built with the search table locked), and after prepareDatedSearch
 * built them ahead (timed apart), then the first connect(). Beside it a searcher asks for one delivery by its JSON,
 * one search at a time, each timed under the phase it began in, and an old host stores one delivery at a time.
 */
async function datedSearchCost(rows: number): Promise<string[]> {
  const lines: string[] = [];
  const say = (line: string) => void (console.log(line), lines.push(line));
  const name = `PostgreSQL upgrade to ${UPGRADES.dated.name} at ${f(rows)} indexed`;
  const version = MIGRATIONS.findIndex((m) => m.includes(UPGRADES.dated.mark));
  const filled = async () => {
    const db = await filledBefore(rows, UPGRADES.dated.mark);
    await onInbox(db.url, async (client) => {
      // Every row indexed, as a backfill leaves them; the indexes built once over them rather than row by row.
      await client.query("DROP INDEX deliveries_search_json; DROP INDEX deliveries_search_words");
      await client.query(
        "INSERT INTO deliveries_search (source, id, doc) SELECT source, id, convert_from(body, 'UTF8')::jsonb FROM deliveries WHERE route = 0",
      );
      await client.query(`UPDATE search_state SET enabled = true, done = true;
        CREATE INDEX deliveries_search_json ON deliveries_search USING gin (doc jsonb_path_ops);
        CREATE INDEX deliveries_search_words ON deliveries_search USING gin
          (jsonb_to_tsvector('simple'::regconfig, doc, '["string", "numeric", "boolean"]'::jsonb))`);
      await client.query("VACUUM (ANALYZE) deliveries_search");
      await client.query("CHECKPOINT");
    });
    return db;
  };
  // One search at a time by a delivery's ID in its JSON, through the JSON index, timed under the phase it began in.
  const searcher = async (url: string) => {
    const client = new pg.Client({ connectionString: url, options: "-c search_path=inbox" });
    await client.connect();
    const times = new Map<string, number[]>();
    let phase = "before";
    let running = true;
    const loop = (async () => {
      for (let k = 0; running; k++) {
        const during = phase;
        const started = performance.now();
        const needle = JSON.stringify({ id: `evt_${(k * 7919) % rows}` });
        await client.query("SELECT source, id FROM deliveries_search WHERE doc @> $1::jsonb LIMIT 20", [needle]);
        const list = times.get(during) ?? [];
        list.push(performance.now() - started);
        times.set(during, list);
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    })();
    return {
      phase: (name: string) => void (phase = name),
      stop: async () => {
        running = false;
        await loop;
        await client.end();
        return times;
      },
    };
  };
  for (const ahead of [false, true]) {
    const db = await filled();
    try {
      const host = await oldHost(db.url);
      const search = await searcher(db.url);
      const phase = (name: string) => (host.phase(name), search.phase(name));
      await new Promise((resolve) => setTimeout(resolve, 2_000));
      let aheadMs = 0;
      let built = 0;
      if (ahead) {
        phase("ahead");
        const started = performance.now();
        built = await onInbox(db.url, (session) => prepareDatedSearch(session, "inbox"));
        aheadMs = performance.now() - started;
        phase("between");
        await new Promise((resolve) => setTimeout(resolve, 1_000));
      }
      phase("migration");
      const ms = await onInbox(db.url, (client) =>
        migrationAlone(client, version, "SELECT pg_advisory_xact_lock(hashtext('webhook-inbox:inbox'))"),
      );
      phase("after");
      await new Promise((resolve) => setTimeout(resolve, 1_000));
      const [stores, searches] = [await host.stop(), await search.stop()];
      say(
        ahead
          ? `  ${name}, built ahead: the builds ${f(aheadMs)} ms (${built} indexes), then the migration's transaction ${f(ms)} ms`
          : `  ${name}, built in its migration: the migration's transaction ${f(ms)} ms`,
      );
      const phases: [string, string][] = ahead
        ? [
            ["before", "before"],
            ["ahead", "during the builds ahead"],
            ["migration", "begun during the migration"],
          ]
        : [
            ["before", "before"],
            ["migration", "begun during the migration"],
          ];
      for (const [p, what] of phases) {
        say(`    ${what}: ${latencies(searches.get(p), "searches")}`);
        say(`    ${" ".repeat(what.length)}  ${latencies(stores.get(p))}`);
      }
    } finally {
      await db.drop();
    }
  }
  return lines;
}

/** stored runs every size on every backend and returns the summary. */
export async function stored(): Promise<string> {
  const lines: string[] = [];
  const { dir, cleanup } = tempDir();
  try {
    for (const target of await inboxTargets()) {
      console.log(`\nstored on ${target.name}: ${f(N)} new deliveries stored and drained beside S done ones`);
      // A round thrown away first: the first on a target paid its start-up (the JIT, the server's caches), which
      // made the empty inbox, measured first, look slower than a full one.
      const warm = await target.fresh(dir, "stored_warm");
      await once(warm.db, 0).finally(() => warm.drop());
      let empty: Round | undefined;
      for (const size of SIZES) {
        const { db, drop } = await target.fresh(dir, `stored_${size}`);
        try {
          const r = await once(db, size);
          empty ??= r;
          const perMillion = size > 0 ? `${f(((r.bytes / size) * 1e6) / 2 ** 20)} MB per million stored` : "";
          const line =
            `  ${target.name.padEnd(10)} S=${f(size).padStart(8)}  ingest ${f(r.ingest).padStart(6)}/s (×${f(r.ingest / empty.ingest, 2)}), ` +
            `${f(r.ingestCpu)} µs CPU (×${f(r.ingestCpu / empty.ingestCpu, 2)})` +
            `  drain ${f(r.drain).padStart(6)}/s (×${f(r.drain / empty.drain, 2)}), ${f(r.drainCpu)} µs CPU (×${f(r.drainCpu / empty.drainCpu, 2)})` +
            (size > 0 ? `  fill ${f(r.fillS, 1)} s  ${perMillion}` : "");
          console.log(line);
          lines.push(line);
        } finally {
          await drop();
        }
      }
    }
    // BENCH_UPGRADE_ROWS sets the upgrade's size apart from the largest S, as a fill of ten million twice is most of an hour.
    const upgrades = (process.env.BENCH_UPGRADES ?? "bodies,history,failed,dated,sqlite")
      .split(",")
      .map((u) => u.trim());
    for (const u of upgrades)
      if (!(u in UPGRADES) && u !== "sqlite")
        throw new TypeError(`BENCH_UPGRADES: expected some of bodies,history,failed,dated,sqlite, got ${u}`);
    const rows = knob("BENCH_UPGRADE_ROWS", Math.max(...SIZES));
    if (upgrades.includes("sqlite") && (await inboxTargets()).some((t) => t.name === "SQLite"))
      lines.push(sqliteUpgradeCost(rows, dir));
    if ((await inboxTargets()).some((t) => t.name === "PostgreSQL"))
      for (const to of ["bodies", "history"] as const)
        if (upgrades.includes(to)) lines.push(...(await upgradeCost(rows, to)));
    if (upgrades.includes("failed") && (await inboxTargets()).some((t) => t.name === "PostgreSQL"))
      lines.push(...(await failedIndexCost(rows)));
    if (upgrades.includes("dated") && (await inboxTargets()).some((t) => t.name === "PostgreSQL"))
      lines.push(...(await datedSearchCost(rows)));
  } finally {
    cleanup();
  }
  return `stored (ratios against an empty inbox, the same run):\n${lines.join("\n")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1]!).href) console.log(`\n${await stored()}`);
