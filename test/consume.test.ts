// test/consume.test.ts: broker sources (lib/consume.ts) against the real NATS JetStream and RabbitMQ, on
// SQLite and PostgreSQL: which identity a message is stored under, duplicates past JetStream's own window
// and RabbitMQ's repeated message-id, a poison message refused and dead-lettered while the rest flow, and a
// store that is down leaving every message with the broker. The sources file's "broker" is checked too.
//   npx node --import tsx --test test/consume.test.ts

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";
import { headers as natsHeaders, connect as natsConnect } from "@nats-io/transport-node";
import { AckPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import amqp from "amqplib";
import { connect, type Inbox } from "../inbox.ts";
import { createAdmin, listenAdmin } from "../lib/admin/server.ts";
import { brokerLines, Consumer, type BrokerSource } from "../lib/consume.ts";
import { Metrics } from "../lib/metrics.ts";
import { loadSources } from "../lib/config/sources.ts";
import { backends, NATS, natsSkip, RABBITMQ, rabbitmqSkip, runScript, tempDir } from "./helpers.ts";

const run = randomBytes(3).toString("hex");
const natsSkipped = await natsSkip();
const rabbitSkipped = await rabbitmqSkip();
const silent = () => {};

// until waits for a condition the consumer reaches on its own, polling, for at most ten seconds.
async function until(what: string, ok: () => boolean | Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!(await ok())) {
    assert.ok(Date.now() < deadline, `within ten seconds: ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe("the sources file's broker", () => {
  it("takes a JetStream or RabbitMQ source beside the HTTP ones, checked by the same loader", () => {
    const sources = loadSources(
      {
        stripe: { provider: "stripe", secret: "whsec_x" },
        orders: { broker: { type: "nats", stream: "ORDERS", consumer: "inbox", filter: "orders.>" } },
        billing: { provider: "plain", broker: { type: "rabbitmq", queue: "billing", idHeader: "x-id" } },
      },
      {},
    );
    assert.equal(sources.get("stripe")!.broker, undefined);
    assert.deepEqual(sources.get("orders")!.broker, {
      type: "nats",
      servers: ["nats://127.0.0.1:4222"],
      timeoutMs: 5_000,
      stream: "ORDERS",
      consumer: "inbox",
      maxAckPending: 512,
      ackWaitMs: 30_000,
      filter: "orders.>",
    });
    assert.equal(sources.get("billing")!.broker!.type, "rabbitmq");
  });

  it("refuses a mistake with one line naming the source, and never says a secret", () => {
    const load = (broker: unknown, provider?: string) =>
      loadSources({ orders: { ...(provider ? { provider, secret: "s" } : {}), broker } }, { PASS: "hunter2" });
    assert.throws(() => load({ type: "kafka" }), /source "orders": broker: expected type to be nats or rabbitmq/);
    assert.throws(() => load({ type: "nats", consumer: "c" }), /missing stream/);
    assert.throws(() => load({ type: "rabbitmq", queue: "q", subject: "x" }), /unknown setting "subject"/);
    assert.throws(() => load({ type: "nats", stream: "S", consumer: "c" }, "github"), /takes provider "plain" or none/);
    assert.throws(
      () => load({ type: "nats", stream: "S", consumer: "c", url: "nats://x", user: "u", pass: "env:NOPE" }),
      (e: Error) => /NOPE, which is not set/.test(e.message) && !e.message.includes("hunter2"),
    );
  });
});

describe("Consumer.store()", () => {
  it("keeps the headers a route's filter read, as the receiver does, so preview sees what the filter saw (control: a route that reads none keeps none)", async () => {
    const dir = tempDir();
    const inbox = await connect(join(dir.dir, "inbox.db"));
    try {
      const sources = loadSources(
        {
          // hooks does not forward headers: the filter alone must keep them.
          $destinations: { hooks: { url: "http://127.0.0.1:9/" } },
          orders: {
            broker: { type: "nats", stream: "ORDERS", consumer: "inbox" },
            routes: [{ to: "hooks", filter: { headers: { "x-topic": "orders/create" } } }],
          },
          billing: { broker: { type: "nats", stream: "BILLING", consumer: "inbox" }, routes: ["hooks"] },
        },
        {},
      );
      const headers = { "x-topic": ["orders/create"] };
      const arrived = {
        id: "m1",
        body: Buffer.from("{}"),
        eventType: null,
        contentType: null,
        headers,
        redelivered: false,
      };
      for (const [name, kept] of [
        ["orders", headers],
        ["billing", null],
      ] as const) {
        const source = { ...sources.get(name)!, broker: sources.get(name)!.broker! };
        assert.equal(await new Consumer({ inbox, source, log: silent }).store(arrived), "stored");
        const [d] = (await inbox.find("m1")).filter((x) => x.source === name);
        assert.equal(d!.destination, "hooks", `${name}: its route took it`);
        assert.deepEqual(d!.headers, kept, `${name}: the headers kept`);
      }
    } finally {
      await inbox.close();
      dir.cleanup();
    }
  });
});

for (const backend of await backends("consume")) {
  describe(`JetStream source on ${backend.name}`, { skip: natsSkipped || backend.skip }, () => {
    it("stores by Nats-Msg-Id, else stream:sequence:stored time, byte for byte; the same ID past the server's duplicate window is one delivery", async () => {
      const { target, cleanup } = await backend.make();
      const nc = await natsConnect({ servers: NATS });
      const jsm = await jetstreamManager(nc);
      const stream = `I40T_${run}_${backend.name}`;
      // 100 ms, the least JetStream takes: a copy published after it is a second message in the stream.
      await jsm.streams.add({ name: stream, subjects: [`i40t.${run}.${backend.name}.>`], duplicate_window: 100e6 });
      const js = jetstream(nc);
      const subject = `i40t.${run}.${backend.name}.order.paid`;
      const withId = () => {
        const h = natsHeaders();
        h.set("Nats-Msg-Id", "evt_1");
        h.set("Content-Type", "application/json");
        return h;
      };
      const raw = Buffer.from([0x7b, 0xff, 0x00, 0xfe, 0x7d]);
      await js.publish(subject, '{"n":1}', { headers: withId() });
      await new Promise((r) => setTimeout(r, 300));
      const again = await js.publish(subject, '{"n":1}', { headers: withId() });
      assert.equal(again.duplicate, false, "outside its window, the stream took the copy as a new message");
      const plain = await js.publish(subject, raw);
      const inbox = await connect(target);
      const broker: BrokerSource = {
        type: "nats",
        servers: [NATS],
        timeoutMs: 5_000,
        stream,
        consumer: "inbox",
        maxAckPending: 16,
        ackWaitMs: 30_000,
      };
      const c = new Consumer({ inbox, source: { name: "orders", broker }, log: silent });
      try {
        c.start();
        await until("three acked", () => c.counts.acked === 3);
        assert.equal(c.counts.stored, 2);
        assert.equal(c.counts.duplicate, 1);
        const first = (await inbox.find("evt_1", "orders"))[0];
        assert.equal(first!.eventType, subject);
        assert.equal(first!.contentType, "application/json");
        const [bySeq] = (await inbox.list({ source: "orders", limit: 10 })).filter((d) => d.id !== "evt_1");
        assert.match(
          bySeq!.id,
          new RegExp(`^${stream}:${plain.seq}:\\d{19}$`),
          "the stream, its sequence, its stored time",
        );
        assert.deepEqual((await inbox.find(bySeq!.id, "orders"))[0]!.body, raw, "the body byte for byte");
        await until("the consumer has nothing pending", async () => {
          const info = await jsm.consumers.info(stream, "inbox");
          return info.num_ack_pending === 0 && info.num_pending === 0;
        });
      } finally {
        await c.stop();
        await inbox.close();
        await jsm.streams.delete(stream);
        await nc.close();
        await cleanup();
      }
    });

    it("terminates a message too large to store, counts it, and the messages after it still flow", async () => {
      const { target, cleanup } = await backend.make();
      const nc = await natsConnect({ servers: NATS });
      const jsm = await jetstreamManager(nc);
      const stream = `I40P_${run}_${backend.name}`;
      await jsm.streams.add({ name: stream, subjects: [`i40p.${run}.${backend.name}`] });
      const js = jetstream(nc);
      await js.publish(`i40p.${run}.${backend.name}`, "x".repeat(2_000));
      for (let i = 0; i < 5; i++) await js.publish(`i40p.${run}.${backend.name}`, `{"i":${i}}`);
      const inbox = await connect(target);
      const broker: BrokerSource = {
        type: "nats",
        servers: [NATS],
        timeoutMs: 5_000,
        stream,
        consumer: "inbox",
        maxAckPending: 16,
        ackWaitMs: 30_000,
      };
      const lines: string[] = [];
      const c = new Consumer({
        inbox,
        source: { name: "orders", broker },
        log: (l) => lines.push(l),
        maxBodyBytes: 1_000,
      });
      try {
        c.start();
        await until("five acked", () => c.counts.acked === 5);
        assert.equal(c.counts.refused, 1);
        assert.equal(await inbox.count({ source: "orders" }), 5);
        assert.match(lines.join("\n"), /refused a message of orders.*over the 1000-byte limit/);
        await until("nothing pending: the poison terminated, not redelivered", async () => {
          const info = await jsm.consumers.info(stream, "inbox");
          return info.num_ack_pending === 0 && info.num_pending === 0;
        });
      } finally {
        await c.stop();
        await inbox.close();
        await jsm.streams.delete(stream);
        await nc.close();
        await cleanup();
      }
    });
  });

  describe(`JetStream AckProgress on ${backend.name}`, { skip: natsSkipped || backend.skip }, () => {
    it("keeps a message whose commit takes longer than ack_wait from being delivered again (control: a plain subscriber's is)", async () => {
      const { target, cleanup } = await backend.make();
      const nc = await natsConnect({ servers: NATS });
      const jsm = await jetstreamManager(nc);
      const stream = `I40A_${run}_${backend.name}`;
      await jsm.streams.add({ name: stream, subjects: [`i40a.${run}.${backend.name}`] });
      const js = jetstream(nc);
      await js.publish(`i40a.${run}.${backend.name}`, '{"slow":true}', { msgID: "evt_slow" });
      const real = await connect(target);
      // A slow inbox, not a fake one: each store waits 2.5 s before the real store runs.
      const slow = Object.create(real) as Inbox;
      slow.store = async (incoming) => {
        await new Promise((r) => setTimeout(r, 2_500));
        return real.store(incoming);
      };
      const broker: BrokerSource = {
        type: "nats",
        servers: [NATS],
        timeoutMs: 5_000,
        stream,
        consumer: "inbox",
        maxAckPending: 16,
        ackWaitMs: 1_000,
      };
      const c = new Consumer({ inbox: slow, source: { name: "orders", broker }, log: silent });
      try {
        c.start();
        await until("acked", () => c.counts.acked === 1);
        assert.equal(c.counts.consumed, 1, "delivered once, though the store took 2.5 ack waits");
        assert.equal((await jsm.consumers.info(stream, "inbox")).num_redelivered, 0);
        await c.stop();
        // The control: a consumer of the same stream that holds the message as long, without AckProgress.
        await jsm.consumers.add(stream, { durable_name: "plain", ack_policy: AckPolicy.Explicit, ack_wait: 1_000e6 });
        const plain = await js.consumers.get(stream, "plain");
        const messages = await plain.consume({ max_messages: 4 });
        let deliveries = 0;
        for await (const m of messages) {
          deliveries++;
          if (deliveries === 1) setTimeout(() => m.ack(), 2_500);
          else {
            m.ack();
            break;
          }
        }
        assert.equal(deliveries, 2, "without AckProgress the server delivered it again");
      } finally {
        await c.stop();
        await real.close();
        await jsm.streams.delete(stream);
        await nc.close();
        await cleanup();
      }
    });
  });

  describe(`RabbitMQ source on ${backend.name}`, { skip: rabbitSkipped || backend.skip }, () => {
    // A queue whose dead-letter exchange routes refused messages to a queue of their own.
    async function queues(tag: string) {
      const model = await amqp.connect(RABBITMQ);
      const ch = await model.createConfirmChannel();
      const queue = `i40r.${run}.${backend.name}.${tag}`;
      await ch.assertQueue(`${queue}.dlq`, { durable: true });
      await ch.assertQueue(queue, {
        durable: true,
        arguments: { "x-dead-letter-exchange": "", "x-dead-letter-routing-key": `${queue}.dlq` },
      });
      return {
        ch,
        queue,
        depth: async (q: string) => (await ch.checkQueue(q)).messageCount,
        close: async () => {
          await ch.deleteQueue(queue).catch(() => {});
          await ch.deleteQueue(`${queue}.dlq`).catch(() => {});
          await model.close();
        },
      };
    }
    const source = (queue: string): BrokerSource => ({
      type: "rabbitmq",
      url: RABBITMQ,
      timeoutMs: 5_000,
      queue,
      prefetch: 16,
      idHeader: "x-id",
    });

    it("stores by message-id, else the named header; the same message-id twice is one delivery, and a message with no ID is dead-lettered while the rest flow", async () => {
      const { target, cleanup } = await backend.make();
      const q = await queues("ids");
      q.ch.sendToQueue(q.queue, Buffer.from('{"a":1}'), { messageId: "evt_a", persistent: true });
      q.ch.sendToQueue(q.queue, Buffer.from('{"a":1}'), { messageId: "evt_a", persistent: true });
      q.ch.sendToQueue(q.queue, Buffer.from("no id at all"), { persistent: true });
      q.ch.sendToQueue(q.queue, Buffer.from('{"b":1}'), { headers: { "x-id": "evt_b" }, persistent: true });
      for (let i = 0; i < 5; i++) q.ch.sendToQueue(q.queue, Buffer.from(`{"i":${i}}`), { messageId: `evt_${i}` });
      await q.ch.waitForConfirms();
      const inbox = await connect(target);
      const lines: string[] = [];
      const c = new Consumer({
        inbox,
        source: { name: "billing", broker: source(q.queue) },
        log: (l) => lines.push(l),
      });
      const metrics = new Metrics({ inbox, processMetrics: false });
      metrics.consumedFrom("billing", c.counts);
      try {
        c.start();
        await until("eight acked", () => c.counts.acked === 8);
        const text = await metrics.text();
        for (const [result, n] of [
          ["stored", 7],
          ["duplicate", 1],
          ["refused", 1],
          ["acked", 8],
        ] as const)
          assert.match(text, new RegExp(`inbox_consumed_total\\{source="billing",result="${result}"\\} ${n}\\n`));
        assert.match(text, /inbox_consumer_lag\{source="billing"\} \d+/);
        assert.equal(c.counts.stored, 7);
        assert.equal(c.counts.duplicate, 1);
        assert.equal(c.counts.refused, 1);
        assert.equal(await inbox.count({ source: "billing" }), 7);
        assert.equal(
          (await inbox.find("evt_b", "billing"))[0]!.eventType,
          q.queue,
          "the routing key as the event type",
        );
        assert.match(
          lines.join("\n"),
          /refused a message of billing: no delivery ID: no message-id property, no x-id header/,
        );
        await until("the poison in the dead-letter queue", async () => (await q.depth(`${q.queue}.dlq`)) === 1);
      } finally {
        await c.stop();
        await inbox.close();
        await q.close();
        await cleanup();
      }
      assert.equal(c.counts.acked, 8);
    });

    it("stores by the body field a source names when there is no message-id, its type from another field; a body that is not JSON is refused", async () => {
      const { target, cleanup } = await backend.make();
      const q = await queues("fields");
      q.ch.sendToQueue(q.queue, Buffer.from('{"eventId":"evt_f1","kind":"order.paid"}'), { persistent: true });
      // The property wins over the field: the broker's own identity first.
      q.ch.sendToQueue(q.queue, Buffer.from('{"eventId":"evt_ignored","kind":"order.paid"}'), {
        messageId: "evt_f2",
        persistent: true,
      });
      q.ch.sendToQueue(q.queue, Buffer.from("eventId=evt_f3"), { persistent: true });
      await q.ch.waitForConfirms();
      const inbox = await connect(target);
      const lines: string[] = [];
      const broker: BrokerSource = {
        type: "rabbitmq",
        url: RABBITMQ,
        timeoutMs: 5_000,
        queue: q.queue,
        prefetch: 16,
        idField: "eventId",
        eventTypeField: "kind",
      };
      const c = new Consumer({ inbox, source: { name: "orders", broker }, log: (l) => lines.push(l) });
      try {
        c.start();
        await until("two acked, one refused", () => c.counts.acked === 2 && c.counts.refused === 1);
        assert.equal(c.counts.stored, 2);
        const f1 = (await inbox.find("evt_f1", "orders"))[0]!;
        assert.equal(f1.eventType, "order.paid", "the type from the named field, not the routing key");
        assert.equal(f1.body.toString(), '{"eventId":"evt_f1","kind":"order.paid"}', "byte for byte");
        assert.equal((await inbox.find("evt_f2", "orders")).length, 1);
        assert.equal((await inbox.find("evt_ignored", "orders")).length, 0);
        const said = lines.join("\n");
        assert.match(said, /refused a message of orders: the body is not JSON, so it has no eventId field/);
        await until("the refused body in the dead-letter queue", async () => (await q.depth(`${q.queue}.dlq`)) === 1);
      } finally {
        await c.stop();
        await inbox.close();
        await q.close();
        await cleanup();
      }
    });

    it("shows on inbox.ts status --sources and on the operator page how far behind its consumer is", async () => {
      const { target, cleanup } = await backend.make();
      const q = await queues("shown");
      for (let i = 0; i < 3; i++) q.ch.sendToQueue(q.queue, Buffer.from(`{"i":${i}}`), { messageId: `evt_${i}` });
      await q.ch.waitForConfirms();
      const dir = tempDir();
      const file = join(dir.dir, "sources.json");
      writeFileSync(file, JSON.stringify({ billing: { broker: { type: "rabbitmq", url: RABBITMQ, queue: q.queue } } }));
      const inbox = await connect(target);
      const admin = createAdmin({
        inbox,
        audit: silent,
        brokers: () => brokerLines(loadSources(JSON.parse(readFileSync(file, "utf8")), {}).values()),
      });
      try {
        const cli = await runScript("inbox.ts", ["status", "--db", target, "--sources", file]);
        assert.equal(cli.code, 0, cli.stderr);
        assert.match(
          cli.stdout,
          new RegExp(
            `broker source billing \\(RabbitMQ queue ${q.queue.replaceAll(".", "\\.")}\\): 3 ready in the queue, 0 consumers`,
          ),
        );
        const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
        const html = await (await fetch(url)).text();
        assert.match(html, /<h2>Broker sources<\/h2>/);
        assert.match(html, /3 ready in the queue, 0 consumers/);
      } finally {
        admin.server.close();
        await inbox.close();
        await q.close();
        dir.cleanup();
        await cleanup();
      }
    });

    it("on stop, acknowledges every message it stored before it closes: none goes back to the queue stored", async () => {
      const { target, cleanup } = await backend.make();
      const q = await queues("stop");
      for (let i = 0; i < 2_000; i++) q.ch.sendToQueue(q.queue, Buffer.from(`{"i":${i}}`), { messageId: `evt_${i}` });
      await q.ch.waitForConfirms();
      const inbox = await connect(target);
      const c = new Consumer({ inbox, source: { name: "billing", broker: source(q.queue) }, log: silent });
      try {
        c.start();
        await until("some stored", () => c.counts.stored >= 100);
        await c.stop();
        const stored = await inbox.count({ source: "billing" });
        assert.ok(stored < 2_000, `stopped mid-stream (${stored} stored)`);
        assert.equal(c.counts.acked, stored, "each stored message acknowledged");
        assert.equal(await q.depth(q.queue), 2_000 - stored, "the queue holds exactly the ones not stored");
      } finally {
        await inbox.close();
        await q.close();
        await cleanup();
      }
    });

    it("acknowledges nothing while the store is down: the queue keeps every message, and a working store takes them", async () => {
      const { target, cleanup } = await backend.make();
      const q = await queues("down");
      for (let i = 0; i < 20; i++) q.ch.sendToQueue(q.queue, Buffer.from(`{"i":${i}}`), { messageId: `evt_${i}` });
      await q.ch.waitForConfirms();
      const down: Inbox = await connect(target);
      await down.close();
      const broken = new Consumer({ inbox: down, source: { name: "billing", broker: source(q.queue) }, log: silent });
      broken.start();
      await until("stores failed", () => broken.counts.unavailable >= 20);
      await broken.stop();
      assert.equal(broken.counts.acked, 0);
      assert.equal(await q.depth(q.queue), 20, "every message back in the queue");
      const inbox = await connect(target);
      const c = new Consumer({ inbox, source: { name: "billing", broker: source(q.queue) }, log: silent });
      try {
        c.start();
        await until("twenty acked", () => c.counts.acked === 20);
        assert.equal(await inbox.count({ source: "billing" }), 20);
      } finally {
        await c.stop();
        await inbox.close();
        await q.close();
        await cleanup();
      }
    });
  });
}
