// test/durability.test.ts: the same durability on every runtime. Node, Deno and Bun each bundle their own
// SQLite behind node:sqlite, so an inbox reads back what it was opened with and refuses a database that
// cannot keep a 200's promise. Part of the portable subset (test/runtimes.test.ts runs it on each runtime).

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { describeRuntime } from "../lib/runtime.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { durabilityProblem, walResetFixed, type Durability } from "../lib/sqlite/schema.ts";
import { runScript, startReceiver, tempDir } from "./helpers.ts";

describe(`opening a SQLite inbox on ${describeRuntime()}`, () => {
  it("reads back WAL, synchronous=FULL, a thread-safe SQLite with the WAL-reset fix, and whose SQLite it is", async () => {
    const dir = tempDir();
    const inbox = new SqliteInbox(join(dir.dir, "inbox.db"));
    try {
      const d = inbox.durability;
      assert.equal(d.runtime, describeRuntime());
      assert.equal(d.journalMode, "wal");
      assert.equal(d.synchronous, 2);
      assert.equal(d.threadsafe, true);
      assert.ok(walResetFixed(d.sqliteVersion), `SQLite ${d.sqliteVersion}`);
      assert.equal(durabilityProblem(d), undefined);
      // Read back from the database itself, not from what was asked for.
      assert.equal(Object.values(inbox.db.prepare("SELECT sqlite_version()").get()!)[0], d.sqliteVersion);
    } finally {
      await inbox.close();
      dir.cleanup();
    }
  });

  it("refuses :memory: at start-up in one line (its journal is not a WAL on disk), and listens on nothing", async () => {
    // The child runs on this same runtime, so on the SQLite this process has.
    const dir = tempDir();
    const probe = new SqliteInbox(join(dir.dir, "inbox.db"));
    const sqlite = probe.durability.sqliteVersion;
    await probe.close();
    dir.cleanup();
    const { code, stdout, stderr } = await runScript("receiver.ts", ["--port", "0", "--db", ":memory:"]);
    assert.equal(code, 1);
    assert.equal(stdout, "");
    assert.equal(
      stderr,
      `receiver: cannot use the database: open :memory:: journal_mode is memory, not wal, on SQLite ${sqlite} (${describeRuntime()}): a 200 would not mean the delivery is safe on disk\n`,
    );
    assert.equal(existsSync(join(process.cwd(), ":memory:")), false);
  });

  it("(control) the same receiver on a file starts, stores and stops cleanly", async () => {
    const dir = tempDir();
    const receiver = await startReceiver(join(dir.dir, "inbox.db"));
    try {
      const response = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": "evt_1" }, body: "{}" });
      assert.equal(await response.text(), "stored");
    } finally {
      assert.equal(await receiver.stop(), 0);
      dir.cleanup();
    }
  });
});

describe("durabilityProblem()", () => {
  const good: Durability = {
    runtime: "node 24.21.0",
    sqliteVersion: "3.53.4",
    journalMode: "wal",
    synchronous: 2,
    threadsafe: true,
  };

  it("(control) finds nothing wrong with what a file on a current runtime reads back", () => {
    assert.equal(durabilityProblem(good), undefined);
    assert.equal(durabilityProblem({ ...good, synchronous: 3 }), undefined); // EXTRA is FULL and more
  });

  it("names the setting that cannot hold, the SQLite and the runtime, in one clause", () => {
    assert.equal(
      durabilityProblem({ ...good, journalMode: "delete" }),
      "journal_mode is delete, not wal, on SQLite 3.53.4 (node 24.21.0)",
    );
    assert.equal(
      durabilityProblem({ ...good, synchronous: 1 }),
      "synchronous is 1, not FULL (2), on SQLite 3.53.4 (node 24.21.0)",
    );
    assert.equal(
      durabilityProblem({ ...good, sqliteVersion: "3.45.1", runtime: "bun 1.1.0" }),
      "SQLite 3.45.1 (bun 1.1.0) has the WAL-reset bug (fixed in 3.51.3, 3.50.7 and 3.44.6)",
    );
    assert.match(durabilityProblem({ ...good, threadsafe: false })!, /built without thread safety \(THREADSAFE=0\)/);
  });

  it("knows which versions have the WAL-reset fix, backports included", () => {
    const fixed = ["3.51.3", "3.52.0", "3.53.2", "3.54.1", "3.50.7", "3.50.9", "3.44.6", "4.0.0"];
    const broken = ["3.51.2", "3.50.6", "3.49.2", "3.45.1", "3.44.5", "3.7.0"];
    assert.deepEqual(
      fixed.filter((v) => !walResetFixed(v)),
      [],
    );
    assert.deepEqual(
      broken.filter((v) => walResetFixed(v)),
      [],
    );
    assert.throws(() => walResetFixed("3.x"), {
      name: "TypeError",
      message: 'walResetFixed: expected a version like 3.51.3, got "3.x"',
    });
  });
});
