// test/migrate-dated.test.ts: a PostgreSQL inbox whose search index today's main filled upgrades in place to one
// that holds each indexed row's hour and day beside its JSON and its words (docs/performance.md#the-newest-matches-first). The
// rows it had indexed keep none, search_state.dated_since says from when every row has them, and a search with
// many matches, by JSON or by words, walks the new rows by their periods back to that time, then finds the old
// ones, newest first, each once. SQLite's search keeps no periods, so it has nothing to upgrade.
//   node --test test/migrate-dated.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { MIGRATIONS } from "../lib/postgres/schema.ts";
import type { Delivery, Filter, Inbox } from "../lib/store.ts";
import { freshSchema, PG_SEARCH_ON, pastSchema, postgresSkip } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const HOUR = 3_600_000;
const pgSkip = await postgresSkip();
// The schema as today's main leaves it: every migration before the one that dates the search rows.
const BEFORE = MIGRATIONS.slice(
  0,
  MIGRATIONS.findIndex((m) => m.includes("ADD COLUMN periods")),
);
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
