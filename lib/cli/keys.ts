// lib/cli/keys.ts: `inbox.ts keys create|list|revoke`, the JSON API's bearer keys (docs/api.md). A key is
// printed once, at create; the inbox keeps its SHA-256 alone. A read key only reads; a write key may also
// retry, replay, pause and resume. Revoking is for good: a revoked key is refused with a 401.

import { InvalidArgumentError } from "commander";
import { mintKey } from "../api/keys.ts";
import { iso } from "../format.ts";
import { type Cli, NotFound } from "./command.ts";

/** keys adds `keys create`, `keys list` and `keys revoke ID`. */
export function keys(c: Cli): void {
  const { withDb, open, connect, target } = c;
  const group = c.program.command("keys").description("the JSON API's keys: create (printed once), list, revoke");
  const scope = (value: string) => {
    if (value !== "read" && value !== "write") throw new InvalidArgumentError("expected read or write.");
    return value;
  };
  withDb(group.command("create"))
    .description("make an API key and print it once; the inbox keeps only its SHA-256")
    .requiredOption("--scope <read|write>", "read: look only; write: also retry, replay, pause, resume", scope)
    .option("--name <text>", "what the key is for, shown by keys list and in the audit log's key ID", "")
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; scope: "read" | "write"; name: string; json?: boolean }) => {
      const inbox = await connect(target(opts));
      try {
        const { key, row } = mintKey({ scope: opts.scope, name: opts.name, now: Date.now() });
        await inbox.addApiKey(row);
        if (opts.json) return void console.log(JSON.stringify({ id: row.id, name: row.name, scope: row.scope, key }));
        console.log(key);
        console.error(
          `API key ${row.id} (${row.scope}${row.name ? `, ${row.name}` : ""}). It is shown this once: keep it now. Send it as Authorization: Bearer <key>.`,
        );
      } finally {
        await inbox.close();
      }
    });
  withDb(group.command("list"))
    .description("list the API keys (never the keys themselves): ID, scope, name, created, revoked")
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const all = await inbox.apiKeys();
        if (opts.json) return void console.log(JSON.stringify(all.map(({ hash: _hash, ...shown }) => shown)));
        if (all.length === 0) return void console.log("No API keys. Make one: inbox.ts keys create --scope read");
        for (const k of all)
          console.log(
            `${k.id}  ${k.scope.padEnd(5)}  created ${iso(k.createdAt)}${k.revokedAt === null ? "" : `  revoked ${iso(k.revokedAt)}`}  ${k.name}`,
          );
      } finally {
        await inbox.close();
      }
    });
  withDb(group.command("revoke <id>"))
    .description("revoke an API key for good: it is refused with a 401 from then on")
    .action(async (id: string, opts: { db?: string }) => {
      const inbox = await open(opts);
      try {
        if (await inbox.revokeApiKey(id, Date.now())) return void console.log(`API key ${id} revoked.`);
        const known = (await inbox.apiKeys()).find((k) => k.id === id);
        if (!known) throw new NotFound(`No API key ${id}: see inbox.ts keys list.`);
        console.log(`API key ${id} was already revoked; nothing changed.`);
      } finally {
        await inbox.close();
      }
    });
}
