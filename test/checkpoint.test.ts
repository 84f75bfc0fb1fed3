// test/checkpoint.test.ts: with backgroundCheckpoints, the WAL is copied into the database by a thread
// of its own, not inside a commit that acks wait on. The control shows commits alone leave it in the WAL.

import assert from "node:assert/strict";
import { statSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, beforeEach, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { tempDir } from "./helpers.ts";

let dir: { dir: string; cleanup: () => void };
let path: string;

beforeEach(() => {
  dir = tempDir();
  path = join(dir.dir, "inbox.db");
});
afterEach(() => dir.cleanup());

// 300 stores of 4 KB: a few hundred WAL pages, far below the 4,000 at which a commit checkpoints.
async function fill(inbox: SqliteInbox): Promise<void> {
  for (let i = 0; i < 300; i++) await inbox.store({ id: `evt_${i}`, body: Buffer.alloc(4096, i % 256) });
}

// until polls for an outcome instead of sleeping a fixed time; it gives up after 10 s.
async function until(check: () => boolean): Promise<boolean> {
  for (let waited = 0; waited < 10_000; waited += 20) {
    if (check()) return true;
    await sleep(20);
  }
  return check();
}

describe("backgroundCheckpoints", () => {
  it("copies committed pages into the database file without a commit doing it", async () => {
    const inbox = new SqliteInbox(path, { backgroundCheckpoints: true });
    try {
      const before = statSync(path).size;
      await fill(inbox);
      assert.ok(
        await until(() => statSync(path).size > before + 300 * 4096),
        "the database file took in the WAL's pages",
      );
    } finally {
      await inbox.close();
    }
  });

  it("(control) without it, the same commits leave their pages in the WAL", async () => {
    const inbox = new SqliteInbox(path);
    try {
      const before = statSync(path).size;
      await fill(inbox);
      await sleep(300); // three times the checkpointer's interval: long enough for it to have shown
      assert.equal(statSync(path).size, before);
      assert.ok(statSync(`${path}-wal`).size > 300 * 4096);
    } finally {
      await inbox.close();
    }
  });

  it("close() ends the thread without an error, on every runtime", async () => {
    // Each runtime's node:worker_threads is its own; the thread's program keeps to what all three have.
    const inbox = new SqliteInbox(path, { backgroundCheckpoints: true });
    await fill(inbox);
    await inbox.close();
  });

  it("refuses a value that is not a boolean", () => {
    assert.throws(
      () => new SqliteInbox(path, { backgroundCheckpoints: "yes" as unknown as boolean }),
      /expected backgroundCheckpoints to be a boolean, got string/,
    );
  });
});
