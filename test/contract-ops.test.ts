// test/contract-ops.test.ts: the operator's side of the contract, on both backends (test/contract-harness.ts):
// retention (purge(), dropBodies(), kept()), and moving deliveries between backends with page() and inbox.ts copy.
//   npx node --import tsx --test test/contract-ops.test.ts

import assert from "node:assert/strict";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { sha256, type Delivery, type Inbox } from "../lib/store.ts";
import { run } from "../worker.ts";
import { freshSchema, runScript, tempDir } from "./helpers.ts";
import { body, contract, LEASE, pgSkip, T0 } from "./contract-harness.ts";

contract((suite) => {
  const { open } = suite;
  describe("retention: purge(), dropBodies(), kept()", () => {
    const DAY = 86_400_000;
    // Delivered and handled at once: done, its body kept.
    const handled = async (inbox: Inbox, id: string, payload: unknown = { id }) => {
      await inbox.store({ id, body: body(payload) });
      const lease = (await inbox.claim(LEASE))!;
      assert.equal(await inbox.finish(lease), true);
    };

    it("drops old done bodies but remembers the IDs: a redelivery is a duplicate and no handler runs again", async () => {
      const inbox = await open();
      await handled(inbox, "old");
      suite.t += 6 * DAY;
      await handled(inbox, "young");
      suite.t += 2 * DAY;
      const purged = await inbox.purge();
      assert.deepEqual(
        { ...purged, vacuumedBytes: 0 },
        { bodies: 1, bytes: body({ id: "old" }).length, forgotten: 0, vacuumedBytes: 0 },
      );
      const [old] = await inbox.find("old");
      assert.deepEqual(
        [old!.status, old!.body.length, old!.purgedAt, old!.bodySha256],
        ["done", 0, suite.t, sha256(body({ id: "old" }))],
      );
      assert.equal((await inbox.find("young"))[0]!.body.length, body({ id: "young" }).length);
      assert.equal(await inbox.store({ id: "old", body: body({ id: "old" }) }), "duplicate");
      assert.equal(
        await inbox.store({ id: "old", body: body({ id: "forged" }) }),
        "conflict",
        "a different body is still told by its hash",
      );
      assert.equal((await inbox.find("old"))[0]!.conflicts, 1);
      let ran = 0;
      await run(() => void ran++, { inbox, once: true, log: () => {} });
      assert.equal(ran, 0, "the tombstoned ID is never handled again");
      assert.deepEqual(
        await inbox.purge(),
        { bodies: 0, bytes: 0, forgotten: 0, vacuumedBytes: 0 },
        "run twice, nothing more goes",
      );
    });

    it("forgets a tombstone after forgetAfterMs: a copy that arrives later is stored as new", async () => {
      const inbox = await open();
      await handled(inbox, "evt_1");
      suite.t += 8 * DAY;
      await inbox.purge();
      suite.t += 23 * DAY;
      assert.equal((await inbox.purge()).forgotten, 1);
      assert.equal((await inbox.find("evt_1")).length, 0);
      assert.equal(await inbox.store({ id: "evt_1", body: body({ id: "evt_1" }) }), "stored");
      assert.equal((await inbox.claim(LEASE))!.id, "evt_1");
    });

    it("keeps failed bodies until they are purged by name; a tombstone cannot be retried or replayed, and says so", async () => {
      const inbox = await open();
      await inbox.store({ id: "bad", body: body({}) });
      await inbox.fail((await inbox.claim(LEASE))!, "nope", { permanent: true });
      await handled(inbox, "done");
      suite.t += 40 * DAY;
      assert.deepEqual((await inbox.purge()).bodies, 1);
      assert.equal(
        (await inbox.find("bad"))[0]!.body.length,
        body({}).length,
        "a failed delivery keeps its body to be fixed and retried",
      );
      assert.equal((await inbox.find("done")).length, 0, "past both ages: body and tombstone went in one run");
      assert.deepEqual(await inbox.dropBodies({ id: "bad" }, { dryRun: true }), {
        bodies: 1,
        bytes: body({}).length,
      });
      assert.deepEqual(await inbox.dropBodies({ id: "bad" }), { bodies: 1, bytes: body({}).length });
      assert.equal(await inbox.retry({ id: "bad" }), 0);
      assert.equal(await inbox.retryMatching({}), 0);
      assert.equal(await inbox.store({ id: "bad", body: body({}) }), "duplicate");
      await handled(inbox, "replayable");
      await inbox.dropBodies({ id: "replayable" });
      assert.deepEqual(await inbox.replayMatching({}), { replayed: 0, tombstoned: 1 });
    });

    it("dry run counts what would go and changes nothing", async () => {
      const inbox = await open();
      await handled(inbox, "a");
      await handled(inbox, "b");
      suite.t += 8 * DAY;
      const before = await inbox.search({}, { limit: 10 });
      assert.deepEqual(await inbox.purge({ dryRun: true }), {
        bodies: 2,
        bytes: 2 * body({ id: "a" }).length,
        forgotten: 0,
        vacuumedBytes: 0,
      });
      assert.deepEqual(await inbox.search({}, { limit: 10 }), before);
      assert.equal((await inbox.purge({ dryRun: true, bodiesAfterMs: DAY, forgetAfterMs: 2 * DAY })).forgotten, 2);
      assert.deepEqual(await inbox.search({}, { limit: 10 }), before);
    });

    it("works in bounded batches, and refuses a memory no longer than the bodies", async () => {
      const inbox = await open();
      for (let i = 0; i < 7; i++) await handled(inbox, `e${i}`);
      suite.t += 8 * DAY;
      assert.equal((await inbox.purge({ batch: 2 })).bodies, 7);
      await assert.rejects(async () => inbox.purge({ bodiesAfterMs: DAY, forgetAfterMs: DAY }), TypeError);
    });

    it("a worker run with purge set purges at start, beside its handlers, and logs what went", async () => {
      const inbox = await open();
      await handled(inbox, "old");
      suite.t += 8 * DAY;
      await inbox.store({ id: "new", body: body({ id: "new" }) });
      const lines: string[] = [];
      let ran = 0;
      const stats = await run(() => void ran++, {
        inbox,
        once: true,
        log: (l) => lines.push(l),
        purge: { everyMs: 60_000 },
      });
      assert.deepEqual([stats.done, ran], [1, 1]);
      assert.equal((await inbox.find("old"))[0]!.purgedAt, suite.t);
      assert.ok(
        lines.some((l) => /^purge: dropped 1 bodies \(12 bytes\), forgot 0 tombstones/.test(l)),
        lines.join("\n"),
      );
      await assert.rejects(
        run(() => {}, { inbox, once: true, purge: { everyMs: 0 } }),
        TypeError,
      );
    });

    it("kept() counts bodies and tombstones, their bytes and the oldest of each", async () => {
      const inbox = await open();
      await handled(inbox, "a");
      suite.t += 1_000;
      await handled(inbox, "b");
      await inbox.store({ id: "c", body: body({ id: "c" }) });
      await inbox.dropBodies({ id: "a" });
      const kept = await inbox.kept();
      assert.deepEqual(kept.bodies, { count: 2, bytes: 2 * body({ id: "b" }).length, oldest: T0 + 1_000 });
      assert.deepEqual(kept.tombstones, { count: 1, oldest: T0 });
      assert.ok(kept.fileBytes > 0);
    });
  });
});
describe("moving between backends: page() and restore(), and inbox.ts copy", { skip: pgSkip }, () => {
  let dir: { dir: string; cleanup: () => void };
  let pgTarget: { url: string; drop: () => Promise<void> };
  beforeEach(async () => {
    dir = tempDir();
    pgTarget = await freshSchema("copy");
  });
  afterEach(async () => {
    await pgTarget.drop();
    dir.cleanup();
  });

  const strip = (d: Delivery) => ({ ...d, availableAt: d.status === "processing" ? 0 : d.availableAt });

  it("copies every delivery to PostgreSQL and back byte-exact; run again, it changes nothing and says so", async () => {
    const from = join(dir.dir, "from.db");
    const back = join(dir.dir, "back.db");
    let t = T0;
    const sqlite = new SqliteInbox(from, { now: () => t });
    await sqlite.store({ id: "plain", body: body({ a: 1 }) });
    await sqlite.store({
      source: "stripe",
      id: "bytes",
      body: Buffer.from([0xc3, 0x28, 0x00, 0xff]),
      eventType: "x.y",
      providerTime: 5,
    });
    await sqlite.store({ id: "plain", body: body({ a: 2 }) });
    await Promise.all(
      Array.from({ length: 1_100 }, (_, i) => sqlite.store({ source: "bulk", id: `b${i}`, body: body({ i }) })),
    );
    const failing = (await sqlite.claim(LEASE))!;
    await sqlite.fail(failing, "went wrong", { permanent: true });
    const doneOne = (await sqlite.claim(LEASE))!;
    await sqlite.finish(doneOne);
    await sqlite.claim(LEASE); // one left processing
    t += 1;
    const all = async (inbox: Inbox) => {
      const out: Delivery[] = [];
      let after: Delivery | undefined;
      for (let page = await inbox.page(undefined, 400); page.length > 0; page = await inbox.page(after, 400)) {
        out.push(...page);
        after = page.at(-1);
      }
      return out.map(strip);
    };
    const original = await all(sqlite);
    await sqlite.close();

    // The server trusts any password; this one is only there to be kept out of what the command prints.
    const withSecret = new URL(pgTarget.url);
    withSecret.password = "s3cret-pw";
    const first = await runScript("inbox.ts", ["copy", "--from", from, "--to", withSecret.toString()]);
    assert.equal(first.code, 0, first.stderr);
    assert.match(first.stdout, /Copied 1102 of 1102 deliveries/);
    assert.doesNotMatch(first.stdout + first.stderr, /s3cret-pw/, "the URL is shown without its password");
    assert.match(first.stdout, /:\*\*\*@/);
    const again = await runScript("inbox.ts", ["copy", "--from", from, "--to", pgTarget.url]);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /Nothing to copy: all 1102 deliveries/);

    const pg = await connect(pgTarget.url);
    try {
      assert.deepEqual(await all(pg), original);
    } finally {
      await pg.close();
    }
    const home = await runScript("inbox.ts", ["copy", "--from", pgTarget.url, "--to", back]);
    assert.equal(home.code, 0, home.stderr);
    const returned = new SqliteInbox(back);
    try {
      assert.deepEqual(await all(returned), original);
    } finally {
      await returned.close();
    }
  });
});
