// bench/consume.ts: broker sources. The rate at which lib/consume.ts drains a JetStream stream and a
// RabbitMQ queue into a SQLite inbox (each message stored, durable, then acked), against each client's own
// consume-and-ack loop on the same messages in the same run (before and after), with CPU per message.
//   npm run bench -- consume              # BENCH_CONSUME=20000 messages; BENCH_BROKERS=nats or rabbitmq for one

import { join } from "node:path";
import { jetstream, jetstreamManager, AckPolicy } from "@nats-io/jetstream";
import { connect as natsConnect } from "@nats-io/transport-node";
import amqp from "amqplib";
import { Consumer, type BrokerSource } from "../lib/consume.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { f, knob, tempDir } from "./common.ts";

const MESSAGES = knob("BENCH_CONSUME", 20_000);
const NATS = process.env.INBOX_TEST_NATS ?? DEFAULTS.natsUrl;
const RABBITMQ = process.env.INBOX_TEST_RABBITMQ ?? DEFAULTS.rabbitmqUrl;
const BODY = JSON.stringify({ type: "payment.succeeded", customer: "Ann", amount: 5 });

interface Measured {
  rate: number;
  cpuUs: number;
}

// timed runs a drain and measures its rate and the process's CPU per message.
async function timed(drain: () => Promise<void>): Promise<Measured> {
  const cpu = process.cpuUsage();
  const t = performance.now();
  await drain();
  const s = (performance.now() - t) / 1000;
  const used = process.cpuUsage(cpu);
  return { rate: MESSAGES / s, cpuUs: (used.user + used.system) / MESSAGES };
}

async function nats(): Promise<string> {
  const nc = await natsConnect({ servers: NATS });
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const stream = `BENCH_CONSUME_${process.pid}`;
  await jsm.streams.add({ name: stream, subjects: [`bench.consume.${process.pid}`] });
  const fill = async () => {
    for (let i = 0; i < MESSAGES; i += 500)
      await Promise.all(
        Array.from({ length: Math.min(500, MESSAGES - i) }, (_, k) =>
          js.publish(`bench.consume.${process.pid}`, BODY, { msgID: `m${i + k}-${Math.random()}` }),
        ),
      );
  };
  let n = 0;
  const raw = async () => {
    const name = `raw${n++}`;
    await jsm.consumers.add(stream, {
      durable_name: name,
      ack_policy: AckPolicy.Explicit,
      max_ack_pending: DEFAULTS.consumePrefetch,
    });
    const c = await js.consumers.get(stream, name);
    return timed(async () => {
      const messages = await c.consume({ max_messages: DEFAULTS.consumePrefetch });
      let seen = 0;
      for await (const m of messages) {
        m.ack();
        if (++seen === MESSAGES) break;
      }
      await nc.flush();
    });
  };
  const inbox = async () => {
    const dir = tempDir();
    const db = new SqliteInbox(join(dir.dir, "inbox.db"));
    const broker: BrokerSource = {
      type: "nats",
      servers: [NATS],
      timeoutMs: 5_000,
      stream,
      consumer: `inbox${n++}`,
      maxAckPending: DEFAULTS.consumePrefetch,
      ackWaitMs: DEFAULTS.consumeAckWaitMs,
    };
    const c = new Consumer({ inbox: db, source: { name: "bench", broker }, log: () => {} });
    const m = await timed(() => until(c, () => c.start()));
    await c.stop();
    await db.close();
    dir.cleanup();
    return m;
  };
  try {
    await fill();
    const before = await raw();
    const ours = await inbox();
    const after = await raw();
    return summary("NATS JetStream", before, ours, after);
  } finally {
    await jsm.streams.delete(stream).catch(() => {});
    await nc.close();
  }
}

async function rabbit(): Promise<string> {
  const model = await amqp.connect(RABBITMQ);
  const ch = await model.createConfirmChannel();
  const queue = `bench.consume.${process.pid}`;
  await ch.assertQueue(queue, { durable: true });
  const fill = async () => {
    for (let i = 0; i < MESSAGES; i++)
      ch.sendToQueue(queue, Buffer.from(BODY), { messageId: `m${i}-${Math.random()}`, persistent: true });
    await ch.waitForConfirms();
  };
  const raw = async () => {
    await fill();
    const c = await model.createChannel();
    await c.prefetch(DEFAULTS.consumePrefetch);
    const m = await timed(
      () =>
        new Promise<void>((resolve) => {
          let seen = 0;
          void c.consume(queue, (msg) => {
            if (!msg) return;
            c.ack(msg);
            if (++seen === MESSAGES) resolve();
          });
        }),
    );
    await c.close();
    return m;
  };
  const inbox = async () => {
    await fill();
    const dir = tempDir();
    const db = new SqliteInbox(join(dir.dir, "inbox.db"));
    const broker: BrokerSource = {
      type: "rabbitmq",
      url: RABBITMQ,
      timeoutMs: 5_000,
      queue,
      prefetch: DEFAULTS.consumePrefetch,
    };
    const c = new Consumer({ inbox: db, source: { name: "bench", broker }, log: () => {} });
    const m = await timed(() => until(c, () => c.start()));
    await c.stop();
    await db.close();
    dir.cleanup();
    return m;
  };
  try {
    const before = await raw();
    const ours = await inbox();
    const after = await raw();
    return summary("RabbitMQ", before, ours, after);
  } finally {
    await ch.deleteQueue(queue).catch(() => {});
    await model.close();
  }
}

// until starts a consumer and resolves once it has acknowledged every message.
function until(c: Consumer, start: () => void): Promise<void> {
  start();
  return new Promise((resolve) => {
    const t = setInterval(() => {
      if (c.counts.acked >= MESSAGES) {
        clearInterval(t);
        resolve();
      }
    }, 5);
  });
}

function summary(name: string, before: Measured, ours: Measured, after: Measured): string {
  const raw = (before.rate + after.rate) / 2;
  const lines = [
    `${name.padEnd(15)} raw consume-and-ack   ${f(before.rate)} msg/s, again after ${f(after.rate)} msg/s, ${f(before.cpuUs)} µs CPU/msg`,
    `${name.padEnd(15)} consume.ts → SQLite   ${f(ours.rate)} msg/s = ${(ours.rate / raw).toFixed(2)}x raw, ${f(ours.cpuUs)} µs CPU/msg (stored, durable, then acked)`,
  ];
  for (const l of lines) console.log(l);
  return lines.join("\n");
}

/** consume runs the broker sources' bench, on NATS and RabbitMQ or the one BENCH_BROKERS names. */
export async function consume(): Promise<string> {
  const which = process.env.BENCH_BROKERS;
  console.log(`\n== broker sources: ${MESSAGES} messages drained into a SQLite inbox, against the raw client ==`);
  const out: string[] = [];
  if (which !== "rabbitmq") out.push(await nats());
  if (which !== "nats") out.push(await rabbit());
  return out.join("\n");
}
