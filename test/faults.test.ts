// test/faults.test.ts: the inbox under faults: a full disk, a database it cannot use, a storm of
// processes fighting for SQLite's lock, and a clock that jumps an hour either way.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  rmSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, afterEach, before, describe, it } from "node:test";
import { DEFAULTS } from "../lib/defaults.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Lease } from "../lib/store.ts";
import { backoff } from "../lib/timing.ts";
import { createReceiver } from "../receiver.ts";
import { run } from "../worker.ts";
import { bodyIsWhole, busyStorm, prepareLedger, readLedger, selfCheckingBody, startWorker } from "./chaos.ts";
import { ROOT, runScript, startReceiver, tempDir } from "./helpers.ts";

const { dir, cleanup } = tempDir("inbox-faults-");
after(cleanup);

const pageCount = (inbox: SqliteInbox) =>
  (inbox.db.prepare("PRAGMA page_count").get() as { page_count: number }).page_count;
// The disk is "full" once the file may not grow past the pages it has; max_page_count holds per connection.
const fillDisk = (inbox: SqliteInbox) => inbox.db.exec(`PRAGMA max_page_count = ${pageCount(inbox)}`);

describe("a full disk", () => {
  it("makes the receiver answer 503 with Retry-After, never 200, store nothing partial, and recover by itself", async () => {
    const inbox = new SqliteInbox(join(dir, "full.db"));
    const receiver = createReceiver({ inbox, log: () => {} });
    await new Promise<void>((resolve) => receiver.server.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(receiver.server.address() as AddressInfo).port}/`;
    const send = async (id: string, bytes: number) => {
      const res = await fetch(url, {
        method: "POST",
        headers: { "x-delivery-id": id },
        body: Buffer.alloc(bytes, id).toString(),
      });
      return { status: res.status, retryAfter: res.headers.get("retry-after"), text: await res.text() };
    };
    try {
      for (let i = 0; i < 20; i++) assert.equal((await send(`filler-${i}`, 4_000)).status, 200);
      fillDisk(inbox);
      const refused = await Promise.all(Array.from({ length: 10 }, (_, i) => send(`while-full-${i}`, 4_000 + i)));
      for (const r of refused) {
        assert.equal(r.status, 503);
        assert.ok(Number(r.retryAfter) > 0, "Retry-After tells the sender when to come back");
      }
      const rows = inbox.db.prepare("SELECT id, length(body) AS n FROM deliveries").all() as {
        id: string;
        n: number;
      }[];
      assert.equal(rows.length, 20, "nothing was stored while the disk was full");
      assert.ok(rows.every((r) => r.n === 4_000));
      assert.equal(
        (inbox.db.prepare("PRAGMA integrity_check").get() as { integrity_check: string }).integrity_check,
        "ok",
      );

      // The operator frees space (old deliveries deleted); the next delivery is stored, with no restart.
      inbox.db.exec("DELETE FROM deliveries WHERE id LIKE 'filler-%'");
      const retried = await Promise.all(Array.from({ length: 10 }, (_, i) => send(`while-full-${i}`, 4_000 + i)));
      assert.deepEqual(
        retried.map((r) => r.text),
        Array(10).fill("stored"),
      );
      const [stored] = await inbox.find("while-full-3");
      assert.equal(stored!.body.length, 4_003);
    } finally {
      await receiver.close(0);
      await inbox.close();
    }
  });

  it("never lets a worker mark a delivery done when its write failed", async () => {
    let now = 1_000_000;
    const inbox = new SqliteInbox(join(dir, "full-worker.db"), { now: () => now, retryJitter: 0 });
    prepareLedger(inbox);
    inbox.db.exec("CREATE TABLE blobs (id TEXT, data BLOB)");
    await inbox.store({ id: "pay-1", body: Buffer.from(JSON.stringify({ amount: 5 })) });
    fillDisk(inbox);
    const handler = (job: import("../worker.ts").Job) => {
      job.write((tx) => void tx.db!.prepare("UPDATE accounts SET balance = balance + 5 WHERE name = 'main'").run());
      // A write that needs new pages: on a full disk it fails, and must take the balance update with it.
      job.write(
        (tx) => void tx.db!.prepare("INSERT INTO blobs VALUES (?, ?)").run(job.delivery.id, Buffer.alloc(50_000)),
      );
    };
    const first = await run(handler, { inbox, once: true, log: () => {} });
    assert.deepEqual([first.done, first.retried], [0, 1]);
    let [d] = await inbox.find("pay-1");
    assert.equal(d!.status, "received");
    assert.match(d!.error ?? "", /full/);
    assert.equal(readLedger(inbox.path).balance, 0, "the failed write left no trace");

    inbox.db.exec("PRAGMA max_page_count = 1073741823");
    now += DEFAULTS.retryCapMs;
    const second = await run(handler, { inbox, once: true, log: () => {} });
    assert.equal(second.done, 1);
    [d] = await inbox.find("pay-1");
    assert.equal(d!.status, "done");
    assert.equal(readLedger(inbox.path).balance, 5);
    await inbox.close();
  });
  it("lets a running worker wait out a disk too full even to claim, then drain the backlog", async () => {
    const inbox = new SqliteInbox(join(dir, "full-claim.db"));
    await Promise.all(
      Array.from({ length: 3_000 }, (_, i) => inbox.store({ id: `evt-${i}`, body: Buffer.from("{}") })),
    );
    fillDisk(inbox);
    const lines: string[] = [];
    const stop = new AbortController();
    let freed = false;
    const log = (line: string) => {
      lines.push(line);
      // The operator frees space once the worker has said it cannot claim.
      if (line.startsWith("could not claim") && !freed) {
        freed = true;
        inbox.db.exec("PRAGMA max_page_count = 1073741823");
      }
      if (/^evt-\d+ done$/.test(line) && lines.filter((l) => l.endsWith(" done")).length === 3_000) stop.abort();
    };
    const stats = await run(() => {}, { inbox, concurrency: 64, signal: stop.signal, log });
    assert.equal(stats.done, 3_000);
    assert.match(lines.find((l) => l.startsWith("could not claim")) ?? "", /full/);
    assert.equal(lines.filter((l) => l.startsWith("could not claim")).length, 1, "said once, not once per poll");
    assert.ok(lines.includes("claiming again"));
    await inbox.close();
  });
});

describe("a real full disk: an 8 MB tmpfs (when the tests may mount one)", () => {
  const mnt = join(dir, "tmpfs");
  let mounted = false;
  before(() => {
    mkdirSync(mnt);
    try {
      execFileSync("mount", ["-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt], { stdio: "ignore" });
      mounted = true;
    } catch {
      // Not root, or no mount in this sandbox: the max_page_count tests above still run.
    }
  });
  afterEach(() => {
    if (mounted) for (const name of readdirSync(mnt)) rmSync(join(mnt, name), { force: true });
  });
  after(() => {
    if (mounted) execFileSync("umount", [mnt]);
  });
  // fill takes every free byte of the tmpfs with a ballast file; removing it frees the space again.
  const fill = () => {
    const fd = openSync(join(mnt, "ballast"), "w");
    try {
      for (const chunk = Buffer.alloc(4096); ; ) writeSync(fd, chunk);
    } catch (error) {
      assert.equal((error as NodeJS.ErrnoException).code, "ENOSPC");
    } finally {
      closeSync(fd);
    }
  };

  it("makes receiver.ts answer 503 with Retry-After, store nothing partial, and store again once space is freed", async (t) => {
    if (!mounted) return t.skip("cannot mount a tmpfs here");
    const db = join(mnt, "inbox.db");
    const receiver = await startReceiver(db, ["--quiet"]);
    const send = async (id: string) => {
      const res = await fetch(receiver.url, {
        method: "POST",
        headers: { "x-delivery-id": id },
        body: new Uint8Array(selfCheckingBody(id, 30_000)),
      });
      return { status: res.status, retryAfter: res.headers.get("retry-after"), text: await res.text() };
    };
    try {
      for (let i = 0; i < 5; i++) assert.equal((await send(`before-${i}`)).status, 200);
      fill();
      // The disk is full, but the WAL is not always out of room: once the checkpointer has copied it back,
      // SQLite rewrites it from its start, over the ~700 KB it already holds (the schema and the bodies so
      // far), and a 200 for a delivery stored there is honest. Eighty 30 KB bodies are three times that room,
      // so some of them must be refused, whenever the checkpoint ran.
      const ids = Array.from({ length: 80 }, (_, i) => `full-${i}`);
      const whileFull = await Promise.all(ids.map(send));
      assert.deepEqual(
        [...new Set(whileFull.map((r) => r.status))].filter((s) => s !== 200 && s !== 503),
        [],
      );
      const refused = ids.filter((_, i) => whileFull[i]!.status === 503);
      assert.ok(refused.length > 0, "more than the disk holds was sent, so some of it was refused");
      assert.ok(whileFull.every((r) => r.status === 200 || Number(r.retryAfter) > 0));
      rmSync(join(mnt, "ballast"));
      const retried = await Promise.all(refused.map(send));
      assert.deepEqual(
        retried.map((r) => r.text),
        Array(refused.length).fill("stored"),
        "no restart needed",
      );
      // And it stays up: a few hundred small commits would grow the WAL past the space freed if it were
      // not reused from its start.
      for (let i = 0; i < 300; i++) {
        const res = await fetch(receiver.url, {
          method: "POST",
          headers: { "x-delivery-id": `small-${i}` },
          body: "{}",
        });
        assert.equal(res.status, 200, `small-${i}: ${await res.text()}`);
      }
    } finally {
      await receiver.stop("SIGKILL");
    }
    const conn = new DatabaseSync(db);
    const rows = conn.prepare("SELECT id, body FROM deliveries").all() as { id: string; body: Uint8Array }[];
    assert.equal((conn.prepare("PRAGMA integrity_check").get() as { integrity_check: string }).integrity_check, "ok");
    conn.close();
    assert.equal(rows.length, 385);
    assert.ok(rows.filter((r) => !r.id.startsWith("small-")).every((r) => bodyIsWhole(r.id, r.body)));
  });

  it("keeps a running worker alive through it, never marking done a delivery whose write failed", {
    timeout: 120_000,
  }, async (t) => {
    if (!mounted) return t.skip("cannot mount a tmpfs here");
    const db = join(mnt, "ledger.db");
    const inbox = new SqliteInbox(db);
    prepareLedger(inbox);
    await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        inbox.store({ id: `pay-${i}`, body: Buffer.from(JSON.stringify({ amount: i + 1 })) }),
      ),
    );
    await inbox.close();
    // The worker must be running before the disk fills: SQLite cannot even open a file on a full disk.
    const worker = startWorker(db, ["--lease-ms", "1000", "--work-ms", "100", "--concurrency", "8"]);
    try {
      await until(() => worker.lines.some((l) => / done$/.test(l)), worker.lines);
      fill();
      await until(() => worker.lines.some((l) => /disk is full/.test(l)), worker.lines);
      rmSync(join(mnt, "ballast"));
      await until(() => readLedger(db).done === 200, worker.lines);
    } finally {
      worker.child.kill("SIGKILL");
    }
    assert.equal(await worker.exited, null, "the worker never died: it was still there to be killed");
    const ledger = readLedger(db);
    assert.deepEqual(
      [ledger.balance, ledger.lost, ledger.doubled, ledger.processing],
      [20_100, 0, 0, 0],
      "every write that failed took its done mark with it",
    );
  });
});

// until polls a condition on real processes for up to 30 s, then fails with what the worker said.
async function until(condition: () => boolean, lines: string[] = []): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (!condition()) {
    if (Date.now() > deadline)
      throw new Error(`gave up waiting; the worker's last lines:\n${lines.slice(-5).join("\n")}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("a database the scripts cannot use", () => {
  const cases: [string, () => string][] = [
    ["a missing directory", () => join(dir, "no-such-folder", "inbox.db")],
    [
      "a file that is not SQLite",
      () => {
        const path = join(dir, "not-sqlite.db");
        writeFileSync(path, "this is a text file, not a database\n".repeat(200));
        return path;
      },
    ],
    [
      "a read-only database",
      () => {
        // The folder stays writable, so SQLite can open the file (quietly read-only) and make its -wal file.
        const folder = join(dir, "read-only");
        mkdirSync(folder, { recursive: true, mode: 0o777 });
        chmodSync(folder, 0o777);
        const path = join(folder, "inbox.db");
        if (!existsSync(path)) new SqliteInbox(path).db.close();
        chmodSync(path, 0o444);
        return path;
      },
    ],
  ];
  // Root may write a read-only file anyway, so the scripts run as nobody when the tests run as root.
  const asNobody = process.getuid?.() === 0 ? { uid: 65534, gid: 65534 } : undefined;
  if (asNobody) chmodSync(dir, 0o755);
  for (const [what, make] of cases) {
    for (const script of ["receiver.ts", "worker.ts"]) {
      it(`makes ${script} fail at start-up with one clear line and a non-zero exit: ${what}`, async () => {
        const path = make();
        const r = await runAs(asNobody, script, [
          "--db",
          path,
          ...(script === "receiver.ts" ? ["--port", "0"] : ["--once"]),
        ]);
        assert.notEqual(r.code, 0);
        assert.equal(r.stdout, "", "it never said it was listening");
        const lines = r.stderr.trim().split("\n");
        assert.equal(lines.length, 1, r.stderr);
        assert.match(
          lines[0]!,
          /cannot use the database: open .*: (no such directory|file is not a database|attempt to write a readonly database)/,
        );
      });
    }
  }
});

describe("a SQLITE_BUSY storm", () => {
  it("loses no delivery and claims none twice, with K processes storing and claiming at once", async () => {
    const r = await busyStorm({ dir, processes: 4, perProcess: 150, claimer: "inbox" });
    assert.deepEqual(r.exitCodes, [0, 0, 0, 0]);
    assert.deepEqual(r.errors, []);
    assert.equal(r.deliveries, 600);
    assert.equal(r.claims, 600);
    assert.equal(r.lost, 0);
    assert.equal(r.doubled, 0);
  });

  it("control: catches a claimer opened with a deferred BEGIN (SQLITE_BUSY that the busy timeout cannot absorb)", async () => {
    const r = await busyStorm({ dir, processes: 4, perProcess: 150, claimer: "deferred" });
    assert.ok(r.errors.length > 0, "the storm test fails on it");
    assert.ok(
      r.errors.every((e) => /locked|busy/i.test(e)),
      r.errors[0],
    );
  });

  it("control: catches a claimer that reads outside its transaction (the same delivery claimed twice)", async () => {
    const r = await busyStorm({ dir, processes: 4, perProcess: 150, claimer: "split" });
    assert.ok(r.doubled > 0, "the storm test fails on it");
  });
});

describe("a clock that jumps an hour", () => {
  const HOUR = 3_600_000;
  const LEASE = 30_000;
  const setup = async (name: string) => {
    const clock = { now: 10 * HOUR };
    const inbox = new SqliteInbox(join(dir, `${name}.db`), { now: () => clock.now, random: () => 0.5 });
    for (let i = 0; i < 6; i++) await inbox.store({ id: `evt-${i}`, body: Buffer.from("{}") });
    return { clock, inbox };
  };
  const processing = (inbox: SqliteInbox) =>
    (inbox.db.prepare("SELECT count(*) AS n FROM deliveries WHERE status = 'processing'").get() as { n: number }).n;

  it("forward: a heartbeat after the jump keeps live leases, and dead ones are taken over on the first claim", async () => {
    const { clock, inbox } = await setup("jump-forward");
    const live = await inbox.claimBatch(3, LEASE);
    const dead = await inbox.claimBatch(3, LEASE);
    clock.now += HOUR;
    for (const lease of live)
      assert.equal(await inbox.extend(lease, LEASE), true, "the live worker's heartbeat still holds");
    const taken = await inbox.claimBatch(10, LEASE);
    assert.deepEqual(taken.map((l) => l.id).sort(), dead.map((l) => l.id).sort(), "only the dead leases expired");
    assert.ok(
      taken.every((l) => l.attempts === 2),
      "a takeover spends one attempt, not the hour's worth",
    );
    for (const lease of live) assert.equal(await inbox.finish(lease), true);
    await inbox.close();
  });

  it("backward: a dead lease still expires one lease after its claim, not an hour later", async () => {
    const { clock, inbox } = await setup("jump-backward");
    const dead = await inbox.claimBatch(6, LEASE);
    assert.equal(dead.length, 6);
    clock.now -= HOUR;
    assert.equal((await inbox.claimBatch(10, LEASE)).length, 0, "nothing is taken over at once");
    clock.now += LEASE + 1;
    const taken = await inbox.claimBatch(10, LEASE);
    assert.equal(taken.length, 6, "every dead lease was taken over within one lease length of the jump");
    assert.equal(processing(inbox), 6);
    await inbox.close();
  });

  it("keeps backoff sane: a retry waits its backoff from the current clock, and never longer than the cap after a jump back", async () => {
    const { clock, inbox } = await setup("jump-backoff");
    const opts = {
      retryDelayMs: DEFAULTS.retryDelayMs,
      retryCapMs: DEFAULTS.retryCapMs,
      retryJitter: DEFAULTS.retryJitter,
      random: () => 0.5,
    };
    for (const attempts of [1, 2, 5, 30, 1000]) {
      const wait = backoff(attempts, opts);
      assert.ok(wait >= DEFAULTS.retryDelayMs && wait <= DEFAULTS.retryCapMs, `attempt ${attempts}: ${wait}`);
    }
    const leases: Lease[] = await inbox.claimBatch(6, LEASE);
    const before = await inbox.fail(leases[0]!, "boom");
    assert.equal(before?.status === "received" && before.retryAt - clock.now, 2_200);
    clock.now += HOUR;
    const afterForward = await inbox.fail(leases[1]!, "boom");
    assert.equal(
      afterForward?.status === "received" && afterForward.retryAt - clock.now,
      2_200,
      "measured from the new time",
    );

    clock.now -= 2 * HOUR;
    // Scheduled before the jump, both retries are now an hour or two away: not due at once...
    assert.equal(
      (await inbox.claimBatch(10, LEASE)).filter((l) => l.id === leases[0]!.id || l.id === leases[1]!.id).length,
      0,
    );
    // ...but due once the cap has passed, not after the jump has been waited out.
    clock.now += DEFAULTS.retryCapMs;
    const again = await inbox.claimBatch(10, LEASE);
    assert.deepEqual(
      again
        .map((l) => l.id)
        .filter((id) => id === leases[0]!.id || id === leases[1]!.id)
        .sort(),
      [leases[0]!.id, leases[1]!.id].sort(),
    );
    await inbox.close();
  });
});

// runAs runs a script as another user when given one (to make a read-only file truly read-only for root).
async function runAs(user: { uid: number; gid: number } | undefined, script: string, args: string[]) {
  if (!user) return runScript(script, args);
  const { spawn } = await import("node:child_process");
  const child = spawn(process.execPath, ["--import", "tsx", join(ROOT, script), ...args], {
    cwd: ROOT,
    env: { ...process.env, HOME: dir },
    stdio: ["ignore", "pipe", "pipe"],
    ...user,
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  return { code, stdout, stderr };
}
