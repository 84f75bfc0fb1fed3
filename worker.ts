// worker.ts: the polling worker. It claims due deliveries under a lease, runs a handler on each, and
// commits the handler's local writes together with the done mark, so they happen exactly once.
//   npx tsx worker.ts --once          # drain the queue, then exit
//   npx tsx worker.ts [--db inbox.db] [--concurrency 8] [--lease 60] [--purge-every [minutes]]
// Import run() to plug in your own handler; the one here records the article's payments.

import { dirname, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { connect, isPostgresUrl } from "./inbox.ts";
import { DEFAULTS } from "./lib/defaults.ts";
import { age as formatAge, parseDuration } from "./lib/format.ts";
import {
  jsonLine,
  label,
  lineLog,
  LOG_FORMATS,
  message,
  progress,
  type Log,
  type LogFormat,
  type Progress,
} from "./lib/log.ts";
import {
  PermanentError,
  type Inbox,
  type Lease,
  type LocalWrite,
  type PurgeOptions,
  type SetAside,
} from "./lib/store.ts";
import { again, sqlstate } from "./lib/errors.ts";
import type { Metrics } from "./lib/metrics.ts";
import { announce, checkSecrets } from "./lib/forwarding/forward.ts";
import type { ForwardStats } from "./lib/forwarding/forwarder.ts";
import { loadSources, readSourcesFile } from "./lib/providers.ts";
import { loadDestinations, type Forwarding, type Operator, type Route } from "./lib/routing/routes.ts";
import { startProcess, type Outcome, type Process } from "./lib/traces.ts";
import { brokerSender, missingClient, parseBrokerDestination, type BrokerDestination } from "./lib/brokers.ts";
import { redactor, secretsOf, type Secret } from "./lib/redact.ts";
import { checkTransforms, Transforms } from "./lib/forwarding/transform.ts";
import type { Sender } from "./lib/forwarding/forward.ts";
import { damagedLine, healthProblem } from "./lib/sqlite/backup.ts";

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
   * The W3C traceparent of this attempt's span (traces.ts), to send on with any forward so the destination
   * joins the trace that began when the delivery was received; undefined when nothing traces it.
   */
  traceparent?: string;
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
  /** Handlers run at once: a real limit for handlers that wait on I/O. @default DEFAULTS.concurrency */
  concurrency?: number;
  /** Most deliveries claimed in one transaction when handlers are fast. @default DEFAULTS.claimBatch */
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
   * given: purging lets bodies go, which no upgrade should start doing on its own. @default undefined
   */
  purge?: Omit<PurgeOptions, "dryRun" | "signal"> & { everyMs: number };
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
  const claimBatch = Math.max(concurrency, options.claimBatch ?? DEFAULTS.claimBatch);
  const pollMin = options.pollMinMs ?? DEFAULTS.pollMinMs;
  const pollMax = options.pollMaxMs ?? DEFAULTS.pollMaxMs;
  const log: Log = options.log ?? ((line: string) => console.error(line));
  const metrics = options.metrics;
  const redact = options.redact ?? ((text: string) => text);
  for (const [name, value, min] of [
    ["leaseMs", leaseMs, 1],
    ["concurrency", concurrency, 1],
    ["pollMinMs", pollMin, 0],
    ["pollMaxMs", pollMax, pollMin],
  ] as const) {
    if (!Number.isFinite(value) || value < min) throw new TypeError(`run: expected ${name} >= ${min}, got ${value}`);
  }
  if (options.purge && !(options.purge.everyMs >= 1))
    throw new TypeError(`run: expected purge.everyMs >= 1, got ${options.purge.everyMs}`);
  const stats: RunStats = options.stats ?? { claimed: 0, done: 0, retried: 0, failed: 0, lost: 0, released: 0 };
  const active = new Map<Lease, AbortController>();
  // Each started lease's span, ended once its outcome is committed or known (traces.ts).
  const spans = new Map<Lease, Process>();
  const traced = (lease: Lease, outcome: Outcome, error?: string) => {
    spans.get(lease)?.end(outcome, error);
    spans.delete(lease);
  };
  // Claimed leases whose handler has not started: concurrency bounds the handlers, not the claims.
  const waiting: Lease[] = [];
  // Handlers still running; concurrency bounds these. A lease whose handler is done but whose finish is
  // not yet committed stays in active without taking a handler's place, so the next claim can join the
  // very transaction that commits those finishes: one fsync per batch, not two.
  let running = 0;
  // How long handlers take (a moving average, in ms). Fast ones share claims of up to claimBatch, so one
  // commit serves many; slow ones claim only what the free handlers can start, as no worker should hoard
  // leases it cannot work on. It starts slow, so the first claim is never more than concurrency.
  let handlerMs = Infinity;
  // How long a claim takes, its commit included (a moving average, in ms). A claim brings at least
  // CLAIM_SHARE times its own time in work for each handler's place: where a commit's fsync is slow, a
  // claim sized by the handlers alone would cost the worker as much as the work it brings.
  let claimMs = 0;
  const claimSize = () =>
    Math.max(
      concurrency,
      Math.min(claimBatch, Math.floor((concurrency * Math.max(CLAIM_AHEAD_MS, CLAIM_SHARE * claimMs)) / handlerMs)),
    );
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
  // persist runs a done mark, a failure or a release through again(): a database error that passes (a
  // deadlock, a dropped connection, a server restarting) is counted, logged once, and the write goes
  // again for as long as a lease lasts, the lease kept meanwhile by the heartbeat. A done mark's writes
  // rolled back with it, so they run again with it, once.
  const persist = <T>(what: string, lease: Lease, write: () => Promise<T>, first?: { error: unknown }): Promise<T> =>
    again(
      write,
      {
        forMs: leaseMs,
        minMs: pollMin,
        maxMs: 4 * pollMax,
        onError: (error, tries) => {
          metrics?.dbError("handler", error);
          if (tries === 1)
            log(`${label(lease)}: could not ${what} (${message(error)}); trying again`, {
              level: "warn",
              source: lease.source,
              id: lease.id,
              sqlstate: sqlstate(error),
            });
        },
      },
      first,
    );
  // On PostgreSQL a receiver's NOTIFY ends an idle pause at once; polling stays as the backstop.
  const unwake = inbox.onWake(() => wake());
  const purging = schedulePurge(inbox, options.purge, stop, log);

  const heartbeat = setInterval(
    () => {
      for (const [lease, controller] of active) {
        inbox.extend(lease, leaseMs).then(
          (held) => {
            if (!held && !controller.signal.aborted) controller.abort(new Error("the lease was lost"));
          },
          (error: unknown) => {
            metrics?.dbError("handler", error);
            log(`${label(lease)}: could not extend the lease: ${message(error)}`, {
              level: "warn",
              source: lease.source,
              id: lease.id,
              sqlstate: sqlstate(error),
            });
          },
        );
      }
    },
    options.heartbeatMs ?? Math.max(1, Math.floor(leaseMs / 3)),
  );

  // Done marks held for the next claim, which takes them into its own transaction. Handlers that wait on
  // I/O finish one or two a turn, and each turn's done marks would otherwise be a commit of their own: on
  // SQLite an fsync that holds the thread, and every handler in flight with it, for as long as the disk
  // takes. A claim comes when the last claimed lease starts (or a handler's place frees, for slow ones),
  // and none waits longer than pollMax. They go to the inbox just ahead of that claim, so its takeovers
  // never see them as expired leases, and each handler awaits its own finish() as before.
  const held: { lease: Lease; writes: LocalWrite[]; sent(finish: { done: Promise<boolean> }): void }[] = [];
  let holding: ReturnType<typeof setTimeout> | undefined;
  const finishHeld = () => {
    clearTimeout(holding);
    holding = undefined;
    for (const h of held.splice(0)) {
      let done: Promise<boolean>;
      try {
        done = inbox.finish(h.lease, h.writes);
      } catch (error) {
        done = Promise.reject(error);
      }
      h.sent({ done });
    }
  };
  const finishWithClaim = (lease: Lease, writes: LocalWrite[]) =>
    new Promise<{ done: Promise<boolean> }>((sent) => {
      held.push({ lease, writes, sent });
      holding ??= setTimeout(finishHeld, pollMax);
    });

  const handlerDone = (lease: Lease, started: number) => {
    const ms = performance.now() - started;
    metrics?.handled(lease, ms);
    handlerMs = handlerMs === Infinity ? ms : handlerMs * 0.9 + ms * 0.1;
    running--;
    startWaiting();
    wake();
  };

  async function settle(lease: Lease, work: () => Promise<LocalWrite[]>): Promise<void> {
    const name = label(lease);
    const fields = { source: lease.source, id: lease.id };
    const started = performance.now();
    let writes: LocalWrite[];
    try {
      writes = await work();
    } catch (error) {
      handlerDone(lease, started);
      return record(lease, error);
    }
    handlerDone(lease, started);
    try {
      // The first try goes with the next claim and is awaited directly: it settles in the same turn as that
      // claim, so the last empty claim of `--once` finds nothing left and ends the run.
      const finish = () => inbox.finish(lease, writes);
      const first = await finishWithClaim(lease, writes);
      let finished: boolean;
      try {
        finished = await first.done;
      } catch (error) {
        finished = await persist("write the done mark", lease, finish, { error });
      }
      if (finished) {
        stats.done++;
        traced(lease, "done");
        log(`${name} done`, { ...fields, status: "done" });
      } else {
        stats.lost++;
        traced(lease, "lost");
        metrics?.lost(lease);
        log(`${name}: the lease was lost while working, so its writes were rolled back and another worker took over`, {
          level: "warn",
          ...fields,
        });
      }
    } catch (error) {
      // The done mark and the writes rolled back together; nothing is marked done that wasn't written.
      await record(lease, error);
    }
  }

  // Set aside by a claim, as their last attempt's lease ran out: whoever held them crashed or hung, so no
  // record() of theirs says so.
  function gaveUp(setAside: SetAside[]): void {
    for (const d of setAside) {
      stats.failed++;
      metrics?.failed(d);
      log(`${label(d)} set aside after ${d.attempts} attempts: ${d.error}`, { level: "error", ...d, status: "failed" });
      announceSetAside(d);
    }
  }

  function announceSetAside(d: SetAside): void {
    if (!options.operator) return;
    const event = { type: "delivery.set_aside" as const, data: { ...d } };
    void announce(options.operator, event).then((r) => r === true || log(r, { level: "warn", event: event.type }));
  }

  async function record(lease: Lease, error: unknown): Promise<void> {
    const name = label(lease);
    const permanent = error instanceof PermanentError;
    // A handler's error may quote a secret (an API's answer that echoed one): redacted before it goes anywhere.
    const said = redact(message(error));
    try {
      const outcome = await persist("record the failure", lease, () => inbox.fail(lease, said, { permanent }));
      const fields = { source: lease.source, id: lease.id, attempts: lease.attempts, error: said };
      traced(lease, outcome === undefined ? "lost" : outcome.status === "failed" ? "failed" : "retry", said);
      if (outcome === undefined) {
        stats.lost++;
        metrics?.lost(lease);
        log(`${name} failed, but the lease was already lost: ${said}`, { level: "warn", ...fields });
      } else if (outcome.status === "failed") {
        stats.failed++;
        metrics?.failed(lease);
        log(`${name} failed${permanent ? " permanently" : ` after ${lease.attempts} attempts`}: ${said}`, {
          level: "error",
          ...fields,
          status: "failed",
        });
        announceSetAside({
          source: lease.source,
          id: lease.id,
          destination: lease.destination,
          attempts: lease.attempts,
          error: said,
        });
      } else {
        stats.retried++;
        metrics?.retried(lease);
        log(
          `${name} failed (attempt ${lease.attempts}), retrying at ${new Date(outcome.retryAt).toISOString()}: ${said}`,
          { level: "warn", ...fields, status: "received", retryAt: outcome.retryAt },
        );
      }
    } catch (failError) {
      // Unrecorded, it is tried again once its lease runs out.
      traced(lease, "retry", said);
      log(`${name}: could not record the failure (${message(failError)}); it will be retried when its lease expires`, {
        level: "error",
        source: lease.source,
        id: lease.id,
      });
    }
  }

  function startWaiting(): void {
    while (running < concurrency && waiting.length > 0 && !stop?.aborted) start(waiting.shift()!);
  }

  function start(lease: Lease): void {
    const controller = active.get(lease)!;
    const span = startProcess(lease);
    spans.set(lease, span);
    running++;
    settle(lease, async () => {
      let event: unknown;
      try {
        event = JSON.parse(strictUtf8.decode(lease.body));
      } catch (error) {
        // V8 quotes a piece of the text in its JSON errors: keep only where, so no log repeats a body.
        const why =
          error instanceof SyntaxError
            ? `not valid JSON${/ at position \d+/.exec(error.message)?.[0] ?? ""}`
            : message(error);
        throw new PermanentError(`the body is not JSON: ${why}`);
      }
      const writes: LocalWrite[] = [];
      await span.run(() =>
        handler({
          delivery: lease,
          event,
          key: `${lease.source}:${lease.id}`,
          signal: controller.signal,
          stale: lease.newerId !== null,
          ...(lease.newerId !== null ? { newerId: lease.newerId } : {}),
          ...(span.traceparent !== undefined ? { traceparent: span.traceparent } : {}),
          write: (fn) => void writes.push(fn),
        }),
      );
      if (controller.signal.aborted) throw controller.signal.reason;
      return writes;
    }).finally(() => {
      active.delete(lease);
      // An outcome that went unrecorded (its lease was lost before fail() could say so) still ends the span.
      traced(lease, "lost");
      wake();
    });
  }

  try {
    let delay = pollMin;
    let claimFailing = false;
    while (!stop?.aborted) {
      // Claim when everything claimed has started: a batch's worth for fast handlers, the free handlers'
      // worth for slow ones, but never more than a second batch of leases waiting on their commit.
      const size = claimSize();
      const room = waiting.length > 0 ? 0 : Math.min(size - (size > concurrency ? 0 : running), 2 * size - active.size);
      let leases: Lease[] = [];
      // The held done marks go with this claim; with nothing left to start and no claim, they go now.
      if (waiting.length === 0) finishHeld();
      try {
        if (room > 0) {
          const started = performance.now();
          leases = await inbox.claimBatch(room, leaseMs, { onSetAside: gaveUp });
          claimMs = claimMs * 0.9 + (performance.now() - started) * 0.1;
        }
      } catch (error) {
        // A full disk or a lock held too long passes: a long-running worker waits it out (saying so once)
        // rather than dying with its handlers in flight. Run once, it reports the error instead.
        metrics?.dbError("handler", error);
        if (options.once) throw error;
        if (!claimFailing) log(`could not claim (${message(error)}); trying again`, { level: "error" });
        claimFailing = true;
        await pause(pollMax);
        continue;
      }
      if (claimFailing) log("claiming again");
      claimFailing = false;
      for (const lease of leases) {
        active.set(lease, new AbortController());
        stats.claimed++;
        metrics?.claimed(lease);
        waiting.push(lease);
      }
      startWaiting();
      if (leases.length > 0) {
        delay = pollMin;
        continue;
      }
      if (options.once && active.size === 0) break;
      // Idle: back off up to pollMax, but a finishing handler or a stop wakes the loop at once.
      await pause(room > 0 ? delay : pollMax);
      if (room > 0) delay = Math.min(pollMax, Math.max(1, delay * 2));
    }
    // Leases not yet started go straight back; the ones at work get the grace period.
    // A release that fails for good leaves the lease to run out instead: the worker stops all the same.
    const giveBack = (lease: Lease) =>
      persist("release the lease", lease, () => inbox.release(lease)).catch((error: unknown) => {
        log(`${label(lease)}: could not release (${message(error)}); it goes again when its lease expires`, {
          level: "warn",
          source: lease.source,
          id: lease.id,
        });
        return false;
      });
    for (const lease of waiting.splice(0)) {
      active.delete(lease);
      if (await giveBack(lease)) stats.released++;
    }
    await drain(active, options.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs, () => {
      finishHeld();
      return pause(pollMax);
    });
    // Whatever outlived the grace period goes back to the queue now rather than when its lease expires;
    // what finished meanwhile has its done mark sent first.
    finishHeld();
    for (const [lease, controller] of active) {
      controller.abort(new Error("the worker is stopping"));
      traced(lease, "released");
      if (await giveBack(lease)) {
        stats.released++;
        log(`${label(lease)} released: the worker stopped before it finished`, {
          source: lease.source,
          id: lease.id,
          status: "received",
        });
      }
    }
    finishHeld();
    await inbox.flush();
  } finally {
    // Done marks held when a claim failed for good go to the inbox all the same.
    finishHeld();
    clearInterval(heartbeat);
    unwake();
    await purging.stop();
  }
  return stats;
}

// Fast handlers claim ahead this many ms of their own work per handler slot, or CLAIM_SHARE times a
// claim's own time if that is more (see claimSize).
const CLAIM_AHEAD_MS = 5;
const CLAIM_SHARE = 10;

// schedulePurge runs purge at start and then every everyMs, never two at once; stop ends the schedule
// after the batch in flight. A failed purge is logged and tried again next time: the queue comes first.
function schedulePurge(
  inbox: Inbox,
  purge: WorkerOptions["purge"],
  signal: AbortSignal | undefined,
  log: (line: string) => void,
): { stop(): Promise<void> } {
  if (purge === undefined) return { stop: async () => {} };
  const { everyMs, ...ages } = purge;
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

/** main runs the worker as `worker.ts` does, from a full argv (runtime, script, then its flags). */
export async function main(argv: string[]): Promise<void> {
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
      "most deliveries claimed in one transaction while handlers are fast",
      whole,
      DEFAULTS.claimBatch,
    )
    .option("--max-attempts <n>", "tries before a delivery is set aside as failed", whole, DEFAULTS.maxAttempts)
    .option("--force", "start on a SQLite file that fails quick_check (checked at start-up only)")
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
  program.exitOverride((error) => process.exit(error.exitCode === 0 ? 0 : 2));
  await program.parseAsync(argv);
  const opts = program.opts<{
    once?: boolean;
    db?: string;
    lease: number;
    concurrency: number;
    claimBatch: number;
    maxAttempts: number;
    quiet?: boolean;
    logFormat: LogFormat;
    metricsPort?: number;
    metricsHost: string;
    purgeEvery?: number | true;
    bodiesAfter: number;
    forgetAfter: number;
    sources?: string;
    force?: boolean;
  }>();
  const say = (line: string, level: "info" | "error" = "info", fields: Record<string, unknown> = {}) =>
    console.error(opts.logFormat === "json" ? jsonLine(line, { level, ...fields }) : line);
  if (opts.forgetAfter <= opts.bodiesAfter) {
    say(
      "worker: --forget-after must be longer than --bodies-after: the tombstone must outlive the body (run with --help for usage)",
      "error",
    );
    process.exit(2);
  }
  const purgeEveryMs =
    opts.purgeEvery === undefined
      ? undefined
      : (opts.purgeEvery === true ? DEFAULTS.purgeEveryMinutes : opts.purgeEvery) * 60_000;

  // The sources file says where deliveries go: destinations the worker forwards to, beside the handler.
  // Read before the database is opened, so a mistake stops start-up with one line and nothing created.
  const sourcesFile = opts.sources ?? process.env.INBOX_SOURCES;
  let forwarding: Forwarding | undefined;
  let routes: Map<string, readonly Route[]> | undefined;
  // Every secret the file names, redacted wherever a failed try's error goes (redact.ts).
  let secrets: Secret[] = [];
  // The broker destinations, parsed once, their secrets read; and the transforms' threads, loaded once.
  const brokers = new Map<string, BrokerDestination>();
  let transforms: Transforms | undefined;
  if (sourcesFile) {
    try {
      const parsed = readSourcesFile(sourcesFile);
      const sources = [...loadSources(parsed, process.env).values()];
      routes = new Map(sources.map((s) => [s.name, s.routes ?? []]));
      // A broker destination's own settings are brokers.ts's to check, its secrets read from the environment.
      forwarding = loadDestinations(parsed, process.env, {
        brokerCheck: (name, settings, where) =>
          void brokers.set(name, parseBrokerDestination(name, settings, where, process.env)),
      });
      for (const d of forwarding.destinations.values())
        if (d.kind === "http") checkSecrets(d.secrets, `destination ${JSON.stringify(d.name)}`);
      secrets = secretsOf(forwarding, { sources, brokers: brokers.values() });
    } catch (error) {
      say(`worker: ${sourcesFile}: ${message(error)}`, "error");
      process.exit(2);
    }
    // A broker's client is an optional dependency: one this file publishes to must be installed now,
    // not found missing at the first delivery.
    for (const [name, broker] of brokers) {
      const missing = await missingClient(broker.type, name);
      if (missing !== undefined) {
        say(`worker: ${missing}`, "error");
        process.exit(2);
      }
    }
    // Each transform module is loaded once now, so a missing file or a bad export stops start-up, not a forward.
    const uses = [
      ...[...routes!].flatMap(([source, list]) =>
        list
          .filter((r) => r.transform)
          .map((r) => ({ module: r.transform!.module, where: `source ${JSON.stringify(source)}: route to ${r.to}` })),
      ),
      ...[...forwarding!.destinations.values()]
        .filter((d) => d.transform)
        .map((d) => ({ module: d.transform!.module, where: `destination ${JSON.stringify(d.name)}` })),
    ];
    if (uses.length > 0) transforms = new Transforms(dirname(resolve(sourcesFile)));
    const wrong = transforms ? await checkTransforms(uses, transforms) : undefined;
    if (wrong) {
      say(`worker: ${sourcesFile}: ${wrong}`, "error");
      process.exit(2);
    }
  }

  const path = opts.db ?? process.env.INBOX_DB ?? DEFAULTS.db;
  const damaged = opts.force || isPostgresUrl(path) ? undefined : healthProblem(path);
  if (damaged !== undefined) {
    say(damagedLine("worker", path, damaged), "error");
    // Exit 2 as the receiver does: a restart cannot mend the file (docs/production.md, start-up check).
    process.exit(2);
  }
  let inbox: Inbox;
  // On SQLite the forwarding lanes write through a connection of their own that commits without an fsync
  // and settles each write only after an fdatasync of the WAL on a libuv thread (syncOffLoop, as the
  // receiver's): an fsync inside each COMMIT held the event loop, and with it every forward in flight, for
  // a third of the time. Their writes are claims, done marks and failures, none of which anyone acts on
  // before it settles; the handler's connection, whose writes the app reads, keeps FULL.
  let lanes: Inbox | undefined;
  let metrics: Metrics | undefined;
  try {
    const onCommit =
      opts.metricsPort === undefined ? {} : { onCommit: (size: number, ms: number) => metrics?.commit(size, ms) };
    inbox = await connect(path, { maxAttempts: opts.maxAttempts, ...onCommit });
    await ensurePayments(inbox);
    if (forwarding && forwarding.destinations.size > 0 && inbox.backend === "sqlite") {
      lanes = await connect(path, { maxAttempts: opts.maxAttempts, syncOffLoop: true, ...onCommit });
    }
  } catch (error) {
    say(`worker: cannot use the database: ${message(error)}`, "error");
    process.exit(1);
  }
  const stop = new AbortController();
  if (opts.metricsPort !== undefined) {
    // Loaded only when asked for: a worker without metrics does not pay for prom-client.
    const { Metrics, Readiness } = await import("./lib/metrics.ts");
    metrics = new Metrics({ inbox });
    try {
      const server = await metrics.listen(
        opts.metricsPort,
        opts.metricsHost,
        new Readiness(inbox, { stopping: () => stop.signal.aborted }),
      );
      server.unref();
      const address = server.address();
      const url = `http://${opts.metricsHost}:${typeof address === "object" && address ? address.port : opts.metricsPort}/metrics`;
      say(`Metrics on ${url}`, "info", { url });
    } catch (error) {
      say(`worker: cannot serve metrics on ${opts.metricsHost}:${opts.metricsPort}: ${message(error)}`, "error");
      process.exit(1);
    }
  }
  // On a terminal, --once shows how far it has got; piped or logged, it prints nothing extra.
  const stats: RunStats = { claimed: 0, done: 0, retried: 0, failed: 0, lost: 0, released: 0 };
  let shown: Progress | undefined;
  if (opts.once && process.stderr.isTTY) {
    const gauges = await inbox.gauges().catch(() => undefined);
    const backlog = (gauges?.bySourceStatus ?? [])
      .filter((g) => g.status === "received" || g.status === "processing")
      .reduce((n, g) => n + g.n, 0);
    shown = progress(process.stderr, () => {
      const settled = stats.done + stats.failed + stats.lost;
      return {
        done: settled,
        total: Math.max(backlog, settled),
        extra: stats.retried > 0 ? `${stats.retried} to retry` : undefined,
      };
    });
  }
  const lines = lineLog(shown ?? process.stderr, opts.logFormat);
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    process.on(signal, () => {
      if (stop.signal.aborted) return;
      lines.flush();
      shown?.stop();
      say(`${signal}: no more claims; letting the work in flight finish`);
      stop.abort();
    });
  }
  const log = opts.quiet ? () => {} : lines.log;
  const forwardStats: ForwardStats = { done: 0, retried: 0, failed: 0, held: 0, lost: 0 };
  // One publisher per broker destination; each connects at its first publish, and closes when forwarding ends.
  const senders = new Map<string, Sender>();
  for (const [name, broker] of brokers) senders.set(name, brokerSender(broker));
  try {
    const forwarding$ =
      forwarding && forwarding.destinations.size > 0
        ? import("./lib/forwarding/forwarder.ts")
            .then(({ forward }) =>
              forward({
                inbox: lanes ?? inbox,
                forwarding: forwarding!,
                routes,
                ...(transforms ? { transforms } : {}),
                once: opts.once,
                leaseMs: opts.lease * 1000,
                signal: stop.signal,
                log,
                metrics,
                stats: forwardStats,
                senders,
                secrets,
              }),
            )
            .finally(() => Promise.all([...[...senders.values()].map((s) => s.close()), transforms?.close()]))
        : undefined;
    await Promise.all([
      run(recordPayment, {
        inbox,
        once: opts.once,
        leaseMs: opts.lease * 1000,
        concurrency: opts.concurrency,
        claimBatch: opts.claimBatch,
        signal: stop.signal,
        log,
        metrics,
        stats,
        ...(forwarding?.operator ? { operator: forwarding.operator } : {}),
        ...(secrets.length > 0 ? { redact: redactor(secrets, { mine: DEFAULTS.destination }).redact } : {}),
        purge:
          purgeEveryMs === undefined
            ? undefined
            : { everyMs: purgeEveryMs, bodiesAfterMs: opts.bodiesAfter, forgetAfterMs: opts.forgetAfter },
      }),
      forwarding$,
    ]);
  } catch (error) {
    lines.flush();
    shown?.stop();
    say(`worker: ${message(error)}`, "error");
    process.exit(1);
  }
  await lanes?.close();
  await inbox.close();
  lines.flush();
  shown?.stop();
  if (opts.once || stop.signal.aborted) {
    say(
      `worker: ${stats.done} done, ${stats.retried} to retry, ${stats.failed} failed, ${stats.lost} lost to other workers`,
      "info",
      { ...stats },
    );
    if (forwarding && forwarding.destinations.size > 0) {
      const f = forwardStats;
      say(
        `worker: forwarded ${f.done}, ${f.retried} to retry, ${f.failed} set aside, ${f.held} held, ${f.lost} lost to other workers`,
        "info",
        { forwarded: { ...f } },
      );
    }
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await main(process.argv);
