// test/secrets.test.ts: lib/secrets.ts, the secret store's cipher, and the CLI over it. A value sealed under
// the operator's key opens under that key and that name alone (another key, another name, a changed byte: each
// refused, saying why, never the value); a ring of keys opens what each sealed and seals with the first;
// `inbox.ts secrets` sets from standard input only, lists without values, rotates the key in one audited
// transaction; a worker that needs a secret and has no key stops at start-up with one line naming it, the
// control being the same worker given the key.
//   npx node --test test/secrets.test.ts

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { scriptCommand } from "../lib/runtime.ts";
import { Keyring, mintKey, parseKeyring, SecretError } from "../lib/secrets.ts";
import { ROOT, runScript, startWorker, tempDir, until } from "./helpers.ts";

const A = Buffer.alloc(32, 1).toString("base64");
const B = Buffer.alloc(32, 2).toString("hex");

// secretsSet runs `inbox.ts secrets set NAME` with its value on standard input.
async function secretsSet(db: string, name: string, value: string, env: NodeJS.ProcessEnv) {
  const { command, args } = scriptCommand(resolve(ROOT, "inbox.ts"), ["secrets", "set", name, "--db", db]);
  const child = spawn(command, args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ["pipe", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  child.stdin.end(value);
  const [code] = await once(child, "exit");
  return { code: code as number, out };
}

describe("Keyring", () => {
  it("opens what it sealed, under that name alone; another key, another name or one changed byte is refused without the value", () => {
    const ring = parseKeyring(A);
    const sealed = ring.seal("app", "whsec_value");
    assert.equal(ring.open("app", sealed), "whsec_value");
    assert.ok(!sealed.includes("whsec_value"));
    assert.notEqual(ring.seal("app", "whsec_value"), sealed, "a fresh nonce each time");
    assert.throws(
      () => ring.open("other", sealed),
      (e: Error) => e instanceof SecretError && /altered, or is another secret's/.test(e.message),
    );
    assert.throws(
      () => parseKeyring(B).open("app", sealed),
      /sealed with key [0-9a-f]{8}, which this process does not hold/,
    );
    const [v, id, iv, body] = sealed.split(".");
    const flipped = Buffer.from(body!, "base64url");
    flipped[0]! ^= 1;
    assert.throws(() => ring.open("app", [v, id, iv, flipped.toString("base64url")].join(".")), /altered/);
    for (const e of [() => ring.open("other", sealed), () => parseKeyring(B).open("app", sealed)])
      assert.throws(e, (error: Error) => !error.message.includes("whsec_value"));
  });

  it("holds several keys during a rotation: opens what each sealed, seals with the first", () => {
    const old = parseKeyring(A);
    const sealedOld = old.seal("s", "one");
    const both = parseKeyring(`${B},${A}`);
    assert.equal(both.open("s", sealedOld), "one");
    assert.equal(Keyring.sealedWith(both.seal("s", "two")), both.ids[0]);
    assert.notEqual(both.ids[0], old.ids[0]);
  });

  it("refuses a key that is not 32 bytes, in one line naming where it came from, never the key", () => {
    assert.throws(() => parseKeyring("c2hvcnQ="), /^TypeError: INBOX_SECRETS_KEY: key #1 is not 32 bytes/);
    assert.throws(() => parseKeyring(""), /expected a key/);
    assert.equal(Buffer.from(mintKey(), "base64").length, 32);
  });
});

describe("inbox.ts secrets, and a worker that needs one", () => {
  it("sets from standard input, lists no value, rotates the key in one audited change; a worker without the key stops with one line, with it runs", async () => {
    const { dir, cleanup } = tempDir();
    const db = join(dir, "inbox.db");
    const env = { INBOX_SECRETS_KEY: A };
    try {
      (await connect(db)).close();
      assert.equal(
        (await runScript("inbox.ts", ["secrets", "set", "app", "--db", db], env)).code,
        2,
        "no value on stdin: a usage error",
      );
      const value = `whsec_${Buffer.from("the app's secret, set by the CLI").toString("base64")}`;
      const set = await secretsSet(db, "app", value, env);
      assert.equal(set.code, 0, set.out);
      const noKey = await secretsSet(db, "other", "x", { INBOX_SECRETS_KEY: "" });
      assert.equal(noKey.code, 2);
      assert.match(noKey.out, /needs the operator's key: INBOX_SECRETS_KEY or --secrets-key-file/);
      const listed = await runScript("inbox.ts", ["secrets", "list", "--json", "--db", db]);
      assert.deepEqual(
        (JSON.parse(listed.stdout) as { name: string; key: string }[]).map((s) => [s.name, s.key]),
        [["app", parseKeyring(A).ids[0]]],
      );
      assert.ok(!listed.stdout.includes(value));
      assert.ok(!readFileSync(db).toString("latin1").includes(value.slice(6)), "sealed in the file");

      // Rotate: the new key first, the old one beside it; every value sealed again under the new one.
      const rotated = await runScript("inbox.ts", ["secrets", "rotate", "--db", db], {
        INBOX_SECRETS_KEY: `${B},${A}`,
      });
      assert.equal(rotated.code, 0, rotated.stderr);
      const after = JSON.parse((await runScript("inbox.ts", ["secrets", "list", "--json", "--db", db])).stdout);
      assert.equal(after[0].key, parseKeyring(B).ids[0]);
      const inbox = await connect(db);
      const [entry] = await inbox.auditLog({ limit: 1 });
      assert.deepEqual([entry!.operation, entry!.count], ["secrets rotate", 1]);
      assert.equal(parseKeyring(B).open("app", (await inbox.secrets())[0]!.sealed), value, "the same value, under B");
      await inbox.close();

      // A configuration that names it: a worker with no key stops at start-up, one line naming the secret.
      const file = join(dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          $destinations: { app: { url: "http://127.0.0.1:9/x", secret: "secret:app" } },
          st: { provider: "plain", routes: ["app"] },
        }),
      );
      const applied = await runScript("inbox.ts", ["config", "apply", file, "--db", db], { INBOX_SECRETS_KEY: B });
      assert.equal(applied.code, 0, applied.stderr);
      const bare = await runScript("worker.ts", ["--db", db, "--once"], { INBOX_SECRETS_KEY: "" });
      assert.equal(bare.code, 2);
      const lines = bare.stderr.trim().split("\n");
      assert.equal(lines.length, 1, bare.stderr);
      assert.match(lines[0]!, /secret:app is sealed, and this process has no key to open it/);
      // Another key is refused the same way; the control, with the key, runs.
      const wrong = await runScript("worker.ts", ["--db", db, "--once"], { INBOX_SECRETS_KEY: A });
      assert.match(
        wrong.stderr,
        /secret:app: secret app was sealed with key [0-9a-f]{8}, which this process does not hold/,
      );
      const worker = startWorker(db, ["--metrics-port", "0"], { INBOX_SECRETS_KEY: B });
      await until("the worker runs", () => /Metrics on/.test(worker.log()));
      assert.equal(await worker.stop(), 0, worker.log());
    } finally {
      cleanup();
    }
  });
});
