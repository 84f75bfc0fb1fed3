// test/clock.ts: a fake Clock (lib/lease/clock.ts) for the lease tests. Time stands still until a test
// moves it; advance() and until() fire the timers due on the way, in order, and let the database's real
// I/O settle between them, so a lease's heartbeat, back-off or grace is tested without waiting for it.

import type { Clock } from "../lib/lease/clock.ts";

interface Timer {
  at: number;
  fn: () => void;
  everyMs?: number;
  cancelled: boolean;
}

// A real turn or two of the event loop: enough for SQLite's commit queue, and a PostgreSQL round trip.
const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
  await new Promise((resolve) => setTimeout(resolve, 2));
};

/** FakeClock is a Clock that moves only when the test says so; `wall` maps it onto a date for an inbox's `now`. */
export class FakeClock implements Clock {
  private t = 0;
  private timers: Timer[] = [];
  private readonly epoch: number;

  constructor(epoch = 1_700_000_000_000) {
    this.epoch = epoch;
  }

  now(): number {
    return this.t;
  }

  /** wall is the fake time as a date in ms since 1970, for an inbox's `now` option. */
  wall = (): number => this.epoch + this.t;

  after(ms: number, fn: () => void): () => void {
    const timer: Timer = { at: this.t + Math.max(0, ms), fn, cancelled: false };
    this.timers.push(timer);
    return () => void (timer.cancelled = true);
  }

  every(ms: number, fn: () => void): () => void {
    const everyMs = Math.max(1, ms);
    const timer: Timer = { at: this.t + everyMs, fn, everyMs, cancelled: false };
    this.timers.push(timer);
    return () => void (timer.cancelled = true);
  }

  /** sleep is a promise that settles ms from now on this clock. */
  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.after(ms, resolve));
  }

  /** advance moves the clock on ms, firing each timer due on the way in order, I/O settled after each. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    await settle();
    for (let next = this.next(); next !== undefined && next.at <= end; next = this.next()) {
      this.t = next.at;
      this.fire(next);
      await settle();
    }
    this.t = end;
    await settle();
  }

  /**
   * until moves the clock on, timer by timer, until check() holds, and says how far it moved; it throws
   * once it would pass limitMs of fake time, or when nothing is left to fire.
   */
  async until(check: () => boolean, limitMs = 600_000): Promise<number> {
    const from = this.t;
    for (let spins = 0; ; spins++) {
      await settle();
      if (check()) return this.t - from;
      // Real I/O may still be on its way (a PostgreSQL round trip): a few more turns before time moves.
      if (spins % 4 !== 3) continue;
      const next = this.next();
      if (next === undefined || next.at - from > limitMs)
        throw new Error(`FakeClock.until: not true after ${this.t - from} ms of fake time`);
      this.t = next.at;
      this.fire(next);
    }
  }

  private next(): Timer | undefined {
    this.timers = this.timers.filter((t) => !t.cancelled);
    let first: Timer | undefined;
    for (const t of this.timers) if (first === undefined || t.at < first.at) first = t;
    return first;
  }

  private fire(timer: Timer): void {
    if (timer.everyMs === undefined) timer.cancelled = true;
    else timer.at += timer.everyMs;
    timer.fn();
  }
}
