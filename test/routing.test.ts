// test/routing.test.ts: route filters through the real receiver (a receiver.ts child) on SQLite and on
// PostgreSQL: deliveries signed as Stripe-style Standard Webhooks and GitHub send them, rows written for the
// routes whose filters match, a form-encoded body that matches no body filter, and `replay --to` still adding
// a route afterwards. A bad filter stops receiver.ts and worker.ts with one line and exit code 2.

import assert from "node:assert/strict";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { sign } from "../lib/providers.ts";
import { backends, runScript, startReceiver, tempDir } from "./helpers.ts";

const APP_SECRET = `whsec_${Buffer.from("the billing app's secret").toString("base64")}`;
const STRIPE_SECRET = `whsec_${Buffer.from("stripe-ish standard webhooks secret").toString("base64")}`;
const GITHUB_SECRET = "github hook secret";

// SOURCES routes Stripe-like events to billing only when live and over 100.00, and GitHub pushes to main to deploy.
const SOURCES = {
  $destinations: {
    billing: { url: "http://127.0.0.1:1/billing", secret: APP_SECRET },
    deploy: { url: "http://127.0.0.1:1/deploy", secret: APP_SECRET },
  },
  stripe: {
    provider: "standard", secret: STRIPE_SECRET,
    routes: ["handler", { to: "billing", types: ["invoice.*"], filter: { body: { livemode: true, data: { object: { amount_due: { $gt: 10000 } } } } } }],
  },
  github: {
    provider: "github", secret: GITHUB_SECRET,
    routes: [{ to: "deploy", filter: { headers: { "X-GitHub-Event": "push" }, body: { ref: "refs/heads/main" } } }],
  },
};

describe("a bad filter stops start-up", () => {
  let dir: { dir: string; cleanup: () => void };
  beforeEach(() => (dir = tempDir()));
  afterEach(() => dir.cleanup());
  const withRoute = (route: Record<string, unknown>) => ({ ...SOURCES, stripe: { ...SOURCES.stripe, routes: ["handler", { to: "billing", ...route }] } });
  const cases: [string, string, unknown, string][] = [
    ["receiver.ts", "an unknown operator", withRoute({ filter: { body: { amount: { $gtt: 1 } } } }), 'source "stripe": route #2 (billing): filter at body.amount.$gtt: unknown operator $gtt'],
    ["worker.ts", "a regex that does not compile", withRoute({ filter: { headers: { "user-agent": { $regex: "[" } } } }), 'source "stripe": route #2 (billing): filter at headers.user-agent.$regex: the regular expression "[" does not compile'],
  ];
  for (const [script, what, config, line] of cases) {
    it(`${script}: ${what}: one line, exit code 2, nothing created`, async () => {
      const file = join(dir.dir, "sources.json");
      writeFileSync(file, JSON.stringify(config));
      const db = join(dir.dir, "inbox.db");
      const r = await runScript(script, ["--sources", file, "--db", db, ...(script === "worker.ts" ? ["--once"] : ["--port", "0"])], { APP_SECRET });
      assert.equal(r.code, 2, r.stderr);
      assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
      assert.ok(r.stderr.includes(line), r.stderr);
      assert.equal(existsSync(db), false);
    });
  }

  it("control: the file with its filters mended starts the worker", async () => {
    const file = join(dir.dir, "sources.json");
    writeFileSync(file, JSON.stringify(SOURCES));
    const r = await runScript("worker.ts", ["--sources", file, "--db", join(dir.dir, "inbox.db"), "--once"]);
    assert.equal(r.code, 0, r.stderr);
  });
});

for (const backend of await backends("routing")) {
  describe(`filters at store time, through receiver.ts, on ${backend.name}`, { skip: backend.skip }, () => {
    it("writes a row for each route whose filter matches; a form body matches no body filter; replay --to still adds a route", async () => {
      const dir = tempDir();
      const { target, cleanup } = await backend.make();
      try {
        const file = join(dir.dir, "sources.json");
        writeFileSync(file, JSON.stringify(SOURCES));
        const receiver = await startReceiver(target, ["--sources", file, "--quiet"]);
        const now = () => Math.floor(Date.now() / 1000);
        const stripe = async (id: string, event: unknown) => {
          const body = JSON.stringify(event);
          const r = await fetch(`${receiver.url}/stripe`, { method: "POST", headers: { ...sign("standard", STRIPE_SECRET, { id, body, timestampS: now() }), "content-type": "application/json" }, body });
          assert.equal(r.status, 200, await r.text());
        };
        const github = async (id: string, event: string, body: string, contentType = "application/json") => {
          const r = await fetch(`${receiver.url}/github`, {
            method: "POST", body,
            headers: { ...sign("github", GITHUB_SECRET, { id, body, timestampS: now() }), "X-GitHub-Event": event, "content-type": contentType },
          });
          assert.equal(r.status, 200, await r.text());
        };
        const invoice = (livemode: boolean, amount: number) => ({ type: "invoice.paid", livemode, data: { object: { amount_due: amount } } });
        await stripe("evt_live_big", invoice(true, 25_000));
        await stripe("evt_live_small", invoice(true, 10_000));
        await stripe("evt_test_big", invoice(false, 25_000));
        await stripe("evt_customer", { type: "customer.created", livemode: true, data: { object: { amount_due: 99_999 } } });
        await github("gh_main", "push", JSON.stringify({ ref: "refs/heads/main" }));
        await github("gh_branch", "push", JSON.stringify({ ref: "refs/heads/feature" }));
        await github("gh_ping", "ping", JSON.stringify({ ref: "refs/heads/main" }));
        await github("gh_form", "push", `payload=${encodeURIComponent(JSON.stringify({ ref: "refs/heads/main" }))}`, "application/x-www-form-urlencoded");
        await receiver.stop();

        const inbox = await connect(target);
        try {
          const routes = async (id: string) => (await inbox.find(id)).map((d) => d.destination).sort();
          assert.deepEqual(await routes("evt_live_big"), ["billing", "handler"]);
          assert.deepEqual(await routes("evt_live_small"), ["handler"], "10000 is not over 10000");
          assert.deepEqual(await routes("evt_test_big"), ["handler"], "not live");
          assert.deepEqual(await routes("evt_customer"), ["handler"], "types are checked too");
          assert.deepEqual(await routes("gh_main"), ["deploy"]);
          // No route matched: kept, done, as a duplicate's memory (the empty destination).
          for (const id of ["gh_branch", "gh_ping", "gh_form"]) assert.deepEqual(await routes(id), [""], id);
        } finally {
          await inbox.close();
        }
        const replayed = await runScript("inbox.ts", ["replay", "evt_test_big", "--to", "billing", "--db", target]);
        assert.equal(replayed.code, 0, replayed.stderr);
        const again = await connect(target);
        try {
          assert.deepEqual((await again.find("evt_test_big")).map((d) => d.destination).sort(), ["billing", "handler"]);
        } finally {
          await again.close();
        }
      } finally {
        await cleanup();
        dir.cleanup();
      }
    });
  });
}
