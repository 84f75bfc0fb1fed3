// test/forward-scripts.test.ts: forwarding as people run it: receiver.ts and worker.ts as child processes
// with a sources file that routes to a real destination server, and the CLI's destinations, pause and
// resume. A mistake in a route or a destination stops either script with one line and exit code 2.

import assert from "node:assert/strict";
import { once } from "node:events";
import { existsSync, writeFileSync } from "node:fs";
import { createServer, type IncomingHttpHeaders } from "node:http";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { Webhook } from "standardwebhooks";
import { connect } from "../inbox.ts";
import { sign } from "../lib/providers.ts";
import { runScript, startReceiver, tempDir } from "./helpers.ts";

const SECRET = `whsec_${Buffer.from("forwarding secret of the app").toString("base64")}`;
const SOURCE_SECRET = `whsec_${Buffer.from("the provider's secret").toString("base64")}`;

describe("a mistake in a route or a destination", () => {
  let dir: { dir: string; cleanup: () => void };
  beforeEach(() => (dir = tempDir()));
  afterEach(() => dir.cleanup());

  const cases: [string, unknown, RegExp][] = [
    [
      "a route to a destination that is not defined",
      { s: { provider: "plain", routes: ["nowhere"] } },
      /route #1: expected "to" to name a destination \(handler\), got "nowhere"/,
    ],
    [
      "a destination without a secret",
      { $destinations: { app: { url: "http://127.0.0.1:1/" } }, s: { provider: "plain", routes: ["app"] } },
      /destination "app": missing secret/,
    ],
    [
      "a destination whose url is not http",
      { $destinations: { app: { url: "ftp://x/", secret: SECRET } }, s: { provider: "plain" } },
      /destination "app": expected url to be an http:\/\/ or https:\/\/ address/,
    ],
    [
      "a key of the file's own that is not known",
      { $destination: {}, s: { provider: "plain" } },
      /unknown key "\$destination"/,
    ],
    [
      "a route with a setting it does not know",
      {
        $destinations: { app: { url: "http://127.0.0.1:1/", secret: SECRET } },
        s: { provider: "plain", routes: [{ to: "app", type: ["x"] }] },
      },
      /unknown setting "type"/,
    ],
    [
      "a destination named after the handler",
      { $destinations: { handler: { url: "http://127.0.0.1:1/", secret: SECRET } }, s: { provider: "plain" } },
      /the name is the handler's/,
    ],
  ];
  for (const script of ["receiver.ts", "worker.ts"]) {
    for (const [what, config, why] of cases) {
      it(`stops ${script} at start-up with one line and exit code 2: ${what}`, async () => {
        const file = join(dir.dir, "sources.json");
        writeFileSync(file, JSON.stringify(config));
        const db = join(dir.dir, "inbox.db");
        const r = await runScript(script, [
          "--sources",
          file,
          "--db",
          db,
          ...(script === "worker.ts" ? ["--once"] : ["--port", "0"]),
        ]);
        assert.equal(r.code, 2, r.stderr);
        assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
        assert.match(r.stderr, why);
        assert.equal(existsSync(db), false, "nothing created");
      });
    }
  }

  it("stops the worker when a secret is not a Standard Webhooks one, or its environment variable is unset; never printing a secret", async () => {
    const file = join(dir.dir, "sources.json");
    writeFileSync(
      file,
      JSON.stringify({
        $destinations: { app: { url: "http://127.0.0.1:1/", secret: "hunter2-not-whsec" } },
        s: { provider: "plain", routes: ["app"] },
      }),
    );
    let r = await runScript("worker.ts", ["--sources", file, "--db", join(dir.dir, "inbox.db"), "--once"]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /destination "app": secret is not a whsec_ secret/);
    assert.doesNotMatch(r.stderr, /hunter2/);
    writeFileSync(
      file,
      JSON.stringify({
        $destinations: {
          app: { url: "http://127.0.0.1:1/", secret: "env:APP_FORWARD_SECRET", bearer: "env:APP_TOKEN" },
        },
        s: { provider: "plain", routes: ["app"] },
      }),
    );
    r = await runScript("worker.ts", ["--sources", file, "--db", join(dir.dir, "inbox.db"), "--once"], {
      APP_FORWARD_SECRET: SECRET,
      APP_TOKEN: "",
    });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /bearer reads the environment variable APP_TOKEN, which is not set/);
    // The receiver checks the shape only: the secrets are the worker's.
    const receiver = await startReceiver(join(dir.dir, "inbox.db"), ["--sources", file]);
    await receiver.stop();
  });

  it("control: the same file with the mistake mended starts", async () => {
    const file = join(dir.dir, "sources.json");
    writeFileSync(
      file,
      JSON.stringify({
        $destinations: { app: { url: "http://127.0.0.1:1/", secret: SECRET } },
        s: { provider: "plain", routes: ["app"] },
      }),
    );
    const r = await runScript("worker.ts", ["--sources", file, "--db", join(dir.dir, "inbox.db"), "--once"]);
    assert.equal(r.code, 0, r.stderr);
  });
});

describe("receiver.ts and worker.ts with routes", () => {
  it("routes by event type at receive time, and the worker forwards signed while the handler records the payments", async () => {
    const dir = tempDir();
    const got: { headers: IncomingHttpHeaders; body: Buffer }[] = [];
    const app = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req
        .on("data", (c: Buffer) => chunks.push(c))
        .on("end", () => {
          got.push({ headers: req.headers, body: Buffer.concat(chunks) });
          res.writeHead(200).end();
        });
    }).listen(0, "127.0.0.1");
    await once(app, "listening");
    try {
      const file = join(dir.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          $destinations: {
            app: {
              url: `http://127.0.0.1:${(app.address() as { port: number }).port}/hooks`,
              secret: "env:APP_FORWARD_SECRET",
              bearer: "env:APP_TOKEN",
            },
          },
          st: { provider: "standard", secret: SOURCE_SECRET, routes: ["handler", { to: "app", types: ["invoice.*"] }] },
        }),
      );
      const db = join(dir.dir, "inbox.db");
      const receiver = await startReceiver(db, ["--sources", file]);
      for (const [id, type] of [
        ["evt_1", "invoice.paid"],
        ["evt_2", "customer.created"],
        ["evt_3", "invoice.payment_failed"],
      ]) {
        const body = JSON.stringify({ customer: "Ann", amount: 5, type });
        const r = await fetch(`${receiver.url}/st`, {
          method: "POST",
          headers: {
            ...sign("standard", SOURCE_SECRET, { id: id!, body, timestampS: Math.floor(Date.now() / 1000) }),
            "content-type": "application/json",
          },
          body,
        });
        assert.equal(r.status, 200);
      }
      await receiver.stop();
      const env = { APP_FORWARD_SECRET: SECRET, APP_TOKEN: "t0ken" };
      const w = await runScript("worker.ts", ["--sources", file, "--db", db, "--once", "--handler", "demo"], env);
      assert.equal(w.code, 0, w.stderr);
      assert.doesNotMatch(w.stderr + w.stdout, /t0ken/, "a destination's own headers are never logged");
      assert.match(w.stderr, /forwarded 2, 0 to retry/);
      assert.deepEqual(got.map((g) => g.headers["inbox-delivery-id"]).sort(), ["evt_1", "evt_3"]);
      for (const g of got) {
        assert.equal(g.headers.authorization, "Bearer t0ken");
        assert.ok(new Webhook(SECRET).verify(g.body.toString(), g.headers as Record<string, string>));
      }
      const inbox = await connect(db);
      try {
        assert.equal((await inbox.query("SELECT count(*) AS n FROM payments"))[0]!.n, 3);
      } finally {
        await inbox.close();
      }
      const listed = await runScript("inbox.ts", ["destinations", "--db", db, "--json"]);
      const states = JSON.parse(listed.stdout) as { name: string; state: string; waiting: number }[];
      assert.deepEqual(
        states.map((s) => [s.name, s.state, s.waiting]),
        [
          ["app", "closed", 0],
          ["handler", "closed", 0],
        ],
      );
      const paused = await runScript("inbox.ts", ["pause", "app", "--db", db, "--reason", "deploying"]);
      assert.match(paused.stdout, /app paused/);
      const again = await runScript("inbox.ts", ["destinations", "--db", db]);
      assert.match(again.stdout, /app\tpaused \(deploying\)/);
      const resumed = await runScript("inbox.ts", ["resume", "app", "--db", db]);
      assert.match(resumed.stdout, /app resumed/);
    } finally {
      app.close();
      dir.cleanup();
    }
  });
});
