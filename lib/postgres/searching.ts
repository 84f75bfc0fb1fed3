// postgres/searching.ts: PostgreSQL's body search index (docs/operations.md#searching-bodies): turning it on and
// off (`inbox.ts search enable|disable|status`) and indexSearch(), which indexes what was stored since, after the
// acks. deliveries_search and its GIN indexes are made empty by their migration. While the index is on, a store's
// trigger puts each delivery's key in search_pending, and the indexer takes the oldest keys out and copies their
// bodies in one transaction, one indexer at a time (search_state's row locked). Enable adds the triggers, then
// copies the rows stored before, a batch per transaction walked by the primary key, through the same copy; its
// place is in search_state, so an interrupted enable carries on. The SQL is this backend's alone.

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { whileMoved } from "../errors.ts";
import { indexAll, SearchOff, searching } from "../search.ts";
import { type FilterSql, filterSql } from "../sql.ts";
import type { Audit, EnableSearchOptions, Filter, SearchStatus } from "../store.ts";
import { NOW } from "./commit.ts";
import { bodyKept } from "./periods.ts";
import type { Pool } from "./pool.ts";
import { writeAudit } from "./records.ts";

// The triggers sit on delivery_rows, not on the deliveries view (docs/table.md#bodies-apart). An insert queues
// route 0's key (a delivery's routes share its body): one statement per INSERT, as a store's group commit is
// one. A row's body dropped (purge, dropBodies, and each row of a day before its partition is dropped: they
// are made tombstones first) takes it out of the search at once; so does the row deleted (a tombstone
// forgotten); a body set again queues it. The functions are the migration's (lib/postgres/schema.ts).
const TRIGGERS = `
  CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue();
  CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON delivery_rows
    FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_forget();
  CREATE TRIGGER deliveries_search_delete AFTER DELETE ON delivery_rows
    FOR EACH ROW WHEN (OLD.route = 0) EXECUTE FUNCTION inbox_search_forget();`;
const DROP_TRIGGERS = `
  DROP TRIGGER IF EXISTS deliveries_search_insert ON delivery_rows;
  DROP TRIGGER IF EXISTS deliveries_search_update ON delivery_rows;
  DROP TRIGGER IF EXISTS deliveries_search_delete ON delivery_rows;
  DROP TRIGGER IF EXISTS deliveries_search_body ON delivery_bodies;`;

// COPY is the copy of a batch's bodies, as CTEs after one named keys (source, id, in key order, so that rows are
// locked in one order): each key's route 0 row, found by its key and its day (delivery_keys' received_at, so that
// only the hot partition and that day's are opened) in a subquery of its own, which its
// FOR SHARE keeps from being folded into a join (a join let the planner, with no statistics on a freshly filled
// table, scan delivery_rows once per key: 3 ms a row at 23,000 rows, 0.1 ms this way), that
// still has its body (delivery_body() finds it in the row or in delivery_bodies), locked FOR SHARE so that a row
// purged meanwhile is read again after the purge commits, and left out as a tombstone, never copied stale (and
// a purge that comes after the lock waits for this copy to commit, then its trigger deletes it); a row copied
// already is left as it is (its body cannot have changed without its trigger deleting the copy).
const COPY = `
  batch AS MATERIALIZED (
    SELECT r.source, r.id, delivery_body(r.source, r.id, 0::smallint, r.received_at, r.body) AS body
      FROM keys k JOIN delivery_keys dk ON dk.source = k.source AND dk.id = k.id AND dk.route = 0 CROSS JOIN LATERAL (
        SELECT source, id, received_at, body FROM delivery_rows
         WHERE source = k.source AND id = k.id AND route = 0 AND received_at = dk.received_at AND ${bodyKept()}
           FOR SHARE) r),
  copied AS (
    INSERT INTO deliveries_search (source, id, doc)
      SELECT b.source, b.id, j FROM batch b CROSS JOIN LATERAL inbox_search_json(b.body) AS j WHERE j IS NOT NULL
      ON CONFLICT (source, id) DO NOTHING RETURNING 1)`;

// One batch of the backfill: the next keys by primary key, copied; the last key read is the next batch's start.
const walkSql = (first: boolean) => `
  WITH keys AS MATERIALIZED (
    SELECT source, id FROM delivery_rows
    WHERE route = 0 AND ${bodyKept()} ${first ? "" : "AND (source, id) > ($1::text, $2::text)"}
    ORDER BY source, id LIMIT ${first ? "$1" : "$3"}::integer),
  ${COPY},
  last AS (SELECT source, id FROM keys ORDER BY source DESC, id DESC LIMIT 1)
  SELECT (SELECT count(*) FROM keys)::integer AS n, (SELECT count(*) FROM copied)::integer AS copied,
         (SELECT source FROM last) AS source, (SELECT id FROM last) AS id`;

// One batch of the indexer: the oldest keys the queue holds, taken out and copied (a key queued twice, once).
const DRAIN = `
  WITH taken AS (
    DELETE FROM search_pending WHERE seq IN (SELECT seq FROM search_pending ORDER BY seq LIMIT $1::integer)
    RETURNING source, id),
  keys AS MATERIALIZED (SELECT DISTINCT source, id FROM taken ORDER BY source, id),
  ${COPY}
  SELECT (SELECT count(*) FROM taken)::integer AS n, (SELECT count(*) FROM copied)::integer AS copied`;

/** SearchQueue is what PostgresSearching needs of its inbox: the pool, the clock and the commit queue. */
export interface SearchQueue {
  pool: Pool;
  pinned: (() => number) | undefined;
  other(run: (client: pg.PoolClient) => Promise<unknown>): Promise<unknown>;
}

const toStatus = (r: Record<string, unknown>, pending: number): SearchStatus => ({
  enabled: r.enabled === true,
  backfilled: Number(r.backfilled),
  toBackfill: Number(r.to_backfill),
  ready: r.enabled === true && r.done === true,
  changedAt: r.changed_at === null ? null : Number(r.changed_at),
  pending,
});

/** searchStatusOf reads search_state: one row, cheap enough to read before each search (pending: 0, see pendingOf). */
export async function searchStatusOf(db: Pool | pg.PoolClient): Promise<SearchStatus> {
  const { rows } = await db.query("SELECT * FROM search_state");
  return toStatus(rows[0], 0);
}

// pendingOf counts the keys the queue holds: what indexSearch() has still to copy.
async function pendingOf(db: Pool | pg.PoolClient): Promise<number> {
  const { rows } = await db.query("SELECT count(*) AS n FROM search_pending");
  return Number(rows[0].n);
}

/**
 * searchSettings sets, for the rest of client's transaction alone (set_config's is_local, so neither the session
 * nor the next borrower behind a per-transaction pooler keeps them), how a search that reads bodies or the search
 * index runs: stopped after timeoutMs (0: not at all), so that one whose words are all common is stopped by the
 * server rather than scanning for minutes; and, unless it scans bodies (bodyContains, whose day of bodies is the
 * long query JIT and workers are for: p50 8.0 s with them at ten million, 10.0 s without JIT), never compiled by
 * JIT nor run by parallel workers. A words search's estimate (thousands of rows for a phrase that matches one) took
 * its cost past jit_above_cost: 412 functions compiled in 343 ms, and 50 ms starting workers, for a page that
 * reads 45 pages (docs/performance.md#at-ten-million-after-the-split).
 */
export async function searchSettings(client: pg.ClientBase, filter: Filter, timeoutMs: number): Promise<void> {
  await client.query(
    `SELECT set_config('statement_timeout', $1, true),
            set_config('jit', CASE WHEN $2::boolean THEN current_setting('jit') ELSE 'off' END, true),
            set_config('max_parallel_workers_per_gather',
                       CASE WHEN $2::boolean THEN current_setting('max_parallel_workers_per_gather') ELSE '0' END, true)`,
    [String(timeoutMs), filter.bodyContains !== undefined],
  );
}

/** filterSqlChecked is filterSql() in PostgreSQL's dialect, refusing (SearchOff) a search form the index cannot answer yet. */
export async function filterSqlChecked(pool: Pool, filter: Filter): Promise<FilterSql> {
  // A form that cannot narrow is refused first (a TypeError, the caller's mistake), whatever the index's state.
  const sql = filterSql(filter, "postgres");
  if (filter.bodyJson !== undefined || filter.bodyWords !== undefined) {
    const status = await searchStatusOf(pool);
    if (!status.ready) throw new SearchOff(status);
  }
  return sql;
}

/** PostgresSearching keeps a PostgresInbox's search index: on and off, and indexing what was stored since. */
export class PostgresSearching {
  private readonly queue: SearchQueue;

  constructor(queue: SearchQueue) {
    this.queue = queue;
  }

  private now(): number | null {
    return this.queue.pinned ? this.queue.pinned() : null;
  }

  async status(): Promise<SearchStatus> {
    const { pool } = this.queue;
    const [status, pending] = await Promise.all([searchStatusOf(pool), pendingOf(pool)]);
    return { ...status, pending };
  }

  /**
   * index takes up to limit of the oldest keys out of the queue and copies their bodies, in one transaction, and
   * returns how many keys it took. search_state's row is locked first, so indexers take turns; a key leaves the
   * queue only in the transaction that copies it, so a search that finds the queue empty knows that every key
   * queued before it began was copied by a transaction that has committed. A look at the queue first, so that
   * a tick with nothing to do locks nothing.
   */
  async index(limit: number = DEFAULTS.searchIndexBatch, audit?: Audit): Promise<number> {
    const { pool } = this.queue;
    const { rows } = await pool.query("SELECT EXISTS (SELECT 1 FROM search_pending) AS any");
    if (rows[0].any !== true) return 0;
    // A row its lock meets moved by a done mark that just committed (40001) is read again where it went.
    const drain = () =>
      this.queue.other(async (client) => {
        const state = await client.query("SELECT enabled FROM search_state FOR UPDATE");
        if (state.rows[0].enabled !== true) return 0;
        const got = await client.query(DRAIN, [Math.max(1, limit)]);
        await writeAudit(client, audit, Number(got.rows[0].copied), this.now());
        return Number(got.rows[0].n);
      });
    return (await whileMoved(drain, DEFAULTS.movedTries)) as number;
  }

  /** catchUp copies every key queued before a search form reads the index, when the index is ready. */
  async catchUp(filter: Filter): Promise<void> {
    if (!searching(filter) || !(await searchStatusOf(this.queue.pool)).ready) return;
    await indexAll((limit) => this.index(limit));
  }

  async enable(options: EnableSearchOptions = {}): Promise<SearchStatus> {
    const batch = Math.max(1, options.batch ?? DEFAULTS.searchBackfillBatch);
    // The triggers and the backfill's goal in one transaction, its state row locked so two enables make one.
    // The count comes before CREATE TRIGGER, whose lock holds off writers until the commit.
    await this.queue.other(async (client) => {
      const { rows } = await client.query("SELECT enabled FROM search_state FOR UPDATE");
      if (rows[0].enabled !== true) {
        const counted = await client.query(`SELECT count(*) AS n FROM delivery_rows WHERE route = 0 AND ${bodyKept()}`);
        await client.query(DROP_TRIGGERS + TRIGGERS);
        await client.query(
          `UPDATE search_state SET enabled = true, changed_at = ${NOW}, after_source = NULL, after_id = NULL,
             done = false, backfilled = 0, to_backfill = $2`,
          [this.now(), Number(counted.rows[0].n)],
        );
      }
      await writeAudit(client, options.audit, 0, this.now());
    });
    // The rows stored before, walked by primary key; those stored since are in the queue, copied after.
    for (;;) {
      const batchOnce = () =>
        this.queue.other(async (client) => {
          const { rows } = await client.query("SELECT * FROM search_state FOR UPDATE");
          const s = rows[0];
          if (s.enabled !== true || s.done === true) return undefined;
          const first = s.after_source === null;
          const got = await client.query(walkSql(first), first ? [batch] : [s.after_source, s.after_id, batch]);
          const r = got.rows[0];
          const n = Number(r.n);
          await client.query(
            `UPDATE search_state SET after_source = coalesce($1, after_source), after_id = coalesce($2, after_id),
             backfilled = backfilled + $3, done = $4`,
            [r.source, r.id, n, n < batch],
          );
          await writeAudit(client, options.audit, Number(r.copied), this.now());
          return searchStatusOf(client);
        });
      const status = (await whileMoved(batchOnce, DEFAULTS.movedTries)) as SearchStatus | undefined;
      if (status === undefined) break;
      options.onBatch?.(status);
    }
    while ((await this.index(batch, options.audit)) === batch);
    return this.status();
  }

  async disable(audit?: Audit): Promise<boolean> {
    return (await this.queue.other(async (client) => {
      const { rows } = await client.query("SELECT enabled FROM search_state FOR UPDATE");
      const was = rows[0].enabled === true;
      if (was) {
        await client.query(DROP_TRIGGERS);
        // TRUNCATE rather than DELETE: no dead rows left for vacuum, and the GIN indexes emptied at once.
        await client.query("TRUNCATE deliveries_search, search_pending");
        await client.query(
          `UPDATE search_state SET enabled = false, changed_at = ${NOW}, after_source = NULL, after_id = NULL,
             done = false, backfilled = 0, to_backfill = 0, dated_since = 0`,
          [this.now()],
        );
      }
      await writeAudit(client, audit, was ? 1 : 0, this.now());
      return was;
    })) as boolean;
  }
}
