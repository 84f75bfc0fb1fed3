// test/migrate-bodies.test.ts: a PostgreSQL inbox that today's main filled (bodies inline in deliveries)
// upgrades in place to bodies in a table of their own (docs/table.md#bodies-apart): its rows keep their
// bodies where they are and read as before, new ones keep theirs apart, and retention, replay, duplicates
// and SQL written against the old table all carry on. SQLite keeps one table, so it has nothing to upgrade.

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { bodyProbes, freshSchema, pastSchema, postgresSkip } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const DAY = 86_400_000;
const pgSkip = await postgresSkip();
// The schema as today's main leaves it: every migration before the one that moves bodies.
const BEFORE = MIGRATIONS.slice(
  0,
  MIGRATIONS.findIndex((m) => m.includes("CREATE TABLE delivery_bodies")),
);

const OLD = Buffer.from('{"customer":"Ann","amount":5}');
const rows = `
  INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at, finished_at)
  VALUES ('default', 'done_old', '\\x${OLD.toString("hex")}', '${sha256(OLD)}', ${T0 - 10 * DAY}, 'done', 1, ${T0 - 10 * DAY}, ${T0 - 10 * DAY}),
         ('default', 'kept_old', '\\x${OLD.toString("hex")}', '${sha256(OLD)}', ${T0 - DAY}, 'done', 1, ${T0 - DAY}, ${T0 - DAY}),
         ('default', 'wait_old', '\\x${OLD.toString("hex")}', '${sha256(OLD)}', ${T0 - DAY}, 'received', 0, ${T0 - DAY}, NULL);`;

describe("upgrading a PostgreSQL inbox to bodies apart", { skip: pgSkip }, () => {
  it("reads, claims, replays and purges the rows main stored, and keeps new bodies in delivery_bodies", async () => {
    const schema = await freshSchema("bodies");
    try {
      const past = await pastSchema("postgres", schema.schema, BEFORE);
      await past.exec(rows);
      await past.close();

      let t = T0;
      const inbox = await connect(schema.url, { now: () => t, random: () => 0 });
      try {
        // The old rows read as they did, through the view, their bodies still inline.
        assert.deepEqual((await inbox.find("kept_old"))[0]!.body, OLD);
        const [{ n }] = (await inbox.query("SELECT count(*) AS n FROM delivery_bodies")) as [{ n: string }];
        assert.equal(Number(n), 0, "the upgrade moved no body: it is a rename and a view");

        // A new delivery's body goes to its own table; its row carries an empty one (the control: an
        // old row's body is inline, so the two layouts are told apart here).
        const NEW = Buffer.from(
          JSON.stringify({ customer: "Bo", amount: 7, note: "x".repeat(DEFAULTS.inlineBodyBytes) }),
        );
        assert.equal(await inbox.store({ id: "new_1", body: NEW }), "stored");
        const [raw] = await inbox.query(
          "SELECT r.body AS inline, b.body AS apart FROM delivery_rows r LEFT JOIN delivery_bodies b USING (source, id, route, received_at) WHERE id = ?",
          "new_1",
        );
        assert.deepEqual([Buffer.from(raw!.inline as Uint8Array).length, raw!.apart], [0, NEW]);
        const [old] = await inbox.query("SELECT body FROM delivery_rows WHERE id = ?", "kept_old");
        assert.deepEqual(Buffer.from(old!.body as Uint8Array), OLD);
        // A body up to DEFAULTS.inlineBodyBytes stays in its row, as cheap to copy as the row itself.
        const SMALL = Buffer.from('{"customer":"Cy","amount":1}');
        assert.equal(await inbox.store({ id: "small_1", body: SMALL }), "stored");
        const [small] = await inbox.query(
          "SELECT r.body AS inline, b.body AS apart FROM delivery_rows r LEFT JOIN delivery_bodies b USING (source, id, route, received_at) WHERE id = ?",
          "small_1",
        );
        assert.deepEqual([Buffer.from(small!.inline as Uint8Array), small!.apart], [SMALL, null]);

        // Claims hand over either kind of body.
        const leases = await inbox.claimBatch(10, 60_000);
        assert.deepEqual(
          new Map(leases.map((l) => [l.id, Buffer.from(l.body).toString()])),
          new Map([
            ["wait_old", OLD.toString()],
            ["new_1", NEW.toString()],
            ["small_1", SMALL.toString()],
          ]),
        );
        for (const lease of leases) assert.equal(await inbox.finish(lease), true);

        // A duplicate of an old row and of a new one; a replay of an old one brings its body back to work.
        assert.equal(await inbox.store({ id: "kept_old", body: OLD }), "duplicate");
        assert.equal(await inbox.store({ id: "new_1", body: OLD }), "conflict");
        assert.equal((await inbox.replayMatching({ id: "kept_old" })).replayed, 1);
        const again = (await inbox.claim(60_000))!;
        assert.deepEqual([again.id, Buffer.from(again.body)], ["kept_old", OLD]);
        assert.equal(await inbox.finish(again), true);

        // Retention drops either kind: the old inline body and the new row's own, and the IDs stay duplicates.
        t = T0 + 1_000;
        const purged = await inbox.purge({ bodiesAfterMs: 1, forgetAfterMs: 100 * DAY });
        assert.equal(purged.bodies, 5);
        assert.equal(purged.bytes, 3 * OLD.length + NEW.length + SMALL.length);
        const [left] = await inbox.query("SELECT count(*) AS n FROM delivery_bodies");
        assert.equal(Number(left!.n), 0);
        for (const id of ["done_old", "new_1", "small_1"]) {
          const [row] = await inbox.find(id);
          assert.deepEqual([row!.body.length, row!.purgedAt], [0, t]);
          assert.equal(await inbox.store({ id, body: OLD }), id === "done_old" ? "duplicate" : "conflict");
        }
      } finally {
        await inbox.close();
      }
    } finally {
      await schema.drop();
    }
  });

  it("upgrades to a view and delivery_body() that read a body in its row, or a tombstone's, without looking it up apart", async () => {
    const schema = await freshSchema("bodies_inline");
    // The schema before the migration that stopped the lookup, whatever comes after it.
    const INLINE = MIGRATIONS.findIndex((m) => m.includes("CREATE OR REPLACE FUNCTION delivery_body"));
    assert.ok(INLINE > MIGRATIONS.findIndex((m) => m.includes("CREATE TABLE delivery_bodies")));
    const LARGE = Buffer.from(JSON.stringify({ pad: "x".repeat(DEFAULTS.inlineBodyBytes) }));
    const hex = (b: Buffer) => `'\\x${b.toString("hex")}'`;
    const probes = await bodyProbes(schema.url);
    try {
      const past = await pastSchema("postgres", schema.schema, MIGRATIONS.slice(0, INLINE));
      // A body in its row, one apart, and a tombstone whose body's row waits for its day's release.
      await past.exec(`
        INSERT INTO delivery_rows (source, id, body, body_sha256, received_at, status, attempts, available_at, finished_at, purged_at)
        VALUES ('default', 'small', ${hex(OLD)}, '${sha256(OLD)}', ${T0}, 'done', 1, ${T0}, ${T0}, NULL),
               ('default', 'large', '\\x', '${sha256(LARGE)}', ${T0}, 'done', 1, ${T0}, ${T0}, NULL),
               ('default', 'gone', '\\x', '${sha256(LARGE)}', ${T0}, 'done', 1, ${T0}, ${T0}, ${T0 + DAY});
        INSERT INTO delivery_bodies (source, id, route, received_at, body)
        VALUES ('default', 'large', 0, ${T0}, ${hex(LARGE)}), ('default', 'gone', 0, ${T0}, ${hex(LARGE)});`);
      await past.close();
      const view = "SELECT body FROM deliveries WHERE source = 'default' AND id = $1";
      const fn = `SELECT delivery_body(source, id, route, received_at, body) AS body FROM delivery_rows
                   WHERE source = 'default' AND id = $1`;
      // The control: before the upgrade, reads of a body in its row, or of a tombstone, looked it up apart too.
      assert.deepEqual(
        [await probes.probes(view, "small"), await probes.probes(fn, "small"), await probes.probes(view, "gone")],
        [1, 1, 1],
      );

      const inbox = await connect(schema.url, { now: () => T0 + DAY });
      try {
        assert.deepEqual(
          [await probes.probes(view, "small"), await probes.probes(fn, "small"), await probes.probes(view, "gone")],
          [0, 0, 0],
        );
        assert.deepEqual([await probes.probes(view, "large"), await probes.probes(fn, "large")], [1, 1]);
        const read = async (id: string) => Buffer.from((await inbox.find(id))[0]!.body);
        assert.deepEqual([await read("small"), await read("large"), await read("gone")], [OLD, LARGE, Buffer.alloc(0)]);
      } finally {
        await inbox.close();
      }
    } finally {
      await probes.close();
      await schema.drop();
    }
  });

  it("keeps the view writable for SQL written against the table: an insert, an update of the body, a delete", async () => {
    const schema = await freshSchema("bodies_sql");
    try {
      const inbox = await connect(schema.url, { now: () => T0 });
      try {
        const body = Buffer.from("abc");
        await inbox.query(
          `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
           VALUES ('default', 'sql_1', ?, ?, ?, 'received', ?)`,
          body,
          sha256(body),
          T0,
          T0,
        );
        assert.deepEqual((await inbox.find("sql_1"))[0]!.body, body);
        assert.equal((await inbox.find("sql_1"))[0]!.attempts, 0, "a column left out takes the table's default");
        await inbox.query("UPDATE deliveries SET body = ?, status = 'done' WHERE id = 'sql_1'", Buffer.from("xyz"));
        const [row] = await inbox.find("sql_1");
        assert.deepEqual([row!.body.toString(), row!.status], ["xyz", "done"]);
        await inbox.query("DELETE FROM deliveries WHERE id = 'sql_1'");
        assert.deepEqual(await inbox.find("sql_1"), []);
        const [left] = await inbox.query("SELECT count(*) AS n FROM delivery_bodies");
        assert.equal(Number(left!.n), 0);
      } finally {
        await inbox.close();
      }
    } finally {
      await schema.drop();
    }
  });
});
