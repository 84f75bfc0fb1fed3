// lib/admin/config.ts: the configuration on the operator page: the version in force (who applied it, when, which
// way, whose hand wrote each part), its sources, routes, destinations and secrets, and its history; each read the
// API's own operation run as the session. The forms that change it are lib/admin/editors.ts's.

import type { AnswerOf } from "../api/api.ts";
import { utc } from "../format.ts";
import { destinationStates } from "../operations/actions.ts";
import { acts, escape, hidden, page, sayState, stateBadge } from "./html.ts";
import type { PageContext } from "./pages.ts";
import { callerOf, type Flash, type Session } from "./session.ts";

/** Doc is a configuration's document, or one part's settings, as JSON. */
export type Doc = Record<string, unknown>;
/** Config is the configuration in force as getConfig answers it. */
export type Config = AnswerOf<"getConfig">;
/** isObject tells a JSON object from an array, null or a scalar. */
export const isObject = (v: unknown): v is Doc => typeof v === "object" && v !== null && !Array.isArray(v);

/** Problem is a change refused, shown above the form that asked for it, kept as it was sent. */
export interface Problem {
  status: number;
  detail: string;
  /** For a refused removal: the deliveries that wait for the destination. */
  waiting?: { destination: string; n: number }[];
  /** For a stale version: what was applied since the form was read. */
  since?: string[];
  /** Where to read it again, as it is now. */
  again?: string;
}

/** problemBox shows a refused change: its detail, and for a stale version what changed since and where to read it again. */
export const problemBox = (p: Problem | undefined) =>
  p === undefined
    ? ""
    : `<div class="problem" role="alert"><strong>Not saved.</strong> ${escape(p.detail)}${
        p.since && p.since.length > 0
          ? `<p>Changed since you read it:</p><ul>${p.since.map((l) => `<li><code>${escape(l)}</code></li>`).join("")}</ul>${
              p.again
                ? `<p><a href="${escape(p.again)}">Read it again as it is now</a> (the edits below are not kept), then make them again.</p>`
                : ""
            }`
          : ""
      }</div>`;

/** readConfig is the configuration in force as the API shows it (secrets in the clear masked), read as the session. */
export const readConfig = async (ctx: PageContext, s: Session): Promise<Config> =>
  (await ctx.api.perform("getConfig", {}, callerOf(s))).body;

const wayWords = (way: string | null | undefined) =>
  way === "api" ? "through the API or this page" : way === "operator" ? "from the operator's file" : "";
/** trustBadge says whose hand wrote a part (or which way a version came): operator, or API. */
export const trustBadge = (way: string | undefined) =>
  `<span class="badge way ${escape(way ?? "operator")}">${way === "api" ? "API" : "operator"}</span>`;
const code = (v: unknown) => `<code>${escape(typeof v === "string" ? v : JSON.stringify(v))}</code>`;

/** sourcesOf lists a document's sources with their settings. */
export const sourcesOf = (doc: Doc | null) =>
  Object.entries(doc ?? {}).filter(([name, v]) => !name.startsWith("$") && isObject(v)) as [string, Doc][];
/** destinationsOf lists a document's destinations (its $destinations) with their settings. */
export const destinationsOf = (doc: Doc | null): [string, Doc][] =>
  isObject(doc?.$destinations)
    ? (Object.entries(doc.$destinations).filter(([, v]) => isObject(v)) as [string, Doc][])
    : [];

// routeParts says a route in a few words: where it goes, and its types, filter and transform.
function routeParts(route: unknown, transforms: Record<string, string>): string {
  const r = typeof route === "string" ? { to: route } : isObject(route) ? route : { to: String(route) };
  const bits = [`→ <strong>${escape(String(r.to))}</strong>`];
  if (Array.isArray(r.types)) bits.push(`types ${code(r.types.join(", "))}`);
  if (r.filter !== undefined) bits.push(`filter ${code(r.filter)}`);
  if (typeof r.transform === "string") bits.push(`transform ${transformShown(r.transform, transforms)}`);
  return bits.join(" ");
}

const transformShown = (module: string, transforms: Record<string, string>) =>
  `${code(module)}${transforms[module] ? ` <span class="sha">sha256 ${escape(transforms[module].slice(0, 12))}…</span>` : ""}`;

// limits says a destination's limits, its defaults where it sets none.
function limits(d: Doc): string {
  const bits: string[] = [];
  if (d.timeout !== undefined) bits.push(`timeout ${escape(String(d.timeout))} s`);
  if (d.connectTimeout !== undefined) bits.push(`connect ${escape(String(d.connectTimeout))} s`);
  if (d.maxInFlight !== undefined) bits.push(`${escape(String(d.maxInFlight))} in flight`);
  if (d.rate !== undefined)
    bits.push(`${escape(String(d.rate))}/s${d.burst === undefined ? "" : `, burst ${escape(String(d.burst))}`}`);
  if (d.breaker === false) bits.push("no breaker");
  else if (isObject(d.breaker)) bits.push(`breaker ${code(d.breaker)}`);
  return bits.join("<br>") || `<span class="note">defaults</span>`;
}

// headersShown lists a destination's own headers: references as they are written, never a value they name.
function headersShown(d: Doc): string {
  const lines = Object.entries(isObject(d.headers) ? d.headers : {}).map(([k, v]) => `${escape(k)}: ${code(v)}`);
  if (typeof d.bearer === "string") lines.push(`authorization: bearer ${code(d.bearer)}`);
  if (typeof d.basic === "string") lines.push(`authorization: basic ${code(d.basic)}`);
  return lines.join("<br>") || "–";
}

const secretShown = (v: unknown) => (v === undefined ? "–" : Array.isArray(v) ? v.map(code).join("<br>") : code(v));

/** configPage shows the configuration in force, its sources and destinations, and the secrets by name. */
export async function configPage(
  ctx: PageContext,
  s: Session,
  flash: Flash | null,
  problem?: Problem,
): Promise<string> {
  const config = await readConfig(ctx, s);
  const doc = config.document;
  const writes = acts(ctx, s);
  const trust = config.trust;
  const version = String(config.version);
  const head =
    config.version === 0
      ? `<p class="version">No configuration has been applied to this inbox: the receivers serve the default source, the workers the handler. A document needs a source: apply one with <code>inbox.ts config apply</code> or through the API (<code>PUT /api/v1/config</code>); then its destinations and routes can be made here.</p>`
      : `<p class="version">Version <strong>${escape(version)}</strong> in force, applied ${escape(utc(config.appliedAt))} by <code>${escape(config.actor)}</code>, ${escape(wayWords(config.way))}. <a href="/config/history">History</a> · <a href="/config/version?version=${escape(version)}">Its document</a></p>`;
  const sources = sourcesOf(doc)
    .map(([name, settings]) => {
      const routes = Array.isArray(settings.routes) ? settings.routes : undefined;
      const list =
        routes === undefined
          ? `<p class="note">No routes: every delivery goes to the handler.</p>`
          : `<ol class="routelist">${routes
              .map(
                (r, i) =>
                  `<li><a href="/config/route?${escape(new URLSearchParams({ source: name, route: String(i) }).toString())}">${routeParts(r, config.transforms)}</a></li>`,
              )
              .join("")}</ol>`;
      const provider =
        settings.provider ?? (isObject(settings.broker) ? `broker (${settings.broker.type ?? "?"})` : "plain");
      return `<tr><td class="name"><strong>${escape(name)}</strong><div class="badges">${trustBadge(trust[`source ${name}`])}</div></td><td>${escape(String(provider))}<div class="sample">secret ${secretShown(settings.secret)}</div></td>
<td>${list}${writes ? `<a class="add" href="/config/route?${escape(new URLSearchParams({ source: name }).toString())}">Add a route</a>` : ""}</td></tr>`;
    })
    .join("");
  const named = destinationsOf(doc);
  const states = new Map(
    (
      await destinationStates(
        ctx.inbox,
        named.map(([n]) => n),
      )
    ).map((d) => [d.name, d] as const),
  );
  const now = ctx.now();
  const destinations = named
    .map(([name, d]) => {
      const state = states.get(name);
      const where =
        d.type === undefined || d.type === "http"
          ? code(d.url ?? "")
          : `${escape(String(d.type))} ${code(d.url ?? "")}`;
      const edit = `/config/destination?${new URLSearchParams({ name })}`;
      const remove = writes
        ? `<form method="post" action="/config/destination/delete" class="inline">${hidden(s)}<input type="hidden" name="name" value="${escape(name)}"><input type="hidden" name="version" value="${escape(version)}"><button class="danger">Delete</button></form>`
        : "";
      return `<tr><td class="name"><a href="${escape(edit)}"><strong>${escape(name)}</strong></a><div class="badges">${state ? stateBadge(sayState(state, now)) : ""} ${trustBadge(trust[`destination ${name}`])}</div></td><td class="url">${where}</td>
<td>secret ${secretShown(d.secret)}${headersShown(d) === "–" ? "" : `<div class="sample">${headersShown(d)}</div>`}</td>
<td class="limits">${limits(d)}</td><td class="transform">${typeof d.transform === "string" ? transformShown(d.transform, config.transforms) : "–"}</td>
<td class="acts"><a class="button" href="${escape(edit)}">${writes ? "Edit" : "View"}</a> ${remove}</td></tr>`;
    })
    .join("");
  const operator = isObject(doc?.$operator)
    ? `<h2>The operator's URL</h2><p>Pauses and resumes are told to ${code(doc.$operator.url ?? "")} ${trustBadge(trust.$operator)}</p>`
    : "";
  return page(
    ctx,
    s,
    "Configuration",
    `<h1>Configuration</h1>${problemBox(problem)}${problem?.waiting ? waitingChoice(s, problem, config.version) : ""}${head}
<h2>Sources</h2>
<div class="scroll"><table class="sources"><thead><tr><th>source</th><th>provider</th><th>routes</th></tr></thead>
<tbody>${sources || `<tr><td colspan="3">No sources.</td></tr>`}</tbody></table></div>
<h2>Destinations ${writes && config.version > 0 ? `<a class="button primary" href="/config/destination">New destination</a>` : ""}</h2>
<div class="scroll"><table class="config-destinations"><thead><tr><th>destination</th><th>where</th><th>signed with, and its headers</th><th>limits</th><th>transform</th><th></th></tr></thead>
<tbody>${destinations || `<tr><td colspan="6">No destinations: the handler takes every delivery.</td></tr>`}</tbody></table></div>
${operator}
${await secretsSection(ctx, s)}
<p class="note">Secrets are shown as the references the configuration names (<code>env:NAME</code>, <code>secret:NAME</code>), never their values. The <span class="badge way operator">operator</span> and <span class="badge way api">API</span> badges say whose hand last wrote each part: a part changed here or through the API is held to the operator's rule (<a href="/audit">every change</a> is in the audit log).</p>`,
    flash,
  );
}

// waitingChoice offers, after a removal refused while deliveries wait, to remove it all the same and set them aside.
const waitingChoice = (s: Session, p: Problem, version: number) => {
  const [first] = p.waiting ?? [];
  if (!first) return "";
  const n = (p.waiting ?? []).reduce((a, w) => a + w.n, 0);
  return `<form method="post" action="/config/destination/delete" class="inline">${hidden(s)}<input type="hidden" name="name" value="${escape(first.destination)}"><input type="hidden" name="version" value="${version}"><input type="hidden" name="cancelWaiting" value="true"><button class="danger">Delete ${escape(first.destination)}, and set its ${n.toLocaleString("en")} waiting ${n === 1 ? "delivery" : "deliveries"} aside as failed</button></form>`;
};

// secretsSection lists the secrets by name, with the form that sets one (its value never shown again).
async function secretsSection(ctx: PageContext, s: Session): Promise<string> {
  const { items } = (await ctx.api.perform("listSecrets", {}, callerOf(s))).body;
  const writes = acts(ctx, s);
  const rows = items
    .map(
      (x) =>
        `<tr><td><code>secret:${escape(x.name)}</code></td><td class="time">${escape(utc(x.setAt))}</td><td>${escape(x.setBy)}</td><td>${
          writes
            ? `<form method="post" action="/config/secret/delete" class="inline">${hidden(s)}<input type="hidden" name="name" value="${escape(x.name)}"><button>Delete</button></form>`
            : ""
        }</td></tr>`,
    )
    .join("");
  return `<h2 id="secrets">Secrets</h2>
<div class="scroll"><table class="secrets"><thead><tr><th>name</th><th>set</th><th>by</th><th></th></tr></thead>
<tbody>${rows || `<tr><td colspan="4">No secrets in the store.</td></tr>`}</tbody></table></div>
${
  writes
    ? `<form method="post" action="/config/secret" class="filters">${hidden(s)}<label>Name <input name="name" required maxlength="128" placeholder="app_signing"></label><label>Value <input name="value" type="password" required autocomplete="off"></label><button>Set the secret</button></form>
<p class="note">Sealed under the operator's key as it arrives; no page, answer or log shows it again. Name it in a destination as <code>secret:NAME</code>.</p>`
    : ""
}`;
}

// ---- The history ----

/** historyPage lists the configuration's versions, newest first, each with what it changed from the one before. */
export async function historyPage(ctx: PageContext, s: Session, params: URLSearchParams): Promise<string> {
  const after = params.get("after");
  const { body } = await ctx.api.perform(
    "listConfigVersions",
    { query: { limit: String(ctx.pageSize), ...(after ? { after } : {}) } },
    callerOf(s),
  );
  const rows = body.items
    .map(
      (v) =>
        `<tr><td class="num"><a href="/config/version?version=${v.version}">${v.version}</a></td><td class="time">${escape(utc(v.appliedAt))}</td><td><code>${escape(v.actor)}</code></td><td>${trustBadge(v.way)}</td>
<td><ul class="changes">${v.changes.map((l) => `<li><code>${escape(ctx.redact(l))}</code></li>`).join("") || "<li>no change</li>"}</ul></td></tr>`,
    )
    .join("");
  return page(
    ctx,
    s,
    "Configuration history",
    `<p class="crumbs"><a href="/config">Configuration</a> /</p><h1>History</h1>
<div class="scroll"><table class="history"><thead><tr><th class="num">version</th><th>applied</th><th>by</th><th>way</th><th>what it changed</th></tr></thead>
<tbody>${rows || `<tr><td colspan="5">No configuration has been applied.</td></tr>`}</tbody></table></div>
${body.next === null ? "" : `<p><a rel="next" href="/config/history?after=${body.next}">Older</a></p>`}
<p class="note">Each version's changes from the one before it, down to the field; a value that may be a secret is never shown. Open a version to see its document, or to compare it with any other.</p>`,
  );
}

/** versionPage shows one version's document, and what it changed from another (the one before it unless ?against=). */
export async function versionPage(ctx: PageContext, s: Session, params: URLSearchParams): Promise<string> {
  const version = params.get("version") ?? "";
  const against = params.get("against");
  const { body: v } = await ctx.api.perform(
    "getConfigVersion",
    { params: { version }, query: against === null || against === "" ? {} : { against } },
    callerOf(s),
  );
  const transforms = Object.entries(v.transforms)
    .map(([m, sha]) => `<li><code>${escape(m)}</code> sha256 <code>${escape(sha)}</code></li>`)
    .join("");
  return page(
    ctx,
    s,
    `Configuration version ${v.version}`,
    `<p class="crumbs"><a href="/config">Configuration</a> / <a href="/config/history">History</a> /</p><h1>Version ${v.version}</h1>
<p class="version">Applied ${escape(utc(v.appliedAt))} by <code>${escape(v.actor)}</code>, ${escape(wayWords(v.way))}.</p>
<form method="get" action="/config/version" class="filters"><input type="hidden" name="version" value="${v.version}"><label>Compared with version <input name="against" type="number" min="0" value="${v.against}" size="5"></label><button>Compare</button></form>
<h2>${v.against === 0 ? "What it set up" : `What changed from version ${v.against}`}</h2>
<ul class="changes">${v.changes.map((l) => `<li><code>${escape(ctx.redact(l))}</code></li>`).join("") || "<li>nothing</li>"}</ul>
<h2>Its document</h2><pre class="body">${escape(ctx.redact(JSON.stringify(v.document, null, 2)))}</pre>
${transforms ? `<h2>Its transforms</h2><ul>${transforms}</ul>` : ""}
<p class="note">Parts and whose hand wrote them: ${Object.entries(v.trust)
      .map(([part, way]) => `${escape(part)} ${trustBadge(way)}`)
      .join(" · ")}</p>`,
  );
}
