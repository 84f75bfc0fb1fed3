// lib/admin/server.ts: the operator page's server: createAdmin() and listenAdmin(), and the routing of each request:
// assets, login, a page for a GET, an action for a POST. Every POST passes the same checks (same origin, the
// session's CSRF token, a scope that allows it, writable mode), writes one audit line, and redirects so a reload
// does not repeat it, or answers with its form (a filter tried, a change refused).

import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { hashKey, KEY_PREFIX } from "../api/keys.ts";
import { Api } from "../api/api.ts";
import { type Host, hostOf } from "../config/config.ts";
import { DEFAULTS } from "../defaults.ts";
import type { Preview } from "../forwarding/preview.ts";
import { message } from "../log.ts";
import { redactor, type Secret } from "../redact.ts";
import { refusedSearch } from "../search.ts";
import type { Audit, Delivery, Inbox } from "../store.ts";
import {
  type Announce,
  type Changed,
  pauseDestination,
  replayOne,
  resumeDestination,
  retryGroup,
  retryOne,
  retryOrReplayAll,
  targetLabel,
} from "../operations/actions.ts";
import { configPage, historyPage, versionPage } from "./config.ts";
import { CONFIG_FORMS, destinationPage, routePage } from "./editors.ts";
import { acts, CSS, deliveryHref, errorPage, JS, loginPage } from "./html.ts";
import { KEY_FORMS, keysPage } from "./keys.ts";
import { bulkFilter, describe, destinationField, filterQuery, HttpError, readForm } from "../operations/input.ts";
import {
  auditPage,
  bulkConfirm,
  deliveries,
  destinationsPage,
  type Done,
  failures,
  type Form,
  oneDelivery,
  overview,
  overviewLive,
  type PageContext,
} from "./pages.ts";
import { callerOf, COOKIE, isLoopback, SESSION_MS, type Session, Sessions } from "./session.ts";

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
  announce?: Announce;
  /**
   * Secrets never shown, whatever holds them (redact.ts secretsOf() of the sources file), should a row
   * stored before the worker redacted its errors hold one. Each is replaced by its marker, such as
   * [redacted: app bearer]. @default none
   */
  hide?: readonly Secret[];
  /** Destinations the sources file names: listed, and may be paused, before a worker has used them. @default none */
  destinations?: readonly string[];
  /** The broker sources as their brokers see them, for the overview (admin.ts asks, cached). @default none */
  brokers?: () => Promise<readonly { source: string; from: string; said: string; problem?: string }[]>;
  /** What a stored delivery would become under the configuration now (lib/forwarding/preview.ts), for the delivery's page and the API; to names one destination. @default none */
  preview?: (rows: readonly Delivery[], options?: { to?: string }) => Promise<Preview>;
  /**
   * What the operator hands a configuration changed through the API (lib/config/config.ts Host): the
   * environment its allowed `env:NAME` references are read from, the Policy its parts are held to
   * (INBOX_API_ENV, INBOX_API_DESTINATIONS_ALLOW), and the key of the secret store (admin.ts builds it from
   * its environment and flags). @default no environment, nothing allowed, no key
   */
  host?: Host;
  /** The folder a configuration applied through the API reads relative transform paths from, as a worker does. @default the working directory */
  base?: string;
}

/** Admin is the operator page's server, not yet listening, with the JSON API it serves under /api/v1/. */
export interface Admin {
  server: Server;
  api: Api;
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

// One strict policy for every answer: scripts and styles only from this server, nothing may frame it.
const SECURITY_HEADERS: Record<string, string> = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "same-origin",
  "cache-control": "no-store",
};

// Page is what every request is answered with: the pages' context, the sessions, and where audit lines go.
interface Page extends PageContext {
  sessions: Sessions;
  audit: (line: string) => void;
  announce?: Announce;
  host: Host;
  base: string;
}

/**
 * createAdmin builds the operator page over an open inbox; start it with listenAdmin. Reads need a
 * session (the token exchanged at /login for an HttpOnly, SameSite=Strict cookie) unless no token is
 * set, which listenAdmin allows on loopback only. Every action also needs the session's CSRF token, a
 * same-origin Origin when the browser sends one, and writable mode; each writes one audit line.
 */
export function createAdmin(options: AdminOptions): Admin {
  const sessions = new Sessions(options.token, options.now ?? Date.now);
  const p: Page = {
    inbox: options.inbox,
    now: options.now ?? Date.now,
    audit: options.audit ?? ((line: string) => console.error(line)),
    pageSize: options.pageSize ?? DEFAULTS.adminPageSize,
    batchSize: options.batchSize ?? DEFAULTS.bulkBatch,
    readOnly: options.readOnly ?? false,
    refreshMs: options.refreshMs ?? DEFAULTS.adminRefreshMs,
    guarded: sessions.guarded,
    sessions,
    // redact hides the sources file's secrets in a text from the store (an error, a reason) before it is
    // grouped, shortened or put in a link, where send() could no longer find them.
    redact: redactor(options.hide ?? []).redact,
    destinations: options.destinations ?? [],
    host: options.host ?? hostOf({}, { inbox: options.inbox }),
    base: options.base ?? process.cwd(),
    ...(options.preview ? { preview: options.preview } : {}),
    ...(options.brokers ? { brokers: options.brokers } : {}),
    ...(options.announce ? { announce: options.announce } : {}),
  } as Omit<Page, "api"> as Page;
  p.api = new Api(p);
  const server = createServer((req, res) => {
    handle(p, req, res).catch((error: unknown) => {
      // A refused search (its index off, or stopped at its bound): the page says why, as the API does.
      const status = error instanceof HttpError ? error.status : (refusedSearch(error) ?? 500);
      if (status === 500) console.error(`admin: ${req.method} ${req.url}: ${message(error)}`);
      if (!res.headersSent)
        send(
          p,
          res,
          status,
          errorPage(status, status === 500 ? "Something went wrong; the server's log says what." : message(error)),
        );
      else res.end();
    });
  });
  return { server, api: p.api };
}

// Every page goes out through send, which hides what redact() missed, as it is or as escape() wrote it.
function send(p: Page, res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, { ...SECURITY_HEADERS, "content-type": "text/html; charset=utf-8", ...headers });
  res.end(p.redact(body));
}

// asset answers the page's own CSS and script, and the favicon browsers ask for; false for any other path.
function asset(req: IncomingMessage, res: ServerResponse, path: string): boolean {
  if (req.method !== "GET") return false;
  const file = path === "/admin.css" ? CSS : path === "/admin.js" ? JS : undefined;
  if (file !== undefined) {
    const type = path === "/admin.css" ? "text/css" : "text/javascript";
    res
      .writeHead(200, { ...SECURITY_HEADERS, "content-type": `${type}; charset=utf-8`, "cache-control": "max-age=300" })
      .end(file);
    return true;
  }
  // There is no favicon, and a 404 would be noise in the browser's console.
  if (path === "/favicon.ico") {
    res.writeHead(204, SECURITY_HEADERS).end();
    return true;
  }
  return false;
}

// login exchanges the token for a session cookie; a wrong token is audited and asked for again.
async function login(p: Page, req: IncomingMessage, res: ServerResponse): Promise<void> {
  if (req.method === "GET") return send(p, res, 200, loginPage());
  if (req.method !== "POST") throw new HttpError(405, "GET or POST");
  const form = await readForm(req);
  const given = form.get("token") ?? "";
  let s = p.sessions.login(given, req.socket.remoteAddress);
  // An API key logs in as its scope: a read key's session looks and changes nothing.
  if (!s && given.startsWith(KEY_PREFIX)) {
    const key = await p.inbox.apiKeyByHash(hashKey(given));
    if (key) s = p.sessions.loginKey(key, req.socket.remoteAddress);
  }
  if (!s) {
    p.audit(`admin audit: who=${req.socket.remoteAddress} action=login count=0 result=refused`);
    return send(p, res, 401, loginPage("That is neither the admin token nor a live API key."));
  }
  p.audit(`admin audit: who=${s.who} action=login count=0`);
  send(p, res, 303, "", {
    location: "/",
    "set-cookie": `${COOKIE}=${s.id}; HttpOnly; SameSite=Strict; Path=/; Max-Age=${SESSION_MS / 1000}`,
  });
}

// read answers a GET with its page.
async function read(p: Page, s: Session, url: URL): Promise<string> {
  const flash = p.sessions.takeFlash(s, url.searchParams.get("flash"));
  switch (url.pathname) {
    case "/":
      return url.searchParams.get("fragment") === "overview" ? overviewLive(p) : overview(p, s);
    case "/deliveries":
      return deliveries(p, s, url.searchParams, flash);
    case "/delivery":
      return oneDelivery(p, s, url.searchParams, flash);
    case "/failures":
      return failures(p, s, flash);
    case "/destinations":
      return destinationsPage(p, s, flash);
    case "/audit":
      return auditPage(p, s, url.searchParams);
    case "/config":
      return configPage(p, s, flash);
    case "/config/history":
      return historyPage(p, s, url.searchParams);
    case "/config/version":
      return versionPage(p, s, url.searchParams);
    case "/config/destination":
      return destinationPage(p, s, url.searchParams, flash);
    case "/config/route":
      return routePage(p, s, url.searchParams, flash);
    case "/keys":
      return keysPage(p, s, flash);
    case "/bulk":
      if (!acts(p, s)) throw new HttpError(403, "read-only: actions are refused");
      return bulkConfirm(p, s, url.searchParams);
    default:
      throw new HttpError(404, `no page ${url.pathname}`);
  }
}

async function handle(p: Page, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? "/", "http://admin.invalid");
  const path = url.pathname;
  if (!p.sessions.trusts(req)) {
    const why = "this page answers to a loopback address only";
    if (p.api.refuse(res, url, "foreign_host", 403, why)) return;
    throw new HttpError(403, why);
  }
  if (asset(req, res, path)) return;
  // The API and its document answer bearer API keys, never the page's session (lib/api/api.ts).
  if (await p.api.handle(req, res, url)) return;
  if (path === "/metrics" && req.method === "GET") {
    const text = await p.api.metrics.registry.metrics();
    res.writeHead(200, { "content-type": p.api.metrics.registry.contentType, "cache-control": "no-store" }).end(text);
    return;
  }
  if (path === "/login" && p.guarded) return login(p, req, res);
  let s = p.sessions.of(req);
  // A key's session lasts while its key does: revoked, it is logged out at its next request.
  if (s?.key !== undefined && (await p.inbox.apiKeyByHash(s.key))?.revokedAt !== null) {
    p.sessions.logout(s);
    s = undefined;
  }
  if (!s) {
    if (req.method === "GET" && !url.searchParams.has("fragment")) return send(p, res, 401, loginPage());
    throw new HttpError(401, "log in first: exchange the admin token (or an API key) at /login");
  }
  if (req.method === "GET") return send(p, res, 200, await read(p, s, url));
  if (req.method !== "POST") throw new HttpError(405, "expected GET or POST");
  // Every POST is an action: same origin, the session's CSRF token, and writable mode, in that order.
  const origin = req.headers.origin;
  if (origin !== undefined && origin !== `http://${req.headers.host}` && origin !== `https://${req.headers.host}`) {
    throw new HttpError(403, "cross-origin request refused");
  }
  const form = await readForm(req);
  if (!p.sessions.csrfMatches(s, form.get("csrf")))
    throw new HttpError(403, "missing or wrong CSRF token: reload the page and try again");
  if (path === "/logout") {
    p.sessions.logout(s);
    return send(p, res, 303, "", {
      location: "/login",
      "set-cookie": `${COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0`,
    });
  }
  const run = Object.hasOwn(FORMS, path) ? FORMS[path] : undefined;
  if (!run) throw new HttpError(404, `no action ${path}`);
  if (!acts(p, s, run.scope)) {
    const why = p.readOnly ? "read-only" : `this session is ${s.scope}; ${run.scope} is needed`;
    p.audit(`admin audit: who=${s.who} action=${path.slice(1)} count=0 result=refused (${why})`);
    throw new HttpError(
      403,
      p.readOnly
        ? "read-only: actions are refused"
        : `this session may not do that: it logged in with a ${s.scope} key, and ${run.scope} is needed`,
    );
  }
  // The action's entry in the store's audit log, beside the API's, written by the store call that makes
  // the change, in its transaction: `page:` and the session. (The API's operations write theirs as the same.)
  const audit = (what: string): Audit => ({
    at: p.now(),
    who: callerOf(s).who,
    operation: path.slice(1),
    target: what,
  });
  const done = await run.run(p, s, form, audit);
  if (!("what" in done)) return send(p, res, done.status, done.html);
  // Every value the person typed is JSON-quoted in `what`, so one action stays one line.
  p.audit(`admin audit: who=${s.who} action=${done.what} count=${done.count}`);
  const to = new URL(done.to, "http://admin.invalid");
  to.searchParams.set(
    "flash",
    p.sessions.flash(s, { text: done.flash, ...(done.once === undefined ? {} : { once: done.once }) }),
  );
  send(p, res, 303, "", { location: `${to.pathname}${to.search}${to.hash}` });
}

// ---- The forms: each reads its fields, runs its action (lib/operations/actions.ts), and says what it did ----

// target reads the delivery a form names, and the destination's row when it names one.
function target(form: URLSearchParams): { source: string; id: string; destination?: string; label: string } {
  const source = form.get("source") ?? DEFAULTS.source;
  const id = form.get("id") ?? "";
  const destination = destinationField(form);
  const t = { source, id, ...(destination === undefined ? {} : { destination }) };
  return { ...t, label: targetLabel(t) };
}

// named reads the destination a pause or resume names: one is needed.
function named(form: URLSearchParams): string {
  const destination = destinationField(form);
  if (destination === undefined) throw new HttpError(400, "destination: expected a destination's name");
  return destination;
}

// toldText says whether the operator's URL heard of a change.
function toldText(change: Changed): string {
  return change.told === undefined
    ? ""
    : change.told === true
      ? " The operator's URL was told."
      : ` The operator's URL was not told: ${change.told}.`;
}

// QUEUE_FORMS are the queue's actions: a retry, a replay, a pause, a resume, a bulk action, a group retried.
const QUEUE_FORMS: Record<
  string,
  (p: Page, s: Session, form: URLSearchParams, audit: (what: string) => Audit) => Promise<Done>
> = {
  "/retry": async (p, _s, form, audit) => {
    const t = target(form);
    const n = await retryOne(p.inbox, t, p.batchSize, audit(`retry ${t.label}`));
    const flash = n >= 1 ? "Queued again." : "Not failed any more: nothing to retry.";
    return { what: `retry ${t.label}`, count: n, to: deliveryHref(t), flash };
  },
  "/replay": async (p, _s, form, audit) => {
    const t = target(form);
    const n = await replayOne(p.inbox, t, p.batchSize, audit(`replay ${t.label}`));
    const flash = n >= 1 ? "Queued again, to be handled once more." : "Not done any more: nothing to replay.";
    return { what: `replay ${t.label}`, count: n, to: deliveryHref(t), flash };
  },
  "/pause": async (p, s, form, audit) => {
    const destination = named(form);
    const reason = (form.get("reason") ?? "").trim().slice(0, 200) || "paused on the operator page";
    const what = `pause destination=${JSON.stringify(destination)} reason=${JSON.stringify(reason)}`;
    const change = await pauseDestination(
      p.inbox,
      { destination, reason, by: s.who },
      { configured: p.destinations, audit: audit(what), ...(p.announce ? { announce: p.announce } : {}) },
    );
    return {
      what,
      count: change.changed ? 1 : 0,
      to: "/destinations",
      flash: change.changed
        ? `${destination} paused: its deliveries wait, none discarded.${toldText(change)}`
        : `${destination} was already paused; nothing changed.`,
    };
  },
  "/resume": async (p, s, form, audit) => {
    const destination = named(form);
    const what = `resume destination=${JSON.stringify(destination)}`;
    const change = await resumeDestination(
      p.inbox,
      { destination, by: s.who },
      { configured: p.destinations, audit: audit(what), ...(p.announce ? { announce: p.announce } : {}) },
    );
    return {
      what,
      count: change.changed ? 1 : 0,
      to: "/destinations",
      flash: change.changed
        ? `${destination} resumed: its deliveries go again.${toldText(change)}`
        : `${destination} was not paused; nothing changed.`,
    };
  },
  "/bulk": async (p, _s, form, audit) => {
    const kind = form.get("action");
    if (kind !== "retry" && kind !== "replay") throw new HttpError(400, "action: expected retry or replay");
    const filter = bulkFilter(form, kind, p.now());
    const n = await retryOrReplayAll(p.inbox, kind, filter, p.batchSize, audit(`${kind} filter: ${describe(filter)}`));
    const expected = form.get("expected");
    const note = expected !== null && Number(expected) !== n ? ` (${expected} matched when you confirmed)` : "";
    return {
      what: `${kind} filter: ${describe(filter)}`,
      count: n,
      to: `/deliveries?${filterQuery(form)}`,
      flash: `${kind === "retry" ? "Retried" : "Replayed"} ${n.toLocaleString("en")} ${n === 1 ? "delivery" : "deliveries"}${note}.`,
    };
  },
  "/retry-group": async (p, _s, form, audit) => {
    const key = form.get("group") ?? "";
    const n = await retryGroup(p.inbox, key, p.redact, p.batchSize, audit(`retry group=${JSON.stringify(key)}`));
    return {
      what: `retry group=${JSON.stringify(key)}`,
      count: n,
      to: "/failures",
      flash: `Retried ${n.toLocaleString("en")} ${n === 1 ? "delivery" : "deliveries"} of that group.`,
    };
  },
};

// FORMS are every action the page's forms post: the queue's (which need write), the configuration's and the keys'.
const FORMS: Record<string, Form<Page>> = {
  ...Object.fromEntries(Object.entries(QUEUE_FORMS).map(([path, run]) => [path, { scope: "write" as const, run }])),
  ...CONFIG_FORMS,
  ...KEY_FORMS,
};
