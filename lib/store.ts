// store.ts: the store's contract, at the ground floor of the house: the Inbox interface, named after a
// delivery's life (store, claim, extend, finish, fail, release, retry), its types and PermanentError. The
// backends in lib/sqlite/ and lib/postgres/ implement it side by side, the contract suite (test/contract-*.test.ts) holds both to
// it, and this file imports nothing: what the backends share besides the contract has rooms of its own.

/** Status is where a delivery is in its life. */
export type Status = "received" | "processing" | "done" | "failed";
export const STATUSES: readonly Status[] = ["received", "processing", "done", "failed"];

/** Headers are a request's headers with repeats kept apart, as node:http's headersDistinct gives them. */
export type Headers = Record<string, string[] | undefined>;

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
  /**
   * The destinations its routes chose, fixed now: one row each, with its own status, attempts, lease and
   * order. None (an empty list) keeps it, done, as a duplicate's memory only. @default [DEFAULTS.destination]
   */
  destinations?: readonly string[];
  /** The provider's own headers, kept for destinations that forward them (forwardHeaders). @default none */
  headers?: Headers | null;
  /** The W3C traceparent of the receive, carried to the destinations. @default none */
  traceparent?: string | null;
  /** Where it came from: the provider's webhook, its API through reconcile (docs/reconcile.md), or a test. @default "webhook" */
  origin?: Origin;
}

/**
 * Origin is where a delivery came from: "webhook", as the provider sent it to the receiver; "reconcile",
 * fetched back from the provider's API after the webhook never came: API JSON, not the webhook's bytes, and no
 * signature (its trust is the authenticated API call); or "test", a test delivery an operator sent to one
 * destination (the API's testDestination), stored under TEST_SOURCE.
 */
export type Origin = "webhook" | "reconcile" | "test";
/** ORIGINS lists every Origin. */
export const ORIGINS: readonly Origin[] = ["webhook", "reconcile", "test"];

/**
 * TEST_SOURCE is the source a test delivery is stored under. It starts with "$", as the sources file's own
 * keys do, so no source can be called that: a test never shares an ID's namespace with a provider's deliveries.
 */
export const TEST_SOURCE = "$test";

/** NO_DESTINATION is the destination of a delivery that no route chose: kept, done, so a copy is still a duplicate. */
export const NO_DESTINATION = "";

/** DESTINATION_NAME is what a destination may be called: one plain word, as a source is. */
export const DESTINATION_NAME = /^[A-Za-z0-9._~-]+$/;

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
  /** Where this row goes: one row per route, each with its own status, attempts, lease and order. */
  destination: string;
  /** The route's place among the delivery's rows: 0 is the first, which alone counts conflicts. */
  route: number;
  /** The provider's own headers, where a route forwards them. */
  headers: Headers | null;
  /** The W3C traceparent of the receive, where one was taken. */
  traceparent: string | null;
  /** Where it came from: "webhook", "reconcile" when fetched back from the provider's API, or "test". */
  origin: Origin;
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
  /** A substring of the body, as UTF-8 text: no index serves it, so it reads every body the other fields leave. */
  bodyContains?: string;
  /**
   * A JSON object or array (as text) the body contains, as PostgreSQL's jsonb @> says, found through an index.
   * Bodies that are not JSON, or past DEFAULTS.searchBodyBytes, never match.
   */
  bodyJson?: string;
  /** Words (any case) each of which a string, number or boolean value of the body holds, found through an index; the same bodies never match. */
  bodyWords?: string;
  /** The delivery ID, exactly. */
  id?: string;
  /** The destination, exactly. */
  destination?: string;
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
  /** Who asks, for the audit log (a worker's own retention has none). @default none */
  audit?: Audit;
}

/** Purged says what a purge let go (or, in a dry run, would): bodies dropped, their bytes, tombstones forgotten. */
export interface Purged {
  bodies: number;
  bytes: number;
  forgotten: number;
  /** SQLite: bytes the incremental vacuum gave back to the file system; 0 elsewhere. */
  vacuumedBytes: number;
  /** SQLite: the file predates retention (auto_vacuum NONE): the space is reused inside it, the file keeps its size. */
  fileKeepsSize?: boolean;
}

/** Kept is how much the inbox holds: deliveries with their body, tombstones, and the space they take. */
export interface Kept {
  bodies: { count: number; bytes: number; oldest: number | null };
  tombstones: { count: number; oldest: number | null };
  /** The database's size on disk (SQLite: the file; PostgreSQL: delivery_rows and delivery_bodies, with their indexes and TOAST). */
  fileBytes: number;
  /** SQLite: space inside the file that is free for reuse, and whether purge can give it back (auto_vacuum). */
  freeBytes?: number;
  autoVacuum?: "none" | "full" | "incremental";
}

/** BulkOptions tunes a bulk command: retryMatching, replayMatching, dropBodies. */
export interface BulkOptions {
  /** Deliveries per transaction. @default DEFAULTS.bulkBatch */
  batch?: number;
  /** Count what would change, and change nothing. @default false */
  dryRun?: boolean;
  /** Who asks, for the audit log: written in the first batch's transaction, its count added to by each. @default none */
  audit?: Audit;
}

/**
 * Audit is who made a change and what it was. A method that changes the inbox on someone's behalf takes one
 * and writes it to the audit log in the change's own transaction: if the entry cannot be written, the change
 * is not made. A change made in several transactions (a bulk retry in batches) keeps one entry, written with
 * the first and added to by each later one.
 */
export interface Audit {
  /** `key:ID` (an API key), `page:…` (the operator page), `cli:USER`, `sighup:SCRIPT`, `start:SCRIPT`: its kind before the first ":". */
  who: string;
  operation: string;
  /** What it changed, down to the field; never a secret's value. */
  target: string;
  /** When. @default the store's clock */
  at?: number;
  /** The entry's key, set by the store at the first write; each later write adds its count to that entry. @default set by the store */
  change?: string;
}

/** SearchStatus is the body search index's state (Inbox.searchStatus()). */
export interface SearchStatus {
  /** It is on: every body stored from now is indexed after its ack (indexSearch()), every body dropped leaves it at once. */
  enabled: boolean;
  /** Rows the backfill has read. PostgreSQL's walks the primary key, so this may pass toBackfill by rows stored since, which it skips. */
  backfilled: number;
  /** Rows with a body (not tombstones) stored before the index was enabled, counted then: what the backfill reads. */
  toBackfill: number;
  /** Enabled and backfilled: the search forms answer only then. */
  ready: boolean;
  /** When it was last enabled or disabled, or null if never. */
  changedAt: number | null;
  /**
   * Rows stored and not yet indexed, which the worker's tick or the next search indexes (SQLite: the rows past
   * the index's place, a backfill's among them; PostgreSQL: the rows its queue holds). 0 while it is off.
   */
  pending: number;
}

/** EnableSearchOptions are enableSearch()'s: the batch, who asks, and a callback after each batch. */
export interface EnableSearchOptions {
  /** Rows per backfill transaction. @default DEFAULTS.searchBackfillBatch */
  batch?: number;
  /** Who asks, for the audit log: one entry, written with the triggers, its count the rows each batch indexed. @default none */
  audit?: Audit;
  /** Called after each committed batch, with the status then (the CLI's progress). @default none */
  onBatch?: (status: SearchStatus) => void;
}

/** Way is how a configuration arrived: from the operator's hand on the host (a file), or through the API or the page. */
export type Way = "operator" | "api";

/** StoredSecret is one secret of the store as it is kept: its value sealed (lib/secrets.ts), never in the clear. */
export interface StoredSecret {
  name: string;
  /** The value, encrypted with the operator's key: the store cannot read it. */
  sealed: string;
  setAt: number;
  /** Who set it, as an Audit's who. */
  setBy: string;
}

/** Cursor is where a page of search() ended: pass the last delivery (or these fields) as `after`. */
export interface Cursor {
  receivedAt: number;
  source: string;
  id: string;
  /** The route of that row; without it, the page starts past every row of the delivery. */
  route?: number;
}

/** Lease is a claimed delivery; its token fences every later write against a takeover. */
export interface Lease extends Delivery {
  token: string;
  leasedUntil: number;
  /** True when this claim took the delivery from a worker whose lease had run out (for the metrics). */
  takeover?: boolean;
  /** True when its destination's breaker was open and this is the one delivery that tries it again. */
  probe?: boolean;
}

/** ClaimOptions says whose deliveries a claim takes, and the limits all workers share through the database. */
export interface ClaimOptions {
  /** The destination whose deliveries to claim. @default DEFAULTS.destination */
  destination?: string;
  /** Most of its deliveries leased at once, by every worker together. @default no limit */
  maxInFlight?: number;
  /** Most claims per second, by every worker together, with a burst of up to `burst` at once. @default no limit */
  rate?: { perSecond: number; burst?: number };
  /**
   * Told, once the claim has committed, of the deliveries it set aside instead of leasing: their lease ran
   * out on their last attempt, so their worker crashed or hung with them. No handler or forward reports
   * those, so this is where they are announced. @default none
   */
  onSetAside?: (setAside: SetAside[]) => void;
}

/** SetAside is a delivery that a claim set aside as failed: its last attempt's lease ran out. */
export interface SetAside {
  source: string;
  id: string;
  destination: string;
  attempts: number;
  error: string;
}

/** FailOptions says how a failed try goes on: set aside at once, or retried no sooner than the destination asked. */
export interface FailOptions {
  /** Set it aside now: retrying cannot help. @default false */
  permanent?: boolean;
  /** Retry no sooner than this many ms from now (a Retry-After), capped at retryCapMs. @default the backoff alone */
  retryAfterMs?: number;
  /** What the try came to, kept in the delivery's attempt log. @default the error alone, at the store's now */
  attempt?: Try;
}

/**
 * Try is what one try of a delivery came to, as its executor saw it: when it started, how long it took, and
 * for a forward the destination's answer (its status, headers and the first bytes of its body, redacted) or
 * the connection's error. finish() and fail() keep it in the delivery's attempt log, in their transaction.
 */
export interface Try {
  /** When the try started, in ms since the epoch. */
  startedAt: number;
  /** How long it took, in ms. */
  ms: number;
  /** The HTTP status the destination answered; absent when none came (a timeout, a refused connection, a handler). */
  status?: number;
  /** The answer's headers, each name lower case, values joined with ", ". */
  headers?: Record<string, string>;
  /** The first bytes of the answer's body (DEFAULTS.attemptBodyBytes), redacted. */
  body?: string;
}

/** Attempt is one try in a delivery's attempt log: which attempt it was, where it went, and what it came to. */
export interface Attempt {
  attempt: number;
  /** The destination the try went to. */
  destination: string;
  startedAt: number;
  /** How long it took, in ms; null for a try kept before tries were timed. */
  ms: number | null;
  /** The HTTP status answered, or null (no answer, or not a forward). */
  status: number | null;
  /** Why the try failed, redacted; null when it succeeded. */
  error: string | null;
  headers: Record<string, string> | null;
  body: string | null;
}

/**
 * KeptAttempt is one try as the attempt log keeps it, with its route's key and what tells its delivery from
 * another of the same ID: what copy reads from one inbox (attemptPage()) and writes into another (restoreAttempts()).
 */
export interface KeptAttempt extends Attempt {
  source: string;
  id: string;
  /** Its place in the log: the order the tries of one route were kept in, and where a page of them ends. */
  seq: number;
  /** The receivedAt of the route's delivery. */
  receivedAt: number;
  /** The bodySha256 of the route's delivery. */
  bodySha256: string;
}

/** BreakerPolicy is when a destination's breaker opens, and how long it stays open before one delivery probes it. */
export interface BreakerPolicy {
  /** Opens after this many failures in a row (every worker's). @default DEFAULTS.breakerFailures */
  failures: number;
  /** Or when this share of the tries in the window failed... @default DEFAULTS.breakerRate */
  rate: number;
  /** ...with at least this many tries in it. @default DEFAULTS.breakerMinTries */
  minTries: number;
  /** The window's length, in ms. @default DEFAULTS.breakerWindowMs */
  windowMs: number;
  /** How long it stays open before a probe, in ms. @default DEFAULTS.breakerCoolDownMs */
  coolDownMs: number;
}

/** Tally is what one worker saw of a destination since its last tally: tries done and failed, and a probe's answer. */
export interface Tally {
  done: number;
  failed: number;
  /** The last failure's error, for the destination's page. */
  error?: string;
  /** The probe's outcome, when one of these tries was the probe. */
  probe?: "done" | "failed";
}

/** BreakerChange is what a tally did to the breaker, for the log and the operator's webhook. */
export type BreakerChange = {
  change: "opened" | "closed";
  failures: number;
  rate: number | null;
  error: string | null;
  retryAt: number | null;
};

/** DestinationState is one destination as `inbox.ts destinations` shows it. */
export interface DestinationState {
  name: string;
  /** paused (by a person, or by a 410), open (the breaker: waiting out the cool-down, or probing), or closed. */
  state: "closed" | "open" | "paused";
  /** Why it is paused. */
  pausedReason: string | null;
  /** When an open breaker lets its probe go, or the probe's lease ends. */
  retryAt: number | null;
  probing: boolean;
  /** Deliveries waiting for it, and leased now. */
  waiting: number;
  processing: number;
  failed: number;
  /** Failures in a row, and the share of failed tries in the breaker's current window (null: none yet). */
  failuresInRow: number;
  failureRate: number | null;
  lastError: string | null;
  lastErrorAt: number | null;
}

/** Rate is a destination's shared limit: perSecond tokens a second, up to burst at once. */
export type Rate = { perSecond: number; burst?: number };

/** Permit is permit()'s answer: how many may start, whether the destination is paused, and when to ask again if fewer than asked. */
export interface Permit {
  granted: number;
  paused: boolean;
  /** Milliseconds until the next token, when fewer were granted than asked; else 0. */
  waitMs: number;
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
  // db, the SQLite connection, is declared by lib/sqlite/sqlite.ts, so that the contract names no backend's types.
  /**
   * The PostgreSQL client inside the transaction (PostgreSQL only); its queries must be awaited. Behind
   * PgBouncer (?listen=false), no named statements and no session SET: docs/postgres.md, behind PgBouncer.
   */
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
  /**
   * PostgreSQL: milliseconds a body search of search() or count() may run before it fails with SearchTooBroad
   * (0: none; SQLite takes it and has no way to apply it). @default DEFAULTS.searchTimeoutMs
   */
  searchTimeoutMs?: number;
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
  /** Tries kept in a delivery's attempt log for each of its destinations; older ones go as new ones come. @default DEFAULTS.attemptsKept */
  attemptsKept?: number;
  /**
   * Checkpoint on a thread of its own, so that no commit, and no 200 waiting on one, also waits while
   * the WAL is copied into the database; commits then checkpoint only if that thread falls far behind.
   * @default false
   */
  backgroundCheckpoints?: boolean;
  /**
   * SQLite: commit without an fsync (synchronous = NORMAL) and settle each write only after an fdatasync
   * of the WAL, run on a libuv thread while the next writes commit; one covers every commit before it.
   * Every write still settles only once it is on disk (see SqliteInbox.syncWal). @default false
   */
  syncOffLoop?: boolean;
  /**
   * SQLite: this connection's page cache, in KiB. A connection that only appends deliveries (the receiver's)
   * touches few pages; the cache openDatabase sets suits claims over a large backlog. @default 16_000
   */
  pageCacheKb?: number;
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

/** Failure is the outcome of fail(): retried later, or set aside. */
export type Failure = { status: "received"; retryAt: number } | { status: "failed" };
/**
 * Inbox is the store's contract, named after a delivery's life: store, claim, extend, finish, fail,
 * release, retry; then find, list and status to look, and flush and close. SqliteInbox (lib/sqlite/sqlite.ts)
 * and PostgresInbox (lib/postgres/postgres.ts) implement it, and the contract suite (test/contract-*.test.ts) holds both to it. Every write is
 * queued and committed with whatever else is waiting (group commit), so one commit serves many callers,
 * and a promise settles only after its transaction is durable.
 */
/** AttemptCursor is where a page of attemptPage() ended: its last try. */
export interface AttemptCursor {
  source: string;
  id: string;
  destination: string;
  seq: number;
}

export interface Inbox {
  readonly backend: Backend;
  /** Where the deliveries live, fit for a log line: a path, or a URL without its password. */
  readonly target: string;
  /** store saves a delivery if its (source, id) is new; a duplicate keeps the first copy. */
  store(delivery: Incoming): Promise<Stored>;
  /** claim leases the oldest due delivery of a destination, or returns undefined when there is nothing to do. */
  claim(leaseMs?: number, options?: ClaimOptions): Promise<Lease | undefined>;
  /**
   * claimBatch leases up to limit due deliveries of one destination (new, due retries, expired leases) in
   * one transaction: none while it is paused or its breaker open, one probe after the cool-down, and no
   * more than its shared in-flight and rate limits allow.
   */
  claimBatch(limit: number, leaseMs?: number, options?: ClaimOptions): Promise<Lease[]>;
  /** extend pushes a held lease further out; false means it was lost to a takeover. */
  extend(lease: Lease, leaseMs?: number): Promise<boolean>;
  /**
   * finish marks a delivery done with the handler's writes in one transaction, and keeps the try in its
   * attempt log if one is given; false if the lease was lost (and then nothing is written).
   */
  finish(lease: Lease, writes?: readonly LocalWrite[], attempt?: Try): Promise<boolean>;
  /**
   * fail records a failed try, kept in its attempt log: retried after a backoff, or set aside; undefined if
   * the lease was lost.
   */
  fail(lease: Lease, error: string, options?: FailOptions): Promise<Failure | undefined>;
  /**
   * attempts returns the attempt log of one delivery, oldest first: every try fail() recorded, and those
   * finish() was given, the last InboxOptions.attemptsKept of each destination. Only tries since receivedAt,
   * so an ID that purge forgot and that arrived again does not show its old tries.
   */
  attempts(d: { source: string; id: string; receivedAt: number; destination?: string }): Promise<Attempt[]>;
  /** release hands a claimed delivery back untouched, without spending an attempt. */
  release(lease: Lease): Promise<boolean>;
  /** retry puts failed deliveries back in the queue with their attempts reset; returns how many. */
  retry(target: { source?: string; id: string } | { allFailed: true }, audit?: Audit): Promise<number>;
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
  /** page returns up to limit deliveries in key order (source, id, route) after the cursor, every field, for copying. */
  page(after: { source: string; id: string; route?: number } | undefined, limit: number): Promise<Delivery[]>;
  /** restore writes deliveries as they are (from page() of another inbox); existing keys are skipped. */
  restore(deliveries: readonly Delivery[], audit?: Audit): Promise<number>;
  /**
   * attemptPage returns the attempt log for copying: up to limit tries in key order (source, id, destination,
   * then seq) after the cursor, then the rest of the last route's, so that no page splits one route's log. Only
   * the tries attempts() shows: of a delivery still kept, since its receivedAt.
   */
  attemptPage(after: AttemptCursor | undefined, limit: number): Promise<KeptAttempt[]>;
  /**
   * restoreAttempts writes tries as they are (from attemptPage() of another inbox), in their seq order, so the
   * oldest are still the first to go, and of each route no more than this inbox keeps (InboxOptions.attemptsKept),
   * the newest. A route's tries are written only into the same delivery (its receivedAt and bodySha256) and only
   * while it has none of its own: run again, it writes nothing, and a delivery that restore() skipped for another
   * of the same ID keeps its own tries alone. Returns how many it wrote.
   */
  restoreAttempts(tries: readonly KeptAttempt[]): Promise<number>;
  /**
   * search returns the deliveries that match, newest first (received_at, then source and id), a page after the
   * cursor. With bodies: false each comes with an empty body, as a list shows none and need not read them.
   */
  search(filter: Filter, page?: { after?: Cursor; limit?: number; bodies?: boolean }): Promise<Delivery[]>;
  /** count says how many deliveries match. */
  count(filter: Filter): Promise<number>;
  /**
   * retryMatching queues the failed deliveries that match (tombstones aside) again, attempts reset, in
   * batches; returns how many. With dryRun it only counts them.
   */
  retryMatching(filter: Filter, options?: BulkOptions): Promise<number>;
  /**
   * replayMatching puts the done deliveries that match through their destination again: same key, attempts
   * reset, replays counted, due now. With `to`, each matching delivery goes to that destination instead:
   * its row there is replayed if done, or added if its routes never chose it (routing after the fact).
   * A tombstone has no body to replay; it is counted, not replayed.
   */
  replayMatching(
    filter: Filter,
    options?: BulkOptions & { to?: string },
  ): Promise<{ replayed: number; tombstoned: number }>;
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
  /**
   * onWake calls back when new deliveries may be due (PostgreSQL's NOTIFY), a hint beside polling; returns
   * how to stop. Its payload is "config" when a new configuration was applied (applyConfig()).
   */
  onWake(listener: (payload?: string) => void): () => void;
  /** gauges counts deliveries per source and status and finds the oldest wait, for /metrics. */
  gauges(): Promise<Gauges>;
  /** ready is true if a delivery could be committed now, else the reason why not (for /readyz). */
  ready(): Promise<true | string>;
  /** pause holds a destination's deliveries (none is claimed, none spends an attempt) until resume; false if it already was. */
  pause(destination: string, reason?: string, audit?: Audit): Promise<boolean>;
  /** resume lets a paused destination's deliveries go again; false if it was not paused. */
  resume(destination: string, audit?: Audit): Promise<boolean>;
  /**
   * permit says how many of n forwards to a destination may start now: none while it is paused, else up to
   * the tokens its shared rate has, taken at this moment. A lane asks just before it sends, so a pause
   * that has committed stops every forward that starts after it, and the rate holds when the forwards go
   * out, not when they were claimed. Without a rate it only reads.
   */
  permit(destination: string, n: number, rate?: Rate): Promise<Permit>;
  /** tally adds what a worker saw of a destination to its shared breaker, and says if that opened or closed it. */
  tally(destination: string, tally: Tally, policy: BreakerPolicy): Promise<BreakerChange | undefined>;
  /** destinations lists every destination with deliveries or a state: its state, waiting count, failure rate and last error. */
  destinations(): Promise<DestinationState[]>;
  /** flush resolves once every write queued so far is committed. */
  flush(): Promise<void>;
  /** close commits what is queued, then lets go of the database. */
  close(): Promise<void>;
  /**
   * failuresByError counts the failed deliveries by their exact last error, each with the newest one's
   * received time: the operator page groups them further by a normalised key, reading the failed rows once.
   */
  failuresByError(): Promise<{ error: string | null; count: number; latest: number }[]>;
  /** searchStatus says whether the body search index (bodyJson, bodyWords) is on, and how far its backfill got. */
  searchStatus(): Promise<SearchStatus>;
  /**
   * enableSearch turns the body search index on (docs/operations.md#searching-bodies): in one short transaction
   * the switch (from then on every body stored waits for indexSearch(), after its ack), then the rows stored
   * before, a batch per transaction (writers wait for one batch at most), until all are read. Called again (after
   * an interruption) it carries on where the backfill stopped. The forms answer once the backfill is done. One
   * audit entry, its count the rows indexed.
   */
  enableSearch(options?: EnableSearchOptions): Promise<SearchStatus>;
  /** disableSearch turns the index off and empties it (and what waited for it), in one transaction; false if it was off already. */
  disableSearch(audit?: Audit): Promise<boolean>;
  /**
   * indexSearch indexes up to limit of the rows stored and not yet in the body search index, in one transaction,
   * oldest first, and returns how many it took (fewer than limit: none is left). A store never indexes its own
   * body, so that the ack does not wait for it (docs/operations.md#searching-bodies): the worker's tick calls
   * this, and search(), count() and the bulk commands call it until none is left before a bodyJson or bodyWords
   * form. 0 while the index is off. @default limit DEFAULTS.searchIndexBatch
   */
  indexSearch(limit?: number): Promise<number>;
  /** addApiKey stores a new API key: its SHA-256 alone, never the key. */
  addApiKey(key: ApiKey, audit?: Audit): Promise<void>;
  /** apiKeys lists every API key, revoked ones too, oldest first. */
  apiKeys(): Promise<ApiKey[]>;
  /** apiKeyByHash finds the key whose SHA-256 (hex) this is, revoked or not; undefined when none is. */
  apiKeyByHash(hash: string): Promise<ApiKey | undefined>;
  /** revokeApiKey marks a key revoked at a time; false if there is no such key or it already was. */
  revokeApiKey(id: string, at: number, audit?: Audit): Promise<boolean>;
  /**
   * remember keeps a POST's first answer under its idempotency key, dropping records older than
   * expiredBefore first; when a live record of that key is already there it is kept, and returned.
   */
  remember(record: Remembered, expiredBefore: number): Promise<Remembered>;
  /** recall finds the answer kept under an idempotency key at or after since; undefined when none is. */
  recall(key: string, since: number): Promise<Remembered | undefined>;
  /**
   * addAudit appends an entry for a change that changed nothing in the store (count 0: a group of failures
   * found empty). A change that writes passes its Audit to the method that writes, which keeps both in one
   * transaction.
   */
  addAudit(entry: Omit<AuditEntry, "seq">): Promise<void>;
  /** auditLog lists the audit log, newest first: up to limit entries, those before seq when given. */
  auditLog(page: { before?: number; limit: number }): Promise<AuditEntry[]>;
  /** auditCounts counts the audit log's entries by their actor's kind (`key`, `page`, `cli`, `sighup` …), for /metrics. */
  auditCounts(): Promise<{ kind: string; n: number }[]>;
  /** setSecret stores a secret, sealed, in place of one of that name; true if it is new. */
  setSecret(secret: StoredSecret, audit?: Audit): Promise<boolean>;
  /** deleteSecret removes a secret; false if there was none. */
  deleteSecret(name: string, audit?: Audit): Promise<boolean>;
  /** secrets lists every secret as it is kept, sealed, by name: to list their names, open them, or copy them as they are. */
  secrets(): Promise<StoredSecret[]>;
  /** putSecrets writes secrets as they are (still sealed), in place of those of their names, in one transaction: a copy, or a key's rotation. */
  putSecrets(secrets: readonly StoredSecret[], audit?: Audit): Promise<number>;
  /** secretsVersion counts every change to the secrets ever made: one cheap read, for the watchers' timer. */
  secretsVersion(): Promise<number>;
  /** readConfig reads the configuration in force (the newest applied version), or undefined if none was ever applied. */
  readConfig(): Promise<StoredConfig | undefined>;
  /** configVersion is the version of the configuration in force, 0 if none: one cheap read, for the watchers' timer. */
  configVersion(): Promise<number>;
  /**
   * applyConfig stores a new version of the configuration in one transaction, unless another version was
   * applied since expectedVersion, or rows wait for a destination it removes (then, with cancelWaiting,
   * they are set aside as failed in the same transaction). On PostgreSQL its commit NOTIFYs every listener.
   */
  applyConfig(document: string, options: ApplyConfigOptions): Promise<ConfigApplied>;
  /** configHistory lists every applied version of the configuration, oldest first: its history, for copy. */
  configHistory(): Promise<StoredConfig[]>;
  /**
   * configVersions pages through the configuration's versions, newest first: up to limit of them, those below
   * the version before when given. The page and the API show the history a page at a time, each version beside
   * the one before it.
   */
  configVersions(page: { before?: number; limit: number }): Promise<StoredConfig[]>;
  /**
   * restoreConfig writes versions as they are (from configHistory() of another inbox), their numbers, actors
   * and times kept; a version already there is skipped. Returns how many it wrote.
   */
  restoreConfig(versions: readonly StoredConfig[]): Promise<number>;
  /** restoreApiKeys writes keys as they are (from apiKeys() of another inbox), revoked ones too; a key already there is skipped. */
  restoreApiKeys(keys: readonly ApiKey[]): Promise<number>;
  /** restoreAudit writes audit entries as they are (from auditLog() of another inbox), their seq kept; one already there is skipped. */
  restoreAudit(entries: readonly AuditEntry[]): Promise<number>;
}

/**
 * SCOPES are what an API key (or a session of the page) may do, each allowing what the one before it does:
 * read looks; write also retries, replays, pauses and changes the configuration; admin also makes and revokes keys.
 */
export const SCOPES = ["read", "write", "admin"] as const;
/** Scope is one of SCOPES. */
export type Scope = (typeof SCOPES)[number];

/** ApiKey is one API key as stored: its hash, never the key; read keys change nothing. */
export interface ApiKey {
  id: string;
  name: string;
  scope: Scope;
  /** The SHA-256 of the key, in hex. */
  hash: string;
  createdAt: number;
  revokedAt: number | null;
}

/** Remembered is the first answer to a POST under its Idempotency-Key, with a hash of the request it answered. */
export interface Remembered {
  /** Who sent it and the key they gave, so two callers' keys never meet. */
  key: string;
  requestHash: string;
  status: number;
  /** The answer's JSON text. */
  body: string;
  at: number;
}

/** AuditEntry is one change, by any way in: who, what, to what, how many, and when. */
export interface AuditEntry {
  seq: number;
  at: number;
  /** `key:ID`, `page:…`, `cli:USER`, `sighup:SCRIPT` or `start:SCRIPT` (see Audit). */
  who: string;
  operation: string;
  target: string;
  /** How many rows it changed. */
  count: number;
}

/** TransformCode is one transform module as it was when a configuration was applied: its code and the code's SHA-256. */
export interface TransformCode {
  sha256: string;
  code: string;
}

/** StoredConfig is one applied version of the configuration: the sources file's JSON (secrets as env:NAME) and its transforms. */
export interface StoredConfig {
  version: number;
  /** The sources file's JSON text, exactly as applied. */
  document: string;
  /** Each transform module the document names, by the path it is named with. */
  transforms: Record<string, TransformCode>;
  /** Who applied it: a command, a script, or a person's name. */
  actor: string;
  appliedAt: number;
  /** Which way it came: the operator's file, or the API (or the page). */
  way: Way;
  /**
   * Per part (`source NAME`, `destination NAME`, `$operator`), whose hand last wrote it: a part an API change
   * left as the operator wrote it keeps "operator"; a part it changed or added is "api". A part not named
   * here is the version's way.
   */
  trust: Record<string, Way>;
}

/** ApplyConfigOptions says what applyConfig() may do, and who asks. */
export interface ApplyConfigOptions {
  actor: string;
  /** Which way it came. @default "operator" */
  way?: Way;
  /** Whose hand wrote each part (StoredConfig's trust). @default every part the way's */
  trust?: Record<string, Way>;
  /** Who asks, for the audit log. @default none */
  audit?: Audit;
  /** How many parts it changes: its audit entry's count. @default 1 */
  parts?: number;
  /** Refuse if the version in force is not this one (0: none). @default apply over whatever is in force */
  expectedVersion?: number;
  /** @default no transforms */
  transforms?: Record<string, TransformCode>;
  /** Destinations this version removes: the rows waiting for them refuse it, unless cancelWaiting. @default none */
  removed?: readonly string[];
  /** Set aside as failed the rows waiting for a removed destination, rather than refuse. @default false */
  cancelWaiting?: boolean;
}

/** ConfigApplied is applyConfig()'s answer: the new version (and how many rows it cancelled), or why it was refused, nothing changed. */
export type ConfigApplied =
  | { applied: true; version: number; cancelled: number }
  | { applied: false; reason: "version"; version: number }
  | { applied: false; reason: "waiting"; waiting: { destination: string; n: number }[] };

/** InboxStatus is what `inbox.ts status` prints. */
export interface InboxStatus {
  counts: Record<Status, number>;
  /** The counts again, per source and event type. */
  sources: { source: string; eventType: string | null; counts: Record<Status, number> }[];
  failed: {
    source: string;
    id: string;
    attempts: number;
    error: string | null;
    eventType: string | null;
    destination: string;
  }[];
  oldestWaitingMs: number | null;
  conflicts: { deliveries: number; copies: number };
  ordering: OrderingStatus;
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

/** Bucket is one slice of time in histogram(): what arrived in it, and what was finished in it. */
export interface Bucket {
  start: number;
  received: number;
  done: number;
  failed: number;
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
  /** Keys are held per destination: each destination goes through a key's deliveries on its own. */
  destination: string;
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
