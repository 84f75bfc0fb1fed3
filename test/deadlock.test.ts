// test/deadlock.test.ts: two workers' lease ops on PostgreSQL cannot wait on each other (docs/postgres.md,
// "Locks, in one order"). A test connection holds one row locked so that each side's batch stops at a
// chosen point, and the interleaving that deadlocked before is played exactly, not hoped for. The control
// plays it with the statements as they were (extend locking by (source, id), in the order queued) and
// must get PostgreSQL's 40P01. Skipped in one line without a server.

import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";
import pg from "pg";
import { connect } from "../inbox.ts";
import type { Inbox, Lease } from "../lib/store.ts";
import { freshSchema, POSTGRES, postgresSkip } from "./helpers.ts";

const skip = await postgresSkip();
const LEASE = 60_000;
const body = Buffer.from("{}");

describe("lease ops of two workers on PostgreSQL", { skip }, () => {
  let schema: Awaited<ReturnType<typeof freshSchema>>;
  let a: Inbox;
  let b: Inbox;
  let clients: pg.Client[];
  const client = async () => {
    const c = new pg.Client({ connectionString: POSTGRES, options: `-c search_path=${schema.schema}` });
    await c.connect();
    clients.push(c);
    return c;
  };
  // Deliveries x and y go to destinations a and b; z to a alone. Worker A holds x, y and z's leases at a,
  // worker B x and y's at b: the two hold different rows of the same deliveries, as two lanes do.
  const setUp = async () => {
    a = await connect(schema.url);
    b = await connect(schema.url);
    for (const id of ["x", "y"]) await a.store({ id, body, destinations: ["a", "b"] });
    await a.store({ id: "z", body, destinations: ["a"] });
    const atA = new Map((await a.claimBatch(10, LEASE, { destination: "a" })).map((l) => [l.id, l]));
    const atB = new Map((await b.claimBatch(10, LEASE, { destination: "b" })).map((l) => [l.id, l]));
    assert.deepEqual(
      [[...atA.keys()].sort(), [...atB.keys()].sort()],
      [
        ["x", "y", "z"],
        ["x", "y"],
      ],
    );
    return { atA, atB };
  };
  beforeEach(async () => {
    schema = await freshSchema("deadlock");
    clients = [];
  });
  afterEach(async () => {
    for (const c of clients) await c.end().catch(() => {});
    await a?.close();
    await b?.close();
    await schema.drop();
  });

  // waitFor polls until what returns true, the server's lock table being the only clock here.
  const waitFor = async (what: () => Promise<boolean>, why: string) => {
    for (let i = 0; i < 2_000; i++) {
      if (await what()) return;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    throw new Error(`waited 10 s for ${why}`);
  };
  const blockedBy = async (observer: pg.Client, pid: number) =>
    (await observer.query("SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", [pid])).rows.map(
      (r) => r.pid as number,
    );

  it("lets one worker's heartbeat and failures run beside another's on the same deliveries, with no 40P01", async () => {
    const { atA, atB } = await setUp();
    const gate = await client();
    const observer = await client();
    const gatePid = (await gate.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
    // The gate holds z's row, so A's batch stops at z, after whatever it locked before.
    await gate.query("BEGIN");
    await gate.query("SELECT 1 FROM delivery_rows WHERE id = 'z' FOR UPDATE");
    const sideA = Promise.allSettled([
      a.extend(atA.get("y")!, LEASE),
      a.fail(atA.get("z")!, "z failed"),
      a.fail(atA.get("x")!, "x failed"),
    ]);
    await waitFor(async () => (await blockedBy(observer, gatePid)).length === 1, "A's batch to wait on the gate");
    const [aPid] = await blockedBy(observer, gatePid);
    // B's batch runs while A's waits: it finishes, or it waits on A (the deadlock's first half).
    let bDone = false;
    const sideB = Promise.allSettled([b.extend(atB.get("x")!, LEASE), b.fail(atB.get("y")!, "y failed")]).finally(
      () => (bDone = true),
    );
    await waitFor(
      async () => bDone || (await blockedBy(observer, aPid!)).length > 0,
      "B's batch to finish or wait on A",
    );
    await gate.query("COMMIT");
    const results = [...(await sideA), ...(await sideB)];
    const rejected = results
      .filter((r) => r.status === "rejected")
      .map((r) => String((r as PromiseRejectedResult).reason));
    assert.deepEqual(rejected, [], "no op failed");
    assert.deepEqual(
      results.map(
        (r) =>
          (r as PromiseFulfilledResult<unknown>).value !== undefined &&
          (r as PromiseFulfilledResult<unknown>).value !== false,
      ),
      [true, true, true, true, true],
      "every lease still held and every failure recorded",
    );
  });

  // The done marks' statements go out behind the batch's lock statement without waiting for it: the
  // server still takes the locks first, and when the lock fails the batch fails with the lock's own error,
  // not the "current transaction is aborted" that the done marks behind it then meet.
  it("fails a batch of done marks whose lock is cancelled with the lock's error, and takes none of its rows", async () => {
    const { atA } = await setUp();
    const gate = await client();
    const observer = await client();
    const gatePid = (await gate.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
    await gate.query("BEGIN");
    await gate.query("SELECT 1 FROM delivery_rows WHERE id = 'z' FOR UPDATE");
    const marks = Promise.allSettled(["x", "y", "z"].map((id) => a.finish(atA.get(id)!)));
    await waitFor(async () => (await blockedBy(observer, gatePid)).length > 0, "A's lock to wait on the gate");
    const [waiting] = await blockedBy(observer, gatePid);
    // What waits on the gate is the lock statement: the done marks' UPDATE has not begun.
    const { rows } = await observer.query("SELECT query FROM pg_stat_activity WHERE pid = $1", [waiting]);
    assert.match(rows[0].query, /FOR NO KEY UPDATE OF d/);
    await observer.query("SELECT pg_cancel_backend($1)", [waiting]);
    const settled = await marks;
    await gate.query("ROLLBACK");
    for (const mark of settled) {
      assert.equal(mark.status, "rejected");
      const reason = (mark as PromiseRejectedResult).reason as Error;
      assert.match(reason.message, /cancel/i, `the lock's error: ${reason.message}`);
      assert.doesNotMatch(reason.message, /current transaction is aborted/);
    }
    const statuses = await observer.query("SELECT id, status FROM delivery_rows WHERE destination = 'a' ORDER BY id");
    assert.deepEqual(
      statuses.rows.map((r) => `${r.id} ${r.status}`),
      ["x processing", "y processing", "z processing"],
      "no done mark of the batch was written",
    );
  });

  it("control: with extend locking by (source, id), as it did, the same interleaving deadlocks", async () => {
    const { atA, atB } = await setUp();
    const gate = await client();
    const observer = await client();
    const [sideA, sideB] = [await client(), await client()];
    const pidOf = async (c: pg.Client) => (await c.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
    const [gatePid, aPid] = [await pidOf(gate), await pidOf(sideA)];
    // The statements as they were before this change: extend locks every route's row of the delivery.
    const extend = (c: pg.Client, l: Lease) =>
      c.query(
        `WITH l AS (SELECT source, id FROM delivery_rows WHERE source = $1 AND id = $2 FOR UPDATE SKIP LOCKED)
       UPDATE delivery_rows d SET leased_until = leased_until + 1 FROM l WHERE d.source = l.source AND d.id = l.id AND d.lease_token = $3`,
        [l.source, l.id, l.token],
      );
    const fail = (c: pg.Client, l: Lease) =>
      c.query(
        "UPDATE delivery_rows SET status = 'received', lease_token = NULL WHERE source = $1 AND id = $2 AND lease_token = $3",
        [l.source, l.id, l.token],
      );
    await gate.query("BEGIN");
    await gate.query("SELECT 1 FROM delivery_rows WHERE id = 'z' FOR UPDATE");
    const runA = (async () => {
      await sideA.query("BEGIN");
      await extend(sideA, atA.get("y")!);
      await fail(sideA, atA.get("z")!);
      await fail(sideA, atA.get("x")!);
      await sideA.query("COMMIT");
    })();
    await waitFor(async () => (await blockedBy(observer, gatePid)).length === 1, "A to wait on the gate");
    const runB = (async () => {
      await sideB.query("BEGIN");
      await extend(sideB, atB.get("x")!);
      await fail(sideB, atB.get("y")!);
      await sideB.query("COMMIT");
    })();
    await waitFor(async () => (await blockedBy(observer, aPid)).length > 0, "B to wait on A");
    await gate.query("COMMIT");
    const results = await Promise.allSettled([runA, runB]);
    const codes = results.map((r) => (r.status === "rejected" ? (r.reason as { code?: string }).code : "ok"));
    assert.ok(codes.includes("40P01"), `one side is chosen as the deadlock's victim (got ${codes.join(", ")})`);
  });
});
