// sqlite/searching.ts: SQLite's body search index (docs/operations.md#searching-bodies): turning it on and off
// (`inbox.ts search enable|disable|status`) and indexSearch(), which indexes the rows stored since it last ran,
// after their acks. The FTS5 table deliveries_search is made empty by its migration; search_state holds whether
// it is on and its place (done_rowid): every row at or below it is indexed, or has nothing to index. A store
// writes nothing here; the indexer takes the rows past the place, a batch per transaction through the commit
// queue, and moves the place on in the same transaction, so a row is never skipped nor indexed twice: SQLite
// has one writer, so no rowid is committed after a larger one. Enable's backfill is that same indexer run from
// rowid 0. The triggers that take a dropped body out at once are the migration's (lib/sqlite/schema.ts), gated
// on search_state. The SQL is this backend's alone.

import type { DatabaseSync } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import { indexAll, SearchOff, searching } from "../search.ts";
import { type FilterSql, filterSql } from "../sql.ts";
import type { Audit, EnableSearchOptions, Filter, SearchStatus } from "../store.ts";
import { whole } from "./commit.ts";
import type { Statements } from "./order-keys.ts";
import { writeAudit } from "./records.ts";

/**
 * WORDS is the SQL for the words of a body: its strings, numbers and booleans (true and false by name),
 * space-separated. Spelled as the migration's update trigger spells them; exported so that a bulk fill (the
 * listing bench's) indexes with this very expression, not a copy that could drift.
 */
export const WORDS = (body: string) =>
  `(SELECT group_concat(CASE type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE value END, ' ')
    FROM json_tree(CAST(${body} AS TEXT)) WHERE type IN ('text', 'integer', 'real', 'true', 'false'))`;
/** INDEXABLE is the SQL condition a body meets to be indexed: at most 65536 bytes (DEFAULTS.searchBodyBytes), and JSON. */
export const INDEXABLE = (body: string) => `length(${body}) <= 65536 AND json_valid(CAST(${body} AS TEXT))`;

/** SearchQueue is what SqliteSearching needs of its inbox: its statements, its clock and its commit queue. */
export interface SearchQueue {
  sql: Statements;
  now: () => number;
  enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial?: boolean): Promise<unknown>;
}

/**
 * searchStatusOf reads search_state: one row, cheap enough to read before each search. pending is counted by
 * rowid, past the place up to the last: a row deleted there before the indexer reached it still counts.
 */
export function searchStatusOf(sql: Statements): SearchStatus {
  const r = sql(
    "SELECT s.*, (SELECT coalesce(max(rowid), 0) FROM deliveries) AS last FROM search_state s",
  ).get() as Record<string, number | null>;
  const enabled = r.enabled === 1;
  return {
    enabled,
    backfilled: Number(r.backfilled),
    toBackfill: Number(r.to_backfill),
    ready: enabled && Number(r.done_rowid) >= Number(r.until_rowid),
    changedAt: r.changed_at === null ? null : Number(r.changed_at),
    pending: enabled ? Math.max(0, Number(r.last) - Number(r.done_rowid)) : 0,
  };
}

/** checkSearchable throws SearchOff when a filter asks for bodyJson or bodyWords and the index cannot answer yet. */
export function checkSearchable(sql: Statements, filter: { bodyJson?: string; bodyWords?: string }): void {
  if (filter.bodyJson === undefined && filter.bodyWords === undefined) return;
  const status = searchStatusOf(sql);
  if (!status.ready) throw new SearchOff(status);
}

/** SqliteSearching keeps a SqliteInbox's search index: on and off, and indexing what was stored since. */
export class SqliteSearching {
  private readonly queue: SearchQueue;

  constructor(queue: SearchQueue) {
    this.queue = queue;
  }

  private atomic<T>(run: (db: DatabaseSync) => T): Promise<T> {
    return this.queue.enqueue((db, guarded) => whole(db, guarded, () => run(db)), true) as Promise<T>;
  }

  async status(): Promise<SearchStatus> {
    return searchStatusOf(this.queue.sql);
  }

  /**
   * index indexes up to limit rows past the place, in one transaction, and moves the place to the last of them;
   * it returns how many rows it read. Rows up to until_rowid are the backfill's, counted in backfilled
   * (tombstones aside). A read outside the queue first, so that a tick with nothing to do takes no write lock.
   */
  async index(limit: number = DEFAULTS.searchIndexBatch, audit?: Audit): Promise<number> {
    const { sql, now } = this.queue;
    const n = Math.max(1, limit);
    if (searchStatusOf(sql).pending === 0) return 0;
    return this.atomic(() => {
      const s = sql("SELECT enabled, until_rowid, done_rowid FROM search_state").get() as Record<string, number>;
      // Disabled meanwhile: nothing to read.
      if (s.enabled !== 1) return 0;
      const range = sql(
        `SELECT count(*) AS n, count(*) FILTER (WHERE p IS NULL AND rowid <= ?) AS backfilled, max(rowid) AS last
           FROM (SELECT rowid, purged_at AS p FROM deliveries WHERE rowid > ? ORDER BY rowid LIMIT ?)`,
      ).get(s.until_rowid, s.done_rowid, n) as { n: number; backfilled: number; last: number | null };
      if (range.last === null) return 0;
      const indexed = Number(
        sql(
          `INSERT INTO deliveries_search (rowid, words)
             SELECT d.rowid, ${WORDS("d.body")} FROM deliveries d
             WHERE d.rowid > ? AND d.rowid <= ? AND ${INDEXABLE("d.body")}`,
        ).run(s.done_rowid, range.last).changes,
      );
      sql("UPDATE search_state SET done_rowid = ?, backfilled = backfilled + ?").run(range.last, range.backfilled);
      writeAudit(sql, audit, indexed, now());
      return Number(range.n);
    });
  }

  /** catchUp indexes every row pending before a search form reads the index, when the index is ready. */
  async catchUp(filter: Filter): Promise<void> {
    if (!searching(filter) || !searchStatusOf(this.queue.sql).ready) return;
    await indexAll((limit) => this.index(limit));
  }

  async enable(options: EnableSearchOptions = {}): Promise<SearchStatus> {
    const { sql, now } = this.queue;
    const batch = Math.max(1, options.batch ?? DEFAULTS.searchBackfillBatch);
    // The switch and the backfill's goal in one transaction: every row stored before it is at or below
    // until_rowid, and the place starts at 0, so the indexer reads them all, and the rows after them.
    await this.atomic(() => {
      if (!searchStatusOf(sql).enabled) {
        const r = sql(
          "SELECT coalesce(max(rowid), 0) AS last, count(*) FILTER (WHERE purged_at IS NULL) AS n FROM deliveries",
        ).get() as {
          last: number;
          n: number;
        };
        sql(
          `UPDATE search_state SET enabled = 1, changed_at = ?, until_rowid = ?, done_rowid = 0, backfilled = 0,
             to_backfill = ?`,
        ).run(now(), r.last, r.n);
      }
      writeAudit(sql, options.audit, 0, now());
    });
    // The backfill is the indexer, until the place passes the rows stored before: the last batch may take rows
    // stored since, which is as well.
    for (let s = searchStatusOf(sql); s.enabled && !s.ready; s = searchStatusOf(sql)) {
      if ((await this.index(batch, options.audit)) === 0) break;
      options.onBatch?.(searchStatusOf(sql));
    }
    // And what was stored meanwhile, as PostgreSQL's enable does, so that it leaves nothing waiting.
    if (searchStatusOf(sql).ready) while ((await this.index(batch, options.audit)) === batch);
    return this.status();
  }

  disable(audit?: Audit): Promise<boolean> {
    const { sql, now } = this.queue;
    return this.atomic(() => {
      const was = searchStatusOf(sql).enabled;
      if (was) {
        // FTS5's own command to empty a contentless table.
        sql("INSERT INTO deliveries_search (deliveries_search) VALUES ('delete-all')").run();
        sql(
          `UPDATE search_state SET enabled = 0, changed_at = ?, until_rowid = 0, done_rowid = 0, backfilled = 0,
             to_backfill = 0`,
        ).run(now());
      }
      writeAudit(sql, audit, was ? 1 : 0, now());
      return was;
    });
  }
}

/** filterSqlChecked is filterSql() in SQLite's dialect, refusing (SearchOff) a search form the index cannot answer yet. */
export function filterSqlChecked(sql: Statements, filter: Filter): FilterSql {
  // A form that cannot narrow is refused first (a TypeError, the caller's mistake), whatever the index's state.
  const where = filterSql(filter, "sqlite");
  checkSearchable(sql, filter);
  return where;
}
