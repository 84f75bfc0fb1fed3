#!/usr/bin/env node
// cli.ts: the package's one command, `webhook-inbox receiver|worker|consumer|inbox|admin …`: each runs the script of
// that name, with the same flags and --help. Installed from the package as the `webhook-inbox` bin (npx
// webhook-inbox worker --once); here, npx tsx cli.ts worker --once does the same as npx tsx worker.ts --once.

import { realpathSync } from "node:fs";
import { pathToFileURL } from "node:url";
import { packageVersion } from "./lib/format.ts";
import { requireSqlite } from "./lib/runtime.ts";

// Loaded on demand: `webhook-inbox inbox status` need not load the receiver, the page or prom-client.
const COMMANDS: Record<string, { about: string; load: () => Promise<(argv: string[]) => Promise<void>> }> = {
  receiver: {
    about: "receive webhooks and store each one durably before answering 200",
    load: async () => (await import("./receiver.ts")).main,
  },
  worker: { about: "process each stored delivery exactly once", load: async () => (await import("./worker.ts")).main },
  consumer: {
    about: "consume the broker sources (JetStream, RabbitMQ), acking each message once it is stored",
    load: async () => (await import("./consumer.ts")).main,
  },
  inbox: {
    about: "look into the inbox, retry, replay, purge, export and import",
    load: async () => (await import("./inbox.ts")).cli,
  },
  admin: { about: "the operator page, in a browser", load: async () => (await import("./admin.ts")).main },
};

const USAGE = `Usage: webhook-inbox <command> [options]

Commands:
${Object.entries(COMMANDS)
  .map(([name, c]) => `  ${name.padEnd(10)}${c.about}`)
  .join("\n")}

Each takes the options of its script; webhook-inbox <command> --help lists them.
webhook-inbox --version prints the package's version.

Examples:
  npx webhook-inbox receiver --db inbox.db --sources sources.json
  npx webhook-inbox worker --once --db inbox.db
  npx webhook-inbox consumer --db inbox.db --sources sources.json
  npx webhook-inbox inbox status --db inbox.db`;

/** main runs the command argv names, handing it an argv of its own: runtime, this file, then its flags. */
export async function main(argv: string[]): Promise<void> {
  const [name, ...rest] = argv.slice(2);
  if (name === "--help" || name === "-h" || name === "help") {
    console.log(USAGE);
    return;
  }
  if (name === "--version" || name === "-V") {
    console.log(packageVersion());
    return;
  }
  // Before any command's modules load: on Node 20 their import of node:sqlite would fail as they link, with
  // a stack trace and exit 1, which a unit's Restart=on-failure would repeat every second.
  requireSqlite();
  const command = name === undefined ? undefined : COMMANDS[name];
  if (!command) {
    console.error(
      `${name === undefined ? "webhook-inbox: which command?" : `webhook-inbox: unknown command ${name}`} (${Object.keys(COMMANDS).join(", ")}; run with --help for usage)`,
    );
    process.exit(2);
  }
  await (await command.load())([argv[0]!, argv[1]!, ...rest]);
}

// Through realpath: npx runs the bin as node_modules/.bin/webhook-inbox, a link to this file.
if (import.meta.url === pathToFileURL(realpathSync(process.argv[1] ?? ".")).href) await main(process.argv);
