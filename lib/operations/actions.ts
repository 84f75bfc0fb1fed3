// lib/operations/actions.ts: what an operator does to the queue, through the Inbox contract alone: retry or replay
// one delivery, or every one a filter or an error group matches; pause or resume a destination; send one a
// test delivery. Each is a
// plain function of the inbox and input already checked, so a page's form and an API's JSON can share it.
// Beside them, the two reads they rest on: the destinations' states and the failures grouped.

import { randomBytes } from "node:crypto";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { destinationNames, sha256 } from "../rows.ts";
import { type Audit, type Delivery, type DestinationState, type Filter, type Inbox, TEST_SOURCE } from "../store.ts";
import { HttpError } from "./input.ts";

/** Target is one delivery, and optionally one destination's row of it. */
export interface Target {
  source: string;
  id: string;
  destination?: string;
}

/** targetLabel names a target in the audit log, its values JSON-quoted so one action stays one line. */
export function targetLabel(t: Target): string {
  return `delivery=${JSON.stringify(`${t.source}/${t.id}`)}${t.destination === undefined ? "" : ` destination=${JSON.stringify(t.destination)}`}`;
}

/** Announce tells the operator's URL of a pause or resume; true, or why not. */
export type Announce = (event: {
  type: "destination.paused" | "destination.resumed";
  data: Record<string, unknown>;
}) => Promise<true | string>;

/** Changed is what a pause or resume did: whether the state changed, and whether the operator's URL was told. */
export interface Changed {
  changed: boolean;
  /** true when told, the reason when not, undefined when nothing changed or no URL is configured. */
  told?: true | string;
}

/**
 * normaliseError turns an error message into the key its failures are grouped by: numbers, hex and
 * UUIDs, quoted values and e-mail addresses become placeholders, so "timeout after 5012 ms for evt_81"
 * and "timeout after 4990 ms for evt_7" are one issue.
 */
export function normaliseError(error: string | null): string {
  if (error === null || error.trim() === "") return "(no error recorded)";
  return error
    .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi, "<uuid>")
    .replace(/\S+@\S+\.\w+/g, "<email>")
    .replace(/"[^"]*"|'[^']*'/g, "<value>")
    .replace(/\b(?=[0-9a-f]*\d)[0-9a-f]{12,}\b/gi, "<hex>")
    .replace(/\d+(\.\d+)?/g, "<n>")
    .replace(/\s+/g, " ")
    .trim()
    .slice(0, 300);
}

/**
 * failureGroups counts failed deliveries by their exact error in the database, then merges the counts
 * under each error's normalised key, redacted first: the failed rows are read once, through their partial index.
 */
export async function failureGroups(
  inbox: Inbox,
  redact: (text: string) => string,
): Promise<{ key: string; count: number; latest: number; sample: string | null }[]> {
  const rows = await inbox.failuresByError();
  const groups = new Map<string, { key: string; count: number; latest: number; sample: string | null }>();
  for (const r of rows) {
    const error = r.error === null ? null : redact(r.error);
    const key = normaliseError(error);
    const g = groups.get(key) ?? { key, count: 0, latest: 0, sample: error };
    g.count += r.count;
    g.latest = Math.max(g.latest, r.latest);
    groups.set(key, g);
  }
  return [...groups.values()].sort((a, b) => b.count - a.count || b.latest - a.latest);
}

/** destinationStates is the store's list, with the configured destinations it does not know yet, idle. */
export async function destinationStates(inbox: Inbox, configured: readonly string[]): Promise<DestinationState[]> {
  const known = await inbox.destinations();
  const missing = configured.filter((name) => !known.some((d) => d.name === name));
  return [
    ...known,
    ...missing.map(
      (name): DestinationState => ({
        name,
        state: "closed",
        pausedReason: null,
        retryAt: null,
        probing: false,
        waiting: 0,
        processing: 0,
        failed: 0,
        failuresInRow: 0,
        failureRate: null,
        lastError: null,
        lastErrorAt: null,
      }),
    ),
  ].sort((a, b) => (a.name < b.name ? -1 : 1));
}

/**
 * retryOne queues a delivery's failed row for one destination again, or every failed row of it when none is
 * named; audit, where given, is written in the same transaction (as for every action here).
 */
export async function retryOne(
  inbox: Inbox,
  target: Target,
  batch: number = DEFAULTS.bulkBatch,
  audit?: Audit,
): Promise<number> {
  const { source, id, destination } = target;
  return destination === undefined
    ? inbox.retry({ source, id }, audit)
    : inbox.retryMatching({ source, id, destination, status: "failed" }, { batch, ...(audit ? { audit } : {}) });
}

/** replayOne puts a done delivery through again: one destination's row, or every done row of it. */
export async function replayOne(
  inbox: Inbox,
  target: Target,
  batch: number = DEFAULTS.bulkBatch,
  audit?: Audit,
): Promise<number> {
  const { source, id, destination } = target;
  const { replayed } = await inbox.replayMatching(
    { source, id, ...(destination === undefined ? {} : { destination }) },
    { batch, ...(audit ? { audit } : {}) },
  );
  return replayed;
}

/** retryOrReplayAll retries the failed deliveries a filter matches, or replays the done ones; returns how many. */
export async function retryOrReplayAll(
  inbox: Inbox,
  kind: "retry" | "replay",
  filter: Filter,
  batch: number = DEFAULTS.bulkBatch,
  audit?: Audit,
): Promise<number> {
  const options = { batch, ...(audit ? { audit } : {}) };
  return kind === "retry"
    ? inbox.retryMatching(filter, options)
    : (await inbox.replayMatching(filter, options)).replayed;
}

/**
 * retryGroup retries the failed deliveries whose redacted error normalises to key. The group is a
 * normalised key, which no filter can say: it walks the failures a page at a time and retries those whose
 * error normalises to it. A page's retries join one group commit.
 */
export async function retryGroup(
  inbox: Inbox,
  key: string,
  redact: (text: string) => string,
  batch: number = DEFAULTS.bulkBatch,
  audit?: Audit,
): Promise<number> {
  let n = 0;
  let tried = 0;
  let after: Delivery | undefined;
  for (;;) {
    const page = await inbox.search({ status: "failed" }, { after, limit: batch, bodies: false });
    const mine = page.filter((d) => normaliseError(d.error === null ? null : redact(d.error)) === key);
    // Every retry adds its count to the one entry (Audit's change), each in its own retry's transaction.
    tried += mine.length;
    n += (await Promise.all(mine.map((d) => inbox.retry({ source: d.source, id: d.id }, audit)))).reduce(
      (a, b) => a + b,
      0,
    );
    if (page.length < batch) break;
    after = page.at(-1);
  }
  // A group found empty changed nothing, and is kept as asked all the same.
  if (audit && tried === 0) await inbox.addAudit({ at: audit.at ?? Date.now(), ...audit, count: 0 });
  return n;
}

// Only a destination the inbox knows may be paused: a typo would otherwise make a paused one of its own.
async function known(inbox: Inbox, destination: string, configured: readonly string[]): Promise<void> {
  if (!(await destinationStates(inbox, configured)).some((d) => d.name === destination))
    throw new HttpError(404, `no destination ${destination}`);
}

// tell announces a change where a URL is configured; a failure is said, not thrown.
async function tell(
  announce: Announce | undefined,
  event: Parameters<Announce>[0],
): Promise<true | string | undefined> {
  if (!announce) return undefined;
  return announce(event).catch((error: unknown) => message(error));
}

/**
 * pauseDestination holds a known destination's deliveries, and tells the operator's URL when that changed
 * something; a destination neither the store nor the sources file knows is a 404.
 */
export async function pauseDestination(
  inbox: Inbox,
  input: { destination: string; reason: string; by: string },
  options: { configured?: readonly string[]; announce?: Announce; audit?: Audit } = {},
): Promise<Changed> {
  const { destination, reason, by } = input;
  await known(inbox, destination, options.configured ?? []);
  const changed = await inbox.pause(destination, reason, options.audit);
  if (!changed) return { changed };
  const told = await tell(options.announce, { type: "destination.paused", data: { destination, reason, by } });
  return told === undefined ? { changed } : { changed, told };
}

/** resumeDestination lets a known destination's deliveries go again, and tells the operator's URL when it was paused. */
export async function resumeDestination(
  inbox: Inbox,
  input: { destination: string; by: string },
  options: { configured?: readonly string[]; announce?: Announce; audit?: Audit } = {},
): Promise<Changed> {
  const { destination, by } = input;
  await known(inbox, destination, options.configured ?? []);
  const changed = await inbox.resume(destination, options.audit);
  if (!changed) return { changed };
  const told = await tell(options.announce, { type: "destination.resumed", data: { destination, by } });
  return told === undefined ? { changed } : { changed, told };
}

/** TEST_EVENT is a test delivery's event type, so a destination's code can tell one from a provider's event. */
export const TEST_EVENT = "inbox.test";

/** SentTest is the test delivery sendTest() stored: find it with inbox.find(id, source). */
export interface SentTest {
  source: string;
  id: string;
  eventType: string;
  destination: string;
}

/**
 * sendTest stores a test delivery for one destination of the configuration in force, and for it alone: a
 * JSON body {type, id, data} (data as given, else a line saying what it is), event type TEST_EVENT, origin
 * "test", under TEST_SOURCE with an ID of its own (test_, the time, random hex). No route or filter is asked:
 * the destination's worker forwards it as any other, its transform run, signed. Another destination is a 404.
 * It is written whole, as a row is restored, so that its audit entry (audit, given the delivery it names)
 * goes in the same transaction.
 */
export async function sendTest(
  inbox: Inbox,
  input: { destination: string; data?: unknown; now: number; audit?: (target: string) => Audit },
): Promise<SentTest> {
  const { destination, now } = input;
  const stored = await inbox.readConfig();
  if (!stored || !destinationNames(stored.document).includes(destination))
    throw new HttpError(
      404,
      `no destination ${destination} under $destinations in the configuration in force (${stored ? `version ${stored.version}` : "none applied"}); the handler takes no test delivery`,
    );
  const id = `test_${now}_${randomBytes(4).toString("hex")}`;
  const data = input.data ?? { message: "A test delivery from webhook-inbox.", destination };
  const body = Buffer.from(JSON.stringify({ type: TEST_EVENT, id, data }));
  const sent = { source: TEST_SOURCE, id, eventType: TEST_EVENT, destination };
  const added = await inbox.restore(
    [
      {
        source: TEST_SOURCE,
        id,
        body,
        bodySha256: sha256(body),
        contentType: "application/json",
        eventType: TEST_EVENT,
        providerTime: null,
        receivedAt: now,
        status: "received",
        attempts: 0,
        availableAt: now,
        leasedUntil: null,
        error: null,
        conflicts: 0,
        finishedAt: null,
        replays: 0,
        purgedAt: null,
        orderKey: null,
        eventTime: null,
        newerId: null,
        destination,
        route: 0,
        headers: null,
        traceparent: null,
        origin: "test",
      },
    ],
    input.audit?.(targetLabel(sent)),
  );
  // Random bytes make the ID new; a duplicate would mean the clock and 32 random bits both repeated.
  if (added !== 1) throw new Error(`send test ${TEST_SOURCE}/${id}: it was there already`);
  return sent;
}
