// consumer.ts: the broker sources' consumer. For each source of the sources file with a "broker", it
// consumes the JetStream stream or RabbitMQ queue, stores each message as a delivery of that source (the
// same routes as a webhook), and acknowledges it only once the commit is durable; worker.ts handles them.
//   npx tsx consumer.ts --sources sources.json [--db inbox.db] [--source orders] [--metrics-port 9465]

import { pathToFileURL } from "node:url";
import { connect, isPostgresUrl } from "./inbox.ts";
import { missingClient } from "./lib/brokers.ts";
import type { Loaded } from "./lib/config/config.ts";
import { Consumer, type ConsumedSource } from "./lib/consume.ts";
import { DEFAULTS } from "./lib/defaults.ts";
import { speakTo } from "./lib/format.ts";
import { Metrics, Readiness } from "./lib/metrics.ts";
import { Startup, StartupError } from "./lib/startup.ts";

/** main runs the consumer as `consumer.ts` does, from a full argv (runtime, script, then its flags). */
export async function main(argv: string[]): Promise<void> {
  try {
    await consume(argv);
  } catch (error) {
    if (!(error instanceof StartupError)) throw error;
    say(error.message);
    process.exit(error.code);
  }
  process.exit(0);
}

// consume starts a consumer per broker source and runs them until SIGTERM or SIGINT, then drains them.
async function consume(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError } = await import("commander");
  const port = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 0 || n > 65_535) throw new InvalidArgumentError("expected a port, 0 to 65535.");
    return n;
  };
  const seconds = (value: string) => {
    const n = Number(value);
    if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError("expected a number of seconds above 0.");
    return n;
  };
  const program = new Command("consumer.ts")
    .description(
      "Consume the broker sources (NATS JetStream, RabbitMQ) into the inbox: store each message, then acknowledge it.",
    )
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option("--sources <file>", "JSON sources file whose sources with a broker are consumed (default: INBOX_SOURCES)")
    .option("--source <name...>", "consume only these sources (default: every source with a broker)")
    .option("--metrics-port <port>", "serve /metrics, /livez and /readyz on this port (default: off)", port)
    .option("--metrics-host <address>", "address for --metrics-port", DEFAULTS.host)
    .option(
      "--starved-after <seconds>",
      `a source that takes nothing this long while its broker holds messages for it is unhealthy (default: ${DEFAULTS.consumeStarvedAfterMs / 1000})`,
      seconds,
    )
    .option("--quiet", "log nothing but errors")
    .option(
      "--skip-check",
      "SQLite: skip the start-up quick_check, even when it is due (it runs after an unclean stop, or once a day)",
    )
    .option("--force", "SQLite: start on a file that fails the start-up quick_check, saying so")
    .option(
      "--secrets-key-file <file>",
      "the key that opens the secret store's values (a broker's secret:NAME), instead of INBOX_SECRETS_KEY",
    )
    .addHelpText(
      "after",
      `
Stop it with SIGTERM or Ctrl-C: it stops consuming, waits for the stores in flight, acknowledges them, and exits.

Examples:
  npx tsx consumer.ts --sources sources.json
  npx tsx consumer.ts --sources sources.json --db postgres://localhost/inbox --metrics-port 9465`,
    )
    .showHelpAfterError("(run with --help for usage)");
  speakTo(program, argv);
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<{
    db?: string;
    sources?: string;
    source?: string[];
    metricsPort?: number;
    metricsHost: string;
    starvedAfter?: number;
    quiet?: boolean;
    skipCheck?: boolean;
    force?: boolean;
    secretsKeyFile?: string;
  }>();
  const file = opts.sources ?? process.env.INBOX_SOURCES;
  if (!file)
    throw new StartupError("consumer: expected --sources FILE (or INBOX_SOURCES): the sources whose broker to consume");
  const startup = new Startup({
    script: "consumer",
    argv,
    say,
    door: { connect, isPostgresUrl },
    env: process.env,
    keyFile: opts.secretsKeyFile,
  });
  // Read and checked as the receiver reads it (the destinations' secrets are the worker's, so only their
  // shape); a file whose sources name a secret of the store is read once the inbox is open.
  const sources = startup.readSources(file, { resolve: false });
  const chosen = sources.loaded ? await choose(sources.loaded, file, opts.source) : undefined;
  // As the receiver and the worker: a message acked into a damaged file may never be read back, so the
  // check runs when it is due, and this process's own unclean stop makes it due for the next to start.
  const inbox = await startup.open(opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db, {
    skipCheck: opts.skipCheck,
    force: opts.force,
  });
  const consumed = chosen ?? (await choose(await startup.loaded(sources, { resolve: false }), file, opts.source));
  const metrics = opts.metricsPort === undefined ? undefined : new Metrics({ inbox });
  const starvedAfterMs = opts.starvedAfter === undefined ? undefined : opts.starvedAfter * 1000;
  const consumers = consumed.map(
    (source) => new Consumer({ inbox, source, log: say, ...(starvedAfterMs ? { starvedAfterMs } : {}) }),
  );
  for (const c of consumers) metrics?.consumedFrom(c.source.name, c.counts, c.health);
  // Ready while the store can commit and every source consumes, none starved.
  const readiness = new Readiness(inbox, {
    also: () => consumers.map((c) => c.health.ready()).find((r) => r !== true) ?? true,
  });
  const stopped = startup.stopped();
  const server = metrics ? await metrics.listen(opts.metricsPort!, opts.metricsHost, readiness) : undefined;
  for (const c of consumers) {
    c.start();
    if (!opts.quiet) {
      const b = c.source.broker;
      say(
        `consumer: ${c.source.name} from ${b.type === "nats" ? `JetStream stream ${b.stream}, consumer ${b.consumer}${b.filter ? `, subjects ${b.filter}` : ""}` : `RabbitMQ queue ${b.queue}`}`,
      );
    }
  }
  // A consumer whose settings could lose a message is refused at start: its one line (logged by its
  // Health) names the setting and the fix, and nothing is consumed. Later, it is a pause shown on /readyz.
  await Promise.all(consumers.map((c) => c.health.first));
  const refusedAtStart = consumers.filter((c) => c.health.state === "refused").map((c) => c.source.name);
  if (refusedAtStart.length === 0) await stopped;
  await Promise.all(consumers.map((c) => c.stop()));
  server?.close();
  if (refusedAtStart.length === 0)
    for (const c of consumers) say(`consumer: ${c.source.name}: ${JSON.stringify(c.counts)}`);
  await inbox.close();
  startup.close();
  if (refusedAtStart.length > 0)
    throw new StartupError(`consumer: refused to consume ${refusedAtStart.join(", ")}; nothing was taken`);
}

// choose is the file's broker sources this consumer takes (all, or those --source names), each with its
// client installed, or stops start-up with one line.
async function choose(loaded: Loaded, file: string, only: string[] | undefined): Promise<ConsumedSource[]> {
  const refused = (why: string) => new StartupError(`consumer: ${file}: ${why}`);
  let chosen = [...loaded.sources.values()].filter((s): s is typeof s & ConsumedSource => s.broker !== undefined);
  if (only) {
    const unknown = only.filter((n) => !chosen.some((s) => s.name === n));
    if (unknown.length > 0) throw refused(`no broker source named ${unknown.join(", ")}`);
    chosen = chosen.filter((s) => only.includes(s.name));
  }
  if (chosen.length === 0) throw refused('no source has a "broker" to consume');
  for (const s of chosen) {
    const missing = await missingClient(s.broker.type, s.name, "source");
    if (missing) throw refused(missing);
  }
  return chosen;
}

// say writes one line of the consumer's own to stderr.
function say(line: string): void {
  console.error(line);
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);
