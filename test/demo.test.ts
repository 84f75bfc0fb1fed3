// test/demo.test.ts: the article's scripts as a reader runs them: naive-race.ts, send.ts against a real
// receiver (and against none), and `npm run demo` from start to finish.

import assert from "node:assert/strict";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { createServer } from "node:net";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { describe, it } from "node:test";
import { runnerName } from "../lib/runtime.ts";
import { POSTGRES, postgresSkip, runScript, startReceiver, tempDir } from "./helpers.ts";

// The demo prints each command as a person would type it on the runtime it runs on ("npx tsx" under tsx).
const runner = runnerName().replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

const pgSkip = await postgresSkip();

describe("every script", () => {
  it("answers --help with its usage and exit 0, doing nothing else", async () => {
    const scripts = ["inbox.ts", "receiver.ts", "worker.ts", "send.ts", "naive-race.ts", "demo.ts"];
    const results = await Promise.all(scripts.map((script) => runScript(script, ["--help"])));
    results.forEach(({ code, stdout }, i) => {
      assert.equal(code, 0, scripts[i]);
      assert.match(stdout, new RegExp(`^Usage: ${scripts[i]!.replace(".", "\\.")} `), scripts[i]);
      assert.doesNotMatch(stdout, /The work was done/, `${scripts[i]} ran instead of answering --help`);
    });
  });
});

describe("naive-race.ts", () => {
  it("does the work twice without the inbox and once through it", async () => {
    const { code, stdout, stderr } = await runScript("naive-race.ts");
    assert.equal(code, 0, stderr);
    assert.equal(stdout, "Without the inbox: The work was done 2 times\nWith the inbox:    The work was done 1 time\n");
  });
});

describe("send.ts", () => {
  it("sends the article's four deliveries and prints each answer", async () => {
    const dir = tempDir();
    const path = join(dir.dir, "inbox.db");
    const receiver = await startReceiver(path);
    try {
      const { code, stdout, stderr } = await runScript("send.ts", ["--url", receiver.url]);
      assert.equal(code, 0, stderr);
      assert.equal(stdout, "evt_100: stored\nevt_100: duplicate\nevt_101: stored\nevt_100: duplicate\n");
      const db = new DatabaseSync(path, { readOnly: true });
      const ids = (db.prepare("SELECT id FROM deliveries ORDER BY id").all() as { id: string }[]).map((r) => r.id);
      db.close();
      assert.deepEqual(ids, ["evt_100", "evt_101"]);
    } finally {
      assert.equal(await receiver.stop(), 0);
      // Its last words are its SIGTERM line: nothing failed on the way out.
      assert.match(receiver.log(), /\nSIGTERM: finishing the requests in flight, then stopping\n$/);
      dir.cleanup();
    }
  });

  it("prints the status of each answer that is not 200, and exits 1", async () => {
    const dir = tempDir();
    const path = join(dir.dir, "inbox.db");
    const receiver = await startReceiver(path);
    const admin = new DatabaseSync(path);
    admin.exec(
      "CREATE TRIGGER refuse BEFORE INSERT ON delivery_rows BEGIN SELECT RAISE(ABORT, 'simulated failure'); END",
    );
    try {
      const { code, stdout } = await runScript("send.ts", ["--url", receiver.url]);
      assert.equal(code, 1);
      assert.equal(
        stdout,
        "evt_100: 503 try again later\nevt_100: 503 try again later\nevt_101: 503 try again later\nevt_100: 503 try again later\n",
      );
    } finally {
      admin.close();
      await receiver.stop();
      dir.cleanup();
    }
  });

  it("says in one line that no receiver is listening, and exits 1", async () => {
    // A port that was free a moment ago: bind it, note it, let it go.
    const server = createServer();
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as { port: number }).port;
    await new Promise((resolve) => server.close(resolve));
    const { code, stdout, stderr } = await runScript("send.ts", ["--url", `http://127.0.0.1:${port}`]);
    assert.equal(code, 1);
    assert.equal(stdout, "");
    assert.equal(
      stderr,
      `send: no receiver at http://127.0.0.1:${port} (connection refused); start one with: npx tsx receiver.ts\n`,
    );
  });
});

describe("npm run demo", () => {
  it("tells the article's story end to end, exits 0 and leaves nothing running", async () => {
    const { code, stdout, stderr } = await runScript("demo.ts");
    assert.equal(code, 0, `${stdout}\n${stderr}`);
    // Each step, in order, with what its script said.
    const expected = [
      /The work was done 2 times/,
      /The work was done 1 time\b/,
      new RegExp(`\\$ ${runner} receiver\\.ts --port 0 --db \\S+inbox\\.db &`),
      /receiver\| Listening on http:\/\/127\.0\.0\.1:\d+/,
      /^ {2}evt_100: stored$/m,
      /^ {2}evt_100: duplicate$/m,
      /^ {2}evt_101: stored$/m,
      /^ {2}evt_100: duplicate$/m,
      /^ {2}evt_100 done$/m,
      /^ {2}evt_101 done$/m,
      /^ {2}done {7}2$/m,
      /Done: 4 deliveries sent, 2 stored, 2 payments recorded, nothing left running\./,
    ];
    let from = 0;
    for (const re of expected) {
      const match = re.exec(stdout.slice(from));
      assert.ok(match, `expected ${re} after position ${from} in:\n${stdout}`);
      from += match.index + match[0].length;
    }
    assert.doesNotMatch(stdout, /demo failed/);
    // Nothing it started outlives it: no process still names its throwaway database.
    const db = /--db (\S+inbox\.db)/.exec(stdout)![1]!;
    const survivors = readdirSync("/proc")
      .filter((pid) => /^\d+$/.test(pid))
      .filter((pid) => {
        try {
          return readFileSync(`/proc/${pid}/cmdline`, "utf8").includes(db);
        } catch {
          return false; // it ended while we looked
        }
      });
    assert.deepEqual(survivors, []);
    assert.equal(existsSync(db), false, "the throwaway database was left behind");
  });
});

describe("npm run demo -- --postgres URL", { skip: pgSkip }, () => {
  it("tells the same story on PostgreSQL, in a schema of its own that it drops afterwards", async () => {
    const { code, stdout, stderr } = await runScript("demo.ts", ["--postgres", POSTGRES]);
    assert.equal(code, 0, `${stdout}\n${stderr}`);
    assert.match(
      stdout,
      new RegExp(`\\$ ${runner} receiver\\.ts --port 0 --db postgres://\\S+\\?schema=inbox_demo_\\d+ &`),
    );
    assert.match(stdout, /^ {2}done {7}2$/m);
    assert.match(stdout, /Done: 4 deliveries sent, 2 stored, 2 payments recorded, nothing left running\./);
    const schema = /schema=(inbox_demo_\d+)/.exec(stdout)![1]!;
    const { default: pg } = await import("pg");
    const client = new pg.Client({ connectionString: POSTGRES });
    await client.connect();
    try {
      const { rows } = await client.query("SELECT 1 FROM information_schema.schemata WHERE schema_name = $1", [schema]);
      assert.equal(rows.length, 0, "the throwaway schema was left behind");
    } finally {
      await client.end();
    }
  });
});
