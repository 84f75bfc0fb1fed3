// test/retention.test.ts: running for years. The SQLite file really shrinks after a purge (and an older
// file after purge --vacuum); the CLI's purge, retry --failed, replay, export and import as an operator
// runs them; and export then import keeps every byte of every body, on SQLite and on PostgreSQL.

import assert from "node:assert/strict";
import { readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { DEFAULTS } from "../lib/defaults.ts";
import { exportLine, importLine, parseDuration, parseWhen } from "../lib/format.ts";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import type { Inbox } from "../lib/store.ts";
import { freshSchema, postgresSkip, runScript, tempDir } from "./helpers.ts";

const DAY = 86_400_000;
const cli = (...args: string[]) => runScript("inbox.ts", args);
const pgSkip = await postgresSkip();

// handleAll finishes every due delivery, failing those whose ID starts with "bad".
async function handleAll(inbox: Inbox, error = "Timeout talking to the ledger"): Promise<void> {
  for (let leases = await inbox.claimBatch(100); leases.length > 0; leases = await inbox.claimBatch(100)) {
    for (const lease of leases) {
      if (lease.id.startsWith("bad")) await inbox.fail(lease, error, { permanent: true });
      else await inbox.finish(lease);
    }
  }
}

let dir: { dir: string; cleanup: () => void };
let path: string;
beforeEach(() => {
  dir = tempDir();
  path = join(dir.dir, "inbox.db");
});
afterEach(() => dir.cleanup());

describe("the SQLite file after a purge", () => {
  const fill = async (inbox: SqliteInbox) => {
    const big = Buffer.alloc(20_000, "x");
    for (let i = 0; i < 300; i++) await inbox.store({ id: `evt_${i}`, body: big });
    await handleAll(inbox);
  };
  const onDisk = (inbox: SqliteInbox) => {
    inbox.db.exec("PRAGMA wal_checkpoint(TRUNCATE)");
    return statSync(path).size;
  };

  // inbox.ts purge and the worker's --purge-every purge through a connection with syncOffLoop (each batch's
  // fdatasync after the write lock is let go); a library caller's purge on its own inbox commits at FULL: the
  // same purge on both.
  for (const [how, options] of [
    ["synchronous = FULL", {}],
    ["syncOffLoop, as inbox.ts purge and worker.ts --purge-every open it", { syncOffLoop: true }],
  ] as const)
    it(`really shrinks: a new file gives the freed pages back to the file system (${how})`, async () => {
      let t = Date.now();
      let commits = 0;
      const inbox = new SqliteInbox(path, { now: () => t, onCommit: () => commits++, ...options });
      try {
        await fill(inbox);
        const before = onDisk(inbox);
        t += 8 * DAY;
        commits = 0;
        const purged = await inbox.purge();
        assert.equal(purged.bodies, 300);
        assert.ok(purged.vacuumedBytes > 4_000_000, `vacuumed ${purged.vacuumedBytes}`);
        // The pages go back a bounded step a transaction, so no writer waits behind more than one step.
        const steps = Math.ceil(purged.vacuumedBytes / 4096 / DEFAULTS.vacuumStepPages);
        assert.ok(commits >= 300 / DEFAULTS.purgeBatch + steps, `${commits} commits for ${steps} steps`);
        const after = onDisk(inbox);
        assert.ok(after < before / 10, `${before} bytes before, ${after} after`);
        assert.equal((await inbox.kept()).autoVacuum, "incremental");
        assert.equal(await inbox.store({ id: "evt_7", body: Buffer.alloc(20_000, "x") }), "duplicate");
      } finally {
        await inbox.close();
      }
      // What the purge settled is in the file as another connection opens it: tombstones, not bodies.
      const reopened = new SqliteInbox(path);
      try {
        const kept = await reopened.kept();
        assert.equal(kept.tombstones.count, 300);
        assert.equal(kept.bodies.count, 0);
      } finally {
        await reopened.close();
      }
    });

  it("keeps its size on a file made before retention (the space is reused), until purge --vacuum converts it once", async () => {
    let t = Date.now() - 8 * DAY;
    const old = new SqliteInbox(path, { now: () => t });
    // As a database created by an earlier version: no auto_vacuum.
    old.db.exec("PRAGMA auto_vacuum = NONE");
    old.db.exec("VACUUM");
    await fill(old);
    t += 8 * DAY;
    const before = onDisk(old);
    const purged = await old.purge();
    assert.equal(purged.vacuumedBytes, 0);
    assert.equal(purged.fileKeepsSize, true, "the purge itself says so, for the CLI to tell without reading every row");
    assert.ok(onDisk(old) >= before, "no auto_vacuum: the file keeps its size");
    assert.equal((await old.kept()).autoVacuum, "none");
    await old.close();

    const status = await cli("status", "--db", path);
    assert.match(status.stdout, /made before retention: run `purge --vacuum` once/);
    const again = await cli("purge", "--db", path);
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stdout, /The file keeps its size .*run `purge --vacuum` once/);
    const vacuum = await cli("purge", "--vacuum", "--db", path);
    assert.equal(vacuum.code, 0, vacuum.stderr);
    assert.match(vacuum.stdout, /^Vacuumed .*: [\d.]+ MB before, [\d.]+ KB after/);
    assert.ok(statSync(path).size < before / 10, `${before} bytes before, ${statSync(path).size} after`);
    const reopened = new SqliteInbox(path);
    assert.equal((await reopened.kept()).autoVacuum, "incremental");
    assert.equal((await reopened.purge()).fileKeepsSize, undefined, "a file that shrinks says nothing");
    assert.equal((await reopened.kept()).tombstones.count, 300, "the tombstones survive the rewrite");
    await reopened.close();
  });

  // SQLite's documentation says VACUUM "may change the ROWIDs" of a table without an INTEGER PRIMARY KEY, which
  // delivery_rows is. The search index holds each row's words by its rowid, and an order key's head its rowid
  // (head_seq): renumbered, a search would answer with other deliveries. What SQLite does today is keep them
  // (its copy of each table carries the rowids over); this pins it, so that an SQLite that stops doing so fails here.
  it("keeps every delivery's rowid through purge --vacuum, which the search index and an order key's head go by", async () => {
    const old = new SqliteInbox(path);
    old.db.exec("PRAGMA auto_vacuum = NONE");
    old.db.exec("VACUUM");
    await old.enableSearch();
    for (let i = 0; i < 300; i++) {
      const pad = "x".repeat(i % 2 === 0 ? 20 : DEFAULTS.inlineBodyBytes + 100); // in its row, and apart
      await old.store({ id: `evt_${i}`, body: Buffer.from(JSON.stringify({ word: `w${i}x`, pad })) });
    }
    // Gaps in the rowids, as forgotten tombstones leave them: a renumbering copy would close them.
    old.db.exec("DELETE FROM delivery_rows WHERE rowid % 3 = 0");
    const kept = Array.from({ length: 300 }, (_, i) => `evt_${i}`).filter((_, i) => (i + 1) % 3 !== 0);
    assert.deepEqual(
      (await old.search({ bodyWords: "w1x" })).map((d) => d.id),
      ["evt_1"],
    ); // the index caught up
    const rowids = (db: DatabaseSync, table = "delivery_rows") =>
      db
        .prepare(`SELECT rowid, id FROM ${table} ORDER BY id`)
        .all()
        .map((r) => `${r.id}@${r.rowid}`);
    const before = rowids(old.db);
    // The control: a copy that does not carry the rowids over numbers them anew, and the comparison sees it.
    old.db.exec("CREATE TEMP TABLE copied AS SELECT * FROM delivery_rows");
    assert.notDeepEqual(rowids(old.db, "temp.copied"), before);
    await old.close();

    const vacuum = await cli("purge", "--vacuum", "--db", path);
    assert.equal(vacuum.code, 0, vacuum.stderr);
    const reopened = new SqliteInbox(path);
    try {
      assert.equal((await reopened.kept()).autoVacuum, "incremental", "the file was rewritten");
      assert.deepEqual(rowids(reopened.db), before);
      for (const id of kept) {
        const word = `w${id.slice(4)}x`;
        assert.deepEqual(
          (await reopened.search({ bodyWords: word })).map((d) => d.id),
          [id],
          word,
        );
      }
    } finally {
      await reopened.close();
    }
  });
});

describe("inbox.ts purge, retry --failed, replay", () => {
  // Ten days of deliveries: old done ones, young done ones, and failures with two kinds of error.
  async function story(): Promise<void> {
    let t = Date.now() - 10 * DAY;
    const inbox = new SqliteInbox(path, { now: () => t });
    for (const id of ["old_1", "old_2"])
      await inbox.store({ source: "stripe", id, eventType: "invoice.paid", body: Buffer.from(`{"id":"${id}"}`) });
    await handleAll(inbox);
    t = Date.now() - DAY;
    await inbox.store({
      source: "stripe",
      id: "young",
      eventType: "invoice.paid",
      body: Buffer.from('{"id":"young"}'),
    });
    await inbox.store({ source: "stripe", id: "bad_1", body: Buffer.from("{}") });
    await inbox.store({ source: "github", id: "bad_2", body: Buffer.from("{}") });
    await handleAll(inbox);
    t = Date.now() - 60_000;
    await inbox.store({ source: "github", id: "bad_3", body: Buffer.from("{}") });
    await handleAll(inbox, "HTTP 500 from CI");
    await inbox.close();
  }
  const rowOf = (id: string) => {
    const db = new DatabaseSync(path, { readOnly: true });
    try {
      return {
        ...(db
          .prepare("SELECT status, attempts, replays, length(body) AS bytes, purged_at FROM deliveries WHERE id = ?")
          .get(id) as object),
      } as Record<string, unknown>;
    } finally {
      db.close();
    }
  };

  it("purge --dry-run says what would go and changes nothing; purge drops it; status shows what is kept", async () => {
    await story();
    const dry = await cli("purge", "--dry-run", "--db", path);
    assert.equal(dry.code, 0, dry.stderr);
    assert.equal(
      dry.stdout,
      [
        "Would drop 2 bodies (28 B) of done deliveries older than 7d; their tombstones stay.",
        "Would forget 0 tombstones older than 30d: those IDs would be stored as new if they came again.",
        "(dry run: nothing changed)",
        "",
      ].join("\n"),
    );
    assert.equal(rowOf("old_1").bytes, 14);
    const real = await cli("purge", "--json", "--db", path);
    assert.equal(real.code, 0, real.stderr);
    assert.deepEqual(
      { ...JSON.parse(real.stdout), vacuumedBytes: 0 },
      { bodies: 2, bytes: 28, forgotten: 0, vacuumedBytes: 0, dryRun: false },
    );
    assert.deepEqual([rowOf("old_1").bytes, rowOf("old_1").status], [0, "done"]);
    const status = await cli("status", "--db", path);
    assert.match(status.stdout, /^kept: 4 with their body \(\d+ B, oldest \S+\); 2 tombstones, oldest \S+$/m);
    const json = JSON.parse((await cli("status", "--json", "--db", path)).stdout);
    assert.equal(json.kept.tombstones.count, 2);
  });

  it("purges a failed delivery only by name, and then will not retry it", async () => {
    await story();
    const purge = await cli("purge", "bad_1", "--db", path);
    assert.equal(purge.code, 0, purge.stderr);
    assert.match(purge.stdout, /^Dropped the body of stripe\/bad_1 \(2 B\); its tombstone stays\.$/m);
    const retry = await cli("retry", "bad_1", "--db", path);
    assert.equal(retry.code, 1);
    assert.match(retry.stderr, /cannot be retried: its body was purged/);
  });

  it("refuses a memory no longer than the bodies, and an age it cannot read: exit 2", async () => {
    await story();
    const short = await cli("purge", "--bodies-after", "7d", "--forget-after", "3d", "--db", path);
    assert.equal(short.code, 2);
    assert.match(short.stderr, /--forget-after \(3d\) must be longer than --bodies-after \(7d\)/);
    const bad = await cli("purge", "--bodies-after", "a week", "--db", path);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /expected an age such as 30m/);
    const since = await cli("retry", "--failed", "--since", "last tuesday", "--db", path);
    assert.equal(since.code, 2);
    assert.match(since.stderr, /expected an ISO date/);
  });

  it("retry --failed takes filters and --dry-run; run twice, the second finds nothing", async () => {
    await story();
    const dry = await cli("retry", "--failed", "--error-match", "timeout", "--dry-run", "--db", path);
    assert.equal(dry.stdout, "Would queue 2 failed deliveries again (dry run: nothing changed).\n");
    assert.equal(rowOf("bad_1").status, "failed");
    const some = await cli("retry", "--failed", "--source", "github", "--since", "2h", "--db", path);
    assert.equal(some.stdout, "Queued 1 failed delivery again.\n");
    assert.deepEqual([rowOf("bad_3").status, rowOf("bad_2").status], ["received", "failed"]);
    assert.equal(
      (await cli("retry", "--failed", "--source", "github", "--since", "2h", "--db", path)).stdout,
      "Queued 0 failed deliveries again.\n",
    );
    assert.equal((await cli("retry", "--all-failed", "--db", path)).stdout, "Queued 2 failed deliveries again.\n");
  });

  it("replay ID and replay by filter queue done deliveries again under their key; a tombstone says why not", async () => {
    await story();
    await cli("purge", "--db", path);
    const one = await cli("replay", "young", "--db", path);
    assert.equal(one.code, 0, one.stderr);
    assert.equal(one.stdout, "Replayed 1 done delivery: queued again, attempts reset.\n");
    assert.deepEqual([rowOf("young").status, rowOf("young").attempts, rowOf("young").replays], ["received", 0, 1]);
    const tomb = await cli("replay", "old_1", "--db", path);
    assert.equal(tomb.code, 1);
    assert.match(tomb.stderr, /cannot be replayed: its body was purged/);
    const many = await cli("replay", "--type", "invoice.paid", "--dry-run", "--db", path);
    assert.equal(
      many.stdout,
      [
        "Would replay 0 done deliveries (dry run: nothing changed).",
        "2 more matched but cannot be replayed: their bodies were purged (tombstones).",
        "",
      ].join("\n"),
    );
    const bare = await cli("replay", "--db", path);
    assert.equal(bare.code, 2, "a bare replay would take every done delivery: it asks for --all");
  });
});

describe("parseDuration() and parseWhen()", () => {
  it("read ages and ISO dates, and nothing else", () => {
    assert.equal(parseDuration("90s"), 90_000);
    assert.equal(parseDuration("1.5h"), 5_400_000);
    assert.equal(parseDuration("7d"), 7 * DAY);
    assert.equal(parseDuration("7"), undefined);
    const now = Date.UTC(2026, 0, 10);
    assert.equal(parseWhen("2d", now), now - 2 * DAY);
    assert.equal(parseWhen("2026-01-05", now), Date.UTC(2026, 0, 5));
    assert.equal(parseWhen("2026-01-05T12:00:00Z", now), Date.UTC(2026, 0, 5, 12));
    assert.equal(parseWhen("March", now), undefined);
  });
});

// Bodies a round trip could damage: not UTF-8, empty, NUL bytes, a BOM, and text that is.
const BODIES: [string, Buffer][] = [
  ["latin1", Buffer.from([0x7b, 0xe9, 0xff, 0xfe, 0x7d])],
  ["empty", Buffer.alloc(0)],
  ["nul", Buffer.from([0x00, 0x01, 0x00, 0x80])],
  ["bom", Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d])],
  ["utf8", Buffer.from('{"name":"Zoë 🧾"}')],
  ["lone-surrogate", Buffer.from([0xed, 0xa0, 0x80])],
];

for (const backend of ["sqlite", "postgres"] as const) {
  describe(`export and import on ${backend}`, { skip: backend === "postgres" ? pgSkip : false }, () => {
    it("keeps every byte of every body, tombstones included; importing again skips them all and says so", async () => {
      const from = join(dir.dir, "from.db");
      let t = Date.now() - 9 * DAY;
      const source = new SqliteInbox(from, { now: () => t });
      for (const [id, bytes] of BODIES)
        await source.store({ source: "raw", id, body: bytes, contentType: "application/octet-stream" });
      await source.store({ id: "bad_json", body: Buffer.from("{}") });
      await handleAll(source);
      t += 8 * DAY;
      await source.store({ id: "waiting", body: Buffer.from([0xc3, 0x28]), eventType: "x" });
      await source.dropBodies({ id: "utf8" });
      await source.close();

      const fresh = backend === "postgres" ? await freshSchema("export") : undefined;
      const to = fresh?.url ?? join(dir.dir, "to.db");
      try {
        const exported = join(dir.dir, "a.jsonl");
        const out = await cli("export", "--out", exported, "--db", from);
        assert.equal(out.code, 0, out.stderr);
        assert.equal(out.stderr, `Exported 8 deliveries to ${exported}.\n`);
        const lines = readFileSync(exported, "utf8")
          .trimEnd()
          .split("\n")
          .map((l) => JSON.parse(l));
        const latin1 = lines.find((l) => l.id === "latin1")!;
        assert.deepEqual(
          [latin1.body, latin1.bodyBase64, latin1.bodyBytes],
          [null, BODIES[0]![1].toString("base64"), 5],
        );
        assert.equal(lines.find((l) => l.id === "bom")!.body, "\ufeff{}", "UTF-8 bodies also come as text");

        const imported = await cli("import", exported, "--db", to);
        assert.equal(imported.code, 0, imported.stderr);
        assert.equal(imported.stdout, "Imported 8 deliveries; skipped 0 already present.\n");
        const inbox = await connect(to);
        try {
          for (const [id, bytes] of BODIES) {
            const [d] = await inbox.find(id, "raw");
            if (id === "utf8")
              assert.deepEqual([d!.body.length, d!.purgedAt !== null], [0, true], "a tombstone stays a tombstone");
            else assert.ok(d!.body.equals(bytes), `${id}: ${d!.body.toString("hex")} != ${bytes.toString("hex")}`);
          }
          assert.equal(
            await inbox.store({ source: "raw", id: "utf8", body: BODIES[4]![1] }),
            "duplicate",
            "the moved tombstone still remembers",
          );
        } finally {
          await inbox.close();
        }
        const back = join(dir.dir, "b.jsonl");
        await cli("export", "--out", back, "--db", to);
        assert.equal(readFileSync(back, "utf8"), readFileSync(exported, "utf8"), "exported again, the same bytes");

        const again = await cli("import", exported, "--db", to);
        assert.equal(again.stdout, "Imported 0 deliveries; skipped 8 already present.\n");
        const dry = await cli("import", exported, "--dry-run", "--db", to);
        assert.equal(dry.stdout, "Would import 0 deliveries; skipped 8 already present (dry run: nothing changed).\n");
      } finally {
        await fresh?.drop();
      }
    });
  });
}

describe("importLine()", () => {
  it("refuses a body that does not match its hash, naming the line", async () => {
    const inbox = new SqliteInbox(path);
    await inbox.store({ id: "evt_1", body: Buffer.from("{}") });
    const [d] = await inbox.find("evt_1");
    await inbox.close();
    const line = exportLine(d!);
    assert.deepEqual(importLine(JSON.parse(JSON.stringify(line))).body, Buffer.from("{}"));
    assert.throws(
      () => importLine({ ...line, purgedAt: 1, bodyBase64: "" }),
      /expected a tombstone \(purgedAt set\) to be done or failed, got received/,
    );
    const file = join(dir.dir, "forged.jsonl");
    writeFileSync(
      file,
      `${JSON.stringify(line)}\n${JSON.stringify({ ...line, id: "evt_2", bodyBase64: Buffer.from("[]").toString("base64") })}\n`,
    );
    const r = await cli("import", file, "--db", join(dir.dir, "other.db"));
    assert.equal(r.code, 2);
    assert.match(r.stderr, /forged\.jsonl:2: the body of default\/evt_2 does not match its sha256/);
  });
});
