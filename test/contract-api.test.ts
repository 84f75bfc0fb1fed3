// test/contract-api.test.ts: the contract's part for the JSON API (lib/api/), on both backends
// (test/contract-harness.ts): API keys kept by hash and revoked for good, an admin key's scope kept, a POST's first answer kept under
// its idempotency key (the first one wins, the expired go), and the audit log, newest first, in pages; keys and
// the audit log written into another inbox as they are (restoreApiKeys, restoreAudit), for copy.
//   npx node --import tsx --test test/contract-api.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { hashKey, mintKey } from "../lib/api/keys.ts";
import { contract, T0 } from "./contract-harness.ts";

contract((suite) => {
  const { open } = suite;

  describe("API keys", () => {
    it("addApiKey keeps the hash alone; apiKeyByHash finds it; revokeApiKey revokes once; apiKeys lists them all", async () => {
      const inbox = await open();
      const { key, row } = mintKey({ scope: "write", name: "ci", now: T0 });
      const read = mintKey({ scope: "read", name: "", now: T0 + 1 });
      await inbox.addApiKey(row);
      await inbox.addApiKey(read.row);
      assert.deepEqual(await inbox.apiKeyByHash(hashKey(key)), row);
      assert.equal(await inbox.apiKeyByHash(hashKey(`${key}x`)), undefined, "the control: another key is unknown");
      const stored = JSON.stringify(await inbox.query("SELECT * FROM api_keys"));
      assert.ok(!stored.includes(key), "the key itself is never stored");
      assert.equal(await inbox.revokeApiKey(row.id, T0 + 5), true);
      assert.equal(await inbox.revokeApiKey(row.id, T0 + 6), false, "a second revoke changes nothing");
      assert.equal(await inbox.revokeApiKey("nope", T0 + 6), false);
      assert.deepEqual(
        (await inbox.apiKeys()).map((k) => [k.id, k.scope, k.revokedAt]),
        [
          [row.id, "write", T0 + 5],
          [read.row.id, "read", null],
        ],
      );
      await assert.rejects(inbox.addApiKey(row), "the same key twice is refused");
    });
    it("keeps an admin key's scope as it is, and the table refuses a scope it does not know (the control)", async () => {
      const inbox = await open();
      const admin = mintKey({ scope: "admin", name: "platform", now: T0 });
      await inbox.addApiKey(admin.row);
      assert.equal((await inbox.apiKeyByHash(hashKey(admin.key)))?.scope, "admin");
      assert.deepEqual(
        (await inbox.apiKeys()).map((k) => k.scope),
        ["admin"],
      );
      const root = mintKey({ scope: "admin", name: "", now: T0 + 1 });
      await assert.rejects(inbox.addApiKey({ ...root.row, scope: "root" as "admin" }), /check|constraint/i);
      assert.equal((await inbox.apiKeys()).length, 1, "nothing of the refused key was stored");
    });
    it("restoreApiKeys writes another inbox's keys as they are, revoked ones too: each key works there, and only there once", async () => {
      const inbox = await open();
      const live = mintKey({ scope: "write", name: "ci", now: T0 });
      const gone = mintKey({ scope: "read", name: "old", now: T0 + 1 });
      await inbox.addApiKey(live.row);
      await inbox.addApiKey(gone.row);
      await inbox.revokeApiKey(gone.row.id, T0 + 2);
      const copy = await suite.another();
      assert.equal(await copy.restoreApiKeys(await inbox.apiKeys()), 2);
      assert.deepEqual(await copy.apiKeys(), await inbox.apiKeys());
      assert.deepEqual(await copy.apiKeyByHash(hashKey(live.key)), live.row);
      assert.equal((await copy.apiKeyByHash(hashKey(gone.key)))?.revokedAt, T0 + 2, "still revoked there");
      assert.equal(await copy.restoreApiKeys(await inbox.apiKeys()), 0, "run again, it writes nothing");
    });
  });

  describe("idempotency records", () => {
    it("remember keeps the first answer under a key and returns it to a second; recall finds it while it is live", async () => {
      const inbox = await open();
      const first = { key: "key:a:k1", requestHash: "h1", status: 200, body: '{"count":1}', at: T0 };
      assert.deepEqual(await inbox.remember(first, T0 - 1_000), first);
      const second = { ...first, requestHash: "h2", body: '{"count":2}', at: T0 + 10 };
      assert.deepEqual(await inbox.remember(second, T0 - 1_000), first, "the first answer stands");
      assert.deepEqual(await inbox.recall("key:a:k1", T0), first);
      assert.equal(await inbox.recall("key:a:k1", T0 + 1), undefined, "older than since: not recalled");
      assert.equal(await inbox.recall("key:b:k1", T0 - 1), undefined, "another caller's key is another record");
      // Past its time, a record goes when the next one is kept, and the key is free again.
      const later = { ...second, at: T0 + 100_000 };
      assert.deepEqual(await inbox.remember(later, T0 + 1), later);
      assert.deepEqual(await inbox.recall("key:a:k1", T0), later);
    });
  });

  describe("the audit log", () => {
    it("addAudit appends; auditLog lists newest first, limit entries at a time, before a seq", async () => {
      const inbox = await open();
      for (let i = 0; i < 5; i++)
        await inbox.addAudit({
          at: T0 + i,
          who: `key:k${i}`,
          operation: "pauseDestination",
          target: `d${i}`,
          count: i,
        });
      const all = await inbox.auditLog({ limit: 10 });
      assert.deepEqual(
        all.map((e) => [e.who, e.target, e.count, e.at]),
        [4, 3, 2, 1, 0].map((i) => [`key:k${i}`, `d${i}`, i, T0 + i]),
      );
      const page = await inbox.auditLog({ limit: 2, before: all[1]!.seq });
      assert.deepEqual(
        page.map((e) => e.target),
        ["d2", "d1"],
      );
      assert.deepEqual(await inbox.auditLog({ limit: 2, before: all[4]!.seq }), []);
    });

    it("restoreAudit writes another inbox's entries with their seq, and the next entry added there comes after them", async () => {
      const inbox = await open();
      for (let i = 0; i < 3; i++)
        await inbox.addAudit({ at: T0 + i, who: "key:k", operation: "retry", target: `d${i}`, count: 1 });
      const entries = (await inbox.auditLog({ limit: 10 })).reverse();
      const copy = await suite.another();
      assert.equal(await copy.restoreAudit(entries), 3);
      assert.deepEqual((await copy.auditLog({ limit: 10 })).reverse(), entries);
      assert.equal(await copy.restoreAudit(entries), 0, "run again, it writes nothing");
      await copy.addAudit({ at: T0 + 9, who: "page:ann", operation: "pause", target: "app", count: 1 });
      const [newest] = await copy.auditLog({ limit: 1 });
      assert.equal(newest!.target, "app");
      assert.ok(newest!.seq > entries.at(-1)!.seq, `seq ${newest!.seq} follows the copied ${entries.at(-1)!.seq}`);
    });
  });
});
