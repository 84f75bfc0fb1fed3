// sqlite/reads.ts: what the operator reads of an Inbox on SQLite (status, summary, search, lists, histogram,
// attempts and the attempt log's pages for copy, destinations, kept), apart from the delivery's life in
// sqlite.ts. SqliteInbox holds a SqliteReads and hands it these calls; each reads the file in one statement
// or a few, outside the commit queue of sqlite/commit.ts, which it never waits for.

import { filterSqlChecked } from "./searching.ts";
import { walkedPage } from "./searchwalk.ts";
import type { SQLInputValue } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import {
  NO_DESTINATION,
  type DestinationState,
  type Attempt,
  type Bucket,
  type Cursor,
  type Delivery,
  type Filter,
  type InboxStatus,
  type Kept,
  type KeptAttempt,
  type SqlValue,
  type Status,
  type Summary,
  type AttemptCursor,
} from "../store.ts";
import { toDestinationState } from "../breaker.ts";
import { searchPageLimit } from "../checks.ts";
import {
  countsBySource,
  emptyBuckets,
  orderingStatus,
  summarise,
  toAttempt,
  toDelivery,
  toKeptAttempt,
} from "../rows.ts";
import { ORDERING_SQL, searchSql } from "../sql.ts";

import type { Statements } from "./order-keys.ts";

type Row = Record<string, SQLInputValue>;

/** SqliteReads is the operator's side of SqliteInbox: every read, on its connection, at its clock. */
export class SqliteReads {
  private readonly sql: Statements;
  private readonly now: () => number;

  constructor(sql: Statements, now: () => number) {
    this.sql = sql;
    this.now = now;
  }

  /** attempts returns one delivery's attempt log, oldest first. */
  async attempts(d: { source: string; id: string; receivedAt: number; destination?: string }): Promise<Attempt[]> {
    return (
      this.sql(`SELECT * FROM attempts WHERE source = ? AND id = ? AND started_at >= ?
              AND (? IS NULL OR destination = ?) ORDER BY started_at, seq`).all(
        d.source,
        d.id,
        d.receivedAt,
        d.destination ?? null,
        d.destination ?? null,
      ) as Row[]
    ).map(toAttempt);
  }

  /** find returns the deliveries with this ID, in every source or in one. */
  async find(id: string, source?: string): Promise<Delivery[]> {
    const rows =
      source === undefined
        ? this.sql("SELECT * FROM deliveries WHERE id = ? ORDER BY source, route").all(id)
        : this.sql("SELECT * FROM deliveries WHERE id = ? AND source = ? ORDER BY route").all(id, source);
    return (rows as Row[]).map(toDelivery);
  }

  /** list returns deliveries newest first, optionally of one status or source. */
  // list is search() of a status and a source, as on PostgreSQL: the same order (a delivery's routes last) and
  // the same refusal of a limit below 1 on both backends.
  async list(filter: { status?: Status; source?: string; limit?: number } = {}): Promise<Delivery[]> {
    return this.search({ status: filter.status, source: filter.source }, { limit: filter.limit ?? 20 });
  }

  /** status summarises the queue: counts, failures, the oldest wait and conflicting duplicates. */
  async status(): Promise<InboxStatus> {
    const now = this.now();
    const failed = (
      this.sql(`SELECT source, id, attempts, error, event_type, destination FROM deliveries WHERE status = 'failed'
                ORDER BY received_at, rowid LIMIT 100`).all() as Row[]
    ).map((r) => ({
      source: r.source as string,
      id: r.id as string,
      attempts: r.attempts as number,
      error: r.error as string | null,
      eventType: r.event_type as string | null,
      destination: r.destination as string,
    }));
    const oldest = this.sql(
      "SELECT min(received_at) AS t FROM deliveries WHERE status IN ('received', 'processing')",
    ).get() as { t: number | null };
    // Per source and event type, so one inbox fed by several providers can be read at a glance; the totals
    // by status are their sums.
    const { counts, sources } = countsBySource(
      this.sql(`SELECT source, event_type, status, count(*) AS n FROM deliveries
                GROUP BY source, event_type, status ORDER BY source, event_type`).all() as Row[],
    );
    const conflicts = this.sql(
      "SELECT count(*) AS rows, coalesce(sum(conflicts), 0) AS copies FROM deliveries WHERE conflicts > 0",
    ).get() as { rows: number; copies: number };
    return {
      counts,
      sources,
      failed,
      oldestWaitingMs: oldest.t === null ? null : Math.max(0, now - oldest.t),
      conflicts: { deliveries: conflicts.rows, copies: conflicts.copies },
      ordering: orderingStatus(
        this.sql(ORDERING_SQL.counts).get() as Row,
        this.sql(ORDERING_SQL.held).all(now) as Row[],
      ),
    };
  }

  /**
   * summary counts per status and per source for a page that refreshes every few seconds. The rows not
   * done are counted in their partial index; done is each source's total (a count on the primary key)
   * less those, so no statement reads the table itself.
   */
  async summary(): Promise<Summary> {
    const now = this.now();
    const open = this
      // Named, as without statistics SQLite would rather walk the primary key for its order by source.
      .sql(
        "SELECT source, status, count(*) AS n FROM delivery_rows INDEXED BY deliveries_open WHERE status <> 'done' GROUP BY source, status",
      )
      .all() as Row[];
    const totals = (this.sql("SELECT DISTINCT source FROM deliveries").all() as Row[]).map((r) => ({
      source: r.source as string,
      n: (this.sql("SELECT count(*) AS n FROM deliveries WHERE source = ?").get(r.source as string) as { n: number }).n,
    }));
    // Each with status <> 'done' spelled out, which is what lets SQLite pick the partial index.
    const oldest = this.sql(`SELECT min(t) AS t FROM (
              SELECT min(received_at) AS t FROM deliveries WHERE status = 'received' AND status <> 'done'
              UNION ALL SELECT min(received_at) FROM deliveries WHERE status = 'processing' AND status <> 'done')`).get() as {
      t: number | null;
    };
    const conflicts = this.sql(
      "SELECT count(*) AS rows, coalesce(sum(conflicts), 0) AS copies FROM deliveries WHERE conflicts > 0",
    ).get() as { rows: number; copies: number };
    return summarise(
      totals,
      open.map((r) => ({ source: r.source as string, status: r.status as Status, n: r.n as number })),
      oldest.t === null ? null : Math.max(0, now - oldest.t),
      { deliveries: conflicts.rows, copies: conflicts.copies },
    );
  }

  /** histogram counts deliveries received, and done or failed, per bucket; the operator page's chart. */
  async histogram(since: number, bucketMs: number, until: number = this.now()): Promise<Bucket[]> {
    const buckets = emptyBuckets(since, bucketMs, until);
    // node:sqlite binds a JS number as a REAL, so the division is truncated to its bucket by CAST.
    for (const r of this.sql(`SELECT CAST((received_at - ?1) / ?2 AS INTEGER) AS b, count(*) AS n FROM deliveries
            WHERE received_at >= ?1 AND received_at < ?3 GROUP BY b`).all(since, bucketMs, until) as Row[]) {
      buckets[r.b as number]!.received = r.n as number;
    }
    for (const r of this.sql(`SELECT CAST((finished_at - ?1) / ?2 AS INTEGER) AS b, status, count(*) AS n FROM deliveries
            WHERE finished_at >= ?1 AND finished_at < ?3 AND status IN ('done', 'failed') GROUP BY b, status`).all(
      since,
      bucketMs,
      until,
    ) as Row[]) {
      buckets[r.b as number]![r.status as "done" | "failed"] = r.n as number;
    }
    return buckets;
  }

  /** page returns up to limit deliveries in (source, id) order after the cursor, for copying. */
  async page(after: { source: string; id: string; route?: number } | undefined, limit: number): Promise<Delivery[]> {
    const rows =
      after === undefined
        ? this.sql("SELECT * FROM deliveries ORDER BY source, id, route LIMIT ?").all(limit)
        : this.sql(
            "SELECT * FROM deliveries WHERE (source, id, route) > (?, ?, ?) ORDER BY source, id, route LIMIT ?",
          ).all(after.source, after.id, after.route ?? Number.MAX_SAFE_INTEGER, limit);
    return (rows as Row[]).map(toDelivery);
  }

  /**
   * attemptPage reads the attempt log in the order of its index (source, id, destination, seq), a page after
   * the cursor, then the rest of the last route's tries, each with its delivery's received_at and hash.
   */
  async attemptPage(after: AttemptCursor | undefined, limit: number): Promise<KeptAttempt[]> {
    const tries = `SELECT a.*, d.received_at, d.body_sha256 FROM attempts a
        JOIN deliveries d ON d.source = a.source AND d.id = a.id AND d.destination = a.destination
       WHERE a.started_at >= d.received_at`;
    const rows = (
      after === undefined
        ? this.sql(`${tries} ORDER BY a.source, a.id, a.destination, a.seq LIMIT ?`).all(limit)
        : this.sql(
            `${tries} AND (a.source, a.id, a.destination, a.seq) > (?, ?, ?, ?)
              ORDER BY a.source, a.id, a.destination, a.seq LIMIT ?`,
          ).all(after.source, after.id, after.destination, after.seq, limit)
    ) as Row[];
    const last = rows.at(-1);
    // A full page may have cut a route's log short: restoreAttempts() writes a route's tries only whole.
    if (last !== undefined && rows.length === limit)
      rows.push(
        ...(this.sql(`${tries} AND a.source = ? AND a.id = ? AND a.destination = ? AND a.seq > ? ORDER BY a.seq`).all(
          last.source,
          last.id,
          last.destination,
          last.seq,
        ) as Row[]),
      );
    return rows.map(toKeptAttempt);
  }

  /** search returns the deliveries that match, newest first, a page after the cursor (keyset, never OFFSET). */
  async search(filter: Filter, page: { after?: Cursor; limit?: number; bodies?: boolean } = {}): Promise<Delivery[]> {
    const checked = filterSqlChecked(this.sql, filter);
    const limit = searchPageLimit(page.limit);
    // A body search's page: walked newest first when it has many matches (lib/sqlite/searchwalk.ts). Not with an
    // ID, whose rows the primary key finds at once, where a walk would pass every match received since.
    const { walked } = checked;
    if (walked !== undefined && filter.id === undefined)
      return walkedPage(this.sql, { ...checked, walked }, filter, { ...page, limit });
    const { sql, params } = searchSql("sqlite", checked, { ...page, limit });
    return (this.sql(sql).all(...params) as Row[]).map(toDelivery);
  }

  /** count says how many deliveries match. */
  async count(filter: Filter): Promise<number> {
    const { where, params } = filterSqlChecked(this.sql, filter);
    return (this.sql(`SELECT count(*) AS n FROM deliveries WHERE ${where}`).get(...params) as { n: number }).n;
  }

  /** kept says how much is kept: bodies, tombstones, bytes, and the oldest of each. */
  async kept(): Promise<Kept> {
    const bodies = this.sql(
      "SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes, min(received_at) AS oldest FROM deliveries WHERE purged_at IS NULL",
    ).get() as { n: number; bytes: number; oldest: number | null };
    const tombstones = this.sql(
      "SELECT count(*) AS n, min(received_at) AS oldest FROM deliveries WHERE purged_at IS NOT NULL",
    ).get() as { n: number; oldest: number | null };
    const pragma = (name: string) => Object.values(this.sql(`PRAGMA ${name}`).get() as Record<string, number>)[0]!;
    const pageSize = pragma("page_size");
    return {
      bodies: { count: bodies.n, bytes: bodies.bytes, oldest: bodies.oldest },
      tombstones: { count: tombstones.n, oldest: tombstones.oldest },
      fileBytes: pragma("page_count") * pageSize,
      freeBytes: pragma("freelist_count") * pageSize,
      autoVacuum: (["none", "full", "incremental"] as const)[pragma("auto_vacuum")] ?? "none",
    };
  }

  /** query runs one statement with `?` parameters: the handler's own tables, and tests. */
  async query(sql: string, ...params: SqlValue[]): Promise<Record<string, unknown>[]> {
    const statement = this.sql(sql);
    return statement.columns().length === 0
      ? (statement.run(...params), [])
      : (statement.all(...params) as Record<string, unknown>[]);
  }

  /** destinations lists every destination with deliveries or a state of its own, by name. */
  async destinations(windowMs: number = DEFAULTS.breakerWindowMs): Promise<DestinationState[]> {
    const now = this.now();
    const counts = new Map<string, { waiting: number; processing: number; failed: number }>();
    const at = (name: string) =>
      counts.get(name) ?? (counts.set(name, { waiting: 0, processing: 0, failed: 0 }), counts.get(name)!);
    // Only what is not done, through its partial index, so a large inbox is not walked.
    for (const r of this.sql(
      "SELECT destination, status, count(*) AS n FROM delivery_rows INDEXED BY deliveries_open WHERE status <> 'done' GROUP BY destination, status",
    ).all() as Row[]) {
      const c = at(r.destination as string);
      if (r.status === "received") c.waiting = r.n as number;
      else if (r.status === "processing") c.processing = r.n as number;
      else c.failed = r.n as number;
    }
    const rows = new Map((this.sql("SELECT * FROM destinations").all() as Row[]).map((r) => [r.name as string, r]));
    for (const name of rows.keys()) at(name);
    // The handler is every inbox's destination, even one with nothing waiting; the others have a row once a worker tallies them.
    at(DEFAULTS.destination);
    counts.delete(NO_DESTINATION);
    return [...counts.keys()]
      .sort()
      .map((name) => toDestinationState(name, rows.get(name), counts.get(name)!, windowMs, now));
  }
}
