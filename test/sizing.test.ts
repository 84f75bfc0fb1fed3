// test/sizing.test.ts: how much a lane claims (lib/lease/sizing.ts), each policy alone, on a fake clock and
// with no database: HandlerSizing by the handlers' and the claims' times, AheadSizing ahead of a destination's
// slots. A LaneView is a plain value here; test/lease.test.ts runs the same policies in real lanes.
//   npx node --test test/sizing.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { LaneView } from "../lib/lease/lane.ts";
import { AheadSizing, HandlerSizing } from "../lib/lease/sizing.ts";
import { FakeClock } from "./clock.ts";

const view = (v: Partial<LaneView> = {}): LaneView => ({ waiting: 0, running: 0, active: 0, gated: false, ...v });

describe("HandlerSizing", () => {
  it("claims concurrency at first: nothing is known of the handlers yet", () => {
    assert.equal(new HandlerSizing(4, 32).room(view()), 4);
  });

  it("sends no claim while claimed leases wait to start", () => {
    const sizing = new HandlerSizing(4, 32);
    sizing.ran(0.1);
    assert.equal(sizing.room(view({ waiting: 1, running: 4, active: 5 })), 0);
  });

  it("fast handlers share claims of up to claimBatch, and hold no more than two batches", () => {
    const sizing = new HandlerSizing(4, 32);
    sizing.ran(0.1);
    assert.equal(sizing.room(view({ running: 4, active: 4 })), 32, "a batch's worth, whoever runs");
    assert.equal(sizing.room(view({ running: 4, active: 50 })), 14, "up to two batches held: 64 - 50");
    assert.equal(
      sizing.full(view({ running: 4, active: 60 })),
      false,
      "a lane that does not claim ahead is never full",
    );
  });

  it("claiming ahead, sends no claim while more leases wait than fast handlers start during a claim", () => {
    const sizing = new HandlerSizing(4, 32, true);
    sizing.ran(0.1);
    assert.equal(
      sizing.room(view({ waiting: 300, running: 4, active: 304 })),
      0,
      "300 × 0.1 ms over 4 is 7.5 ms of work",
    );
    assert.equal(sizing.room(view({ waiting: 20, running: 4, active: 24 })), 32, "0.5 ms of work: the next batch now");
  });

  it("claiming ahead, slow handlers send no claim while claimed leases wait to start", () => {
    const sizing = new HandlerSizing(4, 32, true);
    sizing.ran(1_000);
    assert.equal(sizing.room(view({ waiting: 1, running: 4, active: 5 })), 0);
  });

  it("claiming ahead, fast handlers hold no more than three batches, and claim no sliver", () => {
    const sizing = new HandlerSizing(4, 32, true);
    sizing.ran(0.1);
    assert.equal(sizing.room(view({ running: 4, active: 4 })), 32, "a batch's worth, whoever runs");
    assert.equal(sizing.room(view({ running: 4, active: 70 })), 26, "up to three batches held: 96 - 70");
    assert.equal(sizing.room(view({ running: 4, active: 90 })), 0, "6 is less than half a batch: wait for done marks");
    assert.equal(sizing.full(view({ running: 4, active: 90 })), true, "so the done marks should not wait for a claim");
    assert.equal(sizing.full(view({ running: 4, active: 70 })), false);
  });

  it("slow handlers claim only what the free handlers can start", () => {
    const sizing = new HandlerSizing(4, 32);
    sizing.ran(1_000);
    assert.equal(sizing.room(view({ running: 3, active: 3 })), 1);
    assert.equal(sizing.room(view({ running: 4, active: 4 })), 0);
  });

  it("claims more for the same handlers when claims are slow (a slow fsync), so a claim's cost is shared", () => {
    const handlers = 20;
    const quick = new HandlerSizing(4, 256);
    const slow = new HandlerSizing(4, 256);
    quick.ran(handlers);
    slow.ran(handlers);
    for (let i = 0; i < 50; i++) slow.claimed(8, 8, 40);
    assert.equal(quick.room(view()), 4, "5 ms of claim-ahead per slot is less than one 20 ms handler: concurrency");
    assert.ok(slow.room(view()) > 4 * 4, `claims of ~40 ms bring at least ten times their time: ${slow.room(view())}`);
  });

  it("moves its handler time by a tenth of each new one, not at once", () => {
    const sizing = new HandlerSizing(4, 1_000);
    sizing.ran(0.1);
    assert.equal(sizing.room(view()), 200, "20 ms of claim-ahead over 0.1 ms handlers");
    sizing.ran(10);
    assert.equal(sizing.room(view()), 18, "0.1 ms moved a tenth of the way to 10 ms: 1.09 ms");
  });
});

describe("AheadSizing", () => {
  it("claims its slots and `ahead` more when nothing is held, and nothing while half of ahead still waits", () => {
    const sizing = new AheadSizing(4, 64);
    assert.equal(sizing.ahead, 8, "two lanes' worth to start");
    assert.equal(sizing.room(view()), 12);
    assert.equal(sizing.room(view({ waiting: 4, running: 4 })), 0);
    assert.equal(sizing.room(view({ waiting: 3, running: 4 })), 5, "refills ahead + slots less what it holds");
  });

  it("doubles `ahead`, up to `most`, when the lane ran dry while a full claim was out", () => {
    const sizing = new AheadSizing(4, 20);
    for (const expected of [16, 20, 20]) {
      sizing.room(view());
      sizing.starved();
      sizing.claimed(12, 12, 1, 0);
      assert.equal(sizing.ahead, expected);
    }
  });

  it("a control: a claim that came back short does not grow it, however dry the lane", () => {
    const sizing = new AheadSizing(4, 64);
    sizing.room(view());
    sizing.starved();
    sizing.claimed(12, 3, 1, 0);
    assert.equal(sizing.ahead, 8);
  });

  it("doubles when claims take more than a quarter of the time between them, and halves when under a sixteenth", async () => {
    const clock = new FakeClock();
    const sizing = new AheadSizing(4, 64);
    const claim = async (everyMs: number, tookMs: number) => {
      await clock.advance(everyMs);
      sizing.room(view({ running: 4 }));
      sizing.claimed(8, 8, tookMs, clock.now());
    };
    await claim(100, 1);
    assert.equal(sizing.ahead, 8, "from the start: 1 ms of 100");
    await claim(100, 30);
    assert.equal(sizing.ahead, 16, "30 ms of 100: more than a quarter");
    await claim(100, 30);
    assert.equal(sizing.ahead, 32);
    await claim(100, 10);
    assert.equal(sizing.ahead, 32, "10 ms of 100: between a sixteenth and a quarter, kept");
    await claim(100, 5);
    assert.equal(sizing.ahead, 16, "5 ms of 100: under a sixteenth, halved");
    await claim(1_000, 1);
    await claim(1_000, 1);
    assert.equal(sizing.ahead, 8, "never under two lanes' worth");
    assert.equal(sizing.claimTook, 1);
  });
});
