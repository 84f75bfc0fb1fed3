// test/powerloss.test.ts: a 200 survives a power cut, on SQLite and PostgreSQL, and the controls with durability
// turned down lose acked IDs. A few cycles (test/powerloss/scenarios.ts); `npm run torture -- powerloss` runs many.
//   npx node --import tsx --test test/powerloss.test.ts       # needs /dev/fuse and libfuse3-dev
//   POWERLOSS_RECEIVER=/path/to/other/receiver.ts npx node --import tsx --test test/powerloss.test.ts

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { seeded } from "./chaos.ts";
import { PG_BIN, tempDir } from "./helpers.ts";
import { fuseSkip } from "./powerloss/layer.ts";
import { powerLossPostgres, powerLossSqlite, receiverBuild, type PowerLossReport } from "./powerloss/scenarios.ts";

const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
const receiver = receiverBuild(process.env);
const skip = await fuseSkip();
const pgSkip = skip || postgresBinariesSkip();
const { dir, cleanup } = tempDir("inbox-powerloss-");
after(cleanup);

function postgresBinariesSkip(): string | false {
  if (PG_BIN) return false;
  const why = "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin";
  if (process.env.INBOX_REQUIRE_POSTGRES === "1") throw new Error(`INBOX_REQUIRE_POSTGRES=1 but ${why}`);
  console.log(`# Power-loss tests on PostgreSQL skipped: ${why}; apt-get install -y postgresql to run them.`);
  return why;
}

const figures = (r: PowerLossReport) =>
  `${r.cycles} cycles, ${r.acked} acked, ${r.lost.length} lost, ${r.stored} stored, ${r.droppedPages} unsynced pages dropped ` +
  `(${r.keptPages} kept by harsh cuts), ${r.undoneNames} names undone, ${Math.round(r.ms / 1000)} s`;

function assertNothingLost(r: PowerLossReport, cycles: number): void {
  const all = JSON.stringify({ ...r, lost: r.lost.slice(0, 10) });
  assert.equal(r.cycles, cycles, all);
  assert.ok(r.acked > 0, `the receiver acknowledged deliveries: ${all}`);
  assert.deepEqual(r.lost.slice(0, 10), [], "every acknowledged ID is stored after every cut");
  assert.deepEqual(r.integrity, [], "the database is intact after every cut");
  assert.deepEqual(r.payments, [], "a payment and its done mark survive together, or not at all");
  assert.ok(r.drained, `the worker drained what was stored: ${all}`);
  assert.deepEqual(r.exactlyOnce, [], "each stored delivery is done and paid exactly once");
  assert.ok(r.droppedPages > 0, "the cuts threw unsynced pages away");
}

describe("a power cut under load, SQLite", { skip }, () => {
  it(`loses no acknowledged delivery, leaves the database intact, and the worker pays each once (seed ${seed})`, async () => {
    const r = await powerLossSqlite({
      dir: join(dir, "sqlite"),
      label: "sqlite",
      cycles: 4,
      senders: 16,
      minUpMs: 300,
      maxUpMs: 1_200,
      random: seeded(seed),
      mixedCuts: true,
      receiver,
    });
    console.log(`# power loss on SQLite: ${figures(r)}`);
    assertNothingLost(r, 4);
  });

  it(`control: at synchronous=OFF the same cuts lose acknowledged deliveries (seed ${seed})`, async () => {
    const r = await powerLossSqlite({
      dir: join(dir, "sqlite-off"),
      label: "sqlite synchronous=OFF",
      cycles: 8,
      untilLoss: true,
      senders: 16,
      minUpMs: 300,
      maxUpMs: 1_200,
      random: seeded(seed + 1),
      receiver: { script: "test/fixtures/unsafe-receiver.ts", args: ["--synchronous", "OFF"] },
    });
    console.log(`# control, SQLite synchronous=OFF: ${figures(r)}`);
    assert.ok(r.lost.length > 0, `the test can fail: ${figures(r)}`);
  });
});

describe("a power cut under load, PostgreSQL", { skip: pgSkip }, () => {
  it(`loses no acknowledged delivery, leaves the indexes intact, and the worker pays each once (seed ${seed})`, async () => {
    const r = await powerLossPostgres({
      dir: join(dir, "postgres"),
      label: "postgres",
      cycles: 2,
      senders: 16,
      minUpMs: 500,
      maxUpMs: 1_500,
      random: seeded(seed + 2),
      mixedCuts: true,
      receiver,
    });
    console.log(`# power loss on PostgreSQL: ${figures(r)}`);
    assertNothingLost(r, 2);
  });

  it(`control: with fsync=off the same cuts lose acknowledged deliveries (seed ${seed})`, async () => {
    const r = await powerLossPostgres({
      dir: join(dir, "postgres-fsync-off"),
      label: "postgres fsync=off",
      cycles: 3,
      untilLoss: true,
      senders: 16,
      minUpMs: 500,
      maxUpMs: 1_500,
      random: seeded(seed + 3),
      serverSettings: ["fsync=off"],
    });
    console.log(`# control, PostgreSQL fsync=off: ${figures(r)}`);
    assert.ok(r.lost.length > 0, `the test can fail: ${figures(r)}`);
  });
});
