// lib/cli/secrets.ts: `inbox.ts secrets set NAME` (the value from standard input, never an argument), `list`
// (names, when each was set and by whom, never a value), `delete NAME`, `rotate` (every value sealed again
// under the first of INBOX_SECRETS_KEY's keys) and `key` (a new key). The store keeps each value sealed with
// the operator's key (lib/secrets.ts); a configuration names one as secret:NAME. docs/security.md.

import { text } from "node:stream/consumers";
import { secretUsers } from "../config/config.ts";
import { DEFAULTS } from "../defaults.ts";
import { iso } from "../format.ts";
import { plainName, SECRET_NAME } from "../references.ts";
import { Keyring, mintKey } from "../secrets.ts";
import type { Inbox } from "../store.ts";
import { type Cli, NotFound, Refused, UsageError } from "./command.ts";

/** secrets adds `secrets set|list|delete|rotate|key`: one command, so its --help says every option. */
export function secrets(c: Cli): void {
  const { withDb, withKey, open } = c;
  withKey(withDb(c.program.command("secrets <action> [name]")))
    .description(
      "the secret store: set NAME (its value from standard input), list (never a value), delete NAME, rotate (seal every value again under the first key of INBOX_SECRETS_KEY), or key (print a new key)",
    )
    .option("--json", "print JSON")
    .addHelpText(
      "after",
      `
A value is sealed with AES-256-GCM under INBOX_SECRETS_KEY (or the key in --secrets-key-file), which the
database never holds: a copy of it, a backup or a pg_dump holds no value. A configuration names one as
secret:NAME wherever it takes env:NAME. To rotate the key: give every script INBOX_SECRETS_KEY=NEW,OLD and
restart them, run secrets rotate, then drop OLD.

Examples:
  npx tsx inbox.ts secrets key                                   # a new key, for INBOX_SECRETS_KEY
  printf %s "$APP_SECRET" | npx tsx inbox.ts secrets set app_signing
  npx tsx inbox.ts secrets list
  INBOX_SECRETS_KEY=$NEW,$OLD npx tsx inbox.ts secrets rotate`,
    )
    .action(
      async (
        action: string,
        name: string | undefined,
        opts: { db?: string; json?: boolean; secretsKeyFile?: string },
      ) => {
        if (action === "key") return void console.log(mintKey());
        if (action === "list") return list(await open(opts), opts.json === true);
        const named = (): string => {
          if (name === undefined || !plainName(name, SECRET_NAME))
            throw new UsageError(
              `secrets ${action}: expected the secret's name, one word of letters, digits, ".", "_", "~" or "-"; got ${JSON.stringify(name ?? "")}.`,
            );
          return name;
        };
        if (action === "set") {
          const n = named();
          const keyring = ring(c, opts);
          const value = await fromStdin();
          const inbox = await open(opts);
          try {
            const created = await inbox.setSecret(
              { name: n, sealed: keyring.seal(n, value), setAt: Date.now(), setBy: c.who() },
              { who: c.who(), operation: "secrets set", target: `secret=${JSON.stringify(n)}` },
            );
            if (opts.json) return void console.log(JSON.stringify({ name: n, created }));
            console.log(
              `Secret ${n} ${created ? "set" : "replaced"}; running scripts open it again within a second or two.`,
            );
          } finally {
            await inbox.close();
          }
          return;
        }
        if (action === "delete") {
          const n = named();
          const inbox = await open(opts);
          try {
            const stored = await inbox.readConfig();
            const users = stored ? secretUsers(stored.document, n) : [];
            if (users.length > 0)
              throw new Refused(
                `Refused: configuration version ${stored!.version} names secret:${n} (${users.join(", ")}); change that first.`,
              );
            const gone = await inbox.deleteSecret(n, {
              who: c.who(),
              operation: "secrets delete",
              target: `secret=${JSON.stringify(n)}`,
            });
            if (!gone) throw new NotFound(`No secret ${n}: see inbox.ts secrets list.`);
            console.log(`Secret ${n} deleted.`);
          } finally {
            await inbox.close();
          }
          return;
        }
        if (action === "rotate") return rotate(c, ring(c, opts), await open(opts));
        throw new UsageError(`secrets: expected set, list, delete, rotate or key, got ${JSON.stringify(action)}.`);
      },
    );
}

// ring is the operator's keys, or a UsageError saying where to give them.
function ring(c: Cli, opts: { secretsKeyFile?: string }): Keyring {
  const keyring = c.host(opts).keyring;
  if (!keyring)
    throw new UsageError(
      "secrets: needs the operator's key: INBOX_SECRETS_KEY or --secrets-key-file (make one with inbox.ts secrets key).",
    );
  return keyring;
}

// fromStdin reads a secret's value from standard input, never from an argument (which ps and the shell's
// history would show), without the one line end an echo adds.
async function fromStdin(): Promise<string> {
  if (process.stdin.isTTY)
    throw new UsageError(
      'secrets set: give the value on standard input: printf %s "$VALUE" | inbox.ts secrets set NAME.',
    );
  const value = (await text(process.stdin)).replace(/\r?\n$/, "");
  if (value === "") throw new UsageError("secrets set: the value on standard input is empty.");
  if (Buffer.byteLength(value) > DEFAULTS.maxSecretBytes)
    throw new UsageError(`secrets set: the value is larger than ${DEFAULTS.maxSecretBytes} bytes.`);
  return value;
}

// list prints each secret's name, when it was set, by whom and which key sealed it: never a value.
async function list(inbox: Inbox, json: boolean): Promise<void> {
  try {
    const all = (await inbox.secrets()).map((s) => ({
      name: s.name,
      setAt: s.setAt,
      setBy: s.setBy,
      key: Keyring.sealedWith(s.sealed) ?? "?",
    }));
    if (json) return void console.log(JSON.stringify(all));
    if (all.length === 0)
      return void console.log('No secrets. Set one: printf %s "$VALUE" | inbox.ts secrets set NAME');
    for (const s of all) console.log(`${s.name}  set ${iso(s.setAt)} by ${s.setBy}  key ${s.key}`);
  } finally {
    await inbox.close();
  }
}

// rotate opens every value with whichever key sealed it and seals it again under the first, in one
// transaction; a value no key here opens stops it, nothing changed.
async function rotate(c: Cli, keyring: Keyring, inbox: Inbox): Promise<void> {
  try {
    const now = Date.now();
    const rows = await inbox.secrets();
    const resealed = rows.map((s) => {
      try {
        return { ...s, sealed: keyring.seal(s.name, keyring.open(s.name, s.sealed)), setAt: now, setBy: c.who() };
      } catch (error) {
        throw new Refused(`Refused: ${(error as Error).message}; nothing changed.`);
      }
    });
    await inbox.putSecrets(resealed, {
      who: c.who(),
      operation: "secrets rotate",
      target: `${rows.length} secrets sealed again under key ${keyring.ids[0]}`,
    });
    console.log(`Sealed ${rows.length} ${rows.length === 1 ? "secret" : "secrets"} again under key ${keyring.ids[0]}.`);
  } finally {
    await inbox.close();
  }
}
