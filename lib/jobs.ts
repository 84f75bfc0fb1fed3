// jobs.ts: the user's handler as a lane's executor. Each lease becomes a Job; the handler's local
// writes commit with the done mark, or not at all; a thrown error is a retry, a PermanentError a failure.
// worker.ts run() builds its lane on Jobs, which is also where that lane's outcomes are reported.

import { announce } from "./forwarding/forward.ts";
import { label, message, type Log } from "./log.ts";
import type { Metrics } from "./metrics.ts";
import type { Operator } from "./routing/routes.ts";
import { PermanentError, type Inbox, type Lease, type LocalWrite, type SetAside } from "./store.ts";
import { sqlstate } from "./errors.ts";
import { startProcess, type Outcome, type Process } from "./traces.ts";
import type { Batcher } from "./lease/batcher.ts";
import type { Clock } from "./lease/clock.ts";
import type { Lane, LaneReport, Running } from "./lease/lane.ts";
import type { HandlerSizing } from "./lease/sizing.ts";

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

/** RunStats counts what happened to the deliveries a run claimed. */
export interface RunStats {
  claimed: number;
  done: number;
  retried: number;
  failed: number;
  lost: number;
  released: number;
}

/** JobsOptions are what Jobs reports to and runs with. */
export interface JobsOptions {
  inbox: Inbox;
  handler: Handler;
  /** Where done marks go, with the next claim. */
  batcher: Batcher;
  /** Told how long each handler took. */
  sizing: HandlerSizing;
  clock: Clock;
  stats: RunStats;
  log: Log;
  metrics?: Metrics;
  /** Where a delivery set aside is announced. @default none */
  operator?: Operator;
  /** Applied to a handler's error before it is stored, logged, traced or announced. */
  redact: (text: string) => string;
}

// JSON is UTF-8: a body with bytes that are not is refused rather than decoded with U+FFFD in their place,
// which would hand the handler text the sender never sent. The BOM is kept, so JSON.parse refuses it too.
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Jobs runs the handler on a lane's leases and reports what the lane and the handler did. */
export class Jobs implements LaneReport {
  readonly releasing = "release the lease";
  private readonly o: JobsOptions;
  // Each started lease's span, ended once its outcome is committed or known (traces.ts).
  private readonly spans = new Map<Lease, Process>();

  constructor(options: JobsOptions) {
    this.o = options;
  }

  /** execute is the lane's executor: the handler on one lease, then its done mark or its failure. */
  execute = (lease: Lease, running: Running): Promise<void> => {
    const span = startProcess(lease);
    this.spans.set(lease, span);
    return this.settle(lease, span, running);
  };

  private traced(lease: Lease, outcome: Outcome, error?: string): void {
    this.spans.get(lease)?.end(outcome, error);
    this.spans.delete(lease);
  }

  // settle runs the handler, then sends its done mark or records its failure. Its awaits are the ones
  // run() has always had: a `--once` run ends when the turn its last claim settles in finds no lease held.
  private async settle(lease: Lease, span: Process, { signal, free, lane }: Running): Promise<void> {
    const { inbox, clock, stats, log, metrics } = this.o;
    const name = label(lease);
    const fields = { source: lease.source, id: lease.id };
    const started = clock.now();
    // The handler's place is free once it has returned: the done mark need not hold it.
    const handled = () => {
      const ms = clock.now() - started;
      metrics?.handled(lease, ms);
      this.o.sizing.ran(ms);
      free();
    };
    let writes: LocalWrite[];
    try {
      writes = await this.work(lease, span, signal);
    } catch (error) {
      handled();
      return this.record(lease, error, lane);
    }
    handled();
    try {
      // The first try goes with the next claim and is awaited directly: it settles in the same turn as that
      // claim, so the last empty claim of `--once` finds nothing left and ends the run.
      let finished: boolean;
      try {
        finished = await (await this.o.batcher.add(lease, writes)).finished;
      } catch (error) {
        finished = await lane.persist("write the done mark", () => inbox.finish(lease, writes), lease, { error });
      }
      if (finished) {
        stats.done++;
        this.traced(lease, "done");
        log(`${name} done`, { ...fields, status: "done" });
      } else {
        stats.lost++;
        this.traced(lease, "lost");
        metrics?.lost(lease);
        log(`${name}: the lease was lost while working, so its writes were rolled back and another worker took over`, {
          level: "warn",
          ...fields,
        });
      }
    } catch (error) {
      // The done mark and the writes rolled back together; nothing is marked done that wasn't written.
      await this.record(lease, error, lane);
    }
  }

  // work parses the body and runs the handler in the try's span; its writes wait for the done mark.
  private async work(lease: Lease, span: Process, signal: AbortSignal): Promise<LocalWrite[]> {
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
      this.o.handler({
        delivery: lease,
        event,
        key: `${lease.source}:${lease.id}`,
        signal,
        stale: lease.newerId !== null,
        ...(lease.newerId !== null ? { newerId: lease.newerId } : {}),
        ...(span.traceparent !== undefined ? { traceparent: span.traceparent } : {}),
        write: (fn) => void writes.push(fn),
      }),
    );
    if (signal.aborted) throw signal.reason;
    return writes;
  }

  private async record(lease: Lease, error: unknown, lane: Lane): Promise<void> {
    const { inbox, stats, log, metrics } = this.o;
    const name = label(lease);
    const permanent = error instanceof PermanentError;
    // A handler's error may quote a secret (an API's answer that echoed one): redacted before it goes anywhere.
    const said = this.o.redact(message(error));
    try {
      const outcome = await lane.persist("record the failure", () => inbox.fail(lease, said, { permanent }), lease);
      const fields = { source: lease.source, id: lease.id, attempts: lease.attempts, error: said };
      this.traced(lease, outcome === undefined ? "lost" : outcome.status === "failed" ? "failed" : "retry", said);
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
        const { source, id, destination, attempts } = lease;
        this.announceSetAside({ source, id, destination, attempts, error: said });
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
      this.traced(lease, "retry", said);
      log(`${name}: could not record the failure (${message(failError)}); it will be retried when its lease expires`, {
        level: "error",
        source: lease.source,
        id: lease.id,
      });
    }
  }

  private announceSetAside(d: SetAside): void {
    const { operator, log } = this.o;
    if (!operator) return;
    const event = { type: "delivery.set_aside" as const, data: { ...d } };
    void announce(operator, event).then((r) => r === true || log(r, { level: "warn", event: event.type }));
  }

  dbError(error: unknown): void {
    this.o.metrics?.dbError("handler", error);
  }

  retrying(what: string, error: unknown, lease?: Lease): void {
    this.o.log(`${lease ? label(lease) : "worker"}: could not ${what} (${message(error)}); trying again`, {
      level: "warn",
      source: lease?.source,
      id: lease?.id,
      sqlstate: sqlstate(error),
    });
  }

  claimFailing(error: unknown): void {
    this.o.log(`could not claim (${message(error)}); trying again`, { level: "error" });
  }

  claimingAgain(): void {
    this.o.log("claiming again");
  }

  claimed(lease: Lease): void {
    this.o.stats.claimed++;
    this.o.metrics?.claimed(lease);
  }

  // Set aside by a claim, as their last attempt's lease ran out: whoever held them crashed or hung, so no
  // record() of theirs says so.
  setAside(list: SetAside[]): void {
    for (const d of list) {
      this.o.stats.failed++;
      this.o.metrics?.failed(d);
      this.o.log(`${label(d)} set aside after ${d.attempts} attempts: ${d.error}`, {
        level: "error",
        ...d,
        status: "failed",
      });
      this.announceSetAside(d);
    }
  }

  extendFailed(lease: Lease, error: unknown): void {
    this.o.log(`${label(lease)}: could not extend the lease: ${message(error)}`, {
      level: "warn",
      source: lease.source,
      id: lease.id,
      sqlstate: sqlstate(error),
    });
  }

  // An outcome that went unrecorded (its lease was lost before fail() could say so) still ends the span.
  settled(lease: Lease): void {
    this.traced(lease, "lost");
  }

  cutOff(lease: Lease): void {
    this.traced(lease, "released");
  }

  released(lease: Lease, cutOff: boolean): void {
    this.o.stats.released++;
    if (cutOff)
      this.o.log(`${label(lease)} released: the worker stopped before it finished`, {
        source: lease.source,
        id: lease.id,
        status: "received",
      });
  }

  releaseFailed(lease: Lease, error: unknown): void {
    this.o.log(`${label(lease)}: could not release (${message(error)}); it goes again when its lease expires`, {
      level: "warn",
      source: lease.source,
      id: lease.id,
    });
  }
}
