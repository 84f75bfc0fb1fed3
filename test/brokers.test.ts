// test/brokers.test.ts: brokers.ts against the real servers: NATS JetStream at 127.0.0.1:4222 and RabbitMQ at
// 127.0.0.1:5672 (INBOX_TEST_NATS, INBOX_TEST_RABBITMQ). Each run makes streams and queues of its own names.
// Where a server is absent its tests are skipped with one line; INBOX_REQUIRE_NATS=1 / INBOX_REQUIRE_RABBITMQ=1 fail instead.
//   npx node --import tsx --test test/brokers.test.ts

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { after, before, describe, it } from "node:test";
import { jetstream, jetstreamManager, type JetStreamManager } from "@nats-io/jetstream";
import { connect as natsConnect, nanos, type NatsConnection } from "@nats-io/transport-node";
import amqp, { type Channel, type ChannelModel } from "amqplib";
import { join } from "node:path";
import {
  brokerSender,
  HEADERS,
  messageId,
  missingClient,
  openBroker,
  parseBrokerDestination,
  type Broker,
  type BrokerMessage,
} from "../lib/brokers.ts";
import type { Sender } from "../lib/forwarding/forward.ts";
import { connect } from "../inbox.ts";
import { freePort, NATS, natsSkip, RABBITMQ, rabbitmqSkip, tempDir } from "./helpers.ts";

const natsSkipped = await natsSkip();
const rabbitSkipped = await rabbitmqSkip();
const run = randomBytes(4).toString("hex");

// Every byte value, and bytes that are not UTF-8: a body must arrive exactly as it was received.
const BINARY = Buffer.concat([
  Buffer.from(Array.from({ length: 256 }, (_, i) => i)),
  Buffer.from([0xc3, 0x28, 0xff, 0xfe, 0x00]),
]);

function message(over: Partial<BrokerMessage> = {}): BrokerMessage {
  return {
    source: "stripe",
    id: "evt_1",
    body: BINARY,
    contentType: "application/octet-stream",
    eventType: "invoice.paid",
    attempt: 1,
    replays: 0,
    orderKey: null,
    newerId: null,
    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    ...over,
  };
}

describe("parseBrokerDestination()", () => {
  const parse = (settings: unknown, env: Record<string, string> = {}) =>
    parseBrokerDestination("audit", settings, 'sources.json: destination "audit"', env);
  const refuses = (settings: unknown, pattern: RegExp, env: Record<string, string> = {}) =>
    assert.throws(
      () => parse(settings, env),
      (error: unknown) => {
        assert.ok(error instanceof TypeError, `a TypeError, got ${String(error)}`);
        assert.match(error.message, /^sources\.json: destination "audit": /);
        assert.match(error.message, pattern);
        assert.doesNotMatch(error.message, /\n/, "one line");
        return true;
      },
    );

  it("reads a NATS destination, its defaults and its env: secrets", () => {
    const d = parse(
      { type: "nats", subject: "webhooks.{source}.{type}", user: "inbox", pass: "env:NATS_PASS", stream: "WEBHOOKS" },
      { NATS_PASS: "s3cret" },
    );
    assert.deepEqual(d, {
      type: "nats",
      name: "audit",
      servers: ["nats://127.0.0.1:4222"],
      subject: "webhooks.{source}.{type}",
      timeoutMs: 5_000,
      stream: "WEBHOOKS",
      user: "inbox",
      pass: "s3cret",
    });
    const two = parse({ type: "nats", url: "nats://a:4222, tls://b:4222", subject: "x", token: "t" });
    assert.deepEqual(two.type === "nats" && [two.servers, two.token], [["nats://a:4222", "tls://b:4222"], "t"]);
  });

  it("reads a RabbitMQ destination, its defaults and an env: URL", () => {
    assert.deepEqual(
      parse({ type: "rabbitmq", url: "env:AMQP_URL", routingKey: "inbox" }, { AMQP_URL: "amqp://u:p@mq:5672/v" }),
      {
        type: "rabbitmq",
        name: "audit",
        url: "amqp://u:p@mq:5672/v",
        exchange: "",
        routingKey: "inbox",
        mandatory: true,
        timeoutMs: 5_000,
      },
    );
    assert.equal(
      parse({ type: "rabbitmq", routingKey: "k", exchange: "webhooks", mandatory: false, timeoutMs: 50 }).type,
      "rabbitmq",
    );
  });

  it("refuses each mistake in one line that names the destination", () => {
    refuses(null, /expected an object/);
    refuses({ type: "kafka" }, /expected type to be one of nats, rabbitmq, got "kafka"/);
    refuses({ type: "nats", subject: "a", routingKey: "b" }, /unknown setting "routingKey"; a nats destination takes/);
    refuses({ type: "nats" }, /missing subject/);
    refuses({ type: "nats", subject: "webhooks.>" }, /subject "webhooks\.>" is not one a message can be published to/);
    refuses({ type: "nats", subject: "webhooks..x" }, /is not one a message can be published to/);
    refuses({ type: "nats", subject: "webhooks.{id}" }, /names \{id\}; expected only \{source\} and \{type\}/);
    refuses({ type: "nats", subject: "webhooks.{source" }, /unmatched brace/);
    refuses({ type: "nats", subject: "x", url: "http://h:4222" }, /expected url to start with nats:\/\/ or tls:\/\/$/);
    refuses({ type: "nats", subject: "x", user: "u" }, /expected user and pass together/);
    refuses({ type: "nats", subject: "x", stream: "a.b" }, /expected stream to be a stream's name/);
    refuses(
      { type: "nats", subject: "x", timeoutMs: 0 },
      /expected timeoutMs to be a whole number of ms from 1 to 300000, got 0/,
    );
    refuses({ type: "rabbitmq" }, /missing routingKey/);
    refuses({ type: "rabbitmq", routingKey: "k".repeat(256) }, /longer than AMQP's 255 bytes/);
    refuses({ type: "rabbitmq", routingKey: "k", exchange: 7 }, /expected exchange to be a string/);
    refuses({ type: "rabbitmq", routingKey: "k", mandatory: "yes" }, /expected mandatory to be true or false/);
    refuses(
      { type: "rabbitmq", routingKey: "k", url: "env:AMQP_URL" },
      /url reads the environment variable AMQP_URL, which is not set/,
    );
  });

  it("keys each message by destination, source and ID, so that no two deliveries share a key", () => {
    assert.equal(messageId("events", { source: "stripe", id: "evt_1", replays: 0 }), "events:stripe:evt_1");
    assert.notEqual(
      messageId("d", { source: "a:b", id: "c", replays: 0 }),
      messageId("d", { source: "a", id: "b:c", replays: 0 }),
      "a : inside a part is no separator",
    );
    assert.notEqual(
      messageId("d:x", { source: "s", id: "i", replays: 0 }),
      messageId("d", { source: "x:s", id: "i", replays: 0 }),
    );
    assert.equal(messageId("events", { source: "stripe", id: "evt_1", replays: 2 }), "events:stripe:evt_1:replay-2");
  });

  it("checks only the shape without the environment, as the receiver does, whose secrets are the worker's", () => {
    const shape = (settings: unknown) => parseBrokerDestination("audit", settings, 'destination "audit"', {}, false);
    assert.equal(shape({ type: "rabbitmq", url: "env:AMQP_URL", routingKey: "k" }).type, "rabbitmq");
    assert.equal(shape({ type: "nats", url: "env:NATS_URL", subject: "x", user: "env:U", pass: "env:P" }).type, "nats");
    assert.throws(
      () => shape({ type: "nats", url: "env:NATS_URL", subject: "x.>" }),
      /^TypeError: destination "audit": subject "x\.>" is not one/,
    );
    assert.throws(() => shape({ type: "nats", subject: "x", user: "env:U" }), /expected user and pass together/);
  });

  it("never says a secret back, even when the secret is what is wrong", () => {
    const secret = "hunter2-do-not-print";
    for (const [settings, env] of [
      [{ type: "rabbitmq", routingKey: "k", url: `ftp://guest:${secret}@mq` }, {}],
      [{ type: "rabbitmq", routingKey: "k", url: "env:URL" }, { URL: `guest:${secret}` }],
      [{ type: "nats", subject: "x", url: "env:URL" }, { URL: `not a url ${secret}` }],
      [{ type: "nats", subject: "x", token: "env:T", user: "u", pass: secret }, { T: secret }],
    ] as const) {
      assert.throws(
        () => parse(settings, env),
        (error: Error) => !error.message.includes(secret) && !error.message.includes("guest"),
      );
    }
  });
});

describe("publishing into NATS JetStream", { skip: natsSkipped }, () => {
  // Opened in before(), not in the suite's body, so that a run that filters these tests out holds no connection open.
  let nc: NatsConnection;
  let jsm: JetStreamManager;
  before(async () => {
    nc = await natsConnect({ servers: NATS });
    jsm = await jetstreamManager(nc);
  });
  // A stream of its own for each test: purging a stream leaves its duplicate window's memory behind.
  let n = 0;
  let stream = "";
  let prefix = "";
  const fresh = async () => {
    stream = `INBOX_TEST_${run}_${++n}`;
    prefix = `inboxtest${run}n${n}`;
    await jsm.streams.add({ name: stream, subjects: [`${prefix}.>`], duplicate_window: nanos(120_000) });
  };
  const brokers: Broker[] = [];
  const broker = (settings: Record<string, unknown>, name = "audit") => {
    const b = openBroker(
      parseBrokerDestination(
        name,
        { type: "nats", url: NATS, subject: `${prefix}.{source}.{type}`, ...settings },
        "test",
      ),
    );
    brokers.push(b);
    return b;
  };
  const stored = async () => {
    const info = await jsm.streams.info(stream);
    const out = [];
    for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
      const m = await jsm.streams.getMessage(stream, { seq });
      if (m) out.push(m);
    }
    return out;
  };
  after(async () => {
    for (const b of brokers) await b.close();
    for (let i = 1; i <= n; i++) await jsm.streams.delete(`INBOX_TEST_${run}_${i}`).catch(() => {});
    await nc.close();
  });

  it("publishes the body byte-exact with its headers, and is done only with the PubAck", async () => {
    await fresh();
    const b = broker({ stream });
    assert.deepEqual(await b.publish(message({ orderKey: "sub_1", newerId: "evt_2", attempt: 3 })), { kind: "done" });
    const [m] = await stored();
    assert.equal(m!.subject, `${prefix}.stripe.invoice.paid`, "{type} keeps its dots as token breaks");
    assert.ok(Buffer.from(m!.data).equals(BINARY), "every byte arrives as it was");
    const h = m!.header;
    assert.equal(h.get("Nats-Msg-Id"), "audit:stripe:evt_1");
    assert.deepEqual(
      [
        "inbox-source",
        "inbox-delivery-id",
        "inbox-event-type",
        "inbox-attempt",
        "inbox-order-key",
        "inbox-stale",
        "inbox-newer-id",
        "traceparent",
      ].map((k) => h.get(k)),
      [
        "stripe",
        "evt_1",
        "invoice.paid",
        "3",
        "sub_1",
        "true",
        "evt_2",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      ],
    );
    assert.equal(h.get("Content-Type"), "application/octet-stream");
  });

  it("puts a delivery in the stream once, however often it is published, while a replay goes again", async () => {
    await fresh();
    const b = broker({});
    for (let i = 0; i < 3; i++)
      assert.deepEqual(
        await b.publish(message({ attempt: i + 1 })),
        { kind: "done" },
        "a duplicate PubAck is done too",
      );
    assert.equal((await stored()).length, 1);
    assert.deepEqual(await b.publish(message({ replays: 1 })), { kind: "done" });
    const all = await stored();
    assert.deepEqual(
      all.map((m) => m.header.get("Nats-Msg-Id")),
      ["audit:stripe:evt_1", "audit:stripe:evt_1:replay-1"],
    );
  });

  it("keeps two destinations that feed one stream apart: each has its message (control: one shared ID loses one)", async () => {
    await fresh();
    const audit = broker({}, "audit");
    const billing = broker({ subject: `${prefix}.billing.{type}` }, "billing");
    assert.deepEqual(await audit.publish(message()), { kind: "done" });
    assert.deepEqual(await billing.publish(message()), { kind: "done" });
    assert.deepEqual((await stored()).map((m) => m.subject).sort(), [
      `${prefix}.billing.invoice.paid`,
      `${prefix}.stripe.invoice.paid`,
    ]);
    // The control: the same two publishes keyed by the delivery alone, as a naive msg ID would be.
    await fresh();
    const js = jetstream(nc);
    await js.publish(`${prefix}.stripe.invoice.paid`, BINARY, { msgID: "stripe:evt_1" });
    const second = await js.publish(`${prefix}.billing.invoice.paid`, BINARY, { msgID: "stripe:evt_1" });
    assert.equal(second.duplicate, true);
    assert.equal((await stored()).length, 1, "the second destination's message was dropped as a duplicate");
    assert.notEqual(messageId("audit", message()), messageId("billing", message()));
  });

  it("fills {source} and {type} so that any event type makes a subject, and takes a route's own subject", async () => {
    await fresh();
    const b = broker({});
    assert.deepEqual(await b.publish(message({ id: "a", eventType: "weird type*with>chars..x" })), { kind: "done" });
    assert.deepEqual(await b.publish(message({ id: "b", eventType: null })), { kind: "done" });
    assert.deepEqual(await b.publish(message({ id: "c", to: `${prefix}.routed.{source}` })), { kind: "done" });
    assert.deepEqual(
      (await stored()).map((m) => m.subject),
      [`${prefix}.stripe.weird_type_with_chars._.x`, `${prefix}.stripe._`, `${prefix}.routed.stripe`],
    );
  });

  it("is the forwarder's Sender for a broker destination: a leased delivery goes out whole, its traceparent carried on", async () => {
    await fresh();
    const { dir, cleanup } = tempDir();
    const inbox = await connect(join(dir, "inbox.db"));
    try {
      const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
      await inbox.store({
        source: "shop",
        id: "evt_9",
        body: BINARY,
        contentType: "application/octet-stream",
        eventType: "order.paid",
        traceparent,
      });
      const lease = (await inbox.claim())!;
      // The settings routes.ts reads for every destination (maxInFlight, rate, breaker) are taken too.
      const settings = {
        type: "nats",
        url: NATS,
        subject: `${prefix}.{source}.{type}`,
        maxInFlight: 4,
        rate: 100,
        breaker: false,
      };
      const sender: Sender = brokerSender(parseBrokerDestination("audit", settings, "test"));
      assert.deepEqual(await sender.send(lease, { signal: new AbortController().signal, permanent4xx: false }), {
        kind: "done",
      });
      await sender.close();
      const [m] = await stored();
      assert.equal(m!.subject, `${prefix}.shop.order.paid`);
      assert.ok(Buffer.from(m!.data).equals(BINARY));
      assert.deepEqual(
        ["Nats-Msg-Id", "inbox-attempt", "traceparent"].map((k) => m!.header.get(k)),
        ["audit:shop:evt_9", "1", traceparent],
      );
    } finally {
      await inbox.close();
      cleanup();
    }
  });

  it("percent-encodes a header value that a header cannot hold", async () => {
    await fresh();
    assert.deepEqual(await broker({}).publish(message({ id: "evt\r\n1 é" })), { kind: "done" });
    const [m] = await stored();
    assert.deepEqual(
      [m!.header.get(HEADERS.id), m!.header.get("Nats-Msg-Id")],
      ["evt%0D%0A1%20%C3%A9", "audit:stripe:evt%0D%0A1%20%C3%A9"],
    );
  });

  it("retries, saying why, when no stream captures the subject or another stream does", async () => {
    await fresh();
    const none = await broker({ subject: `nostream${run}.{source}` }).publish(message());
    assert.equal(none.kind, "retry");
    assert.match(
      (none as { error: string }).error,
      /^nats audit: publish to nostream\w+\.stripe: no stream captures this subject/,
    );
    const other = await broker({ stream: "SOME_OTHER_STREAM" }).publish(message({ id: "other" }));
    assert.equal(other.kind, "retry");
    assert.match(
      (other as { error: string }).error,
      /^nats audit: publish to inboxtest\w+\.stripe\.invoice\.paid: expected stream does not match$/,
    );
  });

  it("fails for good a body larger than the server takes, which no retry can cure", async () => {
    await fresh();
    const big = Buffer.alloc((nc.info?.max_payload ?? 1_048_576) + 1, 0x61);
    const outcome = await broker({}).publish(message({ id: "big", body: big }));
    assert.equal(outcome.kind, "failed", JSON.stringify(outcome));
  });

  it("retries when the server cannot be reached, or the lease is lost before the PubAck", async () => {
    const port = await freePort();
    const down = await broker({ url: `nats://127.0.0.1:${port}`, timeoutMs: 500 }).publish(message());
    assert.equal(down.kind, "retry");
    assert.match((down as { error: string }).error, /^nats audit: cannot connect/);
    const aborted = AbortSignal.abort(new Error("the lease was lost"));
    assert.deepEqual(await broker({}).publish(message(), aborted), {
      kind: "retry",
      error: "not published: the lease was lost",
    });
  });
});

describe("publishing into RabbitMQ", { skip: rabbitSkipped }, () => {
  let model: ChannelModel;
  let channel: Channel;
  const queue = `inbox-test-${run}`;
  const brokers: Broker[] = [];
  const broker = (settings: Record<string, unknown>) => {
    const b = openBroker(
      parseBrokerDestination("audit", { type: "rabbitmq", url: RABBITMQ, routingKey: queue, ...settings }, "test"),
    );
    brokers.push(b);
    return b;
  };
  before(async () => {
    model = await amqp.connect(RABBITMQ);
    channel = await model.createChannel();
    await channel.assertQueue(queue, { durable: true });
  });
  after(async () => {
    for (const b of brokers) await b.close();
    await channel.deleteQueue(queue).catch(() => {});
    await model.close();
  });

  it("publishes a persistent message, byte-exact, with message_id and headers, done only with the confirm", async () => {
    await channel.purgeQueue(queue);
    assert.deepEqual(await broker({}).publish(message({ orderKey: "sub_1", attempt: 2 })), { kind: "done" });
    const got = await channel.get(queue, { noAck: true });
    assert.ok(got, "the message is in the queue");
    assert.ok(got.content.equals(BINARY), "every byte arrives as it was");
    const p = got.properties;
    assert.deepEqual(
      [p.messageId, p.deliveryMode, p.contentType, p.type, p.appId],
      ["audit:stripe:evt_1", 2, "application/octet-stream", "invoice.paid", "webhook-inbox"],
    );
    assert.deepEqual(p.headers, {
      "inbox-source": "stripe",
      "inbox-delivery-id": "evt_1",
      "inbox-attempt": 2,
      "inbox-event-type": "invoice.paid",
      "inbox-order-key": "sub_1",
      "inbox-stale": "false",
      traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    });
  });

  it("retries a message no queue takes, rather than be told done for a message dropped (control: mandatory false)", async () => {
    const key = `nobody-${run}`;
    const returned = await broker({ routingKey: key }).publish(message());
    assert.equal(returned.kind, "retry");
    assert.match((returned as { error: string }).error, /no queue is bound to take it/);
    assert.deepEqual(
      await broker({ routingKey: key, mandatory: false }).publish(message()),
      { kind: "done" },
      "RabbitMQ confirms what it dropped",
    );
  });

  it("retries, saying why, when the exchange is missing, and publishes again once the channel is reopened", async () => {
    const b = broker({ exchange: `missing-${run}` });
    const missing = await b.publish(message());
    assert.equal(missing.kind, "retry");
    assert.match((missing as { error: string }).error, /NOT_FOUND - no exchange 'missing-\w+'/);
    await channel.assertExchange(`missing-${run}`, "direct", { durable: false, autoDelete: true });
    await channel.bindQueue(queue, `missing-${run}`, queue);
    await channel.purgeQueue(queue);
    assert.deepEqual(await b.publish(message({ id: "later" })), { kind: "done" });
    assert.equal(
      ((await channel.get(queue, { noAck: true })) || undefined)?.properties.messageId,
      "audit:stripe:later",
    );
    await channel.deleteExchange(`missing-${run}`);
  });

  it("retries when the server cannot be reached or refuses the login, and never says the password", async () => {
    const port = await freePort();
    const down = await broker({ url: `amqp://guest:guest@127.0.0.1:${port}`, timeoutMs: 500 }).publish(message());
    assert.equal(down.kind, "retry");
    assert.match((down as { error: string }).error, /^rabbitmq audit: cannot connect/);
    const url = new URL(RABBITMQ);
    url.password = "wrong-password-xyz";
    const refused = await broker({ url: url.toString() }).publish(message());
    assert.equal(refused.kind, "retry");
    assert.match((refused as { error: string }).error, /^rabbitmq audit: cannot connect: .*ACCESS_REFUSED/);
    assert.doesNotMatch((refused as { error: string }).error, /wrong-password-xyz/);
  });
});

describe("missingClient()", () => {
  it("finds each broker's client installed here, and names what to install when one is not (the package test's control)", async () => {
    assert.equal(await missingClient("nats", "events"), undefined);
    assert.equal(await missingClient("rabbitmq", "audit"), undefined);
    assert.equal(
      await missingClient("rabbitmq", "audit", "destination", ["amqplib-that-is-not-there"]),
      `destination "audit" publishes to RabbitMQ, but amqplib-that-is-not-there is not installed: npm install amqplib-that-is-not-there`,
    );
    assert.equal(
      await missingClient("nats", "orders", "source", ["@nats-io/not-there"]),
      `source "orders" consumes NATS JetStream, but @nats-io/not-there is not installed: npm install @nats-io/not-there`,
    );
  });
});
