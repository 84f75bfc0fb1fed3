// test/postgres-process.test.ts: the scripts on PostgreSQL as real processes: one clock (the database's)
// for hosts whose clocks are minutes off, migrations run once by ten processes starting at once, a schema
// newer than the code refused in one line, and errors in one line that never show a URL's password.
//   npx node --import tsx --test test/postgres-process.test.ts

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { join } from "node:path";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Inbox } from "../lib/store.ts";
import { PostgresInbox } from "../lib/postgres/postgres.ts";
import { prepareLedgerOn, startWorker } from "./chaos.ts";
import { ROOT, freePort, freshSchema, postgresSkip, runScript, startReceiver } from "./helpers.ts";

const pgSkip = await postgresSkip();
const SKEW = join(ROOT, "test/fixtures/skew-clock.ts");
const TEN_MINUTES = 10 * 60_000;
// A worker process whose clock is `skewMs` off, through the preload.
const skewed = (skewMs: number) => ({
  NODE_OPTIONS: `${process.env.NODE_OPTIONS ?? ""} --import=${SKEW}`.trim(),
  CLOCK_SKEW_MS: String(skewMs),
});
const until = async (condition: () => Promise<boolean> | boolean) => {
  while (!(await condition())) await new Promise((resolve) => setTimeout(resolve, 50));
};
const lines = (text: string) => text.split("\n").filter((l) => l.trim() !== "");

describe("a worker whose clock is ten minutes off", { skip: pgSkip }, () => {
  it("really runs with its clock off (the control)", async () => {
    const child = spawn(process.execPath, ["-e", "console.log(Date.now())"], {
      env: { ...process.env, ...skewed(TEN_MINUTES) },
    });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    await new Promise((resolve) => child.on("close", resolve));
    assert.ok(Number(out) - Date.now() > TEN_MINUTES - 60_000, `the preload moved Date.now ahead: ${out}`);
  });

  for (const skew of [TEN_MINUTES, -TEN_MINUTES]) {
    const ahead = skew > 0 ? "ahead" : "behind";
    it(`(${ahead}) never takes a live lease, and takes over a dead one when the database's clock says it ended`, async () => {
      const schema = await freshSchema("skew");
      const inbox = await connect(schema.url);
      try {
        await prepareLedgerOn(inbox);
        // A live lease, held for a minute by a worker on a true clock (this process, on the database's clock).
        await inbox.store({ id: "live", body: Buffer.from(JSON.stringify({ amount: 1 })) });
        const live = (await inbox.claim(60_000))!;
        assert.equal(live.id, "live");
        // A dead one: its worker "crashed" holding a 1.5 s lease.
        await inbox.store({ id: "dead", body: Buffer.from(JSON.stringify({ amount: 10 })) });
        const dead = (await inbox.claim(1_500))!;
        assert.equal(dead.id, "dead");
        await inbox.store({ id: "free", body: Buffer.from(JSON.stringify({ amount: 100 })) });

        const worker = startWorker(schema.url, ["--lease-ms", "1000"], skewed(skew));
        const status = async (id: string) =>
          (await inbox.query("SELECT status FROM deliveries WHERE id = ?", id))[0]!.status;
        await until(async () => (await status("dead")) === "done" && (await status("free")) === "done");
        worker.child.kill("SIGTERM");
        assert.equal(await worker.exited, 0);

        const [d] = await inbox.query("SELECT attempts, finished_at FROM deliveries WHERE id = 'dead'");
        assert.equal(Number(d!.attempts), 2, "taken over once");
        assert.ok(Number(d!.finished_at) >= dead.leasedUntil!, "not before its lease ended on the database's clock");
        assert.ok(Number(d!.finished_at) - dead.leasedUntil! < TEN_MINUTES / 2, "and not ten minutes late either");
        assert.ok(!worker.lines.some((l) => l.startsWith("claim live")), worker.lines.join("\n"));
        assert.equal(await status("live"), "processing", "the live lease is still its holder's");
        assert.equal(await inbox.finish(live), true, "and its holder finishes it");
        const [account] = await inbox.query("SELECT balance FROM accounts");
        assert.equal(Number(account!.balance), 110);
      } finally {
        await inbox.close();
        await schema.drop();
      }
    });
  }

  it("(ahead) schedules a retry on the database's clock", async () => {
    const schema = await freshSchema("skew_retry");
    const inbox = await connect(schema.url);
    try {
      // The balance fixture fails a delivery whose body has no amount (a handler error, so a retry).
      await prepareLedgerOn(inbox);
      await inbox.store({ id: "bad", body: Buffer.from(JSON.stringify({ note: "no amount" })) });
      const worker = startWorker(
        schema.url,
        ["--lease-ms", "1000", "--once", "--retry-delay-ms", "60000"],
        skewed(TEN_MINUTES),
      );
      assert.equal(await worker.exited, 0);
      const [row] = await inbox.query(
        "SELECT status, available_at - (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS due_in FROM deliveries WHERE id = 'bad'",
      );
      assert.equal(row!.status, "received", worker.lines.join("\n"));
      const dueIn = Number(row!.due_in);
      assert.ok(
        dueIn > 0 && dueIn <= 60_000 * 1.2,
        `due about a minute from the database's now, not eleven: ${dueIn} ms`,
      );
    } finally {
      await inbox.close();
      await schema.drop();
    }
  });
});

describe("migrations on PostgreSQL", { skip: pgSkip }, () => {
  const versions = async (inbox: Inbox) =>
    (await inbox.query("SELECT version FROM inbox_migrations ORDER BY version")).map((r) => Number(r.version));

  it("run once when ten connections open a fresh schema at once", async () => {
    const schema = await freshSchema("migrate");
    try {
      const inboxes = await Promise.all(Array.from({ length: 10 }, () => PostgresInbox.open(schema.url)));
      const applied = await versions(inboxes[0]!);
      assert.deepEqual(
        applied,
        applied.map((_, i) => i + 1),
        "each version applied exactly once, in order",
      );
      assert.ok(applied.length >= 1);
      await Promise.all(inboxes.map((i) => i.close()));
    } finally {
      await schema.drop();
    }
  });

  it("run once when ten processes start on a fresh schema at once", async () => {
    const schema = await freshSchema("migrate_procs");
    try {
      const runs = await Promise.all(
        Array.from({ length: 10 }, () => runScript("inbox.ts", ["status", "--db", schema.url])),
      );
      for (const r of runs) assert.equal(r.code, 0, r.stderr);
      const inbox = await connect(schema.url);
      const applied = await versions(inbox);
      await inbox.close();
      assert.deepEqual(
        applied,
        applied.map((_, i) => i + 1),
      );
    } finally {
      await schema.drop();
    }
  });

  it("refuse a schema newer than the code, in one line and exit code 1, in every script", async () => {
    const schema = await freshSchema("newer");
    try {
      const inbox = await connect(schema.url);
      await inbox.query("INSERT INTO inbox_migrations (version) VALUES (999)");
      await inbox.close();
      const runs = {
        receiver: await runScript("receiver.ts", ["--port", "0", "--db", schema.url]),
        worker: await runScript("worker.ts", ["--once", "--db", schema.url]),
        inbox: await runScript("inbox.ts", ["status", "--db", schema.url]),
      };
      for (const [name, r] of Object.entries(runs)) {
        assert.equal(r.code, 1, `${name}: ${r.stderr}`);
        const said = lines(r.stderr).filter((l) => !l.startsWith("warning:"));
        assert.equal(said.length, 1, `${name} says one line: ${r.stderr}`);
        assert.match(said[0]!, /schema version 999 is newer than this code knows/);
      }
    } finally {
      await schema.drop();
    }
  });
});

describe("errors on PostgreSQL", { skip: pgSkip }, () => {
  const SECRET = "hunter2-s3cret";
  const withPassword = (url: string) => {
    const u = new URL(url);
    u.password = SECRET;
    return u.toString();
  };

  it("are one line and never show the URL's password, when the server cannot be reached", async () => {
    const url = withPassword(`postgres://postgres@127.0.0.1:${await freePort()}/test?schema=nowhere`);
    const runs = {
      receiver: await runScript("receiver.ts", ["--port", "0", "--db", url]),
      worker: await runScript("worker.ts", ["--once", "--db", url]),
      inbox: await runScript("inbox.ts", ["status", "--db", url]),
    };
    for (const [name, r] of Object.entries(runs)) {
      assert.equal(r.code, 1, `${name}: ${r.stderr}`);
      assert.ok(!(r.stdout + r.stderr).includes(SECRET), `${name} keeps the password out: ${r.stderr}`);
      const said = lines(r.stderr).filter((l) => !l.startsWith("warning:"));
      assert.equal(said.length, 1, `${name} says one line: ${r.stderr}`);
      assert.match(said[0]!, /ECONNREFUSED|connect/);
      assert.match(said[0]!, /:\*\*\*@/, `${name} names the target, password hidden: ${said[0]}`);
    }
  });

  it("never show the password while the scripts run, nor when a store fails at run time", async () => {
    const schema = await freshSchema("secret");
    const url = withPassword(schema.url);
    try {
      const receiver = await startReceiver(url);
      const ok = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "a" }, body: "{}" });
      assert.equal(ok.status, 200);
      // The table goes away under the receiver: the next store fails, in one line that says why.
      const inbox = await connect(schema.url);
      await inbox.query("ALTER TABLE delivery_rows RENAME TO deliveries_gone");
      const failed = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "b" }, body: "{}" });
      assert.equal(failed.status, 503);
      await inbox.query("ALTER TABLE deliveries_gone RENAME TO delivery_rows");
      await inbox.close();
      await receiver.stop();
      const worker = await runScript("worker.ts", ["--once", "--db", url]);
      const status = await runScript("inbox.ts", ["status", "--db", url]);
      assert.equal(worker.code, 0, worker.stderr);
      assert.equal(status.code, 0, status.stderr);
      const logged = [receiver.log(), worker.stdout, worker.stderr, status.stdout, status.stderr].join("\n");
      assert.ok(!logged.includes(SECRET), `no password in any output:\n${logged}`);
      const rejected = lines(receiver.log()).find((l) => l.startsWith("rejected b"));
      assert.ok(rejected, receiver.log());
      assert.match(rejected, /^rejected b: 503 could not store: relation "delivery_rows" does not exist$/);
    } finally {
      await schema.drop();
    }
  });
});
