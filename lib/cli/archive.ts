// lib/cli/archive.ts: the CLI's commands that move deliveries between inboxes and files: export to JSON
// Lines, import them back, and copy one inbox into another (SQLite to PostgreSQL, or back). Each is a
// function of the Cli (lib/cli/command.ts) that adds itself to the program.

import { existsSync } from "node:fs";
import { DEFAULTS } from "../defaults.ts";
import { exportLine, importLine } from "../format.ts";
import { message } from "../log.ts";
import {
  type AuditEntry,
  type Cursor,
  type Delivery,
  type Filter,
  type Inbox,
  type KeptAttempt,
  STATUSES,
  type Status,
} from "../store.ts";
import { type Cli, type CliFilters, filterOf, NotFound, Refused, UsageError } from "./command.ts";

/** exportLines writes the deliveries that match as JSON Lines, every field and every byte of each body. */
export function exportLines(c: Cli): void {
  const { withDb, withFilters, open, status } = c;
  withFilters(withDb(c.program.command("export")))
    .description("write deliveries as JSON Lines: every field, and the body as base64 (and as text where it is UTF-8)")
    .option("--status <status>", `only this status (${STATUSES.join(", ")})`, status)
    .option("--out <file>", "write to this file instead of stdout")
    .addHelpText(
      "after",
      `
One delivery per line, newest first. Tombstones are exported too (body empty, purgedAt set), so an
inbox moved with export and import keeps answering their IDs as duplicates. For archiving, and for moving
between machines; every byte of every body survives the round trip.

Examples:
  npx tsx inbox.ts export --since 30d --out archive.jsonl
  npx tsx inbox.ts export --status failed --source stripe | gzip > failed.jsonl.gz`,
    )
    .action(async (opts: CliFilters & { db?: string; status?: Status; out?: string }) => {
      const filter: Filter = { ...filterOf(opts), ...(opts.status ? { status: opts.status } : {}) };
      const inbox = await open(opts);
      const { createWriteStream } = await import("node:fs");
      const out = opts.out ? createWriteStream(opts.out) : process.stdout;
      let n = 0;
      try {
        let after: Cursor | undefined;
        for (;;) {
          const page = await inbox.search(filter, { after, limit: DEFAULTS.bulkBatch });
          if (page.length === 0) break;
          const text = `${page.map((d) => JSON.stringify(exportLine(d))).join("\n")}\n`;
          if (!out.write(text)) await new Promise<void>((resolve) => out.once("drain", () => resolve()));
          n += page.length;
          after = page.at(-1);
        }
      } finally {
        if (opts.out)
          await new Promise<void>((resolve, reject) =>
            (out as ReturnType<typeof createWriteStream>).end((e?: Error | null) => (e ? reject(e) : resolve())),
          );
        await inbox.close();
      }
      console.error(`Exported ${n} ${n === 1 ? "delivery" : "deliveries"}${opts.out ? ` to ${opts.out}` : ""}.`);
    });
}

/** importLines reads an export's JSON Lines back; those already present are skipped and counted. */
export function importLines(c: Cli): void {
  const { withDb, target, connect } = c;
  withDb(c.program.command("import <file>"))
    .description(
      "read deliveries from an export's JSON Lines (- for stdin); those already present are skipped and counted",
    )
    .option("--dry-run", "check every line and count, and change nothing")
    .option("--json", "print the counts as JSON")
    .addHelpText(
      "after",
      `
Every body is checked against its sha256 before anything is written. A delivery whose source and ID are
already in the inbox is left as it is. Safe to run twice: the second run skips them all.

Examples:
  npx tsx inbox.ts import archive.jsonl --db other.db
  gunzip -c failed.jsonl.gz | npx tsx inbox.ts import - --db postgres://127.0.0.1:5432/test?schema=inbox`,
    )
    .action(async (file: string, opts: { db?: string; dryRun?: boolean; json?: boolean }) => {
      const { createReadStream } = await import("node:fs");
      const { createInterface } = await import("node:readline");
      if (file !== "-" && !existsSync(file)) throw new NotFound(`No such file: ${file}`);
      const inbox = await connect(target(opts));
      let [lines, added, skipped] = [0, 0, 0];
      // One entry for the whole import, written with its first batch and added to by each (Audit's change).
      const audit = { who: c.who(), operation: "import", target: `import file=${JSON.stringify(file)}` };
      try {
        let batch: Delivery[] = [];
        const flush = async () => {
          if (batch.length === 0) return;
          if (opts.dryRun) {
            for (const d of batch) (await inbox.find(d.id, d.source)).length > 0 ? skipped++ : added++;
          } else {
            const n = await inbox.restore(batch, audit);
            added += n;
            skipped += batch.length - n;
          }
          batch = [];
        };
        const input = file === "-" ? process.stdin : createReadStream(file);
        for await (const line of createInterface({ input, crlfDelay: Infinity })) {
          lines++;
          if (line.trim() === "") continue;
          try {
            batch.push(importLine(JSON.parse(line)));
          } catch (error) {
            throw new UsageError(`${file}:${lines}: ${message(error)}`);
          }
          if (batch.length >= DEFAULTS.bulkBatch) await flush();
        }
        await flush();
      } finally {
        await inbox.close();
      }
      if (opts.json)
        return void console.log(JSON.stringify({ imported: added, skipped, dryRun: opts.dryRun === true }));
      console.log(
        `${opts.dryRun ? "Would import" : "Imported"} ${added} ${added === 1 ? "delivery" : "deliveries"}; skipped ${skipped} already present${opts.dryRun ? " (dry run: nothing changed)" : ""}.`,
      );
    });
}

/**
 * Carried is one kind of record copy takes beside the deliveries: what it is called, how it is read from one
 * inbox a page at a time, and how each page is written into another as it is (the store's read and write
 * pair, which skips what is already there and says how many it wrote).
 */
interface Carried {
  /** Its plural, for the summary line. */
  name: string;
  /** What the rows it did not write are, for the summary line. @default "already there" */
  left?: string;
  pages(inbox: Inbox, size: number): AsyncIterable<readonly unknown[]>;
  write(inbox: Inbox, rows: readonly unknown[]): Promise<number>;
}

// carried makes a Carried of a typed read and write pair, the read one page at a time.
const carried = <T>(
  name: string,
  pages: (inbox: Inbox, size: number) => AsyncIterable<readonly T[]>,
  write: (inbox: Inbox, rows: readonly T[]) => Promise<number>,
  left?: string,
): Carried => ({ name, pages, write: (inbox, rows) => write(inbox, rows as readonly T[]), ...(left ? { left } : {}) });

// whole reads, as one page, a kind that the store reads whole (a few rows, never many).
const whole = <T>(read: (inbox: Inbox) => Promise<readonly T[]>) =>
  async function* (inbox: Inbox): AsyncIterable<readonly T[]> {
    yield await read(inbox);
  };

/**
 * CARRIED is everything copy takes beside the deliveries, in order: without the configuration a receiver
 * on the copy serves no source, without the keys every API consumer is refused. The idempotency records
 * stay behind (they live 24 h). A new kind of record is one line here, with its read and write pair in the
 * store's contract.
 */
const CARRIED: readonly Carried[] = [
  // Whole routes a page (attemptPage()), each written only into the delivery it was of, if it has no tries
  // there, and no more of a route's than the target keeps (its attemptsKept, the newest).
  carried(
    "tries of the attempt log",
    attemptPages,
    (i, rows) => i.restoreAttempts(rows),
    "already there, older than the target keeps, or of a delivery the target had of its own",
  ),
  carried(
    "configuration versions",
    whole((i) => i.configHistory()),
    (i, rows) => i.restoreConfig(rows),
  ),
  carried(
    "API keys",
    whole((i) => i.apiKeys()),
    (i, rows) => i.restoreApiKeys(rows),
  ),
  // Still sealed: the copy opens with the same INBOX_SECRETS_KEY, and nothing on the way can read them.
  carried(
    "secrets",
    whole((i) => i.secrets()),
    (i, rows) => i.putSecrets(rows),
  ),
  carried("audit entries", auditPages, (i, rows) => i.restoreAudit(rows)),
];

// attemptPages reads the attempt log in key order, a page at a time.
async function* attemptPages(inbox: Inbox, size: number): AsyncIterable<KeptAttempt[]> {
  for (let after: KeptAttempt | undefined; ; ) {
    const page = await inbox.attemptPage(after, size);
    if (page.length === 0) return;
    yield page;
    after = page.at(-1);
  }
}

// auditPages reads the audit log newest first, a page at a time: each entry keeps its seq, so the order
// they are written in does not matter.
async function* auditPages(inbox: Inbox, size: number): AsyncIterable<AuditEntry[]> {
  for (let before: number | undefined; ; ) {
    const page = await inbox.auditLog({ ...(before !== undefined ? { before } : {}), limit: size });
    if (page.length === 0) return;
    yield page;
    before = page.at(-1)!.seq;
  }
}

// sameHistory refuses, before anything is copied, a target whose configuration has a history of its own: a
// version of the same number with another document would leave two histories interleaved, and the one in
// force whichever numbered higher. A target that an earlier copy made, even changed since, goes on.
async function sameHistory(from: Inbox, to: Inbox): Promise<void> {
  const theirs = new Map((await to.configHistory()).map((v) => [v.version, v.document]));
  if (theirs.size === 0) return;
  const clash = (await from.configHistory()).find((v) => theirs.has(v.version) && theirs.get(v.version) !== v.document);
  if (clash)
    throw new Refused(
      `${to.target} has a configuration of its own (its version ${clash.version} is not ${from.target}'s); nothing copied. Copy into a new inbox, or one an earlier copy made.`,
    );
}

/**
 * copy copies one inbox into another, byte-exact: every delivery, then what CARRIED lists (the deliveries'
 * attempt log, the configuration and its history, the API keys, the secrets still sealed, the audit log); run
 * again, it changes nothing.
 */
export function copy(c: Cli): void {
  const { openTarget, connect, positive } = c;
  c.program
    .command("copy")
    .description(
      "copy a whole inbox into another (SQLite to PostgreSQL, or back): every delivery byte-exact with its attempt log, the configuration and its history, the API keys and the audit log; run again, it changes nothing",
    )
    .requiredOption("--from <path|url>", "the inbox to copy from")
    .requiredOption("--to <path|url>", "the inbox to copy into (created if new)")
    .option("--batch <n>", "deliveries, tries of the attempt log and audit entries per transaction", positive, 500)
    .action(async (opts: { from: string; to: string; batch: number }) => {
      const from = await openTarget(opts.from);
      try {
        const to = await connect(opts.to);
        try {
          await sameHistory(from, to);
          let seen = 0;
          let added = 0;
          let after: { source: string; id: string } | undefined;
          for (;;) {
            const page = await from.page(after, opts.batch);
            if (page.length === 0) break;
            added += await to.restore(page);
            seen += page.length;
            after = page.at(-1)!;
          }
          const there = seen - added;
          console.log(
            added === 0
              ? `Nothing to copy: all ${seen} deliveries of ${from.target} are already in ${to.target}.`
              : `Copied ${added} of ${seen} deliveries from ${from.target} to ${to.target}${there > 0 ? ` (${there} were already there)` : ""}.`,
          );
          for (const kind of CARRIED) {
            let [read, wrote] = [0, 0];
            for await (const rows of kind.pages(from, opts.batch)) {
              if (rows.length === 0) continue;
              wrote += await kind.write(to, rows);
              read += rows.length;
            }
            const left = kind.left ?? "already there";
            console.log(
              read === 0
                ? `No ${kind.name} to copy.`
                : wrote === 0
                  ? `Nothing to copy: all ${read} ${kind.name} are ${left}.`
                  : `Copied ${wrote} of ${read} ${kind.name}${read > wrote ? ` (${read - wrote} were ${left})` : ""}.`,
            );
          }
        } finally {
          await to.close();
        }
      } finally {
        await from.close();
      }
    });
}
