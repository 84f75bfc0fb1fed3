// lib/admin/keys.ts: the API's keys on the operator page: each one listed (never a key or its hash), and, for
// an admin session (the page's token, or an admin key), the forms that make one (shown once, on the page the
// form leads to) and revoke one. Each is the API's own operation (listKeys, createKey, revokeKey) run through
// Api.perform() as the session, audited in its transaction.

import { utc } from "../format.ts";
import { HttpError } from "../operations/input.ts";
import { SCOPES } from "../store.ts";
import { action, acts, escape, hidden, page } from "./html.ts";
import type { Done, Form, PageContext } from "./pages.ts";
import { callerOf, type Flash, type Session } from "./session.ts";

/** keysPage lists the API's keys, with a key's making and revoking for an admin session. */
export async function keysPage(ctx: PageContext, s: Session, flash: Flash | null): Promise<string> {
  const { items } = (await ctx.api.perform("listKeys", {}, callerOf(s))).body;
  const admin = acts(ctx, s, "admin");
  const rows = items
    .map(
      (k) =>
        `<tr${k.revokedAt === null ? "" : ` class="revoked"`}><td><code>${escape(k.id)}</code></td><td>${escape(k.name)}</td><td><span class="badge scope ${escape(k.scope)}">${escape(k.scope)}</span></td><td class="time">${escape(utc(k.createdAt))}</td>
<td class="time">${k.revokedAt === null ? "–" : escape(utc(k.revokedAt))}</td><td>${k.revokedAt === null ? action(ctx, s, "/keys/revoke", "Revoke", { id: k.id }, "danger", "admin") : ""}</td></tr>`,
    )
    .join("");
  const make = admin
    ? `<h2>Make a key</h2><form method="post" action="/keys/create" class="filters">${hidden(s)}
<label>What it is for <input name="name" maxlength="200" placeholder="deploy bot" size="24"></label>
<label>Scope <select name="scope">${SCOPES.map((x) => `<option${x === "read" ? " selected" : ""}>${x}</option>`).join("")}</select></label>
<button class="primary">Make the key</button></form>
<p class="note">The key is shown once, on the next page: copy it then. The inbox keeps its SHA-256 alone.</p>`
    : `<p class="note">Making and revoking keys needs an admin key, or the page's token.</p>`;
  return page(
    ctx,
    s,
    "API keys",
    `<h1>API keys</h1>
<div class="scroll"><table class="keys"><thead><tr><th>ID</th><th>for</th><th>scope</th><th>made</th><th>revoked</th><th></th></tr></thead>
<tbody>${rows || `<tr><td colspan="6">No API keys yet.</td></tr>`}</tbody></table></div>
${make}
<p class="note">A read key looks and changes nothing; a write key also retries, replays, pauses and changes the configuration within the operator's rule; an admin key also makes and revokes keys. Send one as <code>Authorization: Bearer wik_…</code> to <code>/api/v1/</code>, or log in to this page with it.</p>`,
    flash,
  );
}

/** KEY_FORMS make and revoke a key, for an admin session. */
export const KEY_FORMS: Record<string, Form> = {
  "/keys/create": {
    scope: "admin",
    run: async (ctx, s, form) => {
      const { body } = await ctx.api.perform(
        "createKey",
        { body: { scope: form.get("scope") ?? "", name: (form.get("name") ?? "").trim() } },
        callerOf(s),
      );
      if (body.key === null) throw new HttpError(500, "createKey answered no key");
      return {
        what: `created key=${body.id} scope=${body.scope} name=${JSON.stringify(body.name)}`,
        count: 1,
        to: "/keys",
        flash: `API key ${body.id} (${body.scope}${body.name ? `, ${body.name}` : ""}) made. It is shown this once, below: copy it now.`,
        once: body.key,
      } satisfies Done;
    },
  },
  "/keys/revoke": {
    scope: "admin",
    run: async (ctx, s, form) => {
      const id = form.get("id") ?? "";
      const { body } = await ctx.api.perform("revokeKey", { params: { id }, body: {} }, callerOf(s));
      return {
        what: `revoked key=${id}`,
        count: body.revoked ? 1 : 0,
        to: "/keys",
        flash: body.revoked
          ? `API key ${id} revoked: it is refused from now on.`
          : `API key ${id} was already revoked; nothing changed.`,
      } satisfies Done;
    },
  },
};
