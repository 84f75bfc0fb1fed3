// bench/purgetrace.ts: why SQLite's acks slow during a purge, taken apart (operations.md, "Why the acks slow
// on SQLite"). Fills an inbox as bench/purge.ts does (BENCH_PURGE_ROWS done deliveries of 1 KB, 8 days old),
// opens it as receiver.ts does (checkpoint thread, syncOffLoop, its page cache) and stores BENCH_PURGE_RATE
// deliveries a second straight into it, no HTTP, open loop: for BENCH_SECONDS, all through `inbox.ts purge`
// (BENCH_PURGE_BATCH, BENCH_PURGE_REST) in a process of its own, then BENCH_SECONDS again. Each store's time from
// when it was due is split into the event loop (until its commit tried the write lock; the pacer's timer adds up
// to a ms), the write lock, its transaction, and the WAL's fdatasync (until settled): p50/p99 of each, and the
// share of stores that met a purge batch (waited over 0.2 ms for the lock: one nap of the committer's retry).
// Every BENCH_PURGETRACE_EVERY seconds (1) a line: the stores, the lock, the fdatasyncs, the WAL's frames,
// checkpoints and resets (its -shm file read every 5 ms), the disk's writes and their time queued
// (/proc/diskstats, where it lists the file's device; the line says when not), each process's CPU.
//   npm run bench -- purgetrace      BENCH_PURGE_ROWS=1000000 BENCH_PURGE_RATE=1000 BENCH_SECONDS=8

import fs, { closeSync, openSync, readFileSync, readSync, realpathSync, statSync } from "node:fs";
import { syncBuiltinESMExports } from "node:module";
import { join } from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";
import type { DatabaseSync } from "node:sqlite";
import { pathToFileURL } from "node:url";
import { DEFAULTS } from "../lib/defaults.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { cpuMs, f, knob, SECONDS, tempDir, WARMUP_SECONDS } from "./common.ts";
import { BATCH, fillDone, purgeChild, RATE, REST, ROWS } from "./purge.ts";

const EVERY = knob("BENCH_PURGETRACE_EVERY", 1);
// A lock taken at the first try costs microseconds; one failed try naps 0.2 ms (SqliteCommitter.lock).
const MET_BATCH_MS = 0.2;

/** Store is one store()'s moments, in performance.now() ms. */
interface Store {
  due: number;
  /** When its commit began to try for the write lock. */
  begun: number;
  locked: number;
  committed: number;
  settled: number;
}

const PARTS = {
  loop: (s: Store) => s.begun - s.due,
  lock: (s: Store) => s.locked - s.begun,
  transaction: (s: Store) => s.committed - s.locked,
  fdatasync: (s: Store) => s.settled - s.committed,
} as const;
const total = (s: Store) => s.settled - s.due;

/**
 * TracedInbox is the receiver's SqliteInbox, timed from outside: its commit's lock (begin) and COMMIT, and each
 * store's op as it runs and settles. Nothing of the inbox's own code changes.
 */
class TracedInbox extends SqliteInbox {
  /** The store the next enqueue() belongs to (store() enqueues once, synchronously). */
  next: Store | undefined;
  /** Called after each COMMIT, before its fdatasync (it reads the -shm file: microseconds). */
  afterCommit: () => void = () => {};
  private lockFrom = 0;
  private lockTo = 0;
  private running: Store[] = [];

  constructor(path: string) {
    super(path, { backgroundCheckpoints: true, syncOffLoop: true, pageCacheKb: DEFAULTS.receiverPageCacheKb });
    const db: DatabaseSync = this.db;
    const exec = db.exec.bind(db);
    db.exec = (sql: string) => {
      exec(sql);
      if (sql !== "COMMIT") return;
      const now = performance.now();
      for (const s of this.running) s.committed = now;
      this.afterCommit();
    };
  }

  // A batch's tries for the lock: the first, and the one that takes it, with the event loop run between them.
  private trying = false;
  protected override lock(): boolean {
    const now = performance.now();
    if (!this.trying) this.lockFrom = now;
    this.trying = true;
    const held = super.lock();
    if (held) {
      this.trying = false;
      this.lockTo = performance.now();
      this.running = [];
    }
    return held;
  }

  // A batch retried in halves takes the lock again here, at once or after the same naps.
  protected override begin(timeoutMs?: number): void {
    this.lockFrom = performance.now();
    try {
      super.begin(timeoutMs);
    } finally {
      this.lockTo = performance.now();
      this.running = [];
    }
  }

  protected override enqueue(run: (db: DatabaseSync, guarded: boolean) => unknown, partial = false): Promise<unknown> {
    const s = this.next;
    this.next = undefined;
    if (!s) return super.enqueue(run, partial);
    const timed = (db: DatabaseSync, guarded: boolean) => {
      // A store queued while its batch waited for the lock waited only from when it was due.
      s.begun = Math.max(this.lockFrom, s.due);
      s.locked = this.lockTo;
      this.running.push(s);
      return run(db, guarded);
    };
    return super.enqueue(timed, partial).then((value) => {
      s.settled = performance.now();
      return value;
    });
  }
}

/** Wal reads the WAL index's header from the -shm file, as SQLite maps it: frames written, and how many copied back. */
class Wal {
  private readonly fd: number;
  private readonly header = Buffer.alloc(100);
  constructor(path: string) {
    this.fd = openSync(`${realpathSync(path)}-shm`, "r");
  }
  /** mxFrame (offset 16 of the first header copy) and nBackfill (offset 96), in native order: little-endian here. */
  read(): { frames: number; backfilled: number } {
    readSync(this.fd, this.header, 0, 100, 0);
    return { frames: this.header.readUInt32LE(16), backfilled: this.header.readUInt32LE(96) };
  }
  close(): void {
    closeSync(this.fd);
  }
}

/** Disk is a device's write counters from /proc/diskstats: writes done, sectors written, ms spent writing. */
interface Disk {
  writes: number;
  sectors: number;
  writeMs: number;
}

/**
 * diskOf finds the /proc/diskstats line of the device a folder lives on, or says why there is none (overlay and
 * tmpfs have no block device; other systems no /proc).
 */
function diskOf(dir: string): { read: () => Disk; name: string } | { why: string } {
  const dev = statSync(dir, { bigint: true }).dev;
  // Linux's dev_t: the major number in bits 8–19 and 32 up, the minor in 0–7 and 20 up.
  const major = Number(((dev >> 8n) & 0xfffn) | ((dev >> 32n) & ~0xfffn));
  const minor = Number((dev & 0xffn) | ((dev >> 12n) & ~0xffn));
  const line = () => {
    try {
      return readFileSync("/proc/diskstats", "utf8")
        .split("\n")
        .map((l) => l.trim().split(/\s+/))
        .find((x) => x[0] === String(major) && x[1] === String(minor));
    } catch {
      return undefined;
    }
  };
  const found = line();
  if (!found) return { why: `/proc/diskstats lists no device ${major}:${minor} (the folder ${dir})` };
  return {
    name: found[2]!,
    read: () => {
      const x = line()!;
      return { writes: Number(x[7]), sectors: Number(x[9]), writeMs: Number(x[10]) };
    },
  };
}

function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

type Phase = "warm" | "before" | "during" | "after";

/** Tally is what one phase (or one line's second) saw beside its stores. */
class Tally {
  stores: Store[] = [];
  failed = 0;
  syncs: number[] = [];
  backstops = 0;
  checkpoints = 0;
  backfilled = 0;
  resets = 0;
  maxFrames = 0;
  framesWritten = 0;
  seconds = 0;
  loopP99 = 0;
  disk: Disk = { writes: 0, sectors: 0, writeMs: 0 };
  cpuSelf = 0;
  cpuPurge = 0;

  add(o: Tally): void {
    this.stores.push(...o.stores);
    this.failed += o.failed;
    this.syncs.push(...o.syncs);
    this.backstops += o.backstops;
    this.checkpoints += o.checkpoints;
    this.backfilled += o.backfilled;
    this.resets += o.resets;
    this.maxFrames = Math.max(this.maxFrames, o.maxFrames);
    this.framesWritten += o.framesWritten;
    this.seconds += o.seconds;
    this.loopP99 = Math.max(this.loopP99, o.loopP99);
    this.disk = {
      writes: this.disk.writes + o.disk.writes,
      sectors: this.disk.sectors + o.disk.sectors,
      writeMs: this.disk.writeMs + o.disk.writeMs,
    };
    this.cpuSelf += o.cpuSelf;
    this.cpuPurge += o.cpuPurge;
  }

  /** met is the share of stores whose commit waited for the lock past one nap: those that met a batch. */
  met(stores = this.stores): number {
    return stores.filter((s) => PARTS.lock(s) > MET_BATCH_MS).length / stores.length;
  }
}

// second is one line of the trace: this second's stores and what went on around them.
function second(phase: Phase, t: Tally, disk: string | undefined, pageSize: number): string {
  const lat = t.stores.map(total);
  const locks = t.stores.map(PARTS.lock);
  const per = (n: number) => n / t.seconds;
  return [
    phase.padEnd(6),
    `stores ${t.stores.length} p50 ${f(percentile(lat, 0.5), 2)} p99 ${f(percentile(lat, 0.99), 2)} ms`,
    `| lock p99 ${f(percentile(locks, 0.99), 2)} met ${f(100 * t.met(), 1)}%`,
    `| fdatasync ${t.syncs.length} p50 ${f(percentile(t.syncs, 0.5), 2)} p99 ${f(percentile(t.syncs, 0.99), 2)}`,
    `| loop p99 ${f(t.loopP99, 1)}`,
    `| WAL max ${f(t.maxFrames)} frames (${f((t.maxFrames * (pageSize + 24)) / 2 ** 20, 1)} MB), +${f(t.framesWritten)}, checkpointed ${f(t.backfilled)} frames (seen in ${t.checkpoints} reads), resets ${t.resets}, backstops ${t.backstops}`,
    disk === undefined
      ? ""
      : `| disk ${f(per(t.disk.writes))} writes/s ${f(per(t.disk.sectors) / 2048, 1)} MB/s queued ${f(per(t.disk.writeMs))} ms/s`,
    `| CPU ms/s self ${f(per(t.cpuSelf))} purge ${f(per(t.cpuPurge))}`,
  ]
    .filter(Boolean)
    .join(" ");
}

// phaseLines sums up one phase: the store's time and each part of it, the share that met a batch, what the
// slowest 1% were made of, and what went on beside them.
function phaseLines(phase: Phase, t: Tally, disk: string | undefined, pageSize: number): string[] {
  const done = t.stores.filter((s) => s.settled > 0 && s.committed > 0);
  const lat = done.map(total);
  const slowest = [...done].sort((a, b) => total(b) - total(a)).slice(0, Math.ceil(done.length / 100));
  const parts = Object.entries(PARTS) as [string, (s: Store) => number][];
  return [
    `${phase} (${f(t.seconds, 1)} s, ${done.length} stores${t.failed ? `, ${t.failed} failed` : ""}): p50 ${f(percentile(lat, 0.5), 2)} ms, p99 ${f(percentile(lat, 0.99), 2)}, p99.9 ${f(percentile(lat, 0.999), 2)}; ` +
      parts
        .map(([name, part]) => {
          const xs = done.map(part);
          return `${name} p50 ${f(percentile(xs, 0.5), 2)} p99 ${f(percentile(xs, 0.99), 2)}`;
        })
        .join(", "),
    `  met a batch (lock wait > ${MET_BATCH_MS} ms): ${f(100 * t.met(done), 1)}% of stores, ${f(100 * t.met(slowest), 0)}% of the slowest 1%; ` +
      `the slowest 1% on average ${f(mean(slowest.map(total)), 2)} ms = ` +
      parts.map(([name, part]) => `${name} ${f(mean(slowest.map(part)), 2)}`).join(" + "),
    `  WAL fdatasync p50 ${f(percentile(t.syncs, 0.5), 2)} ms p99 ${f(percentile(t.syncs, 0.99), 2)} (${f(t.syncs.length / t.seconds)}/s); ` +
      `event loop delay p99 ${f(t.loopP99, 1)} ms (worst second); WAL at most ${f(t.maxFrames)} frames (${f((t.maxFrames * (pageSize + 24)) / 2 ** 20, 1)} MB), ` +
      `${f(t.backfilled / t.seconds)} frames checkpointed/s (copying seen in ${f((100 * t.checkpoints) / (t.seconds * 200))}% of the 5 ms reads), ${f(t.resets / t.seconds, 1)} resets/s, ${f(t.backstops / t.seconds, 1)} backstop commits/s; ` +
      (disk === undefined
        ? ""
        : `disk ${f(t.disk.writes / t.seconds)} writes/s, ${f(t.disk.sectors / 2048 / t.seconds, 1)} MB/s, ${f(t.disk.writeMs / t.seconds)} ms/s queued; `) +
      `CPU self ${f(t.cpuSelf / t.seconds)} ms/s, purge ${f(t.cpuPurge / t.seconds)} ms/s`,
  ];
}

/** purgetrace fills, stores around one purge, prints the trace and the phases, and returns the summary. */
export async function purgetrace(): Promise<string> {
  const { dir, cleanup } = tempDir();
  // The WAL's fdatasync is timed where the committer calls it, through node:fs's export, put back after.
  const realSync = fs.fdatasync;
  let tally = new Tally();
  Object.assign(fs, {
    fdatasync: (fd: number, done: (error: NodeJS.ErrnoException | null) => void) => {
      const started = performance.now();
      const mine = tally;
      realSync(fd, (error) => {
        mine.syncs.push(performance.now() - started);
        done(error);
      });
    },
  });
  syncBuiltinESMExports();
  try {
    const path = join(dir, "purgetrace.db");
    const filled = performance.now();
    fillDone(path, ROWS, 8);
    console.log(
      `purgetrace: ${f(ROWS)} done deliveries of 1 KB filled in ${f((performance.now() - filled) / 1000, 1)} s; ` +
        `storing ${f(RATE)}/s, purge batches of ${BATCH}, rest ×${REST}`,
    );
    const found = diskOf(dir);
    const diskName = "name" in found ? found.name : undefined;
    if (!("name" in found)) console.log(`  disk: not measured: ${found.why}`);
    const inbox = new TracedInbox(path);
    const wal = new Wal(path);
    const pageSize = (inbox.db.prepare("PRAGMA page_size").get() as { page_size: number }).page_size;
    // A commit that leaves the WAL at this many frames checkpoints on the event loop (the receiver's backstop).
    const backstop = (inbox.db.prepare("PRAGMA wal_autocheckpoint").get() as { wal_autocheckpoint: number })
      .wal_autocheckpoint;
    inbox.afterCommit = () => {
      if (wal.read().frames >= backstop) tally.backstops++;
    };
    const phases: Record<Phase, Tally> = {
      warm: new Tally(),
      before: new Tally(),
      during: new Tally(),
      after: new Tally(),
    };
    let phase: Phase = "warm";
    let purgePid = 0;

    // The WAL, read every 5 ms: a drop in its frames is a reset, a rise in what is backfilled a checkpoint's pass.
    let last = wal.read();
    const poll = setInterval(() => {
      const now = wal.read();
      if (now.frames < last.frames) {
        tally.resets++;
        tally.framesWritten += now.frames;
      } else {
        tally.framesWritten += now.frames - last.frames;
        if (now.backfilled > last.backfilled) {
          tally.checkpoints++;
          tally.backfilled += now.backfilled - last.backfilled;
        }
      }
      tally.maxFrames = Math.max(tally.maxFrames, now.frames);
      last = now;
    }, 5);

    const loop = monitorEventLoopDelay({ resolution: 1 });
    loop.enable();
    const readDisk = "read" in found ? found.read : () => ({ writes: 0, sectors: 0, writeMs: 0 });
    let disk = readDisk();
    let self = cpuMs(process.pid);
    let purge = 0;
    let lineStarted = performance.now();
    // flush ends the current line: at each EVERY seconds, and when the phase changes, so none straddles two.
    const flush = () => {
      const t = tally;
      tally = new Tally();
      const d = readDisk();
      const s = cpuMs(process.pid);
      let p = 0;
      try {
        p = purgePid ? cpuMs(purgePid) : 0;
      } catch {
        // The purge ended between two lines; its last part of a second is not counted.
      }
      const now = performance.now();
      t.seconds = (now - lineStarted) / 1000;
      t.loopP99 = loop.percentile(99) / 1e6;
      t.disk = { writes: d.writes - disk.writes, sectors: d.sectors - disk.sectors, writeMs: d.writeMs - disk.writeMs };
      t.cpuSelf = s - self;
      t.cpuPurge = purgePid && p >= purge ? p - purge : 0;
      [disk, self, purge, lineStarted] = [d, s, p, now];
      loop.reset();
      if (phase !== "warm" && t.seconds >= 0.05) console.log(`  ${second(phase, t, diskName, pageSize)}`);
      phases[phase].add(t);
    };
    const line = setInterval(flush, EVERY * 1000);
    const enter = (next: Phase) => {
      flush();
      phase = next;
    };

    // Open loop: each store is due at its slot whatever the last ones did, and timed from then.
    const body = (i: number) =>
      Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i % 1000}`, amount: 5, i }));
    const start = performance.now();
    let sent = 0;
    let stopped = false;
    const send = () => {
      if (stopped) return;
      const now = performance.now();
      for (let due = start + (sent * 1000) / RATE; due <= now; due = start + (sent * 1000) / RATE) {
        const s: Store = { due, begun: 0, locked: 0, committed: 0, settled: 0 };
        const i = sent++;
        inbox.next = s;
        // Counted in the line of the second it settled in.
        inbox.store({ id: `pt${i}`, body: body(i), contentType: "application/json" }).then(
          () => tally.stores.push(s),
          () => tally.failed++,
        );
      }
      setTimeout(send, Math.max(0, start + (sent * 1000) / RATE - performance.now()));
    };
    send();
    const sleep = (seconds: number) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));
    let purged: { ms: number; out: string };
    try {
      await sleep(WARMUP_SECONDS);
      enter("before");
      await sleep(SECONDS);
      enter("during");
      const running = purgeChild(path);
      purgePid = running.pid;
      purged = await running.done;
      enter("after");
      purgePid = 0;
      await sleep(SECONDS);
      stopped = true;
      await new Promise((resolve) => setTimeout(resolve, 200)); // the last stores settle
      flush();
    } finally {
      stopped = true;
      clearInterval(line);
      clearInterval(poll);
      loop.disable();
      wal.close();
      await inbox.close();
    }
    console.log(`  purge: ${f(purged.ms / 1000, 1)} s: ${purged.out.trim().split("\n").join(" / ")}`);
    for (const p of ["before", "during", "after"] as const)
      for (const l of phaseLines(p, phases[p], diskName, pageSize)) console.log(`  ${l}`);
    const p99 = (p: Phase) =>
      percentile(phases[p].stores.filter((s) => s.settled > 0 && s.committed > 0).map(total), 0.99);
    const side = Math.max(p99("before"), p99("after"));
    const queued = (p: Phase) => phases[p].disk.writeMs / phases[p].seconds;
    const syncP99 = (p: Phase) => percentile(phases[p].syncs, 0.99);
    return (
      `purgetrace:\n  SQLite, ${f(ROWS)} bodies purged in ${f(purged.ms / 1000, 1)} s beside ${f(RATE)} stores/s (batches of ${BATCH}, rest ×${REST}): ` +
      `store p99 ${f(p99("during"), 2)} ms during, ${f(p99("before"), 2)}/${f(p99("after"), 2)} before/after: ×${f(p99("during") / side, 2)}; ` +
      `met a batch ${f(100 * phases.during.met(), 1)}% (before ${f(100 * phases.before.met(), 1)}%); ` +
      `WAL fdatasync p99 ${f(syncP99("during"), 2)} ms against ${f(syncP99("before"), 2)}; ` +
      (diskName === undefined
        ? "disk queue not measured"
        : `${diskName} writes queued ${f(queued("during"))} ms/s against ${f(queued("before"))}`)
    );
  } finally {
    Object.assign(fs, { fdatasync: realSync });
    syncBuiltinESMExports();
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await purgetrace());
