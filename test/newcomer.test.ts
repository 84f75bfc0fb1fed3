// test/newcomer.test.ts: the commands as a newcomer meets them (issues 38 and 49): --version on every script,
// --db before the inbox command as after it, backup --dir making its folder and keeping its backups to the
// inbox's user, and the worker's handler chosen on purpose: --handler MODULE or --handler demo, a refusal to
// start on a configuration that routes to the handler with neither, and the article's example stopped when a
// configuration comes while it runs. Each with a control.

import assert from "node:assert/strict";
import { once } from "node:events";
import { createServer } from "node:http";
import { existsSync, mkdirSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { DatabaseSync } from "node:sqlite";
import { after, describe, it } from "node:test";
import { SqliteInbox } from "../lib/sqlite/sqlite.ts";
import { freshSchema, postgresSkip, runScript, startAdmin, startWorker, tempDir, until } from "./helpers.ts";

const { dir, cleanup } = tempDir("inbox-newcomer-");
const pgSkip = await postgresSkip();
after(cleanup);

const db = join(dir, "inbox.db");
const made = (async () => {
  const inbox = new SqliteInbox(db);
  await inbox.store({ id: "evt_1", body: Buffer.from(JSON.stringify({ customer: "Ann", amount: 5 })) });
  await inbox.close();
})();

describe("--version", () => {
  it("prints the package's version on every script and the package's command", async () => {
    const { version } = (await import("../package.json", { with: { type: "json" } })).default;
    for (const script of [
      "receiver.ts",
      "worker.ts",
      "inbox.ts",
      "admin.ts",
      "cli.ts",
      "consumer.ts",
      "naive-race.ts",
      "send.ts",
      "demo.ts",
    ]) {
      const r = await runScript(script, ["--version"]);
      assert.equal(`${r.code} ${r.stdout}`, `0 ${version}\n`, script);
    }
  });
});

describe("inbox.ts --db", () => {
  it("is taken before the command as after it, the command's own winning", async () => {
    await made;
    const before = await runScript("inbox.ts", ["--db", db, "status"]);
    const afterIt = await runScript("inbox.ts", ["status", "--db", db]);
    assert.equal(before.code, 0, before.stderr);
    const steady = (text: string) => text.replace(/^oldest waiting: .*$/m, "");
    assert.equal(steady(before.stdout), steady(afterIt.stdout));
    assert.match(before.stdout, /^received {3}1$/m);
    const both = await runScript("inbox.ts", ["--db", db, "status", "--db", join(dir, "nope.db")]);
    assert.equal(both.code, 1);
    assert.match(both.stderr, /No inbox database at .*nope\.db/);
  });

  it("(control) an option no command has is still refused before the command", async () => {
    const r = await runScript("inbox.ts", ["--dbb", db, "status"]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /unknown option '--dbb'/);
  });
});

describe("inbox.ts init", () => {
  it("creates the inbox a new deployment's config apply, keys and reconcile then use; run again, it changes nothing", async () => {
    const w = join(dir, "deploy.db");
    const sources = join(dir, "deploy.json");
    writeFileSync(sources, JSON.stringify({ shop: { provider: "plain" } }));
    // Before: config apply refuses a path that is no inbox, and says how to make one.
    const before = await runScript("inbox.ts", ["config", "apply", sources, "--db", w]);
    assert.equal(before.code, 1, before.stderr);
    assert.match(
      before.stderr,
      /^No inbox database at .*deploy\.db \(use --db or INBOX_DB; inbox\.ts init creates one\)\.$/m,
    );
    assert.equal(existsSync(w), false, "a refusal creates nothing");
    const made = await runScript("inbox.ts", ["init", "--db", w]);
    assert.equal(`${made.code} ${made.stdout}`, `0 Created an inbox at ${w}.\n`, made.stderr);
    const applied = await runScript("inbox.ts", ["config", "apply", sources, "--db", w]);
    assert.equal(applied.code, 0, applied.stderr);
    assert.match(applied.stdout, /^Applied version 1/);
    const again = await runScript("inbox.ts", ["init", "--db", w]);
    assert.equal(`${again.code} ${again.stdout}`, `0 ${w} is already an inbox; its tables are up to date.\n`);
    const dumped = await runScript("inbox.ts", ["config", "dump", "--db", w]);
    assert.equal(
      dumped.stdout,
      JSON.stringify({ shop: { provider: "plain" } }),
      "the second init kept the configuration",
    );
  });

  it("(control) refuses a file that is another program's database, and changes nothing in it", async () => {
    const other = join(dir, "other.db");
    const db = new DatabaseSync(other);
    db.exec("CREATE TABLE notes (text TEXT)");
    db.close();
    const r = await runScript("inbox.ts", ["init", "--db", other]);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /other\.db is not an inbox database: it has tables, but no deliveries/);
    const after = new DatabaseSync(other, { readOnly: true });
    const tables = after
      .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
      .all()
      .map((t) => ({ ...t }));
    after.close();
    assert.deepEqual(tables, [{ name: "notes" }]);
  });

  it("makes a PostgreSQL schema's tables", { skip: pgSkip }, async () => {
    const schema = await freshSchema("init");
    try {
      const r = await runScript("inbox.ts", ["init", "--db", schema.url]);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stdout, /^The inbox at postgres:\/\/.* is ready: its tables are made and up to date\.$/m);
      const status = await runScript("inbox.ts", ["status", "--db", schema.url]);
      assert.equal(status.code, 0, status.stderr);
    } finally {
      await schema.drop();
    }
  });
});

describe("backup --dir", () => {
  it("makes its folder, 0700, and writes each backup 0600: it holds every body", async () => {
    await made;
    const folder = join(dir, "backups", "hourly");
    const r = await runScript("inbox.ts", ["backup", "--dir", folder, "--db", db]);
    assert.equal(r.code, 0, r.stderr);
    const [file] = readdirSync(folder);
    assert.ok(file);
    assert.equal(statSync(folder).mode & 0o777, 0o700);
    assert.equal(statSync(join(folder, file)).mode & 0o777, 0o600);
  });

  it("(control) a folder that exists keeps its own mode", async () => {
    const folder = join(dir, "shared");
    mkdirSync(folder, { mode: 0o755 });
    const r = await runScript("inbox.ts", ["backup", "--dir", folder, "--db", db]);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(statSync(folder).mode & 0o777, 0o755);
    assert.equal(statSync(join(folder, readdirSync(folder)[0]!)).mode & 0o777, 0o600);
  });
});

describe("the worker's handler", () => {
  const signed = join(dir, "signed.json");
  writeFileSync(signed, JSON.stringify({ stripe: { provider: "stripe", secret: "env:STRIPE_SECRET" } }));
  const env = { STRIPE_SECRET: "whsec_test" };
  // docs/forwarding.md's and docs/brokers.md's shape: a route that names the handler, beside another.
  const routed = join(dir, "routed.json");
  writeFileSync(
    routed,
    JSON.stringify({ stripe: { provider: "stripe", secret: "env:STRIPE_SECRET", routes: ["handler"] } }),
  );
  const fix =
    /and no --handler is given: pass --handler MODULE \(your code for each delivery\), or --handler demo for the article's record-payment example/;

  it("refuses, in one line with exit 2, a sources file whose source goes to the handler with no --handler: routes that name it, or none", async () => {
    const plain = join(dir, "plain.json");
    writeFileSync(plain, JSON.stringify({ shop: { provider: "plain" } }));
    for (const [file, why] of [
      [routed, /source "stripe" routes to "handler"/],
      [signed, /source "stripe" has no routes, so its deliveries go to the handler/],
      [plain, /source "shop" has no routes, so its deliveries go to the handler/],
    ] as const) {
      const w = join(dir, `refused-${file.length}-${why.source.length}.db`);
      const r = await runScript("worker.ts", ["--once", "--db", w, "--sources", file], env);
      assert.equal(r.code, 2, r.stderr);
      assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
      assert.match(r.stderr, why);
      assert.match(r.stderr, fix);
      assert.equal(existsSync(w), false, "nothing created");
    }
  });

  it("refuses the same configuration in the database, applied before it starts", async () => {
    const w = join(dir, "applied.db");
    assert.equal((await runScript("inbox.ts", ["init", "--db", w])).code, 0);
    const applied = await runScript("inbox.ts", ["config", "apply", routed, "--db", w], env);
    assert.equal(applied.code, 0, applied.stderr);
    const r = await runScript("worker.ts", ["--once", "--db", w], env);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /source "stripe" routes to "handler".*--handler demo/);
  });

  it("(control) runs the example where nothing is configured, saying so in one line, and with --handler demo where it is", async () => {
    await made;
    const article = await runScript("worker.ts", ["--once", "--db", db]);
    assert.equal(article.code, 0, article.stderr);
    assert.match(article.stderr, /^evt_1 done$/m);
    assert.equal(article.stderr.split("\n").filter((l) => /record-payment example/.test(l)).length, 1, article.stderr);
    assert.match(
      article.stderr,
      /^worker: no configuration and no --handler: running the article's record-payment example/m,
    );
    const w = join(dir, "demo.db");
    const inbox = new SqliteInbox(w);
    await inbox.store({ source: "stripe", id: "evt_d", body: Buffer.from('{"customer":"Bo","amount":7}') });
    await inbox.close();
    const named = await runScript("worker.ts", ["--once", "--db", w, "--sources", routed, "--handler", "demo"], env);
    assert.equal(named.code, 0, named.stderr);
    assert.match(named.stderr, /^stripe\/evt_d done$/m);
    const check = new SqliteInbox(w);
    const rows = (await check.query("SELECT delivery_id, amount FROM payments")).map((r) => ({ ...r }));
    assert.deepEqual(rows, [{ delivery_id: "evt_d", amount: 7 }]);
    await check.close();
  });

  it("stops the example once a configuration is applied while it runs: what then reaches the handler is set aside, naming the fix", async () => {
    const w = join(dir, "live.db");
    assert.equal((await runScript("inbox.ts", ["init", "--db", w])).code, 0);
    const worker = startWorker(w, [], env);
    try {
      await until("the example's line", () => /record-payment example/.test(worker.log()));
      const inbox = new SqliteInbox(w);
      try {
        // (control) Before any configuration, the example handles the demo's delivery.
        await inbox.store({ id: "evt_before", body: Buffer.from('{"customer":"Ann","amount":5}') });
        await until("evt_before done", async () => (await inbox.find("evt_before"))[0]?.status === "done");
        const applied = await runScript("inbox.ts", ["config", "apply", routed, "--db", w], env);
        assert.equal(applied.code, 0, applied.stderr);
        await until("the example stops", () => /the record-payment example stops/.test(worker.log()));
        await inbox.store({ source: "stripe", id: "evt_real", body: Buffer.from('{"customer":"Cy","amount":9}') });
        await until("evt_real set aside", async () => (await inbox.find("evt_real", "stripe"))[0]?.status === "failed");
        const [real] = await inbox.find("evt_real", "stripe");
        assert.match(String(real!.error), /^no handler: .*--handler MODULE/);
        const payments = (await inbox.query("SELECT delivery_id FROM payments ORDER BY delivery_id")).map((r) => ({
          ...r,
        }));
        assert.deepEqual(payments, [{ delivery_id: "evt_before" }], "the example never ran on the real event");
      } finally {
        await inbox.close();
      }
    } finally {
      assert.equal(await worker.stop(), 0, worker.log());
    }
  });

  it("runs the --handler module's default export for each delivery, and says in one line what is wrong with a bad one", async () => {
    const w = join(dir, "w3.db");
    const inbox = new SqliteInbox(w);
    await inbox.store({ source: "stripe", id: "evt_s1", body: Buffer.from('{"type":"invoice.paid"}') });
    await inbox.close();
    writeFileSync(
      join(dir, "my-handler.ts"),
      'import type { Job } from "webhook-inbox/worker";\nexport default (job: Job) => console.error(`mine: ${job.key} ${(job.event as { type: string }).type}`);\n',
    );
    const r = await runScript(
      "worker.ts",
      ["--once", "--db", w, "--sources", signed, "--handler", join(dir, "my-handler.ts")],
      env,
    );
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /^mine: stripe:evt_s1 invoice\.paid$/m);
    assert.match(r.stderr, /^stripe\/evt_s1 done$/m);
    for (const [file, text, line] of [
      ["missing.ts", undefined, /--handler .*missing\.ts: cannot load it: /],
      ["no-default.ts", "export const handle = () => {};\n", /expected a module whose default export is a function/],
    ] as const) {
      if (text) writeFileSync(join(dir, file), text);
      const bad = await runScript("worker.ts", ["--once", "--db", w, "--handler", join(dir, file)]);
      assert.equal(bad.code, 2, bad.stderr);
      assert.equal(bad.stderr.trim().split("\n").length, 1, bad.stderr);
      assert.match(bad.stderr, line);
    }
  });
});

describe("a source's signing secret, which only the receiver needs", () => {
  // Two signed sources; this host's environment has stripe's secret and not github's.
  const STRIPE = "whsec_c3RyaXBlIHNpZ25pbmcgc2VjcmV0IGhlcmU=";
  const APP = `whsec_${Buffer.from("the app's forwarding secret").toString("base64")}`;
  const file = join(dir, "two-signed.json");
  const env = { STRIPE_SECRET: STRIPE, APP_SECRET: APP };
  const writeFile = (url: string) =>
    writeFileSync(
      file,
      JSON.stringify({
        $destinations: { app: { url, secret: "env:APP_SECRET" } },
        stripe: { provider: "stripe", secret: "env:STRIPE_SECRET", routes: ["app"] },
        github: { provider: "github", secret: "env:GITHUB_SECRET", routes: ["app"] },
      }),
    );

  it("is not needed by the worker: it starts without github's, forwards, and redacts stripe's, which it has", async () => {
    // The app answers 500, echoing stripe's secret as a debug page might.
    const app = createServer((_req, res) => res.writeHead(500).end(`debug: ${STRIPE}`)).listen(0, "127.0.0.1");
    await once(app, "listening");
    try {
      writeFile(`http://127.0.0.1:${(app.address() as { port: number }).port}/hooks`);
      const w = join(dir, "secrets.db");
      const inbox = new SqliteInbox(w);
      await inbox.store({ source: "stripe", id: "evt_s", body: Buffer.from("{}"), destinations: ["app"] });
      await inbox.close();
      const r = await runScript("worker.ts", ["--once", "--db", w, "--sources", file], env);
      assert.equal(r.code, 0, r.stderr);
      assert.match(r.stderr, /forwarded 0, 1 to retry/);
      const check = new SqliteInbox(w);
      const error = String((await check.find("evt_s", "stripe"))[0]!.error);
      await check.close();
      assert.match(error, /debug: \[redacted: source stripe secret\]/);
      assert.doesNotMatch(error, /c3RyaXBl/);
    } finally {
      app.close();
    }
  });

  it("(control) the receiver, which verifies, still refuses to start without github's", async () => {
    const r = await runScript("receiver.ts", ["--port", "0", "--db", join(dir, "rx.db"), "--sources", file], env);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, /source "github": secret reads the environment variable GITHUB_SECRET, which is not set/);
  });

  it("is not needed by admin.ts either, which hides stripe's on the page where a row holds it as stored", async () => {
    const w = join(dir, "page.db");
    const inbox = new SqliteInbox(w);
    await inbox.store({ source: "stripe", id: "evt_p", body: Buffer.from("{}") });
    const lease = await inbox.claim(60_000);
    assert.ok(lease);
    // As a run() given no redact option would keep it.
    await inbox.fail(lease, `HTTP 500: debug: ${STRIPE}`, { permanent: true });
    await inbox.close();
    const admin = await startAdmin(["--db", w, "--sources", file], env);
    try {
      const page = await (await fetch(`${admin.url}/delivery?source=stripe&id=evt_p`)).text();
      assert.match(page, /\[redacted: source stripe secret\]/);
      assert.doesNotMatch(page, /c3RyaXBl/);
    } finally {
      admin.child.kill("SIGTERM");
      await once(admin.child, "exit");
    }
  });
});
