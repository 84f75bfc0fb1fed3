// test/forward.test.ts: forwarding, on both backends: real destination servers on free ports (that answer,
// fail, hang, ask to wait, go away and come back), the forwarder's lanes, the shared breaker, pause and
// resume, replay --to, and the signatures checked with the standardwebhooks library. The inbox's clock is
// pinned, so retries and cool-downs come due when the test says, never by sleeping.

import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer, type IncomingHttpHeaders, type Server } from "node:http";
import { afterEach, beforeEach, describe, it } from "node:test";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { judge, retryAfterMs } from "../lib/forwarding/forward.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { Metrics } from "../lib/metrics.ts";
import { loadDestinations, type Forwarding } from "../lib/routing/routes.ts";
import type { Inbox, InboxOptions } from "../lib/store.ts";
import { backends } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const SECRET = `whsec_${Buffer.from("the app's forwarding secret").toString("base64")}`;
const NEW_SECRET = `whsec_${Buffer.from("the app's next secret").toString("base64")}`;
const OTHER = `whsec_${Buffer.from("somebody else's").toString("base64")}`;
const body = (event: unknown) => Buffer.from(JSON.stringify(event));

/** Received is one request a destination server got: its headers and its exact bytes. */
interface Received {
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** Answer is what a destination server says to one request; hang never answers. */
type Answer = { status: number; body?: string; headers?: Record<string, string> } | "hang";

// destination starts a real HTTP server on a free port whose answers the test changes as it goes.
async function destination(answer: (r: Received, n: number) => Answer = () => ({ status: 200 })): Promise<{
  url: string;
  got: Received[];
  answer: (fn: (r: Received, n: number) => Answer) => void;
  close: () => Promise<void>;
}> {
  const got: Received[] = [];
  let reply = answer;
  const server: Server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const r = { headers: req.headers, body: Buffer.concat(chunks) };
      got.push(r);
      const a = reply(r, got.length);
      if (a === "hang") return;
      res.writeHead(a.status, { "content-type": "text/plain", ...a.headers });
      res.end(a.body ?? "");
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    got,
    answer: (fn) => void (reply = fn),
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const verify = (secret: string, r: Received) =>
  new Webhook(secret).verify(r.body.toString("utf8"), r.headers as Record<string, string>);

const BACKENDS = await backends("forward");

for (const backend of BACKENDS) {
  describe(`forwarding on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let t: number;
    let opened: Inbox[];
    let servers: { close: () => Promise<void> }[];
    const open = async (options: InboxOptions = {}) => {
      const inbox = await connect(target, { now: () => t, random: () => 0, ...options });
      opened.push(inbox);
      return inbox;
    };
    const serve = async (answer?: (r: Received, n: number) => Answer) => {
      const d = await destination(answer);
      servers.push(d);
      return d;
    };
    const config = (
      destinations: Record<string, Record<string, unknown>>,
      extra: Record<string, unknown> = {},
    ): Forwarding => loadDestinations({ $destinations: destinations, ...extra }, {});
    const rows = async (inbox: Inbox, destination: string) =>
      inbox.query(
        "SELECT id, status, attempts, error, available_at FROM deliveries WHERE destination = ? ORDER BY id",
        destination,
      );

    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      t = T0;
      opened = [];
      servers = [];
    });
    afterEach(async () => {
      for (const s of servers) await s.close();
      for (const inbox of opened) await inbox.close();
      await cleanup();
    });

    it("forwards each delivery byte-exact with its content type, signed so standardwebhooks verifies it; a changed byte fails", async () => {
      const inbox = await open();
      const app = await serve();
      const bodies = [
        body({ customer: "Ann", amount: 5 }),
        Buffer.from('{"name":"Zoë ✓","emoji":"🦊"}'),
        body({ n: 3 }),
      ];
      for (const [i, b] of bodies.entries()) {
        assert.equal(
          await inbox.store({
            source: "stripe",
            id: `evt_${i}`,
            body: b,
            contentType: "application/json; charset=utf-8",
            eventType: "invoice.paid",
            destinations: ["app"],
          }),
          "stored",
        );
      }
      const metrics = new Metrics({ inbox, processMetrics: false });
      const stats = await forward({
        inbox,
        forwarding: config({ app: { url: app.url, secret: SECRET } }),
        once: true,
        log: () => {},
        metrics,
      });
      assert.equal(stats.done, 3);
      assert.equal(app.got.length, 3);
      for (const r of app.got) {
        const i = Number(r.headers["inbox-delivery-id"]!.slice(4));
        assert.deepEqual(r.body, bodies[i]);
        assert.equal(r.headers["content-type"], "application/json; charset=utf-8");
        assert.equal(r.headers["webhook-id"], `stripe:evt_${i}`);
        assert.equal(r.headers["inbox-source"], "stripe");
        assert.equal(r.headers["inbox-event-type"], "invoice.paid");
        assert.equal(r.headers["inbox-attempt"], "1");
        assert.match(String(r.headers.traceparent), /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
        assert.deepEqual(verify(SECRET, r), JSON.parse(bodies[i]!.toString()));
        // The control: one changed byte, or another secret, and the same library refuses it.
        const changed = Buffer.from(r.body);
        changed[changed.length - 2] ^= 1;
        assert.throws(() => verify(SECRET, { headers: r.headers, body: changed }), /No matching signature/);
        assert.throws(() => verify(OTHER, r), /No matching signature/);
      }
      assert.deepEqual(
        (await rows(inbox, "app")).map((r) => r.status),
        ["done", "done", "done"],
      );
      const text = await metrics.text();
      assert.match(text, /inbox_forwards_total\{destination="app",outcome="done"\} 3/);
      assert.doesNotMatch(text, /evt_\d/, "no delivery ID in any label");
    });

    it("signs with every secret while the app rotates: the old one and the new one each verify", async () => {
      const inbox = await open();
      const app = await serve();
      await inbox.store({ id: "evt_1", body: body({ a: 1 }), destinations: ["app"] });
      await forward({
        inbox,
        forwarding: config({ app: { url: app.url, secret: [SECRET, NEW_SECRET] } }),
        once: true,
        log: () => {},
      });
      assert.equal(app.got.length, 1);
      assert.ok(verify(SECRET, app.got[0]!));
      assert.ok(verify(NEW_SECRET, app.got[0]!));
      assert.throws(() => verify(OTHER, app.got[0]!));
    });

    it("keeps each destination's state apart: one failing retries on its own while the other and the handler go on", async () => {
      const inbox = await open();
      const ok = await serve();
      const failing = await serve(() => ({ status: 500, body: `boom ${"x".repeat(400)}` }));
      for (let i = 0; i < 5; i++)
        assert.equal(
          await inbox.store({ id: `evt_${i}`, body: body({ i }), destinations: ["handler", "a", "b"] }),
          "stored",
        );
      // A copy is a duplicate for every route, and a conflicting one is counted once.
      assert.equal(
        await inbox.store({ id: "evt_0", body: body({ i: 0 }), destinations: ["handler", "a", "b"] }),
        "duplicate",
      );
      assert.equal(
        await inbox.store({ id: "evt_0", body: body({ other: true }), destinations: ["handler", "a", "b"] }),
        "conflict",
      );
      assert.deepEqual((await inbox.status()).conflicts, { deliveries: 1, copies: 1 });
      await forward({
        inbox,
        forwarding: config({
          a: { url: ok.url, secret: SECRET },
          b: { url: failing.url, secret: SECRET, breaker: false },
        }),
        once: true,
        log: () => {},
      });
      assert.equal(ok.got.length, 5);
      assert.equal(failing.got.length, 5);
      assert.deepEqual(
        (await rows(inbox, "a")).map((r) => r.status),
        Array(5).fill("done"),
      );
      const b = await rows(inbox, "b");
      assert.deepEqual(
        b.map((r) => [r.status, Number(r.attempts)]),
        Array(5).fill(["received", 1]),
      );
      assert.ok(Number(b[0]!.available_at) > t, "retried after a backoff");
      // The handler's rows were not touched by either: the worker's handler takes them.
      assert.deepEqual(
        (await rows(inbox, "handler")).map((r) => [r.status, Number(r.attempts)]),
        Array(5).fill(["received", 0]),
      );
      // The first bytes of the failed answer are kept for the delivery's page, and no more.
      const [d] = (await inbox.find("evt_0")).filter((x) => x.destination === "b");
      const tries = await inbox.attempts({ ...d!, destination: "b" });
      assert.equal(tries.length, 1);
      assert.match(tries[0]!.error!, /^HTTP 500 from b: boom x+$/);
      assert.ok(tries[0]!.error!.length < 300);
      const states = new Map((await inbox.destinations()).map((s) => [s.name, s]));
      assert.equal(states.get("b")!.waiting, 5);
      assert.equal(states.get("b")!.failureRate, 1);
      assert.match(states.get("b")!.lastError!, /HTTP 500/);
      assert.equal(states.get("a")!.failureRate, 0);
      assert.equal(states.get("handler")!.waiting, 5);
    });

    it("answers by the table: 429 waits out Retry-After, 410 pauses with no attempt spent, a 4xx is permanent only where the route says so", async () => {
      const inbox = await open({ retryCapMs: 600_000 });
      const operatorGot: Received[] = [];
      const ops = await serve((r) => (operatorGot.push(r), { status: 200 }));
      const busy = await serve(() => ({ status: 429, headers: { "retry-after": "120" } }));
      const gone = await serve(() => ({ status: 410, body: "this endpoint was deleted" }));
      const strict = await serve(() => ({ status: 400, body: "bad shape" }));
      const lax = await serve(() => ({ status: 400, body: "bad shape" }));
      await inbox.store({ source: "s", id: "evt_1", body: body({}), destinations: ["busy", "gone", "strict", "lax"] });
      const forwarding = config(
        {
          busy: { url: busy.url, secret: SECRET },
          gone: { url: gone.url, secret: SECRET },
          strict: { url: strict.url, secret: SECRET },
          lax: { url: lax.url, secret: SECRET },
        },
        { $operator: { url: ops.url, secret: SECRET } },
      );
      const routes = new Map([
        [
          "s",
          [
            { to: "strict", permanent4xx: true, forwardHeaders: false },
            { to: "lax", permanent4xx: false, forwardHeaders: false },
          ],
        ],
      ]);
      await forward({ inbox, forwarding, routes, once: true, log: () => {} });
      const [r429] = await rows(inbox, "busy");
      assert.equal(r429!.status, "received");
      assert.ok(Number(r429!.available_at) >= T0 + 120_000, "no sooner than Retry-After");
      const [r410] = await rows(inbox, "gone");
      assert.deepEqual([r410!.status, Number(r410!.attempts)], ["received", 0]);
      const goneState = (await inbox.destinations()).find((d) => d.name === "gone")!;
      assert.equal(goneState.state, "paused");
      assert.match(goneState.pausedReason!, /HTTP 410 from gone: this endpoint was deleted/);
      assert.equal((await rows(inbox, "strict"))[0]!.status, "failed");
      assert.equal((await rows(inbox, "lax"))[0]!.status, "received");
      // The operator heard of the pause and of the delivery set aside, each a signed Standard Webhooks event.
      await waitFor(() => operatorGot.length >= 2);
      const events = operatorGot.map((r) => verify(SECRET, r) as { type: string; data: Record<string, unknown> });
      assert.deepEqual(events.map((e) => [e.type, e.data.destination]).sort(), [
        ["delivery.set_aside", "strict"],
        ["destination.paused", "gone"],
      ]);
      // Paused, it is asked nothing more, however long the test waits.
      t += 3_600_000;
      await forward({
        inbox,
        forwarding: config({ gone: { url: gone.url, secret: SECRET } }),
        once: true,
        log: () => {},
      });
      assert.equal(gone.got.length, 1);
    });

    it("announces a delivery its claim set aside because the worker forwarding it died on the last attempt", async () => {
      const inbox = await open({ maxAttempts: 2 });
      const operatorGot: Received[] = [];
      const ops = await serve((r) => (operatorGot.push(r), { status: 200 }));
      const app = await serve();
      await inbox.store({ source: "s", id: "evt_1", body: body({}), destinations: ["app"] });
      // Two workers took it and died with it, the second on its last attempt; the lease has run out.
      assert.equal((await inbox.claim(1_000, { destination: "app" }))!.attempts, 1);
      t += 1_001;
      assert.equal((await inbox.claim(1_000, { destination: "app" }))!.attempts, 2);
      t += 1_001;
      const lines: string[] = [];
      const stats = await forward({
        inbox,
        forwarding: config({ app: { url: app.url, secret: SECRET } }, { $operator: { url: ops.url, secret: SECRET } }),
        once: true,
        log: (line) => lines.push(line),
      });
      assert.equal(app.got.length, 0, "not forwarded a third time");
      assert.equal(stats.failed, 1);
      assert.equal((await rows(inbox, "app"))[0]!.status, "failed");
      assert.ok(
        lines.some((l) => /s\/evt_1 → app set aside after 2 attempts: gave up: the lease expired/.test(l)),
        lines.join("\n"),
      );
      await waitFor(() => operatorGot.length >= 1);
      const [event] = operatorGot.map((r) => verify(SECRET, r) as { type: string; data: Record<string, unknown> });
      assert.equal(event!.type, "delivery.set_aside");
      assert.deepEqual(
        { ...event!.data, error: undefined },
        { source: "s", id: "evt_1", destination: "app", attempts: 2, error: undefined },
      );
      assert.match(String(event!.data.error), /^gave up: the lease expired on the last attempt/);
    });

    it("counts a hanging destination's timeout and a refused connection as failures to retry", async () => {
      const inbox = await open();
      const hang = await serve(() => "hang");
      const closed = await serve();
      const refusedUrl = closed.url;
      await closed.close();
      servers.pop();
      await inbox.store({ id: "evt_1", body: body({}), destinations: ["hang", "refused"] });
      await forward({
        inbox,
        forwarding: config({
          hang: { url: hang.url, secret: SECRET, timeout: 0.3 },
          refused: { url: refusedUrl, secret: SECRET },
        }),
        once: true,
        log: () => {},
      });
      const [h] = await rows(inbox, "hang");
      assert.deepEqual([h!.status, Number(h!.attempts)], ["received", 1]);
      assert.match(String(h!.error), /hang did not answer within 300 ms/);
      const [r] = await rows(inbox, "refused");
      assert.match(String(r!.error), /ECONNREFUSED/);
    });

    it("opens a destination that is down, spends no attempt while open, leaves the other alone, and a probe closes it when it is back", async () => {
      const inbox = await open({ retryDelayMs: 1_000 });
      const operatorGot: Received[] = [];
      const ops = await serve((r) => (operatorGot.push(r), { status: 204 }));
      const down = await serve(() => ({ status: 503 }));
      const up = await serve();
      for (let i = 0; i < 10; i++)
        await inbox.store({ id: `evt_${i}`, body: body({ i }), destinations: ["down", "up"] });
      const forwarding = config(
        {
          down: { url: down.url, secret: SECRET, maxInFlight: 1, breaker: { failures: 3, coolDown: 30 } },
          up: { url: up.url, secret: SECRET },
        },
        { $operator: { url: ops.url, secret: SECRET } },
      );
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(up.got.length, 10, "the healthy destination got everything");
      assert.equal(down.got.length, 3, "three failures in a row opened it");
      const attempts = (await rows(inbox, "down")).map((r) => Number(r.attempts));
      assert.deepEqual(attempts.filter((a) => a === 0).length, 7, "the rest wait without spending an attempt");
      let state = (await inbox.destinations()).find((d) => d.name === "down")!;
      assert.equal(state.state, "open");
      assert.equal(state.retryAt, T0 + 30_000);
      // Before the cool-down, nothing goes.
      t += 29_000;
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(down.got.length, 3);
      // It comes back; after the cool-down one probe decides, and everything arrives.
      down.answer(() => ({ status: 200 }));
      t += 2_000;
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(new Set(down.got.slice(3).map((r) => r.headers["webhook-id"])).size, 10);
      assert.deepEqual(
        (await rows(inbox, "down")).map((r) => r.status),
        Array(10).fill("done"),
      );
      state = (await inbox.destinations()).find((d) => d.name === "down")!;
      assert.equal(state.state, "closed");
      // The operator heard both, signed as Standard Webhooks events.
      await waitFor(() => operatorGot.length >= 2);
      const events = operatorGot.map((r) => verify(SECRET, r) as { type: string; data: { destination: string } });
      assert.deepEqual(
        events.map((e) => [e.type, e.data.destination]),
        [
          ["destination.opened", "down"],
          ["destination.closed", "down"],
        ],
      );
    });

    it("does not count against the destination's breaker the tries it cut off itself when another worker took their leases", async () => {
      const inbox = await open();
      const slow = await serve(() => "hang");
      for (let i = 0; i < 5; i++) await inbox.store({ id: `evt_${i}`, body: body({ i }), destinations: ["slow"] });
      const forwarding = config({
        slow: { url: slow.url, secret: SECRET, maxInFlight: 5, breaker: { failures: 3, coolDown: 30 } },
      });
      const forwarded = forward({ inbox, forwarding, once: true, leaseMs: 300, log: () => {} });
      await waitFor(() => slow.got.length === 5);
      // Another worker's claim after these leases ran out (this one's event loop stalled): new tokens.
      await inbox.query("UPDATE deliveries SET lease_token = 'taken over' WHERE status = 'processing'");
      const stats = await forwarded;
      assert.equal(stats.lost, 5, "each try was cut off as its lease was lost");
      const state = (await inbox.destinations()).find((d) => d.name === "slow");
      assert.equal(
        state?.state ?? "closed",
        "closed",
        "five cut-off tries, over the three failures that open it, left it closed",
      );
      assert.equal(state?.failuresInRow ?? 0, 0);
    });

    it("control: with no breaker, the same outage spends an attempt on every delivery", async () => {
      const inbox = await open({ retryDelayMs: 1_000 });
      const down = await serve(() => ({ status: 503 }));
      for (let i = 0; i < 10; i++) await inbox.store({ id: `evt_${i}`, body: body({ i }), destinations: ["down"] });
      await forward({
        inbox,
        forwarding: config({ down: { url: down.url, secret: SECRET, maxInFlight: 1, breaker: false } }),
        once: true,
        log: () => {},
      });
      assert.equal(down.got.length, 10);
      assert.ok((await rows(inbox, "down")).every((r) => Number(r.attempts) === 1));
    });

    it("holds a paused destination's deliveries, nothing discarded and no attempt spent, and sends each once after resume", async () => {
      const inbox = await open();
      const app = await serve();
      assert.equal(await inbox.pause("app"), true);
      assert.equal(await inbox.pause("app"), false, "already paused");
      for (let i = 0; i < 25; i++) await inbox.store({ id: `evt_${i}`, body: body({ i }), destinations: ["app"] });
      const forwarding = config({ app: { url: app.url, secret: SECRET } });
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(app.got.length, 0);
      assert.ok((await rows(inbox, "app")).every((r) => r.status === "received" && Number(r.attempts) === 0));
      assert.equal((await inbox.destinations()).find((d) => d.name === "app")!.state, "paused");
      assert.equal(await inbox.resume("app"), true);
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(app.got.length, 25);
      assert.equal(new Set(app.got.map((r) => r.headers["webhook-id"])).size, 25);
    });

    it("gives a lease back unsent when its destination was paused while its transform ran, and sends it once after resume", async () => {
      const inbox = await open();
      const app = await serve();
      // The pause commits right after the wave's permit, as one committed while a transform ran would: the
      // forwarder must read it again once the transform returns. Without a transform (the control) the send
      // follows the permit at once, and goes.
      const pausedAfterPermit = (): Inbox => {
        let first = true;
        const permit: Inbox["permit"] = async (name, n, rate) => {
          const answer = await inbox.permit(name, n, rate);
          if (first) {
            first = false;
            await inbox.pause(name);
          }
          return answer;
        };
        return Object.assign(Object.create(inbox) as Inbox, { permit });
      };
      await inbox.store({ id: "plain", body: body({}), destinations: ["app"] });
      const plain = config({ app: { url: app.url, secret: SECRET } });
      await forward({ inbox: pausedAfterPermit(), forwarding: plain, once: true, log: () => {} });
      assert.equal(app.got.length, 1, "control: the pause after the permit does not stop a send with no transform");
      assert.equal(await inbox.resume("app"), true);

      await inbox.store({ id: "shaped", body: body({}), destinations: ["app"] });
      const shaped = config({
        app: { url: app.url, secret: SECRET, transform: { code: "export default (d) => ({ body: { id: d.id } })" } },
      });
      await forward({ inbox: pausedAfterPermit(), forwarding: shaped, once: true, log: () => {} });
      assert.equal(app.got.length, 1, "the transformed forward was not sent after the pause");
      const [row] = (await rows(inbox, "app")).filter((r) => r.id === "shaped");
      assert.deepEqual([row!.status, Number(row!.attempts)], ["received", 0], "its lease went back, no attempt spent");
      assert.equal(await inbox.resume("app"), true);
      await forward({ inbox, forwarding: shaped, once: true, log: () => {} });
      assert.equal(app.got.length, 2);
      assert.deepEqual(JSON.parse(app.got[1]!.body.toString()), { id: "shaped" });
    });

    it("routes a delivery after the fact only when asked: replay --to adds its row there, and a second replay sends it again", async () => {
      const inbox = await open();
      const app = await serve();
      await inbox.store({ source: "s", id: "evt_old", body: body({ old: true }), destinations: ["handler"] });
      await inbox.store({ source: "s", id: "evt_other", body: body({ other: true }), destinations: ["handler"] });
      const forwarding = config({ app: { url: app.url, secret: SECRET } });
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(app.got.length, 0, "a route added later does not reach old deliveries");
      assert.deepEqual(await inbox.replayMatching({ id: "evt_old" }, { to: "app", dryRun: true }), {
        replayed: 1,
        tombstoned: 0,
      });
      assert.deepEqual(await inbox.replayMatching({ id: "evt_old" }, { to: "app" }), { replayed: 1, tombstoned: 0 });
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(app.got.length, 1);
      assert.equal(app.got[0]!.headers["webhook-id"], "s:evt_old");
      assert.deepEqual(app.got[0]!.body, body({ old: true }));
      const [row] = (await inbox.find("evt_old", "s")).filter((d) => d.destination === "app");
      assert.deepEqual([row!.route, row!.status], [1, "done"]);
      assert.deepEqual(await inbox.replayMatching({ id: "evt_old" }, { to: "app" }), { replayed: 1, tombstoned: 0 });
      await forward({ inbox, forwarding, once: true, log: () => {} });
      assert.equal(app.got.length, 2);
    });

    it("forwards the provider's own headers only where the destination asks, never its hop-by-hop ones", async () => {
      const inbox = await open();
      const withHeaders = await serve();
      const without = await serve();
      const headers = {
        "stripe-signature": ["t=1,v1=abc"],
        connection: ["keep-alive"],
        "content-length": ["12"],
        "x-custom": ["a", "b"],
      };
      await inbox.store({ id: "evt_1", body: body({}), destinations: ["with", "without"], headers });
      await forward({
        inbox,
        log: () => {},
        once: true,
        forwarding: config({
          with: { url: withHeaders.url, secret: SECRET, forwardHeaders: true },
          without: { url: without.url, secret: SECRET },
        }),
      });
      assert.equal(withHeaders.got[0]!.headers["stripe-signature"], "t=1,v1=abc");
      assert.equal(withHeaders.got[0]!.headers["x-custom"], "a, b");
      assert.equal(withHeaders.got[0]!.headers["content-length"], "2");
      assert.equal(without.got[0]!.headers["stripe-signature"], undefined);
    });

    it("holds a shared rate limit: a claim takes no more than the tokens every worker draws from", async () => {
      const inbox = await open();
      for (let i = 0; i < 20; i++) await inbox.store({ id: `evt_${i}`, body: body({ i }), destinations: ["app"] });
      const other = await open();
      const rate = { perSecond: 5, burst: 5 };
      assert.equal((await inbox.claimBatch(20, 60_000, { destination: "app", rate })).length, 5);
      assert.equal(
        (await other.claimBatch(20, 60_000, { destination: "app", rate })).length,
        0,
        "another worker finds the bucket empty",
      );
      t += 1_000;
      assert.equal((await other.claimBatch(20, 60_000, { destination: "app", rate })).length, 5);
      assert.equal(
        (await inbox.claimBatch(20, 60_000, { destination: "app", maxInFlight: 12 })).length,
        2,
        "in flight counts every worker's leases",
      );
    });
  });
}

describe("judge()", () => {
  const at = T0;
  it("reads the answer table", () => {
    assert.deepEqual(judge(200, {}, "", "app", false, at), { kind: "done" });
    assert.deepEqual(judge(204, {}, "", "app", false, at), { kind: "done" });
    assert.equal(judge(410, {}, "", "app", false, at).kind, "gone");
    assert.deepEqual(judge(429, { "retry-after": "30" }, "", "app", false, at), {
      kind: "retry",
      error: "HTTP 429 from app",
      afterMs: 30_000,
    });
    assert.deepEqual(judge(503, { "retry-after": new Date(at + 5_000).toUTCString() }, "", "app", false, at), {
      kind: "retry",
      error: "HTTP 503 from app",
      afterMs: 5_000,
    });
    assert.deepEqual(judge(503, {}, "down", "app", false, at), { kind: "retry", error: "HTTP 503 from app: down" });
    for (const status of [408, 409, 425, 429])
      assert.equal(
        judge(status, {}, "", "app", true, at).kind,
        "retry",
        `${status} retries even where 4xx is permanent`,
      );
    assert.equal(judge(400, {}, "", "app", true, at).kind, "failed");
    assert.equal(judge(422, {}, "", "app", false, at).kind, "retry");
    assert.equal(judge(500, {}, "", "app", true, at).kind, "retry");
    assert.match(
      (judge(302, { location: "https://elsewhere/" }, "", "app", false, at) as { error: string }).error,
      /redirect to https:\/\/elsewhere\/, not followed/,
    );
  });
  it("reads Retry-After as seconds or a date, and ignores what it cannot read", () => {
    assert.equal(retryAfterMs("7", at), 7_000);
    assert.equal(retryAfterMs(new Date(at - 1_000).toUTCString(), at), 0);
    assert.equal(retryAfterMs("soon", at), undefined);
    assert.equal(retryAfterMs(undefined, at), undefined);
  });
});

async function waitFor(condition: () => boolean, ms = 5_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("timed out waiting");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}
