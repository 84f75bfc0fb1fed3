// test/contract-destinations.test.ts: a destination's state, shared by every worker through the database, on
// both backends (test/contract-harness.ts): pause() and resume(), the breaker's tally(), permit(), and
// destinations() that shows them all.
//   npx node --import tsx --test test/contract-destinations.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type { BreakerPolicy, DestinationState } from "../lib/store.ts";
import { body, contract, LEASE, T0 } from "./contract-harness.ts";

// A destination as destinations() shows one that nothing has happened to; each test spells out what differs.
const untouched = (name: string): DestinationState => ({
  name,
  state: "closed",
  pausedReason: null,
  retryAt: null,
  probing: false,
  waiting: 0,
  processing: 0,
  failed: 0,
  failuresInRow: 0,
  failureRate: null,
  lastError: null,
  lastErrorAt: null,
});
// A breaker that opens on three failures in a row, the share of failures being out of reach (20 tries).
const POLICY: BreakerPolicy = { failures: 3, rate: 0.5, minTries: 20, windowMs: 60_000, coolDownMs: 30_000 };

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

  describe("destinations()", () => {
    it("lists the handler with nothing waiting, and each destination with deliveries or a state, by name, with its counts", async () => {
      const inbox = await open();
      assert.deepEqual(await inbox.destinations(), [untouched("handler")]);
      for (const id of ["a", "b", "c"]) await inbox.store({ id, body: body({}), destinations: ["app", "ledger"] });
      await inbox.store({ id: "unrouted", body: body({}), destinations: [] });
      const [first] = await inbox.claimBatch(2, LEASE, { destination: "app" });
      await inbox.fail(first!, "gone", { permanent: true });
      await inbox.pause("idle");
      assert.deepEqual(await inbox.destinations(), [
        { ...untouched("app"), waiting: 1, processing: 1, failed: 1 },
        untouched("handler"),
        { ...untouched("idle"), state: "paused", pausedReason: "paused by a person" },
        { ...untouched("ledger"), waiting: 3 },
      ]);
    });
  });

  describe("pause() and resume()", () => {
    it("holds a destination's deliveries, none claimed and none spending an attempt, until resume lets them go", async () => {
      const [a, b] = [await open(), await open()];
      await a.store({ id: "evt_1", body: body({}), destinations: ["app", "handler"] });
      assert.equal(await a.pause("app", "the ledger is down"), true);
      assert.equal(await b.pause("app"), false, "already paused, by the other worker");
      assert.deepEqual(await b.claimBatch(5, LEASE, { destination: "app" }), []);
      assert.equal((await b.claim(LEASE))!.destination, "handler", "another destination goes on");
      suite.t += 10 * LEASE;
      assert.deepEqual(await a.claimBatch(5, LEASE, { destination: "app" }), [], "held however long it waits");
      assert.deepEqual(
        (await a.destinations()).find((d) => d.name === "app"),
        { ...untouched("app"), state: "paused", pausedReason: "the ledger is down", waiting: 1 },
      );
      assert.equal(await b.resume("app"), true);
      assert.equal(await a.resume("app"), false, "no longer paused");
      assert.equal(await a.resume("never-paused"), false);
      const lease = (await a.claim(LEASE, { destination: "app" }))!;
      assert.deepEqual([lease.id, lease.attempts], ["evt_1", 1], "its first attempt, none spent while paused");
      await assert.rejects(async () => a.pause("not a name"), TypeError);
      await assert.rejects(async () => a.resume("not a name"), TypeError);
    });

    it("resume closes an open breaker too, its counts fresh, so its deliveries go at once", async () => {
      const inbox = await open();
      await inbox.store({ id: "evt_1", body: body({}), destinations: ["app"] });
      assert.equal((await inbox.tally("app", { done: 0, failed: 3, error: "HTTP 500" }, POLICY))?.change, "opened");
      assert.deepEqual(await inbox.claimBatch(1, LEASE, { destination: "app" }), [], "open: held for its cool-down");
      assert.equal(await inbox.pause("app"), true);
      assert.equal(await inbox.resume("app"), true);
      const app = (await inbox.destinations()).find((d) => d.name === "app")!;
      assert.deepEqual(
        [app.state, app.retryAt, app.failuresInRow, app.failureRate],
        ["closed", null, 0, null],
        "closed, with no cool-down to wait out and no failures counted",
      );
      assert.equal((await inbox.claim(LEASE, { destination: "app" }))?.id, "evt_1");
    });
  });

  describe("tally()", () => {
    it("opens the breaker every worker shares on failures in a row, holds claims through the cool-down, lets one probe go, and closes on its answer", async () => {
      const [a, b] = [await open(), await open()];
      for (const id of ["evt_1", "evt_2"]) await a.store({ id, body: body({}), destinations: ["app"] });
      assert.equal(
        await a.tally("app", { done: 1, failed: 2, error: "HTTP 500" }, POLICY),
        undefined,
        "two failures in a row (the try that got through came first)",
      );
      assert.deepEqual(await b.tally("app", { done: 0, failed: 1, error: "HTTP 502" }, POLICY), {
        change: "opened",
        failures: 3,
        rate: 0.75,
        error: "HTTP 502",
        retryAt: T0 + 30_000,
      });
      assert.deepEqual(
        (await a.destinations()).find((d) => d.name === "app"),
        {
          ...untouched("app"),
          state: "open",
          retryAt: T0 + 30_000,
          waiting: 2,
          failuresInRow: 3,
          failureRate: 0.75,
          lastError: "HTTP 502",
          lastErrorAt: T0,
        },
      );
      assert.deepEqual(await a.claimBatch(5, LEASE, { destination: "app" }), [], "open for the worker that tallied");
      suite.t += 30_000 - 1;
      assert.deepEqual(await a.claimBatch(5, LEASE, { destination: "app" }), [], "and for the other, all cool-down");
      suite.t += 1;
      const probes = await b.claimBatch(5, LEASE, { destination: "app" });
      assert.deepEqual(
        probes.map((l) => [l.id, l.probe]),
        [["evt_1", true]],
        "one delivery, the probe",
      );
      assert.deepEqual(
        (await a.destinations()).filter((d) => d.name === "app").map((d) => [d.state, d.probing, d.retryAt]),
        [["open", true, suite.t + LEASE]],
        "probing until the probe's lease ends",
      );
      assert.deepEqual(await a.claimBatch(5, LEASE, { destination: "app" }), [], "none beside the probe");
      // The probe failed: open again for a cool-down, which is no new opening to announce.
      assert.equal(await b.tally("app", { done: 0, failed: 1, error: "HTTP 503", probe: "failed" }, POLICY), undefined);
      assert.deepEqual(
        (await a.destinations())
          .filter((d) => d.name === "app")
          .map((d) => [d.state, d.probing, d.retryAt, d.lastError]),
        [["open", false, suite.t + 30_000, "HTTP 503"]],
      );
      suite.t += 30_000;
      const [second] = await a.claimBatch(5, LEASE, { destination: "app" });
      assert.deepEqual([second?.id, second?.probe], ["evt_2", true], "the next probe, after the next cool-down");
      // A minute after the first tally: a new window, holding the probe's one try.
      assert.deepEqual(await a.tally("app", { done: 1, failed: 0, probe: "done" }, POLICY), {
        change: "closed",
        failures: 0,
        rate: 0,
        error: "HTTP 503",
        retryAt: null,
      });
      assert.deepEqual(
        (await b.destinations())
          .filter((d) => d.name === "app")
          .map((d) => [d.state, d.probing, d.retryAt, d.failuresInRow]),
        [["closed", false, null, 0]],
      );
    });

    it("opens on the share of failed tries once the window holds minTries, counting this window's tries alone", async () => {
      const inbox = await open();
      const policy = { ...POLICY, failures: 100, minTries: 4 };
      assert.equal(await inbox.tally("app", { done: 0, failed: 3 }, policy), undefined, "three tries: too few");
      suite.t += policy.windowMs;
      assert.equal(await inbox.tally("app", { done: 2, failed: 1 }, policy), undefined, "a new window: 1 of 3");
      assert.deepEqual(await inbox.tally("app", { done: 0, failed: 1 }, policy), {
        change: "opened",
        failures: 2,
        rate: 0.5,
        error: null,
        retryAt: suite.t + policy.coolDownMs,
      });
      const app = (await inbox.destinations()).find((d) => d.name === "app")!;
      assert.deepEqual([app.state, app.failureRate, app.failuresInRow], ["open", 0.5, 2]);
      await assert.rejects(async () => inbox.tally("not a name", { done: 1, failed: 0 }, policy), TypeError);
    });
  });
});
