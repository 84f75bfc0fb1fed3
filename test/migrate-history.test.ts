// test/migrate-history.test.ts: a PostgreSQL inbox that today's main filled (every delivery's state in one table,
// delivery_rows) upgrades in place to a hot queue and a history (docs/table.md#hot-and-cold): its backlog moves
// to the hot partition, the rest of the old table becomes the history's partition for the days before, attached
// without a scan and with no index built, its keys go to delivery_keys, and the view, its trigger and the search
// triggers are made again on the new table. Claims, done marks, replays, retries, duplicates, retention and SQL
// written against the view all carry on. Its keys are copied ahead of the split, online (prepareKeys), with an old
// host still writing beside the copy. SQLite keeps one table, so it has nothing to upgrade.
//   node --test test/migrate-history.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import pg from "pg";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { historyOf, periodOf } from "../lib/postgres/periods.ts";
import { prepareKeys } from "../lib/postgres/migrate.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { freshSchema, PG_SEARCH_ON, POSTGRES, pastSchema, postgresSkip, schemaClient } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const DAY = 86_400_000;
const pgSkip = await postgresSkip();
// The schema as today's main leaves it: every migration before the one that partitions delivery_rows.
const BEFORE = MIGRATIONS.slice(
  0,
  MIGRATIONS.findIndex((m) => m.includes("CREATE TABLE delivery_rows_hot")),
);

const SMALL = Buffer.from('{"data":{"object":{"customer":"cus_123"}}}');
const LARGE = Buffer.from(
  JSON.stringify({ data: { object: { customer: "cus_456" } }, pad: "x".repeat(DEFAULTS.inlineBodyBytes) }),
);
const hex = (b: Buffer) => `'\\x${b.toString("hex")}'`;

// What main wrote, through the view as its store would have placed each body: done long ago and yesterday, a
// tombstone, a failure, the backlog (one due, one leased), and a delivery with a second route still to do.
const rows = (() => {
  const row = (id: string, b: Buffer, at: number, status: string, extra = "NULL, NULL, NULL, 0, 'handler'") =>
    `('default', '${id}', ${hex(b)}, '${sha256(b)}', ${at}, '${status}', ${status === "received" ? 0 : 1}, ${at}, ` +
    `${status === "done" || status === "failed" ? at + 1_000 : "NULL"}, ${extra})`;
  return `
    INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at, finished_at,
                            leased_until, lease_token, purged_at, route, destination)
    VALUES ${[
      row("done_old", SMALL, T0 - 10 * DAY, "done"),
      row("done_big", LARGE, T0 - DAY, "done"),
      row("gone_old", Buffer.alloc(0), T0 - 10 * DAY, "done", `NULL, NULL, ${T0 - 2 * DAY}, 0, 'handler'`),
      row("failed_old", SMALL, T0 - DAY, "failed"),
      row("wait_old", LARGE, T0 - DAY, "received"),
      row("lease_old", SMALL, T0 - DAY, "processing", `${T0 - 1_000}, 'tok', NULL, 0, 'handler'`),
      row("two_routes", SMALL, T0 - DAY, "done"),
      row("two_routes", SMALL, T0 - DAY, "received", "NULL, NULL, NULL, 1, 'app'"),
    ].join(",\n")};
    UPDATE deliveries SET error = 'HTTP 500' WHERE id = 'failed_old';`;
})();

describe("upgrading a PostgreSQL inbox to a hot queue and a history", { skip: pgSkip }, () => {
  it("moves the backlog to the hot partition, attaches the rest as history unscanned, and carries on", async () => {
    const schema = await freshSchema("history");
    try {
      const past = await pastSchema("postgres", schema.schema, BEFORE);
      await past.exec(PG_SEARCH_ON);
      await past.exec(rows);
      await past.exec(`INSERT INTO deliveries_search (source, id, doc) VALUES ('default', 'done_old', '${SMALL}'::jsonb);
                       DELETE FROM search_pending;`);
      await past.close();

      let t = T0;
      const inbox = await connect(schema.url, { now: () => t, random: () => 0 });
      try {
        const where = async (id: string, route = 0) =>
          (
            await inbox.query(
              "SELECT tableoid::regclass::text AS part FROM delivery_rows WHERE id = ? AND route = ?",
              id,
              route,
            )
          )[0]?.part;
        // The backlog is hot; everything else is the old table, now the history of the days before.
        assert.deepEqual(
          [
            await where("wait_old"),
            await where("lease_old"),
            await where("two_routes", 1),
            await where("done_old"),
            await where("gone_old"),
            await where("failed_old"),
            await where("two_routes", 0),
          ],
          [...Array(3).fill("delivery_rows_hot"), ...Array(4).fill("delivery_rows_before")],
        );
        const [attached] = await inbox.query(
          `SELECT c.relispartition AS part, pg_get_expr(c.relpartbound, c.oid) AS bound,
                  (SELECT count(*)::integer FROM pg_index i WHERE i.indrelid = c.oid) AS indexes
             FROM pg_class c WHERE c.oid = to_regclass('delivery_rows_before')`,
        );
        // The cut is the end of the newest old row's UTC day; the old table's eleven indexes were taken as the
        // partitioned ones', none built beside them.
        const cut = Math.floor((T0 - DAY) / DAY) * DAY + DAY;
        assert.deepEqual(attached, { part: true, bound: `FOR VALUES FROM (MINVALUE) TO ('${cut}')`, indexes: 11 });
        const [{ n: keys }] = (await inbox.query("SELECT count(*)::integer AS n FROM delivery_keys")) as [
          { n: number },
        ];
        assert.equal(keys, 8, "every row's key, routes apart");
        const triggers = await inbox.query(
          "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass('delivery_rows') AND tgname LIKE 'deliveries_search%' ORDER BY tgname",
        );
        assert.deepEqual(
          triggers.map((r) => r.tgname),
          ["deliveries_search_delete", "deliveries_search_insert", "deliveries_search_update"],
          "the search triggers are on the new table",
        );

        // Duplicates of every kind of old row are answered from delivery_keys.
        assert.equal(await inbox.store({ id: "done_old", body: SMALL }), "duplicate");
        assert.equal(await inbox.store({ id: "gone_old", body: SMALL }), "conflict");
        assert.equal(await inbox.store({ id: "wait_old", body: LARGE }), "duplicate");
        assert.equal(await inbox.store({ id: "done_big", body: SMALL }), "conflict");
        assert.equal((await inbox.find("done_big"))[0]!.conflicts, 1);

        // The backlog is claimed, with its bodies; its done marks stay in the old days (its rows' received_at).
        assert.equal(await inbox.store({ id: "new_1", body: LARGE }), "stored");
        assert.equal(await where("new_1"), "delivery_rows_hot");
        t = T0 + 1_000;
        const leases = await inbox.claimBatch(10, 60_000);
        assert.deepEqual(
          new Map(leases.map((l) => [l.id, Buffer.from(l.body)])),
          new Map([
            ["wait_old", LARGE],
            ["lease_old", SMALL],
            ["new_1", LARGE],
          ]),
        );
        const [app] = await inbox.claimBatch(10, 60_000, { destination: "app" });
        assert.equal(app?.id, "two_routes");
        for (const lease of [...leases, app!]) assert.equal(await inbox.finish(lease), true);
        assert.deepEqual(
          [await where("wait_old"), await where("two_routes", 1), await where("new_1")],
          ["delivery_rows_before", "delivery_rows_before", historyOf(periodOf(T0))],
        );

        // A replay and a retry of old rows bring them back to the hot partition; their bodies come along.
        assert.equal((await inbox.replayMatching({ id: "done_big" })).replayed, 1);
        assert.equal(await inbox.retry({ id: "failed_old" }), 1);
        assert.deepEqual(
          [await where("done_big"), await where("failed_old")],
          ["delivery_rows_hot", "delivery_rows_hot"],
        );
        const again = await inbox.claimBatch(10, 60_000);
        assert.deepEqual(
          new Map(again.map((l) => [l.id, Buffer.from(l.body)])),
          new Map([
            ["done_big", LARGE],
            ["failed_old", SMALL],
          ]),
        );
        for (const lease of again) assert.equal(await inbox.finish(lease), true);

        // The search document of an old row outlived the upgrade and the moves.
        const docs = await inbox.query("SELECT id FROM deliveries_search ORDER BY id");
        assert.deepEqual(
          docs.map((r) => r.id),
          ["done_old"],
        );

        // SQL written against the view still writes both tables, and the key with the row.
        await inbox.query(
          `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
           VALUES ('default', 'sql_1', ?, ?, ?, 'done', ?)`,
          SMALL,
          sha256(SMALL),
          T0,
          T0,
        );
        assert.equal(await where("sql_1"), historyOf(periodOf(T0)));
        assert.equal(await inbox.store({ id: "sql_1", body: SMALL }), "duplicate");
        await inbox.query("DELETE FROM deliveries WHERE id = 'sql_1'");
        assert.equal(await inbox.store({ id: "sql_1", body: SMALL }), "stored", "the delete forgot its key too");

        // Retention: old bodies go, their IDs stay duplicates; forgotten, their keys go with their rows.
        t = T0 + 8 * DAY;
        assert.equal((await inbox.purge()).bodies, 8, "every done body but the tombstone's");
        assert.equal(await inbox.store({ id: "done_old", body: SMALL }), "duplicate");
        t = T0 + 40 * DAY;
        const purged = await inbox.purge();
        assert.equal(purged.forgotten, 9, "every tombstone");
        const left = await inbox.query("SELECT id FROM delivery_keys");
        assert.deepEqual(
          left.map((r) => r.id),
          ["sql_1"],
          "the one still to do keeps its key",
        );
        assert.equal(await inbox.store({ id: "done_old", body: SMALL }), "stored");
      } finally {
        await inbox.close();
      }
    } finally {
      await schema.drop();
    }
  });

  it("drops an old table that holds no history: a new inbox, or one whose every row had work left", async () => {
    const schema = await freshSchema("history_empty");
    try {
      const past = await pastSchema("postgres", schema.schema, BEFORE);
      await past.exec(`INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
                       VALUES ('default', 'wait', ${hex(SMALL)}, '${sha256(SMALL)}', ${T0}, 'received', ${T0})`);
      await past.close();
      const inbox = await connect(schema.url, { now: () => T0 });
      try {
        const [{ gone }] = (await inbox.query("SELECT to_regclass('delivery_rows_before') IS NULL AS gone")) as [
          { gone: boolean },
        ];
        assert.equal(gone, true);
        const lease = (await inbox.claim(60_000))!;
        assert.deepEqual([lease.id, Buffer.from(lease.body)], ["wait", SMALL]);
        assert.equal(await inbox.finish(lease), true);
        const [row] = await inbox.query("SELECT tableoid::regclass::text AS part FROM delivery_rows WHERE id = 'wait'");
        assert.equal(row!.part, historyOf(periodOf(T0)), "done into its day, made at open");
      } finally {
        await inbox.close();
      }
    } finally {
      await schema.drop();
    }
  });
});

// The copy ahead (lib/postgres/migrate.ts prepareKeys, docs/table.md#the-upgrade): an inbox at the version just
// before the split, with old code still writing it through the view, as main's store wrote it.
describe("copying the keys ahead of the split, online", { skip: pgSkip }, () => {
  const SPLIT = BEFORE.length;
  const OLD = 10;
  const filled = async (prefix: string) => {
    const schema = await freshSchema(prefix);
    const past = await pastSchema("postgres", schema.schema, BEFORE);
    await past.exec(`INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at, finished_at)
                     SELECT 'default', 'old_' || lpad(i::text, 2, '0'), ${hex(SMALL)}, '${sha256(SMALL)}', ${T0 - DAY},
                            'done', ${T0 - DAY}, ${T0 - DAY}
                       FROM generate_series(1, ${OLD}) AS i`);
    await past.close();
    // A connection of its own for each part: the copy's, an old host's writes, and the test's reads.
    const client = (lockMs = 0) => schemaClient(schema.schema, lockMs);
    return { schema, client };
  };
  // An old host's store: main's INSERT through the view, its row written into the old delivery_rows.
  const oldStore = (c: pg.Client, id: string) =>
    c.query(
      `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
       VALUES ('default', $1, $2, $3, $4, 'received', $4)`,
      [id, SMALL, sha256(SMALL), T0],
    );
  // The same as main's store() wrote it: straight into the table, a key already there skipped.
  const oldStoreDirect = (c: pg.Client, id: string) =>
    c.query(
      `INSERT INTO delivery_rows (source, id, body, body_sha256, received_at, status, available_at)
       VALUES ('default', $1, $2, $3, $4, 'received', $4) ON CONFLICT (source, id, route) DO NOTHING`,
      [id, SMALL, sha256(SMALL), T0],
    );
  // delivery_keys is every row's key, and nothing else (no key left behind, no deleted row's mark).
  const exact = async (c: pg.Client) =>
    (
      await c.query(`SELECT count(*)::integer AS n FROM delivery_keys k FULL JOIN delivery_rows r USING (source, id, route)
                      WHERE k.source IS NULL OR r.source IS NULL OR k.received_at <> r.received_at`)
    ).rows[0].n;

  it("lets an old host's store and delete through while a batch of the copy is open, and keeps both in the keys", async () => {
    const { schema, client } = await filled("keys_ahead");
    const [session, writer] = [await client(0), await client(200)];
    try {
      const pid = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
      const during: string[] = [];
      const copied = await prepareKeys(session, schema.schema, {
        batch: 4,
        during: async (n) => {
          if (n !== 2) return;
          // Batch 1 committed, batch 2 copied and not: stores of new keys (through the view and straight into the
          // table, as main wrote them), a store of a key already there, and a delete of a copied one.
          await oldStore(writer, "during");
          await oldStoreDirect(writer, "direct");
          await oldStoreDirect(writer, "old_03");
          await writer.query("DELETE FROM deliveries WHERE id = 'old_01'");
          const [{ state }] = (await writer.query("SELECT state FROM pg_stat_activity WHERE pid = $1", [pid])).rows;
          during.push(state);
        },
      });
      assert.deepEqual(during, ["idle in transaction"], "both were done while the batch's transaction was open");
      assert.equal(copied, OLD, "the copy went on past them; the new keys, before its place, were mirrored, not read");
      const [{ keys }] = (
        await writer.query("SELECT oid::integer AS keys FROM pg_class WHERE oid = to_regclass('delivery_keys')")
      ).rows;

      const inbox = await connect(schema.url, { now: () => T0 });
      try {
        const [{ same, marks }] = (
          await writer.query(
            `SELECT to_regclass('delivery_keys')::oid::integer = $1 AS same,
                  (SELECT count(*)::integer FROM delivery_keys WHERE received_at = -1) AS marks`,
            [keys],
          )
        ).rows;
        assert.deepEqual([same, marks], [true, 0], "the split kept the copy made ahead, its marks taken out");
        assert.equal(await exact(writer), 0);
        assert.equal(await inbox.store({ id: "during", body: SMALL }), "duplicate");
        assert.equal(await inbox.store({ id: "direct", body: SMALL }), "duplicate");
        assert.equal(await inbox.store({ id: "old_01", body: SMALL }), "stored", "the deleted row's key went with it");
        assert.equal(await inbox.store({ id: "old_10", body: SMALL }), "duplicate");
      } finally {
        await inbox.close();
      }
    } finally {
      await Promise.all([session.end(), writer.end()]);
      await schema.drop();
    }
  });

  it("control: the split's own copy, in its transaction, makes the same store wait for the table's lock", async () => {
    const { schema, client } = await filled("keys_inline");
    const [session, writer] = [await client(0), await client(200)];
    try {
      await session.query("BEGIN");
      await session.query(MIGRATIONS[SPLIT]!);
      await assert.rejects(oldStore(writer, "during"), { code: "55P03" });
      await session.query("ROLLBACK");
    } finally {
      await Promise.all([session.end(), writer.end()]);
      await schema.drop();
    }
  });

  it("keeps a key out whose row was deleted after a batch's snapshot saw it, before the batch copied it", async () => {
    const { schema, client } = await filled("keys_race");
    const [session, writer, holder] = [await client(0), await client(0), await client(0)];
    try {
      const pid = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
      let raced: Promise<void> | undefined;
      const copied = await prepareKeys(session, schema.schema, {
        batch: 4,
        before: async (n) => {
          if (n !== 2) return;
          // Batch 2 is old_05 … old_08: old_05 held by an uncommitted insert makes it wait with its snapshot taken,
          // old_07 is deleted meanwhile, then old_05 let go.
          await holder.query("BEGIN");
          await holder.query(
            "INSERT INTO delivery_keys (source, id, route, received_at) VALUES ('default', 'old_05', 0, 1)",
          );
          raced = (async () => {
            for (;;) {
              const { rows } = await writer.query("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", [pid]);
              if (rows[0]?.wait_event_type === "Lock") break;
              await new Promise((resolve) => setTimeout(resolve, 5));
            }
            await writer.query("DELETE FROM deliveries WHERE id = 'old_07'");
            await holder.query("ROLLBACK");
          })();
        },
      });
      await raced;
      assert.equal(copied, OLD, "the batch's snapshot saw old_07, deleted before it copied it");
      const inbox = await connect(schema.url, { now: () => T0 });
      try {
        assert.equal(await exact(writer), 0);
        assert.equal(await inbox.store({ id: "old_07", body: SMALL }), "stored");
      } finally {
        await inbox.close();
      }
    } finally {
      await Promise.all([session.end(), writer.end(), holder.end()]);
      await schema.drop();
    }
  });

  it("leaves an inbox that old code writes and the next open copies whole, when the copy dies halfway", async () => {
    const { schema, client } = await filled("keys_crash");
    const [session, writer] = [await client(0), await client(0)];
    try {
      const pid = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
      await assert.rejects(
        prepareKeys(session, schema.schema, {
          batch: 4,
          during: async (n) => {
            if (n === 2) await writer.query("SELECT pg_terminate_backend($1)", [pid]);
          },
        }),
      );
      const [{ half }] = (await writer.query("SELECT count(*)::integer AS half FROM delivery_keys")).rows;
      assert.equal(half, 4, "batch 1's keys, not batch 2's");
      await oldStore(writer, "after");
      await writer.query("DELETE FROM deliveries WHERE id = 'old_02'");
      const inbox = await connect(schema.url, { now: () => T0 });
      try {
        assert.equal(await exact(writer), 0);
        assert.equal(await inbox.store({ id: "after", body: SMALL }), "duplicate");
        assert.equal(await inbox.store({ id: "old_02", body: SMALL }), "stored");
      } finally {
        await inbox.close();
      }
    } finally {
      await writer.end();
      await session.end().catch(() => {});
      await schema.drop();
    }
  });

  it("copies once when two hosts open at once: the second waits for the first's copy, then finds it made", async () => {
    const { schema, client } = await filled("keys_two");
    const [first, second, reader] = [await client(0), await client(0), await client(0)];
    try {
      const pid = (await second.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
      let other: Promise<number> | undefined;
      const copied = await prepareKeys(first, schema.schema, {
        batch: 4,
        during: async (n) => {
          if (n !== 1) return;
          other = prepareKeys(second, schema.schema, { batch: 4 });
          // The second is past its first look (the copy not yet whole) and waits for the first's session lock.
          for (;;) {
            const { rows } = await reader.query(
              "SELECT count(*)::integer AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1",
              [pid],
            );
            if (rows[0].n > 0) break;
            await new Promise((resolve) => setTimeout(resolve, 5));
          }
        },
      });
      assert.deepEqual([copied, await other], [OLD, 0]);
    } finally {
      await Promise.all([first.end(), second.end(), reader.end()]);
      await schema.drop();
    }
  });

  // A store through the view takes the view's lock, then its table's. Staged: a holder's SHARE lock on the table
  // keeps the split waiting for it first, and a store through the view queued after it.
  const staged = async (prefix: string, split: (c: pg.Client, url: string) => Promise<unknown>) => {
    const { schema, client } = await filled(prefix);
    const [session, writer, holder] = [await client(0), await client(0), await client(0)];
    try {
      await prepareKeys(session, schema.schema, { batch: 4 });
      const waiting = async (n: number) => {
        for (;;) {
          const { rows } = await holder.query(
            `SELECT count(*)::integer AS n FROM pg_locks
              WHERE NOT granted AND relation IN (to_regclass('delivery_rows'), to_regclass('deliveries'))`,
          );
          if (rows[0].n >= n) return;
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
      };
      await holder.query("BEGIN");
      await holder.query("LOCK TABLE delivery_rows IN SHARE MODE");
      const splitting = split(session, schema.url);
      await waiting(1);
      const storing = oldStore(writer, "queued");
      await waiting(2);
      await holder.query("COMMIT");
      const results = await Promise.allSettled([splitting, storing]);
      return { results, keys: (await writer.query("SELECT id FROM delivery_keys WHERE id = 'queued'")).rows };
    } finally {
      await Promise.all([session.end(), writer.end(), holder.end()]);
      await schema.drop();
    }
  };

  it("splits with a store through the view queued behind it, both done, the store's key kept", async () => {
    const { results, keys } = await staged("keys_view", async (_c, url) =>
      (await connect(url, { now: () => T0 })).close(),
    );
    assert.deepEqual(
      results.map((r) => r.status),
      ["fulfilled", "fulfilled"],
    );
    assert.equal(keys.length, 1);
  });

  it("control: the split without the view locked first deadlocks with that store", async () => {
    const { results } = await staged("keys_deadlock", async (c) => {
      await c.query("BEGIN");
      await c.query(MIGRATIONS[SPLIT]!);
      await c.query("COMMIT");
    });
    assert.deepEqual(
      results.filter((r) => r.status === "rejected").map((r) => (r as PromiseRejectedResult).reason.code),
      ["40P01"],
    );
  });

  it("ends the split with the same delivery_keys whether copied ahead, cut short, or not at all", async () => {
    const shape = `
      SELECT (SELECT json_agg(json_build_object('name', attname, 'type', format_type(atttypid, atttypmod), 'notnull', attnotnull,
                                                'dropped', attisdropped) ORDER BY attnum)
                FROM pg_attribute WHERE attrelid = 'delivery_keys'::regclass AND attnum > 0) AS columns,
             (SELECT reloptions FROM pg_class WHERE oid = 'delivery_keys'::regclass) AS options,
             (SELECT json_agg(replace(pg_get_indexdef(indexrelid), current_schema() || '.', '') ORDER BY indexrelid::regclass::text) FROM pg_index
               WHERE indrelid = 'delivery_keys'::regclass) AS indexes,
             (SELECT json_agg(conname || ' ' || pg_get_constraintdef(oid) ORDER BY conname) FROM pg_constraint
               WHERE conrelid = 'delivery_keys'::regclass) AS constraints,
             (SELECT count(*)::integer FROM pg_trigger WHERE tgname LIKE 'delivery_keys%') AS triggers,
             (SELECT count(*)::integer FROM pg_proc WHERE proname = 'delivery_keys_ahead') AS functions,
             to_regclass('delivery_keys_copied') IS NULL AS flag_gone,
             (SELECT json_agg(id ORDER BY id) FROM delivery_keys) AS ids`;
    const shapes = [];
    for (const way of ["ahead", "cut short", "inline"] as const) {
      const { schema, client } = await filled("keys_shape");
      const [session, writer] = [await client(0), await client(0)];
      try {
        const pid = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid;
        if (way === "ahead") await prepareKeys(session, schema.schema, { batch: 4 });
        if (way === "cut short")
          await assert.rejects(
            prepareKeys(session, schema.schema, {
              batch: 4,
              during: async () => void (await writer.query("SELECT pg_terminate_backend($1)", [pid])),
            }),
          );
        // The split as a tool that runs the list of migrations would run it, without prepareKeys before it.
        await writer.query("BEGIN");
        await writer.query(MIGRATIONS[SPLIT]!);
        await writer.query("COMMIT");
        shapes.push((await writer.query(shape)).rows[0]);
      } finally {
        await writer.end();
        await session.end().catch(() => {});
        await schema.drop();
      }
    }
    assert.deepEqual(shapes[0], shapes[2]);
    assert.deepEqual(shapes[1], shapes[2]);
    assert.equal(shapes[2].ids.length, OLD);
  });

  // An inbox further behind, from before bodies apart (the schema of the day issue 51 was filed), is brought to
  // just before the split on its own first, so that its keys too are copied ahead. A key the copy ahead wrote has
  // another transaction's xmin than the split's; one the split copied has the split's own (its inbox_migrations row).
  const OLDER = SPLIT - 4;
  const inSplit = `SELECT count(*)::integer AS n FROM delivery_keys
                    WHERE xmin = (SELECT xmin FROM inbox_migrations WHERE version = ${SPLIT + 1})`;
  const older = async (prefix: string) => {
    const schema = await freshSchema(prefix);
    const past = await pastSchema("postgres", schema.schema, MIGRATIONS.slice(0, OLDER));
    await past.exec(`INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at, finished_at)
                     SELECT 'default', 'old_' || i, ${hex(SMALL)}, '${sha256(SMALL)}', ${T0 - DAY}, 'done', ${T0 - DAY}, ${T0 - DAY}
                       FROM generate_series(1, ${OLD}) AS i`);
    await past.close();
    return schema;
  };

  it("copies ahead the keys of an inbox several versions before the split too", async () => {
    const schema = await older("keys_older");
    const reader = new pg.Client({ connectionString: POSTGRES, options: `-c search_path=${schema.schema}` });
    await reader.connect();
    try {
      const inbox = await connect(schema.url, { now: () => T0 });
      await inbox.close();
      assert.equal((await reader.query(inSplit)).rows[0].n, 0, "no key copied in the split's transaction");
      assert.equal((await reader.query("SELECT count(*)::integer AS n FROM delivery_keys")).rows[0].n, OLD);
      // The versions up to the split applied in a transaction of their own, before the split's; the failed rows'
      // index's migration in one more, after that index was built ahead (test/failed-index.test.ts), and the
      // search indexes' with the periods in one more, after those were (test/migrate-dated.test.ts).
      const { rows } = await reader.query(
        "SELECT count(DISTINCT applied_at)::integer AS n FROM inbox_migrations WHERE version > $1",
        [OLDER],
      );
      assert.equal(rows[0].n, 4);
    } finally {
      await reader.end();
      await schema.drop();
    }
  });

  it("control: the same inbox migrated in one transaction copies every key in the split's", async () => {
    const schema = await older("keys_older_one");
    const reader = new pg.Client({ connectionString: POSTGRES, options: `-c search_path=${schema.schema}` });
    await reader.connect();
    try {
      await reader.query("BEGIN");
      for (let next = OLDER; next < MIGRATIONS.length; next++) {
        await reader.query(MIGRATIONS[next]!);
        await reader.query("INSERT INTO inbox_migrations (version) VALUES ($1)", [next + 1]);
      }
      await reader.query("COMMIT");
      assert.equal((await reader.query(inSplit)).rows[0].n, OLD);
    } finally {
      await reader.end();
      await schema.drop();
    }
  });
});
