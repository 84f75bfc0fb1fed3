// bench/listing.ts: does listing stay fast in a full inbox? On each backend (bench/targets.ts) an inbox is filled
// through its bulk path with BENCH_LISTING_ROWS (1,000,000; BENCH_TEN_MILLION=1 makes it 10,000,000) deliveries
// received over 30 days: Stripe- and GitHub-shaped bodies of about 1 KB from three sources, 96% done, 2% failed,
// 2% waiting for a retry. Then it times the operator's lists, a page of 50 newest first as the page and the API
// ask for them (search() without bodies), each kind over BENCH_LISTING_QUERIES (200) variants (a random source, hour or
// cursor): warm (each variant run once before it is timed) and cold (the OS page cache dropped, SQLite's
// connection opened afresh, and variants no query touched before). Prints p50/p99 of each beside the issue's
// goal (p99 ≤ 20 ms) and the plan the backend chose for it. Cold needs root (it writes
// /proc/sys/vm/drop_caches); elsewhere it says so and measures warm only. PostgreSQL's own 128 MB of shared
// buffers is not emptied: a cold variant reads pages no query read before, which those buffers do not hold.
// BENCH_LISTING_COLD=0 measures warm only (while another bench runs, whose cache it would empty).
//   npm run bench -- listing
//   BENCH_TEN_MILLION=1 npm run bench -- listing

import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { connect } from "../inbox.ts";
import { toPg } from "../lib/postgres/commit.ts";
import { sha256 } from "../lib/rows.ts";
import { filterSql, searchSql } from "../lib/sql.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import type { Cursor, Filter, Inbox } from "../lib/store.ts";
import { f, flushFill, knob, tempDir } from "./common.ts";
import { makeDays, stripeLike } from "./stored.ts";
import { inboxTargets } from "./targets.ts";

const ROWS = knob("BENCH_LISTING_ROWS", process.env.BENCH_TEN_MILLION === "1" ? 10_000_000 : 1_000_000);
const QUERIES = knob("BENCH_LISTING_QUERIES", 200);
const DAYS = 30;
const HOUR = 3_600_000;
const SPAN = DAYS * 86_400_000;
const SOURCES = ["stripe", "github", "shopify"];

// githubLike is a push event of about 1 KB, as GitHub sends it, its IDs made from i.
function githubLike(i: number): Buffer {
  return Buffer.from(
    JSON.stringify({
      ref: "refs/heads/main",
      before: (i * 7919).toString(16).padStart(40, "0"),
      after: (i * 104_729).toString(16).padStart(40, "0"),
      repository: {
        id: 1_000 + (i % 300),
        name: `service-${i % 300}`,
        full_name: `acme/service-${i % 300}`,
        private: true,
        owner: { login: "acme", id: 42, type: "Organization" },
        default_branch: "main",
      },
      pusher: { name: `dev${i % 97}`, email: `dev${i % 97}@acme.example` },
      sender: { login: `dev${i % 97}`, id: 5_000 + (i % 97), type: "User" },
      head_commit: {
        id: (i * 104_729).toString(16).padStart(40, "0"),
        message: `Fix the retry of order ${i} when the ledger times out`,
        timestamp: "2026-12-06T10:00:00Z",
        author: { name: `Dev ${i % 97}`, email: `dev${i % 97}@acme.example` },
        added: [],
        removed: [],
        modified: [`src/orders/${i % 50}.ts`],
      },
    }),
  );
}

// The row i of the synthetic inbox, the same on both backends: its source, type, status and time.
function shape(i: number, t0: number) {
  const source = SOURCES[i % 3]!;
  const status = i % 50 === 0 ? "failed" : i % 50 === 1 ? "received" : "done";
  const type = source === "github" ? "push" : i % 2 === 0 ? "charge.succeeded" : "invoice.paid";
  return { source, status, type, at: t0 + Math.floor((i * SPAN) / ROWS) };
}

function fillSqlite(path: string, t0: number): void {
  openDatabase(path).close();
  const db = new DatabaseSync(path);
  db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
  const insert = db.prepare(
    `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, received_at, status, attempts,
                             available_at, error, finished_at)
     VALUES (?, ?, ?, ?, 'application/json', ?, ?, ?, ?, ?, ?, ?)`,
  );
  for (let start = 0; start < ROWS; start += 50_000) {
    db.exec("BEGIN");
    for (let i = start; i < Math.min(ROWS, start + 50_000); i++) {
      const s = shape(i, t0);
      const body = s.source === "github" ? githubLike(i) : stripeLike(i);
      insert.run(
        s.source,
        `evt_${i}`,
        body,
        sha256(body),
        s.type,
        s.at,
        s.status,
        s.status === "done" ? 1 : 3,
        s.status === "received" ? s.at + 10 * SPAN : s.at,
        s.status === "done" ? null : "HTTP 500 from upstream",
        s.status === "received" ? null : s.at + 50,
      );
    }
    db.exec("COMMIT");
  }
  db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  db.exec("ANALYZE");
  db.close();
  flushFill(path);
}

// fillPostgres writes the same rows as fillSqlite, generated by the server, straight into delivery_rows and
// delivery_bodies as store() writes them (docs/table.md#bodies-apart), 100,000 a statement.
async function fillPostgres(inbox: Inbox, t0: number): Promise<void> {
  const cut = (sample: string, id: string) => [
    sample.slice(0, sample.indexOf(id)),
    sample.slice(sample.indexOf(id) + id.length),
  ];
  const [sh, st] = cut(stripeLike(0).toString("utf8"), '"evt_0"');
  const [gh, gt] = cut(githubLike(0).toString("utf8"), '"acme/service-0"');
  await makeDays(inbox, t0, t0 + SPAN);
  for (let start = 0; start < ROWS; start += 100_000) {
    await inbox.query(
      `WITH g AS (
         SELECT i, (ARRAY['stripe','github','shopify'])[i % 3 + 1] AS s,
                CASE WHEN i % 50 = 0 THEN 'failed' WHEN i % 50 = 1 THEN 'received' ELSE 'done' END AS st,
                ?::bigint + (i * ?::bigint) / ?::bigint AS t
         FROM generate_series(?::bigint, ?::bigint) AS i),
       b AS (
         SELECT g.*, convert_to(CASE WHEN s = 'github' THEN ? || '"acme/service-' || (i % 300) || '"' || ?
                                     ELSE ? || '"evt_' || i || '"' || replace(?, '_0"', '_' || i || '"') END, 'UTF8') AS body
         FROM g),
       r AS (
         INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, received_at, status, attempts,
                                    available_at, error, finished_at)
         SELECT s, 'evt_' || i, '\\x'::bytea, encode(sha256(body), 'hex'), 'application/json',
                CASE WHEN s = 'github' THEN 'push' WHEN i % 2 = 0 THEN 'charge.succeeded' ELSE 'invoice.paid' END, t, st,
                CASE WHEN st = 'done' THEN 1 ELSE 3 END, CASE WHEN st = 'received' THEN t + 10 * ?::bigint ELSE t END,
                CASE WHEN st = 'done' THEN NULL ELSE 'HTTP 500 from upstream' END, CASE WHEN st = 'received' THEN NULL ELSE t + 50 END
         FROM b)
       INSERT INTO delivery_bodies (source, id, route, received_at, body) SELECT s, 'evt_' || i, 0, t, body FROM b`,
      t0,
      SPAN,
      ROWS,
      start,
      Math.min(ROWS, start + 100_000) - 1,
      gh,
      gt,
      sh,
      st,
      SPAN,
    );
  }
  await inbox.query("VACUUM (ANALYZE) delivery_rows");
  await inbox.query("VACUUM (ANALYZE) delivery_bodies");
  await inbox.query("CHECKPOINT");
}

// dropCaches empties the OS page cache, or says why it cannot.
function dropCaches(): string | undefined {
  if (process.env.BENCH_LISTING_COLD === "0") return "BENCH_LISTING_COLD=0";
  try {
    execFileSync("sync");
    writeFileSync("/proc/sys/vm/drop_caches", "3");
    return undefined;
  } catch (error) {
    return (error as Error).message.split("\n")[0];
  }
}

// A kind of list: the filter and cursor of its variant k (k counts from 0; cold variants come after warm ones).
interface Kind {
  name: string;
  variant(k: number, t0: number): { filter: Filter; after?: Cursor };
}

// pick spreads variant k over the 30 days without repeating: the golden ratio's steps fill [0, 1) evenly.
const pick = (k: number) => (k * 0.618_033_988_749_895) % 1;

const KINDS: Kind[] = [
  { name: "newest of a source", variant: (k) => ({ filter: { source: SOURCES[k % 3]! } }) },
  {
    name: "a source, before a time",
    variant: (k, t0) => ({ filter: { source: SOURCES[k % 3]!, until: t0 + Math.floor(pick(k) * SPAN) } }),
  },
  {
    name: "failed, before a time",
    variant: (k, t0) => ({ filter: { status: "failed", until: t0 + Math.floor(pick(k) * SPAN) } }),
  },
  {
    name: "a source's failed, before",
    variant: (k, t0) => ({
      filter: { status: "failed", source: SOURCES[k % 3]!, until: t0 + Math.floor(pick(k) * SPAN) },
    }),
  },
  {
    name: "an hour",
    variant: (k, t0) => {
      const since = t0 + Math.floor(pick(k) * (SPAN - HOUR));
      return { filter: { since, until: since + HOUR } };
    },
  },
  {
    name: "a source's next page",
    variant: (k, t0) => ({
      filter: { source: SOURCES[k % 3]! },
      after: { receivedAt: t0 + Math.floor(pick(k) * SPAN), source: SOURCES[k % 3]!, id: "evt_~" },
    }),
  },
  { name: "one ID", variant: (k) => ({ filter: { id: `evt_${Math.floor(pick(k) * ROWS)}` } }) },
];

const quantile = (ms: number[], q: number) =>
  [...ms].sort((a, b) => a - b)[Math.min(ms.length - 1, Math.floor(q * ms.length))]!;

async function timeKind(inbox: Inbox, kind: Kind, from: number, t0: number, warmFirst: boolean): Promise<number[]> {
  const ms: number[] = [];
  for (let k = from; k < from + QUERIES; k++) {
    const { filter, after } = kind.variant(k, t0);
    // As the page and the API list: no bodies (a list shows none).
    const page = after ? { after, limit: 50, bodies: false } : { limit: 50, bodies: false };
    if (warmFirst) await inbox.search(filter, page);
    const started = performance.now();
    await inbox.search(filter, page);
    ms.push(performance.now() - started);
  }
  return ms;
}

// plan is the backend's plan for a kind's first variant, one line per step, as search() words its query.
async function plan(inbox: Inbox, kind: Kind, t0: number): Promise<string> {
  const { filter, after } = kind.variant(0, t0);
  // search()'s own statement (lib/sql.ts), as it runs for this kind's first variant.
  const { sql, params } = searchSql(inbox.backend, filterSql(filter, inbox.backend), {
    ...(after ? { after } : {}),
    limit: 50,
    bodies: false,
  });
  const rows =
    inbox.backend === "postgres"
      ? await inbox.query(toPg(`EXPLAIN (COSTS OFF) ${sql}`), ...params)
      : await inbox.query(`EXPLAIN QUERY PLAN ${sql}`, ...params);
  return rows.map((r) => `      ${String(r["QUERY PLAN"] ?? r.detail)}`).join("\n");
}

/** listing fills each backend, times its lists warm and cold, and returns the summary. */
export async function listing(): Promise<string> {
  const lines: string[] = [];
  const { dir, cleanup } = tempDir();
  try {
    for (const target of await inboxTargets()) {
      const t0 = Date.now() - SPAN;
      const { db, drop } = await target.fresh(dir, "listing");
      try {
        const started = performance.now();
        if (target.name === "SQLite") fillSqlite(db, t0);
        let inbox = await connect(db);
        if (target.name === "PostgreSQL") await fillPostgres(inbox, t0);
        const fillS = (performance.now() - started) / 1000;
        console.log(`\nlisting on ${target.name}: ${f(ROWS)} deliveries over ${DAYS} days, filled in ${f(fillS, 1)} s`);
        lines.push(`  ${target.name}, ${f(ROWS)} deliveries:`);
        const cold: string | undefined = dropCaches();
        if (cold !== undefined) console.log(`  cold not measured: ${cold}`);
        for (const [i, kind] of KINDS.entries()) {
          // Cold first, on variants no query touched, right after the cache is emptied for this kind.
          let coldMs: number[] | undefined;
          if (cold === undefined) {
            await inbox.close();
            dropCaches();
            inbox = await connect(db);
            coldMs = await timeKind(inbox, kind, (i + 1) * 100_000, t0, false);
          }
          const warmMs = await timeKind(inbox, kind, 0, t0, true);
          const line =
            `  ${target.name.padEnd(10)} ${kind.name.padEnd(26)} warm p50 ${f(quantile(warmMs, 0.5), 2).padStart(6)} p99 ${f(quantile(warmMs, 0.99), 2).padStart(6)} ms` +
            (coldMs
              ? `   cold p50 ${f(quantile(coldMs, 0.5), 2).padStart(6)} p99 ${f(quantile(coldMs, 0.99), 2).padStart(6)} ms`
              : "") +
            "   (goal p99 ≤ 20 ms)";
          console.log(line);
          console.log(await plan(inbox, kind, t0));
          lines.push(line);
        }
        await inbox.close();
      } finally {
        await drop();
      }
    }
  } finally {
    cleanup();
  }
  return `listing (a page of 50, ${f(QUERIES)} variants a kind, ${f(ROWS)} stored):\n${lines.join("\n")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1]!).href) console.log(`\n${await listing()}`);
