// test/api-keys.test.ts: `inbox.ts keys create|list|revoke` as a newcomer runs them, on SQLite and PostgreSQL:
// the key is printed once (stdout holds it alone), the database keeps its SHA-256 and never the key, list
// shows no key or hash, revoke is for good and says so, an admin key is made, and a bad scope or an unknown ID
// is a clear error. A database made before the admin scope keeps its keys through the migration that allows it.
//   npx node --import tsx --test test/api-keys.test.ts

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { hashKey, mintKey } from "../lib/api/keys.ts";
import { MIGRATIONS as PG_MIGRATIONS } from "../lib/postgres/schema.ts";
import { MIGRATIONS as SQLITE_MIGRATIONS } from "../lib/sqlite/schema.ts";
import { backends, freshSchema, pastSchema, postgresSkip, runScript, tempDir } from "./helpers.ts";

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

    it("makes an admin key, which keys list shows as admin", async () => {
      const created = await keys("create", "--scope", "admin", "--name", "platform", "--json");
      assert.equal(created.code, 0, created.stderr);
      const made = JSON.parse(created.stdout) as { id: string; scope: string; key: string };
      assert.equal(made.scope, "admin");
      assert.match((await keys("list")).stdout, new RegExp(`^${made.id}  admin  created \\S+  platform$`, "m"));
    });

    it("refuses a scope that is none of read, write and admin, and an unknown ID, in one line each", async () => {
      const scope = await keys("create", "--scope", "root");
      assert.equal(scope.code, 2);
      assert.match(scope.stderr, /expected read, write or admin/);
      const unknown = await keys("revoke", "000000000000");
      assert.equal(unknown.code, 1);
      assert.equal(unknown.stderr.trim(), "No API key 000000000000: see inbox.ts keys list.");
      // The control: a good scope is taken.
      assert.equal((await keys("create", "--scope", "read")).code, 0);
    });
  });
}

// The schema before the admin scope: every migration up to the one that allows it.
const beforeAdmin = (list: readonly string[]) =>
  list.slice(
    0,
    list.findIndex((m) => m.includes("'admin'")),
  );
const T0 = 1_700_000_000_000;
const pgSkip = await postgresSkip();
const old = mintKey({ scope: "write", name: "deploys", now: T0 });
const insertOld = `INSERT INTO api_keys (id, name, scope, hash, created_at, revoked_at) VALUES ('${old.row.id}', 'deploys', 'write', '${old.row.hash}', ${T0}, NULL)`;
const insertAdmin = `INSERT INTO api_keys (id, name, scope, hash, created_at, revoked_at) VALUES ('aaaaaaaaaaaa', 'x', 'admin', 'h', ${T0}, NULL)`;

// migrated opens the old database through connect(), which migrates it: its key is there, and an admin key is taken.
async function migrated(target: string): Promise<void> {
  const inbox = await connect(target);
  try {
    assert.deepEqual(await inbox.apiKeyByHash(hashKey(old.key)), old.row);
    const admin = mintKey({ scope: "admin", name: "platform", now: T0 + 1 });
    await inbox.addApiKey(admin.row);
    assert.deepEqual(
      (await inbox.apiKeys()).map((k) => [k.name, k.scope]),
      [
        ["deploys", "write"],
        ["platform", "admin"],
      ],
    );
  } finally {
    await inbox.close();
  }
}

describe("a database made before the admin scope", () => {
  it("keeps its keys through the migration on SQLite, and then takes an admin key (the old table refused one)", async () => {
    const dir = tempDir();
    try {
      const path = join(dir.dir, "old.db");
      const list = beforeAdmin(SQLITE_MIGRATIONS);
      assert.ok(list.length > 0 && list.length < SQLITE_MIGRATIONS.length);
      const past = await pastSchema("sqlite", path, list);
      await past.exec(insertOld);
      // The control: the table as it was refuses an admin key.
      await assert.rejects(past.exec(insertAdmin), /CHECK constraint failed/);
      await past.close();
      await migrated(path);
    } finally {
      dir.cleanup();
    }
  });

  it("keeps its keys through the migration on PostgreSQL, and then takes an admin key", { skip: pgSkip }, async () => {
    const fresh = await freshSchema("migrscope");
    try {
      const past = await pastSchema("postgres", fresh.schema, beforeAdmin(PG_MIGRATIONS));
      try {
        await past.exec(insertOld);
        await assert.rejects(past.exec(insertAdmin), /api_keys_scope_check/);
      } finally {
        await past.close();
      }
      await migrated(fresh.url);
    } finally {
      await fresh.drop();
    }
  });
});
