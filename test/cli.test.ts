// test/cli.test.ts: inbox.ts as the operator runs it, a real process on a real database: what each
// command prints, its exit code (0 success, 1 not found or refused, 2 usage error), and errors in one line.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, before, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { runScript, tempDir } from "./helpers.ts";

const cli = (...args: string[]) => runScript("inbox.ts", args);
const payment = (customer: string, amount: number) => Buffer.from(JSON.stringify({ customer, amount }));
const NOT_UTF8 = Buffer.from([0x7b, 0xff, 0xfe, 0x7d]);

// oneLine asserts a failed command said why in a single line on stderr, with no stack trace.
function oneLine(result: { stdout: string; stderr: string }, re: RegExp): void {
  assert.equal(result.stdout, "");
  assert.doesNotMatch(result.stderr, /^\s+at /m, "a stack trace was printed");
  assert.equal(result.stderr.trimEnd().split("\n").length, 1, `expected one line, got:\n${result.stderr}`);
  assert.match(result.stderr.trimEnd(), re);
}

const rowOf = (path: string, id: string) => {
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    return { ...(db.prepare("SELECT status, attempts, error FROM deliveries WHERE id = ?").get(id) as object) };
  } finally {
    db.close();
  }
};

// The inbox after the article's story, plus a failure, a conflicting copy, a delivery still waiting
// five minutes after it arrived, a body that is not UTF-8, and an ID that two sources share.
async function story(path: string): Promise<void> {
  let t = Date.now() - 10 * 60_000;
  const inbox = new SqliteInbox(path, { now: () => t });
  await inbox.store({ id: "evt_100", body: payment("Maria Lopez", 24.99), contentType: "application/json" });
  await inbox.store({ id: "evt_100", body: payment("Maria Lopez", 99) }); // a conflicting copy
  t += 1_000;
  await inbox.store({ id: "evt_101", body: payment("Sam Okafor", 12.5) });
  t += 1_000;
  await inbox.store({ id: "evt_102", body: payment("Nobody", 1) });
  for (let lease = await inbox.claim(); lease; lease = await inbox.claim()) {
    if (lease.id === "evt_102") await inbox.fail(lease, "unknown customer", { permanent: true });
    else await inbox.finish(lease);
  }
  t = Date.now() - 5 * 60_000;
  await inbox.store({ id: "evt_103", body: NOT_UTF8 });
  await inbox.close();
}

describe("inbox.ts", () => {
  const dir = tempDir();
  const path = join(dir.dir, "inbox.db");
  before(() => story(path));
  after(() => dir.cleanup());

  describe("status", () => {
    it("prints one `name count` line per status, the failures, the oldest wait and the conflicts", async () => {
      const { code, stdout, stderr } = await cli("status", "--db", path);
      assert.equal(code, 0, stderr);
      const lines = stdout.split("\n");
      assert.equal(
        lines.slice(0, 6).join("\n"),
        [
          "received   1",
          "done       2",
          "failed     1",
          "  failed: evt_102 after 1 attempt: unknown customer",
          "oldest waiting: 5m",
          "conflicts: 1 deliveries had 1 duplicates with a different body (the first copy was kept)",
        ].join("\n"),
      );
      assert.match(lines[6]!, /^kept: 4 with their body \(\d+ B, oldest \S+\); 0 tombstones$/);
      assert.match(lines[7]!, /^on disk: [\d.]+ KB/);
      assert.equal(lines.length, 9);
    });

    it("prints the same as JSON with --json", async () => {
      const { code, stdout } = await cli("status", "--json", "--db", path);
      assert.equal(code, 0);
      const status = JSON.parse(stdout);
      assert.deepEqual(status.counts, { received: 1, processing: 0, done: 2, failed: 1 });
      assert.deepEqual(
        status.failed.map((f: { id: string; attempts: number; error: string }) => [f.id, f.attempts, f.error]),
        [["evt_102", 1, "unknown customer"]],
      );
      assert.deepEqual(status.conflicts, { deliveries: 1, copies: 1 });
      assert.ok(status.oldestWaitingMs >= 5 * 60_000);
    });

    it("reads INBOX_DB when --db is not given", async () => {
      const { code, stdout } = await runScript("inbox.ts", ["status"], { INBOX_DB: path });
      assert.equal(code, 0);
      assert.match(stdout, /^done {7}2$/m);
    });

    it("says so when the inbox is empty", async () => {
      const empty = join(dir.dir, "empty.db");
      await new SqliteInbox(empty).close();
      const { code, stdout } = await cli("status", "--db", empty);
      assert.equal(code, 0);
      assert.equal(stdout, "(the inbox is empty)\n");
    });
  });

  describe("list", () => {
    it("lists deliveries newest first, one tab-separated line each", async () => {
      const { code, stdout } = await cli("list", "--db", path);
      assert.equal(code, 0);
      const lines = stdout
        .trimEnd()
        .split("\n")
        .map((l) => l.split("\t"));
      assert.deepEqual(lines[0], ["source", "id", "status", "attempts", "type", "received", "error"]);
      assert.deepEqual(
        lines.slice(1).map((l) => [l[1], l[2], l[3]]),
        [
          ["evt_103", "received", "0"],
          ["evt_102", "failed", "1"],
          ["evt_101", "done", "1"],
          ["evt_100", "done", "1"],
        ],
      );
      assert.equal(lines[2]![6], "unknown customer");
    });

    it("filters by --status and stops at --limit", async () => {
      const done = await cli("list", "--status", "done", "--limit", "1", "--db", path);
      assert.equal(done.code, 0);
      assert.deepEqual(
        done.stdout
          .trimEnd()
          .split("\n")
          .slice(1)
          .map((l) => l.split("\t")[1]),
        ["evt_101"],
      );
    });

    it("prints JSON with --json, with the body's size but not the body", async () => {
      const { code, stdout } = await cli("list", "--json", "--status", "received", "--db", path);
      assert.equal(code, 0);
      const [d, ...rest] = JSON.parse(stdout);
      assert.equal(rest.length, 0);
      assert.equal(d.id, "evt_103");
      assert.equal(d.bodyBytes, NOT_UTF8.length);
      assert.equal("body" in d, false);
    });

    it("takes the filters retry, replay and export take: --destination, --type, --since and the rest", async () => {
      const routed = join(dir.dir, "routed.db");
      let t = Date.now() - 3 * 3_600_000;
      const inbox = new SqliteInbox(routed, { now: () => t });
      await inbox.store({
        source: "stripe",
        id: "old",
        body: Buffer.from("{}"),
        eventType: "invoice.paid",
        destinations: ["app"],
      });
      t = Date.now() - 60_000;
      await inbox.store({
        source: "stripe",
        id: "paid",
        body: Buffer.from("{}"),
        eventType: "invoice.paid",
        destinations: ["app", "crm"],
      });
      await inbox.store({
        source: "stripe",
        id: "made",
        body: Buffer.from("{}"),
        eventType: "customer.created",
        destinations: ["crm"],
      });
      await inbox.close();
      const ids = async (...args: string[]) => {
        const r = await cli("list", "--json", "--db", routed, ...args);
        assert.equal(r.code, 0, r.stderr);
        return (JSON.parse(r.stdout) as { id: string; destination: string }[])
          .map((d) => `${d.id}:${d.destination}`)
          .sort();
      };
      assert.deepEqual(await ids("--destination", "crm"), ["made:crm", "paid:crm"]);
      assert.deepEqual(await ids("--type", "invoice.paid", "--destination", "app"), ["old:app", "paid:app"]);
      assert.deepEqual(await ids("--since", "2h", "--type", "invoice.paid"), ["paid:app", "paid:crm"]);
      assert.deepEqual(await ids("--until", "2h"), ["old:app"]);
      // (control) With none, every row.
      assert.equal((await ids()).length, 4);
    });

    it("refuses an unknown status with exit 2, in one line", async () => {
      const result = await cli("list", "--status", "lost", "--db", path);
      assert.equal(result.code, 2);
      oneLine(result, /expected one of received, processing, done, failed/);
    });
  });

  describe("show", () => {
    it("prints the metadata, the last error and the body", async () => {
      const { code, stdout } = await cli("show", "evt_102", "--db", path);
      assert.equal(code, 0);
      assert.match(stdout, /^status {8}failed$/m);
      assert.match(stdout, /^attempts {6}1$/m);
      assert.match(stdout, /^error {9}unknown customer$/m);
      assert.match(stdout, /^body {10}\d+ bytes$/m);
      assert.equal(stdout.trimEnd().split("\n").at(-1), '{"customer":"Nobody","amount":1}');
    });

    it("lists every try of a delivery, not only the last error, oldest first", async () => {
      const tried = join(dir.dir, "tried.db");
      let t = Date.now() - 10 * 60_000;
      const inbox = new SqliteInbox(tried, { now: () => t, random: () => 0 });
      await inbox.store({ id: "evt_t", body: Buffer.from("{}") });
      for (const error of ["did not answer within 30 s", "HTTP 502 from app: bad gateway"]) {
        const lease = (await inbox.claim(60_000))!;
        await inbox.fail(lease, error);
        t += 60_000;
      }
      await inbox.close();
      const { code, stdout } = await cli("show", "evt_t", "--db", tried);
      assert.equal(code, 0);
      assert.match(stdout, /^error {9}HTTP 502 from app: bad gateway$/m);
      assert.match(
        stdout,
        /^tries {9}#1 \S+Z - did not answer within 30 s\n {14}#2 \S+Z - HTTP 502 from app: bad gateway$/m,
      );
      const json = JSON.parse((await cli("show", "evt_t", "--json", "--db", tried)).stdout);
      assert.deepEqual(
        json.tries.map((x: { attempt: number; error: string }) => [x.attempt, x.error]),
        [
          [1, "did not answer within 30 s"],
          [2, "HTTP 502 from app: bad gateway"],
        ],
      );
      // (control) A delivery that never failed shows none.
      assert.match((await cli("show", "evt_101", "--db", path)).stdout, /^tries {9}-$/m);
    });

    it("shows a body that is not UTF-8 as base64, byte-exact", async () => {
      const { stdout } = await cli("show", "evt_103", "--db", path);
      assert.equal(stdout.trimEnd().split("\n").at(-1), `(not UTF-8; base64) ${NOT_UTF8.toString("base64")}`);
      const json = JSON.parse((await cli("show", "evt_103", "--json", "--db", path)).stdout);
      assert.equal(json.body, null);
      assert.deepEqual(Buffer.from(json.bodyBase64, "base64"), NOT_UTF8);
    });

    it("exits 1 with one line for an ID it does not have", async () => {
      const result = await cli("show", "evt_999", "--db", path);
      assert.equal(result.code, 1);
      oneLine(result, /^No delivery with ID evt_999\.$/);
    });

    it("asks for --source when two sources share the ID, and takes it", async () => {
      const shared = join(dir.dir, "sources.db");
      const inbox = new SqliteInbox(shared);
      await inbox.store({ source: "github", id: "42", body: Buffer.from('{"from":"github"}') });
      await inbox.store({ source: "stripe", id: "42", body: Buffer.from('{"from":"stripe"}') });
      await inbox.close();
      const ambiguous = await cli("show", "42", "--db", shared);
      assert.equal(ambiguous.code, 2);
      oneLine(ambiguous, /^ID 42 exists in sources github, stripe; pass --source\.$/);
      const chosen = await cli("show", "42", "--source", "stripe", "--json", "--db", shared);
      assert.equal(chosen.code, 0);
      assert.equal(JSON.parse(chosen.stdout).body, '{"from":"stripe"}');
      const listed = await cli("list", "--source", "github", "--json", "--db", shared);
      assert.deepEqual(
        JSON.parse(listed.stdout).map((d: { source: string; id: string }) => [d.source, d.id]),
        [["github", "42"]],
      );
    });
  });

  describe("retry", () => {
    it("puts a failed delivery back in the queue with its attempts reset", async () => {
      const { code, stdout } = await cli("retry", "evt_102", "--db", path);
      assert.equal(code, 0);
      assert.equal(stdout, "Queued again.\n");
      assert.deepEqual(rowOf(path, "evt_102"), { status: "received", attempts: 0, error: null });
    });

    it("exits 1 for a delivery that is not failed, and leaves it alone", async () => {
      const result = await cli("retry", "evt_100", "--db", path);
      assert.equal(result.code, 1);
      oneLine(result, /^No failed delivery with ID evt_100: it is done\.$/);
      assert.equal((rowOf(path, "evt_100") as { status: string }).status, "done");
    });

    it("--all-failed puts every failed delivery back and says how many", async () => {
      const many = join(dir.dir, "failed.db");
      const inbox = new SqliteInbox(many);
      for (const id of ["a", "b", "c"]) await inbox.store({ id, body: Buffer.from("{}") });
      for (let lease = await inbox.claim(); lease; lease = await inbox.claim()) {
        if (lease.id === "c") await inbox.finish(lease);
        else await inbox.fail(lease, "nope", { permanent: true });
      }
      await inbox.close();
      const { code, stdout } = await cli("retry", "--all-failed", "--db", many);
      assert.equal(code, 0);
      assert.equal(stdout, "Queued 2 failed deliveries again.\n");
      assert.deepEqual(rowOf(many, "c"), { status: "done", attempts: 1, error: null });
    });

    it("wants an ID or --all-failed, not both and not neither: exit 2", async () => {
      const neither = await cli("retry", "--db", path);
      assert.equal(neither.code, 2);
      oneLine(neither, /Give the ID of a failed delivery, or --all-failed\./);
      const both = await cli("retry", "evt_102", "--all-failed", "--db", path);
      assert.equal(both.code, 2);
      oneLine(both, /either an ID or --all-failed, not both/);
    });
  });

  describe("errors", () => {
    it("exits 1 for a --db that does not exist, and does not create it", async () => {
      const missing = join(dir.dir, "typo.db");
      const result = await cli("status", "--db", missing);
      assert.equal(result.code, 1);
      oneLine(result, /^No inbox database at .*typo\.db/);
      assert.equal(existsSync(missing), false);
    });

    it("exits 1 for another program's SQLite database, and leaves it as it was", async () => {
      const foreign = join(dir.dir, "app.sqlite");
      const app = new DatabaseSync(foreign);
      app.exec("CREATE TABLE users (name TEXT); INSERT INTO users VALUES ('ann')");
      app.close();
      for (const command of [["status"], ["list"], ["retry", "--all-failed"]]) {
        const result = await cli(...command, "--db", foreign);
        assert.equal(result.code, 1, command.join(" "));
        oneLine(result, /app\.sqlite is not an inbox database/);
      }
      const check = new DatabaseSync(foreign, { readOnly: true });
      const tables = (
        check.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[]
      ).map((t) => t.name);
      const { journal_mode: mode } = check.prepare("PRAGMA journal_mode").get() as { journal_mode: string };
      check.close();
      assert.deepEqual(tables, ["users"]);
      assert.equal(mode, "delete");
    });

    it("exits 1 with one line for a file that is not a database", async () => {
      const result = await cli("status", "--db", join(process.cwd(), "README.md"));
      assert.equal(result.code, 1);
      oneLine(result, /not a database/);
    });

    it("exits 2 with one line for an unknown command, option or a missing argument", async () => {
      for (const args of [["frobnicate"], ["status", "--verbose"], ["show"], ["list", "--limit", "0"]]) {
        const result = await cli(...args, "--db", path);
        assert.equal(result.code, 2, `${args.join(" ")}: ${result.stderr}`);
        oneLine(result, /^error: /);
      }
    });

    it("exits 0 for --help, with examples and the exit codes", async () => {
      const { code, stdout } = await cli("--help");
      assert.equal(code, 0);
      assert.match(stdout, /Exit codes: 0 success, 1 not found or refused, 2 usage error\./);
    });
  });
});
