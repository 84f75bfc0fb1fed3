// inbox.ts: the durable inbox. The store's contract (Inbox), its node:sqlite backend, connect(), and the
// operator's CLI. Store every delivery before answering, claim it under a lease, finish it exactly once.
//   npx tsx inbox.ts status | list | show <id> | retry <id> | retry --all-failed | copy   [--db inbox.db]
//   npx tsx inbox.ts purge | retry --failed … | replay … | export | import <file>   (retention, bulk, archives)
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
  /** Most deliveries a worker claims in one transaction while its handlers are fast (see worker.ts). @default 256 */
  claimBatch: 256,
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
  /** Milliseconds a scrape of /metrics reuses the queue's gauges before reading them again. @default 5_000 */
  gaugeCacheMs: 5_000,
  /** Milliseconds /readyz reuses the store's last readiness probe. @default 1_000 */
  readyCacheMs: 1_000,
  /** Milliseconds a readiness probe may take before the store counts as unreachable. @default 1_000 */
  readyTimeoutMs: 1_000,
  /** Deliveries a bulk command (retry, replay, purge by name, export, import) touches per transaction, so none waits behind it long. @default 500 */
  bulkBatch: 500,
  /** Age after which purge drops the body of a done delivery, keeping its tombstone. @default 7 days */
  bodiesAfterMs: 7 * 86_400_000,
  /**
   * Age after which purge forgets a tombstone, and with it the ID: a copy that arrives later is stored as
   * new. Longer than any sender resends (Stripe 3 days, GitHub 3, GHES 7, Svix's manual resend at will).
   * @default 30 days
   */
  forgetAfterMs: 30 * 86_400_000,
  /**
   * Deliveries purge changes per transaction, so no ack waits long behind it: 100, not 500, as the
   * 500-row batches' commits (2 MB of WAL each) raised the ack p99 in bench/purge.ts. @default 100
   */
  purgeBatch: 100,
  /**
   * After each batch, purge rests this many times as long as the batch took, leaving the write lock and
   * the disk to acks in between (bench/purge.ts measures the ack p99 with and without). @default 1
   */
  purgeRest: 1,
  /** Free pages SQLite's incremental vacuum gives back to the file system per transaction (4 MB at 4 KB). @default 1_000 */
  vacuumStepPages: 1_000,
  /** Minutes between two purges of a worker started with --purge-every and no number. @default 60 */
  purgeEveryMinutes: 60,
  /** Deliveries search() returns when no limit is given. @default 50 */
  searchLimit: 50,
  /** The operator page's port (admin.ts), apart from the receiver's: providers reach one, people the other. @default 8001 */
  adminPort: 8001,
  /** Deliveries on one page of the operator page's list. @default 50 */
  adminPageSize: 50,
  /** Milliseconds between two refreshes of the overview while its tab is in sight. @default 5_000 */
  adminRefreshMs: 5_000,
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
  /** Times a person replayed it after it was done; attempts count from zero again at each replay. */
  replays: number;
  /** When purge dropped its body, leaving a tombstone (body empty, hash kept); null while the body is kept. */
  purgedAt: number | null;
  /** The order key, or null for an unordered delivery. */
  orderKey: string | null;
  /** The event time its key is ordered by, in ms. */
  eventTime: number | null;
  /** Set when it was handed over stale: the ID of a newer delivery of its key that was already handled. */
  newerId: string | null;
}

/**
 * Filter picks deliveries for search, count and the bulk commands; every field narrows, all are optional.
 * Times are ms since the epoch, on received_at: since inclusive, until exclusive.
 */
export interface Filter {
  status?: Status;
  source?: string;
  /** The event type, exactly. */
  type?: string;
  since?: number;
  until?: number;
  /** A case-insensitive substring of the last error. */
  errorMatch?: string;
  /** A substring of the body, as UTF-8 text. */
  bodyContains?: string;
  /** The delivery ID, exactly. */
  id?: string;
}

/** PurgeOptions says what purge() lets go; every field has a default in DEFAULTS. */
export interface PurgeOptions {
  /** Drop the bodies of done deliveries received longer ago than this. @default DEFAULTS.bodiesAfterMs */
  bodiesAfterMs?: number;
  /** Forget tombstones (and so their IDs) received longer ago than this; must be longer. @default DEFAULTS.forgetAfterMs */
  forgetAfterMs?: number;
  /** @default DEFAULTS.purgeBatch */
  batch?: number;
  /** Rest after each batch this many times as long as it took; 0 runs batches back to back. @default DEFAULTS.purgeRest */
  rest?: number;
  /** Count what would go, and change nothing. @default false */
  dryRun?: boolean;
  /** Abort to stop after the batch in flight (a stopping worker). @default undefined */
  signal?: AbortSignal;
}

/** Purged says what a purge let go (or, in a dry run, would): bodies dropped, their bytes, tombstones forgotten. */
export interface Purged {
  bodies: number;
  bytes: number;
  forgotten: number;
  /** SQLite: bytes the incremental vacuum gave back to the file system; 0 elsewhere. */
  vacuumedBytes: number;
}

/** Kept is how much the inbox holds: deliveries with their body, tombstones, and the space they take. */
export interface Kept {
  bodies: { count: number; bytes: number; oldest: number | null };
  tombstones: { count: number; oldest: number | null };
  /** The database's size on disk (SQLite: the file; PostgreSQL: the deliveries table with its indexes and TOAST). */
  fileBytes: number;
  /** SQLite: space inside the file that is free for reuse, and whether purge can give it back (auto_vacuum). */
  freeBytes?: number;
  autoVacuum?: "none" | "full" | "incremental";
}

/** purgeCutoffs checks purge's ages and turns them into the two received_at bounds, at now. */
export function purgeCutoffs(options: PurgeOptions, now: number): { bodiesBefore: number; forgetBefore: number; batch: number; rest: number } {
  const bodiesAfterMs = options.bodiesAfterMs ?? DEFAULTS.bodiesAfterMs;
  const forgetAfterMs = options.forgetAfterMs ?? DEFAULTS.forgetAfterMs;
  for (const [name, value] of [["bodiesAfterMs", bodiesAfterMs], ["forgetAfterMs", forgetAfterMs]] as const) {
    if (!Number.isFinite(value) || value < 0) throw new TypeError(`purge: expected ${name} to be a number of ms >= 0, got ${value}`);
  }
  // A tombstone that goes with its body would let a resend through at once: the memory must outlast it.
  if (forgetAfterMs <= bodiesAfterMs) {
    throw new TypeError(`purge: expected forgetAfterMs (${forgetAfterMs}) to be longer than bodiesAfterMs (${bodiesAfterMs})`);
  }
  const batch = options.batch ?? DEFAULTS.purgeBatch;
  if (!Number.isInteger(batch) || batch < 1) throw new TypeError(`purge: expected batch to be a whole number >= 1, got ${batch}`);
  const rest = options.rest ?? DEFAULTS.purgeRest;
  if (!Number.isFinite(rest) || rest < 0) throw new TypeError(`purge: expected rest to be a number >= 0, got ${rest}`);
  return { bodiesBefore: now - bodiesAfterMs, forgetBefore: now - forgetAfterMs, batch, rest };
}

/**
 * paced runs one batch of a bulk command and then rests rest times as long as it took, so that acks get
 * the write lock and the disk in between; the batches' pace adapts to the load they meet.
 */
export async function paced<T>(rest: number, batch: () => Promise<T>): Promise<T> {
  const started = performance.now();
  const result = await batch();
  const ms = (performance.now() - started) * rest;
  if (ms >= 1) await new Promise((resolve) => setTimeout(resolve, ms));
  return result;
}

/** BulkOptions tunes a bulk command: retryMatching, replayMatching, dropBodies. */
export interface BulkOptions {
  /** Deliveries per transaction. @default DEFAULTS.bulkBatch */
  batch?: number;
  /** Count what would change, and change nothing. @default false */
  dryRun?: boolean;
}

/** Cursor is where a page of search() ended: pass the last delivery (or these three fields) as `after`. */
export interface Cursor {
  receivedAt: number;
  source: string;
  id: string;
}

const FILTER_FIELDS: Record<keyof Filter, "string" | "number"> = {
  status: "string", source: "string", type: "string", since: "number", until: "number", errorMatch: "string", bodyContains: "string", id: "string",
};

/**
 * filterSql turns a Filter into a WHERE condition with `?` parameters, in the backend's dialect. It throws
 * a TypeError for a field it does not know or a value of the wrong type, so a typo never matches everything.
 */
export function filterSql(filter: Filter, backend: Backend): { where: string; params: SqlValue[] } {
  if (filter === null || typeof filter !== "object") throw new TypeError(`filter: expected an object, got ${filter === null ? "null" : typeof filter}`);
  for (const [key, value] of Object.entries(filter)) {
    const kind = FILTER_FIELDS[key as keyof Filter];
    if (kind === undefined) throw new TypeError(`filter: expected one of ${Object.keys(FILTER_FIELDS).join(", ")}, got ${JSON.stringify(key)}`);
    if (value === undefined) continue;
    if (kind === "number" ? !Number.isFinite(value) : typeof value !== "string") {
      throw new TypeError(`filter: expected ${key} to be a ${kind === "number" ? "finite number (ms since the epoch)" : "string"}, got ${JSON.stringify(value)}`);
    }
  }
  if (filter.status !== undefined && !STATUSES.includes(filter.status)) {
    throw new TypeError(`filter: expected status to be one of ${STATUSES.join(", ")}, got ${JSON.stringify(filter.status)}`);
  }
  const pg = backend === "postgres";
  const where: string[] = [];
  const params: SqlValue[] = [];
  const add = (sql: string, value: SqlValue) => void (where.push(sql), params.push(value));
  // On SQLite, two hints for the planner, which otherwise walks a third of the table by the primary key's
  // source and sorts it (350 ms at a million rows): status <> 'done' spelled out lets it use the partial index
  // of what is not done (deliveries_open, which holds received_at and source), and +source keeps it off the
  // primary key unless the ID is given too, so it walks received_at newest first. PostgreSQL needs neither.
  if (filter.status !== undefined) add(!pg && filter.status !== "done" ? "status = ? AND status <> 'done'" : "status = ?", filter.status);
  if (filter.source !== undefined) add(!pg && filter.id === undefined ? "+source = ?" : "source = ?", filter.source);
  if (filter.id !== undefined) add("id = ?", filter.id);
  if (filter.type !== undefined) add("event_type = ?", filter.type);
  if (filter.since !== undefined) add(pg ? "received_at >= ?::bigint" : "received_at >= ?", Math.floor(filter.since));
  if (filter.until !== undefined) add(pg ? "received_at < ?::bigint" : "received_at < ?", Math.ceil(filter.until));
  // instr and strpos, not LIKE: the operator's text is matched as it is, % and _ included.
  if (filter.errorMatch !== undefined) add(pg ? "strpos(lower(error), lower(?::text)) > 0" : "instr(lower(error), lower(?)) > 0", filter.errorMatch);
  // The body is bytes: the needle goes in as the bytes of its UTF-8 text, so any body can be searched.
  if (filter.bodyContains !== undefined) add(pg ? "position(?::bytea IN body) > 0" : "instr(body, ?) > 0", Buffer.from(filter.bodyContains, "utf8"));
  return { where: where.length === 0 ? "TRUE" : where.join(" AND "), params };
}

/** Lease is a claimed delivery; its token fences every later write against a takeover. */
export interface Lease extends Delivery {
  token: string;
  leasedUntil: number;
  /** True when this claim took the delivery from a worker whose lease had run out (for the metrics). */
  takeover?: boolean;
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
  /** Called after every group commit that succeeded, with its number of ops and its duration (metrics.ts). @default none */
  onCommit?: (size: number, ms: number) => void;
}

/** Gauges is the queue's shape as the metrics show it, read without counting the whole table twice. */
export interface Gauges {
  /** Deliveries per source and status; statuses with none are left out. */
  bySourceStatus: { source: string; status: Status; n: number }[];
  /** Per source with any waiting (received or processing), how long the oldest has waited. */
  oldestWaitingMs: { source: string; ms: number }[];
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

/** toGauges turns live counts and totals per source into Gauges: done is each total less its live rows. */
export function toGauges(rows: readonly { source: string; status: Status | "total"; n: number; oldest: number | null }[], now: number): Gauges {
  const bySourceStatus: Gauges["bySourceStatus"] = [];
  const live = new Map<string, number>();
  const oldest = new Map<string, number>();
  for (const r of rows) {
    if (r.status === "total") continue;
    // One status may come in several rows (SQLite counts unordered and ordered waiting ones apart).
    const same = bySourceStatus.find((x) => x.source === r.source && x.status === r.status);
    if (same) same.n += Number(r.n);
    else bySourceStatus.push({ source: r.source, status: r.status, n: Number(r.n) });
    live.set(r.source, (live.get(r.source) ?? 0) + Number(r.n));
    if (r.oldest !== null) oldest.set(r.source, Math.min(oldest.get(r.source) ?? Infinity, Number(r.oldest)));
  }
  for (const r of rows) {
    const done = Number(r.n) - (live.get(r.source) ?? 0);
    if (r.status === "total" && done > 0) bySourceStatus.push({ source: r.source, status: "done", n: done });
  }
  bySourceStatus.sort((a, b) => (a.source < b.source ? -1 : a.source > b.source ? 1 : STATUSES.indexOf(a.status) - STATUSES.indexOf(b.status)));
  return { bySourceStatus, oldestWaitingMs: [...oldest].sort().map(([source, t]) => ({ source, ms: Math.max(0, now - t) })) };
}

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
  // Replays, tombstones (a purged body leaves the row, hash and times, so its ID is still a duplicate), and
  // the indexes that keep search and the bulk commands off a full scan. A tombstone stays in deliveries, not in a
  // table of its own, so that store() stays one INSERT, unchanged: its ON CONFLICT already finds the ID.
  `ALTER TABLE deliveries ADD COLUMN replays INTEGER NOT NULL DEFAULT 0;
   ALTER TABLE deliveries ADD COLUMN purged_at INTEGER;
   CREATE INDEX deliveries_received ON deliveries (received_at, source, id);
   -- Only done rows with a body: what purge drops next, and what replay may take, without walking tombstones.
   CREATE INDEX deliveries_kept ON deliveries (received_at) WHERE status = 'done' AND purged_at IS NULL;
   CREATE INDEX deliveries_purged ON deliveries (received_at) WHERE purged_at IS NOT NULL;`,
  // The operator page's overview (summary, histogram) from indexes alone, however many done rows pile up:
  // what was finished per minute; what is not done, by status, age and source; and conflicting duplicates.
  `CREATE INDEX IF NOT EXISTS deliveries_finished ON deliveries (finished_at) WHERE finished_at IS NOT NULL;
   CREATE INDEX IF NOT EXISTS deliveries_open ON deliveries (status, received_at, source) WHERE status <> 'done';
   CREATE INDEX IF NOT EXISTS deliveries_conflicts ON deliveries (conflicts) WHERE conflicts > 0;
   -- Failures grouped by their error without reading the failed rows themselves; only failed rows pay for it.
   CREATE INDEX IF NOT EXISTS deliveries_failed_error ON deliveries (error, received_at) WHERE status = 'failed';
   -- Every failed try's error, not only the last one's, for the person reading a delivery's page.
   CREATE TABLE IF NOT EXISTS attempt_errors (
     source TEXT NOT NULL, id TEXT NOT NULL, attempt INTEGER NOT NULL, error TEXT NOT NULL, failed_at INTEGER NOT NULL);
   CREATE INDEX IF NOT EXISTS attempt_errors_delivery ON attempt_errors (source, id);`,
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
    // Before anything else writes the file: a new database is created able to give freed pages back
    // (purge's incremental vacuum). On an existing file this does nothing until a VACUUM (vacuum()).
    db.exec("PRAGMA auto_vacuum = INCREMENTAL");
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

/** toDelivery reads a deliveries row, as either backend returns it, into a Delivery. */
export function toDelivery(row: Record<string, unknown>): Delivery {
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
    replays: row.replays as number,
    purgedAt: row.purged_at as number | null,
    orderKey: (row.order_key ?? null) as string | null,
    eventTime: (row.event_time ?? null) as number | null,
    newerId: (row.newer_id ?? null) as string | null,
  };
}

/** searchPageLimit checks a page size given to search(), or gives DEFAULTS.searchLimit. */
export function searchPageLimit(limit: number | undefined): number {
  if (limit === undefined) return DEFAULTS.searchLimit;
  if (!Number.isInteger(limit) || limit < 1) throw new TypeError(`search: expected limit to be a whole number >= 1, got ${limit}`);
  return limit;
}
/** bulkBatchSize checks a batch size given to a bulk command, or gives DEFAULTS.bulkBatch. */
export function bulkBatchSize(batch: number | undefined): number {
  if (batch === undefined) return DEFAULTS.bulkBatch;
  if (!Number.isInteger(batch) || batch < 1) throw new TypeError(`bulk: expected batch to be a whole number >= 1, got ${batch}`);
  return batch;
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
  /**
   * attemptErrors returns each failed try of one delivery that fail() recorded, oldest first; only tries
   * since receivedAt, so an ID that purge forgot and that arrived again does not show its old tries.
   */
  attemptErrors(d: { source: string; id: string; receivedAt: number }): Promise<AttemptError[]>;
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
  /** summary counts per status and per source, with the oldest wait, from indexes alone: the operator page's overview. */
  summary(): Promise<Summary>;
  /** histogram counts deliveries received, done and failed in each bucketMs from since up to until (the clock's now). */
  histogram(since: number, bucketMs: number, until?: number): Promise<Bucket[]>;
  /** page returns up to limit deliveries in key order after the cursor, every field, for copying. */
  page(after: { source: string; id: string } | undefined, limit: number): Promise<Delivery[]>;
  /** restore writes deliveries as they are (from page() of another inbox); existing keys are skipped. */
  restore(deliveries: readonly Delivery[]): Promise<number>;
  /** search returns the deliveries that match, newest first (received_at, then source and id), a page after the cursor. */
  search(filter: Filter, page?: { after?: Cursor; limit?: number }): Promise<Delivery[]>;
  /** count says how many deliveries match. */
  count(filter: Filter): Promise<number>;
  /**
   * retryMatching queues the failed deliveries that match (tombstones aside) again, attempts reset, in
   * batches; returns how many. With dryRun it only counts them.
   */
  retryMatching(filter: Filter, options?: BulkOptions): Promise<number>;
  /**
   * replayMatching puts the done deliveries that match through the handler again: same key, attempts
   * reset, replays counted, due now. A tombstone has no body to replay; it is counted, not replayed.
   */
  replayMatching(filter: Filter, options?: BulkOptions): Promise<{ replayed: number; tombstoned: number }>;
  /**
   * purge drops the bodies of done deliveries older than bodiesAfterMs, keeping a tombstone (source, ID,
   * hash, status, times) that store() still answers as a duplicate, and forgets tombstones older than
   * forgetAfterMs. Failed deliveries keep their bodies. It works in batches, each its own transaction.
   */
  purge(options?: PurgeOptions): Promise<Purged>;
  /** dropBodies makes tombstones of the settled (done or failed) deliveries that match, whatever their age: purge by name. */
  dropBodies(filter: Filter, options?: BulkOptions): Promise<{ bodies: number; bytes: number }>;
  /** kept says how much is kept: bodies, tombstones, bytes, and the oldest of each. */
  kept(): Promise<Kept>;
  /** query runs SQL with `?` parameters outside any delivery: the handler's own tables, and tests. */
  query(sql: string, ...params: SqlValue[]): Promise<Record<string, unknown>[]>;
  /** onWake calls back when new deliveries may be due (PostgreSQL's NOTIFY), a hint beside polling; returns how to stop. */
  onWake(listener: () => void): () => void;
  /** gauges counts deliveries per source and status and finds the oldest wait, for /metrics. */
  gauges(): Promise<Gauges>;
  /** ready is true if a delivery could be committed now, else the reason why not (for /readyz). */
  ready(): Promise<true | string>;
  /** flush resolves once every write queued so far is committed. */
  flush(): Promise<void>;
  /** close commits what is queued, then lets go of the database. */
  close(): Promise<void>;
}

/** checkOptions throws a TypeError for an InboxOptions field of the wrong kind; both backends take the same. */
export function checkOptions(options: InboxOptions): void {
  for (const [key, value] of Object.entries(options)) {
    if (key === "now" || key === "random" || key === "onCommit") {
      if (typeof value !== "function") throw new TypeError(`Inbox: expected ${key} to be a function, got ${typeof value}`);
    } else if (key === "backgroundCheckpoints" || key === "listen") {
      if (typeof value !== "boolean") throw new TypeError(`Inbox: expected ${key} to be a boolean, got ${typeof value}`);
    } else if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
      throw new TypeError(`Inbox: expected ${key} to be a number >= 0, got ${String(value)}`);
    }
  }
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
  private gauger: Worker | undefined;
  private readonly onCommit: ((size: number, ms: number) => void) | undefined;
  // The error of the last group commit, until one succeeds: a full disk or a read-only file shows here first.
  private commitError: unknown;
  private flushing = false;
  private closed = false;

  constructor(path: string, options: InboxOptions = {}) {
    checkOptions(options);
    this.path = this.target = path;
    this.db = openDatabase(path, options.busyTimeoutMs ?? DEFAULTS.busyTimeoutMs);
    const db = this.db;
    this.tx = { backend: "sqlite", db, run: (sql, ...params) => Number(this.sql(sql).run(...params).changes) };
    this.now = options.now ?? Date.now;
    this.random = options.random ?? Math.random;
    this.batchSize = Math.max(1, options.batchSize ?? DEFAULTS.batchSize);
    this.busyTimeoutMs = Math.round(options.busyTimeoutMs ?? DEFAULTS.busyTimeoutMs);
    this.maxAttempts = Math.max(1, options.maxAttempts ?? DEFAULTS.maxAttempts);
    this.onCommit = options.onCommit;
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
      // Which of the rows about to be claimed are takeovers: RETURNING sees only the new status.
      const expired = this.sql("SELECT rowid FROM deliveries WHERE status = 'processing' AND leased_until <= ? LIMIT ?").all(now, limit) as Row[];
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
      for (const lease of expired.length > 0 ? leases : []) if (expired.some((r) => r.rowid === rowids.get(lease))) lease.takeover = true;
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
      this.sql("INSERT INTO attempt_errors (source, id, attempt, error, failed_at) VALUES (?, ?, ?, ?, ?)")
        .run(lease.source, lease.id, row.attempts, error, now);
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

  /** attemptErrors returns each failed try of one delivery that fail() recorded, oldest first. */
  async attemptErrors(d: { source: string; id: string; receivedAt: number }): Promise<AttemptError[]> {
    return (this
      .sql("SELECT attempt, error, failed_at FROM attempt_errors WHERE source = ? AND id = ? AND failed_at >= ? ORDER BY failed_at, rowid")
      .all(d.source, d.id, d.receivedAt) as Row[]).map((r) => ({ attempt: r.attempt as number, error: r.error as string, failedAt: r.failed_at as number }));
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
                    WHERE status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key`)
          .all(now)
        : this
          .sql(`UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                    WHERE source = ? AND id = ? AND status = 'failed' AND purged_at IS NULL RETURNING source, id, order_key`)
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

  /**
   * summary counts per status and per source for a page that refreshes every few seconds. The rows not
   * done are counted in their partial index; done is each source's total (a count on the primary key)
   * less those, so no statement reads the table itself.
   */
  async summary(): Promise<Summary> {
    const now = this.now();
    const open = this
      .sql("SELECT source, status, count(*) AS n FROM deliveries WHERE status <> 'done' GROUP BY source, status")
      .all() as Row[];
    const totals = (this.sql("SELECT DISTINCT source FROM deliveries").all() as Row[]).map((r) => ({
      source: r.source as string,
      n: (this.sql("SELECT count(*) AS n FROM deliveries WHERE source = ?").get(r.source as string) as { n: number }).n,
    }));
    // Each with status <> 'done' spelled out, which is what lets SQLite pick the partial index.
    const oldest = this
      .sql(`SELECT min(t) AS t FROM (
              SELECT min(received_at) AS t FROM deliveries WHERE status = 'received' AND status <> 'done'
              UNION ALL SELECT min(received_at) FROM deliveries WHERE status = 'processing' AND status <> 'done')`)
      .get() as { t: number | null };
    const conflicts = this
      .sql("SELECT count(*) AS rows, coalesce(sum(conflicts), 0) AS copies FROM deliveries WHERE conflicts > 0")
      .get() as { rows: number; copies: number };
    return summarise(totals, open.map((r) => ({ source: r.source as string, status: r.status as Status, n: r.n as number })),
      oldest.t === null ? null : Math.max(0, now - oldest.t), { deliveries: conflicts.rows, copies: conflicts.copies });
  }

  /** histogram counts deliveries received, and done or failed, per bucket; the operator page's chart. */
  async histogram(since: number, bucketMs: number, until: number = this.now()): Promise<Bucket[]> {
    const buckets = emptyBuckets(since, bucketMs, until);
    // node:sqlite binds a JS number as a REAL, so the division is truncated to its bucket by CAST.
    for (const r of this
      .sql(`SELECT CAST((received_at - ?1) / ?2 AS INTEGER) AS b, count(*) AS n FROM deliveries
            WHERE received_at >= ?1 AND received_at < ?3 GROUP BY b`)
      .all(since, bucketMs, until) as Row[]) {
      buckets[r.b as number]!.received = r.n as number;
    }
    for (const r of this
      .sql(`SELECT CAST((finished_at - ?1) / ?2 AS INTEGER) AS b, status, count(*) AS n FROM deliveries
            WHERE finished_at >= ?1 AND finished_at < ?3 AND status IN ('done', 'failed') GROUP BY b, status`)
      .all(since, bucketMs, until) as Row[]) {
      buckets[r.b as number]![r.status as "done" | "failed"] = r.n as number;
    }
    return buckets;
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
                                     replays, purged_at, order_key, event_time, newer_id)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
             ON CONFLICT (source, id) DO NOTHING`,
          )
          .run(d.source, d.id, d.body, d.bodySha256, d.contentType, d.eventType, d.providerTime, d.receivedAt, d.status,
            d.attempts, d.availableAt, d.leasedUntil, d.leasedUntil === null ? null : Math.max(1, d.leasedUntil - this.now()),
            d.error, d.conflicts, d.finishedAt, d.replays ?? 0, d.purgedAt ?? null, d.orderKey ?? null, d.eventTime ?? null, d.newerId ?? null).changes);
        added += changed;
        if (changed === 1 && d.orderKey != null) keys.set(JSON.stringify([d.source, d.orderKey]), [d.source, d.orderKey]);
      }
      for (const [source, key] of keys.values()) this.rebuildKey(source, key);
      return added;
    }) as Promise<number>;
  }

  /** search returns the deliveries that match, newest first, a page after the cursor (keyset, never OFFSET). */
  async search(filter: Filter, page: { after?: Cursor; limit?: number } = {}): Promise<Delivery[]> {
    const { where, params } = filterSql(filter, "sqlite");
    const limit = searchPageLimit(page.limit);
    const after = page.after === undefined ? "" : "AND (received_at, source, id) < (?, ?, ?)";
    const cursor = page.after === undefined ? [] : [page.after.receivedAt, page.after.source, page.after.id];
    const rows = this
      .sql(`SELECT * FROM deliveries WHERE ${where} ${after} ORDER BY received_at DESC, source DESC, id DESC LIMIT ?`)
      .all(...params, ...cursor, limit) as Row[];
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
        const row = this
          .sql(`UPDATE deliveries SET status = 'received', attempts = 0, error = NULL, available_at = ?, finished_at = NULL
                WHERE source = ? AND id = ? AND status = 'failed' RETURNING order_key`)
          .get(now, k.source, k.id) as Row | undefined;
        if (!row) continue;
        total++;
        // An ordered delivery waits its turn again: its key's head row decides when.
        if (row.order_key !== null) this.settleKey(k.source, row.order_key as string, k.id, false);
      }
    });
    return total;
  }

  /** replayMatching puts the done deliveries that match through the handler again; tombstones are counted, not replayed. */
  async replayMatching(filter: Filter, options: BulkOptions = {}): Promise<{ replayed: number; tombstoned: number }> {
    const kept = "status = 'done' AND purged_at IS NULL";
    const tombstoned = () => this.countWhere(filter, "status = 'done' AND purged_at IS NOT NULL");
    if (options.dryRun) return { replayed: await this.countWhere(filter, kept), tombstoned: await tombstoned() };
    let replayed = 0;
    await this.inBatches(filter, kept, options.batch, (keys, now) => {
      for (const k of keys) {
        const row = this
          .sql(`UPDATE deliveries SET status = 'received', attempts = 0, replays = replays + 1, error = NULL, available_at = ?,
                       finished_at = NULL, leased_until = NULL, lease_token = NULL
                WHERE source = ? AND id = ? AND status = 'done' AND purged_at IS NULL RETURNING order_key`)
          .get(now, k.source, k.id) as Row | undefined;
        if (!row) continue;
        replayed++;
        if (row.order_key !== null) this.settleKey(k.source, row.order_key as string, k.id, false);
      }
    });
    return { replayed, tombstoned: await tombstoned() };
  }

  private async countWhere(filter: Filter, also: string): Promise<number> {
    const { where, params } = filterSql(filter, "sqlite");
    return (this.sql(`SELECT count(*) AS n FROM deliveries WHERE ${also} AND ${where}`).get(...params) as { n: number }).n;
  }

  // inBatches walks the deliveries that match, oldest first, a batch per transaction, and hands each
  // batch's keys to act inside it. The cursor moves past every batch, so a delivery changed by a worker
  // meanwhile (retried, then failed again) is never taken twice in one run, and the run always ends.
  private async inBatches(filter: Filter, also: string, batch: number | undefined, act: (keys: Cursor[], now: number) => void): Promise<void> {
    const size = bulkBatchSize(batch);
    const { where, params } = filterSql(filter, "sqlite");
    let after: Cursor | undefined;
    for (;;) {
      const picked = await this.enqueue(() => {
        const cursor = after === undefined ? "" : "AND (received_at, source, id) > (?, ?, ?)";
        const keys = (this
          .sql(`SELECT received_at, source, id FROM deliveries WHERE ${also} AND ${where} ${cursor}
                ORDER BY received_at, source, id LIMIT ?`)
          .all(...params, ...(after ? [after.receivedAt, after.source, after.id] : []), size) as Row[])
          .map((r) => ({ receivedAt: r.received_at as number, source: r.source as string, id: r.id as string }));
        act(keys, this.now());
        return keys;
      }) as Cursor[];
      if (picked.length < size) return;
      after = picked.at(-1);
    }
  }

  /** purge drops old done bodies (tombstones stay), forgets old tombstones, then gives the space back. */
  async purge(options: PurgeOptions = {}): Promise<Purged> {
    const { bodiesBefore, forgetBefore, batch, rest } = purgeCutoffs(options, this.now());
    if (options.dryRun) {
      const bodies = this
        .sql(`SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes FROM deliveries
              WHERE status = 'done' AND purged_at IS NULL AND received_at < ?`)
        .get(bodiesBefore) as { n: number; bytes: number };
      // What is past both ages goes in one run: its body now, then its tombstone.
      const forgotten = this.sql("SELECT count(*) AS n FROM deliveries WHERE purged_at IS NOT NULL AND received_at < ?").get(forgetBefore) as { n: number };
      const both = this.sql("SELECT count(*) AS n FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < ?").get(forgetBefore) as { n: number };
      return { bodies: bodies.n, bytes: bodies.bytes, forgotten: forgotten.n + both.n, vacuumedBytes: 0 };
    }
    const purged: Purged = { bodies: 0, bytes: 0, forgotten: 0, vacuumedBytes: 0 };
    for (;;) {
      const { n, bytes } = await paced(rest, () => this.enqueue(() => this.dropBatch(
        "SELECT rowid, length(body) AS bytes FROM deliveries WHERE status = 'done' AND purged_at IS NULL AND received_at < ? ORDER BY received_at LIMIT ?",
        [bodiesBefore, batch]))) as { n: number; bytes: number };
      purged.bodies += n;
      purged.bytes += bytes;
      if (n < batch || options.signal?.aborted) break;
    }
    for (;;) {
      if (options.signal?.aborted) return purged;
      const n = await paced(rest, () => this.enqueue(() => Number(this
        .sql(`DELETE FROM deliveries WHERE rowid IN (
                SELECT rowid FROM deliveries WHERE purged_at IS NOT NULL AND received_at < ? ORDER BY received_at LIMIT ?)`)
        .run(forgetBefore, batch).changes))) as number;
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
                          WHERE status IN ('done', 'failed') AND purged_at IS NULL AND ${where}`).get(...params) as { n: number; bytes: number };
      return { bodies: r.n, bytes: r.bytes };
    }
    const total = { bodies: 0, bytes: 0 };
    for (;;) {
      const { n, bytes } = await paced(DEFAULTS.purgeRest, () => this.enqueue(() => this.dropBatch(pick, [...params, size]))) as { n: number; bytes: number };
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
    const bodies = this
      .sql("SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes, min(received_at) AS oldest FROM deliveries WHERE purged_at IS NULL")
      .get() as { n: number; bytes: number; oldest: number | null };
    const tombstones = this
      .sql("SELECT count(*) AS n, min(received_at) AS oldest FROM deliveries WHERE purged_at IS NOT NULL")
      .get() as { n: number; oldest: number | null };
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
    return statement.columns().length === 0 ? (statement.run(...params), []) : (statement.all(...params) as Record<string, unknown>[]);
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
      this.gauger = new Worker(GAUGER, { eval: true, workerData: { path: this.path, busyTimeoutMs: this.busyTimeoutMs } });
      this.gauger.unref();
    }
    const gauger = this.gauger;
    const now = this.now();
    return new Promise((resolve, reject) => {
      // A thread that fails or exits (close() ends it) answers no more: this read fails, the next starts anew.
      const onExit = () => onError(new Error("the gauge thread stopped"));
      const onError = (error: Error) => {
        gauger.off("message", onMessage).off("error", onError).off("exit", onExit);
        if (this.gauger === gauger) this.gauger = undefined;
        reject(new Error(`gauges ${this.path}: ${message(error)}`, { cause: error }));
      };
      const onMessage = (reply: { error?: string; rows?: { source: string; status: Status | "total"; n: number; oldest: number | null }[] }) => {
        gauger.off("error", onError).off("exit", onExit);
        if (reply.error !== undefined) return reject(new Error(`gauges ${this.path}: ${reply.error}`));
        resolve(toGauges(reply.rows!, now));
      };
      gauger.once("message", onMessage).once("error", onError).once("exit", onExit);
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
    await this.gauger?.terminate();
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
    const started = performance.now();
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
      if (!isOwnError(error)) this.commitError = error;
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
    this.commitError = undefined;
    this.onCommit?.(batch.length, performance.now() - started);
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
  private begin(timeoutMs: number = this.busyTimeoutMs): void {
    const deadline = performance.now() + timeoutMs;
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

// How long ready()'s probe commit waits for the write lock before it reports the store as not ready.
const READY_LOCK_MS = 50;

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

/** AttemptError is one failed try of a delivery: which attempt it was, what the handler said, and when. */
export interface AttemptError {
  attempt: number;
  error: string;
  failedAt: number;
}

/** Summary is the operator page's overview: counts per status, the same per source, the oldest wait, conflicts. */
export interface Summary {
  counts: Record<Status, number>;
  sources: { source: string; counts: Record<Status, number> }[];
  oldestWaitingMs: number | null;
  conflicts: { deliveries: number; copies: number };
  /** True when the done counts are estimates (PostgreSQL, a large table); every other count is exact. */
  estimated: boolean;
}

/** summarise builds a Summary from each source's total and its counts of what is not done; both backends use it. */
export function summarise(
  totals: { source: string; n: number }[], open: { source: string; status: Status; n: number }[],
  oldestWaitingMs: number | null, conflicts: Summary["conflicts"],
): Summary {
  const zero = () => Object.fromEntries(STATUSES.map((s) => [s, 0])) as Record<Status, number>;
  const counts = zero();
  const bySource = new Map(totals.map((t) => [t.source, { source: t.source, counts: { ...zero(), done: t.n } }]));
  for (const o of open) {
    const entry = bySource.get(o.source) ?? { source: o.source, counts: zero() };
    bySource.set(o.source, entry);
    entry.counts[o.status] += o.n;
    entry.counts.done -= o.n;
  }
  const sources = [...bySource.values()].sort((a, b) => (a.source < b.source ? -1 : 1));
  for (const x of sources) for (const s of STATUSES) counts[s] += x.counts[s];
  return { counts, sources, oldestWaitingMs, conflicts, estimated: false };
}

/** Bucket is one slice of time in histogram(): what arrived in it, and what was finished in it. */
export interface Bucket {
  start: number;
  received: number;
  done: number;
  failed: number;
}

/** emptyBuckets lays out histogram()'s buckets from since to until, every count zero; misuse throws. */
export function emptyBuckets(since: number, bucketMs: number, until: number): Bucket[] {
  if (!Number.isInteger(bucketMs) || bucketMs < 1) throw new TypeError(`histogram: expected bucketMs >= 1, got ${bucketMs}`);
  const n = Math.ceil((until - since) / bucketMs);
  if (!Number.isInteger(since) || !(n >= 0 && n <= 10_000)) {
    throw new TypeError(`histogram: expected since <= until and at most 10,000 buckets, got since ${since}, until ${until}, bucketMs ${bucketMs}`);
  }
  return Array.from({ length: n }, (_, i) => ({ start: since + i * bucketMs, received: 0, done: 0, failed: 0 }));
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

/** LogFormat is how lineLog writes: the text lines people read, or one JSON object per line for a collector. */
export type LogFormat = "text" | "json";
export const LOG_FORMATS: readonly LogFormat[] = ["text", "json"];

/**
 * LogFields are what a JSON log line carries beside its message: which delivery, and where it ended up
 * (an HTTP status from the receiver, a delivery's status from the worker). Never a body or a secret.
 */
export interface LogFields {
  level?: "debug" | "info" | "warn" | "error";
  source?: string;
  id?: string;
  status?: number | string;
  [key: string]: unknown;
}

/** Log is one line for an entry point's log; fields go into the JSON format only. */
export type Log = (line: string, fields?: LogFields) => void;

// pino's numeric levels, so a collector that reads pino reads these too.
const LEVELS = { debug: 20, info: 30, warn: 40, error: 50 } as const;

/** jsonLine is one log event in pino's shape: level, time (ms since the epoch), msg, then the fields. */
export function jsonLine(line: string, fields: LogFields = {}, time: number = Date.now()): string {
  const { level = "info", ...rest } = fields;
  return JSON.stringify({ level: LEVELS[level], time, msg: line, ...rest });
}

/**
 * lineLog returns a logger for an entry point's one line per delivery. A write to a pipe or a file is
 * synchronous, so the lines of one turn of the event loop go out in one write rather than one each:
 * under load that is a batch of deliveries per system call. Call flush before exiting. With format
 * "json" each line is one JSON object (jsonLine); the text format ignores the fields.
 */
export function lineLog(
  stream: { write(text: string): unknown } = process.stderr,
  format: LogFormat = "text",
): { log: Log; flush: () => void } {
  const lines: string[] = [];
  const flush = () => {
    if (lines.length > 0) stream.write(`${lines.splice(0).join("\n")}\n`);
  };
  const log: Log = format === "json"
    ? (line, fields) => void (lines.push(jsonLine(line, fields)) === 1 && setImmediate(flush))
    : (line) => void (lines.push(line) === 1 && setImmediate(flush));
  return { log, flush };
}

/** Progress is a live status line on a terminal: how far, how fast, how long still. */
export interface Progress {
  /** write puts text above the status line (log lines), which is drawn again below it. */
  write(text: string): void;
  /** stop clears the status line for good. */
  stop(): void;
}

/**
 * progress draws "done of total (percent), rate/s, time left" on one line of stream, redrawn every
 * everyMs, only if stream is a terminal: anything else (a pipe, a file, a log collector) gets nothing
 * extra, and progress returns undefined. read says how far the work is; extra adds to the line.
 */
export function progress(
  stream: { write(text: string): unknown; isTTY?: boolean },
  read: () => { done: number; total: number; extra?: string },
  options: { everyMs?: number; now?: () => number } = {},
): Progress | undefined {
  if (!stream.isTTY) return undefined;
  const now = options.now ?? (() => performance.now());
  const started = now();
  const line = () => {
    const { done, total, extra } = read();
    const seconds = Math.max(0.001, (now() - started) / 1000);
    const rate = done / seconds;
    const left = rate > 0 && total > done ? `, ${clock((total - done) / rate)} left` : "";
    const pct = total > 0 ? ` (${Math.min(100, Math.floor((100 * done) / total))}%)` : "";
    return `${done.toLocaleString("en-US")} of ${total.toLocaleString("en-US")}${pct}, ${Math.round(rate).toLocaleString("en-US")}/s${left}${extra ? `, ${extra}` : ""}`;
  };
  // \r and erase-line: the status line is redrawn where it stands, and cleared before anything else prints.
  const draw = () => void stream.write(`\r\x1b[K${line()}`);
  draw();
  const timer = setInterval(draw, options.everyMs ?? 200);
  timer.unref();
  let stopped = false;
  return {
    write: (text) => {
      if (stopped) return void stream.write(text);
      stream.write(`\r\x1b[K${text}`);
      draw();
    },
    stop: () => {
      if (stopped) return;
      stopped = true;
      clearInterval(timer);
      stream.write("\r\x1b[K");
    },
  };
}

function clock(seconds: number): string {
  const s = Math.ceil(seconds);
  return s < 60 ? `${s} s` : s < 3600 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
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

// CliFilters are the filter options every bulk command takes.
interface CliFilters {
  source?: string;
  type?: string;
  since?: number;
  until?: number;
  errorMatch?: string;
}

function filterOf(opts: CliFilters): Filter {
  const filter: Filter = {};
  if (opts.source !== undefined) filter.source = opts.source;
  if (opts.type !== undefined) filter.type = opts.type;
  if (opts.since !== undefined) filter.since = opts.since;
  if (opts.until !== undefined) filter.until = opts.until;
  if (opts.errorMatch !== undefined) filter.errorMatch = opts.errorMatch;
  return filter;
}

const UNITS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** parseDuration reads an age such as 90s, 30m, 12h, 7d or 2w as ms, or returns undefined. */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)$/.exec(text.trim());
  return match ? Math.round(Number(match[1]) * UNITS[match[2]!]!) : undefined;
}

/** parseWhen reads an ISO date, or an age meaning that long before now, as ms since the epoch; else undefined. */
export function parseWhen(text: string, now: number): number | undefined {
  const ago = parseDuration(text);
  if (ago !== undefined) return now - ago;
  // Only what looks like a date: Date.parse would also take "1" or "March".
  if (!/^\d{4}-\d{2}-\d{2}/.test(text.trim())) return undefined;
  const ms = Date.parse(text.trim());
  return Number.isNaN(ms) ? undefined : ms;
}

function bytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 ** 2) return `${(n / 1024).toFixed(1)} KB`;
  if (n < 1024 ** 3) return `${(n / 1024 ** 2).toFixed(1)} MB`;
  return `${(n / 1024 ** 3).toFixed(2)} GB`;
}

/** ExportLine is one line of `inbox.ts export`: a delivery's every field, its body as base64 and, where it is UTF-8, as text. */
export type ExportLine = Omit<Delivery, "body"> & { bodyBytes: number; body: string | null; bodyBase64: string };

/** exportLine turns a delivery into its line of an export. */
export function exportLine(d: Delivery): ExportLine {
  const { body, ...rest } = d;
  // ignoreBOM keeps a leading BOM in the text, so the text alone is also every byte of the body.
  const text = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true }).decode(body);
  return { ...rest, bodyBytes: body.length, body: Buffer.from(text, "utf8").equals(body) ? text : null, bodyBase64: body.toString("base64") };
}

/** importLine reads a line of an export back into a delivery, checking its fields and its body against the hash. */
export function importLine(line: unknown): Delivery {
  if (line === null || typeof line !== "object" || Array.isArray(line)) throw new TypeError(`expected a JSON object, got ${JSON.stringify(line)}`);
  const o = line as Record<string, unknown>;
  // Typed never, so each field takes the type its slot in Delivery asks for; the checks here make it so.
  const need = (key: string, kind: "string" | "number", nullable = false): never => {
    const v = o[key];
    if ((v === null || v === undefined) && nullable) return null as never;
    if (typeof v !== kind || (kind === "number" && !Number.isFinite(v))) throw new TypeError(`expected ${key} to be a ${kind}${nullable ? " or null" : ""}, got ${JSON.stringify(v)}`);
    return v as never;
  };
  const status: Status = need("status", "string");
  if (!STATUSES.includes(status)) throw new TypeError(`expected status to be one of ${STATUSES.join(", ")}, got ${JSON.stringify(status)}`);
  const base64: string = need("bodyBase64", "string");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(base64)) throw new TypeError("expected bodyBase64 to be base64");
  const body = Buffer.from(base64, "base64");
  const d: Delivery = {
    source: need("source", "string"), id: need("id", "string"), body, bodySha256: need("bodySha256", "string"),
    contentType: need("contentType", "string", true), eventType: need("eventType", "string", true),
    providerTime: need("providerTime", "number", true), receivedAt: need("receivedAt", "number"), status,
    attempts: need("attempts", "number"), availableAt: need("availableAt", "number"), leasedUntil: need("leasedUntil", "number", true),
    error: need("error", "string", true), conflicts: need("conflicts", "number"), finishedAt: need("finishedAt", "number", true),
    replays: o.replays === undefined ? 0 : need("replays", "number"), purgedAt: need("purgedAt", "number", true),
    orderKey: need("orderKey", "string", true), eventTime: need("eventTime", "number", true), newerId: need("newerId", "string", true),
  };
  // Only a settled delivery can be a tombstone: a waiting one with no body would reach a handler.
  if (d.purgedAt !== null && d.status !== "done" && d.status !== "failed") {
    throw new TypeError(`expected a tombstone (purgedAt set) to be done or failed, got ${d.status}`);
  }
  // A tombstone's body is gone on purpose; any other body must be the one its hash names.
  if (d.purgedAt === null && sha256(body) !== d.bodySha256) throw new TypeError(`the body of ${d.source}/${d.id} does not match its sha256`);
  return d;
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
  npx tsx inbox.ts retry --failed --source stripe --error-match timeout --since 2h --dry-run
  npx tsx inbox.ts replay --source stripe --type invoice.paid --since 3d
  npx tsx inbox.ts purge --dry-run
  npx tsx inbox.ts export --since 30d --out archive.jsonl
  npx tsx inbox.ts import archive.jsonl --db other.db
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
  const duration = (value: string) => {
    const ms = parseDuration(value);
    if (ms === undefined) throw new InvalidArgumentError("expected an age such as 30m, 12h, 7d or 2w.");
    return ms;
  };
  const when = (value: string) => {
    const ms = parseWhen(value, Date.now());
    if (ms === undefined) throw new InvalidArgumentError("expected an ISO date (2026-01-05, 2026-01-05T12:00:00Z) or an age ago (2h, 3d).");
    return ms;
  };
  const withFilters = (command: InstanceType<typeof Command>) => command
    .option("--source <name>", "only this source")
    .option("--type <type>", "only this event type")
    .option("--since <when>", "received at or after: an ISO date, or an age ago (2h, 3d)", when)
    .option("--until <when>", "received before: an ISO date, or an age ago", when)
    .option("--error-match <text>", "whose last error contains this text (any case)");

  withDb(program.command("status"))
    .description("count deliveries per status; list failures, the oldest wait and conflicting duplicates")
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const s = await inbox.status();
        const kept = await inbox.kept();
        if (opts.json) return void console.log(JSON.stringify({ ...s, kept }, null, 2));
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
        // How much is kept, so an operator sees retention at work (or that the file predates it).
        if (STATUSES.every((name) => s.counts[name] === 0)) return;
        const oldest = (t: number | null) => (t === null ? "" : `, oldest ${iso(t)}`);
        console.log(`kept: ${kept.bodies.count} with their body (${bytes(kept.bodies.bytes)}${oldest(kept.bodies.oldest)}); ${kept.tombstones.count} tombstones${oldest(kept.tombstones.oldest)}`);
        const free = kept.freeBytes ? `, ${bytes(kept.freeBytes)} of it free for reuse` : "";
        const shrink = kept.autoVacuum === "none" ? " (made before retention: run `purge --vacuum` once so purges can shrink it)" : "";
        console.log(`on disk: ${bytes(kept.fileBytes)}${free}${shrink}`);
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

  withFilters(withDb(program.command("retry [id]")))
    .description("put failed deliveries back in the queue, attempts reset: one by ID, every failed one, or those a filter matches")
    .option("--all-failed", "retry every failed delivery")
    .option("--failed", "retry the failed deliveries that the filters match")
    .option("--dry-run", "say how many would be retried, and change nothing")
    .option("--json", "print the count as JSON")
    .addHelpText("after", `
A failed delivery whose body was purged (a tombstone) cannot be retried. Bulk retries go in batches of
${DEFAULTS.bulkBatch}, each its own transaction, beside a running worker; run twice, the second finds nothing.

Examples:
  npx tsx inbox.ts retry evt_100
  npx tsx inbox.ts retry --failed --source stripe --error-match timeout --since 2h --dry-run
  npx tsx inbox.ts retry --all-failed`)
    .action(async (id: string | undefined, opts: CliFilters & { db?: string; allFailed?: boolean; failed?: boolean; dryRun?: boolean; json?: boolean }) => {
      const bulk = opts.allFailed || opts.failed;
      if (opts.allFailed && opts.failed) throw new UsageError("Give either --all-failed or --failed with filters, not both.");
      if (bulk && id !== undefined) throw new UsageError(`Give either an ID or ${opts.allFailed ? "--all-failed" : "--failed"}, not both.`);
      if (!bulk && id === undefined) throw new UsageError("Give the ID of a failed delivery, or --all-failed. To retry some, --failed with filters.");
      const filter = filterOf(opts);
      if (opts.allFailed && Object.keys(filter).some((k) => k !== "source")) throw new UsageError("--all-failed takes no filters; use --failed with them.");
      const inbox = await open(opts);
      try {
        if (bulk) {
          const n = await inbox.retryMatching(filter, { dryRun: opts.dryRun });
          if (opts.json) return void console.log(JSON.stringify({ matched: n, retried: opts.dryRun ? 0 : n, dryRun: opts.dryRun === true }));
          const what = n === 1 ? "1 failed delivery" : `${n} failed deliveries`;
          return void console.log(opts.dryRun ? `Would queue ${what} again (dry run: nothing changed).` : `Queued ${what} again.`);
        }
        const d = await findOne(inbox, id!, opts.source);
        if (d.status !== "failed") throw new NotFound(`No failed delivery with ID ${id}: it is ${d.status}.`);
        if (d.purgedAt !== null) throw new NotFound(`Delivery ${label(d)} cannot be retried: its body was purged at ${iso(d.purgedAt)} (only its tombstone is left).`);
        if (opts.dryRun) return void console.log(`Would queue ${label(d)} again (dry run: nothing changed).`);
        await inbox.retry({ source: d.source, id: d.id });
        console.log("Queued again.");
      } finally {
        await inbox.close();
      }
    });

  withFilters(withDb(program.command("replay [id]")))
    .description("put done deliveries through the handler again (after a handler bug was fixed): one by ID, or those the filters match")
    .option("--all", "replay every done delivery the filters match, even with no filter at all")
    .option("--dry-run", "say how many would be replayed, and change nothing")
    .option("--json", "print the counts as JSON")
    .addHelpText("after", `
A replay is a new attempt of the same delivery (same source and ID, so handlers' idempotency keys hold):
its attempts start again from zero and its replay count goes up. It needs the body: a tombstone (body
purged) cannot be replayed, and is counted apart. Batches of ${DEFAULTS.bulkBatch}, each its own transaction.

Examples:
  npx tsx inbox.ts replay evt_100
  npx tsx inbox.ts replay --source stripe --type invoice.paid --since 2026-01-05T00:00:00Z --until 1d --dry-run`)
    .action(async (id: string | undefined, opts: CliFilters & { db?: string; all?: boolean; dryRun?: boolean; json?: boolean }) => {
      const filter = filterOf(opts);
      if (id !== undefined && (opts.all || Object.keys(filter).some((k) => k !== "source"))) {
        throw new UsageError("Give either an ID or filters, not both.");
      }
      if (id === undefined && !opts.all && Object.keys(filter).length === 0) {
        throw new UsageError("Give the ID of a done delivery, some filters (--source, --type, --since …), or --all.");
      }
      const inbox = await open(opts);
      try {
        if (id !== undefined) {
          const d = await findOne(inbox, id, opts.source);
          if (d.status !== "done") throw new NotFound(`No done delivery with ID ${id}: it is ${d.status}.`);
          if (d.purgedAt !== null) throw new NotFound(`Delivery ${label(d)} cannot be replayed: its body was purged at ${iso(d.purgedAt)} (only its tombstone is left).`);
          Object.assign(filter, { source: d.source, id: d.id });
        }
        const r = await inbox.replayMatching(filter, { dryRun: opts.dryRun });
        if (opts.json) return void console.log(JSON.stringify({ ...r, dryRun: opts.dryRun === true }));
        const what = r.replayed === 1 ? "1 done delivery" : `${r.replayed} done deliveries`;
        console.log(opts.dryRun ? `Would replay ${what} (dry run: nothing changed).` : `Replayed ${what}: queued again, attempts reset.`);
        if (r.tombstoned > 0) console.log(`${r.tombstoned} more matched but cannot be replayed: their bodies were purged (tombstones).`);
      } finally {
        await inbox.close();
      }
    });

  withDb(program.command("purge [id]"))
    .description("let old bodies go: drop the bodies of old done deliveries, keeping tombstones that still answer duplicates, and forget old tombstones")
    .option("--bodies-after <age>", "drop the bodies of done deliveries older than this (30m, 12h, 7d, 2w)", duration, DEFAULTS.bodiesAfterMs)
    .option("--forget-after <age>", "forget tombstones older than this; must be longer than --bodies-after", duration, DEFAULTS.forgetAfterMs)
    .option("--source <name>", "with an ID: the delivery's source, when IDs clash")
    .option("--dry-run", "say what would go, and change nothing")
    .option("--batch <n>", "deliveries per transaction", positive, DEFAULTS.purgeBatch)
    .option("--rest <ratio>", "after each batch, rest this many times as long as it took, so acks get through (0: no rest)", (v: string) => {
      const n = Number(v);
      if (!Number.isFinite(n) || n < 0) throw new InvalidArgumentError("expected a number of 0 or more.");
      return n;
    }, DEFAULTS.purgeRest)
    .option("--vacuum", "SQLite: rewrite the file once so that purges can shrink it (needed for a database made before retention; blocks writers meanwhile)")
    .option("--json", "print the counts as JSON")
    .addHelpText("after", `
A tombstone keeps a delivery's source, ID, body hash, status and times: a sender that resends the ID gets
"duplicate" and the handler never runs again; a different body still counts as a conflict. Once a tombstone
is forgotten, the ID is new again: a copy that arrives later is stored and handled as a new delivery.
Failed deliveries keep their bodies (so they can be fixed and retried) unless purged by name: purge ID.
The defaults (7d, 30d) outlast Stripe's (3 days), GitHub's (3, GHES 7) and Svix's (about 28 h) retries.

Examples:
  npx tsx inbox.ts purge --dry-run
  npx tsx inbox.ts purge --bodies-after 3d --forget-after 14d
  npx tsx inbox.ts purge evt_102            # drop one delivery's body (done or failed), keep its tombstone
  npx tsx inbox.ts purge --vacuum           # once, on a database created before retention existed`)
    .action(async (id: string | undefined, opts: {
      db?: string; bodiesAfter: number; forgetAfter: number; source?: string; dryRun?: boolean; vacuum?: boolean; json?: boolean; batch: number; rest: number;
    }) => {
      if (opts.forgetAfter <= opts.bodiesAfter) {
        throw new UsageError(`--forget-after (${age(opts.forgetAfter)}) must be longer than --bodies-after (${age(opts.bodiesAfter)}): the tombstone must outlive the body.`);
      }
      if (opts.source !== undefined && id === undefined) throw new UsageError("--source goes with an ID: purge ID --source NAME.");
      const inbox = await open(opts);
      try {
        if (opts.vacuum) {
          if (!(inbox instanceof SqliteInbox)) throw new UsageError("--vacuum is for SQLite; PostgreSQL's autovacuum reuses the space.");
          if (opts.dryRun) return void console.log("Would rewrite the file once with auto_vacuum = INCREMENTAL (dry run: nothing changed).");
          const { before, after } = await inbox.vacuum();
          return void console.log(`Vacuumed ${inbox.target}: ${bytes(before)} before, ${bytes(after)} after; later purges give freed space back to the file system.`);
        }
        if (id !== undefined) {
          const d = await findOne(inbox, id, opts.source);
          if (d.purgedAt !== null) return void console.log(`${label(d)} is already a tombstone (purged at ${iso(d.purgedAt)}).`);
          if (d.status !== "done" && d.status !== "failed") throw new NotFound(`Delivery ${label(d)} is ${d.status}: only done or failed deliveries can be purged.`);
          const r = await inbox.dropBodies({ source: d.source, id: d.id }, { dryRun: opts.dryRun });
          if (opts.json) return void console.log(JSON.stringify({ ...r, dryRun: opts.dryRun === true }));
          return void console.log(`${opts.dryRun ? "Would drop" : "Dropped"} the body of ${label(d)} (${bytes(r.bytes)}); its tombstone stays${opts.dryRun ? " (dry run: nothing changed)" : ""}.`);
        }
        const r = await inbox.purge({ bodiesAfterMs: opts.bodiesAfter, forgetAfterMs: opts.forgetAfter, dryRun: opts.dryRun, batch: opts.batch, rest: opts.rest });
        if (opts.json) return void console.log(JSON.stringify({ ...r, dryRun: opts.dryRun === true }));
        const verb = opts.dryRun ? "Would drop" : "Dropped";
        console.log(`${verb} ${r.bodies} ${r.bodies === 1 ? "body" : "bodies"} (${bytes(r.bytes)}) of done deliveries older than ${age(opts.bodiesAfter)}; their tombstones stay.`);
        console.log(`${opts.dryRun ? "Would forget" : "Forgot"} ${r.forgotten} ${r.forgotten === 1 ? "tombstone" : "tombstones"} older than ${age(opts.forgetAfter)}: those IDs would be stored as new if they came again.`);
        if (r.vacuumedBytes > 0) console.log(`Gave ${bytes(r.vacuumedBytes)} back to the file system.`);
        if (opts.dryRun) console.log("(dry run: nothing changed)");
        const k = await inbox.kept();
        if (k.autoVacuum === "none" && !opts.dryRun) {
          console.log(`The file keeps its size (the space is reused for new deliveries): it predates retention; run \`purge --vacuum\` once to let purges shrink it.`);
        }
      } finally {
        await inbox.close();
      }
    });

  withFilters(withDb(program.command("export")))
    .description("write deliveries as JSON Lines: every field, and the body as base64 (and as text where it is UTF-8)")
    .option("--status <status>", `only this status (${STATUSES.join(", ")})`, status)
    .option("--out <file>", "write to this file instead of stdout")
    .addHelpText("after", `
One delivery per line, newest first. Tombstones are exported too (body empty, purgedAt set), so an
inbox moved with export and import keeps answering their IDs as duplicates. For archiving, and for moving
between machines; every byte of every body survives the round trip.

Examples:
  npx tsx inbox.ts export --since 30d --out archive.jsonl
  npx tsx inbox.ts export --status failed --source stripe | gzip > failed.jsonl.gz`)
    .action(async (opts: CliFilters & { db?: string; status?: Status; out?: string }) => {
      const filter: Filter = { ...filterOf(opts), ...(opts.status ? { status: opts.status } : {}) };
      const inbox = await open(opts);
      const { createWriteStream } = await import("node:fs");
      const out = opts.out ? createWriteStream(opts.out) : process.stdout;
      let n = 0;
      try {
        let after: Cursor | undefined;
        for (;;) {
          const page = await inbox.search(filter, { after, limit: DEFAULTS.bulkBatch });
          if (page.length === 0) break;
          const text = `${page.map((d) => JSON.stringify(exportLine(d))).join("\n")}\n`;
          if (!out.write(text)) await new Promise<void>((resolve) => out.once("drain", () => resolve()));
          n += page.length;
          after = page.at(-1);
        }
      } finally {
        if (opts.out) await new Promise<void>((resolve, reject) => (out as ReturnType<typeof createWriteStream>).end((e?: Error | null) => (e ? reject(e) : resolve())));
        await inbox.close();
      }
      console.error(`Exported ${n} ${n === 1 ? "delivery" : "deliveries"}${opts.out ? ` to ${opts.out}` : ""}.`);
    });

  withDb(program.command("import <file>"))
    .description("read deliveries from an export's JSON Lines (- for stdin); those already present are skipped and counted")
    .option("--dry-run", "check every line and count, and change nothing")
    .option("--json", "print the counts as JSON")
    .addHelpText("after", `
Every body is checked against its sha256 before anything is written. A delivery whose source and ID are
already in the inbox is left as it is. Safe to run twice: the second run skips them all.

Examples:
  npx tsx inbox.ts import archive.jsonl --db other.db
  gunzip -c failed.jsonl.gz | npx tsx inbox.ts import - --db postgres://127.0.0.1:5432/test?schema=inbox`)
    .action(async (file: string, opts: { db?: string; dryRun?: boolean; json?: boolean }) => {
      const { createReadStream } = await import("node:fs");
      const { createInterface } = await import("node:readline");
      if (file !== "-" && !existsSync(file)) throw new NotFound(`No such file: ${file}`);
      const inbox = await connect(opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db);
      let [lines, added, skipped] = [0, 0, 0];
      try {
        let batch: Delivery[] = [];
        const flush = async () => {
          if (batch.length === 0) return;
          if (opts.dryRun) {
            for (const d of batch) ((await inbox.find(d.id, d.source)).length > 0 ? skipped++ : added++);
          } else {
            const n = await inbox.restore(batch);
            added += n;
            skipped += batch.length - n;
          }
          batch = [];
        };
        const input = file === "-" ? process.stdin : createReadStream(file);
        for await (const line of createInterface({ input, crlfDelay: Infinity })) {
          lines++;
          if (line.trim() === "") continue;
          try {
            batch.push(importLine(JSON.parse(line)));
          } catch (error) {
            throw new UsageError(`${file}:${lines}: ${message(error)}`);
          }
          if (batch.length >= DEFAULTS.bulkBatch) await flush();
        }
        await flush();
      } finally {
        await inbox.close();
      }
      if (opts.json) return void console.log(JSON.stringify({ imported: added, skipped, dryRun: opts.dryRun === true }));
      console.log(`${opts.dryRun ? "Would import" : "Imported"} ${added} ${added === 1 ? "delivery" : "deliveries"}; skipped ${skipped} already present${opts.dryRun ? " (dry run: nothing changed)" : ""}.`);
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

