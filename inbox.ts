// inbox.ts: connect() to the durable inbox, and the operator's CLI. Scripts import connect() from here;
// it opens a SQLite file (sqlite.ts) or a postgres:// URL (postgres.ts), both held to the contract in
// store.ts, which this module re-exports for apps. Run directly, it is the CLI at the bottom.
//   npx tsx inbox.ts status | list | show <id> | retry <id> | retry --all-failed | copy   [--db inbox.db]
//   npx tsx inbox.ts purge | retry --failed … | replay … | export | import <file>   (retention, bulk, archives)
//   npx tsx inbox.ts preview <id> [--to billing]   (what a stored delivery would become under the sources file)
//   npx tsx inbox.ts backup FILE | --dir D --keep N;  restore FILE   (SQLite: a checked online copy, and back)
// --db (or INBOX_DB) is a file path, or a postgres:// URL.

import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { DEFAULTS } from "./lib/defaults.ts";
import {
  age,
  bodyForPeople,
  bytes,
  deliveryJson,
  exportLine,
  importLine,
  iso,
  parseDuration,
  parseWhen,
} from "./lib/format.ts";
import { label, message } from "./lib/log.ts";
import { readSourcesFile } from "./lib/providers.ts";
import { loadDestinations, type Operator } from "./lib/routing/routes.ts";
import { parseBrokerDestination } from "./lib/brokers.ts";
import { SqliteInbox } from "./lib/sqlite/sqlite.ts";
// Tx.db, the SQLite connection, is declared by the SQLite backend; this import keeps that declaration in the
// package's types, whose inbox.d.ts would otherwise drop the backend (connect()'s type names no SqliteInbox).
import "./lib/sqlite/sqlite.ts";
import { isInbox } from "./lib/sqlite/schema.ts";
import {
  DESTINATION_NAME,
  STATUSES,
  type Cursor,
  type Delivery,
  type Filter,
  type Inbox,
  type InboxOptions,
  type InboxStatus,
  type Status,
} from "./lib/store.ts";

export { DEFAULTS } from "./lib/defaults.ts";
export * from "./lib/store.ts";
// What the contract's file exported before its helpers had rooms of their own, still exported from here.
export {
  breakerAfter,
  checkClaim,
  checkPermit,
  gateClaim,
  gatePermit,
  tellSetAside,
  toDestinationState,
} from "./lib/breaker.ts";
export { bulkBatchSize, checkOptions, orderOf, purgeCutoffs, routesOf, searchPageLimit } from "./lib/checks.ts";
export { again, passing, sqlstate } from "./lib/errors.ts";
export { emptyBuckets, orderingStatus, sha256, summarise, toDelivery, toGauges } from "./lib/rows.ts";
export { DISTINCT_SOURCES, filterSql, ORDERING_SQL } from "./lib/sql.ts";
export { backoff, paced, retryDelay } from "./lib/timing.ts";

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
  if (!isPostgresUrl(target)) return new SqliteInbox(target, options);
  // Loaded only when asked for, so a SQLite inbox never loads pg.
  const { PostgresInbox } = await import("./lib/postgres/postgres.ts");
  return PostgresInbox.open(target, options);
}

// ---- The operator's CLI ----------------------------------------------------------------------------

/** UsageError is a mistake on the command line: one line on stderr, exit 2. */
class UsageError extends Error {}
/** NotFound is a lookup that matched nothing: one line on stderr, exit 1. */
class NotFound extends Error {}
/** Refused is an operation that would not be safe now (a restore over a database in use): one line, exit 1. */
class Refused extends Error {}

// One delivery by ID, with a row per route: --source settles it when two sources share an ID, and
// --destination picks one route's row.
async function findRows(
  inbox: Inbox,
  id: string,
  source: string | undefined,
  destination?: string,
): Promise<Delivery[]> {
  const found = (await inbox.find(id, source)).filter(
    (d) => destination === undefined || d.destination === destination,
  );
  if (found.length === 0)
    throw new NotFound(
      `No delivery with ID ${id}${source ? ` in source ${source}` : ""}${destination ? ` for destination ${destination}` : ""}.`,
    );
  const sources = [...new Set(found.map((d) => d.source))];
  if (sources.length > 1) throw new UsageError(`ID ${id} exists in sources ${sources.join(", ")}; pass --source.`);
  return found;
}

// CliFilters are the filter options every bulk command takes.
interface CliFilters {
  source?: string;
  type?: string;
  since?: number;
  until?: number;
  errorMatch?: string;
  destination?: string;
}

function filterOf(opts: CliFilters): Filter {
  const filter: Filter = {};
  if (opts.destination !== undefined) filter.destination = opts.destination;
  if (opts.source !== undefined) filter.source = opts.source;
  if (opts.type !== undefined) filter.type = opts.type;
  if (opts.since !== undefined) filter.since = opts.since;
  if (opts.until !== undefined) filter.until = opts.until;
  if (opts.errorMatch !== undefined) filter.errorMatch = opts.errorMatch;
  return filter;
}

// holds says what a backup holds: deliveries per status, and tombstones.
function holds(s: { counts: Record<Status, number>; tombstones: number }): string {
  const total = STATUSES.reduce((n, name) => n + s.counts[name], 0);
  const each = STATUSES.filter((name) => s.counts[name] > 0)
    .map((name) => `${name} ${s.counts[name]}`)
    .join(", ");
  return `${total} ${total === 1 ? "delivery" : "deliveries"}${each ? ` (${each})` : ""}, ${s.tombstones} of them tombstones`;
}

/** cli runs the operator's CLI as `inbox.ts` does, from a full argv (runtime, script, then its command). */
export async function cli(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError, CommanderError, Option } = await import("commander");
  const program = new Command("inbox.ts")
    .description("Look into the webhook inbox and put failed deliveries back in the queue.")
    .exitOverride()
    // A usage error is one line, the hint included: commander's own hint would be a second one.
    .configureOutput({ outputError: (text, write) => write(`${text.trimEnd()} (run with --help for usage)\n`) })
    .addHelpText(
      "after",
      `
Examples:
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

Exit codes: 0 success, 1 not found or refused, 2 usage error.`,
    );

  const positive = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("expected a whole number of 1 or more.");
    return n;
  };
  const status = (value: string) => {
    if (!(STATUSES as readonly string[]).includes(value))
      throw new InvalidArgumentError(`expected one of ${STATUSES.join(", ")}.`);
    return value as Status;
  };
  const withDb = (command: InstanceType<typeof Command>) =>
    command.option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`);
  const target = (opts: { db?: string }) => opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  // requireInbox refuses a SQLite path that is no inbox yet. Looking must not create: a typo in --db would
  // otherwise show an empty, healthy inbox. Nor convert: opening another program's database would switch
  // it to WAL and add our tables.
  const requireInbox = (path: string) => {
    if (!existsSync(path)) throw new NotFound(`No inbox database at ${path} (use --db or INBOX_DB).`);
    if (!isInbox(path))
      throw new NotFound(`${path} is not an inbox database: it has tables, but no deliveries (use --db or INBOX_DB).`);
  };
  const openTarget = async (path: string) => {
    if (!isPostgresUrl(path)) requireInbox(path);
    return connect(path);
  };
  const open = (opts: { db?: string }) => openTarget(target(opts));
  const duration = (value: string) => {
    const ms = parseDuration(value);
    if (ms === undefined) throw new InvalidArgumentError("expected an age such as 30m, 12h, 7d or 2w.");
    return ms;
  };
  const when = (value: string) => {
    const ms = parseWhen(value, Date.now());
    if (ms === undefined)
      throw new InvalidArgumentError("expected an ISO date (2026-01-05, 2026-01-05T12:00:00Z) or an age ago (2h, 3d).");
    return ms;
  };
  const withFilters = (command: InstanceType<typeof Command>) =>
    command
      .option("--source <name>", "only this source")
      .option("--type <type>", "only this event type")
      .option("--since <when>", "received at or after: an ISO date, or an age ago (2h, 3d)", when)
      .option("--until <when>", "received before: an ISO date, or an age ago", when)
      .option("--error-match <text>", "whose last error contains this text (any case)")
      .option("--destination <name>", 'only the rows going to this destination (the handler is "handler")');

  withDb(program.command("status"))
    .description("count deliveries per status; list failures, the oldest wait and conflicting duplicates")
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const s = await inbox.status();
        const kept = await inbox.kept();
        if (opts.json) return void console.log(JSON.stringify({ ...s, kept }, null, 2));
        for (const name of STATUSES) if (s.counts[name] > 0) console.log(`${name.padEnd(11)}${s.counts[name]}`);
        if (STATUSES.every((name) => s.counts[name] === 0)) console.log("(the inbox is empty)");
        for (const f of s.failed) {
          const tries = f.attempts === 1 ? "1 attempt" : `${f.attempts} attempts`;
          console.log(
            `  failed: ${label(f)}${f.eventType ? ` (${f.eventType})` : ""} after ${tries}: ${f.error ?? "(no error recorded)"}`,
          );
        }
        // The article's single unsigned source has nothing to break down; several sources or typed events do.
        if (s.sources.some((x) => x.source !== DEFAULTS.source || x.eventType !== null)) {
          console.log("by source and type:");
          const width = (f: (x: InboxStatus["sources"][number]) => string) =>
            Math.max(...s.sources.map((x) => f(x).length)) + 2;
          const [sw, tw] = [width((x) => x.source), width((x) => x.eventType ?? "-")];
          for (const x of s.sources) {
            const counts = STATUSES.filter((name) => x.counts[name] > 0)
              .map((name) => `${name} ${x.counts[name]}`)
              .join(", ");
            console.log(`  ${x.source.padEnd(sw)}${(x.eventType ?? "-").padEnd(tw)}${counts}`);
          }
        }
        if (s.oldestWaitingMs !== null) console.log(`oldest waiting: ${age(s.oldestWaitingMs)}`);
        if (s.conflicts.deliveries > 0) {
          console.log(
            `conflicts: ${s.conflicts.deliveries} deliveries had ${s.conflicts.copies} duplicates with a different body (the first copy was kept)`,
          );
        }
        const o = s.ordering;
        if (o.keys > 0 || o.stale > 0 || o.passed > 0) {
          const plural = (n: number, one: string, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;
          console.log(
            `ordered: ${plural(o.keys, "key")} with work, ${plural(o.heldKeys, "key")} held up, ` +
              `${plural(o.stale, "stale delivery", "stale deliveries")} handed over, ${plural(o.passed, "set-aside delivery", "set-aside deliveries")} passed by later ones`,
          );
          for (const h of o.held) {
            const why =
              h.reason === "retry"
                ? `waits for ${h.headId} to be retried at ${iso(h.retryAt)} (attempt ${h.attempts + 1})`
                : `is blocked by ${h.headId}, set aside as failed on a strict key (retry it to go on)`;
            console.log(
              `  held: ${label({ source: h.source, id: h.orderKey })} ${why}; ${h.waiting} waiting: ${h.error ?? "(no error recorded)"}`,
            );
          }
          if (o.heldKeys > o.held.length) console.log(`  … and ${o.heldKeys - o.held.length} more held keys`);
        }
        // How much is kept, so an operator sees retention at work (or that the file predates it).
        if (STATUSES.every((name) => s.counts[name] === 0)) return;
        const oldest = (t: number | null) => (t === null ? "" : `, oldest ${iso(t)}`);
        console.log(
          `kept: ${kept.bodies.count} with their body (${bytes(kept.bodies.bytes)}${oldest(kept.bodies.oldest)}); ${kept.tombstones.count} tombstones${oldest(kept.tombstones.oldest)}`,
        );
        const free = kept.freeBytes ? `, ${bytes(kept.freeBytes)} of it free for reuse` : "";
        const shrink =
          kept.autoVacuum === "none"
            ? " (made before retention: run `purge --vacuum` once so purges can shrink it)"
            : "";
        console.log(`on disk: ${bytes(kept.fileBytes)}${free}${shrink}`);
      } finally {
        await inbox.close();
      }
    });

  withDb(program.command("list"))
    .description("list deliveries, newest first")
    .option("--status <status>", `only this status (${STATUSES.join(", ")})`, status)
    .option("--source <name>", "only this source")
    .option("--limit <n>", "at most this many", positive, 20)
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; status?: Status; source?: string; limit: number; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const rows = await inbox.list(opts);
        if (opts.json)
          return void console.log(
            JSON.stringify(
              rows.map((d) => deliveryJson(d, false)),
              null,
              2,
            ),
          );
        if (rows.length === 0) return void console.log("(no deliveries)");
        // The destination shows once any row goes elsewhere than the handler; the handler's alone reads as before.
        const routed = rows.some((d) => d.destination !== DEFAULTS.destination);
        console.log(
          ["source", "id", "status", "attempts", "type", "received", "error", ...(routed ? ["destination"] : [])].join(
            "\t",
          ),
        );
        for (const d of rows) {
          console.log(
            [
              d.source,
              d.id,
              d.status,
              d.attempts,
              d.eventType ?? "-",
              iso(d.receivedAt),
              d.error ?? "",
              ...(routed ? [d.destination || "-"] : []),
            ].join("\t"),
          );
        }
      } finally {
        await inbox.close();
      }
    });

  withDb(program.command("show <id>"))
    .description("print one delivery: its metadata, last error and body")
    .option("--source <name>", "the delivery's source, when IDs clash")
    .option("--destination <name>", "only its row for this destination")
    .option("--json", "print JSON (the body as text when it is UTF-8, and always as base64)")
    .action(async (id: string, opts: { db?: string; source?: string; destination?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const all = await findRows(inbox, id, opts.source, opts.destination);
        const d = all[0]!;
        if (opts.json)
          return void console.log(
            JSON.stringify(all.length === 1 ? deliveryJson(d, true) : all.map((x) => deliveryJson(x, true)), null, 2),
          );
        if (all.length > 1) {
          // One delivery, several routes: each destination's row has its own status, attempts and error.
          console.log(
            `routes        ${all.map((x) => `${x.destination} ${x.status} (${x.attempts} attempts)${x.error ? `: ${x.error}` : ""}`).join("\n              ")}`,
          );
        }
        const lines: [string, unknown][] = [
          ["source", d.source],
          ["id", d.id],
          ["destination", d.destination || "(none: no route chose it)"],
          ["status", d.status],
          ["attempts", d.attempts],
          ["type", d.eventType ?? "-"],
          ["content type", d.contentType ?? "-"],
          ["received", iso(d.receivedAt)],
          ["provider time", iso(d.providerTime)],
          ["due", d.status === "received" ? iso(d.availableAt) : "-"],
          ["leased until", iso(d.leasedUntil)],
          ["finished", iso(d.finishedAt)],
          ["conflicts", d.conflicts],
          ["sha256", d.bodySha256],
          ...(d.orderKey === null
            ? []
            : ([
                ["order key", d.orderKey],
                ["event time", iso(d.eventTime)],
                ["stale", d.newerId === null ? "no" : `yes, handled after ${d.newerId}`],
              ] as [string, unknown][])),
          // The trace to look up in the tracing UI (docs/observability.md#traces), where one was recorded.
          ...(d.traceparent === null ? [] : ([["traceparent", d.traceparent]] as [string, unknown][])),
          ["error", d.error ?? "-"],
          ["body", `${d.body.length} bytes`],
        ];
        for (const [k, v] of lines) console.log(`${k.padEnd(14)}${v}`);
        console.log(bodyForPeople(d.body));
      } finally {
        await inbox.close();
      }
    });

  withDb(program.command("preview <id>"))
    .description(
      "show which routes a stored delivery's filters choose now, and the exact request each destination would get (its transform run); nothing is sent",
    )
    .option("--source <name>", "the delivery's source, when IDs clash")
    .option("--to <destination>", "only this destination, whether its routes chose it or not")
    .option("--sources <file>", "the sources file (default: INBOX_SOURCES)")
    .option("--json", "print JSON (each body as text when it is UTF-8, and always as base64)")
    .action(
      async (id: string, opts: { db?: string; source?: string; to?: string; sources?: string; json?: boolean }) => {
        const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
        if (!sourcesFile)
          throw new UsageError("preview reads the routes from the sources file: pass --sources or set INBOX_SOURCES.");
        let config: unknown;
        try {
          config = readSourcesFile(sourcesFile);
        } catch (error) {
          throw new UsageError(`${sourcesFile}: ${message(error)}`);
        }
        const inbox = await open(opts);
        try {
          const rows = await findRows(inbox, id, opts.source);
          const { preview } = await import("./lib/forwarding/preview.ts");
          let seen: Awaited<ReturnType<typeof preview>>;
          try {
            seen = await preview(rows, config, {
              base: dirname(resolve(sourcesFile)),
              ...(opts.to ? { to: opts.to } : {}),
            });
          } catch (error) {
            throw new UsageError(`${sourcesFile}: ${message(error)}`);
          }
          if (opts.json) {
            const body = (b: Buffer | undefined) =>
              b === undefined
                ? {}
                : {
                    body: bodyForPeople(b).startsWith("(not UTF-8") ? null : b.toString("utf8"),
                    bodyBase64: b.toString("base64"),
                  };
            return void console.log(
              JSON.stringify(
                { ...seen, requests: seen.requests.map(({ body: b, ...r }) => ({ ...r, ...body(b) })) },
                null,
                2,
              ),
            );
          }
          const d = rows[0]!;
          console.log(
            `${label(d)}${d.eventType ? ` (${d.eventType})` : ""}, received ${iso(d.receivedAt)}; nothing is sent`,
          );
          console.log(
            `routes now    ${seen.routes.map((r) => `${r.to}: ${r.chosen ? "chosen" : `not chosen (${r.why})`}`).join("; ") || "(none)"}`,
          );
          console.log(`stored rows   ${rows.map((x) => `${x.destination || "(none)"} ${x.status}`).join("; ")}`);
          for (const note of seen.notes) console.log(`note          ${note}`);
          for (const r of seen.requests) {
            console.log("");
            if (r.kind === "handler")
              console.log(`→ ${r.destination}: the worker's handler runs it; nothing goes over the network`);
            else if (r.error) console.log(`→ ${r.destination}: the try would fail: ${r.error}`);
            else if (r.skipped)
              console.log(
                `→ ${r.destination}: skipped, its transform returned null; the row would be done, nothing sent`,
              );
            else {
              console.log(`→ ${r.destination}: ${r.kind === "http" ? `POST ${r.url}` : "publish to its broker"}`);
              for (const [name, value] of Object.entries(r.headers ?? {})) console.log(`${name}: ${value}`);
              console.log("");
              console.log(bodyForPeople(r.body!));
            }
          }
        } finally {
          await inbox.close();
        }
      },
    );

  withFilters(withDb(program.command("retry [id]")))
    .description(
      "put failed deliveries back in the queue, attempts reset: one by ID, every failed one, or those a filter matches",
    )
    .option("--all-failed", "retry every failed delivery")
    .option("--failed", "retry the failed deliveries that the filters match")
    .option("--dry-run", "say how many would be retried, and change nothing")
    .option("--json", "print the count as JSON")
    .addHelpText(
      "after",
      `
A failed delivery whose body was purged (a tombstone) cannot be retried. Bulk retries go in batches of
${DEFAULTS.bulkBatch}, each its own transaction, beside a running worker; run twice, the second finds nothing.

Examples:
  npx tsx inbox.ts retry evt_100
  npx tsx inbox.ts retry --failed --source stripe --error-match timeout --since 2h --dry-run
  npx tsx inbox.ts retry --all-failed`,
    )
    .action(
      async (
        id: string | undefined,
        opts: CliFilters & { db?: string; allFailed?: boolean; failed?: boolean; dryRun?: boolean; json?: boolean },
      ) => {
        const bulk = opts.allFailed || opts.failed;
        if (opts.allFailed && opts.failed)
          throw new UsageError("Give either --all-failed or --failed with filters, not both.");
        if (bulk && id !== undefined)
          throw new UsageError(`Give either an ID or ${opts.allFailed ? "--all-failed" : "--failed"}, not both.`);
        if (!bulk && id === undefined)
          throw new UsageError(
            "Give the ID of a failed delivery, or --all-failed. To retry some, --failed with filters.",
          );
        const filter = filterOf(opts);
        if (opts.allFailed && Object.keys(filter).some((k) => k !== "source"))
          throw new UsageError("--all-failed takes no filters; use --failed with them.");
        const inbox = await open(opts);
        try {
          if (bulk) {
            const n = await inbox.retryMatching(filter, { dryRun: opts.dryRun });
            if (opts.json)
              return void console.log(
                JSON.stringify({ matched: n, retried: opts.dryRun ? 0 : n, dryRun: opts.dryRun === true }),
              );
            const what = n === 1 ? "1 failed delivery" : `${n} failed deliveries`;
            return void console.log(
              opts.dryRun ? `Would queue ${what} again (dry run: nothing changed).` : `Queued ${what} again.`,
            );
          }
          const rows = await findRows(inbox, id!, opts.source, opts.destination);
          const d = rows.find((x) => x.status === "failed") ?? rows[0]!;
          if (d.status !== "failed") throw new NotFound(`No failed delivery with ID ${id}: it is ${d.status}.`);
          if (d.purgedAt !== null)
            throw new NotFound(
              `Delivery ${label(d)} cannot be retried: its body was purged at ${iso(d.purgedAt)} (only its tombstone is left).`,
            );
          if (opts.dryRun) return void console.log(`Would queue ${label(d)} again (dry run: nothing changed).`);
          await inbox.retry({ source: d.source, id: d.id });
          console.log("Queued again.");
        } finally {
          await inbox.close();
        }
      },
    );

  withFilters(withDb(program.command("replay [id]")))
    .description(
      "put done deliveries through the handler again (after a handler bug was fixed): one by ID, or those the filters match",
    )
    .option("--all", "replay every done delivery the filters match, even with no filter at all")
    .option(
      "--to <destination>",
      "send the deliveries that match to this destination instead: its row goes again, or is added if their routes never chose it",
    )
    .option("--dry-run", "say how many would be replayed, and change nothing")
    .option("--json", "print the counts as JSON")
    .addHelpText(
      "after",
      `
A replay is a new attempt of the same delivery (same source and ID, so handlers' idempotency keys hold):
its attempts start again from zero and its replay count goes up. It needs the body: a tombstone (body
purged) cannot be replayed, and is counted apart. Batches of ${DEFAULTS.bulkBatch}, each its own transaction.

Examples:
  npx tsx inbox.ts replay evt_100
  npx tsx inbox.ts replay --source stripe --type invoice.paid --since 2026-01-05T00:00:00Z --until 1d --dry-run
  npx tsx inbox.ts replay --to app --source stripe --since 3d      # routing after the fact`,
    )
    .action(
      async (
        id: string | undefined,
        opts: CliFilters & { db?: string; all?: boolean; dryRun?: boolean; json?: boolean; to?: string },
      ) => {
        const filter = filterOf(opts);
        if (id !== undefined && (opts.all || Object.keys(filter).some((k) => k !== "source"))) {
          throw new UsageError("Give either an ID or filters, not both.");
        }
        if (id === undefined && !opts.all && Object.keys(filter).length === 0) {
          throw new UsageError("Give the ID of a done delivery, some filters (--source, --type, --since …), or --all.");
        }
        const inbox = await open(opts);
        try {
          if (id !== undefined) {
            const rows = await findRows(inbox, id, opts.source, opts.destination);
            const d =
              rows.find((x) => x.status === "done" && x.purgedAt === null) ??
              rows.find((x) => x.status === "done") ??
              rows[0]!;
            if (d.status !== "done" && opts.to === undefined)
              throw new NotFound(`No done delivery with ID ${id}: it is ${d.status}.`);
            if (d.purgedAt !== null)
              throw new NotFound(
                `Delivery ${label(d)} cannot be replayed: its body was purged at ${iso(d.purgedAt)} (only its tombstone is left).`,
              );
            Object.assign(filter, { source: d.source, id: d.id });
          }
          const r = await inbox.replayMatching(filter, {
            dryRun: opts.dryRun,
            ...(opts.to !== undefined ? { to: opts.to } : {}),
          });
          if (opts.json) return void console.log(JSON.stringify({ ...r, dryRun: opts.dryRun === true }));
          const what = r.replayed === 1 ? "1 done delivery" : `${r.replayed} done deliveries`;
          console.log(
            opts.dryRun
              ? `Would replay ${what} (dry run: nothing changed).`
              : `Replayed ${what}: queued again, attempts reset.`,
          );
          if (r.tombstoned > 0)
            console.log(`${r.tombstoned} more matched but cannot be replayed: their bodies were purged (tombstones).`);
        } finally {
          await inbox.close();
        }
      },
    );

  withDb(program.command("destinations"))
    .description(
      "list each destination: closed (forwarding), open (its breaker) or paused, what waits for it, its recent failure rate and last error",
    )
    .option("--json", "print JSON")
    .action(async (opts: { db?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const all = await inbox.destinations();
        if (opts.json) return void console.log(JSON.stringify(all, null, 2));
        console.log(
          ["destination", "state", "waiting", "processing", "failed", "failure rate", "last error"].join("\t"),
        );
        for (const d of all) {
          const state =
            d.state === "paused"
              ? `paused (${d.pausedReason ?? "?"})`
              : d.state === "open"
                ? `open (${d.probing ? "probing" : `probe at ${iso(d.retryAt)}`})`
                : "closed";
          const rate = d.failureRate === null ? "-" : `${Math.round(d.failureRate * 100)}%`;
          console.log(
            [
              d.name,
              state,
              d.waiting,
              d.processing,
              d.failed,
              rate,
              d.lastError ? `${iso(d.lastErrorAt)} ${d.lastError}` : "-",
            ].join("\t"),
          );
        }
      } finally {
        await inbox.close();
      }
    });

  for (const verb of ["pause", "resume"] as const) {
    withDb(program.command(`${verb} <destination>`))
      .description(
        verb === "pause"
          ? "hold a destination's deliveries: none is sent, none discarded, no attempt spent, until resume"
          : "let a paused destination's deliveries go again (its breaker closed, its counts fresh)",
      )
      .option("--sources <file>", "the sources file, whose $operator URL hears of it (default: INBOX_SOURCES)")
      .option("--reason <text>", "pause: why, for the destinations list and the operator's event")
      .option("--json", "print JSON")
      .action(async (destination: string, opts: { db?: string; sources?: string; reason?: string; json?: boolean }) => {
        if (!DESTINATION_NAME.test(destination))
          throw new UsageError(`Expected a destination's name, got ${JSON.stringify(destination)}.`);
        const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
        let operator: Operator | undefined;
        if (sourcesFile) {
          try {
            // Only the operator's URL is wanted here; a broker destination's shape is checked, its secrets left to the worker.
            operator = loadDestinations(readSourcesFile(sourcesFile), process.env, {
              brokerCheck: (name, settings, where) =>
                void parseBrokerDestination(name, settings, where, process.env, false),
            }).operator;
          } catch (error) {
            throw new UsageError(`${sourcesFile}: ${message(error)}`);
          }
        }
        const inbox = await open(opts);
        try {
          const changed =
            verb === "pause"
              ? await inbox.pause(destination, opts.reason ?? "paused by a person")
              : await inbox.resume(destination);
          if (changed && operator) {
            const { announce } = await import("./lib/forwarding/forward.ts");
            const said = await announce(operator, {
              type: verb === "pause" ? "destination.paused" : "destination.resumed",
              data: { destination, ...(opts.reason ? { reason: opts.reason } : {}) },
            });
            if (said !== true) console.error(said);
          }
          if (opts.json) return void console.log(JSON.stringify({ destination, changed }));
          console.log(
            changed
              ? `${destination} ${verb === "pause" ? "paused: its deliveries wait, none discarded" : "resumed: its deliveries go again"}.`
              : `${destination} was ${verb === "pause" ? "already" : "not"} paused; nothing changed.`,
          );
        } finally {
          await inbox.close();
        }
      });
  }

  withDb(program.command("purge [id]"))
    .description(
      "let old bodies go: drop the bodies of old done deliveries, keeping tombstones that still answer duplicates, and forget old tombstones",
    )
    // Defaults shown as ages (7d), as they are typed, not as the milliseconds they parse to.
    .addOption(
      new Option("--bodies-after <age>", "drop the bodies of done deliveries older than this (30m, 12h, 7d, 2w)")
        .argParser(duration)
        .default(DEFAULTS.bodiesAfterMs, age(DEFAULTS.bodiesAfterMs)),
    )
    .addOption(
      new Option("--forget-after <age>", "forget tombstones older than this; must be longer than --bodies-after")
        .argParser(duration)
        .default(DEFAULTS.forgetAfterMs, age(DEFAULTS.forgetAfterMs)),
    )
    .option("--source <name>", "with an ID: the delivery's source, when IDs clash")
    .option("--dry-run", "say what would go, and change nothing")
    .option("--batch <n>", "deliveries per transaction", positive, DEFAULTS.purgeBatch)
    .option(
      "--rest <ratio>",
      "after each batch, rest this many times as long as it took, so acks get through (0: no rest)",
      (v: string) => {
        const n = Number(v);
        if (!Number.isFinite(n) || n < 0) throw new InvalidArgumentError("expected a number of 0 or more.");
        return n;
      },
      DEFAULTS.purgeRest,
    )
    .option(
      "--vacuum",
      "SQLite: rewrite the file once so that purges can shrink it (needed for a database made before retention; blocks writers meanwhile)",
    )
    .option("--json", "print the counts as JSON")
    .addHelpText(
      "after",
      `
A tombstone keeps a delivery's source, ID, body hash, status and times: a sender that resends the ID gets
"duplicate" and the handler never runs again; a different body still counts as a conflict. Once a tombstone
is forgotten, the ID is new again: a copy that arrives later is stored and handled as a new delivery.
Failed deliveries keep their bodies (so they can be fixed and retried) unless purged by name: purge ID.
The defaults (7d, 30d) outlast Stripe's (3 days), GitHub's (3, GHES 7) and Svix's (about 28 h) retries.

Examples:
  npx tsx inbox.ts purge --dry-run
  npx tsx inbox.ts purge --bodies-after 3d --forget-after 14d
  npx tsx inbox.ts purge evt_102            # drop one delivery's body (done or failed), keep its tombstone
  npx tsx inbox.ts purge --vacuum           # once, on a database created before retention existed`,
    )
    .action(
      async (
        id: string | undefined,
        opts: {
          db?: string;
          bodiesAfter: number;
          forgetAfter: number;
          source?: string;
          dryRun?: boolean;
          vacuum?: boolean;
          json?: boolean;
          batch: number;
          rest: number;
        },
      ) => {
        if (opts.forgetAfter <= opts.bodiesAfter) {
          throw new UsageError(
            `--forget-after (${age(opts.forgetAfter)}) must be longer than --bodies-after (${age(opts.bodiesAfter)}): the tombstone must outlive the body.`,
          );
        }
        if (opts.source !== undefined && id === undefined)
          throw new UsageError("--source goes with an ID: purge ID --source NAME.");
        const inbox = await open(opts);
        try {
          if (opts.vacuum) {
            if (!(inbox instanceof SqliteInbox))
              throw new UsageError("--vacuum is for SQLite; PostgreSQL's autovacuum reuses the space.");
            if (opts.dryRun)
              return void console.log(
                "Would rewrite the file once with auto_vacuum = INCREMENTAL (dry run: nothing changed).",
              );
            const { before, after } = await inbox.vacuum();
            return void console.log(
              `Vacuumed ${inbox.target}: ${bytes(before)} before, ${bytes(after)} after; later purges give freed space back to the file system.`,
            );
          }
          if (id !== undefined) {
            const rows = await findRows(inbox, id, opts.source);
            const d =
              rows.find((x) => x.status !== "done" && x.status !== "failed") ??
              rows.find((x) => x.purgedAt === null) ??
              rows[0]!;
            if (d.purgedAt !== null)
              return void console.log(`${label(d)} is already a tombstone (purged at ${iso(d.purgedAt)}).`);
            if (d.status !== "done" && d.status !== "failed")
              throw new NotFound(`Delivery ${label(d)} is ${d.status}: only done or failed deliveries can be purged.`);
            const r = await inbox.dropBodies({ source: d.source, id: d.id }, { dryRun: opts.dryRun });
            if (opts.json) return void console.log(JSON.stringify({ ...r, dryRun: opts.dryRun === true }));
            return void console.log(
              `${opts.dryRun ? "Would drop" : "Dropped"} the body of ${label(d)} (${bytes(r.bytes)}); its tombstone stays${opts.dryRun ? " (dry run: nothing changed)" : ""}.`,
            );
          }
          const r = await inbox.purge({
            bodiesAfterMs: opts.bodiesAfter,
            forgetAfterMs: opts.forgetAfter,
            dryRun: opts.dryRun,
            batch: opts.batch,
            rest: opts.rest,
          });
          if (opts.json) return void console.log(JSON.stringify({ ...r, dryRun: opts.dryRun === true }));
          const verb = opts.dryRun ? "Would drop" : "Dropped";
          console.log(
            `${verb} ${r.bodies} ${r.bodies === 1 ? "body" : "bodies"} (${bytes(r.bytes)}) of done deliveries older than ${age(opts.bodiesAfter)}; their tombstones stay.`,
          );
          console.log(
            `${opts.dryRun ? "Would forget" : "Forgot"} ${r.forgotten} ${r.forgotten === 1 ? "tombstone" : "tombstones"} older than ${age(opts.forgetAfter)}: those IDs would be stored as new if they came again.`,
          );
          if (r.vacuumedBytes > 0) console.log(`Gave ${bytes(r.vacuumedBytes)} back to the file system.`);
          if (opts.dryRun) console.log("(dry run: nothing changed)");
          const k = await inbox.kept();
          if (k.autoVacuum === "none" && !opts.dryRun) {
            console.log(
              `The file keeps its size (the space is reused for new deliveries): it predates retention; run \`purge --vacuum\` once to let purges shrink it.`,
            );
          }
        } finally {
          await inbox.close();
        }
      },
    );

  withFilters(withDb(program.command("export")))
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

  withDb(program.command("import <file>"))
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
      try {
        let batch: Delivery[] = [];
        const flush = async () => {
          if (batch.length === 0) return;
          if (opts.dryRun) {
            for (const d of batch) (await inbox.find(d.id, d.source)).length > 0 ? skipped++ : added++;
          } else {
            const n = await inbox.restore(batch);
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

  program
    .command("copy")
    .description(
      "copy every delivery from one inbox to another (SQLite to PostgreSQL, or back), byte-exact; run again, it changes nothing",
    )
    .requiredOption("--from <path|url>", "the inbox to copy from")
    .requiredOption("--to <path|url>", "the inbox to copy into (created if new)")
    .option("--batch <n>", "deliveries per transaction", positive, 500)
    .action(async (opts: { from: string; to: string; batch: number }) => {
      const from = await openTarget(opts.from);
      try {
        const to = await connect(opts.to);
        try {
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
        } finally {
          await to.close();
        }
      } finally {
        await from.close();
      }
    });

  const sqliteOnly = (what: string, db: string) => {
    if (isPostgresUrl(db)) {
      throw new UsageError(
        `${what} is for a SQLite inbox; on PostgreSQL use pg_basebackup or pg_dump, and inbox.ts copy to move (docs/production.md).`,
      );
    }
  };

  program
    .command("backup [file]")
    .description(
      "SQLite: copy the live inbox to a file while receivers and workers go on; the copy is checked, then renamed into place",
    )
    .option("--db <path>", `the inbox's database file (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option(
      "--dir <folder>",
      "write into this folder, named after the database and the time: inbox-20261203T120000Z.db",
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
      if (opts.dir !== undefined && !existsSync(opts.dir)) throw new NotFound(`No such folder: ${opts.dir}`);
      const { backup, backupName } = await import("./lib/sqlite/backup.ts");
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

  program
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
      const { restore, InUse } = await import("./lib/sqlite/backup.ts");
      let r: Awaited<ReturnType<typeof restore>>;
      try {
        r = restore(file, db);
      } catch (error) {
        throw error instanceof InUse ? new Refused(`Refused: ${error.message}.`) : error;
      }
      if (opts.json) return void console.log(JSON.stringify(r));
      console.log(`Restored ${file} to ${db}: ${bytes(r.bytes)}, ${holds(r)}.`);
      if (r.aside !== undefined)
        console.log(`The database it replaced was moved aside to ${r.aside} (with its -wal and -shm, if any).`);
    });

  try {
    await program.parseAsync(argv);
  } catch (error) {
    if (error instanceof CommanderError) {
      process.exitCode = error.exitCode === 0 ? 0 : 2;
      return;
    }
    process.exitCode = error instanceof UsageError ? 2 : 1;
    console.error(
      error instanceof UsageError || error instanceof NotFound || error instanceof Refused
        ? error.message
        : `inbox.ts: ${message(error)}`,
    );
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) void cli(process.argv);
