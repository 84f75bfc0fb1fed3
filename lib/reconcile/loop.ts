// reconcile/loop.ts: the loop every provider shares. A provider (stripe.ts, github.ts) lists what it sent
// since a time, page by page; for each event the inbox lacks under (source, id), the loop stores it as the
// receiver would (routes, filters, order), marked origin "reconcile", or asks the provider to send it again.
// Each API call goes through call(): rate limits and outages are waited out, on an injected sleep.

import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { orderOfRequest, type OrderRule } from "../order.ts";
import { filterInput } from "../routing/filter.ts";
import { chooseRoutes, type Route } from "../routing/routes.ts";
import type { Headers, Inbox, Stored } from "../store.ts";

/**
 * Reconciled is what the loop reads of a source (providers.ts's Source has it): its name, and its routes
 * and order rule, so that a fetched event is routed and ordered as the receiver would have.
 */
export interface Reconciled {
  name: string;
  routes?: readonly Route[];
  order?: OrderRule;
}

/** Found is one event a provider lists: its id (the one its webhook carries), and how to get or resend it. */
export interface Found {
  id: string;
  eventType: string | null;
  /** The provider's own time for it, in ms. */
  providerTime: number | null;
  /** load gets the event as it is to be stored: the API's JSON, and the webhook's headers where the API keeps them. */
  load?: () => Promise<{ body: Buffer; headers?: Headers; contentType: string }>;
  /** redeliver asks the provider to send the webhook again, signed. */
  redeliver?: () => Promise<void>;
  /** Asked for already (a redelivery is listed), so asking again would only send it twice. */
  asked?: boolean;
}

/** Caller runs one API call with its back-off: what was asked, for messages, and the call. */
export type Caller = <T>(what: string, fn: () => Promise<T>) => Promise<T>;

/** Lister lists a provider's events since a time (ms), a page at a time, through call. */
export type Lister = (since: number, call: Caller) => AsyncIterable<Found[]>;

/** Verdict is how a provider reads a failed call: wait this long and try again, or stop the run. */
export type Verdict = { retryAfterMs?: number; fatal?: false } | { fatal: true };

/** ReconcileFailed is a run stopped by its provider: a bad credential, or failures past the tries allowed. */
export class ReconcileFailed extends Error {}

/** Tally is what one run saw: listed, already in the inbox, fetched and stored, redeliveries asked for. */
export interface Tally {
  seen: number;
  already: number;
  fetched: number;
  redelivered: number;
  /** In a dry run: what is missing, by id; else empty. */
  missing: string[];
}

/** ReconcileOptions is what a run needs besides the source: the inbox, the time, and what it may do. */
export interface ReconcileOptions {
  inbox: Inbox;
  /** Wall time in ms, for since. */
  now: () => number;
  /** Waits ms: the process's timers, or a test's clock. */
  sleep: (ms: number) => Promise<void>;
  /** List what is missing and store nothing. */
  dryRun?: boolean;
  /** How far back to look, in ms. @default DEFAULTS.reconcileSinceMs */
  sinceMs?: number;
  /** Called after each event, for progress. */
  onEvent?: (tally: Tally) => void;
  /** Where each wait is told. */
  log?: (line: string) => void;
  /** @default DEFAULTS.reconcileTries */
  tries?: number;
  /** @default DEFAULTS.reconcileBackoffMs */
  backoffMs?: number;
  /** @default DEFAULTS.reconcileMaxWaitMs */
  maxWaitMs?: number;
  /** Redact the provider's messages before they are shown (lib/redact.ts). */
  redact?: (text: string) => string;
  /** Aborted to stop after the event in flight (SIGINT, SIGTERM): the run returns what it did so far. */
  signal?: AbortSignal;
}

// The socket's codes of a provider that cannot be reached at all: no network, a name no DNS knows, nothing
// listening where apiBase points.
const UNREACHABLE = new Set(["ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH"]);

/**
 * unreachable finds, in a failed call's error and the errors it wraps (the stripe SDK's detail, fetch's
 * cause), the socket's own words when the provider could not be reached at all: "getaddrinfo ENOTFOUND
 * api.stripe.com", where the SDK says only "An error occurred with our connection to Stripe.".
 */
export function unreachable(error: unknown): string | undefined {
  let e = error as { code?: unknown; message?: unknown; detail?: unknown; cause?: unknown } | undefined;
  for (let depth = 0; e && typeof e === "object" && depth < 5; depth++) {
    if (typeof e.code === "string" && UNREACHABLE.has(e.code))
      return typeof e.message === "string" && e.message.includes(e.code) ? e.message : e.code;
    e = (e.detail ?? e.cause) as typeof e;
  }
  return undefined;
}

/**
 * caller builds the Caller of one run: a call that fails is read by judge, waited out (its Retry-After,
 * else a doubling back-off) and tried again, up to tries in all; a fatal one, or one past its tries, stops
 * the run with a ReconcileFailed of one line. A provider not reached at all by the run's first call stops
 * it at once, saying so: a host with no network, or a wrong apiBase, is not an outage to wait out (six
 * tries took a dry run 63 s to say nothing more).
 */
export function caller(source: string, judge: (error: unknown) => Verdict, options: ReconcileOptions): Caller {
  const tries = options.tries ?? DEFAULTS.reconcileTries;
  const first = options.backoffMs ?? DEFAULTS.reconcileBackoffMs;
  const most = options.maxWaitMs ?? DEFAULTS.reconcileMaxWaitMs;
  const redact = options.redact ?? ((t: string) => t);
  let reached = false;
  return async (what, fn) => {
    for (let attempt = 1; ; attempt++) {
      try {
        const answer = await fn();
        reached = true;
        return answer;
      } catch (error) {
        const cannot = reached ? undefined : unreachable(error);
        if (cannot !== undefined)
          throw new ReconcileFailed(
            `reconcile ${source}: cannot reach the provider's API: ${redact(cannot)} (no network here, or a wrong apiBase); nothing fetched`,
          );
        const verdict = judge(error);
        const why = redact(message(error)).split("\n")[0];
        if (verdict.fatal) throw new ReconcileFailed(`reconcile ${source}: ${what}: ${why}`);
        if (attempt >= tries)
          throw new ReconcileFailed(`reconcile ${source}: ${what}: gave up after ${tries} tries: ${why}`);
        const wait = verdict.retryAfterMs ?? first * 2 ** (attempt - 1);
        if (wait > most)
          throw new ReconcileFailed(
            `reconcile ${source}: ${what}: the provider asks to wait ${Math.ceil(wait / 1000)} s: ${why}`,
          );
        options.log?.(
          `reconcile ${source}: ${what}: ${why}; trying again in ${Math.ceil(wait / 1000)} s (try ${attempt + 1} of ${tries})`,
        );
        await options.sleep(wait);
        if (options.signal?.aborted)
          throw new ReconcileFailed(`reconcile ${source}: ${what}: stopped while waiting: ${why}`);
      }
    }
  };
}

/**
 * reconcile runs once for one source: it lists what the provider sent since sinceMs ago and, for each id
 * the inbox lacks, stores it (origin "reconcile") or asks for it again. What it stored stays stored if a
 * later call stops the run; the store's (source, id) key makes a second run, or another host's, a no-op.
 */
export async function reconcile(
  source: Reconciled,
  list: Lister,
  judge: (error: unknown) => Verdict,
  options: ReconcileOptions,
): Promise<Tally> {
  const tally: Tally = { seen: 0, already: 0, fetched: 0, redelivered: 0, missing: [] };
  const call = caller(source.name, judge, options);
  const since = options.now() - (options.sinceMs ?? DEFAULTS.reconcileSinceMs);
  const done = new Set<string>();
  for await (const page of list(since, call)) {
    if (options.signal?.aborted) break;
    // GitHub lists each try of a delivery (a redelivery shares its guid): one event is seen once.
    const fresh = page.filter((found) => !done.has(found.id) && done.add(found.id));
    // A page's lookups, and its stores, go to the store together, so its committer writes them in a few
    // commits rather than one each (one at a time, 5,000 Stripe events took 11 s on SQLite).
    const there = await Promise.all(fresh.map(async (f) => (await options.inbox.find(f.id, source.name)).length > 0));
    const stores: Promise<void>[] = [];
    for (const [i, found] of fresh.entries()) {
      if (options.signal?.aborted) break;
      tally.seen++;
      if (there[i]) tally.already++;
      else if (options.dryRun) tally.missing.push(found.id);
      else if (found.load) {
        const got = await call(`get ${found.id}`, found.load);
        // Another run, or the webhook itself, may have stored it since the look: then it was already there.
        stores.push(
          store(options.inbox, source, found, got).then(
            (stored) => void (stored === "stored" ? tally.fetched++ : tally.already++),
          ),
        );
      } else if (found.redeliver && !found.asked) {
        await call(`redeliver ${found.id}`, found.redeliver);
        tally.redelivered++;
      }
      options.onEvent?.(tally);
    }
    await Promise.all(stores);
    options.onEvent?.(tally);
  }
  return tally;
}

// store keeps a fetched event as the receiver keeps a webhook: its routes and filters chosen now, its order
// key read from it, marked as fetched. A webhook that won the race meanwhile makes this a duplicate.
async function store(
  inbox: Inbox,
  source: Reconciled,
  found: Found,
  got: { body: Buffer; headers?: Headers; contentType: string },
): Promise<Stored> {
  const headers: Headers = { "content-type": [got.contentType], ...(got.headers ?? {}) };
  const chosen = source.routes
    ? chooseRoutes(
        source.routes,
        found.eventType,
        filterInput({
          source: source.name,
          eventType: found.eventType,
          body: got.body,
          headers,
          url: `/${source.name}`,
        }),
      )
    : undefined;
  return inbox.store({
    source: source.name,
    id: found.id,
    body: got.body,
    contentType: got.contentType,
    eventType: found.eventType,
    providerTime: found.providerTime,
    origin: "reconcile",
    ...orderOfRequest(source.order, headers, got.body),
    ...(chosen ? { destinations: chosen.destinations } : {}),
    ...(chosen?.keepHeaders ? { headers } : {}),
  });
}

/** summaryLine is a run's one line: seen, already there, fetched, redeliveries asked (and missing, in a dry run). */
export function summaryLine(source: string, t: Tally, dryRun = false): string {
  return dryRun
    ? `reconcile ${source}: ${t.seen} seen, ${t.already} already there, ${t.missing.length} missing (dry run: nothing stored or asked)`
    : `reconcile ${source}: ${t.seen} seen, ${t.already} already there, ${t.fetched} fetched, ${t.redelivered} redeliveries asked`;
}
