// lib/cli/actions.ts: the CLI's commands that change the queue, one delivery or in bulk beside a running
// worker: retry, replay, pause and resume a destination, and purge. Each is a function of the Cli
// (lib/cli/command.ts) that adds itself to the program.

import { InvalidArgumentError, Option } from "commander";
import { parseBrokerDestination } from "../brokers.ts";
import { DEFAULTS } from "../defaults.ts";
import { age, bytes, iso } from "../format.ts";
import { label, message } from "../log.ts";
import { readSourcesFile } from "../config/sources.ts";
import { loadDestinations, type Operator } from "../routing/routes.ts";
import { SqliteInbox } from "../sqlite/sqlite.ts";
import { describe } from "../operations/input.ts";
import { type Audit, DESTINATION_NAME } from "../store.ts";
import { type Cli, type CliFilters, filterOf, findRows, NotFound, UsageError } from "./command.ts";

/** retry puts failed deliveries back in the queue: one by ID, every failed one, or those a filter matches. */
export function retry(c: Cli): void {
  const { withDb, withFilters, open } = c;
  const audit = (target: string): Audit => ({ who: c.who(), operation: "retry", target });
  withFilters(withDb(c.program.command("retry [id]")))
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
            const n = await inbox.retryMatching(filter, {
              dryRun: opts.dryRun,
              ...(opts.dryRun ? {} : { audit: audit(`retry filter: ${describe({ ...filter, status: "failed" })}`) }),
            });
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
          await inbox.retry({ source: d.source, id: d.id }, audit(`retry ${label(d)}`));
          console.log("Queued again.");
        } finally {
          await inbox.close();
        }
      },
    );
}

/** replay puts done deliveries through again: one by ID, or those the filters match. */
export function replay(c: Cli): void {
  const { withDb, withFilters, open } = c;
  const audit = (target: string): Audit => ({ who: c.who(), operation: "replay", target });
  withFilters(withDb(c.program.command("replay [id]")))
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
            ...(opts.dryRun
              ? {}
              : {
                  audit: audit(
                    `replay filter: ${describe(filter)}${opts.to === undefined ? "" : ` to=${JSON.stringify(opts.to)}`}`,
                  ),
                }),
          });
          if (opts.json) return void console.log(JSON.stringify({ ...r, dryRun: opts.dryRun === true }));
          const what =
            opts.to !== undefined
              ? `${r.replayed} ${r.replayed === 1 ? "delivery" : "deliveries"} to ${opts.to}`
              : r.replayed === 1
                ? "1 done delivery"
                : `${r.replayed} done deliveries`;
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
}

/** pause holds a destination's deliveries until resume, and tells the operator's URL. */
export function pause(c: Cli): void {
  pauseOrResume(c, "pause");
}

/** resume lets a paused destination's deliveries go again, and tells the operator's URL. */
export function resume(c: Cli): void {
  pauseOrResume(c, "resume");
}

// pause and resume are one command each, told apart by verb.
function pauseOrResume(c: Cli, verb: "pause" | "resume"): void {
  const { withDb, open } = c;
  withDb(c.program.command(`${verb} <destination>`))
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
        const reason = opts.reason ?? "paused by a person";
        const target = `destination=${JSON.stringify(destination)}${verb === "pause" ? ` reason=${JSON.stringify(reason)}` : ""}`;
        const audit: Audit = { who: c.who(), operation: verb, target };
        const changed =
          verb === "pause" ? await inbox.pause(destination, reason, audit) : await inbox.resume(destination, audit);
        if (changed && operator) {
          const { announce } = await import("../forwarding/forward.ts");
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

/** purge drops old done deliveries' bodies, keeping their tombstones, and forgets old tombstones; or one delivery's body by ID. */
export function purge(c: Cli): void {
  const { withDb, open, positive, duration } = c;
  withDb(c.program.command("purge [id]"))
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
        // On SQLite each batch commits without its fsync and settles after an fdatasync of the WAL on a libuv
        // thread (syncOffLoop, as the receiver's): the fsync inside COMMIT held the write lock, and every ack
        // waited behind it (bench/purge.ts: the ack's median doubled). --vacuum's rewrite keeps FULL.
        const inbox = await open(opts, opts.vacuum ? {} : { syncOffLoop: true });
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
            const r = await inbox.dropBodies(
              { source: d.source, id: d.id },
              {
                dryRun: opts.dryRun,
                ...(opts.dryRun ? {} : { audit: { who: c.who(), operation: "purge", target: `purge ${label(d)}` } }),
              },
            );
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
            ...(opts.dryRun
              ? {}
              : {
                  audit: {
                    who: c.who(),
                    operation: "purge",
                    target: `purge bodies-after=${age(opts.bodiesAfter)} forget-after=${age(opts.forgetAfter)}`,
                  },
                }),
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
          // From the purge's own answer: kept() would read every delivery again to tell.
          if (r.fileKeepsSize && !opts.dryRun) {
            console.log(
              `The file keeps its size (the space is reused for new deliveries): it predates retention; run \`purge --vacuum\` once to let purges shrink it.`,
            );
          }
        } finally {
          await inbox.close();
        }
      },
    );
}
