// test/breaker.test.ts: a destination's shared gate (lib/breaker.ts) alone, on a fake clock and with no
// database: the breaker after each tally, what a claim and a forward may take (the pause, the cool-down and
// its probe, the in-flight limit, the token bucket), and the state the page shows. Both backends run these
// functions on their rows inside their transactions; test/contract-destinations.test.ts runs them there.
//   npx node --test test/breaker.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { breakerAfter, gateClaim, gatePermit, toDestinationState } from "../lib/breaker.ts";
import type { BreakerPolicy, SqlValue, Tally } from "../lib/store.ts";
import { FakeClock } from "./clock.ts";

const POLICY: BreakerPolicy = { failures: 3, rate: 0.5, minTries: 10, windowMs: 60_000, coolDownMs: 30_000 };

// Row is a destinations row as a backend keeps it, advanced by one tally after another.
class Row {
  row: Record<string, SqlValue> | undefined;
  readonly clock = new FakeClock();
  tally(t: Partial<Tally>, policy = POLICY) {
    const { row, change } = breakerAfter(this.row, { done: 0, failed: 0, ...t }, policy, this.clock.wall());
    this.row = row;
    return change;
  }
}

describe("breakerAfter()", () => {
  it("opens after `failures` failures in a row, and says when its probe may go", () => {
    const d = new Row();
    assert.equal(d.tally({ failed: 1, error: "HTTP 503" }), undefined);
    assert.equal(d.tally({ failed: 1, error: "HTTP 503" }), undefined);
    const change = d.tally({ failed: 1, error: "HTTP 502" });
    assert.deepEqual(change, {
      change: "opened",
      failures: 3,
      rate: 1,
      error: "HTTP 502",
      retryAt: d.clock.wall() + POLICY.coolDownMs,
    });
    assert.equal(d.row!.state, "open");
  });

  it("a control: a try that gets through between them ends the run, and it stays closed", () => {
    const d = new Row();
    d.tally({ failed: 2 });
    d.tally({ done: 1 });
    assert.equal(d.tally({ failed: 2 }), undefined);
    assert.equal(d.row!.failures, 2, "the run starts again after the success");
    assert.equal(d.row!.state, "closed");
  });

  it("opens on the window's failure rate once minTries tries are in it, and a fresh window forgets the old ones", async () => {
    // Failures in a row alone never open it here: only the rate can.
    const policy = { ...POLICY, failures: 1_000 };
    const d = new Row();
    d.tally({ done: 5, failed: 2 }, policy);
    d.tally({ done: 1, failed: 1 }, policy);
    assert.equal(d.row!.state, "closed", "3 of 9 tries failed: under minTries and under the rate");
    await d.clock.advance(POLICY.windowMs);
    d.tally({ done: 4, failed: 0 }, policy);
    assert.deepEqual([d.row!.window_done, d.row!.window_failed], [4, 0], "a new window");
    const change = d.tally({ done: 1, failed: 5 }, policy);
    assert.equal(change?.change, "opened", "5 of 10 in the window failed: the rate, at minTries");
    assert.equal(change?.rate, 0.5);
  });

  it("a probe that gets through closes it; one that fails keeps it open for another cool-down, announcing nothing", async () => {
    const d = new Row();
    d.tally({ failed: 3 });
    await d.clock.advance(POLICY.coolDownMs);
    assert.equal(d.tally({ failed: 1, probe: "failed", error: "still down" }), undefined);
    assert.equal(d.row!.retry_at, d.clock.wall() + POLICY.coolDownMs, "a new cool-down from the failed probe");
    await d.clock.advance(POLICY.coolDownMs);
    const change = d.tally({ done: 1, probe: "done" });
    assert.deepEqual([change?.change, d.row!.state, d.row!.failures, d.row!.retry_at], ["closed", "closed", 0, null]);
  });

  it("keeps the last error and when it came, through tallies that bring none", async () => {
    const d = new Row();
    d.tally({ failed: 1, error: "HTTP 500" });
    const at = d.clock.wall();
    await d.clock.advance(5_000);
    d.tally({ done: 3 });
    assert.deepEqual([d.row!.last_error, d.row!.last_error_at], ["HTTP 500", at]);
  });
});

describe("gateClaim()", () => {
  it("takes none while paused, none while open until the cool-down ends, then one: the probe", async () => {
    const d = new Row();
    const now = () => d.clock.wall();
    assert.deepEqual(gateClaim({ paused: 1 }, 10, now(), {}, 0), { n: 0, probe: false, tokens: null });
    d.tally({ failed: 3 });
    assert.equal(gateClaim(d.row, 10, now(), {}, 0).n, 0, "open, cooling down");
    await d.clock.advance(POLICY.coolDownMs - 1);
    assert.equal(gateClaim(d.row, 10, now(), {}, 0).n, 0, "a millisecond early");
    await d.clock.advance(1);
    assert.deepEqual(gateClaim(d.row, 10, now(), {}, 0), { n: 1, probe: true, tokens: null });
    const probing = { ...d.row, state: "probing", probe_until: now() + 1_000 };
    assert.equal(gateClaim(probing, 10, now(), {}, 0).n, 0, "one probe at a time");
  });

  it("takes what the shared in-flight limit leaves, and the rate's whole tokens, refilled on the clock", async () => {
    const clock = new FakeClock();
    assert.equal(gateClaim(undefined, 10, clock.wall(), { maxInFlight: 4 }, 3).n, 1);
    assert.equal(gateClaim(undefined, 10, clock.wall(), { maxInFlight: 4 }, 4).n, 0);
    const rate = { perSecond: 2, burst: 5 };
    assert.equal(gateClaim(undefined, 10, clock.wall(), { rate }, 0).n, 5, "a bucket never used starts full");
    const spent = { tokens: 0, tokens_at: clock.wall() };
    await clock.advance(1_500);
    assert.deepEqual(gateClaim(spent, 10, clock.wall(), { rate }, 0), { n: 3, probe: false, tokens: 3 });
  });
});

describe("gatePermit()", () => {
  it("grants none while paused, and all without a rate", () => {
    assert.deepEqual(gatePermit({ paused: 1 }, 4, 0, undefined), { granted: 0, paused: true, waitMs: 0, tokens: null });
    assert.deepEqual(gatePermit(undefined, 4, 0, undefined), { granted: 4, paused: false, waitMs: 0, tokens: null });
  });

  it("keeps one token of the burst back, and says how long until the next", async () => {
    const clock = new FakeClock();
    const rate = { perSecond: 10, burst: 4 };
    const full = gatePermit(undefined, 8, clock.wall(), rate);
    assert.deepEqual([full.granted, full.tokens], [3, 0], "a burst of 4 grants 3 at once");
    assert.equal(full.waitMs, 100, "one token at 10 a second");
    const row = { tokens: full.tokens, tokens_at: clock.wall() };
    await clock.advance(250);
    const later = gatePermit(row, 8, clock.wall(), rate);
    assert.equal(later.granted, 2, "2.5 tokens in 250 ms");
    assert.equal(later.waitMs, 50, "half a token left: 50 ms to the next");
  });
});

describe("toDestinationState()", () => {
  it("shows a paused one as paused with its reason, an open one with its probe's time, and forgets an old window", async () => {
    const d = new Row();
    const counts = { waiting: 2, processing: 1, failed: 0 };
    d.tally({ done: 1, failed: 3, error: "HTTP 503" });
    const open = toDestinationState("app", d.row, counts, POLICY.windowMs, d.clock.wall());
    assert.deepEqual(
      [open.state, open.retryAt, open.failuresInRow, open.failureRate, open.lastError],
      ["open", d.clock.wall() + POLICY.coolDownMs, 3, 0.75, "HTTP 503"],
    );
    const paused = toDestinationState("app", { ...d.row, paused: 1, paused_reason: "410 Gone" }, counts, 1, 0);
    assert.deepEqual([paused.state, paused.pausedReason], ["paused", "410 Gone"]);
    await d.clock.advance(2 * POLICY.windowMs);
    assert.equal(toDestinationState("app", d.row, counts, POLICY.windowMs, d.clock.wall()).failureRate, null);
  });
});
