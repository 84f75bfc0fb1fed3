// test/migrate-history.test.ts: a PostgreSQL inbox that today's main filled (every delivery's state in one table,
// delivery_rows) upgrades in place to a hot queue and a history (docs/table.md#hot-and-cold): its backlog moves
// to the hot partition, the rest of the old table becomes the history's partition for the days before, attached
// without a scan and with no index built, its keys go to delivery_keys, and the view, its trigger and the search
// triggers are made again on the new table. Claims, done marks, replays, retries, duplicates, retention and SQL
// written against the view all carry on. SQLite keeps one table, so it has nothing to upgrade.
//   node --test test/migrate-history.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { historyOf, periodOf } from "../lib/postgres/periods.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { freshSchema, pastSchema, postgresSkip } from "./helpers.ts";

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

// The search index on, as inbox.ts search enable leaves it (lib/postgres/searching.ts).
const SEARCH_ON = `
  UPDATE search_state SET enabled = true, done = true;
  CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION inbox_search_queue();
  CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON delivery_rows
    FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_forget();
  CREATE TRIGGER deliveries_search_delete AFTER DELETE ON delivery_rows
    FOR EACH ROW WHEN (OLD.route = 0) EXECUTE FUNCTION inbox_search_forget();`;

describe("upgrading a PostgreSQL inbox to a hot queue and a history", { skip: pgSkip }, () => {
  it("moves the backlog to the hot partition, attaches the rest as history unscanned, and carries on", async () => {
    const schema = await freshSchema("history");
    try {
      const past = await pastSchema("postgres", schema.schema, BEFORE);
      await past.exec(SEARCH_ON);
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
