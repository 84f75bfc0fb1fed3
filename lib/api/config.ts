// lib/api/config.ts: the JSON API's operations on the configuration in the database (docs/config.md): read the
// version in force, apply a whole document, or change one source or destination, which reads the version in
// force, changes that part and applies it expecting that version, so a change made meanwhile is a 409 and is
// never lost; and try a route's filter on a delivery. Every change is lib/config/config.ts's plan() and apply(),
// the checks and the one transaction of `inbox.ts config apply`. Mounted by lib/api/api.ts.

import type { z } from "zod";
import { apply, auditTarget, plan, type Plan, trustIn, versionChanges } from "../config/config.ts";
import { holders as partHolders, inTheClear, partsOf } from "../config/trust.ts";
import { message } from "../log.ts";
import { type Arrival, compileFilter, filterInput } from "../routing/filter.ts";
import { destinationNames } from "../rows.ts";
import type { StoredConfig } from "../store.ts";
import { type Answer, type ApiContext, ApiError, type Call, type Operate } from "./call.ts";
import type {
  ConfigBody,
  ConfigVersionPath,
  ConfigVersionQuery,
  ConfigVersionsQuery,
  DestinationPath,
  FilterTestBody,
  PartBody,
  RemoveDestinationQuery,
  RemoveSourceQuery,
  SourcePath,
} from "./schemas.ts";

/**
 * IN_THE_CLEAR is what getConfig shows in place of a secret written in the clear (not as env:NAME or
 * secret:NAME) in the operator's file, so a read key never reads one; a change that sends it back is refused,
 * rather than stored as the secret.
 */
export const IN_THE_CLEAR = "[a secret written in the clear: write it as env:NAME or secret:NAME]";

type Doc = Record<string, unknown>;
const isObject = (v: unknown): v is Doc => typeof v === "object" && v !== null && !Array.isArray(v);

// masked is a copy of a document with every secret written in the clear replaced by IN_THE_CLEAR.
function masked(doc: Doc): Doc {
  const copy = JSON.parse(JSON.stringify(doc)) as Doc;
  for (const part of partsOf(copy).values())
    for (const settings of partHolders(part))
      for (const [key, value] of Object.entries(settings)) if (inTheClear(key, value)) settings[key] = IN_THE_CLEAR;
  return copy;
}

/**
 * configuredDestinations lists the destinations the page's --sources file names and those the configuration
 * in force names: listed, and may be paused, before a worker has used them.
 */
export async function configuredDestinations(ctx: ApiContext): Promise<string[]> {
  const stored = await ctx.inbox.readConfig();
  return [...new Set([...ctx.destinations, ...(stored ? destinationNames(stored.document) : [])])];
}

// Options of one change: the version it expects, whether waiting rows may be let go, whether to only look.
interface ChangeOptions {
  expected?: number;
  cancelWaiting?: boolean;
  dryRun: boolean;
  /** What the audit log names as changed: `configuration`, `source="st"`. */
  what: string;
}

// stale is the refusal of a change that expected another version than the one in force.
function stale(current: number, expected: number): ApiError {
  return new ApiError(
    409,
    `version ${current} is in force, not ${expected}: the configuration changed since it was read; nothing changed, read it again and retry`,
  );
}

// change checks a whole document against the version in force, then applies it in one transaction, unless a
// dry run or no change. Nothing changes when it refuses: a document that fails the checks (400), another
// version than the one expected (409), or a removal that rows wait for without cancelWaiting (409).
async function change(ctx: ApiContext, call: Call, document: Doc, o: ChangeOptions): Promise<Answer> {
  if (JSON.stringify(document).includes(IN_THE_CLEAR))
    throw new ApiError(
      400,
      `the document holds ${JSON.stringify(IN_THE_CLEAR)} where getConfig hid a secret: write that secret as env:NAME; nothing changed`,
    );
  let p: Plan;
  try {
    p = await plan(ctx.inbox, `${JSON.stringify(document, null, 2)}\n`, ctx.host, ctx.base, { way: "api" });
  } catch (error) {
    // loadConfig's and the transforms' mistakes are TypeErrors of one line; anything else is the server's.
    if (error instanceof TypeError) throw new ApiError(400, `${message(error)}; nothing changed`);
    throw error;
  }
  const previous = p.current?.version ?? 0;
  if (o.expected !== undefined && o.expected !== previous) throw stale(previous, o.expected);
  const letGo = p.removed.filter((r) => r.now || o.cancelWaiting);
  const body = {
    applied: false,
    dryRun: o.dryRun,
    version: previous,
    previousVersion: previous,
    changes: p.changes,
    removed: letGo.map(({ destination, waiting }) => ({ destination, waiting })),
    cancelled: 0,
  };
  if (o.dryRun) return { body };
  const cancelling = o.cancelWaiting === true && letGo.some((r) => r.waiting > 0);
  if (p.changes.length === 0 && !cancelling) {
    // Asked for, and nothing to change: kept as asked, with nothing else to keep it beside.
    const target = `${o.what}: no change from version ${previous}`;
    await ctx.inbox.addAudit({ ...call.audit(target), at: ctx.now(), count: 0 });
    return { body, change: { target, count: 0 } };
  }
  const target = auditTarget(p, o.what);
  const result = await apply(ctx.inbox, p, {
    actor: call.who,
    cancelWaiting: o.cancelWaiting === true,
    audit: call.audit(target),
  });
  if (!result.applied) {
    if (result.reason === "version")
      throw new ApiError(
        409,
        `another configuration (version ${result.version}) was applied meanwhile; nothing changed, read it again and retry`,
      );
    const list = result.waiting.map((w) => `${w.n} for ${w.destination}`).join(", ");
    throw new ApiError(
      409,
      `deliveries still wait for a destination this removes (${list}); nothing changed. Let them finish, or ask again with cancelWaiting to set them aside as failed`,
      { waiting: result.waiting },
    );
  }
  const cancelled = result.cancelled > 0 ? ` cancelled=${result.cancelled}` : "";
  return {
    body: { ...body, applied: true, version: result.version, cancelled: result.cancelled },
    change: { target: `${target}${cancelled}`, count: p.changes.length },
  };
}

// edit changes one part of the document in force and applies it expecting the version read, so that a change
// applied in between is refused rather than overwritten.
async function edit(
  ctx: ApiContext,
  call: Call,
  o: ChangeOptions,
  alter: (doc: Doc, version: number) => void,
): Promise<Answer> {
  const stored = await ctx.inbox.readConfig();
  const read = stored?.version ?? 0;
  if (o.expected !== undefined && o.expected !== read) throw stale(read, o.expected);
  const doc = stored ? (JSON.parse(stored.document) as Doc) : {};
  alter(doc, read);
  return change(ctx, call, doc, { ...o, expected: read });
}

// destinationsOf is a document's $destinations, made if it has none.
function destinationsOf(doc: Doc): Doc {
  if (!isObject(doc.$destinations)) doc.$destinations = {};
  return doc.$destinations as Doc;
}

// put sets a part of a document as JSON.parse would have: an own key, even one named __proto__.
function put(doc: Doc, name: string, settings: unknown): void {
  Object.defineProperty(doc, name, { value: settings, enumerable: true, writable: true, configurable: true });
}

// routedFrom lists the sources whose routes name a destination.
function routedFrom(doc: Doc, destination: string): string[] {
  return Object.entries(doc)
    .filter(([key, settings]) => !key.startsWith("$") && isObject(settings) && Array.isArray(settings.routes))
    .filter(([, settings]) =>
      ((settings as Doc).routes as unknown[]).some((r) => (isObject(r) ? r.to : r) === destination),
    )
    .map(([key]) => key);
}

const inForce = (version: number) => (version === 0 ? "none applied" : `version ${version}`);

// shown is a stored version as the API answers it: its document masked, each part's trust named, its
// transforms by their SHA-256 alone (not their code).
function shown(stored: StoredConfig) {
  const parsed = JSON.parse(stored.document) as Doc;
  return {
    version: stored.version,
    actor: stored.actor,
    appliedAt: stored.appliedAt,
    way: stored.way,
    trust: trustIn(parsed, stored),
    document: masked(parsed),
    transforms: Object.fromEntries(Object.entries(stored.transforms).map(([m, t]) => [m, t.sha256])),
  };
}

/** CONFIG_HANDLERS are the configuration's operations, which lib/api/api.ts answers beside its own. */
export const CONFIG_HANDLERS = {
  getConfig: async (ctx) => {
    const stored = await ctx.inbox.readConfig();
    if (!stored)
      return {
        body: { version: 0, actor: null, appliedAt: null, way: null, trust: {}, document: null, transforms: {} },
      };
    return { body: shown(stored) };
  },
  listConfigVersions: async (ctx, call) => {
    const { limit, after } = call.query as z.output<typeof ConfigVersionsQuery>;
    // One more than the page: the last one's change is told from the version before it.
    const versions = await ctx.inbox.configVersions({
      limit: limit + 1,
      ...(after === undefined ? {} : { before: after }),
    });
    const page = versions.slice(0, limit);
    const items = page.map((v, i) => ({
      version: v.version,
      actor: v.actor,
      appliedAt: v.appliedAt,
      way: v.way,
      changes: versionChanges(versions[i + 1], v),
    }));
    // A version numbered 1 has nothing before it; a page that ends sooner is the last.
    const last = page.at(-1);
    return { body: { items, next: versions.length > limit && last ? last.version : null } };
  },
  getConfigVersion: async (ctx, call) => {
    const { version } = call.params as z.output<typeof ConfigVersionPath>;
    const { against } = call.query as z.output<typeof ConfigVersionQuery>;
    const [stored] = await ctx.inbox.configVersions({ before: version + 1, limit: 1 });
    if (!stored || stored.version !== version) throw new ApiError(404, `no configuration version ${version}`);
    const base = against ?? version - 1;
    const [other] = base === 0 ? [] : await ctx.inbox.configVersions({ before: base + 1, limit: 1 });
    if (base !== 0 && other?.version !== base) throw new ApiError(404, `no configuration version ${base}`);
    return { body: { ...shown(stored), against: base, changes: versionChanges(other, stored) } };
  },
  applyConfig: async (ctx, call) => {
    const { document, expectedVersion, cancelWaiting, dryRun } = call.body as z.output<typeof ConfigBody>;
    return change(ctx, call, document, {
      ...(expectedVersion === undefined ? {} : { expected: expectedVersion }),
      cancelWaiting,
      dryRun,
      what: "configuration",
    });
  },
  putSource: async (ctx, call) => {
    const { name } = call.params as z.output<typeof SourcePath>;
    const { settings, expectedVersion, dryRun } = call.body as z.output<typeof PartBody>;
    const o = { dryRun, what: `source=${JSON.stringify(name)}` };
    return edit(ctx, call, expectedVersion === undefined ? o : { ...o, expected: expectedVersion }, (doc) => {
      put(doc, name, settings);
    });
  },
  deleteSource: async (ctx, call) => {
    const { name } = call.params as z.output<typeof SourcePath>;
    const { expectedVersion, dryRun } = call.query as z.output<typeof RemoveSourceQuery>;
    const o = { dryRun: dryRun === true, what: `remove source=${JSON.stringify(name)}` };
    return edit(ctx, call, expectedVersion === undefined ? o : { ...o, expected: expectedVersion }, (doc, v) => {
      if (!Object.hasOwn(doc, name))
        throw new ApiError(404, `no source ${name} in the configuration in force (${inForce(v)})`);
      delete doc[name];
    });
  },
  putDestination: async (ctx, call) => {
    const { name } = call.params as z.output<typeof DestinationPath>;
    const { settings, expectedVersion, dryRun } = call.body as z.output<typeof PartBody>;
    const o = { dryRun, what: `destination=${JSON.stringify(name)}` };
    return edit(ctx, call, expectedVersion === undefined ? o : { ...o, expected: expectedVersion }, (doc) => {
      put(destinationsOf(doc), name, settings);
    });
  },
  deleteDestination: async (ctx, call) => {
    const { name } = call.params as z.output<typeof DestinationPath>;
    const { expectedVersion, dryRun, cancelWaiting } = call.query as z.output<typeof RemoveDestinationQuery>;
    const o = {
      dryRun: dryRun === true,
      cancelWaiting: cancelWaiting === true,
      what: `remove destination=${JSON.stringify(name)}`,
    };
    return edit(ctx, call, expectedVersion === undefined ? o : { ...o, expected: expectedVersion }, (doc, v) => {
      const destinations = destinationsOf(doc);
      if (!Object.hasOwn(destinations, name))
        throw new ApiError(
          404,
          `no destination ${name} under $destinations in the configuration in force (${inForce(v)})`,
        );
      // A route to it would fail the checks anyway; this says what to do about it.
      const from = routedFrom(doc, name);
      if (from.length > 0)
        throw new ApiError(
          409,
          `${from.map((s) => `source ${s}`).join(", ")} still ${from.length === 1 ? "routes" : "route"} to ${name}: change ${from.length === 1 ? "its" : "their"} routes first (PUT /api/v1/sources/{name}); nothing changed`,
        );
      delete destinations[name];
    });
  },
  testFilter: async (ctx, call) => {
    const b = call.body as z.output<typeof FilterTestBody>;
    let filter: ReturnType<typeof compileFilter>;
    try {
      filter = compileFilter(b.filter, "body");
    } catch (error) {
      if (error instanceof TypeError) throw new ApiError(400, message(error));
      throw error;
    }
    const notes: string[] = [];
    let arrival: Arrival;
    if (b.delivery) {
      const { source, id } = b.delivery;
      const [d] = await ctx.inbox.find(id, source);
      if (!d) throw new ApiError(404, `no delivery ${source}/${id}`);
      if (d.purgedAt !== null && filter.reads.has("body"))
        notes.push("its body was purged, so a body filter sees none");
      if (!d.headers && filter.reads.has("headers"))
        notes.push(
          "its headers were not kept (no route read or forwarded them when it was stored), so a header filter sees none",
        );
      // The stored delivery as a filter saw it when it came in, as lib/forwarding/preview.ts builds it.
      arrival = {
        source: d.source,
        eventType: d.eventType,
        body: d.body,
        headers: d.headers ?? {},
        url: `/${d.source}`,
      };
    } else {
      const source = b.source ?? "";
      arrival = {
        source,
        eventType: b.type ?? null,
        body: Buffer.from(JSON.stringify(b.body)),
        headers: Object.fromEntries(
          Object.entries(b.headers ?? {}).map(([k, v]) => [k.toLowerCase(), Array.isArray(v) ? v : [v]]),
        ),
        url: `/${source}`,
      };
    }
    if (filter.reads.has("query")) notes.push("the request's query is not stored, so a query filter sees none here");
    return { body: { matches: filter(filterInput(arrival)), notes } };
  },
} satisfies Record<string, Operate>;
