// test/powerloss-sync.test.ts: the receiver's off-loop fdatasync (SqliteInbox syncOffLoop) under power cuts.
// test/powerloss.test.ts runs the real receiver, which uses it, and must lose nothing; the control here is
// the same receiver with its fdatasync pointed at another file, acking before the WAL is on disk, and must lose.
//   npx node --import tsx --test test/powerloss-sync.test.ts        # needs /dev/fuse and libfuse3-dev

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { seeded } from "./chaos.ts";
import { tempDir } from "./helpers.ts";
import { fuseSkip } from "./powerloss/layer.ts";
import { powerLossSqlite } from "./powerloss/scenarios.ts";

const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
const skip = await fuseSkip();
const { dir, cleanup } = tempDir("inbox-powerloss-sync-");
after(cleanup);

describe("the receiver's off-loop fdatasync under a power cut", { skip }, () => {
  it(`control: acked before its fdatasync of the WAL (another file synced instead), it loses acknowledged deliveries (seed ${seed})`, async () => {
    const r = await powerLossSqlite({
      dir: join(dir, "early"),
      label: "sqlite, fdatasync of another file",
      cycles: 8,
      untilLoss: true,
      senders: 16,
      minUpMs: 300,
      maxUpMs: 1_200,
      random: seeded(seed),
      receiver: { script: "test/fixtures/early-ack-receiver.ts", args: ["--not-the-wal", join(dir, "not-the-wal")] },
    });
    console.log(
      `# control, early acks: ${r.cycles} cycles, ${r.acked} acked, ${r.lost.length} lost, ${r.droppedPages} unsynced pages dropped`,
    );
    assert.ok(
      r.lost.length > 0,
      `the power-loss test sees an ack that came before the fdatasync: ${r.cycles} cycles, ${r.acked} acked`,
    );
  });
});
