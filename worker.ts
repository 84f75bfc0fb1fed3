// worker.ts: the polling worker. It claims due deliveries under a lease, runs a handler on each, and
// commits the handler's local writes together with the done mark, so they happen exactly once.
//   npx tsx worker.ts --once          # drain the queue, then exit
//   npx tsx worker.ts [--db inbox.db] [--concurrency 8] [--lease 60]
// Import run() to plug in your own handler; the one here records the article's payments.

import { pathToFileURL } from "node:url";
import { DEFAULTS, PermanentError, connect, label, lineLog, message, type Inbox, type Lease, type LocalWrite } from "./inbox.ts";

/** Job is what a handler gets: the delivery, its parsed event, and a way to write locally, exactly once. */
export interface Job {
  delivery: Lease;
  /** The body parsed as JSON. A body that is not JSON never reaches a handler: it fails permanently. */
  event: unknown;
  /** `source:id`, stable across retries: pass it as the idempotency key of any external call. */
  key: string;
  /** Aborted when the lease is lost to another worker, or when a stopping worker gives up waiting. */
  signal: AbortSignal;
  /**
   * True when a newer event of the same order key was already handled (an out-of-order arrival, or a
   * set-aside delivery retried later): a handler that overwrites state with the event's should skip it.
   */
  stale: boolean;
  /** The ID of that newer, already handled delivery, when stale. */
  newerId?: string;
  /**
   * write queues a write to the inbox database; it commits with the done mark, or not at all. It gets a
   * Tx: `tx.run(sql, ...params)` works on both backends (return its result); see LocalWrite.
   */
  write(fn: LocalWrite): void;
}

/** Handler does the work for one delivery; throw to retry later, or throw PermanentError to give up. */
export type Handler = (job: Job) => unknown;

/** WorkerOptions configures run(); every number has a default in DEFAULTS. */
export interface WorkerOptions {
  inbox: Inbox;
  /** Drain what is due, then return. @default false */
  once?: boolean;
  /** @default DEFAULTS.leaseMs */
  leaseMs?: number;
  /** How often a held lease is extended while its handler runs. @default a third of leaseMs */
  heartbeatMs?: number;
  /** @default DEFAULTS.concurrency */
  concurrency?: number;
  /** @default DEFAULTS.pollMinMs */
  pollMinMs?: number;
  /** @default DEFAULTS.pollMaxMs */
  pollMaxMs?: number;
  /** @default DEFAULTS.shutdownGraceMs */
  shutdownGraceMs?: number;
  /** Abort to stop: no more claims; work in flight finishes, or is released after shutdownGraceMs. */
  signal?: AbortSignal;
  /** Where a line per delivery goes. @default console.error */
  log?: (line: string) => void;
}

/** RunStats counts what happened to the deliveries a run claimed. */
export interface RunStats {
  claimed: number;
  done: number;
  retried: number;
  failed: number;
  lost: number;
  released: number;
}

/** run claims and handles deliveries until the queue is empty (once) or the signal aborts. */
export async function run(handler: Handler, options: WorkerOptions): Promise<RunStats> {
  const { inbox } = options;
  const leaseMs = options.leaseMs ?? DEFAULTS.leaseMs;
  const concurrency = options.concurrency ?? DEFAULTS.concurrency;
  const pollMin = options.pollMinMs ?? DEFAULTS.pollMinMs;
  const pollMax = options.pollMaxMs ?? DEFAULTS.pollMaxMs;
  const log = options.log ?? ((line: string) => console.error(line));
  for (const [name, value, min] of [["leaseMs", leaseMs, 1], ["concurrency", concurrency, 1], ["pollMinMs", pollMin, 0], ["pollMaxMs", pollMax, pollMin]] as const) {
    if (!Number.isFinite(value) || value < min) throw new TypeError(`run: expected ${name} >= ${min}, got ${value}`);
  }
  const stats: RunStats = { claimed: 0, done: 0, retried: 0, failed: 0, lost: 0, released: 0 };
  const active = new Map<Lease, AbortController>();
  // Handlers still running; concurrency bounds these. A lease whose handler is done but whose finish is
  // not yet committed stays in active without taking a handler's place, so the next claim can join the
  // very transaction that commits those finishes: one fsync per batch, not two.
  let running = 0;
  const stop = options.signal;

  // wake ends the current pause early: a handler finished (room to claim) or the worker is stopping.
  let wake: () => void = () => {};
  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      const timer = setTimeout(() => resolve(), ms);
      wake = () => {
        clearTimeout(timer);
        resolve();
      };
    });
  stop?.addEventListener("abort", () => wake(), { once: true });
  // On PostgreSQL a receiver's NOTIFY ends an idle pause at once; polling stays as the backstop.
  const unwake = inbox.onWake(() => wake());

  const heartbeat = setInterval(() => {
    for (const [lease, controller] of active) {
      inbox.extend(lease, leaseMs).then(
        (held) => {
          if (!held && !controller.signal.aborted) controller.abort(new Error("the lease was lost"));
        },
        (error: unknown) => log(`${label(lease)}: could not extend the lease: ${message(error)}`),
      );
    }
  }, options.heartbeatMs ?? Math.max(1, Math.floor(leaseMs / 3)));

  async function settle(lease: Lease, work: () => Promise<LocalWrite[]>): Promise<void> {
    const name = label(lease);
    let writes: LocalWrite[];
    try {
      writes = await work();
    } catch (error) {
      running--;
      wake();
      return record(lease, error);
    }
    running--;
    wake();
    try {
      if (await inbox.finish(lease, writes)) {
        stats.done++;
        log(`${name} done`);
      } else {
        stats.lost++;
        log(`${name}: the lease was lost while working, so its writes were rolled back and another worker took over`);
      }
    } catch (error) {
      // The done mark and the writes rolled back together; nothing is marked done that wasn't written.
      await record(lease, error);
    }
  }

  async function record(lease: Lease, error: unknown): Promise<void> {
    const name = label(lease);
    const permanent = error instanceof PermanentError;
    try {
      const outcome = await inbox.fail(lease, message(error), { permanent });
      if (outcome === undefined) {
        stats.lost++;
        log(`${name} failed, but the lease was already lost: ${message(error)}`);
      } else if (outcome.status === "failed") {
        stats.failed++;
        log(`${name} failed${permanent ? " permanently" : ` after ${lease.attempts} attempts`}: ${message(error)}`);
      } else {
        stats.retried++;
        log(`${name} failed (attempt ${lease.attempts}), retrying at ${new Date(outcome.retryAt).toISOString()}: ${message(error)}`);
      }
    } catch (failError) {
      log(`${name}: could not record the failure (${message(failError)}); it will be retried when its lease expires`);
    }
  }

  function start(lease: Lease): void {
    const controller = new AbortController();
    active.set(lease, controller);
    running++;
    stats.claimed++;
    settle(lease, async () => {
      let event: unknown;
      try {
        event = JSON.parse(strictUtf8.decode(lease.body));
      } catch (error) {
        throw new PermanentError(`the body is not JSON: ${message(error)}`);
      }
      const writes: LocalWrite[] = [];
      await handler({
        delivery: lease, event, key: `${lease.source}:${lease.id}`, signal: controller.signal,
        stale: lease.newerId !== null, ...(lease.newerId !== null ? { newerId: lease.newerId } : {}),
        write: (fn) => void writes.push(fn),
      });
      if (controller.signal.aborted) throw controller.signal.reason;
      return writes;
    }).finally(() => {
      active.delete(lease);
      wake();
    });
  }

  try {
    let delay = pollMin;
    let claimFailing = false;
    while (!stop?.aborted) {
      // Room for handlers, but never more than a second batch of leases waiting on their commit.
      const room = Math.min(concurrency - running, 2 * concurrency - active.size);
      let leases: Lease[] = [];
      try {
        if (room > 0) leases = await inbox.claimBatch(room, leaseMs);
      } catch (error) {
        // A full disk or a lock held too long passes: a long-running worker waits it out (saying so once)
        // rather than dying with its handlers in flight. Run once, it reports the error instead.
        if (options.once) throw error;
        if (!claimFailing) log(`could not claim (${message(error)}); trying again`);
        claimFailing = true;
        await pause(pollMax);
        continue;
      }
      if (claimFailing) log("claiming again");
      claimFailing = false;
      for (const lease of leases) start(lease);
      if (leases.length > 0) {
        delay = pollMin;
        continue;
      }
      if (options.once && active.size === 0) break;
      // Idle: back off up to pollMax, but a finishing handler or a stop wakes the loop at once.
      await pause(room > 0 ? delay : pollMax);
      if (room > 0) delay = Math.min(pollMax, Math.max(1, delay * 2));
    }
    await drain(active, options.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs, () => pause(pollMax));
    // Whatever outlived the grace period goes back to the queue now rather than when its lease expires.
    for (const [lease, controller] of active) {
      controller.abort(new Error("the worker is stopping"));
      if (await inbox.release(lease)) {
        stats.released++;
        log(`${label(lease)} released: the worker stopped before it finished`);
      }
    }
    await inbox.flush();
  } finally {
    clearInterval(heartbeat);
    unwake();
  }
  return stats;
}

// JSON is UTF-8: a body with bytes that are not is refused rather than decoded with U+FFFD in their place,
// which would hand the handler text the sender never sent. The BOM is kept, so JSON.parse refuses it too.
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

async function drain(active: Map<Lease, AbortController>, graceMs: number, tick: () => Promise<void>): Promise<void> {
  const deadline = Date.now() + graceMs;
  while (active.size > 0 && Date.now() < deadline) await tick();
}

/** ensurePayments creates the example's payments table, keyed by delivery so a payment is one row. */
export async function ensurePayments(inbox: Inbox): Promise<void> {
  await inbox.query(`CREATE TABLE IF NOT EXISTS payments (
                       source      TEXT NOT NULL,
                       delivery_id TEXT NOT NULL,
                       customer    TEXT NOT NULL,
                       amount      ${inbox.backend === "postgres" ? "DOUBLE PRECISION" : "REAL"} NOT NULL,
                       PRIMARY KEY (source, delivery_id))`);
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
  job.write((tx) => tx.run("INSERT INTO payments (source, delivery_id, customer, amount) VALUES (?, ?, ?, ?)",
    job.delivery.source, job.delivery.id, customer, amount));
}

async function main(argv: string[]): Promise<void> {
  const { Command, InvalidArgumentError } = await import("commander");
  const whole = (value: string) => {
    const n = Number(value);
    if (!Number.isInteger(n) || n < 1) throw new InvalidArgumentError("expected a whole number of 1 or more.");
    return n;
  };
  const program = new Command("worker.ts")
    .description("Process stored deliveries: record each payment exactly once.")
    .option("--once", "drain the deliveries that are due, then exit")
    .option("--db <path|url>", `database file, or a postgres:// URL (default: INBOX_DB, else ${DEFAULTS.db})`)
    .option("--lease <seconds>", "how long a claimed delivery is held before another worker may take it over", whole, DEFAULTS.leaseMs / 1000)
    .option("--concurrency <n>", "handlers run at once", whole, DEFAULTS.concurrency)
    .option("--max-attempts <n>", "tries before a delivery is set aside as failed", whole, DEFAULTS.maxAttempts)
    .option("--quiet", "don't log a line per delivery")
    .addHelpText("after", `
Examples:
  npx tsx worker.ts --once
  npx tsx worker.ts --db /tmp/inbox.db --concurrency 32
  npx tsx inbox.ts status          # see what it did`)
    .showHelpAfterError("(run with --help for usage)");
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<{ once?: boolean; db?: string; lease: number; concurrency: number; maxAttempts: number; quiet?: boolean }>();

  const path = opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  let inbox: Inbox;
  try {
    inbox = await connect(path, { maxAttempts: opts.maxAttempts });
    await ensurePayments(inbox);
  } catch (error) {
    console.error(`worker: cannot use the database: ${message(error)}`);
    process.exit(1);
  }
  const lines = lineLog();
  const stop = new AbortController();
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    process.on(signal, () => {
      if (stop.signal.aborted) return;
      lines.flush();
      console.error(`${signal}: no more claims; letting the work in flight finish`);
      stop.abort();
    });
  }
  const log = opts.quiet ? () => {} : lines.log;
  let stats: RunStats;
  try {
    stats = await run(recordPayment, {
      inbox, once: opts.once, leaseMs: opts.lease * 1000, concurrency: opts.concurrency, signal: stop.signal, log,
    });
  } catch (error) {
    lines.flush();
    console.error(`worker: ${message(error)}`);
    process.exit(1);
  }
  await inbox.close();
  lines.flush();
  if (opts.once || stop.signal.aborted) {
    console.error(`worker: ${stats.done} done, ${stats.retried} to retry, ${stats.failed} failed, ${stats.lost} lost to other workers`);
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);
