// lease/batcher.ts: the done marks of a lane, sent to the inbox in batches. Every commit costs a sync to
// disk (on SQLite one that holds the event loop), so one should serve many leases; the lane says when a
// claim is about to go out, and the marks go with it. How long they may wait is the lane's policy.

import type { Inbox, Lease, LocalWrite } from "../store.ts";
import type { Clock } from "./clock.ts";
import type { LaneView, Marks } from "./lane.ts";

/** BatcherOptions says when a lane's done marks go out. */
export interface BatcherOptions {
  inbox: Inbox;
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
  /** Told of every mark added: the lane wakes, to send it. @default none */
  onAdded?: () => void;
  /** Told of every batch settled: the lane wakes, to claim or send the next. @default none */
  onSettled?: () => void;
}

/** Sent is a done mark on its way: `finished` settles as inbox.finish does. */
export interface Sent {
  finished: Promise<boolean>;
}

interface Mark {
  lease: Lease;
  writes: readonly LocalWrite[] | undefined;
  sent: (sent: Sent) => void;
}

/**
 * Batcher gathers done marks and sends them together: at the lane's turn before a claim (which takes
 * them into its own transaction on SQLite), when its policy stops holding them, or on flush().
 */
export class Batcher implements Marks {
  private readonly options: BatcherOptions;
  private marks: Mark[] = [];
  private firstAt = 0;
  private sending = 0;
  private cancelTimer: (() => void) | undefined;

  constructor(options: BatcherOptions) {
    this.options = options;
  }

  /**
   * add gathers a lease's done mark, with the writes that commit with it. It settles once the mark has
   * gone to the inbox, with `finished`, which settles as inbox.finish does: true if the lease was still
   * held and the delivery is done. A caller awaits `finished` itself, so that the mark's outcome reaches
   * it in the very turn the commit does (a `--once` run's last claim then finds nothing left in flight).
   */
  add(lease: Lease, writes?: readonly LocalWrite[]): Promise<Sent> {
    const { clock, longestMs, onAdded } = this.options;
    return new Promise<Sent>((sent) => {
      if (this.marks.length === 0) this.firstAt = clock.now();
      this.marks.push({ lease, writes, sent });
      if (longestMs !== undefined) this.cancelTimer ??= clock.after(longestMs, () => this.flush());
      onAdded?.();
    });
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
    const { inbox, oneAtATime, onSettled } = this.options;
    // Only a policy that waits on the batch in flight, or a lane told when it settles, pays to follow it.
    const follow = oneAtATime || onSettled !== undefined;
    let left = batch.length;
    if (follow) this.sending++;
    const settled = () => {
      if (--left > 0) return;
      this.sending--;
      onSettled?.();
    };
    for (const m of batch) {
      let finished: Promise<boolean>;
      try {
        finished = inbox.finish(m.lease, m.writes);
      } catch (error) {
        finished = Promise.reject(error);
      }
      if (follow) finished.then(settled, settled);
      m.sent({ finished });
    }
  }
}
