// test/search-walk.test.ts: SQLite's walk of a body search with many matches (lib/sqlite/searchwalk.ts), a
// window of the time index at a time, each asking FTS5 for the matches between its rows' least and greatest
// rowid. Windows of a few entries here, where an inbox's are 20,000, so that a page takes many of them and the
// rest after them. Its pages must be the sorted page's, newest first, each row once: with rows stored out of
// their time's order (a clock stepped back, an import of older deliveries), with ties on the time, with the
// rest of the filter and its bounds. PostgreSQL's walk is held to the same by test/contract-search.test.ts.
//   node --test test/search-walk.test.ts

import assert from "node:assert/strict";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { registerSearch } from "../lib/sqlite/schema.ts";
import { searchWalkAt, type Windows, walkedPage } from "../lib/sqlite/searchwalk.ts";
import { filterSql } from "../lib/sql.ts";
import type { Delivery, Filter } from "../lib/store.ts";
import { tempDir } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const MIN = 60_000;
const CUSTOMER = '{"data":{"object":{"customer":"cus_many"}}}';

describe("SQLite's walk of a body search with many matches, a window at a time", () => {
  it("pages as the sorted page does, each row once, whatever order the rows were stored in", async () => {
    const { dir, cleanup } = tempDir();
    const path = join(dir, "walk.db");
    type Kept = { receivedAt: number; source: string; id: string; route: number; matches: boolean };
    const kept: Kept[] = [];
    let t = T0;
    const inbox = await connect(path, { now: () => t });
    try {
      await inbox.enableSearch();
      const store = async (i: number, at: number) => {
        t = at;
        const source = i % 2 === 0 ? "stripe" : "shop";
        const matches = i % 3 !== 2;
        const body = { id: `evt_${i}`, data: { object: { customer: matches ? "cus_many" : "cus_other" } } };
        // Every tenth to two destinations: two rows, two routes, one time, source and ID.
        const destinations = i % 10 === 0 ? ["handler", "audit"] : ["handler"];
        await inbox.store({ source, id: `evt_${i}`, body: Buffer.from(JSON.stringify(body)), destinations });
        for (const route of destinations.keys()) kept.push({ receivedAt: at, source, id: `evt_${i}`, route, matches });
      };
      // In order, some three to a millisecond; then a clock stepped back an hour; then an import of older ones:
      // each later rowid an earlier time.
      for (let i = 0; i < 90; i++) await store(i, T0 + Math.floor(i / 3) * 3 * MIN);
      for (let i = 90; i < 120; i++) await store(i, T0 + 90 * MIN - 60 * MIN + (i - 90) * MIN);
      for (let i = 120; i < 150; i++) await store(i, T0 - 1_000 * MIN + (i - 120) * 7 * MIN);
      // The index caught up, as a search does first.
      assert.equal((await inbox.search({ bodyJson: CUSTOMER }, { limit: 1 })).length, 1);
    } finally {
      await inbox.close();
    }

    const db = new DatabaseSync(path);
    registerSearch(db);
    const sql = (text: string) => db.prepare(text);
    try {
      const order = (a: Kept, b: Kept) =>
        b.receivedAt - a.receivedAt ||
        (a.source < b.source ? 1 : -1) * (a.source === b.source ? 0 : 1) ||
        (a.id < b.id ? 1 : -1);
      const expected = (keep: (k: Kept) => boolean) =>
        kept
          .filter((k) => k.matches && keep(k))
          .sort(order)
          .map((k) => `${k.id}/${k.route}`);
      const rows = kept.length;
      assert.ok(expected(() => true).length >= searchWalkAt(rows), "enough matches to walk");
      // The control: the fixture's rowids are not in its time's order, so a walk by rowid alone would misorder it.
      const byRowid = (
        sql(
          "SELECT id, route FROM deliveries WHERE rowid IN (SELECT rowid FROM deliveries_search WHERE deliveries_search MATCH '\"cus_many\"') ORDER BY rowid DESC",
        ).all() as { id: string; route: number }[]
      ).map((r) => `${r.id}/${r.route}`);
      assert.notDeepEqual(
        byRowid,
        expected(() => true),
        "(control) rowids out of the time's order",
      );

      const pages = (filter: Filter, limit: number, windows: Windows) => {
        const all: string[] = [];
        const checked = filterSql(filter, "sqlite");
        assert.ok(checked.walked);
        for (let after: Delivery | undefined, k = 0; k < 200; k++) {
          const page = walkedPage(
            sql,
            { ...checked, walked: checked.walked },
            filter,
            {
              limit,
              ...(after && {
                after: { receivedAt: after.receivedAt, source: after.source, id: after.id, route: after.route },
              }),
            },
            windows,
          );
          all.push(...page.map((d) => `${d.id}/${d.route}`));
          if (page.length < limit) break;
          after = page.at(-1);
        }
        return all;
      };
      const since = T0 - 500 * MIN;
      const until = T0 + 45 * MIN;
      for (const windows of [{ first: 1, most: 1_000 }, { first: 3 }, { first: 5, most: 2 }, {}]) {
        const what = JSON.stringify(windows);
        for (const limit of [7, 50]) {
          assert.deepEqual(
            pages({ bodyJson: CUSTOMER }, limit, windows),
            expected(() => true),
            `${what} JSON ${limit}`,
          );
          assert.deepEqual(
            pages({ bodyWords: "cus_many" }, limit, windows),
            expected(() => true),
            `${what} words ${limit}`,
          );
        }
        assert.deepEqual(
          pages({ bodyJson: CUSTOMER, source: "stripe" }, 5, windows),
          expected((k) => k.source === "stripe"),
          `${what} with a source`,
        );
        assert.deepEqual(
          pages({ bodyJson: CUSTOMER, bodyWords: "cus_many", since, until }, 6, windows),
          expected((k) => k.receivedAt >= since && k.receivedAt < until),
          `${what} both forms, since and until`,
        );
      }
    } finally {
      db.close();
      cleanup();
    }
  });
});
