// lease/lane.ts: the lease loop, built once. A lane claims deliveries under a lease, starts each on its
// executor (the worker's handler, an HTTP forward, a broker publish), keeps every lease alive with one
// heartbeat, and when it stops gives back what has not started and drains what has. run() in worker.ts
// is one lane; forwarding/forwarder.ts runs one per destination. See docs/reliability.md.

import { DEFAULTS } from "../defaults.ts";
import type { ClaimOptions, Inbox, Lease, SetAside } from "../store.ts";
import { again } from "../errors.ts";
import { type Clock, realClock } from "./clock.ts";

/** LaneView is what a lane's parts (its sizing, its batcher's policy) may read of its state. */
export interface LaneView {
  /** Claimed leases not yet started. */
  readonly waiting: number;
  /** Leases started whose executor has not yet freed its place. */
  readonly running: number;
  /** Leases held: waiting, running, or freed but not yet settled (a done mark on its way). */
  readonly active: number;
  /** Whether starts wait on a permit being asked or its timer (LaneOptions.permit). */
  readonly gated: boolean;
}

/** Sizing decides how many leases a lane's next claim takes. */
export interface Sizing {
  /** room is how many leases the next claim takes; 0 sends no claim this turn. */
  room(lane: LaneView): number;
  /** claimed learns from a claim: how many it asked for and got, how long it took and when it began (ms). */
  claimed(asked: number, got: number, tookMs: number, at: number): void;
  /** starved is told when a place was free with nothing to start while a claim was out. */
  starved?(): void;
}

/** Marks is what a lane asks of its done marks' batcher (batcher.ts). */
export interface Marks {
  /** turn is the lane's moment before a claim: the marks go with it, or wait as the batcher's policy says. */
  turn(claiming: boolean, lane: LaneView): void;
  /** flush sends every gathered mark now. */
  flush(): void;
}

/** Running is what an executor gets beside its lease. */
export interface Running {
  /** Aborted when the lease is lost (the heartbeat found it taken) or when a stopping lane gives up waiting. */
  signal: AbortSignal;
  /** free gives the lease's place back before the executor settles (a forward answered, its mark on its way). */
  free(): void;
  lane: Lane;
}

/** Executor runs one lease to its end: finished, failed or released, through the lane's persist(). */
export type Executor = (lease: Lease, running: Running) => Promise<void>;

/** Permit is how many of the leases asked for may start now, and when to ask again for the rest. */
export interface Permit {
  granted: number;
  waitMs: number;
  /** The destination was paused: the lane holds (LaneOptions.permit). */
  paused: boolean;
}

/** LaneReport is where a lane's own outcomes go: metrics, counters and log lines. */
export interface LaneReport {
  /** What a release is called in the line a retried write logs ("release the lease"). */
  readonly releasing: string;
  /** dbError counts a database error the lane met. */
  dbError(error: unknown): void;
  /** retrying says, at its first retry, that a write failed with an error that passes. */
  retrying(what: string, error: unknown, lease?: Lease): void;
  /** claimFailing is told once when claims begin to fail; claimingAgain once one works again. */
  claimFailing(error: unknown): void;
  claimingAgain(): void;
  /** claimed is told of each lease a claim brought. */
  claimed(lease: Lease): void;
  /** setAside is told of deliveries a claim set aside: their last attempt's lease ran out. */
  setAside(list: SetAside[]): void;
  /** extendFailed is told when the heartbeat could not extend a lease (it tries again next beat). */
  extendFailed(lease: Lease, error: unknown): void;
  /** released is told of a lease given back unstarted, or cut off by a stop (`cutOff`). */
  released(lease: Lease, cutOff: boolean): void;
  /** settled is told of each lease whose executor has settled, just before the lane lets it go. @default none */
  settled?(lease: Lease): void;
  /** cutOff is told of a lease whose executor a stop cut off, before the lane gives it back. @default none */
  cutOff?(lease: Lease): void;
  /** releaseFailed is told of a lease that could not be given back: it runs out instead. */
  releaseFailed(lease: Lease, error: unknown): void;
}

/** LaneOptions are the parts a lane is built from; every number has a default in DEFAULTS. */
export interface LaneOptions {
  inbox: Inbox;
  /** What runs a lease: the handler, a forward, a publish. */
  execute: Executor;
  /** How much to claim. */
  sizing: Sizing;
  /** How done marks are batched (a Batcher, batcher.ts); the lane calls its turn() before each claim it may send. */
  batcher: Marks;
  /** Where the lane's outcomes go. */
  report: LaneReport;
  /** @default realClock */
  clock?: Clock;
  /** Leases at work at once. @default DEFAULTS.concurrency */
  concurrency?: number;
  /** @default DEFAULTS.leaseMs */
  leaseMs?: number;
  /** How often every held lease is extended. @default a third of leaseMs */
  heartbeatMs?: number;
  /** @default DEFAULTS.pollMinMs */
  pollMinMs?: number;
  /** @default DEFAULTS.pollMaxMs */
  pollMaxMs?: number;
  /** How often a held lane (its destination open or paused) looks again. @default pollMaxMs */
  heldPollMs?: number;
  /** @default DEFAULTS.shutdownGraceMs */
  shutdownGraceMs?: number;
  /** Who is named when an option is wrong. @default "lane" */
  who?: string;
  /** Drain what is due, then end. @default false */
  once?: boolean;
  /** Abort to stop the lane, as stop() does. @default none */
  signal?: AbortSignal;
  /** The destination whose deliveries to claim. @default the inbox's default */
  destination?: string;
  /**
   * Asked before each wave of starts, at the end of the turn in which places freed, so that they all
   * join one wave; a rejection is the caller's to log, and the lane asks again after pollMaxMs.
   * @default none: leases start as places free
   */
  permit?: (want: number) => Promise<Permit | undefined>;
  /**
   * What a stop does with an executor that outlives the grace period, once its signal is aborted: give
   * its lease back at once (a handler may never return), or wait for the executor, which releases it
   * itself (a forward ends when its request is cut off). @default "give back"
   */
  cutOff?: "give back" | "wait";
  /** Run once the lane has drained, before start()'s promise settles (a last tally, a flush). @default none */
  drained?: () => Promise<void>;
}

/**
 * Lane is one lease loop: claim, start, heartbeat, finish, fail or give back, drain. start() runs it
 * until stop() (or the signal, or `once` with nothing left); it may be started again after, and no lease
 * is lost or held twice across a stop and a start.
 */
export class Lane implements LaneView {
  private readonly o: LaneOptions;
  private readonly clock: Clock;
  private readonly concurrency: number;
  private readonly leaseMs: number;
  private readonly pollMin: number;
  private readonly pollMax: number;
  // Every held lease, with the controller its executor's signal comes from.
  private readonly leases = new Map<Lease, AbortController>();
  private readonly queue: Lease[] = [];
  private started = 0;
  private claiming = false;
  private claimFailing = false;
  private delay: number;
  private holding = false;
  private heldAt = -Infinity;
  // The permit being asked, or the cancel of the timer before the next ask; starts wait for either.
  private gate: "asking" | (() => void) | undefined;
  // Ends the pause in hand, if any.
  private resume: () => void = () => {};
  // Something may have become due since the claim in flight read the queue (due()).
  private changed = false;
  private stopping = false;
  private loop: Promise<void> | undefined;
  private readonly heldPoll: number;
  private readonly claimOptions: ClaimOptions;

  constructor(options: LaneOptions) {
    this.o = options;
    this.clock = options.clock ?? realClock;
    this.concurrency = options.concurrency ?? DEFAULTS.concurrency;
    this.leaseMs = options.leaseMs ?? DEFAULTS.leaseMs;
    this.pollMin = options.pollMinMs ?? DEFAULTS.pollMinMs;
    this.pollMax = options.pollMaxMs ?? DEFAULTS.pollMaxMs;
    this.delay = this.pollMin;
    this.heldPoll = Math.max(this.pollMax, options.heldPollMs ?? 0);
    const onSetAside = (list: SetAside[]) => this.o.report.setAside(list);
    this.claimOptions =
      options.destination === undefined ? { onSetAside } : { destination: options.destination, onSetAside };
    for (const [name, value, min] of [
      ["leaseMs", this.leaseMs, 1],
      ["concurrency", this.concurrency, 1],
      ["pollMinMs", this.pollMin, 0],
      ["pollMaxMs", this.pollMax, this.pollMin],
    ] as const) {
      if (!Number.isFinite(value) || value < min)
        throw new TypeError(`${options.who ?? "lane"}: expected ${name} >= ${min}, got ${value}`);
    }
    options.signal?.addEventListener("abort", () => void this.stop(), { once: true });
  }

  get waiting(): number {
    return this.queue.length;
  }
  get running(): number {
    return this.started;
  }
  get active(): number {
    return this.leases.size;
  }
  get gated(): boolean {
    return this.gate !== undefined;
  }
  /** isStopping is true from stop() until the lane has drained: a lease cut off now goes back unspent. */
  get isStopping(): boolean {
    return this.stopping;
  }

  /** start runs the lane; the promise settles once it has stopped and drained. Started twice, it runs once. */
  start(): Promise<void> {
    if (this.loop && this.stopping) return this.loop.then(() => this.start());
    if (this.o.signal?.aborted) this.stopping = true;
    this.loop ??= this.run().finally(() => {
      this.loop = undefined;
      this.stopping = false;
    });
    return this.loop;
  }

  /** stop sends no more claims; leases not started go back, those at work finish or are cut off after the grace. */
  stop(): Promise<void> {
    this.stopping = true;
    this.wake();
    return this.loop ?? Promise.resolve();
  }

  /**
   * hold(true) holds the lane (its destination opened or paused): waiting leases go back unstarted and it
   * looks again every heldPollMs. A claim begun after that which brings leases lets it go again.
   */
  hold(on: boolean): void {
    this.holding = on;
    if (on) this.heldAt = this.clock.now();
  }

  /**
   * persist runs one of the lane's writes through again(): a database error that passes (a deadlock, a
   * dropped connection, a server restarting) is counted, said once, and the write goes again for as long
   * as a lease lasts, the lease kept meanwhile by the heartbeat. `first` is the error of a first try the
   * caller made itself.
   */
  persist<T>(what: string, write: () => Promise<T>, lease?: Lease, first?: { error: unknown }): Promise<T> {
    const onError = (error: unknown, tries: number) => {
      this.o.report.dbError(error);
      if (tries === 1) this.o.report.retrying(what, error, lease);
    };
    return again(write, { forMs: this.leaseMs, minMs: this.pollMin, maxMs: 4 * this.pollMax, onError }, first);
  }

  // giveBack releases a lease, its attempt given back; one it cannot release runs out instead.
  private async giveBack(lease: Lease, cutOff = false): Promise<boolean> {
    try {
      const released = await this.persist(this.o.report.releasing, () => this.o.inbox.release(lease), lease);
      if (released) this.o.report.released(lease, cutOff);
      return released;
    } catch (error) {
      this.o.report.releaseFailed(lease, error);
      return false;
    } finally {
      if (!cutOff) this.leases.delete(lease);
    }
  }

  private async run(): Promise<void> {
    const { inbox } = this.o;
    const stopBeat = this.clock.every(this.o.heartbeatMs ?? Math.max(1, Math.floor(this.leaseMs / 3)), () =>
      this.beat(),
    );
    // New deliveries (PostgreSQL's NOTIFY) end an idle pause at once, unless the lane is held.
    const unwake = inbox.onWake(() => this.holding || this.due());
    try {
      await this.claimUntilStopped();
      await this.drain();
    } finally {
      // Done marks gathered when a claim failed for good go to the inbox all the same.
      this.o.batcher.flush();
      stopBeat();
      if (typeof this.gate === "function") this.gate();
      this.gate = undefined;
      unwake();
    }
  }

  // claimUntilStopped is the loop: send the done marks, claim what the sizing says, start what may start,
  // and pause when nothing came. Its only awaits are the claim and the pause: a claim's leases are started
  // and the next claim sized in the same turn, before the handlers they started have said anything.
  private async claimUntilStopped(): Promise<void> {
    this.delay = this.pollMin;
    while (!this.stopping) {
      this.startWaiting();
      const room = this.o.sizing.room(this);
      this.o.batcher.turn(room > 0, this);
      const claimedAt = this.clock.now();
      let leases: Lease[] = [];
      this.changed = false;
      if (room > 0) {
        this.claiming = true;
        try {
          leases = await this.o.inbox.claimBatch(room, this.leaseMs, this.claimOptions);
        } catch (error) {
          this.claiming = false;
          this.claimFailed(error);
          if (!this.stopping) await this.pause(this.pollMax);
          continue;
        }
        this.claiming = false;
        this.claimed(room, leases, claimedAt);
      }
      if (leases.length > 0) {
        this.delay = this.pollMin;
        continue;
      }
      // What became due while the claim was out (a probe's tally closed the breaker, a NOTIFY) the claim
      // could not see, and its wake found no pause to end: claim again rather than pause, or end a --once
      // run with work left.
      if (this.changed && !this.stopping) continue;
      if (this.o.once && this.leases.size === 0) return;
      // A stop that came while the claim was out found no pause to end: it must not wait for one.
      if (this.stopping) return;
      // Idle: back off up to pollMax, but a freed place, a done mark or a stop wakes the loop at once.
      await this.pause(this.holding ? this.heldPoll : room > 0 ? this.delay : this.pollMax);
      if (room > 0) this.delay = Math.min(this.pollMax, Math.max(1, this.delay * 2));
    }
  }

  // claimFailed says a failed claim once. A full disk or a lock held too long passes: a long-running lane
  // waits it out rather than dying with its work in flight. Run once, it reports the error instead.
  private claimFailed(error: unknown): void {
    this.o.report.dbError(error);
    if (this.o.once) throw error;
    if (!this.claimFailing) this.o.report.claimFailing(error);
    this.claimFailing = true;
  }

  // claimed takes a claim's leases in and starts what may start.
  private claimed(room: number, leases: Lease[], claimedAt: number): void {
    this.o.sizing.claimed(room, leases.length, this.clock.now() - claimedAt, claimedAt);
    if (this.claimFailing) this.o.report.claimingAgain();
    this.claimFailing = false;
    if (leases.length > 0 && claimedAt > this.heldAt) this.hold(false);
    for (const lease of leases) {
      this.leases.set(lease, new AbortController());
      this.o.report.claimed(lease);
      this.queue.push(lease);
    }
    this.startWaiting();
  }

  // beat extends every held lease; one found taken has its executor's signal aborted.
  private beat(): void {
    for (const [lease, controller] of this.leases) {
      this.o.inbox.extend(lease, this.leaseMs).then(
        (held) => {
          if (!held && !controller.signal.aborted) controller.abort(new Error("the lease was lost"));
        },
        (error: unknown) => {
          this.o.report.dbError(error);
          this.o.report.extendFailed(lease, error);
        },
      );
    }
  }

  // pause waits ms on the clock; wake() ends it early.
  private pause(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const cancel = this.clock.after(ms, resolve);
      this.resume = () => {
        cancel();
        resolve();
      };
    });
  }

  private wake(): void {
    this.resume();
  }

  /** poke ends the lane's pause early: a place freed, a mark was added. */
  poke(): void {
    this.wake();
  }

  /**
   * due says that deliveries may have become due that a claim already out could not see (the breaker
   * closed, new ones were stored): the pause ends, and an empty claim in flight is followed by another.
   */
  due(): void {
    this.changed = true;
    this.wake();
  }

  // startWaiting starts what the free places (and a permit, if the lane asks for one) allow.
  private startWaiting(): void {
    // Leases claimed before the lane was held go back untouched, their attempt given back.
    if (this.holding) for (const lease of this.queue.splice(0)) void this.giveBack(lease);
    const want = Math.min(this.concurrency - this.started, this.queue.length);
    if (this.claiming && this.queue.length === 0 && this.started < this.concurrency) this.o.sizing.starved?.();
    if (want <= 0 || this.stopping || this.gate !== undefined) return;
    if (!this.o.permit) {
      // An executor may free its place before begin() returns, and start the next from within it.
      while (this.started < this.concurrency && this.queue.length > 0 && !this.stopping)
        this.begin(this.queue.shift()!);
      return;
    }
    // Asked at the end of this turn of the event loop, so that every place freed in it (answers come in
    // together) joins one wave: one read for them all rather than one each.
    this.gate = "asking";
    setImmediate(() => this.ask());
  }

  private ask(): void {
    const want = Math.min(this.concurrency - this.started, this.queue.length);
    if (want <= 0 || this.holding || this.stopping) {
      this.gate = undefined;
      this.startWaiting();
      return;
    }
    this.o.permit!(want).then(
      (permit) => {
        this.gate = undefined;
        if (permit === undefined) {
          this.later(this.pollMax);
          return;
        }
        if (permit.paused) this.hold(true);
        for (let i = 0; i < permit.granted && this.queue.length > 0 && !this.holding && !this.stopping; i++)
          this.begin(this.queue.shift()!);
        if (permit.granted < want && !permit.paused) this.later(permit.waitMs);
        this.startWaiting();
      },
      () => {
        this.gate = undefined;
        this.later(this.pollMax);
      },
    );
  }

  private later(ms: number): void {
    this.gate = this.clock.after(ms, () => {
      this.gate = undefined;
      this.startWaiting();
    });
  }

  // begin starts a lease on the executor. Its place is freed once, by the executor or at the latest when
  // it settles; the lease is let go when it settles.
  private begin(lease: Lease): void {
    const controller = this.leases.get(lease)!;
    this.started++;
    let freed = false;
    const free = () => {
      if (freed) return;
      freed = true;
      this.started--;
      this.startWaiting();
      this.wake();
    };
    // Not finally(): its extra turns would let a `--once` run's last claim see this lease still held. An
    // executor that rejects broke its contract: the rejection goes on, unhandled, as it would have.
    const settled = () => {
      free();
      this.o.report.settled?.(lease);
      this.leases.delete(lease);
      this.wake();
    };
    void this.o.execute(lease, { signal: controller.signal, free, lane: this }).then(settled, (error: unknown) => {
      settled();
      throw error;
    });
  }

  // drain gives back what has not started and gives the rest the grace period; what outlives it is cut
  // off, and given back or waited for (LaneOptions.cutOff). Done marks keep going out meanwhile.
  private async drain(): Promise<void> {
    const { batcher } = this.o;
    await Promise.all(this.queue.splice(0).map((lease) => this.giveBack(lease)));
    const deadline = this.clock.now() + (this.o.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs);
    while (this.leases.size > 0 && this.clock.now() < deadline) {
      batcher.flush();
      await this.pause(this.pollMax);
    }
    // What finished meanwhile has its done mark sent before the rest go back.
    batcher.flush();
    if ((this.o.cutOff ?? "give back") === "give back") {
      for (const [lease, controller] of [...this.leases]) {
        controller.abort(new Error("the worker is stopping"));
        this.o.report.cutOff?.(lease);
        await this.giveBack(lease, true);
      }
    } else {
      for (const controller of this.leases.values()) controller.abort(new Error("the worker is stopping"));
      while (this.leases.size > 0) {
        batcher.flush();
        await this.pause(this.pollMax);
      }
    }
    batcher.flush();
    await this.o.drained?.();
  }
}
