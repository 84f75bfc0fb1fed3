// test/failed-index.test.ts: the failed rows' index in the page's order, by time, source and key
// (delivery_rows_failed, docs/performance.md#lists-at-ten-million), which a PostgreSQL inbox's migration declares
// on delivery_rows in the place of the one by time alone: it is made on every partition the inbox had (each day's
// history, the hot one, the defaults) and on each day made after it (makePeriods), each attached to the one index;
// a purge releases a day without writing it anew (releaseDay), and the day keeps it. The migration holds
// delivery_rows' lock, so its index is built ahead of it, online (prepareFailedIndex: CREATE INDEX CONCURRENTLY on
// each partition), and the migration attaches what it finds built.
// SQLite keeps one table and its one failed index, so it has nothing to upgrade.
//   node --test test/failed-index.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import pg from "pg";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { historyOf, periodOf } from "../lib/postgres/periods.ts";
import { prepareFailedIndex } from "../lib/postgres/migrate.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { freshSchema, holding, pastSchema, POSTGRES, postgresSkip, schemaClient, waitingOn } from "./helpers.ts";

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

// The failed rows' index built ahead (lib/postgres/migrate.ts prepareFailedIndex, docs/table.md#built-ahead):
// an inbox at the version just before the migration, written meanwhile as an inbox of that version writes it.
describe("the failed rows' index built ahead of its migration, online", { skip: pgSkip }, () => {
  const old = periodOf(T0 - 3 * DAY);
  const hex = (b: Buffer) => `'\\x${b.toString("hex")}'`;
  const B = Buffer.from("{}");
  // An inbox at the version before the migration: a day's history made (as makePeriods makes it), done and failed
  // rows in it, and a backlog of three in the hot partition.
  const filled = async (prefix: string) => {
    const schema = await freshSchema(prefix);
    const past = await pastSchema("postgres", schema.schema, BEFORE);
    await past.exec(`
      CREATE TABLE ${old.name} PARTITION OF delivery_bodies FOR VALUES FROM (${old.from}) TO (${old.until});
      CREATE TABLE ${historyOf(old)} PARTITION OF delivery_history FOR VALUES FROM (${old.from}) TO (${old.until});
      CREATE UNIQUE INDEX ${historyOf(old)}_key ON ${historyOf(old)} (source, id, route);
      CREATE INDEX ${historyOf(old)}_open ON ${historyOf(old)} (status, received_at, source, destination) WHERE status <> 'done';
      INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at, finished_at, error)
        SELECT s, s || '_' || i, ${hex(B)}, '${sha256(B)}', ${old.from} + i, CASE WHEN i % 5 = 0 THEN 'failed' ELSE 'done' END,
               1, ${old.from} + i, ${old.from} + i + 1000, CASE WHEN i % 5 = 0 THEN 'HTTP 500' END
          FROM generate_series(1, 20) AS i, (VALUES ('a'), ('b')) AS v(s);
      INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
        SELECT 'a', 'wait_' || i, ${hex(B)}, '${sha256(B)}', ${old.from} + 100 + i, 'received', ${old.from} + 100 + i
          FROM generate_series(1, 3) AS i;`);
    await past.close();
    // A connection of its own for each part, on the inbox's schema: the build's, a writer's, a holder's, the test's.
    const client = (lockMs = 0) => schemaClient(schema.schema, lockMs);
    return { schema, client };
  };
  // Each index of the failed rows' form on a leaf of delivery_rows: its leaf, OID, file, whether it is valid, and
  // whether it is a leaf of delivery_rows_failed (through delivery_history's index, for the history's).
  const built = async (c: pg.Client) =>
    (
      await c.query(
        `SELECT t.relid::regclass::text AS part, i.indexrelid::bigint::text AS oid, x.relfilenode::bigint::text AS file,
                i.indisvalid AS valid,
                i.indexrelid IN (SELECT relid FROM pg_partition_tree(to_regclass('delivery_rows_failed'))) AS attached
           FROM pg_partition_tree(to_regclass('delivery_rows')) t JOIN pg_index i ON i.indrelid = t.relid
           JOIN pg_class x ON x.oid = i.indexrelid
          WHERE t.isleaf AND pg_get_indexdef(i.indexrelid) LIKE '%USING btree (received_at, source, id, route) WHERE (status = ''failed''::text)'
          ORDER BY 1, 2`,
      )
    ).rows as { part: string; oid: string; file: string; valid: boolean; attached: boolean }[];
  // The migration as the list of migrations runs it alone: one transaction, delivery_rows locked for the build.
  const inOneTransaction = async (c: pg.Client, commit = true) => {
    await c.query("BEGIN");
    await c.query(MIGRATIONS[BEFORE.length]!);
    await c.query("INSERT INTO inbox_migrations (version) VALUES ($1)", [BEFORE.length + 1]);
    if (commit) await c.query("COMMIT");
  };
  // A holder's snapshot, taken before a build of the day's partition, that the build's last phase waits for; the
  // build's session waiting on it, with its index there and not yet valid.
  // What an inbox of that version writes: a store, and a done mark and a failure, each moving a row of the
  // backlog into the day's history (its partition the one being built on).
  const writes = async (writer: pg.Client) => {
    await writer.query(
      `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
       VALUES ('a', 'during', $1, $2, $3, 'received', $3)`,
      [B, sha256(B), old.from + 500],
    );
    await writer.query("UPDATE deliveries SET status = 'done', finished_at = $1 WHERE id = 'wait_1'", [old.from + 600]);
    await writer.query(
      "UPDATE deliveries SET status = 'failed', error = 'HTTP 500', finished_at = $1 WHERE id = 'wait_2'",
      [old.from + 600],
    );
  };

  it("lets a store, a done mark and a failure into the day through while its partition's index is built", async () => {
    const { schema, client } = await filled("failed_ahead");
    const [session, writer, holder] = [await client(), await client(200), await client()];
    try {
      const pid = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
      let during: Promise<{ valid: boolean }[]> | undefined;
      const n = await prepareFailedIndex(session, schema.schema, {
        before: async (part) => {
          if (part !== historyOf(old)) return;
          const vxid = await holding(holder);
          during = (async () => {
            await waitingOn(writer, pid, vxid);
            const mid = (await built(writer)).filter((b) => b.part === part);
            await writes(writer);
            await holder.query("COMMIT");
            return mid;
          })();
        },
      });
      const mid = await during;
      assert.deepEqual(
        mid?.map((b) => b.valid),
        [false],
        "the writes went through while the day's index was being built, not yet valid",
      );
      assert.ok(n >= 3, `built on the hot partition, the default and the day (${n})`);
      assert.ok(
        (await built(writer)).every((b) => b.valid && !b.attached),
        "each valid, attached to nothing yet",
      );
      // The failure written during the build, read through the index built.
      await writer.query("BEGIN");
      await writer.query("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off");
      const read = `SELECT id FROM ${historyOf(old)} WHERE status = 'failed' AND source = 'a' ORDER BY received_at, source, id, route`;
      const plan = (await writer.query(`EXPLAIN ${read}`)).rows.map((r) => r["QUERY PLAN"] as string).join("\n");
      assert.match(plan, /Index (Only )?Scan using \w+_received_at_source_id_route_idx/);
      const ids = (await writer.query(read)).rows.map((r) => r.id as string);
      await writer.query("COMMIT");
      assert.deepEqual(ids, ["a_5", "a_10", "a_15", "a_20", "wait_2"]);
      const inbox = await connect(schema.url, { now: () => T0 });
      try {
        const failed = (await inbox.search({ status: "failed", source: "a" }, { bodies: false })).map((d) => d.id);
        assert.deepEqual(failed, ["wait_2", "a_20", "a_15", "a_10", "a_5"]);
      } finally {
        await inbox.close();
      }
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      await Promise.all([session.end(), writer.end(), holder.end()]);
      await schema.drop();
    }
  });

  it("control: the migration in one transaction, as it ran before, makes the same writes wait for its lock", async () => {
    const { schema, client } = await filled("failed_inline");
    const [session, writer] = [await client(), await client(200)];
    try {
      await inOneTransaction(session, false);
      await assert.rejects(writes(writer), { code: "55P03" });
      await session.query("ROLLBACK");
    } finally {
      await Promise.all([session.end(), writer.end()]);
      await schema.drop();
    }
  });

  it("is attached by the migration as it was built, not built again (control: the migration alone builds its own)", async () => {
    const ahead = await filled("failed_attach");
    const alone = await filled("failed_alone");
    const [a, b] = [await ahead.client(), await alone.client()];
    try {
      assert.ok((await prepareFailedIndex(a, ahead.schema.schema)) >= 3);
      const before = await built(a);
      // A day made between the build and the migration (as makePeriods makes one): the migration builds its index.
      const between = periodOf(T0 - 2 * DAY);
      await a.query(
        `CREATE TABLE ${historyOf(between)} PARTITION OF delivery_history FOR VALUES FROM (${between.from}) TO (${between.until})`,
      );
      const inbox = await connect(ahead.schema.url, { now: () => T0 });
      await inbox.close();
      const after = await built(a);
      for (const index of before) {
        const now = after.find((x) => x.part === index.part);
        assert.deepEqual(
          [now?.oid, now?.file, now?.valid, now?.attached],
          [index.oid, index.file, true, true],
          `${index.part}: the index built ahead, attached to the migration's, its file as it was`,
        );
      }
      assert.equal(after.find((x) => x.part === historyOf(between))?.attached, true, "the day made between has it");
      assert.ok(after.every((x) => x.valid && x.attached));
      assert.equal(after.length, before.length + 1 + DEFAULTS.periodsAhead + 1, "and the days made after, one each");
      assert.equal(await prepareFailedIndex(a, ahead.schema.schema), 0, "past the migration, nothing to build");

      // The control: the same inbox, a near miss (its columns in another order) built ahead on the day by hand, the
      // migration alone: no index of the form before it, each made in it, and the near miss left beside it.
      await b.query(
        `CREATE INDEX CONCURRENTLY near_miss ON ${historyOf(old)} (received_at, source, route, id) WHERE status = 'failed'`,
      );
      assert.deepEqual(await built(b), []);
      await inOneTransaction(b);
      const made = await built(b);
      assert.ok(made.length >= 3 && made.every((x) => x.valid && x.attached));
      const [{ left }] = (
        await b.query("SELECT count(*)::integer AS left FROM pg_inherits WHERE inhrelid = to_regclass('near_miss')")
      ).rows;
      assert.equal(left, 0, "the near miss was not attached");
    } finally {
      await Promise.all([a.end(), b.end()]);
      await Promise.all([ahead.schema.drop(), alone.schema.drop()]);
    }
  });

  it("drops an index a killed build left INVALID and builds it again (control: attached as it is, it leaves the migration's index invalid)", async () => {
    const { schema, client } = await filled("failed_killed");
    const [session, watcher, holder] = [await client(), await client(), await client()];
    try {
      const pid = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
      await assert.rejects(
        prepareFailedIndex(session, schema.schema, {
          before: async (part) => {
            if (part !== historyOf(old)) return;
            const vxid = await holding(holder);
            void (async () => {
              await waitingOn(watcher, pid, vxid);
              await watcher.query("SELECT pg_terminate_backend($1)", [pid]);
            })();
          },
        }),
      );
      await holder.query("COMMIT");
      const [left] = (await built(watcher)).filter((b) => b.part === historyOf(old));
      assert.equal(left?.valid, false, "the killed build left its index INVALID");

      // The control: the migration alone, over it, attaches it and is left invalid itself.
      await inOneTransaction(watcher, false);
      const [{ valid }] = (
        await watcher.query(
          "SELECT indisvalid AS valid FROM pg_index WHERE indexrelid = to_regclass('delivery_rows_failed')",
        )
      ).rows;
      assert.equal(valid, false, "(control) the partitioned index invalid, its leaf attached as it was");
      await watcher.query("ROLLBACK");

      const again = await client();
      try {
        assert.ok((await prepareFailedIndex(again, schema.schema)) >= 1);
      } finally {
        await again.end();
      }
      const day = (await built(watcher)).filter((b) => b.part === historyOf(old));
      assert.equal(day.length, 1, "one index on the day, the leftover gone");
      assert.notEqual(day[0]!.oid, left!.oid);
      assert.equal(day[0]!.valid, true);
      const inbox = await connect(schema.url, { now: () => T0 });
      await inbox.close();
      const [{ whole }] = (
        await watcher.query(
          "SELECT indisvalid AS whole FROM pg_index WHERE indexrelid = to_regclass('delivery_rows_failed')",
        )
      ).rows;
      assert.equal(whole, true);
      assert.ok((await built(watcher)).every((b) => b.valid && b.attached));
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      await Promise.all([session.end().catch(() => {}), watcher.end(), holder.end()]);
      await schema.drop();
    }
  });

  it("is built once by two hosts opening at once, the second waiting for the first's lock", async () => {
    const { schema, client } = await filled("failed_twice");
    const [one, two] = [await client(), await client()];
    try {
      const counts = await Promise.all([
        prepareFailedIndex(one, schema.schema),
        prepareFailedIndex(two, schema.schema),
      ]);
      const leaves = (
        await one.query("SELECT count(*)::integer AS n FROM pg_partition_tree('delivery_rows') WHERE isleaf")
      ).rows[0].n as number;
      assert.deepEqual(
        counts.sort((x, y) => x - y),
        [0, leaves],
      );
      const all = await built(one);
      assert.equal(all.length, leaves, "one index on each leaf");
      assert.ok(all.every((b) => b.valid));
    } finally {
      await Promise.all([one.end(), two.end()]);
      await schema.drop();
    }
  });

  it("control: a second host waiting in pg_advisory_lock() is a transaction the first's build waits for, a deadlock", async () => {
    const { schema, client } = await filled("failed_deadlock");
    const [one, two, watcher] = [await client(), await client(), await client()];
    try {
      const key = `webhook-inbox:failed:${schema.schema}`;
      const pid = (await two.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
      let waiting: Promise<unknown> | undefined;
      const build = prepareFailedIndex(one, schema.schema, {
        before: async () => {
          if (waiting) return;
          waiting = two.query("SELECT pg_advisory_lock(hashtext($1))", [key]);
          waiting.catch(() => {});
          for (;;) {
            const { rowCount } = await watcher.query(
              "SELECT 1 FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted",
              [pid],
            );
            if (rowCount) return;
            await new Promise((resolve) => setTimeout(resolve, 5));
          }
        },
      });
      const settled = [...(await Promise.allSettled([build])), ...(await Promise.allSettled([waiting]))];
      assert.ok(
        settled.some((r) => r.status === "rejected" && (r.reason as { code?: string }).code === "40P01"),
        JSON.stringify(settled.map((r) => r.status)),
      );
    } finally {
      await Promise.all([one.end().catch(() => {}), two.end().catch(() => {}), watcher.end()]);
      await schema.drop();
    }
  });

  it("ends with the indexes the migration alone made, on every partition and on the days made after", async () => {
    const ahead = await filled("failed_same_a");
    const alone = await filled("failed_same_b");
    const [a, b] = [await ahead.client(), await alone.client()];
    // Every index on delivery_rows and its partitions, with the index it is attached to, its schema's name out.
    const indexes = async (c: pg.Client, schema: string) =>
      (
        await c.query(
          `SELECT t.relid::regclass::text AS part, replace(pg_get_indexdef(i.indexrelid), $1 || '.', '') AS def,
                  i.indisvalid AS valid, (SELECT inhparent::regclass::text FROM pg_inherits WHERE inhrelid = i.indexrelid) AS parent
             FROM pg_partition_tree(to_regclass('delivery_rows')) t JOIN pg_index i ON i.indrelid = t.relid
            ORDER BY 1, 2`,
          [schema],
        )
      ).rows;
    try {
      await prepareFailedIndex(a, ahead.schema.schema);
      await inOneTransaction(b);
      let t = T0;
      const inboxes = [
        await connect(ahead.schema.url, { now: () => t }),
        await connect(alone.schema.url, { now: () => t }),
      ];
      try {
        const first = await indexes(a, ahead.schema.schema);
        assert.ok(first.some((x) => x.def.includes("(received_at, source, id, route)")));
        assert.deepEqual(first, await indexes(b, alone.schema.schema));
        // Days on: a purge makes the new days, and writes the old day anew.
        t = T0 + 10 * DAY;
        for (const inbox of inboxes) assert.equal((await inbox.purge()).bodies, 32);
        assert.deepEqual(await indexes(a, ahead.schema.schema), await indexes(b, alone.schema.schema));
      } finally {
        await Promise.all(inboxes.map((inbox) => inbox.close()));
      }
    } finally {
      await Promise.all([a.end(), b.end()]);
      await Promise.all([ahead.schema.drop(), alone.schema.drop()]);
    }
  });
});
