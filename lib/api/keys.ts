// lib/api/keys.ts: the API's keys: mintKey() makes one (32 random bytes, shown once) with the row the store
// keeps of it (its SHA-256 alone), and hashKey() is how a bearer key is looked up. Used by the API's auth
// (lib/api/routes.ts) and by `inbox.ts keys` (lib/cli/keys.ts).

import { createHash, randomBytes } from "node:crypto";
import type { ApiKey } from "../store.ts";

/** KEY_PREFIX starts every key, so a leaked one is easy to recognise (and to search a repository for). */
export const KEY_PREFIX = "wik_";

/** hashKey is the SHA-256, in hex, that the store keeps of an API key. */
export function hashKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

/** mintKey makes a new key: the text to give its owner once, and the row to store, which never holds it. */
export function mintKey(input: { scope: "read" | "write"; name: string; now: number }): { key: string; row: ApiKey } {
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
