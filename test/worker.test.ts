// test/worker.test.ts: run() and worker.ts. Draining, concurrency, failures, a lease lost mid-handler,
// graceful shutdown of a real worker process, and a worker killed with -9 whose delivery is taken over.

import assert from "node:assert/strict";
import type { ChildProcess } from "node:child_process";
import { constants, existsSync, readdirSync, readFileSync, readlinkSync, realpathSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { DatabaseSync } from "node:sqlite";
import { after, afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { type Inbox, PermanentError } from "../lib/store.ts";
import { ensurePayments, recordPayment, run, type Job } from "../worker.ts";
import { freshSchema, holdThreadPool, postgresSkip, runScript, spawnScript, tempDir, turns, until } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const DAY = 86_400_000;
const LEASE = 60_000;
const payment = (customer = "Maria Lopez", amount = 24.99) => Buffer.from(JSON.stringify({ customer, amount }));

let dir: { dir: string; cleanup: () => void };
let path: string;
let t: number;
let opened: SqliteInbox[];
const open = (options: ConstructorParameters<typeof SqliteInbox>[1] = {}) => {
  const inbox = new SqliteInbox(path, { now: () => t, random: () => 0, ...options });
  void ensurePayments(inbox); // on SQLite it has run by the time this returns
  opened.push(inbox);
  return inbox;
};
const query = <T>(sql: string, ...params: (string | number)[]): T[] => {
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    // Spread into plain objects: node:sqlite's rows have a null prototype, which deepEqual tells apart.
    return db
      .prepare(sql)
      .all(...params)
      .map((row) => ({ ...row })) as T[];
  } finally {
    db.close();
  }
};
const statusOf = (id: string) =>
  query<{ status: string; attempts: number; error: string | null }>(
    "SELECT status, attempts, error FROM deliveries WHERE id = ?",
    id,
  )[0];
const quiet = () => {};
const tombstones = () => query<{ n: number }>("SELECT count(*) AS n FROM deliveries WHERE purged_at IS NOT NULL")[0]!.n;

// Every child a test starts is killed at the end, so a test that fails (or times out) waiting on one
// does not leave it running and hold this file's process open.
const children = new Set<ChildProcess>();
const start = (...args: Parameters<typeof spawnScript>): ChildProcess => {
  const child = spawnScript(...args);
  children.add(child);
  return child;
};
after(() => {
  for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
});

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

describe("run()", () => {
  it("drains what is due with once, recording each payment once", async () => {
    const inbox = open();
    for (let i = 0; i < 5; i++) await inbox.store({ id: `evt_${i}`, body: payment("C", i) });
    await inbox.store({ id: "evt_0", body: payment("C", 0) }); // a duplicate adds no work
    const stats = await run(recordPayment, { inbox, once: true, log: quiet });
    assert.deepEqual(stats, { claimed: 5, done: 5, retried: 0, failed: 0, lost: 0, released: 0 });
    assert.deepEqual(query<{ n: number }>("SELECT count(*) AS n FROM payments")[0], { n: 5 });
    assert.deepEqual(query<{ n: number }>("SELECT count(*) AS n FROM deliveries WHERE status <> 'done'")[0], { n: 0 });
  });

  it("runs up to concurrency handlers at once, and never more", async () => {
    const inbox = open();
    for (let i = 0; i < 9; i++) await inbox.store({ id: `evt_${i}`, body: payment() });
    const most = async (concurrency: number) => {
      let running = 0;
      let peak = 0;
      await run(
        async () => {
          peak = Math.max(peak, ++running);
          for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
          running--;
        },
        { inbox, once: true, concurrency, log: quiet },
      );
      return peak;
    };
    assert.equal(await most(3), 3);
    // Control: the same handlers under concurrency 1 never overlap, so the peak above is run()'s doing.
    inbox.db.exec("UPDATE deliveries SET status = 'received', attempts = 0");
    assert.equal(await most(1), 1);
  });

  it("schedules a retry with backoff when the handler throws", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: payment() });
    const lines: string[] = [];
    const stats = await run(
      () => {
        throw new Error("the bank is down");
      },
      { inbox, once: true, log: (l) => lines.push(l) },
    );
    assert.equal(stats.retried, 1);
    assert.deepEqual(statusOf("evt_1"), { status: "received", attempts: 1, error: "the bank is down" });
    assert.deepEqual(query<{ available_at: number }>("SELECT available_at FROM deliveries")[0], {
      available_at: T0 + 2_000,
    });
    assert.match(lines.join("\n"), /evt_1 failed \(attempt 1\), retrying at .*: the bank is down/);
  });

  it("sets a delivery aside at once when the handler throws PermanentError", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: payment() });
    let calls = 0;
    const stats = await run(
      () => {
        calls++;
        throw new PermanentError("unknown customer");
      },
      { inbox, once: true, log: quiet },
    );
    assert.equal(calls, 1);
    assert.equal(stats.failed, 1);
    assert.deepEqual(statusOf("evt_1"), { status: "failed", attempts: 1, error: "unknown customer" });
  });

  it("fails a body that is not JSON permanently, without calling the handler", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: Buffer.from("customer=Maria&amount=24.99") });
    let calls = 0;
    const stats = await run(() => void calls++, { inbox, once: true, log: quiet });
    assert.equal(calls, 0);
    assert.equal(stats.failed, 1);
    const row = statusOf("evt_1")!;
    assert.equal(row.status, "failed");
    assert.match(row.error!, /not JSON/);
  });

  it("fails permanently a JSON body that is not valid UTF-8, rather than hand the handler altered text", async () => {
    const inbox = open();
    // 0xff can appear nowhere in UTF-8; decoding it leniently would turn the name into "Mar\ufffda".
    await inbox.store({
      id: "evt_1",
      body: Buffer.concat([Buffer.from('{"customer":"Mar'), Buffer.from([0xff]), Buffer.from('a","amount":1}')]),
    });
    const stats = await run(recordPayment, { inbox, once: true, log: quiet });
    assert.equal(stats.failed, 1);
    assert.match(statusOf("evt_1")!.error!, /not JSON.*utf-8/i);
    assert.deepEqual(query("SELECT * FROM payments"), []);
  });

  it("sets a delivery aside after the last attempt, across runs", async () => {
    const inbox = open({ maxAttempts: 3 });
    await inbox.store({ id: "evt_1", body: payment() });
    for (let attempt = 1; attempt <= 3; attempt++) {
      await run(
        () => {
          throw new Error(`boom ${attempt}`);
        },
        { inbox, once: true, log: quiet },
      );
      t += 3_600_000; // past any backoff
    }
    assert.deepEqual(statusOf("evt_1"), { status: "failed", attempts: 3, error: "boom 3" });
    const stats = await run(() => assert.fail("a failed delivery was handed out again"), {
      inbox,
      once: true,
      log: quiet,
    });
    assert.equal(stats.claimed, 0);
  });

  describe("the heartbeat", () => {
    // extendedTo waits (a few ms at a time, as the heartbeat beats every 5 ms) until the row's lease
    // reaches the given time on the pinned clock; a heartbeat that never comes fails rather than hangs.
    const extendedTo = async (until: number) => {
      for (
        let tries = 0;
        query<{ leased_until: number }>("SELECT leased_until FROM deliveries")[0]!.leased_until < until;
        tries++
      ) {
        if (tries === 1_000) assert.fail("the heartbeat never extended the lease");
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    };

    it("keeps extending a long handler's lease, so no other worker takes it over", async () => {
      const a = open();
      const b = open();
      await a.store({ id: "evt_1", body: payment() });
      const stats = await run(
        async () => {
          // Four lease lengths pass on the clock while the handler works; each time the heartbeat renews it.
          for (let i = 0; i < 4; i++) {
            t += 900;
            await extendedTo(t + 1_000);
            assert.equal(await b.claim(1_000), undefined);
          }
        },
        { inbox: a, once: true, leaseMs: 1_000, heartbeatMs: 5, log: quiet },
      );
      assert.equal(stats.done, 1);
      assert.deepEqual(statusOf("evt_1"), { status: "done", attempts: 1, error: null });
    });

    it("aborts the job's signal when it finds the lease lost", async () => {
      const a = open();
      const b = open();
      await a.store({ id: "evt_1", body: payment() });
      let reason: unknown;
      const stats = await run(
        async (job) => {
          t += 1_000;
          assert.ok(await b.claim(60_000)); // taken over: the next heartbeat finds out
          await new Promise((resolve) => job.signal.addEventListener("abort", resolve));
          reason = job.signal.reason;
        },
        { inbox: a, once: true, leaseMs: 1_000, heartbeatMs: 5, log: quiet },
      );
      assert.match(String(reason), /the lease was lost/);
      assert.equal(stats.lost, 1);
    });
  });

  describe("when the lease is lost mid-handler", () => {
    // The handler stalls past its lease; meanwhile a second worker (its own connection) takes the
    // delivery over and records the payment. The first handler then finishes too.
    const logged: string[] = [];
    async function overtaken(
      write: (job: Job, key: string) => void,
    ): Promise<{ stats: Awaited<ReturnType<typeof run>>; ledger: number }> {
      const a = open();
      const b = open();
      a.db.exec("CREATE TABLE ledger (key TEXT)"); // no key constraint: a second write would be counted
      await a.store({ id: "evt_1", body: payment() });
      const ledger = (db: DatabaseSync, key: string) => db.prepare("INSERT INTO ledger VALUES (?)").run(key);
      const stats = await run(
        async (job) => {
          t += LEASE;
          const takeover = (await b.claim(LEASE))!;
          assert.equal(takeover.id, "evt_1");
          assert.equal(await b.finish(takeover, [(tx) => void ledger(tx.db!, job.key)]), true);
          write(job, job.key);
        },
        { inbox: a, once: true, leaseMs: LEASE, log: (line) => logged.push(line) },
      );
      return { stats, ledger: query<{ n: number }>("SELECT count(*) AS n FROM ledger")[0]!.n };
    }

    it("rolls back the stale handler's job.write, so the local effect happens exactly once", async () => {
      const { stats, ledger } = await overtaken((job, key) =>
        job.write((tx) => void tx.db!.prepare("INSERT INTO ledger VALUES (?)").run(key)),
      );
      assert.equal(stats.lost, 1);
      assert.equal(stats.done, 0);
      assert.equal(ledger, 1);
      assert.match(logged.join("\n"), /^evt_1: the lease was lost while working, so its writes were rolled back/m);
      assert.equal(statusOf("evt_1")!.status, "done");
    });

    it("control: a write made outside job.write happens twice", async () => {
      const { ledger } = await overtaken(
        (job, key) => void opened[0]!.db.prepare("INSERT INTO ledger VALUES (?)").run(key),
      );
      assert.equal(ledger, 2);
    });
  });
});

// On SQLite worker.ts hands run() a connection of its own with syncOffLoop for the scheduled purge (purge.inbox):
// each batch commits without an fsync inside the write lock and settles after an fdatasync of the WAL on libuv's
// thread pool, as inbox.ts purge's do. Holding that pool shows which way a batch committed.
describe("run()'s scheduled purge", () => {
  // Three payments handled eight days ago: the purge's default ages drop their bodies.
  const handledLongAgo = async (inbox: SqliteInbox) => {
    for (const id of ["evt_1", "evt_2", "evt_3"]) await inbox.store({ id, body: payment() });
    await run(recordPayment, { inbox, once: true, log: quiet });
    t += 8 * DAY;
  };
  // purging runs a worker on inbox whose purge commits through purgeInbox (the run's own when not given).
  const purging = (inbox: Inbox, purgeInbox?: Inbox) => {
    const stop = new AbortController();
    const seen: { line?: string } = {};
    let said: (line: string) => void = () => {};
    const purged = new Promise<string>((resolve) => (said = resolve));
    const running = run(recordPayment, {
      inbox,
      signal: stop.signal,
      log: (line) => {
        if (!line.startsWith("purge")) return;
        seen.line = line;
        said(line);
      },
      purge: { everyMs: 3_600_000, ...(purgeInbox ? { inbox: purgeInbox } : {}) },
    });
    return { seen, purged, stop: () => (stop.abort(), running) };
  };

  it("commits each batch through the connection it is given, with syncOffLoop: at once, settled after the fdatasync", async () => {
    const handler = open();
    const own = open({ syncOffLoop: true });
    await handledLongAgo(handler);
    const pool = await holdThreadPool(dir.dir);
    try {
      const worker = purging(handler, own);
      await until("the purge's batch is committed", () => tombstones() === 3);
      await turns(5);
      assert.equal(worker.seen.line, undefined, "the purge is not over before its fdatasync, which waits for the pool");
      await pool.release();
      assert.match(await worker.purged, /^purge: dropped 3 bodies/);
      await worker.stop();
    } finally {
      await pool.release();
    }
    assert.equal(handler.durability.synchronous, 2, "the handler's connection keeps FULL");
    for (const inbox of opened) await inbox.close();
    // What the purge settled is in the file as a new connection opens it, after the worker has stopped.
    const reopened = new SqliteInbox(path);
    try {
      const kept = await reopened.kept();
      assert.deepEqual([kept.tombstones.count, kept.bodies.count], [3, 0]);
    } finally {
      await reopened.close();
    }
  });

  it("(control) on the run's own connection, at FULL, the same purge settles with its commits whatever the pool does", async () => {
    const handler = open();
    await handledLongAgo(handler);
    const pool = await holdThreadPool(dir.dir);
    try {
      const worker = purging(handler);
      assert.match(await worker.purged, /^purge: dropped 3 bodies/);
      await worker.stop();
    } finally {
      await pool.release();
    }
    assert.equal(tombstones(), 3);
  });
});

// walSyncers counts the descriptors a process holds on this test's WAL read-only: syncOffLoop's, not SQLite's.
function walSyncers(pid: number): number {
  const wal = `${realpathSync(path)}-wal`;
  return readdirSync(`/proc/${pid}/fd`).filter((fd) => {
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`) !== wal) return false;
      const flags = /^flags:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/fdinfo/${fd}`, "utf8"))![1]!;
      // The access mode is the low two bits (O_ACCMODE, which node:fs does not export).
      return (Number.parseInt(flags, 8) & 3) === constants.O_RDONLY;
    } catch {
      return false; // closed meanwhile
    }
  }).length;
}

// lines follows a child's stream and resolves when a line matches.
function lines(child: ChildProcess, stream: "stdout" | "stderr") {
  const seen: string[] = [];
  const waiters: { re: RegExp; resolve: (line: string) => void }[] = [];
  createInterface({ input: child[stream]! }).on("line", (line) => {
    seen.push(line);
    for (const w of waiters.filter((w) => w.re.test(line))) {
      waiters.splice(waiters.indexOf(w), 1);
      w.resolve(line);
    }
  });
  return {
    seen,
    next: (re: RegExp) =>
      new Promise<string>((resolve) => {
        const found = seen.find((l) => re.test(l));
        if (found) resolve(found);
        else waiters.push({ re, resolve });
      }),
  };
}
// exitOf resolves once the child has exited and its output has been read to the end.
const exitOf = (child: ChildProcess) =>
  new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on("close", (code, signal) => resolve({ code, signal })),
  );

describe("a worker process", { timeout: 30_000 }, () => {
  it("on SIGTERM stops claiming, lets the work in flight finish, and exits 0", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: payment() });
    await inbox.store({ id: "evt_2", body: payment() });
    await inbox.close();
    const child = start("test/fixtures/slow-worker.ts", [path, "until-sigterm"]);
    const out = lines(child, "stdout");
    const exited = exitOf(child);
    await out.next(/^started evt_2$/); // both handlers are running
    child.kill("SIGTERM");
    assert.deepEqual(await exited, { code: 0, signal: null });
    assert.deepEqual(JSON.parse(out.seen.at(-1)!), {
      claimed: 2,
      done: 2,
      retried: 0,
      failed: 0,
      lost: 0,
      released: 0,
    });
    assert.deepEqual(query("SELECT id, status FROM deliveries ORDER BY id"), [
      { id: "evt_1", status: "done" },
      { id: "evt_2", status: "done" },
    ]);
    assert.equal(query("SELECT * FROM payments").length, 2);
  });

  it("on SIGTERM claims nothing more: what was waiting stays in the queue, untouched", async () => {
    const inbox = open();
    for (const id of ["evt_1", "evt_2", "evt_3"]) await inbox.store({ id, body: payment() });
    await inbox.close();
    const child = start("test/fixtures/slow-worker.ts", [path, "until-sigterm", "10000", "1"]);
    const out = lines(child, "stdout");
    const exited = exitOf(child);
    await out.next(/^started evt_1$/);
    child.kill("SIGTERM");
    assert.deepEqual(await exited, { code: 0, signal: null });
    assert.deepEqual(
      out.seen.filter((l) => l.startsWith("started")),
      ["started evt_1"],
    );
    assert.deepEqual(query("SELECT id, status, attempts FROM deliveries ORDER BY id"), [
      { id: "evt_1", status: "done", attempts: 1 },
      { id: "evt_2", status: "received", attempts: 0 },
      { id: "evt_3", status: "received", attempts: 0 },
    ]);
  });

  it("on SIGTERM releases what outlives the grace period, unspent, and exits 0", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_1", body: payment() });
    await inbox.close();
    const child = start("test/fixtures/slow-worker.ts", [path, "hang", "50"]);
    const out = lines(child, "stdout");
    const exited = exitOf(child);
    await out.next(/^started evt_1$/);
    assert.equal(statusOf("evt_1")!.status, "processing");
    child.kill("SIGTERM");
    assert.deepEqual(await exited, { code: 0, signal: null });
    assert.equal(JSON.parse(out.seen.at(-1)!).released, 1);
    // Back in the queue at once, its attempt given back, no lease left over.
    assert.deepEqual(query("SELECT status, attempts, lease_token, leased_until FROM deliveries"), [
      { status: "received", attempts: 0, lease_token: null, leased_until: null },
    ]);
  });

  it("killed with -9 loses nothing: its delivery is taken over once the lease expires", async () => {
    t = Date.now();
    const setup = open();
    await setup.store({ id: "evt_1", body: payment() });
    const child = start("test/fixtures/slow-worker.ts", [path, "hang"]);
    const out = lines(child, "stdout");
    const exited = exitOf(child);
    await out.next(/^started evt_1$/);
    child.kill("SIGKILL");
    assert.deepEqual(await exited, { code: null, signal: "SIGKILL" });
    // The dead worker's lease still holds: nobody may take the delivery yet.
    assert.equal((await run(recordPayment, { inbox: setup, once: true, log: quiet })).claimed, 0);
    // A minute later (the default lease, on the pinned clock) another worker takes it and finishes it.
    t = Date.now() + LEASE;
    const stats = await run(recordPayment, { inbox: setup, once: true, log: quiet });
    assert.deepEqual(stats, { claimed: 1, done: 1, retried: 0, failed: 0, lost: 0, released: 0 });
    assert.deepEqual(statusOf("evt_1"), { status: "done", attempts: 2, error: null });
    assert.equal(query("SELECT * FROM payments").length, 1);
  });
});

describe("worker.ts", { timeout: 30_000 }, () => {
  it("--once records each payment, logs each outcome, and exits 0", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_100", body: payment() });
    await inbox.store({ id: "evt_101", body: payment("Sam Okafor", 12.5) });
    await inbox.store({ id: "evt_bad", body: Buffer.from('{"customer": 7}') });
    await inbox.close();
    const { code, stdout, stderr } = await runScript("worker.ts", ["--once", "--db", path]);
    assert.equal(code, 0, stderr);
    assert.equal(stdout, "");
    assert.match(stderr, /^evt_100 done$/m);
    assert.match(stderr, /^evt_101 done$/m);
    assert.match(stderr, /^evt_bad failed permanently: expected \{"customer": string, "amount": number\}$/m);
    assert.match(stderr, /^worker: 2 done, 0 to retry, 1 failed, 0 lost to other workers$/m);
    assert.deepEqual(query("SELECT delivery_id, customer, amount FROM payments ORDER BY delivery_id"), [
      { delivery_id: "evt_100", customer: "Maria Lopez", amount: 24.99 },
      { delivery_id: "evt_101", customer: "Sam Okafor", amount: 12.5 },
    ]);
  });

  it("keeps polling without --once until SIGTERM, then exits 0", async () => {
    const inbox = open();
    await inbox.store({ id: "evt_100", body: payment() });
    await inbox.close();
    const child = start("worker.ts", ["--db", path]);
    const err = lines(child, "stderr");
    const exited = exitOf(child);
    await err.next(/^evt_100 done$/);
    child.kill("SIGTERM");
    assert.deepEqual(await exited, { code: 0, signal: null });
    assert.match(err.seen.join("\n"), /^SIGTERM: no more claims/m);
  });

  // syncOffLoop opens the WAL read-only twice per connection (for its fdatasyncs; SQLite's own descriptor is
  // read-write), which /proc shows from outside: the forwarding lanes' connection has two, a purge's own two more.
  for (const [how, args, expected] of [
    ["--purge-every purges through a syncOffLoop connection of its own", ["--purge-every"], 4],
    ["(control) without --purge-every only the lanes' connection syncs the WAL itself", [], 2],
  ] as const)
    it(how, { skip: existsSync("/proc/self/fdinfo") ? false : "reads /proc" }, async () => {
      t = Date.now() - 8 * DAY;
      const inbox = open();
      for (const id of ["evt_1", "evt_2", "evt_3"]) await inbox.store({ id, body: payment() });
      await run(recordPayment, { inbox, once: true, log: quiet });
      await inbox.close();
      const child = start("worker.ts", ["--db", path, ...args]);
      const err = lines(child, "stderr");
      const exited = exitOf(child);
      if (args.length > 0) await err.next(/^purge: dropped 3 bodies/);
      else await until("the worker has opened its connections", () => walSyncers(child.pid!) === expected);
      assert.equal(walSyncers(child.pid!), expected);
      child.kill("SIGTERM");
      assert.deepEqual(await exited, { code: 0, signal: null });
      // What the purge settled is in the file as a new connection opens it, after the worker has stopped.
      const reopened = new SqliteInbox(path);
      try {
        const kept = await reopened.kept();
        assert.deepEqual([kept.tombstones.count, kept.bodies.count], args.length > 0 ? [3, 0] : [0, 3]);
      } finally {
        await reopened.close();
      }
    });

  it("answers a bad option with exit 2", async () => {
    const { code, stderr } = await runScript("worker.ts", ["--concurrency", "0", "--db", path]);
    assert.equal(code, 2);
    assert.match(stderr, /expected a whole number of 1 or more/);
    assert.doesNotMatch(stderr, /\n\s+at /);
  });
});

// Two workers started at once on a new PostgreSQL schema both create the example's table: PostgreSQL's
// CREATE TABLE IF NOT EXISTS fails the loser (a duplicate pg_type row) when the two race.
describe("ensurePayments on PostgreSQL, eight workers starting at once", { skip: await postgresSkip() }, () => {
  let drop: () => Promise<void> = async () => {};
  let inboxes: Inbox[] = [];
  beforeEach(async () => {
    const fresh = await freshSchema("ensure_payments");
    drop = fresh.drop;
    inboxes = [];
    for (let i = 0; i < 8; i++) inboxes.push(await connect(fresh.url));
  });
  afterEach(async () => {
    await Promise.all(inboxes.map((inbox) => inbox.close()));
    await drop();
  });

  it("creates the table once, and none of them fails", async () => {
    await Promise.all(inboxes.map((inbox) => ensurePayments(inbox)));
    const [row] = await inboxes[0]!.query("SELECT count(*) AS n FROM payments");
    assert.equal(Number(row?.n), 0);
  });

  it("control: the bare CREATE TABLE IF NOT EXISTS, sent by all eight at once, fails at least one", async () => {
    const create = "CREATE TABLE IF NOT EXISTS payments (source TEXT NOT NULL, delivery_id TEXT PRIMARY KEY)";
    const results = await Promise.allSettled(inboxes.map((inbox) => inbox.query(create)));
    assert.ok(
      results.some((r) => r.status === "rejected"),
      "the eight raced and all got through: the race this guards against was not shown",
    );
  });
});
