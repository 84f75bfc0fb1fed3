// test/pgbouncer.test.ts: the inbox behind PgBouncer in transaction mode (Debian's pgbouncer, 1.18 on Debian
// 12), started on a free port in front of the test server, with ?listen=false: the contract suite (the very
// files test/contract-*.test.ts, run as a child with its PostgreSQL URL pointed through PgBouncer), the article's
// story, and the crash suite's pipeline. Skipped in one line without the binary; .ci/run installs it and sets
// INBOX_REQUIRE_PGBOUNCER=1, which makes a missing one fail the run.
//   npx node --import tsx --test test/pgbouncer.test.ts

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { after, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import type { Tx } from "../lib/store.ts";
import { postgresPipeline, seeded } from "./chaos.ts";
import { CONTRACT_FILES, freshSchema, POSTGRES, postgresSkip, privatePgBouncer, ROOT, runScript } from "./helpers.ts";

const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 100_000);
const pgSkip = await postgresSkip();
const bouncer = pgSkip === false ? await privatePgBouncer() : pgSkip;
const skip = typeof bouncer === "string" ? bouncer : false;
after(async () => {
  if (typeof bouncer !== "string") await bouncer.stop();
});
const through = () => bouncer as Exclude<typeof bouncer, string>;

// transactions is how many transactions PgBouncer has passed on to the server so far, to every database
// but its own console: each contract test has a database of its own (freshInbox()).
async function transactions(): Promise<number> {
  const rows = await through().admin("SHOW STATS");
  return rows.filter((r) => r.database !== "pgbouncer").reduce((n, r) => n + Number(r.total_xact_count ?? 0), 0);
}

describe("behind PgBouncer in transaction mode, with ?listen=false", { skip, timeout: 600_000 }, () => {
  it("control: a named prepared statement is missing from the next transaction's server connection", async () => {
    const { default: pg } = await import("pg");
    const [a, b] = [
      new pg.Client({ connectionString: through().url }),
      new pg.Client({ connectionString: through().url }),
    ];
    await Promise.all([a.connect(), b.connect()]);
    try {
      await a.query("BEGIN");
      await a.query({ name: "control_statement", text: "SELECT 1 AS one" });
      await a.query("COMMIT");
      // b holds the server connection a just gave back, so a's next transaction gets another one.
      await b.query("BEGIN");
      await b.query("SELECT 1");
      await assert.rejects(
        a.query({ name: "control_statement", text: "SELECT 1 AS one" }),
        /prepared statement "control_statement" does not exist/,
      );
      await b.query("COMMIT");
    } finally {
      await Promise.all([a.end(), b.end()]);
    }
  });

  it("runs a handler's writes as unnamed statements, whichever server connection each transaction gets", async () => {
    const fresh = await freshSchema("bouncer_named");
    const url = new URL(fresh.url);
    url.host = new URL(through().url).host;
    url.searchParams.set("listen", "false");
    const direct = await connect(fresh.url);
    const inbox = await connect(url.toString());
    const { default: pg } = await import("pg");
    const other = new pg.Client({ connectionString: through().url });
    await other.connect();
    try {
      await inbox.query("CREATE TABLE ledger (id text PRIMARY KEY)");
      // What the server says is prepared on the connection a write runs on, read from inside the write.
      const named = async (on: typeof inbox, id: string) => {
        await on.store({ id, body: Buffer.from("{}") });
        const lease = (await on.claim(60_000))!;
        let prepared: string[] = [];
        const ok = await on.finish(lease, [
          (tx: Tx) => tx.run("INSERT INTO ledger (id) VALUES (?)", id),
          async (tx: Tx) => {
            const { rows } = await tx.client!.query("SELECT name FROM pg_prepared_statements WHERE name LIKE 'inbox%'");
            prepared = (rows as { name: string }[]).map((r) => r.name);
          },
        ]);
        assert.equal(ok, true);
        return prepared;
      };
      assert.notDeepEqual(
        await named(direct, "direct-1"),
        [],
        "control: connected directly, the inbox names its statements",
      );
      for (let i = 0; i < 4; i++) {
        assert.deepEqual(await named(inbox, `bounced-${i}`), [], "behind PgBouncer it names none");
        // Another client takes a server connection between two batches, as under load.
        await other.query(i % 2 === 0 ? "BEGIN" : "COMMIT");
      }
      assert.equal(
        (await inbox.query("SELECT count(*) AS n FROM ledger"))[0]!.n,
        5,
        "every write landed, on whichever server connection",
      );
    } finally {
      await other.query("ROLLBACK").catch(() => {});
      await other.end();
      await inbox.close();
      await direct.close();
      await fresh.drop();
    }
  });

  it("passes the contract suite, run through it", async () => {
    const before = await transactions();
    const { code, stdout, stderr } = await runTests(CONTRACT_FILES, {
      INBOX_TEST_POSTGRES: through().url,
      // Each test's database is made from a template and dropped on the server itself (freshInbox()).
      INBOX_TEST_POSTGRES_ADMIN: POSTGRES,
      INBOX_REQUIRE_POSTGRES: "1",
    });
    const passed = Number(/^ℹ pass (\d+)/m.exec(stdout)?.[1] ?? 0);
    const tail = `${stdout
      .split("\n")
      .filter((l) => /✖|not ok|Error/.test(l))
      .slice(0, 20)
      .join("\n")}\n${stderr.slice(-2000)}`;
    assert.equal(code, 0, `the contract suite failed through PgBouncer:\n${tail}`);
    assert.match(stdout, /^ℹ fail 0$/m);
    assert.match(stdout, /^ℹ skipped 0$/m, "none of the PostgreSQL tests was skipped");
    assert.match(stdout, /✔ the contract on postgres/, "the PostgreSQL half ran");
    const after = await transactions();
    console.log(
      `# contract suite through PgBouncer: ${passed} tests passed, ${after - before} transactions through it`,
    );
    assert.ok(after - before > 500, `its transactions went through PgBouncer (${after - before})`);
  });

  it("tells the article's story through it: npm run demo -- --postgres URL", async () => {
    const { code, stdout, stderr } = await runScript("demo.ts", ["--postgres", through().url]);
    assert.equal(code, 0, `${stdout}\n${stderr}`);
    assert.match(stdout, /^ {2}done {7}2$/m);
    assert.match(stdout, /Done: 4 deliveries sent, 2 stored, 2 payments recorded, nothing left running\./);
  });

  it(`loses and doubles nothing through it while scripts are SIGKILLed and server connections ended (seed ${seed})`, async () => {
    const fresh = await freshSchema("bouncer_crash");
    const url = new URL(through().url);
    url.searchParams.set("schema", fresh.schema);
    try {
      const r = await postgresPipeline({
        url: url.toString(),
        seconds: 5,
        senders: 2,
        receivers: 2,
        workers: 3,
        killEveryMs: 1_000,
        terminateEveryMs: 1_200,
        random: seeded(seed),
      });
      console.log(
        `# pipeline through PgBouncer: ${r.kills} kills, ${r.terminations} server connections ended (${r.terminationsMidTransaction} ` +
          `mid-transaction), ${r.acked} acknowledged, ${r.deliveries} done, ${r.unavailable} answered 503, lost ${r.lostAcked + r.lost}, doubled ${r.doubled}`,
      );
      assert.ok(r.drained, JSON.stringify(r));
      assert.ok(r.acked > 0 && r.kills > 0, JSON.stringify(r));
      assert.deepEqual(r.unexpectedExits, [], "no script exited on its own");
      assert.equal(r.lostAcked, 0, "every acknowledged delivery is done");
      assert.equal(r.lost, 0, "every done delivery has its effect");
      assert.equal(r.doubled, 0, "no effect applied twice");
      assert.equal(r.balance, r.expected);
      assert.equal(r.unavailableWithoutRetryAfter, 0);
    } finally {
      await fresh.drop();
    }
  });
});

// runTests runs test files under node's test runner, one after another as `npm test` does, with env added.
async function runTests(
  files: readonly string[],
  env: NodeJS.ProcessEnv,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  // Without NODE_TEST_CONTEXT, which this run's own runner set: the child reports to us as to a person.
  const { NODE_TEST_CONTEXT: _, ...outside } = process.env;
  const child = spawn(
    process.execPath,
    [
      "--import",
      "tsx",
      "--test",
      "--test-concurrency=1",
      "--test-reporter=spec",
      "--test-skip-pattern=on sqlite",
      ...files,
    ],
    {
      cwd: ROOT,
      env: { ...outside, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d) => (stdout += d));
  child.stderr.on("data", (d) => (stderr += d));
  const code = await new Promise<number | null>((resolve) => child.on("close", resolve));
  return { code, stdout, stderr };
}
