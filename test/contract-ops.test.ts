// test/contract-ops.test.ts: the contract's housekeeping, on both backends (test/contract-harness.ts): flush()
// and close(), ready() and gauges() for /readyz and /metrics, onWake() beside polling, retention (purge(),
// dropBodies(), kept()), and moving deliveries with page() and restore(), between backends by inbox.ts copy,
// which carries the deliveries' attempt log (attemptPage(), restoreAttempts()), the configuration's history,
// the API keys and the audit log with them.
//   npx node --import tsx --test test/contract-ops.test.ts

import assert from "node:assert/strict";
import { writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { historyOf, makePeriods, periodOf } from "../lib/postgres/periods.ts";
import { DAYS_HELD } from "../lib/postgres/reads.ts";
import { parseTarget, Pool } from "../lib/postgres/pool.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Delivery, Inbox, KeptAttempt, Lease } from "../lib/store.ts";
import { sha256 } from "../lib/rows.ts";
import { hashKey } from "../lib/api/keys.ts";
import { Keyring } from "../lib/secrets.ts";
import { run } from "../worker.ts";
import { freshSchema, runScript, startReceiver, tempDir } from "./helpers.ts";
import { body, contract, LEASE, pgSkip, T0 } from "./contract-harness.ts";

contract((suite) => {
  const { backend, open, row } = suite;
  // PostgreSQL LISTENs for wake-ups unless told not to (?listen=false, as behind PgBouncer, which
  // test/pgbouncer.test.ts runs this suite through); SQLite is one machine, where polling is the wake-up.
  const listens = () => backend.name === "postgres" && !/[?&]listen=false/.test(suite.target);
  // blocked says whether a statement (whose text is like like) waits for a lock that the session pid holds: by
  // pid, not by text alone, as the same test run on another runtime beside this one (test/runtimes.test.ts) waits too.
  const blocked = async (inbox: Inbox, pid: number, like = "%") => {
    const [{ n }] = (await inbox.query(
      "SELECT count(*)::integer AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE ? AND ? = ANY(pg_blocking_pids(pid))",
      like,
      pid,
    )) as [{ n: number }];
    return n > 0;
  };
  // untilBlocked waits until blocked() says so.
  const untilBlocked = async (inbox: Inbox, pid: number, like = "%") => {
    while (!(await blocked(inbox, pid, like))) await new Promise((resolve) => setTimeout(resolve, 5));
  };

  describe("flush() and close()", () => {
    it("flush resolves once every write queued before it has committed, as another connection sees", async () => {
      const [inbox, other] = [await open(), await open()];
      await inbox.flush();
      await inbox.store({ id: "held", body: body({}) });
      const lease = (await inbox.claim(LEASE))!;
      // Queued, not awaited: flush() alone waits for them.
      const writes = [
        ...Array.from({ length: 20 }, (_, i) => inbox.store({ id: `evt_${i}`, body: body({ i }) })),
        inbox.finish(lease),
      ];
      await inbox.flush();
      assert.equal(await other.count({}), 21);
      assert.equal((await row(other, "held"))!.status, "done");
      await Promise.all(writes);
    });

    it("close commits what is queued, then lets go: later calls fail, a second close does nothing", async () => {
      const inbox = await open();
      const writes = Array.from({ length: 10 }, (_, i) => inbox.store({ id: `evt_${i}`, body: body({ i }) }));
      await inbox.close();
      assert.deepEqual(await Promise.all(writes), Array(10).fill("stored"));
      await assert.rejects(async () => inbox.store({ id: "late", body: body({}) }), /is closed/);
      await inbox.close();
      assert.equal(await (await open()).count({}), 10, "all ten are there when it is opened again");
    });
  });

  describe("ready()", () => {
    it("is true while a delivery could be committed, and else says why not: here, the inbox is closed", async () => {
      const inbox = await open();
      assert.equal(await inbox.ready(), true);
      assert.equal(await inbox.store({ id: "evt_1", body: body({}) }), "stored");
      assert.equal(await inbox.ready(), true);
      await inbox.close();
      assert.equal(await inbox.ready(), "the inbox is closed");
    });
  });

  describe("gauges()", () => {
    it("counts per source and status, leaving out the statuses with none, and the oldest wait of each source", async () => {
      const inbox = await open();
      assert.deepEqual(await inbox.gauges(), { bySourceStatus: [], oldestWaitingMs: [] });
      for (const id of ["s1", "s2"]) await inbox.store({ source: "stripe", id, body: body({}) });
      suite.t += 1_000;
      for (const id of ["g1", "g2"]) await inbox.store({ source: "github", id, body: body({}) });
      suite.t += 1_000;
      // One of stripe's waiting deliveries is ordered: SQLite counts those apart, and the gauge adds them up.
      await inbox.store({ source: "stripe", id: "s3", body: body({}), orderKey: "cus_1" });
      await inbox.store({ source: "stripe", id: "s4", body: body({}) });
      const fates: Record<string, (lease: Lease) => Promise<unknown>> = {
        s1: (l) => inbox.finish(l),
        s2: (l) => inbox.fail(l, "bad", { permanent: true }),
        g1: async () => {}, // still processing
        g2: (l) => inbox.finish(l),
        s3: (l) => inbox.release(l),
        s4: (l) => inbox.release(l),
      };
      for (const lease of await inbox.claimBatch(10, LEASE)) await fates[lease.id]!(lease);
      suite.t += 5_000;
      assert.deepEqual(await inbox.gauges(), {
        bySourceStatus: [
          { source: "github", status: "processing", n: 1 },
          { source: "github", status: "done", n: 1 },
          { source: "stripe", status: "received", n: 2 },
          { source: "stripe", status: "done", n: 1 },
          { source: "stripe", status: "failed", n: 1 },
        ],
        oldestWaitingMs: [
          { source: "github", ms: 6_000 },
          { source: "stripe", ms: 5_000 },
        ],
      });
    });
  });

  describe("onWake()", () => {
    // listening waits until the LISTEN is in place, as pg_stat_activity shows it: a NOTIFY sent before is lost.
    // In this test's database alone: pg_stat_activity shows the whole server, where another run's inboxes
    // (Deno's and Bun's suites run at once, each test in a database of its own) listen on the same channel name.
    const listening = async (inbox: Inbox) => {
      const listen = `LISTEN inbox_wake_${new URL(suite.target).searchParams.get("schema")}`;
      const sql = "SELECT 1 FROM pg_stat_activity WHERE query = ? AND state = 'idle' AND datname = current_database()";
      while ((await inbox.query(sql, listen)).length === 0) await new Promise((resolve) => setTimeout(resolve, 10));
    };

    // The wake-up is waited on, bounded by the test's timeout rather than by a sleep.
    it("tells every listener of another process's commit that stored or resumed, until it stops, wherever it can listen", {
      timeout: 20_000,
    }, async () => {
      const [worker, receiver, operator] = [await open(), await open(), await open()];
      const heard: string[] = [];
      const wakes: (() => void)[] = [];
      const woken = () => new Promise<void>((resolve) => wakes.push(resolve));
      const stopped = worker.onWake(() => heard.push("stopped"));
      const stop = worker.onWake(() => {
        heard.push("woken");
        wakes.shift()?.();
      });
      stopped();
      if (listens()) await listening(worker);
      let wake = woken();
      assert.equal(await receiver.store({ id: "evt_1", body: body({}) }), "stored");
      if (listens()) await wake;
      wake = woken();
      await operator.pause("app");
      assert.equal(await operator.resume("app"), true);
      if (listens()) await wake;
      await Promise.all([receiver.flush(), operator.flush()]);
      assert.deepEqual(heard, listens() ? ["woken", "woken"] : [], "a listener that stopped hears nothing");
      stop();
    });
  });

  describe("backend and target", () => {
    it("say which backend holds the deliveries, and where, without a password", async () => {
      if (backend.name === "sqlite") {
        const inbox = await open();
        assert.deepEqual([inbox.backend, inbox.target], ["sqlite", suite.target]);
        return;
      }
      // The server trusts any password; this one is only there to be kept out of the target.
      const url = new URL(suite.target);
      url.password = "s3cret-pw";
      const inbox = await connect(url.toString(), { now: () => suite.t });
      suite.opened.push(inbox);
      assert.equal(inbox.backend, "postgres");
      assert.doesNotMatch(inbox.target, /s3cret-pw/);
      assert.match(inbox.target, /:\*\*\*@/);
      assert.equal(new URL(inbox.target).searchParams.get("schema"), url.searchParams.get("schema"));
    });
  });

  describe("restore()", () => {
    // every reads an inbox whole, by page() in key order, two rows a page so the cursor is crossed.
    const every = async (inbox: Inbox) => {
      const out: Delivery[] = [];
      for (let page = await inbox.page(undefined, 2); page.length > 0; page = await inbox.page(out.at(-1), 2))
        out.push(...page);
      return out;
    };

    it("writes another inbox's page() as it is, every field and order key kept, and skips the keys it has", async () => {
      const from = await open();
      await from.store({
        source: "stripe",
        id: "s1",
        body: Buffer.from([0xff, 0x00, 0x5c]),
        eventType: "charge.succeeded",
        providerTime: 5,
        contentType: "application/json",
        headers: { "stripe-signature": ["t=1,v1=abc"] },
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      });
      await from.store({ id: "both", body: body({}), destinations: ["app", "ledger"] });
      await from.store({ id: "k1", body: body({ n: 1 }), orderKey: "cus_1" });
      await from.store({ id: "bad", body: body({}) });
      await from.store({ id: "bad", body: body({ other: 1 }) });
      suite.t += 1;
      await from.store({ id: "k2", body: body({ n: 2 }), orderKey: "cus_1" });
      for (const lease of await from.claimBatch(10, LEASE)) {
        if (lease.id === "s1") await from.finish(lease);
        if (lease.id === "bad") await from.fail(lease, "nope", { permanent: true });
      }
      const rows = await every(from);
      assert.equal(rows.length, 6);
      assert.equal(await from.restore(rows), 0, "every key is already there");
      const to = await suite.another();
      assert.equal(await to.restore(rows), 6);
      assert.deepEqual(await every(to), rows);
      assert.equal(await to.restore(rows), 0, "run again, it adds nothing");
      // k1 is still leased (its holder is in the other inbox), and k2 waits behind it on its key.
      assert.deepEqual(await to.claimBatch(10, LEASE), []);
      suite.t += LEASE;
      const [k1] = await to.claimBatch(10, LEASE);
      assert.deepEqual([k1?.id, k1?.attempts], ["k1", 2], "taken over once its lease ran out");
      assert.equal(await to.finish(k1!), true);
      assert.deepEqual(
        (await to.claimBatch(10, LEASE)).map((l) => l.id),
        ["k2"],
      );
    });
  });

  describe("attemptPage() and restoreAttempts()", () => {
    // pages reads an inbox's attempt log by attemptPage(), limit tries a page, one array per page.
    const pages = async (inbox: Inbox, limit: number) => {
      const out: KeptAttempt[][] = [];
      for (let page = await inbox.attemptPage(undefined, limit); page.length > 0; ) {
        out.push(page);
        page = await inbox.attemptPage(page.at(-1), limit);
      }
      return out;
    };
    // copied restores from's deliveries into to, then its attempt log, page by page; how many tries it wrote.
    const copied = async (from: Inbox, to: Inbox, limit = 2) => {
      for (let page = await from.page(undefined, 100); page.length > 0; page = await from.page(page.at(-1), 100))
        await to.restore(page);
      let wrote = 0;
      for (const page of await pages(from, limit)) wrote += await to.restoreAttempts(page);
      return wrote;
    };
    const log = (inbox: Inbox, id: string, destination?: string) =>
      inbox.attempts({ source: "default", id, receivedAt: T0, ...(destination ? { destination } : {}) });

    it("writes another inbox's attempt log as attemptPage() reads it, a route whole a page, each try as it was and in its order; run again, it writes nothing", async () => {
      const from = await open({ retryDelayMs: 1, retryJitter: 0, maxAttempts: 10 });
      await from.store({ id: "a", body: body({}), destinations: ["app", "ledger"] });
      await from.store({ id: "b", body: body({}) });
      await from.store({ id: "quiet", body: body({}) });
      // Three tries of a to app in the same millisecond: only their seq orders them.
      const at = { startedAt: T0 + 1, ms: 7 };
      const app = { destination: "app" };
      await from.fail((await from.claim(LEASE, app))!, "HTTP 500 from app", {
        attempt: { ...at, status: 500, headers: { "content-type": "text/html" }, body: "<b>down</b> ✓" },
      });
      suite.t += 10;
      await from.fail((await from.claim(LEASE, app))!, "app did not answer", { attempt: at });
      suite.t += 10;
      assert.equal(await from.finish((await from.claim(LEASE, app))!, [], { ...at, status: 200, body: "ok" }), true);
      await from.fail((await from.claim(LEASE, { destination: "ledger" }))!, "HTTP 400", {
        permanent: true,
        attempt: { ...at, status: 400 },
      });
      const b = (await from.claimBatch(10, LEASE)).find((l) => l.id === "b")!;
      await from.fail(b, "handler threw");
      suite.t += 10;
      await from.fail((await from.claim(LEASE))!, "handler threw again");

      const read = await pages(from, 2);
      assert.deepEqual(
        read.map((page) => page.map((t) => `${t.id}/${t.destination}#${t.attempt}`)),
        [
          ["a/app#1", "a/app#2", "a/app#3"],
          ["a/ledger#1", "b/handler#1", "b/handler#2"],
        ],
        "a full page goes on to the end of its last route's log, and the next starts past it",
      );
      assert.deepEqual(read[0]![0]!.bodySha256, (await from.find("a"))[0]!.bodySha256);

      // A target that keeps two tries a route: a's three to app come as their newest two.
      const to = await suite.another({ attemptsKept: 2, retryDelayMs: 1, retryJitter: 0, maxAttempts: 10 });
      assert.equal(await copied(from, to), 5);
      for (const [id, destination] of [
        ["a", "app"],
        ["a", "ledger"],
        ["b", undefined],
        ["quiet", undefined],
      ] as const)
        assert.deepEqual(
          await log(to, id, destination),
          (await log(from, id, destination)).slice(-2),
          `${id} ${destination ?? ""}`,
        );
      assert.deepEqual(
        (await log(to, "a", "app")).map((t) => t.error),
        ["app did not answer", null],
      );
      assert.equal(await copied(from, to), 0, "run again, it writes nothing");
      assert.equal((await log(to, "a")).length, 3);

      // The copied tries are the oldest there: the copy's next try of b lets the first of them go.
      suite.t += 10;
      const next = (await to.claim(LEASE))!;
      assert.equal(next.id, "b");
      await to.fail(next, "handler threw on the copy");
      assert.deepEqual(
        (await log(to, "b")).map((t) => t.error),
        ["handler threw again", "handler threw on the copy"],
      );
    });

    it("keeps of a route's tries no more than the target keeps (attemptsKept), the newest, in their order", async () => {
      const from = await open({ retryDelayMs: 1, retryJitter: 0, maxAttempts: 10 });
      await from.store({ id: "many", body: body({ id: "many" }), destinations: ["app"] });
      await from.store({ id: "few", body: body({ id: "few" }), destinations: ["app"] });
      // Four tries of many to app, one of few: the second to fourth start in the same millisecond.
      for (let n = 1; n <= 4; n++) {
        for (const lease of await from.claimBatch(10, LEASE, { destination: "app" }))
          await from.fail(lease, `try ${n} of ${lease.id}`, {
            permanent: lease.id === "few",
            attempt: { startedAt: n === 1 ? T0 : T0 + 10, ms: n },
          });
        suite.t += 10;
      }
      const errors = async (inbox: Inbox, id: string) => (await log(inbox, id, "app")).map((t) => t.error);
      assert.equal((await log(from, "many", "app")).length, 4);

      const kept = await suite.another({ attemptsKept: 3, retryDelayMs: 1, retryJitter: 0, maxAttempts: 10 });
      assert.equal(await copied(from, kept), 4, "three of many's four, and few's one");
      assert.deepEqual(await errors(kept, "many"), ["try 2 of many", "try 3 of many", "try 4 of many"]);
      assert.deepEqual(await log(kept, "many", "app"), (await log(from, "many", "app")).slice(-3));
      assert.deepEqual(await errors(kept, "few"), ["try 1 of few"]);
      assert.equal(await copied(from, kept), 0, "run again, it writes nothing");
      // The copy's next try lets the oldest it kept go, as on the original.
      await kept.fail((await kept.claim(LEASE, { destination: "app" }))!, "try 5 of many");
      assert.deepEqual(await errors(kept, "many"), ["try 3 of many", "try 4 of many", "try 5 of many"]);

      // The control: a target that keeps more takes every try.
      const all = await suite.another({ attemptsKept: 4 });
      assert.equal(await copied(from, all), 5);
      assert.deepEqual(await log(all, "many", "app"), await log(from, "many", "app"));
    });

    it("leaves a route's tries out where the target holds another delivery of that ID, or tries of its own", async () => {
      const from = await open({ retryDelayMs: 1 });
      for (const id of ["same-time", "later", "tried", "bare"]) await from.store({ id, body: body({ id }) });
      for (const lease of await from.claimBatch(10, LEASE)) await from.fail(lease, `failed ${lease.id}`);
      const to = await suite.another({ retryDelayMs: 1 });
      // Another body at the same time, and the same body later: each a delivery of its own, whose tries are its own.
      await to.store({ id: "same-time", body: body({ other: true }) });
      suite.t += 1;
      await to.store({ id: "later", body: body({ id: "later" }) });
      for (let page = await from.page(undefined, 100); page.length > 0; page = await from.page(page.at(-1), 100))
        await to.restore(page);
      // The same delivery as from's, which the target has tried since the copy brought it.
      suite.t += 10;
      const own = (await to.claimBatch(10, LEASE)).find((l) => l.id === "tried")!;
      await to.fail(own, "tried on the copy");
      const before = await Promise.all(["same-time", "later", "tried"].map((id) => log(to, id)));

      let wrote = 0;
      for (const page of await pages(from, 100)) wrote += await to.restoreAttempts(page);
      // (control) The delivery the copy brought that had no tries there took its own: the call writes.
      assert.equal(wrote, 1);
      assert.deepEqual(
        (await log(to, "bare")).map((t) => t.error),
        ["failed bare"],
      );
      assert.deepEqual(await Promise.all(["same-time", "later", "tried"].map((id) => log(to, id))), before);
      assert.deepEqual(
        before.map((tries) => tries.map((t) => t.error)),
        [[], [], ["tried on the copy"]],
      );
    });
  });

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

    it("purges and forgets past one batch, each batch going on from the last, rows of one millisecond included", async () => {
      const inbox = await open();
      // Seven done deliveries, five of them received in the same millisecond, across a day's boundary.
      for (const [i, step] of [0, 0, 0, 0, 0, 1_000, DAY].entries()) {
        suite.t += step;
        await handled(inbox, `many_${i}`);
      }
      suite.t += 8 * DAY + 2 * DAY;
      // Batches of 2: a purge that stopped after one, or went on from past the last one's time rather than
      // from it (passing over the rest of that millisecond), would leave some.
      const purged = await inbox.purge({ batch: 2, rest: 0 });
      assert.equal(purged.bodies, 7);
      const rows = await inbox.search({}, { limit: 20 });
      assert.deepEqual(
        rows.filter((d) => d.id.startsWith("many_")).map((d) => d.purgedAt !== null),
        Array(7).fill(true),
      );
      suite.t += 30 * DAY;
      assert.equal((await inbox.purge({ batch: 2, rest: 0 })).forgotten, 7);
      assert.equal((await inbox.find("many_4")).length, 0);
    });

    suite.onPostgres(
      "releases a whole day of bodies by dropping its partition; its IDs stay duplicates, its failed body stays",
      async () => {
        const inbox = await open();
        const big = (id: string) => ({ id, pad: "x".repeat(1_000) }); // past inlineBodyBytes: kept apart
        await handled(inbox, "day_1");
        await handled(inbox, "day_2");
        // Bodies in the day's partition: their bytes are counted as the partition goes, not as the rows are marked.
        await handled(inbox, "day_3", big("day_3"));
        await inbox.store({ id: "day_bad", body: body({}) });
        await inbox.fail((await inbox.claim(LEASE))!, "nope", { permanent: true });
        await inbox.store({ id: "day_bad_big", body: body(big("day_bad_big")) });
        await inbox.fail((await inbox.claim(LEASE))!, "nope", { permanent: true });
        await inbox.store({ id: "day_later", body: body(big("day_later")) }); // still to do, a retry ahead
        await inbox.fail((await inbox.claim(LEASE))!, "not yet");
        const partitions = async () =>
          (await inbox.query("SELECT to_regclass(?) IS NOT NULL AS made", periodOf(T0).name))[0]!.made ? 1 : 0;
        assert.equal(await partitions(), 1, "opening the inbox made the day's partition");
        suite.t += 8 * DAY;
        // The control: a cutoff inside the day releases nothing of it.
        assert.equal((await inbox.purge({ bodiesAfterMs: 9 * DAY, forgetAfterMs: 30 * DAY })).bodies, 0);
        assert.equal(await partitions(), 1);
        const purged = await inbox.purge();
        assert.deepEqual(
          [purged.bodies, purged.bytes],
          [3, body({ id: "day_1" }).length + body({ id: "day_2" }).length + body(big("day_3")).length],
          "the kept failed body's bytes are not counted",
        );
        assert.equal(await partitions(), 0, "the day's partition was dropped");
        const [gone] = await inbox.find("day_1");
        assert.deepEqual([gone!.status, gone!.body.length, gone!.purgedAt], ["done", 0, suite.t]);
        assert.deepEqual((await inbox.find("day_bad"))[0]!.body, body({}), "a failed body of that day was kept");
        assert.deepEqual((await inbox.find("day_bad_big"))[0]!.body, body(big("day_bad_big")), "apart too");
        assert.deepEqual((await inbox.find("day_later"))[0]!.body, body(big("day_later")), "and one still to do");
        assert.deepEqual((await inbox.find("day_3"))[0]!.body.length, 0);
        assert.equal(await inbox.store({ id: "day_1", body: body({ id: "day_1" }) }), "duplicate");
        assert.equal(await inbox.store({ id: "day_2", body: body({ id: "forged" }) }), "conflict");
        assert.equal(await inbox.retry({ id: "day_bad" }), 1, "and it can still be retried, its body read back");
        const claimed = [(await inbox.claim(LEASE))!, (await inbox.claim(LEASE))!];
        assert.deepEqual(claimed.find((lease) => lease.id === "day_bad")!.body, body({}));
      },
    );

    suite.onPostgres(
      "counts a released day's bodies and bytes a few pages at a time, every page read once",
      async () => {
        const inbox = await open();
        // Half the bodies in their rows (the history's count reads them), half apart (the bodies' day's sum).
        const payload = (i: number) => (i % 2 ? { i } : { i, pad: "x".repeat(1_000) });
        let bytes = 0;
        for (let i = 0; i < 200; i++) {
          await handled(inbox, `step_${i}`, payload(i));
          bytes += body(payload(i)).length;
        }
        const pages = async (table: string) =>
          Number((await inbox.query("SELECT pg_relation_size(to_regclass(?)) / 8192 AS n", table))[0]!.n);
        const day = periodOf(T0);
        assert.ok((await pages(day.name)) >= 5 && (await pages(historyOf(day))) >= 2, "each table several pages");
        const defaults = DEFAULTS as { releaseReadPages: number };
        const step = defaults.releaseReadPages;
        defaults.releaseReadPages = 1;
        try {
          suite.t += 8 * DAY;
          const purged = await inbox.purge();
          // The control: read in one step, or only its first, the same purge counts what one read counts.
          assert.deepEqual([purged.bodies, purged.bytes], [200, bytes]);
        } finally {
          defaults.releaseReadPages = step;
        }
        assert.equal((await inbox.find("step_7"))[0]!.body.length, 0);
      },
    );

    suite.onPostgres(
      "releases a day's done rows as tombstones by one row, writing none of them, and marks them in batches when a writer holds one of its rows",
      async () => {
        const inbox = await open();
        await inbox.enableSearch(); // the day's search documents go with its bodies
        const big = (id: string) => ({ id, pad: `x${id}`.repeat(200) }); // past inlineBodyBytes: kept apart
        const { default: pg } = await import("pg");
        const schema = new URL(suite.target).searchParams.get("schema")!;
        // The day's partition (which table, which file) and where a row of it is and which transaction wrote it.
        const where = async (day: string, id: string) =>
          (
            await inbox.query(
              `SELECT to_regclass(?)::oid::bigint AS oid, pg_relation_filenode(to_regclass(?))::bigint AS file,
                      (SELECT ctid::text || ' ' || xmin::text FROM delivery_rows WHERE id = ?) AS row`,
              day,
              day,
              id,
            )
          )[0] as { oid: number; file: number; row: string };
        const days = async (prefix: string, writer?: string) => {
          const day = historyOf(periodOf(suite.t));
          await handled(inbox, `${prefix}_1`);
          await handled(inbox, `${prefix}_2`, big(`${prefix}_2`));
          await inbox.store({ id: `${prefix}_bad`, body: body({}) });
          await inbox.fail((await inbox.claim(LEASE))!, "nope", { permanent: true });
          await inbox.indexSearch();
          const [indexed] = await inbox.query(
            "SELECT count(*)::integer AS n FROM deliveries_search WHERE id IN (?, ?)",
            `${prefix}_1`,
            `${prefix}_2`,
          );
          assert.equal(indexed!.n, 2, "(control) the day's done bodies were searchable");
          const before = await where(day, `${prefix}_2`);
          suite.t += 8 * DAY;
          const holder = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
          await holder.connect();
          try {
            if (writer) {
              await holder.query("BEGIN");
              await holder.query(`UPDATE ${schema}.delivery_rows SET conflicts = conflicts + 1 WHERE id = $1`, [
                writer,
              ]);
            }
            const purging = inbox.purge();
            if (writer) {
              // The batches reach the held row and wait for it: then the writer lets go.
              const { pid } = (await holder.query("SELECT pg_backend_pid() AS pid")).rows[0];
              await untilBlocked(inbox, pid, "%UPDATE delivery_rows d SET body%");
              await holder.query("COMMIT");
            }
            const purged = await purging;
            return { before, after: await where(day, `${prefix}_2`), purged };
          } finally {
            await holder.end();
          }
        };
        const { before, after, purged } = await days("sw");
        assert.equal(purged.bodies, 2);
        assert.deepEqual(
          [after.oid, after.file, after.row],
          [before.oid, before.file, before.row],
          "the day's partition is the same table and file, and the row of the body kept apart was not written",
        );
        const [inline] = await inbox.query(
          "SELECT octet_length(body) AS n, purged_at FROM delivery_rows WHERE id = 'sw_1'",
        );
        assert.deepEqual([inline!.n, Number(inline!.purged_at)], [0, suite.t], "a body kept in its row is emptied");
        // Every read sees the day's done rows as tombstones: show, a list, a search, the export and the counts.
        for (const id of ["sw_1", "sw_2"]) {
          const [gone] = await inbox.find(id);
          assert.deepEqual([gone!.status, gone!.body.length, gone!.purgedAt], ["done", 0, suite.t], id);
        }
        const listed = await inbox.list({ status: "done" });
        assert.deepEqual(
          listed.filter((d) => d.id.startsWith("sw_")).map((d) => [d.id, d.purgedAt, d.body.length]),
          [
            ["sw_2", suite.t, 0],
            ["sw_1", suite.t, 0],
          ],
        );
        const exported = (await inbox.page(undefined, 10)).find((d) => d.id === "sw_2");
        assert.deepEqual([exported!.purgedAt, exported!.body.length], [suite.t, 0]);
        assert.deepEqual(
          (await inbox.search({ bodyContains: "xsw_2xsw_2" })).map((d) => d.id),
          [],
          "a released body is not found",
        );
        const documents = await inbox.query("SELECT id FROM deliveries_search WHERE id LIKE 'sw%' ORDER BY id");
        assert.deepEqual(
          documents.map((d) => d.id).filter((id) => id !== "sw_bad"),
          [],
          "and the day's done documents went with them",
        );
        const kept = await inbox.kept();
        assert.deepEqual([kept.bodies.count, kept.tombstones.count], [1, 2], "counted as tombstones");
        assert.deepEqual((await inbox.find("sw_bad"))[0]!.body, body({}), "a failed body of that day was kept");
        assert.equal(await inbox.store({ id: "sw_1", body: body({ id: "sw_1" }) }), "duplicate");
        assert.equal(await inbox.store({ id: "sw_2", body: body({ id: "forged" }) }), "conflict");
        assert.deepEqual(await inbox.replayMatching({ id: "sw_2" }), { replayed: 0, tombstoned: 1 });
        assert.deepEqual(await inbox.replayMatching({ id: "sw_2" }, { to: "elsewhere" }), {
          replayed: 0,
          tombstoned: 1,
        });
        assert.deepEqual(await inbox.dropBodies({ id: "sw_2" }), { bodies: 0, bytes: 0 }, "nothing left to drop");
        assert.equal(await inbox.retry({ id: "sw_bad" }), 1, "a failed row of the day moves out of it");
        assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true, "and back into it, done since the release");
        assert.deepEqual(
          [(await inbox.find("sw_bad"))[0]!.purgedAt, (await inbox.find("sw_bad"))[0]!.body],
          [null, body({})],
        );
        // The control: with a writer in the day, the day is marked in batches, its rows written where they are.
        suite.t = T0 + DAY + 1_000;
        const held = await days("hold", "hold_1");
        // The held row, changed by the writer meanwhile, is passed over by its batch (dropBatch) and marked by
        // the purge's pass over what no released day covers, once the writer let go.
        assert.equal(
          held.purged.bodies,
          3,
          "hold_1 and hold_2, and the first day's failed row, done since its release",
        );
        assert.deepEqual([held.after.oid, held.after.file], [held.before.oid, held.before.file]);
        assert.notEqual(held.after.row, held.before.row, "the row written anew, where the release wrote none");
        assert.equal((await inbox.find("hold_2"))[0]!.purgedAt, suite.t);
        assert.deepEqual(
          [(await inbox.find("sw_bad"))[0]!.purgedAt, (await inbox.find("sw_bad"))[0]!.body.length],
          [suite.t, 0],
        );
        assert.equal((await inbox.find("hold_1"))[0]!.purgedAt, suite.t);
        assert.equal((await inbox.purge()).bodies, 0, "and the next purge finds nothing left");
      },
    );

    // releaseMany fills T0's day with 2,000 done deliveries (restored at once) and one failed, late, and releases
    // the day by one row: a released day whose tombstones a walk must not read.
    const releaseMany = async (setup: Inbox) => {
      await handled(setup, "many_0");
      const [template] = await setup.page(undefined, 1);
      const many = Array.from({ length: 2_000 }, (_, i) => ({
        ...template!,
        id: `many_${i}`,
        receivedAt: T0 - i * 1_000,
      }));
      assert.equal(await setup.restore(many), 1_999);
      await setup.store({ id: "late", body: body({ id: "late" }) });
      await setup.fail((await setup.claim(LEASE))!, "nope", { permanent: true });
      suite.t += 8 * DAY;
      await setup.purge();
    };
    // dayReads is what the server counts of T0's history partition: rows read from its heap (by a scan, or fetched
    // through an index), and entries read of its index of done rows with a body (delivery_rows_kept's). A backend
    // sends its counts a second after its work at the latest, or as it exits: a test closes its setup's inbox
    // first, and measures one of one connection, whose counts pg_stat_force_next_flush() has sent before it answers.
    const dayReads = async (inbox: Inbox): Promise<{ heap: number; kept: number }> => {
      await inbox.query("SELECT pg_stat_force_next_flush()");
      const { default: pg } = await import("pg");
      const client = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
      await client.connect();
      try {
        const { rows } = await client.query(
          `SELECT (t.seq_tup_read + t.idx_tup_fetch)::integer AS heap,
                  (SELECT sum(i.idx_tup_read)::integer FROM pg_stat_user_indexes i JOIN pg_index x ON x.indexrelid = i.indexrelid
                    WHERE i.relid = t.relid AND pg_get_expr(x.indpred, x.indrelid) LIKE '%status = ''done''%purged_at IS NULL%') AS kept
             FROM pg_stat_user_tables t WHERE t.schemaname = $1 AND t.relname = $2`,
          [new URL(suite.target).searchParams.get("schema")!, historyOf(periodOf(T0))],
        );
        return rows[0] as { heap: number; kept: number };
      } finally {
        await client.end();
      }
    };
    // Behind a pooler (test/pgbouncer.test.ts runs this suite so) each transaction's server backend is the
    // pooler's choice, and a backend's counts cannot be had at once: there the answers are checked, not the reads.
    const direct = () => !/[?&]listen=false/.test(suite.target);

    suite.onPostgres(
      "a replay over a released day takes what was done since its release and walks none of its tombstones, and its dry run counts the same",
      async () => {
        const setup = await open();
        // A day of many done deliveries, and one failed, done again after the day's release.
        await releaseMany(setup);
        const [released] = await setup.query("SELECT count(*)::integer AS n FROM released_days");
        assert.equal(released!.n, 1, "the day was released by one row");
        assert.equal(await setup.retry({ id: "late" }), 1);
        assert.equal(await setup.finish((await setup.claim(LEASE))!), true, "done since the release: its body kept");
        // And a day not released, today's, with its done deliveries.
        for (const id of ["new_1", "new_2", "new_3"]) await handled(setup, id);
        await setup.close();
        const inbox = await open({ poolSize: 1 });
        const reads = () => dayReads(inbox);
        // The day is read once in each, whole, to count its tombstones (their number is part of the answer), and
        // its index of done rows with a body only where late, taken, is written (two entries). The control: the
        // code before read the day twice in the dry run, three times in the dry run --to and twice in the replay
        // --to, and the replay walked all 2,000 entries of that index.
        const once = 2 * 2_000;
        const read = async (what: string, run: () => Promise<unknown>) => {
          const before = direct() ? await reads() : undefined;
          const result = await run();
          if (!before) return result;
          const after = await reads();
          const [heap, kept] = [after.heap - before.heap, after.kept - before.kept];
          assert.ok(heap < once, `${what} read ${heap} rows of the released day`);
          assert.ok(kept <= 2, `${what} read ${kept} entries of the released day's index of done rows`);
          return result;
        };
        const since = { since: T0 - DAY };
        const both = { replayed: 4, tombstoned: 2_000 };
        assert.deepEqual(await read("the dry run", () => inbox.replayMatching(since, { dryRun: true })), both);
        assert.deepEqual(
          await read("the replay", () => inbox.replayMatching(since)),
          both,
          "the dry run counted what was replayed",
        );
        const statuses = await inbox.query(
          "SELECT id, status FROM deliveries WHERE id IN ('late', 'new_1', 'new_2', 'new_3', 'many_7') ORDER BY id",
        );
        assert.deepEqual(
          statuses.map((r) => [r.id, r.status]),
          [
            ["late", "received"],
            ["many_7", "done"],
            ["new_1", "received"],
            ["new_2", "received"],
            ["new_3", "received"],
          ],
        );
        // replay --to picks what keeps its body, done or not: of the released day, late, received again.
        const to = { to: "elsewhere" };
        assert.deepEqual(
          await read("the dry run --to", () => inbox.replayMatching(since, { ...to, dryRun: true })),
          both,
        );
        assert.deepEqual(
          await read("the replay --to", () => inbox.replayMatching(since, to)),
          both,
          "the dry run --to counted what was sent",
        );
        const [sent] = await inbox.query(
          "SELECT count(*)::integer AS n FROM deliveries WHERE destination = 'elsewhere'",
        );
        assert.equal(sent!.n, 4);
      },
    );

    suite.onPostgres(
      "a purge by filter over a released day drops what still has a body there and walks none of its tombstones",
      async () => {
        const setup = await open();
        await releaseMany(setup);
        // Today's: done and failed, each with its body.
        await handled(setup, "new_1");
        await setup.store({ id: "new_2", body: body({ id: "new_2" }) });
        await setup.fail((await setup.claim(LEASE))!, "nope", { permanent: true });
        await setup.close();
        const inbox = await open({ poolSize: 1 });
        const bytes = ["late", "new_1", "new_2"].reduce((n, id) => n + body({ id }).length, 0);
        const since = { since: T0 - DAY };
        for (const dryRun of [true, false]) {
          const before = direct() ? (await dayReads(inbox)).heap : 0;
          assert.deepEqual(await inbox.dropBodies(since, { dryRun }), { bodies: 3, bytes });
          // The control: the walk before read each of the day's 2,000 tombstones, twice in the dry run.
          if (direct())
            assert.ok(
              (await dayReads(inbox)).heap - before < 100,
              `${dryRun ? "the dry run" : "the purge"} read the day's tombstones`,
            );
        }
        assert.equal((await inbox.find("late"))[0]!.body.length, 0, "the released day's failed body went");
        assert.equal((await inbox.find("new_2"))[0]!.body.length, 0);
      },
    );

    suite.onPostgres(
      "a read of several statements in one snapshot sees a day whole while a purge releases it: the purge waits for it, and gives way",
      async () => {
        const inbox = await open();
        const big = (id: string) => ({ id, pad: "x".repeat(1_000) }); // past inlineBodyBytes: kept apart
        const { default: pg } = await import("pg");
        const pool = new Pool(parseTarget(suite.target), {
          size: 1,
          connectTimeoutMs: DEFAULTS.connectTimeoutMs,
          applicationName: "snapshot-days-test",
          types: pg.types,
        });
        const defaults = DEFAULTS as { periodLockTries: number };
        const tries = defaults.periodLockTries;
        defaults.periodLockTries = 2; // each give-way of the purge's, to the read, in 0.4 s rather than 2
        // As find() reads: the ID's key first, then its rows, in one snapshot; a purge of its day between the two.
        const read = (id: string, held: boolean) =>
          pool.snapshot(async (client) => {
            if (held) await client.query(DAYS_HELD);
            await client.query("SELECT received_at FROM delivery_keys WHERE id = $1", [id]);
            const purged = await inbox.purge();
            const { rows } = await client.query(
              "SELECT status, purged_at, octet_length(body) AS bytes FROM deliveries WHERE id = $1",
              [id],
            );
            return { purged, rows };
          });
        try {
          await handled(inbox, "snap_held", big("snap_held"));
          await handled(inbox, "snap_open", big("snap_open"));
          suite.t += 8 * DAY;
          const held = await read("snap_held", true);
          assert.deepEqual(
            held.rows,
            [{ status: "done", purged_at: null, bytes: body(big("snap_held")).length }],
            "the delivery is whole, as it was when the snapshot was taken",
          );
          assert.equal(held.purged.bodies, 2, "both made tombstones, their bodies' day left for the next purge");
          // The control: a snapshot with no such lock, and a purge that drops the day's bodies while it is open.
          suite.t += DAY;
          // Its day made first, by an open, as a daily purge would have made it: the purge above could not, its
          // CREATE … PARTITION OF giving way to the read's lock too.
          await open();
          await handled(inbox, "snap_late", big("snap_late"));
          suite.t += 8 * DAY;
          const open_ = await read("snap_late", false);
          assert.equal(open_.purged.bodies, 1);
          assert.deepEqual(
            open_.rows,
            [{ status: "done", purged_at: null, bytes: 0 }],
            "to a snapshot from before the release, a delivery with a body is read with none",
          );
        } finally {
          defaults.periodLockTries = tries;
          await pool.end();
        }
      },
    );

    suite.onPostgres("drops a day a crash left detached between its release and its DROP", async () => {
      const inbox = await open();
      await handled(inbox, "left_1");
      const day = periodOf(suite.t).name;
      const exists = async () =>
        (await inbox.query("SELECT to_regclass(?) IS NOT NULL AS made", day))[0]!.made as boolean;
      // A release's transaction committed (the day detached, its kept bodies moved), and then the process died.
      await inbox.query(`ALTER TABLE delivery_bodies DETACH PARTITION ${day}`);
      assert.equal(await exists(), true, "(control) detached, the day's table is still there");
      await inbox.purge(); // nothing of that day is past the cutoff: only the leftover goes
      assert.equal(await exists(), false);
      assert.equal((await inbox.find("left_1"))[0]!.purgedAt, null, "and no row was touched");
    });

    suite.onPostgres("drops a day's old history that a crash left behind its copy's swap", async () => {
      const inbox = await open();
      await handled(inbox, "left_1");
      const was = `${historyOf(periodOf(suite.t))}_was`;
      const exists = async () =>
        (await inbox.query("SELECT to_regclass(?) IS NOT NULL AS made", was))[0]!.made as boolean;
      // A swap's transaction committed (the copy attached, the old one detached and renamed), then the process died.
      await inbox.query(`CREATE TABLE ${was} (LIKE ${historyOf(periodOf(suite.t))})`);
      assert.equal(await exists(), true, "(control) the old day's table is there");
      await inbox.purge(); // nothing of that day is past the cutoff: only the leftover goes
      assert.equal(await exists(), false);
      assert.equal((await inbox.find("left_1"))[0]!.purgedAt, null, "and no row was touched");
    });

    suite.onPostgres(
      "a purge that meets a row a writer holds gives way and tries again, rather than deadlocking with it",
      async () => {
        const inbox = await open();
        const { default: pg } = await import("pg");
        const schema = new URL(suite.target).searchParams.get("schema")!;
        // Two done deliveries of a day past the cutoff, the second received first, so that a purge's batch
        // takes it and then waits for the first, which a writer holds; the writer then wants the second.
        const race = async (held: string, wanted: string) => {
          await handled(inbox, wanted);
          suite.t += 1_000;
          await handled(inbox, held);
          suite.t += 8 * DAY;
          // The new time's days are made first, by an open, as the daily purge before it would have made them:
          // made under the writer's open transaction, each waits periodLockMs for the parent's lock (5 s in the
          // control), which is not what this test is about.
          await open();
          const writer = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
          await writer.connect();
          const conflict = (id: string) =>
            writer.query(`UPDATE ${schema}.delivery_rows SET conflicts = conflicts + 1 WHERE id = $1`, [id]).then(
              () => "wrote",
              (error: { code?: string }) => error.code,
            );
          try {
            const writerPid = (await writer.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
            await writer.query("BEGIN");
            await conflict(held);
            const purging = inbox.purge().catch((error: { code?: string }) => error.code ?? String(error));
            // The purge's own batch, waiting on this writer.
            await untilBlocked(inbox, writerPid, "%UPDATE delivery_rows d SET body%");
            const wrote = await conflict(wanted);
            await writer.query(wrote === "wrote" ? "COMMIT" : "ROLLBACK");
            return { wrote, purged: await purging };
          } finally {
            await writer.end();
          }
        };
        const given = await race("hold_a", "hold_b");
        assert.equal(given.wrote, "wrote");
        assert.equal((given.purged as { bodies: number }).bodies, 2, "both, a once the writer let go of it");
        const [a] = await inbox.find("hold_a");
        assert.deepEqual([a!.purgedAt, a!.conflicts], [suite.t, 1]);
        // (control) a purge that waits as long as PostgreSQL's deadlock_timeout (1 s) is part of a deadlock,
        // and PostgreSQL ends one side of it: here the purge, which waited first and so looks first.
        const defaults = DEFAULTS as { periodLockMs: number };
        const bound = defaults.periodLockMs;
        defaults.periodLockMs = 5_000;
        try {
          const raced = await race("hold_c", "hold_d");
          assert.ok(
            raced.wrote === "40P01" || /deadlock detected/.test(String(raced.purged)),
            `one side ended: ${JSON.stringify(raced)}`,
          );
        } finally {
          defaults.periodLockMs = bound;
        }
      },
    );

    suite.onPostgres(
      "a restore makes the days of the bodies it brings, so that a copy's old days are released whole too",
      async () => {
        const from = await open();
        const big = (id: string) => ({ id, pad: "x".repeat(1_000) }); // past inlineBodyBytes: kept apart
        suite.t -= 20 * DAY;
        await handled(from, "old_1", big("old_1"));
        suite.t += 20 * DAY;
        const rows = await from.page(undefined, 10);
        const to = await suite.another();
        const day = periodOf(T0 - 20 * DAY);
        const inDay = async () =>
          (await to.query("SELECT to_regclass(?) IS NOT NULL AS made", day.name))[0]!.made
            ? Number((await to.query(`SELECT count(*) AS n FROM ${day.name}`))[0]!.n)
            : -1;
        // The control: opening an inbox makes today's days, not that one.
        assert.equal(await inDay(), -1, "no partition of that day before the restore");
        assert.equal(await to.restore(rows), 1);
        assert.equal(await inDay(), 1, "the body went to its day's partition, not the default one");
        assert.deepEqual((await to.find("old_1"))[0]!.body, body(big("old_1")));
        const purged = await to.purge();
        assert.deepEqual([purged.bodies, await inDay()], [1, -1], "and the day was released by dropping it");
        assert.equal(await to.store({ id: "old_1", body: body(big("old_1")) }), "duplicate");
      },
    );

    suite.onPostgres(
      "a restore into a day that a purge released makes that day again, in the same process",
      async () => {
        const from = await open();
        const big = (id: string) => ({ id, pad: "x".repeat(1_000) }); // past inlineBodyBytes: kept apart
        suite.t -= 20 * DAY;
        await handled(from, "old_1", big("old_1"));
        await handled(from, "old_2", big("old_2"));
        suite.t += 20 * DAY;
        const [first, second] = await from.page(undefined, 10);
        const to = await suite.another();
        const day = periodOf(T0 - 20 * DAY);
        // Which table holds a body: its day's partition, the default one, or none.
        const held = async (id: string) =>
          (await to.query("SELECT tableoid::regclass::text AS part FROM delivery_bodies WHERE id = ?", id))[0]?.part;
        assert.equal(await to.restore([first!]), 1);
        // The control: the first restore's body is in its day's partition, which this test tells apart.
        assert.equal(await held("old_1"), day.name);
        assert.equal((await to.purge()).bodies, 1);
        assert.equal(await held("old_1"), undefined, "the day was released");
        assert.equal(await to.restore([second!]), 1);
        assert.equal(await held("old_2"), day.name, "made again, not left to the default partition");
        // Done before the day's release, it is one of the day's tombstones at once (docs/table.md#hot-and-cold).
        const [restored] = await to.find("old_2");
        assert.deepEqual([restored!.purgedAt, restored!.body.length], [suite.t, 0]);
        const purged = await to.purge();
        assert.deepEqual([purged.bodies, purged.bytes], [0, body(big("old_2")).length]);
        const [gone] = await to.query("SELECT to_regclass(?) IS NOT NULL AS made", day.name);
        assert.equal(gone!.made, false, "and released whole again");
      },
    );

    suite.onPostgres(
      "a replay that waits behind a day's release reads the release once it goes on; one that went first keeps its body",
      async () => {
        const inbox = await open();
        const big = (id: string) => ({ id, pad: "x".repeat(1_000) }); // past inlineBodyBytes: kept apart
        const { default: pg } = await import("pg");
        const schema = new URL(suite.target).searchParams.get("schema")!;
        const day = periodOf(suite.t);
        await handled(inbox, "race_1", big("race_1"));
        suite.t += 8 * DAY;
        // A release's first transaction, held open: the day's lock and its row in released_days (releaseDay).
        const releasing = async (locked: boolean) => {
          const holder = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
          await holder.connect();
          await holder.query("BEGIN");
          if (locked) await holder.query(`LOCK TABLE ${schema}.${historyOf(day)} IN EXCLUSIVE MODE`);
          await holder.query(`INSERT INTO ${schema}.released_days (day, released_at) VALUES ($1, $2)`, [
            day.from,
            suite.t,
          ]);
          const pid = (await holder.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
          return { holder, pid };
        };
        const { holder, pid } = await releasing(true);
        try {
          const replaying = inbox.replayMatching({ id: "race_1" });
          await untilBlocked(inbox, pid);
          await holder.query("COMMIT");
          assert.deepEqual(await replaying, { replayed: 0, tombstoned: 1 }, "the replay waited, and read the release");
        } finally {
          await holder.end();
        }
        // The control: with no lock on the day, a replay goes before the release commits, and the row it moved
        // out of the day keeps its body through the release of the day's bodies.
        await inbox.query("DELETE FROM released_days");
        const first = await releasing(false);
        try {
          assert.deepEqual(await inbox.replayMatching({ id: "race_1" }), { replayed: 1, tombstoned: 0 });
          await first.holder.query("COMMIT");
        } finally {
          await first.holder.end();
        }
        await inbox.purge();
        const [again] = await inbox.find("race_1");
        assert.deepEqual([again!.status, again!.purgedAt, again!.body], ["received", null, body(big("race_1"))]);
      },
    );

    suite.onPostgres(
      "leaves a day whole when its release cannot have its lock in time, its tombstones' bodies none meanwhile, and drops it at the next purge",
      async () => {
        const inbox = await open();
        await handled(inbox, "day_1");
        // Past inlineBodyBytes: kept apart. From reconcile, so that a copy is judged by its kept body's JSON.
        const big = { id: "day_big", pad: "x".repeat(1_000) };
        await inbox.store({ id: "day_big", body: body(big), origin: "reconcile" });
        assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
        const pretty = Buffer.from(JSON.stringify(big, null, 2));
        const { default: pg } = await import("pg");
        const holder = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
        await holder.connect();
        const schema = new URL(suite.target).searchParams.get("schema")!;
        const made = async () =>
          (await inbox.query("SELECT to_regclass(?) IS NOT NULL AS made", periodOf(T0).name))[0]!.made as boolean;
        const searched = async () => [
          (await inbox.search({ bodyContains: "xxxx" })).map((d) => d.id),
          await inbox.count({ bodyContains: "xxxx" }),
        ];
        assert.deepEqual(await searched(), [["day_big"], 1], "the control: a body search finds it while it is kept");
        assert.equal(await inbox.store({ id: "day_big", body: pretty }), "duplicate", "as does a copy's JSON");
        try {
          // A transaction in flight on the bodies, as a store's would be, that does not end during the purge.
          await holder.query("BEGIN");
          await holder.query(`LOCK TABLE ${schema}.delivery_bodies IN ROW EXCLUSIVE MODE`);
          suite.t += 8 * DAY;
          assert.equal((await inbox.purge()).bodies, 2, "the day's rows are tombstones all the same");
          assert.equal(await made(), true, "its partition waits for the next purge");
          const [marked] = await inbox.find("day_big");
          assert.deepEqual(
            [marked!.purgedAt, marked!.body.length],
            [suite.t, 0],
            "a tombstone, whose body waits in the day's partition, reads as none",
          );
          assert.deepEqual(await searched(), [[], 0], "and a body search never matches it");
          assert.equal(
            await inbox.store({ id: "day_big", body: pretty }),
            "conflict",
            "nor a copy's JSON, its bytes other",
          );
        } finally {
          await holder.query("ROLLBACK").finally(() => holder.end());
        }
        assert.equal(await inbox.store({ id: "day_1", body: body({ id: "day_1" }) }), "duplicate");
        assert.equal((await inbox.purge()).bodies, 0);
        assert.equal(await made(), false, "released once nothing holds it");
      },
    );

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

  describe("a hot queue and a history (docs/table.md#hot-and-cold)", () => {
    const DAY = 86_400_000;
    const handled = async (inbox: Inbox, id: string) => {
      await inbox.store({ id, body: body({ id }) });
      assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
    };
    // Which partition of delivery_rows holds a delivery's row (PostgreSQL).
    const partition = async (inbox: Inbox, id: string) =>
      (await inbox.query("SELECT tableoid::regclass::text AS part FROM delivery_rows WHERE id = ?", id))[0]?.part;

    suite.onPostgres(
      "a done row is in its day's history partition; a replay, a retry and a bulk retry bring it back to the hot one",
      async () => {
        const inbox = await open();
        const day = historyOf(periodOf(suite.t));
        await inbox.store({ id: "h_1", body: body({ n: 1 }) });
        assert.equal(await partition(inbox, "h_1"), "delivery_rows_hot", "stored: work left");
        assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
        assert.equal(await partition(inbox, "h_1"), day, "done: its day's history");
        assert.equal((await inbox.replayMatching({ id: "h_1" })).replayed, 1);
        assert.equal(await partition(inbox, "h_1"), "delivery_rows_hot", "replayed: work again");
        const lease = (await inbox.claim(LEASE))!;
        assert.equal(lease.id, "h_1", "and claimed from there");
        assert.equal((await inbox.fail(lease, "no", { permanent: true }))?.status, "failed");
        assert.equal(await partition(inbox, "h_1"), day, "failed: its day's history");
        assert.equal(await inbox.retry({ id: "h_1" }), 1);
        assert.equal(await partition(inbox, "h_1"), "delivery_rows_hot", "retried");
        await inbox.fail((await inbox.claim(LEASE))!, "no", { permanent: true });
        assert.equal(await inbox.retryMatching({ id: "h_1" }), 1);
        assert.equal(await partition(inbox, "h_1"), "delivery_rows_hot", "retried in bulk");
        // Its body and its one key went nowhere.
        assert.deepEqual((await inbox.claim(LEASE))!.body, body({ n: 1 }));
        assert.deepEqual(await inbox.query("SELECT id, received_at FROM delivery_keys"), [
          { id: "h_1", received_at: T0 },
        ]);
      },
    );

    suite.onPostgres("a day's history partition is made with its bodies' day, ahead", async () => {
      const inbox = await open();
      const made = async (at: number) =>
        (await inbox.query("SELECT to_regclass(?) IS NOT NULL AS made", historyOf(periodOf(at))))[0]!.made;
      assert.deepEqual(
        [await made(suite.t), await made(suite.t + DAY), await made(suite.t + 30 * DAY)],
        [true, true, false],
      );
    });

    suite.onPostgres(
      "a day already made is not made again: making the days waits for no store in flight on the parents",
      async () => {
        const inbox = await open(); // its days made, DEFAULTS.periodsAhead of them
        const { default: pg } = await import("pg");
        const schema = new URL(suite.target).searchParams.get("schema")!;
        // A store's transaction in flight on both parents, whose lock a CREATE … PARTITION OF waits behind.
        const holder = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
        await holder.connect();
        const pool = new Pool(parseTarget(suite.target), {
          size: 1,
          connectTimeoutMs: DEFAULTS.connectTimeoutMs,
          applicationName: "make-periods-test",
          types: pg.types,
        });
        try {
          const holderPid = (await holder.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
          await holder.query("BEGIN");
          await holder.query(`LOCK TABLE ${schema}.delivery_bodies, ${schema}.delivery_history IN ROW EXCLUSIVE MODE`);
          // Which comes first: the days made, or a session seen waiting for the holder's lock. The bound on
          // that lock outlasts the test, so a call that waited for it cannot have come back while it was held.
          const make = async (at: number, ahead: number) => {
            let settled = false;
            const made = makePeriods(pool, at, ahead, 600_000).then(() => "made" as const);
            const waited = (async () => {
              while (!settled) {
                if (await blocked(inbox, holderPid)) return "waited for the lock" as const;
                await new Promise((resolve) => setTimeout(resolve, 5));
              }
              return "made" as const;
            })();
            const first = await Promise.race([made, waited]);
            settled = true;
            await waited; // its last look done before the test ends
            return { first, made };
          };
          const again = await make(suite.t, DEFAULTS.periodsAhead);
          assert.equal(again.first, "made", "the days the open made are left alone, the lock never asked for");
          // (control) a day not made yet needs the lock, and waits for the store in flight.
          const later = periodOf(suite.t + 30 * DAY);
          const fresh = await make(later.from, 0);
          assert.equal(fresh.first, "waited for the lock");
          await holder.query("ROLLBACK");
          await fresh.made;
          const [day] = await inbox.query("SELECT to_regclass(?) IS NOT NULL AS made", historyOf(later));
          assert.equal(day!.made, true, "and makes the day once the store is done");
        } finally {
          await holder.query("ROLLBACK").finally(() => holder.end());
          await pool.end();
        }
      },
    );

    it("a resend answers duplicate after its day's bodies were released, and is stored anew once forgotten", async () => {
      const inbox = await open();
      await inbox.store({ id: "r_1", body: body({ n: 1 }) });
      assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
      suite.t += 8 * DAY;
      assert.equal((await inbox.purge()).bodies, 1);
      assert.equal(await inbox.store({ id: "r_1", body: body({ n: 1 }) }), "duplicate");
      assert.equal(await inbox.store({ id: "r_1", body: body({ n: 2 }) }), "conflict");
      suite.t += 30 * DAY;
      assert.equal((await inbox.purge()).forgotten, 1);
      assert.equal((await inbox.find("r_1")).length, 0);
      // Today's answer, kept: a forgotten ID is a new delivery.
      assert.equal(await inbox.store({ id: "r_1", body: body({ n: 3 }) }), "stored");
      assert.equal(await inbox.store({ id: "r_1", body: body({ n: 3 }) }), "duplicate");
      const lease = (await inbox.claim(LEASE))!;
      assert.deepEqual([lease.id, lease.body], ["r_1", body({ n: 3 })]);
      if (backend.name === "postgres") {
        assert.deepEqual(await inbox.query("SELECT id, received_at FROM delivery_keys"), [
          { id: "r_1", received_at: suite.t },
        ]);
      }
    });

    // Whether a day's history partition is there (attached or not), and the keys of some IDs.
    const made = async (inbox: Inbox, day: string) =>
      (await inbox.query("SELECT to_regclass(?) IS NOT NULL AS made", day))[0]!.made as boolean;
    const keys = async (inbox: Inbox, prefix: string) =>
      (await inbox.query("SELECT id FROM delivery_keys WHERE id LIKE ? ORDER BY id", `${prefix}%`)).map((r) => r.id);

    suite.onPostgres(
      "forget drops a day of history whole: its partition and its keys go, the count is the rows', a resend is stored anew",
      async () => {
        const inbox = await open();
        const day = historyOf(periodOf(suite.t));
        await handled(inbox, "w_1");
        await handled(inbox, "w_2");
        suite.t += 8 * DAY;
        assert.equal((await inbox.purge()).bodies, 2);
        // The control: tombstones, not yet past the forget cutoff, keep their day and their keys.
        assert.equal(await made(inbox, day), true);
        assert.deepEqual(await keys(inbox, "w_"), ["w_1", "w_2"]);
        suite.t += 30 * DAY;
        assert.equal((await inbox.purge()).forgotten, 2);
        assert.equal(await made(inbox, day), false, "the day's partition was dropped");
        assert.deepEqual(await keys(inbox, "w_"), [], "and its keys deleted");
        assert.equal((await inbox.find("w_1")).length, 0);
        assert.equal(await inbox.store({ id: "w_1", body: body({ id: "w_1" }) }), "stored");
        assert.equal(await inbox.store({ id: "w_1", body: body({ id: "w_1" }) }), "duplicate");
        assert.equal((await inbox.claim(LEASE))!.id, "w_1");
        assert.deepEqual(await inbox.purge(), { bodies: 0, bytes: 0, forgotten: 0, vacuumedBytes: 0 }, "nothing twice");
      },
    );

    suite.onPostgres(
      "a day holding a failed row keeps it and stays, its tombstones forgotten row by row; emptied, it is dropped",
      async () => {
        const inbox = await open();
        const day = historyOf(periodOf(suite.t));
        await handled(inbox, "k_1");
        await inbox.store({ id: "k_bad", body: body({ id: "k_bad" }) });
        await inbox.fail((await inbox.claim(LEASE))!, "nope", { permanent: true });
        suite.t += 8 * DAY;
        await inbox.purge();
        suite.t += 30 * DAY;
        assert.equal((await inbox.purge()).forgotten, 1, "the tombstone, row by row");
        assert.equal(await made(inbox, day), true, "the day stays");
        assert.deepEqual(await keys(inbox, "k_"), ["k_bad"]);
        const [bad] = await inbox.find("k_bad");
        assert.deepEqual([bad!.status, bad!.body], ["failed", body({ id: "k_bad" })]);
        // Retried, the failed row moves to the hot partition and leaves its day empty: the next purge drops
        // the day, and the row, still of that day, keeps its key.
        assert.equal(await inbox.retry({ id: "k_bad" }), 1);
        assert.equal((await inbox.purge()).forgotten, 0);
        assert.equal(await made(inbox, day), false, "emptied, the day was dropped");
        assert.deepEqual(await keys(inbox, "k_"), ["k_bad"]);
        assert.equal(await inbox.store({ id: "k_bad", body: body({ id: "k_bad" }) }), "duplicate");
        assert.deepEqual((await inbox.claim(LEASE))!.body, body({ id: "k_bad" }));
      },
    );

    suite.onPostgres("a day dropped whole takes its deliveries' search documents with it", async () => {
      const inbox = await open();
      await inbox.enableSearch();
      await handled(inbox, "s_old");
      suite.t += 8 * DAY;
      await inbox.purge();
      // A tombstone's document went with its body; one the indexer wrote meanwhile (it read the body just
      // before) would be taken out by the row's delete trigger, which a DROP does not fire.
      await inbox.query(
        `INSERT INTO deliveries_search (source, id, doc) VALUES ('default', 's_old', '{"id": "s_old"}')`,
      );
      suite.t += 30 * DAY;
      await handled(inbox, "s_young");
      await inbox.indexSearch();
      const docs = async () =>
        (await inbox.query("SELECT id FROM deliveries_search WHERE id LIKE 's\\_%' ORDER BY id")).map((r) => r.id);
      assert.deepEqual(await docs(), ["s_old", "s_young"], "(control) both are in the index");
      assert.equal((await inbox.purge()).forgotten, 1);
      assert.deepEqual(await docs(), ["s_young"]);
      assert.equal(await made(inbox, historyOf(periodOf(T0))), false);
    });

    suite.onPostgres("drops a day of history a crash left detached between its release and its DROP", async () => {
      const inbox = await open();
      const day = historyOf(periodOf(suite.t));
      await handled(inbox, "c_1");
      suite.t += 40 * DAY;
      // The day's keys were deleted and its DETACH committed, and then the process died.
      await inbox.query("DELETE FROM delivery_keys WHERE id = 'c_1'");
      await inbox.query(`ALTER TABLE delivery_history DETACH PARTITION ${day}`);
      assert.equal(await made(inbox, day), true, "(control) detached, the day's table is still there");
      // Cutoffs that reach no day: only the leftover goes.
      assert.deepEqual(await inbox.purge({ bodiesAfterMs: 50 * DAY, forgetAfterMs: 60 * DAY }), {
        bodies: 0,
        bytes: 0,
        forgotten: 0,
        vacuumedBytes: 0,
      });
      assert.equal(await made(inbox, day), false);
    });

    suite.onPostgres("a claim that fails with 40001 is run again, and hands its lease over", async () => {
      const inbox = await open();
      const defaults = DEFAULTS as { movedTries: number };
      const tries = defaults.movedTries;
      // The first two claims' updates fail as a takeover's would that met a row a late done mark had just
      // moved (that race is a matter of microseconds; its error is the same): the control's one try, and the
      // first try of the claim after it, whose second try succeeds.
      await inbox.query("CREATE SEQUENCE moved_count");
      await inbox.query(`CREATE FUNCTION moved() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.status = 'processing' AND nextval('moved_count') <= 2 THEN
            RAISE EXCEPTION 'tuple to be locked was already moved to another partition (injected by the test)'
              USING ERRCODE = 'serialization_failure';
          END IF;
          RETURN NEW;
        END $$`);
      await inbox.query("CREATE TRIGGER moved BEFORE UPDATE ON delivery_rows FOR EACH ROW EXECUTE FUNCTION moved()");
      try {
        await inbox.store({ id: "c_1", body: body({}) });
        // (control) run once only, the claim fails with the 40001.
        defaults.movedTries = 1;
        const failed = await inbox.claimBatch(10, LEASE).then(
          () => "claimed",
          (error: { code?: string; cause?: { code?: string } }) => error.cause?.code ?? error.code,
        );
        assert.equal(failed, "40001");
        defaults.movedTries = tries;
        const leases = await inbox.claimBatch(10, LEASE);
        assert.deepEqual(
          leases.map((l) => l.id),
          ["c_1"],
        );
        assert.equal(await inbox.finish(leases[0]!), true);
        const [{ n }] = (await inbox.query("SELECT last_value::integer AS n FROM moved_count")) as [{ n: number }];
        assert.equal(n, 3, "the claim after the control failed once, then went through");
      } finally {
        defaults.movedTries = tries;
      }
    });

    suite.onPostgres(
      "a bulk retry that meets a row a commit just moved to another partition (40001) runs its batch again",
      async () => {
        const inbox = await open({ maxAttempts: 1 });
        const { default: pg } = await import("pg");
        const schema = new URL(suite.target).searchParams.get("schema")!;
        const mover = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
        await mover.connect();
        const defaults = DEFAULTS as { movedTries: number };
        const tries = defaults.movedTries;
        try {
          // race: a retry by hand holds m_1 moved to the hot partition, uncommitted, while a bulk retry's batch
          // waits for its lock; the commit then leaves the batch a row that is no longer where it was.
          const race = async () => {
            await inbox.store({ id: "m_1", body: body({}) });
            await inbox.fail((await inbox.claim(LEASE))!, "no", { permanent: true });
            await mover.query("BEGIN");
            await mover.query(`UPDATE ${schema}.delivery_rows SET status = 'received' WHERE id = 'm_1'`);
            const bulk = inbox.retryMatching({ id: "m_1" }).then(
              (n) => n,
              (error: { code?: string; cause?: { code?: string } }) => error.cause?.code ?? error.code ?? String(error),
            );
            for (let waited = 0; ; waited++) {
              // By the batch's opening words: pg_stat_activity keeps a statement's first 1 kB alone, and an ID's
              // filter (its sources and days from delivery_keys) puts FOR UPDATE past it.
              const [{ n }] = (await inbox.query(
                "SELECT count(*)::integer AS n FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'SELECT received_at, source, id, route FROM delivery_rows %'",
              )) as [{ n: number }];
              if (n > 0) break;
              assert.ok(waited < 500, "the bulk retry came to wait for the row");
              await new Promise((resolve) => setTimeout(resolve, 10));
            }
            await mover.query("COMMIT");
            const result = await bulk;
            await inbox.query("DELETE FROM deliveries WHERE id = 'm_1'");
            return result;
          };
          // (control) run once only, the batch fails with PostgreSQL's 40001.
          defaults.movedTries = 1;
          assert.equal(await race(), "40001");
          defaults.movedTries = tries;
          assert.equal(await race(), 0, "run again, it finds m_1 retried already, and nothing to do");
        } finally {
          defaults.movedTries = tries;
          await mover.query("ROLLBACK").catch(() => {});
          await mover.end();
        }
      },
    );
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

  it("carries the attempt log both ways, a page at a time, each try as it was; run again, it adds none", async () => {
    const from = join(dir.dir, "tried.db");
    const back = join(dir.dir, "tried-back.db");
    let t = T0;
    const sqlite = new SqliteInbox(from, { now: () => t, random: () => 0, retryDelayMs: 1, maxAttempts: 10 });
    const ids = ["e1", "e2", "e3", "e4", "e5"];
    for (const id of ids) await sqlite.store({ id, body: body({ id }), destinations: ["app", "crm"] });
    await sqlite.store({ id: "untried", body: body({}) });
    // Three tries of each route, the last to crm a success: 30 in all, each with its answer.
    for (let n = 1; n <= 3; n++) {
      for (const destination of ["app", "crm"])
        for (const lease of await sqlite.claimBatch(10, LEASE, { destination })) {
          const attempt = {
            startedAt: t,
            ms: n,
            status: 500 + n,
            headers: { "x-try": `${n}` },
            body: `${lease.id} ${n}`,
          };
          if (n === 3 && destination === "crm") await sqlite.finish(lease, [], { ...attempt, status: 200 });
          else await sqlite.fail(lease, `HTTP ${500 + n} from ${destination}`, { attempt });
        }
      t += 10;
    }
    // tries reads every route's log of an inbox.
    const tries = async (inbox: Inbox) =>
      Promise.all([...ids, "untried"].map((id) => inbox.attempts({ source: "default", id, receivedAt: T0 })));
    const original = await tries(sqlite);
    await sqlite.close();
    assert.equal(original.flat().length, 30);
    assert.deepEqual(original.at(-1), []);

    const there = await runScript("inbox.ts", ["copy", "--from", from, "--to", pgTarget.url, "--batch", "4"]);
    assert.equal(there.code, 0, there.stderr);
    assert.match(there.stdout, /^Copied 30 of 30 tries of the attempt log\.$/m);
    const again = await runScript("inbox.ts", ["copy", "--from", from, "--to", pgTarget.url, "--batch", "4"]);
    assert.equal(again.code, 0, again.stderr);
    assert.match(
      again.stdout,
      /^Nothing to copy: all 30 tries of the attempt log are already there, older than the target keeps, or of a delivery the target had of its own\.$/m,
    );
    const pg = await connect(pgTarget.url);
    try {
      assert.deepEqual(await tries(pg), original);
    } finally {
      await pg.close();
    }
    const home = await runScript("inbox.ts", ["copy", "--from", pgTarget.url, "--to", back, "--batch", "7"]);
    assert.equal(home.code, 0, home.stderr);
    assert.match(home.stdout, /^Copied 30 of 30 tries of the attempt log\.$/m);
    const returned = new SqliteInbox(back);
    try {
      assert.deepEqual(await tries(returned), original);
    } finally {
      await returned.close();
    }
  });

  it("carries the configuration with its history, the API keys, the secrets still sealed and the audit log, both ways: the copy serves and knows them", async () => {
    const from = join(dir.dir, "configured.db");
    const file = join(dir.dir, "sources.json");
    const env = { STRIPE_SECRET: "whsec_c2lnbmluZyBzZWNyZXQgZm9yIGNvcHk=" };
    const cli = (...args: string[]) => runScript("inbox.ts", args, env);
    assert.equal((await cli("init", "--db", from)).code, 0);
    writeFileSync(file, JSON.stringify({ shop: { provider: "plain" } }));
    assert.equal((await cli("config", "apply", file, "--db", from, "--actor", "ann")).code, 0);
    const second = `${JSON.stringify({ shop: { provider: "plain" }, stripe: { provider: "stripe", secret: "env:STRIPE_SECRET" } }, null, 2)}\n`;
    writeFileSync(file, second);
    assert.equal((await cli("config", "apply", file, "--db", from, "--actor", "bo")).code, 0);
    const made = await cli("keys", "create", "--scope", "read", "--name", "grafana", "--db", from, "--json");
    const key = (JSON.parse(made.stdout) as { key: string }).key;
    const sqlite = new SqliteInbox(from);
    await sqlite.addAudit({ at: T0, who: "key:abc", operation: "pauseDestination", target: "app", count: 1 });
    const keyring = new Keyring([randomBytes(32)]);
    await sqlite.setSecret({ name: "app", sealed: keyring.seal("app", "s3cr3t"), setAt: T0, setBy: "cli:ann" });
    const history = await sqlite.configHistory();
    const log = (await sqlite.auditLog({ limit: 10 })).map((e) => [e.who, e.operation]);
    await sqlite.close();
    // Two applies, a key made and the entry above: every way in leaves its entry (issue 46), and copy takes them all.
    assert.equal(log.length, 4);

    // Three a page, so the audit log's four entries are read in two.
    const there = await cli("copy", "--from", from, "--to", pgTarget.url, "--batch", "3");
    assert.equal(there.code, 0, there.stderr);
    assert.match(there.stdout, /^Copied 2 of 2 configuration versions\.$/m);
    assert.match(there.stdout, /^Copied 1 of 1 API keys\.$/m);
    assert.match(there.stdout, /^Copied 1 of 1 secrets\.$/m);
    assert.match(there.stdout, /^Copied 4 of 4 audit entries\.$/m);
    // On the copy: the configuration in force, its history, the key and the audit log.
    const dumped = await cli("config", "dump", "--db", pgTarget.url);
    assert.equal(dumped.stdout, second, "config dump gives the document back byte for byte");
    const listed = await cli("keys", "list", "--db", pgTarget.url);
    assert.match(listed.stdout, /read +created .* grafana/);
    const pg = await connect(pgTarget.url);
    try {
      assert.deepEqual(await pg.configHistory(), history);
      assert.equal((await pg.apiKeyByHash(hashKey(key)))?.name, "grafana");
      assert.deepEqual(
        (await pg.auditLog({ limit: 10 })).map((e) => [e.who, e.operation]),
        log,
      );
      const [secret] = await pg.secrets();
      assert.equal(
        keyring.open("app", secret!.sealed),
        "s3cr3t",
        "the copy holds the sealed value, which the same key opens",
      );
    } finally {
      await pg.close();
    }
    // A receiver started on the copy with no --sources serves the copied sources.
    const receiver = await startReceiver(pgTarget.url, [], env);
    try {
      const r = await fetch(`${receiver.url}/shop`, { method: "POST", headers: { "x-delivery-id": "o1" }, body: "{}" });
      assert.equal(`${r.status} ${await r.text()}`, "200 stored");
    } finally {
      await receiver.stop();
    }
    const again = await cli("copy", "--from", from, "--to", pgTarget.url);
    assert.match(again.stdout, /^Nothing to copy: all 2 configuration versions are already there\.$/m);
    assert.match(again.stdout, /^Nothing to copy: all 1 API keys are already there\.$/m);

    // And back to SQLite, from the copy.
    const back = join(dir.dir, "back.db");
    const home = await cli("copy", "--from", pgTarget.url, "--to", back);
    assert.equal(home.code, 0, home.stderr);
    const returned = new SqliteInbox(back);
    try {
      assert.deepEqual(await returned.configHistory(), history);
      assert.equal((await returned.apiKeys()).length, 1);
      assert.equal((await returned.auditLog({ limit: 10 })).length, 4);
      assert.equal((await returned.secrets()).length, 1);
    } finally {
      await returned.close();
    }

    // (control) A target with a configuration of its own is refused before anything is copied.
    const other = join(dir.dir, "other.db");
    assert.equal((await cli("init", "--db", other)).code, 0);
    writeFileSync(file, JSON.stringify({ elsewhere: { provider: "plain" } }));
    assert.equal((await cli("config", "apply", file, "--db", other)).code, 0);
    const refused = await cli("copy", "--from", from, "--to", other);
    assert.equal(refused.code, 1);
    assert.match(
      refused.stderr,
      /other\.db has a configuration of its own \(its version 1 is not .*'s\); nothing copied/,
    );
    const untouched = new SqliteInbox(other);
    try {
      assert.equal((await untouched.configHistory()).length, 1);
      assert.equal((await untouched.apiKeys()).length, 0);
    } finally {
      await untouched.close();
    }
  });
});
