// jobs.ts: the user's handler as a lane's executor. Each lease becomes a Job; what the handler does
// becomes a Settlement (lease/settler.ts): done with its local writes, which commit with the done mark or
// not at all; a thrown error a retry, a PermanentError a failure. worker.ts run() builds its lane on Jobs,
// which also turns that lane's events into counts, metrics, spans and log lines.

import { announce } from "./forwarding/forward.ts";
import { label, message, type Log } from "./log.ts";
import type { Metrics } from "./metrics.ts";
import type { Operator } from "./routing/routes.ts";
import { PermanentError, type Lease, type LocalWrite, type SetAside } from "./store.ts";
import { sqlstate } from "./errors.ts";
import { startProcess, type Process } from "./traces.ts";
import type { Running } from "./lease/lane.ts";
import type { LaneEvent, Settled, Settlement } from "./lease/settler.ts";

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

/** JobsOptions are what Jobs runs and reports to. */
export interface JobsOptions {
  handler: Handler;
  stats: RunStats;
  log: Log;
  metrics?: Metrics;
  /** Where a delivery set aside is announced. @default none */
  operator?: Operator;
  /** Applied to a handler's error before it is stored, logged, traced or announced. */
  redact: (text: string) => string;
  /** The time of day, in ms since the epoch, for when a failed try started (the attempt log). @default Date.now */
  now?: () => number;
}

// JSON is UTF-8: a body with bytes that are not is refused rather than decoded with U+FFFD in their place,
// which would hand the handler text the sender never sent. The BOM is kept, so JSON.parse refuses it too.
const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Jobs runs the handler on a lane's leases (execute) and says what the lane did (report). */
export class Jobs {
  private readonly o: JobsOptions;
  // Each started lease's span, ended once its settlement is written or known (traces.ts).
  private readonly spans = new Map<Lease, Process>();

  constructor(options: JobsOptions) {
    this.o = options;
  }

  /** execute is the lane's executor: the handler on one lease, and what it came to. */
  execute = async (lease: Lease, { signal }: Running): Promise<Settlement> => {
    const span = startProcess(lease);
    this.spans.set(lease, span);
    const now = this.o.now ?? Date.now;
    const startedAt = now();
    try {
      // A good try is not kept in the attempt log: the done mark says it, and the handler's hot path pays no row.
      return { kind: "done", writes: await this.work(lease, span, signal) };
    } catch (error) {
      // A handler's error may quote a secret (an API's answer that echoed one): redacted before it goes anywhere.
      const said = this.o.redact(message(error));
      const attempt = { startedAt, ms: now() - startedAt };
      return error instanceof PermanentError
        ? { kind: "failed", error: said, attempt }
        : { kind: "retry", error: said, attempt };
    }
  };

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

  /** report is the lane's listener: each event counted, measured, traced and logged. */
  report = (event: LaneEvent): void => {
    const { stats, log, metrics } = this.o;
    switch (event.type) {
      case "settled":
        this.settled(event);
        return;
      case "claimed":
        stats.claimed++;
        metrics?.claimed(event.lease);
        return;
      case "set aside":
        // Set aside by a claim, as their last attempt's lease ran out: whoever held them crashed or hung, so
        // no settlement of theirs says so.
        for (const d of event.deliveries) {
          stats.failed++;
          metrics?.failed(d);
          log(`${label(d)} set aside after ${d.attempts} attempts: ${d.error}`, {
            level: "error",
            ...d,
            status: "failed",
          });
          this.announceSetAside(d);
        }
        return;
      case "claim failed":
        metrics?.dbError("handler", event.error);
        if (event.first) log(`could not claim (${message(event.error)}); trying again`, { level: "error" });
        return;
      case "claiming again":
        log("claiming again");
        return;
      case "extend failed": {
        const { lease, error } = event;
        metrics?.dbError("handler", error);
        log(`${label(lease)}: could not extend the lease: ${message(error)}`, {
          level: "warn",
          source: lease.source,
          id: lease.id,
          sqlstate: sqlstate(error),
        });
        return;
      }
      case "write failed": {
        const { lease, error } = event;
        metrics?.dbError("handler", error);
        if (event.tries === 1)
          log(`${lease ? label(lease) : "worker"}: could not ${event.what} (${message(error)}); trying again`, {
            level: "warn",
            source: lease?.source,
            id: lease?.id,
            sqlstate: sqlstate(error),
          });
        return;
      }
      case "permit failed":
        return;
    }
  };

  // settled counts, traces and says what became of one lease.
  private settled(event: Settled): void {
    const { stats, log, metrics } = this.o;
    const { lease, settlement, result } = event;
    const name = label(lease);
    const fields = { source: lease.source, id: lease.id };
    const span = this.spans.get(lease);
    this.spans.delete(lease);
    if (event.ran !== undefined) metrics?.handled(lease, event.ran);
    if (settlement.kind === "released") {
      if (event.cutOff) span?.end("released");
      if (result === "released") {
        stats.released++;
        if (event.cutOff)
          log(`${name} released: the worker stopped before it finished`, { ...fields, status: "received" });
      } else if (result === "unsettled") {
        log(`${name}: could not release (${message(event.unsettled)}); it goes again when its lease expires`, {
          level: "warn",
          ...fields,
        });
      }
      return;
    }
    const said = event.error ?? "";
    if (result === "done") {
      stats.done++;
      span?.end("done");
      log(`${name} done`, { ...fields, status: "done" });
    } else if (result === "lost") {
      stats.lost++;
      span?.end("lost");
      metrics?.lost(lease);
      if (settlement.kind === "done")
        log(`${name}: the lease was lost while working, so its writes were rolled back and another worker took over`, {
          level: "warn",
          ...fields,
        });
      else log(`${name} failed, but the lease was already lost: ${said}`, failedFields(event, said, "warn"));
    } else if (result === "failed") {
      stats.failed++;
      span?.end("failed", said);
      metrics?.failed(lease);
      const permanent = settlement.kind === "failed";
      log(`${name} failed${permanent ? " permanently" : ` after ${lease.attempts} attempts`}: ${said}`, {
        ...failedFields(event, said, "error"),
        status: "failed",
      });
      const { source, id, destination, attempts } = lease;
      this.announceSetAside({ source, id, destination, attempts, error: said });
    } else if (result === "retry") {
      stats.retried++;
      span?.end("retry", said);
      metrics?.retried(lease);
      log(
        `${name} failed (attempt ${lease.attempts}), retrying at ${new Date(event.retryAt!).toISOString()}: ${said}`,
        {
          ...failedFields(event, said, "warn"),
          status: "received",
          retryAt: event.retryAt,
        },
      );
    } else {
      // Unrecorded, it is tried again once its lease runs out.
      span?.end("retry", settlement.kind === "done" ? message(event.unsettled) : said);
      log(
        `${name}: could not record the failure (${message(event.unsettled)}); it will be retried when its lease expires`,
        { level: "error", ...fields },
      );
    }
  }

  private announceSetAside(d: SetAside): void {
    const { operator, log } = this.o;
    if (!operator) return;
    const event = { type: "delivery.set_aside" as const, data: { ...d } };
    void announce(operator, event).then((r) => r === true || log(r, { level: "warn", event: event.type }));
  }
}

// failedFields are a failure's log fields.
function failedFields(event: Settled, error: string, level: "warn" | "error") {
  const { source, id, attempts } = event.lease;
  return { level, source, id, attempts, error };
}
