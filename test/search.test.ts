// test/search.test.ts: lib/search.ts and the body search's ways in. jsonContains() as jsonb's @> reads; the forms
// refused; body contains bounded to a day; the limit of DEFAULTS.searchBodyBytes the same as both backends
// index; an inbox filled before search left unindexed by the upgrade and indexed by `inbox.ts search enable`, on
// both backends; and the CLI's list and the operator page taking the new forms, or refusing them while the index
// is off, in real child processes.
//   npx node --test test/search.test.ts

import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { MIGRATIONS as PG_MIGRATIONS } from "../lib/postgres/schema.ts";
import { sha256 } from "../lib/rows.ts";
import { boundBodyContains, bodyWordsOf, jsonContains, parseBodyJson } from "../lib/search.ts";
import { MIGRATIONS as SQLITE_MIGRATIONS } from "../lib/sqlite/schema.ts";
import type { Inbox } from "../lib/store.ts";
import { freshSchema, pastSchema, postgresSkip, runScript, startAdmin, tempDir } from "./helpers.ts";

const pgSkip = await postgresSkip();
const T0 = 1_700_000_000_000;
// Where search's migration is in each list, found by what it makes (the one that moved its indexing after the
// ack comes next), so that a migration added after them moves neither.
const SEARCH = {
  sqlite: SQLITE_MIGRATIONS.findIndex((m) => m.includes("CREATE VIRTUAL TABLE deliveries_search")),
  postgres: PG_MIGRATIONS.findIndex((m) => m.includes("CREATE TABLE deliveries_search")),
};

describe("jsonContains()", () => {
  it("holds an object's keys at their paths, an array's elements anywhere in it, and a scalar only when equal", () => {
    const doc = {
      data: { object: { customer: "cus_1", amount: 4200, tags: ["a", "b"], lines: [{ p: 1 }, { p: 2 }] } },
    };
    assert.ok(jsonContains(doc, { data: { object: { customer: "cus_1" } } }));
    assert.ok(jsonContains(doc, { data: { object: { tags: ["b"], lines: [{ p: 2 }] } } }));
    assert.ok(jsonContains(doc, {}));
    assert.ok(jsonContains([1, [2, 3]], [[3]]));
    // (control) each of these is false: another value, another path, a scalar against an array, a missing key.
    assert.ok(!jsonContains(doc, { data: { object: { customer: "cus_2" } } }));
    assert.ok(!jsonContains(doc, { customer: "cus_1" }));
    assert.ok(!jsonContains(doc, { data: { object: { tags: "a" } } }));
    assert.ok(!jsonContains(doc, { data: { object: { lines: [{ p: 3 }] } } }));
    assert.ok(!jsonContains({ a: null }, { b: null }));
    assert.ok(!jsonContains({ a: 1 }, { a: "1" }));
  });
});

describe("the forms", () => {
  it("refuse, with a TypeError that says why, what no index can answer", () => {
    assert.deepEqual(parseBodyJson('{"a":{"b":[1]}}'), { a: { b: [1] } });
    for (const text of ["{", '"x"', "3", "null", "{}", '{"a":null}', '{"a":1.5}', '{"a":"--"}'])
      assert.throws(() => parseBodyJson(text), TypeError, text);
    assert.deepEqual(bodyWordsOf("  cus_123   invoice.paid -- "), ["cus_123", "invoice.paid"]);
    assert.throws(() => bodyWordsOf(" -- "), TypeError);
  });

  it("bound body contains to a day before until or now, unless since is given", () => {
    const now = T0 + 10 * 86_400_000;
    assert.deepEqual(boundBodyContains({ bodyContains: "x" }, now), {
      filter: { bodyContains: "x", since: now - DEFAULTS.bodyContainsWindowMs },
      since: now - DEFAULTS.bodyContainsWindowMs,
    });
    assert.equal(boundBodyContains({ bodyContains: "x", until: T0 }, now).since, T0 - DEFAULTS.bodyContainsWindowMs);
    assert.deepEqual(boundBodyContains({ bodyContains: "x", since: T0 }, now), {
      filter: { bodyContains: "x", since: T0 },
      since: undefined,
    });
    assert.deepEqual(boundBodyContains({ bodyJson: '{"a":"b"}' }, now).since, undefined);
  });

  it("index bodies up to DEFAULTS.searchBodyBytes, the size both backends index: a new size is a new migration", async () => {
    const limit = `length(body) > ${DEFAULTS.searchBodyBytes}`;
    assert.ok(PG_MIGRATIONS[SEARCH.postgres]!.includes(limit), "PostgreSQL's search migration");
    const dir = tempDir();
    try {
      const inbox = await connect(join(dir.dir, "size.db"));
      await inbox.enableSearch();
      const [trigger] = await inbox.query("SELECT sql FROM sqlite_master WHERE name = 'deliveries_search_update'");
      assert.ok(String(trigger?.sql).includes(`length(new.body) <= ${DEFAULTS.searchBodyBytes}`), "SQLite's trigger");
      await inbox.close();
    } finally {
      dir.cleanup();
    }
  });
});

// The rows an inbox from before search holds: JSON, a body that is not JSON, and a tombstone.
const HASH = sha256(Buffer.from("x"));
const oldRows = (json: string, text: string, empty: string) => `
  INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, attempts, available_at, finished_at, purged_at)
  VALUES ('stripe', 'evt_old', ${json}, '${HASH}', ${T0}, 'done', 1, ${T0}, ${T0}, NULL),
         ('form', 'f_old', ${text}, '${HASH}', ${T0}, 'received', 0, ${T0}, NULL, NULL),
         ('stripe', 'evt_gone', ${empty}, '${HASH}', ${T0}, 'done', 1, ${T0}, ${T0}, ${T0});`;
const JSON_BODY = '{"data":{"object":{"customer":"cus_old"}}}';
const hex = (text: string) => Buffer.from(text).toString("hex");

async function searchesOld(target: string): Promise<void> {
  // The upgrade indexes nothing: the index is off, and the forms say how to turn it on.
  const before = await connect(target, { now: () => T0 + 1_000 });
  try {
    assert.equal((await before.searchStatus()).enabled, false);
    assert.equal(Number((await before.query("SELECT count(*) AS n FROM deliveries_search"))[0]!.n), 0);
    await assert.rejects(before.search({ bodyWords: "cus_old" }), /inbox\.ts search enable/);
  } finally {
    await before.close();
  }
  const enabled = await runScript("inbox.ts", ["search", "enable", "--db", target, "--batch", "1"]);
  assert.equal(enabled.code, 0, enabled.stderr);
  assert.match(enabled.stdout, /search index: on since .*, 2 rows stored before it backfilled/);
  const status = await runScript("inbox.ts", ["search", "status", "--db", target, "--json"]);
  assert.deepEqual(JSON.parse(status.stdout), {
    enabled: true,
    backfilled: 2,
    toBackfill: 2,
    ready: true,
    changedAt: JSON.parse(status.stdout).changedAt,
    pending: 0,
  });
  const inbox = await connect(target, { now: () => T0 + 1_000 });
  try {
    assert.equal((await inbox.auditLog({ limit: 1 }))[0]?.operation, "search enable");
    const ids = async (filter: Parameters<Inbox["search"]>[0]) => (await inbox.search(filter)).map((d) => d.id);
    assert.deepEqual(await ids({ bodyJson: '{"data":{"object":{"customer":"cus_old"}}}' }), ["evt_old"]);
    assert.deepEqual(await ids({ bodyWords: "cus_old" }), ["evt_old"]);
    assert.deepEqual(await ids({ bodyWords: "customer" }), [], "a key is not a value");
    assert.deepEqual(await ids({ bodyContains: "cus_old" }), ["evt_old", "f_old"], "the body not JSON, by contains");
    // A delivery stored after the upgrade is indexed after its ack, before the search reads.
    await inbox.store({ source: "stripe", id: "evt_new", body: Buffer.from('{"customer":"cus_old"}') });
    assert.deepEqual(await ids({ bodyWords: "cus_old" }), ["evt_new", "evt_old"]);
  } finally {
    await inbox.close();
  }
}

describe("an inbox filled before search", () => {
  it("is left unindexed by the upgrade, and indexed by search enable, on SQLite", async () => {
    const dir = tempDir();
    try {
      const path = join(dir.dir, "old.db");
      const past = await pastSchema("sqlite", path, SQLITE_MIGRATIONS.slice(0, SEARCH.sqlite));
      await past.exec(oldRows(`X'${hex(JSON_BODY)}'`, `X'${hex("customer=cus_old")}'`, "X''"));
      // (control) before the migration there is nothing to search through.
      await assert.rejects(past.exec("SELECT * FROM deliveries_search"), /no such table/);
      await past.close();
      await searchesOld(path);
    } finally {
      dir.cleanup();
    }
  });

  it("is left unindexed by the upgrade, and indexed by search enable, on PostgreSQL", { skip: pgSkip }, async () => {
    const fresh = await freshSchema("searchold");
    try {
      const past = await pastSchema("postgres", fresh.schema, PG_MIGRATIONS.slice(0, SEARCH.postgres));
      try {
        await past.exec(
          oldRows(`'\\x${hex(JSON_BODY)}'::bytea`, `'\\x${hex("customer=cus_old")}'::bytea`, "'\\x'::bytea"),
        );
        await assert.rejects(past.exec("SELECT * FROM deliveries_search"), /does not exist/);
      } finally {
        await past.close();
      }
      await searchesOld(fresh.url);
    } finally {
      await fresh.drop();
    }
  });
});

// The triggers main had before the index moved after the ack, which indexed each body in its store's
// transaction: what an inbox with the index on holds when it meets the migration that swaps them.
const IN_THE_ACK = {
  sqlite: `
    CREATE TRIGGER deliveries_search_insert AFTER INSERT ON deliveries
      WHEN length(new.body) <= 65536 AND json_valid(CAST(new.body AS TEXT))
    BEGIN
      INSERT INTO deliveries_search (rowid, words) SELECT new.rowid,
        (SELECT group_concat(CASE type WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' ELSE value END, ' ')
           FROM json_tree(CAST(new.body AS TEXT)) WHERE type IN ('text', 'integer', 'real', 'true', 'false'));
    END;
    CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON deliveries
    BEGIN
      DELETE FROM deliveries_search WHERE rowid = old.rowid;
    END;
    CREATE TRIGGER deliveries_search_delete AFTER DELETE ON deliveries
    BEGIN
      DELETE FROM deliveries_search WHERE rowid = old.rowid;
    END;
    UPDATE search_state SET enabled = 1, changed_at = ${T0};`,
  postgres: `
    CREATE TRIGGER deliveries_search_insert AFTER INSERT ON delivery_rows
      FOR EACH ROW WHEN (NEW.route = 0 AND octet_length(NEW.body) > 0) EXECUTE FUNCTION inbox_search_sync();
    CREATE TRIGGER deliveries_search_update AFTER UPDATE OF body ON delivery_rows
      FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_sync();
    CREATE TRIGGER deliveries_search_delete AFTER DELETE ON delivery_rows
      FOR EACH ROW WHEN (OLD.route = 0) EXECUTE FUNCTION inbox_search_sync();
    CREATE TRIGGER deliveries_search_body AFTER INSERT ON delivery_bodies
      FOR EACH ROW WHEN (NEW.route = 0) EXECUTE FUNCTION inbox_search_sync();
    UPDATE search_state SET enabled = true, done = true, changed_at = ${T0};`,
};

// searchesIndexed opens an inbox whose index was kept in the ack (its rows indexed by those triggers) and checks
// that the upgrade took them over: nothing indexed again or twice, nothing left out, a new store indexed after
// its ack, a dropped body gone.
async function searchesIndexed(target: string): Promise<void> {
  const inbox = await connect(target, { now: () => T0 + 1_000 });
  try {
    const indexed = async () => Number((await inbox.query("SELECT count(*) AS n FROM deliveries_search"))[0]!.n);
    assert.equal(await indexed(), 1, "(control) the old trigger had indexed the JSON body");
    const status = await inbox.searchStatus();
    assert.deepEqual([status.enabled, status.ready, status.pending], [true, true, 0]);
    const ids = async (filter: Parameters<Inbox["search"]>[0]) => (await inbox.search(filter)).map((d) => d.id);
    assert.deepEqual(await ids({ bodyWords: "cus_old" }), ["evt_old"]);
    assert.equal(await indexed(), 1, "nothing indexed twice");
    await inbox.store({ source: "stripe", id: "evt_new", body: Buffer.from('{"customer":"cus_old"}') });
    assert.equal(await indexed(), 1, "the store left its body to the indexer");
    assert.deepEqual(await ids({ bodyWords: "cus_old" }), ["evt_new", "evt_old"]);
    assert.equal(await indexed(), 2);
    assert.equal((await inbox.dropBodies({ id: "evt_old" })).bodies, 1);
    assert.deepEqual(await ids({ bodyWords: "cus_old" }), ["evt_new"]);
  } finally {
    await inbox.close();
  }
}

describe("an inbox with the index on, kept in the ack before", () => {
  it("is upgraded to indexing after the ack, its rows indexed once, on SQLite", async () => {
    const dir = tempDir();
    try {
      const path = join(dir.dir, "indexed.db");
      const past = await pastSchema("sqlite", path, SQLITE_MIGRATIONS.slice(0, SEARCH.sqlite + 1));
      await past.exec(IN_THE_ACK.sqlite);
      await past.exec(oldRows(`X'${hex(JSON_BODY)}'`, `X'${hex("customer=cus_old")}'`, "X''"));
      await past.close();
      await searchesIndexed(path);
    } finally {
      dir.cleanup();
    }
  });

  it("is upgraded to indexing after the ack, its triggers swapped, on PostgreSQL", { skip: pgSkip }, async () => {
    const fresh = await freshSchema("searchindexed");
    try {
      const past = await pastSchema("postgres", fresh.schema, PG_MIGRATIONS.slice(0, SEARCH.postgres + 1));
      try {
        await past.exec(IN_THE_ACK.postgres);
        await past.exec(
          oldRows(`'\\x${hex(JSON_BODY)}'::bytea`, `'\\x${hex("customer=cus_old")}'::bytea`, "'\\x'::bytea"),
        );
      } finally {
        await past.close();
      }
      await searchesIndexed(fresh.url);
    } finally {
      await fresh.drop();
    }
  });
});

describe("the CLI's list and the page", () => {
  const dir = tempDir();
  const db = join(dir.dir, "inbox.db");
  let admin: Awaited<ReturnType<typeof startAdmin>>;

  before(async () => {
    const inbox = await connect(db);
    await inbox.enableSearch();
    await inbox.store({ source: "stripe", id: "evt_1", body: Buffer.from('{"data":{"object":{"customer":"cus_1"}}}') });
    await inbox.store({ source: "stripe", id: "evt_2", body: Buffer.from('{"data":{"object":{"customer":"cus_2"}}}') });
    await inbox.close();
    admin = await startAdmin(["--db", db]);
  });

  it("refuses the forms while the index is off, on the CLI (naming the command) and the page (409); body contains answers", async () => {
    const off = join(dir.dir, "off.db");
    const inbox = await connect(off);
    await inbox.store({ source: "stripe", id: "evt_1", body: Buffer.from('{"data":{"object":{"customer":"cus_1"}}}') });
    await inbox.close();
    const refused = await runScript("inbox.ts", ["list", "--db", off, "--body-words", "cus_1"]);
    assert.equal(refused.code, 1);
    assert.match(refused.stderr, /body search \(bodyJson, bodyWords\) is off in this inbox.*inbox\.ts search enable/);
    const contains = await runScript("inbox.ts", ["list", "--db", off, "--json", "--body-contains", "cus_1"]);
    assert.deepEqual(
      (JSON.parse(contains.stdout) as { id: string }[]).map((d) => d.id),
      ["evt_1"],
    );
    assert.match((await runScript("inbox.ts", ["search", "status", "--db", off])).stdout, /search index: off/);
    const page = await startAdmin(["--db", off]);
    try {
      const r = await fetch(`${page.url}/deliveries?bodyWords=cus_1`);
      assert.equal(r.status, 409);
      assert.match(await r.text(), /search enable/);
    } finally {
      page.child.kill("SIGTERM");
    }
    // The control: turned on, the same list answers.
    assert.equal((await runScript("inbox.ts", ["search", "enable", "--db", off])).code, 0);
    const on = await runScript("inbox.ts", ["list", "--db", off, "--json", "--body-words", "cus_1"]);
    assert.equal(on.code, 0, on.stderr);
    assert.deepEqual(
      (JSON.parse(on.stdout) as { id: string }[]).map((d) => d.id),
      ["evt_1"],
    );
  });
  after(() => {
    admin?.child.kill("SIGTERM");
    dir.cleanup();
  });

  it("lists by --body-json and --body-words, and refuses a form no index can answer as a usage error", async () => {
    const list = (...args: string[]) => runScript("inbox.ts", ["list", "--db", db, "--json", ...args]);
    const ids = (run: { stdout: string }) => (JSON.parse(run.stdout) as { id: string }[]).map((d) => d.id);
    assert.deepEqual(ids(await list("--body-json", '{"data":{"object":{"customer":"cus_2"}}}')), ["evt_2"]);
    assert.deepEqual(ids(await list("--body-words", "CUS_1")), ["evt_1"]);
    const refused = await list("--body-json", '{"customer":null}');
    assert.equal(refused.code, 2, refused.stderr);
    assert.match(refused.stderr, /--body-json.*expected at least one string, whole number or true\/false/);
  });

  it("says on stderr that --body-contains read a day's bodies, and not when --since is given", async () => {
    const run = await runScript("inbox.ts", ["list", "--db", db, "--json", "--body-contains", "cus_1"]);
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(
      (JSON.parse(run.stdout) as { id: string }[]).map((d) => d.id),
      ["evt_1"],
    );
    assert.match(run.stderr, /--body-contains reads every body, so it searched those received since/);
    const given = await runScript("inbox.ts", ["list", "--db", db, "--body-contains", "cus_1", "--since", "2d"]);
    assert.equal(given.stderr, "");
  });

  it("searches on the page by Body JSON and Body words, says when Body contains was bounded, and answers 400 to a bad form", async () => {
    const get = async (query: string) => {
      const r = await fetch(`${admin.url}/deliveries?${query}`);
      return { status: r.status, text: await r.text() };
    };
    const json = await get(`bodyJson=${encodeURIComponent('{"data":{"object":{"customer":"cus_1"}}}')}`);
    assert.equal(json.status, 200);
    assert.match(json.text, /evt_1/);
    assert.doesNotMatch(json.text, /evt_2/);
    assert.match(json.text, /name="bodyJson" value="\{&#34;data/);
    const words = await get("bodyWords=cus_2");
    assert.match(words.text, /evt_2/);
    assert.doesNotMatch(words.text, /evt_1/);
    assert.doesNotMatch(words.text, /searched those received since/);
    const contains = await get("q=cus_2");
    assert.match(contains.text, /evt_2/);
    assert.match(contains.text, /searched those received since/);
    const bad = await get("bodyJson=%7B%7D");
    assert.equal(bad.status, 400);
    assert.match(bad.text, /bodyJson: expected at least one string/);
  });
});
