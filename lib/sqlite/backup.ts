// sqlite/backup.ts: a SQLite inbox copied whole while it runs, and put back after a lost disk. backup() takes
// one consistent snapshot through SQLite's online backup API, checks it, and renames it into place;
// restore() puts a checked copy back, refusing a database that any process has open; healthProblem() is
// the start-up quick_check. inbox.ts's `backup` and `restore` commands run them.
//   npx tsx inbox.ts backup --dir /var/backups/inbox --keep 48      npx tsx inbox.ts restore FILE

import {
  chmodSync,
  closeSync,
  copyFileSync,
  existsSync,
  fsyncSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { basename, dirname, extname, join, resolve } from "node:path";
import { createRequire } from "node:module";
import type { DatabaseSync } from "node:sqlite";
import { DEFAULTS } from "../defaults.ts";
import { message } from "../log.ts";
import { STATUSES, type Status } from "../store.ts";

/** Snapshot is what a checked copy of an inbox holds. */
export interface Snapshot {
  /** The copy's path. */
  file: string;
  /** Its size on disk. */
  bytes: number;
  /** Rows per status (one per delivery and route), tombstones included in their status. */
  counts: Record<Status, number>;
  /** Rows whose body was purged: they still answer their ID as a duplicate. */
  tombstones: number;
  /** Its schema version (PRAGMA user_version): a newer inbox migrates it on open. */
  schema: number;
}

/** Backup is a finished backup: the snapshot, when it began, and what rotation removed. */
export interface Backup extends Snapshot {
  /** When the copy began (ms since the epoch): every delivery acknowledged before it is in the copy. */
  startedAt: number;
  /** How long the copy and its check took, in ms. */
  ms: number;
  /** Of ms, how long the copy itself took: the one read transaction, while the WAL may grow. */
  copyMs: number;
  /** Older backups that --keep let go. */
  removed: string[];
  /** Partial copies left beside file by a backup or restore that was killed (their process is gone), removed first. */
  swept: string[];
}

/** BackupOptions tunes backup(). */
export interface BackupOptions {
  /** After the new backup is checked, keep this many backups of the same name pattern in its folder. @default all */
  keep?: number;
  /** The clock, for startedAt and the default file name. @default Date.now */
  now?: () => number;
}

/** InUse is the refusal of an operation that needs the database to itself. */
export class InUse extends Error {}

// node:sqlite, loaded on first use rather than imported: the scripts import this file for healthProblem(),
// and a static import would stop them on a Node without node:sqlite as the modules link, with a stack
// trace, before runtime.ts's requireSqlite() could say in one line which Node they need.
const load = createRequire(import.meta.url);
const sqlite = (): typeof import("node:sqlite") => load("node:sqlite");

// All pages in one step. SQLite restarts a stepped backup whenever another connection commits, so under a
// busy receiver a small step might never finish; one step is one read transaction, which in WAL mode blocks
// no writer (the WAL grows until it ends, then the checkpointer catches up).
const ALL_PAGES = 2 ** 31 - 1;

/** backupName is the name a scheduled backup of db gets: inbox-20261203T120000Z.db for inbox.db at 12:00 UTC. */
export function backupName(db: string, at: number): string {
  return `${basename(db, extname(db)) || "inbox"}-${stamp(at)}.db`;
}

// BACKUP_NAME is how --dir names a backup: the database's stem and the moment, stem-YYYYMMDDTHHMMSSZ.db.
const BACKUP_NAME = /^(.+)-\d{8}T\d{6}Z\.db$/;

// stamp is a moment as file names here carry it: 20261203T120000Z.
function stamp(at: number): string {
  return new Date(at).toISOString().replace(/[-:]/g, "").replace(/\.\d+/, "");
}

/**
 * backup copies the live SQLite inbox at db to file without stopping its receivers and workers: one read
 * transaction on libuv's thread pool, so it is a single moment's state. The copy is written under a
 * temporary name beside file, checked with integrity_check, synced, and only then renamed to file: a file
 * of that name is always a whole, checked backup. With keep, older backups of the same pattern in file's
 * folder beyond the newest keep are removed afterwards, never the new one; a failed backup removes nothing.
 * The backup is written 0600, readable by the inbox's user alone: it holds every body.
 */
export async function backup(db: string, file: string, options: BackupOptions = {}): Promise<Backup> {
  const now = options.now ?? Date.now;
  if (options.keep !== undefined && !(Number.isInteger(options.keep) && options.keep >= 1)) {
    throw new TypeError(`backup: expected keep to be a whole number of 1 or more, got ${options.keep}`);
  }
  // Opening a missing file would create an empty one; say so instead.
  if (!existsSync(db)) throw new Error(`backup ${db}: no such file`);
  // The rename at the end would put the copy in place of the live database.
  if (resolve(file) === resolve(db)) throw new Error(`backup ${db}: the backup must be another file than the database`);
  const swept = sweepPartials(file);
  const temp = partial(file);
  const started = performance.now();
  let startedAt: number;
  let copyMs: number;
  let snapshot: Snapshot;
  try {
    // A plain connection, only read from: openDatabase would take the write lock to migrate.
    // Loaded here, not imported above: the scripts import this file for healthProblem() on runtimes whose
    // node:sqlite may lack backup().
    const { backup: onlineBackup } = await import("node:sqlite");
    const source = new (sqlite().DatabaseSync)(db, { timeout: DEFAULTS.busyTimeoutMs });
    try {
      // A backup holds every body: readable by the inbox's user alone, whatever the umask. Made empty with
      // that mode before the copy, which SQLite writes into (and its journal takes the same mode).
      closeSync(openSync(temp, "w", 0o600));
      chmodSync(temp, 0o600);
      startedAt = now();
      await onlineBackup(source, temp, { rate: ALL_PAGES });
    } finally {
      source.close();
    }
    copyMs = performance.now() - started;
    const copy = new (sqlite().DatabaseSync)(temp);
    try {
      // One self-contained file: a rollback journal, not WAL, so no -wal file belongs beside it.
      copy.exec("PRAGMA journal_mode = DELETE");
    } finally {
      copy.close();
    }
    snapshot = check(temp);
    syncFile(temp);
    renameSync(temp, file);
    syncFile(dirname(file));
  } catch (error) {
    rmSync(temp, { force: true });
    throw new Error(`backup ${db}: ${message(error)}`, { cause: error });
  }
  const removed = options.keep === undefined ? [] : rotate(file, options.keep);
  return { ...snapshot, file, startedAt, ms: performance.now() - started, copyMs, removed, swept };
}

// partial is the temporary name a copy to target is written under, the writer's PID in it: a file of
// target's own name is always whole.
function partial(target: string): string {
  return join(dirname(target), `.${basename(target)}.partial-${process.pid}`);
}

// sweepPartials removes the partial copies to target, or to an earlier backup of its name pattern
// (stem-YYYYMMDDTHHMMSSZ.db, as --dir names them), that a killed backup or restore left behind, each the
// size of a whole database: an hourly timer would otherwise fill the disk one SIGKILL or power cut at a
// time. Only those whose process is gone: a live one is still writing.
function sweepPartials(target: string): string[] {
  const folder = dirname(target);
  const stem = BACKUP_NAME.exec(basename(target))?.[1];
  const swept: string[] = [];
  for (const name of existsSync(folder) ? readdirSync(folder) : []) {
    // With its journal too: a kill during the copy's switch to a rollback journal leaves one beside it.
    const found = /^\.(.+)\.partial-(\d+)(?:-journal|-wal|-shm)?$/.exec(name);
    if (!found) continue;
    const [, copyOf, pid] = found;
    if (copyOf !== basename(target) && (stem === undefined || BACKUP_NAME.exec(copyOf!)?.[1] !== stem)) continue;
    if (Number(pid) === process.pid || alive(Number(pid))) continue;
    rmSync(join(folder, name), { force: true });
    swept.push(join(folder, name));
  }
  return swept;
}

// alive says whether a process of that PID exists: signal 0 checks without sending anything; EPERM
// means it exists but is another user's.
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

// rotate removes the oldest backups named like file's pattern (stem-YYYYMMDDTHHMMSSZ.db) in its folder
// beyond the newest keep; file itself, just checked, is never one of them.
function rotate(file: string, keep: number): string[] {
  const stem = BACKUP_NAME.exec(basename(file))?.[1];
  if (stem === undefined) return [];
  const folder = dirname(file);
  const same = readdirSync(folder)
    .filter((name) => BACKUP_NAME.exec(name)?.[1] === stem && name !== basename(file))
    .sort();
  const removed = same.slice(0, Math.max(0, same.length - (keep - 1))).map((name) => join(folder, name));
  for (const path of removed) rmSync(path, { force: true });
  return removed;
}

/**
 * check opens a copy read-only and runs integrity_check on it; it returns what the copy holds, or throws
 * with SQLite's first complaint. A file that is not an inbox is refused too.
 */
export function check(file: string): Snapshot {
  if (!existsSync(file)) throw new Error(`no such file ${file}`);
  const db = new (sqlite().DatabaseSync)(file, { readOnly: true });
  try {
    let rows: { integrity_check: string }[];
    try {
      rows = db.prepare("PRAGMA integrity_check(3)").all() as { integrity_check: string }[];
    } catch (error) {
      rows = [{ integrity_check: message(error) }];
    }
    if (rows[0]?.integrity_check !== "ok")
      throw new Error(`integrity_check failed: ${oneLine(rows.map((r) => r.integrity_check))}`);
    const tables = db
      .prepare("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name = 'deliveries'")
      .all();
    if (tables.length === 0) throw new Error("not an inbox database: it has no deliveries table");
    const counts = Object.fromEntries(STATUSES.map((s) => [s, 0])) as Record<Status, number>;
    for (const r of db.prepare("SELECT status, count(*) AS n FROM deliveries GROUP BY status").all() as {
      status: Status;
      n: number;
    }[])
      counts[r.status] = r.n;
    const purged = db.prepare("SELECT count(*) AS n FROM deliveries WHERE purged_at IS NOT NULL").get() as {
      n: number;
    };
    const { user_version: schema } = db.prepare("PRAGMA user_version").get() as { user_version: number };
    return { file, bytes: statSync(file).size, counts, tombstones: purged.n, schema };
  } finally {
    db.close();
  }
}

/**
 * inUse tells whether any process has db open, by asking for an exclusive lock without waiting: in WAL
 * mode every open connection holds a shared lock on the file for as long as it is open.
 */
export function inUse(db: string): boolean {
  const probe = new (sqlite().DatabaseSync)(db, { timeout: 0 });
  try {
    probe.exec("PRAGMA locking_mode = EXCLUSIVE");
    probe.exec("BEGIN EXCLUSIVE");
    probe.exec("ROLLBACK");
    return false;
  } catch (error) {
    if (/locked|busy/i.test(message(error))) return true;
    throw error;
  } finally {
    probe.close();
  }
}

/** Restored is a finished restore: what the inbox now holds, and where the database it replaced went. */
export interface Restored extends Snapshot {
  /** The file the replaced database was moved to, with its -wal and -shm beside it; none if there was none. */
  aside?: string;
}

/**
 * restore puts the backup at file back as the inbox at db. It checks the backup first, refuses (InUse) a
 * db that any process has open, and moves an existing db aside with its -wal and -shm, so nothing is
 * lost and no old WAL is replayed into the restored file. The copy is made under a temporary name, handed
 * to before (the CLI writes its audit entry there, so the restored file holds it from its first moment; a
 * throw leaves the db as it was), synced, and renamed into place.
 */
export function restore(
  file: string,
  db: string,
  now: () => number = Date.now,
  before?: (copy: string) => void,
): Restored {
  if (resolve(file) === resolve(db)) throw new Error(`restore ${file}: the backup is the database itself`);
  let snapshot: Snapshot;
  try {
    // Checked once, here: the copy below is byte for byte and synced, so it holds what this found.
    snapshot = check(file);
  } catch (error) {
    throw new Error(`restore ${file}: not a sound inbox backup: ${message(error)}`, { cause: error });
  }
  if (existsSync(db) && inUse(db))
    throw new InUse(`${db} is in use: stop its receivers, workers and operator page, then restore`);
  sweepPartials(db);
  const temp = partial(db);
  try {
    copyFileSync(file, temp);
    before?.(temp);
    syncFile(temp);
  } catch (error) {
    rmSync(temp, { force: true });
    throw new Error(`restore ${file} to ${db}: ${message(error)}; nothing changed`, { cause: error });
  }
  let aside: string | undefined;
  for (const suffix of ["", "-wal", "-shm"]) {
    if (!existsSync(db + suffix)) continue;
    aside ??= `${db}.before-restore-${stamp(now())}`;
    renameSync(db + suffix, aside + suffix);
  }
  try {
    renameSync(temp, db);
    syncFile(dirname(db));
    // A restored file is checked again at its first start.
    rmSync(checkedMark(db), { force: true });
  } catch (error) {
    rmSync(temp, { force: true });
    throw new Error(`restore ${file} to ${db}: ${message(error)}`, { cause: error });
  }
  return { ...snapshot, file: db, ...(aside ? { aside } : {}) };
}

/**
 * healthProblem runs SQLite's quick_check on a database file before a script starts serving from it, and
 * returns its first complaints, or undefined for a sound file (or none yet). At start-up only, never on the
 * ack path: it reads every page (bench/backup.ts measures it at a million rows).
 */
export function healthProblem(path: string): string | undefined {
  if (!existsSync(path)) return undefined;
  let db: DatabaseSync | undefined;
  try {
    // Read-write, though it only reads: a read-only connection cannot open a WAL file nobody else has open.
    db = new (sqlite().DatabaseSync)(path, { timeout: DEFAULTS.busyTimeoutMs });
    const rows = db.prepare("PRAGMA quick_check(3)").all() as { quick_check: string }[];
    return rows[0]?.quick_check === "ok" ? undefined : oneLine(rows.map((r) => r.quick_check));
  } catch (error) {
    // Only damage (SQLITE_CORRUPT) is the check's to report. A file it cannot open, one that is not a
    // database, or a lock held too long is openDatabase's, in the scripts' own line ("cannot use the
    // database: …"): a backup is no answer to those.
    return ((error as { errcode?: number }).errcode ?? 0) % 256 === 11 ? message(error) : undefined;
  } finally {
    db?.close();
  }
}

/** StartupCheck is what startupCheck() did: why the quick_check ran (none: it was not due), and what it found. */
export interface StartupCheck {
  /** Why it ran: "never checked", "unclean stop (pid 123)", "last checked 2 days ago"; none when not due or skipped. */
  reason?: string;
  /** healthProblem()'s complaint, for a file that failed it. */
  problem?: string;
}

/** StartupCheckOptions tunes startupCheck(). */
export interface StartupCheckOptions {
  /** The clock, for the check's age. @default Date.now */
  now?: () => number;
  /** Run it even when not due. @default false */
  always?: boolean;
  /** @default DEFAULTS.fullCheckEveryMs */
  everyMs?: number;
}

// The two marks beside a database: when its last quick_check passed, and one per process that has it open
// (removed at a clean close, so one left by a process that is gone is an unclean stop).
const checkedMark = (path: string) => `${path}-checked`;
const RUNNING = /^(.+)-running\.(\d+)$/;

// uncleanStop names a process that had path open and is gone without its clean close, if any.
function uncleanStop(path: string): number | undefined {
  const folder = dirname(resolve(path));
  for (const name of readdirSync(folder)) {
    const found = RUNNING.exec(name);
    if (found && found[1] === basename(path) && !alive(Number(found[2]))) return Number(found[2]);
  }
  return undefined;
}

/**
 * startupCheck runs healthProblem()'s quick_check on a SQLite file at start-up only when there is reason
 * to: it never passed one, its last one passed more than everyMs ago, or a process that had it open
 * stopped without closing it (its running() mark is still there). A pass is written beside the file
 * (path-checked), so a cron `worker --once` pays for reading every page once a day, not every run.
 */
export function startupCheck(path: string, options: StartupCheckOptions = {}): StartupCheck {
  if (!existsSync(path)) return {};
  const now = (options.now ?? Date.now)();
  const everyMs = options.everyMs ?? DEFAULTS.fullCheckEveryMs;
  const last = existsSync(checkedMark(path)) ? Number(readFileSync(checkedMark(path), "utf8")) : undefined;
  const pid = uncleanStop(path);
  const reason = options.always
    ? "asked for"
    : pid !== undefined
      ? `unclean stop (pid ${pid})`
      : last === undefined || !Number.isFinite(last)
        ? "never checked"
        : now - last > everyMs
          ? `last checked ${Math.round((now - last) / 3_600_000)} h ago`
          : undefined;
  if (reason === undefined) return {};
  const problem = healthProblem(path);
  if (problem !== undefined) return { reason, problem };
  // Best effort: on a full or read-only disk the pass goes unwritten, and the next start checks again.
  try {
    writeFileSync(checkedMark(path), String(now));
    // The stopped processes' marks have served: the file they left has passed.
    for (const name of readdirSync(dirname(resolve(path)))) {
      const found = RUNNING.exec(name);
      if (found && found[1] === basename(path) && !alive(Number(found[2])))
        rmSync(join(dirname(resolve(path)), name), { force: true });
    }
  } catch {}
  return { reason };
}

/**
 * running marks path as open by this process until the returned function is called at its clean close;
 * a mark left behind tells the next startupCheck() that this process stopped uncleanly.
 */
export function running(path: string): () => void {
  const mark = `${path}-running.${process.pid}`;
  try {
    writeFileSync(mark, "");
  } catch {
    // A full disk, or a folder this user may not write: the inbox's own writes will say so; the mark only
    // means an unclean stop of this process goes unnoticed until the daily check.
    return () => {};
  }
  return () => rmSync(mark, { force: true });
}

// oneLine joins SQLite's complaints into one line, without the banner it puts before them.
function oneLine(complaints: string[]): string {
  return complaints
    .join("; ")
    .replace(/\*\*\* in database \w+ \*\*\*\s*/g, "")
    .replace(/\s*\n\s*/g, "; ");
}

// syncFile fsyncs a file, or a folder so that a rename in it survives a power cut.
function syncFile(path: string): void {
  const fd = openSync(path, "r");
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** damagedLine is the one line a script stops with when its database fails quick_check at start-up. */
export function damagedLine(script: string, path: string, problem: string): string {
  return `${script}: ${path} fails SQLite's quick_check (${problem}): restore the last backup (inbox.ts restore FILE), or start with --force to use it anyway`;
}

/** damagedButForced is the line a script starts with when --force accepts a file that fails quick_check. */
export function damagedButForced(script: string, path: string, problem: string): string {
  return `${script}: ${path} fails SQLite's quick_check (${problem}); starting anyway, as --force asks: restore the last backup soon (inbox.ts restore FILE)`;
}
