// lease/sizing.ts: how much a lane claims at once, the two policies the lanes use. A handler lane sizes
// its claims by how long handlers and claims take (HandlerSizing, run() in worker.ts); a destination's
// lane claims ahead of its request slots (AheadSizing, forwarding/forwarder.ts).

import type { LaneView, Sizing } from "./lane.ts";

// Fast handlers claim ahead this many ms of their own work per handler slot, or CLAIM_SHARE times a
// claim's own time if that is more.
const CLAIM_AHEAD_MS = 5;
const CLAIM_SHARE = 10;

/**
 * HandlerSizing claims by how long handlers take (a moving average). Fast ones share claims of up to
 * claimBatch, so one commit serves many; slow ones claim only what the free handlers can start, as no
 * worker should hoard leases it cannot work on. It starts slow, so the first claim is never more than
 * concurrency. A claim brings at least CLAIM_SHARE times its own time (its commit included) in work for
 * each handler's place: where a commit's fsync is slow, a claim sized by the handlers alone would cost
 * the worker as much as the work it brings.
 */
export class HandlerSizing implements Sizing {
  private readonly concurrency: number;
  private readonly claimBatch: number;
  private readonly ahead: boolean;
  private handlerMs = Infinity;
  private claimMs = 0;

  /**
   * With `ahead`, fast handlers' next claim goes out while the last one's leases still wait to start: for
   * a store whose claim waits on the network (PostgreSQL), not one whose claim holds the thread that runs
   * the handlers (SQLite), where it would only take the leases sooner.
   */
  constructor(concurrency: number, claimBatch: number, ahead = false) {
    this.concurrency = concurrency;
    this.claimBatch = Math.max(concurrency, claimBatch);
    this.ahead = ahead;
  }

  /** ran learns how long a handler took, in ms. */
  ran(ms: number): void {
    this.handlerMs = this.handlerMs === Infinity ? ms : this.handlerMs * 0.9 + ms * 0.1;
  }

  // size is the claim's target: a batch's worth for fast handlers, the handlers' worth for slow ones.
  private size(): number {
    const { concurrency, claimBatch, claimMs, handlerMs } = this;
    return Math.max(
      concurrency,
      Math.min(claimBatch, Math.floor((concurrency * Math.max(CLAIM_AHEAD_MS, CLAIM_SHARE * claimMs)) / handlerMs)),
    );
  }

  /**
   * room claims when everything claimed has started: a batch's worth for fast handlers, the free
   * handlers' worth for slow ones, but never more than a second batch of leases waiting on their commit.
   * Claiming ahead, fast handlers' next batch goes out while the last one still waits to start, once what
   * waits is less work than a claim takes, so the handlers never stand idle through a claim (on PostgreSQL
   * a claim of 256 took 10–20 ms, a third of a drain's time); then up to three batches are held (one at
   * work, one claimed ahead, one whose done marks commit), and it claims nothing rather than a sliver of a
   * batch: 54 of a 50k drain's 251 claims were of 8, each costing what a claim of 256 costs.
   */
  room(lane: LaneView): number {
    const size = this.size();
    if (!this.ahead || size <= this.concurrency) {
      if (lane.waiting > 0) return 0;
      return Math.min(size - (size > this.concurrency ? 0 : lane.running), 2 * size - lane.active);
    }
    const ahead = (lane.waiting * this.handlerMs) / this.concurrency;
    if (lane.waiting > 0 && ahead > Math.max(CLAIM_AHEAD_MS, this.claimMs)) return 0;
    return this.full(lane) ? 0 : Math.min(size, 3 * size - lane.active);
  }

  /**
   * full says whether fast handlers' lane holds all the leases it may: its next claim waits for done marks
   * to commit, so they should not wait for that claim.
   */
  full(lane: LaneView): boolean {
    const size = this.size();
    return this.ahead && size > this.concurrency && (3 * size - lane.active) * 2 < size;
  }

  /** claimed learns how long a claim took, its commit included. */
  claimed(_asked: number, _got: number, tookMs: number): void {
    this.claimMs = this.claimMs * 0.9 + tookMs * 0.1;
  }
}

/**
 * AheadSizing claims ahead of a destination's request slots: a claim goes out when fewer than half of
 * `ahead` leases wait for a slot, and takes enough for `ahead` to wait again, so one claim (one
 * transaction, with the done marks gathered since) serves many forwards and the slots never wait for a
 * claim. `ahead` is at least two lanes' worth (every slot may free up while a claim commits) and doubles,
 * up to `most`, when the lane ran dry while a claim was out (a PostgreSQL claim takes round trips and a
 * commit) or when claims took more than a quarter of the lane's time (each is a sync to disk, on SQLite
 * one that holds the event loop); it halves again when they take less than a sixteenth.
 */
export class AheadSizing implements Sizing {
  /** ahead is how many leases the lane keeps waiting for a slot. */
  ahead: number;
  /** claimTook is how long the last claim took, in ms. */
  claimTook = 0;
  private readonly max: number;
  private readonly most: number;
  private dry = false;
  private lastClaimAt = 0;

  /** A lane with `max` request slots claims up to `most` ahead. */
  constructor(max: number, most: number) {
    this.max = max;
    this.most = most;
    this.ahead = 2 * max;
  }

  /** room is what a claim takes now, or 0 while enough leases wait for a slot. */
  room(lane: LaneView): number {
    const held = lane.waiting + lane.running;
    if (held !== 0 && lane.waiting >= this.ahead / 2) return 0;
    this.dry = false;
    return this.ahead + this.max - held;
  }

  /** starved: a slot was free with nothing to start while a claim was out. */
  starved(): void {
    this.dry = true;
  }

  /** claimed doubles or halves `ahead` by how long the claim took against the time since the last one. */
  claimed(asked: number, got: number, tookMs: number, at: number): void {
    this.claimTook = tookMs;
    const cycle = at - this.lastClaimAt;
    this.lastClaimAt = at;
    if (got === asked && (this.dry || tookMs > cycle / 4)) this.ahead = Math.min(this.most, 2 * this.ahead);
    else if (!this.dry && tookMs < cycle / 16) this.ahead = Math.max(2 * this.max, Math.floor(this.ahead / 2));
  }
}
