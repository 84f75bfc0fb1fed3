// test/migrate-destinations.test.ts: a database made before destinations migrates on open, on both
// backends. Its rows become route 0 of the handler, with their status, attempts, order keys and tombstones
// as they were; duplicates are still duplicates, and the ordered keys carry on in event time.

import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { sha256 } from "../lib/rows.ts";
import { MIGRATIONS as PG_MIGRATIONS } from "../lib/postgres/schema.ts";
import { MIGRATIONS as SQLITE_MIGRATIONS } from "../lib/sqlite/schema.ts";
import { freshSchema, pastSchema, postgresSkip, tempDir } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const pgSkip = await postgresSkip();
// The schema before destinations: every migration up to the one that brought routes.
const before = (list: readonly string[]) =>
  list.slice(
    0,
    list.findIndex((m) => m.includes("destination")),
  );

// oldRows are written as the code before destinations wrote them: one row per delivery, one key's head.
const HASH = sha256(Buffer.from("x"));
const oldRows = (BODY: string, EMPTY: string) => `
  INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at, order_key, event_time, finished_at, purged_at)
  VALUES ('s', 'done_1', ${BODY}, '${HASH}', ${T0}, 'done', 1, ${T0}, NULL, NULL, ${T0}, NULL),
         ('s', 'tomb_1', ${EMPTY}, '${HASH}', ${T0}, 'done', 1, ${T0}, NULL, NULL, ${T0}, ${T0}),
         ('s', 'wait_1', ${BODY}, '${HASH}', ${T0}, 'received', 0, ${T0}, NULL, NULL, NULL, NULL),
         ('s', 'k_2', ${BODY}, '${HASH}', ${T0}, 'received', 0, ${T0}, 'key', ${T0 + 2}, NULL, NULL),
         ('s', 'k_1', ${BODY}, '${HASH}', ${T0}, 'received', 0, ${T0}, 'key', ${T0 + 1}, NULL, NULL);
  INSERT INTO order_keys (source, order_key, head_id, head_event_time, head_seq, due) VALUES ('s', 'key', 'k_1', ${T0 + 1}, 5, ${T0});`;

async function check(target: string): Promise<void> {
  const inbox = await connect(target, { now: () => T0 + 1_000 });
  try {
    const rows = await inbox.query("SELECT id, route, destination, status, purged_at FROM deliveries ORDER BY id");
    assert.deepEqual(
      rows.map((r) => [r.id, Number(r.route), r.destination, r.status]),
      [
        ["done_1", 0, "handler", "done"],
        ["k_1", 0, "handler", "received"],
        ["k_2", 0, "handler", "received"],
        ["tomb_1", 0, "handler", "done"],
        ["wait_1", 0, "handler", "received"],
      ],
    );
    assert.equal(
      await inbox.store({ source: "s", id: "tomb_1", body: Buffer.from("x") }),
      "duplicate",
      "a tombstone still answers duplicates",
    );
    assert.equal(await inbox.store({ source: "s", id: "done_1", body: Buffer.from("y") }), "conflict");
    // The handler's claims carry on: the unordered one, then the key's head in event time, one at a time.
    const first = await inbox.claimBatch(10, 60_000);
    assert.deepEqual(first.map((l) => l.id).sort(), ["k_1", "wait_1"]);
    await inbox.finish(first.find((l) => l.id === "k_1")!);
    assert.deepEqual(
      (await inbox.claimBatch(10, 60_000)).map((l) => l.id),
      ["k_2"],
    );
    assert.deepEqual(
      (await inbox.destinations()).map((d) => [d.name, d.state]),
      [["handler", "closed"]],
    );
  } finally {
    await inbox.close();
  }
}

describe("a database made before destinations", () => {
  it("migrates on SQLite: every row becomes route 0 of the handler, keys and tombstones kept", async () => {
    const dir = tempDir();
    try {
      const path = join(dir.dir, "old.db");
      const old = before(SQLITE_MIGRATIONS);
      assert.ok(old.length >= 5 && old.length < SQLITE_MIGRATIONS.length);
      const past = await pastSchema("sqlite", path, old);
      await past.exec(oldRows("X'78'", "X''"));
      await past.close();
      await check(path);
    } finally {
      dir.cleanup();
    }
  });

  it("migrates on PostgreSQL the same way", { skip: pgSkip }, async () => {
    const fresh = await freshSchema("migrdest");
    try {
      const past = await pastSchema("postgres", fresh.schema, before(PG_MIGRATIONS));
      try {
        await past.exec(oldRows("'\\x78'::bytea", "'\\x'::bytea"));
        await past.exec(
          "UPDATE deliveries SET arrival = CASE id WHEN 'k_2' THEN 4 WHEN 'k_1' THEN 5 END WHERE order_key IS NOT NULL",
        );
      } finally {
        await past.close();
      }
      await check(fresh.url);
    } finally {
      await fresh.drop();
    }
  });
});
