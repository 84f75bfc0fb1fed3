// test/contract-claim.test.ts: claim(), claimBatch(), extend() and release() by a lost holder, on both backends
// (test/contract-harness.ts): the oldest due first, one delivery to one worker, takeovers fenced by the token,
// leases set aside at their last attempt, and worker.ts run() sizing its claims.
//   npx node --import tsx --test test/contract-claim.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import type { Inbox, Lease, SetAside, Tx } from "../lib/store.ts";
import { run } from "../worker.ts";
import { body, contract, LEASE } from "./contract-harness.ts";

contract((suite) => {
  const { backend, open, row, onPostgres } = suite;
  describe("claimBatch()", () => {
    it("leases the oldest due first, and returns undefined when nothing is due", async () => {
      const inbox = await open();
      assert.equal(await inbox.claim(LEASE), undefined);
      for (const id of ["evt_1", "evt_2", "evt_3"]) {
        await inbox.store({ id, body: body({}) });
        suite.t += 1;
      }
      const leases = await inbox.claimBatch(2, LEASE);
      assert.deepEqual(
        leases.map((l) => l.id),
        ["evt_1", "evt_2"],
      );
      assert.equal(leases[0]!.attempts, 1);
      assert.equal(leases[0]!.leasedUntil, suite.t + LEASE);
      assert.notEqual(leases[0]!.token, leases[1]!.token);
      assert.equal((await inbox.claimBatch(5, LEASE)).length, 1);
      assert.equal(await inbox.claim(LEASE), undefined);
    });

    it("never hands one delivery to two workers claiming at once", async () => {
      const a = await open();
      const b = await open();
      await Promise.all(Array.from({ length: 200 }, (_, i) => a.store({ id: `evt_${i}`, body: body({}) })));
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
      suite.t += LEASE;
      const fresh = (await b.claim(LEASE))!;
      assert.equal(fresh.attempts, 2);
      assert.equal(await a.extend(stale, LEASE), false);
      assert.equal(await a.finish(stale, [(tx: Tx) => tx.run("SELECT 1")]), false);
      assert.equal(await a.fail(stale, "late"), undefined);
      assert.equal(await a.release(stale), false);
      assert.equal(await b.extend(fresh, LEASE), true);
      assert.equal(fresh.leasedUntil, suite.t + LEASE);
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
      const holder = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
      await holder.connect();
      try {
        const schema = new URL(suite.target).searchParams.get("schema")!;
        await holder.query("BEGIN");
        await holder.query(`SELECT 1 FROM ${schema}.delivery_rows WHERE id = 'evt_1' FOR UPDATE`);
        assert.equal(await inbox.extend(lease, LEASE), true, "still held, as far as anything committed says");
        await holder.query("ROLLBACK");
        suite.t += 1_000;
        assert.equal(await inbox.extend(lease, LEASE), true);
        assert.equal(lease.leasedUntil, suite.t + LEASE, "extended once the row is free");
      } finally {
        await holder.end();
      }
    });

    // PostgreSQL only: a partition with no statistics yet, and the planner's guess at it (docs/table.md#hot-and-cold).
    onPostgres(
      "has the hot partition analyzed at the first claim of DEFAULTS.analyzeHotAt, where nothing ever did (control: a smaller claim does not)",
      async () => {
        const { default: pg } = await import("pg");
        const admin = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
        await admin.connect();
        const schema = new URL(suite.target).searchParams.get("schema")!;
        // What the planner takes the hot partition's backlog for, with the status the done marks name.
        const guess = async () => {
          const { rows } = await admin.query(
            `EXPLAIN (FORMAT JSON) SELECT 1 FROM ${schema}.delivery_rows_hot WHERE status IN ('received', 'processing')`,
          );
          return Number(rows[0]["QUERY PLAN"][0].Plan["Plan Rows"]);
        };
        const analyzed = async () => {
          const { rows } = await admin.query(
            "SELECT last_analyze IS NOT NULL AS yes FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'delivery_rows_hot'",
            [schema],
          );
          return rows[0].yes as boolean;
        };
        try {
          // Autovacuum stays off it here, so that only the inbox's ANALYZE can be what the test sees.
          await admin.query(`ALTER TABLE ${schema}.delivery_rows_hot SET (autovacuum_enabled = false)`);
          const inbox = await open();
          const n = DEFAULTS.analyzeHotAt * 3;
          await Promise.all(Array.from({ length: n }, (_, i) => inbox.store({ id: `evt_${i}`, body: body({ i }) })));
          const control = await open();
          assert.equal((await control.claimBatch(DEFAULTS.analyzeHotAt - 1, LEASE)).length, DEFAULTS.analyzeHotAt - 1);
          await control.close();
          assert.equal(await analyzed(), false, "control: a claim under DEFAULTS.analyzeHotAt leaves it as it was");
          assert.ok(
            (await guess()) < n / 10,
            `control: unanalyzed, the backlog is guessed far below ${n} (${await guess()})`,
          );
          const worker = await open();
          assert.equal((await worker.claimBatch(DEFAULTS.analyzeHotAt, LEASE)).length, DEFAULTS.analyzeHotAt);
          await worker.close();
          assert.equal(await analyzed(), true, "the first full claim had it analyzed, and close() waited for it");
          assert.ok((await guess()) >= n / 2, `the backlog is known for about what it is (${await guess()} of ${n})`);
        } finally {
          await admin.end();
        }
      },
    );

    it("does not let a delivery it sets aside at its last attempt take the place of one that is due", async () => {
      const inbox = await open({ maxAttempts: 2 });
      await inbox.store({ id: "evt_1", body: body({}) });
      assert.equal((await inbox.claim(LEASE))!.attempts, 1);
      suite.t += LEASE;
      assert.equal((await inbox.claim(LEASE))!.attempts, 2, "taken over");
      suite.t += 1;
      await inbox.store({ id: "evt_2", body: body({}) });
      assert.equal((await inbox.claim(LEASE))!.id, "evt_2");
      suite.t += LEASE + 1;
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
          const holder = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
          await holder.connect();
          try {
            await holder.query("BEGIN");
            await holder.query(
              `SELECT 1 FROM ${new URL(suite.target).searchParams.get("schema")}.delivery_rows WHERE id = 'evt_1' FOR UPDATE`,
            );
            return await fn();
          } finally {
            await holder.query("ROLLBACK").finally(() => holder.end());
          }
        };
        const stored = async (inbox: Inbox, n: number) => {
          for (let i = 0; i < n; i++) {
            await inbox.store({ id: `evt_${i}`, body: body({}) });
            suite.t += 1;
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
          suite.t += DEFAULTS.claimFromStartMs - 1;
          assert.deepEqual(ids(await inbox.claimBatch(2, LEASE)), ["evt_5", "evt_6"]);
          suite.t += 1;
          assert.deepEqual(ids(await inbox.claimBatch(2, LEASE)), ["evt_1", "evt_7"]);
        });

        onPostgres("still takes over expired leases and due retries, which fall due after the cursor", async () => {
          const inbox = await open();
          await stored(inbox, 6);
          const [first] = await inbox.claimBatch(2, LEASE);
          assert.ok(await inbox.fail(first!, "boom"));
          assert.deepEqual(ids(await inbox.claimBatch(2, LEASE)), ["evt_2", "evt_3"]);
          suite.t += LEASE;
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
        const inbox = await connect(`${suite.target}&application_name=${name}`, {
          now: () => suite.t,
          random: () => 0,
        });
        suite.opened.push(inbox);
        await inbox.store({ id: "evt_1", body: body({}) });
        const lease = (await inbox.claim(LEASE))!;
        // Idle connections in the pool beside the batch's: ended too, the next store meets one of them first,
        // before pg has read that it is gone (a restart, a failover, an idle timeout do the same).
        await Promise.all([1, 2, 3].map(() => inbox.list()));
        const finishing = inbox.finish(lease, [(tx: Tx) => tx.run("SELECT pg_sleep(30)")]);
        // Heard from now on: the batch can fail before the terminate query's own answer arrives, and a
        // rejection nobody listens to yet fails the run (seen on Deno, whose timing differs).
        const failed = assert.rejects(finishing, /terminat/);
        const admin = await connect(suite.target);
        suite.opened.push(admin);
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
        const direct = !/[?&]listen=false/.test(suite.target);
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
      suite.t += LEASE;
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
      await Promise.all(Array.from({ length: 600 }, (_, i) => inbox.store({ id: `evt_${i}`, body: body({}) })));
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
});
