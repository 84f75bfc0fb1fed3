// test/failed-index.test.ts: the failed rows' index in the page's order, by time, source and key
// (delivery_rows_failed, docs/performance.md#lists-at-ten-million), which a PostgreSQL inbox's migration declares
// on delivery_rows in the place of the one by time alone: it is made on every partition the inbox had (each day's
// history, the hot one, the defaults) and on each day made after it (makePeriods), each attached to the one index;
// a purge releases a day without writing it anew (releaseDay), and the day keeps it.
// SQLite keeps one table and its one failed index, so it has nothing to upgrade.
//   node --test test/failed-index.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { historyOf, periodOf } from "../lib/postgres/periods.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { freshSchema, pastSchema, POSTGRES, postgresSkip } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const DAY = 86_400_000;
const pgSkip = await postgresSkip();
// The schema as the last main left it: every migration before the one that declares the index.
const BEFORE = MIGRATIONS.slice(
  0,
  MIGRATIONS.findIndex((m) => m.includes("DROP INDEX delivery_rows_failed;")),
);

describe("the failed rows' index by time, source and key (PostgreSQL)", { skip: pgSkip }, () => {
  it("is made on each partition an inbox had and on the days made after, and a released day keeps it", async () => {
    assert.ok(BEFORE.length > 0 && BEFORE.length < MIGRATIONS.length);
    const schema = await freshSchema("failed_source");
    const { default: pg } = await import("pg");
    const client = new pg.Client({ connectionString: POSTGRES });
    await client.connect();
    try {
      await client.query(`SET search_path = ${schema.schema}`);
      // Each leaf partition of delivery_rows, with whether its index is a leaf of delivery_rows_failed.
      const leaves = async () =>
        Object.fromEntries(
          (
            await client.query(
              `SELECT c.relname AS part, c.oid::bigint AS oid, EXISTS (
                        SELECT 1 FROM pg_index i JOIN pg_partition_tree(to_regclass('delivery_rows_failed')) x
                            ON x.relid = i.indexrelid
                         WHERE i.indrelid = c.oid AND x.isleaf AND i.indisvalid
                           AND pg_get_indexdef(i.indexrelid) LIKE '%(received_at, source, id, route) WHERE (status = ''failed''::text)') AS indexed
                 FROM pg_partition_tree(to_regclass('delivery_rows')) t JOIN pg_class c ON c.oid = t.relid
                WHERE t.isleaf`,
            )
          ).rows.map((r) => [r.part as string, { oid: String(r.oid), indexed: r.indexed as boolean }]),
        );

      // An inbox the last main filled: a day's history made (as makePeriods made it then), a done row and a
      // failed one in it, and one of each source's failures.
      const old = periodOf(T0 - 3 * DAY);
      const past = await pastSchema("postgres", schema.schema, BEFORE);
      await past.exec(`
        CREATE TABLE ${old.name} PARTITION OF delivery_bodies FOR VALUES FROM (${old.from}) TO (${old.until});
        CREATE TABLE ${historyOf(old)} PARTITION OF delivery_history FOR VALUES FROM (${old.from}) TO (${old.until});
        CREATE UNIQUE INDEX ${historyOf(old)}_key ON ${historyOf(old)} (source, id, route);`);
      const b = Buffer.from("{}");
      const row = (source: string, id: string, status: string) =>
        `('${source}', '${id}', '\\x${b.toString("hex")}', '${sha256(b)}', ${old.from + 1_000}, '${status}', 1, ` +
        `${old.from + 1_000}, ${old.from + 2_000}, ${status === "failed" ? "'HTTP 500'" : "NULL"})`;
      await past.exec(`INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at,
                                               finished_at, error)
                       VALUES ${[row("a", "done_1", "done"), row("a", "bad_a", "failed"), row("b", "bad_b", "failed")].join(", ")}`);
      await past.close();
      const before = await leaves();
      assert.equal(before[historyOf(old)]?.indexed, false, "(control) the old day has the index by time alone before");

      let t = T0;
      const inbox = await connect(schema.url, { now: () => t, random: () => 0 });
      try {
        const migrated = await leaves();
        // The old day, the hot partition, the defaults, and the days the open made (today and those ahead).
        const made = [0, 1, 2, 3].map((d) => historyOf(periodOf(T0 + d * DAY)));
        for (const part of [
          historyOf(old),
          "delivery_rows_hot",
          "delivery_history_default",
          ...made.slice(0, DEFAULTS.periodsAhead + 1),
        ])
          assert.equal(migrated[part]?.indexed, true, part);
        assert.ok(
          Object.values(migrated).every((p) => p.indexed),
          JSON.stringify(migrated),
        );

        // Days on: the purge makes the new days, and releases the old day (its done row a tombstone) where it is.
        t = T0 + 10 * DAY;
        const purged = await inbox.purge();
        assert.equal(purged.bodies, 1, "done_1's body");
        const after = await leaves();
        assert.equal(after[historyOf(old)]?.oid, migrated[historyOf(old)]?.oid, "the old day is the same table");
        assert.equal(after[historyOf(old)]?.indexed, true, "and has the index, attached");
        assert.equal(after[historyOf(periodOf(t))]?.indexed, true, "a day made after the migration has it");
        assert.ok(
          Object.values(after).every((p) => p.indexed),
          JSON.stringify(after),
        );

        // And a source's failed list reads what it did.
        const ids = async (filter: { status: "failed"; source?: string }) =>
          (await inbox.search(filter, { bodies: false })).map((d) => d.id);
        assert.deepEqual(await ids({ status: "failed", source: "a" }), ["bad_a"]);
        assert.deepEqual(await ids({ status: "failed", source: "b" }), ["bad_b"]);
        assert.deepEqual(await ids({ status: "failed" }), ["bad_b", "bad_a"]);
      } finally {
        await inbox.close();
      }
    } finally {
      await client.end();
      await schema.drop();
    }
  });
});
