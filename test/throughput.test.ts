// test/throughput.test.ts: what the fast paths must not change. A batch is one transaction: a duplicate
// within it, a row that fails within it, requests held short of the in-flight bound, and a worker whose claims and
// finishes share commits while a long handler's lease is kept by the heartbeat (or lost, and its signal
// aborted). No timings: only outcomes.

import assert from "node:assert/strict";
import { connect, type Socket } from "node:net";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterEach, beforeEach, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Stored } from "../lib/store.ts";
import { ensurePayments, recordPayment, run } from "../worker.ts";
import { startReceiver, tempDir, type ReceiverProcess } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const body = (n: number) => Buffer.from(JSON.stringify({ customer: `c${n}`, amount: n }));

let dir: { dir: string; cleanup: () => void };
let path: string;
let opened: SqliteInbox[];
let receivers: ReceiverProcess[];

beforeEach(() => {
  dir = tempDir();
  path = join(dir.dir, "inbox.db");
  opened = [];
  receivers = [];
});
afterEach(async () => {
  for (const r of receivers) await r.stop();
  for (const inbox of opened) await inbox.close();
  dir.cleanup();
});

const open = (options: ConstructorParameters<typeof SqliteInbox>[1] = {}) => {
  const inbox = new SqliteInbox(path, options);
  opened.push(inbox);
  return inbox;
};
const ids = () => {
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    return (db.prepare("SELECT id FROM deliveries ORDER BY id").all() as { id: string }[]).map((r) => r.id);
  } finally {
    db.close();
  }
};
// poison makes one ID impossible to store, through a second connection, as a bad row would be.
const poison = (id: string) => {
  const db = new DatabaseSync(path);
  db.exec(`CREATE TRIGGER poison BEFORE INSERT ON delivery_rows WHEN NEW.id = '${id}'
           BEGIN SELECT RAISE(ABORT, 'this row cannot be stored'); END`);
  db.close();
};
const post = async (url: string, id: string, n = 0) => {
  const res = await fetch(`${url}/`, {
    method: "POST",
    headers: { "x-delivery-id": id, "content-type": "application/json" },
    body: body(n),
  });
  return { status: res.status, text: await res.text(), retryAfter: res.headers.get("retry-after") };
};

describe("store() in one batch", () => {
  it("stores a delivery once when its duplicate arrives in the same batch", async () => {
    const inbox = open();
    // Called in one tick, so they share one transaction.
    const outcomes = await Promise.all([
      inbox.store({ id: "evt_1", body: body(1) }),
      inbox.store({ id: "evt_1", body: body(1) }),
      inbox.store({ id: "evt_2", body: body(2) }),
    ]);
    assert.deepEqual(outcomes, ["stored", "duplicate", "stored"]);
    assert.deepEqual(ids(), ["evt_1", "evt_2"]);
  });

  it("commits the rest of a batch when one row fails, and rejects only that one", async () => {
    const inbox = open();
    poison("evt_bad");
    const outcomes = await Promise.allSettled(
      ["evt_a", "evt_b", "evt_bad", "evt_c"].map((id, n) => inbox.store({ id, body: body(n) })),
    );
    assert.deepEqual(
      outcomes.map((o) => o.status),
      ["fulfilled", "fulfilled", "rejected", "fulfilled"],
    );
    assert.match(String((outcomes[2] as PromiseRejectedResult).reason), /this row cannot be stored/);
    assert.deepEqual(ids(), ["evt_a", "evt_b", "evt_c"]);
  });

  it("control: without the bad row, the whole batch is stored", async () => {
    const inbox = open();
    poison("evt_never_sent");
    const outcomes = await Promise.all(["evt_a", "evt_b", "evt_c"].map((id, n) => inbox.store({ id, body: body(n) })));
    assert.deepEqual(outcomes, ["stored", "stored", "stored"] satisfies Stored[]);
  });
});

describe("receiver.ts under concurrent requests", () => {
  it("answers 200 to each copy of a delivery sent at once, and stores it once", async () => {
    const r = await startReceiver(path, ["--quiet"]);
    receivers.push(r);
    const answers = await Promise.all(Array.from({ length: 8 }, () => post(r.url, "evt_same", 1)));
    assert.ok(answers.every((a) => a.status === 200));
    assert.deepEqual(answers.map((a) => a.text).sort(), [
      "duplicate",
      "duplicate",
      "duplicate",
      "duplicate",
      "duplicate",
      "duplicate",
      "duplicate",
      "stored",
    ]);
    assert.deepEqual(ids(), ["evt_same"]);
  });

  it("answers 200 to the good deliveries of a batch and 503 with Retry-After to the one that fails", async () => {
    open().close(); // create the schema, so the trigger has a table to sit on
    poison("evt_bad");
    const r = await startReceiver(path, ["--quiet"]);
    receivers.push(r);
    const sent = ["evt_1", "evt_2", "evt_bad", "evt_3", "evt_4"];
    const answers = await Promise.all(sent.map((id, n) => post(r.url, id, n)));
    assert.deepEqual(
      answers.map((a) => a.status),
      [200, 200, 503, 200, 200],
    );
    assert.ok(answers[2]!.retryAfter);
    assert.deepEqual(ids(), ["evt_1", "evt_2", "evt_3", "evt_4"]);
  });

  it("counts against --max-in-flight only requests whose body is complete: two held after their headers leave room", async () => {
    const r = await startReceiver(path, ["--quiet", "--max-in-flight", "2"]);
    receivers.push(r);
    const held = await Promise.all(["evt_held_1", "evt_held_2"].map((id) => hold(r.port, id)));
    assert.equal((await post(r.url, "evt_third")).text, "stored");
    assert.deepEqual(await Promise.all(held.map((h) => h.finish())), ["stored", "stored"]);
    assert.deepEqual(ids(), ["evt_held_1", "evt_held_2", "evt_third"]);
  });

  it("(control) with --in-flight-from-headers, as before, two held requests fill it: 503 with Retry-After, then it serves them", async () => {
    const r = await startReceiver(path, ["--quiet", "--max-in-flight", "2", "--in-flight-from-headers"]);
    receivers.push(r);
    // Two requests are held in flight: headers sent, body not yet (the 100 Continue says they are in).
    const held = await Promise.all(["evt_held_1", "evt_held_2"].map((id) => hold(r.port, id)));
    const refused = await post(r.url, "evt_refused");
    assert.equal(refused.status, 503);
    assert.ok(Number(refused.retryAfter) > 0);
    const answers = await Promise.all(held.map((h) => h.finish()));
    assert.deepEqual(answers, ["stored", "stored"]);
    // Control: with room again, the refused one is taken.
    assert.equal((await post(r.url, "evt_refused")).text, "stored");
    assert.deepEqual(ids(), ["evt_held_1", "evt_held_2", "evt_refused"]);
  });
});

// hold sends a request's headers with Expect: 100-continue and waits for the 100, so the receiver holds
// it in flight; finish sends the body and resolves with the answer's body.
async function hold(port: number, id: string): Promise<{ finish(): Promise<string> }> {
  const socket: Socket = connect(port, "127.0.0.1");
  let data = "";
  let onData: () => void = () => {};
  socket.on("data", (d: Buffer) => {
    data += d.toString("latin1");
    onData();
  });
  const until = (test: () => boolean) =>
    new Promise<void>((resolve) => {
      onData = () => test() && resolve();
      onData();
    });
  const payload = body(0);
  socket.write(
    `POST / HTTP/1.1\r\nHost: x\r\nX-Delivery-Id: ${id}\r\nExpect: 100-continue\r\nContent-Length: ${payload.length}\r\n\r\n`,
  );
  await until(() => data.startsWith("HTTP/1.1 100"));
  return {
    finish: async () => {
      socket.write(payload);
      await until(() => /\r\n\r\n(stored|duplicate)$/.test(data));
      socket.destroy();
      return /(stored|duplicate)$/.exec(data)![1]!;
    },
  };
}

describe("run() in batches", () => {
  let t: number;
  beforeEach(() => (t = T0));
  const quiet = () => {};
  // leasedUntil reads a delivery's lease straight from the file.
  const leasedUntil = (id: string) => {
    const db = new DatabaseSync(path, { readOnly: true });
    try {
      return (db.prepare("SELECT leased_until FROM deliveries WHERE id = ?").get(id) as { leased_until: number | null })
        .leased_until;
    } finally {
      db.close();
    }
  };
  // beat waits until the heartbeat has pushed the lease past `until` on the pinned clock.
  const beat = async (id: string, until: number) => {
    for (let tries = 0; (leasedUntil(id) ?? 0) < until; tries++) {
      if (tries === 2_000) assert.fail("the heartbeat never extended the lease");
      await new Promise((resolve) => setImmediate(resolve));
    }
  };

  it("commits a batch's finishes together with the next claim, each payment once", async () => {
    const inbox = open({ now: () => t });
    await ensurePayments(inbox);
    for (let i = 0; i < 12; i++) await inbox.store({ id: `evt_${i}`, body: body(i) });
    let begins = 0;
    const exec = inbox.db.exec.bind(inbox.db);
    inbox.db.exec = (sql: string) => {
      if (/^BEGIN/.test(sql)) begins++;
      return exec(sql);
    };
    // Claims of four (claimBatch: 4), so the count below does not depend on how fast the handlers ran.
    const stats = await run(recordPayment, { inbox, once: true, concurrency: 4, claimBatch: 4, log: quiet });
    assert.equal(stats.done, 12);
    // A claim, then three commits that each finish four and claim the next, the last of which finds the
    // queue empty: 4. Kept apart, the four claims and three batches of finishes would take 7.
    assert.equal(begins, 4);
    const db = new DatabaseSync(path, { readOnly: true });
    assert.deepEqual(
      { ...db.prepare("SELECT count(*) AS n, count(DISTINCT delivery_id) AS distinct_ids FROM payments").get() },
      { n: 12, distinct_ids: 12 },
    );
    db.close();
  });

  // counted opens an inbox that counts its transactions and its claims.
  const counted = () => {
    const inbox = open({ now: () => t });
    const count = { begins: 0, claims: 0, limits: [] as number[] };
    const exec = inbox.db.exec.bind(inbox.db);
    inbox.db.exec = (sql: string) => {
      if (/^BEGIN/.test(sql)) count.begins++;
      return exec(sql);
    };
    const claimBatch = inbox.claimBatch.bind(inbox);
    inbox.claimBatch = (limit, ...rest) => {
      count.claims++;
      count.limits.push(limit);
      return claimBatch(limit, ...rest);
    };
    return { inbox, count };
  };
  // ticks waits n turns of the event loop, as a handler waiting on I/O does.
  const ticks = async (n: number) => {
    for (let i = 0; i < n; i++) await new Promise((resolve) => setImmediate(resolve));
  };

  it("commits the done marks of handlers that wait on I/O with the next claim, not one commit a turn", async () => {
    const { inbox, count } = counted();
    for (let i = 0; i < 24; i++) await inbox.store({ id: `evt_${i}`, body: body(i) });
    count.begins = 0;
    // Handlers that end in different turns; pollMaxMs so long that no done mark goes for want of a claim.
    const stats = await run(
      async (job) => {
        await ticks(1 + (Number(job.delivery.id.slice(4)) % 5));
      },
      { inbox, once: true, concurrency: 3, claimBatch: 8, pollMaxMs: 60_000, log: quiet },
    );
    assert.equal(stats.done, 24);
    // Every commit is a claim's; the done marks went with them (24 of their own, one a turn, before).
    assert.equal(count.begins, count.claims);
  });

  it("control: a write of the handler's own outside job.write is a commit the count sees", async () => {
    const { inbox, count } = counted();
    for (let i = 0; i < 6; i++) await inbox.store({ id: `evt_${i}`, body: body(i) });
    count.begins = 0;
    await run(
      async (job) => {
        await ticks(1);
        await inbox.extend(job.delivery);
      },
      { inbox, once: true, concurrency: 3, claimBatch: 8, pollMaxMs: 60_000, log: quiet },
    );
    assert.ok(count.begins > count.claims, `${count.begins} commits, ${count.claims} claims`);
  });

  it("claims more than concurrency at once when a claim costs more than the handlers' work", async () => {
    const { inbox, count } = counted();
    for (let i = 0; i < 40; i++) await inbox.store({ id: `evt_${i}`, body: body(i) });
    // Each claim takes 30 ms (a slow disk's fsync), each handler 10 ms: sized by the handlers alone (5 ms of
    // their work a place), a claim would stay at concurrency, and the worker would wait on a claim for
    // every two deliveries.
    const claimBatch = inbox.claimBatch;
    inbox.claimBatch = async (...args) => {
      await new Promise((resolve) => setTimeout(resolve, 30));
      return claimBatch(...args);
    };
    const stats = await run(() => new Promise((resolve) => setTimeout(resolve, 10)), {
      inbox,
      once: true,
      concurrency: 2,
      claimBatch: 32,
      log: quiet,
    });
    assert.equal(stats.done, 40);
    assert.equal(count.limits[0], 2); // the first claim, before anything is known, is concurrency's
    assert.ok(Math.max(...count.limits) > 2, `claims of ${count.limits.join(", ")}`);
  });

  it("keeps a long handler's lease by heartbeat while the short ones around it finish", async () => {
    const inbox = open({ now: () => t });
    const other = open({ now: () => t });
    await ensurePayments(inbox);
    for (let i = 0; i < 4; i++) await inbox.store({ id: `evt_${i}`, body: body(i) });
    const stats = await run(
      async (job) => {
        if (job.delivery.id !== "evt_0") return recordPayment(job);
        // Three lease lengths pass on the clock; each time the heartbeat renews the lease first.
        for (let i = 0; i < 3; i++) {
          t += 800;
          await beat("evt_0", t + 1_000);
          assert.equal(await other.claim(1_000), undefined);
        }
        recordPayment(job);
      },
      { inbox, once: true, concurrency: 4, leaseMs: 1_000, heartbeatMs: 2, log: quiet },
    );
    assert.deepEqual(stats, { claimed: 4, done: 4, retried: 0, failed: 0, lost: 0, released: 0 });
  });

  it("control: without a heartbeat, another worker takes the long handler's delivery over", async () => {
    const inbox = open({ now: () => t });
    const other = open({ now: () => t });
    await ensurePayments(inbox);
    await inbox.store({ id: "evt_0", body: body(0) });
    let taken: string | undefined;
    await run(
      async () => {
        t += 1_600;
        taken = (await other.claim(1_000))?.id;
      },
      { inbox, once: true, leaseMs: 1_000, heartbeatMs: 3_600_000, log: quiet },
    );
    assert.equal(taken, "evt_0");
  });

  it("aborts job.signal when the heartbeat finds the lease lost, and commits nothing for it", async () => {
    const inbox = open({ now: () => t });
    const other = open({ now: () => t });
    await ensurePayments(inbox);
    for (let i = 0; i < 3; i++) await inbox.store({ id: `evt_${i}`, body: body(i) });
    let reason: unknown;
    const stats = await run(
      async (job) => {
        if (job.delivery.id !== "evt_0") return recordPayment(job);
        t += 1_500;
        assert.equal((await other.claim(60_000))?.id, "evt_0"); // expired, so another worker takes it
        await new Promise((resolve) => job.signal.addEventListener("abort", resolve, { once: true }));
        reason = job.signal.reason;
        recordPayment(job); // too late: this write must not commit
      },
      { inbox, once: true, concurrency: 3, leaseMs: 1_000, heartbeatMs: 2, log: quiet },
    );
    assert.match(String(reason), /the lease was lost/);
    assert.deepEqual({ done: stats.done, lost: stats.lost }, { done: 2, lost: 1 });
    const db = new DatabaseSync(path, { readOnly: true });
    assert.deepEqual(
      (db.prepare("SELECT delivery_id FROM payments ORDER BY delivery_id").all() as { delivery_id: string }[]).map(
        (r) => r.delivery_id,
      ),
      ["evt_1", "evt_2"],
    );
    db.close();
  });
});
