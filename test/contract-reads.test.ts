// test/contract-reads.test.ts: the operator's reads, on both backends (test/contract-harness.ts): find(), list(),
// status(), summary(), histogram(), and the filters of search(), count(), retryMatching() and replayMatching().
//   npx node --import tsx --test test/contract-reads.test.ts

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { DEFAULTS } from "../lib/defaults.ts";
import { historyOf, periodOf } from "../lib/postgres/periods.ts";
import { parseTarget, Pool } from "../lib/postgres/pool.ts";
import { listWindows } from "../lib/postgres/reads.ts";
import { DISTINCT_SOURCES, filterSql, idKeysSql, replayToCount, searchSql } from "../lib/sql.ts";
import type { Cursor, Delivery, Filter, Inbox, SqlValue } from "../lib/store.ts";
import { run } from "../worker.ts";
import { body, contract, LEASE, T0, daysOpened } from "./contract-harness.ts";
import { bodyProbes } from "./helpers.ts";

contract((suite) => {
  const { open } = suite;
  describe("looking: find(), list(), status()", () => {
    it("counts per status and source, lists newest first, and names the failures and the oldest wait", async () => {
      const inbox = await open();
      await inbox.store({ source: "stripe", id: "s1", body: body({}), eventType: "charge.succeeded" });
      suite.t += 1_000;
      await inbox.store({ id: "evt_1", body: body({}) });
      await inbox.store({ id: "evt_1", body: body({ other: 1 }) });
      const lease = (await inbox.claim(LEASE))!;
      await inbox.fail(lease, "nope", { permanent: true });
      suite.t += 4_000;
      const s = await inbox.status();
      assert.deepEqual(s.counts, { received: 1, processing: 0, done: 0, failed: 1 });
      assert.deepEqual(
        s.failed.map((f) => [f.source, f.id, f.error]),
        [["stripe", "s1", "nope"]],
      );
      assert.equal(s.oldestWaitingMs, 4_000);
      assert.deepEqual(s.conflicts, { deliveries: 1, copies: 1 });
      assert.deepEqual(
        s.sources.map((x) => [x.source, x.eventType]),
        [
          ["default", null],
          ["stripe", "charge.succeeded"],
        ],
      );
      assert.deepEqual(
        (await inbox.list()).map((d) => d.id),
        ["evt_1", "s1"],
      );
      assert.deepEqual(
        (await inbox.list({ status: "failed" })).map((d) => d.id),
        ["s1"],
      );
      assert.deepEqual(
        (await inbox.list({ source: "default" })).map((d) => d.id),
        ["evt_1"],
      );
    });

    // On PostgreSQL a body of at most DEFAULTS.inlineBodyBytes stays in its row and a larger one is kept
    // apart (docs/table.md#bodies-apart); every read hands either over whole, and a tombstone's as empty.
    const small = body({ size: "small" });
    const large = body({ size: "large", pad: "x".repeat(1_000) });
    const stocked = async () => {
      const inbox = await open();
      for (const [id, b] of [
        ["small", small],
        ["large", large],
        ["small_gone", small],
        ["large_gone", large],
      ] as const)
        await inbox.store({ id, body: b });
      for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      for (const id of ["small_gone", "large_gone"]) assert.equal((await inbox.dropBodies({ id })).bodies, 1);
      return inbox;
    };
    const bodies = (rows: Delivery[]) =>
      Object.fromEntries(rows.map((d) => [d.id, Buffer.from(d.body).toString()]).sort());
    const expected = {
      large: large.toString(),
      large_gone: "",
      small: small.toString(),
      small_gone: "",
    };

    it("reads each body whole wherever it is kept, small or large, and a tombstone's as empty", async () => {
      const inbox = await stocked();
      const found = [];
      for (const id of Object.keys(expected)) found.push(...(await inbox.find(id)));
      assert.deepEqual(bodies(found), expected, "find()");
      assert.deepEqual(bodies(await inbox.list()), expected, "list()");
      assert.deepEqual(bodies(await inbox.page(undefined, 10)), expected, "page()");
      assert.deepEqual(bodies(await inbox.search({})), expected, "search()");
      assert.deepEqual(
        (await inbox.search({ bodyContains: "large" })).map((d) => d.id),
        ["large"],
        "a body searched for is read wherever it is; a tombstone's matches nothing",
      );
      for (const id of ["small", "large"]) assert.equal((await inbox.replayMatching({ id })).replayed, 1);
      assert.deepEqual(bodies(await inbox.claimBatch(10, LEASE)), { large: expected.large, small: expected.small });
    });

    suite.onPostgres("finds an ID in the days delivery_keys names, opening no other day's partition", async () => {
      const inbox = await open();
      const DAY = 86_400_000;
      for (const k of [0, 1, 2]) {
        suite.t = T0 + k * DAY;
        for (const source of ["stripe", "github"]) await inbox.store({ source, id: `evt_${k}`, body: body({ k }) });
        for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.finish(lease);
      }
      const opened = (read: { where: string; params: SqlValue[] }) => daysOpened(inbox, read);
      // As search() and find() run it: its sources and days read first, then planned for that day alone.
      const probe = idKeysSql("evt_1", undefined);
      const [keys] = await inbox.query(probe.sql, ...probe.params);
      assert.deepEqual(keys, { sources: ["github", "stripe"], first: T0 + DAY, last: T0 + DAY });
      const planned = await opened(
        filterSql({ id: "evt_1" }, "postgres", { sources: ["github", "stripe"], first: T0 + DAY, last: T0 + DAY }),
      );
      assert.deepEqual(planned, { ran: 1, all: 1 }, "one day's partition is planned and read: evt_1's");
      // The statement alone, its days read from delivery_keys as it runs, plans every day's and prunes as it runs.
      const now = await opened(filterSql({ id: "evt_1" }, "postgres"));
      assert.equal(now.ran, 1, "one day's partition is read: evt_1's");
      assert.ok(now.all >= 3, `the others are in the plan, pruned as it ran (${now.all})`);
      // The control: the ID by its sources alone, as before delivery_keys was asked, reads every day's.
      const before = await opened({ where: `source = ANY (ARRAY(${DISTINCT_SOURCES})) AND id = ?`, params: ["evt_1"] });
      assert.ok(before.ran >= 3, `without the days, each is read (${before.ran})`);
      assert.deepEqual(await inbox.search({ id: "evt_9" }), [], "an ID not stored: its keys say so");
      assert.deepEqual(
        (await inbox.find("evt_1")).map((d) => [d.source, d.id, d.receivedAt]),
        [
          ["github", "evt_1", T0 + DAY],
          ["stripe", "evt_1", T0 + DAY],
        ],
      );
      assert.deepEqual(
        (await inbox.search({ id: "evt_2", source: "stripe" })).map((d) => [d.source, d.id]),
        [["stripe", "evt_2"]],
      );
    });

    it("pages newest first across days, its filters and cursor as one statement over them all would", async () => {
      const inbox = await open();
      const DAY = 86_400_000;
      // Four days, five deliveries a day from two sources, three done and one failed of each day's five: rows in
      // the history's days and in the hot partition.
      const stored: { source: string; id: string; receivedAt: number; status: string }[] = [];
      for (let day = 0; day < 4; day++)
        for (let k = 0; k < 5; k++) {
          suite.t = T0 + day * DAY + k * 3_600_000;
          const source = k % 2 === 0 ? "stripe" : "github";
          await inbox.store({ source, id: `d${day}_${k}`, body: body({ day, k }) });
          stored.push({
            source,
            id: `d${day}_${k}`,
            receivedAt: suite.t,
            status: k === 1 ? "failed" : k === 4 ? "received" : "done",
          });
        }
      suite.t = T0 + 4 * DAY;
      for (const lease of await inbox.claimBatch(100, LEASE)) {
        const status = stored.find((d) => d.id === lease.id)!.status;
        if (status === "failed") await inbox.fail(lease, "nope", { permanent: true });
        else if (status === "done") await inbox.finish(lease);
        else await inbox.release(lease);
      }
      const newestFirst = [...stored].sort((a, b) => b.receivedAt - a.receivedAt);
      const cases: { filter: Filter; matches: (d: (typeof stored)[number]) => boolean }[] = [
        { filter: {}, matches: () => true },
        { filter: { source: "stripe" }, matches: (d) => d.source === "stripe" },
        { filter: { status: "failed" }, matches: (d) => d.status === "failed" },
        { filter: { until: T0 + 2 * DAY + 1 }, matches: (d) => d.receivedAt < T0 + 2 * DAY + 1 },
        {
          filter: { source: "github", since: T0 + DAY + 3_600_000, until: T0 + 3 * DAY },
          matches: (d) => d.source === "github" && d.receivedAt >= T0 + DAY + 3_600_000 && d.receivedAt < T0 + 3 * DAY,
        },
      ];
      for (const { filter, matches } of cases) {
        const expected = newestFirst.filter(matches).map((d) => d.id);
        for (const limit of [1, 3, 50]) {
          const seen: string[] = [];
          let after: Cursor | undefined;
          for (let pages = 0; pages < 30; pages++) {
            const page = await inbox.search(filter, { ...(after ? { after } : {}), limit, bodies: false });
            seen.push(...page.map((d) => d.id));
            if (page.length < limit) break;
            const last = page.at(-1)!;
            after = { receivedAt: last.receivedAt, source: last.source, id: last.id, route: last.route };
          }
          assert.deepEqual(seen, expected, `${JSON.stringify(filter)}, ${limit} a page`);
        }
      }
    });

    suite.onPostgres(
      "plans a list's newest day alone, the day of its bound, where one statement planned every day",
      async () => {
        const inbox = await open();
        const DAY = 86_400_000;
        for (let day = 0; day < 3; day++) {
          suite.t = T0 + day * DAY;
          await inbox.store({ id: `d${day}`, body: body({ day }) });
          for (const lease of await inbox.claimBatch(1, LEASE)) await inbox.finish(lease);
        }
        const planned = async (filter: Filter) => {
          const { sql, params } = searchSql("postgres", filterSql(filter, "postgres"), { limit: 50, bodies: false });
          const plan = await inbox.query(`EXPLAIN (COSTS OFF) ${sql}`, ...params);
          return new Set(plan.flatMap((r) => /delivery_history_d\d{8}/.exec(String(r["QUERY PLAN"])) ?? [])).size;
        };
        const filter: Filter = { source: "default", until: T0 + 2 * DAY + 1 };
        const windows = listWindows(filter, undefined, T0 + 2 * DAY);
        assert.deepEqual(
          windows.map((w) => [w.since, w.until]),
          [
            [Math.floor((T0 + 2 * DAY) / DAY) * DAY, T0 + 2 * DAY + 1],
            [Math.floor((T0 + 2 * DAY) / DAY) * DAY - DAY, Math.floor((T0 + 2 * DAY) / DAY) * DAY],
            [undefined, Math.floor((T0 + 2 * DAY) / DAY) * DAY - DAY],
          ],
          "the day of the bound, the day before, then the rest",
        );
        assert.equal(await planned(windows[0]!), 1, "the first statement plans one day's partition");
        // The control: the list as one statement plans each day up to its bound.
        assert.ok((await planned(filter)) >= 3, "one statement plans every day");
        assert.deepEqual(
          (await inbox.search(filter, { bodies: false })).map((d) => d.id),
          ["d2", "d1", "d0"],
        );
      },
    );

    suite.onPostgres(
      "reads a body kept in its row without looking in delivery_bodies, through the view and delivery_body()",
      async () => {
        const inbox = await stocked();
        const { probes, close } = await bodyProbes(suite.target);
        try {
          const view = "SELECT body FROM deliveries WHERE source = 'default' AND id = $1";
          const fn = `SELECT delivery_body(source, id, route, received_at, body) AS body FROM delivery_rows
                       WHERE source = 'default' AND id = $1`;
          // The control: a body kept apart is found there, and counted.
          assert.equal(await probes(view, "large"), 1);
          assert.equal(await probes(fn, "large"), 1);
          assert.equal(await probes(view, "small"), 0, "the view reads an inline body from its row alone");
          assert.equal(await probes(fn, "small"), 0, "and so does delivery_body()");
          assert.equal(await probes(view, "large_gone"), 0, "a tombstone's body is empty, looked up nowhere");
        } finally {
          await close();
        }
        assert.deepEqual(bodies(await inbox.find("small")), { small: expected.small }, "and reads it whole");
      },
    );
  });

  describe("summary()", () => {
    it("counts per status and per source as status() does, and names the oldest wait and the conflicts", async () => {
      const inbox = await open({ maxAttempts: 1 });
      await inbox.store({ source: "stripe", id: "s1", body: body({}) });
      suite.t += 1_000;
      for (const id of ["s2", "s3", "s4"]) await inbox.store({ source: "stripe", id, body: body({}) });
      await inbox.store({ source: "github", id: "g1", body: body({}) });
      await inbox.store({ source: "github", id: "g1", body: body({ other: 1 }) });
      const [a, b, c] = await inbox.claimBatch(3, LEASE); // s1, s2, s3: one done, one failed, one processing
      await inbox.finish(a!);
      await inbox.fail(b!, "boom");
      void c;
      suite.t += 4_000;
      const summary = await inbox.summary();
      const status = await inbox.status();
      assert.deepEqual(summary.counts, { received: 2, processing: 1, done: 1, failed: 1 });
      assert.deepEqual(summary.counts, status.counts);
      assert.deepEqual(summary.sources, [
        { source: "github", counts: { received: 1, processing: 0, done: 0, failed: 0 } },
        { source: "stripe", counts: { received: 1, processing: 1, done: 1, failed: 1 } },
      ]);
      assert.equal(summary.oldestWaitingMs, 4_000, "s3 has waited since it arrived, processing or not");
      assert.deepEqual(summary.conflicts, { deliveries: 1, copies: 1 });
      assert.equal(summary.estimated, false, "a small table is counted, not estimated");
      const empty = await open({ maxAttempts: 1 });
      await empty.query("DELETE FROM deliveries");
      assert.deepEqual(await empty.summary(), {
        counts: { received: 0, processing: 0, done: 0, failed: 0 },
        sources: [],
        oldestWaitingMs: null,
        conflicts: { deliveries: 0, copies: 0 },
        estimated: false,
      });
    });
  });

  describe("histogram()", () => {
    it("counts received, done and failed per bucket, each in the bucket it happened in, empty ones as zero", async () => {
      const inbox = await open({ maxAttempts: 1 });
      await inbox.store({ id: "old", body: body({}) }); // before the range: counted nowhere
      suite.t += 60_000;
      const since = suite.t;
      await inbox.store({ id: "a", body: body({}) });
      await inbox.store({ id: "b", body: body({}) });
      suite.t += 61_000; // second bucket
      await inbox.store({ id: "c", body: body({}) });
      const leases = await inbox.claimBatch(4, LEASE);
      await inbox.finish(leases.find((l) => l.id === "a")!);
      await inbox.fail(leases.find((l) => l.id === "b")!, "boom");
      suite.t += 60_000; // third bucket: nothing at all
      const buckets = await inbox.histogram(since, 60_000, since + 180_000);
      assert.deepEqual(buckets, [
        { start: since, received: 2, done: 0, failed: 0 },
        { start: since + 60_000, received: 1, done: 1, failed: 1 },
        { start: since + 120_000, received: 0, done: 0, failed: 0 },
      ]);
      assert.equal((await inbox.histogram(since, 60_000)).length, 3, "until defaults to the clock's now");
      await assert.rejects(inbox.histogram(since, 0), TypeError);
    });
  });

  describe("filters: search(), count(), retryMatching(), replayMatching()", () => {
    // Six deliveries a second apart: two sources, two types, two failures with different errors, two done.
    const seed = async (inbox: Inbox) => {
      const plan: [string, string, string, "done" | "failed" | "received", string?][] = [
        ["stripe", "s1", "charge.succeeded", "done"],
        ["stripe", "s2", "charge.failed", "failed", "Timeout talking to ledger"],
        ["github", "g1", "push", "failed", "HTTP 500 from CI"],
        ["github", "g2", "push", "done"],
        ["stripe", "s3", "charge.succeeded", "received"],
        ["default", "d1", "", "failed", "timeout again"],
      ];
      for (const [source, id, eventType] of plan) {
        await inbox.store({ source, id, eventType: eventType || null, body: body({ id, note: `for ${source}` }) });
        suite.t += 1_000;
      }
      const fates = new Map(plan.map(([source, id, , fate, error]) => [`${source}/${id}`, { fate, error }]));
      for (const lease of await inbox.claimBatch(plan.length, LEASE)) {
        const { fate, error } = fates.get(`${lease.source}/${lease.id}`)!;
        if (fate === "done") await inbox.finish(lease);
        else if (fate === "failed") await inbox.fail(lease, error!, { permanent: true });
        else await inbox.release(lease);
      }
    };
    const ids = (ds: Delivery[]) => ds.map((d) => d.id);

    it("narrows by every field, newest first, and counts the same", async () => {
      const inbox = await open();
      await seed(inbox);
      assert.deepEqual(ids(await inbox.search({})), ["d1", "s3", "g2", "g1", "s2", "s1"]);
      const cases: [Parameters<Inbox["search"]>[0], string[]][] = [
        [{ status: "failed" }, ["d1", "g1", "s2"]],
        [{ source: "stripe" }, ["s3", "s2", "s1"]],
        [{ type: "push" }, ["g2", "g1"]],
        [{ since: T0 + 1_000, until: T0 + 3_000 }, ["g1", "s2"]],
        [{ errorMatch: "TIMEOUT" }, ["d1", "s2"]],
        [{ errorMatch: "500 from" }, ["g1"]],
        [{ id: "g2" }, ["g2"]],
        [{ bodyContains: "for github" }, ["g2", "g1"]],
        [{ status: "failed", source: "stripe", errorMatch: "ledger" }, ["s2"]],
        [{ errorMatch: "%" }, []],
      ];
      for (const [filter, expected] of cases) {
        const found = await inbox.search(filter);
        assert.deepEqual(ids(found), expected, JSON.stringify(filter));
        assert.equal(await inbox.count(filter), expected.length, JSON.stringify(filter));
        // A list's read: the same rows, every field but the body, which it leaves empty (a body filter still reads it).
        const listed = await inbox.search(filter, { bodies: false });
        assert.deepEqual(
          listed,
          found.map((d) => ({ ...d, body: Buffer.alloc(0) })),
          `${JSON.stringify(filter)} without bodies`,
        );
      }
      assert.ok(
        (await inbox.search({})).every((d) => d.body.length > 0),
        "control: search() brings every body",
      );
    });

    it("finds an ID under every source that has it, and under one when the source is given", async () => {
      const inbox = await open();
      for (const source of ["stripe", "github", "shopify"]) {
        await inbox.store({ source, id: source === "shopify" ? "other" : "evt_same", body: body({ source }) });
        suite.t += 1_000;
      }
      assert.deepEqual(
        (await inbox.search({ id: "evt_same" })).map((d) => d.source),
        ["github", "stripe"],
      );
      assert.equal(await inbox.count({ id: "evt_same" }), 2);
      assert.deepEqual(
        (await inbox.search({ id: "evt_same", source: "stripe" })).map((d) => d.source),
        ["stripe"],
      );
      assert.deepEqual(await inbox.search({ id: "nope" }), []);
    });

    // An ID stored under two sources a day apart, beside others over four days: what count(), list() and the bulk
    // commands by ID answer, the same on both backends. On PostgreSQL they read the ID's days from delivery_keys
    // first (byId()) and a list a day at a time (listWindows()), and must answer as one statement over every day.
    it("counts, retries and replays an ID whose rows span days, and lists newest first across days", async () => {
      const inbox = await open();
      const DAY = 86_400_000;
      const plan: [number, string, string, "done" | "failed" | "received"][] = [
        [0, "stripe", "evt_0", "done"],
        [1, "stripe", "evt_1", "failed"],
        [1, "github", "evt_x", "done"],
        [2, "github", "evt_1", "failed"],
        [2, "stripe", "evt_2", "done"],
        [3, "github", "evt_3", "received"],
        [3, "stripe", "evt_4", "failed"],
      ];
      for (const [k, [day, source, id]] of plan.entries()) {
        suite.t = T0 + day * DAY + k * 60_000;
        await inbox.store({ source, id, body: body({ day, source }) });
      }
      suite.t = T0 + 3 * DAY + 7_200_000;
      const fates = new Map(plan.map(([, source, id, fate]) => [`${source}/${id}`, fate]));
      for (const lease of await inbox.claimBatch(100, LEASE)) {
        const fate = fates.get(`${lease.source}/${lease.id}`);
        if (fate === "done") await inbox.finish(lease);
        else if (fate === "failed") await inbox.fail(lease, "nope", { permanent: true });
        else await inbox.release(lease);
      }
      const counts: [Filter, number][] = [
        [{ id: "evt_1" }, 2],
        [{ id: "evt_1", source: "stripe" }, 1],
        [{ id: "evt_1", status: "failed" }, 2],
        [{ id: "evt_1", since: T0 + 2 * DAY }, 1],
        [{ id: "evt_1", source: "shopify" }, 0],
        [{ id: "evt_9" }, 0],
      ];
      for (const [filter, n] of counts) assert.equal(await inbox.count(filter), n, JSON.stringify(filter));
      // Newest first, a page of each size, as list() is asked: its status, its source, or neither.
      const newestFirst = [...plan].reverse();
      for (const [filter, pick] of [
        [{}, () => true],
        [{ status: "failed" }, (p: (typeof plan)[number]) => p[3] === "failed"],
        [{ source: "stripe" }, (p: (typeof plan)[number]) => p[1] === "stripe"],
        [{ status: "done", source: "github" }, (p: (typeof plan)[number]) => p[3] === "done" && p[1] === "github"],
      ] as const)
        for (const limit of [1, 3, 20]) {
          const expected = newestFirst.filter(pick).map(([, source, id]) => `${source}/${id}`);
          assert.deepEqual(
            (await inbox.list({ ...filter, limit })).map((d) => `${d.source}/${d.id}`),
            expected.slice(0, limit),
            `list(${JSON.stringify({ ...filter, limit })})`,
          );
        }
      assert.equal(await inbox.retryMatching({ id: "evt_1" }, { dryRun: true }), 2);
      assert.equal(await inbox.retryMatching({ id: "evt_9" }, { dryRun: true }), 0, "an ID not stored: none");
      assert.equal(await inbox.retryMatching({ id: "evt_9" }), 0);
      assert.equal(await inbox.retryMatching({ id: "evt_1", source: "github" }), 1);
      assert.equal(await inbox.retryMatching({ id: "evt_1" }, { batch: 1 }), 1, "the other source's, a day before");
      assert.equal(await inbox.count({ id: "evt_1", status: "received" }), 2);
      assert.equal(await inbox.count({ status: "failed" }), 1, "evt_4 alone is left failed");
      assert.deepEqual(await inbox.replayMatching({ id: "evt_2" }, { dryRun: true }), { replayed: 1, tombstoned: 0 });
      assert.deepEqual(await inbox.replayMatching({ id: "evt_9" }), { replayed: 0, tombstoned: 0 });
      assert.deepEqual(await inbox.replayMatching({ id: "evt_2" }), { replayed: 1, tombstoned: 0 });
      assert.deepEqual(
        (await inbox.search({ status: "received" })).map((d) => `${d.source}/${d.id}`),
        ["github/evt_3", "stripe/evt_2", "github/evt_1", "stripe/evt_1"],
      );
    });

    suite.onPostgres("lists the rows and the order list()'s one statement over every day did", async () => {
      const inbox = await open();
      const DAY = 86_400_000;
      for (let k = 0; k < 12; k++) {
        suite.t = T0 + Math.floor(k / 3) * DAY + (k % 3) * 3_600_000;
        await inbox.store({ source: k % 2 ? "stripe" : "github", id: `e${k}`, body: body({ k }) });
        // Two deliveries received in the same millisecond: the order goes on to the source and the ID.
        if (k === 4) await inbox.store({ source: "github", id: `e${k}_tie`, body: body({ k }) });
      }
      for (const lease of await inbox.claimBatch(100, LEASE))
        if (Number(lease.id.slice(1, 2)) % 2) await inbox.fail(lease, "nope", { permanent: true });
        else await inbox.finish(lease);
      const before = async (f: { status?: string; source?: string; limit: number }) =>
        (
          await inbox.query(
            `SELECT source, id FROM deliveries
              WHERE (?::text IS NULL OR status = ?::text) AND (?::text IS NULL OR source = ?::text)
              ORDER BY received_at DESC, source DESC, id DESC LIMIT ?::integer`,
            f.status ?? null,
            f.status ?? null,
            f.source ?? null,
            f.source ?? null,
            f.limit,
          )
        ).map((r) => `${r.source}/${r.id}`);
      for (const f of [{ limit: 20 }, { limit: 5 }, { status: "failed", limit: 4 }, { source: "github", limit: 3 }]) {
        const listed = (await inbox.list(f as never)).map((d) => `${d.source}/${d.id}`);
        assert.ok(listed.length > 0, JSON.stringify(f));
        assert.deepEqual(listed, await before(f), JSON.stringify(f));
      }
    });

    suite.onPostgres(
      "counts, retries, replays to a destination and lists without opening a day they read nothing of: a lock on it does not stop them",
      async () => {
        const inbox = await open();
        const DAY = 86_400_000;
        for (const [day, source, id] of [
          [0, "stripe", "evt_0"],
          [1, "stripe", "evt_1"],
          [2, "github", "evt_1"],
          [3, "github", "evt_3"],
        ] as const) {
          suite.t = T0 + day * DAY;
          // Past inlineBodyBytes, kept apart: replay --to copies it to the route it adds.
          await inbox.store({ source, id, body: body({ day, pad: "x".repeat(DEFAULTS.inlineBodyBytes) }) });
          for (const lease of await inbox.claimBatch(10, LEASE)) await inbox.fail(lease, "nope", { permanent: true });
        }
        const { default: pg } = await import("pg");
        const holder = new Pool(parseTarget(suite.target), {
          size: 2,
          connectTimeoutMs: DEFAULTS.connectTimeoutMs,
          applicationName: "day-locked-test",
          types: pg.types,
        });
        // waited runs read while another transaction holds day 0's history partition in ACCESS EXCLUSIVE mode, and
        // says whether read asked for it (a plan that named the day takes a lock on it) before it ended; the lock
        // is then let go, so a read that waits still ends.
        const day0 = historyOf(periodOf(T0));
        const waited = async (read: () => Promise<unknown>): Promise<boolean> => {
          const client = await holder.transaction();
          await client.query(`LOCK TABLE ${day0} IN ACCESS EXCLUSIVE MODE`);
          let ended = false;
          const reading = read().finally(() => void (ended = true));
          let waiting = false;
          while (!ended && !waiting) {
            const [r] = await inbox.query(
              "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE relation = ?::regclass AND NOT granted) AS w",
              day0,
            );
            waiting = r!.w === true;
            if (!waiting) await new Promise((resolve) => setTimeout(resolve, 2));
          }
          await client.query("ROLLBACK");
          client.release();
          await reading;
          return waiting;
        };
        try {
          // The controls: one statement that reads the ID's days from delivery_keys as it runs, and list()'s old
          // statement, each plan every day's partition, and wait for the lock.
          const old = filterSql({ id: "evt_1" }, "postgres");
          assert.equal(
            await waited(() => inbox.query(`SELECT count(*) FROM deliveries WHERE ${old.where}`, ...old.params)),
            true,
          );
          assert.equal(
            await waited(() =>
              inbox.query("SELECT * FROM deliveries ORDER BY received_at DESC, source DESC, id DESC LIMIT 1"),
            ),
            true,
          );
          let n: unknown;
          assert.equal(await waited(async () => (n = await inbox.count({ id: "evt_1" }))), false, "count() of an ID");
          assert.equal(n, 2);
          assert.equal(
            await waited(async () => (n = await inbox.count({ id: "evt_9" }))),
            false,
            "of an ID not stored",
          );
          assert.equal(n, 0);
          assert.equal(await waited(async () => (n = await inbox.list({ limit: 1 }))), false, "list()");
          assert.deepEqual(
            (n as Delivery[]).map((d) => d.id),
            ["evt_3"],
          );
          assert.equal(
            await waited(async () => (n = await inbox.retryMatching({ id: "evt_1" }, { dryRun: true }))),
            false,
            "a retry by ID, counted",
          );
          assert.equal(n, 2);
          // The retry itself: its batches' UPDATE names the days of the keys they picked as values too.
          assert.equal(
            await waited(async () => (n = await inbox.retryMatching({ id: "evt_1" }))),
            false,
            "a retry by ID",
          );
          assert.equal(n, 2);
          assert.equal(await inbox.count({ id: "evt_1", status: "received" }), 2);
          // replay --to by ID: its count, and its batch, which finds the delivery's row there and its route numbers
          // by their key, as the old statements did, but in the days it read from delivery_keys first.
          const control = replayToCount(old.where);
          assert.equal(
            await waited(() => inbox.query(control, ...old.params, "audit")),
            true,
            "the old count, its row there found by its key alone",
          );
          assert.equal(
            await waited(async () => (n = await inbox.replayMatching({ id: "evt_1" }, { to: "audit", dryRun: true }))),
            false,
            "replay --to by ID, counted",
          );
          assert.deepEqual(n, { replayed: 2, tombstoned: 0 });
          assert.equal(
            await waited(async () => (n = await inbox.replayMatching({ id: "evt_1" }, { to: "audit" }))),
            false,
            "replay --to by ID, a route added",
          );
          assert.deepEqual(n, { replayed: 2, tombstoned: 0 });
          for (const lease of await inbox.claimBatch(10, LEASE, { destination: "audit" }))
            assert.equal(await inbox.finish(lease), true);
          assert.equal(await inbox.count({ id: "evt_1", destination: "audit", status: "done" }), 2);
          // The control: the old UPDATE of a done row there (its key alone, no day) waits for day 0's lock, here
          // until its lock_timeout (55P03), rather than until the lock is let go.
          const locker = await holder.transaction();
          await locker.query(`LOCK TABLE ${day0} IN ACCESS EXCLUSIVE MODE`);
          const oldForm = await holder.transaction();
          try {
            await oldForm.query("SET LOCAL lock_timeout = '200ms'");
            await assert.rejects(
              oldForm.query(
                `UPDATE delivery_rows d SET status = 'received', replays = d.replays + 1 FROM unnest($1::text[], $2::text[]) AS u(s, i)
                  WHERE d.source = u.s AND d.id = u.i AND d.destination = $3 AND d.status = 'done' AND d.purged_at IS NULL`,
                [["stripe", "github"], ["evt_1", "evt_1"], "audit"],
              ),
              { code: "55P03" },
            );
          } finally {
            await oldForm.query("ROLLBACK");
            oldForm.release();
            await locker.query("ROLLBACK");
            locker.release();
          }
          assert.equal(
            await waited(async () => (n = await inbox.replayMatching({ id: "evt_1" }, { to: "audit" }))),
            false,
            "replay --to by ID, its done rows there again",
          );
          assert.deepEqual(n, { replayed: 2, tombstoned: 0 });
          assert.equal(await inbox.count({ id: "evt_1", destination: "audit", status: "received" }), 2);
          const routes = await inbox.find("evt_1");
          assert.deepEqual(
            routes.map((d) => [d.source, d.route, d.destination, d.replays, d.receivedAt]),
            [
              ["github", 0, "handler", 0, T0 + 2 * DAY],
              ["github", 1, "audit", 2, T0 + 2 * DAY],
              ["stripe", 0, "handler", 0, T0 + DAY],
              ["stripe", 1, "audit", 2, T0 + DAY],
            ],
          );
          for (const d of routes)
            assert.deepEqual(JSON.parse(d.body.toString()).day, d.source === "github" ? 2 : 1, "its body, whole");
        } finally {
          await holder.end();
        }
      },
    );

    it("pages by cursor without gaps or repeats, ties on received_at included", async () => {
      const inbox = await open();
      for (let i = 0; i < 25; i++) {
        await inbox.store({ source: i % 2 ? "a" : "b", id: `e${String(i).padStart(2, "0")}`, body: body({ i }) });
        if (i % 3 === 0) suite.t += 1;
      }
      const all = ids(await inbox.search({}, { limit: 100 }));
      const paged: string[] = [];
      let after: Delivery | undefined;
      for (;;) {
        const page = await inbox.search({}, { after, limit: 4 });
        if (page.length === 0) break;
        paged.push(...ids(page));
        after = page.at(-1);
      }
      assert.equal(all.length, 25);
      assert.deepEqual(paged, all);
      assert.equal((await inbox.search({})).length, 25, "the default limit is above 25");
    });

    it("replays beside a running worker: each delivery at most once per run, and every one ends done", async () => {
      const inbox = await open();
      for (let i = 0; i < 40; i++) await inbox.store({ id: `e${i}`, body: body({ i }) });
      const handled = new Map<string, number>();
      const stop = new AbortController();
      const worker = run((job) => void handled.set(job.delivery.id, (handled.get(job.delivery.id) ?? 0) + 1), {
        inbox,
        concurrency: 4,
        pollMaxMs: 5,
        signal: stop.signal,
        log: () => {},
      });
      while ((await inbox.count({ status: "done" })) < 10) await new Promise((resolve) => setTimeout(resolve, 2));
      const { replayed } = await inbox.replayMatching({}, { batch: 3 });
      assert.ok(replayed >= 10, `replayed ${replayed}`);
      while ((await inbox.count({ status: "done" })) < 40) await new Promise((resolve) => setTimeout(resolve, 2));
      stop.abort();
      await worker;
      const all = await inbox.search({}, { limit: 100 });
      assert.equal(all.filter((d) => d.replays === 1).length, replayed);
      assert.ok(all.every((d) => d.replays <= 1));
      assert.equal(
        [...handled.values()].reduce((a, b) => a + b, 0),
        40 + replayed,
        "the handler ran once per delivery, and once per replay",
      );
    });

    it("refuses a filter it does not know, rather than matching everything", async () => {
      const inbox = await open();
      await assert.rejects(async () => inbox.search({ staus: "failed" } as never), TypeError);
      await assert.rejects(async () => inbox.count({ since: "yesterday" } as never), TypeError);
      await assert.rejects(async () => inbox.retryMatching({ status: "gone" } as never), TypeError);
    });

    it("retryMatching queues only the failed ones that match, in batches, and twice changes nothing more", async () => {
      const inbox = await open();
      await seed(inbox);
      assert.equal(await inbox.retryMatching({ errorMatch: "timeout" }, { batch: 1 }), 2);
      assert.deepEqual(ids(await inbox.search({ status: "failed" })), ["g1"]);
      const s2 = (await inbox.find("s2", "stripe"))[0]!;
      assert.deepEqual([s2.status, s2.attempts, s2.error, s2.availableAt], ["received", 0, null, suite.t]);
      assert.equal(await inbox.retryMatching({ errorMatch: "timeout" }), 0, "run twice, nothing more");
      assert.equal(await inbox.retryMatching({ source: "stripe" }), 0, "done and received ones are not retried");
    });

    it("replayMatching takes done ones again under the same key, attempts reset and replays counted", async () => {
      const inbox = await open();
      await seed(inbox);
      assert.deepEqual(await inbox.replayMatching({ type: "charge.succeeded" }), { replayed: 1, tombstoned: 0 });
      const s1 = (await inbox.find("s1", "stripe"))[0]!;
      assert.deepEqual(
        [s1.status, s1.attempts, s1.replays, s1.finishedAt, s1.availableAt],
        ["received", 0, 1, null, suite.t],
      );
      const lease = (await inbox.claimBatch(10, LEASE)).find((l) => l.id === "s1")!;
      assert.equal(lease.attempts, 1);
      assert.equal(await inbox.finish(lease), true);
      assert.deepEqual(await inbox.replayMatching({ id: "s1" }, { batch: 1 }), { replayed: 1, tombstoned: 0 });
      assert.equal((await inbox.find("s1", "stripe"))[0]!.replays, 2);
      assert.equal(await inbox.count({}), 6, "a replay is not a new delivery");
    });

    it("replayMatching with to counts on a dry run what it then sends: each delivery once, whatever its rows", async () => {
      const inbox = await open();
      const routed = (id: string, destinations: string[]) =>
        inbox.store({ source: "shop", id, body: body({ id }), destinations });
      await routed("d1", ["handler", "app"]);
      await routed("d2", ["handler", "app"]);
      await routed("d3", ["handler", "audit"]);
      await routed("d4", ["handler"]);
      await routed("d5", ["handler", "audit"]);
      for (const destination of ["handler", "app", "audit"])
        for (const lease of await inbox.claimBatch(10, LEASE, { destination }))
          if (lease.id !== "d5" || destination === "handler") assert.equal(await inbox.finish(lease), true);
      // Rows matched: nine. Deliveries audit would get: d1, d2, d4 (a row added), d3 (its done row again);
      // not d5, whose row there is still on its way.
      assert.equal(await inbox.count({}), 9);
      const dry = await inbox.replayMatching({}, { to: "audit", dryRun: true });
      assert.deepEqual(dry, { replayed: 4, tombstoned: 0 });
      assert.deepEqual(await inbox.replayMatching({}, { to: "audit" }), dry);
      // Asked again at once, nothing is left to send: every row there is on its way.
      assert.deepEqual(await inbox.replayMatching({}, { to: "audit", dryRun: true }), { replayed: 0, tombstoned: 0 });
    });
  });
});
