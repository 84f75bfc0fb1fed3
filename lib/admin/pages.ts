// lib/admin/pages.ts: the operator page's pages, each read through the Inbox contract and laid out with
// lib/admin/html.ts: the overview, the deliveries and one delivery, the destinations, the failures grouped,
// the confirmation before a bulk action, and the audit log. Nothing here writes; the actions are lib/operations/actions.ts.

import type { Api } from "../api/api.ts";
import { bodyForPeople, utc } from "../format.ts";
import { type Preview, type PreviewRequest, routeLine } from "../forwarding/preview.ts";
import { message } from "../log.ts";
import { redactAttempt } from "../redact.ts";
import {
  type Attempt,
  type Audit,
  STATUSES,
  type Delivery,
  type DestinationState,
  type Inbox,
  type Status,
} from "../store.ts";
import { REMOVED } from "../rows.ts";
import { boundBodyContains } from "../search.ts";
import { destinationStates, failureGroups } from "../operations/actions.ts";
import {
  action,
  acts,
  age,
  bodyViews,
  chart,
  deliveryHref,
  destinationLabel,
  escape,
  hidden,
  page,
  sayState,
  stateBadge,
  statusBadge,
  type View,
} from "./html.ts";
import {
  bulkFilter,
  decodeCursor,
  describe,
  encodeCursor,
  filterFrom,
  filterQuery,
  HttpError,
} from "../operations/input.ts";
import type { Flash, Session } from "./session.ts";

/**
 * PageContext is what every page reads from: the inbox, the clock, the page's settings and its redaction, and
 * the API, whose operations the configuration's and the keys' pages run (lib/admin/config.ts, lib/admin/keys.ts).
 */
export interface PageContext extends View {
  inbox: Inbox;
  api: Api;
  now: () => number;
  pageSize: number;
  batchSize: number;
  refreshMs: number;
  /** redact hides the sources file's secrets in a text from the store before it is grouped, shortened or linked. */
  redact: (text: string) => string;
  /** Destinations the sources file names, listed before a worker has used them. */
  destinations: readonly string[];
  preview?: (rows: readonly Delivery[], options?: { to?: string }) => Promise<Preview>;
  /** The broker sources as their brokers see them (consume.ts's brokerLines), where the sources file has any. */
  brokers?: () => Promise<readonly { source: string; from: string; said: string; problem?: string }[]>;
}

/** Done is what a form's action did: its audit line, and where it sends the person next, with what message. */
export interface Done {
  what: string;
  count: number;
  to: string;
  flash: string;
  /** A value shown once with the message, never again (a new API key). */
  once?: string;
}

/** Shown is a form's answer as a page of its own, with its status: a filter tried, a change refused with the form kept. */
export interface Shown {
  status: number;
  html: string;
}

/**
 * Form is one action of the page's forms: the scope a session needs for it (read for one that changes nothing,
 * such as trying a filter), and what it does with the form's fields. Every one passes the same checks first
 * (same origin, the session's CSRF token); audit is its entry in the audit log, for the store call that makes
 * the change. One that changes something redirects (Done); one that shows a result or keeps a refused form
 * answers with its page (Shown).
 */
export interface Form<C extends PageContext = PageContext> {
  scope: "read" | "write" | "admin";
  run(ctx: C, s: Session, form: URLSearchParams, audit: (what: string) => Audit): Promise<Done | Shown>;
}

/** overviewLive is the overview's part that refreshes itself: counts, what is held, the last hour, each source. */
export const overviewLive = async (ctx: PageContext): Promise<string> => {
  const [s, destinations, brokers] = await Promise.all([
    ctx.inbox.summary(),
    ctx.inbox.destinations(),
    ctx.brokers?.() ?? [],
  ]);
  const t = ctx.now();
  const hour = await ctx.inbox.histogram(t - 3_600_000 - (t % 60_000) + 60_000, 60_000, t);
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
${held(destinations, t)}
<h2>Last hour</h2>${chart(hour)}
<h2>By source</h2><div class="scroll"><table><thead><tr><th>source</th>${STATUSES.map((n) => `<th class="num">${n}</th>`).join("")}</tr></thead><tbody>${rows || `<tr><td colspan="5">(the inbox is empty)</td></tr>`}</tbody></table></div>
${brokers.length === 0 ? "" : `<h2>Broker sources</h2><div class="scroll"><table><thead><tr><th>source</th><th>consumed from</th><th>its broker says</th><th>health</th></tr></thead><tbody>${brokers.map((b) => `<tr><td><a href="/deliveries?${new URLSearchParams({ source: b.source })}">${escape(b.source)}</a></td><td>${escape(b.from)}</td><td>${escape(ctx.redact(b.said))}</td>${b.problem === undefined ? "<td>ok</td>" : `<td class="error">${escape(ctx.redact(b.problem))}</td>`}</tr>`).join("")}</tbody></table></div>`}
<p class="updated">Updated ${escape(utc(t))}</p>`;
};

// held warns of the destinations that hold their deliveries now: an open breaker, or a pause.
const held = (destinations: DestinationState[], now: number) => {
  const holding = destinations.filter((d) => d.state !== "closed");
  if (holding.length === 0) return "";
  return `<p class="held">Holding their deliveries: ${holding
    .map(
      (d) =>
        `<a href="/destinations">${escape(d.name)}</a> ${stateBadge(sayState(d, now))}${d.pausedReason?.startsWith(REMOVED) ? ` <strong>${REMOVED}</strong>` : ""} ${d.waiting.toLocaleString("en")} waiting`,
    )
    .join(" · ")}</p>`;
};

/** overview is the first page: the live part, refreshed every refreshMs by admin.js. */
export const overview = async (ctx: PageContext, s: Session) =>
  page(
    ctx,
    s,
    "Overview",
    `<h1>Overview <span class="live" id="live-state">live</span></h1><div id="live" data-refresh="${ctx.refreshMs}">${await overviewLive(ctx)}</div>`,
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
<label>Body JSON <input name="bodyJson" value="${v("bodyJson")}" placeholder='{"data":{"object":{"customer":"cus_123"}}}' size="24"></label>
<label>Body words <input name="bodyWords" value="${v("bodyWords")}" placeholder="cus_123" size="14"></label>
<label>Body contains <input name="q" value="${v("q")}" size="14" title="reads every body: a day's when Since is empty"></label>
<label>Error contains <input name="error" value="${v("error")}" size="14"></label>
<button>Filter</button> <a href="/deliveries">clear</a></form>`;
};

/** deliveries lists the deliveries a filter matches, newest first, a page at a time, with the bulk actions. */
export const deliveries = async (ctx: PageContext, s: Session, params: URLSearchParams, flash: Flash | null) => {
  // A body contains with no Since reads a day's bodies, not every one; the page says so above the list.
  const { filter, since } = boundBodyContains(filterFrom(params, ctx.now()), ctx.now());
  const after = decodeCursor(params.get("after"));
  // One more than a page says whether there is a next one, without counting a million rows.
  const rows = await ctx.inbox.search(filter, { after, limit: ctx.pageSize + 1, bodies: false });
  const more = rows.length > ctx.pageSize;
  const shown = rows.slice(0, ctx.pageSize);
  const table = shown
    .map(
      (d) => `<tr><td><a href="${escape(deliveryHref(d))}">${escape(d.id)}</a></td><td>${escape(d.source)}</td>
<td class="dest">${escape(destinationLabel(d.destination))}</td><td>${escape(d.eventType ?? "–")}</td><td>${statusBadge(d.status)}</td><td class="num">${d.attempts}</td><td class="time">${escape(utc(d.receivedAt))}</td>
<td class="error">${escape(ctx.redact(d.error ?? ""))}</td></tr>`,
    )
    .join("");
  const filtered = filterQuery(params) !== "";
  const status = params.get("status") || undefined;
  // Nothing to act on when the first page is empty: no action offered above "No deliveries match".
  const bulk =
    !acts(ctx, s) || !filtered || (shown.length === 0 && !after)
      ? ""
      : `<p class="bulk">Everything that matches, not only this page:
${status === undefined || status === "failed" ? `<a class="button" href="/bulk?${escape(filterQuery(params, { action: "retry" }))}">Retry all failed…</a>` : ""}
${status === undefined || status === "done" ? `<a class="button" href="/bulk?${escape(filterQuery(params, { action: "replay" }))}">Replay all done…</a>` : ""}</p>`;
  return page(
    ctx,
    s,
    "Deliveries",
    `<h1>Deliveries</h1>${filterForm(params)}${bulk}${
      since === undefined
        ? ""
        : `<p class="note">Body contains reads every body, so it searched those received since ${escape(utc(since))}; set Since to look further back, or search by Body JSON or Body words, which an index serves.</p>`
    }
<div class="scroll"><table class="list"><thead><tr><th>id</th><th>source</th><th>destination</th><th>event type</th><th>status</th><th class="num">tries</th><th>received</th><th>error</th></tr></thead>
<tbody>${table || `<tr><td colspan="8">No deliveries match.</td></tr>`}</tbody></table></div>
<p class="pager">${after ? `<a href="/deliveries?${escape(filterQuery(params))}">« newest</a>` : ""}
${more ? `<a rel="next" href="/deliveries?${escape(filterQuery(params, { after: encodeCursor(shown.at(-1)!) }))}">older »</a>` : ""}</p>`,
    flash,
  );
};

/** oneDelivery shows one delivery: its row per destination, its tries, its metadata and its body. */
export const oneDelivery = async (ctx: PageContext, s: Session, params: URLSearchParams, flash: Flash | null) => {
  const id = params.get("id");
  const source = params.get("source") ?? undefined;
  if (!id) throw new HttpError(400, "expected ?id= (and &source=)");
  const found = await ctx.inbox.find(id, source);
  if (found.length === 0) throw new HttpError(404, `no delivery ${source ? `${source}/` : ""}${id}`);
  const sources = [...new Set(found.map((d) => d.source))];
  if (sources.length > 1) {
    return page(
      ctx,
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
    ? new Map((await ctx.inbox.destinations()).filter((x) => x.state !== "closed").map((x) => [x.name, x.state]))
    : new Map<string, string>();
  // The whole story, try by try, across its destinations; redacted again with today's secrets.
  const tries = (await Promise.all(rows.map((r) => ctx.inbox.attempts(r))))
    .flat()
    .sort((a, b) => a.startedAt - b.startedAt)
    .map((a) => redactAttempt(a, ctx.redact));
  const views = bodyViews(d.body);
  const view = params.get("view") ?? (views.json !== undefined ? "json" : views.text !== undefined ? "text" : "base64");
  const shown = view === "json" ? views.json : view === "text" ? views.text : views.base64;
  const tab = (name: string, label: string, available: boolean) =>
    available
      ? `<a class="tab${name === view ? " on" : ""}" href="${escape(`${deliveryHref(d)}&view=${name}`)}">${label}</a>`
      : "";
  const meta: [string, string][] = [
    ["source", escape(d.source)],
    ["event type", escape(d.eventType ?? "–")],
    // A fetched delivery is the provider's API JSON, unsigned (docs/reconcile.md).
    ["origin", d.origin === "reconcile" ? "reconcile: fetched from the provider's API" : escape(d.origin ?? "webhook")],
    ["received", escape(utc(d.receivedAt))],
    ["provider time", escape(utc(d.providerTime))],
    ["content type", escape(d.contentType ?? "–")],
    ["body", `${d.body.length.toLocaleString("en")} bytes, sha256 <code>${escape(d.bodySha256.slice(0, 16))}…</code>`],
    ["duplicates with another body", String(d.conflicts)],
  ];
  // Retry and Replay act on one destination's row; a delivery with one row keeps them at the top.
  const rowAction = (r: Delivery) => {
    const fields: Record<string, string> = single
      ? { source: r.source, id: r.id }
      : { source: r.source, id: r.id, destination: r.destination };
    return r.status === "failed"
      ? action(ctx, s, "/retry", "Retry", fields, "primary")
      : r.status === "done"
        ? action(ctx, s, "/replay", "Replay", fields, single ? "primary" : "")
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
            : escape(utc(r.availableAt))
      }</td>
<td class="time">${r.leasedUntil === null ? "none" : `until ${escape(utc(r.leasedUntil))}`}</td><td class="time">${escape(utc(r.finishedAt))}</td>
<td class="error">${escape(ctx.redact(r.error ?? ""))}</td>${single ? "" : `<td>${rowAction(r)}</td>`}</tr>`,
    )
    .join("");
  return page(
    ctx,
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
    : `<h2>Tries</h2><div class="scroll"><table class="tries"><thead><tr><th class="num">try</th>${single ? "" : "<th>destination</th>"}<th>started</th><th class="num">took</th><th>answer</th></tr></thead><tbody>${tries
        .map((a) => tryRow(a, single))
        .join("")}</tbody></table></div>`
}
<dl class="meta">${meta.map(([k, v]) => `<dt>${escape(k)}</dt><dd>${v}</dd>`).join("")}</dl>
<h2>Body</h2><nav class="tabs">${tab("json", "JSON", views.json !== undefined)}${tab("text", "Raw", views.text !== undefined)}${tab("base64", "Base64", true)}</nav>
${views.text === undefined ? `<p class="note">Not UTF-8: shown as base64.</p>` : ""}<pre class="body">${escape(shown ?? "")}</pre>
${await previewSection(ctx, rows, params.get("preview") === "1")}`,
    flash,
  );
};

// tryRow is one try on a delivery's page: when, how long, the status or the error, and the answer's
// headers and first bytes folded beneath it. Everything in it came from a destination: escaped.
function tryRow(a: Attempt, single: boolean): string {
  const answer = a.error === null ? (a.status === null ? "ok" : `HTTP ${a.status}`) : escape(a.error);
  const headers = a.headers === null ? [] : Object.entries(a.headers);
  const told =
    headers.length === 0 && (a.body === null || a.body === "")
      ? ""
      : `<details><summary>${a.status === null ? "answer" : `HTTP ${a.status}`}: headers and ${a.body === null ? 0 : a.body.length} characters of its body</summary>${
          headers.length === 0
            ? ""
            : `<pre class="headers">${escape(headers.map(([k, v]) => `${k}: ${v}`).join("\n"))}</pre>`
        }${a.body === null || a.body === "" ? "" : `<pre class="body">${escape(a.body)}</pre>`}</details>`;
  return `<tr class="try"><td class="num">${a.attempt}</td>${single ? "" : `<td>${escape(destinationLabel(a.destination))}</td>`}<td class="time">${escape(utc(a.startedAt))}</td><td class="num">${a.ms === null ? "–" : `${a.ms} ms`}</td><td class="${a.error === null ? "ok" : "error"}">${answer}${told}</td></tr>`;
}

// previewSection shows, when asked, what each destination would get now (filters, transform), as `inbox.ts preview` does; nothing is sent.
const previewSection = async (ctx: PageContext, rows: readonly Delivery[], asked: boolean): Promise<string> => {
  if (!ctx.preview) return "";
  if (!asked)
    return `<h2>What would be sent now</h2><p><a href="${escape(`${deliveryHref(rows[0]!)}&preview=1`)}">Preview</a> the routes its filters choose under the configuration in force, and each destination's request, its transform run; nothing is sent.</p>`;
  let seen: Preview;
  try {
    seen = await ctx.preview(rows);
  } catch (error) {
    return `<h2>What would be sent now</h2><p class="error">${escape(ctx.redact(message(error)))}</p>`;
  }
  return `<h2>What would be sent now</h2><p>Routes: ${seen.routes.map((r) => escape(routeLine(r))).join("; ") || "none"}</p>
${seen.notes.map((n) => `<p class="note">${escape(n)}</p>`).join("")}${seen.requests.map((r) => `<h3>${escape(r.destination)}</h3><pre class="body">${escape(ctx.redact(previewText(r)))}</pre>`).join("")}`;
};

/** previewText says what one destination of a preview would get, as plain text: the request, or why nothing is sent. */
export const previewText = (r: PreviewRequest): string =>
  r.kind === "handler"
    ? "the worker's handler runs it; nothing goes over the network"
    : r.error
      ? `the try would fail: ${r.error}`
      : r.skipped
        ? "skipped: its transform returned null"
        : `${r.kind === "http" ? `POST ${r.url}` : "publish to its broker"}\n${Object.entries(r.headers ?? {})
            .map(([k, v]) => `${k}: ${v}`)
            .join("\n")}\n\n${bodyForPeople(r.body!)}`;

/** destinationsPage lists each destination's state and counts, with pause and resume. */
export const destinationsPage = async (ctx: PageContext, s: Session, flash: Flash | null) => {
  const all = await destinationStates(ctx.inbox, ctx.destinations);
  const now = ctx.now();
  const list = (d: DestinationState, status: Status, n: number) =>
    n === 0
      ? "0"
      : `<a href="/deliveries?${escape(new URLSearchParams({ destination: d.name, status }).toString())}">${n.toLocaleString("en")}</a>`;
  const rate = (d: DestinationState) =>
    d.failureRate === null
      ? "–"
      : `${Math.round(d.failureRate * 100)}%${d.failuresInRow > 0 ? ` <span class="note">(${d.failuresInRow} in a row)</span>` : ""}`;
  const control = (d: DestinationState) =>
    !acts(ctx, s)
      ? ""
      : d.state === "paused"
        ? action(ctx, s, "/resume", "Resume", { destination: d.name }, "primary")
        : `<form method="post" action="/pause" class="pause">${hidden(s)}<input type="hidden" name="destination" value="${escape(d.name)}"><input name="reason" placeholder="why (optional)" size="14" maxlength="200" aria-label="why pause ${escape(d.name)}"><button>Pause</button></form>`;
  const rows = all
    .map(
      (
        d,
      ) => `<tr class="${escape(d.state)}"><td><a href="/deliveries?${escape(new URLSearchParams({ destination: d.name }).toString())}">${escape(d.name)}</a></td>
<td>${stateBadge(sayState(d, now))} <span class="detail">${escape(ctx.redact(sayState(d, now).breaker))}</span></td><td class="num">${list(d, "received", d.waiting)}</td>
<td class="num">${d.processing.toLocaleString("en")}</td><td class="num">${list(d, "failed", d.failed)}</td><td class="num">${rate(d)}</td>
<td class="error">${d.lastError === null ? "" : `${escape(ctx.redact(d.lastError))}<div class="sample">${escape(utc(d.lastErrorAt))}</div>`}</td><td>${control(d)}</td></tr>`,
    )
    .join("");
  return page(
    ctx,
    s,
    "Destinations",
    `<h1>Destinations</h1>
<div class="scroll"><table class="destinations"><thead><tr><th>destination</th><th>state</th><th class="num">waiting</th><th class="num">in flight</th><th class="num">failed</th><th class="num">failure rate</th><th>last error</th><th></th></tr></thead>
<tbody>${rows}</tbody></table></div>
<p class="note">Healthy: forwarding, its last try went through. Failing, still sending: its last tries failed, and each delivery is retried with backoff (the breaker is closed). Failing, paused for N s: too many failed in a row, so its deliveries wait without spending attempts until one probe tries again (the breaker is open). Paused by an operator, or after a 410 Gone: held until resumed; nothing is discarded. The failure rate is over the breaker's current window.</p>`,
    flash,
  );
};

/** failures groups the failed deliveries by their normalised error, each group with a retry. */
export const failures = async (ctx: PageContext, s: Session, flash: Flash | null) => {
  const groups = await failureGroups(ctx.inbox, ctx.redact);
  // The list link narrows by the group's longest literal piece: a filter cannot say the normalised key.
  const literal = (key: string) =>
    key.split(/<\w+>|\[hidden\]/).reduce((a, b) => (b.trim().length > a.length ? b.trim() : a), "");
  const rows = groups
    .map(
      (
        g,
      ) => `<tr><td class="num"><a href="/deliveries?${escape(new URLSearchParams({ status: "failed", error: literal(g.key) }).toString())}">${g.count.toLocaleString("en")}</a></td><td><code>${escape(g.key)}</code><div class="sample">e.g. ${escape(g.sample ?? "")}</div></td>
<td class="time">${escape(utc(g.latest))}</td><td>${action(ctx, s, "/retry-group", "Retry all", { group: g.key })}</td></tr>`,
    )
    .join("");
  return page(
    ctx,
    s,
    "Failures",
    `<h1>Failures, grouped by error</h1>
<div class="scroll"><table><thead><tr><th class="num">failed</th><th>error</th><th>latest</th><th></th></tr></thead>
<tbody>${rows || `<tr><td colspan="4">Nothing has failed.</td></tr>`}</tbody></table></div>`,
    flash,
  );
};

/** bulkConfirm asks before a bulk retry or replay, saying how many match. */
export const bulkConfirm = async (ctx: PageContext, s: Session, params: URLSearchParams) => {
  const kind = params.get("action");
  if (kind !== "retry" && kind !== "replay") throw new HttpError(400, "action: expected retry or replay");
  const filter = bulkFilter(params, kind, ctx.now());
  const n = await ctx.inbox.count(filter);
  // An age (since=2h) is posted as the time it stood for here, so the action takes the rows confirmed.
  const fields = {
    ...Object.fromEntries([...new URLSearchParams(filterQuery(params))]),
    ...(filter.since !== undefined ? { since: String(filter.since) } : {}),
    ...(filter.until !== undefined ? { until: String(filter.until) } : {}),
  };
  const verb = kind === "retry" ? "Retry" : "Replay";
  return page(
    ctx,
    s,
    `${verb}?`,
    `<h1>${verb} ${n.toLocaleString("en")} ${kind === "retry" ? "failed" : "done"} ${n === 1 ? "delivery" : "deliveries"}?</h1>
<p>Everything that matches this filter (${escape(describe(filter))}), not only the rows on screen, in batches of ${ctx.batchSize} beside the running worker.</p>
${n === 0 ? `<p>Nothing to do.</p>` : action(ctx, s, "/bulk", `${verb} ${n.toLocaleString("en")}`, { ...fields, action: kind, expected: String(n) }, "primary")}
<p><a href="/deliveries?${escape(filterQuery(params))}">Back to the list</a></p>`,
  );
};

/** auditPage lists the audit log, newest first: every change made here or through the API, who made it and when. */
export const auditPage = async (ctx: PageContext, s: Session, params: URLSearchParams) => {
  const after = params.get("after");
  const before = after === null || after === "" ? undefined : Number(after);
  if (before !== undefined && !Number.isSafeInteger(before))
    throw new HttpError(400, "after: expected an entry's number");
  const entries = await ctx.inbox.auditLog({ limit: ctx.pageSize, ...(before === undefined ? {} : { before }) });
  const rows = entries
    .map(
      (e) =>
        `<tr><td class="time">${escape(utc(e.at))}</td><td>${escape(e.who)}</td><td>${escape(e.operation)}</td><td><code>${escape(ctx.redact(e.target))}</code></td><td class="num">${e.count.toLocaleString("en")}</td></tr>`,
    )
    .join("");
  const next =
    entries.length === ctx.pageSize
      ? `<p><a href="/audit?after=${escape(String(entries.at(-1)!.seq))}">Older</a></p>`
      : "";
  return page(
    ctx,
    s,
    "Audit log",
    `<h1>Audit log</h1>
<div class="scroll"><table class="audit"><thead><tr><th>when</th><th>who</th><th>what</th><th>target</th><th class="num">rows changed</th></tr></thead>
<tbody>${rows || `<tr><td colspan="5">Nothing has been changed through the page or the API yet.</td></tr>`}</tbody></table></div>${next}
<p class="note">Every retry, replay, pause and resume made on this page (by its session) or through the API (by its key, <code>key:ID</code>; see <code>inbox.ts keys list</code>).</p>`,
  );
};
