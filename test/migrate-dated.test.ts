// test/migrate-dated.test.ts: a PostgreSQL inbox whose search index today's main filled upgrades in place to one
// that holds each indexed row's hour and day beside its JSON and its words (docs/performance.md#the-newest-matches-first). The
// rows it had indexed keep none, search_state.dated_since says from when every row has them, and a search with
// many matches, by JSON or by words, walks the new rows by their periods back to that time, then finds the old
// ones, newest first, each once. SQLite's search keeps no periods, so it has nothing to upgrade.
//   node --test test/migrate-dated.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import type pg from "pg";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { prepareDatedSearch } from "../lib/postgres/migrate.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import type { Delivery, Filter, Inbox } from "../lib/store.ts";
import { freshSchema, holding, PG_SEARCH_ON, pastSchema, postgresSkip, schemaClient, waitingOn } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const HOUR = 3_600_000;
const pgSkip = await postgresSkip();
// The schema as the main before the periods left it: every migration before the one that dates the search rows.
const BEFORE = MIGRATIONS.slice(
  0,
  MIGRATIONS.findIndex((m) => m.includes("ADD COLUMN periods")),
);
// The migration after it, that gives both search indexes the periods, built ahead of it (prepareDatedSearch).
const INDEXES = MIGRATIONS.findIndex((m) => m.includes("deliveries_search_json_dated"));
const OLD = DEFAULTS.searchWalkAbove;
const NEW = 100;
const doc = (id: string) => JSON.stringify({ id, data: { object: { customer: "cus_many" } } });

// pages reads a filter's search a page at a time, each after the last one's row, as the API's cursor does.
async function pages(inbox: Inbox, filter: Filter, limit: number): Promise<string[]> {
  const all: string[] = [];
  for (let after: Delivery | undefined, k = 0; k < 100; k++) {
    const page = await inbox.search(filter, {
      limit,
      ...(after && { after: { receivedAt: after.receivedAt, source: after.source, id: after.id, route: after.route } }),
    });
    all.push(...page.map((d) => d.id));
    if (page.length < limit) break;
    after = page.at(-1);
  }
  return all;
}

describe("upgrading a PostgreSQL search index to rows dated by hour and day", { skip: pgSkip }, () => {
  it("finds the rows main indexed after the new ones, newest first, and dates each row indexed since", async () => {
    const schema = await freshSchema("dated");
    try {
      // Main's inbox: the index on, and OLD deliveries four hours apart before T0, each indexed as main did.
      const past = await pastSchema("postgres", schema.schema, BEFORE);
      try {
        await past.exec(PG_SEARCH_ON);
        await past.exec(`
          INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at, finished_at,
                                  route, destination)
            SELECT 'default', 'old_' || i, b, encode(sha256(b), 'hex'), ${T0} - i * ${4 * HOUR}, 'done', 1,
                   ${T0} - i * ${4 * HOUR}, ${T0} - i * ${4 * HOUR} + 1000, 0, 'handler'
              FROM generate_series(1::bigint, ${OLD}) i
              CROSS JOIN LATERAL (SELECT convert_to(json_build_object('id', 'old_' || i, 'data',
                                    json_build_object('object', json_build_object('customer', 'cus_many')))::text, 'UTF8') AS b) x;
          INSERT INTO deliveries_search (source, id, doc)
            SELECT source, id, convert_from(body, 'UTF8')::jsonb FROM deliveries WHERE id LIKE 'old_%';
          DELETE FROM search_pending;`);
      } finally {
        await past.close();
      }

      let t = T0;
      const inbox = await connect(schema.url, { now: () => t });
      try {
        const state = async () =>
          (
            await inbox.query(
              `SELECT (SELECT dated_since FROM search_state) AS since,
                      (SELECT count(*) FROM deliveries_search WHERE periods IS NULL) AS undated,
                      (SELECT count(*) FROM deliveries_search WHERE periods IS NOT NULL) AS dated`,
            )
          )[0]!;
        // Every row main indexed was received before dated_since, and holds no period.
        assert.deepEqual(await state(), { since: T0 - 4 * HOUR + 1, undated: OLD, dated: 0 });
        // New deliveries ten minutes apart after T0: the walk's windows of hours hold them.
        for (let i = 0; i < NEW; i++) {
          t = T0 + i * 600_000;
          await inbox.store({ id: `new_${i}`, body: Buffer.from(doc(`new_${i}`)) });
        }
        const expected = [
          ...Array.from({ length: NEW }, (_, i) => `new_${NEW - 1 - i}`),
          ...Array.from({ length: OLD }, (_, i) => `old_${i + 1}`),
        ];
        const filter = { bodyJson: '{"data":{"object":{"customer":"cus_many"}}}' };
        assert.deepEqual(await pages(inbox, filter, 50), expected);
        assert.equal(await inbox.count(filter), NEW + OLD);
        assert.deepEqual(await pages(inbox, { bodyWords: "cus_many" }, 50), expected);
        assert.deepEqual(await state(), { since: T0 - 4 * HOUR + 1, undated: OLD, dated: NEW });
        // The control: with dated_since forgotten, the walk's windows of days would pass over the old rows in them,
        // which hold no period, and the last statement asks only for what is older than the windows.
        await inbox.query("UPDATE search_state SET dated_since = 0");
        for (const form of [filter, { bodyWords: "cus_many" }]) {
          const missed = await pages(inbox, form, 50);
          assert.ok(missed.length < expected.length, `found ${missed.length} of ${expected.length}`);
          assert.deepEqual(missed.slice(0, NEW), expected.slice(0, NEW));
        }
      } finally {
        await inbox.close();
      }
    } finally {
      await schema.drop();
    }
  });
});

// Both search indexes with the periods built ahead of their migration, online (lib/postgres/migrate.ts
// prepareDatedSearch, docs/table.md#built-ahead): an inbox at the version just before that migration, its column
// added, with OLD rows indexed as main indexed them.
describe("the search indexes with periods built ahead of their migration, online", { skip: pgSkip }, () => {
  const JSON_FORM = "USING gin (doc jsonb_path_ops, periods)";
  const filled = async (prefix: string, fill = "") => {
    assert.equal(INDEXES, BEFORE.length + 1, "the column's migration, then the indexes'");
    const schema = await freshSchema(prefix);
    const past = await pastSchema("postgres", schema.schema, BEFORE);
    try {
      await past.exec(PG_SEARCH_ON);
      await past.exec(`
        INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at, finished_at,
                                route, destination)
          SELECT 'default', 'old_' || i, b, encode(sha256(b), 'hex'), ${T0} - i * ${HOUR}, 'done', 1,
                 ${T0} - i * ${HOUR}, ${T0} - i * ${HOUR} + 1000, 0, 'handler'
            FROM generate_series(1::bigint, ${OLD}) i
            CROSS JOIN LATERAL (SELECT convert_to(json_build_object('id', 'old_' || i, 'data',
                                  json_build_object('object', json_build_object('customer', 'cus_' || i % 2)))::text, 'UTF8') AS b) x;
        INSERT INTO deliveries_search (source, id, doc)
          SELECT source, id, convert_from(body, 'UTF8')::jsonb FROM deliveries WHERE id LIKE 'old_%';
        DELETE FROM search_pending;
        ${MIGRATIONS[BEFORE.length]};
        INSERT INTO inbox_migrations (version) VALUES (${INDEXES});
        ${fill}`);
    } finally {
      await past.close();
    }
    return { schema, client: (lockMs = 0) => schemaClient(schema.schema, lockMs) };
  };
  // Each index on deliveries_search: its name, OID, file, whether it is valid and whether it holds the periods.
  const indexes = async (c: pg.Client) =>
    (
      await c.query(
        `SELECT x.relname AS name, i.indexrelid::bigint::text AS oid, x.relfilenode::bigint::text AS file,
                i.indisvalid AS valid, pg_get_indexdef(i.indexrelid) LIKE '%, periods)' AS dated
           FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
          WHERE i.indrelid = to_regclass('deliveries_search') AND x.relname <> 'deliveries_search_pkey' ORDER BY 1`,
      )
    ).rows as { name: string; oid: string; file: string; valid: boolean; dated: boolean }[];
  // A body search as the walk asks one window of it, by JSON through its index, and the indexer's write and a
  // purge's delete, each on the reader's connection, which waits 200 ms at most for a lock.
  const searchAndIndex = async (reader: pg.Client) => {
    await reader.query("BEGIN");
    await reader.query("SET LOCAL enable_seqscan = off");
    const { rows } = await reader.query(
      `SELECT id FROM deliveries_search WHERE doc @> '{"data":{"object":{"customer":"cus_1"}}}' ORDER BY id`,
    );
    await reader.query("COMMIT");
    await reader.query("DELETE FROM deliveries_search WHERE id = 'old_2'");
    await reader.query(
      `INSERT INTO deliveries_search (source, id, doc) VALUES ('default', 'old_2', '{"data":{"object":{"customer":"cus_0"}}}')`,
    );
    return rows.length;
  };

  it("lets a body search, the indexer and a purge's delete through while each is built, then takes each as built", async () => {
    const { schema, client } = await filled("dated_ahead");
    const [session, reader, holder] = [await client(), await client(200), await client()];
    try {
      const pid = (await session.query("SELECT pg_backend_pid() AS pid")).rows[0].pid as number;
      const during: Promise<{ mid: boolean[]; found: number }>[] = [];
      const n = await prepareDatedSearch(session, schema.schema, {
        before: async (name) => {
          const vxid = await holding(holder);
          during.push(
            (async () => {
              await waitingOn(reader, pid, vxid);
              const mid = (await indexes(reader)).filter((x) => x.name === `${name}_dated`).map((x) => x.valid);
              const found = await searchAndIndex(reader);
              await holder.query("COMMIT");
              return { mid, found };
            })(),
          );
        },
      });
      assert.equal(n, 2);
      assert.deepEqual(await Promise.all(during), [
        { mid: [false], found: OLD / 2 },
        { mid: [false], found: OLD / 2 },
      ]);
      const ahead = await indexes(reader);
      assert.deepEqual(
        ahead.map((x) => [x.name, x.valid, x.dated]),
        [
          ["deliveries_search_json", true, false],
          ["deliveries_search_json_dated", true, true],
          ["deliveries_search_words", true, false],
          ["deliveries_search_words_dated", true, true],
        ],
      );
      const inbox = await connect(schema.url, { now: () => T0 });
      try {
        const after = await indexes(reader);
        assert.deepEqual(
          after.map((x) => [x.name, x.oid, x.file, x.valid, x.dated]),
          ahead.filter((x) => x.dated).map((x) => [x.name.replace("_dated", ""), x.oid, x.file, true, true]),
          "each built ahead, renamed in the old one's place, its file as it was",
        );
        assert.equal(await prepareDatedSearch(session, schema.schema), 0, "past the migration, nothing to build");
        const cus0 = await pages(inbox, { bodyJson: '{"data":{"object":{"customer":"cus_0"}}}' }, 10);
        assert.equal(cus0.length, OLD / 2, "old_2, deleted and indexed again during the builds, found once");
        assert.deepEqual(
          await pages(inbox, { bodyWords: "cus_1" }, 10),
          await pages(inbox, { bodyWords: "cus_1" }, 50),
        );
      } finally {
        await inbox.close();
      }
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      await Promise.all([session.end(), reader.end(), holder.end()]);
      await schema.drop();
    }
  });

  it("control: the migration building them in its transaction, as it did, makes the same reads and writes wait", async () => {
    const { schema, client } = await filled("dated_inline");
    const [session, reader] = [await client(), await client(200)];
    try {
      await session.query("BEGIN");
      await session.query(MIGRATIONS[INDEXES]!);
      await assert.rejects(searchAndIndex(reader), { code: "55P03" });
      await reader.query("ROLLBACK");
      await session.query("ROLLBACK");
    } finally {
      await Promise.all([session.end(), reader.end()]);
      await schema.drop();
    }
  });

  // leftInvalid leaves the index of index (its name, table and form) INVALID, as a build cut short does: built
  // concurrently on c, stopped by its statement_timeout while it waits for holder's older snapshot.
  const leftInvalid = async (c: pg.Client, holder: pg.Client, index: string) => {
    await holding(holder);
    await c.query("SET statement_timeout = '300ms'");
    await assert.rejects(c.query(`CREATE INDEX CONCURRENTLY ${index}`), { code: "57014" });
    await c.query("RESET statement_timeout");
    await holder.query("ROLLBACK");
  };

  it("builds again what a build cut short left INVALID, and the migration renames no index not of the form", async () => {
    // An index left INVALID: a build stopped by its statement_timeout while it waited for an older snapshot.
    const { schema, client } = await filled("dated_invalid");
    const [session, holder] = [await client(), await client()];
    try {
      await leftInvalid(session, holder, `deliveries_search_json_dated ON deliveries_search ${JSON_FORM}`);
      const left = (await indexes(session)).find((x) => x.name === "deliveries_search_json_dated");
      assert.equal(left?.valid, false, "left INVALID");
      assert.equal(await prepareDatedSearch(session, schema.schema), 2);
      const built = (await indexes(session)).find((x) => x.name === "deliveries_search_json_dated");
      assert.equal(built?.valid, true);
      assert.notEqual(built?.oid, left?.oid, "built again, not kept");
    } finally {
      await Promise.all([session.end(), holder.end()]);
      await schema.drop();
    }
    // A near miss under the name (without the periods) and an INVALID one: the migration alone, as behind a
    // per-transaction pooler, drops both and builds its own.
    const near = await filled("dated_near");
    const c = await near.client();
    const h = await near.client();
    try {
      await c.query("CREATE INDEX deliveries_search_json_dated ON deliveries_search USING gin (doc jsonb_path_ops)");
      await leftInvalid(
        c,
        h,
        `deliveries_search_words_dated ON deliveries_search USING gin
           (jsonb_to_tsvector('simple'::regconfig, doc, '["string", "numeric", "boolean"]'::jsonb), periods)`,
      );
      const before = await indexes(c);
      assert.deepEqual(
        before.map((x) => [x.name, x.valid, x.dated]),
        [
          ["deliveries_search_json", true, false],
          ["deliveries_search_json_dated", true, false],
          ["deliveries_search_words", true, false],
          ["deliveries_search_words_dated", false, true],
        ],
        "(control) a near miss and an INVALID one, each named as built ahead",
      );
      await c.query("BEGIN");
      await c.query(MIGRATIONS[INDEXES]!);
      await c.query("COMMIT");
      const after = await indexes(c);
      assert.deepEqual(
        after.map((x) => [x.name, x.valid, x.dated]),
        [
          ["deliveries_search_json", true, true],
          ["deliveries_search_words", true, true],
        ],
      );
      for (const x of after) assert.ok(!before.some((b) => b.oid === x.oid), `${x.name} built anew`);
    } finally {
      await Promise.all([c.end(), h.end()]);
      await near.schema.drop();
    }
  });

  it("leaves as they are the indexes of an inbox that took the periods in one migration with the column", async () => {
    // As a session's main left it: the indexes made with the periods in the column's migration.
    const { schema, client } = await filled(
      "dated_once",
      `DROP INDEX deliveries_search_json;
       CREATE INDEX deliveries_search_json ON deliveries_search ${JSON_FORM};
       DROP INDEX deliveries_search_words;
       CREATE INDEX deliveries_search_words ON deliveries_search USING gin
         (jsonb_to_tsvector('simple'::regconfig, doc, '["string", "numeric", "boolean"]'::jsonb), periods);`,
    );
    const c = await client();
    try {
      const before = await indexes(c);
      assert.deepEqual(
        before.map((x) => [x.name, x.dated]),
        [
          ["deliveries_search_json", true],
          ["deliveries_search_words", true],
        ],
      );
      assert.equal(await prepareDatedSearch(c, schema.schema), 0, "nothing built beside them");
      await (await connect(schema.url, { now: () => T0 })).close();
      assert.deepEqual(await indexes(c), before, "the same indexes, their files as they were");
    } finally {
      await c.end();
      await schema.drop();
    }
  });
});
