// test/receiver-connection.test.ts: the options receiver.ts opens its SQLite connection with. With syncOffLoop
// a commit does not fsync, and each write settles only once an fdatasync of the WAL, run on libuv's thread
// pool, has finished after its commit; the pool is held up by opens of named pipes that no one writes to
// (holdThreadPool, test/helpers.ts), so what waits for it is plain to see. (Whether that is as durable as
// synchronous=FULL is for the power-loss tests to show.) pageCacheKb sizes the connection's page cache.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { closeSync, constants, fstatSync, mkdirSync, openSync, statSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterEach, beforeEach, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { durabilityProblem } from "../lib/sqlite/schema.ts";
import { holdThreadPool, tempDir, turns } from "./helpers.ts";

let dir: { dir: string; cleanup: () => void };
let path: string;
let opened: SqliteInbox[];
const inbox = (options: ConstructorParameters<typeof SqliteInbox>[1] = {}, at = path) => {
  const it = new SqliteInbox(at, options);
  opened.push(it);
  return it;
};

beforeEach(() => {
  dir = tempDir();
  path = join(dir.dir, "inbox.db");
  opened = [];
});
afterEach(async () => {
  for (const it of opened) await it.close().catch(() => {});
  dir.cleanup();
});

// stored reads, through a connection of its own, whether a delivery is committed.
function stored(id: string): boolean {
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    return db.prepare("SELECT 1 FROM deliveries WHERE id = ?").get(id) !== undefined;
  } finally {
    db.close();
  }
}

const synchronous = (db: DatabaseSync) =>
  (db.prepare("PRAGMA synchronous").get() as { synchronous: number }).synchronous;

describe("syncOffLoop", () => {
  it("commits a store at once but settles it only after the fdatasync that follows", async () => {
    const fast = inbox({ syncOffLoop: true });
    const pool = await holdThreadPool(dir.dir);
    try {
      let settled = false;
      const result = fast.store({ id: "evt_1", body: Buffer.from("{}") }).finally(() => (settled = true));
      await turns(5);
      assert.equal(stored("evt_1"), true, "the commit happened on the event loop");
      assert.equal(settled, false, "no answer before the fdatasync, which waits for a free thread");
      await pool.release();
      assert.equal(await result, "stored");
    } finally {
      await pool.release();
    }
  });

  it("(control) at synchronous=FULL a store settles with its commit, whatever the thread pool is doing", async () => {
    const full = inbox();
    const pool = await holdThreadPool(dir.dir);
    try {
      let settled = false;
      const result = full.store({ id: "evt_1", body: Buffer.from("{}") }).finally(() => (settled = true));
      await turns(5);
      assert.equal(settled, true);
      assert.equal(await result, "stored");
    } finally {
      await pool.release();
    }
  });

  it("syncs a commit made during an fdatasync with a second one at once, and holds writes while two run", async () => {
    const fast = inbox({ syncOffLoop: true });
    const pool = await holdThreadPool(dir.dir);
    try {
      const first = fast.store({ id: "evt_1", body: Buffer.from("{}") });
      await turns(3);
      // Committed at once, with an fdatasync of its own beside the first one's, which may have begun before it.
      const second = fast.store({ id: "evt_2", body: Buffer.from("{}") });
      await turns(3);
      assert.equal(stored("evt_2"), true);
      // Two are running: a third would be covered by neither, so the write waits to be committed after one.
      const third = fast.store({ id: "evt_3", body: Buffer.from("{}") });
      let flushed = false;
      const flush = fast.flush().then(() => (flushed = true));
      await turns(5);
      assert.equal(stored("evt_3"), false);
      assert.equal(flushed, false, "flush() waits for the fdatasyncs in flight");
      await pool.release();
      assert.deepEqual(await Promise.all([first, second, third, flush]), ["stored", "stored", "stored", true]);
      assert.equal(stored("evt_3"), true);
    } finally {
      await pool.release();
    }
  });

  it("keeps its own connection at NORMAL, says so in its durability, and leaves every other connection at FULL", () => {
    const fast = inbox({ syncOffLoop: true });
    const worker = inbox();
    assert.equal(synchronous(fast.db), 1);
    assert.equal(synchronous(worker.db), 2);
    assert.deepEqual([fast.durability.synchronous, fast.durability.ownWalSync], [1, true]);
    assert.deepEqual([worker.durability.synchronous, worker.durability.ownWalSync], [2, undefined]);
    assert.equal(durabilityProblem(fast.durability), undefined);
    assert.match(durabilityProblem({ ...fast.durability, ownWalSync: undefined })!, /synchronous is 1, not FULL \(2\)/);
  });

  it("after a failed fdatasync, rejects its writes and every later one, and is not ready", async () => {
    const fast = inbox({ syncOffLoop: true });
    assert.equal(
      await fast.store({ id: "evt_ok", body: Buffer.from("{}") }),
      "stored",
      "control: the same store goes through",
    );
    // A named pipe in place of the WAL: fdatasync on it fails (EINVAL), as a disk's write error would.
    const fifo = join(dir.dir, "not-a-file");
    execFileSync("mkfifo", [fifo]);
    const pipe = openSync(fifo, constants.O_RDWR | constants.O_NONBLOCK);
    const fds = (fast as unknown as { idleFds: number[] }).idleFds;
    const own = [...fds];
    fds.fill(pipe);
    try {
      await assert.rejects(
        fast.store({ id: "evt_1", body: Buffer.from("{}") }),
        /fdatasync of the WAL failed.*nothing is acked until a restart/,
      );
      fds.splice(0, fds.length, ...own);
      await assert.rejects(fast.store({ id: "evt_2", body: Buffer.from("{}") }), /fdatasync of the WAL failed/);
      assert.match(String(await fast.ready()), /fdatasync of the WAL failed/);
      assert.equal(stored("evt_2"), false, "nothing more is committed");
    } finally {
      fds.splice(0, fds.length, ...own);
      closeSync(pipe);
    }
  });

  it("syncs the WAL beside the file a symbolic link points to, where SQLite keeps it", async () => {
    mkdirSync(join(dir.dir, "real"));
    const real = join(dir.dir, "real", "inbox.db");
    const link = join(dir.dir, "link.db");
    new DatabaseSync(real).close();
    symlinkSync(real, link);
    const fast = inbox({ syncOffLoop: true }, link);
    assert.equal(await fast.store({ id: "evt_1", body: Buffer.from("{}") }), "stored");
    for (const fd of (fast as unknown as { walFds: number[] }).walFds)
      assert.equal(fstatSync(fd).ino, statSync(`${real}-wal`).ino);
    assert.throws(() => statSync(`${link}-wal`), /ENOENT/);
  });

  it("refuses a value that is not a boolean", () => {
    assert.throws(
      () => new SqliteInbox(path, { syncOffLoop: 1 as unknown as boolean }),
      /expected syncOffLoop to be a boolean, got number/,
    );
  });
});

describe("pageCacheKb", () => {
  it("sizes this connection's page cache, and leaves the others at openDatabase's", () => {
    const receiver = inbox({ pageCacheKb: 4_000 });
    const worker = inbox();
    const cacheSize = (db: DatabaseSync) =>
      (db.prepare("PRAGMA cache_size").get() as { cache_size: number }).cache_size;
    assert.equal(cacheSize(receiver.db), -4_000);
    assert.equal(cacheSize(worker.db), -16_000);
  });

  it("refuses a value that is not a number of 0 or more", () => {
    assert.throws(() => new SqliteInbox(path, { pageCacheKb: -1 }), /expected pageCacheKb to be a number >= 0, got -1/);
  });
});
