// test/limits.test.ts: a destination's limits hold where the destination sees them, on both backends.
// A destination with its own token bucket (the rate and burst it was configured with) refuses none of
// the forwards of two workers at once: the tokens are taken as each forward goes out, not when it was
// claimed. A destination paused while a lane holds leases it claimed ahead gets no forward that started
// after the pause committed, and those leases go back without spending an attempt. Each has a control.

import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { forward, type ForwardStats } from "../lib/forwarding/forwarder.ts";
import { loadDestinations } from "../lib/routing/routes.ts";
import type { Inbox } from "../lib/store.ts";
import { backends } from "./helpers.ts";

const SECRET = `whsec_${Buffer.from("limits test").toString("base64")}`;
const body = Buffer.from("{}");

// serve answers each request with what `answer` says, after the request's body is in.
async function serve(answer: (req: IncomingMessage, res: ServerResponse) => void) {
  const server = createServer((req, res) => void req.resume().on("end", () => answer(req, res)));
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `http://127.0.0.1:${(server.address() as { port: number }).port}/`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

// bucket is the destination's own limiter: perSecond tokens a second, burst at most, full at the start.
function bucket(perSecond: number, burst: number) {
  let tokens = burst;
  let at = performance.now();
  return () => {
    const now = performance.now();
    tokens = Math.min(burst, tokens + ((now - at) * perSecond) / 1000);
    at = now;
    if (tokens < 1) return false;
    tokens--;
    return true;
  };
}

for (const backend of await backends("limits")) {
  describe(`a destination's limits on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let opened: Inbox[];
    let closers: (() => Promise<void>)[];
    // As worker.ts opens its lanes' connection: on SQLite each commit's fsync off the event loop, which
    // would otherwise hold every forward granted meanwhile and send them together.
    const open = async () => {
      const inbox = await connect(target, backend.name === "sqlite" ? { syncOffLoop: true } : {});
      opened.push(inbox);
      return inbox;
    };
    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      opened = [];
      closers = [];
    });
    afterEach(async () => {
      for (const close of closers) await close();
      for (const inbox of opened) await inbox.close();
      await cleanup();
    });

    // twoWorkers forwards n deliveries to a destination whose own bucket allows `allows` a second (burst
    // 3), with two workers (two inboxes, two lanes) configured at `configured`; it counts the refusals.
    // The rate is low enough that one token's time (200 ms) outlasts the delays of a loaded test machine
    // between a permit and the request's arrival, which the token kept back absorbs (see gatePermit).
    const twoWorkers = async (n: number, configured: number, allows: number, stopAtRefusal = false) => {
      let take = () => true;
      let got = 0;
      let refused = 0;
      const app = await serve((_req, res) => {
        if (take()) {
          got++;
          res.writeHead(200).end();
        } else {
          refused++;
          res.writeHead(429, { "retry-after": "0" }).end();
        }
      });
      closers.push(app.close);
      const [a, b] = [await open(), await open()];
      const forwarding = loadDestinations(
        { $destinations: { app: { url: app.url, secret: SECRET, maxInFlight: 4, rate: configured, burst: 3 } } },
        {},
      );
      // Each worker's first forward opens its connection and loads the HTTP client's code, which takes
      // longer than one token's time: it goes out before the destination starts counting (see gatePermit).
      for (const inbox of [a, b]) {
        await inbox.store({ id: `warm_${opened.indexOf(inbox)}`, body, destinations: ["app"] });
        await forward({ inbox, forwarding, once: true, log: () => {} });
      }
      got = 0;
      take = bucket(allows, 3);
      for (let i = 0; i < n; i++) await a.store({ id: `evt_${i}`, body, destinations: ["app"] });
      const stop = new AbortController();
      const lanes = [a, b].map((inbox) =>
        forward({ inbox, forwarding, signal: stop.signal, leaseMs: 10_000, log: () => {} }),
      );
      const deadline = Date.now() + 20_000;
      while (got < n && Date.now() < deadline && !(stopAtRefusal && refused > 0))
        await new Promise((resolve) => setTimeout(resolve, 20));
      stop.abort();
      await Promise.all(lanes);
      return { got, refused };
    };

    it("holds rate and burst as the destination counts them: two workers, none refused", async () => {
      const r = await twoWorkers(14, 5, 5);
      assert.deepEqual(r, { got: 14, refused: 0 });
    });

    it("control: workers configured faster than the destination's bucket get refused", async () => {
      const r = await twoWorkers(14, 15, 5, true);
      assert.ok(r.refused > 0, `the bucket refuses what comes too fast (${JSON.stringify(r)})`);
    });

    // paused runs a lane of one slot that has claimed ahead; the destination holds the first forward
    // open, and meanwhile a person pauses it through another connection (or, in the control, does not).
    const pausedMidway = async (pause: boolean) => {
      const requests: number[] = [];
      let release: () => void = () => {};
      let first: () => void = () => {};
      const arrived = new Promise<void>((resolve) => (first = resolve));
      const app = await serve((_req, res) => {
        requests.push(performance.now());
        if (requests.length === 1) {
          release = () => res.writeHead(200).end();
          first();
        } else res.writeHead(200).end();
      });
      closers.push(app.close);
      const [worker, person] = [await open(), await open()];
      for (let i = 0; i < 10; i++) await worker.store({ id: `evt_${i}`, body, destinations: ["app"] });
      const forwarding = loadDestinations(
        { $destinations: { app: { url: app.url, secret: SECRET, maxInFlight: 1 } } },
        {},
      );
      const stop = new AbortController();
      const stats: ForwardStats = { done: 0, retried: 0, failed: 0, released: 0, lost: 0 };
      const lane = forward({
        inbox: worker,
        forwarding,
        signal: stop.signal,
        leaseMs: 10_000,
        log: () => {},
        stats,
        heldPollMs: 50,
      });
      await arrived;
      const claimedAhead = Number(
        (await person.query("SELECT count(*) AS n FROM deliveries WHERE status = 'processing'"))[0]!.n,
      );
      let pausedAt = Infinity;
      if (pause) {
        assert.equal(await person.pause("app"), true);
        pausedAt = performance.now();
      }
      release();
      const deadline = Date.now() + 10_000;
      const open$ = async () =>
        Number((await person.query("SELECT count(*) AS n FROM deliveries WHERE status = 'processing'"))[0]!.n);
      while (Date.now() < deadline && (pause ? (await open$()) > 0 : requests.length < 10))
        await new Promise((resolve) => setTimeout(resolve, 20));
      stop.abort();
      await lane;
      const rows = await person.query("SELECT status, attempts FROM deliveries ORDER BY id");
      return {
        claimedAhead,
        after: requests.filter((t) => t > pausedAt).length,
        requests: requests.length,
        stats,
        rows,
      };
    };

    it("a pause stops every forward after it commits; the leases claimed ahead go back with no attempt spent", async () => {
      const r = await pausedMidway(true);
      assert.ok(r.claimedAhead > 1, `the lane had claimed ahead (${r.claimedAhead} leased)`);
      assert.equal(r.after, 0, "no forward started after the pause committed");
      assert.equal(r.requests, 1);
      assert.equal(r.stats.released, r.claimedAhead - 1, "every lease claimed ahead went back");
      assert.deepEqual(
        r.rows.filter((x) => x.status !== "done").map((x) => [x.status, Number(x.attempts)]),
        Array(9).fill(["received", 0]),
      );
    });

    it("control: without the pause, the same lane sends what it claimed ahead", async () => {
      const r = await pausedMidway(false);
      assert.ok(r.claimedAhead > 1);
      assert.equal(r.requests, 10);
    });
  });
}
