// lib/cli/config.ts: `inbox.ts init`, a deployment's first step, and `inbox.ts config apply FILE [--dry-run]
// [--cancel-waiting]` and `inbox.ts config dump`, the configuration in the database (lib/config/): init
// creates the inbox on purpose, the one command that does; apply checks a sources file whole, prints what it
// changes and swaps it in as one transaction; dump writes the version in force, which apply takes back
// unchanged. Running receivers and workers take a change up within two seconds (docs/config.md).

import { existsSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { apply, auditTarget, plan, readDocument, refusedLine, type Plan } from "../config/config.ts";
import { message } from "../log.ts";
import { type Cli, NotFound, Refused, UsageError } from "./command.ts";

/**
 * init creates an inbox on purpose: a new SQLite file, or a PostgreSQL schema brought up to date. The other
 * commands refuse a path that is no inbox (a typo in --db must not make an empty one), so a new deployment
 * starts here, before its configuration, its keys or a reconcile.
 */
export function init(c: Cli): void {
  const { withDb, target, connect, requireInbox, isPostgresUrl } = c;
  withDb(c.program.command("init"))
    .description("create the inbox (a new SQLite file, or PostgreSQL's tables): a deployment's first step")
    .addHelpText(
      "after",
      `
Run again, it changes nothing. A file that is some other program's database is refused, never converted.

Examples:
  npx tsx inbox.ts init --db /var/lib/webhook-inbox/inbox.db
  npx tsx inbox.ts init --db postgres://127.0.0.1:5432/test?schema=inbox`,
    )
    .action(async (opts: { db?: string }) => {
      const db = target(opts);
      const fresh = !isPostgresUrl(db) && !existsSync(db);
      if (!fresh && !isPostgresUrl(db)) requireInbox(db);
      const inbox = await connect(db);
      await inbox.close();
      if (isPostgresUrl(db)) console.log(`The inbox at ${inbox.target} is ready: its tables are made and up to date.`);
      else console.log(fresh ? `Created an inbox at ${db}.` : `${db} is already an inbox; its tables are up to date.`);
    });
}

/** config adds `config apply` and `config dump`. */
export function config(c: Cli): void {
  const { withDb, withKey, open } = c;
  const group = c.program
    .command("config")
    .description(
      "the configuration in the database: apply a sources file (checked whole, one transaction), or dump it",
    );
  withKey(withDb(group.command("apply <file>")))
    .description("check a sources file whole, print what it changes, and swap it in; running scripts take it up")
    .option("--dry-run", "check and print the difference; change nothing")
    .option("--cancel-waiting", "set aside as failed the deliveries waiting for a destination the file removes")
    .option("--actor <name>", "who applies it, kept with the version (default: USER, else inbox.ts)")
    .option("--json", "print JSON")
    .action(
      async (
        file: string,
        opts: {
          db?: string;
          dryRun?: boolean;
          cancelWaiting?: boolean;
          actor?: string;
          json?: boolean;
          secretsKeyFile?: string;
        },
      ) => {
        let text: string;
        try {
          text = readDocument(file).text;
        } catch (error) {
          throw new UsageError(`${message(error)}; nothing changed.`);
        }
        const host = c.host(opts);
        const inbox = await open(opts);
        try {
          let p: Plan;
          try {
            p = await plan(inbox, text, { ...host, inbox }, dirname(resolve(file)), { way: "operator" });
          } catch (error) {
            throw new UsageError(`${file}: ${message(error)}; nothing changed, the configuration in force stays.`);
          }
          const from = p.current ? `version ${p.current.version}` : "none (the default source)";
          const waitLines = p.removed
            .filter((r) => r.waiting > 0)
            .map(
              (r) => `  ${r.waiting} ${r.waiting === 1 ? "delivery waits" : "deliveries wait"} for ${r.destination}`,
            );
          const cancelling = opts.cancelWaiting === true && p.removed.some((r) => r.waiting > 0);
          if (opts.dryRun || (p.changes.length === 0 && !cancelling)) {
            if (opts.json) {
              console.log(JSON.stringify({ from: p.current?.version ?? 0, changes: p.changes, removed: p.removed }));
            } else {
              console.log(p.changes.length === 0 ? `No change from ${from}.` : `Would change ${from}:`);
              for (const line of p.changes) console.log(`  ${line}`);
              for (const line of waitLines) console.log(line);
            }
            return;
          }
          const actor = opts.actor ?? process.env.USER ?? "inbox.ts";
          const audit = { who: c.who(), operation: "config apply", target: auditTarget(p) };
          const result = await apply(inbox, p, {
            actor,
            audit,
            ...(opts.cancelWaiting ? { cancelWaiting: true } : {}),
          });
          if (!result.applied) throw new Refused(refusedLine(result));
          if (opts.json) {
            console.log(JSON.stringify({ version: result.version, changes: p.changes, cancelled: result.cancelled }));
            return;
          }
          console.log(`Applied version ${result.version} (was ${from}):`);
          for (const line of p.changes) console.log(`  ${line}`);
          if (result.cancelled > 0)
            console.log(
              `  ${result.cancelled} waiting ${result.cancelled === 1 ? "delivery" : "deliveries"} set aside as failed`,
            );
        } finally {
          await inbox.close();
        }
      },
    );
  withDb(group.command("dump"))
    .description("write the configuration in force as a sources file, which config apply takes back unchanged")
    .option("--out <file>", "write here rather than to stdout")
    .option("--json", "print the version, who applied it, when, and its transforms' SHA-256 as JSON instead")
    .action(async (opts: { db?: string; out?: string; json?: boolean }) => {
      const inbox = await open(opts);
      try {
        const stored = await inbox.readConfig();
        if (!stored)
          throw new NotFound(
            "No configuration in this inbox: the scripts serve the default source (config apply FILE).",
          );
        if (opts.json) {
          const transforms = Object.fromEntries(Object.entries(stored.transforms).map(([m, t]) => [m, t.sha256]));
          console.log(
            JSON.stringify({ version: stored.version, actor: stored.actor, appliedAt: stored.appliedAt, transforms }),
          );
        } else if (opts.out) writeFileSync(opts.out, stored.document);
        else process.stdout.write(stored.document);
      } finally {
        await inbox.close();
      }
    });
  // `inbox.ts config --help` lists its commands' options too, so one help shows the whole group.
  const lines = group.commands.flatMap((sub) =>
    sub.options.map((o) => `  ${o.flags.padEnd(22)}${sub.name()}: ${o.description}`),
  );
  group.addHelpText("after", `\nOptions of its commands:\n${lines.join("\n")}`);
}
