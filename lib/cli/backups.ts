// lib/cli/backups.ts: the CLI's backup and restore of a SQLite inbox: a checked online copy of the live
// file, and putting one back while nothing has it open (lib/sqlite/backup.ts does the work). Each is a
// function of the Cli (lib/cli/command.ts) that adds itself to the program.

import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { DEFAULTS } from "../defaults.ts";
import { bytes, iso } from "../format.ts";
import { writeAudit } from "../sqlite/records.ts";
import { openDatabase } from "../sqlite/schema.ts";
import { type Audit, STATUSES, type Status } from "../store.ts";
import { type Cli, NotFound, Refused, UsageError } from "./command.ts";

// auditInto writes a restore's audit entry into the copy about to become the inbox: its schema brought up to
// date as any start would, the entry written, the WAL folded back into the file before it is renamed.
function auditInto(copy: string, audit: Audit): void {
  const db = openDatabase(copy);
  try {
    db.exec("BEGIN IMMEDIATE");
    writeAudit((text) => db.prepare(text), audit, 1, Date.now());
    db.exec("COMMIT");
    db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
  } finally {
    if (db.isTransaction) db.exec("ROLLBACK");
    db.close();
  }
}

// holds says what a backup holds: deliveries per status, and tombstones.
function holds(s: { counts: Record<Status, number>; tombstones: number }): string {
  const total = STATUSES.reduce((n, name) => n + s.counts[name], 0);
  const each = STATUSES.filter((name) => s.counts[name] > 0)
    .map((name) => `${name} ${s.counts[name]}`)
    .join(", ");
  return `${total} ${total === 1 ? "delivery" : "deliveries"}${each ? ` (${each})` : ""}, ${s.tombstones} of them tombstones`;
}

/** backup copies a live SQLite inbox to a file, checked, then renamed into place. */
export function backup(c: Cli): void {
  const { target, requireInbox, positive, sqliteOnly } = c;
  c.program
    .command("backup [file]")
    .description(
      "SQLite: copy the live inbox to a file while receivers and workers go on; the copy is checked, then renamed into place",
    )
    .option("--db <path>", `the inbox's database file (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option(
      "--dir <folder>",
      "write into this folder (made 0700 if missing), named after the database and the time: inbox-20261203T120000Z.db; each backup is written 0600",
    )
    .option(
      "--keep <n>",
      "with --dir: afterwards keep only the newest n backups there (never removing the one just made)",
      positive,
    )
    .option("--json", "print the report as JSON")
    .addHelpText(
      "after",
      `
The copy is one moment's state: it holds every delivery acknowledged before the backup began, and none
acknowledged after it. It is written under a temporary name, checked with integrity_check and synced, and
only then renamed, so a file of a backup's name is always a whole one; a failed backup removes nothing.
Keep backups on another disk, or copy them off the machine: see docs/production.md.

Examples:
  npx tsx inbox.ts backup /mnt/backups/inbox.db
  npx tsx inbox.ts backup --dir /var/backups/webhook-inbox --keep 48     # hourly, from a systemd timer`,
    )
    .action(async (file: string | undefined, opts: { db?: string; dir?: string; keep?: number; json?: boolean }) => {
      const db = target(opts);
      sqliteOnly("backup", db);
      if ((file === undefined) === (opts.dir === undefined))
        throw new UsageError("Give the backup's file, or --dir FOLDER (not both).");
      if (opts.keep !== undefined && opts.dir === undefined)
        throw new UsageError("--keep goes with --dir: backup --dir FOLDER --keep N.");
      requireInbox(db);
      // The folder is made if missing, 0700: the backups in it hold every body, for the inbox's user alone.
      if (opts.dir !== undefined && !existsSync(opts.dir)) mkdirSync(opts.dir, { recursive: true, mode: 0o700 });
      const { backup, backupName } = await import("../sqlite/backup.ts");
      const r = await backup(
        db,
        file ?? join(opts.dir!, backupName(db, Date.now())),
        opts.keep === undefined ? {} : { keep: opts.keep },
      );
      if (opts.json) return void console.log(JSON.stringify({ ...r, integrity: "ok" }));
      console.log(
        `Backed up ${db} to ${r.file}: ${bytes(r.bytes)}, ${holds(r)}; integrity_check ok; copied in ${(r.copyMs / 1000).toFixed(1)} s, checked in ${((r.ms - r.copyMs) / 1000).toFixed(1)} s.`,
      );
      console.log(`It holds every delivery acknowledged before ${iso(r.startedAt)}.`);
      if (r.removed.length > 0)
        console.log(
          `Removed ${r.removed.length} older ${r.removed.length === 1 ? "backup" : "backups"} (--keep ${opts.keep}): ${r.removed.join(", ")}`,
        );
      if (r.swept.length > 0)
        console.log(
          `Removed ${r.swept.length} partial ${r.swept.length === 1 ? "copy" : "copies"} left by a backup that was killed: ${r.swept.join(", ")}`,
        );
    });
}

/** restore puts a checked backup back as the SQLite inbox, refused while any process has it open. */
export function restore(c: Cli): void {
  const { target, sqliteOnly } = c;
  c.program
    .command("restore <file>")
    .description(
      "SQLite: put a backup back as the inbox, checked first; refused while any process has the database open",
    )
    .option("--db <path>", `the inbox's database file (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option("--json", "print the report as JSON")
    .addHelpText(
      "after",
      `
Stop the receivers, the workers and the operator page first. A database already at --db is moved aside,
with its -wal and -shm, to <db>.before-restore-<time>: nothing is deleted, and no old WAL is replayed into
the restored file. Deliveries acknowledged after the backup began are not in it: see docs/production.md.

Examples:
  npx tsx inbox.ts restore /var/backups/webhook-inbox/inbox-20261203T120000Z.db --db /var/lib/webhook-inbox/inbox.db`,
    )
    .action(async (file: string, opts: { db?: string; json?: boolean }) => {
      const db = target(opts);
      sqliteOnly("restore", db);
      if (!existsSync(file)) throw new NotFound(`No such file: ${file}`);
      const { restore, InUse } = await import("../sqlite/backup.ts");
      let r: Awaited<ReturnType<typeof restore>>;
      try {
        // The entry goes into the copy before it is renamed into place: the restored inbox holds it from its
        // first moment, and one that cannot be written leaves the database as it was.
        r = restore(file, db, Date.now, (copy) =>
          auditInto(copy, { who: c.who(), operation: "restore", target: `restore file=${JSON.stringify(file)}` }),
        );
      } catch (error) {
        throw error instanceof InUse ? new Refused(`Refused: ${error.message}.`) : error;
      }
      if (opts.json) return void console.log(JSON.stringify(r));
      console.log(`Restored ${file} to ${db}: ${bytes(r.bytes)}, ${holds(r)}.`);
      if (r.aside !== undefined)
        console.log(`The database it replaced was moved aside to ${r.aside} (with its -wal and -shm, if any).`);
    });
}
