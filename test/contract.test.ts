// test/contract.test.ts: one suite for the store's contract, run against both backends: a real SQLite
// file, and a fresh schema on a real PostgreSQL (INBOX_TEST_POSTGRES; skipped in one line without one).
// The clock is pinned; where the backends must differ, the test says why.

import assert from "node:assert/strict";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import type { Delivery, Inbox, InboxOptions, Lease, SetAside, Tx } from "../lib/store.ts";
import { sha256 } from "../lib/rows.ts";
import { ensurePayments, recordPayment, run } from "../worker.ts";
import { freshSchema, postgresSkip, runScript, tempDir, backends } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const LEASE = 60_000;
const body = (event: unknown) => Buffer.from(JSON.stringify(event));
const pgSkip = await postgresSkip();

const BACKENDS = await backends("contract");

for (const backend of BACKENDS) {
  describe(`the contract on ${backend.name}`, { skip: backend.skip }, () => {
    // A behaviour only one backend has is declared on that one alone, rather than skipped on the other.
    const onPostgres = (name: string, fn: () => Promise<void>) =>
      backend.name === "postgres" ? it(name, fn) : undefined;
    let target: string;
    let cleanup: () => Promise<void>;
    let t: number;
    let opened: Inbox[];
    const open = async (options: InboxOptions = {}) => {
      const inbox = await connect(target, { now: () => t, random: () => 0, ...options });
      opened.push(inbox);
      return inbox;
    };
    const row = async (inbox: Inbox, id: string, source = "default") =>
      (await inbox.query("SELECT * FROM deliveries WHERE source = ? AND id = ?", source, id))[0];

    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      t = T0;
      opened = [];
    });
    afterEach(async () => {
      for (const inbox of opened) await inbox.close();
      await cleanup();
    });

    describe("store()", () => {
      it("keeps the first copy: stored, then duplicate, then conflict for a different body", async () => {
        const inbox = await open();
        assert.equal(await inbox.store({ id: "evt_1", body: body({ amount: 1 }) }), "stored");
        assert.equal(await inbox.store({ id: "evt_1", body: body({ amount: 1 }) }), "duplicate");
        assert.equal(await inbox.store({ id: "evt_1", body: body({ amount: 2 }) }), "conflict");
        const [d] = await inbox.find("evt_1");
        assert.deepEqual(d!.body, body({ amount: 1 }));
        assert.equal(d!.conflicts, 1);
        assert.equal(d!.receivedAt, T0);
      });

      it("tells the copies of one key apart within one group commit", async () => {
        const inbox = await open();
        const results = await Promise.all([
          inbox.store({ id: "evt_1", body: body({ a: 1 }) }),
          inbox.store({ id: "evt_1", body: body({ a: 1 }) }),
          inbox.store({ id: "evt_1", body: body({ a: 2 }) }),
          inbox.store({ id: "evt_2", body: body({}) }),
        ]);
        assert.deepEqual(results, ["stored", "duplicate", "conflict", "stored"]);
        assert.equal((await inbox.find("evt_1"))[0]!.conflicts, 1);
      });

      it("keeps bodies byte-exact, bytes that are not UTF-8 included, and one ID apart in two sources", async () => {
        const inbox = await open();
        const bytes = Buffer.from([0xff, 0x00, 0xfe, 0x22, 0x5c, 0x7b]);
        await inbox.store({
          source: "stripe",
          id: "x",
          body: bytes,
          eventType: "a.b",
          providerTime: 123,
          contentType: "application/json",
        });
        await inbox.store({ source: "github", id: "x", body: body({}) });
        const found = await inbox.find("x");
        assert.deepEqual(
          found.map((d) => d.source),
          ["github", "stripe"],
        );
        const stripe = (await inbox.find("x", "stripe"))[0]!;
        assert.deepEqual(stripe.body, bytes);
        assert.deepEqual([stripe.eventType, stripe.providerTime, stripe.contentType], ["a.b", 123, "application/json"]);
      });

      it("keeps every body of one batch apart, byte for byte, on every route: empty, binary and long alike", async () => {
        const inbox = await open();
        const bodies = [
          Buffer.alloc(0),
          Buffer.from([0x00, 0x5c, 0x78, 0xff]),
          Buffer.alloc(70_000, 0xab),
          body({ n: 1 }),
          Buffer.from("\\x00"),
        ];
        // Stored in one turn, so they share a batch (and on PostgreSQL one INSERT); the last goes to two routes.
        await Promise.all(
          bodies.map((b, i) =>
            inbox.store({ id: `b${i}`, body: b, ...(i === 4 ? { destinations: ["one", "two"] } : {}) }),
          ),
        );
        const rows = await inbox.query("SELECT id, route, body FROM deliveries ORDER BY id, route");
        assert.deepEqual(
          rows.map((r) => [r.id, r.route, Buffer.from(r.body as Uint8Array).toString("hex")]),
          [
            ...bodies.slice(0, 4).map((b, i) => [`b${i}`, 0, b.toString("hex")]),
            ["b4", 0, bodies[4]!.toString("hex")],
            ["b4", 1, bodies[4]!.toString("hex")],
          ],
        );
      });
    });

    describe("permit()", () => {
      it("grants nothing while paused, everything without a rate, and a rate's tokens shared by every worker, taken now", async () => {
        const [a, b] = [await open(), await open()];
        assert.deepEqual(await a.permit("app", 5), { granted: 5, paused: false, waitMs: 0 });
        const rate = { perSecond: 10, burst: 4 };
        // One token of the burst is kept back for the delay between a permit and the request's arrival.
        assert.deepEqual(await a.permit("app", 5, rate), { granted: 3, paused: false, waitMs: 100 });
        assert.deepEqual(
          await b.permit("app", 5, rate),
          { granted: 0, paused: false, waitMs: 100 },
          "the other worker finds the bucket empty",
        );
        t += 250;
        assert.deepEqual(await b.permit("app", 5, rate), { granted: 2, paused: false, waitMs: 50 });
        assert.equal(await a.pause("app"), true);
        t += 10_000;
        assert.deepEqual(await b.permit("app", 5), { granted: 0, paused: true, waitMs: 0 });
        assert.deepEqual(await b.permit("app", 5, rate), { granted: 0, paused: true, waitMs: 0 });
        assert.throws(() => a.permit("app", 0), TypeError);
      });
    });

    describe("claimBatch()", () => {
      it("leases the oldest due first, and returns undefined when nothing is due", async () => {
        const inbox = await open();
        assert.equal(await inbox.claim(LEASE), undefined);
        for (const id of ["evt_1", "evt_2", "evt_3"]) {
          await inbox.store({ id, body: body({}) });
          t += 1;
        }
        const leases = await inbox.claimBatch(2, LEASE);
        assert.deepEqual(
          leases.map((l) => l.id),
          ["evt_1", "evt_2"],
        );
        assert.equal(leases[0]!.attempts, 1);
        assert.equal(leases[0]!.leasedUntil, t + LEASE);
        assert.notEqual(leases[0]!.token, leases[1]!.token);
        assert.equal((await inbox.claimBatch(5, LEASE)).length, 1);
        assert.equal(await inbox.claim(LEASE), undefined);
      });

      it("never hands one delivery to two workers claiming at once", async () => {
        const a = await open();
        const b = await open();
        for (let i = 0; i < 200; i++) await a.store({ id: `evt_${i}`, body: body({}) });
        const claims = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? a : b).claimBatch(15, LEASE)));
        const ids = claims.flat().map((l) => l.id);
        assert.equal(ids.length, 200);
        assert.equal(new Set(ids).size, 200);
      });

      it("takes over an expired lease, and fences the old holder out of extend, finish, fail and release", async () => {
        const a = await open();
        const b = await open();
        await a.store({ id: "evt_1", body: body({}) });
        const stale = (await a.claim(LEASE))!;
        assert.equal(await b.claim(LEASE), undefined, "a live lease is not taken");
        t += LEASE;
        const fresh = (await b.claim(LEASE))!;
        assert.equal(fresh.attempts, 2);
        assert.equal(await a.extend(stale, LEASE), false);
        assert.equal(await a.finish(stale, [(tx: Tx) => tx.run("SELECT 1")]), false);
        assert.equal(await a.fail(stale, "late"), undefined);
        assert.equal(await a.release(stale), false);
        assert.equal(await b.extend(fresh, LEASE), true);
        assert.equal(fresh.leasedUntil, t + LEASE);
        assert.equal(await b.finish(fresh), true);
        assert.equal((await row(b, "evt_1"))!.status, "done");
      });

      // PostgreSQL only: SQLite has no row locks (its writers queue on one database lock, never in a cycle).
      onPostgres("extends a lease without waiting on its row while another transaction holds that row", async () => {
        // A heartbeat that waited here, inside a batch already holding a lock the row's holder wants (a row
        // every handler updates), deadlocked: PostgreSQL failed one batch a second under the crash tests.
        const inbox = await open();
        await inbox.store({ id: "evt_1", body: body({}) });
        const lease = (await inbox.claim(LEASE))!;
        const { default: pg } = await import("pg");
        const holder = new pg.Client({ connectionString: target.replace(/[?&]schema=([^&]+)/, "") });
        await holder.connect();
        try {
          const schema = new URL(target).searchParams.get("schema")!;
          await holder.query("BEGIN");
          await holder.query(`SELECT 1 FROM ${schema}.deliveries WHERE id = 'evt_1' FOR UPDATE`);
          assert.equal(await inbox.extend(lease, LEASE), true, "still held, as far as anything committed says");
          await holder.query("ROLLBACK");
          t += 1_000;
          assert.equal(await inbox.extend(lease, LEASE), true);
          assert.equal(lease.leasedUntil, t + LEASE, "extended once the row is free");
        } finally {
          await holder.end();
        }
      });

      it("does not let a delivery it sets aside at its last attempt take the place of one that is due", async () => {
        const inbox = await open({ maxAttempts: 2 });
        await inbox.store({ id: "evt_1", body: body({}) });
        assert.equal((await inbox.claim(LEASE))!.attempts, 1);
        t += LEASE;
        assert.equal((await inbox.claim(LEASE))!.attempts, 2, "taken over");
        t += 1;
        await inbox.store({ id: "evt_2", body: body({}) });
        assert.equal((await inbox.claim(LEASE))!.id, "evt_2");
        t += LEASE + 1;
        // Both leases have run out (their workers died); evt_1's first, and on its last attempt.
        assert.deepEqual(
          (await inbox.claimBatch(1, LEASE)).map((l) => l.id),
          ["evt_2"],
        );
        assert.equal((await row(inbox, "evt_1"))!.status, "failed");
      });

      // PostgreSQL only: the claim and the done marks pin index scans for themselves, whatever statistics the
      // table has (or lacks), and must leave the handler's own statements to the planner as configured.
      onPostgres("runs a handler's writes with the connection's own planner settings", async () => {
        const inbox = await open();
        await inbox.query("CREATE TABLE seen (setting text)");
        await inbox.store({ id: "evt_1", body: body({}) });
        const lease = (await inbox.claim(LEASE))!;
        assert.equal(
          await inbox.finish(lease, [(tx: Tx) => tx.run("INSERT INTO seen SELECT current_setting('enable_seqscan')")]),
          true,
        );
        assert.deepEqual(await inbox.query("SELECT setting FROM seen"), [{ setting: "on" }]);
      });

      // PostgreSQL only: its claims start where the last one ended (a keyset on the due index), and a row
      // lock is the one way for a due delivery to fall behind that point (SQLite has no row locks).
      if (backend.name === "postgres")
        describe("from where the last claim ended", () => {
          // lockedDuring holds evt_1's row lock, as another worker's claim would, while fn claims; then
          // rolls back, as that claim would if it failed.
          const lockedDuring = async <T>(fn: () => Promise<T>): Promise<T> => {
            const { default: pg } = await import("pg");
            const holder = new pg.Client({ connectionString: target.replace(/[?&]schema=([^&]+)/, "") });
            await holder.connect();
            try {
              await holder.query("BEGIN");
              await holder.query(
                `SELECT 1 FROM ${new URL(target).searchParams.get("schema")}.deliveries WHERE id = 'evt_1' FOR UPDATE`,
              );
              return await fn();
            } finally {
              await holder.query("ROLLBACK").finally(() => holder.end());
            }
          };
          const stored = async (inbox: Inbox, n: number) => {
            for (let i = 0; i < n; i++) {
              await inbox.store({ id: `evt_${i}`, body: body({}) });
              t += 1;
            }
          };
          const ids = (leases: Lease[]) => leases.map((l) => l.id);

          onPostgres("takes a delivery that a rolled-back claim skipped once claims come back short", async () => {
            const inbox = await open();
            await stored(inbox, 4);
            assert.deepEqual(ids(await lockedDuring(() => inbox.claimBatch(2, LEASE))), ["evt_0", "evt_2"]);
            assert.deepEqual(ids(await inbox.claimBatch(5, LEASE)), ["evt_1", "evt_3"]);
          });

          onPostgres("takes it within DEFAULTS.claimFromStartMs under a backlog that never runs dry", async () => {
            const inbox = await open();
            await stored(inbox, 10);
            assert.deepEqual(ids(await lockedDuring(() => inbox.claimBatch(2, LEASE))), ["evt_0", "evt_2"]);
            // The control: full claims go on from where the last one ended, past evt_1, due before them.
            assert.deepEqual(ids(await inbox.claimBatch(2, LEASE)), ["evt_3", "evt_4"]);
            t += DEFAULTS.claimFromStartMs - 1;
            assert.deepEqual(ids(await inbox.claimBatch(2, LEASE)), ["evt_5", "evt_6"]);
            t += 1;
            assert.deepEqual(ids(await inbox.claimBatch(2, LEASE)), ["evt_1", "evt_7"]);
          });

          onPostgres("still takes over expired leases and due retries, which fall due after the cursor", async () => {
            const inbox = await open();
            await stored(inbox, 6);
            const [first] = await inbox.claimBatch(2, LEASE);
            assert.ok(await inbox.fail(first!, "boom"));
            assert.deepEqual(ids(await inbox.claimBatch(2, LEASE)), ["evt_2", "evt_3"]);
            t += LEASE;
            // evt_0's retry is due, and evt_1's lease has ended (its worker died): all that is due, in due order.
            assert.deepEqual(ids(await inbox.claimBatch(4, LEASE)), ["evt_4", "evt_5", "evt_0", "evt_1"]);
          });
        });

      // PostgreSQL only: SQLite has no server to end a connection.
      onPostgres(
        "fails only the batch whose connection the server ends mid-transaction, and carries on, though its idle connections were ended too",
        async () => {
          // pg emits "error" on a client whose connection drops as well as failing its query: unheard while
          // the client was checked out, that event killed the whole process (this test's, here).
          const name = `contract-terminate-${process.pid}`;
          const inbox = await connect(`${target}&application_name=${name}`, { now: () => t, random: () => 0 });
          opened.push(inbox);
          await inbox.store({ id: "evt_1", body: body({}) });
          const lease = (await inbox.claim(LEASE))!;
          // Idle connections in the pool beside the batch's: ended too, the next store meets one of them first,
          // before pg has read that it is gone (a restart, a failover, an idle timeout do the same).
          await Promise.all([1, 2, 3].map(() => inbox.list()));
          const finishing = inbox.finish(lease, [(tx: Tx) => tx.run("SELECT pg_sleep(30)")]);
          // Heard from now on: the batch can fail before the terminate query's own answer arrives, and a
          // rejection nobody listens to yet fails the run (seen on Deno, whose timing differs).
          const failed = assert.rejects(finishing, /terminat/);
          const admin = await connect(target);
          opened.push(admin);
          const sleeping = `FROM pg_stat_activity WHERE application_name = ? AND query LIKE 'SELECT pg_sleep%'`;
          while ((await admin.query(`SELECT pid ${sleeping}`, name)).length === 0)
            await new Promise((resolve) => setTimeout(resolve, 10));
          const ended = await admin.query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ?",
            name,
          );
          // At once, before pg has read the idle connections' end: each meets one, drops it and goes on.
          const [listed, stored] = await Promise.all([inbox.list(), inbox.store({ id: "evt_2", body: body({}) })]);
          // Behind a pooler (test/pgbouncer.test.ts runs this suite so) idle connections are the pooler's, not ours.
          const direct = !/[?&]listen=false/.test(target);
          assert.ok(
            ended.length > (direct ? 1 : 0),
            `the batch's connection, and idle ones when direct, were ended (${ended.length})`,
          );
          await failed;
          assert.equal((await row(admin, "evt_1"))!.status, "processing", "nothing of the batch committed");
          assert.equal(stored, "stored", "the inbox carries on, on a new connection");
          // The read ran beside the store, so it may or may not see evt_2 yet (seen both ways on Deno).
          assert.ok(
            listed.some((d) => d.id === "evt_1"),
            "the read carries on too, on a new connection",
          );
          assert.equal(await inbox.finish(lease), true);
        },
      );

      it("sets aside a delivery whose lease expired on its last attempt, and tells the claim's onSetAside once", async () => {
        const inbox = await open({ maxAttempts: 1 });
        await inbox.store({ id: "evt_1", body: body({}) });
        const told: SetAside[][] = [];
        const onSetAside = (setAside: SetAside[]) => told.push(setAside);
        await inbox.claim(LEASE, { onSetAside });
        assert.deepEqual(told, [], "a claim that sets nothing aside says nothing");
        t += LEASE;
        assert.equal(await inbox.claim(LEASE, { onSetAside }), undefined);
        const [d] = await inbox.find("evt_1");
        assert.equal(d!.status, "failed");
        assert.match(d!.error!, /gave up: the lease expired on the last attempt/);
        assert.deepEqual(told, [
          [{ source: "default", id: "evt_1", destination: "handler", attempts: 1, error: d!.error }],
        ]);
        assert.equal(await inbox.claim(LEASE, { onSetAside }), undefined);
        assert.equal(told.length, 1, "set aside once, told once");
      });
    });

    describe("fail(), release() and retry()", () => {
      it("backs off, then sets aside after the last attempt; retry queues it again with attempts reset", async () => {
        const inbox = await open({ maxAttempts: 2, retryDelayMs: 1_000, retryJitter: 0 });
        await inbox.store({ id: "evt_1", body: body({}) });
        const first = (await inbox.claim(LEASE))!;
        assert.deepEqual(await inbox.fail(first, "boom"), { status: "received", retryAt: t + 1_000 });
        assert.equal(await inbox.claim(LEASE), undefined, "not due before its backoff");
        t += 1_000;
        const second = (await inbox.claim(LEASE))!;
        assert.deepEqual(await inbox.fail(second, "boom again"), { status: "failed" });
        const [failed] = await inbox.find("evt_1");
        assert.deepEqual([failed!.status, failed!.error, failed!.finishedAt], ["failed", "boom again", t]);
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
        t += LEASE;
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

      onPostgres(
        "sends a batch's one-row inserts as one statement, in the transaction of their done marks",
        async () => {
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
          t += LEASE;
          const other = await open();
          assert.equal((await other.claim(LEASE))!.id, leases[0]!.id, "the other worker took over the first");
          const results = await Promise.all(leases.map((lease, i) => inbox.finish(lease, [pay(`k${i + 1}`)])));
          assert.deepEqual(results, [false, true, true, true]);
          assert.deepEqual(await keys(inbox), ["k2", "k3", "k4"], "each held lease's write once, the lost one's none");
          assert.equal((await inbox.query("SELECT count(*)::integer AS n FROM ledger_statements"))[0]!.n, 1);
        },
      );

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

    describe("worker.ts run()", () => {
      it("never runs more than --concurrency handlers that await I/O at once", async () => {
        const inbox = await open();
        for (let i = 0; i < 60; i++) await inbox.store({ id: `evt_${i}`, body: body({}) });
        let now = 0;
        let most = 0;
        const stats = await run(
          async () => {
            most = Math.max(most, ++now);
            await new Promise((resolve) => setTimeout(resolve, 2));
            now--;
          },
          { inbox, once: true, concurrency: 4, log: () => {} },
        );
        assert.equal(stats.done, 60);
        assert.equal(most, 4, "exactly the limit: it is reached, and never passed");
      });

      it("claims fast handlers' work in batches larger than --concurrency, so one commit serves many", async () => {
        const inbox = await open();
        for (let i = 0; i < 600; i++) await inbox.store({ id: `evt_${i}`, body: body({}) });
        const sizes: number[] = [];
        const claimBatch = inbox.claimBatch.bind(inbox);
        inbox.claimBatch = async (limit, leaseMs) => {
          const leases = await claimBatch(limit, leaseMs);
          if (leases.length > 0) sizes.push(leases.length);
          return leases;
        };
        const stats = await run(() => {}, { inbox, once: true, concurrency: 8, claimBatch: 200, log: () => {} });
        assert.equal(stats.done, 600);
        assert.equal(sizes[0], 8, "the first claim, before any handler has been timed, is the concurrency");
        assert.ok(Math.max(...sizes) > 8 && Math.max(...sizes) <= 200, `claims of ${sizes.join(", ")}`);
      });
    });

    describe("looking: find(), list(), status()", () => {
      it("counts per status and source, lists newest first, and names the failures and the oldest wait", async () => {
        const inbox = await open();
        await inbox.store({ source: "stripe", id: "s1", body: body({}), eventType: "charge.succeeded" });
        t += 1_000;
        await inbox.store({ id: "evt_1", body: body({}) });
        await inbox.store({ id: "evt_1", body: body({ other: 1 }) });
        const lease = (await inbox.claim(LEASE))!;
        await inbox.fail(lease, "nope", { permanent: true });
        t += 4_000;
        const s = await inbox.status();
        assert.deepEqual(s.counts, { received: 1, processing: 0, done: 0, failed: 1 });
        assert.deepEqual(
          s.failed.map((f) => [f.source, f.id, f.error]),
          [["stripe", "s1", "nope"]],
        );
        assert.equal(s.oldestWaitingMs, 4_000);
        assert.deepEqual(s.conflicts, { deliveries: 1, copies: 1 });
        assert.deepEqual(
          s.sources.map((x) => [x.source, x.eventType]),
          [
            ["default", null],
            ["stripe", "charge.succeeded"],
          ],
        );
        assert.deepEqual(
          (await inbox.list()).map((d) => d.id),
          ["evt_1", "s1"],
        );
        assert.deepEqual(
          (await inbox.list({ status: "failed" })).map((d) => d.id),
          ["s1"],
        );
        assert.deepEqual(
          (await inbox.list({ source: "default" })).map((d) => d.id),
          ["evt_1"],
        );
      });
    });

    describe("attemptErrors()", () => {
      it("keeps every failed try's error, oldest first, through a manual retry; others' stay apart", async () => {
        const inbox = await open({ maxAttempts: 2, retryDelayMs: 1_000 });
        await inbox.store({ id: "evt_1", body: body({}) });
        await inbox.store({ id: "evt_2", body: body({}) });
        await inbox.fail((await inbox.claim(LEASE))!, "timeout");
        await inbox.fail((await inbox.claim(LEASE))!, "other delivery");
        t += 10_000;
        const again = (await inbox.claim(LEASE))!;
        assert.equal(again.id, "evt_1");
        assert.deepEqual(await inbox.fail(again, "HTTP 502"), { status: "failed" });
        await inbox.retry({ id: "evt_1" });
        t += 1_000;
        const leases = await inbox.claimBatch(2, LEASE);
        await inbox.fail(leases.find((l) => l.id === "evt_1")!, "bad amount", { permanent: true });
        assert.deepEqual(await inbox.attemptErrors({ source: "default", id: "evt_1", receivedAt: T0 }), [
          { attempt: 1, error: "timeout", failedAt: T0, destination: "handler" },
          { attempt: 2, error: "HTTP 502", failedAt: T0 + 10_000, destination: "handler" },
          { attempt: 1, error: "bad amount", failedAt: T0 + 11_000, destination: "handler" },
        ]);
        assert.deepEqual(await inbox.attemptErrors({ source: "default", id: "nope", receivedAt: T0 }), []);
        assert.deepEqual(
          (await inbox.attemptErrors({ source: "default", id: "evt_1", receivedAt: T0 + 10_500 })).map((a) => a.error),
          ["bad amount"],
          "a delivery stored again after purge forgot it shows only its own tries",
        );
      });
    });

    describe("summary()", () => {
      it("counts per status and per source as status() does, and names the oldest wait and the conflicts", async () => {
        const inbox = await open({ maxAttempts: 1 });
        await inbox.store({ source: "stripe", id: "s1", body: body({}) });
        t += 1_000;
        for (const id of ["s2", "s3", "s4"]) await inbox.store({ source: "stripe", id, body: body({}) });
        await inbox.store({ source: "github", id: "g1", body: body({}) });
        await inbox.store({ source: "github", id: "g1", body: body({ other: 1 }) });
        const [a, b, c] = await inbox.claimBatch(3, LEASE); // s1, s2, s3: one done, one failed, one processing
        await inbox.finish(a!);
        await inbox.fail(b!, "boom");
        void c;
        t += 4_000;
        const summary = await inbox.summary();
        const status = await inbox.status();
        assert.deepEqual(summary.counts, { received: 2, processing: 1, done: 1, failed: 1 });
        assert.deepEqual(summary.counts, status.counts);
        assert.deepEqual(summary.sources, [
          { source: "github", counts: { received: 1, processing: 0, done: 0, failed: 0 } },
          { source: "stripe", counts: { received: 1, processing: 1, done: 1, failed: 1 } },
        ]);
        assert.equal(summary.oldestWaitingMs, 4_000, "s3 has waited since it arrived, processing or not");
        assert.deepEqual(summary.conflicts, { deliveries: 1, copies: 1 });
        assert.equal(summary.estimated, false, "a small table is counted, not estimated");
        const empty = await open({ maxAttempts: 1 });
        await empty.query("DELETE FROM deliveries");
        assert.deepEqual(await empty.summary(), {
          counts: { received: 0, processing: 0, done: 0, failed: 0 },
          sources: [],
          oldestWaitingMs: null,
          conflicts: { deliveries: 0, copies: 0 },
          estimated: false,
        });
      });
    });

    describe("histogram()", () => {
      it("counts received, done and failed per bucket, each in the bucket it happened in, empty ones as zero", async () => {
        const inbox = await open({ maxAttempts: 1 });
        await inbox.store({ id: "old", body: body({}) }); // before the range: counted nowhere
        t += 60_000;
        const since = t;
        await inbox.store({ id: "a", body: body({}) });
        await inbox.store({ id: "b", body: body({}) });
        t += 61_000; // second bucket
        await inbox.store({ id: "c", body: body({}) });
        const leases = await inbox.claimBatch(4, LEASE);
        await inbox.finish(leases.find((l) => l.id === "a")!);
        await inbox.fail(leases.find((l) => l.id === "b")!, "boom");
        t += 60_000; // third bucket: nothing at all
        const buckets = await inbox.histogram(since, 60_000, since + 180_000);
        assert.deepEqual(buckets, [
          { start: since, received: 2, done: 0, failed: 0 },
          { start: since + 60_000, received: 1, done: 1, failed: 1 },
          { start: since + 120_000, received: 0, done: 0, failed: 0 },
        ]);
        assert.equal((await inbox.histogram(since, 60_000)).length, 3, "until defaults to the clock's now");
        await assert.rejects(inbox.histogram(since, 0), TypeError);
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
        t += 6 * DAY;
        await handled(inbox, "young");
        t += 2 * DAY;
        const purged = await inbox.purge();
        assert.deepEqual(
          { ...purged, vacuumedBytes: 0 },
          { bodies: 1, bytes: body({ id: "old" }).length, forgotten: 0, vacuumedBytes: 0 },
        );
        const [old] = await inbox.find("old");
        assert.deepEqual(
          [old!.status, old!.body.length, old!.purgedAt, old!.bodySha256],
          ["done", 0, t, sha256(body({ id: "old" }))],
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
        t += 8 * DAY;
        await inbox.purge();
        t += 23 * DAY;
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
        t += 40 * DAY;
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
        t += 8 * DAY;
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
        t += 8 * DAY;
        assert.equal((await inbox.purge({ batch: 2 })).bodies, 7);
        await assert.rejects(async () => inbox.purge({ bodiesAfterMs: DAY, forgetAfterMs: DAY }), TypeError);
      });

      it("a worker run with purge set purges at start, beside its handlers, and logs what went", async () => {
        const inbox = await open();
        await handled(inbox, "old");
        t += 8 * DAY;
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
        assert.equal((await inbox.find("old"))[0]!.purgedAt, t);
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
        t += 1_000;
        await handled(inbox, "b");
        await inbox.store({ id: "c", body: body({ id: "c" }) });
        await inbox.dropBodies({ id: "a" });
        const kept = await inbox.kept();
        assert.deepEqual(kept.bodies, { count: 2, bytes: 2 * body({ id: "b" }).length, oldest: T0 + 1_000 });
        assert.deepEqual(kept.tombstones, { count: 1, oldest: T0 });
        assert.ok(kept.fileBytes > 0);
      });
    });

    describe("filters: search(), count(), retryMatching(), replayMatching()", () => {
      // Six deliveries a second apart: two sources, two types, two failures with different errors, two done.
      const seed = async (inbox: Inbox) => {
        const plan: [string, string, string, "done" | "failed" | "received", string?][] = [
          ["stripe", "s1", "charge.succeeded", "done"],
          ["stripe", "s2", "charge.failed", "failed", "Timeout talking to ledger"],
          ["github", "g1", "push", "failed", "HTTP 500 from CI"],
          ["github", "g2", "push", "done"],
          ["stripe", "s3", "charge.succeeded", "received"],
          ["default", "d1", "", "failed", "timeout again"],
        ];
        for (const [source, id, eventType] of plan) {
          await inbox.store({ source, id, eventType: eventType || null, body: body({ id, note: `for ${source}` }) });
          t += 1_000;
        }
        const fates = new Map(plan.map(([source, id, , fate, error]) => [`${source}/${id}`, { fate, error }]));
        for (const lease of await inbox.claimBatch(plan.length, LEASE)) {
          const { fate, error } = fates.get(`${lease.source}/${lease.id}`)!;
          if (fate === "done") await inbox.finish(lease);
          else if (fate === "failed") await inbox.fail(lease, error!, { permanent: true });
          else await inbox.release(lease);
        }
      };
      const ids = (ds: Delivery[]) => ds.map((d) => d.id);

      it("narrows by every field, newest first, and counts the same", async () => {
        const inbox = await open();
        await seed(inbox);
        assert.deepEqual(ids(await inbox.search({})), ["d1", "s3", "g2", "g1", "s2", "s1"]);
        const cases: [Parameters<Inbox["search"]>[0], string[]][] = [
          [{ status: "failed" }, ["d1", "g1", "s2"]],
          [{ source: "stripe" }, ["s3", "s2", "s1"]],
          [{ type: "push" }, ["g2", "g1"]],
          [{ since: T0 + 1_000, until: T0 + 3_000 }, ["g1", "s2"]],
          [{ errorMatch: "TIMEOUT" }, ["d1", "s2"]],
          [{ errorMatch: "500 from" }, ["g1"]],
          [{ id: "g2" }, ["g2"]],
          [{ bodyContains: "for github" }, ["g2", "g1"]],
          [{ status: "failed", source: "stripe", errorMatch: "ledger" }, ["s2"]],
          [{ errorMatch: "%" }, []],
        ];
        for (const [filter, expected] of cases) {
          assert.deepEqual(ids(await inbox.search(filter)), expected, JSON.stringify(filter));
          assert.equal(await inbox.count(filter), expected.length, JSON.stringify(filter));
        }
      });

      it("finds an ID under every source that has it, and under one when the source is given", async () => {
        const inbox = await open();
        for (const source of ["stripe", "github", "shopify"]) {
          await inbox.store({ source, id: source === "shopify" ? "other" : "evt_same", body: body({ source }) });
          t += 1_000;
        }
        assert.deepEqual(
          (await inbox.search({ id: "evt_same" })).map((d) => d.source),
          ["github", "stripe"],
        );
        assert.equal(await inbox.count({ id: "evt_same" }), 2);
        assert.deepEqual(
          (await inbox.search({ id: "evt_same", source: "stripe" })).map((d) => d.source),
          ["stripe"],
        );
        assert.deepEqual(await inbox.search({ id: "nope" }), []);
      });

      it("pages by cursor without gaps or repeats, ties on received_at included", async () => {
        const inbox = await open();
        for (let i = 0; i < 25; i++) {
          await inbox.store({ source: i % 2 ? "a" : "b", id: `e${String(i).padStart(2, "0")}`, body: body({ i }) });
          if (i % 3 === 0) t += 1;
        }
        const all = ids(await inbox.search({}, { limit: 100 }));
        const paged: string[] = [];
        let after: Delivery | undefined;
        for (;;) {
          const page = await inbox.search({}, { after, limit: 4 });
          if (page.length === 0) break;
          paged.push(...ids(page));
          after = page.at(-1);
        }
        assert.equal(all.length, 25);
        assert.deepEqual(paged, all);
        assert.equal((await inbox.search({})).length, 25, "the default limit is above 25");
      });

      it("replays beside a running worker: each delivery at most once per run, and every one ends done", async () => {
        const inbox = await open();
        for (let i = 0; i < 40; i++) await inbox.store({ id: `e${i}`, body: body({ i }) });
        const handled = new Map<string, number>();
        const stop = new AbortController();
        const worker = run((job) => void handled.set(job.delivery.id, (handled.get(job.delivery.id) ?? 0) + 1), {
          inbox,
          concurrency: 4,
          pollMaxMs: 5,
          signal: stop.signal,
          log: () => {},
        });
        while ((await inbox.count({ status: "done" })) < 10) await new Promise((resolve) => setTimeout(resolve, 2));
        const { replayed } = await inbox.replayMatching({}, { batch: 3 });
        assert.ok(replayed >= 10, `replayed ${replayed}`);
        while ((await inbox.count({ status: "done" })) < 40) await new Promise((resolve) => setTimeout(resolve, 2));
        stop.abort();
        await worker;
        const all = await inbox.search({}, { limit: 100 });
        assert.equal(all.filter((d) => d.replays === 1).length, replayed);
        assert.ok(all.every((d) => d.replays <= 1));
        assert.equal(
          [...handled.values()].reduce((a, b) => a + b, 0),
          40 + replayed,
          "the handler ran once per delivery, and once per replay",
        );
      });

      it("refuses a filter it does not know, rather than matching everything", async () => {
        const inbox = await open();
        await assert.rejects(async () => inbox.search({ staus: "failed" } as never), TypeError);
        await assert.rejects(async () => inbox.count({ since: "yesterday" } as never), TypeError);
        await assert.rejects(async () => inbox.retryMatching({ status: "gone" } as never), TypeError);
      });

      it("retryMatching queues only the failed ones that match, in batches, and twice changes nothing more", async () => {
        const inbox = await open();
        await seed(inbox);
        assert.equal(await inbox.retryMatching({ errorMatch: "timeout" }, { batch: 1 }), 2);
        assert.deepEqual(ids(await inbox.search({ status: "failed" })), ["g1"]);
        const s2 = (await inbox.find("s2", "stripe"))[0]!;
        assert.deepEqual([s2.status, s2.attempts, s2.error, s2.availableAt], ["received", 0, null, t]);
        assert.equal(await inbox.retryMatching({ errorMatch: "timeout" }), 0, "run twice, nothing more");
        assert.equal(await inbox.retryMatching({ source: "stripe" }), 0, "done and received ones are not retried");
      });

      it("replayMatching takes done ones again under the same key, attempts reset and replays counted", async () => {
        const inbox = await open();
        await seed(inbox);
        assert.deepEqual(await inbox.replayMatching({ type: "charge.succeeded" }), { replayed: 1, tombstoned: 0 });
        const s1 = (await inbox.find("s1", "stripe"))[0]!;
        assert.deepEqual(
          [s1.status, s1.attempts, s1.replays, s1.finishedAt, s1.availableAt],
          ["received", 0, 1, null, t],
        );
        const lease = (await inbox.claimBatch(10, LEASE)).find((l) => l.id === "s1")!;
        assert.equal(lease.attempts, 1);
        assert.equal(await inbox.finish(lease), true);
        assert.deepEqual(await inbox.replayMatching({ id: "s1" }, { batch: 1 }), { replayed: 1, tombstoned: 0 });
        assert.equal((await inbox.find("s1", "stripe"))[0]!.replays, 2);
        assert.equal(await inbox.count({}), 6, "a replay is not a new delivery");
      });
    });
  });
}

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
    for (let i = 0; i < 1_100; i++) await sqlite.store({ source: "bulk", id: `b${i}`, body: body({ i }) });
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
