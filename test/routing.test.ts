// test/routing.test.ts: route filters through the real receiver (a receiver.ts child) on SQLite and on
// PostgreSQL: deliveries signed as Stripe-style Standard Webhooks and GitHub send them, rows written for the
// routes whose filters match, a form-encoded body that matches no body filter, and `replay --to` still adding
// a route afterwards; `inbox.ts preview` shows what would be sent. A bad filter or transform module stops
// receiver.ts and worker.ts with one line and exit code 2.

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
    provider: "standard",
    secret: STRIPE_SECRET,
    routes: [
      "handler",
      {
        to: "billing",
        types: ["invoice.*"],
        filter: { body: { livemode: true, data: { object: { amount_due: { $gt: 10000 } } } } },
        transform: "./billing.ts",
      },
    ],
  },
  github: {
    provider: "github",
    secret: GITHUB_SECRET,
    routes: [{ to: "deploy", filter: { headers: { "X-GitHub-Event": "push" }, body: { ref: "refs/heads/main" } } }],
  },
};

// BILLING is the billing route's transform: the invoice in the app's own shape.
const BILLING = `export default (d: { json: { data: { object: { id: string; amount_due: number } } } }) =>
  ({ body: { invoice: d.json.data.object.id, cents: d.json.data.object.amount_due }, headers: { "x-billing": "1" } });`;

// writeSources writes a sources file, and the billing transform beside it; it returns the file's path.
function writeSources(dir: string, config: unknown): string {
  writeFileSync(join(dir, "billing.ts"), BILLING);
  writeFileSync(join(dir, "sources.json"), JSON.stringify(config));
  return join(dir, "sources.json");
}

describe("a bad filter or transform stops start-up", () => {
  let dir: { dir: string; cleanup: () => void };
  beforeEach(() => (dir = tempDir()));
  afterEach(() => dir.cleanup());
  const withRoute = (route: Record<string, unknown>) => ({
    ...SOURCES,
    stripe: { ...SOURCES.stripe, routes: ["handler", { to: "billing", ...route }] },
  });
  const cases: [string, string, unknown, string][] = [
    [
      "receiver.ts",
      "an unknown operator",
      withRoute({ filter: { body: { amount: { $gtt: 1 } } } }),
      'source "stripe": route #2 (billing): filter at body.amount.$gtt: unknown operator $gtt',
    ],
    [
      "worker.ts",
      "a regex that does not compile",
      withRoute({ filter: { headers: { "user-agent": { $regex: "[" } } } }),
      'source "stripe": route #2 (billing): filter at headers.user-agent.$regex: the regular expression "[" does not compile',
    ],
    [
      "worker.ts",
      "a transform module that is not there",
      withRoute({ transform: { module: "./missing.ts", process: true } }),
      'source "stripe": route to billing: transform ./missing.ts could not be loaded: there is no file /',
    ],
  ];
  for (const [script, what, config, line] of cases) {
    it(`${script}: ${what}: one line, exit code 2, nothing created`, async () => {
      const file = writeSources(dir.dir, config);
      const db = join(dir.dir, "inbox.db");
      const r = await runScript(
        script,
        ["--sources", file, "--db", db, ...(script === "worker.ts" ? ["--once"] : ["--port", "0"])],
        { APP_SECRET },
      );
      assert.equal(r.code, 2, r.stderr);
      assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
      assert.ok(r.stderr.includes(line), r.stderr);
      assert.equal(existsSync(db), false);
    });
  }

  it("worker.ts: a transform that imports webhook-inbox at run time from a folder outside any app: one line, exit 2, saying to import types only", async () => {
    const file = writeSources(dir.dir, withRoute({ transform: { module: "./needs-package.ts", process: true } }));
    writeFileSync(
      join(dir.dir, "needs-package.ts"),
      'import { defineTransform } from "webhook-inbox/transform";\nexport default defineTransform(() => ({ body: {} }));\n',
    );
    const r = await runScript("worker.ts", ["--sources", file, "--db", join(dir.dir, "inbox.db"), "--once"], {
      APP_SECRET,
    });
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stderr.trim().split("\n").length, 1, r.stderr);
    assert.match(r.stderr, /transform \.\/needs-package\.ts could not be loaded: .*webhook-inbox.*import type/);
    // (control) The same transform with `import type` loads: the worker starts.
    writeFileSync(
      join(dir.dir, "needs-package.ts"),
      'import type { Transform } from "webhook-inbox/transform";\nconst t: Transform = () => ({ body: {} });\nexport default t;\n',
    );
    const typed = await runScript(
      "worker.ts",
      ["--sources", file, "--db", join(dir.dir, "inbox.db"), "--once", "--handler", "demo"],
      { APP_SECRET },
    );
    assert.equal(typed.code, 0, typed.stderr);
  });

  it("control: the file with its filters mended starts the worker", async () => {
    const file = writeSources(dir.dir, SOURCES);
    const r = await runScript("worker.ts", [
      "--sources",
      file,
      "--db",
      join(dir.dir, "inbox.db"),
      "--once",
      "--handler",
      "demo",
    ]);
    assert.equal(r.code, 0, r.stderr);
  });
});

for (const backend of await backends("routing")) {
  describe(`filters at store time, through receiver.ts, on ${backend.name}`, { skip: backend.skip }, () => {
    it("writes a row for each route whose filter matches; a form body matches no body filter; replay --to still adds a route", async () => {
      const dir = tempDir();
      const { target, cleanup } = await backend.make();
      try {
        const file = writeSources(dir.dir, SOURCES);
        const receiver = await startReceiver(target, ["--sources", file, "--quiet"]);
        const now = () => Math.floor(Date.now() / 1000);
        const stripe = async (id: string, event: unknown) => {
          const body = JSON.stringify(event);
          const r = await fetch(`${receiver.url}/stripe`, {
            method: "POST",
            headers: {
              ...sign("standard", STRIPE_SECRET, { id, body, timestampS: now() }),
              "content-type": "application/json",
            },
            body,
          });
          assert.equal(r.status, 200, await r.text());
        };
        const github = async (id: string, event: string, body: string, contentType = "application/json") => {
          const r = await fetch(`${receiver.url}/github`, {
            method: "POST",
            body,
            headers: {
              ...sign("github", GITHUB_SECRET, { id, body, timestampS: now() }),
              "X-GitHub-Event": event,
              "content-type": contentType,
            },
          });
          assert.equal(r.status, 200, await r.text());
        };
        const invoice = (id: string, livemode: boolean, amount: number) => ({
          type: "invoice.paid",
          livemode,
          data: { object: { id: `in_${id}`, amount_due: amount } },
        });
        await stripe("evt_live_big", invoice("evt_live_big", true, 25_000));
        await stripe("evt_live_small", invoice("evt_live_small", true, 10_000));
        await stripe("evt_test_big", invoice("evt_test_big", false, 25_000));
        await stripe("evt_customer", {
          type: "customer.created",
          livemode: true,
          data: { object: { amount_due: 99_999 } },
        });
        await github("gh_main", "push", JSON.stringify({ ref: "refs/heads/main" }));
        await github("gh_branch", "push", JSON.stringify({ ref: "refs/heads/feature" }));
        await github("gh_ping", "ping", JSON.stringify({ ref: "refs/heads/main" }));
        await github(
          "gh_form",
          "push",
          `payload=${encodeURIComponent(JSON.stringify({ ref: "refs/heads/main" }))}`,
          "application/x-www-form-urlencoded",
        );
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
        // preview: the routes chosen now, and billing's request as its transform shapes it; nothing sent.
        const shown = await runScript("inbox.ts", [
          "preview",
          "evt_live_big",
          "--sources",
          file,
          "--db",
          target,
          "--json",
        ]);
        assert.equal(shown.code, 0, shown.stderr);
        const seen = JSON.parse(shown.stdout) as {
          routes: unknown[];
          requests: {
            destination: string;
            kind: string;
            url?: string;
            headers?: Record<string, string>;
            body?: string;
          }[];
        };
        assert.deepEqual(seen.routes, [
          { to: "handler", chosen: true, stored: true },
          { to: "billing", chosen: true, stored: true },
        ]);
        const billing = seen.requests.find((r) => r.destination === "billing")!;
        assert.equal(billing.url, "http://127.0.0.1:1/billing");
        assert.deepEqual(JSON.parse(billing.body!), { invoice: "in_evt_live_big", cents: 25_000 });
        assert.equal(billing.headers!["x-billing"], "1");
        assert.equal(billing.headers!["content-type"], "application/json");
        assert.equal(billing.headers!["webhook-signature"], "v1,(made when sent, over this body)");
        const other = await runScript("inbox.ts", [
          "preview",
          "evt_test_big",
          "--sources",
          file,
          "--db",
          target,
          "--json",
        ]);
        assert.deepEqual((JSON.parse(other.stdout) as { routes: unknown[] }).routes, [
          { to: "handler", chosen: true, stored: true },
          { to: "billing", chosen: false, why: "its filter", stored: false },
        ]);
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
