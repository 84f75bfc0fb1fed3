// timing.ts: when the backends wait, the same on both: a failed try's backoff before it goes again
// (backoff(), retryDelay(), with a Retry-After), and the rest between a bulk command's batches (paced()).
// Ground floor: the jitter's random is passed in.

import type { FailOptions } from "./store.ts";

/**
 * paced runs one batch of a bulk command and then rests rest times as long as it took, so that acks get
 * the write lock and the disk in between; the batches' pace adapts to the load they meet.
 */
export async function paced<T>(rest: number, batch: () => Promise<T>): Promise<T> {
  const started = performance.now();
  const result = await batch();
  const ms = (performance.now() - started) * rest;
  if (ms >= 1) await new Promise((resolve) => setTimeout(resolve, ms));
  return result;
}

/** backoff is how long to wait before try number attempts+1: doubling, capped, with upward jitter. */
export function backoff(
  attempts: number,
  opts: { retryDelayMs: number; retryCapMs: number; retryJitter: number; random: () => number },
): number {
  const doubled = opts.retryDelayMs * 2 ** Math.max(0, attempts - 1);
  return Math.round(Math.min(opts.retryCapMs, doubled * (1 + opts.retryJitter * opts.random())));
}

/** retryDelay is the wait before the next try: the backoff, or later if the destination asked (Retry-After), capped. */
export function retryDelay(
  attempts: number,
  options: FailOptions,
  opts: { retryDelayMs: number; retryCapMs: number; retryJitter: number; random: () => number },
): number {
  const wait = backoff(attempts, opts);
  const asked = options.retryAfterMs;
  if (asked === undefined) return wait;
  if (!Number.isFinite(asked) || asked < 0)
    throw new TypeError(`fail: expected retryAfterMs to be a number of ms >= 0, got ${asked}`);
  return Math.max(wait, Math.min(opts.retryCapMs, Math.round(asked)));
}
