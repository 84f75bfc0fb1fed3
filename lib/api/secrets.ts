// lib/api/secrets.ts: the JSON API's operations on the secret store: list (names, when, by whom; never a
// value), set (sealed at once under the operator's key, lib/secrets.ts) and delete. A write key may set a
// secret and name it in a configuration as secret:NAME; no key, and no answer, ever reads one back. Mounted
// by lib/api/api.ts.

import type { z } from "zod";
import { secretUsers } from "../config/config.ts";
import { DEFAULTS } from "../defaults.ts";
import { Keyring } from "../secrets.ts";
import { ApiError, type Operate } from "./call.ts";
import type { SecretBody, SecretPath } from "./schemas.ts";

/** SECRET_HANDLERS are the secret store's operations, which lib/api/api.ts answers beside its own. */
export const SECRET_HANDLERS = {
  listSecrets: async (ctx) => ({
    body: {
      items: (await ctx.inbox.secrets()).map((s) => ({
        name: s.name,
        setAt: s.setAt,
        setBy: s.setBy,
        key: Keyring.sealedWith(s.sealed) ?? "?",
      })),
    },
  }),
  putSecret: async (ctx, call) => {
    const { name } = call.params as z.output<typeof SecretPath>;
    const { value } = call.body as z.output<typeof SecretBody>;
    const keyring = ctx.host.keyring;
    if (!keyring)
      throw new ApiError(
        503,
        "this page has no key to seal secrets with: its operator gives admin.ts INBOX_SECRETS_KEY or --secrets-key-file",
      );
    if (Buffer.byteLength(value) > DEFAULTS.maxSecretBytes)
      throw new ApiError(400, `body.value: expected at most ${DEFAULTS.maxSecretBytes} bytes`);
    const target = `secret=${JSON.stringify(name)}`;
    const created = await ctx.inbox.setSecret(
      { name, sealed: keyring.seal(name, value), setAt: ctx.now(), setBy: call.who },
      call.audit(target),
    );
    return { body: { name, created }, change: { target, count: 1 } };
  },
  deleteSecret: async (ctx, call) => {
    const { name } = call.params as z.output<typeof SecretPath>;
    const stored = await ctx.inbox.readConfig();
    const users = stored ? secretUsers(stored.document, name) : [];
    if (users.length > 0)
      throw new ApiError(
        409,
        `configuration version ${stored!.version} names secret:${name} (${users.join(", ")}): change that first; nothing changed`,
      );
    // Looked for first, so that a name that is not there is a 404 that writes nothing, not even its entry.
    if (!(await ctx.inbox.secrets()).some((s) => s.name === name)) throw new ApiError(404, `no secret ${name}`);
    const target = `secret=${JSON.stringify(name)}`;
    if (!(await ctx.inbox.deleteSecret(name, call.audit(target)))) throw new ApiError(404, `no secret ${name}`);
    return { body: { name, deleted: true }, change: { target, count: 1 } };
  },
} satisfies Record<string, Operate>;
