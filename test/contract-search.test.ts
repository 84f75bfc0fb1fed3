// test/contract-search.test.ts: searching bodies through an index, on both backends (test/contract-harness.ts):
// bodyJson (the body contains this JSON, as jsonb @> says) and bodyWords (its values hold these words), in
// search(), count() and a bulk retry; a body that is not JSON, or past DEFAULTS.searchBodyBytes, found by its ID
// and bodyContains alone; a dropped body leaving the index; and a form that cannot narrow refused. The index is
// opt-in: off, a store writes nothing to it and the forms refuse (SearchOff) while bodyContains answers;
// enableSearch() indexes the rows stored before in batches, and carries on after an interruption; disableSearch()
// empties it. On, it is kept after the ack: a store writes nothing to it, indexSearch() (the worker's tick) and a
// search's own catch-up index what was stored since, a body dropped before it was indexed is never found, and on
// PostgreSQL a store that commits after a later one is not skipped. On PostgreSQL a body search that runs past
// its bound (searchTimeoutMs) fails with SearchTooBroad, and leaves the session's statement_timeout as it was.
//   npx node --test test/contract-search.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DEFAULTS } from "../lib/defaults.ts";
import { passing } from "../lib/errors.ts";
import { periodOf } from "../lib/postgres/periods.ts";
import { SearchOff, SearchTooBroad } from "../lib/search.ts";
import { filterSql, searchSql } from "../lib/sql.ts";
import { toPg } from "../lib/postgres/commit.ts";
import { searchSettings } from "../lib/postgres/searching.ts";
import { connect } from "../inbox.ts";
import type { Delivery, Filter, Inbox, InboxOptions, SqlValue } from "../lib/store.ts";
import { run } from "../worker.ts";
import { body, contract, LEASE, T0, daysOpened } from "./contract-harness.ts";

const DAY = 86_400_000;

// Shaped as Stripe and GitHub send them, cut down.
const invoice = (id: string, customer: string, amount: number, paid: boolean) => ({
  id,
  object: "event",
  type: "invoice.paid",
  livemode: false,
  data: { object: { id: `in_${id}`, customer, amount_paid: amount, paid, lines: { data: [{ price: "price_gold" }] } } },
});
const push = (id: string, repo: string, message: string) => ({
  ref: "refs/heads/main",
  repository: { full_name: repo, private: false },
  commits: [{ id, message, author: { name: "Mona Lisa", email: "mona@example.com" } }],
});

contract((suite) => {
  // The index's own tests below open inboxes as they come (off); the forms' tests turn it on first, so their
  // rows are indexed as each search catches up.
  const open = async (options?: InboxOptions) => {
    const inbox = await suite.open(options);
    await inbox.enableSearch();
    return inbox;
  };
  const ids = (ds: Delivery[]) => ds.map((d) => d.id);

  // seed stores, a second apart: three Stripe invoices, two GitHub pushes, a body that is not JSON and one past the size.
  const seed = async (inbox: Inbox) => {
    const rows: [string, string, Buffer][] = [
      ["stripe", "evt_1", body(invoice("evt_1", "cus_123", 4200, true))],
      ["stripe", "evt_2", body(invoice("evt_2", "cus_456", 990, false))],
      ["github", "gh_1", body(push("c0ffee", "octo/webhooks", "Fix the flaky retry test"))],
      ["stripe", "evt_3", body(invoice("evt_3", "cus_123", 990, true))],
      ["github", "gh_2", body(push("bead", "octo/inbox", "Search bodies through an index"))],
      ["form", "f_1", Buffer.from("customer=cus_123&amount=4200")],
      [
        "stripe",
        "big_1",
        body({ ...invoice("big_1", "cus_123", 4200, true), padding: "x".repeat(DEFAULTS.searchBodyBytes) }),
      ],
    ];
    for (const [source, id, b] of rows) {
      await inbox.store({ source, id, body: b });
      suite.t += 1_000;
    }
  };
  const expect = async (inbox: Inbox, filter: Filter, expected: string[]) => {
    assert.deepEqual(ids(await inbox.search(filter)), expected, JSON.stringify(filter));
    assert.equal(await inbox.count(filter), expected.length, JSON.stringify(filter));
  };

  describe("bodyJson", () => {
    it("finds the bodies that contain the document, at any depth and through arrays, newest first", async () => {
      const inbox = await open();
      await seed(inbox);
      await expect(inbox, { bodyJson: '{"data":{"object":{"customer":"cus_123"}}}' }, ["evt_3", "evt_1"]);
      await expect(inbox, { bodyJson: '{"data":{"object":{"customer":"cus_123","amount_paid":4200}}}' }, ["evt_1"]);
      await expect(inbox, { bodyJson: '{"data":{"object":{"paid":false}}}' }, ["evt_2"]);
      await expect(inbox, { bodyJson: '{"data":{"object":{"lines":{"data":[{"price":"price_gold"}]}}}}' }, [
        "evt_3",
        "evt_2",
        "evt_1",
      ]);
      await expect(inbox, { bodyJson: '{"commits":[{"author":{"name":"Mona Lisa"}}]}' }, ["gh_2", "gh_1"]);
      await expect(inbox, { bodyJson: '{"repository":{"full_name":"octo/inbox"}}', source: "github" }, ["gh_2"]);
    });

    it("matches the value at its path only, and the whole value, not a part of it", async () => {
      const inbox = await open();
      await seed(inbox);
      // cus_123 is there, but under data.object, not at the top; and "cus" is only part of a value.
      await expect(inbox, { bodyJson: '{"customer":"cus_123"}' }, []);
      await expect(inbox, { bodyJson: '{"data":{"object":{"customer":"cus"}}}' }, []);
      await expect(inbox, { bodyJson: '{"data":{"object":{"customer":"cus_123","paid":false}}}' }, []);
      // The control: the same needles, where they are, match.
      await expect(inbox, { bodyJson: '{"data":{"object":{"customer":"cus_456","paid":false}}}' }, ["evt_2"]);
    });

    it("never finds a body that is not JSON or is past the size, which its ID and bodyContains still find", async () => {
      const inbox = await open();
      await seed(inbox);
      await expect(inbox, { bodyJson: '{"data":{"object":{"customer":"cus_123"}}}', source: "stripe" }, [
        "evt_3",
        "evt_1",
      ]);
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_3", "evt_1"]);
      await expect(inbox, { bodyContains: "cus_123" }, ["big_1", "f_1", "evt_3", "evt_1"]);
      await expect(inbox, { id: "big_1" }, ["big_1"]);
      await expect(inbox, { id: "f_1" }, ["f_1"]);
    });

    it("refuses a document that is not an object or an array, or holds nothing to look up", async () => {
      const inbox = await open();
      for (const bodyJson of ['"cus_123"', "{not json", "{}", '{"data":{"object":{"customer":null}}}', '{"a":"--"}']) {
        await assert.rejects(inbox.search({ bodyJson }), TypeError, bodyJson);
        await assert.rejects(inbox.count({ bodyJson }), TypeError, bodyJson);
      }
    });
  });

  describe("a page at a time", () => {
    // On PostgreSQL a page of a body search walks its matches' keys newest first and reads each one's row with
    // the rest of the filter until the page is full (searchSql()); pages of two must add up to the whole search.
    it("pages through the matches newest first, each once, with the rest of the filter and both forms", async () => {
      const inbox = await open();
      for (let i = 0; i < 9; i++) {
        await inbox.store({
          source: i % 3 === 0 ? "shop" : "stripe",
          id: `evt_${i}`,
          body: body(invoice(`evt_${i}`, i % 2 === 0 ? "cus_123" : "cus_456", 100 * i, true)),
        });
        // Two of them at the same time: the cursor's source and ID then tell them apart.
        if (i !== 4) suite.t += 1_000;
      }
      const pages = async (filter: Filter) => {
        const all: string[] = [];
        for (let after: Delivery | undefined, n = 0; n < 10; n++) {
          const page = await inbox.search(filter, {
            limit: 2,
            ...(after && {
              after: { receivedAt: after.receivedAt, source: after.source, id: after.id, route: after.route },
            }),
          });
          all.push(...ids(page));
          if (page.length < 2) break;
          after = page.at(-1);
        }
        return all;
      };
      const customer = '{"data":{"object":{"customer":"cus_123"}}}';
      for (const [filter, expected] of [
        [{ bodyJson: customer }, ["evt_8", "evt_6", "evt_4", "evt_2", "evt_0"]],
        [{ bodyJson: customer, source: "stripe" }, ["evt_8", "evt_4", "evt_2"]],
        [{ bodyWords: "cus_456" }, ["evt_7", "evt_5", "evt_3", "evt_1"]],
        [{ bodyJson: customer, bodyWords: "invoice.paid 400" }, ["evt_4"]],
        [{ bodyJson: customer, since: T0 + 4_000 }, ["evt_8", "evt_6", "evt_4"]],
      ] as [Filter, string[]][]) {
        assert.deepEqual(ids(await inbox.search(filter)), expected, JSON.stringify(filter));
        assert.deepEqual(await pages(filter), expected, `by pages of two: ${JSON.stringify(filter)}`);
      }
    });
  });

  describe("a containment with many matches", () => {
    // Past DEFAULTS.searchWalkAbove matches, PostgreSQL walks a body search's page back from its newest hour, a
    // window of hours or days a statement, then asks for the rest (lib/postgres/searchwalk.ts); SQLite walks its
    // time index against every match, its windows being larger than this inbox (test/search-walk.test.ts walks
    // windows of a few rows). Received over two months, closer together towards the newest, so that every window holds
    // some and some are older than all of them; every third delivery matches nothing.
    it("pages from the newest back past every window, each once, by JSON and by words, alone and with the rest of the filter", async () => {
      const inbox = await open();
      const n = Math.ceil(DEFAULTS.searchWalkAbove * 1.5) + 60;
      const start = suite.t;
      const matching: Delivery["id"][] = [];
      const stripe: Delivery["id"][] = [];
      for (let i = 0; i < n; i++) {
        suite.t = start + 60 * DAY - Math.round(60 * DAY * ((n - 1 - i) / (n - 1)) ** 3);
        const source = i % 2 === 0 ? "stripe" : "shop";
        const customer = i % 3 === 2 ? "cus_other" : "cus_many";
        await inbox.store({ source, id: `evt_${i}`, body: body(invoice(`evt_${i}`, customer, i, true)) });
        if (customer === "cus_many") {
          matching.unshift(`evt_${i}`);
          if (source === "stripe") stripe.unshift(`evt_${i}`);
        }
      }
      assert.ok(matching.length > DEFAULTS.searchWalkAbove);
      const pages = async (filter: Filter, limit: number) => {
        const all: string[] = [];
        for (let after: Delivery | undefined, k = 0; k < 100; k++) {
          const page = await inbox.search(filter, {
            limit,
            ...(after && {
              after: { receivedAt: after.receivedAt, source: after.source, id: after.id, route: after.route },
            }),
          });
          all.push(...ids(page));
          if (page.length < limit) break;
          after = page.at(-1);
        }
        return all;
      };
      const customer = '{"data":{"object":{"customer":"cus_many"}}}';
      assert.deepEqual(await pages({ bodyJson: customer }, 50), matching);
      assert.deepEqual(await pages({ bodyJson: customer }, 7), matching);
      assert.deepEqual(await pages({ bodyJson: customer, source: "stripe" }, 20), stripe);
      assert.deepEqual(await pages({ bodyJson: customer, bodyWords: "invoice.paid" }, 50), matching);
      assert.equal(await inbox.count({ bodyJson: customer }), matching.length);
      assert.deepEqual(await pages({ bodyWords: "cus_many" }, 50), matching);
      assert.deepEqual(await pages({ bodyWords: "cus_many", source: "stripe" }, 20), stripe);
      assert.equal(await inbox.count({ bodyWords: "cus_many" }), matching.length);
      // Three days on, with nothing received since: the walk finds its newest row beyond the last day.
      suite.t += 3 * DAY;
      assert.deepEqual(await pages({ bodyJson: customer }, 50), matching);
    });
  });

  describe("bodyWords", () => {
    it("finds the bodies whose values hold every word, in any case, a word of parts as a phrase", async () => {
      const inbox = await open();
      await seed(inbox);
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_3", "evt_1"]);
      await expect(inbox, { bodyWords: "CUS_123 4200" }, ["evt_1"]);
      await expect(inbox, { bodyWords: "flaky" }, ["gh_1"]);
      await expect(inbox, { bodyWords: "mona lisa" }, ["gh_2", "gh_1"]);
      await expect(inbox, { bodyWords: "index search" }, ["gh_2"]);
      await expect(inbox, { bodyWords: "true" }, ["evt_3", "evt_1"]);
      await expect(inbox, { bodyWords: "octo/webhooks" }, ["gh_1"]);
      // Every word must be there; a key is not a value; a word is whole, not a prefix.
      await expect(inbox, { bodyWords: "flaky index" }, []);
      await expect(inbox, { bodyWords: "commits" }, []);
      await expect(inbox, { bodyWords: "flak" }, []);
    });

    it("refuses words with neither a letter nor a digit", async () => {
      const inbox = await open();
      await assert.rejects(inbox.search({ bodyWords: " -- / " }), TypeError);
      await assert.rejects(inbox.search({ bodyWords: "" }), TypeError);
    });
  });

  describe("on PostgreSQL's history by day", () => {
    // The history is a partition a day (docs/table.md#hot-and-cold): a match is probed in its own day's alone,
    // found through delivery_keys, where probing every day's for every match made a search ×36 at ten million.
    suite.onPostgres("probes each match in its own day's partition, for bodyJson and bodyWords alike", async () => {
      const inbox = await open();
      const DAY = 86_400_000;
      for (const k of [0, 1, 2, 3]) {
        suite.t = T0 + k * DAY;
        await inbox.store({ source: "stripe", id: `evt_${k}`, body: body(invoice(`evt_${k}`, `cus_${k}`, 100, true)) });
        await inbox.store({ source: "github", id: `gh_${k}`, body: body(push(`c${k}`, "octo/inbox", `day ${k}`)) });
        for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      }
      // evt_1's second route, done on its day too: a search finds every route of a delivery it matches.
      assert.equal((await inbox.replayMatching({ id: "evt_1" }, { to: "audit" })).replayed, 1);
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      const json = { bodyJson: '{"data":{"object":{"customer":"cus_1"}}}' };
      const words = { bodyWords: "cus_1" };
      await expect(inbox, json, ["evt_1", "evt_1"]);
      await expect(inbox, words, ["evt_1", "evt_1"]);
      const opened = (where: string, params: SqlValue[]) => daysOpened(inbox, { where, params });
      for (const filter of [json, words]) {
        const { where, params } = filterSql(filter, "postgres");
        const now = await opened(where, params);
        assert.equal(now.ran, 1, `${JSON.stringify(filter)}: one day's partition is read, evt_1's`);
        assert.ok(now.all >= 4, `the others are in the plan, pruned as it ran (${now.all})`);
      }
      // The control: the matches' sources and IDs probed as arrays, as before delivery_keys was asked, read every day's.
      const text = JSON.stringify(JSON.parse(json.bodyJson));
      const before = await opened(
        `source = ANY (ARRAY(SELECT DISTINCT source FROM deliveries_search WHERE doc @> ?::jsonb))
         AND id = ANY (ARRAY(SELECT id FROM deliveries_search WHERE doc @> ?::jsonb))
         AND (source, id) IN (SELECT source, id FROM deliveries_search WHERE doc @> ?::jsonb)`,
        [text, text, text],
      );
      assert.ok(before.ran >= 4, `without the days, each is read (${before.ran})`);
    });
  });

  describe("on PostgreSQL, how a search runs", () => {
    // A words search's estimate (thousands of rows for a phrase that matches one) took its cost past the server's
    // jit_above_cost and its parallel thresholds at ten million: 343 ms compiling, 50 ms starting workers, for a
    // page that reads 45 pages (docs/performance.md#at-ten-million-after-the-split). Here every threshold is
    // set to 0 in the transaction, so that the plain statement is compiled (the control), and searchSettings(),
    // which searchQuery() runs first, must leave it neither compiled nor with workers to run in parallel.
    suite.onPostgres(
      "compiles no index search with JIT nor runs it in parallel; a scan of bodies keeps both",
      async () => {
        const inbox = await open();
        await seed(inbox);
        await expect(inbox, { bodyWords: "cus_123" }, ["evt_3", "evt_1"]);
        const { default: pg } = await import("pg");
        const client = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
        await client.connect();
        try {
          const jit = (await client.query("SELECT pg_jit_available() AS on")).rows[0].on as boolean;
          const plan = async (filter: Filter, settings: boolean) => {
            await client.query("BEGIN");
            try {
              // In the transaction: behind a per-transaction pooler, a session's SET would reach another backend.
              await client.query("SELECT set_config('search_path', $1, true)", [
                new URL(suite.target).searchParams.get("schema"),
              ]);
              for (const name of ["jit_above_cost", "jit_inline_above_cost", "jit_optimize_above_cost"])
                await client.query(`SELECT set_config('${name}', '0', true)`);
              for (const name of [
                "parallel_setup_cost",
                "parallel_tuple_cost",
                "min_parallel_table_scan_size",
                "min_parallel_index_scan_size",
              ])
                await client.query(`SELECT set_config('${name}', '0', true)`);
              await client.query(
                "SELECT set_config('jit', 'on', true), set_config('max_parallel_workers_per_gather', '2', true)",
              );
              if (settings) await searchSettings(client, filter, 10_000);
              const { sql, params } = searchSql("postgres", filterSql(filter, "postgres"), {
                limit: 50,
                bodies: false,
              });
              const { rows } = await client.query(`EXPLAIN (ANALYZE, FORMAT JSON) ${toPg(sql)}`, params);
              const text = JSON.stringify(rows[0]["QUERY PLAN"]);
              const workers = (await client.query("SELECT current_setting('max_parallel_workers_per_gather') AS n"))
                .rows[0].n;
              return { jit: text.includes('"JIT"'), parallel: text.includes('"Gather'), workers: Number(workers) };
            } finally {
              await client.query("ROLLBACK");
            }
          };
          let parallel = 0;
          for (const filter of [{ bodyWords: "cus_123" }, { bodyJson: '{"data":{"object":{"customer":"cus_123"}}}' }]) {
            const control = await plan(filter, false);
            const what = `${JSON.stringify(filter)}: the control, every threshold 0`;
            // Compiled, and in parallel where the plan allows it: the matches are a materialized CTE (lib/search.ts
            // pgMatching), which PostgreSQL runs in the leader alone, so whether any other part of it takes workers
            // depends on the form (here the containment's does, the words' not).
            assert.deepEqual({ ...control, parallel: undefined }, { jit, parallel: undefined, workers: 2 }, what);
            if (control.parallel) parallel++;
            assert.deepEqual(
              await plan(filter, true),
              { jit: false, parallel: false, workers: 0 },
              JSON.stringify(filter),
            );
          }
          assert.ok(parallel > 0, "the control: a plan that would run in parallel, which the settings stop");
          // A scan of bodies keeps the server's JIT and workers: it reads a day of bodies (which a few rows here do not
          // need workers for).
          const contains = { bodyContains: "cus_123", since: T0 - 86_400_000 };
          const kept = await plan(contains, false);
          assert.equal(kept.jit, jit, "the control");
          assert.deepEqual(await plan(contains, true), kept);
        } finally {
          await client.end();
        }
      },
    );
  });

  describe("the index follows the body", () => {
    it("forgets a body that dropBodies() dropped, and its tombstone is still found by ID", async () => {
      const inbox = await open();
      await seed(inbox);
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      assert.equal((await inbox.dropBodies({ id: "evt_1" })).bodies, 1);
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_3"]);
      await expect(inbox, { bodyJson: '{"data":{"object":{"customer":"cus_123"}}}' }, ["evt_3"]);
      await expect(inbox, { id: "evt_1" }, ["evt_1"]);
    });

    it("indexes a body kept apart as one kept in its row (PostgreSQL keeps those past DEFAULTS.inlineBodyBytes apart), and forgets both", async () => {
      const inbox = await open();
      const small = body(invoice("evt_small", "cus_789", 1, true));
      const large = body({ ...invoice("evt_large", "cus_789", 2, true), note: "x".repeat(DEFAULTS.inlineBodyBytes) });
      // (control) the two bodies fall on either side of the limit, so both of PostgreSQL's ways are taken.
      assert.ok(small.length <= DEFAULTS.inlineBodyBytes && large.length > DEFAULTS.inlineBodyBytes);
      await inbox.store({ source: "stripe", id: "evt_small", body: small });
      suite.t += 1_000;
      await inbox.store({ source: "stripe", id: "evt_large", body: large });
      await expect(inbox, { bodyWords: "cus_789" }, ["evt_large", "evt_small"]);
      await expect(inbox, { bodyJson: '{"data":{"object":{"amount_paid":2}}}' }, ["evt_large"]);
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      assert.equal((await inbox.dropBodies({ source: "stripe" })).bodies, 2);
      await expect(inbox, { bodyWords: "cus_789" }, []);
    });

    it("follows retention: a purge's bodies leave the index; on PostgreSQL their day's partition is dropped", async () => {
      const inbox = await open();
      const day = periodOf(suite.t).name;
      await seed(inbox);
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      const partitions = async () =>
        Number((await inbox.query("SELECT (to_regclass(?::text) IS NOT NULL)::integer AS n", day))[0]!.n);
      // (control) before the purge the bodies are found, and on PostgreSQL their day is a partition.
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_3", "evt_1"]);
      if (suite.backend.name === "postgres") assert.equal(await partitions(), 1);
      suite.t += 3 * 86_400_000;
      assert.equal((await inbox.purge({ bodiesAfterMs: 86_400_000, rest: 0 })).bodies, 7);
      if (suite.backend.name === "postgres") assert.equal(await partitions(), 0, "the day was dropped whole");
      assert.equal(Number((await inbox.query("SELECT count(*) AS n FROM deliveries_search"))[0]!.n), 0);
      await expect(inbox, { bodyWords: "cus_123" }, []);
      await expect(inbox, { id: "evt_1" }, ["evt_1"]);
      // A body stored after the purge is indexed as before.
      await inbox.store({ source: "stripe", id: "evt_4", body: body(invoice("evt_4", "cus_123", 1, true)) });
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_4"]);
    });

    it("retries by bodyJson the failed deliveries that match, and no other", async () => {
      const inbox = await open({ maxAttempts: 1 });
      await seed(inbox);
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.fail(lease, "HTTP 500", { permanent: true });
      const filter: Filter = { status: "failed", bodyJson: '{"data":{"object":{"customer":"cus_123"}}}' };
      assert.equal(await inbox.retryMatching(filter, { dryRun: true }), 2);
      assert.equal(await inbox.retryMatching(filter), 2);
      await expect(inbox, { status: "received" }, ["evt_3", "evt_1"]);
      await expect(inbox, { status: "failed", bodyWords: "cus_123" }, []);
    });
  });
  describe("the index is opt-in", () => {
    const cus123 = '{"data":{"object":{"customer":"cus_123"}}}';
    const rowsIndexed = async (inbox: Inbox) =>
      Number((await inbox.query("SELECT count(*) AS n FROM deliveries_search"))[0]!.n);

    it("is off in a new inbox: a store writes no search row, the forms refuse naming the command, bodyContains answers", async () => {
      const inbox = await suite.open();
      await seed(inbox);
      assert.deepEqual(await inbox.searchStatus(), {
        enabled: false,
        backfilled: 0,
        toBackfill: 0,
        ready: false,
        changedAt: null,
        pending: 0,
      });
      assert.equal(await inbox.indexSearch(), 0);
      assert.equal(await rowsIndexed(inbox), 0);
      for (const filter of [{ bodyJson: cus123 }, { bodyWords: "cus_123" }] as Filter[]) {
        await assert.rejects(
          inbox.search(filter),
          (e: Error) => e instanceof SearchOff && /search enable/.test(e.message),
        );
        await assert.rejects(inbox.count(filter), SearchOff);
        await assert.rejects(inbox.retryMatching({ ...filter, status: "failed" }), SearchOff);
      }
      // A form that cannot narrow is still the caller's mistake first.
      await assert.rejects(inbox.search({ bodyJson: "{}" }), TypeError);
      await expect(inbox, { bodyContains: "cus_123" }, ["big_1", "f_1", "evt_3", "evt_1"]);
      // The control: on, the same inbox answers, so the refusal above was the switch's.
      await inbox.enableSearch();
      await expect(inbox, { bodyJson: cus123 }, ["evt_3", "evt_1"]);
    });

    it("enable indexes the rows stored before, a batch at a time, then every row stored after; one audit entry", async () => {
      const inbox = await suite.open();
      await seed(inbox);
      const seen: number[] = [];
      const audit = { who: "cli:test", operation: "search enable", target: "search index" };
      const status = await inbox.enableSearch({ batch: 2, audit, onBatch: (s) => seen.push(s.backfilled) });
      assert.deepEqual(seen, [2, 4, 6, 7]);
      assert.deepEqual(status, {
        enabled: true,
        backfilled: 7,
        toBackfill: 7,
        ready: true,
        changedAt: suite.t,
        pending: 0,
      });
      // Five bodies are JSON within the size; the form's and the big one's are not indexed.
      assert.equal(await rowsIndexed(inbox), 5);
      await expect(inbox, { bodyJson: cus123 }, ["evt_3", "evt_1"]);
      await expect(inbox, { bodyWords: "flaky" }, ["gh_1"]);
      await inbox.store({ source: "stripe", id: "evt_4", body: body(invoice("evt_4", "cus_123", 1, true)) });
      suite.t += 1_000;
      await expect(inbox, { bodyJson: cus123 }, ["evt_4", "evt_3", "evt_1"]);
      const [entry] = await inbox.auditLog({ limit: 10 });
      assert.equal(entry?.operation, "search enable");
      assert.equal(entry?.count, 5);
      // Again: nothing to do, the rows are not indexed twice.
      assert.equal((await inbox.enableSearch()).ready, true);
      assert.equal(await rowsIndexed(inbox), 6);
    });

    it("an interrupted enable leaves the forms refusing until enable carries on where it stopped", async () => {
      const inbox = await suite.open();
      await seed(inbox);
      await assert.rejects(
        inbox.enableSearch({
          batch: 2,
          onBatch: () => {
            throw new Error("stopped");
          },
        }),
        /stopped/,
      );
      const half = await inbox.searchStatus();
      assert.deepEqual([half.enabled, half.ready, half.backfilled], [true, false, 2]);
      await assert.rejects(inbox.search({ bodyWords: "cus_123" }), /not ready.*2 of 7/);
      // A row stored meanwhile is indexed too (SQLite: it is past the place; PostgreSQL: in the queue), and found
      // once the backfill is done.
      await inbox.store({ source: "stripe", id: "evt_4", body: body(invoice("evt_4", "cus_123", 1, true)) });
      suite.t += 1_000;
      const seen: number[] = [];
      await inbox.enableSearch({ batch: 2, onBatch: (s) => seen.push(s.backfilled) });
      // PostgreSQL walks the primary key, so it reads evt_4 too (and may end on an empty batch); SQLite stops at
      // the last rowid stored before enable.
      assert.deepEqual(seen.slice(0, 2), [4, 6]);
      assert.ok(seen.at(-1)! >= 7, String(seen));
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_4", "evt_3", "evt_1"]);
    });

    it("disable drops the triggers and empties the index; enable again indexes everything", async () => {
      const inbox = await open();
      await seed(inbox);
      assert.equal(await inbox.indexSearch(), 7);
      assert.equal(await rowsIndexed(inbox), 5);
      const audit = { who: "cli:test", operation: "search disable", target: "search index" };
      assert.equal(await inbox.disableSearch(audit), true);
      assert.equal(await rowsIndexed(inbox), 0);
      assert.equal((await inbox.searchStatus()).enabled, false);
      await assert.rejects(inbox.search({ bodyJson: cus123 }), SearchOff);
      await inbox.store({ source: "stripe", id: "evt_4", body: body(invoice("evt_4", "cus_123", 1, true)) });
      suite.t += 1_000;
      assert.equal(await inbox.indexSearch(), 0);
      assert.equal(await rowsIndexed(inbox), 0, "no trigger left, nothing queued");
      assert.equal(await inbox.disableSearch(), false);
      assert.equal((await inbox.auditLog({ limit: 1 }))[0]?.operation, "search disable");
      await inbox.enableSearch();
      await expect(inbox, { bodyJson: cus123 }, ["evt_4", "evt_3", "evt_1"]);
    });
  });

  describe("the index follows the ack", () => {
    const rowsIndexed = async (inbox: Inbox) =>
      Number((await inbox.query("SELECT count(*) AS n FROM deliveries_search"))[0]!.n);
    const invoiceOf = (id: string) => body(invoice(id, "cus_123", 1, true));

    it("a store writes nothing to the index; a search catches up first and finds it, with no worker running", async () => {
      const inbox = await open();
      await inbox.store({ source: "stripe", id: "evt_1", body: invoiceOf("evt_1") });
      // (control) the ack did not wait for the index: the row is stored, not yet indexed.
      assert.equal(await rowsIndexed(inbox), 0);
      assert.equal((await inbox.searchStatus()).pending, 1);
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_1"]);
      assert.equal(await rowsIndexed(inbox), 1);
      assert.equal((await inbox.searchStatus()).pending, 0);
      await inbox.store({ source: "stripe", id: "evt_2", body: invoiceOf("evt_2") });
      suite.t += 1_000;
      assert.equal(await inbox.count({ bodyJson: '{"data":{"object":{"customer":"cus_123"}}}' }), 2);
    });

    it("indexSearch() takes the oldest rows a batch at a time, and says when none is left", async () => {
      const inbox = await open();
      await seed(inbox);
      assert.equal((await inbox.searchStatus()).pending, 7);
      assert.deepEqual([await inbox.indexSearch(3), await inbox.indexSearch(3), await inbox.indexSearch(3)], [3, 3, 1]);
      assert.equal(await inbox.indexSearch(3), 0);
      // Five of the seven are JSON within the size.
      assert.equal(await rowsIndexed(inbox), 5);
      assert.equal((await inbox.searchStatus()).pending, 0);
    });

    it("the worker's tick indexes what was stored, before anyone searches", async () => {
      const inbox = await open();
      await seed(inbox);
      assert.equal(await rowsIndexed(inbox), 0, "(control) nothing indexed at the stores");
      await run(() => {}, { inbox, once: true, log: () => {} });
      assert.equal(await rowsIndexed(inbox), 5);
      assert.equal((await inbox.searchStatus()).pending, 0);
    });

    it("never finds a body dropped or purged before it was indexed", async () => {
      const inbox = await open();
      for (const id of ["evt_1", "evt_2", "evt_3"]) {
        await inbox.store({ source: "stripe", id, body: invoiceOf(id) });
        suite.t += 1_000;
      }
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      assert.equal((await inbox.dropBodies({ id: "evt_1" })).bodies, 1);
      assert.equal(await rowsIndexed(inbox), 0, "none was indexed yet");
      // (control) the two stored beside it are found.
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_3", "evt_2"]);
      suite.t += 3 * 86_400_000;
      await inbox.store({ source: "stripe", id: "evt_4", body: invoiceOf("evt_4") });
      assert.equal((await inbox.purge({ bodiesAfterMs: 86_400_000, rest: 0 })).bodies, 2);
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_4"]);
      assert.equal(await rowsIndexed(inbox), 1);
    });

    it("indexes a row stored after the newest row was forgotten (SQLite gives its rowid again)", async () => {
      const inbox = await open();
      await inbox.store({ source: "stripe", id: "evt_1", body: invoiceOf("evt_1") });
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_1"]);
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      const rowid = async (id: string) =>
        (await inbox.query("SELECT rowid AS r FROM deliveries WHERE id = ?", id))[0]?.r as number | undefined;
      const first = suite.backend.name === "sqlite" ? await rowid("evt_1") : undefined;
      suite.t += 3 * 86_400_000;
      await inbox.purge({ bodiesAfterMs: 86_400_000, forgetAfterMs: 2 * 86_400_000, rest: 0 });
      suite.t += 3 * 86_400_000;
      await inbox.purge({ bodiesAfterMs: 86_400_000, forgetAfterMs: 2 * 86_400_000, rest: 0 });
      assert.equal((await inbox.find("evt_1")).length, 0, "forgotten");
      await inbox.store({ source: "stripe", id: "evt_2", body: invoiceOf("evt_2") });
      // (control) on SQLite the new row has the rowid the index's place had passed: without stepping the place
      // back at the delete, the indexer would never read it.
      if (suite.backend.name === "sqlite") assert.equal(await rowid("evt_2"), first);
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_2"]);
    });

    it("keeps a delivery indexed through its done mark, a replay and a retry, queued once; forgets it with its row", async () => {
      const inbox = await open({ maxAttempts: 1 });
      await inbox.store({ source: "stripe", id: "evt_1", body: invoiceOf("evt_1") });
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_1"]);
      const pending = async () =>
        suite.backend.name === "postgres"
          ? Number((await inbox.query("SELECT count(*) AS n FROM search_pending"))[0]!.n)
          : 0;
      // On PostgreSQL each of these moves the row between partitions of delivery_rows: a DELETE and an INSERT,
      // whose row triggers must not take it out of the index nor queue it again (docs/table.md#hot-and-cold).
      assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
      assert.deepEqual([await rowsIndexed(inbox), await pending()], [1, 0], "done");
      assert.equal((await inbox.replayMatching({ id: "evt_1" })).replayed, 1);
      assert.deepEqual([await rowsIndexed(inbox), await pending()], [1, 0], "replayed");
      await inbox.fail((await inbox.claim(LEASE))!, "no", { permanent: true });
      assert.equal(await inbox.retry({ source: "stripe", id: "evt_1" }), 1);
      assert.deepEqual([await rowsIndexed(inbox), await pending()], [1, 0], "failed and retried");
      await expect(inbox, { bodyWords: "cus_123" }, ["evt_1"]);
      assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
      suite.t += 3 * 86_400_000;
      await inbox.purge({ bodiesAfterMs: 86_400_000, forgetAfterMs: 2 * 86_400_000, rest: 0 });
      assert.equal(await rowsIndexed(inbox), 0, "purged");
    });

    suite.onPostgres(
      "(control) with the trigger function from before the partitions, a done mark takes the delivery out of the index",
      async () => {
        const inbox = await open();
        await inbox.query(`CREATE OR REPLACE FUNCTION inbox_search_forget() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN
            DELETE FROM deliveries_search WHERE source = OLD.source AND id = OLD.id;
            IF TG_OP = 'UPDATE' AND NEW.purged_at IS NULL THEN
              INSERT INTO search_pending (source, id) VALUES (NEW.source, NEW.id);
            END IF;
            RETURN NULL;
          END $$`);
        await inbox.store({ source: "stripe", id: "evt_1", body: invoiceOf("evt_1") });
        await expect(inbox, { bodyWords: "cus_123" }, ["evt_1"]);
        assert.equal(await inbox.finish((await inbox.claim(LEASE))!), true);
        assert.equal(await rowsIndexed(inbox), 0, "the move's AFTER DELETE took it out");
      },
    );

    suite.onPostgres(
      "never skips a store that commits after a later one: the queue holds its key until it is indexed",
      async () => {
        const inbox = await open();
        const { default: pg } = await import("pg");
        const early = new pg.Client({ connectionString: suite.target.replace(/[?&]schema=([^&]+)/, "") });
        await early.connect();
        const schema = new URL(suite.target).searchParams.get("schema")!;
        try {
          // A store that takes its place in the queue first and commits last, as one held up by a slow commit.
          await early.query("BEGIN");
          await early.query(
            `INSERT INTO ${schema}.deliveries (source, id, body, body_sha256, received_at, status, available_at)
             VALUES ('stripe', 'evt_early', $1, 'x', $2, 'received', $2)`,
            [invoiceOf("evt_early"), suite.t],
          );
          await inbox.store({ source: "stripe", id: "evt_late", body: invoiceOf("evt_late") });
          const passed = Number((await inbox.query("SELECT max(seq) AS s FROM search_pending"))[0]!.s);
          assert.equal(await inbox.indexSearch(), 1, "the indexer sees the late one alone");
          await early.query("COMMIT");
          // (control) the early key is below what the indexer passed: a cursor `seq > last` would never see it.
          const queued = await inbox.query("SELECT seq FROM search_pending");
          assert.equal(queued.length, 1);
          assert.ok(Number(queued[0]!.seq) < passed, `${queued[0]!.seq} < ${passed}`);
          assert.equal((await inbox.query("SELECT count(*) AS n FROM search_pending WHERE seq > ?", passed))[0]!.n, 0);
          await expect(inbox, { bodyWords: "cus_123" }, ["evt_late", "evt_early"]);
          assert.equal(await rowsIndexed(inbox), 2);
        } finally {
          await early.query("ROLLBACK").catch(() => {});
          await early.end();
        }
      },
    );
  });

  describe("a body search's time bound", () => {
    // seedMany stores n deliveries of about 2 KB each in one statement, so that reading every body takes the
    // server far longer than a millisecond: a bound of 1 ms cannot be met by a scan of them.
    const seedMany = async (inbox: Inbox, n: number) => {
      await inbox.query(
        `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
         SELECT 'stripe', 'evt_' || g, convert_to('{"id":"evt_' || g || '","pad":"' || repeat('abcdefgh ', 220) || '"}', 'UTF8'),
                'x', ?, 'received', ?
         FROM generate_series(1, ?) AS g`,
        suite.t,
        suite.t,
        n,
      );
    };
    const wide: Filter = { bodyContains: "no such text", since: 0 };

    suite.onPostgres("a body search past its bound fails with SearchTooBroad, search() and count() alike", async () => {
      const inbox = await suite.open({ searchTimeoutMs: 1 });
      await seedMany(inbox, 20_000);
      const before = (await inbox.query("SHOW statement_timeout"))[0]!.statement_timeout;
      await assert.rejects(
        inbox.search(wide),
        (e: Error) => e instanceof SearchTooBroad && /narrow it by time/.test(e.message),
      );
      await assert.rejects(inbox.count(wide), SearchTooBroad);
      // A search that reads no body is not bounded: the same inbox lists by source.
      assert.equal((await inbox.search({ source: "stripe" }, { limit: 1 })).length, 1);
      // SET LOCAL ended with the search's transaction: the session's setting is as it was.
      assert.equal((await inbox.query("SHOW statement_timeout"))[0]!.statement_timeout, before);
    });

    suite.onPostgres(
      "a refused search is rolled back and its connection kept, and is not taken for a passing error",
      async () => {
        // The pool's connections are told apart by an application_name of this test's own.
        const name = `refused_${process.pid}_${suite.t}`;
        const inbox = await connect(`${suite.target}&application_name=${name}`, {
          now: () => suite.t,
          random: () => 0,
          searchTimeoutMs: 1,
        });
        try {
          await seedMany(inbox, 20_000);
          const pids = async () =>
            new Set(
              (
                (await inbox.query("SELECT pid FROM pg_stat_activity WHERE application_name = ?", name)) as {
                  pid: number;
                }[]
              ).map((r) => r.pid),
            );
          const before = await pids();
          let refused: unknown;
          for (let i = 0; i < 3; i++) refused = await inbox.search(wide).catch((e: unknown) => e);
          assert.ok(refused instanceof SearchTooBroad);
          // Had each refused search ended its connection (as it did), a pid seen before would be gone.
          const after = await pids();
          assert.deepEqual(
            [...before].filter((pid) => !after.has(pid)),
            [],
            "no connection ended",
          );
          // Its cause, a cancelled statement (57014), is passing on its own; the refusal is not.
          assert.equal(passing(refused.cause), true, "(control) the cause alone is passing");
          assert.equal(passing(refused), false);
        } finally {
          await inbox.close();
        }
      },
    );

    suite.onPostgres(
      "(control) the same search under the default bound answers, and leaves the session's setting",
      async () => {
        const inbox = await suite.open();
        await seedMany(inbox, 20_000);
        const before = (await inbox.query("SHOW statement_timeout"))[0]!.statement_timeout;
        assert.deepEqual(await inbox.search(wide), []);
        assert.equal(await inbox.count({ bodyContains: "abcdefgh", since: 0 }), 20_000);
        assert.equal((await inbox.query("SHOW statement_timeout"))[0]!.statement_timeout, before);
      },
    );
  });
});
