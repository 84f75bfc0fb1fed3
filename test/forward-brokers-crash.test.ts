// test/forward-brokers-crash.test.ts: the real worker.ts forwarding into broker destinations named in the
// sources file, SIGKILLed again and again while it forwards, on SQLite and on PostgreSQL. Each kill comes the
// moment the test sees one of the worker's publishes reach the broker, so the message is there and its done
// mark is not: the next worker publishes it again once the lease runs out. NATS JetStream holds each
// delivery exactly once (its duplicate window drops the second publish; control: a window shorter than the
// lease keeps both); RabbitMQ has each at least once, the doubles being those the kills caused.
//   npx node --import tsx --test test/forward-brokers-crash.test.ts

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { nanos } from "@nats-io/transport-node";
import { HEADERS } from "../lib/brokers.ts";
import { connect } from "../inbox.ts";
import { backends, NATS, natsSkip, RABBITMQ, rabbitmqSkip, spawnScript, tempDir } from "./helpers.ts";
import { jetStreamSuite, rabbitSuite } from "./brokers-suite.ts";

const DELIVERIES = 150;
const KILLS = 4;
const run = randomBytes(4).toString("hex");
const natsSkipped = await natsSkip();
const rabbitSkipped = await rabbitmqSkip();

/** Seen is what the test saw reach the broker: each publish's delivery ID, in order, duplicates kept. */
interface Seen {
  ids: string[];
  /** Called on each new publish; the kill loop waits on it. */
  onPublish?: () => void;
}

// fill stores the backlog as the receiver would for a source routed to the broker destination alone.
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
        destinations: ["events"],
      }),
    ),
  );
  await inbox.close();
  return ids;
}

// pending counts the rows not yet done.
async function pending(target: string): Promise<number> {
  const inbox = await connect(target);
  try {
    return Number((await inbox.query("SELECT count(*) AS n FROM deliveries WHERE status <> 'done'"))[0]!.n);
  } finally {
    await inbox.close();
  }
}

// crashThenDrain runs worker.ts --sources on the backlog KILLS times, SIGKILLing each the moment a publish of
// its own reaches the broker, then once more until every row is done, and stops that one with SIGTERM.
async function crashThenDrain(
  target: string,
  sources: string,
  seen: Seen,
): Promise<{ kills: number; workers: number }> {
  const stats = { kills: 0, workers: 0 };
  const deadline = Date.now() + 120_000;
  for (;;) {
    assert.ok(Date.now() < deadline, `drained within two minutes: ${JSON.stringify(stats)}`);
    const killing = stats.kills < KILLS;
    const child = spawnScript("worker.ts", ["--sources", sources, "--db", target, "--lease", "1", "--quiet"]);
    stats.workers++;
    let err = "";
    child.stderr!.on("data", (d) => (err += d));
    const closed = new Promise<NodeJS.Signals | null>((resolve) =>
      child.on("close", (_code, signal) => resolve(signal)),
    );
    if (killing) {
      // Killed at its first publish the broker has, before the worker can have written its done mark.
      const before = seen.ids.length;
      // Bounded by the deadline: a consumer that never hears the worker's publishes (seen once, the worker
      // done with every delivery) would otherwise hang the run rather than fail it.
      let timer: NodeJS.Timeout | undefined;
      await new Promise<void>((resolve) => {
        seen.onPublish = () => {
          if (seen.ids.length > before) resolve();
        };
        void closed.then(() => resolve());
        timer = setTimeout(resolve, Math.max(0, deadline - Date.now()));
      });
      clearTimeout(timer);
      seen.onPublish = undefined;
      if (seen.ids.length === before && child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL");
        assert.fail(
          `no publish of worker ${stats.workers} reached the test's consumer within the deadline: ${JSON.stringify(stats)}; ${err}`,
        );
      }
      child.kill("SIGKILL");
      if ((await closed) === "SIGKILL") stats.kills++;
      else assert.fail(`a worker exited on its own: ${err}`);
      continue;
    }
    while ((await pending(target)) > 0) {
      assert.ok(Date.now() < deadline && child.exitCode === null, `the last worker drains the backlog: ${err}`);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    child.kill("SIGTERM");
    await closed;
    return stats;
  }
}

// copies counts how many times each delivery ID came.
function copies(ids: readonly string[]): Map<string, number> {
  const n = new Map<string, number>();
  for (const id of ids) n.set(id, (n.get(id) ?? 0) + 1);
  return n;
}

const BACKENDS = await backends("fwd_brokers_crash");

// SQLite and PostgreSQL take their turns at once, each backend's cases one after another: each case has a
// database, stream or queue of its own (named by backend), so the two share nothing but the brokers and the
// machine. Most of a case is a worker starting up or a lease running out, which the other backend fills.
describe("on both backends at once", { concurrency: true }, () => {
  for (const backend of BACKENDS) {
    describe(`worker.ts forwarding into brokers through the sources file, SIGKILLed, on ${backend.name}`, {
      skip: backend.skip,
      concurrency: 1,
    }, () => {
      let files: { dir: string; cleanup: () => void };
      beforeEach(() => (files = tempDir()));
      afterEach(() => files.cleanup());
      const sourcesFile = (destination: Record<string, unknown>) => {
        const file = join(files.dir, "sources.json");
        writeFileSync(
          file,
          JSON.stringify({ $destinations: { events: destination }, shop: { provider: "plain", routes: ["events"] } }),
        );
        return file;
      };

      describe("into NATS JetStream", { skip: natsSkipped }, () => {
        const jet = jetStreamSuite(NATS);
        const made = jet.made;

        // scenario crashes workers through a backlog into a fresh stream, watching every publish on its subjects.
        async function scenario(duplicateWindowMs: number) {
          const n = made.length + 1;
          const stream = `FWD_${run}_${backend.name}_${n}`;
          const subject = `fwd${run}${backend.name}${n}`;
          made.push(stream);
          await jet.jsm.streams.add({
            name: stream,
            subjects: [`${subject}.>`],
            duplicate_window: nanos(duplicateWindowMs),
          });
          // A plain subscriber gets every publish, the ones the stream drops as duplicates too.
          const seen: Seen = { ids: [] };
          const sub = jet.nc.subscribe(`${subject}.>`, {
            callback: (_e, m) => {
              seen.ids.push(m.headers?.get(HEADERS.id) ?? "?");
              seen.onPublish?.();
            },
          });
          await jet.nc.flush();
          const { target, cleanup } = await backend.make();
          try {
            const ids = await fill(target);
            const crashes = await crashThenDrain(
              target,
              sourcesFile({ type: "nats", url: NATS, subject: `${subject}.{source}.{type}`, stream }),
              seen,
            );
            await jet.nc.flush();
            const info = await jet.jsm.streams.info(stream);
            const stored: string[] = [];
            for (let seq = info.state.first_seq; seq <= info.state.last_seq; seq++) {
              const m = await jet.jsm.streams.getMessage(stream, { seq });
              if (m) stored.push(m.header.get(HEADERS.id));
            }
            return { crashes, ids, published: seen.ids, held: copies(stored) };
          } finally {
            sub.unsubscribe();
            await cleanup();
          }
        }

        it("holds each delivery exactly once, though the killed workers' last publishes went out again", async () => {
          const { crashes, ids, published, held } = await scenario(120_000);
          const again = published.length - new Set(published).size;
          console.log(
            `# worker.ts into JetStream on ${backend.name}: ${crashes.kills} kills in ${crashes.workers} workers, ${published.length} publishes (${again} again), ${held.size} deliveries in the stream`,
          );
          assert.equal(crashes.kills, KILLS);
          assert.ok(again >= KILLS, `each kill left a publish without its done mark, sent again: ${again}`);
          assert.deepEqual([...held.keys()].sort(), [...ids].sort(), "every delivery is in the stream");
          assert.deepEqual(
            [...held].filter(([, k]) => k > 1),
            [],
            "none twice",
          );
        });

        it("control: with a duplicate window shorter than the lease, the same kills leave doubles in the stream", {
          skip: backend.name !== "sqlite" && "the control runs once, on SQLite",
        }, async () => {
          const { crashes, ids, held } = await scenario(100);
          const doubled = [...held].filter(([, k]) => k > 1).length;
          console.log(
            `# worker.ts into JetStream on ${backend.name}, duplicate window 100 ms: ${crashes.kills} kills, ${doubled} deliveries doubled`,
          );
          assert.deepEqual([...held.keys()].sort(), [...ids].sort(), "every delivery is in the stream");
          assert.ok(doubled >= 1, "a publish sent again after the window is kept twice");
        });
      });

      describe("into RabbitMQ", { skip: rabbitSkipped }, () => {
        const queue = `inbox-fwd-crash-${run}-${backend.name}`;
        const rabbit = rabbitSuite(RABBITMQ, queue);

        it("has each delivery at least once; the doubles are the kills' and message_id tells them", async () => {
          await rabbit.channel.assertQueue(queue, { durable: true });
          const seen: Seen = { ids: [] };
          const messageIds: string[] = [];
          const { consumerTag } = await rabbit.channel.consume(
            queue,
            (m) => {
              if (!m) return;
              seen.ids.push(String(m.properties.headers?.[HEADERS.id]));
              messageIds.push(String(m.properties.messageId));
              seen.onPublish?.();
            },
            { noAck: true },
          );
          const { target, cleanup } = await backend.make();
          try {
            const ids = await fill(target);
            const crashes = await crashThenDrain(
              target,
              sourcesFile({ type: "rabbitmq", url: RABBITMQ, routingKey: queue }),
              seen,
            );
            // Whatever is still on its way to the consumer arrives before the queue is found empty.
            for (let i = 0; i < 100 && (await rabbit.channel.checkQueue(queue)).messageCount > 0; i++)
              await new Promise((resolve) => setTimeout(resolve, 20));
            await rabbit.channel.cancel(consumerTag);
            const held = copies(seen.ids);
            const doubled = [...held].filter(([, k]) => k > 1).length;
            console.log(
              `# worker.ts into RabbitMQ on ${backend.name}: ${crashes.kills} kills in ${crashes.workers} workers, ${seen.ids.length} messages for ${held.size} deliveries, ${doubled} doubled`,
            );
            assert.equal(crashes.kills, KILLS);
            assert.deepEqual([...held.keys()].sort(), [...ids].sort(), "every delivery reached the queue");
            assert.ok(doubled >= 1, "at least once, not exactly once: the kills' publishes came again");
            assert.equal(
              new Set(messageIds).size,
              DELIVERIES,
              "a consumer that dedups by message_id sees each delivery once",
            );
          } finally {
            await cleanup();
          }
        });
      });
    });
  }
});
