// test/contract-destinations.test.ts: a destination's shared state, on both backends (test/contract-harness.ts):
// permit(), its pause and its rate shared by every worker.
//   npx node --import tsx --test test/contract-destinations.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { contract } from "./contract-harness.ts";

contract((suite) => {
  const { open } = suite;
  describe("permit()", () => {
    it("grants nothing while paused, everything without a rate, and a rate's tokens shared by every worker, taken now", async () => {
      const [a, b] = [await open(), await open()];
      assert.deepEqual(await a.permit("app", 5), { granted: 5, paused: false, waitMs: 0 });
      const rate = { perSecond: 10, burst: 4 };
      // One token of the burst is kept back for the delay between a permit and the request's arrival.
      assert.deepEqual(await a.permit("app", 5, rate), { granted: 3, paused: false, waitMs: 100 });
      assert.deepEqual(
        await b.permit("app", 5, rate),
        { granted: 0, paused: false, waitMs: 100 },
        "the other worker finds the bucket empty",
      );
      suite.t += 250;
      assert.deepEqual(await b.permit("app", 5, rate), { granted: 2, paused: false, waitMs: 50 });
      assert.equal(await a.pause("app"), true);
      suite.t += 10_000;
      assert.deepEqual(await b.permit("app", 5), { granted: 0, paused: true, waitMs: 0 });
      assert.deepEqual(await b.permit("app", 5, rate), { granted: 0, paused: true, waitMs: 0 });
      assert.throws(() => a.permit("app", 0), TypeError);
    });
  });
});
