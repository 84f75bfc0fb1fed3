// store.ts: the store's contract, at the ground floor of the house. The Inbox interface, named after a
// delivery's life (store, claim, extend, finish, fail, release, retry), its types, and what both backends
// share. sqlite.ts and postgres.ts implement it side by side, test/contract.test.ts holds both to it, and
// this file imports neither. Not run on its own: scripts reach a backend through connect() in inbox.ts.

import { hash } from "node:crypto";
import type { DatabaseSync } from "node:sqlite";
import { DEFAULTS } from "./defaults.ts";

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
}

/** NO_DESTINATION is the destination of a delivery that no route chose: kept, done, so a copy is still a duplicate. */
export const NO_DESTINATION = "";

/** DESTINATION_NAME is what a destination may be called: one plain word, as a source is. */
export const DESTINATION_NAME = /^[A-Za-z0-9._~-]+$/;

/** routesOf checks an incoming delivery's destinations, or gives the default one. */
export function routesOf(delivery: Incoming): readonly string[] {
  const routes = delivery.destinations ?? [DEFAULTS.destination];
  if (
    !Array.isArray(routes) ||
    routes.some((d) => typeof d !== "string" || !DESTINATION_NAME.test(d)) ||
    new Set(routes).size !== routes.length
  ) {
    throw new TypeError(
      `store: expected destinations to be distinct names of letters, digits, ".", "_", "~" or "-", got ${JSON.stringify(routes)}`,
    );
  }
  return routes;
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
  /** Where this row goes: one row per route, each with its own status, attempts, lease and order. */
  destination: string;
  /** The route's place among the delivery's rows: 0 is the first, which alone counts conflicts. */
  route: number;
  /** The provider's own headers, where a route forwards them. */
  headers: Headers | null;
  /** The W3C traceparent of the receive, where one was taken. */
  traceparent: string | null;
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
export function purgeCutoffs(
  options: PurgeOptions,
  now: number,
): { bodiesBefore: number; forgetBefore: number; batch: number; rest: number } {
  const bodiesAfterMs = options.bodiesAfterMs ?? DEFAULTS.bodiesAfterMs;
  const forgetAfterMs = options.forgetAfterMs ?? DEFAULTS.forgetAfterMs;
  for (const [name, value] of [
    ["bodiesAfterMs", bodiesAfterMs],
    ["forgetAfterMs", forgetAfterMs],
  ] as const) {
    if (!Number.isFinite(value) || value < 0)
      throw new TypeError(`purge: expected ${name} to be a number of ms >= 0, got ${value}`);
  }
  // A tombstone that goes with its body would let a resend through at once: the memory must outlast it.
  if (forgetAfterMs <= bodiesAfterMs) {
    throw new TypeError(
      `purge: expected forgetAfterMs (${forgetAfterMs}) to be longer than bodiesAfterMs (${bodiesAfterMs})`,
    );
  }
  const batch = options.batch ?? DEFAULTS.purgeBatch;
  if (!Number.isInteger(batch) || batch < 1)
    throw new TypeError(`purge: expected batch to be a whole number >= 1, got ${batch}`);
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

/** Cursor is where a page of search() ended: pass the last delivery (or these fields) as `after`. */
export interface Cursor {
  receivedAt: number;
  source: string;
  id: string;
  /** The route of that row; without it, the page starts past every row of the delivery. */
  route?: number;
}

const FILTER_FIELDS: Record<keyof Filter, "string" | "number"> = {
  status: "string",
  source: "string",
  type: "string",
  since: "number",
  until: "number",
  errorMatch: "string",
  bodyContains: "string",
  id: "string",
  destination: "string",
};

/** DISTINCT_SOURCES lists the sources on PostgreSQL by a loose index scan: one probe of the primary key per source. */
export const DISTINCT_SOURCES = `WITH RECURSIVE s(source) AS (
    SELECT min(source) FROM deliveries
    UNION ALL SELECT (SELECT min(source) FROM deliveries WHERE source > s.source) FROM s WHERE s.source IS NOT NULL)
  SELECT source FROM s WHERE source IS NOT NULL`;

/**
 * filterSql turns a Filter into a WHERE condition with `?` parameters, in the backend's dialect. It throws
 * a TypeError for a field it does not know or a value of the wrong type, so a typo never matches everything.
 */
export function filterSql(filter: Filter, backend: Backend): { where: string; params: SqlValue[] } {
  if (filter === null || typeof filter !== "object")
    throw new TypeError(`filter: expected an object, got ${filter === null ? "null" : typeof filter}`);
  for (const [key, value] of Object.entries(filter)) {
    const kind = FILTER_FIELDS[key as keyof Filter];
    if (kind === undefined)
      throw new TypeError(
        `filter: expected one of ${Object.keys(FILTER_FIELDS).join(", ")}, got ${JSON.stringify(key)}`,
      );
    if (value === undefined) continue;
    if (kind === "number" ? !Number.isFinite(value) : typeof value !== "string") {
      throw new TypeError(
        `filter: expected ${key} to be a ${kind === "number" ? "finite number (ms since the epoch)" : "string"}, got ${JSON.stringify(value)}`,
      );
    }
  }
  if (filter.status !== undefined && !STATUSES.includes(filter.status)) {
    throw new TypeError(
      `filter: expected status to be one of ${STATUSES.join(", ")}, got ${JSON.stringify(filter.status)}`,
    );
  }
  const pg = backend === "postgres";
  const where: string[] = [];
  const params: SqlValue[] = [];
  const add = (sql: string, value: SqlValue) => void (where.push(sql), params.push(value));
  // On SQLite, two hints for the planner, which otherwise walks a third of the table by the primary key's
  // source and sorts it (350 ms at a million rows): status <> 'done' spelled out lets it use the partial index
  // of what is not done (deliveries_open, which holds received_at and source), and +source keeps it off the
  // primary key unless the ID is given too, so it walks received_at newest first. PostgreSQL needs neither.
  if (filter.status !== undefined)
    add(!pg && filter.status !== "done" ? "status = ? AND status <> 'done'" : "status = ?", filter.status);
  if (filter.source !== undefined) add(!pg && filter.id === undefined ? "+source = ?" : "source = ?", filter.source);
  // PostgreSQL 15 has no skip scan, so an ID without its source would read the whole primary key (100 ms at a
  // million rows): it probes the key once per source instead, the sources found by a loose index scan.
  if (filter.id !== undefined && pg && filter.source === undefined)
    where.push(`source = ANY (ARRAY(${DISTINCT_SOURCES}))`);
  if (filter.id !== undefined) add("id = ?", filter.id);
  if (filter.type !== undefined) add("event_type = ?", filter.type);
  if (filter.destination !== undefined) add("destination = ?", filter.destination);
  if (filter.since !== undefined) add(pg ? "received_at >= ?::bigint" : "received_at >= ?", Math.floor(filter.since));
  if (filter.until !== undefined) add(pg ? "received_at < ?::bigint" : "received_at < ?", Math.ceil(filter.until));
  // instr and strpos, not LIKE: the operator's text is matched as it is, % and _ included.
  if (filter.errorMatch !== undefined)
    add(pg ? "strpos(lower(error), lower(?::text)) > 0" : "instr(lower(error), lower(?)) > 0", filter.errorMatch);
  // The body is bytes: the needle goes in as the bytes of its UTF-8 text, so any body can be searched.
  if (filter.bodyContains !== undefined)
    add(pg ? "position(?::bytea IN body) > 0" : "instr(body, ?) > 0", Buffer.from(filter.bodyContains, "utf8"));
  return { where: where.length === 0 ? "TRUE" : where.join(" AND "), params };
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

/** tellSetAside hands what a claim set aside to its onSetAside, once the claim has committed. */
export function tellSetAside(
  claimed: Promise<Lease[]>,
  options: ClaimOptions,
  setAside: () => SetAside[],
): Promise<Lease[]> {
  const tell = options.onSetAside;
  if (tell === undefined) return claimed;
  return claimed.then((leases) => {
    const list = setAside();
    if (list.length > 0) tell(list);
    return leases;
  });
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

/**
 * gatePermit is permit()'s arithmetic, the same on both backends: none while paused; else n, or the
 * rate's whole tokens if fewer (refilled at perSecond since tokens_at); and the tokens left. The bucket
 * holds one token less than burst (when burst is 2 or more): a forward reaches the destination a little
 * after its permit, by a delay that varies (a commit, the event loop, the network), and a destination
 * whose own bucket has our rate and burst would refuse the one that comes early after one that came
 * late. The token kept back absorbs any such difference shorter than one token's time (1/perSecond).
 */
export function gatePermit(
  row: Record<string, unknown> | undefined,
  n: number,
  now: number,
  rate: Rate | undefined,
): Permit & { tokens: number | null } {
  if (row !== undefined && Number(row.paused)) return { granted: 0, paused: true, waitMs: 0, tokens: null };
  if (!rate) return { granted: n, paused: false, waitMs: 0, tokens: null };
  const configured = rate.burst ?? Math.max(1, rate.perSecond);
  const tokens = refill(row, rate.perSecond, configured >= 2 ? configured - 1 : configured, now);
  const granted = Math.max(0, Math.min(n, Math.floor(tokens)));
  const waitMs = granted < n ? Math.max(1, Math.ceil(((1 - (tokens - granted)) * 1000) / rate.perSecond)) : 0;
  return { granted, paused: false, waitMs, tokens: tokens - granted };
}

// refill is a destination's token bucket at now: its tokens at tokens_at, refilled at perSecond, up to
// burst; a bucket never used starts full.
function refill(row: Record<string, unknown> | undefined, perSecond: number, burst: number, now: number): number {
  const last = row?.tokens_at == null ? null : Number(row.tokens_at);
  const had = row?.tokens == null || last === null ? burst : Number(row.tokens);
  return Math.min(burst, had + (last === null ? 0 : (Math.max(0, now - last) * perSecond) / 1000));
}

/** checkPermit checks permit()'s arguments and gives the destination. */
export function checkPermit(destination: string, n: number, rate: Rate | undefined): string {
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`permit: expected n >= 1, got ${n}`);
  return checkClaim({ destination, ...(rate ? { rate } : {}) });
}

/**
 * gateClaim says how many deliveries of a destination a claim may take: none while it is paused, or its
 * breaker is open and cooling down or already probing; one, the probe, once the cool-down is over; else
 * the limit less what is in flight and what the shared rate allows. Both backends read the destination's
 * row and its in-flight count, and write back what this returns.
 */
export function gateClaim(
  row: Record<string, unknown> | undefined,
  limit: number,
  now: number,
  options: ClaimOptions,
  inFlight: number,
): { n: number; probe: boolean; tokens: number | null } {
  let n = limit;
  let probe = false;
  if (row !== undefined) {
    if (Number(row.paused)) return { n: 0, probe, tokens: null };
    if (row.state === "open" || row.state === "probing") {
      const until = Number(row.state === "open" ? row.retry_at : row.probe_until);
      if (until > now) return { n: 0, probe, tokens: null };
      probe = true;
      n = 1;
    }
  }
  if (options.maxInFlight !== undefined) n = Math.min(n, options.maxInFlight - inFlight);
  let tokens: number | null = null;
  if (options.rate) {
    tokens = refill(row, options.rate.perSecond, options.rate.burst ?? Math.max(1, options.rate.perSecond), now);
    n = Math.min(n, Math.floor(tokens));
  }
  return { n: Math.max(0, n), probe, tokens };
}

/** checkClaim checks ClaimOptions and gives the destination. */
export function checkClaim(options: ClaimOptions): string {
  const destination = options.destination ?? DEFAULTS.destination;
  if (typeof destination !== "string" || !DESTINATION_NAME.test(destination))
    throw new TypeError(`claim: expected destination to be a destination's name, got ${JSON.stringify(destination)}`);
  if (options.maxInFlight !== undefined && !(Number.isInteger(options.maxInFlight) && options.maxInFlight >= 1)) {
    throw new TypeError(`claim: expected maxInFlight to be a whole number >= 1, got ${options.maxInFlight}`);
  }
  if (
    options.rate !== undefined &&
    !(options.rate.perSecond > 0 && (options.rate.burst === undefined || options.rate.burst >= 1))
  ) {
    throw new TypeError(
      `claim: expected rate to be { perSecond > 0, burst >= 1 }, got ${JSON.stringify(options.rate)}`,
    );
  }
  return destination;
}

/**
 * breakerAfter works out a destination's breaker after a tally, from its row (or none yet): the counts in
 * the window, the failures in a row, and whether it opens (enough failures in a row, or too high a share
 * in the window) or closes (its probe got through). Both backends run it inside the tally's transaction.
 */
export function breakerAfter(
  row: Record<string, unknown> | undefined,
  tally: Tally,
  policy: BreakerPolicy,
  now: number,
): { row: Record<string, SqlValue>; change: BreakerChange | undefined } {
  const fresh = row?.window_start == null || now - Number(row.window_start) >= policy.windowMs;
  const done = (fresh ? 0 : Number(row!.window_done)) + tally.done;
  const failed = (fresh ? 0 : Number(row!.window_failed)) + tally.failed;
  // A try that got through ends the run of failures; the failures reported after it start a new one.
  let inRow = (tally.done > 0 ? 0 : Number(row?.failures ?? 0)) + tally.failed;
  let state = (row?.state as string | undefined) ?? "closed";
  let retryAt = row?.retry_at == null ? null : Number(row.retry_at);
  let change: BreakerChange["change"] | undefined;
  const rate = done + failed === 0 ? null : failed / (done + failed);
  if (tally.probe === "done" && state !== "closed") {
    state = "closed";
    inRow = 0;
    retryAt = null;
    change = "closed";
  } else if (tally.probe === "failed" && state !== "closed") {
    state = "open";
    retryAt = now + policy.coolDownMs;
  } else if (
    state === "closed" &&
    tally.failed > 0 &&
    (inRow >= policy.failures || (done + failed >= policy.minTries && rate !== null && rate >= policy.rate))
  ) {
    state = "open";
    retryAt = now + policy.coolDownMs;
    change = "opened";
  }
  const error = tally.error ?? (row?.last_error as string | null | undefined) ?? null;
  return {
    row: {
      state,
      retry_at: retryAt,
      failures: inRow,
      window_start: fresh ? now : Number(row!.window_start),
      window_done: done,
      window_failed: failed,
      last_error: error,
      last_error_at: tally.error !== undefined ? now : row?.last_error_at == null ? null : Number(row.last_error_at),
    },
    change: change === undefined ? undefined : { change, failures: inRow, rate, error, retryAt },
  };
}

/** toDestinationState reads a destinations row and its counts into a DestinationState. */
export function toDestinationState(
  name: string,
  row: Record<string, unknown> | undefined,
  counts: { waiting: number; processing: number; failed: number },
  policyWindowMs: number,
  now: number,
): DestinationState {
  const live = row?.window_start != null && now - Number(row.window_start) < policyWindowMs * 2;
  const done = live ? Number(row!.window_done) : 0;
  const failed = live ? Number(row!.window_failed) : 0;
  const state =
    row === undefined ? "closed" : Number(row.paused) ? "paused" : row.state === "closed" ? "closed" : "open";
  return {
    name,
    state,
    pausedReason: Number(row?.paused ?? 0) ? ((row!.paused_reason as string | null) ?? null) : null,
    retryAt: row?.state === "open" ? Number(row.retry_at) : row?.state === "probing" ? Number(row.probe_until) : null,
    probing: row?.state === "probing",
    ...counts,
    failuresInRow: Number(row?.failures ?? 0),
    failureRate: done + failed === 0 ? null : failed / (done + failed),
    lastError: (row?.last_error as string | null | undefined) ?? null,
    lastErrorAt: row?.last_error_at == null ? null : Number(row.last_error_at),
  };
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

/** toGauges turns live counts and totals per source into Gauges: done is each total less its live rows. */
export function toGauges(
  rows: readonly { source: string; status: Status | "total"; n: number; oldest: number | null }[],
  now: number,
): Gauges {
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
  bySourceStatus.sort((a, b) =>
    a.source < b.source ? -1 : a.source > b.source ? 1 : STATUSES.indexOf(a.status) - STATUSES.indexOf(b.status),
  );
  return {
    bySourceStatus,
    oldestWaitingMs: [...oldest].sort().map(([source, t]) => ({ source, ms: Math.max(0, now - t) })),
  };
}

/** sha256 is the hex digest used to tell a true duplicate from a conflicting one. */
export function sha256(body: Uint8Array): string {
  // One-shot: no Hash object per delivery.
  return hash("sha256", body, "hex");
}

/** backoff is how long to wait before try number attempts+1: doubling, capped, with upward jitter. */
export function backoff(
  attempts: number,
  opts: { retryDelayMs: number; retryCapMs: number; retryJitter: number; random: () => number },
): number {
  const doubled = opts.retryDelayMs * 2 ** Math.max(0, attempts - 1);
  return Math.round(Math.min(opts.retryCapMs, doubled * (1 + opts.retryJitter * opts.random())));
}

/** retryDelay is the wait before the next try: the backoff, or later if the destination asked (Retry-After), capped. */
export function retryDelay(
  attempts: number,
  options: FailOptions,
  opts: { retryDelayMs: number; retryCapMs: number; retryJitter: number; random: () => number },
): number {
  const wait = backoff(attempts, opts);
  const asked = options.retryAfterMs;
  if (asked === undefined) return wait;
  if (!Number.isFinite(asked) || asked < 0)
    throw new TypeError(`fail: expected retryAfterMs to be a number of ms >= 0, got ${asked}`);
  return Math.max(wait, Math.min(opts.retryCapMs, Math.round(asked)));
}

function asBuffer(bytes: Uint8Array): Buffer {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
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
    destination: (row.destination ?? DEFAULTS.destination) as string,
    route: Number(row.route ?? 0),
    headers: typeof row.headers === "string" ? (JSON.parse(row.headers) as Headers) : null,
    traceparent: (row.traceparent ?? null) as string | null,
  };
}

/** searchPageLimit checks a page size given to search(), or gives DEFAULTS.searchLimit. */
export function searchPageLimit(limit: number | undefined): number {
  if (limit === undefined) return DEFAULTS.searchLimit;
  if (!Number.isInteger(limit) || limit < 1)
    throw new TypeError(`search: expected limit to be a whole number >= 1, got ${limit}`);
  return limit;
}

/** bulkBatchSize checks a batch size given to a bulk command, or gives DEFAULTS.bulkBatch. */
export function bulkBatchSize(batch: number | undefined): number {
  if (batch === undefined) return DEFAULTS.bulkBatch;
  if (!Number.isInteger(batch) || batch < 1)
    throw new TypeError(`bulk: expected batch to be a whole number >= 1, got ${batch}`);
  return batch;
}

/**
 * orderOf checks an incoming delivery's order key and works out the event time its key is ordered by:
 * the provider's event time, else its signed send time, else when it arrived.
 */
export function orderOf(
  delivery: Incoming,
  receivedAt: number | null,
): { key: string | null; eventTime: number | null; strict: boolean } {
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
  const eventTime = delivery.eventTime ?? (key === null ? null : (delivery.providerTime ?? receivedAt));
  return { key, eventTime: eventTime === null ? null : Math.round(eventTime), strict: delivery.strictOrder === true };
}

/** Failure is the outcome of fail(): retried later, or set aside. */
export type Failure = { status: "received"; retryAt: number } | { status: "failed" };
/**

 * Inbox is the store's contract, named after a delivery's life: store, claim, extend, finish, fail,
 * release, retry; then find, list and status to look, and flush and close. SqliteInbox (sqlite.ts) and
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
  /** finish marks a delivery done with the handler's writes in one transaction; false if the lease was lost. */
  finish(lease: Lease, writes?: readonly LocalWrite[]): Promise<boolean>;
  /** fail records a failed try: retried after a backoff, or set aside; undefined if the lease was lost. */
  fail(lease: Lease, error: string, options?: FailOptions): Promise<Failure | undefined>;
  /**
   * attemptErrors returns each failed try of one delivery that fail() recorded, oldest first; only tries
   * since receivedAt, so an ID that purge forgot and that arrived again does not show its old tries.
   */
  attemptErrors(d: { source: string; id: string; receivedAt: number; destination?: string }): Promise<AttemptError[]>;
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
  /** page returns up to limit deliveries in key order (source, id, route) after the cursor, every field, for copying. */
  page(after: { source: string; id: string; route?: number } | undefined, limit: number): Promise<Delivery[]>;
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
  /** onWake calls back when new deliveries may be due (PostgreSQL's NOTIFY), a hint beside polling; returns how to stop. */
  onWake(listener: () => void): () => void;
  /** gauges counts deliveries per source and status and finds the oldest wait, for /metrics. */
  gauges(): Promise<Gauges>;
  /** ready is true if a delivery could be committed now, else the reason why not (for /readyz). */
  ready(): Promise<true | string>;
  /** pause holds a destination's deliveries (none is claimed, none spends an attempt) until resume; false if it already was. */
  pause(destination: string, reason?: string): Promise<boolean>;
  /** resume lets a paused destination's deliveries go again; false if it was not paused. */
  resume(destination: string): Promise<boolean>;
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
}

/** checkOptions throws a TypeError for an InboxOptions field of the wrong kind; both backends take the same. */
export function checkOptions(options: InboxOptions): void {
  for (const [key, value] of Object.entries(options)) {
    if (key === "now" || key === "random" || key === "onCommit") {
      if (typeof value !== "function")
        throw new TypeError(`Inbox: expected ${key} to be a function, got ${typeof value}`);
    } else if (key === "backgroundCheckpoints" || key === "syncOffLoop" || key === "listen") {
      if (typeof value !== "boolean")
        throw new TypeError(`Inbox: expected ${key} to be a boolean, got ${typeof value}`);
    } else if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
      throw new TypeError(`Inbox: expected ${key} to be a number >= 0, got ${String(value)}`);
    }
  }
}

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

/** AttemptError is one failed try of a delivery: which attempt it was, what the handler said, and when. */
export interface AttemptError {
  attempt: number;
  error: string;
  failedAt: number;
  /** The destination the try went to. */
  destination?: string;
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
  totals: { source: string; n: number }[],
  open: { source: string; status: Status; n: number }[],
  oldestWaitingMs: number | null,
  conflicts: Summary["conflicts"],
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
  if (!Number.isInteger(bucketMs) || bucketMs < 1)
    throw new TypeError(`histogram: expected bucketMs >= 1, got ${bucketMs}`);
  const n = Math.ceil((until - since) / bucketMs);
  if (!Number.isInteger(since) || !(n >= 0 && n <= 10_000)) {
    throw new TypeError(
      `histogram: expected since <= until and at most 10,000 buckets, got since ${since}, until ${until}, bucketMs ${bucketMs}`,
    );
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

// HELD_KEYS finds the held keys; both backends run it, `?` being the time now.
const HELD_KEYS = `
  SELECT * FROM (
    SELECT k.source, k.destination, k.order_key, k.head_id, k.due, d.status, d.attempts, d.error,
           (SELECT count(*) FROM deliveries w WHERE w.source = k.source AND w.destination = k.destination AND w.order_key = k.order_key
                                                AND w.status = 'received' AND w.id <> k.head_id) AS waiting
    FROM order_keys k JOIN deliveries d ON d.source = k.source AND d.id = k.head_id AND d.destination = k.destination
    WHERE (d.status = 'received' AND d.attempts > 0 AND k.due > ?) OR d.status = 'failed') h
  WHERE waiting > 0 ORDER BY coalesce(due, 0), source, order_key, destination`;

// ORDERING_COUNTS counts what OrderingStatus counts, on both backends.
const ORDERING_COUNTS = `
  SELECT (SELECT count(*) FROM order_keys WHERE head_id IS NOT NULL) AS keys,
         (SELECT count(*) FROM deliveries WHERE newer_id IS NOT NULL) AS stale,
         (SELECT count(*) FROM deliveries d WHERE d.status = 'failed' AND d.order_key IS NOT NULL AND NOT EXISTS
            (SELECT 1 FROM order_keys k WHERE k.source = d.source AND k.destination = d.destination AND k.order_key = d.order_key
                                          AND k.head_id = d.id)) AS passed`;

/** orderingStatus builds OrderingStatus from the rows of HELD_KEYS and ORDERING_COUNTS. */
export function orderingStatus(counts: Record<string, unknown>, held: Record<string, unknown>[]): OrderingStatus {
  return {
    keys: Number(counts.keys),
    stale: Number(counts.stale),
    passed: Number(counts.passed),
    heldKeys: held.length,
    held: held.slice(0, 100).map((r) => ({
      source: r.source as string,
      destination: r.destination as string,
      orderKey: r.order_key as string,
      headId: r.head_id as string,
      reason: r.status === "failed" ? "failed" : "retry",
      retryAt: r.status === "failed" ? null : Number(r.due),
      attempts: Number(r.attempts),
      error: r.error as string | null,
      waiting: Number(r.waiting),
    })),
  };
}

/** ORDERING_SQL holds the status queries of ordering, which the PostgreSQL backend runs too. */
export const ORDERING_SQL = { held: HELD_KEYS, counts: ORDERING_COUNTS } as const;

/**
 * sqlstate names the kind of a database error for logs and metrics: PostgreSQL's SQLSTATE class (its first
 * two characters: 40 a deadlock or serialization failure, 08 a lost connection, 53 too many connections,
 * 57 a cancelled statement or a server shutting down), else a socket's code (ECONNRESET), else SQLite's
 * (SQLITE_BUSY), else "other". It looks through the causes a batch's error wraps.
 */
export function sqlstate(error: unknown): string {
  for (let e = error, depth = 0; e instanceof Object && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    // A socket's code first: EPIPE and EPERM are five characters too, and no SQLSTATE class starts with E.
    if (typeof code === "string" && /^E[A-Z]+$/.test(code)) return code;
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) return code.slice(0, 2);
    const errcode = (e as { errcode?: unknown }).errcode;
    if (typeof errcode === "number") return SQLITE_CODES[errcode & 0xff] ?? `SQLITE_${errcode & 0xff}`;
  }
  return "other";
}
const SQLITE_CODES: Record<number, string> = {
  5: "SQLITE_BUSY",
  6: "SQLITE_LOCKED",
  10: "SQLITE_IOERR",
  13: "SQLITE_FULL",
};

/**
 * passing says a database error is one that goes away on its own, so the write that met it may simply
 * go again: a deadlock or serialization failure (40), a lost connection (08, or one of SOCKET_CODES), too
 * many connections (53), a lock timeout (55P03), a cancelled statement or a server shutting down or
 * restarting (57), a system error on the server (58), a primary turned standby (25006), SQLite's lock held
 * too long (SQLITE_BUSY, SQLITE_LOCKED). A local I/O error (EIO, ENOSPC, EROFS) is not one: a failed
 * fdatasync, say, sticks until a restart.
 */
export function passing(error: unknown): boolean {
  for (let e = error, depth = 0; e instanceof Object && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (
      typeof code === "string" &&
      (/^(08|40|53|57|58)/.test(code) || code === "55P03" || code === "25006" || SOCKET_CODES.has(code))
    )
      return true;
    const errcode = (e as { errcode?: unknown }).errcode;
    if (typeof errcode === "number" && [5, 6].includes(errcode & 0xff)) return true;
    if (
      code === undefined &&
      errcode === undefined &&
      /connection terminated|not queryable|timeout exceeded when trying to connect/i.test(
        ((e as { message?: unknown }).message as string) ?? "",
      )
    )
      return true;
  }
  return false;
}

// The socket errors of a connection lost or not yet back (a restart, a failover, a network blip).
const SOCKET_CODES = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EHOSTDOWN",
  "ENETDOWN",
  "ENOTFOUND",
]);

/**
 * again runs one of a worker's writes and, while it fails with a passing error, runs it again after a
 * backoff (minMs, doubling up to maxMs) for up to forMs; onError hears of every passing failure first. A lease is
 * fenced by its token, so a done mark, a failure or a release written late still says only what this
 * worker did. Any other error, or one that outlasts forMs, is thrown. With `first`, the first try was the
 * caller's, and failed with that error.
 */
export function again<T>(
  write: () => Promise<T>,
  o: { forMs: number; minMs: number; maxMs: number; onError: (error: unknown, tries: number) => void },
  first?: { error: unknown },
): Promise<T> {
  const since = performance.now();
  const retry = async (failed: unknown): Promise<T> => {
    let error = failed;
    for (let wait = Math.max(1, o.minMs), tries = 1; ; wait = Math.min(o.maxMs, 2 * wait), tries++) {
      if (!passing(error)) throw error;
      o.onError(error, tries);
      if (performance.now() - since >= o.forMs) throw error;
      await new Promise((resolve) => setTimeout(resolve, wait));
      try {
        return await write();
      } catch (next) {
        error = next;
      }
    }
  };
  // A caller that made the first try itself (so that a write that succeeds settles in the very turn it
  // would without again()) hands its error over as `first`.
  return first ? retry(first.error) : write().then(undefined, retry);
}
