// test/consume-change.test.ts: what a broker source's consumer does when what it consumes from is not as
// it needs, or changes under it (issue 50), with the real NATS JetStream and RabbitMQ, on SQLite and
// PostgreSQL. A durable consumer made beforehand with ack_policy none is refused at start in one line; a
// stream deleted and made again, a queue deleted and declared again (a basic.cancel) are each a pause that
// is logged, counted, shown on /readyz, and consumed again, nothing lost, nothing taken for an old message;
// a consumer starved while its broker holds messages is unhealthy. Each has its control: the tree before
// (main at BEFORE, checked out beside this one) loses messages or stops in silence, or the bare mechanism
// fails.
//   npx node --test test/consume-change.test.ts

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import { symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, describe, it } from "node:test";
import {
  AckPolicy,
  DeliverPolicy,
  jetstream,
  jetstreamManager,
  type JetStreamManager,
  type JsMsg,
} from "@nats-io/jetstream";
import { headers as natsHeaders, connect as natsConnect, type NatsConnection } from "@nats-io/transport-node";
import amqp from "amqplib";
import { connect, type Inbox } from "../inbox.ts";
import { createAdmin, listenAdmin } from "../lib/admin/server.ts";
import { brokerLines, Consumer, type BrokerSource } from "../lib/consume.ts";
import { ourDescription } from "../lib/consume-health.ts";
import { Metrics, Readiness } from "../lib/metrics.ts";
import {
  backends,
  freePort,
  NATS,
  natsSkip,
  RABBITMQ,
  rabbitmqSkip,
  ROOT,
  runScript,
  spawnScript,
  tempDir,
  until,
} from "./helpers.ts";

const run = randomBytes(3).toString("hex");
const natsSkipped = await natsSkip();
const rabbitSkipped = await rabbitmqSkip();

// ---- The tree before issue 50, for the controls ----

/** BEFORE is main before issue 50: its consumer uses a JetStream consumer as it finds it, keys a message without an ID by stream:sequence, and ignores a basic.cancel. */
const BEFORE = "2ce6b22d26b72e1a846f04645a350eb2ae0c452c";
let beforeTree: { path: string; skip: string | false } | undefined;
after(() => {
  if (beforeTree && !beforeTree.skip)
    spawnSync("git", ["-C", ROOT, "worktree", "remove", "--force", beforeTree.path], { encoding: "utf8" });
});

// before checks the tree before out beside this one once (its node_modules linked to this one's), or says
// in one line why it cannot (a shallow clone, a tarball).
function before(): { path: string; skip: string | false } {
  if (beforeTree) return beforeTree;
  const path = join(tmpdir(), `inbox-before-50-${process.pid}`);
  const git = (...args: string[]) => spawnSync("git", ["-C", ROOT, ...args], { encoding: "utf8" });
  if (git("cat-file", "-e", `${BEFORE}^{commit}`).status !== 0) {
    const why = `this checkout has no commit ${BEFORE.slice(0, 7)} (a shallow clone?)`;
    if (process.env.CI) throw new Error(`consume-change control: ${why}`);
    console.log(`# consume-change controls skipped: ${why}`);
    return (beforeTree = { path, skip: why });
  }
  const made = git("worktree", "add", "--detach", "--force", path, BEFORE);
  if (made.status !== 0) {
    const why = `no checkout of ${BEFORE.slice(0, 7)} (${(made.stderr || "").trim().split("\n")[0]})`;
    if (process.env.CI) throw new Error(`consume-change control: ${why}`);
    console.log(`# consume-change controls skipped: ${why}`);
    return (beforeTree = { path, skip: why });
  }
  symlinkSync(join(ROOT, "node_modules"), join(path, "node_modules"));
  return (beforeTree = { path, skip: false });
}

// openWith opens a store with a tree's own inbox.ts, so that this tree's migrations never reach a store
// the tree before runs on.
async function openWith(tree: string, target: string): Promise<Inbox> {
  if (tree === ROOT) return connect(target);
  return ((await import(pathToFileURL(join(tree, "inbox.ts")).href)) as { connect: typeof connect }).connect(target);
}

async function stored(tree: string, target: string, source: string): Promise<number> {
  const inbox = await openWith(tree, target);
  try {
    return await inbox.count({ source });
  } finally {
    await inbox.close();
  }
}

// ---- Brokers ----

interface Stream {
  nc: NatsConnection;
  jsm: JetStreamManager;
  name: string;
  subject: string;
  publish(n: number, id?: (i: number) => string | undefined): Promise<void>;
  make(): Promise<void>;
  close(): Promise<void>;
}

async function stream(tag: string): Promise<Stream> {
  const nc = await natsConnect({ servers: NATS });
  const jsm = await jetstreamManager(nc);
  const name = `I50_${tag}_${run}`;
  const subject = `i50.${tag}.${run}`;
  const js = jetstream(nc);
  const make = async () => void (await jsm.streams.add({ name, subjects: [`${subject}.>`] }));
  await make();
  return {
    nc,
    jsm,
    name,
    subject,
    make,
    async publish(n, id = () => undefined) {
      for (let i = 0; i < n; i += 200)
        await Promise.all(
          Array.from({ length: Math.min(200, n - i) }, (_, k) => {
            const h = natsHeaders();
            const msgId = id(i + k);
            if (msgId) h.set("Nats-Msg-Id", msgId);
            return js.publish(`${subject}.pay`, JSON.stringify({ customer: `cus_${i + k}`, amount: i + k }), {
              headers: h,
            });
          }),
        );
    },
    async close() {
      await jsm.streams.delete(name).catch(() => {});
      await nc.close();
    },
  };
}

const jetStreamSource = (s: Stream, extra: object = {}): BrokerSource => ({
  type: "nats",
  servers: [NATS],
  timeoutMs: 5_000,
  stream: s.name,
  consumer: "inbox",
  maxAckPending: 100,
  ackWaitMs: 30_000,
  ...extra,
});

/** watch collects a child's stderr and says when a line matching a pattern has come. */
function watch(child: ReturnType<typeof spawnScript>) {
  const out = { text: "" };
  child.stderr!.on("data", (d) => (out.text += d));
  return {
    out,
    saw: (pattern: RegExp, what: string, ms?: number) =>
      until(`${what}: ${out.text.slice(-600)}`, () => pattern.test(out.text), ms),
  };
}

for (const backend of await backends("consume_change")) {
  describe(`a JetStream consumer made beforehand with ack_policy none, on ${backend.name}`, {
    skip: natsSkipped || backend.skip,
  }, () => {
    const TOTAL = 3_000;
    // setUp: a stream of TOTAL payments (half with a Nats-Msg-Id), its durable consumer made by someone
    // else with ack_policy none, and a sources file naming it.
    // A control runs the tree before, which migrates its own schema: it gets an empty one (make's empty).
    const setUp = async (tag: string, empty = false) => {
      const store = await backend.make({ empty });
      const s = await stream(`${tag}_${backend.name}`);
      await s.jsm.consumers.add(s.name, { durable_name: "inbox", ack_policy: AckPolicy.None, max_ack_pending: 100 });
      await s.publish(TOTAL, (i) => (i % 2 === 0 ? `pay-${i}` : undefined));
      const dir = tempDir();
      const file = join(dir.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          pay: { broker: { type: "nats", url: NATS, stream: s.name, consumer: "inbox", maxAckPending: 100 } },
        }),
      );
      const done = async () => {
        await s.close();
        dir.cleanup();
        await store.cleanup();
      };
      return { ...store, s, file, done };
    };

    it("consumer.ts refuses it at start in one line naming ack_policy and the fix, and takes nothing; the page says the same", async () => {
      const t = await setUp("none");
      try {
        const r = await runScript("consumer.ts", ["--db", t.target, "--sources", t.file]);
        assert.equal(r.code, 2, r.stderr);
        const said = r.stderr.split("\n").filter((l) => /ack_policy/.test(l));
        assert.equal(said.length, 1, r.stderr);
        assert.match(
          said[0]!,
          /^consume pay: refused: JetStream consumer I50_\w+\/inbox has ack_policy none: .*; delete it \(consumer\.ts makes it again as it needs it\) or name another in "consumer"$/,
        );
        const info = await t.s.jsm.consumers.info(t.s.name, "inbox");
        assert.equal(info.num_pending, TOTAL, "no message taken");
        assert.equal(await stored(ROOT, t.target, "pay"), 0);
        // The status command and the operator page name the same setting.
        const [line] = await brokerLines([{ name: "pay", broker: jetStreamSource(t.s) }]);
        assert.match(line!.problem ?? "", /ack_policy none/);
        const inbox = await connect(t.target);
        const admin = createAdmin({ inbox, audit: () => {}, brokers: async () => [line!] });
        try {
          const html = await (await fetch(await listenAdmin(admin, { host: "127.0.0.1", port: 0 }))).text();
          assert.match(html, /<th>health<\/th>/);
          assert.match(html, /<td class="error">JetStream consumer I50_\w+\/inbox has ack_policy none/);
        } finally {
          admin.server.close();
          await inbox.close();
        }
      } finally {
        await t.done();
      }
    });

    it("control: the tree before consumes it, and under SIGKILLs loses messages while the broker shows nothing pending", {
      skip: before().skip,
    }, async () => {
      const t = await setUp("nonectl", true);
      const tree = before().path;
      try {
        let midStream = 0;
        const pending = async () => (await t.s.jsm.consumers.info(t.s.name, "inbox")).num_pending;
        for (let k = 0; k < 4 && (await pending()) > 0; k++) {
          const already = await stored(tree, t.target, "pay");
          const child = spawnScript(join(tree, "consumer.ts"), ["--db", t.target, "--sources", t.file]);
          const seen = watch(child);
          const ended = once(child, "close");
          try {
            await seen.saw(/consumer: pay/, "the consumer started");
            // Killed once it has stored some more, so the kill lands mid-stream (or once nothing is left).
            await until(
              "some more stored",
              async () => (await stored(tree, t.target, "pay")) >= already + 50 || (await pending()) === 0,
            );
          } finally {
            child.kill("SIGKILL");
            await ended;
          }
          if ((await pending()) > 0 || (await stored(tree, t.target, "pay")) < TOTAL) midStream++;
        }
        // A last run to the end: until the broker holds nothing for it, then a SIGTERM.
        const last = spawnScript(join(tree, "consumer.ts"), ["--db", t.target, "--sources", t.file]);
        const ended = once(last, "close");
        try {
          await until("the broker holds nothing", async () => {
            const info = await t.s.jsm.consumers.info(t.s.name, "inbox");
            return info.num_pending === 0 && info.num_ack_pending === 0;
          });
          await new Promise((r) => setTimeout(r, 300));
        } finally {
          last.kill("SIGTERM");
          await ended;
        }
        const n = await stored(tree, t.target, "pay");
        console.log(`# control ${backend.name}: ${midStream} kills mid-stream, stored ${n} of ${TOTAL}`);
        assert.ok(midStream >= 1, "a kill landed mid-stream");
        assert.ok(n < TOTAL, `messages lost: stored ${n} of ${TOTAL}, and the broker has none pending`);
      } finally {
        await t.done();
      }
    });
  });

  describe(`a JetStream stream deleted and made again under a running consumer, on ${backend.name}`, {
    skip: natsSkipped || backend.skip,
  }, () => {
    // Each lifetime of the stream: three messages without an ID first (sequences 1 to 3 both times), then
    // messages with one.
    const firstLife = (s: Stream) => s.publish(5, (i) => (i < 3 ? undefined : `a-${i}`));
    const secondLife = (s: Stream) => s.publish(4, (i) => (i < 3 ? undefined : `b-${i}`));

    it("pauses (one line, counted, /readyz not ready), consumes again, and stores every new message, none taken for an old one", async () => {
      const { target, cleanup } = await backend.make();
      const s = await stream(`life_${backend.name}`);
      const inbox = await connect(target);
      const lines: string[] = [];
      const c = new Consumer({
        inbox,
        source: { name: "orders", broker: jetStreamSource(s) },
        log: (l) => lines.push(l),
        checkEveryMs: 200,
      });
      const metrics = new Metrics({ inbox, processMetrics: false });
      metrics.consumedFrom("orders", c.counts, c.health);
      const readiness = new Readiness(inbox, { also: () => c.health.ready() });
      try {
        await firstLife(s);
        c.start();
        await until("five acked", () => c.counts.acked === 5);
        await s.jsm.streams.delete(s.name);
        await until("the pause said", () => lines.some((l) => /paused/.test(l)));
        assert.notEqual(await readiness.ready(), true, "not ready while paused");
        await s.make();
        await secondLife(s);
        await until("four more acked", () => c.counts.acked === 9);
        assert.equal(c.counts.stored, 9, "every message of both lifetimes stored");
        assert.equal(c.counts.duplicate, 0, "none taken for an old one");
        assert.equal(await inbox.count({ source: "orders" }), 9);
        const pauses = lines.filter((l) => /^consume orders: paused: /.test(l));
        assert.ok(pauses.length >= 1 && pauses.length <= 2, lines.join("\n"));
        assert.match(pauses[0]!, /consumer deleted|does not exist/);
        assert.ok(
          lines.some((l) => /^consume orders: consuming again, after [\d.]+ s of: /.test(l)),
          lines.join("\n"),
        );
        assert.ok(lines.some((l) => /made JetStream consumer .*\/inbox \(ack_policy explicit/.test(l)));
        const text = await metrics.text();
        const counted = [...text.matchAll(/inbox_consumer_pauses_total\{source="orders",reason="(\w+)"\} (\d+)/g)]
          .filter((m) => m[2] !== "0")
          .map((m) => m[1]);
        assert.ok(counted.length >= 1, text);
        assert.ok(
          counted.every((r) => r === "consumer_deleted" || r === "stream_missing"),
          counted.join(),
        );
        assert.match(text, /inbox_consumer_state\{source="orders"\} 0/);
        assert.equal(await readiness.ready(), true);
      } finally {
        await c.stop();
        await inbox.close();
        await s.close();
        await cleanup();
      }
    });

    it("control: the tree before, started again after it, takes the new stream's messages without an ID for the old one's and drops them", {
      skip: before().skip,
    }, async () => {
      const { target, cleanup } = await backend.make({ empty: true });
      const s = await stream(`lifectl_${backend.name}`);
      const tree = before().path;
      const old = (await import(pathToFileURL(join(tree, "lib/consume.ts")).href)) as {
        Consumer: typeof Consumer;
      };
      const inbox = await openWith(tree, target);
      try {
        await firstLife(s);
        const first = new old.Consumer({
          inbox,
          source: { name: "orders", broker: jetStreamSource(s) },
          log: () => {},
        });
        first.start();
        await until("five acked", () => first.counts.acked === 5);
        await first.stop();
        await s.jsm.streams.delete(s.name);
        await s.make();
        await secondLife(s);
        const again = new old.Consumer({
          inbox,
          source: { name: "orders", broker: jetStreamSource(s) },
          log: () => {},
        });
        again.start();
        await until("four acked", () => again.counts.acked === 4);
        await again.stop();
        assert.equal(again.counts.duplicate, 3, "the three without an ID taken for the old stream's 1 to 3");
        assert.equal(await inbox.count({ source: "orders" }), 6, "3 of the second lifetime's 4 lost");
      } finally {
        await inbox.close();
        await s.close();
        await cleanup();
      }
    });
  });

  describe(`a RabbitMQ queue deleted and declared again under consumer.ts (a basic.cancel), on ${backend.name}`, {
    skip: rabbitSkipped || backend.skip,
  }, () => {
    // setUp: a durable queue with 50 messages, a sources file, and a way to declare it again.
    // A control runs the tree before, which migrates its own schema: it gets an empty one (make's empty).
    const setUp = async (tag: string, empty = false) => {
      const store = await backend.make({ empty });
      const model = await amqp.connect(RABBITMQ);
      const ch = await model.createConfirmChannel();
      const queue = `i50.${tag}.${backend.name}.${run}`;
      const declare = () => ch.assertQueue(queue, { durable: true });
      const send = async (from: number, n: number) => {
        for (let i = from; i < from + n; i++)
          ch.sendToQueue(queue, Buffer.from(JSON.stringify({ customer: `cus_${i}`, amount: i })), {
            messageId: `pay-${i}`,
            persistent: true,
          });
        await ch.waitForConfirms();
      };
      await declare();
      await send(0, 50);
      const dir = tempDir();
      const file = join(dir.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({ billing: { broker: { type: "rabbitmq", url: RABBITMQ, queue, prefetch: 20 } } }),
      );
      const done = async () => {
        await ch.deleteQueue(queue).catch(() => {});
        await model.close();
        dir.cleanup();
        await store.cleanup();
      };
      return { ...store, ch, queue, declare, send, file, done };
    };

    it("says the cancel and the missing queue in a line each, counts them, is not ready meanwhile, consumes again with nothing lost, and stops on SIGTERM at once", async () => {
      const t = await setUp("gone");
      const port = await freePort();
      const child = spawnScript("consumer.ts", ["--db", t.target, "--sources", t.file, "--metrics-port", String(port)]);
      const seen = watch(child);
      const ended = once(child, "close");
      const get = async (path: string) => {
        const r = await fetch(`http://127.0.0.1:${port}${path}`);
        return { status: r.status, text: await r.text() };
      };
      try {
        await until("fifty stored", async () => (await stored(ROOT, t.target, "billing")) === 50);
        await t.ch.deleteQueue(t.queue);
        await seen.saw(/paused: RabbitMQ cancelled the consumer of queue \S+ \(basic\.cancel\)/, "the cancel said");
        await seen.saw(/paused: RabbitMQ queue \S+ does not exist/, "the missing queue said");
        const meanwhile = await get("/readyz");
        assert.equal(meanwhile.status, 503);
        assert.match(meanwhile.text, /billing: paused: RabbitMQ queue \S+ does not exist/);
        await t.declare();
        await t.send(50, 100);
        await until("all 150 stored", async () => (await stored(ROOT, t.target, "billing")) === 150);
        await seen.saw(/consume billing: consuming again, after [\d.]+ s of: /, "consuming again");
        assert.equal((await get("/readyz")).status, 200);
        const text = (await get("/metrics")).text;
        assert.match(text, /inbox_consumer_pauses_total\{source="billing",reason="cancelled"\} 1\n/);
        assert.match(text, /inbox_consumer_pauses_total\{source="billing",reason="queue_missing"\} 1\n/);
        assert.match(text, /inbox_consumer_state\{source="billing"\} 0/);
        await until("the queue drained", async () => (await t.ch.checkQueue(t.queue)).messageCount === 0);
        const pauses = seen.out.text.split("\n").filter((l) => /paused/.test(l));
        assert.equal(pauses.length, 2, seen.out.text);
        const asked = Date.now();
        child.kill("SIGTERM");
        const [code] = await ended;
        assert.equal(code, 0, seen.out.text);
        assert.ok(Date.now() - asked < 10_000, `stopped within 10 s of its SIGTERM (${Date.now() - asked} ms)`);
      } finally {
        if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
        await t.done();
      }
    });

    it("control: the tree before says nothing and consumes nothing of the queue declared again", {
      skip: before().skip,
    }, async () => {
      const t = await setUp("gonectl", true);
      const tree = before().path;
      const child = spawnScript(join(tree, "consumer.ts"), ["--db", t.target, "--sources", t.file]);
      const seen = watch(child);
      const ended = once(child, "close");
      try {
        await until("fifty stored", async () => (await stored(tree, t.target, "billing")) === 50);
        const quiet = seen.out.text;
        await t.ch.deleteQueue(t.queue);
        await t.declare();
        await t.send(50, 100);
        // Three reconnect pauses of that tree's: the tree after has consumed them by then.
        await new Promise((r) => setTimeout(r, 3_000));
        const q = await t.ch.checkQueue(t.queue);
        assert.equal(q.messageCount, 100, "none of the new messages taken");
        assert.equal(q.consumerCount, 0, "nobody consumes the queue");
        assert.equal(await stored(tree, t.target, "billing"), 50);
        assert.equal(seen.out.text, quiet, "not a line said");
      } finally {
        if (child.exitCode === null && child.signalCode === null) {
          child.kill("SIGKILL");
          await ended;
        }
        await t.done();
      }
    });
  });

  describe(`a consumer starved while its broker holds messages for it, on ${backend.name}`, {
    skip: backend.skip,
  }, () => {
    // starve runs a Consumer on a pinned clock, with /readyz served, while another client holds what the
    // broker would give it; it checks the consumer is healthy within the bound, unhealthy past it, and
    // healthy again (the control) once the other client lets go and it takes the rest.
    const starve = async (
      broker: BrokerSource,
      total: number,
      letGo: () => Promise<void>,
      inbox: Inbox,
    ): Promise<void> => {
      const clock = { t: Date.now() };
      const c = new Consumer({
        inbox,
        source: { name: "orders", broker },
        log: () => {},
        now: () => clock.t,
        starvedAfterMs: 60_000,
        checkEveryMs: 100,
      });
      const metrics = new Metrics({ inbox, processMetrics: false });
      metrics.consumedFrom("orders", c.counts, c.health);
      const server = await metrics.listen(0, "127.0.0.1", new Readiness(inbox, { also: () => c.health.ready() }));
      const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
      const readyz = async () => {
        const r = await fetch(`${url}/readyz`);
        return { status: r.status, text: await r.text() };
      };
      try {
        c.start();
        await until("the broker says it holds messages for it", () => c.counts.lag > 0);
        assert.equal(c.counts.consumed, 0, "it took nothing");
        assert.equal((await readyz()).status, 200, "within the bound: healthy");
        clock.t += 61_000;
        const starved = await readyz();
        assert.equal(starved.status, 503);
        assert.match(
          starved.text,
          /not ready: orders: starved: has taken nothing for 61 s while its broker holds \d+ messages/,
        );
        assert.match(await metrics.text(), /inbox_consumer_state\{source="orders"\} 2/);
        await letGo();
        await until("the rest taken", () => c.counts.acked === total);
        assert.equal((await readyz()).status, 200, "taking messages: healthy again");
      } finally {
        server.close();
        await c.stop();
      }
    };

    it("JetStream: unhealthy on /readyz while another client holds its max_ack_pending slots (control: healthy once they are acked)", {
      skip: natsSkipped,
    }, async () => {
      const { target, cleanup } = await backend.make();
      const s = await stream(`starve_${backend.name}`);
      const inbox = await connect(target);
      try {
        // The inbox's own consumer, made as consumer.ts makes it, with room for five unacknowledged.
        await s.jsm.consumers.add(s.name, {
          durable_name: "inbox",
          description: ourDescription("orders"),
          ack_policy: AckPolicy.Explicit,
          deliver_policy: DeliverPolicy.All,
          ack_wait: 30e9,
          max_deliver: -1,
          max_ack_pending: 5,
        });
        await s.publish(40, (i) => `o-${i}`);
        const held: JsMsg[] = [];
        const other = await jetstream(s.nc).consumers.get(s.name, "inbox");
        for await (const m of await other.fetch({ max_messages: 5, expires: 2_000 })) held.push(m);
        assert.equal(held.length, 5);
        await starve(
          jetStreamSource(s, { maxAckPending: 5 }),
          35,
          async () => {
            for (const m of held) await m.ackAck();
          },
          inbox,
        );
      } finally {
        await inbox.close();
        await s.close();
        await cleanup();
      }
    });

    it("RabbitMQ: unhealthy on /readyz while another consumer is the queue's single active one and holds its messages (control: healthy once it goes)", {
      skip: rabbitSkipped,
    }, async () => {
      const { target, cleanup } = await backend.make();
      const model = await amqp.connect(RABBITMQ);
      const ch = await model.createConfirmChannel();
      const queue = `i50.starve.${backend.name}.${run}`;
      await ch.assertQueue(queue, { durable: true, arguments: { "x-single-active-consumer": true } });
      for (let i = 0; i < 40; i++)
        ch.sendToQueue(queue, Buffer.from(`{"i":${i}}`), { messageId: `o-${i}`, persistent: true });
      await ch.waitForConfirms();
      const rival = await model.createChannel();
      await rival.prefetch(5);
      let got = 0;
      await rival.consume(queue, () => void got++, { noAck: false });
      await until("the rival holds five", () => got === 5);
      const inbox = await connect(target);
      try {
        const broker: BrokerSource = { type: "rabbitmq", url: RABBITMQ, timeoutMs: 5_000, queue, prefetch: 10 };
        // The rival's channel closed: its five go back to the queue, and the inbox's consumer becomes active.
        await starve(broker, 40, () => rival.close(), inbox);
      } finally {
        await inbox.close();
        await ch.deleteQueue(queue).catch(() => {});
        await model.close();
        await cleanup();
      }
    });
  });
}
