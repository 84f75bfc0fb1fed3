// test/admin-config-browser.test.ts: the configuration and the keys on the operator page, in a real Chromium
// (Debian's /usr/bin/chromium through playwright-core), on SQLite and PostgreSQL, with the real admin.ts, a
// receiver.ts and a worker.ts running and none restarted. A person sets a secret, creates a destination with a
// transform, previews a stored delivery through it, adds a route with a filter, tries the filter on two stored
// deliveries and saves: the next signed delivery reaches the test's app through it, signed with that secret, and
// the one the filter refuses does not. Two browsers editing one destination: the second gets a conflict, not a
// lost change (the control: without the version it read, its save overwrites the first's). A read key's session
// sees everything and changes nothing (the control: a write key's same request changes it). Keys are made (shown
// once) and revoked from the page, by an admin session alone.
//   npx node --test test/admin-config-browser.test.ts

import assert from "node:assert/strict";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import type { Browser, BrowserContext, Page } from "playwright-core";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { sign } from "../lib/providers.ts";
import type { Inbox } from "../lib/store.ts";
import {
  backends,
  chromiumSkip,
  destinationServer,
  launchChromium,
  runScript,
  startAdmin,
  startReceiver,
  startWorker,
  tempDir,
  until,
  type ReceiverProcess,
  type WorkerProcess,
} from "./helpers.ts";

// Where the screenshots go, to be looked at by a person.
const SHOTS = process.env.INBOX_SHOTS ?? join(process.env.TMPDIR ?? "/tmp", "webhook-inbox-shots");
mkdirSync(SHOTS, { recursive: true });

const TOKEN = "config-page-token";
const SOURCE_SECRET = `whsec_${Buffer.from("the provider's secret, page").toString("base64")}`;
const LOG_SECRET = `whsec_${Buffer.from("the log's secret, page").toString("base64")}`;
const APP_SECRET = `whsec_${Buffer.from("the app's secret, set on the page").toString("base64")}`;
// The operator's environment, shared by every process as the production units share one file: the app of the
// test listens on loopback, which the operator allows the API's (and so the page's) destinations to reach, and
// the source's secret may stay env:SOURCE_SECRET once the page changes its routes. LOG_SECRET is not allowed.
const ENV = {
  SOURCE_SECRET,
  LOG_SECRET,
  ADMIN_TOKEN: TOKEN,
  INBOX_SECRETS_KEY: Buffer.alloc(32, 9).toString("base64"),
  INBOX_API_ENV: "SOURCE_SECRET",
  INBOX_API_DESTINATIONS_ALLOW: "127.0.0.1/32",
};
const skip = chromiumSkip();
const BACKENDS = (await backends("admin_config")).map((b) => ({ ...b, skip: skip || b.skip }));

for (const backend of BACKENDS) {
  describe(`the configuration on the operator page in Chromium, on ${backend.name}`, { skip: backend.skip }, () => {
    let browser: Browser;
    let inbox: Inbox;
    let db: string;
    let cleanup: () => Promise<void>;
    let admin: Awaited<ReturnType<typeof startAdmin>>;
    let receiver: ReceiverProcess;
    let worker: WorkerProcess;
    let dest: Awaited<ReturnType<typeof destinationServer>>;
    const dir = tempDir();
    // The transform is code, written on the page and run in the sandbox: a change from the page names no file.
    const shape = "export default (d) => ({ body: { shaped: true, id: d.id, amount: d.json.amount } });\n";
    const contexts: BrowserContext[] = [];
    const problems: string[] = [];

    before(async () => {
      ({ target: db, cleanup } = await backend.make());
      dest = await destinationServer();
      // The operator's file: a source whose deliveries go to a log, applied on the host.
      const sources = join(dir.dir, "sources.json");
      writeFileSync(
        sources,
        JSON.stringify({
          $destinations: { log: { url: `${dest.url}/log`, secret: "env:LOG_SECRET" } },
          st: { provider: "standard", secret: "env:SOURCE_SECRET", routes: ["log"] },
        }),
      );
      for (const args of [["init"], ["config", "apply", sources]]) {
        const r = await runScript("inbox.ts", [...args, "--db", db], ENV);
        assert.equal(r.code, 0, r.stderr);
      }
      inbox = await connect(db);
      [admin, receiver] = await Promise.all([
        startAdmin(["--db", db, "--admin-token", "env:ADMIN_TOKEN"], ENV),
        startReceiver(db, [], ENV),
      ]);
      worker = startWorker(db, ["--metrics-port", "0"], ENV);
      await until("the worker up", () => /Metrics on/.test(worker.log()));
      browser = await launchChromium();
    });

    after(async () => {
      for (const c of contexts) await c.close();
      await browser?.close();
      const codes = await Promise.all([receiver?.stop(), worker?.stop()]);
      admin?.child.kill("SIGTERM");
      await inbox?.close();
      dest?.server.close();
      await cleanup?.();
      dir.cleanup();
      assert.deepEqual(codes, [0, 0]);
      assert.deepEqual(problems, [], "no script errors or CSP violations in the page");
    });

    // session opens a browser of its own (its own cookies) logged in with the page's token or an API key.
    const session = async (credential = TOKEN): Promise<Page> => {
      const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
      contexts.push(context);
      const page = await context.newPage();
      page.on(
        "console",
        (m) => void (m.type() === "error" && !/status of (401|403|409|400)/.test(m.text()) && problems.push(m.text())),
      );
      page.on("pageerror", (e) => void problems.push(e.message));
      await page.goto(`${admin.url}/`);
      await page.fill('input[name="token"]', credential);
      await page.click('button:has-text("Log in")');
      await page.waitForSelector("h1:has-text('Overview')");
      return page;
    };
    const post = async (id: string, body: unknown) => {
      const text = JSON.stringify(body);
      const r = await fetch(`${receiver.url}/st`, {
        method: "POST",
        headers: {
          ...sign("standard", SOURCE_SECRET, { id, body: text, timestampS: Math.floor(Date.now() / 1000) }),
          "content-type": "application/json",
        },
        body: text,
      });
      assert.equal(r.status, 200, await r.text());
    };
    const sentTo = (to: string, id: string) => dest.got.filter((g) => g.to === to && g.id === id);
    const takenUp = (v: number) =>
      until(`version ${v} taken up`, () =>
        [receiver.log(), worker.log()].every((l) =>
          new RegExp(`(serving|running) configuration version ${v}\\b`).test(l),
        ),
      );
    const stored = async () => {
      const c = (await inbox.readConfig())!;
      const doc = JSON.parse(c.document) as Record<string, Record<string, unknown>>;
      return { version: c.version, doc, app: (doc.$destinations as Record<string, Record<string, unknown>>).app };
    };
    // Everything a change could touch: the configuration, the secrets, the keys, the audit log.
    const snapshot = async () =>
      JSON.stringify([
        await inbox.query("SELECT version FROM inbox_config ORDER BY version"),
        await inbox.query("SELECT name, set_at FROM secrets ORDER BY name"),
        await inbox.query("SELECT id, revoked_at FROM api_keys ORDER BY id"),
        await inbox.query("SELECT count(*) AS n FROM audit"),
      ]);
    const apiKey = async (scope: "read" | "write") => {
      const r = await runScript("inbox.ts", ["keys", "create", "--scope", scope, "--json", "--db", db], ENV);
      assert.equal(r.code, 0, r.stderr);
      return JSON.parse(r.stdout) as { id: string; key: string };
    };

    it("sets a secret, creates a destination with a transform, previews a stored delivery through it, tries a route's filter on two and saves: the next signed delivery reaches the app, the filtered one does not", async () => {
      await post("evt_small", { amount: 5 });
      await post("evt_big", { amount: 500 });
      await until(
        "both forwarded to the log",
        () => sentTo("log", "evt_small").length + sentTo("log", "evt_big").length === 2,
      );
      const page = await session();
      await page.click("nav >> text=Configuration");
      await page.waitForSelector("h1:has-text('Configuration')");
      assert.match(
        (await page.textContent(".version"))!,
        /Version 1 in force, .* by inbox\.ts, from the operator's file/,
      );
      assert.match((await page.textContent("table.sources"))!, /st.*standard.*env:SOURCE_SECRET.*→ log/s);

      // The app's signing secret, set here: write-only.
      await page.fill('form[action="/config/secret"] input[name="name"]', "app_signing");
      await page.fill('form[action="/config/secret"] input[name="value"]', APP_SECRET);
      await page.click('button:has-text("Set the secret")');
      await page.waitForSelector(".flash");
      assert.match((await page.textContent(".flash"))!, /Secret app_signing set: name it as secret:app_signing/);
      assert.match((await page.textContent("table.secrets"))!, /secret:app_signing.*page:session:/s);
      assert.ok(!(await page.content()).includes(APP_SECRET.slice(6)), "the value is not on the page");

      await page.click("text=New destination");
      await page.fill('input[name="name"]', "app");
      await page.fill('input[name="url"]', `${dest.url}/app`);
      // Held to the operator's rule, as a change through the API is: a variable it does not allow is refused.
      await page.fill('input[name="secret"]', "env:LOG_SECRET");
      const state = await snapshot();
      await page.click('button:has-text("Create")');
      await page.waitForSelector(".problem");
      assert.match(
        (await page.textContent(".problem"))!,
        /destination app: secret names the environment variable LOG_SECRET, which a change through the API may not read/,
      );
      assert.equal(await snapshot(), state, "refused, nothing changed");
      assert.equal(await page.inputValue('input[name="url"]'), `${dest.url}/app`, "the form kept as sent");
      await page.fill('input[name="secret"]', "secret:app_signing");
      await page.fill('input[name="timeout"]', "10");
      await page.fill('textarea[name="transform"]', shape);
      await page.click('button:has-text("Create")');
      await page.waitForSelector(".flash");
      assert.equal(await page.textContent(".flash"), "Destination app created: configuration version 2 is in force.");

      // Its transform, previewed on a stored delivery it never had: nothing is sent.
      await page.fill('#preview ~ form input[name="source"]', "st");
      await page.fill('#preview ~ form input[name="id"]', "evt_big");
      await page.click('button:has-text("Preview")');
      await page.waitForSelector("pre.preview");
      const previewed = (await page.textContent("pre.preview"))!;
      assert.match(previewed, new RegExp(`^POST ${dest.url}/app\\n`));
      assert.match(previewed, /\n\n\{"shaped":true,"id":"evt_big","amount":500\}$/, "the body its transform made");
      assert.equal(sentTo("app", "evt_big").length, 0, "a preview sends nothing");
      await page.screenshot({ path: join(SHOTS, `config-destination-${backend.name}.png`), fullPage: true });

      // A route to it from st, with a filter tried on the two stored deliveries before it is saved.
      await page.click("text=Configuration");
      await page.click('table.sources a:has-text("Add a route")');
      await page.selectOption('select[name="to"]', "app");
      await page.fill('textarea[name="filter"]', '{"body": {"amount": {"$gte": 100}}}');
      await page.fill('input[name="try_id"]', "evt_small");
      await page.click('button:has-text("Test the filter")');
      await page.waitForSelector(".verdict");
      assert.equal(
        await page.textContent(".verdict"),
        "The filter does not take st/evt_small: this route would not send it.",
      );
      assert.equal(await page.inputValue('textarea[name="filter"]'), '{"body": {"amount": {"$gte": 100}}}', "kept");
      await page.fill('input[name="try_id"]', "evt_big");
      await page.click('button:has-text("Test the filter")');
      await page.waitForSelector(".verdict.match");
      assert.equal(await page.textContent(".verdict"), "The filter takes st/evt_big: this route would send it to app.");
      assert.equal((await stored()).version, 2, "trying saves nothing");
      await page.screenshot({ path: join(SHOTS, `config-route-${backend.name}.png`), fullPage: true });
      await page.click('button:has-text("Add the route")');
      await page.waitForSelector(".flash");
      assert.equal(await page.textContent(".flash"), "Route of st to app saved: configuration version 3 is in force.");

      const { version, doc, app } = await stored();
      assert.equal(version, 3);
      assert.deepEqual(doc.st!.routes, ["log", { to: "app", filter: { body: { amount: { $gte: 100 } } } }]);
      assert.deepEqual(app, {
        url: `${dest.url}/app`,
        secret: "secret:app_signing",
        timeout: 10,
        transform: { code: shape },
      });
      // Each change an API change, made as the page's session, audited in its transaction.
      const entries = (await inbox.auditLog({ limit: 3 })).map((e) => [e.operation, e.who.replace(/:[^:]+@.*/, ":…")]);
      assert.deepEqual(entries, [
        ["putSource", "page:session:…"],
        ["putDestination", "page:session:…"],
        ["putSecret", "page:session:…"],
      ]);
      const current = (await inbox.readConfig())!;
      assert.deepEqual(
        [current.way, current.trust["destination app"], current.trust["destination log"]],
        ["api", "api", "operator"],
      );

      await takenUp(3);
      await post("evt_big2", { amount: 900 });
      await post("evt_small2", { amount: 1 });
      await until(
        "evt_big2 at the app, evt_small2 at the log",
        () => sentTo("app", "evt_big2").length === 1 && sentTo("log", "evt_small2").length === 1,
      );
      const got = sentTo("app", "evt_big2")[0]!;
      new Webhook(APP_SECRET).verify(got.body, got.headers as Record<string, string>);
      assert.deepEqual(JSON.parse(got.body), { shaped: true, id: "evt_big2", amount: 900 });
      // The filter's control: the small one was stored for the log alone.
      assert.deepEqual(
        (await inbox.find("evt_small2", "st")).map((r) => r.destination),
        ["log"],
      );
      assert.equal(sentTo("app", "evt_small2").length, 0);
    });

    it("gives the second of two browsers editing one destination a conflict, not a lost change; without the version it read (the control), its save overwrites", async () => {
      const [first, second] = [await session(), await session()];
      for (const p of [first, second]) {
        await p.goto(`${admin.url}/config/destination?name=app`);
        await p.waitForSelector("h1:has-text('Destination app')");
      }
      const read = (await stored()).version;
      await first.fill('input[name="maxInFlight"]', "4");
      await first.click('button:has-text("Save")');
      await first.waitForSelector(".flash");
      assert.equal(
        await first.textContent(".flash"),
        `Destination app saved: configuration version ${read + 1} is in force.`,
      );
      await second.fill('input[name="timeout"]', "20");
      await second.click('button:has-text("Save")');
      await second.waitForSelector(".problem");
      const problem = (await second.textContent(".problem"))!;
      assert.match(problem, new RegExp(`Not saved\\. version ${read + 1} is in force, not ${read}`));
      assert.match(problem, /Changed since you read it:\s*~ destination app: maxInFlight \(none\) → 4/);
      assert.equal(await second.inputValue('input[name="timeout"]'), "20", "the second's edit is kept in its form");
      await second.screenshot({ path: join(SHOTS, `config-conflict-${backend.name}.png`), fullPage: true });
      let { version, app } = await stored();
      assert.equal(version, read + 1);
      assert.deepEqual([app!.maxInFlight, app!.timeout], [4, 10]);

      // The control: the same form without the version it was read at is saved over the first's change.
      await second.evaluate(`document.querySelector('form.edit input[name="version"]').remove()`);
      await second.click('button:has-text("Save")');
      await second.waitForSelector(".flash");
      ({ version, app } = await stored());
      assert.equal(version, read + 2);
      assert.deepEqual(
        [app!.maxInFlight, app!.timeout],
        [undefined, 20],
        "the first's change is lost: the version was what kept it",
      );
    });

    it("shows a read key's session everything and lets it change nothing; a write key's session makes the same change (the control)", async () => {
      const reader = await session((await apiKey("read")).key);
      await reader.goto(`${admin.url}/config`);
      assert.equal(await reader.textContent("header .badge.readonly"), "read-only");
      assert.match((await reader.textContent("table.config-destinations"))!, /app.*secret:app_signing.*timeout 20 s/s);
      assert.match((await reader.textContent("table.secrets"))!, /secret:app_signing/);
      assert.equal(await reader.locator("text=New destination").count(), 0);
      assert.equal(await reader.locator('button:has-text("Delete")').count(), 0);
      assert.equal(await reader.locator('form[action="/config/secret"]').count(), 0);
      await reader.click('table.sources a:has-text("→ app")');
      await reader.waitForSelector("h1:has-text('Route 2 of st')");
      assert.equal(await reader.locator('button:has-text("Save")').count(), 0);
      // Trying a filter saves nothing, and a read key may.
      await reader.fill('input[name="try_id"]', "evt_big");
      await reader.click('button:has-text("Test the filter")');
      await reader.waitForSelector(".verdict.match");
      await reader.goto(`${admin.url}/config/history`);
      assert.equal(await reader.locator("table.history tbody tr").count(), (await stored()).version);
      await reader.goto(`${admin.url}/keys`);
      assert.equal(await reader.locator('form[action="/keys/create"]').count(), 0);
      await reader.goto(`${admin.url}/config/destination?name=app`);
      assert.equal(await reader.locator('button:has-text("Save")').count(), 0);

      // Its own session's forms, as a script would post them: each refused, nothing changed.
      const csrf = (await reader.getAttribute('input[name="csrf"]', "value"))!;
      const attempts: [string, Record<string, string>][] = [
        ["/config/destination", { name: "app", url: `${dest.url}/app`, secret: "secret:app_signing", timeout: "30" }],
        ["/config/destination/delete", { name: "app" }],
        ["/config/secret", { name: "app_signing", value: "whsec_bm90IHRoaXMgb25l" }],
        ["/keys/create", { name: "mine", scope: "admin" }],
        ["/pause", { destination: "app" }],
      ];
      const state = await snapshot();
      for (const [path, fields] of attempts) {
        const r = await reader.request.post(`${admin.url}${path}`, { form: { ...fields, csrf }, maxRedirects: 0 });
        assert.equal(r.status(), 403, path);
      }
      assert.equal(await snapshot(), state, "nothing changed");
      // The control: a write key's session posts the same change, and it is made, as that key.
      const writer = await apiKey("write");
      const author = await session(writer.key);
      await author.goto(`${admin.url}/config`);
      const theirs = (await author.getAttribute('input[name="csrf"]', "value"))!;
      const made = await author.request.post(`${admin.url}/config/destination`, {
        form: { ...attempts[0]![1], csrf: theirs },
        maxRedirects: 0,
      });
      assert.equal(made.status(), 303);
      assert.notEqual(await snapshot(), state);
      const [entry] = await inbox.auditLog({ limit: 1 });
      assert.deepEqual([entry!.operation, entry!.who], ["putDestination", `page:key:${writer.id}@127.0.0.1`]);
      // A write key may not make keys: that is an admin's.
      const key = await author.request.post(`${admin.url}/keys/create`, {
        form: { name: "mine", scope: "read", csrf: theirs },
        maxRedirects: 0,
      });
      assert.equal(key.status(), 403);
    });

    it("makes a key from the page, shows it once, and revokes it: the API takes it until then", async () => {
      const page = await session();
      await page.click("nav >> text=Keys");
      await page.waitForSelector("h1:has-text('API keys')");
      await page.fill('input[name="name"]', "deploy bot");
      await page.selectOption('select[name="scope"]', "write");
      await page.click('button:has-text("Make the key")');
      await page.waitForSelector("pre.once");
      const key = (await page.textContent("pre.once"))!;
      assert.match(key, /^wik_[A-Za-z0-9_-]{43}$/);
      const id = /API key ([0-9a-f]{12}) \(write, deploy bot\) made\. It is shown this once/.exec(
        (await page.textContent(".flash"))!,
      )?.[1];
      assert.ok(id);
      await page.screenshot({ path: join(SHOTS, `keys-once-${backend.name}.png`), fullPage: true });
      await page.reload();
      assert.equal(await page.locator("pre.once").count(), 0, "shown once");
      assert.ok(!(await page.content()).includes(key), "nowhere on the page again");
      const status = () => fetch(`${admin.url}/api/v1/status`, { headers: { authorization: `Bearer ${key}` } });
      assert.equal((await status()).status, 200, "the API takes it");
      assert.deepEqual(
        (await inbox.auditLog({ limit: 1 })).map((e) => [e.operation, e.target]),
        [["createKey", `key=${id} scope=write name="deploy bot"`]],
      );

      await page.click(`tr:has(code:text-is("${id}")) button:has-text("Revoke")`);
      await page.waitForSelector(".flash");
      assert.equal(await page.textContent(".flash"), `API key ${id} revoked: it is refused from now on.`);
      assert.equal((await status()).status, 401, "revoked for good");
      assert.equal((await inbox.auditLog({ limit: 1 }))[0]!.operation, "revokeKey");
    });
  });
}
