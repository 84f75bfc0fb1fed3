// bench/brokers.ts: what publishing through brokers.ts costs, against each broker's own client in the same run.
// For NATS JetStream and for RabbitMQ, at the worker's default concurrency (DEFAULTS.concurrency in flight):
//   raw        the official client in a loop, each publish awaiting its PubAck / publisher confirm, with the
//              same message ID, headers and body (the baseline, run before and after the others);
//   brokers.ts the same messages through openBroker().publish();
//   worker     the real run() of worker.ts draining a SQLite backlog, its handler publishing through brokers.ts;
//   and that worker again with no broker, its handler only waiting as long as a raw publish takes.
// Prints messages/s and the ratios against the baseline. Needs the servers at 127.0.0.1:4222 and :5672.
//   npm run bench -- brokers         BENCH_SECONDS=8 BENCH_BROKER_BACKLOG=20000 BENCH_BROKERS=nats,rabbitmq

import { execFileSync } from "node:child_process";
import { join } from "node:path";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { connect as natsConnect, headers as natsHeaders } from "@nats-io/transport-node";
import amqp from "amqplib";
import { HEADERS, messageId, messageOf, openBroker, parseBrokerDestination, type BrokerDestination, type BrokerMessage } from "../lib/brokers.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { SqliteInbox } from "../lib/sqlite.ts";
import { PermanentError } from "../lib/store.ts";
import { run } from "../worker.ts";
import { f, fillBacklog, knob, tempDir } from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 8);
const BACKLOG = knob("BENCH_BROKER_BACKLOG", 20_000);
const CONCURRENCY = DEFAULTS.concurrency;
const NATS = process.env.BENCH_NATS ?? DEFAULTS.natsUrl;
const RABBITMQ = process.env.BENCH_RABBITMQ ?? DEFAULTS.rabbitmqUrl;
const WHICH = (process.env.BENCH_BROKERS ?? "nats,rabbitmq").split(",");

// The body fillBacklog stores, so that every phase sends the same bytes.
const body = (i: number) => Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i % 1000}`, amount: (i % 100) + 1 }));
const message = (tag: string, i: number): BrokerMessage => ({
  source: "default", id: `${tag}_${i}`, body: body(i), contentType: "application/json", eventType: "payment.succeeded", attempt: 1,
  replays: 0, orderKey: null, newerId: null, traceparent: null,
});

// loop keeps `concurrency` publishes in flight for SECONDS and returns messages/s.
async function loop(publish: (i: number) => Promise<void>): Promise<number> {
  let next = 0;
  let done = 0;
  const until = performance.now() + SECONDS * 1000;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (performance.now() < until) {
      await publish(next++);
      done++;
    }
  }));
  return (done / (performance.now() - t0)) * 1000;
}

// drain runs the real worker over a backlog, publishing each delivery through brokers.ts, and returns
// deliveries/s. Given waitMs instead, its handler only waits that long: the worker's own pace with a
// handler as slow as a publish, and no broker at all.
async function drain(destination: BrokerDestination, dir: string, waitMs?: number): Promise<number> {
  const path = join(dir, `${destination.type}-${waitMs ?? "broker"}.db`);
  fillBacklog(path, BACKLOG, `${destination.type}${Date.now()}`);
  const inbox = new SqliteInbox(path);
  const broker = openBroker(destination);
  try {
    const t0 = performance.now();
    const stats = await run(async (job) => {
      if (waitMs !== undefined) return new Promise((resolve) => setTimeout(resolve, waitMs));
      const outcome = await broker.publish(messageOf(job.delivery, job.traceparent), job.signal);
      if (outcome.kind === "retry") throw new Error(outcome.error);
      if (outcome.kind === "failed") throw new PermanentError(outcome.error);
    }, { inbox, once: true, log: () => {} });
    const ms = performance.now() - t0;
    if (stats.done !== BACKLOG) throw new Error(`expected ${BACKLOG} done, got ${JSON.stringify(stats)}`);
    return (stats.done / ms) * 1000;
  } finally {
    await broker.close();
    await inbox.close();
  }
}

// skipped says, in one line, that a broker's rows were left out because its server is not there.
function skipped(name: string, where: string, error: unknown): string {
  const line = `${name}: skipped, no server at ${where} (${error instanceof Error ? error.message : String(error)})`;
  console.log(`  ${line}`);
  return line;
}

type Rates = { raw: number; rawAgain: number; brokers: number; worker: number; waiting: number; waitMs: number };

function report(name: string, r: Rates): string {
  const base = (r.raw + r.rawAgain) / 2;
  console.log(`  ${name} raw client`.padEnd(30) + `${f(r.raw).padStart(7)} msg/s, again after the others ${f(r.rawAgain)} msg/s`);
  console.log(`  ${name} brokers.ts`.padEnd(30) + `${f(r.brokers).padStart(7)} msg/s = ${f(r.brokers / base, 2)}x raw`);
  console.log(`  ${name} worker + brokers.ts`.padEnd(30) + `${f(r.worker).padStart(7)} deliveries/s = ${f(r.worker / base, 2)}x raw (SQLite backlog of ${BACKLOG}, done marks included)`);
  console.log(`  ${name} worker, no broker`.padEnd(30) + `${f(r.waiting).padStart(7)} deliveries/s: its handler only waits ${f(r.waitMs, 1)} ms, a raw publish's mean time (the worker's own pace)`);
  return `${name}: brokers.ts ${f(r.brokers / base, 2)}x, worker ${f(r.worker / base, 2)}x the raw client (${f(base)} msg/s; the worker with a handler as slow and no broker ${f(r.waiting)}/s)`;
}

async function nats(dir: string): Promise<string> {
  const nc = await natsConnect({ servers: NATS, reconnect: false }).catch((error: unknown) => skipped("NATS JetStream", NATS, error));
  if (typeof nc === "string") return nc;
  const jsm = await jetstreamManager(nc);
  const js = jetstream(nc);
  const tag = `bench${Date.now()}`;
  const streams: string[] = [];
  // A fresh stream per phase, each file-backed with the default duplicate window, so none starts fuller.
  const fresh = async () => {
    const name = `BENCH_${tag}_${streams.length}`;
    streams.push(name);
    await jsm.streams.add({ name, subjects: [`${tag}${streams.length}.>`] });
    return `${tag}${streams.length}`;
  };
  try {
    const rawPhase = async () => {
      const prefix = await fresh();
      return loop(async (i) => {
        const m = message(prefix, i);
        const h = natsHeaders();
        h.set(HEADERS.source, m.source);
        h.set(HEADERS.id, m.id);
        h.set(HEADERS.attempt, "1");
        h.set(HEADERS.eventType, m.eventType!);
        h.set("Content-Type", m.contentType!);
        await js.publish(`${prefix}.default.payment.succeeded`, m.body, { msgID: messageId("bench", m), headers: h });
      });
    };
    const raw = await rawPhase();
    const prefix = await fresh();
    const broker = openBroker(parseBrokerDestination("bench", { type: "nats", url: NATS, subject: `${prefix}.{source}.{type}` }, "bench"));
    const brokers = await loop(async (i) => {
      const outcome = await broker.publish(message(prefix, i));
      if (outcome.kind !== "done") throw new Error(JSON.stringify(outcome));
    });
    await broker.close();
    const workerPrefix = await fresh();
    const worker = await drain(parseBrokerDestination("bench", { type: "nats", url: NATS, subject: `${workerPrefix}.{source}.{type}` }, "bench"), dir);
    const rawAgain = await rawPhase();
    const waitMs = (CONCURRENCY / ((raw + rawAgain) / 2)) * 1000;
    const waiting = await drain(parseBrokerDestination("bench", { type: "nats", subject: "unused" }, "bench"), dir, waitMs);
    return report("NATS JetStream", { raw, rawAgain, brokers, worker, waiting, waitMs });
  } finally {
    for (const name of streams) await jsm.streams.delete(name).catch(() => {});
    await nc.close();
  }
}

async function rabbitmq(dir: string): Promise<string> {
  const model = await amqp.connect(RABBITMQ).catch((error: unknown) => skipped("RabbitMQ", new URL(RABBITMQ).host, error));
  if (typeof model === "string") return model;
  const admin = await model.createChannel();
  const tag = `bench-${Date.now()}`;
  const queues: string[] = [];
  // A fresh durable queue per phase, so none starts fuller; each is deleted at the end.
  const fresh = async () => {
    const name = `${tag}-${queues.length}`;
    queues.push(name);
    await admin.assertQueue(name, { durable: true });
    return name;
  };
  try {
    const rawPhase = async () => {
      const queue = await fresh();
      const channel = await model.createConfirmChannel();
      const rate = await loop((i) => new Promise<void>((resolve, reject) => {
        const m = message(queue, i);
        channel.publish("", queue, Buffer.from(m.body), {
          persistent: true, mandatory: true, messageId: messageId("bench", m), contentType: m.contentType!, type: m.eventType!, appId: "webhook-inbox",
          headers: { [HEADERS.source]: m.source, [HEADERS.id]: m.id, [HEADERS.attempt]: 1, [HEADERS.eventType]: m.eventType },
        }, (error: unknown) => (error ? reject(error) : resolve()));
      }));
      await channel.close();
      return rate;
    };
    const raw = await rawPhase();
    const queue = await fresh();
    const broker = openBroker(parseBrokerDestination("bench", { type: "rabbitmq", url: RABBITMQ, routingKey: queue }, "bench"));
    const brokers = await loop(async (i) => {
      const outcome = await broker.publish(message(queue, i));
      if (outcome.kind !== "done") throw new Error(JSON.stringify(outcome));
    });
    await broker.close();
    const workerQueue = await fresh();
    const worker = await drain(parseBrokerDestination("bench", { type: "rabbitmq", url: RABBITMQ, routingKey: workerQueue }, "bench"), dir);
    const rawAgain = await rawPhase();
    const waitMs = (CONCURRENCY / ((raw + rawAgain) / 2)) * 1000;
    const waiting = await drain(parseBrokerDestination("bench", { type: "nats", subject: "unused" }, "bench"), dir, waitMs);
    return report("RabbitMQ", { raw, rawAgain, brokers, worker, waiting, waitMs });
  } finally {
    for (const name of queues) await admin.deleteQueue(name).catch(() => {});
    await model.close();
  }
}

/** brokers runs both brokers' phases and returns the summary line. */
export async function brokers(): Promise<string> {
  let load = "";
  try {
    load = execFileSync("uptime", { encoding: "utf8" }).trim().replace(/.*load average/, "load average");
  } catch {
    // uptime is only context for the reader.
  }
  console.log(`brokers: ${CONCURRENCY} publishes in flight (DEFAULTS.concurrency), ${SECONDS} s per loop, ${load}`);
  const { dir, cleanup } = tempDir();
  try {
    const lines: string[] = [];
    if (WHICH.includes("nats")) lines.push(await nats(dir));
    if (WHICH.includes("rabbitmq")) lines.push(await rabbitmq(dir));
    return lines.join("; ");
  } finally {
    cleanup();
  }
}
