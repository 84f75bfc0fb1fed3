// lib/admin/html.ts: how the operator page looks: its layout, the small pieces every page shows (times,
// badges, a chart, a body three ways), the login and error pages, and its own CSS and script. Everything shown
// passes through escape(); no page here reads the inbox (lib/admin/pages.ts does).

import { allows } from "../api/keys.ts";
import { utc } from "../format.ts";
import type { DestinationState, Scope } from "../store.ts";
import type { Flash, Session } from "./session.ts";

/** View is what the layout needs to know of the page: whether it acts, and whether a token guards it. */
export interface View {
  readOnly: boolean;
  guarded: boolean;
}

/** acts says whether a session may do what needs scope here (write unless said): never on a --read-only page. */
export function acts(view: View, s: Session, scope: Scope = "write"): boolean {
  return !view.readOnly && allows(s.scope, scope);
}

/** escape makes any text safe inside HTML text and quoted attributes; everything shown passes through it. */
export function escape(value: unknown): string {
  return String(value ?? "").replace(/[&<>"'`]/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** age shows a wait in the largest unit that keeps it short: 45s, 12m, 3h, 2d. */
export function age(ms: number): string {
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return s < 172800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86400)}d`;
}

/** deliveryHref links to a delivery's own page. */
export function deliveryHref(d: { source: string; id: string }): string {
  return `/delivery?${new URLSearchParams({ source: d.source, id: d.id })}`;
}

/** bodyViews renders a body three ways: pretty JSON where it parses, the raw text where it is UTF-8, always base64. */
export function bodyViews(body: Buffer): { json?: string; text?: string; base64: string } {
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

/** statusBadge shows a status, or a destination's state, as a coloured badge. */
export function statusBadge(status: string): string {
  return `<span class="badge ${escape(status)}">${escape(status)}</span>`;
}

/** destinationLabel names a row's destination: a delivery no route chose has none. */
export function destinationLabel(name: string): string {
  return name === "" ? "(none)" : name;
}

/** Said is a destination's state as a person reads it at night: a tone for its colour, the words, and the breaker's terms. */
export interface Said {
  tone: "healthy" | "failing" | "paused";
  words: string;
  /** The breaker's own terms (closed, open, probe), for whoever wants them. */
  breaker: string;
}

/**
 * sayState puts a destination's state in words a person woken at night reads without knowing what a
 * breaker is: "healthy", "failing, paused for 30 s", "failing, still sending", "paused by an
 * operator". A closed breaker is not "fine" when its tries fail: it only means they are still being made.
 */
export function sayState(d: DestinationState, now: number): Said {
  if (d.state === "paused")
    return {
      tone: "paused",
      words:
        d.pausedReason !== null && /\b410\b/.test(d.pausedReason)
          ? "paused: it answered 410 Gone"
          : "paused by an operator",
      breaker: `paused, nothing discarded${d.pausedReason ? `: ${d.pausedReason}` : ""}`,
    };
  const inRow = `${d.failuresInRow} ${d.failuresInRow === 1 ? "failure" : "failures"} in a row`;
  if (d.state === "open") {
    if (d.probing)
      return {
        tone: "failing",
        words: "failing, trying one delivery now",
        breaker: `breaker open after ${inRow}; its probe is in flight`,
      };
    const seconds = Math.max(0, Math.ceil(((d.retryAt ?? now) - now) / 1000));
    return {
      tone: "failing",
      words: `failing, paused for ${seconds} s`,
      breaker: `breaker open after ${inRow}; probe at ${utc(d.retryAt).slice(11)}`,
    };
  }
  if (d.failuresInRow > 0)
    return {
      tone: "failing",
      words: "failing, still sending",
      breaker: `the last ${d.failuresInRow === 1 ? "try" : `${d.failuresInRow} tries`} failed; breaker closed (${inRow})`,
    };
  return { tone: "healthy", words: "healthy", breaker: "breaker closed" };
}

/** stateBadge shows sayState()'s words as a badge coloured by their tone. */
export function stateBadge(said: Said): string {
  return `<span class="badge ${said.tone}">${escape(said.words)}</span>`;
}

/** chart draws received, done and failed per bucket as three polylines in a small SVG, no script needed. */
export function chart(buckets: { start: number; received: number; done: number; failed: number }[]): string {
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
  <text class="tick" x="${pad}" y="${height - 6}">${escape(utc(first).slice(11, 16))}</text>
  <text class="tick" x="${width - pad}" y="${height - 6}" text-anchor="end">${escape(utc(last).slice(11, 16))} UTC</text>
  <text class="tick" x="${pad}" y="14">${max}/min</text>
  ${line("received")}${line("done")}${line("failed")}
</svg>
<p class="legend"><span class="key received"></span>received <span class="key done"></span>done <span class="key failed"></span>failed, per minute</p>`;
}

/**
 * page lays a page out: the header with its navigation, a read-only badge (a --read-only page, or a read key's
 * session), the key a session logged in with, log out where a cookie logged in, and the flash, with the value
 * it shows once (a new key) where it has one.
 */
export const page = (view: View, s: Session, title: string, body: string, flash?: Flash | null) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escape(title)} · webhook inbox</title><link rel="stylesheet" href="/admin.css"><script src="/admin.js" defer></script></head>
<body><header><a class="brand" href="/">webhook inbox</a><nav><a href="/">Overview</a><a href="/deliveries">Deliveries</a><a href="/destinations">Destinations</a><a href="/failures">Failures</a><a href="/config">Configuration</a><a href="/keys">Keys</a><a href="/audit">Audit</a></nav>
${acts(view, s) ? "" : `<span class="badge readonly">read-only</span>`}
${s.key === undefined ? "" : `<span class="who">${escape(s.who.replace(/@.*/, ""))} (${escape(s.scope)})</span>`}
${view.guarded && s.id !== "bearer" ? `<form method="post" action="/logout" class="logout"><input type="hidden" name="csrf" value="${escape(s.csrf)}"><button>Log out</button></form>` : ""}
</header><main>${flash ? `<p class="flash">${escape(flash.text)}</p>${flash.once === undefined ? "" : `<pre class="once" id="once">${escape(flash.once)}</pre>`}` : ""}${body}</main></body></html>`;

/** hidden is the CSRF field every form of the page carries. */
export const hidden = (s: Session) => `<input type="hidden" name="csrf" value="${escape(s.csrf)}">`;
/** action is a one-button form that posts an action, or nothing where the session may not (scope: write unless said). */
export const action = (
  view: View,
  s: Session,
  path: string,
  label: string,
  fields: Record<string, string>,
  cls = "",
  scope: Scope = "write",
) =>
  !acts(view, s, scope)
    ? ""
    : `<form method="post" action="${escape(path)}" class="inline">${hidden(s)}${Object.entries(fields)
        .map(([k, v]) => `<input type="hidden" name="${escape(k)}" value="${escape(v)}">`)
        .join("")}<button class="${escape(cls)}">${escape(label)}</button></form>`;

/** loginPage asks for the admin token, with a message when the last one given was wrong. */
export const loginPage = (
  flash?: string,
) => `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Log in · webhook inbox</title><link rel="stylesheet" href="/admin.css"></head><body><main class="login"><h1>webhook inbox</h1>
${flash ? `<p class="flash">${escape(flash)}</p>` : ""}<form method="post" action="/login"><label>Admin token, or an API key <input type="password" name="token" autocomplete="current-password" autofocus></label> <button class="primary">Log in</button></form>
<p class="note">The page's token acts as admin; an API key (<code>wik_…</code>) as its scope: a read key looks and changes nothing.</p></main></body></html>`;

/** errorPage says what went wrong with a request, or only that something did, for a 500. */
export function errorPage(status: number, text: string): string {
  return `<!doctype html><meta charset="utf-8"><link rel="stylesheet" href="/admin.css"><main><h1>${status}</h1><p>${escape(text)}</p><p><a href="/">Overview</a></p></main>`;
}

// ---- The page's own CSS and script, served from this file so nothing comes from elsewhere ----------

/** CSS is the page's one style sheet, served as /admin.css. */
export const CSS = `
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
/* An ID, a source, a destination or an event type of one long word (a GitHub delivery's UUID,
   pull_request_review_comment) may break anywhere, so the row fits and the error column is never pushed out of sight. */
table.list td { overflow-wrap: anywhere; } table.list .badge { overflow-wrap: normal; white-space: nowrap; }
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
/* A delivery's tries: the answer's status or error, its headers and first bytes folded beneath. */
table.tries td.ok { color: var(--done); font-weight: 600; } table.tries td.error { max-width: 48rem; }
table.tries details { font-weight: normal; } table.tries details summary { color: var(--muted); font-size: .85rem; cursor: pointer; } table.tries pre { max-height: 16rem; max-width: 48rem; margin: .3rem 0; }
.badge.closed, .badge.healthy { background: var(--done); } .badge.open, .badge.failing { background: var(--failed); } .badge.paused { background: var(--processing); }
.held { background: #fff6e8; border: 1px solid #efd3a6; padding: .5rem .8rem; border-radius: 4px; }
.detail { color: var(--muted); font-size: .85rem; } form.pause { display: inline-flex; gap: .3rem; } form.pause input { width: 9rem; }
/* The configuration's pages: forms laid out in columns that wrap, what was refused, what a filter said. */
.problem { background: #fff4f3; border: 1px solid #f0c9c5; color: #7d1c14; padding: .5rem .8rem; border-radius: 4px; margin: 0 0 .8rem; overflow-wrap: anywhere; }
.problem ul { margin: .3rem 0 0; } .problem p { margin: .4rem 0 0; }
form.edit { display: flex; flex-direction: column; gap: .6rem; max-width: 52rem; }
form.edit label { display: flex; flex-direction: column; font-size: .85rem; color: var(--muted); gap: .15rem; }
form.edit input, form.edit select, form.edit textarea { color: var(--fg); font-size: .95rem; }
textarea { font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, monospace; padding: .4rem .5rem; border: 1px solid #b9c2cd; border-radius: 4px; width: 100%; }
fieldset { border: 1px solid var(--line); border-radius: 6px; background: var(--card); padding: .5rem .8rem .7rem; margin: 0; display: flex; flex-direction: column; gap: .5rem; }
legend { font-weight: 600; padding: 0 .3rem; } .row { display: flex; flex-wrap: wrap; gap: .5rem .8rem; align-items: end; }
.row label { flex: 1 1 8rem; } .hint { color: var(--muted); font-size: .82rem; margin: 0; }
.verdict { margin: 0; padding: .4rem .7rem; border-radius: 4px; font-weight: 600; }
.verdict.match { background: #e9f6ee; color: var(--done); border: 1px solid #b6dfc5; } .verdict.nomatch { background: #f4f5f7; color: var(--fg); border: 1px solid var(--line); }
button.danger { color: var(--failed); border-color: #e4b3ae; } button:disabled { opacity: .55; cursor: not-allowed; }
pre.once { background: #fffbe6; color: #3b2f00; border: 1px solid #e8d68a; font-size: 14px; user-select: all; }
header .who { color: #dfe6ee; font-size: .85rem; }
.badge.way.operator { background: #4a5666; } .badge.way.api { background: #6b4fa8; }
.badge.scope.read { background: #4a5666; } .badge.scope.write { background: var(--accent); } .badge.scope.admin { background: #6b4fa8; }
tr.revoked td { color: var(--muted); text-decoration: line-through; } tr.revoked td:last-child { text-decoration: none; }
.routelist { margin: 0; padding-left: 1.2rem; } .routelist li { margin-bottom: .2rem; } .routelist a { text-decoration: none; color: var(--fg); }
.routelist a:hover code, .routelist a:hover strong { text-decoration: underline; } a.add { font-size: .85rem; }
.changes { margin: 0; padding-left: 1rem; } .changes li { margin: .1rem 0; } .sha { color: var(--muted); font-size: .8rem; white-space: nowrap; }
td.url { overflow-wrap: anywhere; min-width: 10rem; } td.acts, td.name { white-space: nowrap; } .badges { margin-top: .25rem; display: flex; flex-wrap: wrap; gap: .25rem; }
.badges .badge, .config-destinations .badge { white-space: nowrap; } td.limits { white-space: nowrap; } td.transform { min-width: 11rem; } .sample code { font-size: .82rem; }
.version { margin: 0 0 .6rem; } h2 .button { font-size: .85rem; font-weight: 600; margin-left: .6rem; vertical-align: middle; }
@media (max-width: 560px) {
  table.list thead { display: none; } table.list tr { display: block; padding: .5rem .6rem; border-bottom: 1px solid var(--line); }
  table.list td { display: inline-block; padding: 0 .6rem 0 0; border: 0; } table.list td.error { display: block; min-width: 0; max-width: none; }
  table.list td.num::before { content: "tries "; color: var(--muted); } table.list td.dest::before { content: "→ "; color: var(--muted); }
}
@media (max-width: 560px) { main { padding: .6rem; } .meta { grid-template-columns: 1fr; } .meta dt { margin-top: .3rem; } .filters label { flex: 1 1 45%; } .filters input, .filters select { width: 100%; } }
`;

/** JS is the page's one script, served as /admin.js: the overview refreshes itself while it is in sight, and stops asking while the tab is hidden. */
export const JS = `
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
