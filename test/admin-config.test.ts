// test/admin-config.test.ts: the configuration's and the keys' forms on the operator page over real HTTP, on both
// backends: each is an API change held to the operator's rule (a loopback URL and an env: name refused, each
// beside the control the operator allows), needs its session's CSRF token, is refused to a read key's session
// and on a --read-only page, and whatever the configuration holds is shown as text; a key's session ends with
// its key; a key made on the page and a secret set there reach no page, log line or audit entry; a route added
// to a source with no routes keeps the handler's beside it; a destination a route names is not deleted.
// The browser's side is test/admin-config-browser.test.ts.
//   npx node --test test/admin-config.test.ts

import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";
import { createAdmin, listenAdmin, type Admin, type AdminOptions } from "../admin.ts";
import { connect } from "../inbox.ts";
import { mintKey } from "../lib/api/keys.ts";
import { hostOf } from "../lib/config/config.ts";
import type { Inbox } from "../lib/store.ts";
import { backends } from "./helpers.ts";

const TOKEN = "config-forms-token";
const SECRET_VALUE = "whsec_c2VjcmV0LXZhbHVlLW9mLXRoZS1wYWdlLXRlc3Q=";
const KEY = Buffer.alloc(32, 5).toString("base64");
// The operator's file: a source with no routes (its deliveries go to the handler), a destination whose
// headers hold what a page must show as text.
const DOCUMENT = {
  $destinations: {
    app: {
      url: "https://app.example.com/hooks",
      secret: "env:APP_SECRET",
      headers: { "x-note": "<script>alert(1)</script>", "x-key": "env:APP_KEY" },
    },
  },
  st: { provider: "plain" },
  gh: { provider: "plain", routes: ["app"] },
};
// An operator who allows the API loopback and the app's secret.
const LOOSE = { INBOX_API_DESTINATIONS_ALLOW: "127.0.0.1/32", INBOX_API_ENV: "APP_SECRET" };
const csrfOf = (html: string) => /name="csrf" value="([^"]+)"/.exec(html)?.[1] ?? "";

for (const backend of await backends("admin_config")) {
  describe(`the configuration's forms on the operator page, on ${backend.name}`, { skip: backend.skip }, () => {
    let inbox: Inbox;
    let cleanup: () => Promise<void>;
    let servers: Admin[];
    let lines: string[];

    beforeEach(async () => {
      const made = await backend.make();
      cleanup = made.cleanup;
      inbox = await connect(made.target);
      await inbox.applyConfig(`${JSON.stringify(DOCUMENT)}\n`, { actor: "test" });
      servers = [];
      lines = [];
    });
    afterEach(async () => {
      for (const s of servers) {
        s.server.closeAllConnections();
        await new Promise((resolve) => s.server.close(resolve));
      }
      await inbox.close();
      await cleanup();
    });

    // start runs a page whose operator hands the API env (its INBOX_API_ENV, INBOX_API_DESTINATIONS_ALLOW).
    const start = async (env: Record<string, string> = {}, options: Partial<AdminOptions> = {}) => {
      const admin = createAdmin({
        inbox,
        token: TOKEN,
        audit: (line) => lines.push(line),
        host: hostOf({ APP_SECRET: "whsec_YXBw", APP_KEY: "k", INBOX_SECRETS_KEY: KEY, ...env }, { inbox }),
        ...options,
      });
      servers.push(admin);
      const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0, token: TOKEN });
      // login exchanges a credential for a session: its cookie, and the CSRF token its pages carry.
      const login = async (credential = TOKEN) => {
        const r = await fetch(`${url}/login`, {
          method: "POST",
          body: new URLSearchParams({ token: credential }),
          redirect: "manual",
        });
        assert.equal(r.status, 303, `logged in with ${credential.slice(0, 6)}`);
        const cookie = r.headers.get("set-cookie")!.split(";")[0]!;
        const get = async (path: string) => {
          const answer = await fetch(`${url}${path}`, { headers: { cookie }, redirect: "manual" });
          return { status: answer.status, html: await answer.text() };
        };
        const csrf = csrfOf((await get("/config")).html);
        const post = async (path: string, form: Record<string, string>, withCsrf = true) => {
          const answer = await fetch(`${url}${path}`, {
            method: "POST",
            body: new URLSearchParams({ ...form, ...(withCsrf ? { csrf } : {}) }),
            headers: { cookie },
            redirect: "manual",
          });
          return { status: answer.status, html: await answer.text(), location: answer.headers.get("location") };
        };
        return { get, post, csrf };
      };
      return { url, login };
    };
    const version = async () => (await inbox.readConfig())!.version;
    const snapshot = async () =>
      JSON.stringify([
        await inbox.query("SELECT version FROM inbox_config ORDER BY version"),
        await inbox.query("SELECT name FROM secrets ORDER BY name"),
        await inbox.query("SELECT id, revoked_at FROM api_keys ORDER BY id"),
        await inbox.query("SELECT count(*) AS n FROM audit"),
      ]);
    const newDestination = (url: string, secret = "env:APP_SECRET") => ({
      new: "1",
      name: "more",
      url,
      secret,
      version: "1",
    });

    it("holds a change to the operator's rule: a loopback URL and an env: name it does not allow are refused, nothing changed; allowed (the control), made", async () => {
      const strict = await (await start()).login();
      const state = await snapshot();
      const loop = await strict.post("/config/destination", newDestination("http://127.0.0.1:9/more", "secret:more"));
      assert.equal(loop.status, 400);
      assert.match(loop.html, /destination more: url 127\.0\.0\.1 is loopback \(127\.0\.0\.0\/8\)/);
      const env = await strict.post(
        "/config/destination",
        newDestination("https://more.example.com/", "env:APP_SECRET"),
      );
      assert.equal(env.status, 400);
      assert.match(env.html, /names the environment variable APP_SECRET, which a change through the API may not read/);
      assert.equal(await snapshot(), state, "nothing changed");

      const loose = await (await start(LOOSE)).login();
      const made = await loose.post("/config/destination", newDestination("http://127.0.0.1:9/more"));
      assert.equal(made.status, 303, made.html);
      const stored = (await inbox.readConfig())!;
      assert.deepEqual(
        [stored.version, stored.way, stored.trust["destination more"], stored.trust["destination app"]],
        [2, "api", "api", "operator"],
      );
      const [entry] = await inbox.auditLog({ limit: 1 });
      assert.match(entry!.who, /^page:session:[\w-]{6}@127\.0\.0\.1$/);
      assert.equal(entry!.operation, "putDestination");
      assert.match(entry!.target, /^destination="more": version 2 \(was 1\): \+ destination more$/);
    });

    it("refuses a form without the session's CSRF token, or with another's, changing nothing; with it (the control), makes the change", async () => {
      const { login } = await start(LOOSE);
      const ann = await login();
      const bo = await login();
      const form = newDestination("http://127.0.0.1:9/more");
      const state = await snapshot();
      assert.equal((await ann.post("/config/destination", form, false)).status, 403);
      assert.equal((await ann.post("/config/destination", { ...form, csrf: bo.csrf }, false)).status, 403);
      assert.equal((await ann.post("/keys/create", { name: "x", scope: "admin" }, false)).status, 403);
      assert.equal(await snapshot(), state);
      assert.equal((await ann.post("/config/destination", form)).status, 303);
      assert.equal(await version(), 2);
    });

    it("shows whatever the configuration holds as text, never markup, on every page that shows it", async () => {
      const page = await (await start()).login();
      for (const path of ["/config", "/config/destination?name=app", "/config/version?version=1", "/config/history"]) {
        const { status, html } = await page.get(path);
        assert.equal(status, 200, path);
        assert.ok(!html.includes("<script>alert"), `${path}: no markup from the configuration`);
        if (path !== "/config/history") assert.match(html, /&#60;script&#62;alert\(1\)&#60;\/script&#62;/, path);
      }
      // References stay references; what they name is not read onto the page.
      const { html } = await page.get("/config");
      assert.match(html, /env:APP_KEY/);
      assert.ok(!html.includes("whsec_YXBw"));
    });

    it("refuses a read key's session and a --read-only page every change, and shows them no form that changes; a write key's session changes (the control)", async () => {
      const { login } = await start(LOOSE);
      const read = mintKey({ scope: "read", name: "looker", now: Date.now() });
      const write = mintKey({ scope: "write", name: "editor", now: Date.now() });
      await inbox.addApiKey(read.row);
      await inbox.addApiKey(write.row);
      const reader = await login(read.key);
      const readOnly = await (await start({}, { readOnly: true })).login();
      const forms: [string, Record<string, string>][] = [
        ["/config/destination", newDestination("http://127.0.0.1:9/more")],
        ["/config/destination/delete", { name: "app", version: "1" }],
        ["/config/route", { source: "gh", route: "0", to: "handler", version: "1" }],
        ["/config/route/delete", { source: "gh", route: "0", version: "1" }],
        ["/config/secret", { name: "app_signing", value: SECRET_VALUE }],
        ["/config/secret/delete", { name: "app_signing" }],
        ["/keys/create", { name: "x", scope: "admin" }],
        ["/keys/revoke", { id: read.row.id }],
      ];
      for (const who of [reader, readOnly]) {
        for (const path of ["/config", "/config/destination?name=app", "/config/route?source=gh&route=0", "/keys"]) {
          const { status, html } = await who.get(path);
          assert.equal(status, 200, path);
          assert.match(html, /class="badge readonly">read-only/, path);
          for (const button of [
            "Save",
            "Create",
            "Delete",
            "Set the secret",
            "Make the key",
            "Revoke",
            "New destination",
            "Add a route",
          ])
            assert.ok(!html.includes(`>${button}<`), `${path}: no ${button}`);
        }
        const state = await snapshot();
        for (const [path, form] of forms) assert.equal((await who.post(path, form)).status, 403, path);
        assert.equal(await snapshot(), state, "nothing changed");
      }
      // A read key may try a filter: it saves nothing.
      await inbox.store({ source: "gh", id: "evt_1", body: Buffer.from('{"amount": 5}'), destinations: ["app"] });
      const tried = await reader.post("/config/route/test", {
        source: "gh",
        route: "0",
        to: "app",
        filter: '{"body": {"amount": 5}}',
        try_source: "gh",
        try_id: "evt_1",
        version: "1",
      });
      assert.equal(tried.status, 200);
      assert.match(tried.html, /The filter takes gh\/evt_1/);
      // The control: a write key's session makes the first change, as itself; making a key is an admin's.
      const writer = await login(write.key);
      assert.equal((await writer.post(...forms[0]!)).status, 303);
      assert.equal((await inbox.auditLog({ limit: 1 }))[0]!.who, `page:key:${write.row.id}@127.0.0.1`);
      assert.equal((await writer.post("/keys/create", { name: "x", scope: "read" })).status, 403);
    });

    it("ends a key's session when its key is revoked: its next request is asked to log in", async () => {
      const { login } = await start();
      const key = mintKey({ scope: "write", name: "soon gone", now: Date.now() });
      await inbox.addApiKey(key.row);
      const session = await login(key.key);
      assert.equal((await session.get("/config")).status, 200);
      await inbox.revokeApiKey(key.row.id, Date.now());
      const after = await session.get("/config");
      assert.equal(after.status, 401);
      assert.match(after.html, /Admin token, or an API key/);
      // The control: the page's own token's session goes on.
      assert.equal((await (await login()).get("/config")).status, 200);
    });

    it("sets a secret and makes a key whose values reach no page, log line or audit entry, beyond the key's one page", async () => {
      const page = await (await start()).login();
      const set = await page.post("/config/secret", { name: "app_signing", value: SECRET_VALUE });
      assert.equal(set.status, 303);
      const made = await page.post("/keys/create", { name: "deploy bot", scope: "write" });
      assert.equal(made.status, 303);
      const shown = await page.get(made.location!);
      const key = /<pre class="once" id="once">(wik_[\w-]+)<\/pre>/.exec(shown.html)?.[1];
      assert.ok(key, "shown on the page the form led to");
      assert.equal((await page.get(made.location!)).html.includes(key), false, "and only once");
      const places = [
        [
          "the page",
          (await page.get("/config")).html + (await page.get("/keys")).html + (await page.get("/audit")).html,
        ],
        ["the page's log", lines.join("\n")],
        ["the audit log", JSON.stringify(await inbox.auditLog({ limit: 100 }))],
        ["the database's keys", JSON.stringify(await inbox.query("SELECT * FROM api_keys"))],
        ["the secrets' rows", JSON.stringify(await inbox.query("SELECT * FROM secrets"))],
      ];
      for (const [where, text] of places) {
        assert.ok(!text!.includes(SECRET_VALUE), `the secret reached ${where}`);
        assert.ok(!text!.includes(key.slice(4)), `the key reached ${where}`);
      }
      assert.deepEqual(
        (await inbox.auditLog({ limit: 2 })).map((e) => e.operation),
        ["createKey", "putSecret"],
      );
    });

    it("refuses to delete a destination deliveries wait for, and offers to set them aside: then it goes, and they are failed", async () => {
      const spare = {
        ...DOCUMENT,
        $destinations: {
          ...DOCUMENT.$destinations,
          spare: { url: "https://spare.example.com/", secret: "env:APP_SECRET" },
        },
      };
      await inbox.applyConfig(`${JSON.stringify(spare)}\n`, { actor: "test" });
      await inbox.store({ source: "gh", id: "evt_waits", body: Buffer.from("{}"), destinations: ["spare"] });
      const page = await (await start()).login();
      const state = await snapshot();
      const refused = await page.post("/config/destination/delete", { name: "spare", version: "2" });
      assert.equal(refused.status, 409);
      assert.match(refused.html, /deliveries still wait for a destination this removes \(1 for spare\)/);
      assert.equal(await snapshot(), state, "refused, nothing changed");
      const offer =
        /<form method="post" action="\/config\/destination\/delete" class="inline">(.*?)<button class="danger">(Delete spare, and set its 1 waiting delivery aside as failed)<\/button>/.exec(
          refused.html,
        );
      assert.ok(offer, "offered");
      const fields = Object.fromEntries(
        [...offer[1]!.matchAll(/name="(\w+)" value="([^"]*)"/g)].map((m) => [m[1], m[2]]),
      );
      assert.deepEqual({ ...fields, csrf: "" }, { csrf: "", name: "spare", version: "2", cancelWaiting: "true" });
      const gone = await page.post("/config/destination/delete", fields as Record<string, string>, false);
      assert.equal(gone.status, 303);
      assert.equal(await version(), 3);
      const [row] = await inbox.find("evt_waits", "gh");
      assert.deepEqual(
        [row!.status, row!.error],
        ["failed", "cancelled: destination spare removed by configuration version 3"],
      );
    });

    it("keeps the handler beside a route added to a source with no routes, and deletes no destination a route names", async () => {
      const page = await (await start()).login();
      const added = await page.post("/config/route", { source: "st", route: "", to: "app", version: "1" });
      assert.equal(added.status, 303);
      const doc = JSON.parse((await inbox.readConfig())!.document) as Record<string, { routes?: unknown }>;
      assert.deepEqual(doc.st!.routes, ["handler", "app"]);
      const state = await snapshot();
      const refused = await page.post("/config/destination/delete", { name: "app", version: "2" });
      assert.equal(refused.status, 409);
      assert.match(refused.html, /Not saved\..*source st, source gh still route to app/);
      assert.equal(await snapshot(), state);
      // The control: with the routes to it gone first (st's deleted, gh's sent to the handler), it is deleted.
      const v = async () => String(await version());
      assert.equal(
        (await page.post("/config/route/delete", { source: "st", route: "1", version: await v() })).status,
        303,
      );
      const moved = await page.post("/config/route", { source: "gh", route: "0", to: "handler", version: await v() });
      assert.equal(moved.status, 303);
      const gone = await page.post("/config/destination/delete", { name: "app", version: String(await version()) });
      assert.equal(gone.status, 303, gone.html);
      assert.equal(JSON.parse((await inbox.readConfig())!.document).$destinations.app, undefined);
    });
  });
}
