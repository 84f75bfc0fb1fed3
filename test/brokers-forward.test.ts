// test/brokers-forward.test.ts: broker destinations in the sources file, through the real scripts, on SQLite
// and on PostgreSQL: a source routes to the handler and to a NATS JetStream destination, the receiver stores
// one row per route, and worker.ts publishes into the stream through brokers.ts beside the handler; a mistake
// in a broker destination stops the receiver and the worker at start-up with one line and exit code 2.
//   npx node --import tsx --test test/brokers-forward.test.ts

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { backends, NATS, natsSkip, runScript, startReceiver } from "./helpers.ts";
import { jetStreamSuite } from "./brokers-suite.ts";

const run = randomBytes(4).toString("hex");
const natsSkipped = await natsSkip();
const all = await backends("brokers_forward");
const dir = mkdtempSync(join(tmpdir(), "inbox-brokers-forward-"));
after(() => rmSync(dir, { recursive: true, force: true }));

function sourcesFile(name: string, destination: Record<string, unknown>): string {
  const file = join(dir, `${name}.json`);
  writeFileSync(
    file,
    JSON.stringify({
      $destinations: { events: { type: "nats", ...destination } },
      shop: { provider: "plain", routes: ["handler", "events"] },
    }),
  );
  return file;
}

describe("a mistake in a broker destination", () => {
  it("stops the receiver and the worker at start-up with one line and exit code 2, naming no secret", async () => {
    const bad = sourcesFile("bad", { url: NATS, subject: "webhooks.>" });
    for (const [script, args] of [
      ["receiver.ts", ["--port", "0"]],
      ["worker.ts", ["--once"]],
    ] as const) {
      const r = await runScript(script, [...args, "--db", join(dir, "never.db"), "--sources", bad]);
      assert.equal(r.code, 2, `${script}: ${r.stderr}`);
      assert.match(
        r.stderr.trim(),
        /^\S+: .*destination "events": subject "webhooks\.>" is not one a message can be published to/,
      );
      assert.equal(r.stderr.trim().split("\n").length, 1, "one line");
    }
    const unset = sourcesFile("unset", { url: NATS, subject: "x.{source}", token: "env:INBOX_TEST_NATS_TOKEN_UNSET" });
    const worker = await runScript("worker.ts", ["--once", "--db", join(dir, "never.db"), "--sources", unset]);
    assert.equal(worker.code, 2, worker.stderr);
    assert.match(worker.stderr, /token reads the environment variable INBOX_TEST_NATS_TOKEN_UNSET, which is not set/);
  });
});

describe("a source routed to a NATS JetStream destination", { skip: natsSkipped }, () => {
  const jet = jetStreamSuite(NATS);
  const streams = jet.made;

  for (const backend of all) {
    it(`is published by worker.ts beside the handler, each delivery once (${backend.name})`, {
      skip: backend.skip,
    }, async () => {
      const stream = `FWD_${run}_${backend.name}`;
      const prefix = `fwd${run}${backend.name}`;
      streams.push(stream);
      await jet.jsm.streams.add({ name: stream, subjects: [`${prefix}.>`] });
      const file = sourcesFile(backend.name, {
        url: NATS,
        subject: `${prefix}.{source}.{type}`,
        stream,
        maxInFlight: 4,
      });
      const { target, cleanup } = await backend.make();
      try {
        const receiver = await startReceiver(target, ["--sources", file]);
        const sent = [0, 1, 2].map(async (i) => {
          const body = JSON.stringify({ customer: `c${i}`, amount: i + 1 });
          const answer = await fetch(`${receiver.url}/shop`, {
            method: "POST",
            headers: { "x-delivery-id": `evt_${i}`, "content-type": "application/json" },
            body,
          });
          return answer.status;
        });
        assert.deepEqual(await Promise.all(sent), [200, 200, 200]);
        assert.equal(await receiver.stop(), 0);
        const worker = await runScript("worker.ts", ["--once", "--db", target, "--sources", file, "--handler", "demo"]);
        assert.equal(worker.code, 0, worker.stderr);
        const inbox = await connect(target);
        const rows = await inbox.query("SELECT id, destination, status FROM deliveries ORDER BY id, destination");
        await inbox.close();
        const info = await jet.jsm.streams.info(stream);
        const published = [];
        for (let seq = info.state.first_seq; seq <= info.state.last_seq && info.state.messages > 0; seq++) {
          const m = await jet.jsm.streams.getMessage(stream, { seq });
          if (m) published.push([m.subject, m.header.get("Nats-Msg-Id")]);
        }
        const eventRows = rows.filter((r) => r.destination === "events");
        assert.ok(
          rows.every((r) => r.status === "done"),
          JSON.stringify(rows),
        );
        assert.equal(rows.filter((r) => r.destination === "handler").length, 3, "the handler has all three");
        assert.equal(eventRows.length, 3, "one row per route: the destination has all three too");
        assert.deepEqual(
          published.map(([, id]) => id).sort(),
          ["events:shop:evt_0", "events:shop:evt_1", "events:shop:evt_2"],
          "each in the stream once",
        );
        assert.ok(
          published.every(([subject]) => subject === `${prefix}.shop._`),
          "a delivery with no event type goes to {type} = _",
        );
      } finally {
        await cleanup();
      }
    });
  }
});
