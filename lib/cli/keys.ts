// lib/cli/keys.ts: `inbox.ts keys create|list|revoke`, the JSON API's bearer keys (docs/api.md). A key is
// printed once, at create; the inbox keeps its SHA-256 alone. A read key only reads; a write key may also
// retry, replay, pause, resume and change the configuration; an admin key may also make and revoke keys.
// Revoking is for good: a revoked key is refused with a 401.

import { InvalidArgumentError } from "commander";
import { keyTarget, mintKey } from "../api/keys.ts";
import { iso } from "../format.ts";
import { type Inbox, SCOPES, type Scope } from "../store.ts";
import { type Cli, NotFound, UsageError } from "./command.ts";

/** keys adds `keys create --scope read|write|admin [--name N]`, `keys list` and `keys revoke ID`: one command, so its --help says every option. */
export function keys(c: Cli): void {
  const { withDb, open, connect, target } = c;
  const scope = (value: string): Scope => {
    if (!(SCOPES as readonly string[]).includes(value))
      throw new InvalidArgumentError("expected read, write or admin.");
    return value as Scope;
  };
  withDb(c.program.command("keys <action> [id]"))
    .description(
      "the JSON API's keys: create (printed once; the inbox keeps its SHA-256 alone), list, or revoke ID (for good)",
    )
    .option(
      "--scope <read|write|admin>",
      "create: read looks only; write may also retry, replay, pause, resume and change the configuration; admin may also make and revoke keys",
      scope,
    )
    .option("--name <text>", "create: what the key is for, shown by keys list", "")
    .option("--json", "print JSON")
    .addHelpText(
      "after",
      `
Examples:
  npx tsx inbox.ts keys create --scope read --name grafana
  npx tsx inbox.ts keys create --scope admin --name platform-team
  npx tsx inbox.ts keys list
  npx tsx inbox.ts keys revoke 3f9a0c1d2e4b`,
    )
    .action(
      async (
        action: string,
        id: string | undefined,
        opts: { db?: string; scope?: Scope; name: string; json?: boolean },
      ) => {
        if (action === "create") {
          if (opts.scope === undefined) throw new UsageError("keys create: expected --scope read, write or admin.");
          return create(connect, target(opts), {
            scope: opts.scope,
            name: opts.name,
            json: opts.json === true,
            who: c.who(),
          });
        }
        if (action === "list") return list(await open(opts), opts.json === true);
        if (action === "revoke") {
          if (id === undefined) throw new UsageError("keys revoke: expected the key's ID, as keys list shows it.");
          return revoke(await open(opts), id, c.who());
        }
        throw new UsageError(`keys: expected create, list or revoke, got ${JSON.stringify(action)}.`);
      },
    );
}

// create makes a key, stores its row and prints the key once: on stdout alone, so $(…) takes it.
async function create(
  connect: Cli["connect"],
  db: string,
  opts: { scope: Scope; name: string; json: boolean; who: string },
): Promise<void> {
  const inbox = await connect(db);
  try {
    const { key, row } = mintKey({ scope: opts.scope, name: opts.name, now: Date.now() });
    const target = keyTarget(row);
    await inbox.addApiKey(row, { who: opts.who, operation: "keys create", target });
    if (opts.json) return void console.log(JSON.stringify({ id: row.id, name: row.name, scope: row.scope, key }));
    console.log(key);
    console.error(
      `API key ${row.id} (${row.scope}${row.name ? `, ${row.name}` : ""}). It is shown this once: keep it now. Send it as Authorization: Bearer <key>.`,
    );
  } finally {
    await inbox.close();
  }
}

// list prints every key's row, never a key or its hash.
async function list(inbox: Inbox, json: boolean): Promise<void> {
  try {
    const all = await inbox.apiKeys();
    if (json) return void console.log(JSON.stringify(all.map(({ hash: _hash, ...shown }) => shown)));
    if (all.length === 0) return void console.log("No API keys. Make one: inbox.ts keys create --scope read");
    for (const k of all)
      console.log(
        `${k.id}  ${k.scope.padEnd(5)}  created ${iso(k.createdAt)}${k.revokedAt === null ? "" : `  revoked ${iso(k.revokedAt)}`}  ${k.name}`,
      );
  } finally {
    await inbox.close();
  }
}

// revoke marks a key revoked, saying so when it already was, and NotFound when there is none.
async function revoke(inbox: Inbox, id: string, who: string): Promise<void> {
  try {
    const audit = { who, operation: "keys revoke", target: `key=${id}` };
    if (await inbox.revokeApiKey(id, Date.now(), audit)) return void console.log(`API key ${id} revoked.`);
    const known = (await inbox.apiKeys()).find((k) => k.id === id);
    if (!known) throw new NotFound(`No API key ${id}: see inbox.ts keys list.`);
    console.log(`API key ${id} was already revoked; nothing changed.`);
  } finally {
    await inbox.close();
  }
}
