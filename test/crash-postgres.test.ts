// test/crash-postgres.test.ts: the bounded crash suite on PostgreSQL. Two receivers and three workers as
// real processes on one schema, senders alternating between the receivers, one process SIGKILLed about
// every second, the scripts' connections ended with pg_terminate_backend, and a server restarted mid-load.
// The restarts happen on a private throwaway cluster (privatePostgres), never on the shared server.
//   npx node --import tsx --test test/crash-postgres.test.ts     # TORTURE_POSTGRES_SECONDS=300 npm run torture for long

import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { postgresPipeline, seeded, type PostgresPipelineReport } from "./chaos.ts";
import { freshSchema, postgresSkip, privatePostgres, startReceiver } from "./helpers.ts";

const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
const pgSkip = await postgresSkip();
const server = await privatePostgres();
const privateSkip = typeof server === "string" ? server : false;
after(async () => {
  if (typeof server !== "string") await server.destroy();
});

// Every acknowledged payment is done and applied once; every script survived whatever was done to it.
function assertWhole(r: PostgresPipelineReport): void {
  const figures = JSON.stringify(r);
  assert.ok(r.drained, `the workers drained the backlog: ${figures}`);
  assert.ok(r.acked > 0, figures);
  assert.deepEqual(r.unexpectedExits, [], "no script exited on its own: each survived the dropped connections");
  assert.equal(r.lostAcked, 0, "every acknowledged delivery is done");
  assert.equal(r.lost, 0, "every done delivery has its effect");
  assert.equal(r.doubled, 0, "no effect was applied twice");
  assert.equal(r.balance, r.expected, "the balance is exactly the sum of the stored amounts");
  assert.equal(r.processing, 0);
  assert.equal(r.unavailableWithoutRetryAfter, 0, "every 503 says when to come back");
}

describe("the pipeline on PostgreSQL, two receivers and three workers", { skip: pgSkip }, () => {
  it(`survives a SIGKILL about every second and pg_terminate_backend mid-batch, losing and doubling nothing (seed ${seed})`, async () => {
    const schema = await freshSchema("crash");
    try {
      const r = await postgresPipeline({
        url: schema.url,
        seconds: 5,
        senders: 2,
        receivers: 2,
        workers: 3,
        killEveryMs: 1_000,
        terminateEveryMs: 1_200,
        random: seeded(seed),
      });
      console.log(
        `# pipeline on PostgreSQL: ${r.kills} kills (${r.receiverKills} receivers), ${r.terminations} connections ` +
          `terminated in ${r.terminateRounds} rounds (${r.terminationsMidTransaction} mid-transaction), ${r.acked} acknowledged, ${r.deliveries} done (load ${r.loadMs} ms, drain ${r.drainMs} ms), ${r.unavailable} answered 503, ` +
          `lost ${r.lostAcked + r.lost}, doubled ${r.doubled}`,
      );
      assertWhole(r);
      assert.ok(r.kills > 0 && r.terminations > 0, "processes were killed and connections terminated");
    } finally {
      await schema.drop();
    }
  });
});

describe("a PostgreSQL server restarted in the middle of the load", { skip: privateSkip }, () => {
  it(`loses no acknowledged delivery, and every script carries on without a restart (seed ${seed})`, async () => {
    const pg = server as Exclude<typeof server, string>;
    // One crash-like stop (recovery from the WAL) and one clean one, with the kills going on around them.
    const modes = ["immediate", "fast"] as const;
    let n = 0;
    const r = await postgresPipeline({
      url: `${pg.url}?schema=restart_${process.pid}`,
      seconds: 5,
      senders: 2,
      receivers: 2,
      workers: 3,
      killEveryMs: 1_000,
      terminateEveryMs: 0,
      restart: { times: 2, run: () => pg.restart(modes[n++ % 2]) },
      random: seeded(seed + 1),
    });
    console.log(
      `# restart on PostgreSQL: ${r.serverRestarts} server restarts, ${r.kills} kills, ${r.acked} acknowledged, ` +
        `${r.deliveries} done (load ${r.loadMs} ms, drain ${r.drainMs} ms), ${r.unavailable} answered 503, ` +
        `${r.failedStarts} starts retried, lost ${r.lostAcked + r.lost}, doubled ${r.doubled}`,
    );
    assertWhole(r);
    assert.equal(r.serverRestarts, 2);
  });
});

describe("a receiver whose database is down", { skip: privateSkip }, () => {
  it("answers 503 with Retry-After, never 200, and takes deliveries again once it is back, without a restart", async () => {
    const pg = server as Exclude<typeof server, string>;
    const url = `${pg.url}?schema=down_${process.pid}`;
    const receiver = await startReceiver(url, ["--quiet"]);
    const send = async (id: string) => {
      const res = await fetch(receiver.url, { method: "POST", headers: { "x-delivery-id": id }, body: "{}" });
      return { status: res.status, retryAfter: res.headers.get("retry-after"), text: await res.text() };
    };
    try {
      assert.equal((await send("before")).status, 200);
      await pg.stop("fast");
      try {
        for (let i = 0; i < 5; i++) {
          const answer = await send(`while-down-${i}`);
          assert.equal(answer.status, 503, `no 200 while the database is down: ${JSON.stringify(answer)}`);
          assert.ok(Number(answer.retryAfter) > 0, "it says when to try again");
        }
      } finally {
        await pg.start();
      }
      // The first request after the restart may still meet a connection the server dropped: it gets a 503 too.
      let back = await send("after");
      for (let i = 0; back.status !== 200 && i < 20; i++) {
        assert.equal(back.status, 503);
        await new Promise((resolve) => setTimeout(resolve, 100));
        back = await send("after");
      }
      assert.equal(back.status, 200, "it stores again once the database is back");
      assert.equal(receiver.child.exitCode, null, "the receiver was never restarted");
      const inbox = await connect(url);
      const ids = (await inbox.query("SELECT id FROM deliveries ORDER BY id")).map((r) => r.id);
      await inbox.close();
      assert.deepEqual(ids, ["after", "before"], "nothing answered 503 was stored");
    } finally {
      await receiver.stop();
    }
  });
});
