// breaker.ts: a destination's shared gate, as both backends work it out inside their transactions: a pause,
// the circuit breaker (breakerAfter() after a tally, toDestinationState() for the page) and the token
// bucket of its rate (gateClaim() for a claim, gatePermit() for a forward), with the checks of their options.
// Ground floor: pure arithmetic on a destinations row and the clock's now, so both backends agree.

import { DEFAULTS } from "./defaults.ts";
import {
  DESTINATION_NAME,
  type BreakerChange,
  type BreakerPolicy,
  type ClaimOptions,
  type DestinationState,
  type Lease,
  type Permit,
  type Rate,
  type SetAside,
  type SqlValue,
  type Tally,
} from "./store.ts";

/** tellSetAside hands what a claim set aside to its onSetAside, once the claim has committed. */
export function tellSetAside(
  claimed: Promise<Lease[]>,
  options: ClaimOptions,
  setAside: () => SetAside[],
): Promise<Lease[]> {
  const tell = options.onSetAside;
  if (tell === undefined) return claimed;
  return claimed.then((leases) => {
    const list = setAside();
    if (list.length > 0) tell(list);
    return leases;
  });
}

/**
 * gatePermit is permit()'s arithmetic, the same on both backends: none while paused; else n, or the
 * rate's whole tokens if fewer (refilled at perSecond since tokens_at); and the tokens left. The bucket
 * holds one token less than burst (when burst is 2 or more): a forward reaches the destination a little
 * after its permit, by a delay that varies (a commit, the event loop, the network), and a destination
 * whose own bucket has our rate and burst would refuse the one that comes early after one that came
 * late. The token kept back absorbs any such difference shorter than one token's time (1/perSecond).
 */
export function gatePermit(
  row: Record<string, unknown> | undefined,
  n: number,
  now: number,
  rate: Rate | undefined,
): Permit & { tokens: number | null } {
  if (row !== undefined && Number(row.paused)) return { granted: 0, paused: true, waitMs: 0, tokens: null };
  if (!rate) return { granted: n, paused: false, waitMs: 0, tokens: null };
  const configured = rate.burst ?? Math.max(1, rate.perSecond);
  const tokens = refill(row, rate.perSecond, configured >= 2 ? configured - 1 : configured, now);
  const granted = Math.max(0, Math.min(n, Math.floor(tokens)));
  const waitMs = granted < n ? Math.max(1, Math.ceil(((1 - (tokens - granted)) * 1000) / rate.perSecond)) : 0;
  return { granted, paused: false, waitMs, tokens: tokens - granted };
}

// refill is a destination's token bucket at now: its tokens at tokens_at, refilled at perSecond, up to
// burst; a bucket never used starts full.
function refill(row: Record<string, unknown> | undefined, perSecond: number, burst: number, now: number): number {
  const last = row?.tokens_at == null ? null : Number(row.tokens_at);
  const had = row?.tokens == null || last === null ? burst : Number(row.tokens);
  return Math.min(burst, had + (last === null ? 0 : (Math.max(0, now - last) * perSecond) / 1000));
}

/** checkPermit checks permit()'s arguments and gives the destination. */
export function checkPermit(destination: string, n: number, rate: Rate | undefined): string {
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`permit: expected n >= 1, got ${n}`);
  return checkClaim({ destination, ...(rate ? { rate } : {}) });
}

/**
 * gateClaim says how many deliveries of a destination a claim may take: none while it is paused, or its
 * breaker is open and cooling down or already probing; one, the probe, once the cool-down is over; else
 * the limit less what is in flight and what the shared rate allows. Both backends read the destination's
 * row and its in-flight count, and write back what this returns.
 */
export function gateClaim(
  row: Record<string, unknown> | undefined,
  limit: number,
  now: number,
  options: ClaimOptions,
  inFlight: number,
): { n: number; probe: boolean; tokens: number | null } {
  let n = limit;
  let probe = false;
  if (row !== undefined) {
    if (Number(row.paused)) return { n: 0, probe, tokens: null };
    if (row.state === "open" || row.state === "probing") {
      const until = Number(row.state === "open" ? row.retry_at : row.probe_until);
      if (until > now) return { n: 0, probe, tokens: null };
      probe = true;
      n = 1;
    }
  }
  if (options.maxInFlight !== undefined) n = Math.min(n, options.maxInFlight - inFlight);
  let tokens: number | null = null;
  if (options.rate) {
    tokens = refill(row, options.rate.perSecond, options.rate.burst ?? Math.max(1, options.rate.perSecond), now);
    n = Math.min(n, Math.floor(tokens));
  }
  return { n: Math.max(0, n), probe, tokens };
}

/** checkClaim checks ClaimOptions and gives the destination. */
export function checkClaim(options: ClaimOptions): string {
  const destination = options.destination ?? DEFAULTS.destination;
  if (typeof destination !== "string" || !DESTINATION_NAME.test(destination))
    throw new TypeError(`claim: expected destination to be a destination's name, got ${JSON.stringify(destination)}`);
  if (options.maxInFlight !== undefined && !(Number.isInteger(options.maxInFlight) && options.maxInFlight >= 1)) {
    throw new TypeError(`claim: expected maxInFlight to be a whole number >= 1, got ${options.maxInFlight}`);
  }
  if (
    options.rate !== undefined &&
    !(options.rate.perSecond > 0 && (options.rate.burst === undefined || options.rate.burst >= 1))
  ) {
    throw new TypeError(
      `claim: expected rate to be { perSecond > 0, burst >= 1 }, got ${JSON.stringify(options.rate)}`,
    );
  }
  return destination;
}

/**
 * breakerAfter works out a destination's breaker after a tally, from its row (or none yet): the counts in
 * the window, the failures in a row, and whether it opens (enough failures in a row, or too high a share
 * in the window) or closes (its probe got through). Both backends run it inside the tally's transaction.
 */
export function breakerAfter(
  row: Record<string, unknown> | undefined,
  tally: Tally,
  policy: BreakerPolicy,
  now: number,
): { row: Record<string, SqlValue>; change: BreakerChange | undefined } {
  const fresh = row?.window_start == null || now - Number(row.window_start) >= policy.windowMs;
  const done = (fresh ? 0 : Number(row!.window_done)) + tally.done;
  const failed = (fresh ? 0 : Number(row!.window_failed)) + tally.failed;
  // A try that got through ends the run of failures; the failures reported after it start a new one.
  let inRow = (tally.done > 0 ? 0 : Number(row?.failures ?? 0)) + tally.failed;
  let state = (row?.state as string | undefined) ?? "closed";
  let retryAt = row?.retry_at == null ? null : Number(row.retry_at);
  let change: BreakerChange["change"] | undefined;
  const rate = done + failed === 0 ? null : failed / (done + failed);
  if (tally.probe === "done" && state !== "closed") {
    state = "closed";
    inRow = 0;
    retryAt = null;
    change = "closed";
  } else if (tally.probe === "failed" && state !== "closed") {
    state = "open";
    retryAt = now + policy.coolDownMs;
  } else if (
    state === "closed" &&
    tally.failed > 0 &&
    (inRow >= policy.failures || (done + failed >= policy.minTries && rate !== null && rate >= policy.rate))
  ) {
    state = "open";
    retryAt = now + policy.coolDownMs;
    change = "opened";
  }
  const error = tally.error ?? (row?.last_error as string | null | undefined) ?? null;
  return {
    row: {
      state,
      retry_at: retryAt,
      failures: inRow,
      window_start: fresh ? now : Number(row!.window_start),
      window_done: done,
      window_failed: failed,
      last_error: error,
      last_error_at: tally.error !== undefined ? now : row?.last_error_at == null ? null : Number(row.last_error_at),
    },
    change: change === undefined ? undefined : { change, failures: inRow, rate, error, retryAt },
  };
}

/** toDestinationState reads a destinations row and its counts into a DestinationState. */
export function toDestinationState(
  name: string,
  row: Record<string, unknown> | undefined,
  counts: { waiting: number; processing: number; failed: number },
  policyWindowMs: number,
  now: number,
): DestinationState {
  const live = row?.window_start != null && now - Number(row.window_start) < policyWindowMs * 2;
  const done = live ? Number(row!.window_done) : 0;
  const failed = live ? Number(row!.window_failed) : 0;
  const state =
    row === undefined ? "closed" : Number(row.paused) ? "paused" : row.state === "closed" ? "closed" : "open";
  return {
    name,
    state,
    pausedReason: Number(row?.paused ?? 0) ? ((row!.paused_reason as string | null) ?? null) : null,
    retryAt: row?.state === "open" ? Number(row.retry_at) : row?.state === "probing" ? Number(row.probe_until) : null,
    probing: row?.state === "probing",
    ...counts,
    failuresInRow: Number(row?.failures ?? 0),
    failureRate: done + failed === 0 ? null : failed / (done + failed),
    lastError: (row?.last_error as string | null | undefined) ?? null,
    lastErrorAt: row?.last_error_at == null ? null : Number(row.last_error_at),
  };
}
