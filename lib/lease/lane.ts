// lease/lane.ts: the lease loop, built once. A lane claims deliveries under a lease, starts each on its
// executor (the worker's handler, an HTTP forward, a broker publish), keeps every lease alive with one
// heartbeat, hands what each executor returns to its settler (settler.ts), and when it stops gives back
// what has not started and drains what has. run() in worker.ts is one lane; forwarding/forwarder.ts runs
// one per destination. See docs/reliability.md.

import { DEFAULTS } from "../defaults.ts";
import type { ClaimOptions, Inbox, Lease, SetAside } from "../store.ts";
import { type Clock, realClock } from "./clock.ts";
import {
  type LaneEvent,
  type LaneListener,
  type Released,
  type Settlement,
  Settler,
  type Settling,
} from "./settler.ts";

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
  /** ran learns how long an executor took to return, in ms. */
  ran?(ms: number): void;
}

/** Marks is what a lane asks of its done marks' batcher (batcher.ts), beside the finish() its settler calls. */
export interface Marks extends Pick<Inbox, "finish"> {
  /** How many marks are gathered, not yet sent. */
  readonly gathered: number;
  /** turn is the lane's moment before a claim: the marks go with it, or wait as the batcher's policy says. */
  turn(claiming: boolean, lane: LaneView): void;
  /** flush sends every gathered mark now. */
  flush(): void;
}

/** Running is what an executor gets beside its lease. */
export interface Running {
  /** Aborted when the lease is lost (the heartbeat found it taken) or when a stopping lane gives up waiting. */
  signal: AbortSignal;
}

/**
 * Executor runs one lease and says what it came to; it never touches the lane or the store, and never
 * rejects (one that does broke its contract: its lease runs out, and the rejection goes on, unhandled).
 */
export type Executor<S extends Settlement = Settlement> = (lease: Lease, running: Running) => Promise<S>;

/** Permit is how many of the leases asked for may start now, and when to ask again for the rest. */
export interface Permit {
  granted: number;
  waitMs: number;
  /** The destination was paused: the lane holds (LaneOptions.permit). */
  paused: boolean;
}

/**
 * Wake is why a lane stops pausing, through wake(), its one way in:
 * - "freed": a place freed or a lease was let go: what waits may start, a claim may have room, a --once
 *   run or a drain may be over;
 * - "marks": a done mark was added or a batch of them settled: the next turn sends them, or the next batch;
 * - "due": deliveries may have become due that a claim already out cannot see (a settlement put one back
 *   or ended one of an order key, PostgreSQL's NOTIFY of new ones, a breaker closed): an empty claim is
 *   followed by another rather than a pause, or the end of a --once run;
 * - "stop": stop() was called.
 * Wakes are counted, not flags: a pause ends at once if the lane was woken since the moment it waits from,
 * so a wake that comes while no pause is waiting is never lost to timing.
 */
export type Wake = "freed" | "marks" | "due" | "stop";

/** LaneState is where a lane is in its life: stopped (not started, or drained), running, or stopping (draining). */
export type LaneState = "stopped" | "running" | "stopping";

/** LaneOptions are the parts a lane is built from; every number has a default in DEFAULTS. */
export interface LaneOptions<S extends Settlement = Settlement> {
  inbox: Inbox;
  /** What runs a lease: the handler, a forward, a publish. */
  execute: Executor<NoInfer<S>>;
  /** How much to claim. */
  sizing: Sizing;
  /** How done marks are batched (a Batcher, batcher.ts); the lane calls its turn() before each claim it may send. */
  batcher: Marks;
  /** Told of each lease settled (one event each), of each claimed, and of the database errors met. */
  listener: LaneListener<S>;
  /**
   * How long a lease that did not end done keeps its place: until its executor returned (a handler), or
   * until it is settled and reported (a forward: the breaker counts a failure before the next forward
   * goes out to a destination that may just have opened). @default "returned"
   */
  placeUntil?: "returned" | "settled";
  /** How an error the settler makes a failure of is said (a done mark the store refused). @default its message */
  describe?: (error: unknown) => string;
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
  /** The destination whose deliveries to claim, and which a held settlement pauses. @default the inbox's default */
  destination?: string;
  /**
   * Asked before each wave of starts, at the end of the turn in which places freed, so that they all
   * join one wave; one that fails is reported, and the lane asks again after pollMaxMs.
   * @default none: leases start as places free
   */
  permit?: (want: number) => Promise<Permit>;
  /**
   * What a stop does with an executor that outlives the grace period, once its signal is aborted: give
   * its lease back at once (a handler may never return), or wait for the executor, whose retry then goes
   * back unspent (a forward ends when its request is cut off). @default "give back"
   */
  cutOff?: "give back" | "wait";
  /** Run once the lane has drained, before start()'s promise settles (a last tally, a flush). @default none */
  drained?: () => Promise<void>;
}

// Held is one lease the lane holds, from its claim until it is settled: waiting for a place, running on
// its executor, cut off by a stop (its executor told to end), given back by a stop while its executor ran
// on, or settling (its executor returned, its settlement being written).
interface Held {
  state: "waiting" | "running" | "cut off" | "given back" | "settling";
  controller: AbortController;
  began: number;
}

/**
 * Lane is one lease loop: claim, start, heartbeat, settle, give back, drain. start() runs it until stop()
 * (or the signal, or `once` with nothing left); it may be started again after, and no lease is lost or
 * held twice across a stop and a start.
 */
export class Lane<S extends Settlement = Settlement> implements LaneView {
  private readonly o: LaneOptions<S>;
  private readonly settler: Settler<S>;
  private readonly clock: Clock;
  private readonly concurrency: number;
  private readonly leaseMs: number;
  private readonly pollMin: number;
  private readonly pollMax: number;
  private readonly heldPoll: number;
  private readonly claimOptions: ClaimOptions;
  private readonly leases = new Map<Lease, Held>();
  private readonly queue: Lease[] = [];
  private life: LaneState = "stopped";
  private step: "turning" | "claiming" | "pausing" = "turning";
  private claims: "working" | "failing" = "working";
  // Starts wait while a permit is asked, or for the timer before the next ask (cancelGate cancels it).
  private gate: "open" | "asking" | "waiting" = "open";
  private cancelGate: () => void = () => {};
  // When the lane was last held (its destination opened or paused); undefined while it is not.
  private heldSince: number | undefined;
  // How many wakes have come, and which of them last said "due"; a pause ends once a wake comes after the
  // count it waits from.
  private woken = 0;
  private dueAt = 0;
  private resume: (() => void) | undefined;
  private taken = 0;
  private delay: number;
  private loop: Promise<void> | undefined;

  constructor(options: LaneOptions<S>) {
    this.o = options;
    this.clock = options.clock ?? realClock;
    this.concurrency = options.concurrency ?? DEFAULTS.concurrency;
    this.leaseMs = options.leaseMs ?? DEFAULTS.leaseMs;
    this.pollMin = options.pollMinMs ?? DEFAULTS.pollMinMs;
    this.pollMax = options.pollMaxMs ?? DEFAULTS.pollMaxMs;
    this.delay = this.pollMin;
    this.heldPoll = Math.max(this.pollMax, options.heldPollMs ?? 0);
    const onSetAside = (deliveries: SetAside[]) => this.report({ type: "set aside", deliveries });
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
    this.settler = new Settler<S>({
      inbox: options.inbox,
      marks: options.batcher,
      listener: options.listener,
      ...(options.destination === undefined ? {} : { destination: options.destination }),
      ...(options.describe ? { describe: options.describe } : {}),
      forMs: this.leaseMs,
      minMs: this.pollMin,
      maxMs: 4 * this.pollMax,
    });
    options.signal?.addEventListener("abort", () => void this.stop(), { once: true });
  }

  get waiting(): number {
    return this.queue.length;
  }
  get running(): number {
    return this.taken;
  }
  get active(): number {
    return this.leases.size;
  }
  get gated(): boolean {
    return this.gate !== "open";
  }
  /** state is where the lane is in its life. */
  get state(): LaneState {
    return this.life;
  }

  /** start runs the lane; the promise settles once it has stopped and drained. Started twice, it runs once. */
  start(): Promise<void> {
    if (this.loop && this.life === "stopping") return this.loop.then(() => this.start());
    if (this.loop) return this.loop;
    this.life = this.o.signal?.aborted ? "stopping" : "running";
    this.loop = this.run().finally(() => {
      this.loop = undefined;
      this.life = "stopped";
    });
    return this.loop;
  }

  /** stop sends no more claims; leases not started go back, those at work finish or are cut off after the grace. */
  stop(): Promise<void> {
    if (this.life === "running") this.life = "stopping";
    this.wake("stop");
    return this.loop ?? Promise.resolve();
  }

  /**
   * hold(true) holds the lane (its destination opened or paused): waiting leases go back unstarted and it
   * looks again every heldPollMs. A claim begun after that which brings leases lets it go again.
   */
  hold(on: boolean): void {
    this.heldSince = on ? this.clock.now() : undefined;
  }

  /** wake ends the lane's pause, for one of the reasons Wake lists. */
  wake(reason: Wake): void {
    this.woken++;
    if (reason === "due") this.dueAt = this.woken;
    this.resume?.();
  }

  private report(event: LaneEvent<S>): void {
    void this.o.listener(event);
  }

  private async run(): Promise<void> {
    const { inbox } = this.o;
    const stopBeat = this.clock.every(this.o.heartbeatMs ?? Math.max(1, Math.floor(this.leaseMs / 3)), () =>
      this.beat(),
    );
    // New deliveries (PostgreSQL's NOTIFY) end an idle pause at once, unless the lane is held.
    const unwake = inbox.onWake(() => this.heldSince !== undefined || this.wake("due"));
    try {
      await this.claimUntilStopped();
      await this.drain();
    } finally {
      // Done marks gathered when a claim failed for good go to the inbox all the same.
      this.o.batcher.flush();
      stopBeat();
      this.cancelGate();
      this.gate = "open";
      unwake();
    }
  }

  // claimUntilStopped is the loop: send the done marks, claim what the sizing says, start what may start,
  // and pause when nothing came. It awaits only the claim and its pauses: a claim's leases are started and
  // the next claim sized in the same turn, before the executors they started have said anything.
  private async claimUntilStopped(): Promise<void> {
    this.delay = this.pollMin;
    while (this.life === "running") {
      // What woke the lane before this turn is seen by it: its starts, its sizing, its claim.
      const turn = this.woken;
      this.startWaiting();
      const room = this.o.sizing.room(this);
      this.o.batcher.turn(room > 0, this);
      const got = room > 0 ? await this.claim(room) : 0;
      if (got === undefined) {
        // Only what comes during the pause ends it: a database that fails is not asked again at once.
        if (this.life === "running") await this.pause(this.pollMax, this.woken);
        continue;
      }
      if (got > 0) {
        this.delay = this.pollMin;
        continue;
      }
      if (this.o.once && room > 0 && (await this.nothingLeft(turn))) return;
      // Something became due that the claim could not see (Wake "due"): claim again rather than pause.
      if (this.dueAt > turn) continue;
      if (this.life !== "running") return;
      // Idle: back off up to pollMax; a wake since this turn began (a freed place, a done mark, a stop) ends it at once.
      await this.pause(this.heldSince !== undefined ? this.heldPoll : room > 0 ? this.delay : this.pollMax, turn);
      if (room > 0) this.delay = Math.min(this.pollMax, Math.max(1, this.delay * 2));
    }
  }

  // nothingLeft says whether a --once run whose claim came back empty may end: once every lease it holds is
  // settled, unless one of them (or a NOTIFY) said something became due since the turn began, which that
  // claim could not see. While an executor still runs, or a done mark waits to go with a claim, the run
  // goes on claiming as it would.
  private async nothingLeft(turn: number): Promise<boolean> {
    const settling = () =>
      this.o.batcher.gathered === 0 && [...this.leases.values()].every((held) => held.state === "settling");
    while (this.leases.size > 0 && this.dueAt <= turn && this.life === "running" && settling())
      await this.pause(this.pollMax, this.woken);
    return this.leases.size === 0 && this.dueAt <= turn;
  }

  // claim sends one claim and takes its leases in; undefined when it failed.
  private async claim(room: number): Promise<number | undefined> {
    const at = this.clock.now();
    let leases: Lease[];
    this.step = "claiming";
    try {
      leases = await this.o.inbox.claimBatch(room, this.leaseMs, this.claimOptions);
    } catch (error) {
      this.step = "turning";
      this.claimFailed(error);
      return undefined;
    }
    this.step = "turning";
    this.o.sizing.claimed(room, leases.length, this.clock.now() - at, at);
    if (this.claims === "failing") this.report({ type: "claiming again" });
    this.claims = "working";
    if (leases.length > 0 && this.heldSince !== undefined && at > this.heldSince) this.hold(false);
    for (const lease of leases) {
      this.leases.set(lease, { state: "waiting", controller: new AbortController(), began: 0 });
      this.report({ type: "claimed", lease });
      this.queue.push(lease);
    }
    this.startWaiting();
    return leases.length;
  }

  // claimFailed says a failed claim once. A full disk or a lock held too long passes: a long-running lane
  // waits it out rather than dying with its work in flight. Run once, it throws the error instead.
  private claimFailed(error: unknown): void {
    this.report({ type: "claim failed", error, first: !this.o.once && this.claims === "working" });
    if (this.o.once) throw error;
    this.claims = "failing";
  }

  // beat extends every held lease; one found taken has its executor's signal aborted.
  private beat(): void {
    for (const [lease, { controller }] of this.leases) {
      this.o.inbox.extend(lease, this.leaseMs).then(
        (held) => {
          if (!held && !controller.signal.aborted) controller.abort(new Error("the lease was lost"));
        },
        (error: unknown) => this.report({ type: "extend failed", lease, error }),
      );
    }
  }

  // pause waits ms on the clock; it ends at once if the lane was woken after `since` (a count of wakes), or when woken.
  private pause(ms: number, since: number): Promise<void> {
    if (this.woken > since) return Promise.resolve();
    this.step = "pausing";
    return new Promise<void>((resolve) => {
      const end = () => {
        cancel();
        this.resume = undefined;
        this.step = "turning";
        resolve();
      };
      const cancel = this.clock.after(ms, end);
      this.resume = end;
    });
  }

  // startWaiting starts what the free places (and a permit, if the lane asks for one) allow.
  private startWaiting(): void {
    // Leases claimed before the lane was held go back untouched, their attempt given back.
    if (this.heldSince !== undefined) for (const lease of this.queue.splice(0)) void this.giveBack(lease);
    const want = Math.min(this.concurrency - this.taken, this.queue.length);
    if (this.step === "claiming" && this.queue.length === 0 && this.taken < this.concurrency) this.o.sizing.starved?.();
    if (want <= 0 || this.life !== "running" || this.gate !== "open") return;
    if (!this.o.permit) {
      while (this.taken < this.concurrency && this.queue.length > 0) this.begin(this.queue.shift()!);
      return;
    }
    // Asked at the end of this turn of the event loop, so that every place freed in it (answers come in
    // together) joins one wave: one read for them all rather than one each.
    this.gate = "asking";
    setImmediate(() => this.ask());
  }

  private ask(): void {
    const want = Math.min(this.concurrency - this.taken, this.queue.length);
    if (want <= 0 || this.heldSince !== undefined || this.life !== "running") {
      this.gate = "open";
      this.startWaiting();
      return;
    }
    this.settler
      .persist("ask for a permit", () => this.o.permit!(want))
      .then(
        (permit) => {
          this.gate = "open";
          if (permit.paused) this.hold(true);
          for (
            let i = 0;
            i < permit.granted && this.queue.length > 0 && this.heldSince === undefined && this.life === "running";
            i++
          )
            this.begin(this.queue.shift()!);
          if (permit.granted < want && !permit.paused) this.later(permit.waitMs);
          this.startWaiting();
        },
        (error: unknown) => {
          this.report({ type: "permit failed", error });
          this.later(this.pollMax);
        },
      );
  }

  private later(ms: number): void {
    this.gate = "waiting";
    this.cancelGate = this.clock.after(ms, () => {
      this.gate = "open";
      this.startWaiting();
    });
  }

  // free gives a lease's place back, and starts what waits for one.
  private free(): void {
    this.taken--;
    this.startWaiting();
    this.wake("freed");
  }

  // begin starts a lease on the executor; what it returns is settled, unless a stop gave the lease back meanwhile.
  private begin(lease: Lease): void {
    const held = this.leases.get(lease)!;
    held.state = "running";
    held.began = this.clock.now();
    this.taken++;
    this.o.execute(lease, { signal: held.controller.signal }).then(
      (settlement) => {
        const ran = this.clock.now() - held.began;
        this.o.sizing.ran?.(ran);
        if (held.state === "given back") return this.free();
        const cutOff = held.state === "cut off";
        held.state = "settling";
        // A lease that ended done frees its place now, before its mark is written; the rest as placeUntil says.
        const keep = settlement.kind !== "done" && this.o.placeUntil === "settled";
        if (!keep) this.free();
        void this.settle(lease, settlement, { ran, cutOff, aborted: held.controller.signal.aborted }, keep);
      },
      (error: unknown) => {
        this.free();
        this.leases.delete(lease);
        throw error;
      },
    );
  }

  // settle hands a lease's settlement to the settler, which writes and reports it; then the lease is let
  // go, in the same step as the wake that says whether it made something due, so a --once run that ends
  // on an empty claim has seen every settlement that claim could not.
  private settle(lease: Lease, settlement: S | Released, how: Settling, keepsPlace = false): Promise<void> {
    // Held before the lease goes back, so that no claim of this lane starts the deliveries that wait with it.
    if (settlement.kind === "held") this.hold(true);
    const letGo = (due: boolean) => {
      if (keepsPlace) this.free();
      this.leases.delete(lease);
      this.wake(due ? "due" : "freed");
    };
    return this.settler.settle(lease, settlement, how).then(
      (settled) => letGo(settled.due),
      (error: unknown) => {
        // A listener that threw broke its contract: the lease is let go all the same, and the error goes on.
        letGo(false);
        throw error;
      },
    );
  }

  // giveBack releases a lease not started, its attempt given back.
  private giveBack(lease: Lease): Promise<void> {
    return this.settle(lease, { kind: "released" }, { cutOff: false, aborted: false });
  }

  // drain gives back what has not started and gives the rest the grace period; what outlives it is cut
  // off, and given back or waited for (LaneOptions.cutOff). Done marks keep going out meanwhile.
  private async drain(): Promise<void> {
    const { batcher } = this.o;
    await Promise.all(this.queue.splice(0).map((lease) => this.giveBack(lease)));
    const deadline = this.clock.now() + (this.o.shutdownGraceMs ?? DEFAULTS.shutdownGraceMs);
    await this.settled(() => this.clock.now() < deadline, deadline);
    // What finished meanwhile has its done mark sent before the rest go back.
    batcher.flush();
    const cutOff: Promise<void>[] = [];
    for (const [lease, held] of this.leases) {
      if (held.state !== "running") continue;
      held.controller.abort(new Error("the worker is stopping"));
      if ((this.o.cutOff ?? "give back") === "wait") held.state = "cut off";
      else {
        held.state = "given back";
        cutOff.push(this.settle(lease, { kind: "released" }, { cutOff: true, aborted: true }));
      }
    }
    await Promise.all(cutOff);
    // What was settling, and (cutOff "wait") what was cut off, ends on its own.
    await this.settled(() => true);
    batcher.flush();
    await this.o.drained?.();
  }

  // settled waits, sending done marks meanwhile, until every lease is let go or `more` says to stop waiting.
  private async settled(more: () => boolean, deadline = Infinity): Promise<void> {
    while (this.leases.size > 0 && more()) {
      const since = this.woken;
      this.o.batcher.flush();
      await this.pause(Math.min(this.pollMax, deadline - this.clock.now()), since);
    }
  }
}
