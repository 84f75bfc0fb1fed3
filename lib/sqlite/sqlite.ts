// sqlite/sqlite.ts: the Inbox on one node:sqlite file, the embedded default: a delivery's whole life (store,
// claim, extend, finish, fail, release, retry) and a destination's gate, as SQL on the file sqlite/schema.ts
// opens, every write group-committed by sqlite/commit.ts (which it extends), and a gauge thread beside it. It
// holds its reads (sqlite/reads.ts) and bulk writes (sqlite/bulk.ts) and hands them those calls.
// connect() in inbox.ts picks it for any --db that is not a postgres:// URL.

import { closeSync } from "node:fs";
import type { DatabaseSync, SQLInputValue } from "node:sqlite";
import { Worker } from "node:worker_threads";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { rowInserter } from "./bodies.ts";
import { SqliteBulk } from "./bulk.ts";
import { SqliteCommitter, whole } from "./commit.ts";
import { enterKey, occupyKey, settleKey, settleRows, type Statements } from "./order-keys.ts";
import { SqliteReads } from "./reads.ts";
import { SqliteRecords, writeAudit } from "./records.ts";
import { SqliteSearching } from "./searching.ts";
import { MIGRATIONS, readDurability, type Durability } from "./schema.ts";
import {
  NO_DESTINATION,
  type Permit,
  type Rate,
  type BreakerChange,
  type BreakerPolicy,
  type ClaimOptions,
  type DestinationState,
  type FailOptions,
  type Tally,
  type Attempt,
  type Try,
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
  type KeptAttempt,
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
  type ApiKey,
  type Audit,
  type EnableSearchOptions,
  type SearchStatus,
  type AuditEntry,
  type Remembered,
  type ApplyConfigOptions,
  type ConfigApplied,
  type StoredConfig,
  type StoredSecret,
  type AttemptCursor,
} from "../store.ts";
import { breakerAfter, checkClaim, gateClaim, checkPermit, gatePermit, tellSetAside } from "../breaker.ts";
import { checkOptions, routesOf, orderOf } from "../checks.ts";
import { conflicts, sha256, toDelivery, toGauges } from "../rows.ts";
import { ATTEMPT_SQL, mayOverflow, trimParams, tryParams } from "../sql.ts";
import { retryDelay } from "../timing.ts";

// A new delivery's row, one a route: the insert store() makes of it, its SQL made once.
const insertStored = rowInserter();

declare module "../store.ts" {
  interface Tx {
    /** The SQLite connection, for writes that need more than run (SQLite only). */
    readonly db?: DatabaseSync;
  }
}

// The gauge thread's whole program: one read transaction, so the totals and the live counts agree.
// Each live status is counted through its own partial index; the totals through the primary key's.
const GAUGER = `
const { DatabaseSync } = require("node:sqlite");
const { parentPort, workerData } = require("node:worker_threads");
const db = new DatabaseSync(workerData.path, { timeout: workerData.busyTimeoutMs });
// INDEXED BY, because for GROUP BY source the planner would rather walk the whole primary key (1 s at 1M rows).
const live = db.prepare(\`
  SELECT source, 'received' AS status, count(*) AS n, min(received_at) AS oldest FROM delivery_rows INDEXED BY deliveries_due
  WHERE status = 'received' AND order_key IS NULL GROUP BY source
  UNION ALL
  SELECT source, 'received', count(*), min(received_at) FROM delivery_rows INDEXED BY deliveries_ordered
  WHERE status = 'received' AND order_key IS NOT NULL GROUP BY source
  UNION ALL
  SELECT source, 'processing', count(*), min(received_at) FROM delivery_rows INDEXED BY deliveries_leased
  WHERE status = 'processing' GROUP BY source
  UNION ALL
  SELECT source, 'failed', count(*), NULL FROM delivery_rows INDEXED BY deliveries_failed WHERE status = 'failed' GROUP BY source\`);
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
  private readonly attemptsKept: number;
  private readonly backoffOptions: { retryDelayMs: number; retryCapMs: number; retryJitter: number };
  private gauger: Worker | undefined;
  // The connection's statements, bound once, for the order keys' functions and the rooms this inbox holds.
  private readonly statement: Statements = (text) => this.sql(text);
  // The operator's reads, and its bulk writes (each batch a write of this inbox's queue).
  private readonly reads: SqliteReads;
  private readonly bulk: SqliteBulk;
  private readonly records: SqliteRecords;
  private readonly searching: SqliteSearching;

  constructor(path: string, options: InboxOptions = {}) {
    checkOptions(options);
    super(path, options);
    this.target = path;
    const db = this.db;
    this.durability = { ...readDurability(db), ...(this.walFds.length > 0 ? { ownWalSync: true } : {}) };
    this.tx = { backend: "sqlite", db, run: (sql, ...params) => Number(this.sql(sql).run(...params).changes) };
    this.now = options.now ?? Date.now;
    this.random = options.random ?? Math.random;
    this.reads = new SqliteReads(this.statement, this.now);
    this.bulk = new SqliteBulk({
      db,
      sql: this.statement,
      now: this.now,
      enqueue: (run, partial) => this.enqueue(run, partial),
      flush: () => this.flush(),
    });
    this.records = new SqliteRecords({
      sql: this.statement,
      now: this.now,
      enqueue: (run, partial) => this.enqueue(run, partial),
    });
    this.searching = new SqliteSearching({
      sql: this.statement,
      now: this.now,
      enqueue: (run, partial) => this.enqueue(run, partial),
    });
    this.maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULTS.maxAttempts);
    this.attemptsKept = Math.max(1, options.attemptsKept ?? DEFAULTS.attemptsKept);
    this.backoffOptions = {
      retryDelayMs: options.retryDelayMs ?? DEFAULTS.retryDelayMs,
      retryCapMs: options.retryCapMs ?? DEFAULTS.retryCapMs,
      retryJitter: options.retryJitter ?? DEFAULTS.retryJitter,
    };
  }

  attempts(d: { source: string; id: string; receivedAt: number; destination?: string }): Promise<Attempt[]> {
    return this.reads.attempts(d);
  }
  find(id: string, source?: string): Promise<Delivery[]> {
    return this.reads.find(id, source);
  }
  list(filter?: { status?: Status; source?: string; limit?: number }): Promise<Delivery[]> {
    return this.reads.list(filter);
  }
  status(): Promise<InboxStatus> {
    return this.reads.status();
  }
  summary(): Promise<Summary> {
    return this.reads.summary();
  }
  histogram(since: number, bucketMs: number, until?: number): Promise<Bucket[]> {
    return this.reads.histogram(since, bucketMs, until);
  }
  page(after: { source: string; id: string; route?: number } | undefined, limit: number): Promise<Delivery[]> {
    return this.reads.page(after, limit);
  }
  // A search form reads the index once it has caught up with every row stored before it (indexSearch()).
  async search(filter: Filter, page?: { after?: Cursor; limit?: number; bodies?: boolean }): Promise<Delivery[]> {
    await this.searching.catchUp(filter);
    return this.reads.search(filter, page);
  }
  async count(filter: Filter): Promise<number> {
    await this.searching.catchUp(filter);
    return this.reads.count(filter);
  }
  kept(): Promise<Kept> {
    return this.reads.kept();
  }
  query(sql: string, ...params: SqlValue[]): Promise<Record<string, unknown>[]> {
    return this.reads.query(sql, ...params);
  }
  destinations(windowMs?: number): Promise<DestinationState[]> {
    return this.reads.destinations(windowMs);
  }

  restore(deliveries: readonly Delivery[], audit?: Audit): Promise<number> {
    return this.bulk.restore(deliveries, audit);
  }
  attemptPage(after: AttemptCursor | undefined, limit: number): Promise<KeptAttempt[]> {
    return this.reads.attemptPage(after, limit);
  }
  restoreAttempts(tries: readonly KeptAttempt[]): Promise<number> {
    return this.bulk.restoreAttempts(tries, this.attemptsKept);
  }
  async retryMatching(filter: Filter, options?: BulkOptions): Promise<number> {
    await this.searching.catchUp(filter);
    return this.bulk.retryMatching(filter, options);
  }
  async replayMatching(
    filter: Filter,
    options?: BulkOptions & { to?: string },
  ): Promise<{ replayed: number; tombstoned: number }> {
    await this.searching.catchUp(filter);
    return this.bulk.replayMatching(filter, options);
  }
  purge(options?: PurgeOptions): Promise<Purged> {
    return this.bulk.purge(options);
  }
  async dropBodies(filter: Filter, options?: BulkOptions): Promise<{ bodies: number; bytes: number }> {
    await this.searching.catchUp(filter);
    return this.bulk.dropBodies(filter, options);
  }
  /** vacuum rewrites the whole file (VACUUM), giving every free page back; it waits for the queue to drain. */
  vacuum(): Promise<{ before: number; after: number }> {
    return this.bulk.vacuum();
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
    // Partial: a body apart is inserted before its row, so a row that fails must take its body back with it.
    return this.enqueue(
      (db, guarded) =>
        whole(db, guarded, () => {
          // No route chose it: kept, done, so that a copy is still a duplicate, and nothing runs it.
          const none = routes.length === 0;
          const add = (route: number) => {
            const destination = none ? NO_DESTINATION : routes[route]!;
            const inserted = insertStored(this.statement, {
              source,
              id: delivery.id,
              body: delivery.body,
              body_sha256: digest,
              content_type: delivery.contentType ?? null,
              event_type: delivery.eventType ?? null,
              provider_time: delivery.providerTime ?? null,
              received_at: receivedAt,
              status: none ? "done" : "received",
              available_at: receivedAt,
              order_key: none ? null : ordered.key,
              event_time: ordered.eventTime,
              route,
              destination,
              headers,
              traceparent: delivery.traceparent ?? null,
              finished_at: none ? receivedAt : null,
              origin: delivery.origin ?? "webhook",
            });
            if (Number(inserted.changes) === 1 && ordered.key !== null && !none) {
              enterKey(
                this.statement,
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
            return Number(inserted.changes) === 1;
          };
          if (add(0)) {
            for (let route = 1; route < routes.length; route++) add(route);
            return "stored";
          }
          // A copy: its body is read only where the kept one came from reconcile (rows.ts conflicts()).
          const kept = this.sql(
            `SELECT body_sha256 AS sha256, origin, CASE WHEN origin = 'reconcile' THEN body END AS body
           FROM deliveries WHERE source = ? AND id = ? AND route = 0`,
          ).get(source, delivery.id) as { sha256: string; origin: string; body: Uint8Array | null } | undefined;
          if (!conflicts(kept, digest, delivery.body)) return "duplicate";
          this.sql("UPDATE delivery_rows SET conflicts = conflicts + 1 WHERE source = ? AND id = ? AND route = 0").run(
            source,
            delivery.id,
          );
          return "conflict";
        }),
      true,
    ) as Promise<Stored>;
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
        `UPDATE delivery_rows SET leased_until = ? + lease_ms
         WHERE destination = ? AND status = 'processing' AND leased_until > ? AND leased_until - lease_ms > ?`,
      ).run(now, destination, now, now);
      const latest = now + this.backoffOptions.retryCapMs;
      this.sql(
        "UPDATE delivery_rows SET available_at = ? WHERE destination = ? AND status = 'received' AND order_key IS NULL AND available_at > ?",
      ).run(latest, destination, latest);
      this.sql("UPDATE order_keys SET due = ? WHERE destination = ? AND due > ?").run(latest, destination, latest);
      // A worker that crashed on its last try would otherwise be retried forever: set it aside.
      const gaveUp = this.sql(
        `UPDATE delivery_rows SET status = 'failed', leased_until = NULL, lease_token = NULL, finished_at = ?,
                error = 'gave up: the lease expired on the last attempt (the worker crashed or hung)'
         WHERE destination = ? AND status = 'processing' AND leased_until <= ? AND attempts >= ?
         RETURNING source, id, order_key, destination, attempts, error`,
      ).all(now, destination, now, this.maxAttempts) as Row[];
      settleRows(this.statement, gaveUp, true);
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
        `UPDATE delivery_rows
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
           RETURNING rowid, *, (SELECT b.body FROM delivery_bodies b WHERE b.seq = body_seq) AS apart`,
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
      // A body kept apart comes back beside its row's empty one.
      for (const r of rows) if (r.apart != null) r.body = r.apart;
      const leases = rows.map(toLease);
      for (const lease of expired.length > 0 ? leases : [])
        if (expired.some((r) => r.rowid === rowids.get(lease))) lease.takeover = true;
      for (const lease of leases) if (lease.orderKey !== null) occupyKey(this.statement, lease, rowids.get(lease)!);
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
        `UPDATE delivery_rows SET leased_until = ?, lease_ms = ?
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
  finish(lease: Lease, writes: readonly LocalWrite[] = [], attempt?: Try): Promise<boolean> {
    const rowid = rowids.get(lease);
    return this.enqueue((db, guarded) => {
      // Unguarded, a write that throws fails the whole transaction, which commit() then redoes guarded.
      if (!guarded || writes.length === 0) return this.markDone(db, lease, rowid, writes, attempt);
      // A savepoint confines a failing write to its own delivery; the batch around it still commits.
      // Prepared once like any statement: exec() would parse the text for every delivery.
      this.sql("SAVEPOINT finish").run();
      try {
        const done = this.markDone(db, lease, rowid, writes, attempt);
        this.sql("RELEASE finish").run();
        return done;
      } catch (error) {
        this.sql("ROLLBACK TO finish").run();
        this.sql("RELEASE finish").run();
        throw error;
      }
    }, writes.length > 0) as Promise<boolean>;
  }

  // markDone sets the fenced done mark, then keeps the try and runs the writes if the lease still held.
  private markDone(
    db: DatabaseSync,
    lease: Lease,
    rowid: number | undefined,
    writes: readonly LocalWrite[],
    attempt: Try | undefined,
  ): boolean {
    const now = this.now();
    // By rowid when the claim gave one, one b-tree walk instead of two; the token fences it all the same.
    // A rowid that VACUUM renumbered misses, and the (source, id) key then finds the row.
    let changed =
      rowid === undefined
        ? 0
        : this.sql(
            `UPDATE delivery_rows SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ?
         WHERE rowid = ? AND lease_token = ? AND status = 'processing'`,
          ).run(now, rowid, lease.token).changes;
    if (changed === 0) {
      changed = this.sql(
        `UPDATE delivery_rows SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ?
           WHERE source = ? AND id = ? AND route = ? AND lease_token = ? AND status = 'processing'`,
      ).run(now, lease.source, lease.id, lease.route, lease.token).changes;
    }
    if (changed !== 1) return false;
    if (lease.orderKey !== null) this.handled(lease);
    if (attempt !== undefined) this.keepTry(lease, lease.attempts, null, attempt, now, mayOverflow(lease));
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

  // keepTry adds a try to the delivery's attempt log, and lets its oldest go past the cap.
  private keepTry(
    lease: Lease,
    attempt: number,
    error: string | null,
    tried: Try | undefined,
    now: number,
    trim = true,
  ): void {
    this.sql(ATTEMPT_SQL.keep).run(...(tryParams(lease, attempt, error, tried, now) as SQLInputValue[]));
    if (trim) this.sql(ATTEMPT_SQL.trim).run(...(trimParams(lease, this.attemptsKept) as SQLInputValue[]));
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
      this.keepTry(lease, row.attempts, error, options.attempt, now);
      if (options.permanent || row.attempts >= this.maxAttempts) {
        this.sql(
          `UPDATE delivery_rows SET status = 'failed', error = ?, leased_until = NULL, lease_token = NULL, finished_at = ?
           WHERE source = ? AND id = ? AND route = ?`,
        ).run(error, now, lease.source, lease.id, lease.route);
        if (lease.orderKey !== null)
          settleKey(this.statement, lease.source, lease.destination, lease.orderKey, lease.id, true);
        return { status: "failed" };
      }
      const retryAt = now + retryDelay(row.attempts, options, { ...this.backoffOptions, random: this.random });
      this.sql(
        `UPDATE delivery_rows SET status = 'received', error = ?, leased_until = NULL, lease_token = NULL, available_at = ?
         WHERE source = ? AND id = ? AND route = ?`,
      ).run(error, retryAt, lease.source, lease.id, lease.route);
      if (lease.orderKey !== null)
        settleKey(this.statement, lease.source, lease.destination, lease.orderKey, lease.id, false);
      return { status: "received", retryAt };
    }) as Promise<Failure | undefined>;
  }

  /** release hands a claimed delivery back untouched, without spending an attempt (graceful shutdown). */
  release(lease: Lease): Promise<boolean> {
    return this.enqueue((db) => {
      const released =
        this.sql(
          `UPDATE delivery_rows SET status = 'received', attempts = max(attempts - 1, 0), leased_until = NULL,
                  lease_token = NULL, available_at = ?
           WHERE source = ? AND id = ? AND route = ? AND lease_token = ? AND status = 'processing'`,
        ).run(this.now(), lease.source, lease.id, lease.route, lease.token).changes === 1;
      if (released && lease.orderKey !== null)
        settleKey(this.statement, lease.source, lease.destination, lease.orderKey, lease.id, false);
      return released;
    }) as Promise<boolean>;
  }

  /** retry puts failed deliveries back in the queue with their attempts reset; returns how many. */
  retry(target: { source?: string; id: string } | { allFailed: true }, audit?: Audit): Promise<number> {
    return this.atomic(() => {
      const now = this.now();
      const rows = (
        "allFailed" in target
          ? this.sql(`UPDATE delivery_rows SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                    WHERE status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key, destination`).all(
              now,
            )
          : this.sql(`UPDATE delivery_rows SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                    WHERE source = ? AND id = ? AND status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key, destination`).all(
              now,
              target.source ?? DEFAULTS.source,
              target.id,
            )
      ) as Row[];
      settleRows(this.statement, rows, false);
      writeAudit(this.statement, audit, rows.length, now);
      return rows.length;
    });
  }

  // atomic queues a write that commits whole with its audit entry, or not at all (whole()).
  private atomic<T>(run: () => T): Promise<T> {
    return this.enqueue((db, guarded) => whole(db, guarded, run), true) as Promise<T>;
  }

  /** onWake is a no-op on SQLite: one machine, and the worker's polling is the wake-up. */
  onWake(_listener: (payload?: string) => void): () => void {
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
  pause(destination: string, reason: string = "paused by a person", audit?: Audit): Promise<boolean> {
    checkClaim({ destination });
    return this.atomic(() => {
      const now = this.now();
      this.sql("INSERT INTO destinations (name) VALUES (?) ON CONFLICT (name) DO NOTHING").run(destination);
      const changed = Number(
        this.sql(
          "UPDATE destinations SET paused = 1, paused_reason = ?, changed_at = ? WHERE name = ? AND paused = 0",
        ).run(reason, now, destination).changes,
      );
      writeAudit(this.statement, audit, changed, now);
      return changed === 1;
    });
  }

  /** resume lets a paused destination's deliveries go again, its breaker closed and counts fresh. */
  resume(destination: string, audit?: Audit): Promise<boolean> {
    checkClaim({ destination });
    return this.atomic(() => {
      const now = this.now();
      const changed = Number(
        this.sql(
          `UPDATE destinations SET paused = 0, paused_reason = NULL, state = 'closed', failures = 0, window_start = NULL,
              window_done = 0, window_failed = 0, retry_at = NULL, probe_until = NULL, changed_at = ?
       WHERE name = ? AND paused = 1`,
        ).run(now, destination).changes,
      );
      writeAudit(this.statement, audit, changed, now);
      return changed === 1;
    });
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

  // handled records a finished delivery's event time as its key's newest, then moves the key on.
  private handled(lease: Lease): void {
    settleKey(this.statement, lease.source, lease.destination, lease.orderKey!, lease.id, false, lease.eventTime);
  }

  /** failuresByError counts the failed deliveries by their exact last error, through the failed rows' partial index. */
  async failuresByError(): Promise<{ error: string | null; count: number; latest: number }[]> {
    const rows = this.sql(
      "SELECT error, count(*) AS n, max(received_at) AS latest FROM deliveries WHERE status = 'failed' GROUP BY error",
    ).all() as { error: string | null; n: number; latest: number }[];
    return rows.map((r) => ({ error: r.error, count: Number(r.n), latest: Number(r.latest) }));
  }

  searchStatus(): Promise<SearchStatus> {
    return this.searching.status();
  }
  enableSearch(options?: EnableSearchOptions): Promise<SearchStatus> {
    return this.searching.enable(options);
  }
  disableSearch(audit?: Audit): Promise<boolean> {
    return this.searching.disable(audit);
  }
  indexSearch(limit?: number): Promise<number> {
    return this.searching.index(limit);
  }
  addApiKey(key: ApiKey, audit?: Audit): Promise<void> {
    return this.records.addApiKey(key, audit);
  }
  apiKeys(): Promise<ApiKey[]> {
    return this.records.apiKeys();
  }
  apiKeyByHash(hash: string): Promise<ApiKey | undefined> {
    return this.records.apiKeyByHash(hash);
  }
  revokeApiKey(id: string, at: number, audit?: Audit): Promise<boolean> {
    return this.records.revokeApiKey(id, at, audit);
  }
  remember(record: Remembered, expiredBefore: number): Promise<Remembered> {
    return this.records.remember(record, expiredBefore);
  }
  recall(key: string, since: number): Promise<Remembered | undefined> {
    return this.records.recall(key, since);
  }
  addAudit(entry: Omit<AuditEntry, "seq">): Promise<void> {
    return this.records.addAudit(entry);
  }
  auditLog(page: { before?: number; limit: number }): Promise<AuditEntry[]> {
    return this.records.auditLog(page);
  }
  auditCounts(): Promise<{ kind: string; n: number }[]> {
    return this.records.auditCounts();
  }
  readConfig(): Promise<StoredConfig | undefined> {
    return this.records.readConfig();
  }
  configVersion(): Promise<number> {
    return this.records.configVersion();
  }
  configHistory(): Promise<StoredConfig[]> {
    return this.records.configHistory();
  }
  configVersions(page: { before?: number; limit: number }): Promise<StoredConfig[]> {
    return this.records.configVersions(page);
  }
  restoreConfig(versions: readonly StoredConfig[]): Promise<number> {
    return this.records.restoreConfig(versions);
  }
  restoreApiKeys(keys: readonly ApiKey[]): Promise<number> {
    return this.records.restoreApiKeys(keys);
  }
  restoreAudit(entries: readonly AuditEntry[]): Promise<number> {
    return this.records.restoreAudit(entries);
  }
  applyConfig(document: string, options: ApplyConfigOptions): Promise<ConfigApplied> {
    return this.records.applyConfig(document, options);
  }
  setSecret(secret: StoredSecret, audit?: Audit): Promise<boolean> {
    return this.records.setSecret(secret, audit);
  }
  deleteSecret(name: string, audit?: Audit): Promise<boolean> {
    return this.records.deleteSecret(name, audit);
  }
  secrets(): Promise<StoredSecret[]> {
    return this.records.secrets();
  }
  putSecrets(secrets: readonly StoredSecret[], audit?: Audit): Promise<number> {
    return this.records.putSecrets(secrets, audit);
  }
  secretsVersion(): Promise<number> {
    return this.records.secretsVersion();
  }
}

// How long ready()'s probe commit waits for the write lock before it reports the store as not ready.
const READY_LOCK_MS = 50;
