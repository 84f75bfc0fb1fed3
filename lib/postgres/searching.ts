// postgres/searching.ts: turning PostgreSQL's body search index on and off (`inbox.ts search enable|disable|status`,
// docs/operations.md#searching-bodies). deliveries_search and its GIN indexes are made empty by their migration;
// enable adds the triggers that copy each body stored from then on, then copies the rows stored before, a batch
// per transaction walked by the primary key, so a writer waits for one batch at most. search_state holds whether
// it is on and how far the backfill got, so an interrupted enable carries on. The SQL is this backend's alone.

import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { SearchOff } from "../search.ts";
import { filterSql } from "../sql.ts";
import type { Audit, EnableSearchOptions, Filter, SearchStatus, SqlValue } from "../store.ts";
import { NOW } from "./commit.ts";
import type { Pool } from "./pool.ts";
import { writeAudit } from "./records.ts";

// The triggers call inbox_search_sync() (the migration's) for route 0 alone: a delivery's routes share its body.
// They sit on the tables, not on the deliveries view (docs/table.md#bodies-apart): a body of up to
// DEFAULTS.inlineBodyBytes is stored in its delivery_rows row, a larger one in delivery_bodies, partitioned by day,
// with an empty one in the row. A row's body dropped (purge, dropBodies, and each row of a day before its
// partition is dropped: they are made tombstones first) sets its row's body, which takes it out of the
// search; so does the row deleted (a tombstone forgotten). A body moved to the default partition as its day is
// released is copied again, to the same document.
const TRIGGERS = `
  CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
    FOR EACH ROW WHEN (NEW.route = 0 AND octet_length(NEW.body) > 0) EXECUTE FUNCTION inbox_search_sync();
  CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON delivery_rows
    FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_sync();
  CREATE TRIGGER deliveries_search_delete AFTER DELETE ON delivery_rows
    FOR EACH ROW WHEN (OLD.route = 0) EXECUTE FUNCTION inbox_search_sync();
  CREATE TRIGGER deliveries_search_body AFTER INSERT ON delivery_bodies
    FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_sync();`;
const DROP_TRIGGERS = `
  DROP TRIGGER IF EXISTS deliveries_search_insert ON delivery_rows;
  DROP TRIGGER IF EXISTS deliveries_search_update ON delivery_rows;
  DROP TRIGGER IF EXISTS deliveries_search_delete ON delivery_rows;
  DROP TRIGGER IF EXISTS deliveries_search_body ON delivery_bodies;`;

// One batch of the backfill: the next rows by primary key that still have their body (delivery_body() finds it
// in the row or in delivery_bodies), locked FOR SHARE so that a row purged meanwhile (whose trigger found nothing
// yet to delete) is read again after the purge commits, and left out as a tombstone, never copied stale; a row
// a trigger copied already is left as it is.
const batchSql = (first: boolean) => `
  WITH batch AS MATERIALIZED (
    SELECT source, id, delivery_body(source, id, route, received_at, body) AS body FROM delivery_rows
    WHERE route = 0 AND purged_at IS NULL ${first ? "" : "AND (source, id) > ($1::text, $2::text)"}
    ORDER BY source, id LIMIT ${first ? "$1" : "$3"}::integer FOR SHARE),
  copied AS (
    INSERT INTO deliveries_search (source, id, doc)
      SELECT b.source, b.id, j FROM batch b CROSS JOIN LATERAL inbox_search_json(b.body) AS j WHERE j IS NOT NULL
      ON CONFLICT (source, id) DO NOTHING RETURNING 1),
  last AS (SELECT source, id FROM batch ORDER BY source DESC, id DESC LIMIT 1)
  SELECT (SELECT count(*) FROM batch)::integer AS n, (SELECT count(*) FROM copied)::integer AS copied,
         (SELECT source FROM last) AS source, (SELECT id FROM last) AS id`;

/** SearchQueue is what PostgresSearching needs of its inbox: the pool, the clock and the commit queue. */
export interface SearchQueue {
  pool: Pool;
  pinned: (() => number) | undefined;
  other(run: (client: pg.PoolClient) => Promise<unknown>): Promise<unknown>;
}

const toStatus = (r: Record<string, unknown>): SearchStatus => ({
  enabled: r.enabled === true,
  backfilled: Number(r.backfilled),
  toBackfill: Number(r.to_backfill),
  ready: r.enabled === true && r.done === true,
  changedAt: r.changed_at === null ? null : Number(r.changed_at),
});

/** searchStatusOf reads search_state: one row, cheap enough to read before each search. */
export async function searchStatusOf(db: Pool | pg.PoolClient): Promise<SearchStatus> {
  const { rows } = await db.query("SELECT * FROM search_state");
  return toStatus(rows[0]);
}

/** filterSqlChecked is filterSql() in PostgreSQL's dialect, refusing (SearchOff) a search form the index cannot answer yet. */
export async function filterSqlChecked(pool: Pool, filter: Filter): Promise<{ where: string; params: SqlValue[] }> {
  // A form that cannot narrow is refused first (a TypeError, the caller's mistake), whatever the index's state.
  const sql = filterSql(filter, "postgres");
  if (filter.bodyJson !== undefined || filter.bodyWords !== undefined) {
    const status = await searchStatusOf(pool);
    if (!status.ready) throw new SearchOff(status);
  }
  return sql;
}

/** PostgresSearching turns a PostgresInbox's search index on and off. */
export class PostgresSearching {
  private readonly queue: SearchQueue;

  constructor(queue: SearchQueue) {
    this.queue = queue;
  }

  private now(): number | null {
    return this.queue.pinned ? this.queue.pinned() : null;
  }

  status(): Promise<SearchStatus> {
    return searchStatusOf(this.queue.pool);
  }

  async enable(options: EnableSearchOptions = {}): Promise<SearchStatus> {
    const batch = Math.max(1, options.batch ?? DEFAULTS.searchBackfillBatch);
    // The triggers and the backfill's goal in one transaction, its state row locked so two enables make one.
    // The count comes before CREATE TRIGGER, whose lock holds off writers until the commit.
    await this.queue.other(async (client) => {
      const { rows } = await client.query("SELECT enabled FROM search_state FOR UPDATE");
      if (rows[0].enabled !== true) {
        const counted = await client.query(
          "SELECT count(*) AS n FROM delivery_rows WHERE route = 0 AND purged_at IS NULL",
        );
        await client.query(DROP_TRIGGERS + TRIGGERS);
        await client.query(
          `UPDATE search_state SET enabled = true, changed_at = ${NOW}, after_source = NULL, after_id = NULL,
             done = false, backfilled = 0, to_backfill = $2`,
          [this.now(), Number(counted.rows[0].n)],
        );
      }
      await writeAudit(client, options.audit, 0, this.now());
    });
    for (;;) {
      const status = (await this.queue.other(async (client) => {
        const { rows } = await client.query("SELECT * FROM search_state FOR UPDATE");
        const s = rows[0];
        if (s.enabled !== true || s.done === true) return undefined;
        const first = s.after_source === null;
        const got = await client.query(batchSql(first), first ? [batch] : [s.after_source, s.after_id, batch]);
        const r = got.rows[0];
        const n = Number(r.n);
        await client.query(
          `UPDATE search_state SET after_source = coalesce($1, after_source), after_id = coalesce($2, after_id),
             backfilled = backfilled + $3, done = $4`,
          [r.source, r.id, n, n < batch],
        );
        await writeAudit(client, options.audit, Number(r.copied), this.now());
        return searchStatusOf(client);
      })) as SearchStatus | undefined;
      if (status === undefined) break;
      options.onBatch?.(status);
    }
    return this.status();
  }

  async disable(audit?: Audit): Promise<boolean> {
    return (await this.queue.other(async (client) => {
      const { rows } = await client.query("SELECT enabled FROM search_state FOR UPDATE");
      const was = rows[0].enabled === true;
      if (was) {
        await client.query(DROP_TRIGGERS);
        // TRUNCATE rather than DELETE: no dead rows left for vacuum, and the GIN indexes emptied at once.
        await client.query("TRUNCATE deliveries_search");
        await client.query(
          `UPDATE search_state SET enabled = false, changed_at = ${NOW}, after_source = NULL, after_id = NULL,
             done = false, backfilled = 0, to_backfill = 0`,
          [this.now()],
        );
      }
      await writeAudit(client, audit, was ? 1 : 0, this.now());
      return was;
    })) as boolean;
  }
}
