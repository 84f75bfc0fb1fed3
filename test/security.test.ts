// test/security.test.ts: issue 46's attacks, made through the API with a write key, as its holder would, on
// SQLite and on PostgreSQL, through the real scripts: two admin.ts (one strict, one whose operator allows
// loopback), a receiver and two workers, the workers started again with the rule relaxed for the controls.
// Each attack fails and its canary reaches no server of the test, no API answer, no log, no audit row; each
// control shows the same attack succeeding where the operator allowed it. A secret set through the API signs
// an API destination's forwards, verified with Standard Webhooks, and its rotation signs the next; a database
// file, a backup, an export and a pg_dump hold no secret's value; every way in leaves one audit entry per
// change, and a change whose entry cannot be written is not made.
//   npx node --test test/security.test.ts

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { once } from "node:events";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type IncomingHttpHeaders } from "node:http";
import { join, resolve } from "node:path";
import { after, before, describe, it } from "node:test";
import { promisify } from "node:util";
import createClient from "openapi-fetch";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { sign } from "../lib/providers.ts";
import { scriptCommand } from "../lib/runtime.ts";
import type { Inbox } from "../lib/store.ts";
import type { paths } from "./generated/api.ts";
import {
  backends,
  PG_BIN,
  refuseAudit,
  ROOT,
  runScript,
  startAdmin,
  startReceiver,
  startWorker,
  tempDir,
  until,
  type ReceiverProcess,
  type WorkerProcess,
} from "./helpers.ts";

const whsec = (text: string) => `whsec_${Buffer.from(text).toString("base64")}`;
// The canaries: values that must reach no server, answer, log or audit row of the test.
const DB_PASSWORD = "canary-db-password-hunter2-s3cr3t";
const INTERNAL = "INTERNAL_SECRET_42";
const SIGNING_A = whsec("canary signing secret A, set through the API");
const SIGNING_B = whsec("canary signing secret B, its rotation");
const TOKEN = "canary-bearer-token-tok_live_9f8e7d";
const SOURCE_OLD = whsec("canary source secret, the old one");
const SOURCE_NEW = whsec("canary source secret, the new one");
// What the controls let through, on purpose: the same attacks where the operator allowed them.
const CONTROL_ENV = "control-canary-an-allowed-variable";
const CONTROL_INTERNAL = "CONTROL_INTERNAL_ANSWER";

const KEY = Buffer.alloc(32, 46).toString("base64");
const OPERATOR_SECRET = whsec("the operator's own destination secret");
const BASE_ENV = {
  SOURCE_SECRET: SOURCE_OLD,
  APP_SECRET: OPERATOR_SECRET,
  SUPER_SECRET_DB_PASSWORD: DB_PASSWORD,
  ALLOWED_CANARY: CONTROL_ENV,
  INBOX_SECRETS_KEY: KEY,
};

/** Heard is one request a test server was sent. */
interface Heard {
  path: string;
  headers: IncomingHttpHeaders;
  body: string;
}

// server is a server of the test on loopback: the operator's app, an "internal" service that answers a secret
// (405 with INTERNAL, or the control's answer once told), and /echo, which answers 401 with every header it got.
async function server(answer: { internal: string }) {
  const heard: Heard[] = [];
  const s = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      heard.push({ path: req.url ?? "/", headers: req.headers, body: Buffer.concat(chunks).toString() });
      if (req.url?.startsWith("/internal"))
        return res.writeHead(405).end(JSON.stringify({ internal: answer.internal }));
      if (req.url?.startsWith("/echo")) return res.writeHead(401).end(JSON.stringify(req.headers));
      res.writeHead(200).end("ok");
    });
  }).listen(0, "127.0.0.1");
  await once(s, "listening");
  return { url: `http://127.0.0.1:${(s.address() as { port: number }).port}`, heard, close: () => s.close() };
}

// withStdin runs inbox.ts with its standard input given, as a pipe from printf would.
async function withStdin(args: string[], input: string): Promise<void> {
  const { command, args: all } = scriptCommand(resolve(ROOT, "inbox.ts"), args);
  const child = spawn(command, all, {
    cwd: ROOT,
    env: { ...process.env, ...BASE_ENV },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let err = "";
  child.stderr.on("data", (d) => (err += d));
  child.stdin.end(input);
  const [code] = await once(child, "exit");
  assert.equal(code, 0, err);
}

for (const backend of await backends("security")) {
  describe(`a write key is not root, on ${backend.name}`, { skip: backend.skip }, () => {
    let made: { target: string; cleanup: () => Promise<void> };
    let db: string;
    let inbox: Inbox;
    const dir = tempDir();
    const answer = { internal: INTERNAL };
    let srv: Awaited<ReturnType<typeof server>>;
    let strict: Awaited<ReturnType<typeof startAdmin>>;
    let loose: Awaited<ReturnType<typeof startAdmin>>;
    let receiver: ReceiverProcess;
    let workers: WorkerProcess[] = [];
    const stopped: string[] = [];
    let write: string;
    let read: string;
    const file = join(dir.dir, "sources.json");
    // Every answer any API call gave, kept to be searched for canaries.
    const answers: string[] = [];
    const api = (url: string, key = write) => {
      const client = createClient<paths>({ baseUrl: url, headers: { authorization: `Bearer ${key}` } });
      client.use({
        async onResponse({ response }) {
          answers.push(await response.clone().text());
        },
      });
      return client;
    };
    const version = async () => (await inbox.readConfig())?.version ?? 0;
    const entries = async () => (await inbox.auditLog({ limit: 10_000 })).length;
    const logs = () =>
      [strict.log(), loose.log(), receiver.log(), ...workers.map((w) => w.log()), ...stopped].join("\n");
    let n = 0;
    // post sends a delivery of this event type to the receiver, signed with the source's secret.
    const post = async (type: string, secret = SOURCE_OLD): Promise<{ id: string; status: number }> => {
      const id = `evt_${++n}`;
      const body = JSON.stringify({ type, n });
      const r = await fetch(`${receiver.url}/st`, {
        method: "POST",
        headers: {
          ...sign("standard", secret, { id, body, timestampS: Math.floor(Date.now() / 1000) }),
          "content-type": "application/json",
        },
        body,
      });
      await r.text();
      return { id, status: r.status };
    };
    const rowOf = async (id: string, destination: string) =>
      (await inbox.find(id, "st")).find((r) => r.destination === destination);
    // ran counts the times a worker said it runs configuration version v.
    const ran = (w: WorkerProcess, v: number) =>
      (w.log().match(new RegExp(`running configuration version ${v}\\b`, "g")) ?? []).length;
    // takenUp waits until every worker ran configuration version v more times than it had in before (each its
    // own count: two changes close together may reach one worker as one reload and the other as two).
    const takenUp = (v: number, before: readonly number[] = workers.map(() => 0)) =>
      until(`workers on version ${v}`, () => workers.every((w, i) => ran(w, v) > (before[i] ?? 0))).catch(
        (error: Error) => {
          throw new Error(`${error.message}; the workers said: ${workers.map((w) => w.log().slice(-600)).join(" | ")}`);
        },
      );
    // served waits until the receiver serves configuration version v.
    const served = (v: number) =>
      until(`the receiver on version ${v}`, () =>
        new RegExp(`serving configuration version ${v}\\b`).test(receiver.log()),
      ).catch((error: Error) => {
        throw new Error(`${error.message}; it said: ${receiver.log()}`);
      });
    const startWorkers = (env: NodeJS.ProcessEnv) => {
      workers = [0, 1].map(() => startWorker(db, ["--metrics-port", "0"], { ...BASE_ENV, ...env }));
      return until("both workers up", () => workers.every((w) => /Metrics on/.test(w.log())));
    };

    before(async () => {
      made = await backend.make();
      db = made.target;
      srv = await server(answer);
      // The operator's file: a source, its own destination on loopback (the operator reaches anything), and
      // one that is down, whose failures its breaker counts.
      writeFileSync(
        file,
        JSON.stringify({
          $destinations: {
            app: { url: `${srv.url}/app`, secret: "env:APP_SECRET" },
            down: { url: "http://127.0.0.1:1/x", secret: "env:APP_SECRET", breaker: { failures: 1 } },
          },
          st: { provider: "standard", secret: "env:SOURCE_SECRET", routes: ["app", { to: "down", types: ["down.*"] }] },
        }),
      );
      inbox = await connect(db);
      const applied = await runScript("inbox.ts", ["config", "apply", file, "--db", db], BASE_ENV);
      assert.equal(applied.code, 0, applied.stderr);
      const key = async (scope: string) =>
        JSON.parse(
          (await runScript("inbox.ts", ["keys", "create", "--scope", scope, "--json", "--db", db])).stdout,
        ) as { key: string };
      write = (await key("write")).key;
      read = (await key("read")).key;
      // The strict page: nothing handed to the API; as a systemd unit without a token, it says so at start.
      strict = await startAdmin(["--db", db], { ...BASE_ENV, INVOCATION_ID: "x" });
      // The page of an operator who allows loopback and one variable (its token set, so no warning).
      loose = await startAdmin(["--db", db, "--admin-token", "env:ADMIN_TOKEN"], {
        ...BASE_ENV,
        INVOCATION_ID: "x",
        ADMIN_TOKEN: "t0k3n-of-the-page",
        INBOX_API_DESTINATIONS_ALLOW: "127.0.0.1/32,::1/128",
        INBOX_API_ENV: "ALLOWED_CANARY",
      });
      receiver = await startReceiver(db, ["--sources", file], BASE_ENV);
      // The workers hand the API nothing: every forward it aimed inside is refused at its connection.
      await startWorkers({});
    });

    after(async () => {
      for (const w of workers) await w.stop();
      await receiver?.stop();
      strict?.child.kill("SIGTERM");
      loose?.child.kill("SIGTERM");
      srv?.close();
      await inbox?.close();
      await made?.cleanup();
      dir.cleanup();
    });

    it("says at start-up, in one line, that a page without a token on a server acts for any local process", () => {
      assert.match(strict.log(), /^admin: warning: no --admin-token, so any process on this host .*$/m);
      assert.doesNotMatch(loose.log(), /no --admin-token/, "the control: a page with its token says nothing");
    });

    it("refuses each attack at apply, a 400 saying why in one line, nothing changed or audited", async () => {
      const a = api(strict.url);
      // A secret of the store, set through the API, to sign what the attacks would make.
      const set = await a.PUT("/api/v1/secrets/{name}", {
        params: { path: { name: "app_signing" } },
        body: { value: SIGNING_A },
      });
      assert.equal(set.response.status, 200, JSON.stringify(set.error));
      const v = await version();
      const had = await entries();
      const put = async (name: string, settings: Record<string, unknown>, dryRun = false) => {
        const r = await a.PUT("/api/v1/destinations/{name}", {
          params: { path: { name } },
          body: { settings, dryRun },
        });
        return { status: r.response.status, detail: r.error?.detail ?? "" };
      };
      // Any environment variable of the worker, sent to us: refused before it is read, set or not; a dry run
      // says the same of one that is set as of one that is not.
      const leak = (variable: string) => ({
        url: "https://hooks.example.com/x",
        secret: "secret:app_signing",
        headers: { "x-leak": `env:${variable}` },
      });
      const isSet = await put("exfil", leak("SUPER_SECRET_DB_PASSWORD"), true);
      const unset = await put("exfil", leak("NOT_SET_ANYWHERE_46"), true);
      assert.equal(isSet.status, 400);
      assert.match(
        isSet.detail,
        /names the environment variable SUPER_SECRET_DB_PASSWORD, which a change through the API may not read/,
      );
      assert.equal(
        isSet.detail.replace("SUPER_SECRET_DB_PASSWORD", "X"),
        unset.detail.replace("NOT_SET_ANYWHERE_46", "X"),
      );
      assert.equal((await put("exfil", leak("SUPER_SECRET_DB_PASSWORD"))).status, 400);
      // Any address the worker can reach, in any spelling, and the page's own port.
      for (const [url, range] of [
        ["http://169.254.169.254/latest/meta-data/", /link-local \(169\.254\.0\.0\/16/],
        ["http://10.0.0.1/x", /RFC 1918 \(10\.0\.0\.0\/8\)/],
        ["http://[fd00:ec2::254]/x", /unique-local \(fc00::\/7\)/],
        ["http://2852039166/x", /169\.254\.169\.254 is link-local/],
        ["http://[::ffff:a9fe:a9fe]/x", /link-local/],
        [`http://127.0.0.1:${strict.port}/api/v1/config`, /loopback \(127\.0\.0\.0\/8\)/],
        [`${srv.url}/internal`, /loopback/],
        [`http://localhost:${new URL(srv.url).port}/internal`, /localhost resolves to .*loopback/],
      ] as const) {
        const r = await put("ssrf", { url, secret: "secret:app_signing" });
        assert.equal(r.status, 400, url);
        assert.match(r.detail, range, url);
        assert.doesNotMatch(r.detail, /\n/);
      }
      // Settings no check bounded: a route to an inherited key, a timeout Node clamps to 1 ms, an unreachable name.
      const source = await a.PUT("/api/v1/sources/{name}", {
        params: { path: { name: "st" } },
        body: { settings: { provider: "plain", routes: ["toString"] } },
      });
      assert.equal(source.response.status, 400);
      assert.match(source.error!.detail, /expected "to" to name a destination/);
      const slow = await put("slow", {
        url: "https://hooks.example.com/x",
        secret: "secret:app_signing",
        timeout: 3_000_000,
      });
      assert.match(slow.detail, /timeout to be a number of seconds above 0 and at most 900/);
      const operators = JSON.parse(readFileSync(file, "utf8"));
      const dots = await a.PUT("/api/v1/config", {
        body: {
          document: {
            ...operators,
            $destinations: {
              ...operators.$destinations,
              "..": { url: "https://hooks.example.com/x", secret: "secret:app_signing" },
            },
          },
        },
      });
      assert.equal(dots.response.status, 400);
      assert.match(dots.error!.detail, /destination "\.\.": expected a name .*not "\." or "\.\."/);
      // A secret in the clear belongs in the store; a file on the host is the operator's.
      assert.match(
        (await put("clear", { url: "https://hooks.example.com/x", secret: SIGNING_A })).detail,
        /secret in the clear/,
      );
      assert.match(
        (await put("ca", { url: "https://hooks.example.com/x", secret: "secret:app_signing", ca: "/etc/shadow" }))
          .detail,
        /ca names a file on the host/,
      );
      assert.equal(await version(), v, "nothing applied");
      assert.equal(await entries(), had, "and nothing audited: nothing changed");
    });

    it("refuses at every forward, in the workers, a destination the API aimed inside, and does not count it against its breaker", async () => {
      const a = api(loose.url);
      // The loose page lets them be applied (its operator allows loopback); the workers' operator did not.
      const r = await a.PUT("/api/v1/secrets/{name}", {
        params: { path: { name: "signing" } },
        body: { value: SOURCE_OLD },
      });
      assert.equal(r.response.status, 200, JSON.stringify(r.error));
      const destination = (url: string) => ({ url, secret: "secret:app_signing", breaker: { failures: 1 } });
      for (const [name, url] of [
        ["ssrf", `${srv.url}/internal`],
        ["rebind", `http://localhost:${new URL(srv.url).port}/internal`],
      ]) {
        const r = await a.PUT("/api/v1/destinations/{name}", {
          params: { path: { name: name! } },
          body: { settings: destination(url!) },
        });
        assert.equal(r.response.status, 200, JSON.stringify(r.error));
      }
      const routed = await a.PUT("/api/v1/sources/{name}", {
        params: { path: { name: "st" } },
        body: {
          settings: {
            provider: "standard",
            secret: "secret:signing",
            routes: [
              "app",
              { to: "down", types: ["down.*"] },
              { to: "ssrf", types: ["ssrf.*"] },
              { to: "rebind", types: ["rebind.*"] },
            ],
          },
        },
      });
      assert.equal(routed.response.status, 200, JSON.stringify(routed.error));
      const stored = (await inbox.readConfig())!;
      assert.equal(stored.way, "api");
      assert.deepEqual(
        [stored.trust["destination app"], stored.trust["destination ssrf"], stored.trust["source st"]],
        ["operator", "api", "api"],
        "the operator's own destination keeps its trust",
      );
      await takenUp(stored.version);
      await served(stored.version);
      const ssrf = await post("ssrf.probe");
      const rebind = await post("rebind.probe");
      const down = await post("down.probe");
      assert.deepEqual([ssrf.status, rebind.status, down.status], [200, 200, 200]);
      await until("both refused, set aside", async () =>
        (await Promise.all([rowOf(ssrf.id, "ssrf"), rowOf(rebind.id, "rebind")])).every((r) => r?.status === "failed"),
      );
      assert.match((await rowOf(ssrf.id, "ssrf"))!.error!, /^ssrf: refused: 127\.0\.0\.1 is loopback/);
      assert.match((await rowOf(rebind.id, "rebind"))!.error!, /^rebind: refused: localhost resolves to .*loopback/);
      assert.equal(
        srv.heard.filter((h) => h.path.startsWith("/internal")).length,
        0,
        "the internal service heard nothing",
      );
      // A read key reads the tries back: the refusal, never the internal answer.
      const attempts = await api(loose.url, read).GET("/api/v1/deliveries/{source}/{id}/attempts", {
        params: { path: { source: "st", id: ssrf.id } },
      });
      assert.match(JSON.stringify(attempts.data), /refused/);
      // Not the destination's fault: its breaker (one failure opens it) stays closed. The control: the
      // operator's destination that is down opens at its first failure.
      await until(
        "down opened",
        async () => (await inbox.destinations()).find((d) => d.name === "down")?.state === "open",
      );
      const states = await inbox.destinations();
      assert.deepEqual(
        ["ssrf", "rebind"].map((name) => states.find((d) => d.name === name)?.state ?? "closed"),
        ["closed", "closed"],
      );
      // The operator's own destination on loopback was reached, as it always was.
      await until("app reached", () =>
        srv.heard.some((h) => h.path === "/app" && h.headers["inbox-delivery-id"] === ssrf.id),
      );
    });

    it("lets the same attacks through where the operator allows them (the control): loopback, and one variable", async () => {
      for (const w of workers) {
        assert.equal(await w.stop(), 0);
        stopped.push(w.log());
      }
      answer.internal = CONTROL_INTERNAL;
      await startWorkers({ INBOX_API_DESTINATIONS_ALLOW: "127.0.0.1/32,::1/128", INBOX_API_ENV: "ALLOWED_CANARY" });
      const a = api(loose.url);
      const retried = await a.POST("/api/v1/deliveries/bulk", {
        body: { action: "retry", filter: { source: "st", status: "failed" } },
      });
      assert.equal(retried.response.status, 200);
      await until(
        "the internal service reached, through both",
        () => srv.heard.filter((h) => h.path.startsWith("/internal")).length >= 2,
      );
      const leak = await a.PUT("/api/v1/destinations/{name}", {
        params: { path: { name: "leak" } },
        body: {
          settings: {
            url: `${srv.url}/leak`,
            secret: "secret:app_signing",
            headers: { "x-leak": "env:ALLOWED_CANARY" },
          },
        },
      });
      assert.equal(leak.response.status, 200, JSON.stringify(leak.error));
      await takenUp(leak.data!.version);
      const sent = await a.POST("/api/v1/destinations/{name}/test", { params: { path: { name: "leak" } }, body: {} });
      assert.equal(sent.response.status, 202);
      await until("the allowed variable sent", () => srv.heard.some((h) => h.headers["x-leak"] === CONTROL_ENV));
    });

    it("signs an API destination's forwards with a secret set through the API, verified with Standard Webhooks; rotated, the next uses the new one", async () => {
      const a = api(loose.url);
      const signed = await a.PUT("/api/v1/destinations/{name}", {
        params: { path: { name: "signed" } },
        body: { settings: { url: `${srv.url}/signed`, secret: "secret:app_signing" } },
      });
      assert.equal(signed.response.status, 200, JSON.stringify(signed.error));
      const echo = await a.PUT("/api/v1/secrets/{name}", {
        params: { path: { name: "echo_token" } },
        body: { value: TOKEN },
      });
      assert.equal(echo.response.status, 200);
      const echoing = await a.PUT("/api/v1/destinations/{name}", {
        params: { path: { name: "echo" } },
        body: { settings: { url: `${srv.url}/echo`, secret: "secret:app_signing", bearer: "secret:echo_token" } },
      });
      assert.equal(echoing.response.status, 200, JSON.stringify(echoing.error));
      const routes = ["app", { to: "signed", types: ["signed.*"] }, { to: "echo", types: ["echo.*"] }];
      // The source's secret holds two values during its rotation, both set the same way.
      await a.PUT("/api/v1/secrets/{name}", { params: { path: { name: "signing_new" } }, body: { value: SOURCE_NEW } });
      const source = await a.PUT("/api/v1/sources/{name}", {
        params: { path: { name: "st" } },
        body: { settings: { provider: "standard", secret: ["secret:signing_new", "secret:signing"], routes } },
      });
      assert.equal(source.response.status, 200, JSON.stringify(source.error));
      const v = source.data!.version;
      await takenUp(v);
      await served(v);
      const first = await post("signed.one", SOURCE_NEW);
      const old = await post("signed.old", SOURCE_OLD);
      assert.deepEqual([first.status, old.status], [200, 200], "either value of the rotation verifies");
      assert.equal((await post("signed.neither", whsec("somebody else"))).status, 401);
      const at = (id: string) => srv.heard.find((h) => h.path === "/signed" && h.headers["inbox-delivery-id"] === id);
      await until("signed forward", () => at(first.id) !== undefined);
      const verify = (secret: string, h: Heard) =>
        new Webhook(secret).verify(h.body, {
          "webhook-id": String(h.headers["webhook-id"]),
          "webhook-timestamp": String(h.headers["webhook-timestamp"]),
          "webhook-signature": String(h.headers["webhook-signature"]),
        });
      assert.doesNotThrow(() => verify(SIGNING_A, at(first.id)!));
      // Rotated: the next forward is signed with the new value, and the old one no longer verifies it.
      const turns = workers.map((w) => ran(w, v));
      await a.PUT("/api/v1/secrets/{name}", { params: { path: { name: "app_signing" } }, body: { value: SIGNING_B } });
      await takenUp(v, turns);
      const next = await post("signed.two", SOURCE_NEW);
      await until("the next signed forward", () => at(next.id) !== undefined);
      assert.doesNotThrow(() => verify(SIGNING_B, at(next.id)!));
      assert.throws(() => verify(SIGNING_A, at(next.id)!));
      // A secret reaches the redactor: the echo's 401 repeats the bearer token, and the kept error does not.
      const echoed = await post("echo.one", SOURCE_NEW);
      await until("the echo's failure kept", async () => (await rowOf(echoed.id, "echo"))?.error != null);
      const error = (await rowOf(echoed.id, "echo"))!.error!;
      assert.match(error, /HTTP 401 from echo: .*\[redacted: echo bearer\]/);
      assert.ok(!error.includes(TOKEN));
      assert.ok(
        srv.heard.some((h) => h.headers.authorization === `Bearer ${TOKEN}`),
        "the control: it was sent, and echoed",
      );
    });

    it("keeps every secret's value out of the database's text, a backup, an export and a pg_dump", async () => {
      const values = [SIGNING_A, SIGNING_B, TOKEN, SOURCE_OLD, SOURCE_NEW].flatMap((v) => [
        v,
        v.replace(/^whsec_/, ""),
      ]);
      const holds = (text: string) => values.filter((v) => text.includes(v));
      const exported = join(dir.dir, "export.jsonl");
      const ran = await runScript("inbox.ts", ["export", "--out", exported, "--db", db]);
      assert.equal(ran.code, 0, ran.stderr);
      const texts: [string, string][] = [["the export", readFileSync(exported, "latin1")]];
      if (backend.name === "sqlite") {
        const backup = join(dir.dir, "backup.db");
        const copy = await runScript("inbox.ts", ["backup", backup, "--db", db]);
        assert.equal(copy.code, 0, copy.stderr);
        texts.push([
          "the database file",
          [db, `${db}-wal`]
            .filter(existsSync)
            .map((f) => readFileSync(f, "latin1"))
            .join(""),
        ]);
        texts.push(["the backup", readFileSync(backup, "latin1")]);
      } else {
        const url = new URL(db);
        const schema = url.searchParams.get("schema")!;
        // The inbox's own database (each test has one, freshInbox()), without the inbox's ?schema=.
        url.searchParams.delete("schema");
        const dump = join(PG_BIN ?? "/usr/bin", "pg_dump");
        const { stdout } = await promisify(execFile)(
          existsSync(dump) ? dump : "pg_dump",
          ["--schema", schema, url.toString()],
          { maxBuffer: 64 << 20 },
        );
        texts.push(["the pg_dump", stdout]);
      }
      for (const [what, text] of texts) {
        assert.deepEqual(holds(text), [], `${what} holds no secret's value`);
        // The control: the same search finds what is there, a delivery's body.
        assert.ok(text.includes("signed.one"), `${what} is searched whole`);
      }
    });

    it("let no canary reach a server of the test, an API answer, a log or the audit log", async () => {
      const audit = JSON.stringify(await inbox.auditLog({ limit: 10_000 }));
      const heard = JSON.stringify(srv.heard.filter((h) => h.path !== "/echo"));
      const places: [string, string][] = [
        ["an API answer", answers.join("\n")],
        ["a log", logs()],
        ["the audit log", audit],
        ["a server of the test", heard],
      ];
      for (const canary of [DB_PASSWORD, INTERNAL, SIGNING_A, SIGNING_B, SOURCE_OLD, SOURCE_NEW])
        for (const [where, text] of places) assert.ok(!text.includes(canary), `${canary} reached ${where}`);
      for (const [where, text] of places.slice(0, 3)) assert.ok(!text.includes(TOKEN), `the token reached ${where}`);
      // The controls' canaries did travel, where the operator allowed them: the harness sees a leak.
      assert.ok(heard.includes(CONTROL_ENV));
      assert.ok(
        answers.join("\n").includes(CONTROL_INTERNAL) ||
          (await inbox.query("SELECT error FROM deliveries WHERE error LIKE ?", `%${CONTROL_INTERNAL}%`)).length > 0,
      );
    });

    it("leaves exactly one audit entry per change by every way in, and makes no change whose entry cannot be written", async () => {
      const cli = async (...args: string[]) => {
        const r = await runScript("inbox.ts", [...args, "--db", db], BASE_ENV);
        assert.equal(r.code, 0, `${args.join(" ")}: ${r.stderr}`);
        return r;
      };
      const one = async (what: string, act: () => Promise<unknown>, who: RegExp) => {
        const had = await entries();
        await act();
        const log = await inbox.auditLog({ limit: 2 });
        assert.equal(await entries(), had + 1, `${what}: one entry`);
        assert.match(log[0]!.who, who, what);
      };
      const a = api(loose.url);
      const page = async (path: string, form: Record<string, string>) => {
        const html = await (await fetch(`${strict.url}/destinations`)).text();
        const csrf = /name="csrf" value="([^"]+)"/.exec(html)![1]!;
        return fetch(`${strict.url}${path}`, {
          method: "POST",
          body: new URLSearchParams({ ...form, csrf }),
          headers: { "content-type": "application/x-www-form-urlencoded" },
          redirect: "manual",
        });
      };
      await one(
        "the API",
        () => a.POST("/api/v1/destinations/{name}/pause", { params: { path: { name: "app" } }, body: {} }),
        /^key:/,
      );
      await one("the page", () => page("/resume", { destination: "app" }), /^page:local$/);
      await one("cli pause", () => cli("pause", "app"), /^cli:/);
      await one("cli resume", () => cli("resume", "app"), /^cli:/);
      // A delivery set aside for a destination no worker serves, for the CLI to retry.
      await inbox.store({ source: "st", id: "evt_aside", body: Buffer.from("{}"), destinations: ["nowhere"] });
      for (const lease of await inbox.claimBatch(1, 60_000, { destination: "nowhere" }))
        await inbox.fail(lease, "set aside by the test", { permanent: true });
      await one("cli retry", () => cli("retry", "evt_aside", "--source", "st"), /^cli:/);
      await one("cli retry --failed", () => cli("retry", "--failed", "--source", "nothing-here"), /^cli:/);
      await one("cli replay", () => cli("replay", "--source", "st", "--type", "signed.one"), /^cli:/);
      await one("cli purge", () => cli("purge", "--bodies-after", "30d", "--forget-after", "60d"), /^cli:/);
      await one("cli keys create", () => cli("keys", "create", "--scope", "read"), /^cli:/);
      const id = JSON.parse((await cli("keys", "list", "--json")).stdout).at(-1).id as string;
      await one("cli keys revoke", () => cli("keys", "revoke", id), /^cli:/);
      await one("cli secrets set", () => withStdin(["secrets", "set", "spare", "--db", db], "spare-value"), /^cli:/);
      await one("cli secrets delete", () => cli("secrets", "delete", "spare"), /^cli:/);
      // The operator's file, from the version in force, changed: config apply, then SIGHUP to the receiver
      // that was started with it, each one change.
      await cli("config", "dump", "--out", file);
      const doc = JSON.parse(readFileSync(file, "utf8"));
      doc.$destinations.app.timeout = 25;
      writeFileSync(file, JSON.stringify(doc));
      await one("cli config apply", () => cli("config", "apply", file), /^cli:/);
      doc.$destinations.app.timeout = 20;
      writeFileSync(file, JSON.stringify(doc));
      await one(
        "SIGHUP",
        async () => {
          receiver.child.kill("SIGHUP");
          await until("the receiver applied it", () =>
            /SIGHUP: .* applied as configuration version/.test(receiver.log()),
          );
        },
        /^sighup:receiver\.ts$/,
      );
      assert.match(
        (await inbox.auditLog({ limit: 1 }))[0]!.target,
        /destination app: timeout 25 → 20/,
        "down to the field",
      );
      // /metrics counts them by actor kind.
      const metrics = await (await fetch(`${strict.url}/metrics`)).text();
      for (const kind of ["key", "page", "cli", "sighup"])
        assert.match(metrics, new RegExp(`inbox_audit_entries\\{actor="${kind}"\\} [1-9]`));

      // The audit insert made to fail: nothing the API, the page or the CLI asks is made.
      const allow = await refuseAudit(inbox);
      const v = await version();
      const had = await entries();
      const paused = async () => (await inbox.destinations()).find((d) => d.name === "app")?.state === "paused";
      const viaApi = await a.PUT("/api/v1/destinations/{name}", {
        params: { path: { name: "more" } },
        body: { settings: { url: "https://hooks.example.com/more", secret: "secret:app_signing" } },
      });
      assert.equal(viaApi.response.status, 500);
      assert.equal(
        (await a.POST("/api/v1/destinations/{name}/pause", { params: { path: { name: "app" } }, body: {} })).response
          .status,
        500,
      );
      assert.equal((await page("/pause", { destination: "app" })).status, 500);
      const byCli = await runScript("inbox.ts", ["pause", "app", "--db", db], BASE_ENV);
      assert.equal(byCli.code, 1);
      assert.match(byCli.stderr, /audit refused/);
      assert.deepEqual([await version(), await entries(), await paused()], [v, had, false], "nothing was made");
      await allow();
      // The control: the same request, the entry allowed, is made.
      assert.equal(
        (await a.POST("/api/v1/destinations/{name}/pause", { params: { path: { name: "app" } }, body: {} })).response
          .status,
        200,
      );
      assert.equal(await paused(), true);
      assert.equal(await entries(), had + 1);
    });
  });
}
