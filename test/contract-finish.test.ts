// test/contract-finish.test.ts: finish(), fail(), release(), retry() and attempts(), on both backends
// (test/contract-harness.ts): backoff then set aside, the handler's writes committed with the done mark or
// not at all, each try kept in the attempt log with its answer, the oldest let go past the cap.
//   npx node --import tsx --test test/contract-finish.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { Inbox, Tx } from "../lib/store.ts";
import { ensurePayments, recordPayment, run } from "../worker.ts";
import { body, contract, LEASE, T0 } from "./contract-harness.ts";

contract((suite) => {
  const { open, row, onPostgres } = suite;
  describe("fail(), release() and retry()", () => {
    it("backs off, then sets aside after the last attempt; retry queues it again with attempts reset", async () => {
      const inbox = await open({ maxAttempts: 2, retryDelayMs: 1_000, retryJitter: 0 });
      await inbox.store({ id: "evt_1", body: body({}) });
      const first = (await inbox.claim(LEASE))!;
      assert.deepEqual(await inbox.fail(first, "boom"), { status: "received", retryAt: suite.t + 1_000 });
      assert.equal(await inbox.claim(LEASE), undefined, "not due before its backoff");
      suite.t += 1_000;
      const second = (await inbox.claim(LEASE))!;
      assert.deepEqual(await inbox.fail(second, "boom again"), { status: "failed" });
      const [failed] = await inbox.find("evt_1");
      assert.deepEqual([failed!.status, failed!.error, failed!.finishedAt], ["failed", "boom again", suite.t]);
      assert.equal(await inbox.retry({ id: "evt_1" }), 1);
      assert.equal(await inbox.retry({ id: "evt_1" }), 0, "only a failed delivery is retried");
      const again = (await inbox.claim(LEASE))!;
      assert.equal(again.attempts, 1);
    });

    it("fails a permanent error at once, and retry --all-failed takes every failed one", async () => {
      const inbox = await open();
      for (const id of ["a", "b"]) await inbox.store({ id, body: body({}) });
      for (const lease of await inbox.claimBatch(2, LEASE))
        assert.deepEqual(await inbox.fail(lease, "bad", { permanent: true }), { status: "failed" });
      assert.equal((await inbox.status()).counts.failed, 2);
      assert.equal(await inbox.retry({ allFailed: true }), 2);
      assert.equal((await inbox.status()).counts.received, 2);
    });

    it("release hands a lease back due now, without spending an attempt", async () => {
      const inbox = await open();
      await inbox.store({ id: "evt_1", body: body({}) });
      const lease = (await inbox.claim(LEASE))!;
      assert.equal(await inbox.release(lease), true);
      const again = (await inbox.claim(LEASE))!;
      assert.equal(again.attempts, 1);
    });
  });

  describe("finish() with local writes", () => {
    const ledger = (inbox: Inbox) => inbox.query("CREATE TABLE IF NOT EXISTS ledger (k TEXT PRIMARY KEY)");
    const pay = (k: string) => (tx: Tx) => tx.run("INSERT INTO ledger (k) VALUES (?)", k);
    const keys = async (inbox: Inbox) => (await inbox.query("SELECT k FROM ledger ORDER BY k")).map((r) => r.k);

    it("commits the writes with the done mark, and none of them when the lease was lost", async () => {
      const a = await open();
      const b = await open();
      await ledger(a);
      await a.store({ id: "evt_1", body: body({}) });
      const slow = (await a.claim(LEASE))!;
      suite.t += LEASE;
      const fast = (await b.claim(LEASE))!;
      assert.equal(await b.finish(fast, [pay("fast")]), true);
      assert.equal(await a.finish(slow, [pay("slow")]), false);
      assert.deepEqual(await keys(a), ["fast"]);
    });

    it("confines a write that throws to its own delivery; its batch-mates commit", async () => {
      const inbox = await open();
      await ledger(inbox);
      for (const id of ["evt_1", "evt_bad", "evt_3"]) await inbox.store({ id, body: body({}) });
      const [first, bad, last] = await inbox.claimBatch(3, LEASE);
      const results = await Promise.allSettled([
        inbox.finish(first!, [pay("k1")]),
        inbox.finish(bad!, [pay("k2"), pay("k1")]), // the second violates the key: the whole delivery rolls back
        inbox.finish(last!, [pay("k3")]),
      ]);
      assert.deepEqual(
        results.map((r) => r.status),
        ["fulfilled", "rejected", "fulfilled"],
      );
      assert.deepEqual(await keys(inbox), ["k1", "k3"]);
      assert.equal((await row(inbox, "evt_bad"))!.status, "processing", "its done mark rolled back with it");
      assert.equal((await inbox.fail(bad!, "ledger refused"))!.status, "received");
    });

    onPostgres("sends a batch's one-row inserts as one statement, in the transaction of their done marks", async () => {
      const inbox = await open();
      await ledger(inbox);
      // A statement-level trigger counts the INSERT statements that reach the ledger.
      await inbox.query("CREATE TABLE ledger_statements (n integer)");
      await inbox.query(`CREATE FUNCTION ledger_counted() RETURNS trigger LANGUAGE plpgsql AS $$
                           BEGIN INSERT INTO ledger_statements VALUES (1); RETURN NULL; END $$`);
      await inbox.query(
        "CREATE TRIGGER ledger_counted AFTER INSERT ON ledger FOR EACH STATEMENT EXECUTE FUNCTION ledger_counted()",
      );
      for (const id of ["evt_1", "evt_2", "evt_3", "evt_4"]) await inbox.store({ id, body: body({}) });
      const leases = await inbox.claimBatch(4, LEASE);
      suite.t += LEASE;
      const other = await open();
      assert.equal((await other.claim(LEASE))!.id, leases[0]!.id, "the other worker took over the first");
      const results = await Promise.all(leases.map((lease, i) => inbox.finish(lease, [pay(`k${i + 1}`)])));
      assert.deepEqual(results, [false, true, true, true]);
      assert.deepEqual(await keys(inbox), ["k2", "k3", "k4"], "each held lease's write once, the lost one's none");
      assert.equal((await inbox.query("SELECT count(*)::integer AS n FROM ledger_statements"))[0]!.n, 1);
    });

    onPostgres("says 0 for a write a trigger skipped, even when its batch-mates' inserts were merged", async () => {
      const inbox = await open();
      await ledger(inbox);
      await inbox.query(`CREATE FUNCTION ledger_skip() RETURNS trigger LANGUAGE plpgsql AS $$
                           BEGIN IF NEW.k = 'k2' THEN RETURN NULL; END IF; RETURN NEW; END $$`);
      await inbox.query(
        "CREATE TRIGGER ledger_skip BEFORE INSERT ON ledger FOR EACH ROW EXECUTE FUNCTION ledger_skip()",
      );
      for (const id of ["evt_1", "evt_2", "evt_3"]) await inbox.store({ id, body: body({}) });
      const leases = await inbox.claimBatch(3, LEASE);
      const counts: number[] = [];
      const counted = (k: string, i: number) => async (tx: Tx) =>
        (counts[i] = await tx.run("INSERT INTO ledger (k) VALUES (?)", k));
      assert.deepEqual(await Promise.all(leases.map((lease, i) => inbox.finish(lease, [counted(`k${i + 1}`, i)]))), [
        true,
        true,
        true,
      ]);
      assert.deepEqual(counts, [1, 0, 1]);
      assert.deepEqual(await keys(inbox), ["k1", "k3"]);
    });

    it("records each of the article's payments exactly once through worker.ts's handler", async () => {
      const inbox = await open();
      await ensurePayments(inbox);
      await inbox.store({ id: "evt_100", body: body({ customer: "Maria Lopez", amount: 24.99 }) });
      await inbox.store({ id: "evt_100", body: body({ customer: "Maria Lopez", amount: 24.99 }) });
      await inbox.store({ id: "evt_101", body: body({ customer: "Ann", amount: 5 }) });
      await inbox.store({ id: "evt_bad", body: body({ nope: true }) });
      const stats = await run(recordPayment, { inbox, once: true, log: () => {} });
      assert.deepEqual([stats.done, stats.failed], [2, 1]);
      const rows = await inbox.query("SELECT delivery_id, customer, amount FROM payments ORDER BY delivery_id");
      assert.deepEqual(
        rows.map((r) => ({ ...r })),
        [
          { delivery_id: "evt_100", customer: "Maria Lopez", amount: 24.99 },
          { delivery_id: "evt_101", customer: "Ann", amount: 5 },
        ],
      );
    });
  });

  describe("attempts()", () => {
    // An attempt as a try that fail() was given no Try for keeps it: the error, at the store's now, untimed.
    const untimed = (attempt: number, error: string, startedAt: number) => ({
      attempt,
      destination: "handler",
      startedAt,
      ms: null,
      status: null,
      error,
      headers: null,
      body: null,
    });

    it("keeps every failed try's error, oldest first, through a manual retry; others' stay apart", async () => {
      const inbox = await open({ maxAttempts: 2, retryDelayMs: 1_000 });
      await inbox.store({ id: "evt_1", body: body({}) });
      await inbox.store({ id: "evt_2", body: body({}) });
      await inbox.fail((await inbox.claim(LEASE))!, "timeout");
      await inbox.fail((await inbox.claim(LEASE))!, "other delivery");
      suite.t += 10_000;
      const again = (await inbox.claim(LEASE))!;
      assert.equal(again.id, "evt_1");
      assert.deepEqual(await inbox.fail(again, "HTTP 502"), { status: "failed" });
      await inbox.retry({ id: "evt_1" });
      suite.t += 1_000;
      const leases = await inbox.claimBatch(2, LEASE);
      await inbox.fail(leases.find((l) => l.id === "evt_1")!, "bad amount", { permanent: true });
      assert.deepEqual(await inbox.attempts({ source: "default", id: "evt_1", receivedAt: T0 }), [
        untimed(1, "timeout", T0),
        untimed(2, "HTTP 502", T0 + 10_000),
        untimed(1, "bad amount", T0 + 11_000),
      ]);
      assert.deepEqual(await inbox.attempts({ source: "default", id: "nope", receivedAt: T0 }), []);
      assert.deepEqual(
        (await inbox.attempts({ source: "default", id: "evt_1", receivedAt: T0 + 10_500 })).map((a) => a.error),
        ["bad amount"],
        "a delivery stored again after purge forgot it shows only its own tries",
      );
    });

    it("keeps a try's timing and answer with its failure and with its done mark, a lost lease's not at all", async () => {
      const inbox = await open({ retryDelayMs: 1_000, retryJitter: 0 });
      await inbox.store({ id: "evt_1", body: body({}) });
      const first = (await inbox.claim(LEASE))!;
      await inbox.fail(first, "HTTP 429 from app: slow down", {
        retryAfterMs: 2_000,
        attempt: { startedAt: T0 + 5, ms: 12, status: 429, headers: { "retry-after": "2" }, body: "slow down" },
      });
      suite.t += 2_000;
      const second = (await inbox.claim(LEASE))!;
      const answer = {
        startedAt: T0 + 2_001,
        ms: 40,
        status: 200,
        headers: { "content-type": "text/plain" },
        body: "ok ✓",
      };
      // A done mark without a try keeps none (the handler's), and one for a lease another worker holds keeps none.
      assert.equal(await inbox.finish(first, [], { ...answer, body: "stale" }), false);
      assert.equal(await inbox.finish(second, [], answer), true);
      assert.deepEqual(await inbox.attempts({ source: "default", id: "evt_1", receivedAt: T0 }), [
        {
          attempt: 1,
          destination: "handler",
          startedAt: T0 + 5,
          ms: 12,
          status: 429,
          error: "HTTP 429 from app: slow down",
          headers: { "retry-after": "2" },
          body: "slow down",
        },
        { attempt: 2, destination: "handler", ...answer, error: null },
      ]);
      await inbox.store({ id: "evt_2", body: body({}) });
      assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
      assert.deepEqual(await inbox.attempts({ source: "default", id: "evt_2", receivedAt: T0 }), []);
    });

    it("keeps the tries of a batch of done marks, each with its own delivery", async () => {
      const inbox = await open();
      for (const id of ["a", "b", "c"]) await inbox.store({ id, body: body({}) });
      const leases = await inbox.claimBatch(3, LEASE);
      // Together, so the committer writes them in one transaction (PostgreSQL's finishAll, SQLite's group commit).
      const done = await Promise.all(
        leases.map((l, i) => inbox.finish(l, [], { startedAt: T0 + i, ms: i, status: 200 + i, body: l.id })),
      );
      assert.deepEqual(done, [true, true, true]);
      for (const [i, l] of leases.entries()) {
        const [kept] = await inbox.attempts({ source: "default", id: l.id, receivedAt: T0 });
        assert.deepEqual([kept!.status, kept!.body, kept!.ms], [200 + i, l.id, i]);
      }
    });

    it("keeps the last attemptsKept tries of each destination, letting the oldest go", async () => {
      const inbox = await open({ attemptsKept: 3, maxAttempts: 10, retryDelayMs: 1 });
      await inbox.store({ id: "evt_1", body: body({}) });
      for (let i = 1; i <= 5; i++) {
        suite.t += 1_000;
        const lease = (await inbox.claim(LEASE))!;
        await inbox.fail(lease, `try ${i}`, { attempt: { startedAt: suite.t, ms: 1 } });
      }
      suite.t += 1_000;
      await inbox.finish((await inbox.claim(LEASE))!, [], { startedAt: suite.t, ms: 1, status: 200 });
      const kept = await inbox.attempts({ source: "default", id: "evt_1", receivedAt: T0 });
      assert.deepEqual(
        kept.map((a) => [a.attempt, a.error]),
        [
          [4, "try 4"],
          [5, "try 5"],
          [6, null],
        ],
      );
    });

    it("keeps one more than the cap after a retry by hand that succeeds at once, and trims at the next replay", async () => {
      const inbox = await open({ attemptsKept: 2, maxAttempts: 2, retryDelayMs: 1 });
      await inbox.store({ id: "evt_1", body: body({}) });
      const log = async () =>
        (await inbox.attempts({ source: "default", id: "evt_1", receivedAt: T0 })).map((a) => a.error ?? "ok");
      for (const error of ["first", "second"]) {
        suite.t += 1_000;
        await inbox.fail((await inbox.claim(LEASE))!, error, { attempt: { startedAt: suite.t, ms: 1 } });
      }
      assert.equal(await inbox.retry({ id: "evt_1" }), 1);
      // Its first try after the retry: the hot path, with no trim.
      await inbox.finish((await inbox.claim(LEASE))!, [], { startedAt: suite.t, ms: 1, status: 200 });
      assert.deepEqual(await log(), ["first", "second", "ok"]);
      assert.deepEqual(await inbox.replayMatching({ id: "evt_1" }), { replayed: 1, tombstoned: 0 });
      await inbox.finish((await inbox.claim(LEASE))!, [], { startedAt: suite.t + 1, ms: 1, status: 200 });
      assert.deepEqual(await log(), ["ok", "ok"], "a replayed delivery's try trims its log back to the cap");
    });

    it("the control: with the default cap, all six tries are kept", async () => {
      const inbox = await open({ maxAttempts: 10, retryDelayMs: 1 });
      await inbox.store({ id: "evt_1", body: body({}) });
      for (let i = 1; i <= 6; i++) {
        suite.t += 1_000;
        await inbox.fail((await inbox.claim(LEASE))!, `try ${i}`);
      }
      assert.equal((await inbox.attempts({ source: "default", id: "evt_1", receivedAt: T0 })).length, 6);
    });

    it("purge forgets a delivery's attempt log with the delivery", async () => {
      const inbox = await open();
      for (const id of ["old", "new"]) {
        await inbox.store({ id, body: body({}) });
        await inbox.finish((await inbox.claim(LEASE))!, [], { startedAt: suite.t, ms: 3, status: 200, body: id });
        suite.t += 10 * 86_400_000;
      }
      const purged = await inbox.purge({ bodiesAfterMs: 86_400_000, forgetAfterMs: 15 * 86_400_000, rest: 0 });
      assert.equal(purged.forgotten, 1);
      const count = async (id: string) =>
        Number((await inbox.query("SELECT count(*) AS n FROM attempts WHERE id = ?", id))[0]!.n);
      assert.equal(await count("old"), 0, "the forgotten delivery's tries are gone");
      assert.equal(await count("new"), 1, "the kept one's stay");
    });
  });
});
