// test/crash.test.ts: the bounded crash suite. Real receiver and worker processes on a real database file,
// killed with SIGKILL at random moments; `npm run torture` runs the same scenarios (test/chaos.ts) longer.

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Tx } from "../lib/store.ts";
import { pipelineCrash, prepareLedger, readLedger, receiverCrash, seeded, startWorker, workerCrash } from "./chaos.ts";
import { tempDir } from "./helpers.ts";

const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
// Each suite's own folder, made before its tests and removed after them: Deno's runner skips a top-level after()
// when a filter leaves out the suite it falls to, and Bun's runs a filtered-out suite's body but not its hooks
// (test/runtimes.test.ts runs this file filtered on both); a folder made at load was left in /tmp each run.
function ownDir(): { readonly dir: string } {
  let made: ReturnType<typeof tempDir> | undefined;
  before(() => void (made = tempDir("inbox-crash-")));
  after(() => made?.cleanup());
  return {
    get dir() {
      if (!made) throw new Error("ownDir: read before its suite began");
      return made.dir;
    },
  };
}

describe("a receiver killed with SIGKILL while senders send", () => {
  const own = ownDir();
  it(`loses no acknowledged delivery and stores no partial body (seed ${seed})`, async () => {
    const r = await receiverCrash({
      dir: own.dir,
      rounds: 6,
      senders: 8,
      minUpMs: 100,
      maxUpMs: 700,
      random: seeded(seed),
    });
    assert.equal(r.kills, 6);
    assert.ok(r.acked > 0, "some deliveries were acknowledged");
    assert.deepEqual(r.lost, [], "every acknowledged ID is in the database");
    assert.deepEqual(r.partial, [], "every stored body is whole");
    assert.deepEqual(r.wrongAnswers, [], "a resent delivery is answered duplicate");
    assert.equal(r.integrity, "ok");
    assert.ok(r.stored >= r.acked);
  });
});

describe("workers killed with SIGKILL over a backlog", () => {
  const own = ownDir();
  it(`apply each payment to the balance exactly once, and take over the crashed work (seed ${seed})`, async () => {
    const r = await workerCrash({
      dir: own.dir,
      deliveries: 1000,
      workers: 3,
      concurrency: 4,
      leaseMs: 1000,
      workMs: 80,
      killEveryMs: 1000,
      deadlineMs: 60_000,
      random: seeded(seed + 1),
    });
    assert.ok(r.finishedInTime, `the backlog was done in time: ${JSON.stringify(r)}`);
    assert.equal(r.done, 1000, "every delivery is done");
    assert.equal(r.processing, 0, "nothing is left processing");
    assert.equal(r.balance, r.expected, "the balance is exactly the sum of the amounts");
    assert.equal(r.lost, 0);
    assert.equal(r.doubled, 0);
    assert.ok(r.kills > 0 && r.killsMidHandler > 0, `some kills landed mid-handler: ${JSON.stringify(r)}`);
    assert.ok(r.takenOver > 0, "crashed work was finished by another worker once its lease expired");
  });
});

describe("the whole pipeline with the receiver or a worker killed about every 0.7 s", () => {
  const own = ownDir();
  it(`applies every acknowledged payment exactly once (seed ${seed})`, async () => {
    const r = await pipelineCrash({
      dir: own.dir,
      seconds: 4,
      senders: 2,
      workers: 2,
      killEveryMs: 700,
      random: seeded(seed + 2),
    });
    assert.ok(r.drained, `the workers drained the backlog: ${JSON.stringify(r)}`);
    assert.ok(r.kills > 0 && r.acked > 0);
    assert.equal(r.lostAcked, 0, "every acknowledged delivery is done");
    assert.equal(r.balance, r.expected, "the balance is exactly the sum of the stored amounts");
    assert.equal(r.doubled, 0);
    assert.equal(r.lost, 0);
    assert.equal(r.processing, 0);
    assert.equal(r.integrity, "ok");
  });
});

describe("the whole pipeline with the workers purging every done body meanwhile", () => {
  const own = ownDir();
  it(`loses no acknowledged delivery and no unprocessed one, and applies each payment once (seed ${seed})`, async () => {
    const r = await pipelineCrash({
      dir: own.dir,
      seconds: 4,
      senders: 2,
      workers: 2,
      killEveryMs: 700,
      random: seeded(seed + 3),
      purgeEveryMs: 50,
    });
    assert.ok(r.drained, `the workers drained the backlog: ${JSON.stringify(r)}`);
    assert.ok(r.kills > 0 && r.acked > 0);
    assert.ok(r.purged > 0, `some bodies were purged: ${JSON.stringify(r)}`);
    assert.equal(r.purgedUndone, 0, "no body of a delivery still to process was purged");
    assert.equal(r.lostAcked, 0, "every acknowledged delivery is done");
    assert.equal(r.balance, r.expected, "the balance is exactly the sum of the stored amounts");
    assert.equal(r.doubled, 0, "a resend of a purged delivery was a duplicate, not a second payment");
    assert.equal(r.lost, 0);
    assert.equal(r.processing, 0);
    assert.equal(r.integrity, "ok");
  });
});

describe("a handler that outlives its lease", () => {
  const own = ownDir();
  it("is taken over by another worker, and its late finish and writes are fenced out", async () => {
    const db = join(own.dir, "stall.db");
    const inbox = new SqliteInbox(db);
    prepareLedger(inbox);
    await inbox.store({ id: "stall-me", body: Buffer.from(JSON.stringify({ amount: 7 })) });
    await inbox.close();

    // The first worker blocks its event loop for 2.5 s inside the handler: no heartbeat can run, so its
    // 1 s lease runs out while it still holds the delivery.
    const slow = startWorker(db, ["--lease-ms", "1000", "--stall-id", "stall-me", "--stall-ms", "2500", "--once"]);
    await until(() => slow.lines.some((l) => l.startsWith("claim stall-me")));
    const other = startWorker(db, ["--lease-ms", "1000"]);
    await until(() => readLedger(db).done === 1);
    assert.equal(await slow.exited, 0);
    other.child.kill("SIGTERM");
    await other.exited;

    const ledger = readLedger(db);
    assert.equal(ledger.balance, 7, "the payment was applied once");
    assert.equal(ledger.doubled, 0);
    assert.ok(
      slow.lines.some((l) => /^stall-me.*lease was (already )?lost/.test(l)),
      slow.lines.join("\n"),
    );
    assert.ok(
      other.lines.some((l) => l === "stall-me done"),
      "the other worker finished it",
    );
  });

  it("cannot finish or write with a lease taken over, even when it ignores the abort (pinned clock)", async () => {
    let now = 1_000_000;
    const path = join(own.dir, "fenced.db");
    const first = new SqliteInbox(path, { now: () => now });
    const second = new SqliteInbox(path, { now: () => now });
    prepareLedger(first);
    await first.store({ id: "evt", body: Buffer.from("{}") });
    const stale = (await first.claim(1_000))!;
    now += 1_001;
    const fresh = (await second.claim(1_000))!;
    assert.equal(fresh.id, "evt");
    assert.equal(fresh.attempts, 2);
    const add = (n: number) => (tx: Tx) => tx.run("UPDATE accounts SET balance = balance + ? WHERE name = 'main'", n);
    assert.equal(await first.extend(stale, 1_000), false, "the stale lease cannot be extended");
    assert.equal(await first.finish(stale, [add(100)]), false, "the stale finish is refused");
    assert.equal(await first.fail(stale, "late"), undefined, "the stale failure is refused");
    assert.equal(await second.finish(fresh, [add(1)]), true);
    await first.close();
    await second.close();
    assert.equal(readLedger(path).balance, 1);
  });
});

// until polls a condition on real processes; the test's own timeout bounds it.
async function until(condition: () => boolean): Promise<void> {
  while (!condition()) await new Promise((resolve) => setTimeout(resolve, 25));
}
