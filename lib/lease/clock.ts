// lease/clock.ts: the clock a lease loop reads and sets its timers on. Time is a parameter: the lanes
// take a Clock, the real one here in production and a fake one in the tests (test/clock.ts), so their
// timing is tested by moving the clock on, not by waiting.

/** Clock is the time a lane reads and the timers it sets. */
export interface Clock {
  /** now is a monotonic time in milliseconds, for durations and deadlines (not dates). */
  now(): number;
  /** after calls fn once, ms from now; the function it returns cancels the call. */
  after(ms: number, fn: () => void): () => void;
  /** every calls fn each ms until the function it returns is called. */
  every(ms: number, fn: () => void): () => void;
}

/** realClock is the process's own: performance.now() and Node's timers. */
export const realClock: Clock = {
  now: () => performance.now(),
  after: (ms, fn) => {
    const timer = setTimeout(fn, ms);
    return () => clearTimeout(timer);
  },
  every: (ms, fn) => {
    const timer = setInterval(fn, ms);
    return () => clearInterval(timer);
  },
};
