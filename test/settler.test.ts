// test/settler.test.ts: the Settler (lib/lease/settler.ts) alone: each settlement an executor may return,
// written to a real SQLite file in a temp folder on a pinned clock and reported as one event; a write that
// meets a passing error goes again; whether a settlement may have made a delivery due. No lane runs here:
// test/lease.test.ts runs the settler inside lanes.
//   npx node --test test/settler.test.ts

import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, it } from "node:test";
import { type LaneEvent, type Settled, type Settlement, Settler, type Settling } from "../lib/lease/settler.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Lease } from "../lib/store.ts";
import { FakeClock } from "./clock.ts";
import { tempDir, until } from "./helpers.ts";

const body = Buffer.from(JSON.stringify({ customer: "Ann", amount: 5 }));
const paid = (rows: Record<string, unknown>[]) => rows.map((r) => r.id);

describe("Settler", () => {
  let dir: { dir: string; cleanup: () => void };
  let n = 0;
  before(() => void (dir = tempDir()));
  after(() => dir.cleanup());

  // open makes a fresh file, on a pinned clock, with deliveries stored and one claimed, and a settler on it.
  async function open(
    o: { maxAttempts?: number; orderKey?: string; busyTimeoutMs?: number; forMs?: number; onCommit?: () => void } = {},
  ) {
    const clock = new FakeClock();
    const path = join(dir.dir, `settle-${++n}.db`);
    const inbox = new SqliteInbox(path, {
      now: clock.wall,
      retryDelayMs: 1_000,
      retryJitter: 0,
      ...(o.maxAttempts ? { maxAttempts: o.maxAttempts } : {}),
      ...(o.busyTimeoutMs === undefined ? {} : { busyTimeoutMs: o.busyTimeoutMs }),
      ...(o.onCommit ? { onCommit: o.onCommit } : {}),
    });
    await inbox.query("CREATE TABLE paid (id TEXT PRIMARY KEY)");
    await inbox.store({ id: "evt_1", body, ...(o.orderKey ? { orderKey: o.orderKey } : {}) });
    const events: LaneEvent[] = [];
    const settler = new Settler({
      inbox,
      marks: inbox,
      listener: (event) => void events.push(event),
      destination: "handler",
      forMs: o.forMs ?? 1_000,
      minMs: 1,
      maxMs: 4,
      describe: (error) => `redacted: ${(error as Error).message}`,
    });
    const claim = async () => (await inbox.claimBatch(1, 60_000))[0]!;
    const row = async (id = "evt_1") => (await inbox.find(id))[0]!;
    return { clock, path, inbox, settler, events, claim, row };
  }
  const how: Settling = { ran: 3, cutOff: false, aborted: false };
  const settle = (s: Settler, lease: Lease, settlement: Settlement, h = how) => s.settle(lease, settlement, h);
  // What of an event a test compares: the rest is the lease and what the executor said.
  const said = ({ result, error, retryAt, paused, due }: Settled) => ({ result, error, retryAt, paused, due });

  it("writes a done mark with its writes, in one commit, and reports done once", async () => {
    const { inbox, settler, events, claim, row } = await open();
    try {
      const lease = await claim();
      const settled = await settle(settler, lease, {
        kind: "done",
        writes: [(tx) => tx.run("INSERT INTO paid (id) VALUES (?)", lease.id)],
      });
      assert.deepEqual(said(settled), {
        result: "done",
        error: undefined,
        retryAt: undefined,
        paused: undefined,
        due: false,
      });
      assert.deepEqual(events, [settled], "one event, the one settle() returns");
      assert.equal(settled.ran, 3);
      assert.equal((await row()).status, "done");
      assert.deepEqual(paid(await inbox.query("SELECT id FROM paid")), ["evt_1"]);
    } finally {
      await inbox.close();
    }
  });

  it("keeps each try in the attempt log in the commit that settles it: a retry's, then a done's; a stop's none", async () => {
    let commits = 0;
    const { inbox, settler, clock, claim } = await open({ onCommit: () => void commits++ });
    try {
      const log = async () =>
        (await inbox.attempts({ source: "default", id: "evt_1", receivedAt: 0 })).map((a) => [a.status, a.error, a.ms]);
      const first = await claim();
      commits = 0;
      await settle(settler, first, {
        kind: "retry",
        error: "HTTP 503 from app",
        attempt: { startedAt: clock.wall(), ms: 12, status: 503 },
      });
      assert.equal(commits, 1, "the failure and its try, one commit");
      await clock.advance(1_000);
      const second = await claim();
      // A retry a stop cut off says nothing of the delivery: given back, and no try kept.
      await settle(
        settler,
        second,
        { kind: "retry", error: "stopped", attempt: { startedAt: 0, ms: 1 } },
        { ...how, cutOff: true },
      );
      const third = await claim();
      commits = 0;
      await settle(settler, third, {
        kind: "done",
        attempt: { startedAt: clock.wall(), ms: 7, status: 200, body: "ok" },
      });
      assert.equal(commits, 1, "the done mark and its try, one commit");
      assert.deepEqual(await log(), [
        [503, "HTTP 503 from app", 12],
        [200, null, 7],
      ]);
    } finally {
      await inbox.close();
    }
  });

  it("a done whose lease was lost is reported lost, and its writes roll back with the mark", async () => {
    const { inbox, settler, claim, row } = await open();
    try {
      const lease = await claim();
      await inbox.query("UPDATE deliveries SET lease_token = 'taken over'");
      const settled = await settle(settler, lease, {
        kind: "done",
        writes: [(tx) => tx.run("INSERT INTO paid (id) VALUES (?)", lease.id)],
      });
      assert.equal(settled.result, "lost");
      assert.equal((await row()).status, "processing", "the other worker's, untouched");
      assert.deepEqual(paid(await inbox.query("SELECT id FROM paid")), []);
    } finally {
      await inbox.close();
    }
  });

  it("a done mark the store refuses is the try's failure: retried with the store's error, as describe() says it", async () => {
    const { clock, inbox, settler, claim, row } = await open();
    try {
      await inbox.query("INSERT INTO paid (id) VALUES ('evt_1')");
      const lease = await claim();
      const settled = await settle(settler, lease, {
        kind: "done",
        writes: [(tx) => tx.run("INSERT INTO paid (id) VALUES (?)", lease.id)],
      });
      assert.equal(settled.result, "retry");
      assert.match(settled.error!, /^redacted: .*UNIQUE constraint failed: paid\.id/);
      assert.equal(settled.retryAt, clock.wall() + 1_000);
      const r = await row();
      assert.deepEqual([r.status, r.attempts], ["received", 1], "nothing marked done that was not written");
    } finally {
      await inbox.close();
    }
  });

  it("a retry goes back in the queue after the backoff, or no sooner than the executor's afterMs; either may be due", async () => {
    const { clock, inbox, settler, claim, row } = await open();
    try {
      let settled = await settle(settler, await claim(), { kind: "retry", error: "HTTP 503 from app" });
      assert.deepEqual(said(settled), {
        result: "retry",
        error: "HTTP 503 from app",
        retryAt: clock.wall() + 1_000,
        paused: undefined,
        due: true,
      });
      await clock.advance(1_000);
      settled = await settle(settler, await claim(), { kind: "retry", error: "HTTP 429", afterMs: 60_000 });
      assert.equal(settled.retryAt, clock.wall() + 60_000, "Retry-After, past the backoff");
      assert.deepEqual([(await row()).status, (await row()).attempts], ["received", 2]);
    } finally {
      await inbox.close();
    }
  });

  it("a retry at the last attempt sets the delivery aside; a failed one sets it aside at once", async () => {
    const { inbox, settler, claim } = await open({ maxAttempts: 1 });
    try {
      await inbox.store({ id: "evt_2", body });
      const last = await settle(settler, await claim(), { kind: "retry", error: "timed out" });
      assert.deepEqual([last.result, last.due], ["failed", false]);
      const permanent = await settle(settler, await claim(), { kind: "failed", error: "HTTP 422" });
      assert.deepEqual([permanent.result, permanent.error], ["failed", "HTTP 422"]);
      assert.deepEqual((await inbox.list({ status: "failed" })).map((d) => [d.id, d.attempts, d.error]).sort(), [
        ["evt_1", 1, "timed out"],
        ["evt_2", 1, "HTTP 422"],
      ]);
    } finally {
      await inbox.close();
    }
  });

  it("held: pauses its destination before the lease goes back, no attempt spent; a second is no new pause", async () => {
    const { inbox, settler, claim, row } = await open();
    try {
      await inbox.store({ id: "evt_2", body });
      const first = await settle(settler, await claim(), { kind: "held", error: "HTTP 410 from app" });
      assert.deepEqual([first.result, first.paused], ["released", true]);
      assert.deepEqual(await inbox.claimBatch(1, 60_000), [], "nothing is claimed while paused");
      const state = (await inbox.destinations()).find((d) => d.name === "handler")!;
      assert.deepEqual([state.state, state.pausedReason], ["paused", "HTTP 410 from app"]);
      await inbox.resume("handler");
      const lease = await claim();
      await inbox.query("UPDATE destinations SET paused = 1 WHERE name = 'handler'");
      const second = await settle(settler, lease, { kind: "held", error: "HTTP 410 from app" });
      assert.deepEqual([second.result, second.paused], ["released", false]);
      const r = await row(lease.id);
      assert.deepEqual([r.status, r.attempts], ["received", 0]);
    } finally {
      await inbox.close();
    }
  });

  it("gives back a lease not started, and a retry a stop cut off, with no attempt spent; both may be due", async () => {
    const { inbox, settler, claim, row } = await open();
    try {
      const released = await settle(settler, await claim(), { kind: "released" }, { cutOff: false, aborted: false });
      assert.deepEqual([released.result, released.due, released.ran], ["released", true, undefined]);
      const cut = await settle(
        settler,
        await claim(),
        { kind: "retry", error: "forward to app stopped: the worker is stopping" },
        { ran: 9, cutOff: true, aborted: true },
      );
      assert.deepEqual([cut.result, cut.error, cut.cutOff], ["released", undefined, true]);
      const r = await row();
      assert.deepEqual([r.status, r.attempts, r.error], ["received", 0, null]);
    } finally {
      await inbox.close();
    }
  });

  it("says an ordered delivery's end may make the next of its key due, and an unordered one's done does not", async () => {
    const ordered = await open({ orderKey: "cus_1" });
    const plain = await open();
    try {
      const a = await settle(ordered.settler, await ordered.claim(), { kind: "done" });
      const b = await settle(plain.settler, await plain.claim(), { kind: "done" });
      assert.deepEqual([a.due, b.due], [true, false]);
    } finally {
      await ordered.inbox.close();
      await plain.inbox.close();
    }
  });

  it("writes again a mark that met a passing error (a lock held too long), saying so, until it goes", async () => {
    const { path, inbox, settler, events, claim, row } = await open({ busyTimeoutMs: 1 });
    const other = new DatabaseSync(path, { timeout: 1 });
    try {
      const lease = await claim();
      other.exec("BEGIN IMMEDIATE");
      // The other writer lets go once the settler has said its first try failed.
      const settling = settler.settle(lease, { kind: "done" }, how);
      await until("the first try's failure", () => events.some((e) => e.type === "write failed"));
      other.exec("COMMIT");
      const settled = await settling;
      assert.equal(settled.result, "done");
      const failed = events.filter((e) => e.type === "write failed");
      assert.ok(failed.length >= 1);
      assert.deepEqual(
        failed.map((e) => e.type === "write failed" && [e.what, e.lease?.id]),
        failed.map(() => ["write a done mark", "evt_1"]),
      );
      assert.equal((await row()).status, "done");
    } finally {
      other.close();
      await inbox.close();
    }
  });

  it("a control: a lock held past the lease's time leaves it unsettled, reported, and settle() still resolves", async () => {
    const { path, inbox, settler, claim, row } = await open({ busyTimeoutMs: 1, forMs: 30 });
    const other = new DatabaseSync(path, { timeout: 1 });
    try {
      const lease = await claim();
      other.exec("BEGIN IMMEDIATE");
      const settled = await settler.settle(lease, { kind: "retry", error: "HTTP 500" }, how);
      other.exec("ROLLBACK");
      assert.equal(settled.result, "unsettled");
      assert.match(String(settled.unsettled), /locked|busy/i);
      assert.equal((await row()).status, "processing", "it goes again when its lease runs out");
    } finally {
      other.close();
      await inbox.close();
    }
  });

  it("waits for what the listener returns before settle() resolves", async () => {
    const clock = new FakeClock();
    const path = join(dir.dir, "listener.db");
    const inbox = new SqliteInbox(path, { now: clock.wall });
    try {
      await inbox.store({ id: "evt_1", body });
      let counted = false;
      const settler = new Settler({
        inbox,
        marks: inbox,
        listener: async (event) => {
          if (event.type !== "settled") return;
          await clock.sleep(1_000);
          counted = true;
        },
        forMs: 1_000,
        minMs: 1,
        maxMs: 4,
      });
      let resolved = false;
      const settling = settler
        .settle((await inbox.claimBatch(1))[0]!, { kind: "retry", error: "x" }, how)
        .then(() => void (resolved = true));
      await clock.advance(999);
      assert.equal(resolved, false, "the breaker's tally, say, is still being written");
      await clock.advance(1);
      await settling;
      assert.equal(counted, true);
    } finally {
      await inbox.close();
    }
  });
});
