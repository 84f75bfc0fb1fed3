// bench/byid.ts: what naming an ID's days, and reading a list a day at a time, saves the PostgreSQL statements that
// still planned over every day's partition (issue 51): count() of an ID, list(), a bulk retry's batch by ID, and
// `replay --to` by ID (its count, and its batch's two writes, run in a transaction rolled back).
// A fresh database is filled through the bulk path (stored.ts fillPostgres) with BENCH_BYID_ROWS (200,000) done
// deliveries over 30 days, one in 500 failed, and one ID stored again under a second source a day later. Each read
// is run the old way (one statement, pruned as it runs) and the new way (an ID's keys read from delivery_keys first
// and passed as values; a list's days one statement each, newest first) under EXPLAIN (ANALYZE, BUFFERS), warm (the
// third of three runs), and printed with the history's days its plans name, those it read, the buffers
// (planning and execution) and the planning and execution times, both ways in the same run.
//   npm run bench -- byid
//   BENCH_BYID_ROWS=1000000 npm run bench -- byid

import { pathToFileURL } from "node:url";
import pg from "pg";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { NOW } from "../lib/postgres/commit.ts";
import { listWindows } from "../lib/postgres/reads.ts";
import { filterSql, type IdKeys, idKeysSql, replayToCount, searchSql } from "../lib/sql.ts";
import type { Filter, Inbox, SqlValue } from "../lib/store.ts";
import { f, knob } from "./common.ts";
import { freshDatabase, pgReachable } from "./peers/pgdb.ts";
import { fillPostgres } from "./stored.ts";

const ROWS = knob("BENCH_BYID_ROWS", 200_000);
const DAYS = 30;
const DAY = 86_400_000;

/** Cost is what one or more statements' plans say they did. */
interface Cost {
  statements: number;
  rows: number;
  /** The history's days the plans name, and those of them whose scans ran (not pruned as the statement ran). */
  days: number;
  read: number;
  buffers: number;
  planMs: number;
  execMs: number;
}

interface PlanNode {
  "Relation Name"?: string;
  "Actual Rows"?: number;
  "Actual Loops"?: number;
  "Shared Hit Blocks"?: number;
  "Shared Read Blocks"?: number;
  Plans?: PlanNode[];
}

type Explained = { Plan: PlanNode; Planning?: PlanNode; "Planning Time": number; "Execution Time": number };

// explain runs a statement three times under EXPLAIN (ANALYZE, BUFFERS) and reads the last: the history's days its
// plan names and those it read (a day pruned as it ran was never executed), its buffers (planning's too), its times.
async function explain(inbox: Inbox, sql: string, params: SqlValue[]): Promise<Cost> {
  let out: Explained | undefined;
  for (let i = 0; i < 3; i++) {
    const [row] = await inbox.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${sql}`, ...params);
    out = (row!["QUERY PLAN"] as Explained[])[0];
  }
  return costOf(out!);
}

// explainWrite is explain() for a statement that writes ($1 … parameters): each run in a transaction rolled back,
// so the third finds what the first did.
async function explainWrite(client: pg.Client, sql: string, params: unknown[]): Promise<Cost> {
  let out: Explained | undefined;
  for (let i = 0; i < 3; i++) {
    await client.query("BEGIN");
    try {
      const { rows } = await client.query(`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ${sql}`, params);
      out = (rows[0]["QUERY PLAN"] as Explained[])[0];
    } finally {
      await client.query("ROLLBACK");
    }
  }
  return costOf(out!);
}

function costOf(out: Explained): Cost {
  const days = new Set<string>();
  const read = new Set<string>();
  const walk = (n: PlanNode): void => {
    const name = n["Relation Name"];
    if (name !== undefined && /^delivery_history_d\d{8}$/.test(name)) {
      days.add(name);
      if ((n["Actual Loops"] ?? 0) > 0) read.add(name);
    }
    for (const c of n.Plans ?? []) walk(c);
  };
  walk(out.Plan);
  const blocks = (n: PlanNode | undefined) => (n?.["Shared Hit Blocks"] ?? 0) + (n?.["Shared Read Blocks"] ?? 0);
  return {
    statements: 1,
    rows: out.Plan["Actual Rows"] ?? 0,
    days: days.size,
    read: read.size,
    buffers: blocks(out.Plan) + blocks(out.Planning),
    planMs: out["Planning Time"],
    execMs: out["Execution Time"],
  };
}

function sum(costs: Cost[]): Cost {
  const total = { statements: 0, rows: 0, days: 0, read: 0, buffers: 0, planMs: 0, execMs: 0 };
  for (const c of costs) for (const k of Object.keys(total) as (keyof Cost)[]) total[k] += c[k];
  return total;
}

// keysOf reads an ID's keys as reads.ts byId() does, the statement's cost with them.
async function keysOf(inbox: Inbox, filter: Filter & { id: string }): Promise<{ keys?: IdKeys; cost: Cost }> {
  const { sql, params } = idKeysSql(filter.id, filter.source);
  const [r] = await inbox.query(sql, ...params);
  const cost = await explain(inbox, sql, params);
  if (r!.sources === null) return { cost };
  return { keys: { sources: r!.sources as string[], first: Number(r!.first), last: Number(r!.last) }, cost };
}

// byIdCost is the old statement and the new two for a statement over an ID's rows: where comes first, then more.
async function byIdCost(
  inbox: Inbox,
  filter: Filter & { id: string },
  statement: (where: string) => string,
  more: SqlValue[] = [],
): Promise<[Cost, Cost]> {
  const old = filterSql(filter, "postgres");
  const before = await explain(inbox, statement(old.where), [...old.params, ...more]);
  const { keys, cost } = await keysOf(inbox, filter);
  if (keys === undefined) return [before, cost];
  const named = filterSql(filter, "postgres", keys);
  return [before, sum([cost, await explain(inbox, statement(named.where), [...named.params, ...more])])];
}

// replayToCountCost is `replay --to`'s dry run of an ID, the old statement and the new two: its row there was
// looked for by its key alone, and is now looked for in the ID's days (postgres/bulk.ts countTo).
async function replayToCountCost(inbox: Inbox, filter: Filter & { id: string }, to: string): Promise<[Cost, Cost]> {
  const old = filterSql(filter, "postgres");
  const before = await explain(inbox, replayToCount(old.where), [...old.params, to]);
  const { keys, cost } = await keysOf(inbox, filter);
  if (keys === undefined) return [before, cost];
  const named = filterSql(filter, "postgres", keys);
  const count = replayToCount(named.where, "t.received_at BETWEEN ?::bigint AND ?::bigint");
  return [before, sum([cost, await explain(inbox, count, [...named.params, to, keys.first, keys.last])])];
}

/** Batch is the rows a batch of `replay --to` picked, and the days of all their deliveries' routes. */
interface Batch {
  sources: string[];
  ids: string[];
  routes: number[];
  at: number[];
  days: string[];
  to: string;
}

// replayToWrites is a batch of `replay --to`, its UPDATE of the row there and its INSERT of a route, as
// postgres/bulk.ts replayTo wrote it (named false: its delivery's other routes found by their key alone) and as it
// writes it now (their days, read from delivery_keys first, named as values; the next route number from the keys).
function replayToWrites(named: boolean, b: Batch): [string, unknown[]][] {
  const days = (t: string) => (named ? `AND ${t}.received_at = ANY($8::bigint[])` : "");
  const at = (t: string) => (named ? `AND ${t}.received_at = u.at` : "");
  const u = named
    ? "unnest($2::text[], $3::text[], $4::smallint[], $7::bigint[]) AS u(s, i, r, at)"
    : "unnest($2::text[], $3::text[], $4::smallint[]) AS u(s, i, r)";
  const again = `UPDATE delivery_rows d SET status = 'received', attempts = 0, replays = d.replays + 1, error = NULL, available_at = ${NOW},
                        finished_at = NULL, leased_until = NULL, lease_token = NULL
                 FROM unnest($2::text[], $3::text[]) AS u(s, i)
                 WHERE d.source = u.s AND d.id = u.i AND d.destination = $4 AND d.status = 'done' AND d.purged_at IS NULL
                   ${named ? "AND d.received_at = ANY($5::bigint[])" : ""}
                 RETURNING d.source, d.id, d.order_key, d.destination`;
  const added = `WITH a AS (
       INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status,
                               available_at, order_key, event_time, arrival, route, destination, headers, traceparent, replays, origin)
       SELECT d.source, d.id, CASE WHEN octet_length(d.body) <= $6 THEN d.body ELSE '\\x'::bytea END, d.body_sha256, d.content_type, d.event_type, d.provider_time, d.received_at, 'received', ${NOW},
              d.order_key, d.event_time, CASE WHEN d.order_key IS NULL THEN NULL ELSE nextval('deliveries_arrival') * 1000000 END,
              (SELECT max(m.route) + 1 FROM ${named ? "delivery_keys" : "deliveries"} m WHERE m.source = d.source AND m.id = d.id), $5, d.headers, d.traceparent, 1, d.origin
       FROM ${u}
       JOIN deliveries d ON d.source = u.s AND d.id = u.i AND d.route = u.r ${at("d")} AND d.purged_at IS NULL ${days("d")}
       WHERE NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.source = u.s AND o.id = u.i AND o.destination = $5 ${days("o")})
       ORDER BY d.source, d.id
       RETURNING source, id, route, received_at, order_key, event_time, arrival, available_at),
       b AS (
       INSERT INTO delivery_bodies (source, id, route, received_at, body)
       SELECT a.source, a.id, a.route, a.received_at, s.body FROM a
       JOIN ${u} ON u.s = a.source AND u.i = a.id
       JOIN deliveries s ON s.source = u.s AND s.id = u.i AND s.route = u.r ${at("s")} ${days("s")}
       WHERE octet_length(s.body) > $6),
       k AS (INSERT INTO delivery_keys (source, id, route, received_at) SELECT source, id, route, received_at FROM a)
       SELECT source, id, order_key, event_time, arrival, available_at FROM a`;
  const key = [null, b.sources, b.ids];
  const route = [...key, b.routes, b.to, DEFAULTS.inlineBodyBytes];
  return [
    [again, named ? [...key, b.to, b.days] : [...key, b.to]],
    [added, named ? [...route, b.at, b.days] : route],
  ];
}

// replayToBatchCost is a batch of `replay --to` by ID: its two writes the old way, and the new with the read of its
// days before them; the rows picked are all the ID's, as the retry's batch picks them (measured above).
async function replayToBatchCost(inbox: Inbox, writer: pg.Client, id: string, to: string): Promise<[Cost, Cost]> {
  const picked = (await inbox.query(
    "SELECT source, id, route, received_at FROM delivery_keys WHERE id = ? ORDER BY received_at, source, route",
    id,
  )) as { source: string; id: string; route: number; received_at: number }[];
  const sources = picked.map((k) => k.source);
  const ids = picked.map((k) => k.id);
  const daysSql = `SELECT array_agg(DISTINCT k.received_at) AS days FROM unnest($1::text[], $2::text[]) AS u(s, i)
                     JOIN delivery_keys k ON k.source = u.s AND k.id = u.i`;
  const [{ days }] = (await writer.query(daysSql, [sources, ids])).rows as [{ days: string[] }];
  const batch = { sources, ids, routes: picked.map((k) => k.route), at: picked.map((k) => k.received_at), days, to };
  const costs = async (named: boolean) => {
    const out: Cost[] = [];
    for (const [sql, params] of replayToWrites(named, batch)) out.push(await explainWrite(writer, sql, params));
    return out;
  };
  const before = sum(await costs(false));
  return [before, sum([await explainWrite(writer, daysSql, [sources, ids]), ...(await costs(true))])];
}

// listCost is list()'s old statement and the new ones: search()'s, a day at a time, until the page is full.
async function listCost(inbox: Inbox, filter: Filter, limit: number, now: number): Promise<[Cost, Cost]> {
  const before = await explain(
    inbox,
    `SELECT * FROM deliveries WHERE (?::text IS NULL OR status = ?::text) AND (?::text IS NULL OR source = ?::text)
     ORDER BY received_at DESC, source DESC, id DESC LIMIT ?::integer`,
    [filter.status ?? null, filter.status ?? null, filter.source ?? null, filter.source ?? null, limit],
  );
  const costs: Cost[] = [];
  let found = 0;
  for (const window of listWindows(filter, undefined, now)) {
    const { sql, params } = searchSql("postgres", filterSql(window, "postgres"), { limit: limit - found });
    found += (await inbox.query(sql, ...params)).length;
    costs.push(await explain(inbox, sql, params));
    if (found === limit) break;
  }
  return [before, sum(costs)];
}

function line(name: string, [before, after]: [Cost, Cost]): string {
  const say = (c: Cost) =>
    `${c.statements} stmt, ${c.days} days planned, ${c.read} read, ${f(c.buffers)} buffers, plan ${f(c.planMs, 2)} + run ${f(c.execMs, 2)} ms`;
  return `  ${name}\n    before: ${say(before)}\n    after:  ${say(after)}`;
}

/** byid fills a 30-day inbox and prints each read's cost the old way and the new, in the same run. */
export async function byid(): Promise<string> {
  if (!(await pgReachable())) return "byid: PostgreSQL not reachable (BENCH_PG_URL), skipped";
  const { url, drop } = await freshDatabase("bench_inbox_byid");
  const lines: string[] = [];
  try {
    const now = Date.now();
    const inbox = await connect(url);
    // replay --to's writes are explained in a transaction of their own, rolled back.
    const writer = new pg.Client({ connectionString: url });
    await writer.connect();
    try {
      const t0 = performance.now();
      await fillPostgres(inbox, ROWS, now, DAYS);
      // One in 500 failed; and one failed ID stored again under another source a day later (its keys span days).
      await inbox.query(
        "UPDATE delivery_rows SET status = 'failed', error = 'HTTP 500' WHERE substr(id, 5)::bigint % 500 = 0",
      );
      const twin = `old_${Math.floor(ROWS / 1000) * 500}`;
      const [{ at }] = (await inbox.query("SELECT received_at AS at FROM delivery_keys WHERE id = ?", twin)) as [
        { at: number },
      ];
      await inbox.query(
        `WITH k AS (INSERT INTO delivery_keys (source, id, route, received_at) VALUES ('stripe', ?, 0, ?::bigint + ?::bigint))
         INSERT INTO delivery_rows (source, id, body, body_sha256, received_at, status, attempts, available_at, error, finished_at)
         VALUES ('stripe', ?, '\\x'::bytea, 'x', ?::bigint + ?::bigint, 'failed', 3, ?::bigint, 'HTTP 500', ?::bigint)`,
        twin,
        at,
        DAY,
        twin,
        at,
        DAY,
        at,
        at,
      );
      await inbox.query("VACUUM (ANALYZE) delivery_rows");
      const [{ days }] = (await inbox.query(
        "SELECT count(*)::integer AS days FROM pg_inherits WHERE inhparent = 'delivery_history'::regclass",
      )) as [{ days: number }];
      const head = `${f(ROWS)} stored over ${DAYS} days (${days} history partitions), filled in ${f((performance.now() - t0) / 1000, 1)} s; warm, the third of three runs; ${new Date().toISOString()}`;
      console.log(head);
      lines.push(head);
      const counted = (w: string) => `SELECT count(*) AS n FROM deliveries WHERE ${w}`;
      const batch = (w: string) =>
        `SELECT received_at, source, id, route FROM delivery_rows WHERE status = 'failed' AND purged_at IS NULL AND ${w}
         ORDER BY received_at, source, id, route LIMIT ?::integer FOR UPDATE`;
      const kinds: [string, () => Promise<[Cost, Cost]>][] = [
        ["count({ id }), an ID under two sources a day apart", () => byIdCost(inbox, { id: twin }, counted)],
        ["count({ id, source })", () => byIdCost(inbox, { id: twin, source: "default" }, counted)],
        ["count({ id }), an ID not stored", () => byIdCost(inbox, { id: "evt_missing" }, counted)],
        ["list(), 20 newest", () => listCost(inbox, {}, 20, now)],
        ["list({ status: 'failed' }), 20 newest", () => listCost(inbox, { status: "failed" }, 20, now)],
        ["list({ source: 'default' }), 50 newest", () => listCost(inbox, { source: "default" }, 50, now)],
        ["retryMatching({ id }), its batch", () => byIdCost(inbox, { id: twin }, batch, [500])],
        ["replayMatching({ id }, { to, dryRun })", () => replayToCountCost(inbox, { id: twin }, "audit")],
        ["replayMatching({ id }, { to }), its batch's writes", () => replayToBatchCost(inbox, writer, twin, "audit")],
      ];
      for (const [name, run] of kinds) {
        const l = line(name, await run());
        console.log(l);
        lines.push(l);
      }
    } finally {
      await writer.end();
      await inbox.close();
    }
  } finally {
    await drop();
  }
  return `byid (PostgreSQL, old forms against new):\n${lines.join("\n")}`;
}

if (import.meta.url === pathToFileURL(process.argv[1]!).href) console.log(`\n${await byid()}`);
