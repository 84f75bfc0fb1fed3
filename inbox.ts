// inbox.ts: connect() to the durable inbox, and the operator's CLI. Scripts import connect() from here;
// it opens a SQLite file (sqlite.ts) or a postgres:// URL (postgres.ts), both held to the contract in
// store.ts, which this module re-exports for apps. Run directly, it is the CLI at the bottom.
//   npx tsx inbox.ts init   (a new deployment's first step: the one command that creates an inbox)
//   npx tsx inbox.ts status | list | show <id> | retry <id> | retry --all-failed | copy   [--db inbox.db]
//   npx tsx inbox.ts purge | retry --failed … | replay … | export | import <file>   (retention, bulk, archives)
//   npx tsx inbox.ts preview <id> [--to billing]   (what a stored delivery would become under the sources file)
//   npx tsx inbox.ts backup FILE | --dir D --keep N;  restore FILE   (SQLite: a checked online copy, and back)
//   npx tsx inbox.ts reconcile [--source NAME] [--since 3d] [--dry-run] [--every 15m]   (what the provider never delivered)
//   npx tsx inbox.ts destinations | pause NAME | resume NAME;  keys create|list|revoke;  config apply FILE | dump
//   npx tsx inbox.ts secrets set NAME (value on stdin) | list | delete NAME | rotate;  audit
//   npx tsx inbox.ts search enable | disable | status   (the body search index, off by default)
// --db (or INBOX_DB) is a file path, or a postgres:// URL.

import { pathToFileURL } from "node:url";
import { message } from "./lib/log.ts";
import { requireSqlite } from "./lib/runtime.ts";
// Tx.db, the SQLite connection, is declared by the SQLite backend; this import keeps that declaration in the
// package's types, whose inbox.d.ts would otherwise drop the backend (connect()'s type names no SqliteInbox).
// A type import only: the backend itself is loaded by connect(), after the check that node:sqlite is there.
import type {} from "./lib/sqlite/sqlite.ts";
import type { Inbox, InboxOptions } from "./lib/store.ts";

export { DEFAULTS } from "./lib/defaults.ts";
export * from "./lib/store.ts";

/** isPostgresUrl tells a PostgreSQL URL from a SQLite path. */
export function isPostgresUrl(target: string): boolean {
  return /^postgres(ql)?:\/\//i.test(target);
}

/**
 * connect opens the inbox at target, as the article's connect() did: a file path for SQLite, or a
 * postgres:// URL (with ?schema=NAME to share one database) for PostgreSQL. Which target is the entry
 * point's call: --db, else INBOX_DB, else DEFAULTS.db.
 */
export async function connect(target: string, options: InboxOptions = {}): Promise<Inbox> {
  // On a Node without node:sqlite (Node 20), one line and exit 2, not a stack trace from the import below.
  requireSqlite();
  if (!isPostgresUrl(target)) {
    const { SqliteInbox } = await import("./lib/sqlite/sqlite.ts");
    return new SqliteInbox(target, options);
  }
  // Loaded only when asked for, so a SQLite inbox never loads pg.
  const { PostgresInbox } = await import("./lib/postgres/postgres.ts");
  return PostgresInbox.open(target, options);
}

// ---- The operator's CLI ----------------------------------------------------------------------------

/**
 * cli runs the operator's CLI as `inbox.ts` does, from a full argv (runtime, script, then its command).
 * The commands live in lib/cli/ by what they do (reads, actions, archive, backups); a new one is a function
 * there and a line in the list below, which is the order --help shows them in.
 */
export async function cli(argv: string[]): Promise<void> {
  // Loaded only when the CLI runs, so an app that imports connect() never loads commander.
  const { Command, CommanderError } = await import("commander");
  const { commandLine, NotFound, Refused, UsageError } = await import("./lib/cli/command.ts");
  const reads = await import("./lib/cli/reads.ts");
  const actions = await import("./lib/cli/actions.ts");
  const archive = await import("./lib/cli/archive.ts");
  const backups = await import("./lib/cli/backups.ts");
  const keys = await import("./lib/cli/keys.ts");
  const secrets = await import("./lib/cli/secrets.ts");
  const search = await import("./lib/cli/search.ts");
  const { SearchOff, SearchTooBroad } = await import("./lib/search.ts");
  const reconcile = await import("./lib/cli/reconcile.ts");
  const { speakTo, spokenAs } = await import("./lib/format.ts");
  const { DEFAULTS } = await import("./lib/defaults.ts");
  const configs = await import("./lib/cli/config.ts");
  const program = new Command("inbox.ts")
    .description("Look into the webhook inbox and put failed deliveries back in the queue.")
    .exitOverride()
    // A usage error is one line, the hint included: commander's own hint would be a second one.
    .configureOutput({ outputError: (text, write) => write(`${text.trimEnd()} (run with --help for usage)\n`) })
    // Taken before the command as after it: inbox.ts --db X status, as inbox.ts status --db X.
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .addHelpText(
      "after",
      `
Examples:
  npx tsx inbox.ts init --db /var/lib/webhook-inbox/inbox.db
  npx tsx inbox.ts status
  npx tsx inbox.ts list --status failed
  npx tsx inbox.ts show evt_100
  npx tsx inbox.ts retry evt_100
  npx tsx inbox.ts retry --all-failed
  npx tsx inbox.ts retry --failed --source stripe --error-match timeout --since 2h --dry-run
  npx tsx inbox.ts replay --source stripe --type invoice.paid --since 3d
  npx tsx inbox.ts purge --dry-run
  npx tsx inbox.ts destinations
  npx tsx inbox.ts pause app --reason "deploying the app" && npx tsx inbox.ts resume app
  npx tsx inbox.ts export --since 30d --out archive.jsonl
  npx tsx inbox.ts import archive.jsonl --db other.db
  npx tsx inbox.ts status --db postgres://127.0.0.1:5432/test?schema=inbox
  npx tsx inbox.ts copy --from inbox.db --to postgres://127.0.0.1:5432/test?schema=inbox
  npx tsx inbox.ts backup --dir /var/backups/webhook-inbox --keep 48
  npx tsx inbox.ts restore /var/backups/webhook-inbox/inbox-20261203T120000Z.db
  npx tsx inbox.ts keys create --scope read --name dashboards
  printf %s "$APP_SECRET" | npx tsx inbox.ts secrets set app_signing
  npx tsx inbox.ts audit --limit 20
  npx tsx inbox.ts reconcile --sources sources.json --since 3d --dry-run
  npx tsx inbox.ts config apply sources.json --dry-run && npx tsx inbox.ts config apply sources.json
  npx tsx inbox.ts config dump > sources.json

Exit codes: 0 success, 1 not found or refused, 2 usage error.`,
    );

  speakTo(program, argv);
  const c = commandLine(program, { connect, isPostgresUrl });
  for (const add of [
    configs.init,
    reads.status,
    reads.list,
    reads.show,
    reads.preview,
    actions.retry,
    actions.replay,
    reads.destinations,
    actions.pause,
    actions.resume,
    actions.purge,
    archive.exportLines,
    archive.importLines,
    archive.copy,
    backups.backup,
    backups.restore,
    keys.keys,
    secrets.secrets,
    search.search,
    reads.audit,
    reconcile.reconcileCommand,
    configs.config,
  ])
    add(c);

  try {
    await program.parseAsync(argv);
  } catch (error) {
    if (error instanceof CommanderError) {
      process.exitCode = error.exitCode === 0 ? 0 : 2;
      return;
    }
    process.exitCode = error instanceof UsageError ? 2 : 1;
    // Run from the package, the line names what the user runs (webhook-inbox inbox keys list), not the clone's file.
    console.error(
      spokenAs(argv)(
        error instanceof UsageError ||
          error instanceof NotFound ||
          error instanceof Refused ||
          error instanceof SearchOff ||
          error instanceof SearchTooBroad
          ? error.message
          : `inbox.ts: ${message(error)}`,
      ),
    );
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) void cli(process.argv);
