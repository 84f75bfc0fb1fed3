// lease/settler.ts: where a lease's end is written, once for every lane. What runs a lease (the handler, a
// forward, a publish) returns a Settlement and touches nothing else; the lane hands it here, and the settler
// writes it (a done mark through the batcher, a failure, a lease given back, a destination paused), again
// while the database errs in a way that passes, and reports what came of it as one event. See docs/house.md.

import { DEFAULTS } from "../defaults.ts";
import { again } from "../errors.ts";
import { message } from "../log.ts";
import type { FailOptions, Failure, Inbox, Lease, LocalWrite, SetAside, Try } from "../store.ts";

/** Settlement is what one lease's try came to, as its executor says: the one value an executor returns. */
export type Settlement =
  /** Done, with the writes that commit with its done mark, or not at all; and the try, for its attempt log. */
  | { kind: "done"; writes?: readonly LocalWrite[]; attempt?: Try }
  /** The try failed: try again after the store's backoff (no sooner than afterMs), or set aside after the last attempt. */
  | { kind: "retry"; error: string; afterMs?: number; attempt?: Try }
  /** Retrying cannot help: set the delivery aside now. */
  | { kind: "failed"; error: string; attempt?: Try }
  /** The destination must wait (it said it is gone): it is paused, and the lease given back, no attempt spent. */
  | { kind: "held"; error: string }
  /** Given back untouched, no attempt spent: the lane's own word, for a lease not started or cut off by a stop. */
  | Released;

/** Released is the settlement of a lease the lane gives back itself. */
export type Released = { kind: "released" };

/**
 * SettledAs is what the store made of a settlement: done; back in the queue to retry; set aside; given back;
 * lost (another worker holds the lease now, so nothing was written); or unsettled (the write itself failed,
 * so the lease runs out and the delivery goes again).
 */
export type SettledAs = "done" | "retry" | "failed" | "released" | "lost" | "unsettled";

/** Settled is the one event of a lease's end: what its executor said, and what the store made of it. */
export interface Settled<S extends Settlement = Settlement> {
  type: "settled";
  lease: Lease;
  settlement: S | Released;
  result: SettledAs;
  /** The error written with a retry or a set-aside: the executor's, or a done mark's the store refused. */
  error?: string;
  /** When a retry is due, in ms since the epoch. */
  retryAt?: number;
  /** A held settlement paused its destination now (false: it already was). */
  paused?: boolean;
  /** How long its executor ran, in ms; undefined if it never returned (not started, or cut off and given back). */
  ran?: number;
  /** A stop cut its executor off. */
  cutOff: boolean;
  /** Its executor's signal was aborted: the lease was lost, or a stop cut it off. */
  aborted: boolean;
  /** Why an unsettled write failed. */
  unsettled?: unknown;
  /**
   * It may have made a delivery due that a claim already out cannot see: it put one back in the queue (a
   * retry, a release), or ended one of an order key, whose next is now its key's head.
   */
  due: boolean;
}

/**
 * LaneEvent is what a lane tells its listener: each lease settled (one event each, written first), each
 * lease claimed, the deliveries a claim set aside, and the database errors met on the way. A listener
 * turns them into counters, metrics, spans and log lines.
 */
export type LaneEvent<S extends Settlement = Settlement> =
  | Settled<S>
  | { type: "claimed"; lease: Lease }
  /** A claim set these aside: their last attempt's lease ran out, its worker crashed or hung. */
  | { type: "set aside"; deliveries: SetAside[] }
  /** A claim failed; `first` when claims begin to fail in a lane that tries again (a --once run throws instead). */
  | { type: "claim failed"; error: unknown; first: boolean }
  /** A claim worked again after some failed. */
  | { type: "claiming again" }
  /** The heartbeat could not extend a lease: it tries again at the next beat. */
  | { type: "extend failed"; lease: Lease; error: unknown }
  /** A write met a database error that passes, and goes again; `tries` says how many in a row it has met. */
  | { type: "write failed"; what: string; error: unknown; lease?: Lease; tries: number }
  /** The permit could not be asked: the lane asks again after pollMaxMs. */
  | { type: "permit failed"; error: unknown };

/**
 * LaneListener hears a lane's events. What it returns for a Settled event is awaited before the lease is
 * let go, and, if the lane keeps a failed lease's place until then (LaneOptions.placeUntil), before the
 * place frees: a destination's breaker counts a failure before the next forward goes out.
 */
export type LaneListener<S extends Settlement = Settlement> = (event: LaneEvent<S>) => void | Promise<void>;

/** How a lease came to be settled, as its lane saw it. */
export interface Settling {
  /** How long its executor ran, in ms, if it returned. */
  ran?: number;
  cutOff: boolean;
  aborted: boolean;
}

/** SettlerOptions are what a settler writes to and reports to. */
export interface SettlerOptions<S extends Settlement> {
  /** Where failures, give-backs and pauses are written. */
  inbox: Pick<Inbox, "fail" | "release" | "pause">;
  /** Where done marks go: the lane's Batcher, or the inbox itself; the call is the same. */
  marks: Pick<Inbox, "finish">;
  listener: LaneListener<S>;
  /** The destination a held settlement pauses. @default DEFAULTS.destination */
  destination?: string;
  /** How long a write goes again while the database errs in a way that passes: a lease's time. */
  forMs: number;
  /** The first wait before it goes again; doubled each time up to maxMs. */
  minMs: number;
  maxMs: number;
  /** How an error that becomes a failure is said (a done mark the store refused). @default its message */
  describe?: (error: unknown) => string;
}

// What a write came to, before the rest of the event is added.
type Written = Pick<Settled, "result" | "error" | "retryAt" | "paused" | "unsettled">;

/**
 * Settler writes each lease's settlement and reports it. A done mark goes through `marks`, batched or not;
 * a retry or a failure is fail(); a lease given back (not started, held, or a retry a stop cut off) is
 * release(). Each goes again while the database errs in a way that passes.
 */
export class Settler<S extends Settlement = Settlement> {
  private readonly o: SettlerOptions<S>;

  constructor(options: SettlerOptions<S>) {
    this.o = options;
  }

  /**
   * settle writes what became of a lease, reports it, and settles with the event it reported once the
   * listener is done with it. It never rejects for a write. Its steps are chained rather than awaited in
   * nested async functions: a done mark is the hot path, and each layer was a promise more per delivery.
   */
  settle(lease: Lease, settlement: S | Released, how: Settling): Promise<Settled<S>> {
    const report = (written: Written): Settled<S> | Promise<Settled<S>> => {
      const { result } = written;
      const event: Settled<S> = {
        type: "settled",
        lease,
        settlement,
        ...written,
        cutOff: how.cutOff,
        aborted: how.aborted,
        due:
          result === "retry" ||
          result === "released" ||
          (lease.orderKey !== null && (result === "done" || result === "failed")),
      };
      if (how.ran !== undefined) event.ran = how.ran;
      // Waited for only when the listener has something to wait for: most settlements have not.
      const heard = this.o.listener(event);
      return heard ? heard.then(() => event) : event;
    };
    let writing: Promise<Written>;
    try {
      writing = this.write(lease, settlement, how.cutOff);
    } catch (error) {
      writing = Promise.reject(error);
    }
    return writing.then(report, (error: unknown) => report({ result: "unsettled", unsettled: error }));
  }

  /**
   * persist runs one write through again(): a database error that passes (a deadlock, a dropped connection,
   * a server restarting) is reported, and the write goes again for as long as a lease lasts, the lease kept
   * meanwhile by the heartbeat. Any other error, or one that outlasts the lease, is thrown.
   */
  persist<T>(what: string, write: () => Promise<T>, lease?: Lease): Promise<T> {
    const { forMs, minMs, maxMs, listener } = this.o;
    const onError = (error: unknown, tries: number) =>
      void listener({ type: "write failed", what, error, tries, ...(lease ? { lease } : {}) });
    return again(write, { forMs, minMs, maxMs, onError });
  }

  private write(lease: Lease, s: S | Released, cutOff: boolean): Promise<Written> {
    // A try a stop cut off says nothing of the delivery: back to the queue as it was, no attempt spent.
    if (s.kind === "released" || (s.kind === "retry" && cutOff)) return this.release(lease);
    // The try rides the write that settles it, in its transaction: its attempt log costs no commit of its own.
    const attempt = s.kind !== "held" && s.attempt ? { attempt: s.attempt } : {};
    if (s.kind === "retry")
      return this.fail(lease, s.error, s.afterMs === undefined ? attempt : { retryAfterMs: s.afterMs, ...attempt });
    if (s.kind === "failed") return this.fail(lease, s.error, { permanent: true, ...attempt });
    if (s.kind === "held") {
      // Paused before the lease goes back, so that no claim finds the delivery due and the destination open.
      const { inbox, destination } = this.o;
      return this.persist("pause", () => inbox.pause(destination ?? DEFAULTS.destination, s.error)).then((paused) =>
        this.release(lease).then((released) => ({ ...released, paused })),
      );
    }
    return this.persist("write a done mark", () => this.o.marks.finish(lease, s.writes, s.attempt), lease).then(
      (held): Written => ({ result: held ? "done" : "lost" }),
      // The done mark and its writes rolled back together, so nothing is marked done that wasn't written:
      // the try failed, with the store's error.
      (error: unknown) => this.fail(lease, (this.o.describe ?? message)(error), attempt),
    );
  }

  private fail(lease: Lease, error: string, options: FailOptions): Promise<Written> {
    return this.persist("record a failure", () => this.o.inbox.fail(lease, error, options), lease).then(
      (failure: Failure | undefined): Written =>
        failure === undefined
          ? { result: "lost", error }
          : failure.status === "failed"
            ? { result: "failed", error }
            : { result: "retry", error, retryAt: failure.retryAt },
    );
  }

  private release(lease: Lease): Promise<Written> {
    return this.persist("release a lease", () => this.o.inbox.release(lease), lease).then(
      (released): Written => ({ result: released ? "released" : "lost" }),
    );
  }
}
