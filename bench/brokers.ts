// bench/brokers.ts: what publishing through brokers.ts costs, against each broker's own client in the same run.
// For NATS JetStream and for RabbitMQ, at the worker's default concurrency (DEFAULTS.concurrency in flight):
//   raw        the official client in a loop, each publish awaiting its PubAck / publisher confirm, with the
//              same message ID, headers and body (the baseline, run before and after the others);
//   brokers.ts the same messages through openBroker().publish();
//   worker     the real run() of worker.ts draining a SQLite backlog, its handler publishing through brokers.ts;
//   and that worker again with no broker, its handler only waiting as long as a raw publish takes.
// Prints messages/s, this process's CPU per message (the worker runs in it), and the ratios against the
// baseline; for the worker, its commits and claims per delivery and the time its commits held the thread.
// BENCH_COMPARE=/path/to/another/checkout runs that checkout's run() and SqliteInbox too, in this process,
// the two taking turns with a raw loop in every round (BENCH_ROUNDS rounds, NATS only): an A/B in one run.
// Needs the servers at 127.0.0.1:4222 and :5672.
//   npm run bench -- brokers         BENCH_SECONDS=8 BENCH_BROKER_BACKLOG=20000 BENCH_BROKERS=nats,rabbitmq
//   BENCH_BROKERS=nats BENCH_ROUNDS=3 BENCH_COMPARE=/tmp/before npm run bench -- brokers

import { execFileSync, spawnSync } from "node:child_process";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { connect as natsConnect, headers as natsHeaders } from "@nats-io/transport-node";
import amqp from "amqplib";
import {
  HEADERS,
  messageId,
  parseBrokerDestination,
  type BrokerDestination,
  type BrokerMessage,
} from "../lib/brokers.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { f, fillBacklog, knob, ROOT, tempDir } from "./common.ts";

const SECONDS = knob("BENCH_SECONDS", 8);
const BACKLOG = knob("BENCH_BROKER_BACKLOG", 20_000);
const ROUNDS = knob("BENCH_ROUNDS", 1);
const COMPARE = process.env.BENCH_COMPARE;
const CONCURRENCY = DEFAULTS.concurrency;
const NATS = process.env.BENCH_NATS ?? DEFAULTS.natsUrl;
const RABBITMQ = process.env.BENCH_RABBITMQ ?? DEFAULTS.rabbitmqUrl;
const WHICH = (process.env.BENCH_BROKERS ?? "nats,rabbitmq").split(",");
const median = (xs: number[]) => {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
};

// The body fillBacklog stores, so that every phase sends the same bytes.
const body = (i: number) =>
  Buffer.from(JSON.stringify({ type: "payment.succeeded", customer: `c${i % 1000}`, amount: (i % 100) + 1 }));
const message = (tag: string, i: number): BrokerMessage => ({
  source: "default",
  id: `${tag}_${i}`,
  body: body(i),
  contentType: "application/json",
  eventType: "payment.succeeded",
  attempt: 1,
  replays: 0,
  orderKey: null,
  newerId: null,
  traceparent: null,
});

/** Tree is a checkout whose run(), SqliteInbox and brokers.ts are measured: this one, or BENCH_COMPARE's. */
interface Tree {
  name: string;
  run: typeof import("../worker.ts").run;
  SqliteInbox: typeof import("../lib/sqlite/sqlite.ts").SqliteInbox;
  openBroker: typeof import("../lib/brokers.ts").openBroker;
  messageOf: typeof import("../lib/brokers.ts").messageOf;
  PermanentError: typeof import("../lib/store.ts").PermanentError;
}

async function tree(root: string): Promise<Tree> {
  const load = (file: string) => import(pathToFileURL(resolve(root, file)).href);
  const [worker, sqlite, brokers, store] = await Promise.all([
    load("worker.ts"),
    load("lib/sqlite/sqlite.ts"),
    load("lib/brokers.ts"),
    load("lib/store.ts"),
  ]);
  // A tree with changes not yet committed is marked with a +, so that two trees at one commit differ.
  const dirty =
    spawnSync("git", ["-C", root, "status", "--porcelain", "--untracked-files=no"], {
      encoding: "utf8",
    }).stdout.trim() !== "";
  const name =
    (spawnSync("git", ["-C", root, "log", "-1", "--format=%h"], { encoding: "utf8" }).stdout.trim() || root) +
    (dirty ? "+" : "");
  return {
    name,
    run: worker.run,
    SqliteInbox: sqlite.SqliteInbox,
    openBroker: brokers.openBroker,
    messageOf: brokers.messageOf,
    PermanentError: store.PermanentError,
  };
}

/** Rate is one phase's messages/s and this process's CPU per message (user and system, every thread). */
interface Rate {
  rate: number;
  cpuUs: number;
}

// cpuSince is this process's CPU in µs since `from` (process.cpuUsage()).
const cpuSince = (from: NodeJS.CpuUsage) => {
  const used = process.cpuUsage(from);
  return used.user + used.system;
};

// loop keeps `concurrency` publishes in flight for SECONDS.
async function loop(publish: (i: number) => Promise<void>): Promise<Rate> {
  let next = 0;
  let done = 0;
  const until = performance.now() + SECONDS * 1000;
  const t0 = performance.now();
  const cpu0 = process.cpuUsage();
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < until) {
        await publish(next++);
        done++;
      }
    }),
  );
  return { rate: (done / (performance.now() - t0)) * 1000, cpuUs: cpuSince(cpu0) / done };
}

/** Drained is a worker phase: its rate and CPU, and per delivery its commits, its claims, and the ms its commits took. */
interface Drained extends Rate {
  commits: number;
  claims: number;
  commitMs: number;
}

// drain runs a tree's real worker over a backlog, publishing each delivery through its brokers.ts. Given
// waitMs instead, its handler only waits that long: the worker's own pace with a handler as slow as a
// publish, and no broker at all.
async function drain(t: Tree, destination: BrokerDestination, dir: string, waitMs?: number): Promise<Drained> {
  const path = join(dir, `${destination.type}-${waitMs ?? "broker"}-${Date.now()}.db`);
  fillBacklog(path, BACKLOG, `${destination.type}${Date.now()}`);
  let commits = 0;
  let commitMs = 0;
  let claims = 0;
  const inbox = new t.SqliteInbox(path, {
    onCommit: (_size, ms) => {
      commits++;
      commitMs += ms;
    },
  });
  const claimBatch = inbox.claimBatch.bind(inbox);
  inbox.claimBatch = (...args) => {
    claims++;
    return claimBatch(...args);
  };
  const broker = t.openBroker(destination);
  try {
    const t0 = performance.now();
    const cpu0 = process.cpuUsage();
    const stats = await t.run(
      async (job) => {
        if (waitMs !== undefined) return new Promise((resolve) => setTimeout(resolve, waitMs));
        const outcome = await broker.publish(t.messageOf(job.delivery, job.traceparent), job.signal);
        if (outcome.kind === "retry") throw new Error(outcome.error);
        if (outcome.kind === "failed") throw new t.PermanentError(outcome.error);
      },
      { inbox, once: true, log: () => {} },
    );
    const ms = performance.now() - t0;
    const cpuUs = cpuSince(cpu0);
    if (stats.done !== BACKLOG) throw new Error(`expected ${BACKLOG} done, got ${JSON.stringify(stats)}`);
    const n = stats.done;
    return {
      rate: (n / ms) * 1000,
      cpuUs: cpuUs / n,
      commits: commits / n,
      claims: claims / n,
      commitMs: commitMs / n,
    };
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

// A worker row: its rate against the baseline, and what it cost per delivery.
const workerLine = (r: Drained, base: number) =>
  `${f(r.rate).padStart(7)} deliveries/s = ${f(r.rate / base, 2)}x raw, CPU ${f(r.cpuUs)} µs/delivery (raw ${f(base)}/s), ` +
  `commits ${f(r.commits, 3)} and claims ${f(r.claims, 3)} a delivery, ${f(r.commitMs * 1000)} µs in commits a delivery`;

async function nats(dir: string, trees: Tree[]): Promise<string> {
  const nc = await natsConnect({ servers: NATS, reconnect: false }).catch((error: unknown) =>
    skipped("NATS JetStream", NATS, error),
  );
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
  const destination = (prefix: string) =>
    parseBrokerDestination("bench", { type: "nats", url: NATS, subject: `${prefix}.{source}.{type}` }, "bench");
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
    // Per round: the baseline's mean of its two runs, and each tree's worker with and without the broker.
    const bases: number[] = [];
    const rawCpu: number[] = [];
    const workers = trees.map(() => [] as Drained[]);
    const waitings = trees.map(() => [] as Drained[]);
    let brokers: Rate | undefined;
    for (let round = 1; round <= ROUNDS; round++) {
      const raw = await rawPhase();
      if (brokers === undefined) {
        const prefix = await fresh();
        const broker = trees[0]!.openBroker(destination(prefix));
        brokers = await loop(async (i) => {
          const outcome = await broker.publish(message(prefix, i));
          if (outcome.kind !== "done") throw new Error(JSON.stringify(outcome));
        });
        await broker.close();
      }
      for (const [k, t] of trees.entries()) workers[k]!.push(await drain(t, destination(await fresh()), dir));
      const rawAgain = await rawPhase();
      const base = (raw.rate + rawAgain.rate) / 2;
      bases.push(base);
      rawCpu.push((raw.cpuUs + rawAgain.cpuUs) / 2);
      const waitMs = (CONCURRENCY / base) * 1000;
      for (const [k, t] of trees.entries())
        waitings[k]!.push(
          await drain(t, parseBrokerDestination("bench", { type: "nats", subject: "unused" }, "bench"), dir, waitMs),
        );
      const at = ROUNDS > 1 ? `round ${round} ` : "";
      console.log(
        `  ${at}NATS JetStream raw client`.padEnd(40) +
          `${f(raw.rate).padStart(7)} msg/s, again after the others ${f(rawAgain.rate)} msg/s, CPU ${f(raw.cpuUs)} and ${f(rawAgain.cpuUs)} µs/msg`,
      );
      if (round === 1)
        console.log(
          `  NATS JetStream brokers.ts`.padEnd(40) +
            `${f(brokers.rate).padStart(7)} msg/s = ${f(brokers.rate / base, 2)}x raw, CPU ${f(brokers.cpuUs)} µs/msg`,
        );
      for (const [k, t] of trees.entries()) {
        console.log(`  ${at}worker + brokers.ts [${t.name}]`.padEnd(40) + workerLine(workers[k]!.at(-1)!, base));
        console.log(
          `  ${at}worker, no broker [${t.name}]`.padEnd(40) +
            workerLine(waitings[k]!.at(-1)!, base) +
            `; its handler only waits ${f(waitMs, 1)} ms`,
        );
      }
    }
    const ratio = (k: number) => median(workers[k]!.map((w, r) => w.rate / bases[r]!));
    const cpu = (k: number) => median(workers[k]!.map((w) => w.cpuUs));
    const part = (k: number) =>
      `worker [${trees[k]!.name}] ${f(ratio(k), 2)}x at ${f(cpu(k))} µs CPU/delivery (no broker ${f(median(waitings[k]!.map((w) => w.rate)))}/s)`;
    let line =
      `NATS JetStream${ROUNDS > 1 ? ` (median of ${ROUNDS})` : ""}: brokers.ts ${f(brokers!.rate / bases[0]!, 2)}x, ` +
      `${trees.map((_, k) => part(k)).join(", ")} the raw client (${f(median(bases))} msg/s at ${f(median(rawCpu))} µs CPU/msg)`;
    if (trees.length > 1) {
      const ab = (pick: (d: Drained) => number) => median(workers[0]!.map((w, r) => pick(w) / pick(workers[1]![r]!)));
      line += `; A/B worker rate x${f(
        ab((d) => d.rate),
        2,
      )}, CPU x${f(
        ab((d) => d.cpuUs),
        2,
      )}`;
    }
    console.log(`  ${line}`);
    return line;
  } finally {
    for (const name of streams) await jsm.streams.delete(name).catch(() => {});
    await nc.close();
  }
}

async function rabbitmq(dir: string, t: Tree): Promise<string> {
  const model = await amqp
    .connect(RABBITMQ)
    .catch((error: unknown) => skipped("RabbitMQ", new URL(RABBITMQ).host, error));
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
      const rate = await loop(
        (i) =>
          new Promise<void>((resolve, reject) => {
            const m = message(queue, i);
            channel.publish(
              "",
              queue,
              Buffer.from(m.body),
              {
                persistent: true,
                mandatory: true,
                messageId: messageId("bench", m),
                contentType: m.contentType!,
                type: m.eventType!,
                appId: "webhook-inbox",
                headers: {
                  [HEADERS.source]: m.source,
                  [HEADERS.id]: m.id,
                  [HEADERS.attempt]: 1,
                  [HEADERS.eventType]: m.eventType,
                },
              },
              (error: unknown) => (error ? reject(error) : resolve()),
            );
          }),
      );
      await channel.close();
      return rate;
    };
    const raw = await rawPhase();
    const queue = await fresh();
    const broker = t.openBroker(
      parseBrokerDestination("bench", { type: "rabbitmq", url: RABBITMQ, routingKey: queue }, "bench"),
    );
    const brokers = await loop(async (i) => {
      const outcome = await broker.publish(message(queue, i));
      if (outcome.kind !== "done") throw new Error(JSON.stringify(outcome));
    });
    await broker.close();
    const workerQueue = await fresh();
    const worker = await drain(
      t,
      parseBrokerDestination("bench", { type: "rabbitmq", url: RABBITMQ, routingKey: workerQueue }, "bench"),
      dir,
    );
    const rawAgain = await rawPhase();
    const base = (raw.rate + rawAgain.rate) / 2;
    const waitMs = (CONCURRENCY / base) * 1000;
    const waiting = await drain(
      t,
      parseBrokerDestination("bench", { type: "nats", subject: "unused" }, "bench"),
      dir,
      waitMs,
    );
    console.log(
      `  RabbitMQ raw client`.padEnd(40) +
        `${f(raw.rate).padStart(7)} msg/s, again after the others ${f(rawAgain.rate)} msg/s, CPU ${f(raw.cpuUs)} and ${f(rawAgain.cpuUs)} µs/msg`,
    );
    console.log(
      `  RabbitMQ brokers.ts`.padEnd(40) +
        `${f(brokers.rate).padStart(7)} msg/s = ${f(brokers.rate / base, 2)}x raw, CPU ${f(brokers.cpuUs)} µs/msg`,
    );
    console.log(`  RabbitMQ worker + brokers.ts`.padEnd(40) + workerLine(worker, base));
    console.log(
      `  RabbitMQ worker, no broker`.padEnd(40) +
        workerLine(waiting, base) +
        `; its handler only waits ${f(waitMs, 1)} ms`,
    );
    return `RabbitMQ: brokers.ts ${f(brokers.rate / base, 2)}x, worker ${f(worker.rate / base, 2)}x the raw client (${f(base)} msg/s; the worker with a handler as slow and no broker ${f(waiting.rate)}/s)`;
  } finally {
    for (const name of queues) await admin.deleteQueue(name).catch(() => {});
    await model.close();
  }
}

/** brokers runs both brokers' phases and returns the summary line. */
export async function brokers(): Promise<string> {
  let load = "";
  try {
    load = execFileSync("uptime", { encoding: "utf8" })
      .trim()
      .replace(/.*load average/, "load average");
  } catch {
    // uptime is only context for the reader.
  }
  const trees = [await tree(ROOT), ...(COMPARE ? [await tree(COMPARE)] : [])];
  console.log(
    `brokers: ${CONCURRENCY} publishes in flight (DEFAULTS.concurrency), ${SECONDS} s per loop, ${trees.map((t) => t.name).join(" and ")}, ${load}`,
  );
  const { dir, cleanup } = tempDir();
  try {
    const lines: string[] = [];
    if (WHICH.includes("nats")) lines.push(await nats(dir, trees));
    if (WHICH.includes("rabbitmq")) lines.push(await rabbitmq(dir, trees[0]!));
    return lines.join("; ");
  } finally {
    cleanup();
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) console.log(await brokers());
