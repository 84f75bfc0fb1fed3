// test/alone/consume-restart.test.ts: broker sources through a broker restart, with the real local NATS JetStream
// (nats-server stopped and started again) and RabbitMQ (rabbitmqctl stop_app, start_app), on SQLite and
// PostgreSQL. consumer.ts keeps running across it, connects again, and every message ends stored once,
// handled once (its payment row once) and acknowledged. Runs only where the broker is local and its tools are.
//   npx node --import tsx --test test/alone/consume-restart.test.ts

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { connect as tcp } from "node:net";
import { join } from "node:path";
import { promisify } from "node:util";
import { describe, it } from "node:test";
import { headers as natsHeaders, connect as natsConnect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, StorageType } from "@nats-io/jetstream";
import amqp from "amqplib";
import { connect } from "../../inbox.ts";
import { backends, brokerRestartSkip, NATS, RABBITMQ, runScript, spawnScript, tempDir } from "../helpers.ts";

// Each broker's stream must outlast its stop, so that the stop lands mid-stream with a prefetch's worth in
// flight: nats-server stops in about 0.2 s, but rabbitmqctl takes 1.6 to 2.3 s to boot and stop the app,
// and a consumer with a prefetch of 10 stored 6,000 messages before that on a quiet machine (CI caught
// it). RabbitMQ's stream is longer, and its prefetch smaller, so its commits (each about a fsync) pace it.
const MESSAGES = { nats: 6_000, rabbitmq: 12_000 };
const run = randomBytes(3).toString("hex");
const skipped = { nats: await brokerRestartSkip("nats"), rabbitmq: await brokerRestartSkip("rabbitmq") };
const exec = promisify(execFile);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

// answers is whether something listens on the local port: the test's (exec 3<>/dev/tcp/127.0.0.1/PORT).
const answers = (port: number) =>
  new Promise<boolean>((resolve) => {
    const s = tcp(port, "127.0.0.1");
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });

async function untilAnswers(port: number, ms = 30_000): Promise<void> {
  const until = Date.now() + ms;
  while (!(await answers(port))) {
    if (Date.now() > until) throw new Error(`port ${port} did not answer within ${ms} ms of the restart`);
    await sleep(100);
  }
}

// The machine's nats-server, as it is started here; always started again, whatever the stop did.
const NATS_SERVER = ["--exec", "/usr/sbin/nats-server"];
const NATS_ARGS = [
  "-a",
  "127.0.0.1",
  "-p",
  "4222",
  "-js",
  "-sd",
  "/var/lib/nats-server",
  "-l",
  "/var/log/nats-server.log",
];

// Each restart calls down() once the broker is stopped, before it starts again.
async function restartNats(down: () => Promise<void>): Promise<void> {
  try {
    await exec("start-stop-daemon", ["--stop", "--retry", "TERM/15/KILL/5", ...NATS_SERVER]);
    await down();
  } finally {
    await exec("start-stop-daemon", ["--start", "--oknodo", "--background", ...NATS_SERVER, "--", ...NATS_ARGS]);
    await untilAnswers(4222);
  }
}

async function restartRabbit(down: () => Promise<void>): Promise<void> {
  try {
    await exec("rabbitmqctl", ["stop_app"]);
    await down();
  } finally {
    await exec("rabbitmqctl", ["start_app"]);
    await untilAnswers(5672);
  }
}

// A broker under test: a fresh stream or queue of MESSAGES payments, its restart, and its unacked count.
interface Broker {
  settings: object;
  /** restart stops the broker, calls down(), and starts it again (always), until its port answers. */
  restart(down: () => Promise<void>): Promise<void>;
  /** Messages not yet acknowledged, asked on a connection of its own (the restart closed the last one). */
  unacked(): Promise<number>;
  close(): Promise<void>;
}

const body = (i: number) => JSON.stringify({ customer: `cus_${i}`, amount: i });

async function jetStreamBroker(tag: string): Promise<Broker> {
  const count = MESSAGES.nats;
  const stream = `I40R_${tag}`;
  const ask = async <T>(f: (jsm: Awaited<ReturnType<typeof jetstreamManager>>) => Promise<T>): Promise<T> => {
    const nc = await natsConnect({ servers: NATS, reconnect: false });
    try {
      return await f(await jetstreamManager(nc));
    } finally {
      await nc.close();
    }
  };
  const nc = await natsConnect({ servers: NATS, reconnect: false });
  try {
    const jsm = await jetstreamManager(nc);
    // On file, so the stream and the consumer's acks outlive the restart.
    await jsm.streams.add({ name: stream, subjects: [`i40r.${tag}.>`], storage: StorageType.File });
    const js = jetstream(nc);
    for (let i = 0; i < count; i += 200)
      await Promise.all(
        Array.from({ length: 200 }, (_, k) => {
          const h = natsHeaders();
          if ((i + k) % 2 === 0) h.set("Nats-Msg-Id", `pay-${i + k}`);
          return js.publish(`i40r.${tag}.payment`, body(i + k), { headers: h });
        }),
      );
  } finally {
    await nc.close();
  }
  return {
    settings: { type: "nats", url: NATS, stream, consumer: "inbox", maxAckPending: 10, ackWaitMs: 2_000 },
    restart: restartNats,
    unacked: () =>
      ask(async (jsm) => {
        const info = await jsm.consumers.info(stream, "inbox");
        return info.num_pending + info.num_ack_pending;
      }),
    close: () => ask((jsm) => jsm.streams.delete(stream)).then(() => {}),
  };
}

async function rabbitBroker(tag: string): Promise<Broker> {
  const count = MESSAGES.rabbitmq;
  const queue = `i40r.${tag}`;
  const ask = async <T>(f: (channel: amqp.Channel) => Promise<T>): Promise<T> => {
    const model = await amqp.connect(RABBITMQ);
    try {
      return await f(await model.createChannel());
    } finally {
      await model.close().catch(() => {});
    }
  };
  const model = await amqp.connect(RABBITMQ);
  try {
    const channel = await model.createConfirmChannel();
    await channel.assertQueue(queue, { durable: true });
    for (let n = 0; n < count; n++)
      channel.sendToQueue(queue, Buffer.from(body(n)), { messageId: `pay-${n}`, persistent: true });
    await channel.waitForConfirms();
  } finally {
    await model.close();
  }
  return {
    settings: { type: "rabbitmq", url: RABBITMQ, queue, prefetch: 4 },
    restart: restartRabbit,
    // Ready and unacknowledged alike: asked once the consumer is gone, the unacked are ready again.
    unacked: () => ask(async (c) => (await c.checkQueue(queue)).messageCount),
    close: () => ask((c) => c.deleteQueue(queue)).then(() => {}),
  };
}

for (const type of ["nats", "rabbitmq"] as const) {
  const messages = MESSAGES[type];
  for (const backend of await backends(`consume_restart_${type}`)) {
    describe(`consumer.ts on ${type}, ${backend.name}, through a broker restart`, {
      skip: skipped[type] || backend.skip,
    }, () => {
      it(`stores, handles and acknowledges each of ${messages} messages once, and keeps running`, async () => {
        const store = await backend.make();
        const broker = await (type === "nats" ? jetStreamBroker : rabbitBroker)(`${run}_${backend.name}`);
        const dir = tempDir();
        // One connection for the counts: opening one each time (a check, the migrations) is slower than the stream.
        const watch = await connect(store.target);
        const count = () => watch.count({ source: "pay" });
        try {
          const sourcesFile = join(dir.dir, "sources.json");
          writeFileSync(sourcesFile, JSON.stringify({ pay: { broker: broker.settings } }));
          const child = spawnScript("consumer.ts", ["--db", store.target, "--sources", sourcesFile]);
          let err = "";
          child.stderr!.on("data", (d) => {
            err += d;
          });
          const ended = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((res) =>
            child.on("close", (code, signal) => res({ code, signal })),
          );
          try {
            // Restarted once the consumer has stored some, mid-stream.
            const until = Date.now() + 30_000;
            while ((await count()) < 20 && Date.now() < until) await sleep(10);
            let atStop = 0;
            let stopMs = 0;
            const t0 = Date.now();
            const atStart = await count();
            await broker.restart(async () => {
              atStop = await count();
              stopMs = Date.now() - t0;
            });
            const restartMs = Date.now() - t0;
            const deadline = Date.now() + 40_000;
            while ((await count()) < messages && Date.now() < deadline) await sleep(100);
            if (type === "nats") {
              while ((await broker.unacked()) > 0 && Date.now() < deadline) await sleep(100);
              assert.equal(await broker.unacked(), 0, "every message acknowledged, while the consumer runs");
            }
            assert.equal(child.exitCode, null, `the consumer kept running across the restart: ${err}`);
            assert.ok(
              atStop > 0 && atStop < messages,
              `the broker stopped mid-stream (${atStop} of ${messages} stored; ${atStart} when the stop began, ${stopMs} ms before)`,
            );
            console.log(
              `# ${type} ${backend.name}: ${atStop} of ${messages} stored when the broker stopped, restarted in ${restartMs} ms; reconnects logged: ${(err.match(/connecting again/g) ?? []).length}`,
            );
          } finally {
            child.kill("SIGTERM");
          }
          const end = await ended;
          assert.equal(end.code, 0, `the consumer stopped cleanly on SIGTERM: ${err}`);
          const last = err.trim().split("\n").at(-1) ?? "";
          console.log(`# ${type} ${backend.name}: ${last}`);
          // The restart gave back the messages in flight; the inbox knew them by their IDs.
          const counts = JSON.parse(last.replace(/^consumer: pay: /, "")) as { redelivered: number; stored: number };
          assert.ok(counts.redelivered >= 1, `the restart redelivered messages in flight: ${last}`);
          assert.equal(counts.stored, messages, `stored once each, the redelivered ones as duplicates: ${last}`);
          if (type === "rabbitmq") assert.equal(await broker.unacked(), 0, "every message acknowledged");
          const worked = await runScript("worker.ts", ["--once", "--quiet", "--db", store.target]);
          assert.equal(worked.code, 0, worked.stderr);
          const inbox = await connect(store.target);
          try {
            assert.equal(await inbox.count({ source: "pay" }), messages, "each message stored once");
            assert.equal(await inbox.count({ source: "pay", status: "done" }), messages, "each handled");
            const rows = await inbox.query("SELECT customer, count(*) AS n FROM payments GROUP BY customer");
            assert.equal(rows.length, messages, "a payment row for each message");
            assert.ok(
              rows.every((row) => Number(row.n) === 1),
              "no payment twice",
            );
          } finally {
            await inbox.close();
          }
        } finally {
          await watch.close();
          await broker.close().catch(() => {});
          dir.cleanup();
          await store.cleanup();
        }
      });
    });
  }
}
