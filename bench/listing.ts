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
// BENCH_LISTING_SEARCH=1 adds body search (lib/search.ts) on the same inbox: the search index filled in bulk as
// the fill ends (searchInBulkSqlite(), searchAfterPgFill()), its time and size, then each search form timed warm and cold as the lists are,
// beside issue 51's goals (JSON containment p99 ≤ 50 ms, words and substrings ≤ 200 ms), with its plan
// (PostgreSQL: EXPLAIN (ANALYZE, BUFFERS)). BENCH_LISTING_LISTS=0 leaves the lists out;
// BENCH_LISTING_SEARCH_ONLY=Words times only the search forms whose name holds it; BENCH_LISTING_COMPARE=1
// checks the SQLite bulk fill's index against `search enable`'s, on a copy (at a small BENCH_LISTING_ROWS).
// BENCH_LISTING_KEEP=1 keeps the filled inbox (KEPT_FILE, database KEPT_DB) and measures it again on the next run
// instead of filling.
// On SQLite the index is filled in bulk with FTS5's merging off and measured in the segments the fill wrote, about
// as many as the worker's leaves; BENCH_LISTING_FTS_OPTIMIZE=1 merges them into one ('optimize') first.
//   npm run bench -- listing
//   BENCH_TEN_MILLION=1 npm run bench -- listing
//   BENCH_TEN_MILLION=1 BENCH_LISTING_SEARCH=1 BENCH_LISTING_LISTS=0 npm run bench -- listing

import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { copyFileSync, existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import pg from "pg";
import { connect } from "../inbox.ts";
import { toPg } from "../lib/postgres/commit.ts";
import { sha256 } from "../lib/rows.ts";
import { listWindows } from "../lib/postgres/reads.ts";
import { readsBodies, SearchTooBroad } from "../lib/search.ts";
import { filterSql, idKeysSql, searchSql } from "../lib/sql.ts";
import { openDatabase } from "../lib/sqlite/schema.ts";
import { INDEXABLE, WORDS } from "../lib/sqlite/searching.ts";
import type { Cursor, Filter, Inbox } from "../lib/store.ts";
import { f, flushFill, knob, tempDir } from "./common.ts";
import { makeDays, stripeLike } from "./stored.ts";
import { PG_URL, freshDatabase } from "./peers/pgdb.ts";
import { inboxTargets } from "./targets.ts";

const ROWS = knob("BENCH_LISTING_ROWS", process.env.BENCH_TEN_MILLION === "1" ? 10_000_000 : 1_000_000);
const QUERIES = knob("BENCH_LISTING_QUERIES", 200);
const SEARCH = process.env.BENCH_LISTING_SEARCH === "1";
const LISTS = process.env.BENCH_LISTING_LISTS !== "0";
const KEEP = process.env.BENCH_LISTING_KEEP === "1";
// BENCH_LISTING_MEASURE=0 with BENCH_LISTING_KEEP=1 fills and keeps the inbox only: two backends filled at once,
// measured one after the other.
const MEASURE = process.env.BENCH_LISTING_MEASURE !== "0";
// Where BENCH_LISTING_KEEP=1 keeps the filled inbox between runs: rm the file, DROP DATABASE the database after.
const KEPT_FILE = join(tmpdir(), "inbox-bench-listing-kept.db");
const KEPT_DB = "bench_listing_kept";
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
         FROM b),
       k AS (INSERT INTO delivery_keys (source, id, route, received_at) SELECT s, 'evt_' || i, 0, t FROM g)
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

/** Timed is a kind's variants timed: each one's ms, and how many the search's bound refused (SearchTooBroad). */
interface Timed {
  ms: number[];
  refused: number;
}

// listed runs one list or search as the page and the API ask for it, and says whether the search's bound
// (DEFAULTS.searchTimeoutMs) refused it: at ten million a repository's pushes cold, or a day's bodies, can
// pass it, and the bench counts it (timed as long as it ran) and goes on, as bench/bodysearch.ts does.
async function listed(inbox: Inbox, filter: Filter, page: { after?: Cursor; limit: number; bodies: boolean }) {
  try {
    await inbox.search(filter, page);
    return false;
  } catch (error) {
    if (error instanceof SearchTooBroad) return true;
    throw error;
  }
}

async function timeKind(
  inbox: Inbox,
  kind: Kind,
  from: number,
  t0: number,
  warmFirst: boolean,
  n = QUERIES,
): Promise<Timed> {
  const ms: number[] = [];
  let refused = 0;
  for (let k = from; k < from + n; k++) {
    const { filter, after } = kind.variant(k, t0);
    // As the page and the API list: no bodies (a list shows none).
    const page = after ? { after, limit: 50, bodies: false } : { limit: 50, bodies: false };
    if (warmFirst) await listed(inbox, filter, page);
    const started = performance.now();
    if (await listed(inbox, filter, page)) refused++;
    ms.push(performance.now() - started);
  }
  return { ms, refused };
}

// refusedNote says how many of a kind's variants the search's bound refused, when any was.
const refusedNote = (timed: Timed | undefined, when: string) =>
  timed && timed.refused > 0 ? `, ${timed.refused} refused at the bound ${when}` : "";

// plan is the backend's plan for a kind's variant k (its first unless said), one line per step, as search() words
// its query; analyze makes PostgreSQL's EXPLAIN (ANALYZE, BUFFERS): what it read, and from where. On PostgreSQL a
// list's is its first statement's, its newest day's (listWindows()), and an ID's the one after its keys are read.
async function plan(inbox: Inbox, kind: Kind, t0: number, k = 0, analyze = false): Promise<string> {
  const { filter, after } = kind.variant(k, t0);
  let where = filterSql(filter, inbox.backend);
  if (inbox.backend === "postgres" && filter.id !== undefined) {
    const probe = idKeysSql(filter.id, filter.source);
    const keys = (await inbox.query(probe.sql, ...probe.params))[0]!;
    if (keys.sources !== null)
      where = filterSql(filter, "postgres", {
        sources: keys.sources as string[],
        first: Number(keys.first),
        last: Number(keys.last),
      });
  } else if (inbox.backend === "postgres" && !readsBodies(filter))
    where = filterSql(listWindows(filter, after, Date.now())[0]!, "postgres");
  // search()'s own statement (lib/sql.ts), as it runs for this kind's first variant. A body search with many
  // matches is walked a window a statement instead (lib/postgres/searchwalk.ts): this is the one statement a
  // needle with few runs, and the one the walk's windows narrow. On SQLite every body search's page is
  // walkedPage()'s (lib/sqlite/searchwalk.ts): a needle with few matches sorts the rowids its count found, as
  // this statement sorts those FTS5 finds, and one with many walks the time index (its plan in
  // docs/performance.md#on-sqlite-a-window-of-the-time-index-at-a-time).
  const { sql, params } = searchSql(inbox.backend, where, {
    ...(after ? { after } : {}),
    limit: 50,
    bodies: false,
  });
  const rows =
    inbox.backend === "postgres"
      ? await inbox.query(
          toPg(`EXPLAIN (${analyze ? "ANALYZE, BUFFERS, TIMING OFF, " : ""}COSTS OFF) ${sql}`),
          ...params,
        )
      : await inbox.query(`EXPLAIN QUERY PLAN ${sql}`, ...params);
  return rows.map((r) => `      ${String(r["QUERY PLAN"] ?? r.detail)}`).join("\n");
}

// Body search (BENCH_LISTING_SEARCH=1). The needles come from the fill's own bodies: stripeLike's customer is
// one of 50,000 (each in ~130 Stripe-shaped bodies at ten million), its charge (ch_i) and order are row i's
// alone, githubLike's repository one of 300 (each in ~11,000 pushes).
const DAY = 86_400_000;
const CUSTOMERS = 50_000;
const REPOS = 300;
// stripeRow is a row with a Stripe-shaped body (every source but github, i % 3 = 1) at variant k's place.
const stripeRow = (k: number) => {
  const i = Math.floor(pick(k) * ROWS);
  return i % 3 === 1 ? i - 1 : i;
};

/** SearchKind is a search form timed as the lists are: n variants, beside its goal's p99 in ms. */
interface SearchKind extends Kind {
  goal: number;
  n: number;
}

const SEARCH_KINDS: SearchKind[] = [
  {
    name: "bodyJson a customer",
    goal: 50,
    n: QUERIES,
    variant: (k) => ({
      filter: {
        bodyJson: JSON.stringify({ data: { object: { customer: `cus_${Math.floor(pick(k) * CUSTOMERS)}` } } }),
      },
    }),
  },
  {
    name: "bodyJson a charge",
    goal: 50,
    n: QUERIES,
    variant: (k) => ({ filter: { bodyJson: JSON.stringify({ data: { object: { id: `ch_${stripeRow(k)}` } } }) } }),
  },
  {
    // Every one of ~11,000 matches is read (and on SQLite rechecked): a tenth of the variants.
    name: "bodyJson a repository",
    goal: 50,
    n: Math.max(10, Math.floor(QUERIES / 10)),
    variant: (k) => ({
      filter: {
        bodyJson: JSON.stringify({ repository: { full_name: `acme/service-${Math.floor(pick(k) * REPOS)}` } }),
      },
    }),
  },
  {
    name: "bodyWords a charge ID",
    goal: 200,
    n: QUERIES,
    variant: (k) => ({ filter: { bodyWords: `ch_${stripeRow(k)}` } }),
  },
  {
    name: "bodyWords a customer ID",
    goal: 200,
    n: QUERIES,
    variant: (k) => ({ filter: { bodyWords: `cus_${Math.floor(pick(k) * CUSTOMERS)}` } }),
  },
  {
    // A repository's name as words: as many matches as its JSON (a phrase of its parts, acme/service-N).
    name: "bodyWords a repository",
    goal: 200,
    n: Math.max(10, Math.floor(QUERIES / 10)),
    variant: (k) => ({ filter: { bodyWords: `acme/service-${Math.floor(pick(k) * REPOS)}` } }),
  },
  {
    name: "bodyWords an order's words",
    goal: 200,
    n: QUERIES,
    variant: (k) => ({ filter: { bodyWords: `Order ${stripeRow(k)}` } }),
  },
  {
    // A charge ID in quotes, so that one body matches and the day's every body is read: the worst a day costs.
    // A tenth of the variants: each reads a day's bodies.
    name: "bodyContains a charge, its day",
    goal: 200,
    n: Math.max(5, Math.floor(QUERIES / 20)),
    variant: (k, t0) => {
      const i = stripeRow(k);
      const since = t0 + Math.floor(Math.floor((i * SPAN) / ROWS) / DAY) * DAY;
      return { filter: { bodyContains: `"ch_${i}"`, since, until: since + DAY } };
    },
  },
];

// pgSession is a connection of its own to a PostgreSQL inbox, for the bulk fill's settings and parallel steps.
async function pgSession(db: string): Promise<pg.Client> {
  const url = new URL(db);
  const schema = url.searchParams.get("schema") ?? "public";
  url.search = "";
  const client = new pg.Client({ connectionString: url.toString() });
  await client.connect();
  await client.query(`SET search_path TO ${schema}`);
  // Generous for a bulk build (the server's default is 64 MB): a GIN build sorts its entries in this memory.
  await client.query("SET maintenance_work_mem = '2GB'");
  return client;
}

/** SearchFill is what the PostgreSQL bulk fill keeps from before the rows to after them: the GIN indexes it took off. */
interface SearchFill {
  indexes: { name: string; definition: string }[];
}

// searchBeforePgFill turns the search index on while the inbox is still empty, as `search enable` does (its
// triggers, its state: nothing to backfill), then takes off what makes a bulk load slow: the insert trigger that
// queues each key for the indexer, and the GIN indexes, whose definitions it reads from the database, as the
// schema's migration made them, to make them again after.
async function searchBeforePgFill(inbox: Inbox): Promise<SearchFill> {
  await inbox.enableSearch();
  await inbox.query("DROP TRIGGER deliveries_search_insert ON delivery_rows");
  const indexes = (
    await inbox.query(
      `SELECT indexname AS name, indexdef AS definition FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename = 'deliveries_search' AND indexname <> 'deliveries_search_pkey'`,
    )
  ).map((r) => ({ name: String(r.name), definition: String(r.definition) }));
  for (const index of indexes) await inbox.query(`DROP INDEX ${index.name}`);
  return { indexes };
}

// seconds runs a step and says how long it took.
async function seconds<T>(step: () => Promise<T>): Promise<{ value: T; s: number }> {
  const started = performance.now();
  const value = await step();
  return { value, s: (performance.now() - started) / 1000 };
}

// searchAfterPgFill copies every body's JSON into deliveries_search through the indexer's own function
// (inbox_search_json), a day's partition a statement, two sessions at once; vacuums it; builds the GIN indexes,
// both at once, with maintenance_work_mem at 2 GB; puts the insert trigger back; and returns what each step cost.
async function searchAfterPgFill(inbox: Inbox, db: string, fill: SearchFill): Promise<string[]> {
  const days = (
    await inbox.query("SELECT relid::regclass::text AS name FROM pg_partition_tree('delivery_bodies') WHERE isleaf")
  ).map((r) => String(r.name));
  const sessions = [await pgSession(db), await pgSession(db)];
  try {
    // Every row of the fill is route 0 and none is purged, which the indexer's copy checks in delivery_rows.
    const copied = await seconds(() =>
      Promise.all(
        sessions.map(async (client) => {
          let n = 0;
          for (let day = days.shift(); day !== undefined; day = days.shift()) {
            const r = await client.query(
              `INSERT INTO deliveries_search (source, id, doc)
                 SELECT b.source, b.id, j FROM ${day} b CROSS JOIN LATERAL inbox_search_json(b.body) AS j
                 WHERE b.route = 0 AND j IS NOT NULL`,
            );
            n += r.rowCount ?? 0;
          }
          return n;
        }),
      ),
    );
    const n = copied.value.reduce((a, b) => a + b, 0);
    console.log(`  deliveries_search: ${f(n)} bodies copied in ${f(copied.s, 1)} s`);
    const vacuumed = await seconds(() => sessions[0]!.query("VACUUM (ANALYZE) deliveries_search"));
    const built = await Promise.all(
      fill.indexes.map((index, k) => seconds(() => sessions[k % 2]!.query(index.definition))),
    );
    await inbox.query(
      `CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
         REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue()`,
    );
    await inbox.query("UPDATE search_state SET backfilled = ?, to_backfill = ?", n, n);
    await inbox.query("ANALYZE deliveries_search");
    await inbox.query("CHECKPOINT");
    const mib = async (sql: string, ...params: string[]) =>
      f(Number((await inbox.query(sql, ...params))[0]!.b) / 2 ** 20);
    const lines = [
      `  search index filled in bulk: ${f(n)} bodies copied through inbox_search_json() in ${f(copied.s, 1)} s (two sessions, a day's partition a statement), VACUUM (ANALYZE) ${f(vacuumed.s, 1)} s`,
      ...(await Promise.all(
        fill.indexes.map(
          async (index, k) =>
            `    ${index.name} built in ${f(built[k]!.s, 1)} s (beside the other, maintenance_work_mem 2 GB), ${await mib("SELECT pg_relation_size(?) AS b", index.name)} MiB: ${index.definition}`,
        ),
      )),
      `    deliveries_search ${await mib("SELECT pg_total_relation_size('deliveries_search') AS b")} MiB in all (its heap ${await mib("SELECT pg_relation_size('deliveries_search') AS b")} MiB, TOAST and primary key besides)`,
    ];
    return lines;
  } finally {
    for (const client of sessions) await client.end();
  }
}

// The SQLite bulk search fill (searchInBulkSqlite): the rows a transaction takes, and FTS5's in-memory buffer while
// it fills ('hashsize', 1 MB by default, flushed as a segment of its own each time it fills, and at each commit):
// 512 MB holds a million rows' entries, so each transaction writes one segment, where the worker's 1,000 rows
// a transaction write a segment each.
const BULK_ROWS = 1_000_000;
const BULK_HASH_BYTES = 512 * 2 ** 20;
// BENCH_LISTING_FTS_OPTIMIZE=1 merges SQLite's FTS5 index into one segment ('optimize') after the bulk fill, or on a
// kept inbox before it is measured; by default it is measured in the segments the fill wrote, about as many as the
// worker's. At ten million the merge was stopped after 7 minutes a fifth of the way through (docs/performance.md).
const OPTIMIZE = process.env.BENCH_LISTING_FTS_OPTIMIZE === "1";

// searchInBulkSqlite turns the index on as `search enable` does on a filled inbox (the switch, the backfill's goal
// until_rowid: every row), then indexes every body with the indexer's own statement (WORDS and INDEXABLE from
// lib/sqlite/searching.ts: json_tree over each body into the FTS5 table), BULK_ROWS rows a transaction that moves
// the place (done_rowid, backfilled) as indexSearch() moves it, so that it leaves search_state as the backfill
// would, and an interrupted fill carries on from the place. The indexer itself slowed at ten million (about 450 µs
// a row by 7,000,000, each batch slower than the last; not profiled), as FTS5's upkeep grows: its 1 MB buffer
// written as a small segment every few thousand rows, and automerge merging those into ever larger ones, each
// row's entries rewritten again and again. So while it fills, automerge is off, crisismerge at its ceiling and
// the buffer 512 MB: each transaction writes one segment, and none is merged. Then the three settings go back to
// FTS5's defaults (FTS5 keeps them in its config table, which is read-only from SQL: they stay as rows holding
// the defaults), and with BENCH_LISTING_FTS_OPTIMIZE=1 the segments are merged into one ('optimize'). The caller
// checkpoints and fsyncs the file after.
function searchInBulkSqlite(path: string): string[] {
  const db = new DatabaseSync(path);
  try {
    db.exec("PRAGMA synchronous = OFF"); // only while filling a throwaway bench database
    const started = performance.now();
    db.prepare(
      `UPDATE search_state SET enabled = 1, changed_at = ?, done_rowid = 0, backfilled = 0,
         until_rowid = (SELECT coalesce(max(rowid), 0) FROM deliveries),
         to_backfill = (SELECT count(*) FROM deliveries WHERE purged_at IS NULL)
        WHERE enabled = 0`,
    ).run(Date.now());
    db.exec(`INSERT INTO deliveries_search (deliveries_search, rank) VALUES ('automerge', 0)`);
    db.exec(`INSERT INTO deliveries_search (deliveries_search, rank) VALUES ('crisismerge', 1999)`);
    db.exec(`INSERT INTO deliveries_search (deliveries_search, rank) VALUES ('hashsize', ${BULK_HASH_BYTES})`);
    const place = db
      .prepare("SELECT done_rowid AS done, (SELECT coalesce(max(rowid), 0) FROM deliveries) AS last FROM search_state")
      .get() as { done: number; last: number };
    if (place.done > 0) console.log(`  carrying on from rowid ${f(place.done)}, where an interrupted fill stopped`);
    const index = db.prepare(
      `INSERT INTO deliveries_search (rowid, words)
         SELECT d.rowid, ${WORDS("d.body")} FROM deliveries d
         WHERE d.rowid > ? AND d.rowid <= ? AND ${INDEXABLE("d.body")}`,
    );
    const move = db.prepare(
      `UPDATE search_state SET done_rowid = ?, backfilled = backfilled + (SELECT count(*) FROM deliveries
         WHERE rowid > ? AND rowid <= min(?, search_state.until_rowid) AND purged_at IS NULL)`,
    );
    let indexed = 0;
    for (let from = place.done; from < place.last; from += BULK_ROWS) {
      const to = Math.min(place.last, from + BULK_ROWS);
      db.exec("BEGIN");
      indexed += Number(index.run(from, to).changes);
      move.run(to, from, to);
      db.exec("COMMIT");
      console.log(`  indexed to rowid ${f(to)}, ${f((performance.now() - started) / 1000, 0)} s`);
    }
    const filledS = (performance.now() - started) / 1000;
    db.exec(`INSERT INTO deliveries_search (deliveries_search, rank) VALUES ('automerge', 4)`);
    db.exec(`INSERT INTO deliveries_search (deliveries_search, rank) VALUES ('crisismerge', 16)`);
    db.exec(`INSERT INTO deliveries_search (deliveries_search, rank) VALUES ('hashsize', 1048576)`);
    const rows = place.last - place.done;
    return [
      `  search index filled in bulk: the indexer's own statement over ${f(rows)} rows (${f(indexed)} bodies indexed${place.done > 0 ? `, from rowid ${f(place.done)}` : ""}), ${f(BULK_ROWS)} a transaction, automerge off and a ${f(BULK_HASH_BYTES / 2 ** 20)} MB buffer, in ${f(filledS, 1)} s (${f((filledS * 1e6) / Math.max(1, rows), 1)} µs a row)`,
      `    as filled: ${ftsShape(db).text}`,
      ...(OPTIMIZE ? optimizedSqlite(db) : []),
    ];
  } finally {
    db.close();
  }
}

// optimizedSqlite merges the FTS5 index into one segment ('optimize') unless it is one already, and says what that
// took and left.
function optimizedSqlite(db: DatabaseSync): string[] {
  if (ftsShape(db).segments <= 1) return [];
  // A 1 GB page cache: the merge reads its segments' pages through FTS5's own lookups, and at SQLite's default
  // 2 MB each was a read() from the OS again and again (600,000 a second, 2.5 GB/s, a segment written in minutes).
  db.exec("PRAGMA cache_size = -1048576");
  const started = performance.now();
  db.exec(`INSERT INTO deliveries_search (deliveries_search) VALUES ('optimize')`);
  return [`    'optimize' in ${f((performance.now() - started) / 1000, 1)} s: ${ftsShape(db).text}`];
}

// ftsShape says how FTS5's index lies: its segments in each level (read from its structure record, the
// %_data row 10, as fts5StructureDecode() reads it: a 4-byte cookie, the version 2 mark, then varints), and its size.
function ftsShape(db: DatabaseSync): { segments: number; text: string } {
  const row = db.prepare("SELECT block FROM deliveries_search_data WHERE rowid = 10").get() as
    | { block: Uint8Array }
    | undefined;
  let levels = "no structure record";
  let segments = 0;
  if (row) {
    const b = row.block;
    let i = 4;
    if (b[4] === 0xff && b[5] === 0 && b[6] === 0 && b[7] === 1) i += 4;
    // SQLite's varint: seven bits a byte, the high bit set while more follow, the ninth byte whole.
    const varint = () => {
      let v = 0;
      for (let k = 0; k < 9; k++) {
        const byte = b[i++]!;
        if (k === 8) return v * 256 + byte;
        v = v * 128 + (byte & 0x7f);
        if (byte < 0x80) return v;
      }
      return v;
    };
    const nLevel = varint();
    segments = varint();
    levels = `${f(segments)} segments in ${f(nLevel)} levels`;
  }
  const pages = (name: string) =>
    Number(
      (db.prepare("SELECT coalesce(sum(pgsize), 0) AS b FROM dbstat WHERE name = ?").get(name) as { b: number }).b,
    );
  const bytes = ["data", "idx", "config", "docsize"].reduce((a, t) => a + pages(`deliveries_search_${t}`), 0);
  const file = Number(
    (
      db.prepare("SELECT page_count * page_size AS b FROM pragma_page_count(), pragma_page_size()").get() as {
        b: number;
      }
    ).b,
  );
  return {
    segments,
    text: `${levels}, the FTS5 index ${f(bytes / 2 ** 20)} MiB of the file's ${f(file / 2 ** 20)} MiB`,
  };
}

// BENCH_LISTING_COMPARE=1 (at a small BENCH_LISTING_ROWS) checks the SQLite bulk fill against the inbox's own
// backfill: comparedWithEnable().
const COMPARE = process.env.BENCH_LISTING_COMPARE === "1";

// comparedWithEnable indexes a copy of the bulk-filled inbox again through `search enable` itself (disable, which
// empties the index, then enable, whose backfill is the indexer at 1,000 rows a transaction), and compares the
// two: every (term, row, offset) FTS5 holds, read through an fts5vocab table; search_state; and the answers of
// the search forms' first variants. It says how each index lies, and removes the copy.
async function comparedWithEnable(path: string, t0: number): Promise<string[]> {
  const copy = `${path}.enable.db`;
  copyFileSync(path, copy);
  try {
    const other = await connect(copy);
    const started = performance.now();
    try {
      await other.disableSearch();
      await other.enableSearch();
    } finally {
      await other.close();
    }
    const enableS = (performance.now() - started) / 1000;
    const digest = (file: string) => {
      const db = new DatabaseSync(file);
      try {
        db.exec("CREATE VIRTUAL TABLE temp.entries USING fts5vocab(main, deliveries_search, instance)");
        const hash = createHash("sha256");
        let n = 0;
        for (const r of db.prepare("SELECT term, doc, offset FROM temp.entries ORDER BY term, doc, offset").iterate()) {
          hash.update(`${r.term}\u0000${r.doc}\u0000${r.offset}\n`);
          n++;
        }
        const state = db
          .prepare("SELECT enabled, until_rowid, done_rowid, backfilled, to_backfill FROM search_state")
          .get();
        return { n, entries: hash.digest("hex"), state: JSON.stringify(state), shape: ftsShape(db).text };
      } finally {
        db.close();
      }
    };
    const [a, b] = [digest(path), digest(copy)];
    let same = 0;
    let searches = 0;
    const bulk = await connect(path);
    const enabled = await connect(copy);
    try {
      for (const kind of SEARCH_KINDS.filter((k) => !k.name.startsWith("bodyContains")))
        for (let k = 1; k <= 5; k++) {
          const { filter } = kind.variant(k, t0);
          const ids = async (inbox: Inbox) =>
            JSON.stringify(
              (await inbox.search(filter, { limit: 1000, bodies: false })).map((d) => `${d.source}/${d.id}`),
            );
          searches++;
          if ((await ids(bulk)) === (await ids(enabled))) same++;
        }
    } finally {
      await bulk.close();
      await enabled.close();
    }
    return [
      `  compared with \`search enable\` on a copy (its backfill ${f(enableS, 1)} s): ${a.entries === b.entries && a.n === b.n ? "the same" : "DIFFERENT"} ${f(a.n)} (term, row, offset) entries (enable's ${f(b.n)}), search_state ${a.state === b.state ? "the same" : `DIFFERENT: ${a.state} against ${b.state}`}, ${f(same)} of ${f(searches)} searches answered the same`,
      `    the bulk fill's index: ${a.shape}`,
      `    search enable's index: ${b.shape}`,
    ];
  } finally {
    for (const end of ["", "-wal", "-shm"]) rmSync(`${copy}${end}`, { force: true });
  }
}

// timeSearches times each search form cold and warm, as the lists are, and prints its plan; it returns the lines.
async function timeSearches(target: string, db: string, inbox: Inbox, t0: number, cold: boolean): Promise<string[]> {
  const lines: string[] = [];
  for (const [i, kind] of SEARCH_KINDS.entries()) {
    // BENCH_LISTING_SEARCH_ONLY=words times only the forms whose name holds it.
    if (!kind.name.includes(process.env.BENCH_LISTING_SEARCH_ONLY ?? "")) continue;
    let coldTimed: Timed | undefined;
    if (cold) {
      await inbox.close();
      dropCaches();
      inbox = await connect(db);
      coldTimed = await timeKind(inbox, kind, (i + 1) * 100_000, t0, false, kind.n);
    }
    const coldMs = coldTimed?.ms;
    // From variant 1: variant 0 is row 0, whose charge ch_0 and customer cus_0 end in the token 0 that most bodies
    // hold, which PostgreSQL plans as a scan of every indexed body (docs/performance.md#body-search-at-ten-million).
    const warmTimed = await timeKind(inbox, kind, 1, t0, true, kind.n);
    const warmMs = warmTimed.ms;
    const line =
      `  ${target.padEnd(10)} ${kind.name.padEnd(30)} warm p50 ${f(quantile(warmMs, 0.5), 2).padStart(7)} p99 ${f(quantile(warmMs, 0.99), 2).padStart(7)} ms` +
      (coldMs
        ? `   cold p50 ${f(quantile(coldMs, 0.5), 2).padStart(7)} p99 ${f(quantile(coldMs, 0.99), 2).padStart(7)} ms`
        : "") +
      `   (goal p99 ≤ ${kind.goal} ms, ${kind.n} variants${refusedNote(warmTimed, "warm")}${refusedNote(coldTimed, "cold")})`;
    console.log(line);
    lines.push(line);
    // PostgreSQL's plan run on a variant no query read before: what it read, and whether from shared buffers.
    console.log(await plan(inbox, kind, t0, 7_000_000 + i, inbox.backend === "postgres"));
    // And the slowest warm variant's, again, when it missed the goal: why.
    const slowest = warmMs.indexOf(Math.max(...warmMs));
    if (warmMs[slowest]! > kind.goal) {
      console.log(`    the slowest warm variant (${f(warmMs[slowest]!, 1)} ms), again:`);
      console.log(await plan(inbox, kind, t0, slowest + 1, inbox.backend === "postgres"));
    }
  }
  await inbox.close();
  return lines;
}

// keptInbox is the inbox BENCH_LISTING_KEEP=1 keeps for a target: filled (and its fill's lines, printed again)
// when an earlier run finished filling it, else made empty for this run to fill.
// On SQLite an inbox whose rows were filled (its .rows mark) but whose search index was not is kept, and the index's
// fill carries on.
async function keptInbox(
  target: string,
): Promise<{ db: string; filled: string[] | undefined; rows: string[] | undefined; done: string }> {
  const done = `${KEPT_FILE}.${target}.done`;
  const read = (mark: string) => (existsSync(mark) ? readFileSync(mark, "utf8").split("\n") : undefined);
  const filled = read(done);
  if (target === "SQLite") {
    const rows = filled ? undefined : read(`${KEPT_FILE}.rows`);
    if (filled === undefined && rows === undefined)
      for (const end of ["", "-wal", "-shm"]) rmSync(`${KEPT_FILE}${end}`, { force: true });
    return { db: KEPT_FILE, filled, rows, done };
  }
  if (filled === undefined) await freshDatabase(KEPT_DB);
  const url = new URL(PG_URL);
  url.pathname = `/${KEPT_DB}`;
  return { db: `${url}?schema=inbox`, filled, rows: undefined, done };
}

/** listing fills each backend (or finds the inbox BENCH_LISTING_KEEP=1 kept), times its lists and searches warm and cold, and returns the summary. */
export async function listing(): Promise<string> {
  const lines: string[] = [];
  const { dir, cleanup } = tempDir();
  try {
    for (const target of await inboxTargets()) {
      const kept = KEEP ? await keptInbox(target.name) : undefined;
      const { db, drop } = kept ? { db: kept.db, drop: async () => {} } : await target.fresh(dir, "listing");
      try {
        let inbox: Inbox;
        let t0: number;
        if (kept?.filled) {
          inbox = await connect(db);
          t0 = Number((await inbox.query("SELECT min(received_at) AS t FROM deliveries"))[0]!.t);
          console.log(`\nlisting on ${target.name}: the inbox an earlier run kept (${db}), as it reported:`);
          console.log(kept.filled.join("\n"));
          if (SEARCH && target.name === "SQLite") {
            // Its FTS5 index as it lies now, merged into one segment first with BENCH_LISTING_FTS_OPTIMIZE=1.
            await inbox.close();
            const file = new DatabaseSync(db);
            const shape = [`    now: ${ftsShape(file).text}`, ...(OPTIMIZE ? optimizedSqlite(file) : [])];
            file.exec("PRAGMA wal_checkpoint(TRUNCATE)");
            file.close();
            flushFill(db);
            console.log(shape.join("\n"));
            inbox = await connect(db);
          }
        } else {
          t0 = Date.now() - SPAN;
          const started = performance.now();
          if (target.name === "SQLite" && !kept?.rows) fillSqlite(db, t0);
          inbox = await connect(db);
          if (kept?.rows) t0 = Number((await inbox.query("SELECT min(received_at) AS t FROM deliveries"))[0]!.t);
          const searchFill = SEARCH && target.name === "PostgreSQL" ? await searchBeforePgFill(inbox) : undefined;
          if (target.name === "PostgreSQL") await fillPostgres(inbox, t0);
          const fillS = (performance.now() - started) / 1000;
          const report = kept?.rows ?? [
            `listing on ${target.name}: ${f(ROWS)} deliveries over ${DAYS} days, filled in ${f(fillS, 1)} s`,
          ];
          console.log(`\n${report.join("\n")}`);
          if (kept && target.name === "SQLite") writeFileSync(`${KEPT_FILE}.rows`, report.join("\n"));
          if (SEARCH) {
            if (target.name === "SQLite") await inbox.close();
            const cost = searchFill ? await searchAfterPgFill(inbox, db, searchFill) : searchInBulkSqlite(db);
            console.log(cost.join("\n"));
            report.push(...cost);
            if (target.name === "SQLite") {
              // As the fill does (flushFill): the index's gigabytes on disk before a figure, not dirty in the cache.
              const file = new DatabaseSync(db);
              file.exec("PRAGMA wal_checkpoint(TRUNCATE)");
              file.close();
              flushFill(db);
              if (COMPARE) console.log((await comparedWithEnable(db, t0)).join("\n"));
              inbox = await connect(db);
            }
          }
          if (kept) writeFileSync(kept.done, report.join("\n"));
        }
        if (!MEASURE) {
          await inbox.close();
          continue;
        }
        lines.push(`  ${target.name}, ${f(ROWS)} deliveries:`);
        const cold: string | undefined = dropCaches();
        if (cold !== undefined) console.log(`  cold not measured: ${cold}`);
        for (const [i, kind] of (LISTS ? KINDS : []).entries()) {
          // Cold first, on variants no query touched, right after the cache is emptied for this kind.
          let coldMs: number[] | undefined;
          if (cold === undefined) {
            await inbox.close();
            dropCaches();
            inbox = await connect(db);
            coldMs = (await timeKind(inbox, kind, (i + 1) * 100_000, t0, false)).ms;
          }
          const warmMs = (await timeKind(inbox, kind, 0, t0, true)).ms;
          const line =
            `  ${target.name.padEnd(10)} ${kind.name.padEnd(26)} warm p50 ${f(quantile(warmMs, 0.5), 2).padStart(6)} p99 ${f(quantile(warmMs, 0.99), 2).padStart(6)} ms` +
            (coldMs
              ? `   cold p50 ${f(quantile(coldMs, 0.5), 2).padStart(6)} p99 ${f(quantile(coldMs, 0.99), 2).padStart(6)} ms`
              : "") +
            "   (goal p99 ≤ 20 ms)";
          console.log(line);
          // Where a cold p99 is a few variants' spikes: the slowest three, and their place in the run (the first
          // is the first statement on a new connection).
          if (coldMs)
            console.log(
              `    slowest cold: ${[...coldMs.entries()]
                .sort((a, b) => b[1] - a[1])
                .slice(0, 3)
                .map(([n, ms]) => `${f(ms, 1)} ms (#${n})`)
                .join(", ")}`,
            );
          console.log(await plan(inbox, kind, t0));
          lines.push(line);
        }
        if (SEARCH) lines.push(...(await timeSearches(target.name, db, inbox, t0, cold === undefined)));
        else await inbox.close();
        if (kept) console.log(`  kept: ${db} (remove it, and ${kept.done}, when done)`);
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
