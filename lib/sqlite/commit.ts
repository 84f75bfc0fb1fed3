// sqlite/commit.ts: how the SQLite inbox's writes reach the disk. One connection per inbox, its writes
// queued and group-committed (a batch per event-loop turn), each settled once COMMIT is durable: FULL's
// fsync, or with syncOffLoop an fdatasync of the WAL on a libuv thread; a checkpointer thread beside it.
// SqliteInbox (sqlite.ts) builds the delivery's life on it. Not run on its own.

import { fdatasync, openSync, realpathSync } from "node:fs";
import type { DatabaseSync, StatementSync } from "node:sqlite";
import { Worker } from "node:worker_threads";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { openDatabase } from "./schema.ts";
import type { InboxOptions } from "../store.ts";

// The checkpointer thread's whole program. PASSIVE neither waits for nor blocks a writer, so it can run
// beside the receiver's commits; a failed pass (a full disk, a busy lock) is simply the next one's work,
// and the commits' own checkpoint (BACKSTOP_PAGES) bounds the WAL if passes keep failing.
const CHECKPOINTER = `
const { DatabaseSync } = require("node:sqlite");
const { parentPort, workerData } = require("node:worker_threads");
const db = new DatabaseSync(workerData.path, { timeout: 0 });
db.exec("PRAGMA synchronous = FULL");
const timer = setInterval(() => { try { db.exec("PRAGMA wal_checkpoint(PASSIVE)"); } catch {} }, workerData.everyMs);
// With the timer cleared and once()'s listener gone, nothing keeps the thread alive and it ends on its own
// (Deno's parentPort has no close()).
parentPort.once("message", () => { clearInterval(timer); db.close(); });`;
// How often the checkpointer runs, and how large the WAL may grow before a commit checkpoints anyway.
const CHECKPOINT_EVERY_MS = 100;
const BACKSTOP_PAGES = 16_000;

// A batch committed, with each op's outcome, waiting to be settled.
export interface Committed {
  batch: Op[];
  results: { ok: boolean; value: unknown }[];
  started: number;
  seq: number;
}

// How many fdatasyncs of the WAL may run at once; while that many run, new writes wait to be committed:
// committed then, they could only be covered by a later sync, and would take a commit each.
const SYNCS_AT_ONCE = 2;

// One unit of work for the group committer: runs inside the shared transaction, settles after COMMIT
// (with syncOffLoop, after the fdatasync that follows it).
// `guarded` asks an op that could fail halfway (partial) to confine itself in a savepoint.
export interface Op {
  run(db: DatabaseSync, guarded: boolean): unknown;
  partial: boolean;
  resolve(value: unknown): void;
  reject(error: unknown): void;
}

/**
 * whole runs a write that must commit whole or not at all (a change and its audit entry): queued as partial,
 * it runs bare first, and when its batch is redone op by op (guarded) inside a savepoint of its own, so that
 * a failure takes back all of its writes and only them.
 */
export function whole<T>(db: DatabaseSync, guarded: boolean, run: () => T): T {
  if (!guarded) return run();
  db.exec("SAVEPOINT whole");
  try {
    const value = run();
    db.exec("RELEASE whole");
    return value;
  } catch (error) {
    db.exec("ROLLBACK TO whole");
    db.exec("RELEASE whole");
    throw error;
  }
}

/**
 * SqliteCommitter is one SQLite connection and its group committer: enqueue() runs a write inside the next
 * shared transaction and settles it after the COMMIT is durable. SqliteInbox extends it.
 */
export abstract class SqliteCommitter {
  readonly db: DatabaseSync;
  readonly path: string;
  protected readonly batchSize: number;
  protected readonly busyTimeoutMs: number;
  private readonly statements = new Map<string, StatementSync>();
  // Commits left to checkpoint one by one since the disk was last full, and the setting to go back to.
  private tightCommits = 0;
  private walAutocheckpoint = 0;
  protected queue: Op[] = [];
  protected checkpointer: Worker | undefined;
  private readonly onCommit: ((size: number, ms: number) => void) | undefined;
  // The error of the last group commit, until one succeeds: a full disk or a read-only file shows here first.
  protected commitError: unknown;
  protected flushing = false;
  // Since when the batch at the queue's head has found the write lock another process's, if it has.
  private lockedSince: number | undefined;
  protected closed = false;
  // With syncOffLoop: the WAL file, opened once per fdatasync that may run at once (walFds, those not in
  // use in idleFds); the commits not yet covered by a finished fdatasync, numbered; how many run, the last
  // commit the latest one covers; and the failure of one, after which nothing is acked again (see syncWal).
  protected walFds: number[] = [];
  private idleFds: number[] = [];
  protected unsynced: Committed[] = [];
  private commits = 0;
  protected syncs = 0;
  private covered = 0;
  protected syncFailure: Error | undefined;

  constructor(path: string, options: InboxOptions) {
    this.path = path;
    this.db = openDatabase(path, options.busyTimeoutMs ?? DEFAULTS.busyTimeoutMs);
    const db = this.db;
    if (options.syncOffLoop) this.idleFds = [...(this.walFds = syncOwnWal(db, path, SYNCS_AT_ONCE))];
    this.batchSize = Math.max(1, options.batchSize ?? DEFAULTS.batchSize);
    this.busyTimeoutMs = Math.round(options.busyTimeoutMs ?? DEFAULTS.busyTimeoutMs);
    this.onCommit = options.onCommit;
    // A PRAGMA takes no bound parameters; the number is checked by checkOptions and made whole here.
    if (options.pageCacheKb !== undefined)
      db.exec(`PRAGMA cache_size = -${Math.max(1, Math.round(options.pageCacheKb))}`);
    if (options.backgroundCheckpoints) {
      this.db.exec(`PRAGMA wal_autocheckpoint = ${BACKSTOP_PAGES}`);
      // The thread runs a dozen lines: a small heap keeps the receiver's RSS where it was.
      this.checkpointer = new Worker(CHECKPOINTER, {
        eval: true,
        workerData: { path, everyMs: CHECKPOINT_EVERY_MS },
        resourceLimits: { maxOldGenerationSizeMb: 8, maxYoungGenerationSizeMb: 1 },
      });
      this.checkpointer.unref();
      // Should the thread die, the commits take checkpointing back, as if it had never been started.
      this.checkpointer.on("error", () => {
        this.checkpointer = undefined;
        if (!this.closed) this.db.exec(`PRAGMA wal_autocheckpoint = ${DEFAULTS.walAutocheckpointPages}`);
      });
    }
  }

  // sql compiles each statement once per connection: the receiver and worker run the same few forever.
  protected sql(text: string): StatementSync {
    let statement = this.statements.get(text);
    if (!statement) {
      statement = this.db.prepare(text);
      this.statements.set(text, statement);
    }
    return statement;
  }

  protected enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial = false): Promise<unknown> {
    if (this.closed) return Promise.reject(new Error(`inbox ${this.path} is closed`));
    if (this.syncFailure) return Promise.reject(this.syncFailure);
    return new Promise((resolve, reject) => {
      this.queue.push({ run, partial, resolve, reject });
      // While SYNCS_AT_ONCE fdatasyncs run, the next batch waits for one of them to finish.
      if (this.syncs < SYNCS_AT_ONCE) this.drainSoon();
    });
  }

  private drainSoon(): void {
    if (this.flushing) return;
    this.flushing = true;
    // setImmediate lets every request already read off the sockets join this batch.
    setImmediate(() => this.drain());
  }

  private drain(): void {
    if (this.syncFailure) for (const op of this.queue.splice(0)) op.reject(this.syncFailure);
    while (this.queue.length > 0) {
      if (!this.lock()) {
        // Another process has held the write lock past LOCK_SPIN_MS (a backup's step, a vacuum, a long bulk
        // batch): waiting on here would stop this thread's event loop, its health answers and timers with it,
        // for as long as the lock is held. Between tries the loop runs, and what it reads joins the batch.
        Atomics.wait(NAP, 0, 0, LOCK_TRY_MS);
        setImmediate(() => this.drain());
        return;
      }
      const batch = this.queue.splice(0, this.batchSize);
      this.commit(batch, false, true);
    }
    this.flushing = false;
  }

  // lock takes the write lock for the batch at the queue's head: true once held. A short hold (a worker's
  // claim, a purge's batch: 1-2 ms) is waited out here, as begin() waits: handing the wait to the event loop
  // between tries made such waits longer (the other writer took the lock again first) and the acks no faster
  // (bench/purgetrace.ts). Past LOCK_SPIN_MS it answers false, and drain() tries again from the event loop.
  // After busyTimeoutMs of tries that batch fails, as a begin() that timed out fails its batch, and the next
  // one's wait begins.
  protected lock(): boolean {
    const since = (this.lockedSince ??= performance.now());
    let failure: unknown;
    try {
      failure = this.tryLock(since + Math.min(LOCK_SPIN_MS, this.busyTimeoutMs));
      if (failure === undefined) {
        this.lockedSince = undefined;
        return true;
      }
      if (performance.now() - since < this.busyTimeoutMs) return false;
    } catch (error) {
      failure = error;
    }
    this.lockedSince = undefined;
    const error = new Error(`inbox ${this.path}: ${message(failure)}`, { cause: failure });
    for (const op of this.queue.splice(0, this.batchSize)) op.reject(error);
    return false;
  }

  // commit runs a batch in one transaction and settles each op after COMMIT. When the transaction as a
  // whole fails (disk full, I/O error), it retries in halves, so only the ops that truly fail are rejected.
  // Ops run unguarded first: a savepoint per op costs more than the rare redo when one fails halfway.
  private commit(batch: Op[], guarded = false, locked = false): void {
    const started = performance.now();
    const results: { ok: boolean; value: unknown }[] = [];
    try {
      if (!locked) this.begin();
    } catch (error) {
      // No op has run: the lock is another writer's. Retrying in halves would wait out the busy timeout
      // again for each half, blocking the thread for 2n-1 timeouts, so the whole batch fails once.
      const failure = new Error(`inbox ${this.path}: ${message(error)}`, { cause: error });
      for (const op of batch) op.reject(failure);
      return;
    }
    let redo = false;
    try {
      for (const op of batch) {
        try {
          results.push({ ok: true, value: op.run(this.db, guarded) });
        } catch (error) {
          // An op that cleaned up after itself (one statement, or a savepoint) fails alone; anything else
          // fails the batch. One that may have left half its writes behind is redone in a savepoint.
          if (!this.db.isTransaction || !isOwnError(error)) throw error;
          if (op.partial && !guarded) {
            redo = true;
            throw error;
          }
          results.push({ ok: false, value: error });
        }
      }
      this.db.exec("COMMIT");
    } catch (error) {
      if (this.db.isTransaction) this.db.exec("ROLLBACK");
      if (redo) {
        this.commit(batch, true);
        return;
      }
      if (!isOwnError(error)) this.commitError = error;
      if (sqliteCode(error) === SQLITE_FULL) this.reclaimWal();
      if (batch.length === 1) {
        batch[0]!.reject(new Error(`inbox ${this.path}: ${message(error)}`, { cause: error }));
        return;
      }
      const half = Math.ceil(batch.length / 2);
      this.commit(batch.slice(0, half), guarded);
      this.commit(batch.slice(half), guarded);
      return;
    }
    if (this.tightCommits > 0 && --this.tightCommits === 0)
      this.db.exec(`PRAGMA wal_autocheckpoint = ${this.walAutocheckpoint}`);
    this.commitError = undefined;
    if (this.walFds.length === 0) {
      this.settle({ batch, results, started, seq: 0 });
      return;
    }
    this.unsynced.push({ batch, results, started, seq: ++this.commits });
    this.syncWal();
  }

  private settle({ batch, results, started }: Committed): void {
    this.onCommit?.(batch.length, performance.now() - started);
    batch.forEach((op, i) => (results[i]!.ok ? op.resolve(results[i]!.value) : op.reject(results[i]!.value)));
  }

  // syncWal makes the commits so far durable, then settles them: one fdatasync of the WAL, on a libuv
  // thread, while this thread reads and commits the next requests; a commit made meanwhile gets a second
  // one at once, and whichever finishes settles every commit made before it began. Why that is as
  // durable as FULL:
  // - The WAL is a log that only grows until it is reset, and every commit so far has written its frames
  //   to it before this call: the fdatasync, which begins after, covers them all (and any before them).
  // - A reset, after a checkpoint copied every frame into the database and fsynced it, rewrites the WAL
  //   from its start under new salts; SQLite fsyncs the new header itself (at NORMAL too), so a power cut
  //   leaves the old frames unreadable, never replayed, and what they held is already in the database.
  // - Checkpoints, on any connection not at OFF, fsync the WAL before copying and the database after.
  // A failed fdatasync may have dropped the pages it could not write, and Linux marks them clean: a later
  // one would succeed over the gap. So the failure sticks; nothing is acked again until a restart, whose
  // recovery reads only what reached the disk (PostgreSQL panics for the same reason). Linux reports such
  // an error once to each open file, so two fdatasyncs at once use two descriptors: on one, the first
  // to look would take the report and the other, covering the same pages, would succeed.
  private syncWal(): void {
    if (this.idleFds.length === 0 || this.covered === this.commits) return;
    const fd = this.idleFds.pop()!;
    this.syncs++;
    const covers = (this.covered = this.commits);
    fdatasync(fd, (error) => {
      this.syncs--;
      this.idleFds.push(fd);
      if (error) {
        this.syncFailure ??= new Error(
          `inbox ${this.path}: fdatasync of the WAL failed; the commits since the last one may be lost, so nothing is acked until a restart: ${error.message}`,
          { cause: error },
        );
      }
      // Every commit made before this fdatasync began is on disk, whichever sync started it.
      while (this.unsynced.length > 0 && (this.syncFailure || this.unsynced[0]!.seq <= covers)) {
        const committed = this.unsynced.shift()!;
        if (this.syncFailure) for (const op of committed.batch) op.reject(this.syncFailure);
        else this.settle(committed);
      }
      this.syncWal();
      if (this.syncs < SYNCS_AT_ONCE && this.queue.length > 0) this.drainSoon();
    });
  }

  // reclaimWal answers a full disk. The WAL grows until wal_autocheckpoint pages before it is copied back
  // and reused, so once space is freed it would take all of it and fill the disk again, and the inbox
  // would stay down for good. For the next commits, a checkpoint follows each one, so the WAL is reused
  // from its start and never outgrows the space it already has.
  private reclaimWal(): void {
    if (this.tightCommits === 0) {
      this.walAutocheckpoint = (
        this.db.prepare("PRAGMA wal_autocheckpoint").get() as { wal_autocheckpoint: number }
      ).wal_autocheckpoint;
      this.db.exec("PRAGMA wal_autocheckpoint = 1");
    }
    this.tightCommits = 1_000;
    try {
      this.db.exec("PRAGMA wal_checkpoint(PASSIVE)");
    } catch {
      // Best effort, while the disk is still full: the failure that matters is the commit's, which the
      // caller gets, and the checkpoint after the next commit that succeeds does the work.
    }
  }

  // begin takes the write lock. SQLite's own busy handler sleeps 1, 2, 5, 10 … 100 ms between tries, so
  // against a process that commits back to back (a busy worker) it seldom finds the lock free, and a
  // receiver's acks wait for seconds. Trying every 0.2 ms, up to the same busy timeout, takes the first gap.
  protected begin(timeoutMs: number = this.busyTimeoutMs): void {
    const busy = this.tryLock(performance.now() + timeoutMs);
    if (busy !== undefined) throw busy;
  }

  // tryLock tries for the write lock (BEGIN IMMEDIATE) every LOCK_TRY_MS, once at least, until it holds it
  // (undefined) or the time until has passed (SQLite's busy error, answered); any other error is thrown.
  private tryLock(until: number): unknown {
    this.sql("PRAGMA busy_timeout = 0").run();
    try {
      for (;;) {
        try {
          this.db.exec("BEGIN IMMEDIATE");
          return undefined;
        } catch (error) {
          if (sqliteCode(error) !== SQLITE_BUSY) throw error;
          if (performance.now() >= until) return error;
          Atomics.wait(NAP, 0, 0, LOCK_TRY_MS);
        }
      }
    } finally {
      // A PRAGMA takes no bound parameters; the number is this Inbox's own, checked in the constructor.
      this.sql(`PRAGMA busy_timeout = ${this.busyTimeoutMs}`).run();
    }
  }
}

// NAP is a cell that nothing ever changes: Atomics.wait on it sleeps this thread for a fraction of a ms.
const NAP = new Int32Array(new SharedArrayBuffer(4));
// How long the group committer naps between two tries for a write lock another process holds, and how long
// it waits so before it waits from the event loop instead, in ms.
const LOCK_TRY_MS = 0.2;
const LOCK_SPIN_MS = 5;

// SQLite's primary result codes that the committer acts on; node:sqlite reports the extended code.
const SQLITE_BUSY = 5;
const SQLITE_FULL = 13;

// sqliteCode is the primary result code of an error node:sqlite threw, or 0 for anything else.
function sqliteCode(error: unknown): number {
  const code = (error as { errcode?: unknown }).errcode;
  return typeof code === "number" ? code & 0xff : 0;
}

// Errors of the database itself (busy, locked, out of memory, read-only, I/O, corrupt, full) concern
// the whole batch; anything else came from one op's statement, which SQLite already undid alone.
const BATCH_ERRORS = new Set([SQLITE_BUSY, 6, 7, 8, 10, 11, SQLITE_FULL]);
function isOwnError(error: unknown): boolean {
  return !BATCH_ERRORS.has(sqliteCode(error));
}

/**
 * syncOwnWal sets a connection to commit without an fsync (synchronous = NORMAL) and opens its WAL file
 * n times, whose fdatasync the caller then owes before it reports any commit (SqliteInbox.syncWal). The
 * descriptors are opened now, before any write they must answer for: Linux reports a failed writeback
 * only to the files open when it failed. (openDatabase has made sure the database is in WAL mode.)
 */
function syncOwnWal(db: DatabaseSync, path: string, n: number): number[] {
  // SQLite puts the WAL beside the file a symbolic link points to, so the same is opened here.
  const wal = `${realpathSync(path)}-wal`;
  const fds = Array.from({ length: n }, () => openSync(wal, "r"));
  db.exec("PRAGMA synchronous = NORMAL");
  return fds;
}
