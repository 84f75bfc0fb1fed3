// test/brokers-crash.test.ts: workers publishing into the real brokers, SIGKILLed between the broker's
// acknowledgement and the done mark, again and again, on SQLite and on PostgreSQL. JetStream holds each
// delivery exactly once (control: with a duplicate window shorter than a lease, the same crashes double it);
// RabbitMQ gets every delivery at least once, and the doubles the crashes caused are counted.
//   npx node --import tsx --test test/brokers-crash.test.ts

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { describe, it } from "node:test";
import { nanos } from "@nats-io/transport-node";
import { HEADERS } from "../lib/brokers.ts";
import { connect } from "../inbox.ts";
import { backends, NATS, natsSkip, RABBITMQ, rabbitmqSkip, spawnScript } from "./helpers.ts";
import { jetStreamSuite, rabbitSuite } from "./brokers-suite.ts";

const DELIVERIES = 120;
const KILL_EVERY = 10;
const LEASE_MS = 400;
const run = randomBytes(4).toString("hex");
const natsSkipped = await natsSkip();
const rabbitSkipped = await rabbitmqSkip();

interface Crashes {
  /** Workers that died by their own SIGKILL, each right after an acknowledged publish. */
  kills: number;
  /** The deliveries whose acknowledged publish a kill followed. */
  killedAfterAck: string[];
  workers: number;
}

// fill stores the backlog: DELIVERIES deliveries numbered so the fixture knows which to die after.
async function fill(target: string): Promise<string[]> {
  const inbox = await connect(target);
  const ids = Array.from({ length: DELIVERIES }, (_, i) => `evt_${run}_${i + 1}`);
  await Promise.all(
    ids.map((id, i) =>
      inbox.store({
        source: "shop",
        id,
        body: Buffer.from(JSON.stringify({ n: i + 1 })),
        contentType: "application/json",
        eventType: "order.paid",
      }),
    ),
  );
  await inbox.close();
  return ids;
}

// crashUntilDrained runs broker-worker.ts processes one after another until every delivery is done; most
// die by SIGKILL after an acknowledged publish, and the next takes over their leases once they run out.
async function crashUntilDrained(target: string, destination: object): Promise<Crashes> {
  const crashes: Crashes = { kills: 0, killedAfterAck: [], workers: 0 };
  const deadline = Date.now() + 120_000;
  for (;;) {
    assert.ok(Date.now() < deadline, `drained within two minutes: ${JSON.stringify(crashes)}`);
    const child = spawnScript("test/fixtures/broker-worker.ts", [
      "--db",
      target,
      "--destination",
      JSON.stringify(destination),
      "--kill-every",
      String(KILL_EVERY),
      "--lease-ms",
      String(LEASE_MS),
    ]);
    crashes.workers++;
    let out = "";
    let err = "";
    child.stdout!.on("data", (d) => (out += d));
    child.stderr!.on("data", (d) => (err += d));
    const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
      child.on("close", (c, s) => resolve([c, s])),
    );
    if (signal === "SIGKILL") {
      crashes.kills++;
      crashes.killedAfterAck.push(...[...out.matchAll(/^kill (\S+)$/gm)].map((m) => m[1]!));
    } else {
      assert.equal(code, 0, `the worker exited cleanly or by its own SIGKILL: ${err}`);
    }
    const inbox = await connect(target);
    const [row] = await inbox.query("SELECT count(*) AS n FROM deliveries WHERE status = 'done'");
    await inbox.close();
    if (Number(row!.n) === DELIVERIES) return crashes;
    // The dead worker's leases run out before the next one may take them over.
    if (signal === "SIGKILL" || code === 0) await new Promise((resolve) => setTimeout(resolve, LEASE_MS));
  }
}

// copies counts how many times each delivery ID is among the messages.
function copies(ids: readonly string[]): Map<string, number> {
  const n = new Map<string, number>();
  for (const id of ids) n.set(id, (n.get(id) ?? 0) + 1);
  return n;
}

const BACKENDS = await backends("brokers_crash");

// SQLite and PostgreSQL take their turns at once, each backend's cases one after another: each case has a
// database, stream or queue of its own (named by backend), so the two share nothing but the brokers and the
// machine. Most of a case is a worker starting up or a lease running out, which the other backend fills.
describe("on both backends at once", { concurrency: true }, () => {
  for (const backend of BACKENDS) {
    describe(`workers on ${backend.name} killed between the broker's acknowledgement and the done mark`, {
      skip: backend.skip,
      concurrency: 1,
    }, () => {
      describe("publishing into NATS JetStream", { skip: natsSkipped }, () => {
        const jet = jetStreamSuite(NATS);
        const made = jet.made;

        // scenario fills a backlog, crashes workers through it into a fresh stream, and returns what the stream holds.
        async function scenario(
          duplicateWindowMs: number,
        ): Promise<{ crashes: Crashes; ids: string[]; held: Map<string, number> }> {
          const stream = `CRASH_${run}_${backend.name}_${made.length + 1}`;
          const subject = `crash${run}${backend.name}${made.length + 1}`;
          made.push(stream);
          await jet.jsm.streams.add({
            name: stream,
            subjects: [`${subject}.>`],
            duplicate_window: nanos(duplicateWindowMs),
          });
          const { target, cleanup } = await backend.make();
          try {
            const ids = await fill(target);
            const crashes = await crashUntilDrained(target, {
              type: "nats",
              url: NATS,
              subject: `${subject}.{source}.{type}`,
              stream,
            });
            const info = await jet.jsm.streams.info(stream);
            const seen: string[] = [];
            for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++) {
              const m = await jet.jsm.streams.getMessage(stream, { seq });
              if (m) seen.push(m.header.get(HEADERS.id));
            }
            return { crashes, ids, held: copies(seen) };
          } finally {
            await cleanup();
          }
        }

        it("holds each delivery exactly once in the stream", async () => {
          const { crashes, ids, held } = await scenario(120_000);
          console.log(
            `# JetStream on ${backend.name}: ${crashes.kills} kills after a PubAck in ${crashes.workers} workers; ${held.size} deliveries in the stream, ${[...held.values()].filter((n) => n > 1).length} doubled`,
          );
          assert.ok(crashes.kills >= 5, `the workers were killed many times: ${JSON.stringify(crashes)}`);
          assert.deepEqual([...held.keys()].sort(), [...ids].sort(), "every delivery is in the stream");
          assert.deepEqual(
            [...held].filter(([, n]) => n > 1),
            [],
            "none twice",
          );
        });

        it("control: with the duplicate window at its least (100 ms, shorter than a lease), the same crashes double messages", async () => {
          const { crashes, ids, held } = await scenario(100);
          const doubled = [...held].filter(([, n]) => n > 1).map(([id]) => id);
          console.log(
            `# JetStream on ${backend.name}, duplicate window 100 ms: ${crashes.kills} kills, ${doubled.length} deliveries doubled`,
          );
          assert.ok(crashes.kills >= 5, JSON.stringify(crashes));
          assert.deepEqual([...held.keys()].sort(), [...ids].sort(), "every delivery is in the stream");
          for (const id of crashes.killedAfterAck)
            assert.ok((held.get(id) ?? 0) >= 2, `${id}, killed after its PubAck, is in the stream twice`);
        });
      });

      describe("publishing into RabbitMQ", { skip: rabbitSkipped }, () => {
        const queue = `inbox-crash-${run}-${backend.name}`;
        const rabbit = rabbitSuite(RABBITMQ, queue);

        it("delivers each at least once; the doubles are those the crashes caused, and message_id tells them", async () => {
          await rabbit.channel.assertQueue(queue, { durable: true });
          const { target, cleanup } = await backend.make();
          try {
            const ids = await fill(target);
            const crashes = await crashUntilDrained(target, { type: "rabbitmq", url: RABBITMQ, routingKey: queue });
            const seen: string[] = [];
            const messageIds = new Set<string>();
            for (
              let m = await rabbit.channel.get(queue, { noAck: true });
              m !== false;
              m = await rabbit.channel.get(queue, { noAck: true })
            ) {
              seen.push(String(m.properties.headers?.[HEADERS.id]));
              messageIds.add(m.properties.messageId as string);
            }
            const held = copies(seen);
            const doubled = [...held].filter(([, n]) => n > 1).map(([id]) => id);
            console.log(
              `# RabbitMQ on ${backend.name}: ${crashes.kills} kills after a confirm in ${crashes.workers} workers; ${seen.length} messages for ${held.size} deliveries, ${doubled.length} doubled`,
            );
            assert.ok(crashes.kills >= 5, JSON.stringify(crashes));
            assert.deepEqual([...held.keys()].sort(), [...ids].sort(), "every delivery reached the queue");
            for (const id of crashes.killedAfterAck)
              assert.ok(doubled.includes(id), `${id}, killed after its confirm, was published again`);
            assert.equal(messageIds.size, DELIVERIES, "a consumer that dedups by message_id sees each delivery once");
          } finally {
            await cleanup();
          }
        });
      });
    });
  }
});
