// forwarding/preview.ts: what a stored delivery would become under the sources file as it is now, sending nothing:
// which routes its filters choose, and for each destination the exact request (headers and body, its
// transform run). `inbox.ts preview ID [--to DESTINATION]` prints it; see docs/forwarding.md.
//   npx tsx inbox.ts preview evt_1 --sources sources.json --to billing

import { parseBrokerDestination } from "../brokers.ts";
import { DEFAULTS } from "../defaults.ts";
import { filterInput } from "../routing/filter.ts";
import { forwardHeaders } from "./forward.ts";
import { message } from "../log.ts";
import { loadDestinations, parseRoutes, refusal, type Route } from "../routing/routes.ts";
import { type Delivery, type Lease, NO_DESTINATION } from "../store.ts";
import type { Sandbox } from "./sandbox.ts";
import { transformInput, Transforms, type Shaped } from "./transform.ts";

/** PreviewRoute is one of the source's routes and whether it takes the delivery now. */
export interface PreviewRoute {
  to: string;
  chosen: boolean;
  /** Why not: its types, or its filter. */
  why?: string;
  /** Whether the delivery has a row for it: chosen when it was stored, which is what a retry or replay sends. */
  stored: boolean;
}

/** PreviewRequest is what one destination would get: the request, or why nothing would be sent. */
export interface PreviewRequest {
  destination: string;
  kind: "http" | "broker" | "handler";
  /** Where an HTTP forward goes. */
  url?: string;
  /** The transform returned null: this destination is skipped for this delivery. */
  skipped?: boolean;
  /** The transform failed: the try would fail with this error. */
  error?: string;
  headers?: Record<string, string>;
  body?: Buffer;
}

/** Preview is a delivery as the sources file would route and send it now. */
export interface Preview {
  routes: PreviewRoute[];
  requests: PreviewRequest[];
  /** What the preview could not see, said once each (headers not kept, the query not stored). */
  notes: string[];
}

/** routeLine is one route of a preview for people: chosen now or not, and where its rows say otherwise. */
export function routeLine(r: PreviewRoute): string {
  const now = r.chosen ? "chosen" : `not chosen (${r.why})`;
  if (r.chosen === r.stored) return `${r.to}: ${now}`;
  return `${r.to}: ${now}, ${r.stored ? "but it has a row, chosen when stored" : "but it has no row: not chosen when stored"}`;
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * preview works out what rows (one delivery's, from inbox.find) would become under config, the parsed
 * sources file: routes chosen by its types and filters, and each destination's request, the transform run
 * in its process (modules relative to base). to names one destination instead of the routes' choice. Secrets
 * are not read: the signature and the destination's own headers are shown as placeholders.
 */
export async function preview(
  rows: readonly Delivery[],
  config: unknown,
  options: {
    base: string;
    to?: string;
    now?: number;
    env?: Readonly<Record<string, string | undefined>>;
    /** The sandbox code transforms run in, shared by the previews of one host (admin.ts). @default one of its own, stopped when the preview returns */
    sandbox?: Sandbox;
    /** Says why a module's file here is not the one applied (config.ts's transformDrift), so it is not run. @default none checked */
    drift?: (module: string) => string | undefined;
  },
): Promise<Preview> {
  const d = rows[0]!;
  if (d.purgedAt !== null) throw new TypeError(`${d.source}/${d.id}: its body was purged, so there is nothing to send`);
  if (!isObject(config) || !isObject(config[d.source]))
    throw new TypeError(`source ${JSON.stringify(d.source)} is not in the sources file`);
  const settings = config[d.source] as Record<string, unknown>;
  const routes: Route[] = parseRoutes(settings.routes, config, `source ${JSON.stringify(d.source)}`);
  const destinations = loadDestinations(config, options.env ?? {}, {
    resolve: false,
    brokerCheck: (name, s, where) => void parseBrokerDestination(name, s, where, {}, false),
  }).destinations;
  const notes: string[] = [];
  if (routes.some((r) => r.filter?.reads.has("headers")) && !d.headers)
    notes.push(
      "its headers were not kept (it was stored before a filter read them), so a header filter sees none here",
    );
  if (routes.some((r) => r.filter?.reads.has("query")))
    notes.push("the request's query is not stored, so a query filter sees none here");
  // The stored delivery as a filter saw it when it came in, as near as what is stored allows.
  const input = filterInput({
    source: d.source,
    eventType: d.eventType,
    body: d.body,
    headers: d.headers ?? {},
    url: `/${d.source}`,
  });
  const kept = new Set(rows.map((x) => x.destination));
  const listed: PreviewRoute[] = routes.map((r) => {
    const why = refusal(r, d.eventType, input);
    const stored = kept.has(r.to);
    return why === undefined ? { to: r.to, chosen: true, stored } : { to: r.to, chosen: false, why, stored };
  });
  // What is sent is what the rows say, fixed when the delivery was stored: the worker, a retry and a replay
  // send to those, whatever the sources file says now. So those are the requests shown.
  const differ = listed.filter((r) => r.chosen !== r.stored).map((r) => r.to);
  if (differ.length > 0)
    notes.push(
      `the routes now choose differently for ${differ.join(", ")} than when it was stored; its rows were fixed then, and a retry or replay sends to them (replay --to adds a destination)`,
    );

  const targets =
    options.to !== undefined ? [options.to] : rows.map((x) => x.destination).filter((x) => x !== NO_DESTINATION);
  const transforms = new Transforms(options.base, options.sandbox ? { shared: options.sandbox } : {});
  const requests: PreviewRequest[] = [];
  try {
    for (const name of targets) {
      if (name === DEFAULTS.destination) {
        requests.push({ destination: name, kind: "handler" });
        continue;
      }
      const destination = destinations.get(name);
      if (!destination)
        throw new TypeError(
          `no destination ${JSON.stringify(name)} in the sources file (it has ${[...destinations.keys()].join(", ") || "none"})`,
        );
      const row = rows.find((x) => x.destination === name) ?? d;
      const lease: Lease = {
        ...row,
        destination: name,
        // A delivery that is done or failed is sent again only by a retry or a replay, which start at 1.
        attempts:
          row.destination === name && (row.status === "received" || row.status === "processing") ? row.attempts + 1 : 1,
        token: "",
        leasedUntil: 0,
      };
      const setting = routes.find((r) => r.to === name)?.transform ?? destination.transform;
      let shaped: Shaped | null | undefined;
      if (setting) {
        try {
          // A module file changed since it was applied is not what a worker runs: it is not run here either.
          const drift = setting.code === undefined ? options.drift?.(setting.module) : undefined;
          if (drift) throw new Error(drift);
          shaped = await transforms.get(setting).run(transformInput(lease, name), setting.timeoutMs);
        } catch (error) {
          requests.push({ destination: name, kind: destination.kind, error: message(error) });
          continue;
        }
        if (shaped === null) {
          requests.push({ destination: name, kind: destination.kind, skipped: true });
          continue;
        }
      }
      const sent = shaped ? { ...lease, body: shaped.body, contentType: shaped.contentType } : lease;
      if (destination.kind === "broker") {
        const changes = Object.fromEntries(
          Object.entries(shaped?.headers ?? {}).filter((e): e is [string, string] => e[1] !== null),
        );
        requests.push({
          destination: name,
          kind: "broker",
          headers: { "content-type": sent.contentType ?? "application/octet-stream", ...changes },
          body: sent.body,
        });
        continue;
      }
      // Secrets are not read here: the signature is made when the forward is sent, over these bytes.
      const placeholder = (id: string, _body: Buffer, timestampS: number) => ({
        "webhook-id": id,
        "webhook-timestamp": String(timestampS),
        "webhook-signature": "v1,(made when sent, over this body)",
      });
      const all = forwardHeaders(destination, sent, options.now ?? Date.now(), placeholder, shaped?.headers);
      for (const own of Object.keys(destination.headers))
        if (own in all && shaped?.headers[own] === undefined) all[own] = "(from the sources file; not shown)";
      requests.push({ destination: name, kind: "http", url: destination.url.href, headers: all, body: sent.body });
    }
  } finally {
    await transforms.close();
  }
  return { routes: listed, requests, notes };
}

/** PreviewBusy is a preview refused because as many as a host runs at once are running: try again in retryAfterS. */
export class PreviewBusy extends Error {
  readonly retryAfterS = 1;
}

/**
 * previewGate bounds the previews that run transforms at once on one host (admin.ts), so a read key cannot
 * spend its CPU: past limit, run throws PreviewBusy at once rather than wait.
 */
export function previewGate(limit: number = DEFAULTS.previewsAtOnce): <T>(run: () => Promise<T>) => Promise<T> {
  let running = 0;
  return async (run) => {
    if (running >= limit)
      throw new PreviewBusy(
        `${limit} previews are running on this host, the most it runs at once; try again in a second`,
      );
    running++;
    try {
      return await run();
    } finally {
      running--;
    }
  };
}
