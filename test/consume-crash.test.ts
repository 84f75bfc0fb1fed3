// test/consume-crash.test.ts: broker sources under crashes, with the real NATS JetStream and RabbitMQ, on
// SQLite and PostgreSQL. consumer.ts is SIGKILLed again and again mid-stream and its connection dropped
// (a TCP proxy of the test's own, cut); every message still ends stored once, handled once (its payment row
// once) and acknowledged. The control acks before the commit and loses messages under the same kills.
//   npx node --import tsx --test test/consume-crash.test.ts

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import { createServer, connect as tcp, type Server, type Socket } from "node:net";
import { join } from "node:path";
import { describe, it } from "node:test";
import { headers as natsHeaders, connect as natsConnect } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import amqp from "amqplib";
import { connect } from "../inbox.ts";
import { backends, NATS, natsSkip, RABBITMQ, rabbitmqSkip, runScript, spawnScript, tempDir } from "./helpers.ts";

const MESSAGES = 2_000;
const KILLS = 6;
const run = randomBytes(3).toString("hex");
const skipped = { nats: await natsSkip(), rabbitmq: await rabbitmqSkip() };

// Proxy stands between the consumer and its broker, so the test can drop the consumer's connection alone
// (the brokers are shared with other tests, whose connections must not be touched).
interface Proxy {
  port: number;
  cut(): void;
  close(): Promise<void>;
}

async function proxy(to: string): Promise<Proxy> {
  const target = new URL(to);
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = tcp(Number(target.port), target.hostname);
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("error", () => {});
      s.on("close", () => sockets.delete(s));
    }
    client.pipe(upstream).pipe(client);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  return {
    port,
    cut: () => {
      for (const s of sockets) s.destroy();
    },
    close: () => {
      for (const s of sockets) s.destroy();
      return new Promise((r) => server.close(() => r()));
    },
  };
}

// A broker under test: a fresh stream or queue of MESSAGES payments, and a way to ask whether all are acked.
interface Broker {
  settings(port: number): object;
  /** Messages not yet acknowledged: pending plus delivered and unacknowledged, once no consumer is up. */
  unacked(): Promise<number>;
  close(): Promise<void>;
}

const body = (i: number) => JSON.stringify({ customer: `cus_${i}`, amount: i });

async function jetStreamBroker(tag: string): Promise<Broker> {
  const nc = await natsConnect({ servers: NATS });
  const jsm = await jetstreamManager(nc);
  const stream = `I40C_${tag}`;
  await jsm.streams.add({ name: stream, subjects: [`i40c.${tag}.>`] });
  const js = jetstream(nc);
  // Half carry a Nats-Msg-Id, half are known by the stream and their sequence.
  for (let i = 0; i < MESSAGES; i += 200)
    await Promise.all(
      Array.from({ length: Math.min(200, MESSAGES - i) }, (_, k) => {
        const n = i + k;
        const h = natsHeaders();
        if (n % 2 === 0) h.set("Nats-Msg-Id", `pay-${n}`);
        return js.publish(`i40c.${tag}.payment`, body(n), { headers: h });
      }),
    );
  return {
    settings: (port) => ({
      type: "nats",
      url: `nats://127.0.0.1:${port}`,
      stream,
      consumer: "inbox",
      maxAckPending: 100,
      ackWaitMs: 2_000,
    }),
    async unacked() {
      const info = await jsm.consumers.info(stream, "inbox");
      return info.num_pending + info.num_ack_pending;
    },
    async close() {
      await jsm.streams.delete(stream).catch(() => {});
      await nc.close();
    },
  };
}

async function rabbitBroker(tag: string): Promise<Broker> {
  const model = await amqp.connect(RABBITMQ);
  const channel = await model.createConfirmChannel();
  const queue = `i40c.${tag}`;
  await channel.assertQueue(queue, { durable: true });
  for (let n = 0; n < MESSAGES; n++)
    channel.sendToQueue(queue, Buffer.from(body(n)), {
      messageId: `pay-${n}`,
      persistent: true,
      contentType: "application/json",
    });
  await channel.waitForConfirms();
  const url = new URL(RABBITMQ);
  return {
    settings: (port) => ({
      type: "rabbitmq",
      url: `amqp://${url.username}:${url.password}@127.0.0.1:${port}`,
      queue,
      prefetch: 100,
    }),
    async unacked() {
      return (await channel.checkQueue(queue)).messageCount;
    },
    async close() {
      await channel.deleteQueue(queue).catch(() => {});
      await model.close();
    },
  };
}

interface Run {
  kills: number;
  /** Kills after which the inbox held some of the messages but not all: mid-stream. */
  midStream: number;
  cuts: number;
  /** The last consumer's last line: its counts. */
  last?: string;
}

// crashes runs the consumer script, SIGKILLs it KILLS times at a random moment once it is consuming (one
// of the runs has its connection cut first), then runs it once more to the end and stops it with SIGTERM.
async function crashes(script: string, target: string, sourcesFile: string, broker: Broker, p: Proxy): Promise<Run> {
  const r: Run = { kills: 0, midStream: 0, cuts: 0 };
  const count = async () => {
    const inbox = await connect(target);
    try {
      return await inbox.count({ source: "pay" });
    } finally {
      await inbox.close();
    }
  };
  // Each consumer run: a promise of its start (its first line), and of its end with what it wrote.
  const spawned = () => {
    const child = spawnScript(script, ["--db", target, "--sources", sourcesFile]);
    let err = "";
    const ended = new Promise<{ signal: NodeJS.Signals | null; code: number | null; err: string }>((res) =>
      child.on("close", (code, signal) => res({ code, signal, err })),
    );
    const started = new Promise<void>((resolve, reject) => {
      child.stderr!.on("data", (d) => {
        err += d;
        if (/consumer: pay/.test(err)) resolve();
      });
      void ended.then(() => reject(new Error(`the consumer exited before it started: ${err}`)));
    });
    return { child, started, ended };
  };
  for (let k = 0; k < KILLS; k++) {
    const before = await count();
    const { child, started, ended } = spawned();
    await started;
    // Killed once it has stored a few more (a random number), so the kill lands mid-stream.
    const more = 20 + Math.floor(Math.random() * 200);
    const until = Date.now() + 3_000;
    while (Date.now() < until && (await count()) < Math.min(before + more, MESSAGES))
      await new Promise((res) => setTimeout(res, 10));
    if (k === 2) {
      p.cut();
      r.cuts++;
      await new Promise((res) => setTimeout(res, 300));
    }
    child.kill("SIGKILL");
    const end = await ended;
    assert.equal(end.signal, "SIGKILL", `the consumer lived until its SIGKILL: ${end.err}`);
    // On SQLite a killed consumer leaves its running mark, so the next process to start checks the file.
    if (script === "consumer.ts" && !target.startsWith("postgres"))
      assert.ok(existsSync(`${target}-running.${child.pid}`), "a SIGKILLed consumer's mark is left behind");
    r.kills++;
    const n = await count();
    if (n > 0 && n < MESSAGES) r.midStream++;
  }
  const last = spawned();
  await last.started;
  // A queue reads no messages ready while up to a prefetch of them are still on their way to their ack in
  // the consumer; stopped then, it hands them back (the control once ended with 55 ready again). So the queue
  // must read empty for a second on end before the last consumer is stopped.
  const deadline = Date.now() + 60_000;
  for (let quiet = 0; quiet < 5 && Date.now() < deadline; ) {
    quiet = (await broker.unacked()) > 0 ? 0 : quiet + 1;
    await new Promise((res) => setTimeout(res, 200));
  }
  last.child.kill("SIGTERM");
  const end = await last.ended;
  if (script === "consumer.ts" && !target.startsWith("postgres"))
    assert.ok(!existsSync(`${target}-running.${last.child.pid}`), "a consumer stopped by SIGTERM takes its mark away");
  r.last = end.err.trim().split("\n").at(-1) ?? "";
  return r;
}

for (const type of ["nats", "rabbitmq"] as const) {
  for (const backend of await backends(`consume_crash_${type}`)) {
    const skip = skipped[type] || backend.skip;
    const make = type === "nats" ? jetStreamBroker : rabbitBroker;
    const setUp = async (tag: string) => {
      const store = await backend.make();
      const broker = await make(tag);
      const p = await proxy(type === "nats" ? NATS : RABBITMQ);
      const dir = tempDir();
      const sourcesFile = join(dir.dir, "sources.json");
      writeFileSync(sourcesFile, JSON.stringify({ pay: { broker: broker.settings(p.port) } }));
      return {
        ...store,
        broker,
        p,
        sourcesFile,
        done: async () => {
          await p.close();
          await broker.close();
          dir.cleanup();
          await store.cleanup();
        },
      };
    };

    describe(`consumer.ts on ${type}, ${backend.name}`, { skip }, () => {
      it(`stores, handles and acknowledges each of ${MESSAGES} messages once through SIGKILLs and a dropped connection`, async () => {
        const s = await setUp(`${run}_${backend.name}_ok`);
        try {
          const r = await crashes("consumer.ts", s.target, s.sourcesFile, s.broker, s.p);
          assert.equal(r.kills, KILLS);
          assert.ok(r.midStream >= 1, `at least one kill landed mid-stream: ${JSON.stringify(r)}`);
          assert.equal(await s.broker.unacked(), 0, "every message acknowledged");
          const worked = await runScript("worker.ts", ["--once", "--quiet", "--db", s.target, "--handler", "demo"]);
          assert.equal(worked.code, 0, worked.stderr);
          const inbox = await connect(s.target);
          try {
            assert.equal(await inbox.count({ source: "pay" }), MESSAGES, "each message stored once");
            assert.equal(await inbox.count({ source: "pay", status: "done" }), MESSAGES, "each handled");
            const rows = await inbox.query("SELECT customer, count(*) AS n FROM payments GROUP BY customer");
            assert.equal(rows.length, MESSAGES, "a payment row for each message");
            assert.ok(
              rows.every((row) => Number(row.n) === 1),
              "no payment twice",
            );
          } finally {
            await inbox.close();
          }
          console.log(`# ${type} ${backend.name}: ${JSON.stringify(r)}`);
        } finally {
          await s.done();
        }
      });

      it("control: a consumer that acks before the commit loses messages under the same SIGKILLs", async () => {
        // A loss needs a kill between an ack and its commit; random kills can all miss that window in one
        // round (seen once in CI), so the control runs up to three rounds and must show a loss in one.
        const losses: string[] = [];
        for (let round = 0; round < 3 && losses.length === 0; round++) {
          const s = await setUp(`${run}_${backend.name}_early${round}`);
          try {
            const r = await crashes("test/fixtures/early-ack-consumer.ts", s.target, s.sourcesFile, s.broker, s.p);
            assert.equal(await s.broker.unacked(), 0, "the broker took every message as acknowledged");
            const inbox = await connect(s.target);
            let stored: number;
            try {
              stored = await inbox.count({ source: "pay" });
            } finally {
              await inbox.close();
            }
            console.log(
              `# control ${type} ${backend.name}, round ${round + 1}: ${JSON.stringify(r)}, stored ${stored} of ${MESSAGES}`,
            );
            if (stored < MESSAGES) losses.push(`${stored} of ${MESSAGES}`);
          } finally {
            await s.done();
          }
        }
        assert.ok(losses.length > 0, "acked before the commit, some messages were lost in one of three rounds");
      });
    });
  }
}
