// test/api-keys.test.ts: `inbox.ts keys create|list|revoke` as a newcomer runs them, on SQLite and PostgreSQL:
// the key is printed once (stdout holds it alone), the database keeps its SHA-256 and never the key, list
// shows no key or hash, revoke is for good and says so, and a bad scope or an unknown ID is a clear error.
//   npx node --import tsx --test test/api-keys.test.ts

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { backends, runScript } from "./helpers.ts";

const BACKENDS = await backends("apikeys");

for (const backend of BACKENDS) {
  describe(`inbox.ts keys on ${backend.name}`, { skip: backend.skip }, () => {
    let made: { target: string; cleanup: () => Promise<void> };
    before(async () => {
      made = await backend.make();
    });
    after(async () => made?.cleanup());
    const keys = (...args: string[]) => runScript("inbox.ts", ["keys", ...args, "--db", made.target]);

    it("prints a key once, keeps its SHA-256 alone, lists it without it, and revokes it for good", async () => {
      const created = await keys("create", "--scope", "write", "--name", "deploy bot");
      assert.equal(created.code, 0, created.stderr);
      const key = created.stdout.trim();
      assert.match(key, /^wik_[A-Za-z0-9_-]{43}$/, "stdout is the key alone, for $(…)");
      const id = /API key ([0-9a-f]{12}) \(write, deploy bot\)\. It is shown this once/.exec(created.stderr)?.[1];
      assert.ok(id, created.stderr);
      const inbox = await connect(made.target);
      try {
        const rows = await inbox.query("SELECT * FROM api_keys");
        assert.equal(rows.length, 1);
        assert.equal(rows[0]!.hash, createHash("sha256").update(key).digest("hex"));
        assert.ok(!JSON.stringify(rows).includes(key.slice(4)), "the key itself is nowhere in the table");
      } finally {
        await inbox.close();
      }
      const listed = await keys("list");
      assert.equal(listed.code, 0);
      assert.match(listed.stdout, new RegExp(`^${id}  write  created \\S+  deploy bot$`, "m"));
      assert.ok(!listed.stdout.includes(key.slice(4)) && !listed.stdout.includes("hash"));
      const json = JSON.parse((await keys("list", "--json")).stdout) as Record<string, unknown>[];
      assert.deepEqual(Object.keys(json[0]!).sort(), ["createdAt", "id", "name", "revokedAt", "scope"]);

      const revoked = await keys("revoke", id);
      assert.deepEqual([revoked.code, revoked.stdout.trim()], [0, `API key ${id} revoked.`]);
      assert.match(
        (await keys("list")).stdout,
        new RegExp(`^${id}  write  created \\S+  revoked \\S+  deploy bot$`, "m"),
      );
      const again = await keys("revoke", id);
      assert.deepEqual([again.code, again.stdout.trim()], [0, `API key ${id} was already revoked; nothing changed.`]);
    });

    it("refuses a scope that is neither read nor write, and an unknown ID, in one line each", async () => {
      const scope = await keys("create", "--scope", "admin");
      assert.equal(scope.code, 2);
      assert.match(scope.stderr, /expected read or write/);
      const unknown = await keys("revoke", "000000000000");
      assert.equal(unknown.code, 1);
      assert.equal(unknown.stderr.trim(), "No API key 000000000000: see inbox.ts keys list.");
      // The control: a good scope is taken.
      assert.equal((await keys("create", "--scope", "read")).code, 0);
    });
  });
}
