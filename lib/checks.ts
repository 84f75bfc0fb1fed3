// checks.ts: misuse of the contract, told the same way on both backends: each checks what a caller
// passed (a delivery's routes and order, purge's ages, a page or batch size, replay's destination,
// InboxOptions) and throws a TypeError that says what it expected and what came, before anything is written.

import { DEFAULTS } from "./defaults.ts";
import { DESTINATION_NAME, type Incoming, type InboxOptions, type PurgeOptions } from "./store.ts";

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

/** replayDestination checks the destination that replay's `to` names. */
export function replayDestination(to: string): void {
  if (!DESTINATION_NAME.test(to))
    throw new TypeError(`replay: expected --to to name a destination, got ${JSON.stringify(to)}`);
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
