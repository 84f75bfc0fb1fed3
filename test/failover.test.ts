// test/failover.test.ts: a failover that loses nothing, on private clusters (a primary and a standby made with
// pg_basebackup -R from Debian's PostgreSQL binaries; skipped in one line without them). The short failover
// under load (test/failover.ts), its control without synchronous replication, and a COMMIT whose wait for
// the standby is cancelled or cut off, which must never count as stored.
//   npx node --import tsx --test test/failover.test.ts     # TORTURE_FAILOVERS=5 npm run torture -- crash, long

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { connect, type Inbox } from "../inbox.ts";
import { seeded } from "./chaos.ts";
import { failover, type FailoverReport } from "./failover.ts";
import { privatePostgres, startReceiver, type PrivatePostgres } from "./helpers.ts";

const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
// The standby retries a lost primary every 200 ms rather than PostgreSQL's 5 s, which it waits out before
// it acts on a promote: the short test measures the inbox, not that wait (npm run torture keeps the 5 s).
const FAST_PROMOTE = { wal_retrieve_retry_interval: "200ms" };

function describeRun(r: FailoverReport): string {
  return (
    `${r.acked} acknowledged, ${r.deliveries} stored and ${r.done} done, ${r.handledOrdered} ordered, lost ${r.lostAcked} acknowledged, ` +
    `doubled ${r.doubled}; no 200 for ${r.ackGapMs} ms (kill to 200: ${r.killToAckMs} ms, promote ${r.promoteMs} ms); ` +
    `${r.unavailable} answered 503, ${r.requestErrors} requests failed, ${r.duplicatesAfterKill} resent answered duplicate, ` +
    `${r.retriedHandlers} handlers run again`
  );
}

describe("a failover to a synchronous standby, under load, with no script restarted", { timeout: 300_000 }, () => {
  it(`loses no acknowledged delivery, records every payment once and keeps each key's order (seed ${seed})`, async (t) => {
    const r = await failover({
      synchronous: true,
      beforeS: 3,
      afterS: 3,
      stallMs: 500,
      senders: 4,
      keys: 4,
      random: seeded(seed),
      standby: FAST_PROMOTE,
    });
    if (typeof r === "string") return t.skip(r);
    console.log(`# failover, synchronous: ${describeRun(r)}`);
    assert.deepEqual(r.unexpectedExits, [], "no script exited: each carried on against the new primary");
    assert.deepEqual(r.idleAfter, [], "every receiver acknowledged, and every worker claimed, after the promotion");
    assert.ok(r.drained, JSON.stringify(r));
    assert.ok(r.acked > 0 && r.handledOrdered > 0, JSON.stringify(r));
    assert.deepEqual(r.lostAckedIds, [], "every acknowledged delivery is on the new primary, and done");
    assert.equal(r.lost, 0, "every done delivery has its payment");
    assert.equal(r.doubled, 0, "no payment recorded twice");
    assert.equal(r.balance, r.expected, "the balance is the sum of the stored amounts");
    assert.deepEqual(r.outOfOrder, [], "each key handled in event time, each delivery once");
    assert.ok(Number.isFinite(r.killToAckMs), "acknowledgements came back after the failover");
  });

  it("control: with an asynchronous standby, the same failover loses acknowledged deliveries", async (t) => {
    const r = await failover({
      synchronous: false,
      beforeS: 3,
      afterS: 2,
      stallMs: 500,
      senders: 4,
      keys: 4,
      random: seeded(seed + 1),
      standby: FAST_PROMOTE,
    });
    if (typeof r === "string") return t.skip(r);
    console.log(`# failover, asynchronous (control): ${describeRun(r)}`);
    assert.ok(r.lostAcked > 0, `the test sees a loss when commits do not wait for the standby: ${JSON.stringify(r)}`);
    assert.deepEqual(r.unexpectedExits, []);
  });
});

describe("a COMMIT that waits for a synchronous standby", { timeout: 120_000 }, () => {
  let primary: PrivatePostgres | undefined;
  let standby: PrivatePostgres | undefined;
  let skip: string | false = false;
  let inbox: Inbox;
  const app = `commit-wait-${process.pid}`;
  const url = () => `${primary!.url}?schema=commit_wait&application_name=${app}`;
  // A plain client beside the inbox, for pg_stat_activity, cancels, and the controls.
  let admin: import("pg").Client;

  before(async () => {
    const made = await privatePostgres({ settings: { synchronous_standby_names: "*" } });
    if (typeof made === "string") return void (skip = made);
    primary = made;
    standby = await primary.standby();
    inbox = await connect(url(), { retryJitter: 0 });
    const { default: pg } = await import("pg");
    admin = new pg.Client({ connectionString: primary.url });
    await admin.connect();
  });
  after(async () => {
    await inbox?.close().catch(() => {});
    await admin?.end().catch(() => {});
    await standby?.destroy();
    await primary?.destroy();
  });

  // waiting resolves with the backends of application name `name` that wait for the standby, once there are
  // `n`, or with none once `unless` is done (the statement it watches answered without waiting).
  const waiting = async (name: string, n = 1, unless = { done: false }): Promise<number[]> => {
    for (; !unless.done; ) {
      const { rows } = await admin.query(
        "SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND application_name = $1",
        [name],
      );
      if (rows.length >= n) return rows.map((r) => r.pid as number);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return [];
  };
  // withStandbyDown runs fn while the standby is stopped, so every commit on the primary waits for it.
  const withStandbyDown = async (fn: () => Promise<void>) => {
    await standby!.stop("fast");
    try {
      await fn();
    } finally {
      await standby!.start();
    }
  };
  const settled = (p: Promise<unknown>) => {
    const state = { done: false };
    p.then(
      () => (state.done = true),
      () => (state.done = true),
    );
    return state;
  };

  it("control: a cancelled wait answers COMMIT, with only a warning, though the standby has nothing", async (t) => {
    if (skip) return t.skip(skip);
    const { default: pg } = await import("pg");
    const plain = new pg.Client({ connectionString: `${primary!.url}?application_name=${app}-plain` });
    await plain.connect();
    try {
      await plain.query("CREATE TABLE IF NOT EXISTS control (x int)");
      await withStandbyDown(async () => {
        const warnings: string[] = [];
        plain.on("notice", (n) => warnings.push(n.message ?? ""));
        await plain.query("BEGIN");
        await plain.query("INSERT INTO control VALUES (1)");
        const commit = plain.query("COMMIT");
        await admin.query("SELECT pg_cancel_backend(pid) FROM unnest($1::int[]) AS pid", [
          await waiting(`${app}-plain`),
        ]);
        assert.equal((await commit).command, "COMMIT", "PostgreSQL answers success");
        assert.match(warnings.join(" "), /canceling wait for synchronous replication/);
      });
    } finally {
      await plain.end();
    }
  });

  it("fails the store when its wait is cancelled, and answers a copy only once the standby has it", async (t) => {
    if (skip) return t.skip(skip);
    const body = Buffer.from('{"amount":1}');
    let again: Promise<unknown> | undefined;
    await withStandbyDown(async () => {
      // The assertion holds the promise before the cancel, as the store may fail before the admin's query
      // returns, and an unheld rejection would fail the test on its own.
      const first = assert.rejects(
        inbox.store({ id: "cancelled", body }),
        /may not be on the standby: canceling wait for synchronous replication/,
      );
      await admin.query("SELECT pg_cancel_backend(pid) FROM unnest($1::int[]) AS pid", [await waiting(app)]);
      await first;
      const [row] = (await admin.query("SELECT status FROM commit_wait.deliveries WHERE id = 'cancelled'")).rows;
      assert.equal(row?.status, "received", "committed here all the same: the danger is real");
      // The sender sends it again: the copy waits for the standby too, rather than answer duplicate now.
      again = inbox.store({ id: "cancelled", body });
      const state = settled(again);
      assert.equal((await waiting(app, 1, state)).length, 1, "no answer while the standby lacks the stored copy");
      // Control: a plain duplicate check commits at once, standby or not.
      await admin.query(
        `INSERT INTO commit_wait.delivery_rows (source, id, body, body_sha256, received_at, status, available_at)
         VALUES ('default', 'cancelled', '\\x', '', 0, 'received', 0) ON CONFLICT DO NOTHING`,
      );
    });
    assert.equal(await again, "duplicate", "answered once the standby is back");
    const { default: pg } = await import("pg");
    const onStandby = new pg.Client({ connectionString: standby!.url });
    await onStandby.connect();
    try {
      for (
        let i = 0;
        (await onStandby.query("SELECT 1 FROM commit_wait.deliveries WHERE id = 'cancelled'")).rows.length === 0;
        i++
      ) {
        assert.ok(i < 500, "the standby has the delivery");
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    } finally {
      await onStandby.end();
    }
  });

  it("fails the finish when the connection is terminated while it waits, and carries on", async (t) => {
    if (skip) return t.skip(skip);
    await inbox.store({ id: "to-finish", body: Buffer.from("{}") });
    const lease = (await inbox.claimBatch(10, 60_000)).find((l) => l.id === "to-finish")!;
    await withStandbyDown(async () => {
      const finishing = assert.rejects(inbox.finish(lease), /terminat/);
      await admin.query("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", [await waiting(app)]);
      await finishing;
    });
    assert.equal(await inbox.store({ id: "after", body: Buffer.from("{}") }), "stored", "a new connection takes over");
  });

  it("a receiver answers 503 with Retry-After, never 200, for a store whose wait is cancelled", async (t) => {
    if (skip) return t.skip(skip);
    const name = `${app}-receiver`;
    const receiver = await startReceiver(`${primary!.url}?schema=commit_wait&application_name=${name}`, ["--quiet"]);
    try {
      await withStandbyDown(async () => {
        const answer = fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "over-http" }, body: "{}" });
        await admin.query("SELECT pg_cancel_backend(pid) FROM unnest($1::int[]) AS pid", [await waiting(name)]);
        const res = await answer;
        assert.equal(res.status, 503, await res.text());
        assert.ok(Number(res.headers.get("retry-after")) > 0);
      });
      assert.equal(receiver.child.exitCode, null, "the receiver carries on");
    } finally {
      await receiver.stop();
    }
  });

  it("is not cancelled by statement_timeout, and the inbox refuses ?query_timeout=, which would abandon it", async (t) => {
    if (skip) return t.skip(skip);
    await assert.rejects(
      connect(`${url()}&query_timeout=1000`),
      (e: Error) => e instanceof TypeError && /query_timeout/.test(e.message),
    );
    const name = `${app}-timeout`;
    const timed = await connect(`${primary!.url}?schema=commit_wait&application_name=${name}&statement_timeout=100`);
    try {
      await withStandbyDown(async () => {
        const storing = timed.store({ id: "timed", body: Buffer.from("{}") });
        const state = settled(storing);
        const [pid] = await waiting(name);
        // Three times the statement timeout, and it still waits for the standby.
        await new Promise((resolve) => setTimeout(resolve, 300));
        assert.equal(state.done, false, "statement_timeout did not end the wait");
        assert.deepEqual(await waiting(name), [pid]);
        await admin.query("SELECT pg_cancel_backend($1)", [pid]);
        await assert.rejects(storing, /may not be on the standby/);
      });
    } finally {
      await timed.close();
    }
  });
});
