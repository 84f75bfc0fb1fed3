// test/inbox.test.ts: the store's contract on a real SQLite file, with the clock pinned instead of slept:
// store, claim, leases and their takeover, fencing, exactly-once local writes, backoff and giving up.

import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterEach, beforeEach, describe, it } from "node:test";
import { DEFAULTS } from "../lib/defaults.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Lease, Tx } from "../lib/store.ts";
import { sha256 } from "../lib/rows.ts";
import { backoff } from "../lib/timing.ts";
import { tempDir } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const LEASE = 60_000;
const body = (event: unknown) => Buffer.from(JSON.stringify(event));

// Each test gets a fresh database file and a clock it moves by hand. Two SqliteInbox objects on the same
// file stand for two workers: separate connections, one shared clock.
let dir: { dir: string; cleanup: () => void };
let path: string;
let t: number;
let opened: SqliteInbox[];
const open = (options: ConstructorParameters<typeof SqliteInbox>[1] = {}) => {
  const inbox = new SqliteInbox(path, { now: () => t, random: () => 0, ...options });
  opened.push(inbox);
  return inbox;
};
const row = (id: string, source = "default") => {
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    return db.prepare("SELECT * FROM deliveries WHERE source = ? AND id = ?").get(source, id) as
      | Record<string, unknown>
      | undefined;
  } finally {
    db.close();
  }
};

beforeEach(() => {
  dir = tempDir();
  path = join(dir.dir, "inbox.db");
  t = T0;
  opened = [];
});
afterEach(async () => {
  for (const inbox of opened) await inbox.close();
  dir.cleanup();
});

describe("openDatabase()", () => {
  it("runs in WAL mode with synchronous=FULL and a busy timeout", () => {
    const inbox = open();
    const get = (sql: string) => Object.values(inbox.db.prepare(sql).get()!)[0];
    assert.equal(get("PRAGMA journal_mode"), "wal");
    assert.equal(get("PRAGMA synchronous"), 2); // FULL
    assert.equal(get("PRAGMA busy_timeout"), DEFAULTS.busyTimeoutMs);
  });

  it("migrates a new file once: opening it again changes nothing", async () => {
    const first = open();
    await first.store({ id: "evt_1", body: body({}) });
    const version = (first.db.prepare("PRAGMA user_version").get() as { user_version: number }).user_version;
    assert.ok(version >= 1);
    const second = open();
    assert.equal((second.db.prepare("PRAGMA user_version").get() as { user_version: number }).user_version, version);
    assert.equal((await second.find("evt_1")).length, 1);
  });

  it("refuses a database from a newer version of the code", async () => {
    const db = new DatabaseSync(path);
    db.exec("PRAGMA user_version = 999");
    db.close();
    assert.throws(() => open(), /schema version 999 is newer than this code knows/);
  });

  it("has partial indexes that serve the claim's two lookups, so its cost does not grow with the table", () => {
    const inbox = open();
    const plan = (sql: string) =>
      (inbox.db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(T0) as { detail: string }[]).map((p) => p.detail).join("\n");
    // Each claim takes one destination's deliveries: its slice of each index, however many others wait.
    assert.match(
      plan(
        "SELECT rowid FROM deliveries WHERE destination = 'handler' AND status = 'received' AND order_key IS NULL AND available_at <= ? ORDER BY available_at LIMIT 1",
      ),
      /USING (COVERING )?INDEX deliveries_due \(destination=\? AND available_at<\?\)/,
    );
    assert.match(
      plan(
        "SELECT rowid FROM deliveries WHERE destination = 'handler' AND status = 'processing' AND leased_until <= ? ORDER BY leased_until LIMIT 1",
      ),
      /USING (COVERING )?INDEX deliveries_leased \(destination=\? AND leased_until<\?\)/,
    );
    // Ordering: the idle keys' heads by due time, and a key's next head in event time.
    assert.match(
      plan("SELECT source, order_key FROM order_keys WHERE destination = 'handler' AND due <= ? ORDER BY due LIMIT 1"),
      /USING (COVERING )?INDEX order_keys_due \(destination=\? AND due<\?\)/,
    );
    assert.match(
      plan(`SELECT id FROM deliveries WHERE source = 'a' AND destination = 'handler' AND order_key = 'k' AND status = 'received' AND ? > 0
                       ORDER BY event_time, rowid LIMIT 1`),
      /USING (COVERING )?INDEX deliveries_ordered \(source=\? AND destination=\? AND order_key=\?\)$/,
    );
  });
});

describe("store()", () => {
  it("stores a new delivery once and reports every later copy as a duplicate", async () => {
    const inbox = open();
    assert.equal(await inbox.store({ id: "evt_1", body: body({ a: 1 }) }), "stored");
    assert.equal(await inbox.store({ id: "evt_1", body: body({ a: 1 }) }), "duplicate");
    const r = row("evt_1")!;
    assert.equal(r.status, "received");
    assert.equal(r.conflicts, 0);
    assert.equal(r.body_sha256, sha256(body({ a: 1 })));
  });

  it("keeps the first copy when a duplicate's body differs, and counts the conflict", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: body({ a: 1 }) });
    assert.equal(await inbox.store({ id: "evt_1", body: body({ a: 2 }) }), "conflict");
    assert.deepEqual(Buffer.from(row("evt_1")!.body as Uint8Array), body({ a: 1 }));
    const status = await inbox.status();
    assert.deepEqual(status.conflicts, { deliveries: 1, copies: 1 });
  });

  it("keys deliveries by source and ID, so two sources may share an ID", async () => {
    const inbox = open();
    assert.equal(await inbox.store({ source: "github", id: "1", body: body({}) }), "stored");
    assert.equal(await inbox.store({ source: "stripe", id: "1", body: body({}) }), "stored");
    assert.equal((await inbox.find("1")).length, 2);
  });

  it("keeps the body byte-exact, bytes that are not UTF-8 included", async () => {
    const inbox = open();
    const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i)); // 0x80-0xff alone are invalid UTF-8
    await inbox.store({ id: "evt_bin", body: bytes });
    assert.deepEqual(Buffer.from(row("evt_bin")!.body as Uint8Array), bytes);
    assert.deepEqual((await inbox.find("evt_bin"))[0]!.body, bytes);
  });
});

describe("claim()", () => {
  it("returns undefined when nothing is due", async () => {
    assert.equal(await open().claim(), undefined);
  });

  it("takes the oldest due delivery first, leases it and counts the attempt", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_old", body: body({}) });
    t += 1;
    await inbox.store({ id: "evt_new", body: body({}) });
    const lease = (await inbox.claim(LEASE))!;
    assert.equal(lease.id, "evt_old");
    assert.equal(lease.attempts, 1);
    assert.equal(lease.leasedUntil, t + LEASE);
    assert.match(lease.token, /^[0-9a-f]{24}$/);
    assert.equal(row("evt_old")!.status, "processing");
  });

  it("never hands one delivery to two workers while the lease holds", async () => {
    const a = open();
    const b = open();
    await a.store({ id: "evt_1", body: body({}) });
    assert.ok(await a.claim(LEASE));
    t += LEASE - 1;
    assert.equal(await b.claim(LEASE), undefined);
  });

  it("lets another worker take over once the lease expires, with a fresh token and one more attempt", async () => {
    const a = open();
    const b = open();
    await a.store({ id: "evt_1", body: body({}) });
    const first = (await a.claim(LEASE))!;
    t += LEASE;
    const second = (await b.claim(LEASE))!;
    assert.equal(second.id, "evt_1");
    assert.equal(second.attempts, 2);
    assert.notEqual(second.token, first.token);
  });

  it("holds a delivery that failed until its retry is due", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: body({}) });
    const outcome = await inbox.fail((await inbox.claim())!, "boom");
    assert.deepEqual(outcome, { status: "received", retryAt: T0 + 2_000 });
    t = T0 + 1_999;
    assert.equal(await inbox.claim(), undefined);
    t = T0 + 2_000;
    assert.equal((await inbox.claim())?.attempts, 2);
  });

  it("sets aside as failed a delivery whose expired lease had used the last attempt", async () => {
    const inbox = open({ maxAttempts: 2 });
    await inbox.store({ id: "evt_1", body: body({}) });
    assert.equal((await inbox.claim(LEASE))?.attempts, 1);
    t += LEASE; // the worker vanished
    assert.equal((await inbox.claim(LEASE))?.attempts, 2);
    t += LEASE; // and so did the one that took over
    assert.equal(await inbox.claim(LEASE), undefined);
    const r = row("evt_1")!;
    assert.equal(r.status, "failed");
    assert.equal(r.lease_token, null);
    assert.match(String(r.error), /lease expired on the last attempt/);
    assert.equal(r.finished_at, t);
  });

  it("claims at most the batch it is asked for, each delivery once", async () => {
    const inbox = open();
    for (let i = 0; i < 5; i++) await inbox.store({ id: `evt_${i}`, body: body({}) });
    const first = await inbox.claimBatch(3, LEASE);
    const rest = await inbox.claimBatch(3, LEASE);
    assert.deepEqual(
      first.map((l) => l.id),
      ["evt_0", "evt_1", "evt_2"],
    );
    assert.deepEqual(
      rest.map((l) => l.id),
      ["evt_3", "evt_4"],
    );
  });
});

describe("fencing", () => {
  // A stale lease: claimed by a, expired, then taken over by b.
  async function stale(): Promise<{ a: SqliteInbox; b: SqliteInbox; old: Lease; current: Lease }> {
    const a = open();
    const b = open();
    await a.store({ id: "evt_1", body: body({}) });
    const old = (await a.claim(LEASE))!;
    t += LEASE;
    const current = (await b.claim(LEASE))!;
    return { a, b, old, current };
  }

  it("a stale token cannot finish, fail, extend or release; the current one can still finish", async () => {
    const { a, b, old, current } = await stale();
    assert.equal(await a.finish(old), false);
    assert.equal(await a.fail(old, "late failure"), undefined);
    assert.equal(await a.fail(old, "late failure", { permanent: true }), undefined);
    assert.equal(await a.extend(old, LEASE), false);
    assert.equal(await a.release(old), false);
    const r = row("evt_1")!;
    assert.equal(r.status, "processing");
    assert.equal(r.lease_token, current.token);
    assert.equal(r.leased_until, current.leasedUntil);
    assert.equal(r.error, null);
    assert.equal(await b.finish(current), true);
    assert.equal(row("evt_1")!.status, "done");
  });

  it("control: the same calls with the current token do take effect", async () => {
    // Proves the test above would notice if the token were not checked: each call here changes the row.
    const { b, current } = await stale();
    t += 1;
    assert.equal(await b.extend(current, LEASE), true);
    assert.equal(row("evt_1")!.leased_until, t + LEASE);
    assert.equal(await b.release(current), true);
    assert.equal(row("evt_1")!.status, "received");
  });

  it("a lease extended in time is not taken over", async () => {
    const a = open();
    const b = open();
    await a.store({ id: "evt_1", body: body({}) });
    const lease = (await a.claim(LEASE))!;
    t += LEASE - 1;
    assert.equal(await a.extend(lease, LEASE), true);
    t += LEASE - 1;
    assert.equal(await b.claim(LEASE), undefined);
    assert.equal(await a.finish(lease), true);
  });
});

describe("finish()", () => {
  const ledger = (db: DatabaseSync) =>
    db.exec("CREATE TABLE IF NOT EXISTS ledger (key TEXT PRIMARY KEY, amount INTEGER)");
  const pay = (key: string) => (tx: Tx) => tx.run("INSERT INTO ledger VALUES (?, 1)", key);
  const ledgerRows = () => {
    const db = new DatabaseSync(path, { readOnly: true });
    try {
      return (db.prepare("SELECT key FROM ledger").all() as { key: string }[]).map((r) => r.key);
    } finally {
      db.close();
    }
  };

  it("applies the handler's writes exactly once when the lease is lost mid-handler", async () => {
    const a = open();
    const b = open();
    ledger(a.db);
    await a.store({ id: "evt_1", body: body({}) });
    const slow = (await a.claim(LEASE))!;
    // The slow handler is still working when its lease runs out and b takes the delivery over.
    t += LEASE;
    const fast = (await b.claim(LEASE))!;
    assert.equal(await b.finish(fast, [pay("default:evt_1")]), true);
    assert.equal(await a.finish(slow, [pay("default:evt_1-late")]), false);
    assert.deepEqual(ledgerRows(), ["default:evt_1"]);
  });

  it("rolls back the done mark with a write that throws, without touching its batch-mates", async () => {
    const inbox = open();
    ledger(inbox.db);
    await inbox.store({ id: "evt_bad", body: body({}) });
    await inbox.store({ id: "evt_good", body: body({}) });
    const [bad, good] = await inbox.claimBatch(2, LEASE);
    // Both finishes are queued in the same tick, so they share one transaction.
    const results = await Promise.allSettled([
      inbox.finish(bad!, [
        pay("k1"),
        () => {
          throw new Error("the ledger refused");
        },
      ]),
      inbox.finish(good!, [pay("k2")]),
    ]);
    assert.equal(results[0].status, "rejected");
    assert.match(String((results[0] as PromiseRejectedResult).reason), /the ledger refused/);
    assert.deepEqual(results[1], { status: "fulfilled", value: true });
    assert.deepEqual(ledgerRows(), ["k2"]);
    assert.equal(row("evt_bad")!.status, "processing");
    assert.equal(row("evt_good")!.status, "done");
  });

  it("commits the writes of the finishes before and after a failing one exactly once", async () => {
    const inbox = open();
    ledger(inbox.db);
    for (const id of ["evt_1", "evt_bad", "evt_3"]) await inbox.store({ id, body: body({}) });
    const [first, bad, last] = await inbox.claimBatch(3, LEASE);
    // One transaction: the bad finish fails after its done mark and a write have run, between two good ones.
    const results = await Promise.allSettled([
      inbox.finish(first!, [pay("k1")]),
      inbox.finish(bad!, [
        pay("k2"),
        () => {
          throw new Error("the ledger refused");
        },
      ]),
      inbox.finish(last!, [pay("k3")]),
    ]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["fulfilled", "rejected", "fulfilled"],
    );
    assert.deepEqual(ledgerRows(), ["k1", "k3"]);
    assert.deepEqual(
      ["evt_1", "evt_bad", "evt_3"].map((id) => row(id)!.status),
      ["done", "processing", "done"],
    );
  });
});

describe("group commit", () => {
  it("refuses alone a delivery too big for the disk; the others in its batch are stored", async () => {
    const inbox = open();
    // A full disk, on the inbox's own connection: the file may not grow past its current size plus a bit.
    const pages = (inbox.db.prepare("PRAGMA page_count").get() as { page_count: number }).page_count;
    inbox.db.exec(`PRAGMA max_page_count = ${pages + 4}`);
    const big = Buffer.alloc(64 * 1024, 1);
    // Queued in one tick, so they start out in one transaction.
    const results = await Promise.allSettled([
      inbox.store({ id: "evt_small_1", body: body({}) }),
      inbox.store({ id: "evt_big", body: big }),
      inbox.store({ id: "evt_small_2", body: body({}) }),
    ]);
    assert.deepEqual(
      results.map((r) => r.status),
      ["fulfilled", "rejected", "fulfilled"],
    );
    assert.match(String((results[1] as PromiseRejectedResult).reason), /full/);
    assert.equal(row("evt_big"), undefined);
    assert.ok(row("evt_small_1") && row("evt_small_2"));
  });

  it("gives up a batch once when another writer holds the lock, instead of once per half", async () => {
    const inbox = open({ busyTimeoutMs: 0 });
    const other = new DatabaseSync(path);
    let begins = 0;
    const exec = inbox.db.exec.bind(inbox.db);
    inbox.db.exec = (sql: string) => {
      if (/^BEGIN/.test(sql)) begins++;
      return exec(sql);
    };
    other.exec("BEGIN IMMEDIATE");
    try {
      // Every attempt waits out the whole busy timeout (5 s by default), so retrying 8 stores in halves
      // would wait 15 timeouts.
      const results = await Promise.allSettled(
        Array.from({ length: 8 }, (_, i) => inbox.store({ id: `evt_${i}`, body: body({}) })),
      );
      assert.ok(results.every((r) => r.status === "rejected" && /locked/.test(String(r.reason))));
      assert.equal(begins, 1);
    } finally {
      other.exec("ROLLBACK");
      other.close();
    }
    // Control: the lock gone, the same stores commit, together.
    begins = 0;
    await Promise.all(Array.from({ length: 8 }, (_, i) => inbox.store({ id: `evt_${i}`, body: body({}) })));
    assert.equal(begins, 1);
  });

  // The receiver's stores wait for a worker's or a purge's commit in another process. The lock's holder here is
  // a connection of this same thread, let go by a timer: a wait that stopped the event loop would never let
  // it fire, and the stores would fail at the busy timeout (the control: the old wait in begin(), which is
  // still what a batch retried in halves uses).
  it("waits for another writer's lock without stopping the event loop, and what is queued meanwhile joins the batch", async () => {
    const commits: number[] = [];
    const inbox = open({ busyTimeoutMs: 2_000, onCommit: (size) => commits.push(size) });
    const other = new DatabaseSync(path);
    other.exec("BEGIN IMMEDIATE");
    try {
      const first = inbox.store({ id: "evt_first", body: body({}) });
      // The stores below queue only if this timer fires while the first one waits for the lock.
      await new Promise((resolve) => setTimeout(resolve, 50));
      const later = Array.from({ length: 5 }, (_, i) => inbox.store({ id: `evt_later_${i}`, body: body({}) }));
      other.exec("COMMIT");
      await Promise.all([first, ...later]);
      assert.deepEqual(commits, [6], "one commit for the store that waited and the five queued behind it");
      // The control: the synchronous wait, as every batch had it, blocks this thread until the busy timeout.
      other.exec("BEGIN IMMEDIATE");
      const begin = (inbox as unknown as { begin(ms: number): void }).begin.bind(inbox);
      const started = performance.now();
      const letGo = setTimeout(() => other.exec("COMMIT"), 10);
      assert.throws(() => begin(300), /locked/);
      assert.ok(performance.now() - started >= 300, "the timer that lets the lock go could not fire");
      clearTimeout(letGo);
    } finally {
      if (other.isTransaction) other.exec("ROLLBACK");
      other.close();
    }
  });
});

describe("fail() and backoff()", () => {
  const opts = { retryDelayMs: 2_000, retryCapMs: 3_600_000, retryJitter: 0.2 };

  it("doubles the wait from 2 s: 2, 4, 8, 16 s", () => {
    const waits = [1, 2, 3, 4].map((attempts) => backoff(attempts, { ...opts, random: () => 0 }));
    assert.deepEqual(waits, [2_000, 4_000, 8_000, 16_000]);
  });

  it("adds at most 20% jitter, never less than the base wait", () => {
    for (const r of [0, 0.25, 0.5, 0.999999]) {
      const wait = backoff(3, { ...opts, random: () => r });
      assert.ok(wait >= 8_000 && wait <= 9_600, `jitter ${r} gave ${wait}`);
    }
    assert.equal(backoff(3, { ...opts, random: () => 0.5 }), 8_800);
  });

  it("caps the wait, jitter included", () => {
    assert.equal(backoff(12, { ...opts, random: () => 0 }), 3_600_000); // 2 s * 2^11 = 68 min
    assert.equal(backoff(60, { ...opts, random: () => 0.99 }), 3_600_000);
  });

  it("schedules each retry on that schedule, then sets the delivery aside after the last attempt", async () => {
    let r = 0.5;
    const inbox = open({ maxAttempts: 4, random: () => r });
    await inbox.store({ id: "evt_1", body: body({}) });
    const due: number[] = [];
    for (let attempt = 1; attempt <= 3; attempt++) {
      const lease = (await inbox.claim(LEASE))!;
      assert.equal(lease.attempts, attempt);
      const outcome = await inbox.fail(lease, `boom ${attempt}`);
      assert.equal(outcome?.status, "received");
      due.push((outcome as { retryAt: number }).retryAt - t);
      t = (outcome as { retryAt: number }).retryAt;
      r = 0;
    }
    assert.deepEqual(due, [2_200, 4_000, 8_000]);
    const last = (await inbox.claim(LEASE))!;
    assert.equal(last.attempts, 4);
    assert.deepEqual(await inbox.fail(last, "boom 4"), { status: "failed" });
    const rowAfter = row("evt_1")!;
    assert.equal(rowAfter.status, "failed");
    assert.equal(rowAfter.error, "boom 4");
    assert.equal(rowAfter.attempts, 4);
    assert.equal(rowAfter.finished_at, t);
    t += 10 * 3_600_000;
    assert.equal(await inbox.claim(LEASE), undefined);
  });

  it("caps a real retry at retryCapMs", async () => {
    const inbox = open({ maxAttempts: 10, retryCapMs: 5_000, random: () => 0.99 });
    await inbox.store({ id: "evt_1", body: body({}) });
    const waits: number[] = [];
    for (let i = 0; i < 4; i++) {
      const outcome = (await inbox.fail((await inbox.claim(LEASE))!, "boom")) as { retryAt: number };
      waits.push(outcome.retryAt - t);
      t = outcome.retryAt;
    }
    assert.deepEqual(waits, [2_396, 4_792, 5_000, 5_000]);
  });

  it("sets a permanent failure aside at once, on the first attempt", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: body({}) });
    assert.deepEqual(await inbox.fail((await inbox.claim())!, "bad customer", { permanent: true }), {
      status: "failed",
    });
    const r = row("evt_1")!;
    assert.equal(r.status, "failed");
    assert.equal(r.attempts, 1);
  });
});

describe("release() and retry()", () => {
  it("release hands a delivery back due now, without spending its attempt", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: body({}) });
    assert.equal(await inbox.release((await inbox.claim())!), true);
    assert.equal((await inbox.claim())?.attempts, 1);
  });

  it("retry puts a failed delivery back with its attempts reset, and leaves others alone", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: body({}) });
    await inbox.store({ id: "evt_2", body: body({}) });
    await inbox.fail((await inbox.claim())!, "nope", { permanent: true });
    assert.equal(await inbox.retry({ id: "evt_2" }), 0); // not failed: untouched
    assert.equal(await inbox.retry({ id: "evt_1" }), 1);
    const r = row("evt_1")!;
    assert.equal(r.status, "received");
    assert.equal(r.attempts, 0);
    assert.equal(r.error, null);
    assert.equal(await inbox.retry({ allFailed: true }), 0);
  });
});

describe("SqliteInbox options", () => {
  it("throws a TypeError that says what it expected", () => {
    assert.throws(() => new SqliteInbox(path, { maxAttempts: -1 }), {
      name: "TypeError",
      message: /maxAttempts to be a number >= 0, got -1/,
    });
    assert.throws(() => new SqliteInbox(path, { now: 5 as unknown as () => number }), {
      name: "TypeError",
      message: /now to be a function/,
    });
  });
});
