// test/consume-health.test.ts: lib/consume-health.ts on its own. Which JetStream consumer settings and
// RabbitMQ queue arguments are refused (each with the one line that names the setting and the fix), which
// a consumer the inbox made has corrected instead, and Health's states on a pinned clock: each pause one
// line and one count however often it is said, starved only while the broker holds messages.
//   npx node --test test/consume-health.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import {
  Health,
  judgeJetStreamConsumer,
  judgeRabbitQueue,
  ourDescription,
  pauseOf,
  STATE_CODES,
} from "../lib/consume-health.ts";

const want = { stream: "ORDERS", consumer: "inbox", maxAckPending: 512, ackWaitMs: 30_000 };
// What consumer.ts makes: every later case changes one setting of it.
const good = {
  ack_policy: "explicit",
  deliver_policy: "all",
  ack_wait: 30e9,
  max_deliver: -1,
  max_ack_pending: 512,
};

describe("judgeJetStreamConsumer()", () => {
  it("accepts the consumer consumer.ts makes, made by anyone (control for the refusals below)", () => {
    assert.deepEqual(judgeJetStreamConsumer(good, want), { fix: {}, notes: [] });
    assert.deepEqual(judgeJetStreamConsumer({ ...good, description: ourDescription("orders") }, want), {
      fix: {},
      notes: [],
    });
  });

  it("refuses, in one line naming the setting and the fix, what could ack before the commit or lose a message", () => {
    const cases: [object, RegExp][] = [
      [{ ack_policy: "none" }, /has ack_policy none: the server takes each message as acknowledged when it sends it/],
      [{ ack_policy: "all" }, /has ack_policy all: one ack acknowledges every earlier message/],
      [{ max_deliver: 5 }, /has max_deliver 5: .*never delivered again; set max_deliver to -1/],
      [{ deliver_policy: "new" }, /has deliver_policy new: it skips the messages/],
      [{ deliver_policy: "last_per_subject" }, /has deliver_policy last_per_subject/],
      [{ filter_subject: "orders.paid" }, /has filter orders\.paid: the source asks for no filter/],
      [{ headers_only: true }, /has headers_only true: its messages arrive without their bodies/],
      [{ deliver_subject: "push.here" }, /has deliver_subject push\.here \(a push consumer\)/],
    ];
    for (const [change, line] of cases) {
      const v = judgeJetStreamConsumer({ ...good, ...change }, want);
      assert.match(v.refusal ?? "(accepted)", line, JSON.stringify(change));
      assert.match(v.refusal!, /^JetStream consumer ORDERS\/inbox has /);
      assert.ok(!v.refusal!.includes("\n"), "one line");
      assert.match(v.refusal!, /delete it|set /, "it says the fix");
    }
  });

  it("corrects what JetStream lets change on a consumer the inbox made, and refuses the rest there too", () => {
    const ours = { ...good, description: ourDescription("orders") };
    const v = judgeJetStreamConsumer(
      { ...ours, max_deliver: 3, ack_wait: 5e9, max_ack_pending: 20, filter_subject: "orders.old" },
      { ...want, filter: "orders.>" },
    );
    assert.equal(v.refusal, undefined);
    assert.deepEqual(v.fix, { max_deliver: -1, ack_wait: 30e9, max_ack_pending: 512, filter_subject: "orders.>" });
    // ack_policy cannot change on a consumer, whoever made it.
    assert.match(judgeJetStreamConsumer({ ...ours, ack_policy: "none" }, want).refusal ?? "", /ack_policy none/);
  });

  it("only notes what puts no message at risk on a consumer someone else made, and keeps it", () => {
    const v = judgeJetStreamConsumer({ ...good, ack_wait: 10e9, max_ack_pending: 64 }, want);
    assert.equal(v.refusal, undefined);
    assert.deepEqual(v.fix, {});
    assert.equal(v.notes.length, 2);
    assert.match(v.notes.join("\n"), /ack_wait 10000 ms, the source asks 30000 ms/);
    assert.match(v.notes.join("\n"), /max_ack_pending 64, the source asks 512: it keeps its own/);
  });
});

describe("judgeRabbitQueue()", () => {
  const plain = { durable: true, autoDelete: false, args: {} };
  it("accepts a durable queue, with a dead-letter exchange or a length that rejects publishes (controls)", () => {
    assert.equal(judgeRabbitQueue(plain, "billing").refusal, undefined);
    const kept = { "x-dead-letter-exchange": "", "x-message-ttl": 60_000, "x-max-length": 10 };
    assert.equal(judgeRabbitQueue({ ...plain, args: kept }, "billing").refusal, undefined);
    const rejecting = { "x-max-length": 10, "x-overflow": "reject-publish" };
    assert.equal(judgeRabbitQueue({ ...plain, args: rejecting }, "billing").refusal, undefined);
  });

  it("refuses a queue that drops messages before the inbox takes them, naming the setting and the fix", () => {
    const cases: [object, RegExp][] = [
      [{ durable: false }, /has durable false: a broker restart loses every message/],
      [{ autoDelete: true }, /has auto_delete true/],
      [{ args: { "x-expires": 60_000 } }, /has x-expires 60000/],
      [{ args: { "x-message-ttl": 1_000 } }, /has x-message-ttl 1000: .*; give it an x-dead-letter-exchange/],
      [{ args: { "x-max-length-bytes": 100 } }, /has x-max-length-bytes 100: .*set x-overflow to reject-publish/],
    ];
    for (const [change, line] of cases)
      assert.match(judgeRabbitQueue({ ...plain, ...change }, "billing").refusal ?? "(accepted)", line);
  });
});

describe("pauseOf()", () => {
  it("names the pause each broker's error means", () => {
    assert.equal(pauseOf(new Error("consumer deleted")), "consumer_deleted");
    assert.equal(pauseOf(new Error("stream not found")), "stream_missing");
    const notFound = Object.assign(
      new Error(`Operation failed: QueueDeclare; 404 (NOT-FOUND) with message "NOT_FOUND - no queue 'q'"`),
      { code: 404 },
    );
    assert.equal(pauseOf(notFound), "queue_missing");
    assert.equal(pauseOf(Object.assign(new Error("ACCESS_REFUSED"), { code: 403 })), "permission");
    assert.equal(pauseOf(new Error('Permissions Violation for Subscription to "x"')), "permission");
    assert.equal(pauseOf(new Error("connect ECONNREFUSED 127.0.0.1:4222")), "connection");
  });
});

describe("Health", () => {
  const make = () => {
    const clock = { t: 1_000_000 };
    const lines: string[] = [];
    const lag = { n: 0 };
    const h = new Health({
      source: "orders",
      log: (l) => lines.push(l),
      now: () => clock.t,
      starvedAfterMs: 60_000,
      retryMs: 1_000,
      lag: () => lag.n,
    });
    return { h, clock, lines, lag };
  };

  it("says and counts a pause once however many retries say it again, and says when it consumes again", async () => {
    const { h, clock, lines } = make();
    h.consuming();
    assert.equal(await h.first, true);
    for (let i = 0; i < 5; i++) h.paused("consumer_deleted", "consumer deleted");
    clock.t += 2_500;
    h.paused("stream_missing", "JetStream stream ORDERS does not exist");
    h.paused("stream_missing", "JetStream stream ORDERS does not exist");
    assert.equal(h.code(), STATE_CODES.paused);
    assert.match(String(h.ready()), /orders: paused: JetStream stream ORDERS does not exist/);
    h.consuming();
    assert.deepEqual(lines, [
      "consume orders: paused: consumer deleted; trying again every 1 s",
      "consume orders: paused: JetStream stream ORDERS does not exist; trying again every 1 s",
      "consume orders: consuming again, after 2.5 s of: JetStream stream ORDERS does not exist",
    ]);
    assert.deepEqual(
      [...h.pauses],
      [
        ["consumer_deleted", 1],
        ["stream_missing", 1],
      ],
    );
    assert.equal(h.ready(), true);
  });

  it("is starved once it has taken nothing past the bound while its broker holds messages, and not while the broker holds none (control)", () => {
    const { h, clock, lines, lag } = make();
    h.consuming();
    clock.t += 120_000;
    assert.equal(h.code(), STATE_CODES.consuming, "nothing held for it: idle, not starved");
    lag.n = 100;
    assert.equal(h.code(), STATE_CODES.starved);
    assert.match(String(h.ready()), /orders: starved: has taken nothing for 120 s while its broker holds 100 messages/);
    h.took();
    assert.equal(h.code(), STATE_CODES.consuming, "a message taken: alive again");
    clock.t += 59_000;
    assert.equal(h.ready(), true, "within the bound");
    assert.deepEqual(lines, [
      "consume orders: starved: has taken nothing for 120 s while its broker holds 100 messages for it (another client holding them, or a consumer that no longer delivers)",
      "consume orders: taking messages again",
    ]);
  });

  it("a refusal at start settles first with its line, and is state 3", async () => {
    const { h, lines } = make();
    h.paused("refused", "JetStream consumer ORDERS/inbox has ack_policy none: …");
    assert.equal(await h.first, "JetStream consumer ORDERS/inbox has ack_policy none: …");
    assert.equal(h.code(), STATE_CODES.refused);
    assert.deepEqual(lines, ["consume orders: refused: JetStream consumer ORDERS/inbox has ack_policy none: …"]);
  });
});
