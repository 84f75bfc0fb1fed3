// test/contract-admin.test.ts: the contract's methods the operator page reads through, run against both
// backends (a real SQLite file, and a fresh schema on a real PostgreSQL), so admin.ts needs no SQL of its own.
// The clock is pinned.

import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Inbox } from "../lib/store.ts";
import { backends } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const LEASE = 60_000;

for (const backend of await backends("contract_admin")) {
  describe(`the operator's contract on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let t: number;
    let inbox: Inbox;

    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      t = T0;
      inbox = await connect(target, { now: () => t, random: () => 0 });
    });
    afterEach(async () => {
      await inbox.close();
      await cleanup();
    });

    // failAs stores a delivery at the clock's time, then sets it aside with this error.
    const failAs = async (id: string, error: string) => {
      assert.equal(await inbox.store({ id, body: Buffer.from(`{"id":"${id}"}`) }), "stored");
      const lease = await inbox.claim(LEASE);
      assert.equal(lease?.id, id);
      assert.deepEqual(await inbox.fail(lease!, error, { permanent: true }), { status: "failed" });
    };

    describe("failuresByError()", () => {
      it("counts the failed deliveries by their exact error, each with the newest one's received time", async () => {
        await failAs("evt_1", "timeout after 5012 ms");
        t += 1_000;
        await failAs("evt_2", "timeout after 5012 ms");
        t += 1_000;
        await failAs("evt_3", "HTTP 500");
        const groups = await inbox.failuresByError();
        assert.deepEqual(
          groups.sort((a, b) => b.count - a.count),
          [
            { error: "timeout after 5012 ms", count: 2, latest: T0 + 1_000 },
            { error: "HTTP 500", count: 1, latest: T0 + 2_000 },
          ],
        );
      });

      it("leaves out what is not failed: waiting, done, and a failed one retried", async () => {
        await failAs("evt_1", "HTTP 500");
        await failAs("evt_2", "HTTP 500");
        assert.equal(await inbox.retry({ id: "evt_2" }), 1);
        await inbox.store({ id: "evt_3", body: Buffer.from("{}") });
        await inbox.store({ id: "evt_4", body: Buffer.from("{}") });
        const lease = await inbox.claim(LEASE);
        assert.ok(lease && (await inbox.finish(lease)));
        assert.deepEqual(await inbox.failuresByError(), [{ error: "HTTP 500", count: 1, latest: T0 }]);
      });

      it("returns an empty list when nothing has failed", async () => {
        await inbox.store({ id: "evt_1", body: Buffer.from("{}") });
        assert.deepEqual(await inbox.failuresByError(), []);
      });
    });
  });
}
