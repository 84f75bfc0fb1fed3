// inbox.ts: the durable inbox. The store's contract (Inbox), its node:sqlite backend, connect(), and the
// operator's CLI. Store every delivery before answering, claim it under a lease, finish it exactly once.
//   npx tsx inbox.ts status | list | show <id> | retry <id> | retry --all-failed | copy   [--db inbox.db]
// --db (or INBOX_DB) is a file path, or a postgres:// URL for the PostgreSQL backend in postgres.ts.
// Imported by receiver.ts and worker.ts; run directly, it is the CLI at the bottom of this file.

import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { dirname } from "node:path";
import { DatabaseSync, type SQLInputValue, type StatementSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { Worker } from "node:worker_threads";

/** DEFAULTS holds every default of the suite; the entry points read env and argv, nothing else does. */
export const DEFAULTS = {
  /** Database file, when neither --db nor INBOX_DB is given. @default "inbox.db" */
  db: "inbox.db",
  /** Source name of the article's single, unsigned sender. @default "default" */
  source: "default",
  /** Milliseconds a worker may hold a delivery before another may take it over. @default 60_000 */
  leaseMs: 60_000,
  /** Tries before a delivery is set aside as failed for a person to look at. @default 5 */
  maxAttempts: 5,
  /** Milliseconds before the first retry; each later retry waits twice as long. @default 2_000 */
  retryDelayMs: 2_000,
  /** Longest wait between two tries, whatever the doubling says. @default 3_600_000 */
  retryCapMs: 3_600_000,
  /** Up to this fraction is added at random to each backoff, so failed deliveries don't retry in step. @default 0.2 */
  retryJitter: 0.2,
  /** WAL pages after which a commit also checkpoints (see openDatabase). @default 4_000 */
  walAutocheckpointPages: 4_000,
  /** Milliseconds a writer waits for SQLite's lock before giving up with SQLITE_BUSY. @default 5_000 */
  busyTimeoutMs: 5_000,
  /** Most deliveries or completions committed in one transaction. @default 512 */
  batchSize: 512,
  /** Longest delivery ID accepted, in characters. @default 256 */
  maxIdLength: 256,
  /** Largest body accepted, in bytes. @default 1_000_000 */
  maxBodyBytes: 1_000_000,
  /** Receiver port. @default 8000 */
  port: 8000,
  /** Receiver address; loopback unless told otherwise. @default "127.0.0.1" */
  host: "127.0.0.1",
  /** Requests the receiver holds at once before answering 503. @default 2_048 */
  maxInFlight: 2_048,
  /** Milliseconds a client may take to send its headers. @default 10_000 */
  headersTimeoutMs: 10_000,
  /** Milliseconds a client may take to send a whole request. @default 30_000 */
  requestTimeoutMs: 30_000,
  /** Seconds a rejected sender is asked to wait, in Retry-After. @default 5 */
  retryAfterS: 5,
  /** Seconds a signed timestamp may be off (Stripe: old) before a delivery counts as replayed. @default 300 */
  signatureToleranceS: 300,
  /** Handlers a worker runs at once. @default 8 */
  concurrency: 8,
  /** Shortest and longest pause between claims when the queue is idle. @default 5, 50 */
  pollMinMs: 5,
  pollMaxMs: 50,
  /** Milliseconds a stopping worker lets work in flight finish before releasing it. @default 10_000 */
  shutdownGraceMs: 10_000,
  /**
   * PostgreSQL connections each process holds: group commits run on up to this many at once, and one
   * more listens for wake-ups. Ten hosts of two processes each stay well under max_connections (100).
   * @default 4
   */
  poolSize: 4,
  /** Milliseconds to wait for a PostgreSQL connection before a store fails (and the receiver answers 503). @default 5_000 */
  connectTimeoutMs: 5_000,
  /** Shortest pause between two wake-up NOTIFYs from one process: NOTIFY takes a global lock at commit. @default 25 */
  notifyEveryMs: 25,
} as const;

/** Status is where a delivery is in its life. */
export type Status = "received" | "processing" | "done" | "failed";
export const STATUSES: readonly Status[] = ["received", "processing", "done", "failed"];

/** Incoming is a delivery as the receiver hands it over, before it is stored. */
export interface Incoming {
  source?: string;
  id: string;
  body: Uint8Array;
  contentType?: string | null;
  eventType?: string | null;
  /** The provider's own timestamp for the delivery, in ms since the epoch, where it sends one. */
  providerTime?: number | null;
  /** Deliveries that share an order key run one at a time, in event time; none means unordered. */
  orderKey?: string | null;
  /** When the event happened, in ms (Stripe: the event's created); ordered deliveries fall back to providerTime, then arrival. */
  eventTime?: number | null;
  /** An ordered delivery set aside as failed blocks its key until it is retried, rather than letting later ones pass. */
  strictOrder?: boolean;
}

/** Delivery is one stored webhook, as the worker and the CLI see it. */
export interface Delivery {
  source: string;
  id: string;
  body: Buffer;
  bodySha256: string;
  contentType: string | null;
  eventType: string | null;
  providerTime: number | null;
  receivedAt: number;
  status: Status;
  attempts: number;
  availableAt: number;
  leasedUntil: number | null;
  error: string | null;
  conflicts: number;
  finishedAt: number | null;
  /** The order key, or null for an unordered delivery. */
  orderKey: string | null;
  /** The event time its key is ordered by, in ms. */
  eventTime: number | null;
  /** Set when it was handed over stale: the ID of a newer delivery of its key that was already handled. */
  newerId: string | null;
}

/** Lease is a claimed delivery; its token fences every later write against a takeover. */
export interface Lease extends Delivery {
  token: string;
  leasedUntil: number;
}

/** Stored says whether store() kept the body: a duplicate whose body differs is a conflict. */
export type Stored = "stored" | "duplicate" | "conflict";

/** SqlValue is a value bound to a `?` parameter, on either backend. */
export type SqlValue = string | number | bigint | Uint8Array | null;

/**
 * Tx is a handler's way into the transaction that commits its done mark. `run` binds `?` parameters on
 * both backends: on SQLite it runs at once and returns the rows it changed; on PostgreSQL it returns a
 * promise of that, which the write must return (or await) so the commit waits for it.
 */
export interface Tx {
  readonly backend: Backend;
  run(sql: string, ...params: SqlValue[]): number | Promise<number>;
  /** The SQLite connection, for writes that need more than run (SQLite only). */
  readonly db?: DatabaseSync;
  /** The PostgreSQL client inside the transaction (PostgreSQL only); its queries must be awaited. */
  readonly client?: { query(text: string, values?: unknown[]): Promise<{ rowCount: number | null; rows: unknown[] }> };
}

/**
 * LocalWrite is a handler's write to the inbox database, committed together with the done mark. On SQLite
 * it must be synchronous (the transaction does not wait for a promise, and says so); on PostgreSQL it
 * returns the promise of its queries.
 */
export type LocalWrite = (tx: Tx) => unknown;

/** Backend names where the deliveries live. */
export type Backend = "sqlite" | "postgres";

/** PermanentError, thrown by a handler, sets the delivery aside as failed at once: retrying can't help. */
export class PermanentError extends Error {
  override name = "PermanentError";
}

/** InboxOptions configures an Inbox; every field has a default in DEFAULTS. */
export interface InboxOptions {
  /** The clock, in ms since the epoch. @default Date.now */
  now?: () => number;
  /** A number in [0, 1) for backoff jitter. @default Math.random */
  random?: () => number;
  /** @default DEFAULTS.busyTimeoutMs */
  busyTimeoutMs?: number;
  /** @default DEFAULTS.batchSize */
  batchSize?: number;
  /** @default DEFAULTS.maxAttempts */
  maxAttempts?: number;
  /** @default DEFAULTS.retryDelayMs */
  retryDelayMs?: number;
  /** @default DEFAULTS.retryCapMs */
  retryCapMs?: number;
  /** @default DEFAULTS.retryJitter */
  retryJitter?: number;
  /**
   * Checkpoint on a thread of its own, so that no commit, and no 200 waiting on one, also waits while
   * the WAL is copied into the database; commits then checkpoint only if that thread falls far behind.
   * @default false
   */
  backgroundCheckpoints?: boolean;
  /** PostgreSQL: connections in the pool. @default DEFAULTS.poolSize */
  poolSize?: number;
  /** PostgreSQL: LISTEN for wake-ups; off behind PgBouncer in transaction mode, where polling remains. @default true */
  listen?: boolean;
}

// The checkpointer thread's whole program. PASSIVE neither waits for nor blocks a writer, so it can run
// beside the receiver's commits; a failed pass (a full disk, a busy lock) is simply the next one's work,
// and the commits' own checkpoint (BACKSTOP_PAGES) bounds the WAL if passes keep failing.
const CHECKPOINTER = `
const { DatabaseSync } = require("node:sqlite");
const { parentPort, workerData } = require("node:worker_threads");
const db = new DatabaseSync(workerData.path, { timeout: 0 });
db.exec("PRAGMA synchronous = FULL");
const timer = setInterval(() => { try { db.exec("PRAGMA wal_checkpoint(PASSIVE)"); } catch {} }, workerData.everyMs);
parentPort.once("message", () => { clearInterval(timer); db.close(); parentPort.close(); });`;
// How often the checkpointer runs, and how large the WAL may grow before a commit checkpoints anyway.
const CHECKPOINT_EVERY_MS = 100;
const BACKSTOP_PAGES = 16_000;

// The schema, in order. A shipped entry is never edited: add a new one after it.
const MIGRATIONS: readonly string[] = [
  `CREATE TABLE deliveries (
     source        TEXT    NOT NULL,
     id            TEXT    NOT NULL,
     body          BLOB    NOT NULL,
     body_sha256   TEXT    NOT NULL,
     content_type  TEXT,
     event_type    TEXT,
     provider_time INTEGER,
     received_at   INTEGER NOT NULL,
     status        TEXT    NOT NULL CHECK (status IN ('received', 'processing', 'done', 'failed')),
     attempts      INTEGER NOT NULL DEFAULT 0,
     available_at  INTEGER NOT NULL,
     leased_until  INTEGER,
     lease_token   TEXT,
     error         TEXT,
     conflicts     INTEGER NOT NULL DEFAULT 0,
     finished_at   INTEGER,
     PRIMARY KEY (source, id)
   );
   -- Partial indexes keep a claim's cost flat however many done rows pile up behind it.
   CREATE INDEX deliveries_due ON deliveries (available_at) WHERE status = 'received';
   CREATE INDEX deliveries_leased ON deliveries (leased_until) WHERE status = 'processing';
   CREATE INDEX deliveries_failed ON deliveries (received_at) WHERE status = 'failed';`,
  // The length each lease was granted for, so a claim can tell a clock that stepped back from a live lease.
  `ALTER TABLE deliveries ADD COLUMN lease_ms INTEGER;`,
  // Ordering (see claimBatch and settleKey). Ordered deliveries leave the unordered claim's index, so it
  // never walks past them; each key's head row says which one may run next and from when (due).
  `ALTER TABLE deliveries ADD COLUMN order_key TEXT;
   ALTER TABLE deliveries ADD COLUMN event_time INTEGER;
   ALTER TABLE deliveries ADD COLUMN newer_id TEXT;
   DROP INDEX deliveries_due;
   CREATE INDEX deliveries_due ON deliveries (available_at) WHERE status = 'received' AND order_key IS NULL;
   -- The rowid, last in every SQLite index, is the arrival order that breaks event-time ties.
   CREATE INDEX deliveries_ordered ON deliveries (source, order_key, event_time) WHERE status = 'received' AND order_key IS NOT NULL;
   CREATE TABLE order_keys (
     source          TEXT    NOT NULL,
     order_key       TEXT    NOT NULL,
     -- The head: the delivery that runs next (received, due at due), runs now (processing, due NULL), or
     -- blocks the key (failed under strict, due NULL); NULL when nothing of the key is waiting.
     head_id         TEXT,
     head_event_time INTEGER,
     head_seq        INTEGER,
     due             INTEGER,
     -- The newest event handled so far: an older one after it is handed over stale.
     last_event_time INTEGER,
     last_id         TEXT,
     strict          INTEGER NOT NULL DEFAULT 0,
     PRIMARY KEY (source, order_key)
   );
   CREATE INDEX order_keys_due ON order_keys (due) WHERE due IS NOT NULL;`,
];

/** openDatabase opens (creating if needed) an inbox database and brings its schema up to date. */
export function openDatabase(path: string, busyTimeoutMs: number = DEFAULTS.busyTimeoutMs): DatabaseSync {
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(path, { timeout: busyTimeoutMs });
  } catch (error) {
    // SQLite only says "unable to open database file"; a missing folder is the usual cause, so name it.
    const reason = existsSync(dirname(path)) ? message(error) : `no such directory ${dirname(path)}`;
    throw new Error(`open ${path}: ${reason}`, { cause: error });
  }
  try {
    // WAL lets the worker read while the receiver writes, and makes each commit one append.
    db.exec("PRAGMA journal_mode = WAL");
    // FULL fsyncs the WAL at every commit: a 200 means the delivery survives a power cut.
    db.exec("PRAGMA synchronous = FULL");
    // A checkpoint copies the WAL into the database and fsyncs it, in whichever commit crosses the
    // threshold. 4000 pages (16 MB, not the default 1000) means a quarter as many, each writing the
    // pages that many small commits touched over and over only once. The WAL file is reused, not grown.
    db.exec(`PRAGMA wal_autocheckpoint = ${DEFAULTS.walAutocheckpointPages}`);
    // 16 MB of page cache (the default is 2 MB) keeps the indexes a claim and a finish walk in memory at
    // a backlog of 200k; it is a bound, so memory stays flat whatever the backlog.
    db.exec("PRAGMA cache_size = -16000");
    // The claim's ORDER BY may sort in a temporary b-tree: in memory, not a temporary file.
    db.exec("PRAGMA temp_store = MEMORY");
    migrate(db);
    // SQLite quietly opens a file it may not write read-only: find out now, not at the first delivery.
    // (BEGIN IMMEDIATE alone succeeds on a read-only file in WAL mode; a real write, rolled back, does not.)
    db.exec("BEGIN IMMEDIATE");
    try {
      db.exec(`PRAGMA user_version = ${MIGRATIONS.length}`);
    } finally {
      db.exec("ROLLBACK");
    }
  } catch (error) {
    db.close();
    throw new Error(`open ${path}: ${message(error)}`, { cause: error });
  }
  return db;
}

function migrate(db: DatabaseSync): void {
  const { user_version: version } = db.prepare("PRAGMA user_version").get() as { user_version: number };
  if (version > MIGRATIONS.length) {
    throw new Error(`schema version ${version} is newer than this code knows (${MIGRATIONS.length})`);
  }
  for (let next = version; next < MIGRATIONS.length; next++) {
    // IMMEDIATE, so two processes opening a new file don't both run the same migration.
    db.exec("BEGIN IMMEDIATE");
    try {
      const { user_version: now } = db.prepare("PRAGMA user_version").get() as { user_version: number };
      if (now === next) {
        db.exec(MIGRATIONS[next]!);
        db.exec(`PRAGMA user_version = ${next + 1}`);
      }
      db.exec("COMMIT");
    } catch (error) {
      db.exec("ROLLBACK");
      throw error;
    }
  }
}

/** sha256 is the hex digest used to tell a true duplicate from a conflicting one. */
export function sha256(body: Uint8Array): string {
  return createHash("sha256").update(body).digest("hex");
}

/** backoff is how long to wait before try number attempts+1: doubling, capped, with upward jitter. */
export function backoff(
  attempts: number,
  opts: { retryDelayMs: number; retryCapMs: number; retryJitter: number; random: () => number },
): number {
  const doubled = opts.retryDelayMs * 2 ** Math.max(0, attempts - 1);
  return Math.round(Math.min(opts.retryCapMs, doubled * (1 + opts.retryJitter * opts.random())));
}

type Row = Record<string, SQLInputValue>;

function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

// toLease turns a claimed row into its Lease, and remembers its rowid for the finish.
function toLease(row: Row): Lease {
  const lease = toDelivery(row) as Lease;
  lease.token = row.lease_token as string;
  rowids.set(lease, row.rowid as number);
  return lease;
}

function toDelivery(row: Row): Delivery {
  return {
    source: row.source as string,
    id: row.id as string,
    body: asBuffer(row.body as Uint8Array),
    bodySha256: row.body_sha256 as string,
    contentType: row.content_type as string | null,
    eventType: row.event_type as string | null,
    providerTime: row.provider_time as number | null,
    receivedAt: row.received_at as number,
    status: row.status as Status,
    attempts: row.attempts as number,
    availableAt: row.available_at as number,
    leasedUntil: row.leased_until as number | null,
    error: row.error as string | null,
    conflicts: row.conflicts as number,
    finishedAt: row.finished_at as number | null,
    orderKey: (row.order_key ?? null) as string | null,
    eventTime: (row.event_time ?? null) as number | null,
    newerId: (row.newer_id ?? null) as string | null,
  };
}

/**
 * orderOf checks an incoming delivery's order key and works out the event time its key is ordered by:
 * the provider's event time, else its signed send time, else when it arrived.
 */
export function orderOf(delivery: Incoming, receivedAt: number | null): { key: string | null; eventTime: number | null; strict: boolean } {
  const key = delivery.orderKey ?? null;
  if (key !== null && (typeof key !== "string" || key === "")) {
    throw new TypeError(`store: expected orderKey to be a non-empty string or null, got ${JSON.stringify(key)}`);
  }
  for (const name of ["eventTime", "providerTime"] as const) {
    const value = delivery[name];
    if (value != null && (typeof value !== "number" || !Number.isFinite(value))) {
      throw new TypeError(`store: expected ${name} to be a number of ms or null, got ${String(value)}`);
    }
  }
  // PostgreSQL passes no receivedAt: the database's clock fills it in.
  const eventTime = delivery.eventTime ?? (key === null ? null : delivery.providerTime ?? receivedAt);
  return { key, eventTime: eventTime === null ? null : Math.round(eventTime), strict: delivery.strictOrder === true };
}

/** Failure is the outcome of fail(): retried later, or set aside. */
export type Failure = { status: "received"; retryAt: number } | { status: "failed" };

// One unit of work for the group committer: runs inside the shared transaction, settles after COMMIT.
// `guarded` asks an op that could fail halfway (partial) to confine itself in a savepoint.
interface Op {
  run(db: DatabaseSync, guarded: boolean): unknown;
  partial: boolean;
  resolve(value: unknown): void;
  reject(error: unknown): void;
}

// The rowid each lease was claimed at, so its finish finds the row without the (source, id) index; kept
// out of the Lease type, which is the handler's.
const rowids = new WeakMap<Lease, number>();

/**
 * Inbox is the store's contract, named after a delivery's life: store, claim, extend, finish, fail,
 * release, retry; then find, list and status to look, and flush and close. SqliteInbox (below) and
 * PostgresInbox (postgres.ts) implement it, and test/contract.test.ts holds both to it. Every write is
 * queued and committed with whatever else is waiting (group commit), so one commit serves many callers,
 * and a promise settles only after its transaction is durable.
 */
export interface Inbox {
  readonly backend: Backend;
  /** Where the deliveries live, fit for a log line: a path, or a URL without its password. */
  readonly target: string;
  /** store saves a delivery if its (source, id) is new; a duplicate keeps the first copy. */
  store(delivery: Incoming): Promise<Stored>;
  /** claim leases the oldest due delivery, or returns undefined when there is nothing to do. */
  claim(leaseMs?: number): Promise<Lease | undefined>;
  /** claimBatch leases up to limit due deliveries (new, due retries, expired leases) in one transaction. */
  claimBatch(limit: number, leaseMs?: number): Promise<Lease[]>;
  /** extend pushes a held lease further out; false means it was lost to a takeover. */
  extend(lease: Lease, leaseMs?: number): Promise<boolean>;
  /** finish marks a delivery done with the handler's writes in one transaction; false if the lease was lost. */
  finish(lease: Lease, writes?: readonly LocalWrite[]): Promise<boolean>;
  /** fail records a failed try: retried after a backoff, or set aside; undefined if the lease was lost. */
  fail(lease: Lease, error: string, options?: { permanent?: boolean }): Promise<Failure | undefined>;
  /** release hands a claimed delivery back untouched, without spending an attempt. */
  release(lease: Lease): Promise<boolean>;
  /** retry puts failed deliveries back in the queue with their attempts reset; returns how many. */
  retry(target: { source?: string; id: string } | { allFailed: true }): Promise<number>;
  /** find returns the deliveries with this ID, in every source or in one. */
  find(id: string, source?: string): Promise<Delivery[]>;
  /** list returns deliveries newest first, optionally of one status or source. */
  list(filter?: { status?: Status; source?: string; limit?: number }): Promise<Delivery[]>;
  /** status summarises the queue: counts, failures, the oldest wait and conflicting duplicates. */
  status(): Promise<InboxStatus>;
  /** page returns up to limit deliveries in key order after the cursor, every field, for copying. */
  page(after: { source: string; id: string } | undefined, limit: number): Promise<Delivery[]>;
  /** restore writes deliveries as they are (from page() of another inbox); existing keys are skipped. */
  restore(deliveries: readonly Delivery[]): Promise<number>;
  /** query runs SQL with `?` parameters outside any delivery: the handler's own tables, and tests. */
  query(sql: string, ...params: SqlValue[]): Promise<Record<string, unknown>[]>;
  /** onWake calls back when new deliveries may be due (PostgreSQL's NOTIFY), a hint beside polling; returns how to stop. */
  onWake(listener: () => void): () => void;
  /** flush resolves once every write queued so far is committed. */
  flush(): Promise<void>;
  /** close commits what is queued, then lets go of the database. */
  close(): Promise<void>;
}

/** SqliteInbox is the Inbox on one node:sqlite file: the embedded default. */
export class SqliteInbox implements Inbox {
  readonly backend = "sqlite";
  readonly db: DatabaseSync;
  readonly path: string;
  readonly target: string;
  private readonly tx: Tx;
  private readonly now: () => number;
  private readonly random: () => number;
  private readonly batchSize: number;
  private readonly busyTimeoutMs: number;
  private readonly maxAttempts: number;
  private readonly backoffOptions: { retryDelayMs: number; retryCapMs: number; retryJitter: number };
  private readonly statements = new Map<string, StatementSync>();
  // Commits left to checkpoint one by one since the disk was last full, and the setting to go back to.
  private tightCommits = 0;
  private walAutocheckpoint = 0;
  private queue: Op[] = [];
  private checkpointer: Worker | undefined;
  private flushing = false;
  private closed = false;

  constructor(path: string, options: InboxOptions = {}) {
    for (const [key, value] of Object.entries(options)) {
      if (key === "now" || key === "random") {
        if (typeof value !== "function") throw new TypeError(`Inbox: expected ${key} to be a function, got ${typeof value}`);
      } else if (key === "backgroundCheckpoints" || key === "listen") {
        if (typeof value !== "boolean") throw new TypeError(`Inbox: expected ${key} to be a boolean, got ${typeof value}`);
      } else if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
        throw new TypeError(`Inbox: expected ${key} to be a number >= 0, got ${String(value)}`);
      }
    }
    this.path = this.target = path;
    this.db = openDatabase(path, options.busyTimeoutMs ?? DEFAULTS.busyTimeoutMs);
    const db = this.db;
    this.tx = { backend: "sqlite", db, run: (sql, ...params) => Number(this.sql(sql).run(...params).changes) };
    this.now = options.now ?? Date.now;
    this.random = options.random ?? Math.random;
    this.batchSize = Math.max(1, options.batchSize ?? DEFAULTS.batchSize);
    this.busyTimeoutMs = Math.round(options.busyTimeoutMs ?? DEFAULTS.busyTimeoutMs);
    this.maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULTS.maxAttempts);
    if (options.backgroundCheckpoints) {
      this.db.exec(`PRAGMA wal_autocheckpoint = ${BACKSTOP_PAGES}`);
      // The thread runs a dozen lines: a small heap keeps the receiver's RSS where it was.
      this.checkpointer = new Worker(CHECKPOINTER, {
        eval: true, workerData: { path, everyMs: CHECKPOINT_EVERY_MS },
        resourceLimits: { maxOldGenerationSizeMb: 8, maxYoungGenerationSizeMb: 1 },
      });
      this.checkpointer.unref();
      // Should the thread die, the commits take checkpointing back, as if it had never been started.
      this.checkpointer.on("error", () => {
        this.checkpointer = undefined;
        if (!this.closed) this.db.exec(`PRAGMA wal_autocheckpoint = ${DEFAULTS.walAutocheckpointPages}`);
      });
    }
    this.backoffOptions = {
      retryDelayMs: options.retryDelayMs ?? DEFAULTS.retryDelayMs,
      retryCapMs: options.retryCapMs ?? DEFAULTS.retryCapMs,
      retryJitter: options.retryJitter ?? DEFAULTS.retryJitter,
    };
  }

  /** store saves a delivery if its (source, id) is new; a duplicate keeps the first copy. */
  store(delivery: Incoming): Promise<Stored> {
    const source = delivery.source ?? DEFAULTS.source;
    const receivedAt = this.now();
    const digest = sha256(delivery.body);
    const ordered = orderOf(delivery, receivedAt);
    return this.enqueue((db) => {
      const inserted = this
        .sql(
          `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time,
                                   received_at, status, available_at, order_key, event_time)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'received', ?, ?, ?)
           ON CONFLICT (source, id) DO NOTHING`,
        )
        .run(source, delivery.id, delivery.body, digest, delivery.contentType ?? null, delivery.eventType ?? null,
          delivery.providerTime ?? null, receivedAt, receivedAt, ordered.key, ordered.eventTime);
      if (inserted.changes === 1) {
        if (ordered.key !== null) this.enter(source, ordered.key, delivery.id, ordered.eventTime!, Number(inserted.lastInsertRowid), receivedAt, ordered.strict);
        return "stored";
      }
      const conflict = this
        .sql("UPDATE deliveries SET conflicts = conflicts + 1 WHERE source = ? AND id = ? AND body_sha256 <> ?")
        .run(source, delivery.id, digest);
      return conflict.changes === 1 ? "conflict" : "duplicate";
    }) as Promise<Stored>;
  }

  /** claim leases the oldest due delivery, or returns undefined when there is nothing to do. */
  async claim(leaseMs: number = DEFAULTS.leaseMs): Promise<Lease | undefined> {
    return (await this.claimBatch(1, leaseMs))[0];
  }

  /**
   * claimBatch leases up to limit due deliveries in one transaction: new ones, retries whose time has
   * come, and ones whose lease expired because their worker vanished. Each gets a fresh token.
   */
  claimBatch(limit: number, leaseMs: number = DEFAULTS.leaseMs): Promise<Lease[]> {
    if (!Number.isInteger(limit) || limit < 1) throw new TypeError(`claimBatch: expected limit >= 1, got ${limit}`);
    return this.enqueue((db) => {
      const now = this.now();
      // If the clock stepped back, a dead worker's lease or a retry would wait out the jump: none may be
      // further off than its own lease length, or the retry cap, from now.
      this.sql(
        `UPDATE deliveries SET leased_until = ? + lease_ms
         WHERE status = 'processing' AND leased_until > ? AND leased_until - lease_ms > ?`,
      ).run(now, now, now);
      const latest = now + this.backoffOptions.retryCapMs;
      this.sql("UPDATE deliveries SET available_at = ? WHERE status = 'received' AND order_key IS NULL AND available_at > ?").run(latest, latest);
      this.sql("UPDATE order_keys SET due = ? WHERE due > ?").run(latest, latest);
      // A worker that crashed on its last try would otherwise be retried forever: set it aside.
      const gaveUp = this.sql(
        `UPDATE deliveries SET status = 'failed', leased_until = NULL, lease_token = NULL, finished_at = ?,
                error = 'gave up: the lease expired on the last attempt (the worker crashed or hung)'
         WHERE status = 'processing' AND leased_until <= ? AND attempts >= ?
         RETURNING source, id, order_key`,
      ).all(now, now, this.maxAttempts) as Row[];
      for (const r of gaveUp) if (r.order_key !== null) this.settleKey(r.source as string, r.order_key as string, r.id as string, true);
      // Three kinds are due: unordered deliveries, the heads of idle keys, and leases that expired. An
      // ordered delivery is reached only as its key's head, so two of one key never run at once.
      const rows = this
        .sql(
          `UPDATE deliveries
           SET status = 'processing', attempts = attempts + 1, leased_until = ?, lease_ms = ?,
               lease_token = lower(hex(randomblob(12)))
           WHERE rowid IN (
             SELECT rowid FROM (
               SELECT rowid, due FROM (SELECT rowid, available_at AS due FROM deliveries
                                       WHERE status = 'received' AND order_key IS NULL AND available_at <= ?
                                       ORDER BY available_at LIMIT ?)
               UNION ALL
               SELECT rowid, due FROM (SELECT rowid, leased_until AS due FROM deliveries
                                       WHERE status = 'processing' AND leased_until <= ? ORDER BY leased_until LIMIT ?)
               UNION ALL
               SELECT rowid, due FROM (SELECT d.rowid, k.due FROM order_keys k
                                       JOIN deliveries d ON d.source = k.source AND d.id = k.head_id AND d.status = 'received'
                                       WHERE k.due <= ? ORDER BY k.due LIMIT ?)
             ) ORDER BY due, rowid LIMIT ?)
           RETURNING rowid, *`,
        )
        .all(now + leaseMs, leaseMs, now, limit, now, limit, now, limit, limit) as Row[];
      const leases = rows.map(toLease);
      for (const lease of leases) if (lease.orderKey !== null) this.occupy(lease, rowids.get(lease)!);
      return leases.length < 2 ? leases : leases.sort((a, b) => a.availableAt - b.availableAt || a.receivedAt - b.receivedAt);
    }) as Promise<Lease[]>;
  }

  /** extend pushes a held lease further out; false means it was lost to a takeover. */
  extend(lease: Lease, leaseMs: number = DEFAULTS.leaseMs): Promise<boolean> {
    return this.enqueue((db) => {
      const until = this.now() + leaseMs;
      const changed = this
        .sql(
          `UPDATE deliveries SET leased_until = ?, lease_ms = ?
           WHERE source = ? AND id = ? AND lease_token = ? AND status = 'processing'`,
        )
        .run(until, leaseMs, lease.source, lease.id, lease.token).changes;
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
    let changed = rowid === undefined ? 0 : this
      .sql(
        `UPDATE deliveries SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ?
         WHERE rowid = ? AND lease_token = ? AND status = 'processing'`,
      )
      .run(now, rowid, lease.token).changes;
    if (changed === 0) {
      changed = this
        .sql(
          `UPDATE deliveries SET status = 'done', leased_until = NULL, lease_token = NULL, error = NULL, finished_at = ?
           WHERE source = ? AND id = ? AND lease_token = ? AND status = 'processing'`,
        )
        .run(now, lease.source, lease.id, lease.token).changes;
    }
    if (changed !== 1) return false;
    if (lease.orderKey !== null) this.handled(lease);
    for (const write of writes) {
      const result = write(this.tx);
      if (result instanceof Promise) {
        throw new TypeError("finish: a write on SQLite must be synchronous; it returned a promise (await only on PostgreSQL)");
      }
    }
    return true;
  }

  /**
   * fail records a failed try: back to the queue after a backoff, or set aside as failed when the
   * attempts are used up or the error is permanent. Returns undefined if the lease was lost.
   */
  fail(lease: Lease, error: string, options: { permanent?: boolean } = {}): Promise<Failure | undefined> {
    return this.enqueue((db) => {
      const now = this.now();
      const row = this
        .sql(`SELECT attempts FROM deliveries WHERE source = ? AND id = ? AND lease_token = ? AND status = 'processing'`)
        .get(lease.source, lease.id, lease.token) as { attempts: number } | undefined;
      if (!row) return undefined;
      if (options.permanent || row.attempts >= this.maxAttempts) {
        this.sql(
          `UPDATE deliveries SET status = 'failed', error = ?, leased_until = NULL, lease_token = NULL, finished_at = ?
           WHERE source = ? AND id = ?`,
        ).run(error, now, lease.source, lease.id);
        if (lease.orderKey !== null) this.settleKey(lease.source, lease.orderKey, lease.id, true);
        return { status: "failed" };
      }
      const retryAt = now + backoff(row.attempts, { ...this.backoffOptions, random: this.random });
      this.sql(
        `UPDATE deliveries SET status = 'received', error = ?, leased_until = NULL, lease_token = NULL, available_at = ?
         WHERE source = ? AND id = ?`,
      ).run(error, retryAt, lease.source, lease.id);
      if (lease.orderKey !== null) this.settleKey(lease.source, lease.orderKey, lease.id, false);
      return { status: "received", retryAt };
    }) as Promise<Failure | undefined>;
  }

  /** release hands a claimed delivery back untouched, without spending an attempt (graceful shutdown). */
  release(lease: Lease): Promise<boolean> {
    return this.enqueue((db) => {
      const released = this
        .sql(
          `UPDATE deliveries SET status = 'received', attempts = max(attempts - 1, 0), leased_until = NULL,
                  lease_token = NULL, available_at = ?
           WHERE source = ? AND id = ? AND lease_token = ? AND status = 'processing'`,
        )
        .run(this.now(), lease.source, lease.id, lease.token).changes === 1;
      if (released && lease.orderKey !== null) this.settleKey(lease.source, lease.orderKey, lease.id, false);
      return released;
    }) as Promise<boolean>;
  }

  /** retry puts failed deliveries back in the queue with their attempts reset; returns how many. */
  retry(target: { source?: string; id: string } | { allFailed: true }): Promise<number> {
    return this.enqueue((db) => {
      const now = this.now();
      const rows = ("allFailed" in target
        ? this
          .sql(`UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                    WHERE status = 'failed' RETURNING source, id, order_key`)
          .all(now)
        : this
          .sql(`UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                    WHERE source = ? AND id = ? AND status = 'failed' RETURNING source, id, order_key`)
          .all(now, target.source ?? DEFAULTS.source, target.id)) as Row[];
      for (const r of rows) if (r.order_key !== null) this.settleKey(r.source as string, r.order_key as string, r.id as string, false);
      return rows.length;
    }) as Promise<number>;
  }

  /** find returns the deliveries with this ID, in every source or in one. */
  async find(id: string, source?: string): Promise<Delivery[]> {
    const rows = source === undefined
      ? this.sql("SELECT * FROM deliveries WHERE id = ? ORDER BY source").all(id)
      : this.sql("SELECT * FROM deliveries WHERE id = ? AND source = ?").all(id, source);
    return (rows as Row[]).map(toDelivery);
  }

  /** list returns deliveries newest first, optionally of one status or source. */
  async list(filter: { status?: Status; source?: string; limit?: number } = {}): Promise<Delivery[]> {
    const rows = this
      .sql(
        `SELECT * FROM deliveries
         WHERE (?1 IS NULL OR status = ?1) AND (?2 IS NULL OR source = ?2)
         ORDER BY received_at DESC, rowid DESC LIMIT ?3`,
      )
      .all(filter.status ?? null, filter.source ?? null, filter.limit ?? 20) as Row[];
    return rows.map(toDelivery);
  }

  /** status summarises the queue: counts, failures, the oldest wait and conflicting duplicates. */
  async status(): Promise<InboxStatus> {
    const now = this.now();
    const counts = Object.fromEntries(STATUSES.map((s) => [s, 0])) as Record<Status, number>;
    for (const row of this.sql("SELECT status, count(*) AS n FROM deliveries GROUP BY status").all() as Row[]) {
      counts[row.status as Status] = row.n as number;
    }
    const failed = (this
      .sql(`SELECT source, id, attempts, error, event_type FROM deliveries WHERE status = 'failed'
                ORDER BY received_at, rowid LIMIT 100`)
      .all() as Row[]).map((r) => ({
        source: r.source as string, id: r.id as string, attempts: r.attempts as number,
        error: r.error as string | null, eventType: r.event_type as string | null,
      }));
    const oldest = this
      .sql("SELECT min(received_at) AS t FROM deliveries WHERE status IN ('received', 'processing')")
      .get() as { t: number | null };
    // Per source and event type, so one inbox fed by several providers can be read at a glance.
    const bySource = new Map<string, InboxStatus["sources"][number]>();
    for (const r of this
      .sql(`SELECT source, event_type, status, count(*) AS n FROM deliveries
            GROUP BY source, event_type, status ORDER BY source, event_type`)
      .all() as Row[]) {
      const key = JSON.stringify([r.source, r.event_type]);
      let entry = bySource.get(key);
      if (!entry) {
        entry = { source: r.source as string, eventType: r.event_type as string | null, counts: Object.fromEntries(STATUSES.map((s) => [s, 0])) as Record<Status, number> };
        bySource.set(key, entry);
      }
      entry.counts[r.status as Status] = r.n as number;
    }
    const conflicts = this
      .sql("SELECT count(*) AS rows, coalesce(sum(conflicts), 0) AS copies FROM deliveries WHERE conflicts > 0")
      .get() as { rows: number; copies: number };
    return {
      counts,
      sources: [...bySource.values()],
      failed,
      oldestWaitingMs: oldest.t === null ? null : Math.max(0, now - oldest.t),
      conflicts: { deliveries: conflicts.rows, copies: conflicts.copies },
      ordering: orderingStatus(this.sql(ORDERING_COUNTS).get() as Row, this.sql(HELD_KEYS).all(now) as Row[]),
    };
  }

  /** page returns up to limit deliveries in (source, id) order after the cursor, for copying. */
  async page(after: { source: string; id: string } | undefined, limit: number): Promise<Delivery[]> {
    const rows = after === undefined
      ? this.sql("SELECT * FROM deliveries ORDER BY source, id LIMIT ?").all(limit)
      : this.sql("SELECT * FROM deliveries WHERE (source, id) > (?, ?) ORDER BY source, id LIMIT ?").all(after.source, after.id, limit);
    return (rows as Row[]).map(toDelivery);
  }

  /** restore writes deliveries as they are, in one transaction; keys already here are skipped. */
  restore(deliveries: readonly Delivery[]): Promise<number> {
    return this.enqueue(() => {
      let added = 0;
      const keys = new Map<string, [string, string]>();
      // In arrival order, so that the rowids that break event-time ties keep it.
      for (const d of [...deliveries].sort((a, b) => a.receivedAt - b.receivedAt)) {
        const changed = Number(this
          .sql(
            `INSERT INTO deliveries (source, id, body, body_sha256, content_type, event_type, provider_time, received_at,
                                     status, attempts, available_at, leased_until, lease_ms, error, conflicts, finished_at,
                                     order_key, event_time, newer_id)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (source, id) DO NOTHING`,
          )
          .run(d.source, d.id, d.body, d.bodySha256, d.contentType, d.eventType, d.providerTime, d.receivedAt, d.status,
            d.attempts, d.availableAt, d.leasedUntil, d.leasedUntil === null ? null : Math.max(1, d.leasedUntil - this.now()),
            d.error, d.conflicts, d.finishedAt, d.orderKey ?? null, d.eventTime ?? null, d.newerId ?? null).changes);
        added += changed;
        if (changed === 1 && d.orderKey != null) keys.set(JSON.stringify([d.source, d.orderKey]), [d.source, d.orderKey]);
      }
      for (const [source, key] of keys.values()) this.rebuildKey(source, key);
      return added;
    }) as Promise<number>;
  }

  /** query runs one statement with `?` parameters: the handler's own tables, and tests. */
  async query(sql: string, ...params: SqlValue[]): Promise<Record<string, unknown>[]> {
    const statement = this.sql(sql);
    return statement.columns().length === 0 ? (statement.run(...params), []) : (statement.all(...params) as Record<string, unknown>[]);
  }

  /** onWake is a no-op on SQLite: one machine, and the worker's polling is the wake-up. */
  onWake(_listener: () => void): () => void {
    return () => {};
  }

  /** flush resolves once every write queued so far is committed. */
  flush(): Promise<void> {
    return this.queue.length === 0 && !this.flushing ? Promise.resolve() : this.enqueue(() => undefined).then(() => undefined);
  }

  /** close commits what is queued, then closes the database. */
  async close(): Promise<void> {
    if (this.closed) return;
    await this.flush();
    this.closed = true;
    if (this.checkpointer) {
      const exited = new Promise((resolve) => this.checkpointer!.once("exit", resolve));
      this.checkpointer.postMessage("close");
      await exited;
    }
    this.db.close();
  }

  // enter puts a newly stored delivery at its key's head if the key is idle and it comes first in event
  // time (or the key had nothing waiting); a running or blocked key picks its next head when it settles.
  private enter(source: string, key: string, id: string, eventTime: number, seq: number, due: number, strict: boolean): void {
    this.sql(
      `INSERT INTO order_keys (source, order_key, head_id, head_event_time, head_seq, due, strict)
       VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
       ON CONFLICT (source, order_key) DO UPDATE SET
         strict = excluded.strict,
         head_id = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?3 ELSE head_id END,
         head_event_time = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?4 ELSE head_event_time END,
         head_seq = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?5 ELSE head_seq END,
         due = CASE WHEN head_id IS NULL OR (due IS NOT NULL AND (?4, ?5) < (head_event_time, head_seq)) THEN ?6 ELSE due END`,
    ).run(source, key, id, eventTime, seq, due, strict ? 1 : 0);
  }

  // occupy marks a claimed head's key as running, and flags the lease stale if a newer event of its key
  // was already handled.
  private occupy(lease: Lease, rowid: number): void {
    const key = this
      .sql("UPDATE order_keys SET due = NULL WHERE source = ? AND order_key = ? RETURNING last_event_time, last_id")
      .get(lease.source, lease.orderKey) as { last_event_time: number | null; last_id: string | null } | undefined;
    if (key?.last_event_time != null && key.last_event_time > lease.eventTime!) {
      this.sql("UPDATE deliveries SET newer_id = ? WHERE rowid = ?").run(key.last_id, rowid);
      lease.newerId = key.last_id;
    }
  }

  // handled records a finished delivery's event time as its key's newest, then moves the key on.
  private handled(lease: Lease): void {
    this.settleKey(lease.source, lease.orderKey!, lease.id, false, lease.eventTime);
  }

  // settleKey moves a key's head to its first waiting delivery in event time, then arrival, after the
  // delivery `from` left the head (done, retried, released, set aside) or came back (retry). It leaves a
  // key alone while another delivery runs or blocks it, and a strict key blocked when `from` is set aside.
  private settleKey(source: string, key: string, from: string, setAside: boolean, handledTime: number | null = null): void {
    this.sql(
      `UPDATE order_keys SET
         last_event_time = CASE WHEN ?5 IS NOT NULL AND (last_event_time IS NULL OR last_event_time <= ?5) THEN ?5 ELSE last_event_time END,
         last_id = CASE WHEN ?5 IS NOT NULL AND (last_event_time IS NULL OR last_event_time <= ?5) THEN ?3 ELSE last_id END,
         (head_id, head_event_time, head_seq, due) =
           (SELECT id, event_time, rowid, available_at FROM deliveries
            WHERE source = ?1 AND order_key = ?2 AND status = 'received' ORDER BY event_time, rowid LIMIT 1)
       WHERE source = ?1 AND order_key = ?2 AND (head_id IS NULL OR head_id = ?3 OR due IS NOT NULL) AND NOT (strict AND ?4)`,
    ).run(source, key, from, setAside ? 1 : 0, handledTime);
  }

  // rebuildKey brings a key's head row up to date with its deliveries after a copy: the newest done event
  // is its last handled, a processing delivery runs it, else its first waiting one is the head. (The
  // strict setting is the source's, and comes back with its next delivery.)
  private rebuildKey(source: string, key: string): void {
    this.sql("INSERT INTO order_keys (source, order_key) VALUES (?, ?) ON CONFLICT (source, order_key) DO NOTHING").run(source, key);
    this.sql(
      `UPDATE order_keys SET (last_event_time, last_id) =
         (SELECT event_time, id FROM deliveries WHERE source = ?1 AND order_key = ?2 AND status = 'done' ORDER BY event_time DESC, rowid DESC LIMIT 1)
       WHERE source = ?1 AND order_key = ?2`,
    ).run(source, key);
    const running = this
      .sql("SELECT id, event_time, rowid FROM deliveries WHERE source = ? AND order_key = ? AND status = 'processing' LIMIT 1")
      .get(source, key) as Row | undefined;
    if (running) {
      this.sql("UPDATE order_keys SET head_id = ?, head_event_time = ?, head_seq = ?, due = NULL WHERE source = ? AND order_key = ?")
        .run(running.id, running.event_time, running.rowid, source, key);
    } else {
      this.sql("UPDATE order_keys SET head_id = NULL, due = NULL WHERE source = ? AND order_key = ?").run(source, key);
      this.settleKey(source, key, "", false);
    }
  }

  // sql compiles each statement once per connection: the receiver and worker run the same few forever.
  private sql(text: string): StatementSync {
    let statement = this.statements.get(text);
    if (!statement) {
      statement = this.db.prepare(text);
      this.statements.set(text, statement);
    }
    return statement;
  }

  private enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial = false): Promise<unknown> {
    if (this.closed) return Promise.reject(new Error(`inbox ${this.path} is closed`));
    return new Promise((resolve, reject) => {
      this.queue.push({ run, partial, resolve, reject });
      if (!this.flushing) {
        this.flushing = true;
        // setImmediate lets every request already read off the sockets join this batch.
        setImmediate(() => this.drain());
      }
    });
  }

  private drain(): void {
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, this.batchSize);
      this.commit(batch);
    }
    this.flushing = false;
  }

  // commit runs a batch in one transaction and settles each op after COMMIT. When the transaction as a
  // whole fails (disk full, I/O error), it retries in halves, so only the ops that truly fail are rejected.
  // Ops run unguarded first: a savepoint per op costs more than the rare redo when one fails halfway.
  private commit(batch: Op[], guarded = false): void {
    const results: { ok: boolean; value: unknown }[] = [];
    try {
      this.begin();
    } catch (error) {
      // No op has run: the lock is another writer's. Retrying in halves would wait out the busy timeout
      // again for each half, blocking the thread for 2n-1 timeouts, so the whole batch fails once.
      const failure = new Error(`inbox ${this.path}: ${message(error)}`, { cause: error });
      for (const op of batch) op.reject(failure);
      return;
    }
    let redo = false;
    try {
      for (const op of batch) {
        try {
          results.push({ ok: true, value: op.run(this.db, guarded) });
        } catch (error) {
          // An op that cleaned up after itself (one statement, or a savepoint) fails alone; anything else
          // fails the batch. One that may have left half its writes behind is redone in a savepoint.
          if (!this.db.isTransaction || !isOwnError(error)) throw error;
          if (op.partial && !guarded) {
            redo = true;
            throw error;
          }
          results.push({ ok: false, value: error });
        }
      }
      this.db.exec("COMMIT");
    } catch (error) {
      if (this.db.isTransaction) this.db.exec("ROLLBACK");
      if (redo) return this.commit(batch, true);
      if (sqliteCode(error) === SQLITE_FULL) this.reclaimWal();
      if (batch.length === 1) {
        batch[0]!.reject(new Error(`inbox ${this.path}: ${message(error)}`, { cause: error }));
        return;
      }
      const half = Math.ceil(batch.length / 2);
      this.commit(batch.slice(0, half), guarded);
      this.commit(batch.slice(half), guarded);
      return;
    }
    if (this.tightCommits > 0 && --this.tightCommits === 0) this.db.exec(`PRAGMA wal_autocheckpoint = ${this.walAutocheckpoint}`);
    batch.forEach((op, i) => (results[i]!.ok ? op.resolve(results[i]!.value) : op.reject(results[i]!.value)));
  }

  // reclaimWal answers a full disk. The WAL grows until wal_autocheckpoint pages before it is copied back
  // and reused, so once space is freed it would take all of it and fill the disk again, and the inbox
  // would stay down for good. For the next commits, a checkpoint follows each one, so the WAL is reused
  // from its start and never outgrows the space it already has.
  private reclaimWal(): void {
    if (this.tightCommits === 0) {
      this.walAutocheckpoint = (this.db.prepare("PRAGMA wal_autocheckpoint").get() as { wal_autocheckpoint: number }).wal_autocheckpoint;
      this.db.exec("PRAGMA wal_autocheckpoint = 1");
    }
    this.tightCommits = 1_000;
    try {
      this.db.exec("PRAGMA wal_checkpoint(PASSIVE)");
    } catch {
      // Best effort, while the disk is still full: the failure that matters is the commit's, which the
      // caller gets, and the checkpoint after the next commit that succeeds does the work.
    }
  }

  // begin takes the write lock. SQLite's own busy handler sleeps 1, 2, 5, 10 … 100 ms between tries, so
  // against a process that commits back to back (a busy worker) it seldom finds the lock free, and a
  // receiver's acks wait for seconds. Trying every 0.2 ms, up to the same busy timeout, takes the first gap.
  private begin(): void {
    const deadline = performance.now() + this.busyTimeoutMs;
    this.sql("PRAGMA busy_timeout = 0").run();
    try {
      for (;;) {
        try {
          this.db.exec("BEGIN IMMEDIATE");
          return;
        } catch (error) {
          if (sqliteCode(error) !== SQLITE_BUSY || performance.now() >= deadline) throw error;
          Atomics.wait(NAP, 0, 0, 0.2);
        }
      }
    } finally {
      // A PRAGMA takes no bound parameters; the number is this Inbox's own, checked in the constructor.
      this.sql(`PRAGMA busy_timeout = ${this.busyTimeoutMs}`).run();
    }
  }
}

// NAP is a cell that nothing ever changes: Atomics.wait on it sleeps this thread for a fraction of a ms.
const NAP = new Int32Array(new SharedArrayBuffer(4));

// SQLite's primary result codes that the committer acts on; node:sqlite reports the extended code.
const SQLITE_BUSY = 5;
const SQLITE_FULL = 13;

// sqliteCode is the primary result code of an error node:sqlite threw, or 0 for anything else.
function sqliteCode(error: unknown): number {
  const code = (error as { errcode?: unknown }).errcode;
  return typeof code === "number" ? code & 0xff : 0;
}

// Errors of the database itself (busy, locked, out of memory, read-only, I/O, corrupt, full) concern
// the whole batch; anything else came from one op's statement, which SQLite already undid alone.
const BATCH_ERRORS = new Set([SQLITE_BUSY, 6, 7, 8, 10, 11, SQLITE_FULL]);
function isOwnError(error: unknown): boolean {
  return !BATCH_ERRORS.has(sqliteCode(error));
}

/** InboxStatus is what `inbox.ts status` prints. */
export interface InboxStatus {
  counts: Record<Status, number>;
  /** The counts again, per source and event type. */
  sources: { source: string; eventType: string | null; counts: Record<Status, number> }[];
  failed: { source: string; id: string; attempts: number; error: string | null; eventType: string | null }[];
  oldestWaitingMs: number | null;
  conflicts: { deliveries: number; copies: number };
  ordering: OrderingStatus;
}

/** OrderingStatus is the ordered keys' part of status: which keys are held up and why, and the stale count. */
export interface OrderingStatus {
  /** Keys with a delivery waiting or running. */
  keys: number;
  /** Deliveries handed to a handler stale: a newer one of their key had already been handled. */
  stale: number;
  /** Ordered deliveries set aside as failed that later ones of their key went on past (non-strict keys). */
  passed: number;
  /** How many keys are held up, of which up to 100 are listed in held, longest held first. */
  heldKeys: number;
  held: HeldKey[];
}

/**
 * HeldKey is an order key whose later deliveries wait behind its head: a retry that is not yet due
 * ("retry"), or, on a strict key, a delivery set aside as failed until someone retries it ("failed").
 */
export interface HeldKey {
  source: string;
  orderKey: string;
  headId: string;
  reason: "retry" | "failed";
  /** When the head is retried (reason retry). */
  retryAt: number | null;
  attempts: number;
  error: string | null;
  /** Deliveries of the key waiting behind the head. */
  waiting: number;
}

// HELD_KEYS finds the held keys; both backends run it, `?` being the time now.
const HELD_KEYS = `
  SELECT * FROM (
    SELECT k.source, k.order_key, k.head_id, k.due, d.status, d.attempts, d.error,
           (SELECT count(*) FROM deliveries w WHERE w.source = k.source AND w.order_key = k.order_key
                                                AND w.status = 'received' AND w.id <> k.head_id) AS waiting
    FROM order_keys k JOIN deliveries d ON d.source = k.source AND d.id = k.head_id
    WHERE (d.status = 'received' AND d.attempts > 0 AND k.due > ?) OR d.status = 'failed') h
  WHERE waiting > 0 ORDER BY coalesce(due, 0), source, order_key`;

// ORDERING_COUNTS counts what OrderingStatus counts, on both backends.
const ORDERING_COUNTS = `
  SELECT (SELECT count(*) FROM order_keys WHERE head_id IS NOT NULL) AS keys,
         (SELECT count(*) FROM deliveries WHERE newer_id IS NOT NULL) AS stale,
         (SELECT count(*) FROM deliveries d WHERE d.status = 'failed' AND d.order_key IS NOT NULL AND NOT EXISTS
            (SELECT 1 FROM order_keys k WHERE k.source = d.source AND k.order_key = d.order_key AND k.head_id = d.id)) AS passed`;

/** orderingStatus builds OrderingStatus from the rows of HELD_KEYS and ORDERING_COUNTS. */
export function orderingStatus(counts: Record<string, unknown>, held: Record<string, unknown>[]): OrderingStatus {
  return {
    keys: Number(counts.keys), stale: Number(counts.stale), passed: Number(counts.passed), heldKeys: held.length,
    held: held.slice(0, 100).map((r) => ({
      source: r.source as string, orderKey: r.order_key as string, headId: r.head_id as string,
      reason: r.status === "failed" ? "failed" : "retry", retryAt: r.status === "failed" ? null : Number(r.due),
      attempts: Number(r.attempts), error: r.error as string | null, waiting: Number(r.waiting),
    })),
  };
}

/** ORDERING_SQL holds the status queries of ordering, which the PostgreSQL backend runs too. */
export const ORDERING_SQL = { held: HELD_KEYS, counts: ORDERING_COUNTS } as const;

/** isPostgresUrl tells a PostgreSQL URL from a SQLite path. */
export function isPostgresUrl(target: string): boolean {
  return /^postgres(ql)?:\/\//i.test(target);
}

/**
 * connect opens the inbox at target, as the article's connect() did: a file path for SQLite, or a
 * postgres:// URL (with ?schema=NAME to share one database) for PostgreSQL. Which target is the entry
 * point's call: --db, else INBOX_DB, else DEFAULTS.db.
 */
export async function connect(target: string, options: InboxOptions = {}): Promise<Inbox> {
  if (!isPostgresUrl(target)) return new SqliteInbox(target, options);
  const { PostgresInbox } = await import("./postgres.ts");
  return PostgresInbox.open(target, options);
}

/** label names a delivery in logs: just its ID for the article's default source, else source/id. */
export function label(d: { source: string; id: string }): string {
  return d.source === DEFAULTS.source ? d.id : `${d.source}/${d.id}`;
}

/**
 * lineLog returns a logger for an entry point's one line per delivery. A write to a pipe or a file is
 * synchronous, so the lines of one turn of the event loop go out in one write rather than one each:
 * under load that is a batch of deliveries per system call. Call flush before exiting.
 */
export function lineLog(stream: NodeJS.WritableStream = process.stderr): { log: (line: string) => void; flush: () => void } {
  const lines: string[] = [];
  const flush = () => {
    if (lines.length > 0) stream.write(`${lines.splice(0).join("\n")}\n`);
  };
  return { log: (line) => void (lines.push(line) === 1 && setImmediate(flush)), flush };
}

/** message turns anything thrown into one line. */
export function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

// ---- The operator's CLI ----------------------------------------------------------------------------

/** UsageError is a mistake on the command line: one line on stderr, exit 2. */
class UsageError extends Error {}
/** NotFound is a lookup that matched nothing: one line on stderr, exit 1. */
class NotFound extends Error {}

function age(ms: number): string {
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return s < 172800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86400)}d`;
}

function iso(ms: number | null): string {
  return ms === null ? "-" : new Date(ms).toISOString();
}

function bodyForPeople(body: Buffer): string {
  const text = new TextDecoder("utf-8", { fatal: false }).decode(body);
  return Buffer.from(text, "utf8").equals(body) ? text : `(not UTF-8; base64) ${body.toString("base64")}`;
}

function deliveryJson(d: Delivery, withBody: boolean): Record<string, unknown> {
  const { body, ...rest } = d;
  if (!withBody) return { ...rest, bodyBytes: body.length };
  const text = new TextDecoder("utf-8", { fatal: false }).decode(body);
  const utf8 = Buffer.from(text, "utf8").equals(body);
  return { ...rest, bodyBytes: body.length, body: utf8 ? text : null, bodyBase64: body.toString("base64") };
}

// isInbox peeks, read-only, for the deliveries table; an empty file may still become an inbox. Anything
// that cannot be read this way is left to openDatabase to report in its own words.
function isInbox(path: string): boolean {
  let db: DatabaseSync;
  try {
    db = new DatabaseSync(path, { readOnly: true });
  } catch {
    return true;
  }
  try {
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[];
    return tables.length === 0 || tables.some((t) => t.name === "deliveries");
  } catch {
    return true;
  } finally {
    db.close();
  }
}

// One delivery by ID: --source settles it when two sources share an ID.
async function findOne(inbox: Inbox, id: string, source: string | undefined): Promise<Delivery> {
  const found = await inbox.find(id, source);
  if (found.length === 0) throw new NotFound(`No delivery with ID ${id}${source ? ` in source ${source}` : ""}.`);
  if (found.length > 1) {
    throw new UsageError(`ID ${id} exists in sources ${found.map((d) => d.source).join(", ")}; pass --source.`);
  }
  return found[0]!;
}

async function cli(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError, CommanderError } = await import("commander");
  const program = new Command("inbox.ts")
    .description("Look into the webhook inbox and put failed deliveries back in the queue.")
    .exitOverride()
    // A usage error is one line, the hint included: commander's own hint would be a second one.
    .configureOutput({ outputError: (text, write) => write(`${text.trimEnd()} (run with --help for usage)\n`) })
    .addHelpText("after", `
Examples:
  npx tsx inbox.ts status
  npx tsx inbox.ts list --status failed
  npx tsx inbox.ts show evt_100
  npx tsx inbox.ts retry evt_100
  npx tsx inbox.ts retry --all-failed
  npx tsx inbox.ts status --db postgres://127.0.0.1:5432/test?schema=inbox
  npx tsx inbox.ts copy --from inbox.db --to postgres://127.0.0.1:5432/test?schema=inbox

Exit codes: 0 success, 1 not found, 2 usage error.`);

  const positive = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("expected a whole number of 1 or more.");
    return n;
  };
  const status = (value: string) => {
    if (!(STATUSES as readonly string[]).includes(value)) throw new InvalidArgumentError(`expected one of ${STATUSES.join(", ")}.`);
    return value as Status;
  };
  const withDb = (command: InstanceType<typeof Command>) =>
    command.option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`);
  const openTarget = async (path: string) => {
    if (!isPostgresUrl(path)) {
      // Looking must not create: a typo in --db would otherwise show an empty, healthy inbox.
      if (!existsSync(path)) throw new NotFound(`No inbox database at ${path} (use --db or INBOX_DB).`);
      // Nor convert: opening another program's database would switch it to WAL and add our tables.
      if (!isInbox(path)) throw new NotFound(`${path} is not an inbox database: it has tables, but no deliveries (use --db or INBOX_DB).`);
    }
    return connect(path);
  };
  const open = (opts: { db?: string }) => openTarget(opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db);

  withDb(program.command("status"))
    .description("count deliveries per status; list failures, the oldest wait and conflicting duplicates")
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const s = await inbox.status();
        if (opts.json) return void console.log(JSON.stringify(s, null, 2));
        for (const name of STATUSES) if (s.counts[name] > 0) console.log(`${name.padEnd(11)}${s.counts[name]}`);
        if (STATUSES.every((name) => s.counts[name] === 0)) console.log("(the inbox is empty)");
        for (const f of s.failed) {
          const tries = f.attempts === 1 ? "1 attempt" : `${f.attempts} attempts`;
          console.log(`  failed: ${label(f)}${f.eventType ? ` (${f.eventType})` : ""} after ${tries}: ${f.error ?? "(no error recorded)"}`);
        }
        // The article's single unsigned source has nothing to break down; several sources or typed events do.
        if (s.sources.some((x) => x.source !== DEFAULTS.source || x.eventType !== null)) {
          console.log("by source and type:");
          const width = (f: (x: InboxStatus["sources"][number]) => string) => Math.max(...s.sources.map((x) => f(x).length)) + 2;
          const [sw, tw] = [width((x) => x.source), width((x) => x.eventType ?? "-")];
          for (const x of s.sources) {
            const counts = STATUSES.filter((name) => x.counts[name] > 0).map((name) => `${name} ${x.counts[name]}`).join(", ");
            console.log(`  ${x.source.padEnd(sw)}${(x.eventType ?? "-").padEnd(tw)}${counts}`);
          }
        }
        if (s.oldestWaitingMs !== null) console.log(`oldest waiting: ${age(s.oldestWaitingMs)}`);
        if (s.conflicts.deliveries > 0) {
          console.log(`conflicts: ${s.conflicts.deliveries} deliveries had ${s.conflicts.copies} duplicates with a different body (the first copy was kept)`);
        }
        const o = s.ordering;
        if (o.keys > 0 || o.stale > 0 || o.passed > 0) {
          const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
          console.log(`ordered: ${plural(o.keys, "key")} with work, ${plural(o.heldKeys, "key")} held up, ` +
            `${plural(o.stale, "stale delivery", "stale deliveries")} handed over, ${plural(o.passed, "set-aside delivery", "set-aside deliveries")} passed by later ones`);
          for (const h of o.held) {
            const why = h.reason === "retry"
              ? `waits for ${h.headId} to be retried at ${iso(h.retryAt)} (attempt ${h.attempts + 1})`
              : `is blocked by ${h.headId}, set aside as failed on a strict key (retry it to go on)`;
            console.log(`  held: ${label({ source: h.source, id: h.orderKey })} ${why}; ${h.waiting} waiting: ${h.error ?? "(no error recorded)"}`);
          }
          if (o.heldKeys > o.held.length) console.log(`  … and ${o.heldKeys - o.held.length} more held keys`);
        }
      } finally {
        await inbox.close();
      }
    });

  withDb(program.command("list"))
    .description("list deliveries, newest first")
    .option("--status <status>", `only this status (${STATUSES.join(", ")})`, status)
    .option("--source <name>", "only this source")
    .option("--limit <n>", "at most this many", positive, 20)
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; status?: Status; source?: string; limit: number; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const rows = await inbox.list(opts);
        if (opts.json) return void console.log(JSON.stringify(rows.map((d) => deliveryJson(d, false)), null, 2));
        if (rows.length === 0) return void console.log("(no deliveries)");
        console.log(["source", "id", "status", "attempts", "type", "received", "error"].join("\t"));
        for (const d of rows) {
          console.log([d.source, d.id, d.status, d.attempts, d.eventType ?? "-", iso(d.receivedAt), d.error ?? ""].join("\t"));
        }
      } finally {
        await inbox.close();
      }
    });

  withDb(program.command("show <id>"))
    .description("print one delivery: its metadata, last error and body")
    .option("--source <name>", "the delivery's source, when IDs clash")
    .option("--json", "print JSON (the body as text when it is UTF-8, and always as base64)")
    .action(async (id: string, opts: { db?: string; source?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const d = await findOne(inbox, id, opts.source);
        if (opts.json) return void console.log(JSON.stringify(deliveryJson(d, true), null, 2));
        const lines: [string, unknown][] = [
          ["source", d.source], ["id", d.id], ["status", d.status], ["attempts", d.attempts],
          ["type", d.eventType ?? "-"], ["content type", d.contentType ?? "-"],
          ["received", iso(d.receivedAt)], ["provider time", iso(d.providerTime)],
          ["due", d.status === "received" ? iso(d.availableAt) : "-"], ["leased until", iso(d.leasedUntil)],
          ["finished", iso(d.finishedAt)], ["conflicts", d.conflicts], ["sha256", d.bodySha256],
          ...(d.orderKey === null ? [] : [["order key", d.orderKey], ["event time", iso(d.eventTime)],
            ["stale", d.newerId === null ? "no" : `yes, handled after ${d.newerId}`]] as [string, unknown][]),
          ["error", d.error ?? "-"], ["body", `${d.body.length} bytes`],
        ];
        for (const [k, v] of lines) console.log(`${k.padEnd(14)}${v}`);
        console.log(bodyForPeople(d.body));
      } finally {
        await inbox.close();
      }
    });

  withDb(program.command("retry [id]"))
    .description("put a failed delivery (or every failed one) back in the queue, attempts reset")
    .option("--source <name>", "the delivery's source, when IDs clash")
    .option("--all-failed", "retry every failed delivery")
    .action(async (id: string | undefined, opts: { db?: string; source?: string; allFailed?: boolean }) => {
      if (opts.allFailed && id !== undefined) throw new UsageError("Give either an ID or --all-failed, not both.");
      if (!opts.allFailed && id === undefined) throw new UsageError("Give the ID of a failed delivery, or --all-failed.");
      const inbox = await open(opts);
      try {
        if (opts.allFailed) {
          const n = await inbox.retry({ allFailed: true });
          return void console.log(n === 1 ? "Queued 1 failed delivery again." : `Queued ${n} failed deliveries again.`);
        }
        const d = await findOne(inbox, id!, opts.source);
        if (d.status !== "failed") throw new NotFound(`No failed delivery with ID ${id}: it is ${d.status}.`);
        await inbox.retry({ source: d.source, id: d.id });
        console.log("Queued again.");
      } finally {
        await inbox.close();
      }
    });

  program.command("copy")
    .description("copy every delivery from one inbox to another (SQLite to PostgreSQL, or back), byte-exact; run again, it changes nothing")
    .requiredOption("--from <path|url>", "the inbox to copy from")
    .requiredOption("--to <path|url>", "the inbox to copy into (created if new)")
    .option("--batch <n>", "deliveries per transaction", positive, 500)
    .action(async (opts: { from: string; to: string; batch: number }) => {
      const from = await openTarget(opts.from);
      try {
        const to = await connect(opts.to);
        try {
          let seen = 0;
          let added = 0;
          let after: { source: string; id: string } | undefined;
          for (;;) {
            const page = await from.page(after, opts.batch);
            if (page.length === 0) break;
            added += await to.restore(page);
            seen += page.length;
            after = page.at(-1)!;
          }
          const there = seen - added;
          console.log(added === 0
            ? `Nothing to copy: all ${seen} deliveries of ${from.target} are already in ${to.target}.`
            : `Copied ${added} of ${seen} deliveries from ${from.target} to ${to.target}${there > 0 ? ` (${there} were already there)` : ""}.`);
        } finally {
          await to.close();
        }
      } finally {
        await from.close();
      }
    });

  try {
    await program.parseAsync(argv);
  } catch (error) {
    if (error instanceof CommanderError) {
      process.exitCode = error.exitCode === 0 ? 0 : 2;
      return;
    }
    process.exitCode = error instanceof UsageError ? 2 : 1;
    console.error(error instanceof UsageError || error instanceof NotFound ? error.message : `inbox.ts: ${message(error)}`);
  }
}

// Not awaited at the top level: postgres.ts imports this module, which must finish loading first.
if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) void cli(process.argv);

