// lib/admin/editors.ts: the forms that change the configuration on the operator page: a destination or a route
// made, changed or removed, a filter tried on a stored delivery, a transform previewed, a secret set. Each is the
// API's own operation run as the session (Api.perform()), on the version its form was read at (expectedVersion).

import { createHash } from "node:crypto";
import type { PreviewRequest } from "../forwarding/preview.ts";
import { message } from "../log.ts";
import { HttpError } from "../operations/input.ts";
import { DEFAULTS } from "../defaults.ts";
import {
  type Config,
  configPage,
  destinationsOf,
  type Doc,
  isObject,
  type Problem,
  problemBox,
  readConfig,
  sourcesOf,
  trustBadge,
} from "./config.ts";
import { acts, escape, hidden, page } from "./html.ts";
import { type Done, type Form, type PageContext, previewText, type Shown } from "./pages.ts";
import { callerOf, type Flash, type Session } from "./session.ts";

// problemOf turns what an operation threw into the problem to show; anything but a refusal is the server's.
function problemOf(error: unknown): Problem {
  if (!(error instanceof HttpError)) throw error;
  const waiting = (error as { members?: { waiting?: Problem["waiting"] } }).members?.waiting;
  return { status: error.status, detail: message(error), ...(waiting ? { waiting } : {}) };
}

// withSince adds to a refusal of a stale version what was applied since the version the form was read at.
async function withSince(ctx: PageContext, s: Session, p: Problem, read: number | undefined): Promise<Problem> {
  if (p.status !== 409 || read === undefined || !/changed since it was read|applied meanwhile/.test(p.detail)) return p;
  const now = (await readConfig(ctx, s)).version;
  if (now <= read) return p;
  const since = await ctx.api.perform(
    "getConfigVersion",
    { params: { version: now }, query: { against: read } },
    callerOf(s),
  );
  return { ...p, since: since.body.changes };
}

// versionOf reads the version a form was read at: a change without one applies over whatever is in force, as
// the API's without expectedVersion does (the page's forms always carry it).
function versionOf(form: URLSearchParams): number | undefined {
  const v = form.get("version");
  if (v === null || v === "") return undefined;
  if (!/^\d+$/.test(v)) throw new HttpError(400, `version: expected the version the form was read at, got ${v}`);
  return Number(v);
}

// ---- A destination: its settings as a form, and the form back into settings ----

/** DestinationFields are a destination's settings as its form holds them, every one text. */
interface DestinationFields {
  url: string;
  secret: string;
  headers: string;
  timeout: string;
  connectTimeout: string;
  maxInFlight: string;
  rate: string;
  burst: string;
  /** The transform's code, when it is code. */
  transform: string;
  /** The operator's module path, when the transform is one: a change from the page keeps it only as it is. */
  transformModule: string;
  more: string;
}

const NUMBERS = ["timeout", "connectTimeout", "maxInFlight", "rate", "burst"] as const;
const OWN = new Set(["url", "secret", "headers", "transform", ...NUMBERS]);

// transformFields splits a transform setting into the form's two fields: its code, or the module it names.
const transformFields = (t: unknown): { transform: string; transformModule: string } =>
  typeof t === "string"
    ? { transform: "", transformModule: t }
    : { transform: isObject(t) && typeof t.code === "string" ? t.code : "", transformModule: "" };

// transformSetting is the transform a form saves: its code, else the module it had (which a change from the
// page may not name: the API refuses it with the rule's own line), else none. A form sends its lines ended
// with CRLF, as HTML says: the code is kept as it was typed.
const transformSetting = (f: { transform: string; transformModule: string }): unknown =>
  f.transform.trim() !== ""
    ? { code: f.transform.replace(/\r\n/g, "\n") }
    : f.transformModule.trim() !== ""
      ? f.transformModule.trim()
      : undefined;

// appliedSha is the SHA-256 a version applied for a form's transform, if it has one.
function appliedSha(
  f: { transform: string; transformModule: string },
  transforms: Record<string, string>,
): string | undefined {
  if (f.transformModule) return transforms[f.transformModule];
  if (f.transform.trim() === "") return undefined;
  const code = f.transform.replace(/\r\n/g, "\n");
  return transforms[`code:${createHash("sha256").update(code).digest("hex").slice(0, 12)}`];
}

// transformEditor is the transform's fieldset: a textarea for its code, in either contract, and what it replaces.
function transformEditor(
  f: { transform: string; transformModule: string },
  sha: string | undefined,
  ro: string,
  route: boolean,
): string {
  return `<fieldset><legend>Transform</legend>
<label>Code (JavaScript, run in the sandbox) <textarea name="transform" rows="6" spellcheck="false" placeholder='export default (d) => ({ body: { id: d.id, type: d.json.type } });&#10;// or Hookdeck&#39;s: addHandler("transform", (request, context) => request);'${ro}>${escape(f.transform)}</textarea></label>
<input type="hidden" name="transformModule" value="${escape(f.transformModule)}">
${f.transformModule ? `<p class="note">Now the operator's module <code>${escape(f.transformModule)}</code>, a file on the workers' host, which a change from the page may not name: write code above to replace it, or change it in the operator's file.</p>` : ""}
${sha ? `<p class="hint">Applied as sha256 <code>${escape(sha)}</code>.</p>` : ""}
<p class="hint">${route ? "Overrides the destination's for this route. " : ""}Its <code>export default (delivery) =&gt; …</code> returns <code>{ body?, headers? }</code> or <code>null</code> to skip; Hookdeck's <code>addHandler("transform", …)</code> runs as it is. No file, network or timer in reach; checked when saved (docs/forwarding.md, transforms as code).</p>
</fieldset>`;
}

// fieldsOf reads a destination's settings into its form's fields; what the form has no field for is "more".
function fieldsOf(d: Doc): DestinationFields {
  const text = (v: unknown) => (v === undefined ? "" : typeof v === "string" ? v : JSON.stringify(v));
  const rest = Object.fromEntries(Object.entries(d).filter(([k]) => !OWN.has(k)));
  return {
    url: text(d.url),
    secret: Array.isArray(d.secret) ? d.secret.map(String).join(", ") : text(d.secret),
    headers: Object.entries(isObject(d.headers) ? d.headers : {})
      .map(([k, v]) => `${k}: ${text(v)}`)
      .join("\n"),
    timeout: text(d.timeout),
    connectTimeout: text(d.connectTimeout),
    maxInFlight: text(d.maxInFlight),
    rate: text(d.rate),
    burst: text(d.burst),
    ...transformFields(d.transform),
    more: Object.keys(rest).length === 0 ? "" : JSON.stringify(rest, null, 2),
  };
}

// fieldsFrom reads the fields as posted.
function fieldsFrom(form: URLSearchParams): DestinationFields {
  const get = (k: string) => form.get(k) ?? "";
  return {
    url: get("url"),
    secret: get("secret"),
    headers: get("headers"),
    timeout: get("timeout"),
    connectTimeout: get("connectTimeout"),
    maxInFlight: get("maxInFlight"),
    rate: get("rate"),
    burst: get("burst"),
    transform: get("transform"),
    transformModule: get("transformModule"),
    more: get("more"),
  };
}

// jsonObject reads a textarea of JSON settings: empty is none; anything but an object is a 400 naming it.
function jsonObject(text: string, what: string): Doc {
  if (text.trim() === "") return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new HttpError(400, `${what}: not JSON: ${message(error)}`);
  }
  if (!isObject(parsed)) throw new HttpError(400, `${what}: expected a JSON object`);
  return parsed;
}

// settingsOf makes a destination's settings from its fields, in the order a sources file writes them. The
// checks are the configuration's own (plan()); here only what a form cannot say otherwise.
function settingsOf(f: DestinationFields): Doc {
  const out: Doc = {};
  if (f.url.trim() !== "") out.url = f.url.trim();
  const secrets = f.secret
    .split(",")
    .map((x) => x.trim())
    .filter(Boolean);
  if (secrets.length > 0) out.secret = secrets.length === 1 ? secrets[0] : secrets;
  const headers: Record<string, string> = {};
  for (const line of f.headers.split("\n")) {
    if (line.trim() === "") continue;
    const colon = line.indexOf(":");
    if (colon <= 0)
      throw new HttpError(400, `headers: expected one "name: value" a line, got ${JSON.stringify(line.trim())}`);
    headers[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
  }
  if (Object.keys(headers).length > 0) out.headers = headers;
  for (const k of NUMBERS) {
    const v = f[k].trim();
    if (v === "") continue;
    const n = Number(v);
    if (!Number.isFinite(n)) throw new HttpError(400, `${k}: expected a number, got ${JSON.stringify(v)}`);
    out[k] = n;
  }
  const transform = transformSetting(f);
  if (transform !== undefined) out.transform = transform;
  const more = jsonObject(f.more, "more settings");
  for (const k of Object.keys(more))
    if (OWN.has(k)) throw new HttpError(400, `more settings: ${k} has its own field above; set it there`);
  return { ...out, ...more };
}

// A secret that is not a reference is not sent back to the browser it came from, even to refuse it.
const withoutClearSecret = (f: DestinationFields): DestinationFields => ({
  ...f,
  secret: f.secret
    .split(",")
    .map((x) => x.trim())
    .every((x) => x === "" || x.startsWith("env:") || x.startsWith("secret:"))
    ? f.secret
    : "",
});

interface DestinationView {
  /** Undefined for a new destination. */
  name: string | undefined;
  version: number;
  fields: DestinationFields;
  config: Config;
  problem?: Problem;
  preview?: string;
  tried?: { source: string; id: string };
  /** The name a refused new destination was given, kept in its form. */
  newName?: string;
}

// destinationForm lays out a destination's form, its preview below it.
function destinationForm(ctx: PageContext, s: Session, v: DestinationView, flash: Flash | null): string {
  const writes = acts(ctx, s);
  const f = v.fields;
  const ro = writes ? "" : " readonly";
  const input = (name: keyof DestinationFields, label: string, extra = "") =>
    `<label>${label} <input name="${name}" value="${escape(f[name])}"${extra}${ro}></label>`;
  const number = (name: keyof DestinationFields, label: string, hint: string) =>
    input(name, label, ` type="number" step="any" min="0" placeholder="${escape(hint)}"`);
  const sha = appliedSha(f, v.config.transforms);
  const title = v.name === undefined ? "New destination" : `Destination ${v.name}`;
  const form = `<form method="post" action="/config/destination" class="edit">${hidden(s)}
<input type="hidden" name="version" value="${escape(String(v.version))}">
${v.name === undefined ? `<label>Name <input name="name" required pattern="[A-Za-z0-9._~\\-]+" maxlength="200" placeholder="billing" value="${escape(v.newName ?? "")}"></label><input type="hidden" name="new" value="1">` : `<input type="hidden" name="name" value="${escape(v.name)}">`}
<fieldset><legend>Where it goes</legend>
${input("url", "URL", ` type="url" required placeholder="https://billing.example.com/webhooks"`)}
${input("secret", "Signing secret", ` placeholder="secret:billing_signing"`)}
<p class="hint">Each forward is signed as Standard Webhooks with it: <code>secret:NAME</code> (a secret of the store, set on the <a href="/config#secrets">configuration page</a>) or <code>env:NAME</code> where the operator allows it; several, comma-separated, while your app rotates.</p>
<label>Headers <textarea name="headers" rows="3" placeholder="x-team: payments&#10;x-api-key: secret:billing_key"${ro}>${escape(f.headers)}</textarea></label>
<p class="hint">One <code>name: value</code> a line; a value that is a secret is a reference.</p>
</fieldset>
<fieldset><legend>Limits</legend><div class="row">
${number("timeout", "Timeout (s)", String(DEFAULTS.forwardTimeoutMs / 1000))}${number("connectTimeout", "Connect (s)", String(DEFAULTS.connectTimeoutForwardMs / 1000))}${number("maxInFlight", "In flight", String(DEFAULTS.forwardInFlight))}${number("rate", "Rate (/s)", "no limit")}${number("burst", "Burst", "rate")}
</div></fieldset>
${transformEditor(f, sha, ro, false)}
<label>More settings (JSON) <textarea name="more" rows="4" placeholder='{"breaker": false, "forwardHeaders": true}'${ro}>${escape(f.more)}</textarea></label>
${writes ? `<p><button class="primary">${v.name === undefined ? "Create" : "Save"}</button> <a href="/config">Cancel</a></p>` : `<p class="note">This session may look, not change: saving needs a write key, or the page's token.</p>`}
</form>`;
  const preview =
    v.name === undefined
      ? ""
      : `<h2 id="preview">Preview a stored delivery through it</h2>
<form method="get" action="/config/destination" class="filters"><input type="hidden" name="name" value="${escape(v.name)}">
<label>Source <input name="source" value="${escape(v.tried?.source ?? "")}" size="12"></label><label>ID <input name="id" value="${escape(v.tried?.id ?? "")}" size="20"></label><button>Preview</button></form>
<p class="note">What this destination would be sent for it now, under the configuration in force (save first), its transform run; nothing is sent.</p>
${v.preview ?? ""}`;
  return page(
    ctx,
    s,
    title,
    `<p class="crumbs"><a href="/config">Configuration</a> /</p><h1>${escape(title)} ${v.name === undefined ? "" : trustBadge(v.config.trust[`destination ${v.name}`])}</h1>${problemBox(v.problem)}
<p class="note">Read at version ${escape(String(v.version))}: saving changes it only if it is still the version in force.</p>${form}${preview}`,
    flash,
  );
}

/** destinationPage shows a destination's form (a new one's without ?name=), and a stored delivery previewed through it. */
export async function destinationPage(
  ctx: PageContext,
  s: Session,
  params: URLSearchParams,
  flash: Flash | null,
): Promise<string> {
  const config = await readConfig(ctx, s);
  const name = params.get("name") ?? undefined;
  const found = name === undefined ? undefined : destinationsOf(config.document).find(([n]) => n === name)?.[1];
  if (name !== undefined && !found)
    throw new HttpError(404, `no destination ${name} in the configuration in force (version ${config.version})`);
  const source = params.get("source")?.trim();
  const id = params.get("id")?.trim();
  let preview: string | undefined;
  if (name !== undefined && source && id) preview = await previewFor(ctx, s, { source, id }, name);
  return destinationForm(
    ctx,
    s,
    {
      name,
      version: config.version,
      fields: found ? fieldsOf(found) : fieldsOf({}),
      config,
      ...(preview === undefined ? {} : { preview, tried: { source: source!, id: id! } }),
    },
    flash,
  );
}

// previewFor runs the API's preview of a stored delivery for one destination and shows its request.
async function previewFor(
  ctx: PageContext,
  s: Session,
  d: { source: string; id: string },
  to: string,
): Promise<string> {
  try {
    const { body } = await ctx.api.perform("previewDelivery", { params: d, query: { to } }, callerOf(s));
    const request = body.requests.find((r) => r.destination === to) as PreviewRequest | undefined;
    return `${body.notes.map((n) => `<p class="note">${escape(n)}</p>`).join("")}${
      request ? `<pre class="body preview">${escape(ctx.redact(previewText(request)))}</pre>` : ""
    }`;
  } catch (error) {
    return `<p class="problem">${escape(ctx.redact(problemOf(error).detail))}</p>`;
  }
}

// ---- A route of a source ----

/** RouteFields are a route's settings as its form holds them. */
interface RouteFields {
  to: string;
  types: string;
  filter: string;
  transform: string;
  transformModule: string;
  more: string;
}

const ROUTE_OWN = new Set(["to", "types", "filter", "transform"]);

function routeFieldsOf(route: unknown): RouteFields {
  const r = typeof route === "string" ? { to: route } : isObject(route) ? route : {};
  const rest = Object.fromEntries(Object.entries(r).filter(([k]) => !ROUTE_OWN.has(k)));
  return {
    to: typeof r.to === "string" ? r.to : "",
    types: Array.isArray(r.types) ? r.types.map(String).join(", ") : "",
    filter: r.filter === undefined ? "" : JSON.stringify(r.filter, null, 2),
    ...transformFields(r.transform),
    more: Object.keys(rest).length === 0 ? "" : JSON.stringify(rest, null, 2),
  };
}

function routeFieldsFrom(form: URLSearchParams): RouteFields {
  const get = (k: string) => form.get(k) ?? "";
  return {
    to: get("to"),
    types: get("types"),
    filter: get("filter"),
    transform: get("transform"),
    transformModule: get("transformModule"),
    more: get("more"),
  };
}

// routeOf makes a route from its fields: a plain name where it sets nothing else, as a sources file writes one.
function routeOf(f: RouteFields): unknown {
  const to = f.to.trim();
  if (to === "") throw new HttpError(400, "to: expected the destination this route goes to");
  const out: Doc = { to };
  const types = f.types
    .split(",")
    .map((t) => t.trim())
    .filter(Boolean);
  if (types.length > 0) out.types = types;
  if (f.filter.trim() !== "") out.filter = jsonObject(f.filter, "filter");
  const transform = transformSetting(f);
  if (transform !== undefined) out.transform = transform;
  const more = jsonObject(f.more, "more settings");
  for (const k of Object.keys(more))
    if (ROUTE_OWN.has(k)) throw new HttpError(400, `more settings: ${k} has its own field above; set it there`);
  Object.assign(out, more);
  return Object.keys(out).length === 1 ? to : out;
}

interface RouteView {
  source: string;
  /** The route's place in the source's routes; undefined for a new one. */
  index: number | undefined;
  version: number;
  fields: RouteFields;
  config: Config;
  /** The source had no routes: its deliveries go to the handler, which a new route keeps beside it. */
  implicit: boolean;
  problem?: Problem;
  tried?: { source: string; id: string; result?: { matches: boolean; notes: string[] } };
}

function routeForm(ctx: PageContext, s: Session, v: RouteView, flash: Flash | null): string {
  const writes = acts(ctx, s);
  const f = v.fields;
  const ro = writes ? "" : " readonly";
  const names = [DEFAULTS.destination, ...destinationsOf(v.config.document).map(([n]) => n)];
  if (f.to !== "" && !names.includes(f.to)) names.push(f.to);
  const options = names
    .map((n) => `<option value="${escape(n)}"${n === f.to ? " selected" : ""}>${escape(n)}</option>`)
    .join("");
  const title = v.index === undefined ? `New route of ${v.source}` : `Route ${v.index + 1} of ${v.source}`;
  const sha = appliedSha(f, v.config.transforms);
  const result = v.tried?.result;
  const verdict = result
    ? `<p class="verdict ${result.matches ? "match" : "nomatch"}" role="status">${
        result.matches
          ? `The filter takes ${escape(v.tried!.source)}/${escape(v.tried!.id)}: this route would send it to ${escape(f.to || "its destination")}.`
          : `The filter does not take ${escape(v.tried!.source)}/${escape(v.tried!.id)}: this route would not send it.`
      }</p>${result.notes.map((n) => `<p class="note">${escape(n)}</p>`).join("")}`
    : "";
  const form = `<form method="post" action="/config/route" class="edit">${hidden(s)}
<input type="hidden" name="version" value="${escape(String(v.version))}"><input type="hidden" name="source" value="${escape(v.source)}"><input type="hidden" name="route" value="${v.index === undefined ? "" : escape(String(v.index))}">
${v.implicit ? `<p class="note">This source has no routes, so its deliveries go to the handler; a route added here goes beside the handler's.</p>` : ""}
<label>To <select name="to"${writes ? "" : " disabled"}>${options}</select></label>${writes ? "" : `<input type="hidden" name="to" value="${escape(f.to)}">`}
<label>Event types <input name="types" value="${escape(f.types)}" placeholder="invoice.*, charge.succeeded (every type when empty)"${ro}></label>
<label>Filter (JSON) <textarea name="filter" rows="6" placeholder='{"body": {"amount": {"$gte": 100}}}'>${escape(f.filter)}</textarea></label>
<fieldset class="try"><legend>Try the filter on a stored delivery</legend><div class="row">
<label>Source <input name="try_source" value="${escape(v.tried?.source ?? v.source)}" size="12"></label><label>ID <input name="try_id" value="${escape(v.tried?.id ?? "")}" size="24"></label>
<button formaction="/config/route/test">Test the filter</button></div>
${verdict}<p class="hint">The filter as written above, saved or not, on the delivery's body and the headers it kept; nothing is saved.</p></fieldset>
${transformEditor(f, sha, ro, true)}
<label>More settings (JSON) <textarea name="more" rows="3" placeholder='{"permanent4xx": true}'${ro}>${escape(f.more)}</textarea></label>
${writes ? `<p><button class="primary">${v.index === undefined ? "Add the route" : "Save"}</button> <a href="/config">Cancel</a></p>` : `<p class="note">This session may try a filter, not save one: saving needs a write key, or the page's token.</p>`}
</form>`;
  const remove =
    writes && v.index !== undefined
      ? `<form method="post" action="/config/route/delete" class="inline">${hidden(s)}<input type="hidden" name="version" value="${escape(String(v.version))}"><input type="hidden" name="source" value="${escape(v.source)}"><input type="hidden" name="route" value="${escape(String(v.index))}"><button class="danger">Delete this route</button></form>`
      : "";
  return page(
    ctx,
    s,
    title,
    `<p class="crumbs"><a href="/config">Configuration</a> / ${escape(v.source)} /</p><h1>${escape(title)}</h1>${problemBox(v.problem)}
<p class="note">Read at version ${escape(String(v.version))}: saving changes it only if it is still the version in force.</p>${form}${remove}`,
    flash,
  );
}

// routeAt finds a source in the document in force and one of its routes: a 404 for a source or a route that is not there.
function routeAt(config: Config, source: string, route: string | null) {
  const settings = sourcesOf(config.document).find(([n]) => n === source)?.[1];
  if (!settings)
    throw new HttpError(404, `no source ${source} in the configuration in force (version ${config.version})`);
  const routes = Array.isArray(settings.routes) ? settings.routes : undefined;
  if (route === null || route === "") return { settings, routes, index: undefined };
  const index = Number(route);
  if (!Number.isInteger(index) || index < 0 || index >= (routes?.length ?? 0))
    throw new HttpError(404, `source ${source} has no route ${route} in version ${config.version}`);
  return { settings, routes, index };
}

/** routePage shows one route of a source (a new one's without ?route=), with its filter's tester. */
export async function routePage(
  ctx: PageContext,
  s: Session,
  params: URLSearchParams,
  flash: Flash | null,
): Promise<string> {
  const source = params.get("source") ?? "";
  const config = await readConfig(ctx, s);
  const { routes, index } = routeAt(config, source, params.get("route"));
  return routeForm(
    ctx,
    s,
    {
      source,
      index,
      version: config.version,
      fields: routeFieldsOf(index === undefined ? {} : routes![index]),
      config,
      implicit: routes === undefined,
    },
    flash,
  );
}

// routeShown re-renders a posted route form, with a problem or a filter's result.
async function routeShown(
  ctx: PageContext,
  s: Session,
  form: URLSearchParams,
  extra: Pick<RouteView, "problem" | "tried">,
  status: number,
): Promise<Shown> {
  const config = await readConfig(ctx, s);
  const source = form.get("source") ?? "";
  const route = form.get("route");
  const implicit = sourcesOf(config.document).some(([n, x]) => n === source && !Array.isArray(x.routes));
  return {
    status,
    html: routeForm(
      ctx,
      s,
      {
        source,
        index: route === null || route === "" ? undefined : Number(route),
        version: versionOf(form) ?? config.version,
        fields: routeFieldsFrom(form),
        config,
        implicit,
        ...extra,
      },
      null,
    ),
  };
}

// putRoutes changes a source's routes on the version its form was read at, through the API's putSource.
async function putRoutes(
  ctx: PageContext,
  s: Session,
  form: URLSearchParams,
  change: (routes: unknown[], index: number | undefined) => unknown[],
): Promise<{ version: number; source: string }> {
  const source = form.get("source") ?? "";
  const expected = versionOf(form);
  const config = await readConfig(ctx, s);
  const { settings, routes, index } = routeAt(config, source, form.get("route"));
  // A source without routes sends everything to the handler: that route is kept, written out.
  const next = change([...(routes ?? [DEFAULTS.destination])], index);
  const { body } = await ctx.api.perform(
    "putSource",
    {
      params: { name: source },
      body: {
        settings: { ...settings, routes: next },
        ...(expected === undefined ? {} : { expectedVersion: expected }),
      },
    },
    callerOf(s),
  );
  return { version: body.version, source };
}

// ---- The forms ----

// savedFlash says what a change made.
const savedFlash = (what: string, version: number) => `${what}: configuration version ${version} is in force.`;

/** CONFIG_FORMS are the configuration's forms, each an operation of the API run as the session. */
export const CONFIG_FORMS: Record<string, Form> = {
  "/config/destination": {
    scope: "write",
    run: async (ctx, s, form) => {
      const name = (form.get("name") ?? "").trim();
      const isNew = form.get("new") === "1";
      const expected = versionOf(form);
      const fields = fieldsFrom(form);
      const shown = async (problem: Problem): Promise<Shown> => {
        const config = await readConfig(ctx, s);
        return {
          status: problem.status,
          html: destinationForm(
            ctx,
            s,
            {
              name: isNew ? undefined : name,
              newName: name,
              version: expected ?? config.version,
              fields: withoutClearSecret(fields),
              config,
              problem: {
                ...(await withSince(ctx, s, problem, expected)),
                again: isNew ? "/config/destination" : `/config/destination?${new URLSearchParams({ name })}`,
              },
            },
            null,
          ),
        };
      };
      try {
        const settings = settingsOf(fields);
        if (isNew) {
          const config = await readConfig(ctx, s);
          if (destinationsOf(config.document).some(([n]) => n === name))
            throw new HttpError(409, `a destination named ${name} is there already: edit it, or choose another name`);
        }
        const { body } = await ctx.api.perform(
          "putDestination",
          { params: { name }, body: { settings, ...(expected === undefined ? {} : { expectedVersion: expected }) } },
          callerOf(s),
        );
        const what = `${isNew ? "created" : "saved"} destination=${JSON.stringify(name)}`;
        return {
          what,
          count: body.changes.length,
          to: `/config/destination?${new URLSearchParams({ name })}`,
          flash: body.applied
            ? savedFlash(`Destination ${name} ${isNew ? "created" : "saved"}`, body.version)
            : `Destination ${name}: nothing changed.`,
        } satisfies Done;
      } catch (error) {
        return shown(problemOf(error));
      }
    },
  },
  "/config/destination/delete": {
    scope: "write",
    run: async (ctx, s, form) => {
      const name = form.get("name") ?? "";
      const expected = versionOf(form);
      try {
        const { body } = await ctx.api.perform(
          "deleteDestination",
          {
            params: { name },
            query: {
              ...(expected === undefined ? {} : { expectedVersion: String(expected) }),
              ...(form.get("cancelWaiting") === "true" ? { cancelWaiting: "true" } : {}),
            },
          },
          callerOf(s),
        );
        return {
          what: `deleted destination=${JSON.stringify(name)}`,
          count: body.changes.length,
          to: "/config",
          flash: savedFlash(
            `Destination ${name} deleted${body.cancelled > 0 ? `, ${body.cancelled} waiting set aside as failed` : ""}`,
            body.version,
          ),
        } satisfies Done;
      } catch (error) {
        const problem = await withSince(ctx, s, problemOf(error), expected);
        return { status: problem.status, html: await configPage(ctx, s, null, problem) };
      }
    },
  },
  "/config/route": {
    scope: "write",
    run: async (ctx, s, form) => {
      try {
        const route = routeOf(routeFieldsFrom(form));
        const { version, source } = await putRoutes(ctx, s, form, (routes, index) => {
          if (index === undefined) routes.push(route);
          else routes[index] = route;
          return routes;
        });
        return {
          what: `saved route source=${JSON.stringify(source)} to=${JSON.stringify(form.get("to") ?? "")}`,
          count: 1,
          to: "/config",
          flash: savedFlash(`Route of ${source} to ${form.get("to")} saved`, version),
        } satisfies Done;
      } catch (error) {
        const problem = await withSince(ctx, s, problemOf(error), versionOf(form));
        const again = new URLSearchParams({ source: form.get("source") ?? "", route: form.get("route") ?? "" });
        return routeShown(ctx, s, form, { problem: { ...problem, again: `/config/route?${again}` } }, problem.status);
      }
    },
  },
  "/config/route/delete": {
    scope: "write",
    run: async (ctx, s, form) => {
      try {
        const { version, source } = await putRoutes(ctx, s, form, (routes, index) =>
          routes.filter((_, i) => i !== index),
        );
        return {
          what: `deleted route source=${JSON.stringify(source)} route=${JSON.stringify(form.get("route"))}`,
          count: 1,
          to: "/config",
          flash: savedFlash(`A route of ${source} deleted`, version),
        } satisfies Done;
      } catch (error) {
        const problem = await withSince(ctx, s, problemOf(error), versionOf(form));
        return { status: problem.status, html: await configPage(ctx, s, null, problem) };
      }
    },
  },
  // Trying a filter saves nothing: a read session may (as a read key may call testFilter).
  "/config/route/test": {
    scope: "read",
    run: async (ctx, s, form) => {
      const tried = { source: (form.get("try_source") ?? "").trim(), id: (form.get("try_id") ?? "").trim() };
      try {
        const filter = jsonObject(form.get("filter") ?? "", "filter");
        if (!tried.id) throw new HttpError(400, "ID: expected a stored delivery's ID to try the filter on");
        const { body } = await ctx.api.perform("testFilter", { body: { filter, delivery: tried } }, callerOf(s));
        return routeShown(ctx, s, form, { tried: { ...tried, result: body } }, 200);
      } catch (error) {
        const problem = problemOf(error);
        return routeShown(
          ctx,
          s,
          form,
          { problem: { ...problem, detail: `Not tried: ${problem.detail}` }, tried },
          problem.status,
        );
      }
    },
  },
  "/config/secret": {
    scope: "write",
    run: async (ctx, s, form) => {
      const name = (form.get("name") ?? "").trim();
      try {
        const { body } = await ctx.api.perform(
          "putSecret",
          { params: { name }, body: { value: form.get("value") ?? "" } },
          callerOf(s),
        );
        return {
          what: `set secret=${JSON.stringify(name)}`,
          count: 1,
          to: "/config#secrets",
          flash: `Secret ${name} ${body.created ? "set" : "replaced"}: name it as secret:${name}. Its value is not shown again.`,
        } satisfies Done;
      } catch (error) {
        return { status: problemOf(error).status, html: await configPage(ctx, s, null, problemOf(error)) };
      }
    },
  },
  "/config/secret/delete": {
    scope: "write",
    run: async (ctx, s, form) => {
      const name = form.get("name") ?? "";
      try {
        await ctx.api.perform("deleteSecret", { params: { name } }, callerOf(s));
        return {
          what: `deleted secret=${JSON.stringify(name)}`,
          count: 1,
          to: "/config#secrets",
          flash: `Secret ${name} deleted.`,
        } satisfies Done;
      } catch (error) {
        return { status: problemOf(error).status, html: await configPage(ctx, s, null, problemOf(error)) };
      }
    },
  },
};
