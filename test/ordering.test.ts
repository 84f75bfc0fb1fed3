// test/ordering.test.ts: per-key ordering, held to one contract on both backends like test/contract-*.test.ts:
// a real SQLite file, and a fresh schema on a real PostgreSQL (skipped in one line without one). The
// clock is pinned. Deliveries that share an order key run one at a time, in event time then arrival.

import assert from "node:assert/strict";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Inbox, InboxOptions, Incoming, Lease } from "../lib/store.ts";
import { run, type Job } from "../worker.ts";
import { freshSchema, postgresSkip, runScript, tempDir, backends } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const LEASE = 60_000;
const pgSkip = await postgresSkip();
const ids = (leases: Lease[]) => leases.map((l) => l.id);

const BACKENDS = await backends("ordering");

for (const backend of BACKENDS) {
  describe(`ordering on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let t: number;
    let opened: Inbox[];
    const open = async (options: InboxOptions = {}) => {
      const inbox = await connect(target, {
        now: () => t,
        random: () => 0,
        retryDelayMs: 1_000,
        maxAttempts: 3,
        ...options,
      });
      opened.push(inbox);
      return inbox;
    };
    const put = (
      inbox: Inbox,
      id: string,
      orderKey: string | null,
      eventTime?: number,
      extra: Partial<Incoming> = {},
    ) =>
      inbox.store({ id, body: Buffer.from(JSON.stringify({ id })), orderKey, eventTime: eventTime ?? null, ...extra });

    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      t = T0;
      opened = [];
    });
    afterEach(async () => {
      for (const inbox of opened) await inbox.close();
      await cleanup();
    });

    it("runs one delivery of a key at a time, in event time then arrival, beside unordered ones and other keys", async () => {
      const inbox = await open();
      await put(inbox, "k-30", "k", 30);
      await put(inbox, "k-10", "k", 10);
      await put(inbox, "k-20a", "k", 20);
      await put(inbox, "k-20b", "k", 20);
      await put(inbox, "j-5", "j", 5);
      await put(inbox, "free", null);
      const first = await inbox.claimBatch(10, LEASE);
      assert.deepEqual(ids(first).sort(), ["free", "j-5", "k-10"]);
      assert.deepEqual(await inbox.claimBatch(10, LEASE), [], "nothing more of k while k-10 runs");
      const order: string[] = [];
      for (let lease: Lease | undefined = first.find((l) => l.id === "k-10"); lease; lease = await inbox.claim(LEASE)) {
        order.push(lease.id);
        assert.equal(lease.orderKey, "k");
        assert.equal(lease.newerId, null);
        assert.deepEqual(await inbox.claimBatch(10, LEASE), [], `nothing else runs beside ${lease.id}`);
        assert.equal(await inbox.finish(lease), true);
      }
      assert.deepEqual(order, ["k-10", "k-20a", "k-20b", "k-30"]);
    });

    it("flags as stale, with the newer one's ID, a delivery older than one already handled; an earlier one that arrives in time goes first", async () => {
      const inbox = await open();
      await put(inbox, "updated", "sub_1", 20);
      await put(inbox, "created", "sub_1", 10);
      const created = (await inbox.claim(LEASE))!;
      assert.equal(created.id, "created", "arrived second, but happened first");
      await inbox.finish(created);
      const updated = (await inbox.claim(LEASE))!;
      await inbox.finish(updated);
      await put(inbox, "late", "sub_1", 15);
      const late = (await inbox.claim(LEASE))!;
      assert.deepEqual([late.id, late.newerId], ["late", "updated"]);
      await inbox.finish(late);
      assert.equal((await inbox.find("late"))[0]!.newerId, "updated");
      assert.equal((await inbox.status()).ordering.stale, 1);
      // Falls back to the provider's signed time, then to arrival: a later one of equal time is not stale.
      await put(inbox, "same", "sub_1", 20);
      assert.equal((await inbox.claim(LEASE))!.newerId, null);
    });

    it("holds a key behind a delivery waiting for its retry, and says so in status", async () => {
      const inbox = await open();
      await put(inbox, "a", "k", 1);
      await put(inbox, "b", "k", 2);
      await put(inbox, "other", "j", 1);
      const a = (await inbox.claimBatch(10, LEASE)).find((l) => l.id === "a")!;
      assert.deepEqual(await inbox.fail(a, "timeout"), { status: "received", retryAt: T0 + 1_000 });
      assert.deepEqual(await inbox.claimBatch(10, LEASE), [], "b waits behind a's retry");
      const s = await inbox.status();
      assert.deepEqual(
        s.ordering.held.map((h) => [h.orderKey, h.headId, h.reason, h.retryAt, h.waiting, h.error]),
        [["k", "a", "retry", T0 + 1_000, 1, "timeout"]],
      );
      assert.equal(s.ordering.heldKeys, 1);
      t += 1_000;
      const again = await inbox.claimBatch(10, LEASE);
      assert.deepEqual(ids(again), ["a"]);
      await inbox.finish(again[0]!);
      assert.deepEqual(ids(await inbox.claimBatch(10, LEASE)), ["b"]);
    });

    it("lets later ones pass a delivery set aside as failed, and flags it stale when it is retried after them", async () => {
      const inbox = await open();
      await put(inbox, "a", "k", 1);
      await put(inbox, "b", "k", 2);
      assert.deepEqual(await inbox.fail((await inbox.claim(LEASE))!, "bad", { permanent: true }), { status: "failed" });
      const b = (await inbox.claim(LEASE))!;
      assert.equal(b.id, "b");
      await inbox.finish(b);
      assert.equal((await inbox.status()).ordering.passed, 1);
      assert.equal(await inbox.retry({ id: "a" }), 1);
      const a = (await inbox.claim(LEASE))!;
      assert.deepEqual([a.id, a.newerId], ["a", "b"]);
    });

    it("blocks a strict key behind a delivery set aside as failed until it is retried", async () => {
      const inbox = await open();
      await put(inbox, "a", "k", 1, { strictOrder: true });
      await put(inbox, "b", "k", 2, { strictOrder: true });
      await inbox.fail((await inbox.claim(LEASE))!, "bad", { permanent: true });
      assert.equal(await inbox.claim(LEASE), undefined, "b is blocked");
      const s = await inbox.status();
      assert.deepEqual(
        s.ordering.held.map((h) => [h.orderKey, h.headId, h.reason, h.waiting]),
        [["k", "a", "failed", 1]],
      );
      assert.equal(s.ordering.passed, 0);
      await inbox.retry({ id: "a" });
      const a = (await inbox.claim(LEASE))!;
      assert.deepEqual([a.id, a.newerId], ["a", null]);
      await inbox.finish(a);
      assert.equal((await inbox.claim(LEASE))!.id, "b");
    });

    it("keeps the key busy through a lease takeover, and the old holder is fenced out", async () => {
      const inbox = await open();
      await put(inbox, "a", "k", 1);
      await put(inbox, "b", "k", 2);
      const old = (await inbox.claim(LEASE))!;
      t += LEASE;
      const taken = await inbox.claimBatch(10, LEASE);
      assert.deepEqual(ids(taken), ["a"], "the takeover is a again, not b");
      assert.equal(await inbox.finish(old), false);
      assert.equal(await inbox.fail(old, "late"), undefined);
      assert.deepEqual(await inbox.claimBatch(10, LEASE), []);
      await inbox.finish(taken[0]!);
      assert.equal((await inbox.claim(LEASE))!.id, "b");
    });

    it("puts a released delivery back at its key's head, and sets aside one whose last lease expired", async () => {
      const inbox = await open({ maxAttempts: 1 });
      await put(inbox, "a", "k", 1);
      await put(inbox, "b", "k", 2);
      assert.equal(await inbox.release((await inbox.claim(LEASE))!), true);
      const a = (await inbox.claim(LEASE))!;
      assert.equal(a.id, "a");
      t += LEASE;
      // a used its only attempt and its worker vanished: set aside, and b goes on.
      assert.deepEqual(ids(await inbox.claimBatch(10, LEASE)), ["b"]);
      assert.equal((await inbox.find("a"))[0]!.status, "failed");
    });

    it("never hands two deliveries of one key to two inboxes claiming at once", async () => {
      const [one, two] = [await open(), await open()];
      for (let i = 0; i < 60; i++) await put(one, `d${i}`, `key${i % 6}`, i);
      const running = new Map<string, string>();
      const seen: string[] = [];
      const worker = async (inbox: Inbox) => {
        for (;;) {
          const leases = await inbox.claimBatch(4, LEASE);
          if (leases.length === 0 && seen.length >= 60) return;
          for (const lease of leases) {
            assert.equal(
              running.get(lease.orderKey!),
              undefined,
              `${lease.id} claimed while ${running.get(lease.orderKey!)} runs`,
            );
            running.set(lease.orderKey!, lease.id);
          }
          await new Promise((resolve) => setImmediate(resolve));
          for (const lease of leases) {
            running.delete(lease.orderKey!);
            seen.push(lease.id);
            await inbox.finish(lease);
          }
        }
      };
      await Promise.all([worker(one), worker(two)]);
      assert.equal(new Set(seen).size, 60);
      for (let k = 0; k < 6; k++) {
        const mine = seen.filter((id) => Number(id.slice(1)) % 6 === k).map((id) => Number(id.slice(1)));
        assert.deepEqual(
          mine,
          [...mine].sort((a, b) => a - b),
          `key${k} in event time`,
        );
      }
    });

    it("hands the handler job.stale and job.newerId", async () => {
      const inbox = await open();
      await put(inbox, "new", "k", 2);
      await run(() => {}, { inbox, once: true, log: () => {} });
      await put(inbox, "old", "k", 1);
      const jobs: Pick<Job, "stale" | "newerId">[] = [];
      await run((job) => void jobs.push({ stale: job.stale, newerId: job.newerId }), {
        inbox,
        once: true,
        log: () => {},
      });
      assert.deepEqual(jobs, [{ stale: true, newerId: "new" }]);
    });

    it("refuses an order key that is not a non-empty string, or an event time that is not a number", async () => {
      const inbox = await open();
      assert.throws(() => inbox.store({ id: "x", body: Buffer.from("{}"), orderKey: "" }), TypeError);
      assert.throws(
        () => inbox.store({ id: "x", body: Buffer.from("{}"), orderKey: 5 as unknown as string }),
        /expected orderKey/,
      );
      assert.throws(
        () => inbox.store({ id: "x", body: Buffer.from("{}"), orderKey: "k", eventTime: Number.NaN }),
        /expected eventTime/,
      );
    });
  });
}

describe("copying an inbox with ordered keys", { skip: pgSkip }, () => {
  it("keeps each key's order, its running delivery and its last handled event, SQLite to PostgreSQL and back", async () => {
    const dir = tempDir();
    const fresh = await freshSchema("ordcopy");
    let t = T0;
    const options = { now: () => t, random: () => 0 };
    const from = await connect(join(dir.dir, "from.db"), options);
    const via = await connect(fresh.url, options);
    const back = await connect(join(dir.dir, "back.db"), options);
    try {
      const put = (id: string, key: string, time: number) =>
        from.store({ id, body: Buffer.from("{}"), orderKey: key, eventTime: time });
      await put("k-2", "k", 2);
      await put("k-1", "k", 1);
      await put("k-3", "k", 3);
      await put("j-1", "j", 1);
      await put("j-2", "j", 2);
      const first = await from.claimBatch(10, LEASE);
      assert.deepEqual(ids(first).sort(), ["j-1", "k-1"]);
      await from.finish(first.find((l) => l.id === "j-1")!);
      // k-1 runs in `from` (its lease copies along); j-1 is done, so j-2 is j's head.
      const copy = async (a: Inbox, b: Inbox) => {
        for (let after: { source: string; id: string } | undefined; ; ) {
          const page = await a.page(after, 2);
          if (page.length === 0) break;
          await b.restore(page);
          after = page.at(-1);
        }
      };
      await copy(from, via);
      await copy(via, back);
      for (const inbox of [via, back]) {
        t = T0;
        // j's last handled event (j-1) came along: an older one that arrives now is stale.
        await inbox.store({ id: "j-0", body: Buffer.from("{}"), orderKey: "j", eventTime: 0 });
        const late = await inbox.claimBatch(10, LEASE);
        assert.deepEqual(
          late.map((l) => [l.id, l.newerId]),
          [["j-0", "j-1"]],
          `${inbox.backend}: k waits for its running k-1`,
        );
        await inbox.finish(late[0]!);
        const j2 = await inbox.claimBatch(10, LEASE);
        assert.deepEqual(ids(j2), ["j-2"]);
        await inbox.finish(j2[0]!);
        t += LEASE;
        const taken = await inbox.claimBatch(10, LEASE);
        assert.deepEqual(ids(taken), ["k-1"], `${inbox.backend}: k-1's expired lease is taken over`);
        await inbox.finish(taken[0]!);
        assert.deepEqual(ids(await inbox.claimBatch(10, LEASE)), ["k-2"]);
      }
    } finally {
      for (const inbox of [from, via, back]) await inbox.close();
      await fresh.drop();
      dir.cleanup();
    }
  });
});

describe("inbox.ts status and show with ordered keys", () => {
  it("names each held key and why, and counts stale and passed deliveries", async () => {
    const dir = tempDir();
    const path = join(dir.dir, "inbox.db");
    try {
      // The retry an hour off: the status commands below start processes of their own, which on a loaded
      // machine took longer than the default first delay, and the key was no longer held when they looked.
      const inbox = await connect(path, { random: () => 0, retryDelayMs: 3_600_000 });
      const put = (id: string, source: string, key: string, time: number, strictOrder = false) =>
        inbox.store({ source, id, body: Buffer.from("{}"), orderKey: key, eventTime: time, strictOrder });
      await put("evt_a", "stripe", "sub_1", 1);
      await put("evt_b", "stripe", "sub_1", 2);
      await put("o_1", "shop", "gid://shopify/Order/1", 1, true);
      await put("o_2", "shop", "gid://shopify/Order/1", 2, true);
      const leases = await inbox.claimBatch(10, LEASE);
      await inbox.fail(leases.find((l) => l.id === "evt_a")!, "card declined");
      await inbox.fail(leases.find((l) => l.id === "o_1")!, "bad address", { permanent: true });
      await inbox.close();
      const { code, stdout } = await runScript("inbox.ts", ["status", "--db", path]);
      assert.equal(code, 0);
      assert.match(
        stdout,
        /^ordered: 2 keys with work, 2 keys held up, 0 stale deliveries handed over, 0 set-aside deliveries passed by later ones$/m,
      );
      assert.match(
        stdout,
        /^ {2}held: shop\/gid:\/\/shopify\/Order\/1 is blocked by o_1, set aside as failed on a strict key \(retry it to go on\); 1 waiting: bad address$/m,
      );
      assert.match(
        stdout,
        /^ {2}held: stripe\/sub_1 waits for evt_a to be retried at \S+ \(attempt 2\); 1 waiting: card declined$/m,
      );
      const json = JSON.parse((await runScript("inbox.ts", ["status", "--json", "--db", path])).stdout);
      assert.deepEqual(
        json.ordering.held.map((h: { orderKey: string; reason: string }) => [h.orderKey, h.reason]),
        [
          ["gid://shopify/Order/1", "failed"],
          ["sub_1", "retry"],
        ],
      );
      const shown = await runScript("inbox.ts", ["show", "evt_b", "--db", path]);
      assert.match(shown.stdout, /^order key {5}sub_1$/m);
      assert.match(shown.stdout, /^stale {9}no$/m);
    } finally {
      dir.cleanup();
    }
  });
});
