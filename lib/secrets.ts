// secrets.ts: the secret store's cipher. A secret set through the API or `inbox.ts secrets set` is sealed with
// AES-256-GCM (node:crypto; Deno and Bun have it too) under a key only the operator holds (INBOX_SECRETS_KEY,
// or a key file), bound to its name, and only the sealed text reaches the database: a copy of the file, a
// backup or a pg_dump holds no value. openSecrets() opens the ones a configuration names, in the process that
// uses them. See docs/security.md.
//   const ring = parseKeyring(process.env.INBOX_SECRETS_KEY!);  ring.open("app", ring.seal("app", "whsec_…"))

import { createCipheriv, createDecipheriv, createHash, randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import type { Inbox } from "./store.ts";

// A sealed value is v1.<key id>.<iv>.<ciphertext and tag>, base64url: the key id says which key sealed it,
// so a ring of several keys (during a rotation) opens each with its own.
const VERSION = "v1";
const IV_BYTES = 12;
const TAG_BYTES = 16;

/** SecretError is a secret that cannot be opened here: no key, another key, or a value altered. */
export class SecretError extends Error {
  override name = "SecretError";
}

/** Keyring is the operator's keys: the first seals, every one opens what it sealed. */
export class Keyring {
  private readonly keys: { id: string; key: Buffer }[];

  constructor(keys: readonly Buffer[]) {
    if (keys.length === 0) throw new TypeError("Keyring: expected at least one key");
    for (const key of keys)
      if (key.length !== 32) throw new TypeError(`Keyring: expected 32-byte keys, got one of ${key.length} bytes`);
    this.keys = keys.map((key) => ({ id: keyId(key), key }));
  }

  /** ids names the keys, the sealing one first: the first 8 hex digits of each key's SHA-256. */
  get ids(): string[] {
    return this.keys.map((k) => k.id);
  }

  /** seal encrypts a secret's value under the first key, bound to its name: it opens under that name only. */
  seal(name: string, value: string): string {
    const { id, key } = this.keys[0]!;
    const iv = randomBytes(IV_BYTES);
    const cipher = createCipheriv("aes-256-gcm", key, iv);
    cipher.setAAD(aad(name));
    const body = Buffer.concat([cipher.update(value, "utf8"), cipher.final(), cipher.getAuthTag()]);
    return [VERSION, id, iv.toString("base64url"), body.toString("base64url")].join(".");
  }

  /** open decrypts a sealed value; a SecretError says why it cannot (another key, or altered), never the value. */
  open(name: string, sealed: string): string {
    const [version, id, iv, body] = sealed.split(".");
    if (version !== VERSION || !id || !iv || !body)
      throw new SecretError(`secret ${name} is not a value this inbox sealed`);
    const found = this.keys.find((k) => k.id === id);
    if (!found)
      throw new SecretError(
        `secret ${name} was sealed with key ${id}, which this process does not hold (its keys: ${this.ids.join(", ")})`,
      );
    const bytes = Buffer.from(body, "base64url");
    try {
      const decipher = createDecipheriv("aes-256-gcm", found.key, Buffer.from(iv, "base64url"));
      decipher.setAAD(aad(name));
      decipher.setAuthTag(bytes.subarray(bytes.length - TAG_BYTES));
      return Buffer.concat([decipher.update(bytes.subarray(0, bytes.length - TAG_BYTES)), decipher.final()]).toString(
        "utf8",
      );
    } catch {
      throw new SecretError(`secret ${name} does not open: its sealed value was altered, or is another secret's`);
    }
  }

  /** sealedWith says which key sealed a value, or undefined when it is not one this inbox sealed. */
  static sealedWith(sealed: string): string | undefined {
    const [version, id] = sealed.split(".");
    return version === VERSION ? id : undefined;
  }
}

// The additional data each value is bound to: a sealed value copied under another name does not open.
function aad(name: string): Buffer {
  return Buffer.from(`webhook-inbox secret ${name}`, "utf8");
}

function keyId(key: Buffer): string {
  return createHash("sha256").update(key).digest("hex").slice(0, 8);
}

/**
 * parseKeyring reads the operator's keys: one or more, separated by commas or new lines, each 32 bytes
 * written as base64 (`openssl rand -base64 32`) or 64 hex digits; the first seals. It throws a TypeError
 * naming where the keys came from, never a key.
 */
export function parseKeyring(text: string, where = "INBOX_SECRETS_KEY"): Keyring {
  const parts = text
    .split(/[,\n]/)
    .map((p) => p.trim())
    .filter(Boolean);
  if (parts.length === 0) throw new TypeError(`${where}: expected a key, got nothing`);
  return new Keyring(
    parts.map((p, i) => {
      const key = /^[0-9a-f]{64}$/i.test(p) ? Buffer.from(p, "hex") : Buffer.from(p, "base64");
      const back = key.toString("base64").replace(/=+$/, "");
      if (key.length !== 32 || (!/^[0-9a-f]{64}$/i.test(p) && back !== p.replace(/=+$/, "")))
        throw new TypeError(
          `${where}: key #${i + 1} is not 32 bytes in base64 or hex (make one with: openssl rand -base64 32)`,
        );
      return key;
    }),
  );
}

/**
 * readKeyring finds the operator's keys as a script's entry point was given them: a key file (its flag) first,
 * else the INBOX_SECRETS_KEY value; undefined when neither is given. It throws a TypeError of one line.
 */
export function readKeyring(given: { file?: string | undefined; value?: string | undefined }): Keyring | undefined {
  if (given.file !== undefined) {
    let text: string;
    try {
      text = readFileSync(given.file, "utf8");
    } catch (error) {
      throw new TypeError(`--secrets-key-file ${given.file}: ${(error as Error).message}`);
    }
    return parseKeyring(text, `--secrets-key-file ${given.file}`);
  }
  if (given.value === undefined || given.value === "") return undefined;
  return parseKeyring(given.value);
}

/** mintKey makes a new key for INBOX_SECRETS_KEY: 32 random bytes, base64. */
export function mintKey(): string {
  return randomBytes(32).toString("base64");
}

/**
 * openSecrets opens the named secrets of the store. A name the store does not hold is left out (the setting
 * that reads it then says it is not set); one it holds that this process cannot open throws a TypeError of
 * one line naming it: no key (INBOX_SECRETS_KEY or --secrets-key-file), another key, or an altered value.
 */
export async function openSecrets(
  inbox: Inbox,
  names: Iterable<string>,
  keyring: Keyring | undefined,
): Promise<Map<string, string>> {
  const wanted = new Set(names);
  const out = new Map<string, string>();
  if (wanted.size === 0) return out;
  for (const row of await inbox.secrets()) {
    if (!wanted.has(row.name)) continue;
    if (!keyring)
      throw new TypeError(
        `secret:${row.name} is sealed, and this process has no key to open it: give it INBOX_SECRETS_KEY or --secrets-key-file`,
      );
    try {
      out.set(row.name, keyring.open(row.name, row.sealed));
    } catch (error) {
      throw new TypeError(`secret:${row.name}: ${(error as Error).message}`);
    }
  }
  return out;
}
