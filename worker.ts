// worker.ts: the polling worker. It claims due deliveries under a lease, runs a handler on each, and
// commits the handler's local writes together with the done mark, so they happen exactly once.
//   npx tsx worker.ts --once          # drain the queue, then exit
//   npx tsx worker.ts [--db inbox.db] [--concurrency 8] [--lease 60] [--purge-every [minutes]]
// Import run() to plug in your own handler, or pass --handler MODULE; the one here records the article's
// payments, run where nothing is configured (the demo) or with --handler demo.

import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { connect, isPostgresUrl } from "./inbox.ts";
import { DEFAULTS } from "./lib/defaults.ts";
import { indexAll } from "./lib/search.ts";
import { age as formatAge, parseDuration, speakTo } from "./lib/format.ts";
import {
  jsonLine,
  lineLog,
  LOG_FORMATS,
  message,
  progress,
  type Log,
  type LogFormat,
  type Progress,
} from "./lib/log.ts";
import { PermanentError, type Inbox, type PurgeOptions, type StoredConfig } from "./lib/store.ts";
import { Batcher } from "./lib/lease/batcher.ts";
import { realClock, type Clock } from "./lib/lease/clock.ts";
import { Jobs, type Handler, type Job, type RunStats } from "./lib/jobs.ts";
import { Lane } from "./lib/lease/lane.ts";
import { HandlerSizing } from "./lib/lease/sizing.ts";
import type { Metrics } from "./lib/metrics.ts";
import type { ForwardStats } from "./lib/forwarding/forwarder.ts";
import type { Operator } from "./lib/routing/routes.ts";
import type { Source } from "./lib/providers.ts";
import type { TransformLimits } from "./lib/forwarding/transform.ts";
import { redactor } from "./lib/redact.ts";
import type { Host, SecretChecks } from "./lib/config/config.ts";
import { LiveForwarding, letGo, prepare, unconfigured, type Prepared } from "./lib/config/live.ts";
import { Startup, StartupError, type SourcesFile } from "./lib/startup.ts";

/** Job, Handler and RunStats are the handler's side of run(), declared with its executor (lib/jobs.ts). */
export type { Handler, Job, RunStats };

/** WorkerOptions configures run(); every number has a default in DEFAULTS. */
export interface WorkerOptions {
  inbox: Inbox;
  /** Drain what is due, then return. @default false */
  once?: boolean;
  /** @default DEFAULTS.leaseMs */
  leaseMs?: number;
  /** How often a held lease is extended while its handler runs. @default a third of leaseMs */
  heartbeatMs?: number;
  /** Handlers run at once: a real limit for handlers that wait on I/O. @default DEFAULTS.concurrency */
  concurrency?: number;
  /**
   * Most deliveries claimed in one transaction when handlers are fast.
   * @default DEFAULTS.claimBatch, on PostgreSQL DEFAULTS.claimBatchPostgres
   */
  claimBatch?: number;
  /** @default DEFAULTS.pollMinMs */
  pollMinMs?: number;
  /** @default DEFAULTS.pollMaxMs */
  pollMaxMs?: number;
  /** @default DEFAULTS.shutdownGraceMs */
  shutdownGraceMs?: number;
  /** Abort to stop: no more claims; work in flight finishes, or is released after shutdownGraceMs. */
  signal?: AbortSignal;
  /** Where a line per delivery goes; the fields are for the JSON format. @default console.error */
  log?: Log;
  /** Counts claims, handler times, retries, failures and lost leases (metrics.ts). @default none */
  metrics?: Metrics;
  /** The counters to count into, for a caller that watches them while the run goes on. @default fresh ones */
  stats?: RunStats;
  /**
   * Where a delivery set aside is announced, as a signed delivery.set_aside event, as the forwarder
   * announces its own (the sources file's $operator). @default none
   */
  operator?: Operator;
  /**
   * Applied to a handler's error before it is stored, logged, traced or announced: redact.ts's redactor
   * of the sources file's secrets, as worker.ts passes it. @default none: errors are kept as thrown
   */
  redact?: (text: string) => string;
  /**
   * Purge on a schedule: once at start, then every everyMs, with these ages (see Inbox.purge). Off unless
   * given: purging lets bodies go, which no upgrade should start doing on its own. inbox is the connection
   * its batches commit through: worker.ts passes one of its own with syncOffLoop on SQLite, so that no batch
   * fsyncs inside the write lock; the caller closes it. @default undefined; purge.inbox: the run's inbox
   */
  purge?: Omit<PurgeOptions, "dryRun" | "signal"> & { everyMs: number; inbox?: Inbox };
  /** The clock the loop reads and sets its timers on; the tests move a fake one. @default realClock */
  clock?: Clock;
  /**
   * How often the body search index catches up with what was stored since (Inbox.indexSearch()), while it is
   * on: a store never indexes its own body, so that its ack does not wait; a search catches up first whatever
   * this is. 0 turns the tick off. @default DEFAULTS.searchIndexEveryMs
   */
  searchIndexEveryMs?: number;
}

/** run claims and handles deliveries until the queue is empty (once) or the signal aborts: one lane
 * (lib/lease/lane.ts) whose executor is the handler. */
export async function run(handler: Handler, options: WorkerOptions): Promise<RunStats> {
  const { inbox } = options;
  const clock = options.clock ?? realClock;
  const pollMax = options.pollMaxMs ?? DEFAULTS.pollMaxMs;
  const log: Log = options.log ?? ((line: string) => console.error(line));
  const stats: RunStats = options.stats ?? { claimed: 0, done: 0, retried: 0, failed: 0, lost: 0, released: 0 };
  const sizing = new HandlerSizing(
    options.concurrency ?? DEFAULTS.concurrency,
    options.claimBatch ?? (inbox.backend === "postgres" ? DEFAULTS.claimBatchPostgres : DEFAULTS.claimBatch),
    inbox.backend === "postgres",
  );
  // Done marks are held for the next claim, which takes them into its own transaction. Handlers that wait
  // on I/O finish one or two a turn, and each turn's done marks would otherwise be a commit of their own:
  // on SQLite an fsync that holds the thread, and every handler in flight with it, for as long as the disk
  // takes. A claim comes when the last claimed lease starts (or a handler's place frees, for slow ones;
  // on PostgreSQL, fast ones claim ahead), and none waits longer than pollMax, nor for a claim that waits
  // on them (a lane that holds all it may). They go to the inbox just ahead of that claim, so its takeovers
  // never see them as expired leases.
  const batcher = new Batcher({
    inbox,
    clock,
    hold: (_count, _ageMs, view) => view.waiting > 0 && !sizing.full(view),
    longestMs: pollMax,
  });
  const redact = options.redact ?? ((text: string) => text);
  const jobs = new Jobs({ handler, stats, log, metrics: options.metrics, operator: options.operator, redact });
  const lane = new Lane({
    who: "run",
    inbox,
    execute: jobs.execute,
    sizing,
    batcher,
    listener: jobs.report,
    describe: (error) => redact(message(error)),
    clock,
    concurrency: options.concurrency,
    leaseMs: options.leaseMs,
    heartbeatMs: options.heartbeatMs,
    pollMinMs: options.pollMinMs,
    pollMaxMs: options.pollMaxMs,
    shutdownGraceMs: options.shutdownGraceMs,
    once: options.once,
    signal: options.signal,
    // A stopping worker cannot wait on a handler that outlives the grace: its lease goes back at once.
    cutOff: "give back",
    drained: () => inbox.flush(),
  });
  if (options.purge && !(options.purge.everyMs >= 1))
    throw new TypeError(`run: expected purge.everyMs >= 1, got ${options.purge.everyMs}`);
  const purging = schedulePurge(options.purge?.inbox ?? inbox, options.purge, options.signal, log);
  const indexing = scheduleIndexing(inbox, options.searchIndexEveryMs ?? DEFAULTS.searchIndexEveryMs, clock, log);
  try {
    await lane.start();
  } finally {
    await Promise.all([purging.stop(), indexing.stop()]);
  }
  return stats;
}

// scheduleIndexing indexes what was stored since the last tick (none at all while the index is off: one read),
// a batch per transaction until none is left, at start and then every everyMs, never two at once. A failure
// is logged and tried again at the next tick; nothing is lost meanwhile, as the rows wait for the indexer.
function scheduleIndexing(inbox: Inbox, everyMs: number, clock: Clock, log: (line: string) => void) {
  if (!(everyMs >= 0)) throw new TypeError(`run: expected searchIndexEveryMs >= 0, got ${everyMs}`);
  if (everyMs === 0) return { stop: async () => {} };
  let stopped = false;
  let running: Promise<void> | undefined;
  let failing = false;
  const once = () =>
    indexAll(
      (limit) => inbox.indexSearch(limit),
      () => stopped,
    );
  const tick = () => {
    running ??= once()
      .then(
        () => {
          failing = false;
        },
        (error: unknown) => {
          // Once a failure, not at every tick: the line says it is tried again.
          if (!failing) log(`search index: catching up failed (${message(error)}); trying again every ${everyMs} ms`);
          failing = true;
        },
      )
      .finally(() => {
        running = undefined;
      });
  };
  tick();
  const cancel = clock.every(everyMs, tick);
  return {
    stop: async () => {
      stopped = true;
      cancel();
      await running;
    },
  };
}

// schedulePurge runs purge at start and then every everyMs, never two at once; stop ends the schedule
// after the batch in flight. A failed purge is logged and tried again next time: the queue comes first.
function schedulePurge(
  inbox: Inbox,
  purge: WorkerOptions["purge"],
  signal: AbortSignal | undefined,
  log: (line: string) => void,
): { stop(): Promise<void> } {
  if (purge === undefined) return { stop: async () => {} };
  const { everyMs, inbox: _, ...ages } = purge;
  const stopped = new AbortController();
  signal?.addEventListener("abort", () => stopped.abort(), { once: true });
  let running: Promise<void> = Promise.resolve();
  const once = () => {
    running = inbox.purge({ ...ages, signal: stopped.signal }).then(
      (r) => {
        if (r.bodies > 0 || r.forgotten > 0) {
          log(
            `purge: dropped ${r.bodies} bodies (${r.bytes} bytes), forgot ${r.forgotten} tombstones${r.vacuumedBytes ? `, gave ${r.vacuumedBytes} bytes back` : ""}`,
          );
        }
      },
      (error: unknown) => log(`purge failed (${message(error)}); trying again in ${Math.round(everyMs / 60_000)} min`),
    );
  };
  once();
  const timer = setInterval(() => void running.then(() => !stopped.signal.aborted && once()), everyMs);
  timer.unref();
  return {
    stop: async () => {
      clearInterval(timer);
      stopped.abort();
      await running;
    },
  };
}

/** ensurePayments creates the example's payments table, keyed by delivery so a payment is one row. */
export async function ensurePayments(inbox: Inbox): Promise<void> {
  const create = () =>
    inbox.query(`CREATE TABLE IF NOT EXISTS payments (
                       source      TEXT NOT NULL,
                       delivery_id TEXT NOT NULL,
                       customer    TEXT NOT NULL,
                       amount      ${inbox.backend === "postgres" ? "DOUBLE PRECISION" : "REAL"} NOT NULL,
                       PRIMARY KEY (source, delivery_id))`);
  try {
    await create();
  } catch (err) {
    // PostgreSQL's IF NOT EXISTS is not safe against a second worker starting at the same moment: the
    // loser fails with 'type "payments" already exists' once the winner commits, and then the table is there.
    if (inbox.backend !== "postgres") throw err;
    await create();
  }
}

/** recordPayment is the article's handler: one payment row per delivery, written with the done mark. */
export function recordPayment(job: Job): void {
  const event = job.event as { customer?: unknown; amount?: unknown } | null;
  if (typeof event?.customer !== "string" || typeof event.amount !== "number") {
    throw new PermanentError(`expected {"customer": string, "amount": number}`);
  }
  const { customer, amount } = event;
  // A plain INSERT, not INSERT OR IGNORE: if a payment were ever written twice, this would fail loudly.
  // Returning run's result lets PostgreSQL's commit wait for it; on SQLite it has already run.
  job.write((tx) =>
    tx.run(
      "INSERT INTO payments (source, delivery_id, customer, amount) VALUES (?, ?, ?, ?)",
      job.delivery.source,
      job.delivery.id,
      customer,
      amount,
    ),
  );
}

/**
 * loadHandler imports the module at path (resolved against the working folder) and returns its default
 * export, the Handler run() calls for each delivery routed to the handler, or one line saying what is wrong.
 */
export async function loadHandler(path: string): Promise<Handler | string> {
  let loaded: { default?: unknown };
  try {
    loaded = await import(pathToFileURL(resolve(path)).href);
  } catch (error) {
    // One line, not the loader's require stack.
    return `cannot load it: ${message(error).split("\n")[0]}`;
  }
  return typeof loaded.default === "function"
    ? (loaded.default as Handler)
    : "expected a module whose default export is a function (job) => void | Promise<void>";
}

/** EXAMPLE_HANDLER is what --handler names to run the article's record-payment handler on purpose. */
export const EXAMPLE_HANDLER = "demo";

// toHandler finds a source whose deliveries go to the handler: one with no routes (the handler is the default
// route), or one whose routes name it.
function toHandler(sources: Iterable<Source>): Source | undefined {
  for (const s of sources) if (s.routes === undefined || s.routes.some((r) => r.to === DEFAULTS.destination)) return s;
  return undefined;
}

// unhandled is why a worker without --handler must not start on this configuration: the article's
// record-payment handler reads {customer, amount}, which no real provider's event or broker message has, so
// it would set every one routed to the handler aside. The example runs only with no configuration at all
// (the article's, the demo's), or when --handler demo asks for it.
function unhandled(sources: Iterable<Source>): string | undefined {
  const s = toHandler(sources);
  if (s === undefined) return undefined;
  const how = s.routes === undefined ? "has no routes, so its deliveries go to the handler" : 'routes to "handler"';
  return `worker: source ${JSON.stringify(s.name)} ${how}, and no --handler is given: pass --handler MODULE (your code for each delivery), or --handler ${EXAMPLE_HANDLER} for the article's record-payment example (docs/in-your-app.md#the-workers-handler)`;
}

// unconfiguredHandler sets aside what reaches the handler of a worker given no --handler once a configuration
// is in force: the example is the bare demo's alone, and a real event it cannot read would be set aside with
// a message about {customer, amount} that says nothing of the fix.
function unconfiguredHandler(job: Job): never {
  throw new PermanentError(
    `no handler: source ${job.delivery.source} routes to "handler", and this worker was started without --handler; start one with --handler MODULE, then inbox.ts retry --failed --destination handler`,
  );
}

// WORKER_CHECKS: the worker verifies no signature, so a source's signing secret it is not given does not stop it
// (it redacts those it has); every destination's secret it forwards with is read.
const WORKER_CHECKS: SecretChecks = { verify: false };

// WorkerFlags is what workerProgram() parses.
interface WorkerFlags {
  once?: boolean;
  db?: string;
  lease: number;
  concurrency: number;
  claimBatch?: number;
  maxAttempts: number;
  quiet?: boolean;
  logFormat: LogFormat;
  metricsPort?: number;
  transformMemory: number;
  metricsHost: string;
  purgeEvery?: number | true;
  bodiesAfter: number;
  forgetAfter: number;
  sources?: string;
  handler?: string;
  force?: boolean;
  skipCheck?: boolean;
  secretsKeyFile?: string;
}

// workerProgram is the worker's flags and --help, every flag checked as commander parses it.
async function workerProgram(argv: readonly string[]) {
  const { Command, InvalidArgumentError, Option } = await import("commander");
  const whole = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("expected a whole number of 1 or more.");
    return n;
  };
  const logFormat = (value: string) => {
    if (!(LOG_FORMATS as readonly string[]).includes(value))
      throw new InvalidArgumentError(`expected ${LOG_FORMATS.join(" or ")}.`);
    return value as LogFormat;
  };
  const port = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 0 || n > 65535)
      throw new InvalidArgumentError("expected a port number, 0 to 65535.");
    return n;
  };
  const age = (value: string) => {
    const ms = parseDuration(value);
    if (ms === undefined) throw new InvalidArgumentError("expected an age such as 30m, 12h, 7d or 2w.");
    return ms;
  };
  const program = new Command("worker.ts")
    .description("Process stored deliveries: record each payment exactly once.")
    .option("--once", "drain the deliveries that are due, then exit")
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option(
      "--lease <seconds>",
      "how long a claimed delivery is held before another worker may take it over",
      whole,
      DEFAULTS.leaseMs / 1000,
    )
    .option(
      "--concurrency <n>",
      "handlers run at once (a limit for handlers that wait on I/O)",
      whole,
      DEFAULTS.concurrency,
    )
    .option(
      "--claim-batch <n>",
      `most deliveries claimed in one transaction while handlers are fast (default: ${DEFAULTS.claimBatch}, on PostgreSQL ${DEFAULTS.claimBatchPostgres})`,
      whole,
    )
    .option("--max-attempts <n>", "tries before a delivery is set aside as failed", whole, DEFAULTS.maxAttempts)
    .option(
      "--handler <module>",
      `the module whose default export handles each delivery routed to the handler, or ${EXAMPLE_HANDLER} for the article's record-payment example (default: the example where nothing is configured, the demo's set-up; a configuration that routes to the handler needs it)`,
    )
    .option(
      "--skip-check",
      "SQLite: skip the start-up quick_check, even when it is due (it runs after an unclean stop, or once a day)",
    )
    .option("--force", "SQLite: start on a file that fails the start-up quick_check, saying so")
    .option("--quiet", "don't log a line per delivery")
    .option(
      "--log-format <format>",
      `text, or json: one JSON object per line (${LOG_FORMATS.join(" or ")})`,
      logFormat,
      "text",
    )
    .option(
      "--sources <file>",
      "JSON sources file: routes and $destinations to forward to, beside the handler (default: INBOX_SOURCES)",
    )
    .option(
      "--metrics-port <port>",
      "serve /metrics, /livez and /readyz on this port (default: off; 0 picks a free one)",
      port,
    )
    .option("--metrics-host <address>", "address for --metrics-port", DEFAULTS.host)
    .option(
      "--secrets-key-file <file>",
      "the key that opens the secret store's values (secret:NAME), instead of INBOX_SECRETS_KEY",
    )
    .option(
      "--transform-memory <MB>",
      "memory (RSS) each transform's process may use before it is killed and the try fails",
      whole,
      DEFAULTS.transformMemoryMb,
    )
    .option(
      "--purge-every [minutes]",
      `purge at start and then on this schedule (default when given without a number: ${DEFAULTS.purgeEveryMinutes}); off unless given`,
      whole,
    )
    // Defaults shown as ages (7d), as they are typed, not as the milliseconds they parse to.
    .addOption(
      new Option(
        "--bodies-after <age>",
        "with --purge-every: drop the bodies of done deliveries older than this (30m, 12h, 7d)",
      )
        .argParser(age)
        .default(DEFAULTS.bodiesAfterMs, formatAge(DEFAULTS.bodiesAfterMs)),
    )
    .addOption(
      new Option(
        "--forget-after <age>",
        "with --purge-every: forget tombstones older than this; longer than --bodies-after",
      )
        .argParser(age)
        .default(DEFAULTS.forgetAfterMs, formatAge(DEFAULTS.forgetAfterMs)),
    )
    .addHelpText(
      "after",
      `
On a terminal, --once shows its progress on stderr: done of the backlog, the rate, the time left.
Purging is off unless --purge-every is given, because it lets bodies go: see \`inbox.ts purge --help\`.
Give it to one worker; each purge goes in batches of ${DEFAULTS.purgeBatch}, each its own transaction.

Examples:
  npx tsx worker.ts --purge-every --bodies-after 7d --forget-after 30d
  npx tsx worker.ts --once
  npx tsx worker.ts --db /tmp/inbox.db --concurrency 32
  npx tsx worker.ts --metrics-port 9464 --log-format json
  npx tsx inbox.ts status          # see what it did`,
    )
    .showHelpAfterError("(run with --help for usage)");
  speakTo(program, argv);
  return program;
}

/** main runs the worker as `worker.ts` does, from a full argv (runtime, script, then its flags). */
export async function main(argv: string[]): Promise<void> {
  try {
    await work(argv);
  } catch (error) {
    if (!(error instanceof StartupError)) throw error;
    say(error.message, "error");
    process.exit(error.code);
  }
}

// work starts the worker and runs it until the queue is drained (--once) or SIGTERM or SIGINT, then drains.
async function work(argv: string[]): Promise<void> {
  const program = await workerProgram(argv);
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<WorkerFlags>();
  format = opts.logFormat;
  if (opts.forgetAfter <= opts.bodiesAfter)
    throw new StartupError(
      "worker: --forget-after must be longer than --bodies-after: the tombstone must outlive the body (run with --help for usage)",
    );
  const purgeEveryMs =
    opts.purgeEvery === undefined
      ? undefined
      : (opts.purgeEvery === true ? DEFAULTS.purgeEveryMinutes : opts.purgeEvery) * 60_000;
  // What the operator hands the configuration (lib/config/trust.ts): the key to the secret store, and what a
  // part the API wrote may read and reach; its inbox joins it once open.
  const startup = new Startup({
    script: "worker",
    argv,
    say,
    door: { connect, isPostgresUrl },
    env: process.env,
    keyFile: opts.secretsKeyFile,
    ...(opts.metricsPort ? { ownPorts: [opts.metricsPort] } : {}),
  });

  // The sources file says where deliveries go: destinations the worker forwards to, beside the handler.
  // Read and checked whole before the database is opened, as a worker would run it (its transforms loaded,
  // its brokers' clients found), so a mistake stops start-up with one line and nothing created; once the
  // inbox is open it is applied there (lib/config/), and what runs is what the database holds. Without it,
  // the worker runs the configuration in the database (docs/config.md).
  const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
  // A file that names a secret of the store is checked whole once the inbox is open.
  const file = sourcesFile ? startup.readSources(sourcesFile, WORKER_CHECKS) : undefined;
  const base = file?.base ?? process.cwd();
  // Each transform runs in a process of its own, within these limits (lib/forwarding/transform.ts).
  const limits: TransformLimits = { memoryMb: opts.transformMemory, log: (line) => say(line, "error") };
  if (file?.loaded)
    await ready(file, { version: 0, document: file.text, transforms: {} }, startup.host, base, limits).then(letGo);

  // The handler is chosen on purpose (unhandled()), checked on the file before the database is opened.
  const refusal = opts.handler === undefined && file?.loaded ? unhandled(file.loaded.sources.values()) : undefined;
  if (refusal) throw new StartupError(refusal);
  const named = await chooseHandler(opts.handler);

  const path = opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  let metrics: Metrics | undefined;
  const onCommit =
    opts.metricsPort === undefined ? {} : { onCommit: (size: number, ms: number) => metrics?.commit(size, ms) };
  const inbox = await startup.open(path, {
    skipCheck: opts.skipCheck,
    force: opts.force,
    connect: { maxAttempts: opts.maxAttempts, ...onCommit },
  });
  // On SQLite the forwarding lanes write through a connection of their own that commits without an fsync
  // and settles each write only after an fdatasync of the WAL on a libuv thread (syncOffLoop, as the
  // receiver's): an fsync inside each COMMIT held the event loop, and with it every forward in flight, for
  // a third of the time. Their writes are claims, done marks and failures, none of which anyone acts on
  // before it settles; the handler's connection, whose writes the app reads, keeps FULL. Opened whenever
  // destinations may come: a configuration applied while the worker runs can add the first.
  // --purge-every's batches commit the same way, through a connection of their own, as inbox.ts purge does: on
  // the handler's, each batch's fsync inside COMMIT held the write lock, and the receiver's acks waited behind
  // it (docs/operations.md#retention-by-period). A tombstone seen before its fdatasync lets nothing be lost: a
  // body a power cut brings back is purged again, and a copy stored again settles after its own fdatasync,
  // which covers the purge's frames before it in the same WAL.
  const { first, lanes, purging, example } = await startup.database(async () => {
    const { stored, changes } = await startup.configure(inbox, file, WORKER_CHECKS);
    if (changes.length > 0) say(`worker: ${sourcesFile} applied as configuration version ${stored!.version}`);
    // What the database holds (the handler alone where it holds nothing) is what runs.
    const first = stored ? await ready(undefined, stored, startup.host, base, limits) : unconfigured();
    // The configuration in the database may name sources routed to the handler the file did not: the same rule holds.
    const refusal = named === undefined ? unhandled(first.loaded.sources.values()) : undefined;
    if (refusal) throw new StartupError(refusal);
    // No --handler and nothing configured is the article's set-up, the demo's: its example runs, saying so.
    const example = named === undefined && first.version === 0;
    if (example)
      say(
        `worker: no configuration and no --handler: running the article's record-payment example, as the demo does (--handler MODULE runs yours)`,
      );
    if (example || named === recordPayment) await ensurePayments(inbox);
    const lanes =
      inbox.backend === "sqlite" && (!opts.once || first.loaded.forwarding.destinations.size > 0)
        ? await connect(path, { maxAttempts: opts.maxAttempts, syncOffLoop: true, ...onCommit })
        : undefined;
    const purging =
      inbox.backend === "sqlite" && purgeEveryMs !== undefined
        ? await connect(path, { maxAttempts: opts.maxAttempts, syncOffLoop: true, ...onCommit })
        : undefined;
    return { first, lanes, purging, example };
  });
  // The example stops at the first configuration applied while it runs: what reaches the handler then is real.
  let exampleRuns = example;
  const seen = (version: number) => {
    if (!exampleRuns) return;
    exampleRuns = false;
    say(
      `worker: configuration version ${version} is in force: the record-payment example stops; what is routed to the handler is set aside until a worker runs with --handler MODULE`,
      "error",
    );
  };
  const handler: Handler = named ?? ((job) => (exampleRuns ? recordPayment(job) : unconfiguredHandler(job)));
  const stop = new AbortController();
  if (opts.metricsPort !== undefined)
    metrics = await serveMetrics(inbox, opts.metricsPort, opts.metricsHost, stop.signal);
  // On a terminal, --once shows how far it has got; piped or logged, it prints nothing extra.
  const stats: RunStats = { claimed: 0, done: 0, retried: 0, failed: 0, lost: 0, released: 0 };
  const shown = opts.once && process.stderr.isTTY ? await backlogProgress(inbox, stats) : undefined;
  const lines = lineLog(shown ?? process.stderr, opts.logFormat);
  void startup.stopped().then((signal) => {
    lines.flush();
    shown?.stop();
    say(`${signal}: no more claims; letting the work in flight finish`);
    stop.abort();
  });
  const log = opts.quiet ? () => {} : lines.log;
  const forwardStats: ForwardStats = { done: 0, retried: 0, failed: 0, released: 0, lost: 0 };
  // Each configuration version runs as a generation of lanes; a newer one, checked whole, takes over.
  const live = new LiveForwarding(
    (p, signal) =>
      import("./lib/forwarding/forwarder.ts").then(({ forward }) =>
        forward({
          inbox: lanes ?? inbox,
          forwarding: p.loaded.forwarding,
          routes: p.loaded.routes,
          ...(p.transforms ? { transforms: p.transforms } : {}),
          once: opts.once,
          leaseMs: opts.lease * 1000,
          signal,
          log,
          metrics,
          stats: forwardStats,
          senders: p.senders,
          secrets: p.loaded.secrets,
        }),
      ),
    stop.signal,
    opts.once,
  );
  live.run(first);
  // Each configuration applied while the worker runs is taken up; SIGHUP applies the file again.
  const unwatch = opts.once
    ? undefined
    : startup.watch(inbox, {
        version: first.version,
        sourcesFile,
        checks: WORKER_CHECKS,
        take: async (config) => {
          seen(config.version);
          const next = await prepare(config, startup.host, base, limits);
          if (typeof next === "string")
            return say(
              `worker: configuration version ${config.version} not taken up, version ${live.version} goes on: ${next}`,
              "error",
            );
          live.run(next);
          say(`worker: now running configuration version ${config.version}`, "info", { configVersion: config.version });
        },
      });
  const { forwarding, secrets } = first.loaded;
  try {
    await Promise.all([
      run(handler, {
        inbox,
        once: opts.once,
        leaseMs: opts.lease * 1000,
        concurrency: opts.concurrency,
        claimBatch: opts.claimBatch,
        signal: stop.signal,
        log,
        metrics,
        stats,
        ...(forwarding.operator ? { operator: forwarding.operator } : {}),
        ...(secrets.length > 0 ? { redact: redactor(secrets, { mine: DEFAULTS.destination }).redact } : {}),
        purge:
          purgeEveryMs === undefined
            ? undefined
            : {
                everyMs: purgeEveryMs,
                bodiesAfterMs: opts.bodiesAfter,
                forgetAfterMs: opts.forgetAfter,
                ...(purging ? { inbox: purging } : {}),
              },
      }),
      live.finished(),
    ]);
  } catch (error) {
    lines.flush();
    shown?.stop();
    // A claim a --once run could not make, or a lane that failed: the run cannot go on.
    throw new StartupError(`worker: ${message(error)}`, 1);
  }
  unwatch?.();
  await lanes?.close();
  await purging?.close();
  await inbox.close();
  startup.close();
  lines.flush();
  shown?.stop();
  if (opts.once || stop.signal.aborted)
    summarise(stats, forwarding.destinations.size > 0 || live.version !== first.version ? forwardStats : undefined);
}

// The log format work() was given; the lines before it knows are text.
let format: LogFormat = "text";

// say writes one line of the worker's own (start-up, shutdown, its summary) to stderr, in the log format.
function say(line: string, level: "info" | "warn" | "error" = "info", fields: Record<string, unknown> = {}): void {
  console.error(format === "json" ? jsonLine(line, { level, ...fields }) : line);
}

// chooseHandler is the handler --handler names: the article's record-payment example for "demo", else the
// module's default export; a module that cannot be loaded stops start-up with one line. Undefined when none
// is named: work() then decides by the configuration.
async function chooseHandler(module: string | undefined): Promise<Handler | undefined> {
  if (module === undefined) return undefined;
  if (module === EXAMPLE_HANDLER) return recordPayment;
  const loaded = await loadHandler(module);
  if (typeof loaded === "string") throw new StartupError(`worker: --handler ${module}: ${loaded}`);
  return loaded;
}

// backlogProgress draws how far a --once run has got on a terminal: settled of what was waiting at start.
async function backlogProgress(inbox: Inbox, stats: RunStats): Promise<Progress | undefined> {
  const gauges = await inbox.gauges().catch(() => undefined);
  const backlog = (gauges?.bySourceStatus ?? [])
    .filter((g) => g.status === "received" || g.status === "processing")
    .reduce((n, g) => n + g.n, 0);
  return progress(process.stderr, () => {
    const settled = stats.done + stats.failed + stats.lost;
    return {
      done: settled,
      total: Math.max(backlog, settled),
      extra: stats.retried > 0 ? `${stats.retried} to retry` : undefined,
    };
  });
}

// serveMetrics serves /metrics, /livez and /readyz for the worker, or stops start-up with one line.
async function serveMetrics(inbox: Inbox, port: number, host: string, stopping: AbortSignal): Promise<Metrics> {
  // Loaded only when asked for: a worker without metrics does not pay for prom-client.
  const { Metrics, Readiness } = await import("./lib/metrics.ts");
  const metrics = new Metrics({ inbox });
  try {
    const server = await metrics.listen(port, host, new Readiness(inbox, { stopping: () => stopping.aborted }));
    server.unref();
    const address = server.address();
    const url = `http://${host}:${typeof address === "object" && address ? address.port : port}/metrics`;
    say(`Metrics on ${url}`, "info", { url });
  } catch (error) {
    throw new StartupError(`worker: cannot serve metrics on ${host}:${port}: ${message(error)}`, 1);
  }
  return metrics;
}

// ready prepares a configuration as the worker runs it (lib/config/live.ts: its secrets read, its transforms
// loaded, its brokers' clients found), or stops start-up with one line: the file's mistake, or the database's.
async function ready(
  file: SourcesFile | undefined,
  config: Pick<StoredConfig, "version" | "document" | "transforms"> & Partial<Pick<StoredConfig, "trust" | "way">>,
  host: Host,
  base: string,
  limits: TransformLimits,
): Promise<Prepared> {
  const prepared = await prepare(config, host, base, limits);
  if (typeof prepared !== "string") return prepared;
  throw new StartupError(
    file
      ? `worker: ${file.path}: ${prepared}`
      : `worker: the configuration in the database (version ${config.version}): ${prepared}`,
  );
}

// summarise prints a finished run's counts: the handler's, and the forwards' where there were destinations.
function summarise(stats: RunStats, forwarded: ForwardStats | undefined): void {
  say(
    `worker: ${stats.done} done, ${stats.retried} to retry, ${stats.failed} failed, ${stats.lost} lost to other workers`,
    "info",
    { ...stats },
  );
  if (!forwarded) return;
  const f = forwarded;
  say(
    `worker: forwarded ${f.done}, ${f.retried} to retry, ${f.failed} set aside, ${f.released} held, ${f.lost} lost to other workers`,
    "info",
    { forwarded: { ...f } },
  );
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);
