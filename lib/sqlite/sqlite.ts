// sqlite/sqlite.ts: the Inbox on one node:sqlite file, the embedded default: a delivery's whole life (store,
// claim, extend, finish, fail, release, retry) and the operator's reads and bulk actions, as SQL on the
// file that sqlite/schema.ts opens, every write group-committed by sqlite/commit.ts (WAL with
// synchronous=FULL, or with syncOffLoop the receiver's own fdatasync off the event loop), and a gauge
// thread beside it. connect() in inbox.ts picks it for any --db that is not a postgres:// URL.

import { closeSync } from "node:fs";
import type { DatabaseSync, SQLInputValue } from "node:sqlite";
import { Worker } from "node:worker_threads";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { SqliteCommitter } from "./commit.ts";
import { MIGRATIONS, readDurability, type Durability } from "./schema.ts";
import {
  DESTINATION_NAME,
  NO_DESTINATION,
  ORDERING_SQL,
  STATUSES,
  breakerAfter,
  bulkBatchSize,
  checkClaim,
  checkOptions,
  gateClaim,
  checkPermit,
  gatePermit,
  type Permit,
  type Rate,
  retryDelay,
  routesOf,
  toDestinationState,
  type BreakerChange,
  type BreakerPolicy,
  type ClaimOptions,
  type DestinationState,
  type FailOptions,
  type Tally,
  emptyBuckets,
  filterSql,
  orderOf,
  orderingStatus,
  paced,
  purgeCutoffs,
  searchPageLimit,
  sha256,
  summarise,
  tellSetAside,
  toDelivery,
  toGauges,
  type AttemptError,
  type Bucket,
  type BulkOptions,
  type Cursor,
  type Delivery,
  type Failure,
  type Filter,
  type Gauges,
  type Inbox,
  type InboxOptions,
  type InboxStatus,
  type Incoming,
  type Kept,
  type Lease,
  type LocalWrite,
  type PurgeOptions,
  type Purged,
  type SetAside,
  type SqlValue,
  type Status,
  type Stored,
  type Summary,
  type Tx,
} from "../store.ts";

// The gauge thread's whole program: one read transaction, so the totals and the live counts agree.
// Each live status is counted through its own partial index; the totals through the primary key's.
const GAUGER = `
const { DatabaseSync } = require("node:sqlite");
const { parentPort, workerData } = require("node:worker_threads");
const db = new DatabaseSync(workerData.path, { timeout: workerData.busyTimeoutMs });
// INDEXED BY, because for GROUP BY source the planner would rather walk the whole primary key (1 s at 1M rows).
const live = db.prepare(\`
  SELECT source, 'received' AS status, count(*) AS n, min(received_at) AS oldest FROM deliveries INDEXED BY deliveries_due
  WHERE status = 'received' AND order_key IS NULL GROUP BY source
  UNION ALL
  SELECT source, 'received', count(*), min(received_at) FROM deliveries INDEXED BY deliveries_ordered
  WHERE status = 'received' AND order_key IS NOT NULL GROUP BY source
  UNION ALL
  SELECT source, 'processing', count(*), min(received_at) FROM deliveries INDEXED BY deliveries_leased
  WHERE status = 'processing' GROUP BY source
  UNION ALL
  SELECT source, 'failed', count(*), NULL FROM deliveries INDEXED BY deliveries_failed WHERE status = 'failed' GROUP BY source\`);
const totals = db.prepare("SELECT source, 'total' AS status, count(*) AS n, NULL AS oldest FROM deliveries GROUP BY source");
parentPort.on("message", () => {
  try {
    db.exec("BEGIN");
    try {
      parentPort.postMessage({ rows: [...live.all(), ...totals.all()] });
    } finally {
      db.exec("COMMIT");
    }
  } catch (error) {
    parentPort.postMessage({ error: error.message });
  }
});`;

type Row = Record<string, SQLInputValue>;

// toLease turns a claimed row into its Lease, and remembers its rowid for the finish.
function toLease(row: Row): Lease {
  const lease = toDelivery(row) as Lease;
  lease.token = row.lease_token as string;
  rowids.set(lease, row.rowid as number);
  return lease;
}

// The rowid each lease was claimed at, so its finish finds the row without the (source, id) index; kept
// out of the Lease type, which is the handler's.
const rowids = new WeakMap<Lease, number>();

/** SqliteInbox is the Inbox on one node:sqlite file: the embedded default. */
export class SqliteInbox extends SqliteCommitter implements Inbox {
  readonly backend = "sqlite";
  /** What the database was opened with, read back from SQLite: journal mode, synchronous, version, runtime. */
  readonly durability: Durability;
  readonly target: string;
  private readonly tx: Tx;
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly maxAttempts: number;
  private readonly backoffOptions: { retryDelayMs: number; retryCapMs: number; retryJitter: number };
  private gauger: Worker | undefined;

  constructor(path: string, options: InboxOptions = {}) {
    checkOptions(options);
    super(path, options);
    this.target = path;
    const db = this.db;
    this.durability = { ...readDurability(db), ...(this.walFds.length > 0 ? { ownWalSync: true } : {}) };
    this.tx = { backend: "sqlite", db, run: (sql, ...params) => Number(this.sql(sql).run(...params).changes) };
    this.now = options.now ?? Date.now;
    this.random = options.random ?? Math.random;
    this.maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULTS.maxAttempts);
    this.backoffOptions = {
      retryDelayMs: options.retryDelayMs ?? DEFAULTS.retryDelayMs,
      retryCapMs: options.retryCapMs ?? DEFAULTS.retryCapMs,
      retryJitter: options.retryJitter ?? DEFAULTS.retryJitter,
    };
  }

  /**
   * store saves a delivery if its (source, id) is new, one row per route; a duplicate keeps the first copy.
   * Route 0 is what a copy is a duplicate of: its row alone is inserted first, and counts conflicts.
   */
  store(delivery: Incoming): Promise<Stored> {
    const source = delivery.source ?? DEFAULTS.source;
    const receivedAt = this.now();
    const digest = sha256(delivery.body);
    const ordered = orderOf(delivery, receivedAt);
    const routes = routesOf(delivery);
    const headers = delivery.headers ? JSON.stringify(delivery.headers) : null;
    return this.enqueue((db) => {
      const insert = this.sql(
        `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time,
                                 received_at, status, available_at, order_key, event_time, route, destination, headers, traceparent,
                                 finished_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (source, id, route) DO NOTHING`,
      );
      // No route chose it: kept, done, so that a copy is still a duplicate, and nothing runs it.
      const none = routes.length === 0;
      const add = (route: number) => {
        const destination = none ? NO_DESTINATION : routes[route]!;
        const inserted = insert.run(
          source,
          delivery.id,
          delivery.body,
          digest,
          delivery.contentType ?? null,
          delivery.eventType ?? null,
          delivery.providerTime ?? null,
          receivedAt,
          none ? "done" : "received",
          receivedAt,
          none ? null : ordered.key,
          ordered.eventTime,
          route,
          destination,
          headers,
          delivery.traceparent ?? null,
          none ? receivedAt : null,
        );
        if (inserted.changes === 1 && ordered.key !== null && !none) {
          this.enter(
            source,
            destination,
            ordered.key,
            delivery.id,
            ordered.eventTime!,
            Number(inserted.lastInsertRowid),
            receivedAt,
            ordered.strict,
          );
        }
        return inserted.changes === 1;
      };
      if (add(0)) {
        for (let route = 1; route < routes.length; route++) add(route);
        return "stored";
      }
      const conflict = this.sql(
        "UPDATE deliveries SET conflicts = conflicts + 1 WHERE source = ? AND id = ? AND route = 0 AND body_sha256 <> ?",
      ).run(source, delivery.id, digest);
      return conflict.changes === 1 ? "conflict" : "duplicate";
    }) as Promise<Stored>;
  }

  /** claim leases the oldest due delivery of a destination, or returns undefined when there is nothing to do. */
  async claim(leaseMs: number = DEFAULTS.leaseMs, options: ClaimOptions = {}): Promise<Lease | undefined> {
    return (await this.claimBatch(1, leaseMs, options))[0];
  }

  /**
   * claimBatch leases up to limit due deliveries of one destination in one transaction: new ones, retries
   * whose time has come, and ones whose lease expired because their worker vanished. Each gets a fresh
   * token. The destination's row gates it first (gateClaim): paused, open, probing, in flight, rate.
   */
  claimBatch(limit: number, leaseMs: number = DEFAULTS.leaseMs, options: ClaimOptions = {}): Promise<Lease[]> {
    if (!Number.isInteger(limit) || limit < 1) throw new TypeError(`claimBatch: expected limit >= 1, got ${limit}`);
    const destination = checkClaim(options);
    let setAside: SetAside[] = [];
    const claimed = this.enqueue((db) => {
      setAside = [];
      const now = this.now();
      // A destination that is paused, or whose breaker is open, costs its lane one read and nothing more.
      const row = this.sql("SELECT * FROM destinations WHERE name = ?").get(destination) as Row | undefined;
      if (row !== undefined && gateClaim(row, limit, now, {}, 0).n === 0) return [];
      // If the clock stepped back, a dead worker's lease or a retry would wait out the jump: none may be
      // further off than its own lease length, or the retry cap, from now.
      // Each claim looks after its own destination's rows, through the indexes that lead with it.
      this.sql(
        `UPDATE deliveries SET leased_until = ? + lease_ms
         WHERE destination = ? AND status = 'processing' AND leased_until > ? AND leased_until - lease_ms > ?`,
      ).run(now, destination, now, now);
      const latest = now + this.backoffOptions.retryCapMs;
      this.sql(
        "UPDATE deliveries SET available_at = ? WHERE destination = ? AND status = 'received' AND order_key IS NULL AND available_at > ?",
      ).run(latest, destination, latest);
      this.sql("UPDATE order_keys SET due = ? WHERE destination = ? AND due > ?").run(latest, destination, latest);
      // A worker that crashed on its last try would otherwise be retried forever: set it aside.
      const gaveUp = this.sql(
        `UPDATE deliveries SET status = 'failed', leased_until = NULL, lease_token = NULL, finished_at = ?,
                error = 'gave up: the lease expired on the last attempt (the worker crashed or hung)'
         WHERE destination = ? AND status = 'processing' AND leased_until <= ? AND attempts >= ?
         RETURNING source, id, order_key, destination, attempts, error`,
      ).all(now, destination, now, this.maxAttempts) as Row[];
      for (const r of gaveUp)
        if (r.order_key !== null)
          this.settleKey(r.source as string, r.destination as string, r.order_key as string, r.id as string, true);
      setAside = gaveUp.map((r) => ({
        source: r.source as string,
        id: r.id as string,
        destination,
        attempts: r.attempts as number,
        error: r.error as string,
      }));
      const inFlight =
        options.maxInFlight === undefined
          ? 0
          : (
              this.sql(
                "SELECT count(*) AS n FROM deliveries WHERE status = 'processing' AND destination = ? AND leased_until > ?",
              ).get(destination, now) as { n: number }
            ).n;
      const gate = gateClaim(row, limit, now, options, inFlight);
      if (gate.n === 0) return [];
      // Which of the rows about to be claimed are takeovers: RETURNING sees only the new status.
      const expired = this.sql(
        "SELECT rowid FROM deliveries WHERE status = 'processing' AND destination = ? AND leased_until <= ? LIMIT ?",
      ).all(destination, now, gate.n) as Row[];
      // Three kinds are due: unordered deliveries, the heads of idle keys, and leases that expired. An
      // ordered delivery is reached only as its key's head, so two of one key never run at once.
      const rows = this.sql(
        `UPDATE deliveries
           SET status = 'processing', attempts = attempts + 1, leased_until = ?, lease_ms = ?,
               lease_token = lower(hex(randomblob(12)))
           WHERE rowid IN (
             SELECT rowid FROM (
               SELECT rowid, due FROM (SELECT rowid, available_at AS due FROM deliveries
                                       WHERE destination = ? AND status = 'received' AND order_key IS NULL AND available_at <= ?
                                       ORDER BY available_at LIMIT ?)
               UNION ALL
               SELECT rowid, due FROM (SELECT rowid, leased_until AS due FROM deliveries
                                       WHERE destination = ? AND status = 'processing' AND leased_until <= ? ORDER BY leased_until LIMIT ?)
               UNION ALL
               SELECT rowid, due FROM (SELECT d.rowid, k.due FROM order_keys k
                                       JOIN deliveries d ON d.source = k.source AND d.id = k.head_id AND d.destination = k.destination
                                                        AND d.status = 'received'
                                       WHERE k.destination = ? AND k.due <= ? ORDER BY k.due LIMIT ?)
             ) ORDER BY due, rowid LIMIT ?)
           RETURNING rowid, *`,
      ).all(
        now + leaseMs,
        leaseMs,
        destination,
        now,
        gate.n,
        destination,
        now,
        gate.n,
        destination,
        now,
        gate.n,
        gate.n,
      ) as Row[];
      const leases = rows.map(toLease);
      for (const lease of expired.length > 0 ? leases : [])
        if (expired.some((r) => r.rowid === rowids.get(lease))) lease.takeover = true;
      for (const lease of leases) if (lease.orderKey !== null) this.occupy(lease, rowids.get(lease)!);
      if ((gate.probe && leases.length > 0) || gate.tokens !== null) {
        this.sql("INSERT INTO destinations (name) VALUES (?) ON CONFLICT (name) DO NOTHING").run(destination);
        if (gate.probe && leases.length > 0) {
          // The one delivery that tries the destination again; its lease bounds how long the probe may take.
          this.sql("UPDATE destinations SET state = 'probing', probe_until = ?, changed_at = ? WHERE name = ?").run(
            now + leaseMs,
            now,
            destination,
          );
          leases[0]!.probe = true;
        }
        if (gate.tokens !== null)
          this.sql("UPDATE destinations SET tokens = ?, tokens_at = ? WHERE name = ?").run(
            gate.tokens - leases.length,
            now,
            destination,
          );
      }
      return leases.length < 2
        ? leases
        : leases.sort((a, b) => a.availableAt - b.availableAt || a.receivedAt - b.receivedAt);
    }) as Promise<Lease[]>;
    return tellSetAside(claimed, options, () => setAside);
  }

  /** extend pushes a held lease further out; false means it was lost to a takeover. */
  extend(lease: Lease, leaseMs: number = DEFAULTS.leaseMs): Promise<boolean> {
    return this.enqueue((db) => {
      const until = this.now() + leaseMs;
      const changed = this.sql(
        `UPDATE deliveries SET leased_until = ?, lease_ms = ?
           WHERE source = ? AND id = ? AND route = ? AND lease_token = ? AND status = 'processing'`,
      ).run(until, leaseMs, lease.source, lease.id, lease.route, lease.token).changes;
      if (changed === 1) lease.leasedUntil = until;
      return changed === 1;
    }) as Promise<boolean>;
  }

  /**
   * finish marks a delivery done and applies the handler's local writes in the same transaction. If the
   * lease was lost, neither happens and it returns false, so local effects happen exactly once. If a
   * write throws, both roll back and the promise rejects with the write's error.
   */
  finish(lease: Lease, writes: readonly LocalWrite[] = []): Promise<boolean> {
    const rowid = rowids.get(lease);
    return this.enqueue((db, guarded) => {
      // Unguarded, a write that throws fails the whole transaction, which commit() then redoes guarded.
      if (!guarded || writes.length === 0) return this.markDone(db, lease, rowid, writes);
      // A savepoint confines a failing write to its own delivery; the batch around it still commits.
      // Prepared once like any statement: exec() would parse the text for every delivery.
      this.sql("SAVEPOINT finish").run();
      try {
        const done = this.markDone(db, lease, rowid, writes);
        this.sql("RELEASE finish").run();
        return done;
      } catch (error) {
        this.sql("ROLLBACK TO finish").run();
        this.sql("RELEASE finish").run();
        throw error;
      }
    }, writes.length > 0) as Promise<boolean>;
  }

  // markDone sets the fenced done mark, then runs the writes if the lease still held.
  private markDone(db: DatabaseSync, lease: Lease, rowid: number | undefined, writes: readonly LocalWrite[]): boolean {
    const now = this.now();
    // By rowid when the claim gave one, one b-tree walk instead of two; the token fences it all the same.
    // A rowid that VACUUM renumbered misses, and the (source, id) key then finds the row.
    let changed =
      rowid === undefined
        ? 0
        : this.sql(
            `UPDATE deliveries SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ?
         WHERE rowid = ? AND lease_token = ? AND status = 'processing'`,
          ).run(now, rowid, lease.token).changes;
    if (changed === 0) {
      changed = this.sql(
        `UPDATE deliveries SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ?
           WHERE source = ? AND id = ? AND route = ? AND lease_token = ? AND status = 'processing'`,
      ).run(now, lease.source, lease.id, lease.route, lease.token).changes;
    }
    if (changed !== 1) return false;
    if (lease.orderKey !== null) this.handled(lease);
    for (const write of writes) {
      const result = write(this.tx);
      if (result instanceof Promise) {
        throw new TypeError(
          "finish: a write on SQLite must be synchronous; it returned a promise (await only on PostgreSQL)",
        );
      }
    }
    return true;
  }

  /**
   * fail records a failed try: back to the queue after a backoff, or set aside as failed when the
   * attempts are used up or the error is permanent. Returns undefined if the lease was lost.
   */
  fail(lease: Lease, error: string, options: FailOptions = {}): Promise<Failure | undefined> {
    return this.enqueue((db) => {
      const now = this.now();
      const row = this.sql(
        `SELECT attempts FROM deliveries WHERE source = ? AND id = ? AND route = ? AND lease_token = ? AND status = 'processing'`,
      ).get(lease.source, lease.id, lease.route, lease.token) as { attempts: number } | undefined;
      if (!row) return undefined;
      this.sql(
        "INSERT INTO attempt_errors (source, id, attempt, error, failed_at, destination) VALUES (?, ?, ?, ?, ?, ?)",
      ).run(lease.source, lease.id, row.attempts, error, now, lease.destination);
      if (options.permanent || row.attempts >= this.maxAttempts) {
        this.sql(
          `UPDATE deliveries SET status = 'failed', error = ?, leased_until = NULL, lease_token = NULL, finished_at = ?
           WHERE source = ? AND id = ? AND route = ?`,
        ).run(error, now, lease.source, lease.id, lease.route);
        if (lease.orderKey !== null) this.settleKey(lease.source, lease.destination, lease.orderKey, lease.id, true);
        return { status: "failed" };
      }
      const retryAt = now + retryDelay(row.attempts, options, { ...this.backoffOptions, random: this.random });
      this.sql(
        `UPDATE deliveries SET status = 'received', error = ?, leased_until = NULL, lease_token = NULL, available_at = ?
         WHERE source = ? AND id = ? AND route = ?`,
      ).run(error, retryAt, lease.source, lease.id, lease.route);
      if (lease.orderKey !== null) this.settleKey(lease.source, lease.destination, lease.orderKey, lease.id, false);
      return { status: "received", retryAt };
    }) as Promise<Failure | undefined>;
  }

  /** attemptErrors returns each failed try of one delivery that fail() recorded, oldest first. */
  async attemptErrors(d: {
    source: string;
    id: string;
    receivedAt: number;
    destination?: string;
  }): Promise<AttemptError[]> {
    return (
      this.sql(`SELECT attempt, error, failed_at, destination FROM attempt_errors WHERE source = ? AND id = ? AND failed_at >= ?
              AND (? IS NULL OR destination = ?) ORDER BY failed_at, rowid`).all(
        d.source,
        d.id,
        d.receivedAt,
        d.destination ?? null,
        d.destination ?? null,
      ) as Row[]
    ).map((r) => ({
      attempt: r.attempt as number,
      error: r.error as string,
      failedAt: r.failed_at as number,
      destination: r.destination as string,
    }));
  }

  /** release hands a claimed delivery back untouched, without spending an attempt (graceful shutdown). */
  release(lease: Lease): Promise<boolean> {
    return this.enqueue((db) => {
      const released =
        this.sql(
          `UPDATE deliveries SET status = 'received', attempts = max(attempts - 1, 0), leased_until = NULL,
                  lease_token = NULL, available_at = ?
           WHERE source = ? AND id = ? AND route = ? AND lease_token = ? AND status = 'processing'`,
        ).run(this.now(), lease.source, lease.id, lease.route, lease.token).changes === 1;
      if (released && lease.orderKey !== null)
        this.settleKey(lease.source, lease.destination, lease.orderKey, lease.id, false);
      return released;
    }) as Promise<boolean>;
  }

  /** retry puts failed deliveries back in the queue with their attempts reset; returns how many. */
  retry(target: { source?: string; id: string } | { allFailed: true }): Promise<number> {
    return this.enqueue((db) => {
      const now = this.now();
      const rows = (
        "allFailed" in target
          ? this.sql(`UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                    WHERE status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key, destination`).all(
              now,
            )
          : this.sql(`UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                    WHERE source = ? AND id = ? AND status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key, destination`).all(
              now,
              target.source ?? DEFAULTS.source,
              target.id,
            )
      ) as Row[];
      for (const r of rows)
        if (r.order_key !== null)
          this.settleKey(r.source as string, r.destination as string, r.order_key as string, r.id as string, false);
      return rows.length;
    }) as Promise<number>;
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
  async list(filter: { status?: Status; source?: string; limit?: number } = {}): Promise<Delivery[]> {
    const rows = this.sql(
      `SELECT * FROM deliveries
         WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR source = ?2)
         ORDER BY received_at DESC, rowid DESC LIMIT ?3`,
    ).all(filter.status ?? null, filter.source ?? null, filter.limit ?? 20) as Row[];
    return rows.map(toDelivery);
  }

  /** status summarises the queue: counts, failures, the oldest wait and conflicting duplicates. */
  async status(): Promise<InboxStatus> {
    const now = this.now();
    const counts = Object.fromEntries(STATUSES.map((s) => [s, 0])) as Record<Status, number>;
    for (const row of this.sql("SELECT status, count(*) AS n FROM deliveries GROUP BY status").all() as Row[]) {
      counts[row.status as Status] = row.n as number;
    }
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
    // Per source and event type, so one inbox fed by several providers can be read at a glance.
    const bySource = new Map<string, InboxStatus["sources"][number]>();
    for (const r of this.sql(`SELECT source, event_type, status, count(*) AS n FROM deliveries
            GROUP BY source, event_type, status ORDER BY source, event_type`).all() as Row[]) {
      const key = JSON.stringify([r.source, r.event_type]);
      let entry = bySource.get(key);
      if (!entry) {
        entry = {
          source: r.source as string,
          eventType: r.event_type as string | null,
          counts: Object.fromEntries(STATUSES.map((s) => [s, 0])) as Record<Status, number>,
        };
        bySource.set(key, entry);
      }
      entry.counts[r.status as Status] = r.n as number;
    }
    const conflicts = this.sql(
      "SELECT count(*) AS rows, coalesce(sum(conflicts), 0) AS copies FROM deliveries WHERE conflicts > 0",
    ).get() as { rows: number; copies: number };
    return {
      counts,
      sources: [...bySource.values()],
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
        "SELECT source, status, count(*) AS n FROM deliveries INDEXED BY deliveries_open WHERE status <> 'done' GROUP BY source, status",
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

  /** restore writes deliveries as they are, in one transaction; keys already here are skipped. */
  restore(deliveries: readonly Delivery[]): Promise<number> {
    return this.enqueue(() => {
      let added = 0;
      const keys = new Map<string, [string, string, string]>();
      // In arrival order, so that the rowids that break event-time ties keep it.
      for (const d of [...deliveries].sort((a, b) => a.receivedAt - b.receivedAt)) {
        const changed = Number(
          this.sql(
            `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time, received_at,
                                     status, attempts, available_at, leased_until, lease_ms, error, conflicts, finished_at,
                                     replays, purged_at, order_key, event_time, newer_id, route, destination, headers, traceparent)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (source, id, route) DO NOTHING`,
          ).run(
            d.source,
            d.id,
            d.body,
            d.bodySha256,
            d.contentType,
            d.eventType,
            d.providerTime,
            d.receivedAt,
            d.status,
            d.attempts,
            d.availableAt,
            d.leasedUntil,
            d.leasedUntil === null ? null : Math.max(1, d.leasedUntil - this.now()),
            d.error,
            d.conflicts,
            d.finishedAt,
            d.replays ?? 0,
            d.purgedAt ?? null,
            d.orderKey ?? null,
            d.eventTime ?? null,
            d.newerId ?? null,
            d.route ?? 0,
            d.destination ?? DEFAULTS.destination,
            d.headers ? JSON.stringify(d.headers) : null,
            d.traceparent ?? null,
          ).changes,
        );
        added += changed;
        const destination = d.destination ?? DEFAULTS.destination;
        if (changed === 1 && d.orderKey != null)
          keys.set(JSON.stringify([d.source, destination, d.orderKey]), [d.source, destination, d.orderKey]);
      }
      for (const [source, destination, key] of keys.values()) this.rebuildKey(source, destination, key);
      return added;
    }) as Promise<number>;
  }

  /** search returns the deliveries that match, newest first, a page after the cursor (keyset, never OFFSET). */
  async search(filter: Filter, page: { after?: Cursor; limit?: number } = {}): Promise<Delivery[]> {
    const { where, params } = filterSql(filter, "sqlite");
    const limit = searchPageLimit(page.limit);
    const after = page.after === undefined ? "" : "AND (received_at, source, id, route) < (?, ?, ?, ?)";
    const cursor =
      page.after === undefined ? [] : [page.after.receivedAt, page.after.source, page.after.id, page.after.route ?? -1];
    const rows = this.sql(
      `SELECT * FROM deliveries WHERE ${where} ${after} ORDER BY received_at DESC, source DESC, id DESC, route DESC LIMIT ?`,
    ).all(...params, ...cursor, limit) as Row[];
    return rows.map(toDelivery);
  }

  /** count says how many deliveries match. */
  async count(filter: Filter): Promise<number> {
    const { where, params } = filterSql(filter, "sqlite");
    return (this.sql(`SELECT count(*) AS n FROM deliveries WHERE ${where}`).get(...params) as { n: number }).n;
  }

  /** retryMatching queues the failed deliveries that match again, in batches of their own transaction each. */
  async retryMatching(filter: Filter, options: BulkOptions = {}): Promise<number> {
    const failed = "status = 'failed' AND purged_at IS NULL";
    if (options.dryRun) return this.countWhere(filter, failed);
    let total = 0;
    await this.inBatches(filter, failed, options.batch, (keys, now) => {
      for (const k of keys) {
        const row =
          this.sql(`UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                WHERE source = ? AND id = ? AND route = ? AND status = 'failed' RETURNING order_key, destination`).get(
            now,
            k.source,
            k.id,
            k.route!,
          ) as Row | undefined;
        if (!row) continue;
        total++;
        // An ordered delivery waits its turn again: its key's head row decides when.
        if (row.order_key !== null)
          this.settleKey(k.source, row.destination as string, row.order_key as string, k.id, false);
      }
    });
    return total;
  }

  /** replayMatching puts the done deliveries that match through the handler again; tombstones are counted, not replayed. */
  async replayMatching(
    filter: Filter,
    options: BulkOptions & { to?: string } = {},
  ): Promise<{ replayed: number; tombstoned: number }> {
    if (options.to !== undefined) return this.replayTo(filter, options.to, options);
    const kept = "status = 'done' AND purged_at IS NULL";
    const tombstoned = () => this.countWhere(filter, "status = 'done' AND purged_at IS NOT NULL");
    if (options.dryRun) return { replayed: await this.countWhere(filter, kept), tombstoned: await tombstoned() };
    let replayed = 0;
    await this.inBatches(filter, kept, options.batch, (keys, now) => {
      for (const k of keys) {
        const row =
          this.sql(`UPDATE deliveries SET status = 'received', attempts = 0, replays = replays + 1, error = NULL, available_at = ?,
                       finished_at = NULL, leased_until = NULL, lease_token = NULL
                WHERE source = ? AND id = ? AND route = ? AND status = 'done' AND purged_at IS NULL RETURNING order_key, destination`).get(
            now,
            k.source,
            k.id,
            k.route!,
          ) as Row | undefined;
        if (!row) continue;
        replayed++;
        if (row.order_key !== null)
          this.settleKey(k.source, row.destination as string, row.order_key as string, k.id, false);
      }
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
    if (!DESTINATION_NAME.test(to))
      throw new TypeError(`replay: expected --to to name a destination, got ${JSON.stringify(to)}`);
    const kept = "purged_at IS NULL";
    const tombstoned = () => this.countWhere(filter, "purged_at IS NOT NULL");
    if (options.dryRun) return { replayed: await this.countWhere(filter, kept), tombstoned: await tombstoned() };
    let replayed = 0;
    const seen = new Set<string>();
    await this.inBatches(filter, kept, options.batch, (keys, now) => {
      for (const k of keys) {
        const there = this.sql(
          "SELECT rowid, status, route FROM deliveries WHERE source = ? AND id = ? AND destination = ?",
        ).get(k.source, k.id, to) as Row | undefined;
        if (seen.has(`${k.source}\u0000${k.id}`)) continue;
        seen.add(`${k.source}\u0000${k.id}`);
        if (there !== undefined) {
          if (there.status !== "done") continue;
          const row =
            this.sql(`UPDATE deliveries SET status = 'received', attempts = 0, replays = replays + 1, error = NULL, available_at = ?,
                         finished_at = NULL, leased_until = NULL, lease_token = NULL
                  WHERE rowid = ? AND status = 'done' AND purged_at IS NULL RETURNING order_key`).get(
              now,
              there.rowid as number,
            ) as Row | undefined;
          if (!row) continue;
          replayed++;
          if (row.order_key !== null) this.settleKey(k.source, to, row.order_key as string, k.id, false);
          continue;
        }
        // Routing after the fact: the delivery gets a row for this destination, as its next route.
        const added =
          this.sql(`INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time, received_at, status,
                                        available_at, order_key, event_time, route, destination, headers, traceparent, replays)
                SELECT source, id, body, body_sha256, content_type, event_type, provider_time, received_at, 'received', ?,
                       order_key, event_time, (SELECT max(route) + 1 FROM deliveries WHERE source = ?2 AND id = ?3), ?4, headers, traceparent, 1
                FROM deliveries WHERE source = ?2 AND id = ?3 AND route = ?5 AND purged_at IS NULL
                RETURNING rowid, order_key, event_time`).get(now, k.source, k.id, to, k.route!) as Row | undefined;
        if (!added) continue;
        replayed++;
        if (added.order_key !== null) {
          this.enter(
            k.source,
            to,
            added.order_key as string,
            k.id,
            added.event_time as number,
            added.rowid as number,
            now,
            false,
          );
        }
      }
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  private async countWhere(filter: Filter, also: string): Promise<number> {
    const { where, params } = filterSql(filter, "sqlite");
    return (this.sql(`SELECT count(*) AS n FROM deliveries WHERE ${also} AND ${where}`).get(...params) as { n: number })
      .n;
  }

  // inBatches walks the deliveries that match, oldest first, a batch per transaction, and hands each
  // batch's keys to act inside it. The cursor moves past every batch, so a delivery changed by a worker
  // meanwhile (retried, then failed again) is never taken twice in one run, and the run always ends.
  private async inBatches(
    filter: Filter,
    also: string,
    batch: number | undefined,
    act: (keys: Cursor[], now: number) => void,
  ): Promise<void> {
    const size = bulkBatchSize(batch);
    const { where, params } = filterSql(filter, "sqlite");
    let after: Cursor | undefined;
    for (;;) {
      const picked = (await this.enqueue(() => {
        const cursor = after === undefined ? "" : "AND (received_at, source, id, route) > (?, ?, ?, ?)";
        const keys = (
          this.sql(`SELECT received_at, source, id, route FROM deliveries WHERE ${also} AND ${where} ${cursor}
                ORDER BY received_at, source, id, route LIMIT ?`).all(
            ...params,
            ...(after ? [after.receivedAt, after.source, after.id, after.route!] : []),
            size,
          ) as Row[]
        ).map((r) => ({
          receivedAt: r.received_at as number,
          source: r.source as string,
          id: r.id as string,
          route: r.route as number,
        }));
        act(keys, this.now());
        return keys;
      })) as Cursor[];
      if (picked.length < size) return;
      after = picked.at(-1);
    }
  }

  /** purge drops old done bodies (tombstones stay), forgets old tombstones, then gives the space back. */
  async purge(options: PurgeOptions = {}): Promise<Purged> {
    const { bodiesBefore, forgetBefore, batch, rest } = purgeCutoffs(options, this.now());
    if (options.dryRun) {
      const bodies = this.sql(`SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes FROM deliveries
              WHERE status = 'done' AND purged_at IS NULL AND received_at < ?`).get(bodiesBefore) as {
        n: number;
        bytes: number;
      };
      // What is past both ages goes in one run: its body now, then its tombstone.
      const forgotten = this.sql(
        "SELECT count(*) AS n FROM deliveries WHERE purged_at IS NOT NULL AND received_at < ?",
      ).get(forgetBefore) as { n: number };
      const both = this.sql(
        "SELECT count(*) AS n FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < ?",
      ).get(forgetBefore) as { n: number };
      return { bodies: bodies.n, bytes: bodies.bytes, forgotten: forgotten.n + both.n, vacuumedBytes: 0 };
    }
    const purged: Purged = { bodies: 0, bytes: 0, forgotten: 0, vacuumedBytes: 0 };
    for (;;) {
      const { n, bytes } = (await paced(rest, () =>
        this.enqueue(() =>
          this.dropBatch(
            "SELECT rowid, length(body) AS bytes FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < ? ORDER BY received_at LIMIT ?",
            [bodiesBefore, batch],
          ),
        ),
      )) as { n: number; bytes: number };
      purged.bodies += n;
      purged.bytes += bytes;
      if (n < batch || options.signal?.aborted) break;
    }
    for (;;) {
      if (options.signal?.aborted) return purged;
      const n = (await paced(rest, () =>
        this.enqueue(() =>
          Number(
            this.sql(`DELETE FROM deliveries WHERE rowid IN (
                SELECT rowid FROM deliveries WHERE purged_at IS NOT NULL AND received_at < ? ORDER BY received_at LIMIT ?)`).run(
              forgetBefore,
              batch,
            ).changes,
          ),
        ),
      )) as number;
      purged.forgotten += n;
      if (n < batch) break;
    }
    purged.vacuumedBytes = await this.vacuumFree(options.signal, rest);
    return purged;
  }

  /** dropBodies makes tombstones of the settled deliveries that match (purge by name), in batches. */
  async dropBodies(filter: Filter, options: BulkOptions = {}): Promise<{ bodies: number; bytes: number }> {
    const { where, params } = filterSql(filter, "sqlite");
    const size = bulkBatchSize(options.batch);
    const pick = `SELECT rowid, length(body) AS bytes FROM deliveries
                  WHERE status IN ('done', 'failed') AND purged_at IS NULL AND ${where} ORDER BY received_at LIMIT ?`;
    if (options.dryRun) {
      const r = this.sql(`SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes FROM deliveries
                          WHERE status IN ('done', 'failed') AND purged_at IS NULL AND ${where}`).get(...params) as {
        n: number;
        bytes: number;
      };
      return { bodies: r.n, bytes: r.bytes };
    }
    const total = { bodies: 0, bytes: 0 };
    for (;;) {
      const { n, bytes } = (await paced(DEFAULTS.purgeRest, () =>
        this.enqueue(() => this.dropBatch(pick, [...params, size])),
      )) as { n: number; bytes: number };
      total.bodies += n;
      total.bytes += bytes;
      if (n < size) break;
    }
    await this.vacuumFree();
    return total;
  }

  // dropBatch makes tombstones of the rows a query picks, inside the current transaction. The row stays,
  // with its hash: store()'s ON CONFLICT still finds the ID, and a different body still counts as a
  // conflict. It is moved rather than updated in place: SQLite never merges the half-empty pages an
  // UPDATE leaves (a 1 KB body lives in its leaf page), so the file would not shrink; a DELETE rebalances
  // them into free pages, and the re-inserted tombstones pack densely at the end of the table.
  private dropBatch(pick: string, params: SQLInputValue[]): { n: number; bytes: number } {
    const rows = this.sql(pick).all(...params) as { rowid: number; bytes: number }[];
    if (rows.length === 0) return { n: 0, bytes: 0 };
    // SELECT *: every column, those of later migrations too; a mismatch fails loudly, never drops one.
    this.db.exec("CREATE TEMP TABLE IF NOT EXISTS purging AS SELECT * FROM main.deliveries WHERE 0");
    const ids = JSON.stringify(rows.map((r) => r.rowid));
    const settled = "rowid IN (SELECT value FROM json_each(?)) AND purged_at IS NULL AND status IN ('done', 'failed')";
    this.sql(`INSERT INTO temp.purging SELECT * FROM main.deliveries WHERE ${settled}`).run(ids);
    const n = Number(this.sql(`DELETE FROM main.deliveries WHERE ${settled}`).run(ids).changes);
    this.sql("UPDATE temp.purging SET body = X'', purged_at = ?").run(this.now());
    this.sql("INSERT INTO main.deliveries SELECT * FROM temp.purging ORDER BY received_at").run();
    this.sql("DELETE FROM temp.purging").run();
    return { n, bytes: rows.reduce((sum, r) => sum + r.bytes, 0) };
  }

  // vacuumFree gives free pages back to the file system, a bounded step per transaction, when the file
  // was created with auto_vacuum = INCREMENTAL (see openDatabase; an older file needs vacuum() once).
  // The file itself shrinks at the next checkpoint, which copies the shorter database out of the WAL.
  private async vacuumFree(signal?: AbortSignal, rest: number = DEFAULTS.purgeRest): Promise<number> {
    const pragma = (name: string) => Object.values(this.sql(`PRAGMA ${name}`).get() as Record<string, number>)[0]!;
    if (pragma("auto_vacuum") !== 2) return 0;
    const pageSize = pragma("page_size");
    let pages = 0;
    for (;;) {
      const free = pragma("freelist_count");
      if (free === 0 || signal?.aborted) break;
      const step = Math.min(free, DEFAULTS.vacuumStepPages);
      await paced(rest, () => this.enqueue(() => this.db.prepare(`PRAGMA incremental_vacuum(${step})`).all()));
      pages += step;
    }
    return pages * pageSize;
  }

  /**
   * vacuum rewrites the whole file once, switching it to auto_vacuum = INCREMENTAL, so that purge can shrink
   * a database created before retention existed. It holds the write lock until done (seconds per GB):
   * receivers' acks wait meanwhile, so run it in a quiet moment. SQLite only.
   */
  async vacuum(): Promise<{ before: number; after: number }> {
    await this.flush();
    const size = () => {
      const { page_count: pages } = this.db.prepare("PRAGMA page_count").get() as { page_count: number };
      const { page_size: bytes } = this.db.prepare("PRAGMA page_size").get() as { page_size: number };
      return pages * bytes;
    };
    const before = size();
    this.db.exec("PRAGMA auto_vacuum = INCREMENTAL");
    this.db.exec("VACUUM");
    this.db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
    return { before, after: size() };
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

  /** onWake is a no-op on SQLite: one machine, and the worker's polling is the wake-up. */
  onWake(_listener: () => void): () => void {
    return () => {};
  }

  /**
   * gauges reads the queue's counts on a thread of its own, from one snapshot: the receiver's thread
   * never waits on the count of a large inbox. The waiting, leased and failed rows are counted through
   * their partial indexes, done as each source's total (a scan of the primary key, not of the rows and
   * their bodies) less those.
   */
  gauges(): Promise<Gauges> {
    if (this.closed) return Promise.reject(new Error(`inbox ${this.path} is closed`));
    if (!this.gauger) {
      this.gauger = new Worker(GAUGER, {
        eval: true,
        workerData: { path: this.path, busyTimeoutMs: this.busyTimeoutMs },
      });
      this.gauger.unref();
    }
    const gauger = this.gauger;
    const now = this.now();
    return new Promise((resolve, reject) => {
      // A thread that fails or exits (close() ends it) answers no more: this read fails, the next starts anew.
      const onExit = () => onError(new Error("the gauge thread stopped"));
      const onError = (error: Error) => {
        gauger.unref();
        gauger.off("message", onMessage).off("error", onError).off("exit", onExit);
        if (this.gauger === gauger) this.gauger = undefined;
        reject(new Error(`gauges ${this.path}: ${message(error)}`, { cause: error }));
      };
      const onMessage = (reply: {
        error?: string;
        rows?: { source: string; status: Status | "total"; n: number; oldest: number | null }[];
      }) => {
        gauger.unref();
        gauger.off("error", onError).off("exit", onExit);
        if (reply.error !== undefined) return reject(new Error(`gauges ${this.path}: ${reply.error}`));
        resolve(toGauges(reply.rows!, now));
      };
      gauger.once("message", onMessage).once("error", onError).once("exit", onExit);
      // Held while its answer is awaited, else unref'd: on Deno, a script that awaited only this ended first.
      gauger.ref();
      gauger.postMessage("count");
    });
  }

  /**
   * ready is true while the last commit succeeded. After one failed as a whole (a full disk, a read-only
   * or broken file), it tries a commit of its own, a rewrite of the schema version, and is ready again
   * once that succeeds: an idle receiver must not stay unready after the disk has been freed.
   */
  async ready(): Promise<true | string> {
    if (this.closed) return "the inbox is closed";
    if (this.syncFailure) return message(this.syncFailure);
    if (this.commitError === undefined) return true;
    try {
      // Briefly: the probe runs on the receiver's thread, and a lock that stays busy is an answer too.
      this.begin(READY_LOCK_MS);
      try {
        this.db.exec(`PRAGMA user_version = ${MIGRATIONS.length}`);
        this.db.exec("COMMIT");
      } finally {
        if (this.db.isTransaction) this.db.exec("ROLLBACK");
      }
      this.commitError = undefined;
      return true;
    } catch (error) {
      return `cannot commit: ${message(error)}`;
    }
  }

  /** pause holds a destination's deliveries until resume: none is claimed, none spends an attempt. */
  pause(destination: string, reason: string = "paused by a person"): Promise<boolean> {
    checkClaim({ destination });
    return this.enqueue(() => {
      this.sql("INSERT INTO destinations (name) VALUES (?) ON CONFLICT (name) DO NOTHING").run(destination);
      return (
        this.sql(
          "UPDATE destinations SET paused = 1, paused_reason = ?, changed_at = ? WHERE name = ? AND paused = 0",
        ).run(reason, this.now(), destination).changes === 1
      );
    }) as Promise<boolean>;
  }

  /** resume lets a paused destination's deliveries go again, its breaker closed and counts fresh. */
  resume(destination: string): Promise<boolean> {
    checkClaim({ destination });
    return this.enqueue(
      () =>
        this.sql(
          `UPDATE destinations SET paused = 0, paused_reason = NULL, state = 'closed', failures = 0, window_start = NULL,
              window_done = 0, window_failed = 0, retry_at = NULL, probe_until = NULL, changed_at = ?
       WHERE name = ? AND paused = 1`,
        ).run(this.now(), destination).changes === 1,
    ) as Promise<boolean>;
  }

  /** permit says how many of n forwards may start now: none while paused, else up to the rate's tokens, taken now. */
  permit(destination: string, n: number, rate?: Rate): Promise<Permit> {
    checkPermit(destination, n, rate);
    // Without a rate, one read outside the writer's queue: it sees every pause committed before it.
    if (!rate) {
      const { tokens: _, ...permit } = gatePermit(
        this.sql("SELECT paused FROM destinations WHERE name = ?").get(destination) as Row | undefined,
        n,
        0,
        undefined,
      );
      return Promise.resolve(permit);
    }
    return this.enqueue(() => {
      const now = this.now();
      const row = this.sql("SELECT * FROM destinations WHERE name = ?").get(destination) as Row | undefined;
      const { tokens, ...permit } = gatePermit(row, n, now, rate);
      if (tokens !== null) {
        this.sql("INSERT INTO destinations (name) VALUES (?) ON CONFLICT (name) DO NOTHING").run(destination);
        this.sql("UPDATE destinations SET tokens = ?, tokens_at = ? WHERE name = ?").run(tokens, now, destination);
      }
      return permit;
    }) as Promise<Permit>;
  }

  /** tally adds one worker's tries of a destination to its shared breaker, which may open or close it. */
  tally(destination: string, tally: Tally, policy: BreakerPolicy): Promise<BreakerChange | undefined> {
    checkClaim({ destination });
    return this.enqueue(() => {
      const now = this.now();
      const row = this.sql("SELECT * FROM destinations WHERE name = ?").get(destination) as Row | undefined;
      const next = breakerAfter(row, tally, policy, now);
      this.sql("INSERT INTO destinations (name) VALUES (?) ON CONFLICT (name) DO NOTHING").run(destination);
      const r = next.row;
      this.sql(
        `UPDATE destinations SET state = ?, retry_at = ?, failures = ?, window_start = ?, window_done = ?, window_failed = ?,
                last_error = ?, last_error_at = ?, changed_at = CASE WHEN state <> ? THEN ? ELSE changed_at END
         WHERE name = ?`,
      ).run(
        r.state!,
        r.retry_at!,
        r.failures!,
        r.window_start!,
        r.window_done!,
        r.window_failed!,
        r.last_error!,
        r.last_error_at!,
        r.state!,
        now,
        destination,
      );
      return next.change;
    }) as Promise<BreakerChange | undefined>;
  }

  /** destinations lists every destination with deliveries or a state of its own, by name. */
  async destinations(windowMs: number = DEFAULTS.breakerWindowMs): Promise<DestinationState[]> {
    const now = this.now();
    const counts = new Map<string, { waiting: number; processing: number; failed: number }>();
    const at = (name: string) =>
      counts.get(name) ?? (counts.set(name, { waiting: 0, processing: 0, failed: 0 }), counts.get(name)!);
    // Only what is not done, through its partial index, so a large inbox is not walked.
    for (const r of this.sql(
      "SELECT destination, status, count(*) AS n FROM deliveries INDEXED BY deliveries_open WHERE status <> 'done' GROUP BY destination, status",
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

  /** flush resolves once every write queued so far is committed (and, with syncOffLoop, synced). */
  flush(): Promise<void> {
    const idle = this.queue.length === 0 && !this.flushing && this.syncs === 0 && this.unsynced.length === 0;
    return idle ? Promise.resolve() : this.enqueue(() => undefined).then(() => undefined);
  }

  /** close commits what is queued, then closes the database. */
  async close(): Promise<void> {
    if (this.closed) return;
    await this.flush();
    this.closed = true;
    const checkpointer = this.checkpointer;
    try {
      if (checkpointer) {
        // A thread that fails on its way out (a runtime without an API it used) says so here, once.
        const ended = new Promise<void>((resolve, reject) => {
          checkpointer.once("exit", () => resolve());
          checkpointer.once("error", (error) =>
            reject(new Error(`close ${this.path}: the checkpoint thread failed: ${message(error)}`, { cause: error })),
          );
        });
        // Held while it ends: awaiting an unref'd thread, an otherwise idle process would exit mid-close().
        checkpointer.ref();
        checkpointer.postMessage("close");
        await ended;
      }
    } finally {
      await this.gauger?.terminate();
      this.db.close();
      for (const fd of this.walFds) closeSync(fd);
    }
  }

  // enter puts a newly stored delivery at its key's head (per destination) if the key is idle and it comes
  // first in event time (or the key had nothing waiting); a running or blocked key picks its next head when
  // it settles.
  private enter(
    source: string,
    destination: string,
    key: string,
    id: string,
    eventTime: number,
    seq: number,
    due: number,
    strict: boolean,
  ): void {
    this.sql(
      `INSERT INTO order_keys (source, destination, order_key, head_id, head_event_time, head_seq, due, strict)
       VALUES (?1, ?8, ?2, ?3, ?4, ?5, ?6, ?7)
       ON CONFLICT (source, destination, order_key) DO UPDATE SET
         strict = excluded.strict,
         head_id = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?3 ELSE head_id END,
         head_event_time = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?4 ELSE head_event_time END,
         head_seq = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?5 ELSE head_seq END,
         due = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?6 ELSE due END`,
    ).run(source, key, id, eventTime, seq, due, strict ? 1 : 0, destination);
  }

  // occupy marks a claimed head's key as running, and flags the lease stale if a newer event of its key
  // was already handled (by this destination).
  private occupy(lease: Lease, rowid: number): void {
    const key = this.sql(
      "UPDATE order_keys SET due = NULL WHERE source = ? AND destination = ? AND order_key = ? RETURNING last_event_time, last_id",
    ).get(lease.source, lease.destination, lease.orderKey) as
      | { last_event_time: number | null; last_id: string | null }
      | undefined;
    if (key?.last_event_time != null && key.last_event_time > lease.eventTime!) {
      this.sql("UPDATE deliveries SET newer_id = ? WHERE rowid = ?").run(key.last_id, rowid);
      lease.newerId = key.last_id;
    }
  }

  // handled records a finished delivery's event time as its key's newest, then moves the key on.
  private handled(lease: Lease): void {
    this.settleKey(lease.source, lease.destination, lease.orderKey!, lease.id, false, lease.eventTime);
  }

  // settleKey moves a key's head to its first waiting delivery in event time, then arrival, after the
  // delivery `from` left the head (done, retried, released, set aside) or came back (retry). It leaves a
  // key alone while another delivery runs or blocks it, and a strict key blocked when `from` is set aside.
  private settleKey(
    source: string,
    destination: string,
    key: string,
    from: string,
    setAside: boolean,
    handledTime: number | null = null,
  ): void {
    this.sql(
      `UPDATE order_keys SET
         last_event_time = CASE WHEN ?5 IS NOT NULL AND (last_event_time IS NULL OR last_event_time <= ?5) THEN ?5 ELSE last_event_time END,
         last_id = CASE WHEN ?5 IS NOT NULL AND (last_event_time IS NULL OR last_event_time <= ?5) THEN ?3 ELSE last_id END,
         (head_id, head_event_time, head_seq, due) =
           (SELECT id, event_time, rowid, available_at FROM deliveries
            WHERE source = ?1 AND destination = ?6 AND order_key = ?2 AND status = 'received' ORDER BY event_time, rowid LIMIT 1)
       WHERE source = ?1 AND destination = ?6 AND order_key = ?2 AND (head_id IS NULL OR head_id = ?3 OR due IS NOT NULL) AND NOT (strict AND ?4)`,
    ).run(source, key, from, setAside ? 1 : 0, handledTime, destination);
  }

  // rebuildKey brings a key's head row up to date with its deliveries after a copy: the newest done event
  // is its last handled, a processing delivery runs it, else its first waiting one is the head. (The
  // strict setting is the source's, and comes back with its next delivery.)
  private rebuildKey(source: string, destination: string, key: string): void {
    this.sql(
      "INSERT INTO order_keys (source, destination, order_key) VALUES (?, ?, ?) ON CONFLICT (source, destination, order_key) DO NOTHING",
    ).run(source, destination, key);
    this.sql(
      `UPDATE order_keys SET (last_event_time, last_id) =
         (SELECT event_time, id FROM deliveries WHERE source = ?1 AND destination = ?3 AND order_key = ?2 AND status = 'done'
          ORDER BY event_time DESC, rowid DESC LIMIT 1)
       WHERE source = ?1 AND destination = ?3 AND order_key = ?2`,
    ).run(source, key, destination);
    const running = this.sql(
      "SELECT id, event_time, rowid FROM deliveries WHERE source = ? AND destination = ? AND order_key = ? AND status = 'processing' LIMIT 1",
    ).get(source, destination, key) as Row | undefined;
    if (running) {
      this.sql(
        "UPDATE order_keys SET head_id = ?, head_event_time = ?, head_seq = ?, due = NULL WHERE source = ? AND destination = ? AND order_key = ?",
      ).run(running.id, running.event_time, running.rowid, source, destination, key);
    } else {
      this.sql(
        "UPDATE order_keys SET head_id = NULL, due = NULL WHERE source = ? AND destination = ? AND order_key = ?",
      ).run(source, destination, key);
      this.settleKey(source, destination, key, "", false);
    }
  }
}

// How long ready()'s probe commit waits for the write lock before it reports the store as not ready.
const READY_LOCK_MS = 50;
