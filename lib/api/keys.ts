// lib/api/keys.ts: the API's keys: mintKey() makes one (32 random bytes, shown once) with the row the store
// keeps of it (its SHA-256 alone), hashKey() is how a bearer key is looked up, allows() says what each scope
// may do, and KEY_HANDLERS are the operations that list, make and revoke keys. Used by the API's auth and
// routing (lib/api/api.ts), the operator page's sessions and forms, and `inbox.ts keys` (lib/cli/keys.ts).

import { createHash, randomBytes } from "node:crypto";
import type { z } from "zod";
import { type ApiKey, SCOPES, type Scope } from "../store.ts";
import { ApiError, type Operate } from "./call.ts";
import type { KeyBody, KeyPath } from "./schemas.ts";

/** KEY_PREFIX starts every key, so a leaked one is easy to recognise (and to search a repository for). */
export const KEY_PREFIX = "wik_";

/** hashKey is the SHA-256, in hex, that the store keeps of an API key. */
export function hashKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

/** allows says whether a credential of scope may do what needs `needed`: read < write < admin. */
export function allows(scope: Scope, needed: Scope): boolean {
  return SCOPES.indexOf(scope) >= SCOPES.indexOf(needed);
}

/** mintKey makes a new key: the text to give its owner once, and the row to store, which never holds it. */
export function mintKey(input: { scope: Scope; name: string; now: number }): { key: string; row: ApiKey } {
  const key = `${KEY_PREFIX}${randomBytes(32).toString("base64url")}`;
  const row: ApiKey = {
    id: randomBytes(6).toString("hex"),
    name: input.name,
    scope: input.scope,
    hash: hashKey(key),
    createdAt: input.now,
    revokedAt: null,
  };
  return { key, row };
}

/** keyTarget names a key in the audit log, as `inbox.ts keys create` does. */
export function keyTarget(row: Pick<ApiKey, "id" | "scope" | "name">): string {
  return `key=${row.id} scope=${row.scope} name=${JSON.stringify(row.name)}`;
}

// shown is a key's row without its hash.
const shown = ({ hash: _hash, ...rest }: ApiKey) => rest;

/** KEY_HANDLERS are the keys' operations, which lib/api/api.ts answers beside its own. */
export const KEY_HANDLERS = {
  listKeys: async (ctx) => ({ body: { items: (await ctx.inbox.apiKeys()).map(shown) } }),
  createKey: async (ctx, call) => {
    const { scope, name } = call.body as z.output<typeof KeyBody>;
    const { key, row } = mintKey({ scope, name, now: ctx.now() });
    const target = keyTarget(row);
    await ctx.inbox.addApiKey(row, call.audit(target));
    return { body: { ...shown(row), key }, change: { target, count: 1 } };
  },
  revokeKey: async (ctx, call) => {
    const { id } = call.params as z.output<typeof KeyPath>;
    // Looked for first, so that an ID that is not there is a 404 that writes nothing, not even its entry.
    const known = (await ctx.inbox.apiKeys()).find((k) => k.id === id);
    if (!known) throw new ApiError(404, `no API key ${id}`);
    const target = `key=${id}`;
    const revoked = await ctx.inbox.revokeApiKey(id, ctx.now(), call.audit(target));
    return { body: { id, revoked }, change: { target, count: revoked ? 1 : 0 } };
  },
} satisfies Record<string, Operate>;
