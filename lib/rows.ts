// rows.ts: what both backends make of the rows they read, and the hash they write: a deliveries row as a
// Delivery (toDelivery()), the counts as status()'s, a Summary, Gauges, OrderingStatus or histogram buckets, the
// body's sha256, and whether a copy conflicts. Ground floor: it knows the columns, not the backend that returned them.

import { hash, randomUUID } from "node:crypto";
import { isDeepStrictEqual } from "node:util";
import { DEFAULTS } from "./defaults.ts";
import {
  STATUSES,
  type ApiKey,
  type Attempt,
  type Audit,
  type AuditEntry,
  type StoredSecret,
  type Remembered,
  type Bucket,
  type Delivery,
  type Gauges,
  type Headers,
  type InboxStatus,
  type KeptAttempt,
  type OrderingStatus,
  type Origin,
  type Status,
  type Summary,
  type StoredConfig,
} from "./store.ts";

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

/**
 * conflicts says whether a copy of a stored delivery is a conflict (a different body under the same ID) or a
 * duplicate. The kept row is its route 0: its hash, its origin, and its body where it came from reconcile.
 * Such a body is the API's JSON as the inbox wrote it, never the bytes the provider posts (Stripe's webhook
 * is pretty-printed), so the webhook that comes after it is judged by its parsed JSON; the bytes kept stay.
 */
export function conflicts(
  kept: { sha256: string; origin: string; body: Uint8Array | null } | undefined,
  digest: string,
  body: Uint8Array,
): boolean {
  if (kept === undefined || kept.sha256 === digest) return false;
  if (kept.origin !== "reconcile" || kept.body === null || kept.body.byteLength === 0) return true;
  const parse = (bytes: Uint8Array) => {
    try {
      return { json: JSON.parse(asBuffer(bytes).toString("utf8")) as unknown };
    } catch {
      return undefined;
    }
  };
  const [a, b] = [parse(kept.body), parse(body)];
  return a === undefined || b === undefined || !isDeepStrictEqual(a.json, b.json);
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
    origin: (row.origin ?? "webhook") as Origin,
  };
}

/**
 * countsBySource folds status()'s counts by source, event type and status (rows of source, event_type,
 * status, n) into the totals by status and each source's; both backends use it.
 */
export function countsBySource(rows: readonly Record<string, unknown>[]): Pick<InboxStatus, "counts" | "sources"> {
  const zero = () => Object.fromEntries(STATUSES.map((s) => [s, 0])) as Record<Status, number>;
  const counts = zero();
  const bySource = new Map<string, InboxStatus["sources"][number]>();
  for (const r of rows) {
    counts[r.status as Status] += r.n as number;
    const key = JSON.stringify([r.source, r.event_type]);
    let entry = bySource.get(key);
    if (!entry) {
      entry = { source: r.source as string, eventType: r.event_type as string | null, counts: zero() };
      bySource.set(key, entry);
    }
    entry.counts[r.status as Status] = r.n as number;
  }
  return { counts, sources: [...bySource.values()] };
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

/** toApiKey reads an api_keys row, from either backend (PostgreSQL's bigints come as text). */
export function toApiKey(row: Record<string, unknown>): ApiKey {
  return {
    id: String(row.id),
    name: String(row.name),
    // Anything but the scopes this code knows is read: a row never grants more than it says.
    scope: row.scope === "write" || row.scope === "admin" ? row.scope : "read",
    hash: String(row.hash),
    createdAt: Number(row.created_at),
    revokedAt: row.revoked_at === null || row.revoked_at === undefined ? null : Number(row.revoked_at),
  };
}

/** toRemembered reads an idempotency row. */
export function toRemembered(row: Record<string, unknown>): Remembered {
  return {
    key: String(row.key),
    requestHash: String(row.request_hash),
    status: Number(row.status),
    body: String(row.body),
    at: Number(row.at),
  };
}

/** toAuditEntry reads an audit row. */
export function toAuditEntry(row: Record<string, unknown>): AuditEntry {
  return {
    seq: Number(row.seq),
    at: Number(row.at),
    who: String(row.who),
    operation: String(row.operation),
    target: String(row.target),
    count: Number(row.count),
  };
}

/** REMOVED begins the pause reason of a destination that a configuration took out: bringing it back lifts only that pause. */
export const REMOVED = "removed from the configuration";

/** destinationNames lists the destinations a configuration document names (its $destinations' keys). */
export function destinationNames(document: string): string[] {
  const parsed = JSON.parse(document) as { $destinations?: Record<string, unknown> };
  return Object.keys(parsed.$destinations ?? {});
}

/** toConfig builds a StoredConfig from a row of inbox_config. */
export function toConfig(row: Record<string, unknown>): StoredConfig {
  return {
    version: Number(row.version),
    document: row.document as string,
    transforms: JSON.parse(row.transforms as string) as StoredConfig["transforms"],
    actor: row.actor as string,
    appliedAt: Number(row.applied_at),
    way: row.way === "api" ? "api" : "operator",
    trust: JSON.parse((row.trust as string | undefined) ?? "{}") as StoredConfig["trust"],
  };
}

/** toStoredSecret reads a secrets row: the value as sealed, never opened here. */
export function toStoredSecret(row: Record<string, unknown>): StoredSecret {
  return {
    name: String(row.name),
    sealed: String(row.sealed),
    setAt: Number(row.set_at),
    setBy: String(row.set_by),
  };
}

/**
 * changeOf is an audited change's key, made at its first write and kept on the Audit: a redone transaction
 * writes the same entry again, and a later batch adds its count to that entry rather than starting one.
 */
export function changeOf(audit: Audit): string {
  audit.change ??= randomUUID();
  return audit.change;
}

/** toAttempt reads an attempts row, as either backend returns it, into an Attempt. */
export function toAttempt(row: Record<string, unknown>): Attempt {
  const n = (v: unknown) => (v === null || v === undefined ? null : Number(v));
  return {
    attempt: Number(row.attempt),
    destination: row.destination as string,
    startedAt: Number(row.started_at),
    ms: n(row.ms),
    status: n(row.status),
    error: (row.error as string | null) ?? null,
    headers: row.headers === null || row.headers === undefined ? null : JSON.parse(row.headers as string),
    body: (row.body as string | null) ?? null,
  };
}

/** toKeptAttempt reads an attempts row with its delivery's received_at and body_sha256, as either backend returns it. */
export function toKeptAttempt(row: Record<string, unknown>): KeptAttempt {
  return {
    ...toAttempt(row),
    source: row.source as string,
    id: row.id as string,
    seq: Number(row.seq),
    receivedAt: Number(row.received_at),
    bodySha256: row.body_sha256 as string,
  };
}
