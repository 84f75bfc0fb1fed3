// admin.ts: the operator page. See what failed, find a delivery, retry or replay it, one or all that match
// a filter; see each destination's state and pause or resume it, in a browser. Its own listener, never the
// receiver's port: loopback unless given a token.
//   npx tsx admin.ts --db inbox.db [--port 8001] [--host 127.0.0.1] [--admin-token env:ADMIN_TOKEN] [--read-only] [--sources sources.json]
// Plain server-rendered HTML and forms; admin.js (below, served from /admin.js) only refreshes the overview.

import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { isIP } from "node:net";
import { dirname, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { connect } from "./inbox.ts";
import { DEFAULTS } from "./lib/defaults.ts";
import { bodyForPeople } from "./lib/format.ts";
import { announce } from "./lib/forwarding/forward.ts";
import { preview, type Preview } from "./lib/forwarding/preview.ts";
import { readSourcesFile } from "./lib/providers.ts";
import { redactor, secretsOf, type Secret } from "./lib/redact.ts";
import { loadDestinations, type Forwarding } from "./lib/routing/routes.ts";
import { lineLog, message } from "./lib/log.ts";
import {
  DESTINATION_NAME,
  STATUSES,
  type Delivery,
  type DestinationState,
  type Filter,
  type Inbox,
  type Status,
} from "./lib/store.ts";

/** AdminOptions configures createAdmin; every number has a default in DEFAULTS. */
export interface AdminOptions {
  inbox: Inbox;
  /** The token a person exchanges for a session cookie. Without one, only loopback may listen (see listenAdmin). */
  token?: string;
  /** Show everything, refuse every action with 403. @default false */
  readOnly?: boolean;
  /** Where the one audit line per action goes. @default console.error */
  audit?: (line: string) => void;
  /** The clock, in ms since the epoch. @default Date.now */
  now?: () => number;
  /** @default DEFAULTS.adminPageSize */
  pageSize?: number;
  /** @default DEFAULTS.bulkBatch */
  batchSize?: number;
  /** @default DEFAULTS.adminRefreshMs */
  refreshMs?: number;
  /** Tells the operator's URL of a pause or resume made here, as the CLI does; true, or why not. @default none */
  announce?: (event: {
    type: "destination.paused" | "destination.resumed";
    data: Record<string, unknown>;
  }) => Promise<true | string>;
  /**
   * Secrets never shown, whatever holds them (redact.ts secretsOf() of the sources file), should a row
   * stored before the worker redacted its errors hold one. Each is replaced by its marker, such as
   * [redacted: app bearer]. @default none
   */
  hide?: readonly Secret[];
  /** Destinations the sources file names: listed, and may be paused, before a worker has used them. @default none */
  destinations?: readonly string[];
  /** What a stored delivery would become under the sources file now (lib/forwarding/preview.ts), for the delivery's page. @default none */
  preview?: (rows: readonly Delivery[]) => Promise<Preview>;
}

/** Admin is the operator page's server, not yet listening. */
export interface Admin {
  server: Server;
}

/** isLoopback tells whether an address (or host name) stays on this machine. */
export function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "");
  if (bare === "localhost") return true;
  if (isIP(bare) === 4) return bare.startsWith("127.");
  return bare === "::1" || bare.toLowerCase() === "::ffff:127.0.0.1";
}

/**
 * listenAdmin starts the page on host:port and resolves with its URL. It refuses, with a TypeError, any
 * address beyond loopback unless a token guards the page: the receiver is for providers, this is not.
 */
export async function listenAdmin(
  admin: Admin,
  options: { host: string; port: number; token?: string },
): Promise<string> {
  if (!isLoopback(options.host) && !options.token) {
    throw new TypeError(
      `admin: expected --admin-token to listen on ${options.host}, a non-loopback address; got none (or use --host 127.0.0.1)`,
    );
  }
  await new Promise<void>((resolve, reject) => {
    admin.server.once("error", reject);
    admin.server.listen(options.port, options.host, () => resolve());
  });
  const address = admin.server.address();
  const port = typeof address === "object" && address ? address.port : options.port;
  return `http://${options.host.includes(":") ? `[${options.host}]` : options.host}:${port}`;
}

/** escape makes any text safe inside HTML text and quoted attributes; everything shown passes through it. */
export function escape(value: unknown): string {
  return String(value ?? "").replace(/[&<>"'`]/g, (c) => `&#${c.charCodeAt(0)};`);
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

// ---- Requests, sessions and the checks every action passes ------------------------------------------

const COOKIE = "inbox_admin";
const SESSION_MS = 12 * 3_600_000;
const MAX_SESSIONS = 1_000;
const MAX_FORM_BYTES = 64 * 1024;

interface Session {
  id: string;
  csrf: string;
  who: string;
  expires: number;
}

class HttpError extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

// One strict policy for every answer: scripts and styles only from this server, nothing may frame it.
const SECURITY_HEADERS: Record<string, string> = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "same-origin",
  "cache-control": "no-store",
};

function digest(text: string): Buffer {
  return createHash("sha256").update(text).digest();
}

function cookies(req: IncomingMessage): Map<string, string> {
  const jar = new Map<string, string>();
  for (const part of (req.headers.cookie ?? "").split(";")) {
    const eq = part.indexOf("=");
    if (eq > 0) jar.set(part.slice(0, eq).trim(), part.slice(eq + 1).trim());
  }
  return jar;
}

async function readForm(req: IncomingMessage): Promise<URLSearchParams> {
  const type = req.headers["content-type"] ?? "";
  if (!type.startsWith("application/x-www-form-urlencoded"))
    throw new HttpError(415, "expected a form (application/x-www-form-urlencoded)");
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_FORM_BYTES) throw new HttpError(413, "form too large");
    chunks.push(chunk as Buffer);
  }
  return new URLSearchParams(Buffer.concat(chunks).toString("utf8"));
}

// ---- Filters in the URL ---------------------------------------------------------------------------

/** The filter fields as they appear in a URL, so a link to a list can be shared. */
const FILTER_FIELDS = ["status", "source", "destination", "type", "since", "until", "id", "q", "error"] as const;

// parseTime reads a time field: an ISO date (UTC when it names no zone), or a number of ms since the epoch.
function parseTime(value: string, field: string): number {
  if (/^\d+$/.test(value)) return Number(value);
  const ms = Date.parse(/[zZ]|[+-]\d\d:?\d\d$/.test(value) ? value : `${value}Z`);
  if (Number.isNaN(ms))
    throw new HttpError(400, `${field}: expected a date such as 2026-12-02T19:00 (UTC), got ${value}`);
  return ms;
}

/** filterFrom reads a Filter from query or form fields; an empty field means no constraint. */
export function filterFrom(params: URLSearchParams): Filter {
  const get = (name: string) => params.get(name)?.trim() || undefined;
  const filter: Filter = {};
  const status = get("status");
  if (status !== undefined) {
    if (!(STATUSES as readonly string[]).includes(status))
      throw new HttpError(400, `status: expected one of ${STATUSES.join(", ")}, got ${status}`);
    filter.status = status as Status;
  }
  const [source, type, id, q, error, since, until, destination] = [
    "source",
    "type",
    "id",
    "q",
    "error",
    "since",
    "until",
    "destination",
  ].map(get);
  if (source !== undefined) filter.source = source;
  if (destination !== undefined) {
    if (!DESTINATION_NAME.test(destination))
      throw new HttpError(400, `destination: expected a destination's name, got ${destination}`);
    filter.destination = destination;
  }
  if (type !== undefined) filter.type = type;
  if (id !== undefined) filter.id = id;
  if (q !== undefined) filter.bodyContains = q;
  if (error !== undefined) filter.errorMatch = error;
  if (since !== undefined) filter.since = parseTime(since, "since");
  if (until !== undefined) filter.until = parseTime(until, "until");
  return filter;
}

function filterQuery(params: URLSearchParams, extra: Record<string, string> = {}): string {
  const out = new URLSearchParams();
  for (const name of FILTER_FIELDS) {
    const value = params.get(name)?.trim();
    if (value) out.set(name, value);
  }
  for (const [k, v] of Object.entries(extra)) out.set(k, v);
  return out.toString();
}

// A cursor names a row, route included: a delivery's rows (one per destination) may straddle two pages.
interface Cursor {
  receivedAt: number;
  source: string;
  id: string;
  route?: number;
}

function encodeCursor(d: Delivery): string {
  return Buffer.from(JSON.stringify([d.receivedAt, d.source, d.id, d.route])).toString("base64url");
}

function decodeCursor(text: string | null): Cursor | undefined {
  if (!text) return undefined;
  try {
    const [receivedAt, source, id, route] = JSON.parse(Buffer.from(text, "base64url").toString("utf8")) as unknown[];
    // A cursor from before destinations has no route: the store starts such a page past the whole delivery.
    if (
      typeof receivedAt === "number" &&
      typeof source === "string" &&
      typeof id === "string" &&
      (route === undefined || Number.isInteger(route))
    ) {
      return { receivedAt, source, id, ...(route === undefined ? {} : { route: route as number }) };
    }
  } catch {
    // Falls through to the 400 below: a cursor is only ever one this page wrote.
  }
  throw new HttpError(400, "after: not a cursor this page wrote");
}

// ---- Showing things ----------------------------------------------------------------------------------

function iso(ms: number | null): string {
  return ms === null
    ? "–"
    : new Date(ms)
        .toISOString()
        .replace("T", " ")
        .replace(/\.\d+Z$/, "Z");
}

function age(ms: number): string {
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return s < 172800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86400)}d`;
}

function deliveryHref(d: { source: string; id: string }): string {
  return `/delivery?${new URLSearchParams({ source: d.source, id: d.id })}`;
}

/** bodyViews renders a body three ways: pretty JSON where it parses, the raw text where it is UTF-8, always base64. */
function bodyViews(body: Buffer): { json?: string; text?: string; base64: string } {
  const text = new TextDecoder("utf-8", { fatal: false }).decode(body);
  const utf8 = Buffer.from(text, "utf8").equals(body);
  let json: string | undefined;
  if (utf8) {
    try {
      json = JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      // Not JSON: the raw text is the view.
    }
  }
  return { json, text: utf8 ? text : undefined, base64: body.toString("base64") };
}

function statusBadge(status: string): string {
  return `<span class="badge ${escape(status)}">${escape(status)}</span>`;
}

/** destinationLabel names a row's destination: a delivery no route chose has none. */
function destinationLabel(name: string): string {
  return name === "" ? "(none)" : name;
}

/** stateDetail says what a destination's state means now: when an open one probes, why a paused one waits. */
function stateDetail(d: DestinationState): string {
  if (d.state === "paused") return d.pausedReason ?? "";
  if (d.state === "open") return d.probing ? "probing" : `probe at ${iso(d.retryAt).slice(11)}`;
  return "";
}

/** chart draws received, done and failed per bucket as three polylines in a small SVG, no script needed. */
function chart(buckets: { start: number; received: number; done: number; failed: number }[]): string {
  const width = 600;
  const height = 140;
  const pad = 24;
  const max = Math.max(1, ...buckets.flatMap((b) => [b.received, b.done, b.failed]));
  const x = (i: number) => pad + (i * (width - 2 * pad)) / Math.max(1, buckets.length - 1);
  const y = (n: number) => height - pad - (n * (height - 2 * pad)) / max;
  const line = (key: "received" | "done" | "failed") =>
    `<polyline class="${key}" fill="none" stroke-width="2" points="${buckets.map((b, i) => `${x(i).toFixed(1)},${y(b[key]).toFixed(1)}`).join(" ")}"/>`;
  const first = buckets[0]?.start ?? 0;
  const last = buckets.at(-1)?.start ?? 0;
  return `<svg class="chart" viewBox="0 0 ${width} ${height}" role="img" aria-label="received, done and failed per minute over the last hour">
  <line class="axis" x1="${pad}" y1="${height - pad}" x2="${width - pad}" y2="${height - pad}"/>
  <text class="tick" x="${pad}" y="${height - 6}">${escape(iso(first).slice(11, 16))}</text>
  <text class="tick" x="${width - pad}" y="${height - 6}" text-anchor="end">${escape(iso(last).slice(11, 16))} UTC</text>
  <text class="tick" x="${pad}" y="14">${max}/min</text>
  ${line("received")}${line("done")}${line("failed")}
</svg>
<p class="legend"><span class="key received"></span>received <span class="key done"></span>done <span class="key failed"></span>failed, per minute</p>`;
}

// ---- The server -------------------------------------------------------------------------------------

/**
 * createAdmin builds the operator page over an open inbox; start it with listenAdmin. Reads need a
 * session (the token exchanged at /login for an HttpOnly, SameSite=Strict cookie) unless no token is
 * set, which listenAdmin allows on loopback only. Every action also needs the session's CSRF token, a
 * same-origin Origin when the browser sends one, and writable mode; each writes one audit line.
 */
export function createAdmin(options: AdminOptions): Admin {
  const { inbox } = options;
  const now = options.now ?? Date.now;
  const audit = options.audit ?? ((line: string) => console.error(line));
  const pageSize = options.pageSize ?? DEFAULTS.adminPageSize;
  const batchSize = options.batchSize ?? DEFAULTS.bulkBatch;
  const readOnly = options.readOnly ?? false;
  const refreshMs = options.refreshMs ?? DEFAULTS.adminRefreshMs;
  const tokenDigest = options.token ? digest(options.token) : undefined;
  const secret = randomBytes(32);
  const sessions = new Map<string, Session>();
  // The messages this page issued after an action, by a random key in the redirect's ?flash=: a link can
  // only name one, never bring its own words, and each is shown once, to the session it was made for.
  const flashes = new Map<string, { session: string; text: string }>();
  const takeFlash = (s: Session, key: string | null): string | null => {
    const found = key === null ? undefined : flashes.get(key);
    if (!found || found.session !== s.id) return null;
    flashes.delete(key!);
    return found.text;
  };
  // redact hides the sources file's secrets in a text from the store (an error, a reason) before it is
  // grouped, shortened or put in a link, where send() could no longer find them.
  const { redact } = redactor(options.hide ?? []);
  const csrfFor = (id: string) => createHmac("sha256", secret).update(id).digest("base64url");
  // Without a token there is one implicit session, for whoever reaches loopback.
  const local: Session = { id: "local", csrf: csrfFor("local"), who: "local", expires: Infinity };

  const session = (req: IncomingMessage): Session | undefined => {
    if (!tokenDigest) return local;
    const bearer = /^Bearer (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    if (bearer !== undefined && timingSafeEqual(digest(bearer), tokenDigest)) {
      return { id: "bearer", csrf: "", who: "bearer", expires: Infinity };
    }
    const id = cookies(req).get(COOKIE);
    const found = id === undefined ? undefined : sessions.get(id);
    if (!found) return undefined;
    if (found.expires <= now()) {
      sessions.delete(found.id);
      return undefined;
    }
    return found;
  };

  const page = (s: Session, title: string, body: string, flash?: string | null) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escape(title)} · webhook inbox</title><link rel="stylesheet" href="/admin.css"><script src="/admin.js" defer></script></head>
<body><header><a class="brand" href="/">webhook inbox</a><nav><a href="/">Overview</a><a href="/deliveries">Deliveries</a><a href="/destinations">Destinations</a><a href="/failures">Failures</a></nav>
${readOnly ? `<span class="badge readonly">read-only</span>` : ""}
${tokenDigest && s.id !== "bearer" ? `<form method="post" action="/logout" class="logout"><input type="hidden" name="csrf" value="${escape(s.csrf)}"><button>Log out</button></form>` : ""}
</header><main>${flash ? `<p class="flash">${escape(flash)}</p>` : ""}${body}</main></body></html>`;

  const hidden = (s: Session) => `<input type="hidden" name="csrf" value="${escape(s.csrf)}">`;
  const action = (s: Session, path: string, label: string, fields: Record<string, string>, cls = "") =>
    readOnly
      ? ""
      : `<form method="post" action="${escape(path)}" class="inline">${hidden(s)}${Object.entries(fields)
          .map(([k, v]) => `<input type="hidden" name="${escape(k)}" value="${escape(v)}">`)
          .join("")}<button class="${escape(cls)}">${escape(label)}</button></form>`;

  // ---- Pages ----

  const overviewLive = async (): Promise<string> => {
    const [s, destinations] = await Promise.all([inbox.summary(), inbox.destinations()]);
    const t = now();
    const hour = await inbox.histogram(t - 3_600_000 - (t % 60_000) + 60_000, 60_000, t);
    // Done may be PostgreSQL's estimate on a large table: say so with ≈ rather than show a false exact count.
    const about = (name: Status) => (s.estimated && name === "done" ? "≈ " : "");
    const cards = STATUSES.map(
      (name) =>
        `<a class="card ${name}" href="/deliveries?status=${name}"><span class="n">${about(name)}${s.counts[name].toLocaleString("en")}</span><span class="label">${name}</span></a>`,
    ).join("");
    const rows = s.sources
      .map(
        ({ source, counts }) =>
          `<tr><td><a href="/deliveries?${new URLSearchParams({ source })}">${escape(source)}</a></td>${STATUSES.map(
            (n) =>
              `<td class="num">${counts[n] === 0 ? "" : `<a href="/deliveries?${new URLSearchParams({ source, status: n })}">${about(n)}${counts[n].toLocaleString("en")}</a>`}</td>`,
          ).join("")}</tr>`,
      )
      .join("");
    return `<section class="cards">${cards}</section>
<p class="oldest">Oldest waiting: <strong>${s.oldestWaitingMs === null ? "nothing is waiting" : escape(age(s.oldestWaitingMs))}</strong>
${s.conflicts.deliveries > 0 ? ` · ${s.conflicts.deliveries} deliveries had duplicates with a different body` : ""}</p>
${held(destinations)}
<h2>Last hour</h2>${chart(hour)}
<h2>By source</h2><div class="scroll"><table><thead><tr><th>source</th>${STATUSES.map((n) => `<th class="num">${n}</th>`).join("")}</tr></thead><tbody>${rows || `<tr><td colspan="5">(the inbox is empty)</td></tr>`}</tbody></table></div>
<p class="updated">Updated ${escape(iso(t))}</p>`;
  };

  // held warns of the destinations that hold their deliveries now: an open breaker, or a pause.
  const held = (destinations: DestinationState[]) => {
    const holding = destinations.filter((d) => d.state !== "closed");
    if (holding.length === 0) return "";
    return `<p class="held">Holding their deliveries: ${holding
      .map(
        (d) =>
          `<a href="/destinations">${escape(d.name)}</a> ${statusBadge(d.state)} ${d.waiting.toLocaleString("en")} waiting`,
      )
      .join(" · ")}</p>`;
  };

  const overview = async (s: Session) =>
    page(
      s,
      "Overview",
      `<h1>Overview <span class="live" id="live-state">live</span></h1><div id="live" data-refresh="${refreshMs}">${await overviewLive()}</div>`,
    );

  const filterForm = (params: URLSearchParams) => {
    const v = (name: string) => escape(params.get(name) ?? "");
    return `<form method="get" action="/deliveries" class="filters">
<label>Status <select name="status"><option value="">any</option>${STATUSES.map((n) => `<option${params.get("status") === n ? " selected" : ""}>${n}</option>`).join("")}</select></label>
<label>Source <input name="source" value="${v("source")}" size="10"></label>
<label>Destination <input name="destination" value="${v("destination")}" size="10"></label>
<label>Event type <input name="type" value="${v("type")}" size="14"></label>
<label>Since (UTC) <input name="since" value="${v("since")}" placeholder="2026-12-02T18:00" size="16"></label>
<label>Until (UTC) <input name="until" value="${v("until")}" placeholder="2026-12-02T19:00" size="16"></label>
<label>ID <input name="id" value="${v("id")}" size="12"></label>
<label>Body contains <input name="q" value="${v("q")}" size="14"></label>
<label>Error contains <input name="error" value="${v("error")}" size="14"></label>
<button>Filter</button> <a href="/deliveries">clear</a></form>`;
  };

  const deliveries = async (s: Session, params: URLSearchParams, flash: string | null) => {
    const filter = filterFrom(params);
    const after = decodeCursor(params.get("after"));
    // One more than a page says whether there is a next one, without counting a million rows.
    const rows = await inbox.search(filter, { after, limit: pageSize + 1 });
    const more = rows.length > pageSize;
    const shown = rows.slice(0, pageSize);
    const table = shown
      .map(
        (d) => `<tr><td><a href="${escape(deliveryHref(d))}">${escape(d.id)}</a></td><td>${escape(d.source)}</td>
<td class="dest">${escape(destinationLabel(d.destination))}</td><td>${escape(d.eventType ?? "–")}</td><td>${statusBadge(d.status)}</td><td class="num">${d.attempts}</td><td class="time">${escape(iso(d.receivedAt))}</td>
<td class="error">${escape(redact(d.error ?? ""))}</td></tr>`,
      )
      .join("");
    const filtered = filterQuery(params) !== "";
    const status = params.get("status") || undefined;
    const bulk =
      readOnly || !filtered
        ? ""
        : `<p class="bulk">Everything that matches, not only this page:
${status === undefined || status === "failed" ? `<a class="button" href="/bulk?${escape(filterQuery(params, { action: "retry" }))}">Retry all failed…</a>` : ""}
${status === undefined || status === "done" ? `<a class="button" href="/bulk?${escape(filterQuery(params, { action: "replay" }))}">Replay all done…</a>` : ""}</p>`;
    return page(
      s,
      "Deliveries",
      `<h1>Deliveries</h1>${filterForm(params)}${bulk}
<div class="scroll"><table class="list"><thead><tr><th>id</th><th>source</th><th>destination</th><th>event type</th><th>status</th><th class="num">tries</th><th>received</th><th>error</th></tr></thead>
<tbody>${table || `<tr><td colspan="8">No deliveries match.</td></tr>`}</tbody></table></div>
<p class="pager">${after ? `<a href="/deliveries?${escape(filterQuery(params))}">« newest</a>` : ""}
${more ? `<a rel="next" href="/deliveries?${escape(filterQuery(params, { after: encodeCursor(shown.at(-1)!) }))}">older »</a>` : ""}</p>`,
      flash,
    );
  };

  const oneDelivery = async (s: Session, params: URLSearchParams, flash: string | null) => {
    const id = params.get("id");
    const source = params.get("source") ?? undefined;
    if (!id) throw new HttpError(400, "expected ?id= (and &source=)");
    const found = await inbox.find(id, source);
    if (found.length === 0) throw new HttpError(404, `no delivery ${source ? `${source}/` : ""}${id}`);
    const sources = [...new Set(found.map((d) => d.source))];
    if (sources.length > 1) {
      return page(
        s,
        id,
        `<h1>${escape(id)}</h1><p>This ID exists in several sources:</p><ul>${sources
          .map((source) => `<li><a href="${escape(deliveryHref({ source, id }))}">${escape(source)}</a></li>`)
          .join("")}</ul>`,
      );
    }
    // One row per destination its routes chose, in route order; the first holds what they share.
    const rows = found;
    const d = rows[0]!;
    const single = rows.length === 1;
    // A waiting row whose destination is open or paused waits for that, not for its due time: say so.
    const holding = rows.some((r) => r.status === "received" && r.destination !== "")
      ? new Map((await inbox.destinations()).filter((x) => x.state !== "closed").map((x) => [x.name, x.state]))
      : new Map<string, string>();
    const tries = (await Promise.all(rows.map((r) => inbox.attemptErrors(r))))
      .flatMap((list, i) => list.map((a) => ({ ...a, destination: rows[i]!.destination })))
      .sort((a, b) => a.failedAt - b.failedAt);
    const views = bodyViews(d.body);
    const view =
      params.get("view") ?? (views.json !== undefined ? "json" : views.text !== undefined ? "text" : "base64");
    const shown = view === "json" ? views.json : view === "text" ? views.text : views.base64;
    const tab = (name: string, label: string, available: boolean) =>
      available
        ? `<a class="tab${name === view ? " on" : ""}" href="${escape(`${deliveryHref(d)}&view=${name}`)}">${label}</a>`
        : "";
    const meta: [string, string][] = [
      ["source", escape(d.source)],
      ["event type", escape(d.eventType ?? "–")],
      ["received", escape(iso(d.receivedAt))],
      ["provider time", escape(iso(d.providerTime))],
      ["content type", escape(d.contentType ?? "–")],
      [
        "body",
        `${d.body.length.toLocaleString("en")} bytes, sha256 <code>${escape(d.bodySha256.slice(0, 16))}…</code>`,
      ],
      ["duplicates with another body", String(d.conflicts)],
    ];
    // Retry and Replay act on one destination's row; a delivery with one row keeps them at the top.
    const rowAction = (r: Delivery) => {
      const fields: Record<string, string> = single
        ? { source: r.source, id: r.id }
        : { source: r.source, id: r.id, destination: r.destination };
      return r.status === "failed"
        ? action(s, "/retry", "Retry", fields, "primary")
        : r.status === "done"
          ? action(s, "/replay", "Replay", fields, single ? "primary" : "")
          : "";
    };
    const routeRows = rows
      .map(
        (r) => `<tr><td>${r.destination === "" ? "(none)" : `<a href="/destinations">${escape(r.destination)}</a>`}</td>
<td>${statusBadge(r.status)}</td><td class="num">${r.attempts}</td><td class="time">${
          r.status !== "received"
            ? "–"
            : holding.has(r.destination)
              ? `held: ${escape(r.destination)} is ${escape(holding.get(r.destination)!)}`
              : escape(iso(r.availableAt))
        }</td>
<td class="time">${r.leasedUntil === null ? "none" : `until ${escape(iso(r.leasedUntil))}`}</td><td class="time">${escape(iso(r.finishedAt))}</td>
<td class="error">${escape(redact(r.error ?? ""))}</td>${single ? "" : `<td>${rowAction(r)}</td>`}</tr>`,
      )
      .join("");
    return page(
      s,
      d.id,
      `<p class="crumbs"><a href="/deliveries?${new URLSearchParams({ source: d.source })}">${escape(d.source)}</a> /</p>
<h1 class="id">${escape(d.id)} ${single ? statusBadge(d.status) : ""}</h1>
<div class="actions">${single ? rowAction(d) : ""}</div>
<h2>${single ? "Destination" : "Destinations"}</h2><div class="scroll"><table class="routes"><thead><tr><th>destination</th><th>status</th><th class="num">tries</th><th>due</th><th>lease</th><th>finished</th><th>last error</th>${single ? "" : "<th></th>"}</tr></thead>
<tbody>${routeRows}</tbody></table></div>
${
  tries.length === 0
    ? ""
    : `<h2>Failed tries</h2><div class="scroll"><table class="tries"><thead><tr><th class="num">try</th>${single ? "" : "<th>destination</th>"}<th>when</th><th>error</th></tr></thead><tbody>${tries
        .map(
          (a) =>
            `<tr><td class="num">${a.attempt}</td>${single ? "" : `<td>${escape(destinationLabel(a.destination))}</td>`}<td class="time">${escape(iso(a.failedAt))}</td><td class="error">${escape(redact(a.error))}</td></tr>`,
        )
        .join("")}</tbody></table></div>`
}
<dl class="meta">${meta.map(([k, v]) => `<dt>${escape(k)}</dt><dd>${v}</dd>`).join("")}</dl>
<h2>Body</h2><nav class="tabs">${tab("json", "JSON", views.json !== undefined)}${tab("text", "Raw", views.text !== undefined)}${tab("base64", "Base64", true)}</nav>
${views.text === undefined ? `<p class="note">Not UTF-8: shown as base64.</p>` : ""}<pre class="body">${escape(shown ?? "")}</pre>
${await previewSection(rows, params.get("preview") === "1")}`,
      flash,
    );
  };

  // previewSection shows, when asked, what each destination would get now (filters, transform), as `inbox.ts preview`; nothing is sent.
  const previewSection = async (rows: readonly Delivery[], asked: boolean): Promise<string> => {
    if (!options.preview) return "";
    if (!asked)
      return `<h2>What would be sent now</h2><p><a href="${escape(`${deliveryHref(rows[0]!)}&preview=1`)}">Preview</a> the routes its filters choose under the sources file as admin.ts read it at start, and each destination's request, its transform run; nothing is sent.</p>`;
    let seen: Preview;
    try {
      seen = await options.preview(rows);
    } catch (error) {
      return `<h2>What would be sent now</h2><p class="error">${escape(redact(message(error)))}</p>`;
    }
    const request = (r: Preview["requests"][number]) =>
      r.kind === "handler"
        ? "the worker's handler runs it; nothing goes over the network"
        : r.error
          ? `the try would fail: ${r.error}`
          : r.skipped
            ? "skipped: its transform returned null"
            : `${r.kind === "http" ? `POST ${r.url}` : "publish to its broker"}\n${Object.entries(r.headers ?? {})
                .map(([k, v]) => `${k}: ${v}`)
                .join("\n")}\n\n${bodyForPeople(r.body!)}`;
    return `<h2>What would be sent now</h2><p>Routes: ${seen.routes.map((r) => escape(`${r.to}: ${r.chosen ? "chosen" : `not chosen (${r.why})`}`)).join("; ") || "none"}</p>
${seen.notes.map((n) => `<p class="note">${escape(n)}</p>`).join("")}${seen.requests.map((r) => `<h3>${escape(r.destination)}</h3><pre class="body">${escape(redact(request(r)))}</pre>`).join("")}`;
  };

  const destinationsPage = async (s: Session, flash: string | null) => {
    const all = await destinationStates();
    const list = (d: DestinationState, status: Status, n: number) =>
      n === 0
        ? "0"
        : `<a href="/deliveries?${escape(new URLSearchParams({ destination: d.name, status }).toString())}">${n.toLocaleString("en")}</a>`;
    const rate = (d: DestinationState) =>
      d.failureRate === null
        ? "–"
        : `${Math.round(d.failureRate * 100)}%${d.failuresInRow > 0 ? ` <span class="note">(${d.failuresInRow} in a row)</span>` : ""}`;
    const control = (d: DestinationState) =>
      readOnly
        ? ""
        : d.state === "paused"
          ? action(s, "/resume", "Resume", { destination: d.name }, "primary")
          : `<form method="post" action="/pause" class="pause">${hidden(s)}<input type="hidden" name="destination" value="${escape(d.name)}"><input name="reason" placeholder="why (optional)" size="14" maxlength="200" aria-label="why pause ${escape(d.name)}"><button>Pause</button></form>`;
    const rows = all
      .map(
        (
          d,
        ) => `<tr class="${escape(d.state)}"><td><a href="/deliveries?${escape(new URLSearchParams({ destination: d.name }).toString())}">${escape(d.name)}</a></td>
<td>${statusBadge(d.state)} <span class="detail">${escape(redact(stateDetail(d)))}</span></td><td class="num">${list(d, "received", d.waiting)}</td>
<td class="num">${d.processing.toLocaleString("en")}</td><td class="num">${list(d, "failed", d.failed)}</td><td class="num">${rate(d)}</td>
<td class="error">${d.lastError === null ? "" : `${escape(redact(d.lastError))}<div class="sample">${escape(iso(d.lastErrorAt))}</div>`}</td><td>${control(d)}</td></tr>`,
      )
      .join("");
    return page(
      s,
      "Destinations",
      `<h1>Destinations</h1>
<div class="scroll"><table class="destinations"><thead><tr><th>destination</th><th>state</th><th class="num">waiting</th><th class="num">in flight</th><th class="num">failed</th><th class="num">failure rate</th><th>last error</th><th></th></tr></thead>
<tbody>${rows}</tbody></table></div>
<p class="note">Closed: forwarding. Open: its breaker tripped after too many failures; its deliveries wait without spending attempts, and one probe tries again after the cool-down. Paused: held until resumed, by a person or by a 410 from the destination; nothing is discarded. The failure rate is over the breaker's current window.</p>`,
      flash,
    );
  };

  // failureGroups counts failed deliveries by their exact error in the database, then merges the counts
  // under each error's normalised key: the failed rows are read once, through their partial index.
  const failureGroups = async () => {
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
  };

  const failures = async (s: Session, flash: string | null) => {
    const groups = await failureGroups();
    // The list link narrows by the group's longest literal piece: a filter cannot say the normalised key.
    const literal = (key: string) =>
      key.split(/<\w+>|\[hidden\]/).reduce((a, b) => (b.trim().length > a.length ? b.trim() : a), "");
    const rows = groups
      .map(
        (
          g,
        ) => `<tr><td class="num"><a href="/deliveries?${escape(new URLSearchParams({ status: "failed", error: literal(g.key) }).toString())}">${g.count.toLocaleString("en")}</a></td><td><code>${escape(g.key)}</code><div class="sample">e.g. ${escape(g.sample ?? "")}</div></td>
<td class="time">${escape(iso(g.latest))}</td><td>${action(s, "/retry-group", "Retry all", { group: g.key })}</td></tr>`,
      )
      .join("");
    return page(
      s,
      "Failures",
      `<h1>Failures, grouped by error</h1>
<div class="scroll"><table><thead><tr><th class="num">failed</th><th>error</th><th>latest</th><th></th></tr></thead>
<tbody>${rows || `<tr><td colspan="4">Nothing has failed.</td></tr>`}</tbody></table></div>`,
      flash,
    );
  };

  const bulkConfirm = async (s: Session, params: URLSearchParams) => {
    const kind = params.get("action");
    if (kind !== "retry" && kind !== "replay") throw new HttpError(400, "action: expected retry or replay");
    const filter = bulkFilter(params, kind);
    const n = await inbox.count(filter);
    const fields = Object.fromEntries([...new URLSearchParams(filterQuery(params))]);
    const verb = kind === "retry" ? "Retry" : "Replay";
    return page(
      s,
      `${verb}?`,
      `<h1>${verb} ${n.toLocaleString("en")} ${kind === "retry" ? "failed" : "done"} ${n === 1 ? "delivery" : "deliveries"}?</h1>
<p>Everything that matches this filter (${escape(describe(filter))}), not only the rows on screen, in batches of ${batchSize} beside the running worker.</p>
${n === 0 ? `<p>Nothing to do.</p>` : action(s, "/bulk", `${verb} ${n.toLocaleString("en")}`, { ...fields, action: kind, expected: String(n) }, "primary")}
<p><a href="/deliveries?${escape(filterQuery(params))}">Back to the list</a></p>`,
    );
  };

  // ---- Actions: each one checked, done, audited, then redirected so a reload does not repeat it ----

  // destinationStates is the store's list, with the configured destinations it does not know yet, idle.
  const destinationStates = async (): Promise<DestinationState[]> => {
    const known = await inbox.destinations();
    const missing = (options.destinations ?? []).filter((name) => !known.some((d) => d.name === name));
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
  };
  const destinationField = (form: URLSearchParams): string | undefined => {
    const name = form.get("destination");
    if (name === null || name === "") return undefined;
    if (!DESTINATION_NAME.test(name))
      throw new HttpError(400, `destination: expected a destination's name, got ${name}`);
    return name;
  };
  // Only a destination the inbox knows may be paused: a typo would otherwise make a paused one of its own.
  const knownDestination = async (form: URLSearchParams): Promise<string> => {
    const name = destinationField(form);
    if (name === undefined) throw new HttpError(400, "destination: expected a destination's name");
    if (!(await destinationStates()).some((d) => d.name === name)) throw new HttpError(404, `no destination ${name}`);
    return name;
  };
  // tell announces a pause or resume to the operator's URL, where one is configured; a failure is said, not thrown.
  const tell = async (event: Parameters<NonNullable<AdminOptions["announce"]>>[0]): Promise<string> => {
    if (!options.announce) return "";
    const said = await options.announce(event).catch((error: unknown) => message(error));
    return said === true ? " The operator's URL was told." : ` The operator's URL was not told: ${said}.`;
  };

  const actions: Record<
    string,
    (s: Session, form: URLSearchParams) => Promise<{ what: string; count: number; to: string; flash: string }>
  > = {
    "/retry": async (_s, form) => {
      const target = { source: form.get("source") ?? DEFAULTS.source, id: form.get("id") ?? "" };
      const destination = destinationField(form);
      // One destination's row, or every failed row of the delivery when none is named.
      const n =
        destination === undefined
          ? await inbox.retry(target)
          : await inbox.retryMatching({ ...target, destination, status: "failed" }, { batch: batchSize });
      return {
        what: `retry delivery=${JSON.stringify(`${target.source}/${target.id}`)}${destination === undefined ? "" : ` destination=${JSON.stringify(destination)}`}`,
        count: n,
        to: deliveryHref(target),
        flash: n >= 1 ? "Queued again." : "Not failed any more: nothing to retry.",
      };
    },
    "/replay": async (_s, form) => {
      const target = { source: form.get("source") ?? DEFAULTS.source, id: form.get("id") ?? "" };
      const destination = destinationField(form);
      const { replayed } = await inbox.replayMatching(
        { source: target.source, id: target.id, ...(destination === undefined ? {} : { destination }) },
        { batch: batchSize },
      );
      return {
        what: `replay delivery=${JSON.stringify(`${target.source}/${target.id}`)}${destination === undefined ? "" : ` destination=${JSON.stringify(destination)}`}`,
        count: replayed,
        to: deliveryHref(target),
        flash: replayed >= 1 ? "Queued again, to be handled once more." : "Not done any more: nothing to replay.",
      };
    },
    "/pause": async (s, form) => {
      const destination = await knownDestination(form);
      const reason = (form.get("reason") ?? "").trim().slice(0, 200) || "paused on the operator page";
      const changed = await inbox.pause(destination, reason);
      const told = changed ? await tell({ type: "destination.paused", data: { destination, reason, by: s.who } }) : "";
      return {
        what: `pause destination=${JSON.stringify(destination)} reason=${JSON.stringify(reason)}`,
        count: changed ? 1 : 0,
        to: "/destinations",
        flash: changed
          ? `${destination} paused: its deliveries wait, none discarded.${told}`
          : `${destination} was already paused; nothing changed.`,
      };
    },
    "/resume": async (s, form) => {
      const destination = await knownDestination(form);
      const changed = await inbox.resume(destination);
      const told = changed ? await tell({ type: "destination.resumed", data: { destination, by: s.who } }) : "";
      return {
        what: `resume destination=${JSON.stringify(destination)}`,
        count: changed ? 1 : 0,
        to: "/destinations",
        flash: changed
          ? `${destination} resumed: its deliveries go again.${told}`
          : `${destination} was not paused; nothing changed.`,
      };
    },
    "/bulk": async (_s, form) => {
      const kind = form.get("action");
      if (kind !== "retry" && kind !== "replay") throw new HttpError(400, "action: expected retry or replay");
      const filter = bulkFilter(form, kind);
      const n =
        kind === "retry"
          ? await inbox.retryMatching(filter, { batch: batchSize })
          : (await inbox.replayMatching(filter, { batch: batchSize })).replayed;
      const expected = form.get("expected");
      const note = expected !== null && Number(expected) !== n ? ` (${expected} matched when you confirmed)` : "";
      return {
        what: `${kind} filter: ${describe(filter)}`,
        count: n,
        to: `/deliveries?${filterQuery(form)}`,
        flash: `${kind === "retry" ? "Retried" : "Replayed"} ${n.toLocaleString("en")} ${n === 1 ? "delivery" : "deliveries"}${note}.`,
      };
    },
    "/retry-group": async (_s, form) => {
      const key = form.get("group") ?? "";
      // The group is a normalised key, which no filter can say: walk the failures a page at a time and
      // retry those whose error normalises to it. A page's retries join one group commit.
      let n = 0;
      let after: Delivery | undefined;
      for (;;) {
        const page = await inbox.search({ status: "failed" }, { after, limit: batchSize });
        const mine = page.filter((d) => normaliseError(d.error === null ? null : redact(d.error)) === key);
        n += (await Promise.all(mine.map((d) => inbox.retry({ source: d.source, id: d.id })))).reduce(
          (a, b) => a + b,
          0,
        );
        if (page.length < batchSize) break;
        after = page.at(-1);
      }
      return {
        what: `retry group=${JSON.stringify(key)}`,
        count: n,
        to: "/failures",
        flash: `Retried ${n.toLocaleString("en")} ${n === 1 ? "delivery" : "deliveries"} of that group.`,
      };
    },
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      const status = error instanceof HttpError ? error.status : 500;
      if (status === 500) console.error(`admin: ${req.method} ${req.url}: ${message(error)}`);
      if (!res.headersSent)
        send(
          res,
          status,
          `<!doctype html><meta charset="utf-8"><link rel="stylesheet" href="/admin.css"><main><h1>${status}</h1><p>${escape(status === 500 ? "Something went wrong; the server's log says what." : message(error))}</p><p><a href="/">Overview</a></p></main>`,
        );
      else res.end();
    });
  });

  // Every page goes out through send, which hides what redact() missed, as it is or as escape() wrote it.
  const send = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) => {
    body = redact(body);
    res.writeHead(status, { ...SECURITY_HEADERS, "content-type": "text/html; charset=utf-8", ...headers });
    res.end(body);
  };

  const loginPage = (
    flash?: string,
  ) => `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Log in · webhook inbox</title><link rel="stylesheet" href="/admin.css"></head><body><main class="login"><h1>webhook inbox</h1>
${flash ? `<p class="flash">${escape(flash)}</p>` : ""}<form method="post" action="/login"><label>Admin token <input type="password" name="token" autocomplete="current-password" autofocus></label> <button class="primary">Log in</button></form></main></body></html>`;

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://admin.invalid");
    const path = url.pathname;
    // Without a token the page trusts loopback; a Host that is not loopback means DNS rebinding.
    if (!tokenDigest && !isLoopback((req.headers.host ?? "").replace(/:\d+$/, "")))
      throw new HttpError(403, "this page answers to a loopback address only");
    if (req.method === "GET" && path === "/admin.css")
      return void res
        .writeHead(200, {
          ...SECURITY_HEADERS,
          "content-type": "text/css; charset=utf-8",
          "cache-control": "max-age=300",
        })
        .end(CSS);
    if (req.method === "GET" && path === "/admin.js")
      return void res
        .writeHead(200, {
          ...SECURITY_HEADERS,
          "content-type": "text/javascript; charset=utf-8",
          "cache-control": "max-age=300",
        })
        .end(JS);
    // Browsers ask for it on every page; there is none, and a 404 would be noise in their console.
    if (req.method === "GET" && path === "/favicon.ico") return void res.writeHead(204, SECURITY_HEADERS).end();
    if (path === "/login" && tokenDigest) {
      if (req.method === "GET") return send(res, 200, loginPage());
      if (req.method !== "POST") throw new HttpError(405, "GET or POST");
      const form = await readForm(req);
      const given = form.get("token") ?? "";
      if (!timingSafeEqual(digest(given), tokenDigest)) {
        audit(`admin audit: who=${req.socket.remoteAddress} action=login count=0 result=refused`);
        return send(res, 401, loginPage("That is not the admin token."));
      }
      const id = randomBytes(24).toString("base64url");
      if (sessions.size >= MAX_SESSIONS) sessions.delete(sessions.keys().next().value!);
      const who = `session:${id.slice(0, 6)}@${req.socket.remoteAddress}`;
      sessions.set(id, { id, csrf: csrfFor(id), who, expires: now() + SESSION_MS });
      audit(`admin audit: who=${who} action=login count=0`);
      return send(res, 303, "", {
        location: "/",
        "set-cookie": `${COOKIE}=${id}; HttpOnly; SameSite=Strict; Path=/; Max-Age=${SESSION_MS / 1000}`,
      });
    }
    const s = session(req);
    if (!s) {
      if (req.method === "GET" && !url.searchParams.has("fragment")) return send(res, 401, loginPage());
      throw new HttpError(401, "log in first: exchange the admin token at /login");
    }
    if (req.method === "GET") {
      const flash = takeFlash(s, url.searchParams.get("flash"));
      if (path === "/") {
        if (url.searchParams.get("fragment") === "overview") return send(res, 200, await overviewLive());
        return send(res, 200, await overview(s));
      }
      if (path === "/deliveries") return send(res, 200, await deliveries(s, url.searchParams, flash));
      if (path === "/delivery") return send(res, 200, await oneDelivery(s, url.searchParams, flash));
      if (path === "/failures") return send(res, 200, await failures(s, flash));
      if (path === "/destinations") return send(res, 200, await destinationsPage(s, flash));
      if (path === "/bulk") {
        if (readOnly) throw new HttpError(403, "read-only: actions are refused");
        return send(res, 200, await bulkConfirm(s, url.searchParams));
      }
      throw new HttpError(404, `no page ${path}`);
    }
    if (req.method !== "POST") throw new HttpError(405, "expected GET or POST");
    // Every POST is an action: same origin, the session's CSRF token, and writable mode, in that order.
    const origin = req.headers.origin;
    if (origin !== undefined && origin !== `http://${req.headers.host}` && origin !== `https://${req.headers.host}`) {
      throw new HttpError(403, "cross-origin request refused");
    }
    const form = await readForm(req);
    if (s.id !== "bearer") {
      const csrf = Buffer.from(form.get("csrf") ?? "");
      const expected = Buffer.from(s.csrf);
      if (csrf.length !== expected.length || !timingSafeEqual(csrf, expected))
        throw new HttpError(403, "missing or wrong CSRF token: reload the page and try again");
    }
    if (path === "/logout") {
      sessions.delete(s.id);
      return send(res, 303, "", {
        location: "/login",
        "set-cookie": `${COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0`,
      });
    }
    const run = actions[path];
    if (!run) throw new HttpError(404, `no action ${path}`);
    if (readOnly) {
      audit(`admin audit: who=${s.who} action=${path.slice(1)} count=0 result=refused (read-only)`);
      throw new HttpError(403, "read-only: actions are refused");
    }
    const done = await run(s, form);
    // Every value the person typed is JSON-quoted in `what`, so one action stays one line.
    audit(`admin audit: who=${s.who} action=${done.what} count=${done.count}`);
    const to = new URL(done.to, "http://admin.invalid");
    const key = randomBytes(12).toString("base64url");
    if (flashes.size >= MAX_SESSIONS) flashes.delete(flashes.keys().next().value!);
    flashes.set(key, { session: s.id, text: done.flash });
    to.searchParams.set("flash", key);
    send(res, 303, "", { location: `${to.pathname}${to.search}` });
  }

  return { server };
}

// bulkFilter is the filter a bulk action works on: retry takes the failed ones that match, replay the done ones.
function bulkFilter(params: URLSearchParams, kind: "retry" | "replay"): Filter {
  const filter = filterFrom(params);
  const needed = kind === "retry" ? "failed" : "done";
  if (filter.status !== undefined && filter.status !== needed) {
    throw new HttpError(
      400,
      `only ${needed} deliveries can be ${kind === "retry" ? "retried" : "replayed"}; this filter asks for ${filter.status}`,
    );
  }
  return { ...filter, status: needed };
}

// describe says a filter in words, for the confirmation and the audit line.
function describe(filter: Filter): string {
  const parts = Object.entries(filter)
    .filter(([, v]) => v !== undefined)
    .map(([k, v]) => `${k}=${k === "since" || k === "until" ? iso(v as number) : JSON.stringify(v)}`);
  return parts.length === 0 ? "everything" : parts.join(" ");
}

// ---- The page's own CSS and script, served from this file so nothing comes from elsewhere ----------

const CSS = `
:root { --fg: #1d232b; --muted: #5b6675; --line: #dde2e8; --bg: #f6f7f9; --card: #fff; --accent: #1f5fbf;
  --received: #1f5fbf; --processing: #a86b00; --done: #1d7a45; --failed: #c2362b; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; align-items: center; gap: .4rem 1.2rem; padding: .6rem 1rem; background: #18202b; color: #fff; }
header a { color: #dfe6ee; text-decoration: none; } header a:hover { color: #fff; }
header nav { display: flex; gap: 1rem; flex-wrap: wrap; } .brand { font-weight: 700; color: #fff; }
header .logout { margin-left: auto; } header .logout button { background: transparent; color: #dfe6ee; border-color: #4a5666; }
main { max-width: 1100px; margin: 0 auto; padding: 1rem; }
h1 { font-size: 1.4rem; margin: .4rem 0 1rem; } h2 { font-size: 1.05rem; margin: 1.4rem 0 .5rem; }
a { color: var(--accent); }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(140px, 1fr)); gap: .7rem; }
.card { display: flex; flex-direction: column; padding: .8rem 1rem; background: var(--card); border: 1px solid var(--line); border-left: 5px solid var(--muted); border-radius: 6px; text-decoration: none; color: var(--fg); }
.card .n { font-size: 1.7rem; font-weight: 650; font-variant-numeric: tabular-nums; } .card .label { color: var(--muted); }
.card.received { border-left-color: var(--received); } .card.processing { border-left-color: var(--processing); }
.card.done { border-left-color: var(--done); } .card.failed { border-left-color: var(--failed); }
.card.failed .n { color: var(--failed); }
.oldest { margin: 1rem 0 0; }
.chart { width: 100%; max-width: 700px; height: auto; background: var(--card); border: 1px solid var(--line); border-radius: 6px; }
.chart .axis { stroke: var(--line); } .chart .tick { font-size: 11px; fill: var(--muted); }
polyline.received { stroke: var(--received); } polyline.done { stroke: var(--done); } polyline.failed { stroke: var(--failed); }
.legend { color: var(--muted); font-size: .9rem; margin: .3rem 0; }
.key { display: inline-block; width: .8rem; height: .25rem; margin: 0 .3rem .2rem .6rem; vertical-align: middle; }
.key.received { background: var(--received); } .key.done { background: var(--done); } .key.failed { background: var(--failed); }
.scroll { margin-bottom: 1rem; overflow-x: auto; background: var(--card); border: 1px solid var(--line); border-radius: 6px; }
table { border-collapse: collapse; width: 100%; } th, td { text-align: left; padding: .4rem .6rem; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-weight: 600; color: var(--muted); font-size: .85rem; white-space: nowrap; } tr:last-child td { border-bottom: 0; }
.num { text-align: right; font-variant-numeric: tabular-nums; } .time { white-space: nowrap; font-variant-numeric: tabular-nums; }
td.error { color: var(--failed); max-width: 22rem; overflow-wrap: anywhere; font-size: .9rem; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: 999px; font-size: .8rem; font-weight: 600; color: #fff; background: var(--muted); vertical-align: middle; }
.badge.received { background: var(--received); } .badge.processing { background: var(--processing); }
.badge.done { background: var(--done); } .badge.failed { background: var(--failed); } .badge.readonly { background: #6b4fa8; }
.filters { display: flex; flex-wrap: wrap; gap: .5rem .8rem; align-items: end; margin-bottom: .8rem; }
.filters label { display: flex; flex-direction: column; font-size: .8rem; color: var(--muted); }
input, select, button, .button { font: inherit; padding: .3rem .5rem; border: 1px solid #b9c2cd; border-radius: 4px; background: #fff; color: var(--fg); }
button, .button { cursor: pointer; text-decoration: none; display: inline-block; }
button.primary, .button.primary { background: var(--accent); border-color: var(--accent); color: #fff; font-weight: 600; }
form.inline { display: inline; }
.bulk { margin: .2rem 0 .8rem; } .pager { display: flex; gap: 1rem; } .flash { background: #e8f1ff; border: 1px solid #b8d0f5; padding: .5rem .8rem; border-radius: 4px; }
.meta { display: grid; grid-template-columns: max-content 1fr; gap: .25rem 1rem; background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: .7rem 1rem; margin: 0; }
.meta dt { color: var(--muted); } .meta dd { margin: 0; overflow-wrap: anywhere; }
.id { overflow-wrap: anywhere; } .crumbs { margin: 0; color: var(--muted); } .actions { margin: 0 0 1rem; }
pre { background: #0f1620; color: #e3e9f0; padding: .8rem 1rem; border-radius: 6px; overflow: auto; max-height: 32rem; font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; white-space: pre-wrap; overflow-wrap: anywhere; }
pre.error { background: #fff4f3; color: #7d1c14; border: 1px solid #f0c9c5; }
.tabs { display: flex; gap: .3rem; margin-bottom: .4rem; } .tab { padding: .2rem .7rem; border: 1px solid var(--line); border-radius: 4px; text-decoration: none; background: var(--card); }
.tab.on { background: var(--fg); color: #fff; border-color: var(--fg); }
.sample { color: var(--muted); font-size: .85rem; overflow-wrap: anywhere; } code { overflow-wrap: anywhere; }
.live { font-size: .75rem; font-weight: 600; color: var(--done); border: 1px solid currentColor; border-radius: 999px; padding: 0 .45rem; vertical-align: middle; }
.live.paused { color: var(--muted); } .updated, .note { color: var(--muted); font-size: .85rem; }
.login { max-width: 26rem; margin-top: 4rem; } .login label { display: block; margin-bottom: .6rem; } .login input { width: 100%; margin-top: .3rem; }
td.error { min-width: 12rem; }
.badge.closed { background: var(--done); } .badge.open { background: var(--failed); } .badge.paused { background: var(--processing); }
.held { background: #fff6e8; border: 1px solid #efd3a6; padding: .5rem .8rem; border-radius: 4px; }
.detail { color: var(--muted); font-size: .85rem; } form.pause { display: inline-flex; gap: .3rem; } form.pause input { width: 9rem; }
@media (max-width: 560px) {
  table.list thead { display: none; } table.list tr { display: block; padding: .5rem .6rem; border-bottom: 1px solid var(--line); }
  table.list td { display: inline-block; padding: 0 .6rem 0 0; border: 0; } table.list td.error { display: block; min-width: 0; max-width: none; }
  table.list td.num::before { content: "tries "; color: var(--muted); } table.list td.dest::before { content: "→ "; color: var(--muted); }
}
@media (max-width: 560px) { main { padding: .6rem; } .meta { grid-template-columns: 1fr; } .meta dt { margin-top: .3rem; } .filters label { flex: 1 1 45%; } .filters input, .filters select { width: 100%; } }
`;

// The overview refreshes itself while it is in sight, and stops asking while the tab is hidden.
const JS = `
const live = document.getElementById("live");
const state = document.getElementById("live-state");
if (live) {
  const every = Number(live.dataset.refresh) || 5000;
  let timer;
  const tick = async () => {
    clearTimeout(timer);
    if (document.hidden) return;
    try {
      const res = await fetch("/?fragment=overview", { credentials: "same-origin", cache: "no-store" });
      if (res.ok) live.innerHTML = await res.text();
    } catch {}
    timer = setTimeout(tick, every);
  };
  document.addEventListener("visibilitychange", () => {
    state.textContent = document.hidden ? "paused" : "live";
    state.classList.toggle("paused", document.hidden);
    if (!document.hidden) tick();
  });
  timer = setTimeout(tick, every);
}
`;

// ---- The entry point --------------------------------------------------------------------------------

/** main runs the operator page as `admin.ts` does, from a full argv (runtime, script, then its flags). */
export async function main(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError } = await import("commander");
  const whole = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 0 || n > 65535) throw new InvalidArgumentError("expected a port number.");
    return n;
  };
  const program = new Command("admin.ts")
    .description("The operator page: see, search, retry and replay deliveries in a browser.")
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option("--port <port>", "port to listen on; 0 picks a free one", whole, DEFAULTS.adminPort)
    .option("--host <address>", "address to listen on; beyond loopback only with --admin-token", DEFAULTS.host)
    .option("--admin-token <token|env:NAME>", "the token exchanged for a session cookie (env:NAME reads it from $NAME)")
    .option("--read-only", "show everything, refuse every action")
    .option(
      "--sources <file>",
      "the sources file (as the worker's): pause and resume are told to its $operator URL, a delivery's page previews what would be sent, and no secret it names is ever shown (default: INBOX_SOURCES)",
    )
    .addHelpText(
      "after",
      `
Examples:
  npx tsx admin.ts --db inbox.db
  ADMIN_TOKEN=$(openssl rand -hex 16) npx tsx admin.ts --admin-token env:ADMIN_TOKEN --host 0.0.0.0
  npx tsx admin.ts --db inbox.db --sources sources.json
  npx tsx admin.ts --db postgres://127.0.0.1:5432/test?schema=inbox --read-only`,
    )
    .showHelpAfterError("(run with --help for usage)");
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<{
    db?: string;
    port: number;
    host: string;
    adminToken?: string;
    readOnly?: boolean;
    sources?: string;
  }>();
  let token = opts.adminToken;
  if (token?.startsWith("env:")) {
    const name = token.slice(4);
    token = process.env[name];
    if (!token) fatal(`admin: --admin-token env:${name}, but $${name} is empty or unset`);
  }
  if (!isLoopback(opts.host) && !token) {
    fatal(
      `admin: refusing to listen on ${opts.host} without --admin-token: the page must not be open beyond this machine`,
    );
  }
  // The sources file's secrets are read, as the worker reads them, only to keep them off the page.
  const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
  let forwarding: Forwarding | undefined;
  let config: unknown;
  if (sourcesFile) {
    try {
      config = readSourcesFile(sourcesFile);
      forwarding = loadDestinations(config, process.env);
    } catch (error) {
      fatal(`admin: ${sourcesFile}: ${message(error)}`);
    }
  }
  const target = opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  let inbox: Inbox;
  try {
    inbox = await connect(target);
  } catch (error) {
    return fatal(`admin: cannot use the database: ${message(error)}`, 1);
  }
  const { log, flush } = lineLog();
  const operator = forwarding?.operator;
  const admin = createAdmin({
    inbox,
    token,
    readOnly: opts.readOnly,
    audit: log,
    hide: forwarding ? secretsOf(forwarding) : [],
    destinations: [...(forwarding?.destinations.keys() ?? [])],
    ...(operator ? { announce: (event) => announce(operator, event) } : {}),
    ...(sourcesFile
      ? { preview: (rows: readonly Delivery[]) => preview(rows, config, { base: dirname(resolve(sourcesFile)) }) }
      : {}),
  });
  let url: string;
  try {
    url = await listenAdmin(admin, { host: opts.host, port: opts.port, token });
  } catch (error) {
    return fatal(`admin: cannot listen on ${opts.host}:${opts.port}: ${message(error)}`, 1);
  }
  console.log(
    `Operator page on ${url}${opts.readOnly ? " (read-only)" : ""}${token ? "" : " (no token: loopback only)"}`,
  );
  const stop = async () => {
    admin.server.close();
    admin.server.closeAllConnections();
    await inbox.close();
    flush();
    process.exit(0);
  };
  process.on("SIGTERM", () => void stop());
  process.on("SIGINT", () => void stop());
}

// fatal stops start-up with one line: exit 2 for a mistake in the options, 1 for a runtime failure.
function fatal(line: string, code: 1 | 2 = 2): never {
  console.error(line);
  process.exit(code);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);

// Try:
//   npx tsx demo.ts && npx tsx admin.ts          then open http://127.0.0.1:8001
//   npx tsx admin.ts --host 0.0.0.0              refused: no token
//   ADMIN_TOKEN=s3cret npx tsx admin.ts --admin-token env:ADMIN_TOKEN --read-only
