// postgres/reads.ts: what the operator reads of an Inbox on PostgreSQL (status, summary, search, lists,
// attempts and the attempt log's pages for copy, destinations, gauges), apart from the delivery's life in
// postgres.ts. PostgresInbox holds a PostgresReads and hands it these calls. Reads go straight to the pool,
// outside the commit queue of postgres/commit.ts: they lock nothing and wait for no batch.

import type pg from "pg";
import { filterSqlChecked, searchSettings } from "./searching.ts";
import { DEFAULTS } from "../defaults.ts";
import { NOW, toPg } from "./commit.ts";
import type { Pool } from "./pool.ts";
import {
  NO_DESTINATION,
  type Attempt,
  type Bucket,
  type Cursor,
  type Delivery,
  type DestinationState,
  type Filter,
  type Gauges,
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
  toGauges,
  toKeptAttempt,
} from "../rows.ts";
import { DISTINCT_SOURCES, filterSql, type IdKeys, idKeysSql, ORDERING_SQL, searchSql } from "../sql.ts";
import { periodOf } from "./periods.ts";
import { walkedPage } from "./searchwalk.ts";
import { readsBodies, SearchTooBroad } from "../search.ts";

// Past this many rows (by the planner's statistics), summary() estimates a common source's total instead
// of counting it: counting takes about 20 ms per 100,000 rows here, and the overview is asked every 5 s.
const ESTIMATE_ABOVE_ROWS = 200_000;

/**
 * listWindows are the ranges of received_at a list (search() with a filter that reads no body) reads in turn on
 * PostgreSQL, newest first, each the filter narrowed to one: the UTC day of the list's upper bound (its until,
 * its cursor's time, or else the day of now and all after it), then the days before it one at a time until
 * `days` in all, then all that is older. A page is newest first, so every row of a range comes before the next
 * range's, and a page the first range fills needs no other: each statement's plan names that day's partition
 * alone (with the hot one), where one statement over every day planned them all and, cold, read each day's
 * index and first rows for its newest match (docs/performance.md#lists-at-ten-million). The last range keeps
 * the filter's since; a range that reaches it is the last.
 */
export function listWindows(
  filter: Filter,
  after: Cursor | undefined,
  now: number,
  days: number = DEFAULTS.listDays,
): Filter[] {
  const bounds = [
    ...(filter.until === undefined ? [] : [Math.ceil(filter.until)]),
    ...(after === undefined ? [] : [Math.floor(after.receivedAt) + 1]),
  ];
  let until: number | undefined = bounds.length === 0 ? undefined : Math.min(...bounds);
  const since = filter.since === undefined ? undefined : Math.floor(filter.since);
  const windows: Filter[] = [];
  let from = periodOf(until === undefined ? now : until - 1).from;
  for (let n = 0; n < days && (since === undefined || since < from); n++) {
    windows.push({ ...filter, since: from, ...(until === undefined ? {} : { until }) });
    until = from;
    from = periodOf(from - 1).from;
  }
  windows.push({ ...filter, ...(until === undefined ? {} : { until }) });
  return windows;
}

// daysHeld is a snapshot's first statement: a lock on the parents of the days' partitions that a purge detaches,
// taken before the snapshot is (LOCK takes none). A purge detaches a day's bodies and moves those it keeps to
// another partition as it releases a day (periods.ts releasePeriod): to a snapshot taken before, whose rows still
// have their bodies, those bodies are not there, as after a TRUNCATE. The lock makes the purge's DETACH wait for
// the read (and give way, the day left whole for the next purge), so what the snapshot reads was in place before it.
export const DAYS_HELD = "LOCK TABLE ONLY delivery_history, delivery_bodies IN ACCESS SHARE MODE";

/** heldSnapshot runs a read of several statements in one snapshot (pool.snapshot()) that holds the days first. */
export function heldSnapshot<T>(pool: Pool, run: (client: pg.PoolClient) => Promise<T>): Promise<T> {
  return pool.snapshot(async (client) => {
    await client.query(DAYS_HELD);
    return run(client);
  });
}

/**
 * byId is a filter with an ID as the condition that names the ID's sources and days as values (filterSql() with
 * the IdKeys idKeysSql() reads, on client, in its snapshot or transaction), with those keys, or undefined when
 * the ID is not stored: reads and the bulk commands by ID (postgres/bulk.ts) plan for the ID's days' partitions alone.
 */
export async function byId(
  client: pg.PoolClient,
  filter: Filter & { id: string },
): Promise<{ where: string; params: SqlValue[]; keys: IdKeys } | undefined> {
  const { sql, params } = idKeysSql(filter.id, filter.source);
  const r = (await client.query(toPg(sql), params)).rows[0];
  if (r.sources === null) return undefined;
  const keys: IdKeys = { sources: r.sources, first: Number(r.first), last: Number(r.last) };
  return { ...filterSql(filter, "postgres", keys), keys };
}

/**
 * PostgresReads is the operator's side of PostgresInbox, which holds one and hands it these reads: each
 * goes straight to the pool, and takes the inbox's clock (pinned in tests, else the database's own).
 */
export class PostgresReads {
  private readonly pool: Pool;
  private readonly pinned: (() => number) | undefined;
  private readonly searchTimeoutMs: number;

  constructor(pool: Pool, pinned: (() => number) | undefined, searchTimeoutMs: number = DEFAULTS.searchTimeoutMs) {
    this.pool = pool;
    this.pinned = pinned;
    this.searchTimeoutMs = searchTimeoutMs;
  }

  private now(): number | null {
    return this.pinned ? this.pinned() : null;
  }

  async attempts(d: { source: string; id: string; receivedAt: number; destination?: string }): Promise<Attempt[]> {
    const { rows } = await this.pool.query(
      `SELECT * FROM attempts WHERE source = $1 AND id = $2 AND started_at >= $3
         AND ($4::text IS NULL OR destination = $4) ORDER BY started_at, seq`,
      [d.source, d.id, d.receivedAt, d.destination ?? null],
    );
    return rows.map(toAttempt);
  }

  // find names the ID as a search does: its sources and days read from delivery_keys first, then a probe per
  // source in those days' partitions alone, both in one snapshot; rather than every day's partition read whole
  // for an ID without its source.
  async find(id: string, source?: string): Promise<Delivery[]> {
    const filter = { id, source };
    return this.snapshot(filter, async (client) => {
      const found = await byId(client, filter);
      if (found === undefined) return [];
      const { rows } = await client.query(
        toPg(`SELECT * FROM deliveries WHERE ${found.where} ORDER BY source, route`),
        found.params,
      );
      return rows.map(toDelivery);
    });
  }

  // list is search() of a status and a source, bodies and all: the same rows newest first, read a day at a time
  // (listWindows()), where one statement over the view planned every day's partition and read each one's newest
  // rows (docs/performance.md#lists-at-ten-million). Its order names the route last, as search()'s does.
  async list(filter: { status?: Status; source?: string; limit?: number } = {}): Promise<Delivery[]> {
    return this.search({ status: filter.status, source: filter.source }, { limit: filter.limit ?? 20 });
  }

  async status(): Promise<InboxStatus> {
    const grouped = await this.pool.query(
      "SELECT source, event_type, status, count(*) AS n FROM deliveries GROUP BY source, event_type, status ORDER BY source, event_type",
    );
    const { counts, sources } = countsBySource(grouped.rows);
    const failed = await this.pool.query(
      `SELECT source, id, attempts, error, event_type, destination FROM deliveries WHERE status = 'failed'
       ORDER BY received_at, source, id, route LIMIT 100`,
    );
    const oldest = await this.pool.query(
      `SELECT ${NOW} - min(received_at) AS age FROM deliveries WHERE status IN ('received', 'processing')`,
      [this.now()],
    );
    const conflicts = await this.pool.query(
      "SELECT count(*) AS rows, coalesce(sum(conflicts), 0) AS copies FROM deliveries WHERE conflicts > 0",
    );
    const ordering = await this.pool.query(ORDERING_SQL.counts);
    const held = await this.pool.query(
      toPg(ORDERING_SQL.held.replace("k.due > ?", `k.due > ${NOW.replace("$1", "?")}`)),
      [this.now()],
    );
    const age = oldest.rows[0].age as number | null;
    return {
      counts,
      sources,
      failed: failed.rows.map((r) => ({
        source: r.source,
        id: r.id,
        attempts: r.attempts,
        error: r.error,
        eventType: r.event_type,
        destination: r.destination,
      })),
      oldestWaitingMs: age === null ? null : Math.max(0, age),
      conflicts: { deliveries: conflicts.rows[0].rows, copies: Number(conflicts.rows[0].copies) },
      ordering: orderingStatus(ordering.rows[0], held.rows),
    };
  }

  /**
   * summary counts what is not done exactly, from its partial index. Done is the rest of each source's
   * total, and PostgreSQL has no cheap exact count: a million rows take 200 ms or more to count. So once the
   * planner's statistics say the table is large, a common source's total is estimated from them (as
   * riverui and pgAdmin do), and the summary says so; a small table, or a rare source, is counted.
   */
  async summary(): Promise<Summary> {
    const [open, sources, stats, oldest, conflicts] = await Promise.all([
      this.pool.query(
        "SELECT source, status, count(*) AS n FROM deliveries WHERE status <> 'done' GROUP BY source, status",
      ),
      this.pool.query(DISTINCT_SOURCES),
      this.pool.query(
        // Each partition's own (docs/table.md#hot-and-cold): autovacuum analyzes the partitions, never the
        // partitioned table, whose own statistics stay empty.
        `SELECT c.reltuples::float8 AS rows, st.most_common_vals::text::text[] AS vals, st.most_common_freqs::float8[] AS freqs
         FROM pg_partition_tree(to_regclass('delivery_rows')) t JOIN pg_class c ON c.oid = t.relid
         LEFT JOIN pg_stats st ON st.schemaname = current_schema() AND st.tablename = c.relname AND st.attname = 'source'
         WHERE t.isleaf`,
      ),
      this.pool.query(
        `SELECT ${NOW} - min(received_at) AS age FROM deliveries WHERE status IN ('received', 'processing')`,
        [this.now()],
      ),
      this.pool.query(
        "SELECT count(*) AS rows, coalesce(sum(conflicts), 0) AS copies FROM deliveries WHERE conflicts > 0",
      ),
    ]);
    // The partitions that hold rows, as their statistics say; a source is estimated only where every one of
    // them has it among its most common values, else counted.
    const parts = (stats.rows as { rows: number; vals: string[] | null; freqs: number[] | null }[]).filter(
      (r) => Number(r.rows) > 0,
    );
    const estimatedRows = parts.reduce((sum, r) => sum + Number(r.rows), 0);
    const large = estimatedRows >= ESTIMATE_ABOVE_ROWS;
    const estimateOf = (source: string): number | undefined => {
      let n = 0;
      for (const r of parts) {
        const at = (r.vals ?? []).indexOf(source);
        if (at < 0) return undefined;
        n += Number(r.rows) * r.freqs![at]!;
      }
      return n;
    };
    let estimated = false;
    const totals = await Promise.all(
      sources.rows.map(async ({ source }: { source: string }) => {
        const n = large ? estimateOf(source) : undefined;
        if (n !== undefined) {
          estimated = true;
          return { source, n: Math.round(n) };
        }
        const { rows } = await this.pool.query("SELECT count(*) AS n FROM deliveries WHERE source = $1", [source]);
        return { source, n: rows[0].n as number };
      }),
    );
    const age = oldest.rows[0].age as number | null;
    const summary = summarise(totals, open.rows, age === null ? null : Math.max(0, age), {
      deliveries: conflicts.rows[0].rows,
      copies: Number(conflicts.rows[0].copies),
    });
    // An estimate may fall below what is exactly known not to be done; done is then nought, not negative.
    for (const x of summary.sources) x.counts.done = Math.max(0, x.counts.done);
    summary.counts.done = summary.sources.reduce((sum, x) => sum + x.counts.done, 0);
    return { ...summary, estimated };
  }

  async histogram(since: number, bucketMs: number, until?: number): Promise<Bucket[]> {
    // The clock's now, pinned or the database's, is the default end: the same one every statement uses.
    const end = until ?? this.now() ?? Date.now();
    const buckets = emptyBuckets(since, bucketMs, end);
    const [received, finished] = await Promise.all([
      this.pool.query(
        `SELECT (received_at - $1) / $2 AS b, count(*) AS n FROM deliveries
         WHERE received_at >= $1 AND received_at < $3 GROUP BY b`,
        [since, bucketMs, end],
      ),
      this.pool.query(
        `SELECT (finished_at - $1) / $2 AS b, status, count(*) AS n FROM deliveries
         WHERE finished_at >= $1 AND finished_at < $3 AND status IN ('done', 'failed') GROUP BY b, status`,
        [since, bucketMs, end],
      ),
    ]);
    for (const r of received.rows) buckets[r.b]!.received = r.n;
    for (const r of finished.rows) buckets[r.b]![r.status as "done" | "failed"] = r.n;
    return buckets;
  }

  async page(after: { source: string; id: string; route?: number } | undefined, limit: number): Promise<Delivery[]> {
    const { rows } =
      after === undefined
        ? await this.pool.query("SELECT * FROM deliveries ORDER BY source, id, route LIMIT $1", [limit])
        : await this.pool.query(
            "SELECT * FROM deliveries WHERE (source, id, route) > ($1, $2, $3) ORDER BY source, id, route LIMIT $4",
            [after.source, after.id, after.route ?? 32767, limit],
          );
    // Here a processing row's available_at is its lease's end; the other backend keeps its due time.
    return rows.map(toDelivery);
  }

  /**
   * attemptPage reads the attempt log in the order of its index (source, id, destination, seq), a page after
   * the cursor, then the rest of the last route's tries, each with its delivery's received_at and hash.
   */
  async attemptPage(after: AttemptCursor | undefined, limit: number): Promise<KeptAttempt[]> {
    const tries = `SELECT a.*, d.received_at, d.body_sha256 FROM attempts a
        JOIN delivery_rows d ON d.source = a.source AND d.id = a.id AND d.destination = a.destination
       WHERE a.started_at >= d.received_at`;
    const { rows } =
      after === undefined
        ? await this.pool.query(`${tries} ORDER BY a.source, a.id, a.destination, a.seq LIMIT $1`, [limit])
        : await this.pool.query(
            `${tries} AND (a.source, a.id, a.destination, a.seq) > ($1, $2, $3, $4)
              ORDER BY a.source, a.id, a.destination, a.seq LIMIT $5`,
            [after.source, after.id, after.destination, after.seq, limit],
          );
    const last = rows.at(-1);
    // A full page may have cut a route's log short: restoreAttempts() writes a route's tries only whole.
    if (last !== undefined && rows.length === limit)
      rows.push(
        ...(
          await this.pool.query(
            `${tries} AND a.source = $1 AND a.id = $2 AND a.destination = $3 AND a.seq > $4 ORDER BY a.seq`,
            [last.source, last.id, last.destination, last.seq],
          )
        ).rows,
      );
    return rows.map(toKeptAttempt);
  }

  /**
   * search reads a page in one of three ways. An ID's sources and days are read from delivery_keys first, and
   * its rows then by their values, so that the plan is made for its days' partitions alone (filterSql()). A
   * list (no body read) reads its ranges of days newest first (listWindows()), until the page is full. Either
   * runs its statements in one snapshot. A search of bodies or of the search index stays one statement, under
   * its statement timeout (searchQuery()): each range would search its index again.
   */
  async search(filter: Filter, page: { after?: Cursor; limit?: number; bodies?: boolean } = {}): Promise<Delivery[]> {
    const limit = searchPageLimit(page.limit);
    const checked = await filterSqlChecked(this.pool, filter);
    const { id } = filter;
    const windows =
      id === undefined && !readsBodies(filter) ? listWindows(filter, page.after, this.now() ?? Date.now()) : [];
    // A body search with many matches is walked back from its newest hour (searchwalk.ts), in one transaction.
    const { keyed } = checked;
    if (id === undefined && keyed !== undefined)
      return this.searchRun(filter, (client) =>
        walkedPage(client, { ...checked, keyed }, { ...page, limit }, this.now() ?? Date.now()),
      );
    // One statement needs no snapshot of its own.
    if (id === undefined && windows.length <= 1) {
      const { sql, params } = searchSql(
        "postgres",
        windows.length === 1 ? filterSql(windows[0]!, "postgres") : checked,
        { ...page, limit },
      );
      return (await this.searchQuery(filter, toPg(sql), params)).rows.map(toDelivery);
    }
    return this.snapshot(filter, async (client) => {
      if (id !== undefined) {
        const found = await byId(client, { ...filter, id });
        if (found === undefined) return [];
        const { sql, params } = searchSql("postgres", found, { ...page, limit });
        return (await client.query(toPg(sql), params)).rows.map(toDelivery);
      }
      const found: Delivery[] = [];
      for (const window of windows) {
        const { sql, params } = searchSql("postgres", filterSql(window, "postgres"), {
          ...page,
          limit: limit - found.length,
        });
        found.push(...(await client.query(toPg(sql), params)).rows.map(toDelivery));
        if (found.length === limit) break;
      }
      return found;
    });
  }

  // count of an ID reads its sources and days first, as search() does (byId()), so the count's plan holds its
  // days' partitions alone; an ID not stored is nought without a statement over the rows.
  async count(filter: Filter): Promise<number> {
    const { where, params } = await filterSqlChecked(this.pool, filter);
    const { id } = filter;
    if (id !== undefined)
      return this.snapshot(filter, async (client) => {
        const found = await byId(client, { ...filter, id });
        if (found === undefined) return 0;
        const { rows } = await client.query(
          toPg(`SELECT count(*) AS n FROM deliveries WHERE ${found.where}`),
          found.params,
        );
        return Number(rows[0].n);
      });
    const { rows } = await this.searchQuery(
      filter,
      toPg(`SELECT count(*) AS n FROM deliveries WHERE ${where}`),
      params,
    );
    return Number(rows[0].n);
  }

  /**
   * snapshot runs a search's statements in one snapshot (pool.snapshot()), under its statement timeout when it
   * reads bodies or the search index, as searchQuery() does.
   */
  private async snapshot<T>(filter: Filter, run: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const bounded = readsBodies(filter) && this.searchTimeoutMs !== 0;
    const since = performance.now();
    try {
      return await heldSnapshot(this.pool, async (client) => {
        if (bounded)
          await client.query("SELECT set_config('statement_timeout', $1, true)", [String(this.searchTimeoutMs)]);
        return run(client);
      });
    } catch (error) {
      throw this.refused(error, since);
    }
  }

  // refused is the error a search's statement met: SearchTooBroad when it was its statement timeout's.
  private refused(error: unknown, since: number): unknown {
    // 57014 is also pg_cancel_backend's: only a cancel that came once the bound had passed is the bound's.
    const code = (error as { code?: unknown }).code;
    if (code === "57014" && this.searchTimeoutMs > 0 && performance.now() - since >= this.searchTimeoutMs)
      return new SearchTooBroad(this.searchTimeoutMs, { cause: error });
    return error;
  }

  /**
   * searchQuery runs a search's statement; one that reads bodies or the search index runs in a transaction of
   * its own under searchSettings(): a statement timeout, so that a search whose words are all common, or whose
   * range is wide, is stopped by the server rather than scanning for minutes, and no JIT nor, but for a scan of
   * bodies, parallel workers. They end with the transaction: the session's own settings, and the next
   * borrower's behind PgBouncer in transaction mode, are never touched.
   */
  private async searchQuery(filter: Filter, sql: string, params: SqlValue[]): Promise<pg.QueryResult> {
    if (!readsBodies(filter)) return this.pool.query(sql, params);
    return this.searchRun(filter, (client) => client.query(sql, params));
  }

  // searchRun runs a search's statements in a transaction of their own, under searchSettings().
  private async searchRun<T>(filter: Filter, run: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await this.pool.transaction();
    const since = performance.now();
    try {
      await searchSettings(client, filter, this.searchTimeoutMs);
      const result = await run(client);
      // A read: nothing to keep, and a ROLLBACK cannot meet a standby's wait as a COMMIT can.
      await client.query("ROLLBACK");
      client.release();
      return result;
    } catch (error) {
      // A refused search is the server's answer, not a broken connection: rolled back, the connection goes
      // back to the pool, so a run of too-broad searches does not open one connection each. Only one whose
      // rollback fails too is ended.
      await client.query("ROLLBACK").then(
        () => client.release(),
        () => client.release(error instanceof Error ? error : new Error(String(error))),
      );
      throw this.refused(error, since);
    }
  }

  async kept(): Promise<Kept> {
    const { rows } = await this.pool.query(
      `SELECT count(*) FILTER (WHERE purged_at IS NULL) AS bodies,
              coalesce(sum(octet_length(body)) FILTER (WHERE purged_at IS NULL), 0) AS bytes,
              min(received_at) FILTER (WHERE purged_at IS NULL) AS oldest_body,
              count(*) FILTER (WHERE purged_at IS NOT NULL) AS tombstones,
              min(received_at) FILTER (WHERE purged_at IS NOT NULL) AS oldest_tombstone,
              (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('delivery_rows'))
                + pg_total_relation_size('delivery_keys')
                + (SELECT coalesce(sum(pg_total_relation_size(relid)), 0) FROM pg_partition_tree('delivery_bodies')) AS file
       FROM deliveries`,
    );
    const r = rows[0];
    return {
      bodies: { count: r.bodies, bytes: Number(r.bytes), oldest: r.oldest_body },
      tombstones: { count: r.tombstones, oldest: r.oldest_tombstone },
      fileBytes: r.file,
    };
  }

  async destinations(windowMs: number = DEFAULTS.breakerWindowMs): Promise<DestinationState[]> {
    const [open, states, clock] = await Promise.all([
      this.pool.query(
        "SELECT destination, status, count(*) AS n FROM deliveries WHERE status <> 'done' GROUP BY destination, status",
      ),
      this.pool.query("SELECT * FROM destinations"),
      this.pool.query(`SELECT ${NOW} AS now`, [this.now()]),
    ]);
    const counts = new Map<string, { waiting: number; processing: number; failed: number }>();
    const at = (name: string) =>
      counts.get(name) ?? (counts.set(name, { waiting: 0, processing: 0, failed: 0 }), counts.get(name)!);
    for (const r of open.rows) {
      const c = at(r.destination);
      if (r.status === "received") c.waiting = r.n;
      else if (r.status === "processing") c.processing = r.n;
      else c.failed = r.n;
    }
    const rows = new Map(states.rows.map((r) => [r.name as string, r]));
    for (const name of rows.keys()) at(name);
    // The handler is every inbox's destination, even one with nothing waiting; the others have a row once a worker tallies them.
    at(DEFAULTS.destination);
    counts.delete(NO_DESTINATION);
    return [...counts.keys()]
      .sort()
      .map((name) => toDestinationState(name, rows.get(name), counts.get(name)!, windowMs, Number(clock.rows[0].now)));
  }

  async query(sql: string, ...params: SqlValue[]): Promise<Record<string, unknown>[]> {
    // Not run again after a lost connection: it may be a write whose COMMIT went through unheard.
    return (await this.pool.query(toPg(sql), params, { retry: false })).rows;
  }

  /**
   * gauges counts in one statement, so one snapshot: waiting and leased rows through the partial index
   * that claims use, failed ones through theirs, and done as each source's total less those.
   */
  async gauges(): Promise<Gauges> {
    const now = this.pinned?.() ?? Date.now();
    const { rows } = await this.pool.query(
      `SELECT source, status, count(*) AS n, min(received_at) AS oldest FROM deliveries
       WHERE status IN ('received', 'processing') GROUP BY source, status
       UNION ALL
       SELECT source, 'failed', count(*), NULL FROM deliveries WHERE status = 'failed' GROUP BY source
       UNION ALL
       SELECT source, 'total', count(*), NULL FROM deliveries GROUP BY source`,
    );
    return toGauges(rows, now);
  }
}
