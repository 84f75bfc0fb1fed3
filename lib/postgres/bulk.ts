// postgres/bulk.ts: the operator's bulk writes on PostgreSQL: restore() and restoreAttempts() from another
// inbox's pages, retry and replay by filter, purge() and dropBodies(). Each runs in batches, each batch one
// op of the commit queue (postgres/commit.ts), so acks get the server in between. PostgresInbox holds one and
// hands it these calls; it reaches the queue through the CommitQueue the inbox gives it.

import { filterSqlChecked } from "./searching.ts";
import type pg from "pg";
import { DEFAULTS } from "../defaults.ts";
import { whileMoved } from "../errors.ts";
import { NOW, toPg, type Locks } from "./commit.ts";
import type {
  Audit,
  BulkOptions,
  Cursor,
  Delivery,
  Filter,
  KeptAttempt,
  Purged,
  PurgeOptions,
  SqlValue,
} from "../store.ts";
import { bulkBatchSize, purgeCutoffs, replayDestination } from "../checks.ts";
import { type IdKeys, replayToCount } from "../sql.ts";
import { paced } from "../timing.ts";
import { enterKeys, rebuildKeys, settleRows } from "./order-keys.ts";
import {
  bodyKept,
  type Bounded,
  dropDetached,
  gaveWay,
  givingWay,
  historyBefore,
  historyOf,
  makePeriods,
  ownTransaction,
  type Period,
  periodOf,
  periodsBefore,
  periodsMade,
  type Released,
  releaseDay,
  releasedBefore,
  releasePeriod,
  unreleased,
  unreleasedSpans,
} from "./periods.ts";
import type { Pool } from "./pool.ts";
import { byId, heldSnapshot } from "./reads.ts";
import { writeAudit } from "./records.ts";

/** Dropped is one batch of a purge: the bodies it dropped and their bytes, how many rows it picked, and the last one's time. */
interface Dropped {
  n: number;
  bytes: number;
  picked: number;
  last: number;
}

/**
 * Marked is what a purge's batches make tombstones of: the rows where picks (with its params), walked from the
 * time from (the earliest when unset); with bodyRows false their bodies' rows are left to the DROP of their day.
 */
interface Marked {
  where: string;
  params: SqlValue[];
  from?: number;
  bodyRows?: boolean;
}

// leftWhole ends a give-way transaction's last try quietly: a day whose lock was not had in time is left
// whole, for the next purge (its bodies' release) or for forget's rows one by one (its history).
function leftWhole(error: unknown): undefined {
  if (!gaveWay(error)) throw error;
  return undefined;
}

// The done rows that keep their bodies (no purged_at, and their day not released since): what purge marks.
// Not bodyKept(): a plain conjunction, whose NOT EXISTS the planner can make an anti-join.
const DONE_KEPT = `status = 'done' AND purged_at IS NULL AND ${unreleased()}`;
// Of a released day, the done rows that keep their bodies: done since its release (? its released_at).
const DONE_SINCE = "status = 'done' AND purged_at IS NULL AND finished_at >= ?::bigint";

// Stretch is one part of what a bulk command walks, oldest first: a condition in SQL, with ? parameters, and
// their values. The parts of one walk never hold the same row.
interface Stretch {
  sql: string;
  params: SqlValue[];
}

/** CommitQueue is what the bulk writes need of the inbox: its pool, its clock, and its commit queue. */
export interface CommitQueue {
  pool: Pool;
  pinned: (() => number) | undefined;
  /** other queues an op of its own in the next batch (PostgresCommitter's). */
  other(run: (client: pg.PoolClient) => Promise<unknown>, together?: boolean, locks?: Locks): Promise<unknown>;
  /** notify wakes listening workers at commit. */
  notify(client: pg.PoolClient, added: number): void;
}

/** PostgresBulk is the operator's bulk writes of a PostgresInbox, each batch queued through its CommitQueue. */
export class PostgresBulk {
  private readonly pool: Pool;
  private readonly pinned: (() => number) | undefined;
  private readonly committee: CommitQueue;

  constructor(committee: CommitQueue) {
    this.committee = committee;
    this.pool = committee.pool;
    this.pinned = committee.pinned;
  }

  private now(): number | null {
    return this.pinned ? this.pinned() : null;
  }

  private other(run: (client: pg.PoolClient) => Promise<unknown>, together?: boolean, locks?: Locks): Promise<unknown> {
    return this.committee.other(run, together, locks);
  }

  private notify(client: pg.PoolClient, added: number): void {
    this.committee.notify(client, added);
  }

  async restore(deliveries: readonly Delivery[], audit?: Audit): Promise<number> {
    // The days of the bodies restored are made first, as the inbox would have made them as it lived through
    // them: into the default partition, a copy's or an import's months of bodies would be purged there row by
    // row, never released by the day, and each day made after would have to read them all (PostgreSQL checks
    // a new partition's range against the default partition's rows, under a lock every store waits behind).
    // Which days exist is read at each call, not remembered: a purge, here or in another process, may have
    // released a day since. One read of the catalogue a call, and a CREATE only for a day that is missing.
    const days = new Map<string, number>();
    for (const d of deliveries) {
      if (d.body.length <= DEFAULTS.inlineBodyBytes) continue;
      const day = periodOf(d.receivedAt);
      days.set(day.name, day.from);
    }
    if (days.size > 0) {
      const made = new Set(await periodsMade(this.pool));
      for (const [name, from] of days)
        if (!made.has(name)) await makePeriods(this.pool, from, 0, DEFAULTS.periodLockMs);
    }
    const col = <K extends keyof Delivery>(k: K) => deliveries.map((d) => d[k] ?? null);
    // Ordered rows take their arrival order from when they were received, as store() would have.
    const byArrival = deliveries.map((d, i) => [d.receivedAt, i] as const).sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    const place = new Array<number>(deliveries.length);
    byArrival.forEach(([, i], n) => (place[i] = n));
    return this.other(async (client) => {
      const { rows } = await client.query(
        `WITH u AS (
           SELECT * FROM unnest($2::text[], $3::text[], $4::bytea[], $5::text[], $6::text[], $7::text[], $8::bigint[], $9::bigint[],
                                $10::text[], $11::integer[], $12::bigint[], $13::bigint[], $14::text[], $15::integer[], $16::bigint[],
                                $17::integer[], $18::bigint[], $19::text[], $20::bigint[], $21::text[], $22::integer[],
                                $23::smallint[], $24::text[], $25::text[], $26::text[], $27::text[])
                  AS u(s, i, b, h, ct, et, pt, ra, st, at, av, lu, er, cf, fa, rp, pu, ok, ev, nw, n, ro, de, hd, tp, og)),
         -- The key first, the arbiter delivery_rows cannot have (docs/table.md#hot-and-cold): a row only for a new one.
         k AS (
           INSERT INTO delivery_keys (source, id, route, received_at) SELECT s, i, ro, ra FROM u ORDER BY s, i, ro
           ON CONFLICT (source, id, route) DO NOTHING
           RETURNING source, id, route),
         r AS (
           INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at,
                                      status, attempts, available_at, leased_until, lease_ms, error, conflicts, finished_at,
                                      replays, purged_at, order_key, event_time, newer_id, arrival, route, destination, headers, traceparent, origin)
           SELECT s, i, CASE WHEN octet_length(b) <= $28 THEN b ELSE '\\x'::bytea END, h, ct, et, pt, ra, st, at,
                  CASE WHEN st = 'processing' THEN coalesce(lu, av) ELSE av END, lu,
                  CASE WHEN lu IS NULL THEN NULL ELSE greatest(1, lu - ${NOW}) END, er, cf, fa, rp, pu, ok, ev, nw,
                  CASE WHEN ok IS NULL THEN NULL ELSE (SELECT nextval('deliveries_arrival')) * 1000000 + n END, ro, de, hd, tp, og
           FROM u JOIN k ON k.source = u.s AND k.id = u.i AND k.route = u.ro
           ORDER BY s, i, ro
           RETURNING source, id, route, destination, order_key, received_at),
         -- Each restored body in its own table, as store() keeps it (docs/table.md#bodies-apart); from the new
         -- keys, as r's rows are, not from r, which the planner takes for one row and joined in a nested loop
         -- (postgres/store.ts).
         b AS (
           INSERT INTO delivery_bodies (source, id, route, received_at, body)
           SELECT u.s, u.i, u.ro, u.ra, u.b FROM u JOIN k ON k.source = u.s AND k.id = u.i AND k.route = u.ro
           WHERE octet_length(u.b) > $28)
         SELECT source, destination, order_key FROM r`,
        [
          this.now(),
          col("source"),
          col("id"),
          col("body"),
          col("bodySha256"),
          col("contentType"),
          col("eventType"),
          col("providerTime"),
          col("receivedAt"),
          col("status"),
          col("attempts"),
          col("availableAt"),
          col("leasedUntil"),
          col("error"),
          col("conflicts"),
          col("finishedAt"),
          deliveries.map((d) => d.replays ?? 0),
          deliveries.map((d) => d.purgedAt ?? null),
          col("orderKey"),
          col("eventTime"),
          col("newerId"),
          place,
          deliveries.map((d) => d.route ?? 0),
          deliveries.map((d) => d.destination ?? DEFAULTS.destination),
          deliveries.map((d) => (d.headers ? JSON.stringify(d.headers) : null)),
          deliveries.map((d) => d.traceparent ?? null),
          deliveries.map((d) => d.origin ?? "webhook"),
          DEFAULTS.inlineBodyBytes,
        ],
      );
      const keys = new Map<string, [string, string, string]>();
      for (const r of rows)
        if (r.order_key !== null)
          keys.set(JSON.stringify([r.source, r.destination, r.order_key]), [r.source, r.destination, r.order_key]);
      if (keys.size > 0) await rebuildKeys(client, [...keys.values()].sort());
      await writeAudit(client, audit, rows.length, this.now());
      return rows.length;
    }) as Promise<number>;
  }

  /**
   * restoreAttempts writes the tries in one statement, each route's in their seq order, into a route of the
   * same delivery that had none when the statement began (its own rows are not yet visible to it), the newest
   * kept of them alone (the target's attemptsKept, as its own tries' trim would leave them); a route given in
   * two calls gets the first call's tries alone.
   */
  restoreAttempts(tries: readonly KeptAttempt[], kept: number): Promise<number> {
    const col = (f: (t: KeptAttempt) => unknown) => tries.map(f);
    return this.other(async (client) => {
      const { rowCount } = await client.query(
        `INSERT INTO attempts (source, id, destination, attempt, started_at, ms, status, error, headers, body)
         SELECT s, i, d, at, sa, ms, st, er, hd, bd FROM (
           SELECT *, row_number() OVER (PARTITION BY s, i, d ORDER BY q DESC) AS newest
             FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::integer[], $6::bigint[], $7::integer[],
                         $8::smallint[], $9::text[], $10::text[], $11::text[], $12::bigint[], $13::text[])
                  AS u(s, i, d, q, at, sa, ms, st, er, hd, bd, ra, h)) u
          WHERE newest <= $14
            AND EXISTS (SELECT 1 FROM delivery_rows r WHERE r.source = u.s AND r.id = u.i AND r.destination = u.d
                           AND r.received_at = u.ra AND r.body_sha256 = u.h)
            AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.source = u.s AND a.id = u.i AND a.destination = u.d)
          ORDER BY s, i, d, q`,
        [
          col((t) => t.source),
          col((t) => t.id),
          col((t) => t.destination),
          col((t) => t.seq),
          col((t) => t.attempt),
          col((t) => t.startedAt),
          col((t) => t.ms),
          col((t) => t.status),
          col((t) => t.error),
          col((t) => (t.headers === null ? null : JSON.stringify(t.headers))),
          col((t) => t.body),
          col((t) => t.receivedAt),
          col((t) => t.bodySha256),
          kept,
        ],
      );
      return rowCount ?? 0;
    }) as Promise<number>;
  }

  async retryMatching(filter: Filter, options: BulkOptions = {}): Promise<number> {
    const failed = "status = 'failed' AND purged_at IS NULL";
    if (options.dryRun) return this.countWhere(filter, [{ sql: failed, params: [] }]);
    let total = 0;
    // The batch's days are named as values too (received_at = ANY), beside the join that matches each key: a join
    // alone prunes nothing as the statement is planned, and the plan opened every day's partition (34 against 1,
    // 3.3 against 0.2 ms of planning, a key of one day among 30).
    await this.inBatches(filter, [{ sql: failed, params: [] }], options, async (client, keys) => {
      const { rows } = await client.query(
        `UPDATE delivery_rows d SET status = 'received', attempts = 0, error = NULL, available_at = ${NOW}, finished_at = NULL
         FROM unnest($2::text[], $3::text[], $4::smallint[], $5::bigint[]) AS u(s, i, r, at)
         WHERE d.source = u.s AND d.id = u.i AND d.route = u.r AND d.received_at = u.at AND d.status = 'failed'
           AND d.received_at = ANY($5::bigint[])
         RETURNING d.source, d.id, d.order_key, d.destination`,
        [
          this.now(),
          keys.map((k) => k.source),
          keys.map((k) => k.id),
          keys.map((k) => k.route!),
          keys.map((k) => k.receivedAt),
        ],
      );
      total += rows.length;
      await settleRows(client, rows, false);
      this.notify(client, rows.length);
      return rows.length;
    });
    return total;
  }

  async replayMatching(
    filter: Filter,
    options: BulkOptions & { to?: string } = {},
  ): Promise<{ replayed: number; tombstoned: number }> {
    if (options.to !== undefined) return this.replayTo(filter, options.to, options);
    // A row of a released day is a tombstone though its own purged_at is unset (periods.ts releaseDay): of such a
    // day, only the rows done since its release are asked for (stretches()).
    const kept = await this.stretches(filter, DONE_KEPT, (at) => [{ sql: DONE_SINCE, params: [at] }]);
    const tombstoned = () =>
      this.countWhere(filter, [{ sql: "status = 'done' AND purged_at IS NOT NULL", params: [] }]);
    if (options.dryRun) return { replayed: await this.countWhere(filter, kept), tombstoned: await tombstoned() };
    let replayed = 0;
    await this.inBatches(filter, kept, options, async (client, keys) => {
      const { rows } = await client.query(
        `UPDATE delivery_rows d SET status = 'received', attempts = 0, replays = d.replays + 1, error = NULL, available_at = ${NOW},
                finished_at = NULL, leased_until = NULL, lease_token = NULL
         FROM unnest($2::text[], $3::text[], $4::smallint[], $5::bigint[]) AS u(s, i, r, at)
         WHERE d.source = u.s AND d.id = u.i AND d.route = u.r AND d.received_at = u.at AND d.status = 'done' AND d.purged_at IS NULL
           AND d.received_at = ANY($5::bigint[]) AND ${unreleased("d.")}
         RETURNING d.source, d.id, d.order_key, d.destination`,
        [
          this.now(),
          keys.map((k) => k.source),
          keys.map((k) => k.id),
          keys.map((k) => k.route!),
          keys.map((k) => k.receivedAt),
        ],
      );
      replayed += rows.length;
      await settleRows(client, rows, false);
      this.notify(client, rows.length);
      return rows.length;
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  // replayTo sends each matching delivery (once, whichever of its rows matched) to one destination: its
  // row there goes again if done, and a row is added, as the next route, if its routes never chose it.
  // A row there that is still waiting or failed is left alone: it is on its way, or `retry` is the tool.
  private async replayTo(
    filter: Filter,
    to: string,
    options: BulkOptions,
  ): Promise<{ replayed: number; tombstoned: number }> {
    replayDestination(to);
    // Of a released day, what keeps its body is what is not done, or was done since the release (stretches()):
    // the statuses named, as the day's index of what is not done (status first) is probed for each: a planner with
    // no statistics of the day's statuses (a release analyzed its finished_at alone, before it took the statuses
    // too) took `<> 'done'` for nearly every row and walked the day in received_at's order. The pick asks the two apart:
    // as one condition, its plan read the day's every entry in delivery_rows_kept for the second (a delivery in
    // both, one route failed and one done since, is taken once: seen). The count asks them as one, counting
    // each delivery once.
    const open = "status IN ('received', 'processing', 'failed') AND purged_at IS NULL";
    const kept = await this.stretches(filter, bodyKept(), (at) => [
      { sql: open, params: [] },
      { sql: DONE_SINCE, params: [at] },
    ]);
    const tombstoned = () => this.countWhere(filter, [{ sql: "purged_at IS NOT NULL", params: [] }]);
    if (options.dryRun) {
      // The view's purged_at says the rest: each stretch only bounds the time, and a released day's rows.
      const counted = await this.stretches(filter, "TRUE", (at) => [
        { sql: `(${open} OR ${DONE_SINCE})`, params: [at] },
      ]);
      return { replayed: await this.countTo(filter, to, counted), tombstoned: await tombstoned() };
    }
    let replayed = 0;
    const seen = new Set<string>();
    await this.inBatches(filter, kept, options, async (client, keys) => {
      const mine = keys.filter((k) => !seen.has(`${k.source}\u0000${k.id}`) && seen.add(`${k.source}\u0000${k.id}`));
      if (mine.length === 0) return 0;
      // The statements below reach a delivery's other routes (its row there, its route numbers) by its key, which
      // prunes nothing as a statement is planned: every day's partition was planned (and locked). So the days of
      // all its routes are read from delivery_keys first and named as values, as a retry's batch names its rows'.
      const days = (
        await client.query(
          `SELECT array_agg(DISTINCT k.received_at) AS days FROM unnest($1::text[], $2::text[]) AS u(s, i)
             JOIN delivery_keys k ON k.source = u.s AND k.id = u.i`,
          [mine.map((k) => k.source), mine.map((k) => k.id)],
        )
      ).rows[0].days;
      const again = await client.query(
        `UPDATE delivery_rows d SET status = 'received', attempts = 0, replays = d.replays + 1, error = NULL, available_at = ${NOW},
                finished_at = NULL, leased_until = NULL, lease_token = NULL
         FROM unnest($2::text[], $3::text[]) AS u(s, i)
         WHERE d.source = u.s AND d.id = u.i AND d.destination = $4 AND d.status = 'done' AND d.purged_at IS NULL
           AND d.received_at = ANY($5::bigint[]) AND ${unreleased("d.")}
         RETURNING d.source, d.id, d.order_key, d.destination`,
        [this.now(), mine.map((k) => k.source), mine.map((k) => k.id), to, days],
      );
      // Routing after the fact: a delivery with no row there gets one, as its next route (its keys' next number).
      const added = await client.query(
        `WITH a AS (
         INSERT INTO delivery_rows (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status,
                                 available_at, order_key, event_time, arrival, route, destination, headers, traceparent, replays, origin)
         SELECT d.source, d.id, CASE WHEN octet_length(d.body) <= $6 THEN d.body ELSE '\\x'::bytea END, d.body_sha256, d.content_type, d.event_type, d.provider_time, d.received_at, 'received', ${NOW},
                d.order_key, d.event_time, CASE WHEN d.order_key IS NULL THEN NULL ELSE nextval('deliveries_arrival') * 1000000 END,
                (SELECT max(m.route) + 1 FROM delivery_keys m WHERE m.source = d.source AND m.id = d.id), $5, d.headers, d.traceparent, 1, d.origin
         FROM unnest($2::text[], $3::text[], $4::smallint[], $7::bigint[]) AS u(s, i, r, at)
         JOIN deliveries d ON d.source = u.s AND d.id = u.i AND d.route = u.r AND d.received_at = u.at AND d.purged_at IS NULL
                          AND d.received_at = ANY($8::bigint[])
         WHERE NOT EXISTS (SELECT 1 FROM deliveries o WHERE o.source = u.s AND o.id = u.i AND o.destination = $5
                                                      AND o.received_at = ANY($8::bigint[]))
         ORDER BY d.source, d.id
         RETURNING source, id, route, received_at, order_key, event_time, arrival, available_at),
         -- The new row's body, copied from the row it was replayed from, in its own table.
         b AS (
         INSERT INTO delivery_bodies (source, id, route, received_at, body)
         SELECT a.source, a.id, a.route, a.received_at, s.body FROM a
         JOIN unnest($2::text[], $3::text[], $4::smallint[], $7::bigint[]) AS u(s, i, r, at) ON u.s = a.source AND u.i = a.id
         JOIN deliveries s ON s.source = u.s AND s.id = u.i AND s.route = u.r AND s.received_at = u.at
                          AND s.received_at = ANY($8::bigint[])
         WHERE octet_length(s.body) > $6),
         -- Its key, as a store writes it (docs/table.md#hot-and-cold): no other statement adds a route to a delivery.
         k AS (INSERT INTO delivery_keys (source, id, route, received_at) SELECT source, id, route, received_at FROM a)
         SELECT source, id, order_key, event_time, arrival, available_at FROM a`,
        [
          this.now(),
          mine.map((k) => k.source),
          mine.map((k) => k.id),
          mine.map((k) => k.route!),
          to,
          DEFAULTS.inlineBodyBytes,
          mine.map((k) => k.receivedAt),
          days,
        ],
      );
      replayed += again.rows.length + added.rows.length;
      await settleRows(client, again.rows, false);
      const ordered = added.rows.filter((r) => r.order_key !== null);
      if (ordered.length > 0) {
        await enterKeys(
          client,
          ordered.map((r) => ({
            source: r.source,
            destination: to,
            key: r.order_key,
            id: r.id,
            eventTime: r.event_time,
            seq: r.arrival,
            due: r.available_at,
            strict: false,
          })),
        );
      }
      this.notify(client, again.rows.length + added.rows.length);
      return again.rows.length + added.rows.length;
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  // countWhere counts what a bulk command would take (countOf()), the sum over its stretches.
  private countWhere(filter: Filter, stretches: Stretch[]): Promise<number> {
    return this.countOf(filter, (where, params) =>
      stretches.map((s) => ({
        sql: `SELECT count(*) AS n FROM deliveries WHERE ${s.sql} AND ${where}`,
        params: [...s.params, ...params],
      })),
    );
  }

  // countTo counts what replayTo would send (replayToCount()), the sum over its stretches: a delivery's routes
  // are all received at its time, so no delivery is in two. For an ID, its row there is looked for in the ID's
  // days alone, as the batch does.
  private countTo(filter: Filter, to: string, stretches: Stretch[]): Promise<number> {
    return this.countOf(filter, (where, params, keys) =>
      stretches.map((s) =>
        keys
          ? {
              sql: replayToCount(`${s.sql} AND ${where}`, "t.received_at BETWEEN ?::bigint AND ?::bigint"),
              params: [...s.params, ...params, to, keys.first, keys.last],
            }
          : { sql: replayToCount(`${s.sql} AND ${where}`), params: [...s.params, ...params, to] },
      ),
    );
  }

  // countOf runs the counts built from the filter's where and adds them up; an ID's sources and days are read
  // first and named as values (byId(), handing the counts its keys). Several statements, or an ID's, are read in
  // one snapshot, as count() reads.
  private async countOf(
    filter: Filter,
    count: (where: string, params: SqlValue[], keys?: IdKeys) => { sql: string; params: SqlValue[] }[],
  ): Promise<number> {
    const { where, params } = await filterSqlChecked(this.pool, filter);
    const { id } = filter;
    const sum = async (client: pg.PoolClient | Pool, built: { sql: string; params: SqlValue[] }[]) => {
      let n = 0;
      for (const one of built) n += Number((await client.query(toPg(one.sql), one.params)).rows[0].n);
      return n;
    };
    if (id !== undefined)
      return heldSnapshot(this.pool, async (client) => {
        const found = await byId(client, { ...filter, id });
        if (found === undefined) return 0;
        return sum(client, count(found.where, found.params, found.keys));
      });
    const built = count(where, params);
    if (built.length === 1) return sum(this.pool, built);
    return heldSnapshot(this.pool, (client) => sum(client, built));
  }

  // stretches splits the filter's time into the spans that no released day covers, where pick says what a bulk
  // command takes, and the released days, oldest first, where released(its released_at) says it: of such a day,
  // a done row keeps its body only if done since the release, which the day's index of finished rows finds.
  // Every done row of a released day stays in delivery_rows_kept, so a walk of that index over the day read each
  // row's heap to find it a tombstone, a million a day, before it found anything to take
  // (docs/operations.md#a-day-released-by-one-row); purge's batches walk the same way. The days are read once,
  // before the walk: a day released during it is passed over by pick's own unreleased().
  private async stretches(
    filter: Filter,
    pick: string,
    released: (releasedAt: number) => Stretch[],
  ): Promise<Stretch[]> {
    const start = filter.since === undefined ? Number.MIN_SAFE_INTEGER : Math.floor(filter.since);
    const end = filter.until === undefined ? Number.MAX_SAFE_INTEGER : Math.ceil(filter.until);
    const releases = (await releasedBefore(this.pool, end)).filter((r) => r.until > start);
    const within = "received_at >= ?::bigint AND received_at < ?::bigint";
    const parts = [
      ...unreleasedSpans(releases, start, end).map(([from, until]) => ({
        from,
        stretches: [{ sql: `${pick} AND ${within}`, params: [from, until] }],
      })),
      ...releases.map(({ day, until, releasedAt }) => ({
        from: Math.max(day, start),
        stretches: released(releasedAt).map((s) => ({
          sql: `${s.sql} AND ${within}`,
          params: [...s.params, Math.max(day, start), Math.min(until, end)],
        })),
      })),
    ];
    return parts.sort((a, b) => a.from - b.from).flatMap((p) => p.stretches);
  }

  // inBatches walks the deliveries that match, stretch by stretch, oldest first, a batch per transaction, locking
  // each batch's rows and handing their keys to act inside it; what act changed is added to the audit entry in the same
  // transaction (the first batch writes it, even when it changes nothing). The cursor moves past every
  // batch, so a delivery a worker changes meanwhile (retried, then failed again) is never taken twice in one run.
  private async inBatches(
    filter: Filter,
    stretches: Stretch[],
    options: BulkOptions,
    act: (client: pg.PoolClient, keys: Cursor[]) => Promise<number>,
  ): Promise<void> {
    const size = bulkBatchSize(options.batch);
    const checked = await filterSqlChecked(this.pool, filter);
    for (const stretch of stretches) await this.inStretch(filter, checked, stretch, size, options, act);
  }

  // inStretch is inBatches' walk of one stretch, from its beginning.
  private async inStretch(
    filter: Filter,
    checked: { where: string; params: SqlValue[] },
    also: Stretch,
    size: number,
    options: BulkOptions,
    act: (client: pg.PoolClient, keys: Cursor[]) => Promise<number>,
  ): Promise<void> {
    const { id } = filter;
    let after: Cursor | undefined;
    for (;;) {
      // A batch that met a row another commit just moved between partitions (a worker's done mark, a retry:
      // 40001) is rolled back whole and run again from the same cursor (DEFAULTS.movedTries).
      const batch = () =>
        this.other(async (client) => {
          // An ID's sources and days are read first, in the batch's transaction, and named as values (byId()), so
          // the batch's plan holds its days' partitions alone rather than every day's, pruned as it ran. An ID
          // not stored picks nothing.
          const named = id === undefined ? checked : await byId(client, { ...filter, id });
          const cursor =
            after === undefined
              ? ""
              : "AND received_at >= ?::bigint AND (received_at, source, id, route) > (?::bigint, ?::text, ?::text, ?::smallint)";
          const { rows } =
            named === undefined
              ? { rows: [] }
              : await client.query(
                  toPg(`SELECT received_at, source, id, route FROM delivery_rows WHERE ${also.sql} AND ${named.where} ${cursor}
                      ORDER BY received_at, source, id, route LIMIT ?::integer FOR UPDATE`),
                  [
                    ...also.params,
                    ...named.params,
                    ...(after ? [after.receivedAt, after.receivedAt, after.source, after.id, after.route!] : []),
                    size,
                  ],
                );
          const keys = rows.map((r) => ({
            receivedAt: r.received_at as number,
            source: r.source as string,
            id: r.id as string,
            route: r.route as number,
          }));
          const changed = keys.length > 0 ? await act(client, keys) : 0;
          await writeAudit(client, options.audit, changed, this.now());
          return keys;
        }) as Promise<Cursor[]>;
      const picked = await whileMoved(batch, DEFAULTS.movedTries);
      if (picked.length < size) return;
      after = picked.at(-1);
    }
  }

  async purge(options: PurgeOptions = {}): Promise<Purged> {
    const { bodiesBefore, forgetBefore, batch, rest } = purgeCutoffs(options, this.pinned ? this.pinned() : Date.now());
    if (options.dryRun) {
      const { rows } = await this.pool.query(
        `SELECT (SELECT count(*) FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < $1) AS bodies,
                (SELECT coalesce(sum(octet_length(body)), 0) FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < $1) AS bytes,
                (SELECT count(*) FROM deliveries WHERE purged_at IS NOT NULL AND received_at < $2)
                + (SELECT count(*) FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < $2) AS forgotten`,
        [bodiesBefore, forgetBefore],
      );
      return { bodies: rows[0].bodies, bytes: Number(rows[0].bytes), forgotten: rows[0].forgotten, vacuumedBytes: 0 };
    }
    const purged: Purged = { bodies: 0, bytes: 0, forgotten: 0, vacuumedBytes: 0 };
    // Whole days first (docs/operations.md#retention-by-period): the day's done rows are made tombstones (the day
    // released by one row in released_days, else in batches of narrow rows), and then its partition of bodies is
    // dropped in one statement, rather than each body deleted. The days ahead are made here too, for the
    // retention schedule keeps them coming.
    await makePeriods(
      this.pool,
      this.pinned ? this.pinned() : Date.now(),
      DEFAULTS.periodsAhead,
      DEFAULTS.periodLockMs,
    );
    await dropDetached(this.pool); // what a crash left between a release and its DROP
    const kept = DONE_KEPT;
    for (const period of await periodsBefore(this.pool, bodiesBefore)) {
      // The day's done rows are made tombstones by one row that says so (releaseDay), in a transaction of its own,
      // off the commit queue; rested after, as long as it took. A day with no partition of its own, one whose
      // lock was not had at once, or one released before (a restore made its bodies' day again) is marked in
      // the batches below.
      const now = this.pinned ? this.pinned() : Date.now();
      const released = await paced(rest, () =>
        releaseDay(
          (run) => ownTransaction(this.pool, run),
          period,
          now,
          (client, n) => writeAudit(client, options.audit, n, this.now()),
          rest,
        ).catch(leftWhole),
      );
      if (released) {
        purged.bodies += released.n;
        purged.bytes += released.bytes;
      }
      if (options.signal?.aborted) return purged;
      if (!released) {
        const where = `${kept} AND received_at < ?::bigint`;
        await this.dropAll(
          { where, params: [period.until], from: period.from, bodyRows: false },
          { batch, rest },
          options,
          purged,
        );
        if (options.signal?.aborted) return purged;
      }
      // A release that cannot have its lock within DEFAULTS.periodLockMs rests and tries again (releasePeriod);
      // after DEFAULTS.periodLockTries the day is left whole for the next purge, its rows already tombstones.
      // Each try is a batch of the purge, rested after (paced) whether it released the day or gave way.
      const bodies = await releasePeriod(
        async (run) => {
          const tried = await paced(rest, () =>
            this.other(run).then(
              (value) => ({ value: value as Released }),
              (error: unknown) => {
                if (!gaveWay(error)) throw error;
                return { error };
              },
            ),
          );
          if ("error" in tried) throw tried.error;
          return tried.value;
        },
        period,
        released ? now : undefined,
        rest,
      ).catch(leftWhole);
      if (bodies) {
        purged.bytes += bodies.bytes;
        await dropDetached(this.pool);
      }
    }
    // Everything else before the cutoff, row by row (stretches()): between the released days, what still has a
    // body, each of them holding its tombstones-to-be in deliveries_kept still, which a walk through the released
    // days would read to find none; and of each released day, the rows done since its release (replayed or
    // retried, and done again), which kept their bodies, found by its index of finished rows.
    for (const s of await this.stretches({ until: bodiesBefore }, kept, (at) => [{ sql: DONE_SINCE, params: [at] }])) {
      await this.dropAll({ where: s.sql, params: s.params }, { batch, rest }, options, purged);
      if (options.signal?.aborted) return purged;
    }
    // Whole days of history first (docs/operations.md#retention-by-period): a day past the forget cutoff that
    // holds nothing forget keeps goes in one DROP; the rest, and the rows of a day that could not be had, row by row.
    await this.forgetDays(forgetBefore, rest, purged, options);
    // Deleted a batch per transaction, so autovacuum (tuned tight on this table) reclaims them as it goes;
    // each batch starts at the last one's time, past the index entries of the rows it deleted (dropBatch). A
    // released day that forget could not drop whole (it holds a failed delivery) has its tombstones forgotten
    // here too: its done rows done before its release.
    const forgettable: { which: string; start: number; before: number; releasedAt?: number }[] = [
      { which: "purged_at IS NOT NULL AND received_at < $1", start: Number.MIN_SAFE_INTEGER, before: forgetBefore },
    ];
    for (const { day, until, releasedAt } of await releasedBefore(this.pool, forgetBefore))
      forgettable.push({
        which:
          "status = 'done' AND purged_at IS NULL AND received_at < $1 AND (finished_at IS NULL OR finished_at < $4)",
        start: day,
        before: Math.min(until, forgetBefore),
        releasedAt,
      });
    for (const { which, start, before, releasedAt } of forgettable) {
      for (let from = start; ; ) {
        if (options.signal?.aborted) return purged;
        const { n, last } = await paced(rest, () => this.forgetBatch(which, before, releasedAt, from, batch, options));
        purged.forgotten += n;
        if (n < batch) break;
        from = last;
      }
    }
    // A day that row by row emptied, or that was made ahead and never used, goes now rather than pile up.
    await this.forgetDays(forgetBefore, rest, purged, options);
    return purged;
  }

  // forgetBatch forgets up to batch rows that which picks (before as $1, releasedAt as $4 where it names it),
  // received at or after from, with their keys and attempt logs, in one transaction.
  private forgetBatch(
    which: string,
    before: number,
    releasedAt: number | undefined,
    from: number,
    batch: number,
    options: PurgeOptions,
  ): Promise<{ n: number; last: number }> {
    return this.other(async (client) => {
      // A forgotten delivery's attempt log goes with it: the answers it kept may be as private as the body.
      const { rows } = await client.query(
        `WITH gone AS (
           DELETE FROM delivery_rows WHERE (source, id, route, received_at) IN (
             SELECT source, id, route, received_at FROM delivery_rows WHERE ${which} AND received_at >= $3
             ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED)
           RETURNING source, id, route, destination, received_at),
         keys AS (
           DELETE FROM delivery_keys k USING gone g WHERE k.source = g.source AND k.id = g.id AND k.route = g.route),
         tries AS (
           DELETE FROM attempts a USING gone g WHERE a.source = g.source AND a.id = g.id AND a.destination = g.destination)
         SELECT count(*)::integer AS n, max(received_at) AS last FROM gone`,
        releasedAt === undefined ? [before, batch, from] : [before, batch, from, releasedAt],
      );
      const forgot = rows[0].n as number;
      await writeAudit(client, options.audit, forgot, this.now());
      return { n: forgot, last: Number(rows[0].last) };
    }) as Promise<{ n: number; last: number }>;
  }

  // forgetDays releases each day of delivery_history that ends before the forget cutoff and holds no row
  // that forget keeps (forgetDay), adding its rows to what was forgotten.
  private async forgetDays(forgetBefore: number, rest: number, purged: Purged, options: PurgeOptions): Promise<void> {
    for (const period of await historyBefore(this.pool, forgetBefore)) {
      if (options.signal?.aborted) return;
      purged.forgotten += (await paced(rest, () => this.forgetDay(period, options.audit))) ?? 0;
    }
  }

  // forgetDay forgets a day of history whole, as forget would row by row, when every row of it is a tombstone
  // (forget deletes those alone: a failed row, or a done one whose body is kept, stays with its day). It
  // returns how many rows went, or undefined when the day stays: it holds a row to keep, or its locks were not
  // had in time (its rows are then forgotten row by row). Three transactions:
  // 1. Under a lock that stops writes to this day alone, the rows' keys in delivery_keys (one statement), their
  //    attempts and their search documents are deleted: the row's delete trigger does that for a row, and a
  //    DROP fires no trigger. A resend is then stored anew, as after forget.
  // 2. The DETACH, which locks delivery_history (done marks wait) for a probe of the partial indexes: a row
  //    moved into the day since (a route of `replay --to` done) keeps it attached, rolled back.
  // 3. The DROP (dropDetached), which a crash after 2 leaves to the next purge.
  // Each lock is waited for DEFAULTS.periodLockMs at most, as a release of bodies is (releasePeriod).
  private async forgetDay(period: Period, audit: Audit | undefined): Promise<number | undefined> {
    const day = historyOf(period); // DDL takes no bound parameters: a name periodOf() made from an integer
    // Of a released day, the done rows kept are those done since its release, which its index of finished
    // rows finds in a probe (releaseDay analyzed the day); every other done row of it is in deliveries_kept still.
    const [release] = (await releasedBefore(this.pool, period.until)).filter((r) => r.day === period.from);
    const doneKept = release === undefined ? "" : "AND finished_at >= $1::bigint";
    const keepSql = `SELECT EXISTS (SELECT 1 FROM ${day} WHERE status = 'done' AND purged_at IS NULL ${doneKept})
                      OR EXISTS (SELECT 1 FROM ${day} WHERE status = 'failed' AND purged_at IS NULL) AS keep`;
    const keep = (client: pg.PoolClient) =>
      client.query(keepSql, release === undefined ? [] : [release.releasedAt]).then((r) => r.rows[0].keep as boolean);
    // Each in a transaction of its own, rolled back when it finds the day stays (undefined, or false).
    const own = <T>(run: (client: pg.PoolClient) => Promise<T>): Promise<T> =>
      ownTransaction(this.pool, run, (result) => result !== undefined && result !== false);
    // The first gives way once: its rows are then forgotten row by row.
    const n = await givingWay(
      own<number | undefined>,
      async (client, bounded) => {
        await bounded(`LOCK TABLE ${day} IN SHARE MODE`);
        if (await keep(client)) return undefined;
        // Each of the day's rows finds its key, attempts and document by their own index: a hash join read the
        // whole of delivery_keys, every day's keys, to delete one day's (no index on its received_at, which
        // every store would write).
        await client.query(
          "SELECT set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true)",
        );
        const { rows } = await client.query(
          `WITH docs AS (DELETE FROM deliveries_search s USING ${day} r WHERE r.route = 0 AND s.source = r.source AND s.id = r.id),
              tries AS (DELETE FROM attempts a USING ${day} r
                         WHERE a.source = r.source AND a.id = r.id AND a.destination = r.destination),
              keys AS (DELETE FROM delivery_keys k USING ${day} r
                        WHERE k.source = r.source AND k.id = r.id AND k.route = r.route AND k.received_at = r.received_at)
         SELECT count(*)::integer AS n FROM ${day}`,
        );
        return rows[0].n as number;
      },
      { tries: 1 },
    ).catch(leftWhole);
    if (n === undefined) return undefined;
    const detached = await givingWay(own<boolean>, async (client, bounded) => {
      await bounded(`ALTER TABLE delivery_history DETACH PARTITION ${day}`);
      if (await keep(client)) return false; // rolled back: the day stays attached
      // Its release goes with it: a day made again later (a restore's) starts unreleased.
      await client.query("DELETE FROM released_days WHERE day = $1", [period.from]);
      await writeAudit(client, audit, n, this.now());
      return true;
    }).catch(leftWhole);
    if (!detached) return undefined;
    await dropDetached(this.pool);
    return n;
  }

  async dropBodies(filter: Filter, options: BulkOptions = {}): Promise<{ bodies: number; bytes: number }> {
    const { where, params } = await filterSqlChecked(this.pool, filter);
    const size = bulkBatchSize(options.batch);
    // Of a released day, what still has a body is failed, or done since the release (stretches()), each found by
    // its own index rather than by a walk of the day's tombstones.
    const stretches = await this.stretches(filter, `status IN ('done', 'failed') AND ${bodyKept()}`, (at) => [
      { sql: "status = 'failed' AND purged_at IS NULL", params: [] },
      { sql: "status = 'done' AND purged_at IS NULL AND finished_at >= ?::bigint", params: [at] },
    ]);
    const total = { bodies: 0, bytes: 0 };
    if (options.dryRun)
      return heldSnapshot(this.pool, async (client) => {
        for (const s of stretches) {
          const { rows } = await client.query(
            toPg(`SELECT count(*) AS n, coalesce(sum(octet_length(body)), 0) AS bytes FROM deliveries
                   WHERE ${s.sql} AND ${where}`),
            [...s.params, ...params],
          );
          total.bodies += Number(rows[0].n);
          total.bytes += Number(rows[0].bytes);
        }
        return total;
      });
    for (const s of stretches)
      await this.dropAll(
        { where: `${s.sql} AND ${where}`, params: [...s.params, ...params] },
        { batch: size, rest: DEFAULTS.purgeRest },
        options,
        total,
      );
    return total;
  }

  // dropAll runs dropBatch over the rows `what` names, from its time (the earliest when unset), until a batch
  // picks fewer than pace.batch rows or signal aborts, resting pace.rest times as long as each batch took, and adds
  // what it dropped to total.
  private async dropAll(
    what: Marked,
    pace: { batch: number; rest: number },
    options: { audit?: Audit; signal?: AbortSignal },
    total: { bodies: number; bytes: number },
  ): Promise<void> {
    const { where, params, from = Number.MIN_SAFE_INTEGER, bodyRows = true } = what;
    const { batch, rest } = pace;
    for (let at = from; ; ) {
      const { n, bytes, picked, last } = await paced(rest, () =>
        this.dropBatch(where, params, at, batch, options.audit, bodyRows),
      );
      total.bodies += n;
      total.bytes += bytes;
      if (picked < batch || options.signal?.aborted) return;
      at = last;
    }
  }

  // dropBatch empties the bodies of up to batch rows matching where, in one transaction. The row stays with
  // its hash and its key stays in delivery_keys, so a copy is still a duplicate, and a different body a conflict.
  // With bodyRows false the body's own row is left to the DROP of its day's partition (releasePeriod).
  // The rows are picked by partition and ctid with no lock of their own and updated with the condition checked
  // again, so a row changed meanwhile is passed over rather than made a tombstone (one a replay moved out of its
  // partition fails the batch with 40001, and the batch run again passes it over); and a body's bytes are
  // those of the row that goes, not read again through delivery_body(). Against picking them FOR UPDATE and
  // reading each body through delivery_body(), a batch of 1,000 of a day's done rows took 36 ms against 123
  // (docs/operations.md#retention-by-period). Each batch starts at the last one's time (from): the index
  // entries of the rows marked before it stay until vacuum passes, and a batch that started at the cutoff's
  // beginning walked them all again, 248 ms a batch of 100 once 450,000 of a day's million were marked.
  // A row another transaction holds is waited for DEFAULTS.periodLockMs
  // at most, so a purge never takes part in a deadlock (PostgreSQL looks for one only after a second): the
  // batch is rolled back and tried again after a rest, DEFAULTS.periodLockTries times before the purge fails.
  private dropBatch(
    where: string,
    params: SqlValue[],
    from: number,
    batch: number,
    audit: Audit | undefined,
    bodyRows = true,
  ): Promise<Dropped> {
    return givingWay(
      // A row replayed meanwhile (moved out of its history partition: 40001) is passed over when run again.
      (run) => whileMoved(() => this.other(run) as Promise<Dropped>, DEFAULTS.movedTries),
      (client, bounded) => this.dropBatchIn(client, bounded, where, params, from, batch, audit, bodyRows),
    );
  }

  // dropBatchIn is one try of dropBatch, in the transaction of client.
  private async dropBatchIn(
    client: pg.PoolClient,
    bounded: Bounded,
    where: string,
    params: SqlValue[],
    from: number,
    batch: number,
    audit: Audit | undefined,
    bodyRows: boolean,
  ): Promise<Dropped> {
    const { rows } = await bounded(
      toPg(`WITH p AS (SELECT tableoid AS rel, ctid AS at, received_at AS at_time, octet_length(body) AS inline FROM delivery_rows
                       WHERE ${where} AND status IN ('done', 'failed') AND received_at >= ?::bigint ORDER BY received_at LIMIT ?::integer),
                 -- A ctid names a row within its partition only, and the same one a row in each (docs/table.md#hot-and-cold).
                 d AS (UPDATE delivery_rows d SET body = '\\x'::bytea, purged_at = ?::bigint FROM p
                       WHERE d.tableoid = p.rel AND d.ctid = p.at AND d.received_at = p.at_time AND ${where}
                         AND d.status IN ('done', 'failed') AND d.purged_at IS NULL
                       -- A body is in its row or in delivery_bodies, never both: the row's old body is its bytes.
                       RETURNING d.source, d.id, d.route, d.received_at, p.inline),
                 -- The body's own row goes with it (docs/table.md#bodies-apart).
                 b AS (DELETE FROM delivery_bodies b USING d
                       WHERE ?::boolean AND b.source = d.source AND b.id = d.id AND b.route = d.route AND b.received_at = d.received_at
                       RETURNING octet_length(b.body) AS bytes)
            SELECT (SELECT count(*) FROM d)::integer AS n,
                   ((SELECT coalesce(sum(inline), 0) FROM d) + (SELECT coalesce(sum(bytes), 0) FROM b))::bigint AS bytes,
                   (SELECT count(*) FROM p)::integer AS picked, (SELECT max(at_time) FROM p) AS last`),
      [...params, from, batch, this.pinned ? this.pinned() : Date.now(), ...params, bodyRows],
    );
    const n = rows[0].n as number;
    await writeAudit(client, audit, n, this.now());
    return { n, bytes: Number(rows[0].bytes), picked: rows[0].picked as number, last: Number(rows[0].last) };
  }
}
