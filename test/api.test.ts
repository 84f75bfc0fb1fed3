// test/api.test.ts: the JSON API (docs/api.md) through the real admin.ts process on a free port, on SQLite and
// PostgreSQL: the served OpenAPI document validates, the committed client types (test/generated/api.ts) are
// what openapi-typescript makes of it now, and every operation in it is called through openapi-fetch as a
// user's code would; the configuration is read and changed, whole or a part at a time, with the database
// checked after each and nothing changed by a refusal; refusals (no key, a wrong, read or revoked key) change
// nothing and are counted; an Idempotency-Key is replayed or refused; bad input is a problem+json with nothing
// stored; the page's actions land in the same audit log. Keys come from the real `inbox.ts keys create`.
//   npx node --import tsx --test test/api.test.ts

import assert from "node:assert/strict";
import { request as httpRequest } from "node:http";
import { execFile, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import { Validator } from "@seriousme/openapi-schema-validator";
import createClient, { type Middleware } from "openapi-fetch";
import { connect } from "../inbox.ts";
import { createAdmin, listenAdmin } from "../lib/admin/server.ts";
import { mintKey } from "../lib/api/keys.ts";
import { IN_THE_CLEAR } from "../lib/api/config.ts";
import { TEST_SOURCE, type Inbox } from "../lib/store.ts";
import type { paths } from "./generated/api.ts";
import { backends, ROOT, runScript, startAdmin as start, tempDir } from "./helpers.ts";

const BACKENDS = await backends("api");
// A Standard Webhooks secret for the destination, as a worker (and the configuration's check) requires.
const ENV = {
  STRIPE_SECRET: "whsec_api_test_secret",
  APP_SECRET: `whsec_${Buffer.from("app-signing-secret-api").toString("base64")}`,
  // The operator hands the API these two variables and the loopback stand-in of the app (docs/security.md).
  INBOX_API_ENV: "STRIPE_SECRET,APP_SECRET",
  INBOX_API_DESTINATIONS_ALLOW: "127.0.0.1/32",
  INBOX_SECRETS_KEY: Buffer.alloc(32, 7).toString("base64"),
};

// key makes an API key with the real CLI, and returns it with its ID.
async function key(db: string, scope: "read" | "write" | "admin"): Promise<{ id: string; key: string }> {
  const run = await runScript("inbox.ts", [
    "keys",
    "create",
    "--scope",
    scope,
    "--name",
    `test ${scope}`,
    "--json",
    "--db",
    db,
  ]);
  assert.equal(run.code, 0, run.stderr);
  return JSON.parse(run.stdout) as { id: string; key: string };
}

// startAdmin runs admin.ts on a free port with the test's environment.
const startAdmin = (args: string[]) => start(args, ENV);

for (const backend of BACKENDS) {
  describe(`the API on ${backend.name}`, { skip: backend.skip }, () => {
    let made: { target: string; cleanup: () => Promise<void> };
    let inbox: Inbox;
    let admin: { url: string; child: ChildProcess };
    let write: { id: string; key: string };
    let read: { id: string; key: string };
    let revoked: { id: string; key: string };
    const dir = tempDir();
    // Every operation the document names, and those the typed clients had an answer from, across the tests.
    const ids = new Map<string, string>();
    const called = new Set<string>();

    // What a refusal must leave as it was: every row's state, every destination's, the audit log and the kept answers.
    const snapshot = async () =>
      JSON.stringify([
        await inbox.query(
          "SELECT source, id, route, status, attempts, replays FROM deliveries ORDER BY source, id, route",
        ),
        await inbox.query("SELECT name, paused, paused_reason FROM destinations ORDER BY name"),
        await inbox.query("SELECT count(*) AS n FROM audit"),
        await inbox.query("SELECT count(*) AS n FROM idempotency"),
        await inbox.query("SELECT version, document, transforms, actor FROM inbox_config ORDER BY version"),
      ]);

    before(async () => {
      made = await backend.make();
      inbox = await connect(made.target);
      const sources = join(dir.dir, "sources.json");
      writeFileSync(
        sources,
        JSON.stringify({
          $destinations: { app: { url: "http://127.0.0.1:9/hooks", secret: "env:APP_SECRET" } },
          stripe: { provider: "stripe", secret: "env:STRIPE_SECRET", routes: ["handler", "app"] },
        }),
      );
      const event = (id: string) =>
        Buffer.from(JSON.stringify({ id, type: "invoice.paid", data: { object: { id: `in_${id}` } } }));
      for (const id of ["evt_ok", "evt_bad", "evt_3", "evt_4"])
        await inbox.store({
          source: "stripe",
          id,
          body: event(id),
          contentType: "application/json",
          eventType: "invoice.paid",
          destinations: ["handler", "app"],
        });
      // evt_ok is done for the handler; evt_bad failed there for good; the others wait.
      const leases = await inbox.claimBatch(10, 60_000, { destination: "handler" });
      for (const lease of leases) {
        if (lease.id === "evt_ok") await inbox.finish(lease);
        else if (lease.id === "evt_bad") await inbox.fail(lease, "timeout after 5000 ms", { permanent: true });
        else await inbox.release(lease);
      }
      await inbox.flush();
      write = await key(made.target, "write");
      read = await key(made.target, "read");
      revoked = await key(made.target, "read");
      assert.equal((await runScript("inbox.ts", ["keys", "revoke", revoked.id, "--db", made.target])).code, 0);
      admin = await startAdmin(["--db", made.target, "--sources", sources]);
      const doc = (await (await fetch(`${admin.url}/openapi.json`)).json()) as {
        paths: Record<string, Record<string, { operationId: string }>>;
      };
      for (const [path, methods] of Object.entries(doc.paths))
        for (const [method, op] of Object.entries(methods)) ids.set(`${method.toUpperCase()} ${path}`, op.operationId);
    });

    after(async () => {
      admin?.child.kill("SIGTERM");
      await inbox?.close();
      await made?.cleanup();
      dir.cleanup();
    });

    const seen: Middleware = {
      onResponse({ schemaPath, request, response }) {
        if (response.ok) called.add(ids.get(`${request.method} ${schemaPath}`) ?? `unknown ${schemaPath}`);
      },
    };
    const client = (bearer?: string) => {
      const api = createClient<paths>({
        baseUrl: admin.url,
        ...(bearer === undefined ? {} : { headers: { authorization: `Bearer ${bearer}` } }),
      });
      api.use(seen);
      return api;
    };

    it("serves an OpenAPI 3.1 document that validates, and the committed client types are what it makes now", async () => {
      const doc = (await (await fetch(`${admin.url}/openapi.json`)).json()) as Record<string, unknown>;
      assert.equal(doc.openapi, "3.1.0");
      const validator = new Validator();
      const result = await validator.validate(doc as never);
      assert.deepEqual(result.errors ?? [], []);
      assert.equal(result.valid, true);
      // The control: the validator does refuse a document that is wrong.
      const broken = await new Validator().validate({ ...doc, info: { title: 1 } } as never);
      assert.equal(broken.valid, false);
      if (backend.name !== "sqlite") return;
      writeFileSync(join(dir.dir, "openapi.json"), JSON.stringify(doc));
      await promisify(execFile)(
        join(ROOT, "node_modules/.bin/openapi-typescript"),
        [join(dir.dir, "openapi.json"), "-o", join(dir.dir, "api.ts")],
        { cwd: ROOT },
      );
      assert.equal(
        readFileSync(join(dir.dir, "api.ts"), "utf8"),
        readFileSync(join(ROOT, "test/generated/api.ts"), "utf8"),
        "test/generated/api.ts is stale: regenerate it as docs/api.md says",
      );
    });

    it("declares in the document the 404, 405, 413 and 415 that its routing answers, and answers them so", async () => {
      const doc = (await (await fetch(`${admin.url}/openapi.json`)).json()) as {
        paths: Record<
          string,
          Record<string, { operationId: string; requestBody?: unknown; responses: Record<string, unknown> }>
        >;
      };
      const missing: string[] = [];
      for (const [path, methods] of Object.entries(doc.paths))
        for (const op of Object.values(methods)) {
          const wanted = [405, ...(path.includes("{") ? [404] : []), ...(op.requestBody ? [413, 415] : [])];
          for (const status of wanted)
            if (!(String(status) in op.responses)) missing.push(`${op.operationId} ${status}`);
        }
      assert.deepEqual(missing, []);
      // What the routing answers, on one operation that has them all: POST /api/v1/destinations/{name}/pause.
      const declared = Object.keys(doc.paths["/api/v1/destinations/{name}/pause"]!.post!.responses);
      const send = (init: RequestInit & { path?: string }) =>
        fetch(`${admin.url}${init.path ?? "/api/v1/destinations/app/pause"}`, {
          ...init,
          headers: {
            authorization: `Bearer ${write.key}`,
            "idempotency-key": `problems-${Math.random()}`,
            ...init.headers,
          },
        });
      const state = await snapshot();
      const answers = [
        await send({
          method: "POST",
          path: "/api/v1/destinations/nowhere/pause",
          body: "{}",
          headers: { "content-type": "application/json" },
        }),
        await send({ method: "PATCH", body: "{}" }),
        await send({
          method: "POST",
          body: JSON.stringify({ reason: "x".repeat(70_000) }),
          headers: { "content-type": "application/json" },
        }),
        await send({
          method: "POST",
          body: "reason=hi",
          headers: { "content-type": "application/x-www-form-urlencoded" },
        }),
      ];
      assert.deepEqual(
        answers.map((r) => `${r.status} ${r.headers.get("content-type")}`),
        [404, 405, 413, 415].map((s) => `${s} application/problem+json`),
      );
      for (const r of answers) assert.ok(declared.includes(String(r.status)), `${r.status} is declared`);
      assert.equal(await snapshot(), state, "none of them changed anything");
    });

    it("calls the deliveries' and destinations' operations through the typed client, each doing what the page does", async () => {
      const api = client(write.key);
      const path = (id: string) => ({ path: { source: "stripe", id } });

      // Every row, a page of three at a time, each once.
      const rows: string[] = [];
      for (let after: string | undefined, pages = 0; ; pages++) {
        assert.ok(pages < 5);
        const { data } = await api.GET("/api/v1/deliveries", {
          params: { query: { limit: 3, ...(after ? { after } : {}) } },
        });
        rows.push(...data!.items.map((d) => `${d.id}>${d.destination}`));
        if (!data!.next) break;
        after = data!.next;
      }
      assert.equal(rows.length, 8);
      assert.equal(new Set(rows).size, 8);
      const failed = await api.GET("/api/v1/deliveries", { params: { query: { status: "failed", error: "TIMEOUT" } } });
      assert.deepEqual(
        failed.data!.items.map((d) => d.id),
        ["evt_bad"],
      );

      const shown = await api.GET("/api/v1/deliveries/{source}/{id}", { params: path("evt_ok") });
      assert.equal(shown.data!.rows.length, 2);
      assert.equal(
        Buffer.from(shown.data!.bodyBase64, "base64").toString(),
        (await inbox.find("evt_ok", "stripe"))[0]!.body.toString(),
      );
      const attempts = await api.GET("/api/v1/deliveries/{source}/{id}/attempts", { params: path("evt_bad") });
      assert.deepEqual(
        attempts.data!.attempts.map((a) => a.error),
        ["timeout after 5000 ms"],
      );
      const preview = await api.GET("/api/v1/deliveries/{source}/{id}/preview", { params: path("evt_ok") });
      assert.deepEqual(
        preview.data!.routes.map((r) => [r.to, r.chosen]),
        [
          ["handler", true],
          ["app", true],
        ],
      );
      assert.ok(!JSON.stringify(preview.data).includes(ENV.APP_SECRET), "no secret in the preview");
      const status = await api.GET("/api/v1/status");
      assert.deepEqual(status.data!.counts, (await inbox.summary()).counts);
      const destinations = await api.GET("/api/v1/destinations");
      assert.deepEqual(
        destinations.data!.items.map((d) => d.name),
        ["app", "handler"],
      );

      const retried = await api.POST("/api/v1/deliveries/{source}/{id}/retry", { params: path("evt_bad"), body: {} });
      assert.equal(retried.data!.count, 1);
      assert.equal(
        (await inbox.find("evt_bad", "stripe")).find((d) => d.destination === "handler")!.status,
        "received",
      );
      const replayed = await api.POST("/api/v1/deliveries/{source}/{id}/replay", {
        params: path("evt_ok"),
        body: { destination: "handler" },
      });
      assert.equal(replayed.data!.count, 1);
      assert.equal((await inbox.find("evt_ok", "stripe")).find((d) => d.destination === "handler")!.replays, 1);
      // A bulk dry run counts what the store counts, and changes nothing; the real one changes them.
      const before = await snapshot();
      const dry = await api.POST("/api/v1/deliveries/bulk", {
        body: { action: "retry", filter: { destination: "app" }, dryRun: true },
      });
      assert.equal(dry.data!.count, await inbox.count({ status: "failed", destination: "app" }));
      assert.equal(await snapshot(), before);
      await inbox.fail((await inbox.claimBatch(1, 60_000, { destination: "app" }))[0]!, "503", { permanent: true });
      const bulk = await api.POST("/api/v1/deliveries/bulk", {
        body: { action: "retry", filter: { destination: "app" } },
      });
      assert.equal(bulk.data!.count, 1);
      assert.equal(await inbox.count({ status: "failed" }), 0);

      const paused = await api.POST("/api/v1/destinations/{name}/pause", {
        params: { path: { name: "app" } },
        body: { reason: "deploying" },
      });
      assert.deepEqual(paused.data, { changed: true });
      assert.equal((await inbox.destinations()).find((d) => d.name === "app")!.state, "paused");
      const resumed = await api.POST("/api/v1/destinations/{name}/resume", {
        params: { path: { name: "app" } },
        body: {},
      });
      assert.deepEqual(resumed.data, { changed: true });
      assert.equal((await inbox.destinations()).find((d) => d.name === "app")!.state, "closed");

      const audit = await api.GET("/api/v1/audit", { params: { query: { limit: 10 } } });
      assert.deepEqual(
        audit.data!.items.map((e) => [e.who.replace(/^cli:.*/, "cli"), e.operation, e.count]),
        [
          [`key:${write.id}`, "resumeDestination", 1],
          [`key:${write.id}`, "pauseDestination", 1],
          [`key:${write.id}`, "bulkDeliveries", 1],
          [`key:${write.id}`, "replayDelivery", 1],
          [`key:${write.id}`, "retryDelivery", 1],
          // The keys themselves, made and revoked with the CLI before the page started.
          ["cli", "keys revoke", 1],
          ["cli", "keys create", 1],
          ["cli", "keys create", 1],
          ["cli", "keys create", 1],
        ],
      );
    });

    it("reads and applies the configuration whole, checked as config apply checks it, each change a version with its audit entry", async () => {
      const api = client(write.key);
      const version = async () => (await inbox.readConfig())?.version ?? 0;
      const lastAudit = async () => (await inbox.auditLog({ limit: 1 }))[0]!;
      const none = await api.GET("/api/v1/config");
      assert.deepEqual(none.data, {
        version: 0,
        actor: null,
        appliedAt: null,
        way: null,
        trust: {},
        document: null,
        transforms: {},
      });

      // A transform through the API is code the configuration holds, run in the sandbox; a module path, a file
      // on the host, is refused (the control: the same document with the code written to a file).
      const code = "export default (d) => ({ body: { shaped: true, id: d.id } });\n";
      writeFileSync(join(dir.dir, "shape.mjs"), code);
      const sha = createHash("sha256").update(code).digest("hex");
      const name = `code:${sha.slice(0, 12)}`;
      const document = {
        $destinations: { app: { url: "http://127.0.0.1:9/hooks", secret: "env:APP_SECRET", transform: { code } } },
        stripe: { provider: "stripe", secret: "env:STRIPE_SECRET", routes: ["handler", "app"] },
      };
      const byPath = await api.PUT("/api/v1/config", {
        body: {
          document: {
            ...document,
            $destinations: { app: { ...document.$destinations.app, transform: "./shape.mjs" } },
          },
          dryRun: true,
        },
      });
      assert.equal(byPath.response.status, 400);
      assert.match(byPath.error!.detail, /destination app: transform names a module file on the host/);
      let state = await snapshot();
      const dry = await api.PUT("/api/v1/config", { body: { document, dryRun: true } });
      assert.deepEqual(dry.data, {
        applied: false,
        dryRun: true,
        version: 0,
        previousVersion: 0,
        changes: ["+ destination app", "+ source stripe", `+ transform ${name} (sha256 ${sha.slice(0, 12)})`],
        removed: [],
        cancelled: 0,
      });
      assert.equal(await snapshot(), state, "a dry run changes nothing");

      const applied = await api.PUT("/api/v1/config", { body: { document, expectedVersion: 0 } });
      assert.equal(applied.data!.applied, true);
      assert.equal(applied.data!.version, 1);
      const stored = (await inbox.readConfig())!;
      assert.equal(stored.version, 1);
      assert.equal(stored.actor, `key:${write.id}`);
      assert.deepEqual(JSON.parse(stored.document), document);
      assert.equal(stored.transforms[name]!.sha256, sha);
      assert.deepEqual(
        [(await lastAudit()).who, (await lastAudit()).operation, (await lastAudit()).count],
        [`key:${write.id}`, "applyConfig", 3],
      );
      const shown = await client(read.key).GET("/api/v1/config");
      assert.equal(shown.data!.version, 1);
      assert.equal(shown.data!.actor, `key:${write.id}`);
      assert.deepEqual(shown.data!.document, document, "secrets stay env:NAME references");
      assert.deepEqual(shown.data!.transforms, { [name]: sha }, "the transform's hash");
      assert.deepEqual(
        [shown.data!.way, shown.data!.trust],
        ["api", { "destination app": "api", "source stripe": "api" }],
      );
      // The preview is the configuration in force now, not the --sources file the page read at start.
      const preview = await api.GET("/api/v1/deliveries/{source}/{id}/preview", {
        params: { path: { source: "stripe", id: "evt_ok" } },
      });
      const toApp = preview.data!.requests.find((r) => r.destination === "app") as { body: { data: number[] } };
      assert.deepEqual(JSON.parse(Buffer.from(toApp.body.data).toString()), { shaped: true, id: "evt_ok" });
      // ?to= previews one destination alone, whatever the delivery's rows; without it (the control), each of its rows.
      const one = await api.GET("/api/v1/deliveries/{source}/{id}/preview", {
        params: { path: { source: "stripe", id: "evt_ok" }, query: { to: "app" } },
      });
      assert.deepEqual(
        one.data!.requests.map((r) => r.destination),
        ["app"],
      );
      assert.deepEqual(
        preview.data!.requests.map((r) => r.destination),
        ["handler", "app"],
      );

      // Refused, each with nothing changed: a document that fails the checks, a stale version, no key, a read key,
      // and a document that sends back the marker getConfig shows for a secret written in the clear.
      state = await snapshot();
      const nowhere = { ...document, stripe: { ...document.stripe, routes: ["app", "nowhere"] } };
      const bad = await api.PUT("/api/v1/config", { body: { document: nowhere } });
      assert.equal(bad.response.status, 400);
      assert.equal(bad.response.headers.get("content-type"), "application/problem+json");
      assert.match(
        bad.error!.detail,
        /source "stripe": route #2: expected "to" to name a destination .*"nowhere"; nothing changed/,
      );
      const stale = await api.PUT("/api/v1/config", { body: { document, expectedVersion: 0 } });
      assert.equal(stale.response.status, 409);
      assert.match(stale.error!.detail, /version 1 is in force, not 0/);
      assert.equal((await client().PUT("/api/v1/config", { body: { document } })).response.status, 401);
      assert.equal((await client(read.key).PUT("/api/v1/config", { body: { document } })).response.status, 403);
      const marker = { ...document, stripe: { ...document.stripe, secret: IN_THE_CLEAR } };
      assert.equal((await api.PUT("/api/v1/config", { body: { document: marker } })).response.status, 400);
      assert.equal(await snapshot(), state, "no refusal changed anything");
      // The same document again is no change: no version added.
      const again = await api.PUT("/api/v1/config", { body: { document } });
      assert.deepEqual([again.data!.applied, again.data!.version, again.data!.changes], [false, 1, []]);
      assert.equal(await version(), 1);
    });

    it("creates, replaces and removes one source or destination on the version in force, a stale version refused", async () => {
      const api = client(write.key);
      const doc = async () =>
        JSON.parse((await inbox.readConfig())!.document) as Record<string, Record<string, unknown>>;
      const lastAudit = async () => (await inbox.auditLog({ limit: 1 }))[0]!;

      const extra = await api.PUT("/api/v1/destinations/{name}", {
        params: { path: { name: "extra" } },
        body: { settings: { url: "http://127.0.0.1:9/extra", secret: "env:APP_SECRET" } },
      });
      assert.deepEqual([extra.data!.version, extra.data!.changes], [2, ["+ destination extra"]]);
      assert.deepEqual((await doc()).$destinations!.extra, {
        url: "http://127.0.0.1:9/extra",
        secret: "env:APP_SECRET",
      });
      assert.equal((await lastAudit()).operation, "putDestination");
      assert.ok(
        (await api.GET("/api/v1/destinations")).data!.items.some((d) => d.name === "extra"),
        "listed before any delivery went to it",
      );

      const gh = await api.PUT("/api/v1/sources/{name}", {
        params: { path: { name: "gh" } },
        body: { settings: { provider: "github", secret: "env:STRIPE_SECRET", routes: ["extra"] }, expectedVersion: 2 },
      });
      assert.deepEqual([gh.data!.version, gh.data!.changes], [3, ["+ source gh"]]);
      assert.deepEqual((await doc()).gh, { provider: "github", secret: "env:STRIPE_SECRET", routes: ["extra"] });
      assert.equal((await lastAudit()).operation, "putSource");
      let state = await snapshot();
      const stale = await api.PUT("/api/v1/sources/{name}", {
        params: { path: { name: "gh" } },
        body: { settings: { provider: "github", secret: "env:STRIPE_SECRET" }, expectedVersion: 2 },
      });
      assert.equal(stale.response.status, 409, "a change made since the version read is never lost");
      const wrong = await api.PUT("/api/v1/sources/{name}", {
        params: { path: { name: "gh" } },
        body: { settings: { provider: "github", secret: "env:NOT_SET_ANYWHERE" } },
      });
      assert.equal(wrong.response.status, 400);
      assert.match(
        wrong.error!.detail,
        /source gh: secret names the environment variable NOT_SET_ANYWHERE, which a change through the API may not read/,
      );
      const routed = await api.DELETE("/api/v1/destinations/{name}", { params: { path: { name: "extra" } } });
      assert.equal(routed.response.status, 409);
      assert.match(routed.error!.detail, /source gh still routes to extra/);
      assert.equal(
        (await api.DELETE("/api/v1/sources/{name}", { params: { path: { name: "nope" } } })).response.status,
        404,
      );
      assert.equal(await snapshot(), state, "no refusal changed anything");

      const removed = await api.DELETE("/api/v1/sources/{name}", { params: { path: { name: "gh" } } });
      assert.deepEqual([removed.data!.version, removed.data!.changes], [4, ["- source gh"]]);
      assert.equal((await doc()).gh, undefined);
      assert.equal((await lastAudit()).operation, "deleteSource");

      // A destination that rows wait for is removed only when they may go: 409 naming them, then cancelWaiting.
      await inbox.store({ source: "stripe", id: "evt_extra", body: Buffer.from("{}"), destinations: ["extra"] });
      state = await snapshot();
      const waits = await api.DELETE("/api/v1/destinations/{name}", { params: { path: { name: "extra" } } });
      assert.equal(waits.response.status, 409);
      assert.deepEqual(waits.error!.waiting, [{ destination: "extra", n: 1 }]);
      const dry = await api.DELETE("/api/v1/destinations/{name}", {
        params: { path: { name: "extra" }, query: { cancelWaiting: true, dryRun: true } },
      });
      assert.deepEqual(dry.data!.removed, [{ destination: "extra", waiting: 1 }]);
      assert.equal(await snapshot(), state, "nothing changed");
      const gone = await api.DELETE("/api/v1/destinations/{name}", {
        params: { path: { name: "extra" }, query: { cancelWaiting: true, expectedVersion: 4 } },
      });
      assert.deepEqual([gone.data!.version, gone.data!.changes, gone.data!.cancelled], [5, ["- destination extra"], 1]);
      assert.equal((await doc()).$destinations!.extra, undefined);
      const [row] = await inbox.find("evt_extra", "stripe");
      assert.equal(row!.status, "failed");
      assert.match(row!.error!, /cancelled: destination extra removed by configuration version 5/);
      assert.equal((await lastAudit()).operation, "deleteDestination");
    });

    it("shows the configuration's history a page at a time, each version's changes down to the field, and any two versions compared", async () => {
      const api = client(read.key);
      const first = await api.GET("/api/v1/config/versions", { params: { query: { limit: 2 } } });
      assert.deepEqual(
        first.data!.items.map((v) => [v.version, v.actor, v.way, v.changes]),
        [
          [5, `key:${write.id}`, "api", ["- destination extra"]],
          [4, `key:${write.id}`, "api", ["- source gh"]],
        ],
      );
      assert.equal(first.data!.next, 4);
      const rest = await api.GET("/api/v1/config/versions", { params: { query: { limit: 10, after: 4 } } });
      assert.deepEqual(
        rest.data!.items.map((v) => [v.version, v.changes[0]]),
        [
          [3, "+ source gh"],
          [2, "+ destination extra"],
          [1, "+ destination app"],
        ],
      );
      assert.equal(rest.data!.next, null);
      const three = await api.GET("/api/v1/config/versions/{version}", {
        params: { path: { version: 3 }, query: { against: 1 } },
      });
      assert.deepEqual(
        [three.data!.version, three.data!.against, three.data!.changes],
        [3, 1, ["+ destination extra", "+ source gh"]],
      );
      assert.deepEqual(Object.keys(three.data!.document!).sort(), ["$destinations", "gh", "stripe"]);
      assert.equal(three.data!.trust["source gh"], "api");
      const before = await api.GET("/api/v1/config/versions/{version}", { params: { path: { version: 2 } } });
      assert.deepEqual([before.data!.against, before.data!.changes], [1, ["+ destination extra"]]);
      for (const [version, against] of [
        [99, undefined],
        [3, 42],
      ] as const) {
        const missing = await api.GET("/api/v1/config/versions/{version}", {
          params: { path: { version }, query: against === undefined ? {} : { against } },
        });
        assert.equal(missing.response.status, 404);
      }
    });

    it("sends a test delivery to one destination alone, stored under $test with origin test, followed with getDelivery", async () => {
      const api = client(write.key);
      const sent = await api.POST("/api/v1/destinations/{name}/test", {
        params: { path: { name: "app" } },
        body: { data: { hello: "world" } },
      });
      assert.equal(sent.response.status, 202);
      assert.equal(sent.data!.source, TEST_SOURCE);
      assert.match(sent.data!.id, /^test_\d+_[0-9a-f]{8}$/);
      const rows = await inbox.find(sent.data!.id, TEST_SOURCE);
      assert.deepEqual(
        rows.map((r) => [r.destination, r.status, r.eventType, r.origin]),
        [["app", "received", "inbox.test", "test"]],
      );
      assert.deepEqual(JSON.parse(rows[0]!.body.toString()), {
        type: "inbox.test",
        id: sent.data!.id,
        data: { hello: "world" },
      });
      const followed = await api.GET("/api/v1/deliveries/{source}/{id}", {
        params: { path: { source: sent.data!.source, id: sent.data!.id } },
      });
      assert.deepEqual(
        followed.data!.rows.map((r) => [r.destination, r.origin]),
        [["app", "test"]],
      );
      assert.equal((await inbox.auditLog({ limit: 1 }))[0]!.operation, "testDestination");
      const state = await snapshot();
      for (const name of ["nowhere", "handler"]) {
        const refused = await api.POST("/api/v1/destinations/{name}/test", { params: { path: { name } }, body: {} });
        assert.equal(refused.response.status, 404, name);
      }
      const byRead = await client(read.key).POST("/api/v1/destinations/{name}/test", {
        params: { path: { name: "app" } },
        body: {},
      });
      assert.equal(byRead.response.status, 403);
      assert.equal(await snapshot(), state, "nothing stored");
    });

    it("sets, lists and deletes secrets: sealed at once, never answered back, kept out of the database's text and the audit log", async () => {
      const api = client(write.key);
      const value = "canary-secret-value-for-the-api-test";
      const set = await api.PUT("/api/v1/secrets/{name}", {
        params: { path: { name: "app_token" } },
        body: { value },
      });
      assert.deepEqual(set.data, { name: "app_token", created: true });
      const again = await api.PUT("/api/v1/secrets/{name}", {
        params: { path: { name: "app_token" } },
        body: { value: `${value}-2` },
      });
      assert.deepEqual(again.data, { name: "app_token", created: false });
      const listed = await client(read.key).GET("/api/v1/secrets");
      assert.deepEqual(
        listed.data!.items.map((s) => [s.name, s.setBy]),
        [["app_token", `key:${write.id}`]],
      );
      assert.ok(!JSON.stringify(listed.data).includes("canary-secret"), "the list holds no value");
      const [row] = await inbox.query("SELECT sealed FROM secrets WHERE name = ?", "app_token");
      assert.ok(!String(row!.sealed).includes("canary"), "sealed in the database");
      const entries = (await inbox.auditLog({ limit: 2 })).map((e) => [e.operation, e.target]);
      assert.deepEqual(entries, [
        ["putSecret", 'secret="app_token"'],
        ["putSecret", 'secret="app_token"'],
      ]);
      // A configuration names it, and may not lose it: deleting it then is a 409, nothing changed.
      const named = await api.PUT("/api/v1/destinations/{name}", {
        params: { path: { name: "tokened" } },
        body: { settings: { url: "http://127.0.0.1:9/t", secret: "env:APP_SECRET", bearer: "secret:app_token" } },
      });
      assert.equal(named.response.status, 200, JSON.stringify(named.error));
      const state = await snapshot();
      const held = await api.DELETE("/api/v1/secrets/{name}", { params: { path: { name: "app_token" } } });
      assert.equal(held.response.status, 409);
      assert.match(held.error!.detail, /names secret:app_token \(destination tokened\)/);
      assert.equal(
        (await api.DELETE("/api/v1/secrets/{name}", { params: { path: { name: "nope" } } })).response.status,
        404,
      );
      assert.equal(await snapshot(), state, "neither refusal changed anything");
      await api.DELETE("/api/v1/destinations/{name}", { params: { path: { name: "tokened" } } });
      const gone = await api.DELETE("/api/v1/secrets/{name}", { params: { path: { name: "app_token" } } });
      assert.deepEqual(gone.data, { name: "app_token", deleted: true });
      assert.deepEqual((await client(read.key).GET("/api/v1/secrets")).data!.items, []);
      assert.equal(
        (await client(read.key).PUT("/api/v1/secrets/{name}", { params: { path: { name: "x" } }, body: { value } }))
          .response.status,
        403,
      );
      const bad = await api.PUT("/api/v1/secrets/{name}", { params: { path: { name: "a b" } }, body: { value } });
      assert.equal(bad.response.status, 400);
    });

    it("tries a filter on a stored delivery or a body given inline, with the route's checks, saving nothing", async () => {
      const api = client(read.key);
      const state = await snapshot();
      const on = async (filter: Record<string, unknown>, what: Record<string, unknown>) =>
        (await api.POST("/api/v1/filters/test", { body: { filter, ...what } })).data!.matches;
      const stored = { delivery: { source: "stripe", id: "evt_ok" } };
      assert.equal(await on({ type: "invoice.*" }, stored), false, "a filter's type is no glob");
      assert.equal(await on({ type: "invoice.paid", source: "stripe", path: "/stripe" }, stored), true);
      assert.equal(await on({ body: { data: { object: { id: "in_evt_ok" } } } }, stored), true);
      assert.equal(await on({ body: { id: "evt_bad" } }, stored), false);
      assert.equal(await on({ body: { amount: { $gt: 100 } } }, { body: { amount: 150 } }), true);
      assert.equal(await on({ body: { amount: { $gt: 100 } } }, { body: { amount: 50 } }), false);
      assert.equal(await on({ headers: { "x-plan": "pro" } }, { body: {}, headers: { "X-Plan": "pro" } }), true);
      const notes = await api.POST("/api/v1/filters/test", {
        body: { filter: { headers: { "x-a": "1" } }, ...stored },
      });
      assert.deepEqual(notes.data, {
        matches: false,
        notes: [
          "its headers were not kept (no route read or forwarded them when it was stored), so a header filter sees none",
        ],
      });

      const bad = await api.POST("/api/v1/filters/test", { body: { filter: { body: { a: { $foo: 1 } } }, body: {} } });
      assert.equal(bad.response.status, 400);
      assert.match(bad.error!.detail, /^body: filter at body\.a\.\$foo: unknown operator \$foo; expected one of/);
      const both = await api.POST("/api/v1/filters/test", { body: { filter: {}, body: {}, ...stored } });
      assert.equal(both.response.status, 400);
      const missing = await api.POST("/api/v1/filters/test", {
        body: { filter: {}, delivery: { source: "stripe", id: "evt_none" } },
      });
      assert.equal(missing.response.status, 404);
      assert.equal(await snapshot(), state, "nothing saved");
    });

    it("refuses no key, a wrong key, a read key that writes and a revoked key: 401 or 403, nothing changed, each counted", async () => {
      const metric = async (reason: string) => {
        const text = await (await fetch(`${admin.url}/metrics`)).text();
        return Number(new RegExp(`inbox_api_refused_total\\{reason="${reason}"\\} (\\d+)`).exec(text)?.[1] ?? 0);
      };
      const cases = [
        { who: undefined, status: 401, reason: "no_key" },
        { who: `${write.key}x`, status: 401, reason: "unknown_key" },
        { who: read.key, status: 403, reason: "read_key" },
        { who: revoked.key, status: 401, reason: "revoked_key" },
      ];
      for (const c of cases) {
        const state = await snapshot();
        const counted = await metric(c.reason);
        const { error, response } = await client(c.who).POST("/api/v1/destinations/{name}/pause", {
          params: { path: { name: "app" } },
          body: { reason: "should not" },
        });
        assert.equal(response.status, c.status, c.reason);
        assert.equal(response.headers.get("content-type"), "application/problem+json");
        assert.equal(error!.status, c.status);
        assert.equal(await snapshot(), state, `${c.reason}: nothing changed`);
        assert.equal(await metric(c.reason), counted + 1, `${c.reason}: counted`);
      }
      // A read key reads; the revoked one does not even read.
      assert.equal((await client(read.key).GET("/api/v1/status")).response.status, 200);
      assert.equal((await client(revoked.key).GET("/api/v1/status")).response.status, 401);
      // The control: the write key's same request does change it.
      const state = await snapshot();
      const done = await client(write.key).POST("/api/v1/destinations/{name}/pause", {
        params: { path: { name: "app" } },
        body: {},
      });
      assert.equal(done.response.status, 200);
      assert.notEqual(await snapshot(), state);
      await client(write.key).POST("/api/v1/destinations/{name}/resume", {
        params: { path: { name: "app" } },
        body: {},
      });
    });

    it("answers a DNS-rebinding refusal on /api/ as problem+json, counted in inbox_api_refused_total; the page's own stays HTML", async () => {
      // A page with no token answers loopback names only; a browser led here by a rebound name sends its Host.
      const ask = (path: string, host: string, method = "GET", body?: string) =>
        new Promise<{ status: number; type: string; text: string }>((resolve, reject) => {
          const url = new URL(admin.url);
          const req = httpRequest(
            {
              host: url.hostname,
              port: url.port,
              path,
              method,
              headers: {
                host,
                authorization: `Bearer ${write.key}`,
                ...(body ? { "content-type": "application/json", "idempotency-key": `rebind-${path}` } : {}),
              },
            },
            (res) => {
              let text = "";
              res
                .on("data", (c) => (text += c))
                .on("end", () => resolve({ status: res.statusCode!, type: String(res.headers["content-type"]), text }));
            },
          );
          req.on("error", reject);
          req.end(body);
        });
      const refused = async () =>
        Number(
          /inbox_api_refused_total\{reason="foreign_host"\} (\d+)/.exec(
            await (await fetch(`${admin.url}/metrics`)).text(),
          )?.[1] ?? 0,
        );
      const state = await snapshot();
      const before = await refused();
      const rebound = `rebound.example:${new URL(admin.url).port}`;
      const pause = await ask("/api/v1/destinations/app/pause", rebound, "POST", "{}");
      assert.equal(pause.status, 403);
      assert.equal(pause.type, "application/problem+json");
      assert.deepEqual(JSON.parse(pause.text), {
        type: "about:blank",
        title: "Forbidden",
        status: 403,
        detail: "this page answers to a loopback address only",
      });
      const document = await ask("/openapi.json", rebound);
      assert.equal(`${document.status} ${document.type}`, "403 application/problem+json");
      assert.equal(await refused(), before + 2, "each counted");
      assert.equal(await snapshot(), state, "nothing changed");
      // (control) The page's own paths keep their HTML refusal; a loopback name is answered.
      const page = await ask("/", rebound);
      assert.equal(page.status, 403);
      assert.match(page.type, /^text\/html/);
      assert.equal((await ask("/api/v1/status", `127.0.0.1:${new URL(admin.url).port}`)).status, 200);
    });

    it("refuses every change, even a write key's, when the page runs --read-only, and still reads", async () => {
      const readOnly = await startAdmin(["--db", made.target, "--read-only"]);
      try {
        const api = createClient<paths>({ baseUrl: readOnly.url, headers: { authorization: `Bearer ${write.key}` } });
        const state = await snapshot();
        const refused = await api.POST("/api/v1/destinations/{name}/pause", {
          params: { path: { name: "app" } },
          body: {},
        });
        assert.equal(refused.response.status, 403);
        assert.match(refused.error!.detail, /read-only/);
        assert.equal(await snapshot(), state);
        assert.match(
          await (await fetch(`${readOnly.url}/metrics`)).text(),
          /inbox_api_refused_total\{reason="read_only"\} 1/,
        );
        assert.equal((await api.GET("/api/v1/status")).response.status, 200, "the control: it reads");
      } finally {
        readOnly.child.kill("SIGTERM");
      }
    });

    it("answers a repeated Idempotency-Key with the first answer, a reused one with another body with a 422", async () => {
      const api = client(write.key);
      const pause = (idem: string, reason: string) =>
        api.POST("/api/v1/destinations/{name}/pause", {
          params: { path: { name: "app" }, header: { "idempotency-key": idem } },
          body: { reason },
        });
      const audits = async () => Number((await inbox.query("SELECT count(*) AS n FROM audit"))[0]!.n);
      const before = await audits();
      const first = await pause("k-1", "one");
      assert.deepEqual(first.data, { changed: true });
      const again = await pause("k-1", "one");
      assert.deepEqual(again.data, { changed: true }, "the first answer, though it is paused now");
      assert.equal(again.response.headers.get("idempotent-replayed"), "true");
      assert.equal(await audits(), before + 1, "it ran once");
      const kept = await inbox.query("SELECT key, status FROM idempotency");
      assert.deepEqual(
        kept.filter((r) => r.key === `key:${write.id}:k-1`).map((r) => Number(r.status)),
        [200],
      );
      const state = await snapshot();
      const other = await pause("k-1", "two");
      assert.equal(other.response.status, 422);
      assert.match(other.error!.detail, /different request/);
      assert.equal(await snapshot(), state, "nothing changed");
      // The control: a new key runs it again, and this time the destination was already paused.
      assert.deepEqual((await pause("k-2", "one")).data, { changed: false });
      await api.POST("/api/v1/destinations/{name}/resume", { params: { path: { name: "app" } }, body: {} });
    });

    it("answers bad input with a problem+json naming the field, and keeps nothing of it", async () => {
      const api = client(write.key);
      const state = await snapshot();
      const bad = await api.POST("/api/v1/deliveries/{source}/{id}/retry", {
        params: { path: { source: "stripe", id: "evt_3" }, header: { "idempotency-key": "bad-1" } },
        body: { destination: "no such!" },
      });
      assert.equal(bad.response.status, 400);
      assert.equal(bad.response.headers.get("content-type"), "application/problem+json");
      assert.deepEqual(
        bad.error!.errors!.map((e) => e.path),
        ["body.destination"],
      );
      const extra = await fetch(`${admin.url}/api/v1/destinations/app/pause`, {
        method: "POST",
        headers: { authorization: `Bearer ${write.key}`, "content-type": "application/json" },
        body: "{not json",
      });
      assert.equal(extra.status, 400);
      assert.equal(((await extra.json()) as { title: string }).title, "Bad Request");
      const list = await api.GET("/api/v1/deliveries", { params: { query: { status: "lost" as "done" } } });
      assert.equal(list.response.status, 400);
      const cursor = await api.GET("/api/v1/deliveries", { params: { query: { after: "nonsense" } } });
      assert.equal(cursor.response.status, 400);
      const missing = await api.POST("/api/v1/deliveries/{source}/{id}/retry", {
        params: { path: { source: "stripe", id: "evt_none" } },
        body: {},
      });
      assert.equal(missing.response.status, 404);
      const unknown = await api.POST("/api/v1/destinations/{name}/pause", {
        params: { path: { name: "nowhere" } },
        body: {},
      });
      assert.equal(unknown.response.status, 404);
      assert.equal(
        (await fetch(`${admin.url}/api/v1/nothing`, { headers: { authorization: `Bearer ${write.key}` } })).status,
        404,
      );
      assert.equal(await snapshot(), state, "nothing of any of it was stored");
    });

    it("searches bodies by bodyJson and bodyWords, refuses a form no index can answer, and reads a day's bodies for body", async () => {
      const api = client(read.key);
      const list = (query: Record<string, string>) => api.GET("/api/v1/deliveries", { params: { query } });
      const rows = (r: Awaited<ReturnType<typeof list>>) => r.data!.items.map((d) => `${d.id}>${d.destination}`).sort();
      // The index is off until an operator turns it on: a 409 that names the command, and a form the index
      // could never answer is still a 400 first.
      const off = await list({ bodyWords: "IN_EVT_4" });
      assert.equal(off.response.status, 409);
      assert.equal(off.response.headers.get("content-type"), "application/problem+json");
      assert.match((off.error as { detail: string }).detail, /inbox\.ts search enable/);
      assert.equal((await list({ bodyJson: "{}" })).response.status, 400);
      assert.equal((await runScript("inbox.ts", ["search", "enable", "--db", made.target])).code, 0);
      const json = await list({ bodyJson: '{"data":{"object":{"id":"in_evt_3"}}}' });
      assert.deepEqual(rows(json), ["evt_3>app", "evt_3>handler"]);
      assert.equal(json.data!.bodySince, undefined, "an index served it: no bound");
      assert.deepEqual(rows(await list({ bodyWords: "IN_EVT_4", destination: "app" })), ["evt_4>app"]);
      // (control) The same document at another path, and a word that is only a key, match nothing.
      assert.deepEqual(rows(await list({ bodyJson: '{"id":"in_evt_3"}' })), []);
      assert.deepEqual(rows(await list({ bodyWords: "object" })), []);
      const refusals: Record<string, string>[] = [
        { bodyJson: '"in_evt_3"' },
        { bodyJson: "{}" },
        { bodyJson: "{nope" },
        { bodyWords: "--" },
      ];
      for (const query of refusals) {
        const refused = await list(query);
        assert.equal(refused.response.status, 400, JSON.stringify(query));
        assert.deepEqual(
          refused.error!.errors!.map((e) => e.path),
          [`query.${Object.keys(query)[0]}`],
        );
      }
      // body reads every body the rest leaves: with no since, those of the last day, and the answer says from when.
      const before = Date.now();
      const contains = await list({ body: "in_evt_3" });
      assert.deepEqual(rows(contains), ["evt_3>app", "evt_3>handler"]);
      assert.ok(
        contains.data!.bodySince! >= before - 86_400_000 && contains.data!.bodySince! <= Date.now() - 86_400_000,
      );
      const bounded = await list({ body: "in_evt_3", since: "2d" });
      assert.deepEqual(rows(bounded), ["evt_3>app", "evt_3>handler"]);
      assert.equal(bounded.data!.bodySince, undefined, "a since given is kept");
      assert.deepEqual(rows(await list({ body: "in_evt_3", until: "2h" })), [], "a day before until holds none");
    });

    it("takes a time as the page and the CLI take one: an age ago (since=2h), an ISO date, or ms", async () => {
      const get = async (query: string) => {
        const r = await fetch(`${admin.url}/api/v1/deliveries?${query}`, {
          headers: { authorization: `Bearer ${read.key}` },
        });
        return { status: r.status, body: (await r.json()) as { items?: { id: string }[]; detail?: string } };
      };
      const ids = (r: { body: { items?: { id: string }[] } }) => new Set(r.body.items?.map((d) => d.id));
      const recent = await get("since=2h&source=stripe");
      assert.equal(recent.status, 200, JSON.stringify(recent.body));
      // Every stripe delivery here was stored within the last seconds.
      const every = ids(await get("source=stripe"));
      assert.ok(every.has("evt_ok") && every.has("evt_4"));
      assert.deepEqual(ids(recent), every);
      assert.deepEqual(ids(await get("until=2h&source=stripe")), new Set(), "none is older than two hours");
      assert.deepEqual(ids(await get(`since=${new Date(Date.now() + 3_600_000).toISOString()}`)), new Set());
      assert.deepEqual(ids(await get(`since=${Date.now() - 7_200_000}&source=stripe`)), every);
      // (control) Neither a date nor an age: a 400 that says what is expected.
      const bad = await get("since=2x");
      assert.equal(bad.status, 400);
      assert.match(
        String(bad.body.detail),
        /since: expected a date such as .*, or an age ago such as 2h or 3d, got 2x/,
      );
      // A bulk action's filter reads it the same way, as the page's form does.
      const dry = await fetch(`${admin.url}/api/v1/deliveries/bulk`, {
        method: "POST",
        headers: { authorization: `Bearer ${write.key}`, "content-type": "application/json" },
        body: JSON.stringify({ action: "retry", filter: { since: "2h" }, dryRun: true }),
      });
      assert.equal(dry.status, 200, await dry.clone().text());
      assert.deepEqual(await dry.json(), { count: 1 });
    });

    it("keeps the page's actions in the same audit log, which the page shows escaped", async () => {
      const page = await (await fetch(`${admin.url}/destinations`)).text();
      const csrf = /name="csrf" value="([^"]+)"/.exec(page)![1]!;
      const form = new URLSearchParams({ destination: "app", reason: "<script>alert(1)</script>", csrf });
      const posted = await fetch(`${admin.url}/pause`, {
        method: "POST",
        body: form,
        headers: { "content-type": "application/x-www-form-urlencoded" },
        redirect: "manual",
      });
      assert.equal(posted.status, 303);
      const [entry] = (await client(read.key).GET("/api/v1/audit", { params: { query: { limit: 1 } } })).data!.items;
      assert.equal(entry!.who, "page:local");
      assert.equal(entry!.operation, "pause");
      assert.match(entry!.target, /destination="app" reason="<script>/);
      const shown = await (await fetch(`${admin.url}/audit`)).text();
      assert.ok(!shown.includes("<script>alert"), "escaped");
      assert.match(shown, /&#60;script&#62;alert\(1\)&#60;\/script&#62;/);
      assert.match(shown, new RegExp(`key:${write.id}`), "beside the API's changes");
    });

    it("makes and revokes keys with an admin key alone: shown once, kept as a hash, audited; a write or read key refused and counted", async () => {
      const root = await key(made.target, "admin");
      const keys = async () => JSON.stringify(await inbox.query("SELECT * FROM api_keys ORDER BY id"));
      const refusals = async (reason: string) =>
        Number(
          new RegExp(`inbox_api_refused_total\\{reason="${reason}"\\} (\\d+)`).exec(
            await (await fetch(`${admin.url}/metrics`)).text(),
          )?.[1] ?? 0,
        );
      for (const [who, reason] of [
        [write.key, "write_key"],
        [read.key, "read_key"],
      ] as const) {
        const state = [await snapshot(), await keys()];
        const counted = await refusals(reason);
        const refused = await client(who).POST("/api/v1/keys", { body: { scope: "read", name: "should not" } });
        assert.equal(refused.response.status, 403, reason);
        assert.equal(await refusals(reason), counted + 1, `${reason}: counted`);
        assert.deepEqual([await snapshot(), await keys()], state, `${reason}: nothing changed`);
      }
      // The control: the admin key's same request makes one.
      const api = client(root.key);
      const madeKey = await api.POST("/api/v1/keys", {
        body: { scope: "write", name: "from the api" },
        params: { header: { "idempotency-key": "make-one" } },
      });
      assert.equal(madeKey.response.status, 201, JSON.stringify(madeKey.error));
      const fresh = madeKey.data!;
      assert.match(fresh.key!, /^wik_[A-Za-z0-9_-]{43}$/);
      assert.deepEqual([fresh.scope, fresh.name, fresh.revokedAt], ["write", "from the api", null]);
      assert.equal((await client(fresh.key!).GET("/api/v1/status")).response.status, 200, "the new key works");
      const stored = await keys();
      assert.ok(stored.includes(createHash("sha256").update(fresh.key!).digest("hex")));
      const kept = JSON.stringify(await inbox.query("SELECT * FROM idempotency"));
      for (const [where, text] of [
        ["api_keys", stored],
        ["idempotency", kept],
        ["audit", JSON.stringify(await inbox.auditLog({ limit: 100 }))],
      ])
        assert.ok(!text.includes(fresh.key!.slice(4)), `the key is not kept in ${where}`);
      const [entry] = await inbox.auditLog({ limit: 1 });
      assert.deepEqual(
        [entry!.who, entry!.operation, entry!.target, entry!.count],
        [`key:${root.id}`, "createKey", `key=${fresh.id} scope=write name="from the api"`, 1],
      );
      // The same Idempotency-Key makes nothing more, and its replay holds no key.
      const replay = await api.POST("/api/v1/keys", {
        body: { scope: "write", name: "from the api" },
        params: { header: { "idempotency-key": "make-one" } },
      });
      assert.equal(replay.response.headers.get("idempotent-replayed"), "true");
      assert.deepEqual(replay.data, { ...fresh, key: null });
      assert.equal(await keys(), stored, "no second key");

      const listed = await client(read.key).GET("/api/v1/keys");
      const shown = listed.data!.items.find((k) => k.id === fresh.id);
      assert.deepEqual(shown, {
        id: fresh.id,
        name: "from the api",
        scope: "write",
        createdAt: fresh.createdAt,
        revokedAt: null,
      });
      assert.ok(!JSON.stringify(listed.data).includes("hash"), "no hash listed");

      const gone = await api.POST("/api/v1/keys/{id}/revoke", { params: { path: { id: fresh.id } }, body: {} });
      assert.deepEqual(gone.data, { id: fresh.id, revoked: true });
      assert.equal((await client(fresh.key!).GET("/api/v1/status")).response.status, 401, "revoked for good");
      assert.deepEqual((await inbox.auditLog({ limit: 1 }))[0]!.operation, "revokeKey");
      const again = await api.POST("/api/v1/keys/{id}/revoke", { params: { path: { id: fresh.id } }, body: {} });
      assert.deepEqual(again.data, { id: fresh.id, revoked: false });
      const state = await keys();
      const unknown = await api.POST("/api/v1/keys/{id}/revoke", {
        params: { path: { id: "000000000000" } },
        body: {},
      });
      assert.equal(unknown.response.status, 404);
      const byWrite = await client(write.key).POST("/api/v1/keys/{id}/revoke", {
        params: { path: { id: root.id } },
        body: {},
      });
      assert.equal(byWrite.response.status, 403);
      assert.equal(await keys(), state, "neither refusal changed a key");
    });

    it("has called every operation in the document through the typed client, and had its answer", () => {
      assert.deepEqual([...called].sort(), [...ids.values()].sort());
    });
  });
}

// A body search past its time bound (PostgreSQL's SET LOCAL statement_timeout): the page and the API run in this
// process over an inbox opened with a bound of 1 ms, which no scan of 20,000 bodies of 2 KB can meet.
const POSTGRES = BACKENDS.find((b) => b.name === "postgres")!;
describe("the API's body search bound on postgres", { skip: POSTGRES.skip }, () => {
  const run = async (searchTimeoutMs: number | undefined, check: (url: string, key: string) => Promise<void>) => {
    const { target, cleanup } = await POSTGRES.make();
    const inbox = await connect(target, searchTimeoutMs === undefined ? {} : { searchTimeoutMs });
    const admin = createAdmin({ inbox, audit: () => {} });
    try {
      await inbox.query(
        `INSERT INTO deliveries (source, id, body, body_sha256, received_at, status, available_at)
         SELECT 'stripe', 'evt_' || g, convert_to('{"id":"evt_' || g || '","pad":"' || repeat('abcdefgh ', 220) || '"}', 'UTF8'),
                'x', ?, 'received', ?
         FROM generate_series(1, 20000) AS g`,
        Date.now(),
        Date.now(),
      );
      const { key, row } = mintKey({ scope: "read", name: "bound", now: Date.now() });
      await inbox.addApiKey(row);
      await check(await listenAdmin(admin, { host: "127.0.0.1", port: 0 }), key);
    } finally {
      admin.server.close();
      await inbox.close();
      await cleanup();
    }
  };
  const wide = "body=no+such+text&since=2000-01-01";

  it("answers a body search stopped at its bound 422 problem+json saying to narrow it; the page says the same", async () => {
    await run(1, async (url, key) => {
      const answer = await fetch(`${url}/api/v1/deliveries?${wide}`, { headers: { authorization: `Bearer ${key}` } });
      assert.equal(answer.status, 422);
      assert.equal(answer.headers.get("content-type"), "application/problem+json");
      const problem = (await answer.json()) as { status: number; title: string; detail: string };
      assert.equal(problem.status, 422);
      assert.equal(problem.title, "Unprocessable Content");
      assert.match(problem.detail, /^body search stopped after 1 ms: .*narrow it by time \(since, until\) or source/);
      const page = await fetch(`${url}/deliveries?q=no+such+text&since=2000-01-01`);
      assert.equal(page.status, 422);
      assert.match(await page.text(), /<p>body search stopped after 1 ms: [^<]*narrow it by time/);
    });
  });

  it("(control) answers the same search 200 under the default bound", async () => {
    await run(undefined, async (url, key) => {
      const answer = await fetch(`${url}/api/v1/deliveries?${wide}`, { headers: { authorization: `Bearer ${key}` } });
      assert.equal(answer.status, 200);
      assert.deepEqual(((await answer.json()) as { items: unknown[] }).items, []);
    });
  });
});
