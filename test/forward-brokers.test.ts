// test/forward-brokers.test.ts: broker destinations in the forwarder's lanes, on both backends, against the
// real servers: their answers go through the same breaker, retries, metrics and destinations view as an
// HTTP destination's. A JetStream subject that no stream captures (or a RabbitMQ routing key no queue takes)
// fails each publish as a 503 would: retried, the breaker opens after its failures in a row, no attempt is
// spent while it is open, the metrics count each outcome, and inbox.destinations() shows the last error;
// once a stream captures the subject (a queue is bound), the probe closes it and every delivery arrives.
// The inbox's clock is pinned, so the cool-down passes when the test says. Control: with no breaker, the same
// outage spends an attempt on every delivery.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { afterEach, beforeEach, describe, it } from "node:test";
import parsePrometheusTextFormat from "parse-prometheus-text-format";
import { brokerSender, HEADERS, parseBrokerDestination } from "../lib/brokers.ts";
import type { Sender } from "../lib/forwarding/forward.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { connect } from "../inbox.ts";
import { Metrics } from "../lib/metrics.ts";
import { loadDestinations, type Forwarding } from "../lib/routing/routes.ts";
import type { Inbox } from "../lib/store.ts";
import { backends, NATS, natsSkip, RABBITMQ, rabbitmqSkip } from "./helpers.ts";
import { jetStreamSuite, rabbitSuite } from "./brokers-suite.ts";

const T0 = 1_700_000_000_000;
const run = randomBytes(4).toString("hex");
const natsSkipped = await natsSkip();
const rabbitSkipped = await rabbitmqSkip();

// forwarding reads one broker destination as the worker does: routes.ts for the lane's settings, brokers.ts
// for the broker's own, and its sender for forward().
function destination(settings: Record<string, unknown>): {
  forwarding: Forwarding;
  senders: Map<string, Sender>;
  close: () => Promise<void>;
} {
  const check = (name: string, s: Record<string, unknown>, where: string) =>
    void parseBrokerDestination(name, s, where, {});
  const forwarding = loadDestinations({ $destinations: { events: settings } }, {}, { brokerCheck: check });
  const sender = brokerSender(parseBrokerDestination("events", settings, "events", {}));
  return { forwarding, senders: new Map([["events", sender]]), close: () => sender.close() };
}

// forwardsBy reads inbox_forwards_total for the destination, by outcome.
async function forwardsBy(metrics: Metrics): Promise<Record<string, number>> {
  const families = parsePrometheusTextFormat(await metrics.registry.metrics()) as {
    name: string;
    metrics: { labels?: Record<string, string>; value?: string }[];
  }[];
  const family = families.find((f) => f.name === "inbox_forwards_total");
  const out: Record<string, number> = {};
  for (const m of family?.metrics ?? [])
    if (m.labels?.destination === "events") out[m.labels.outcome!] = Number(m.value);
  return out;
}

for (const backend of await backends("fwd_brokers")) {
  describe(`broker destinations in the forwarder's lanes, on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let inbox: Inbox;
    let t: number;
    const closers: (() => Promise<void>)[] = [];
    beforeEach(async () => {
      ({ target, cleanup } = await backend.make());
      t = T0;
      inbox = await connect(target, { now: () => t, random: () => 0, retryDelayMs: 1_000 });
    });
    afterEach(async () => {
      for (const close of closers.splice(0).reverse()) await close();
      await inbox.close();
      await cleanup();
    });
    const store = async (n: number) => {
      for (let i = 0; i < n; i++)
        await inbox.store({
          source: "shop",
          id: `evt_${i}`,
          body: Buffer.from(JSON.stringify({ i })),
          eventType: "order.paid",
          destinations: ["events"],
        });
    };
    const attempts = async () =>
      (await inbox.query("SELECT attempts FROM deliveries WHERE destination = 'events' ORDER BY id")).map((r) =>
        Number(r.attempts),
      );

    // outage runs the common story against one broker: it fails, opens, waits, comes back, and closes.
    async function outage(
      settings: Record<string, unknown>,
      comeBack: () => Promise<void>,
      arrived: () => Promise<string[]>,
    ): Promise<void> {
      await store(10);
      const d = destination({ ...settings, maxInFlight: 1, breaker: { failures: 3, coolDown: 30 } });
      closers.push(d.close);
      const metrics = new Metrics({ inbox, processMetrics: false });
      await forward({ inbox, forwarding: d.forwarding, senders: d.senders, once: true, log: () => {}, metrics });
      assert.deepEqual(await forwardsBy(metrics), { retry: 3 }, "three publishes failed, each counted, then it opened");
      assert.equal((await attempts()).filter((a) => a === 0).length, 7, "the rest wait without spending an attempt");
      let state = (await inbox.destinations()).find((s) => s.name === "events")!;
      assert.equal(state.state, "open");
      assert.equal(state.retryAt, T0 + 30_000);
      assert.ok(state.lastError && state.lastError.length > 0, "the last error is shown");
      t += 29_000;
      await forward({ inbox, forwarding: d.forwarding, senders: d.senders, once: true, log: () => {}, metrics });
      assert.deepEqual(await forwardsBy(metrics), { retry: 3 }, "nothing goes before the cool-down");
      await comeBack();
      t += 2_000;
      await forward({ inbox, forwarding: d.forwarding, senders: d.senders, once: true, log: () => {}, metrics });
      assert.deepEqual(await forwardsBy(metrics), { retry: 3, done: 10 });
      state = (await inbox.destinations()).find((s) => s.name === "events")!;
      assert.equal(state.state, "closed", "the probe closed it");
      assert.deepEqual((await arrived()).sort(), Array.from({ length: 10 }, (_, i) => `evt_${i}`).sort());
    }

    describe("NATS JetStream", { skip: natsSkipped }, () => {
      const jet = jetStreamSuite(NATS);
      const made = jet.made;

      it("opens on a subject no stream captures, spends no attempt while open, and closes with the probe once a stream takes it", async () => {
        const stream = `FWDB_${run}_${backend.name}`;
        const subject = `fwdb${run}${backend.name}`;
        await outage(
          { type: "nats", url: NATS, subject: `${subject}.{source}.{type}`, timeoutMs: 2_000 },
          async () => {
            made.push(stream);
            await jet.jsm.streams.add({ name: stream, subjects: [`${subject}.>`] });
          },
          async () => {
            const info = await jet.jsm.streams.info(stream);
            const ids: string[] = [];
            for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++)
              ids.push((await jet.jsm.streams.getMessage(stream, { seq }))!.header.get(HEADERS.id));
            return ids;
          },
        );
      });

      it("control: with no breaker, the same outage spends an attempt on every delivery", async () => {
        await store(10);
        const d = destination({
          type: "nats",
          url: NATS,
          subject: `fwdbnone${run}.{source}`,
          timeoutMs: 2_000,
          maxInFlight: 1,
          breaker: false,
        });
        closers.push(d.close);
        await forward({ inbox, forwarding: d.forwarding, senders: d.senders, once: true, log: () => {} });
        assert.deepEqual(await attempts(), Array(10).fill(1));
      });
    });

    describe("RabbitMQ", { skip: rabbitSkipped }, () => {
      const queue = `inbox-fwdb-${run}-${backend.name}`;
      const rabbit = rabbitSuite(RABBITMQ, queue);

      it("opens on a routing key no queue takes, and closes with the probe once the queue is there", async () => {
        await outage(
          { type: "rabbitmq", url: RABBITMQ, routingKey: queue, timeoutMs: 2_000 },
          async () => {
            await rabbit.channel.assertQueue(queue, { durable: true });
          },
          async () => {
            const ids: string[] = [];
            for (
              let m = await rabbit.channel.get(queue, { noAck: true });
              m !== false;
              m = await rabbit.channel.get(queue, { noAck: true })
            )
              ids.push(String(m.properties.headers?.[HEADERS.id]));
            return ids;
          },
        );
      });
    });
  });
}
