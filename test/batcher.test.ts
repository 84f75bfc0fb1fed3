// test/batcher.test.ts: the Batcher (lib/lease/batcher.ts) alone, on a fake clock and with no database: its
// finish() settles as the inbox's does, and its policy decides when the gathered done marks go out. The
// marks are sent to a recording finish() standing where the inbox's would; test/throughput.test.ts shows
// the same marks riding a real SQLite claim's commit.
//   npx node --test test/batcher.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { Batcher, type BatcherOptions } from "../lib/lease/batcher.ts";
import type { LaneView } from "../lib/lease/lane.ts";
import type { Lease, LocalWrite } from "../lib/store.ts";
import { FakeClock } from "./clock.ts";

const lease = (id: string): Lease => ({ id }) as Lease;
const view = (v: Partial<LaneView> = {}): LaneView => ({ waiting: 0, running: 0, active: 0, gated: false, ...v });
// A turn of the event loop, for what a settled promise hands on.
const turn = () => new Promise((resolve) => setImmediate(resolve));

// sink records each batch handed to it and answers each mark when told to: what an inbox's finish() does.
function sink(answer: (lease: Lease) => boolean | Error = () => true) {
  const sent: { lease: Lease; writes: readonly LocalWrite[] | undefined; answer: () => void }[] = [];
  return {
    sent,
    ids: () => sent.map((s) => s.lease.id),
    /** commit answers every mark sent so far. */
    commit: () => {
      for (const s of sent.splice(0)) s.answer();
    },
    finish: (l: Lease, writes?: readonly LocalWrite[]) =>
      new Promise<boolean>((resolve, reject) => {
        const a = answer(l);
        sent.push({ lease: l, writes, answer: () => (a instanceof Error ? reject(a) : resolve(a)) });
      }),
  };
}

function batcher(inbox: ReturnType<typeof sink>, options: Partial<BatcherOptions> = {}) {
  const clock = new FakeClock();
  return { clock, batcher: new Batcher({ inbox, clock, ...options }) };
}

describe("Batcher.finish()", () => {
  it("settles as the inbox's finish does, once its batch has gone: held, lost, or the store's error", async () => {
    const inbox = sink((l) =>
      l.id === "lost" ? false : l.id === "refused" ? new Error("CHECK constraint failed") : true,
    );
    const { batcher: b } = batcher(inbox);
    const write: LocalWrite = () => {};
    const held = b.finish(lease("held"), [write]);
    const lost = b.finish(lease("lost"));
    const refused = b.finish(lease("refused"));
    assert.deepEqual(inbox.ids(), [], "nothing goes before the lane's turn");
    assert.equal(b.gathered, 3);
    b.flush();
    assert.deepEqual(inbox.ids(), ["held", "lost", "refused"]);
    assert.deepEqual(inbox.sent[0]!.writes, [write], "the writes go with their mark");
    inbox.commit();
    assert.equal(await held, true);
    assert.equal(await lost, false);
    await assert.rejects(refused, /CHECK constraint failed/);
  });

  it("a finish that throws at once rejects its own mark, not the others of its batch", async () => {
    const inbox = sink();
    const throwing = {
      finish: (l: Lease, w?: readonly LocalWrite[]) => {
        if (l.id === "bad") throw new TypeError("finish: expected a lease");
        return inbox.finish(l, w);
      },
    };
    const b = new Batcher({ inbox: throwing, clock: new FakeClock() });
    const bad = b.finish(lease("bad"));
    const good = b.finish(lease("good"));
    b.flush();
    inbox.commit();
    await assert.rejects(bad, /expected a lease/);
    assert.equal(await good, true);
  });
});

describe("Batcher.turn()", () => {
  it("sends every gathered mark with a claim, whatever its policy says", () => {
    const inbox = sink();
    const { batcher: b } = batcher(inbox, { hold: () => true, oneAtATime: true });
    void b.finish(lease("a"));
    b.turn(true, view());
    void b.finish(lease("b"));
    b.turn(true, view());
    assert.deepEqual(inbox.ids(), ["a", "b"], "each claim took the marks gathered before it, none waiting for a batch");
  });

  it("holds the marks at a turn without a claim while its policy says, by their count, their age on the clock and the lane", async () => {
    const inbox = sink();
    const asked: [number, number, number][] = [];
    const { clock, batcher: b } = batcher(inbox, {
      hold: (count, ageMs, lane) => (asked.push([count, ageMs, lane.running]), count < 3 && ageMs < 100),
    });
    void b.finish(lease("a"));
    await clock.advance(40);
    void b.finish(lease("b"));
    b.turn(false, view({ running: 2 }));
    assert.deepEqual(inbox.ids(), [], "two marks, 40 ms old: held");
    await clock.advance(60);
    b.turn(false, view({ running: 1 }));
    assert.deepEqual(inbox.ids(), ["a", "b"], "the first is 100 ms old: sent");
    assert.deepEqual(asked, [
      [2, 40, 2],
      [2, 100, 1],
    ]);
  });

  it("a control: with no policy, a turn without a claim sends what it has at once", () => {
    const inbox = sink();
    const { batcher: b } = batcher(inbox);
    void b.finish(lease("a"));
    b.turn(false, view({ running: 5 }));
    assert.deepEqual(inbox.ids(), ["a"]);
  });

  it("one at a time: a turn without a claim waits for the batch in flight, and the next goes once it has settled", async () => {
    const inbox = sink();
    let wakes = 0;
    const { batcher: b } = batcher(inbox, { oneAtATime: true, wake: () => wakes++ });
    void b.finish(lease("a"));
    b.turn(false, view());
    assert.deepEqual(inbox.ids(), ["a"], "none in flight: sent");
    const first = inbox.sent.slice();
    void b.finish(lease("b"));
    b.turn(false, view());
    assert.deepEqual(inbox.ids(), ["a"], "a batch in flight: b waits");
    const before = wakes;
    for (const s of first) s.answer();
    inbox.sent.splice(0, 1);
    await turn();
    assert.equal(wakes, before + 1, "the lane is woken as the batch settles");
    b.turn(false, view());
    assert.deepEqual(inbox.ids(), ["b"]);
  });
});

describe("Batcher's timer and wake", () => {
  it("sends the first mark no later than longestMs on the clock, whatever turns the lane takes", async () => {
    const inbox = sink();
    const { clock, batcher: b } = batcher(inbox, { hold: () => true, longestMs: 50 });
    void b.finish(lease("a"));
    await clock.advance(30);
    void b.finish(lease("b"));
    b.turn(false, view());
    await clock.advance(19);
    assert.deepEqual(inbox.ids(), [], "49 ms: still held");
    await clock.advance(1);
    assert.deepEqual(inbox.ids(), ["a", "b"], "50 ms after the first: sent by the timer");
  });

  it("wakes the lane for each mark added and each batch settled", async () => {
    const inbox = sink();
    let wakes = 0;
    const { batcher: b } = batcher(inbox, { wake: () => wakes++ });
    void b.finish(lease("a"));
    void b.finish(lease("b"));
    assert.equal(wakes, 2);
    b.flush();
    inbox.commit();
    await turn();
    assert.equal(wakes, 3, "one more for the batch, not one per mark");
  });
});
