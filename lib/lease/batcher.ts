// lease/batcher.ts: the done marks of a lane, sent to the inbox in batches. Every commit costs a sync to
// disk (on SQLite one that holds the event loop), so one should serve many leases; the lane says when a
// claim is about to go out, and the marks go with it. How long they may wait is the lane's policy. Its
// finish() is inbox.finish()'s call, so the settler (settler.ts) never knows whether a mark is batched.

import type { Inbox, Lease, LocalWrite, Try } from "../store.ts";
import type { Clock } from "./clock.ts";
import type { LaneView, Marks } from "./lane.ts";

/** BatcherOptions says when a lane's done marks go out. */
export interface BatcherOptions {
  /** Where the marks go. */
  inbox: Pick<Inbox, "finish">;
  clock: Clock;
  /**
   * hold says, at a turn of the lane that sends no claim, whether the gathered marks may wait for a later
   * one: `count` of them, the first `ageMs` old. @default never: they go at the next turn
   */
  hold?: (count: number, ageMs: number, lane: LaneView) => boolean;
  /**
   * Whether a turn that sends no claim waits for the batch in flight before it sends another: where a
   * claim commits beside the marks rather than with them (PostgreSQL), they gain nothing by waiting for
   * it, but each batch is still a commit. @default false
   */
  oneAtATime?: boolean;
  /** Longest the first mark waits: a timer sends the batch after this long. @default no timer */
  longestMs?: number;
  /** Told of every mark added and every batch settled: the lane wakes, to send them or the next batch. @default none */
  wake?: () => void;
}

interface Mark {
  lease: Lease;
  writes: readonly LocalWrite[] | undefined;
  attempt: Try | undefined;
  resolve: (held: boolean) => void;
  reject: (error: unknown) => void;
}

/**
 * Batcher gathers done marks and sends them together: at the lane's turn before a claim (which takes
 * them into its own transaction on SQLite), when its policy stops holding them, or on flush().
 */
export class Batcher implements Marks, Pick<Inbox, "finish"> {
  private readonly options: BatcherOptions;
  private marks: Mark[] = [];
  private firstAt = 0;
  private sending = 0;
  private cancelTimer: (() => void) | undefined;

  constructor(options: BatcherOptions) {
    this.options = options;
  }

  /**
   * finish gathers a lease's done mark, with the writes and the try that commit with it, and settles as inbox.finish
   * does once the mark has gone to the inbox in a batch: true if the lease was still held and the delivery
   * is done.
   */
  finish(lease: Lease, writes?: readonly LocalWrite[], attempt?: Try): Promise<boolean> {
    const { clock, longestMs, wake } = this.options;
    return new Promise<boolean>((resolve, reject) => {
      if (this.marks.length === 0) this.firstAt = clock.now();
      this.marks.push({ lease, writes, attempt, resolve, reject });
      if (longestMs !== undefined) this.cancelTimer ??= clock.after(longestMs, () => this.flush());
      wake?.();
    });
  }

  /** gathered is how many marks wait to be sent. */
  get gathered(): number {
    return this.marks.length;
  }

  /** turn is the lane's moment before a claim: the marks go with it, or, with none, unless the policy holds them. */
  turn(claiming: boolean, lane: LaneView): void {
    const { hold, oneAtATime, clock } = this.options;
    const wait =
      this.marks.length > 0 &&
      !claiming &&
      ((oneAtATime && this.sending > 0) || hold?.(this.marks.length, clock.now() - this.firstAt, lane));
    if (!wait) this.flush();
  }

  /** flush sends every gathered mark now. */
  flush(): void {
    this.cancelTimer?.();
    this.cancelTimer = undefined;
    if (this.marks.length === 0) return;
    const batch = this.marks.splice(0);
    const { inbox, oneAtATime, wake } = this.options;
    // Only a policy that waits on the batch in flight, or a lane woken when it settles, pays to follow it.
    const follow = oneAtATime || wake !== undefined;
    let left = batch.length;
    if (follow) this.sending++;
    const settled = () => {
      if (--left > 0) return;
      this.sending--;
      wake?.();
    };
    for (const m of batch) {
      let finished: Promise<boolean>;
      try {
        finished = inbox.finish(m.lease, m.writes, m.attempt);
      } catch (error) {
        finished = Promise.reject(error);
      }
      finished.then(m.resolve, m.reject);
      if (follow) finished.then(settled, settled);
    }
  }
}
