// sqlite/searching.ts: turning SQLite's body search index on and off (`inbox.ts search enable|disable|status`,
// docs/operations.md#searching-bodies). The FTS5 table deliveries_search is made empty by its migration; enable
// adds the triggers that index each body stored from then on, then indexes the rows stored before, a batch of
// rowids per transaction through the commit queue, so a writer (this process's or another's) waits for one
// batch at most. search_state holds whether it is on and how far the backfill got, so an interrupted enable
// carries on. The SQL is this backend's alone.

import type { DatabaseSync } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import { SearchOff } from "../search.ts";
import { filterSql } from "../sql.ts";
import type { Audit, EnableSearchOptions, Filter, SearchStatus, SqlValue } from "../store.ts";
import { whole } from "./commit.ts";
import type { Statements } from "./order-keys.ts";
import { writeAudit } from "./records.ts";

// The words of a body: its strings, numbers and booleans (true and false by name), space-separated; a body past
// 65536 bytes (DEFAULTS.searchBodyBytes) or not JSON is left out. Spelled once for the triggers and the backfill.
const WORDS = (body: string) =>
  `(SELECT group_concat(CASE type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE value END, ' ')
    FROM json_tree(CAST(${body} AS TEXT)) WHERE type IN ('text', 'integer', 'real', 'true', 'false'))`;
const INDEXABLE = (body: string) => `length(${body}) <= 65536 AND json_valid(CAST(${body} AS TEXT))`;

/**
 * SEARCH_TRIGGERS keep deliveries_search in step with every writer of deliveries, a restore and the sqlite3
 * shell included, as they use no function of ours: a body stored is indexed, one dropped (purge, dropBodies)
 * or a row deleted (a tombstone forgotten) leaves the index.
 */
const SEARCH_TRIGGERS = `
  CREATE TRIGGER deliveries_search_insert AFTER INSERT ON deliveries WHEN ${INDEXABLE("new.body")}
  BEGIN
    INSERT INTO deliveries_search (rowid, words) SELECT new.rowid, ${WORDS("new.body")};
  END;
  CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON deliveries
  BEGIN
    DELETE FROM deliveries_search WHERE rowid = old.rowid;
    INSERT INTO deliveries_search (rowid, words) SELECT new.rowid, ${WORDS("new.body")} WHERE ${INDEXABLE("new.body")};
  END;
  CREATE TRIGGER deliveries_search_delete AFTER DELETE ON deliveries
  BEGIN
    DELETE FROM deliveries_search WHERE rowid = old.rowid;
  END;`;

/** SearchQueue is what SqliteSearching needs of its inbox: its statements, its clock and its commit queue. */
export interface SearchQueue {
  sql: Statements;
  now: () => number;
  enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial?: boolean): Promise<unknown>;
}

/** searchStatusOf reads search_state: one row, cheap enough to read before each search. */
export function searchStatusOf(sql: Statements): SearchStatus {
  const r = sql("SELECT * FROM search_state").get() as Record<string, number | null>;
  const enabled = r.enabled === 1;
  return {
    enabled,
    backfilled: Number(r.backfilled),
    toBackfill: Number(r.to_backfill),
    ready: enabled && Number(r.done_rowid) >= Number(r.until_rowid),
    changedAt: r.changed_at === null ? null : Number(r.changed_at),
  };
}

/** checkSearchable throws SearchOff when a filter asks for bodyJson or bodyWords and the index cannot answer yet. */
export function checkSearchable(sql: Statements, filter: { bodyJson?: string; bodyWords?: string }): void {
  if (filter.bodyJson === undefined && filter.bodyWords === undefined) return;
  const status = searchStatusOf(sql);
  if (!status.ready) throw new SearchOff(status);
}

/** SqliteSearching turns a SqliteInbox's search index on and off. */
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

  async enable(options: EnableSearchOptions = {}): Promise<SearchStatus> {
    const { sql, now } = this.queue;
    const batch = Math.max(1, options.batch ?? DEFAULTS.searchBackfillBatch);
    // The triggers and the backfill's goal in one transaction: a row is either stored after it (a trigger
    // indexes it) or at or below until_rowid (the backfill does).
    await this.atomic((db) => {
      if (!searchStatusOf(sql).enabled) {
        db.exec(SEARCH_TRIGGERS);
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
    for (;;) {
      const status = await this.atomic(() => {
        const s = sql("SELECT enabled, until_rowid, done_rowid FROM search_state").get() as Record<string, number>;
        // Disabled meanwhile, or done: nothing to read.
        if (s.enabled !== 1 || s.done_rowid >= s.until_rowid) return undefined;
        const range = sql(
          // Tombstones are walked past but not counted: they have no body to index.
          "SELECT count(*) FILTER (WHERE p IS NULL) AS n, max(rowid) AS last FROM (SELECT rowid, purged_at AS p FROM deliveries WHERE rowid > ? AND rowid <= ? ORDER BY rowid LIMIT ?)",
        ).get(s.done_rowid, s.until_rowid, batch) as { n: number; last: number | null };
        const last = range.last ?? s.until_rowid;
        // A row a trigger indexed already (its body stored again since) is not indexed twice.
        const indexed = Number(
          sql(
            `INSERT INTO deliveries_search (rowid, words)
               SELECT d.rowid, ${WORDS("d.body")} FROM deliveries d
               WHERE d.rowid > ? AND d.rowid <= ? AND ${INDEXABLE("d.body")}
                 AND d.rowid NOT IN (SELECT rowid FROM deliveries_search WHERE rowid > ? AND rowid <= ?)`,
          ).run(s.done_rowid, last, s.done_rowid, last).changes,
        );
        sql("UPDATE search_state SET done_rowid = ?, backfilled = backfilled + ?").run(last, range.n);
        writeAudit(sql, options.audit, indexed, now());
        return searchStatusOf(sql);
      });
      if (status === undefined) break;
      options.onBatch?.(status);
    }
    return searchStatusOf(sql);
  }

  disable(audit?: Audit): Promise<boolean> {
    const { sql, now } = this.queue;
    return this.atomic((db) => {
      const was = searchStatusOf(sql).enabled;
      if (was) {
        db.exec(`DROP TRIGGER IF EXISTS deliveries_search_insert; DROP TRIGGER IF EXISTS deliveries_search_update;
                 DROP TRIGGER IF EXISTS deliveries_search_delete;`);
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
export function filterSqlChecked(sql: Statements, filter: Filter): { where: string; params: SqlValue[] } {
  // A form that cannot narrow is refused first (a TypeError, the caller's mistake), whatever the index's state.
  const where = filterSql(filter, "sqlite");
  checkSearchable(sql, filter);
  return where;
}
