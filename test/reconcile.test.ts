// test/reconcile.test.ts: `inbox.ts reconcile` against a local Stripe and a local GitHub (reconcile-servers.ts)
// through the real SDKs, on SQLite and PostgreSQL: an outage filled exactly, the arrived webhooks left as
// they were; twice and from two processes at once, nothing stored or handled twice; a 429 and a rate limit
// mid-pages waited out on an injected sleep, from the cursor; a bad credential one line, nothing stored, and
// the credential nowhere in output, logs or the database.

import assert from "node:assert/strict";
import { generateKeyPairSync } from "node:crypto";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";
import { connect } from "../inbox.ts";
import { reconcileOnce } from "../lib/cli/reconcile.ts";
import { caller, unreachable } from "../lib/reconcile/loop.ts";
import { silent } from "../lib/log.ts";
import { Metrics } from "../lib/metrics.ts";
import { loadSources, sign } from "../lib/config/sources.ts";
import type { Delivery, Inbox } from "../lib/store.ts";
import { run } from "../worker.ts";
import { backends, freePort, type ReceiverProcess, runScript, spawnScript, startReceiver, tempDir } from "./helpers.ts";
import { FakeGithub, FakeStripe, stripeEvent } from "./reconcile-servers.ts";

const STRIPE_KEY = "rk_test_51ReconcileKeyThatMustNeverLeak0000000000";
const WHSEC = "whsec_reconcile_test_secret";
const GH_TOKEN = "ghp_ReconcileTokenThatMustNeverLeak00000000";
const GH_SECRET = "github-webhook-secret";
const NOW_S = Math.floor(Date.now() / 1000);

// sourcesFile writes the sources file the receiver and reconcile share.
function sourcesFile(dir: string, stripeUrl: string, githubUrl: string, github: Record<string, unknown>): string {
  const file = join(dir, "sources.json");
  writeFileSync(
    file,
    JSON.stringify({
      stripe: { provider: "stripe", secret: "env:WHSEC", reconcile: { apiKey: "env:STRIPE_KEY", apiBase: stripeUrl } },
      github: { provider: "github", secret: "env:GH_SECRET", reconcile: { ...github, apiBase: githubUrl } },
    }),
  );
  return file;
}

const ENV = { WHSEC, STRIPE_KEY, GH_SECRET, GH_TOKEN };

// unsaid holds a run's output to never naming a credential, on a run that worked as on one that failed.
function unsaid(r: { stdout: string; stderr: string }): void {
  for (const secret of [STRIPE_KEY, GH_TOKEN])
    assert.ok(!r.stdout.includes(secret) && !r.stderr.includes(secret), `a credential in the output: ${r.stderr}`);
}

// postStripe sends a Stripe event to the receiver as Stripe's webhook would: pretty JSON, signed.
async function postStripe(receiver: ReceiverProcess, event: Record<string, unknown> & { id: string }): Promise<number> {
  const body = JSON.stringify(event, null, 2);
  const headers = sign("stripe", WHSEC, { id: event.id, body, timestampS: Math.floor(Date.now() / 1000) });
  const res = await fetch(`${receiver.url}/stripe`, {
    method: "POST",
    headers: { ...headers, "content-type": "application/json" },
    body,
  });
  await res.arrayBuffer();
  return res.status;
}

// postGithub sends a delivery to the receiver as GitHub would, signed with the hook's secret.
async function postGithub(receiver: ReceiverProcess, guid: string, event: string, payload: unknown): Promise<number> {
  const body = JSON.stringify(payload);
  const headers = sign("github", GH_SECRET, { id: guid, body, timestampS: 0, eventType: event });
  const res = await fetch(`${receiver.url}/github`, {
    method: "POST",
    headers: { ...headers, "content-type": "application/json" },
    body,
  });
  await res.arrayBuffer();
  return res.status;
}

async function all(inbox: Inbox, source: string): Promise<Delivery[]> {
  return inbox.search({ source }, { limit: 10_000 });
}

// everything is what a database holds, as text, to grep for a credential: a SQLite file and its WAL, or every
// PostgreSQL table of the schema.
async function everything(target: string, inbox: Inbox): Promise<string> {
  if (!target.startsWith("postgres")) {
    return [target, `${target}-wal`]
      .filter(existsSync)
      .map((f) => readFileSync(f).toString("latin1"))
      .join("");
  }
  const rows = [
    ...(await inbox.query("SELECT * FROM deliveries")),
    ...(await inbox.query("SELECT * FROM attempts")),
    ...(await inbox.query("SELECT * FROM destinations")),
  ];
  return JSON.stringify(rows, (_, v) =>
    typeof v === "bigint" ? String(v) : Buffer.isBuffer(v) ? v.toString("latin1") : v,
  );
}

for (const backend of await backends("reconcile")) {
  describe(`reconcile on ${backend.name}`, { skip: backend.skip }, () => {
    let target: string;
    let cleanup: () => Promise<void>;
    let dir: ReturnType<typeof tempDir>;
    let stripe: FakeStripe;
    let github: FakeGithub;
    let file: string;

    before(async () => {
      ({ target, cleanup } = await backend.make());
      dir = tempDir();
      stripe = await new FakeStripe(STRIPE_KEY).start();
      github = await new FakeGithub({ token: GH_TOKEN }).start();
      const { owner, repo, hookId } = github.repo;
      file = sourcesFile(dir.dir, stripe.url, github.url, { hook: "repo", owner, repo, hookId, token: "env:GH_TOKEN" });
    });
    after(async () => {
      await stripe.stop();
      await github.stop();
      await cleanup();
      dir.cleanup();
    });

    it("Stripe: an outage filled exactly, twice and from two processes at once, each event handled once", async () => {
      // 230 events in the last day: 0-19 delivered before the outage; 20-229 failed to deliver, and every
      // fifth of those arrives later as a real signed webhook through the real receiver.
      const events = Array.from({ length: 230 }, (_, i) =>
        stripeEvent(
          `evt_${String(i).padStart(4, "0")}`,
          i % 2 ? "invoice.paid" : "customer.created",
          NOW_S - 86_400 + i * 60,
          {
            id: `in_${i}`,
            amount: i * 100,
          },
        ),
      );
      // The receiver checks the reconcile setting, but never needs (or holds) the API key.
      const receiver = await startReceiver(target, ["--sources", file], { WHSEC, GH_SECRET });
      const arrived = new Set<string>();
      try {
        for (const [i, e] of events.entries()) {
          stripe.events.push({ event: e, delivered: i < 20 });
          if (i < 20 || i % 5 === 0) {
            assert.equal(await postStripe(receiver, e), 200);
            arrived.add(e.id);
          }
        }
      } finally {
        await receiver.stop();
      }
      const missing = events.filter((e) => !arrived.has(e.id)).map((e) => e.id);
      assert.equal(missing.length, 168);

      // A dry run lists exactly the missing ones and stores nothing.
      const dry = await runScript(
        "inbox.ts",
        ["reconcile", "--db", target, "--sources", file, "--source", "stripe", "--dry-run"],
        ENV,
      );
      assert.equal(dry.code, 0, dry.stderr);
      unsaid(dry);
      const listed = dry.stdout.split("\n").filter((l) => l.startsWith("missing "));
      assert.deepEqual(listed.map((l) => l.slice("missing stripe/".length)).sort(), missing.sort());
      assert.match(dry.stdout, /reconcile stripe: 210 seen, 42 already there, 168 missing \(dry run/);
      let inbox = await connect(target);
      assert.equal((await all(inbox, "stripe")).length, 62);
      await inbox.close();

      // Two processes at once: between them every missing event is fetched, none twice.
      const both = await Promise.all(
        [0, 1].map(() =>
          runScript("inbox.ts", ["reconcile", "--db", target, "--sources", file, "--source", "stripe"], ENV),
        ),
      );
      let fetched = 0;
      for (const r of both) {
        assert.equal(r.code, 0, r.stderr);
        unsaid(r);
        const m = /reconcile stripe: 210 seen, (\d+) already there, (\d+) fetched, 0 redeliveries asked/.exec(r.stdout);
        assert.ok(m, r.stdout);
        fetched += Number(m[2]);
      }
      assert.equal(fetched, 168, "between them, each missing event stored once");
      // And a third: nothing left to fetch.
      const again = await runScript(
        "inbox.ts",
        ["reconcile", "--db", target, "--sources", file, "--source", "stripe"],
        ENV,
      );
      assert.match(again.stdout, /210 seen, 210 already there, 0 fetched/);
      unsaid(again);

      inbox = await connect(target);
      try {
        const rows = await all(inbox, "stripe");
        assert.equal(rows.length, 230, "one row per event, never two");
        assert.equal(new Set(rows.map((d) => d.id)).size, 230);
        for (const d of rows) {
          const e = events.find((x) => x.id === d.id)!;
          if (arrived.has(d.id)) {
            // The webhook's own bytes, untouched by the fetch that found it there.
            assert.equal(d.origin, "webhook");
            assert.equal(d.body.toString(), JSON.stringify(e, null, 2));
            assert.equal(d.conflicts, 0);
          } else {
            assert.equal(d.origin, "reconcile");
            assert.deepEqual(JSON.parse(d.body.toString()), e);
            assert.equal(d.eventType, e.type);
            assert.equal(d.providerTime, e.created * 1000);
          }
        }
        // The worker handles each event once, and sees where it came from; /metrics counts by origin.
        const handled = new Map<string, string>();
        const metrics = new Metrics({ inbox });
        await run(
          (job) => {
            assert.ok(!handled.has(job.delivery.id), `handled ${job.delivery.id} twice`);
            handled.set(job.delivery.id, job.delivery.origin);
          },
          { inbox, once: true, log: silent, metrics },
        );
        assert.equal(handled.size, 230);
        assert.equal([...handled.values()].filter((o) => o === "reconcile").length, 168);
        const text = await metrics.text();
        assert.match(text, /inbox_claimed_by_origin_total\{source="stripe",origin="reconcile"\} 168/);
        assert.match(text, /inbox_claimed_by_origin_total\{source="stripe",origin="webhook"\} 62/);
        // show and export say it too.
        const show = await runScript("inbox.ts", ["show", missing[0]!, "--db", target]);
        assert.match(show.stdout, /origin\s+reconcile \(fetched from the provider's API\)/);
        const exported = await runScript("inbox.ts", ["export", "--db", target, "--source", "stripe"]);
        const lines = exported.stdout
          .trim()
          .split("\n")
          .map((l) => JSON.parse(l) as { id: string; origin: string });
        assert.equal(lines.find((l) => l.id === missing[0])?.origin, "reconcile");
        assert.equal(lines.find((l) => l.id === "evt_0000")?.origin, "webhook");
        assert.ok(!(await everything(target, inbox)).includes(STRIPE_KEY));
      } finally {
        await inbox.close();
      }
    });

    it("Stripe: a 429 mid-pages waits its Retry-After and carries on from its cursor; one that never ends stops the run", async () => {
      const t = Date.now();
      stripe.events.length = 0;
      for (let i = 0; i < 250; i++)
        stripe.events.push({
          event: stripeEvent(`evt_r${String(i).padStart(4, "0")}`, "charge.succeeded", NOW_S - i, {}),
          delivered: false,
        });
      const { target: t2, cleanup: c2 } = await backend.make();
      const inbox = await connect(t2);
      try {
        const sources = [
          ...loadSources(JSON.parse(readFileSync(file, "utf8")), ENV, { reconcile: true }).values(),
        ].filter((s) => s.name === "stripe");
        const out: string[] = [];
        const errors: string[] = [];
        const sleeps: number[] = [];
        const common = {
          inbox,
          sources,
          sinceMs: 86_400_000,
          dryRun: false,
          out: (l: string) => out.push(l),
          err: { write: (text: string) => errors.push(text) },
          now: () => t,
          sleep: async (ms: number) => void sleeps.push(ms),
        };
        // The second page's first ask is refused: 429, Retry-After: 7.
        const fault = {
          status: 429,
          headers: { "retry-after": "7" },
          body: JSON.parse(readFileSync(join("test", "fixtures", "reconcile", "stripe-error-429.json"), "utf8")),
        };
        const before = stripe.requests.length;
        stripe.faults.push({ ...fault, match: (u) => u.searchParams.has("starting_after") });
        assert.deepEqual(await reconcileOnce(common), []);
        assert.match(out.at(-1)!, /250 seen, 0 already there, 250 fetched/);
        assert.deepEqual(sleeps, [7000]);
        const afters = stripe.requests.slice(before).map((u) => u.searchParams.get("starting_after"));
        // Three pages, the second asked twice from the same cursor: the run carried on, not started over.
        assert.equal(afters.length, 4);
        assert.equal(afters[0], null);
        assert.equal(afters[1], "evt_r0099");
        assert.equal(afters[2], "evt_r0099");
        assert.equal(afters[3], "evt_r0199");
        assert.equal((await all(inbox, "stripe")).length, 250);

        // Control: a 429 that never ends stops the run with one line after its tries; what was stored stays.
        for (let i = 250; i < 460; i++)
          stripe.events.push({
            event: stripeEvent(`evt_r${String(i).padStart(4, "0")}`, "charge.succeeded", NOW_S - i, {}),
            delivered: false,
          });
        sleeps.length = 0;
        errors.length = 0;
        stripe.faults.push({ ...fault, times: Number.POSITIVE_INFINITY });
        const stopped = await reconcileOnce(common);
        stripe.faults.length = 0;
        assert.equal(stopped.length, 1);
        assert.match(stopped[0]!, /^reconcile stripe: list events: gave up after 6 tries: /);
        assert.deepEqual(sleeps, [7000, 7000, 7000, 7000, 7000]);
        assert.equal((await all(inbox, "stripe")).length, 250, "what was stored before stays stored");
      } finally {
        await inbox.close();
        await c2();
      }
    });

    it("Stripe: a bad key is one line, nothing stored, and the key is nowhere", async () => {
      const { target: t3, cleanup: c3 } = await backend.make();
      try {
        const init = await connect(t3);
        await init.close();
        const wrong = "rk_test_51WrongKeyThatMustNeverLeakEither00000000";
        const r = await runScript("inbox.ts", ["reconcile", "--db", t3, "--sources", file, "--source", "stripe"], {
          ...ENV,
          STRIPE_KEY: wrong,
        });
        assert.equal(r.code, 1);
        const lines = r.stderr.trim().split("\n");
        assert.equal(lines.length, 1, r.stderr);
        assert.match(
          lines[0]!,
          /^reconcile stripe: list events: Invalid API Key provided: \[redacted: source stripe reconcile credential\]$/,
        );
        // Control: the server did echo the key, so its absence is the redactor's doing.
        assert.ok(stripe.answers.some((a) => a.includes(wrong)));
        assert.ok(!(r.stdout + r.stderr).includes(wrong));
        const inbox = await connect(t3);
        try {
          assert.equal((await all(inbox, "stripe")).length, 0);
          assert.ok(!(await everything(t3, inbox)).includes(wrong));
        } finally {
          await inbox.close();
        }
      } finally {
        await c3();
      }
    });

    it("GitHub: a repository hook's missing deliveries fetched by cursor, a rate limit waited out to its reset", async () => {
      const t = Date.now();
      github.deliveries.length = 0;
      // 150 tries in the last two days, 5 older than --since; a third failed and never came back.
      for (let i = 0; i < 155; i++) {
        const when = new Date(t - (155 - i) * 10 * 60_000 - (i < 5 ? 3 * 86_400_000 : 0)).toISOString();
        github.add({
          guid: `guid-${i}`,
          delivered_at: when,
          redelivery: false,
          status_code: i % 3 === 0 ? 503 : 200,
          event: i % 2 ? "push" : "issues",
          action: i % 2 ? null : "opened",
          payload: { n: i, repository: { full_name: "octo/shop" } },
        });
      }
      const receiver = await startReceiver(target, ["--sources", file], ENV);
      try {
        for (const d of github.deliveries)
          if (d.status_code === 200) assert.equal(await postGithub(receiver, d.guid, d.event, d.payload), 200);
      } finally {
        await receiver.stop();
      }
      const inbox = await connect(target);
      try {
        const sources = [
          ...loadSources(JSON.parse(readFileSync(file, "utf8")), ENV, { reconcile: true }).values(),
        ].filter((s) => s.name === "github");
        const out: string[] = [];
        const errs: string[] = [];
        const sleeps: number[] = [];
        github.requests.length = 0;
        // The second list page is refused once: 403, x-ratelimit-remaining 0, reset 42 s from now.
        github.faults.push({
          status: 403,
          headers: { "x-ratelimit-remaining": "0", "x-ratelimit-reset": String(Math.floor(t / 1000) + 42) },
          body: JSON.parse(readFileSync(join("test", "fixtures", "reconcile", "github-error-rate-limit.json"), "utf8")),
          match: (u) => u.pathname.endsWith("/deliveries") && u.searchParams.has("cursor"),
        });
        const run1 = reconcileOnce({
          inbox,
          sources,
          sinceMs: 2 * 86_400_000,
          dryRun: false,
          out: (l) => out.push(l),
          err: { write: (text) => errs.push(text) },
          now: () => t,
          sleep: async (ms) => void sleeps.push(ms),
        });
        assert.deepEqual(await run1, [], errs.join(""));
        const seen = 150;
        const missing = github.deliveries.filter((d, i) => i >= 5 && d.status_code !== 200).length;
        assert.match(
          out.at(-1)!,
          new RegExp(
            `reconcile github: ${seen} seen, ${seen - missing} already there, ${missing} fetched, 0 redeliveries`,
          ),
        );
        assert.equal(sleeps.length, 1);
        assert.ok(sleeps[0]! > 40_000 && sleeps[0]! <= 42_000, `slept ${sleeps}`);
        assert.match(errs.join(""), /list deliveries.*trying again in 42 s/);
        const rows = await all(inbox, "github");
        assert.equal(rows.length, github.deliveries.filter((d) => d.status_code === 200).length + missing);
        const fetched = rows.filter((d) => d.origin === "reconcile");
        assert.equal(fetched.length, missing);
        for (const d of fetched) {
          const n = Number(d.id.slice(5));
          assert.equal(d.eventType, n % 2 ? "push" : "issues");
          assert.deepEqual(JSON.parse(d.body.toString()), { n, repository: { full_name: "octo/shop" } });
          assert.ok(n >= 5, "older than --since: not fetched");
        }
        // The list pages asked: the first, the second refused, the second again from its cursor.
        const lists = github.requests
          .filter((r) => r.url.pathname.endsWith("/deliveries"))
          .map((r) => r.url.searchParams.get("cursor"));
        assert.equal(lists.length, 3);
        assert.equal(lists[0], null);
        assert.ok(lists[1] !== null && lists[1] === lists[2]);
      } finally {
        await inbox.close();
      }
    });

    it("GitHub: an organization's hook, fetched; a dry run first lists exactly what is missing", async () => {
      const org = await new FakeGithub({ token: GH_TOKEN }).start();
      const { target: t5, cleanup: c5 } = await backend.make();
      const { owner, hookId } = org.repo;
      const orgFile = sourcesFile(dir.dir, stripe.url, org.url, {
        hook: "org",
        org: owner,
        hookId,
        token: "env:GH_TOKEN",
      });
      const receiver = await startReceiver(t5, ["--sources", orgFile], ENV);
      try {
        for (let i = 0; i < 12; i++)
          org.add({
            guid: `org-${i}`,
            delivered_at: new Date(Date.now() - (12 - i) * 60_000).toISOString(),
            redelivery: false,
            status_code: i < 4 ? 504 : 200,
            event: "member",
            action: "added",
            payload: { i },
          });
        for (const d of org.deliveries)
          if (d.status_code === 200) assert.equal(await postGithub(receiver, d.guid, d.event, d.payload), 200);
      } finally {
        await receiver.stop();
      }
      try {
        const dry = await runScript(
          "inbox.ts",
          ["reconcile", "--db", t5, "--sources", orgFile, "--source", "github", "--dry-run"],
          ENV,
        );
        assert.equal(dry.code, 0, dry.stderr);
        assert.deepEqual(
          dry.stdout
            .split("\n")
            .filter((l) => l.startsWith("missing "))
            .sort(),
          ["missing github/org-0", "missing github/org-1", "missing github/org-2", "missing github/org-3"],
        );
        const r = await runScript(
          "inbox.ts",
          ["reconcile", "--db", t5, "--sources", orgFile, "--source", "github"],
          ENV,
        );
        assert.match(r.stdout, /reconcile github: 12 seen, 8 already there, 4 fetched, 0 redeliveries asked/);
        unsaid(dry);
        unsaid(r);
        assert.ok(org.requests.every((q) => q.url.pathname.startsWith(`/orgs/${owner}/hooks/${hookId}/deliveries`)));
        const inbox = await connect(t5);
        try {
          const rows = await all(inbox, "github");
          assert.deepEqual(
            rows
              .filter((d) => d.origin === "reconcile")
              .map((d) => d.id)
              .sort(),
            ["org-0", "org-1", "org-2", "org-3"],
          );
          assert.ok(!(await everything(t5, inbox)).includes(GH_TOKEN));
        } finally {
          await inbox.close();
        }
      } finally {
        await org.stop();
        await c5();
      }
    });

    it("GitHub: an app's hook, with an app JWT, redelivered signed rather than fetched, and asked for once", async () => {
      const { publicKey, privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
      const pem = privateKey.export({ type: "pkcs1", format: "pem" }).toString();
      const app = await new FakeGithub({
        appId: "4242",
        publicKeyPem: publicKey.export({ type: "spki", format: "pem" }).toString(),
      }).start();
      const { target: t4, cleanup: c4 } = await backend.make();
      const appFile = sourcesFile(dir.dir, stripe.url, app.url, {
        hook: "app",
        appId: 4242,
        privateKey: "env:GH_APP_KEY",
        mode: "redeliver",
      });
      const env = { ...ENV, GH_APP_KEY: pem };
      const receiver = await startReceiver(t4, ["--sources", appFile], env);
      try {
        for (let i = 0; i < 40; i++)
          app.add({
            guid: `app-${i}`,
            delivered_at: new Date(Date.now() - (40 - i) * 60_000).toISOString(),
            redelivery: false,
            status_code: i % 4 === 0 ? 502 : 200,
            event: "installation_repositories",
            action: "added",
            payload: { i },
          });
        for (const d of app.deliveries)
          if (d.status_code === 200) assert.equal(await postGithub(receiver, d.guid, d.event, d.payload), 200);
        // GitHub, asked, sends the webhook again, signed, to the real receiver.
        app.onRedeliver = async (d) => void (await postGithub(receiver, d.guid, d.event, d.payload));
        const first = await runScript(
          "inbox.ts",
          ["reconcile", "--db", t4, "--sources", appFile, "--source", "github"],
          env,
        );
        assert.equal(first.code, 0, first.stderr);
        assert.match(first.stdout, /reconcile github: 40 seen, 30 already there, 0 fetched, 10 redeliveries asked/);
        assert.equal(app.redeliveries.length, 10);
        const second = await runScript(
          "inbox.ts",
          ["reconcile", "--db", t4, "--sources", appFile, "--source", "github"],
          env,
        );
        assert.match(second.stdout, /reconcile github: 40 seen, 40 already there, 0 fetched, 0 redeliveries asked/);
        assert.equal(app.redeliveries.length, 10, "asked once each");
        assert.ok(!(first.stdout + first.stderr + second.stdout + second.stderr).includes(pem.split("\n")[1]!));
        const inbox = await connect(t4);
        try {
          const rows = await all(inbox, "github");
          assert.equal(rows.length, 40);
          assert.ok(
            rows.every((d) => d.origin === "webhook"),
            "redelivered: they arrive as webhooks, signed",
          );
        } finally {
          await inbox.close();
        }
        // Control: a JWT from another key is refused, one line, and no key is printed.
        const other = generateKeyPairSync("rsa", { modulusLength: 2048 })
          .privateKey.export({ type: "pkcs1", format: "pem" })
          .toString();
        const bad = await runScript("inbox.ts", ["reconcile", "--db", t4, "--sources", appFile, "--source", "github"], {
          ...env,
          GH_APP_KEY: other,
        });
        assert.equal(bad.code, 1);
        assert.equal(bad.stderr.trim().split("\n").length, 1, bad.stderr);
        assert.match(bad.stderr, /^reconcile github: list deliveries: Bad credentials/);
        assert.ok(!bad.stderr.includes(other.split("\n")[1]!));
      } finally {
        await receiver.stop();
        await app.stop();
        await c4();
      }
    });
  });
}

describe("reconcile settings", () => {
  it("refuse a credential written into the file, an unknown setting and a provider with no API", () => {
    const load = (reconcile: unknown, provider = "stripe") =>
      loadSources(
        { s: { provider, secret: provider === "stripe" ? "whsec_x" : "x", reconcile } },
        { KEY: "sk_test_x" },
        { reconcile: true },
      );
    assert.throws(() => load({ apiKey: "sk_test_plain" }), /reconcile: expected apiKey to be "env:NAME"/);
    assert.throws(() => load({ apiKey: "env:NOPE" }), /reads the environment variable NOPE, which is not set/);
    assert.throws(() => load({ apiKey: "env:KEY", typo: 1 }), /unknown setting "typo"/);
    assert.throws(
      () => load({ hook: "repo", owner: "o", repo: "r", hookId: 1, token: "env:KEY" }, "shopify"),
      /no API to reconcile from/,
    );
    assert.equal(load({ apiKey: "env:KEY" }).get("s")?.reconcile?.provider, "stripe");
    // Without { reconcile: true } (the receiver, the worker) the shape is checked, the key never read.
    const plain = loadSources({ s: { provider: "stripe", secret: "whsec_x", reconcile: { apiKey: "env:UNSET" } } }, {});
    assert.deepEqual(plain.get("s")?.reconcile?.credentials, []);
    assert.throws(
      () => loadSources({ s: { provider: "stripe", secret: "whsec_x", reconcile: { apiKey: "sk_plain" } } }, {}),
      /env:NAME/,
    );
  });

  it("a run stopped by SIGINT while it waits out a 429 says so in one line and keeps what it stored", async () => {
    const d = tempDir();
    const key = "sk_test_sigint_000000000000000000";
    const stripe = await new FakeStripe(key).start();
    try {
      for (let i = 0; i < 150; i++)
        stripe.events.push({
          event: stripeEvent(`evt_s${String(i).padStart(3, "0")}`, "charge.succeeded", NOW_S - i, {}),
          delivered: false,
        });
      stripe.faults.push({
        status: 429,
        headers: { "retry-after": "1" },
        body: { error: { type: "invalid_request_error", code: "rate_limit", message: "Request rate limit exceeded." } },
        times: Number.POSITIVE_INFINITY,
        match: (u) => u.searchParams.has("starting_after"),
      });
      const db = join(d.dir, "inbox.db");
      const init = await connect(db);
      await init.close();
      const file = join(d.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          stripe: { provider: "stripe", secret: "whsec_x", reconcile: { apiKey: "env:K", apiBase: stripe.url } },
        }),
      );
      const child = spawnScript("inbox.ts", ["reconcile", "--db", db, "--sources", file], { K: key });
      let stderr = "";
      const waiting = new Promise<void>((resolve) =>
        child.stderr!.on("data", (x) => {
          stderr += x;
          if (stderr.includes("trying again")) resolve();
        }),
      );
      await waiting;
      child.kill("SIGINT");
      const code = await new Promise((resolve) => child.on("close", resolve));
      assert.equal(code, 1);
      const last = stderr.trim().split("\n").at(-1)!;
      assert.match(
        last,
        /^reconcile stripe: list events after evt_s099: stopped while waiting: Request rate limit exceeded\.$/,
      );
      const inbox = await connect(db);
      try {
        assert.equal((await all(inbox, "stripe")).length, 100, "the first page, stored before the stop, stays");
      } finally {
        await inbox.close();
      }
    } finally {
      await stripe.stop();
      d.cleanup();
    }
  });

  it("a --every run keeps going past a failing provider until stopped", async () => {
    const d = tempDir();
    const stripe = await new FakeStripe("sk_test_every_0000000000000000").start();
    try {
      const db = join(d.dir, "inbox.db");
      const init = await connect(db);
      await init.close();
      const file = join(d.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          stripe: { provider: "stripe", secret: "whsec_x", reconcile: { apiKey: "env:K", apiBase: stripe.url } },
        }),
      );
      stripe.faults.push({
        status: 500,
        body: { error: { type: "api_error", message: "boom" } },
        times: Number.POSITIVE_INFINITY,
      });
      const child = spawnScript("inbox.ts", ["reconcile", "--db", db, "--sources", file, "--every", "1s"], {
        K: "sk_test_every_0000000000000000",
      });
      let stderr = "";
      child.stderr!.on("data", (x) => (stderr += x));
      const closed = new Promise((resolve) => child.on("close", resolve));
      try {
        // Its first pass's tries (1+2+4+8+16 s would be real time) are waited for by what it says, not by a
        // guess at how long a child takes to start on a loaded machine: it says why it waits, and is still up.
        const said = /reconcile stripe: list events: boom; trying again in 1 s/;
        for (const until = Date.now() + 60_000; !said.test(stderr) && child.exitCode === null && Date.now() < until; )
          await new Promise((resolve) => setTimeout(resolve, 50));
        assert.match(stderr, said);
        await new Promise((resolve) => setTimeout(resolve, 1_500)); // past a second try, at 1 s
        assert.equal(child.exitCode, null, stderr);
        child.kill("SIGTERM");
        assert.equal(await closed, 0);
      } finally {
        // A failed assertion must not leave the child running: the test file would never end.
        if (child.exitCode === null) child.kill("SIGKILL");
      }
    } finally {
      await stripe.stop();
      d.cleanup();
    }
  });
});

describe("reconcile where the provider cannot be reached", () => {
  it("stops each source at its first call with one line that says so, waiting out nothing", async () => {
    const d = tempDir();
    try {
      const db = join(d.dir, "inbox.db");
      await (await connect(db)).close();
      // Nothing listens on a port just freed; a .invalid name no DNS knows (RFC 2606).
      const closed = `http://127.0.0.1:${await freePort()}`;
      const file = join(d.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          stripe: { provider: "stripe", secret: "env:WHSEC", reconcile: { apiKey: "env:STRIPE_KEY", apiBase: closed } },
          github: {
            provider: "github",
            secret: "env:GH_SECRET",
            reconcile: {
              hook: "repo",
              owner: "o",
              repo: "r",
              hookId: 1,
              token: "env:GH_TOKEN",
              apiBase: "http://api.no-such-host.invalid",
            },
          },
        }),
      );
      const r = await runScript("inbox.ts", ["reconcile", "--db", db, "--sources", file, "--dry-run"], ENV);
      assert.equal(r.code, 1, r.stderr);
      assert.deepEqual(
        r.stderr
          .trim()
          .split("\n")
          .map((l) => l.replace(/: (connect ECONNREFUSED|getaddrinfo (ENOTFOUND|EAI_AGAIN)) \S+ \(/, ": $1 HOST (")),
        [
          "reconcile stripe: cannot reach the provider's API: connect ECONNREFUSED HOST (no network here, or a wrong apiBase); nothing fetched",
          `reconcile github: cannot reach the provider's API: getaddrinfo ${/EAI_AGAIN/.test(r.stderr) ? "EAI_AGAIN" : "ENOTFOUND"} HOST (no network here, or a wrong apiBase); nothing fetched`,
        ],
      );
      unsaid(r);
    } finally {
      d.cleanup();
    }
  });

  it("(control) waits out the same refusal once the provider has answered a call of the run: an outage, not a missing network", async () => {
    const refused = Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:1"), { code: "ECONNREFUSED" });
    const waits: number[] = [];
    const lines: string[] = [];
    const call = caller("stripe", () => ({}), {
      inbox: undefined as unknown as Inbox,
      now: () => 0,
      sleep: async (ms) => void waits.push(ms),
      log: (line) => lines.push(line),
      tries: 3,
    });
    assert.equal(await call("list events", async () => "page 1"), "page 1");
    await assert.rejects(
      call("list events after evt_1", async () => {
        throw refused;
      }),
      /reconcile stripe: list events after evt_1: gave up after 3 tries: connect ECONNREFUSED/,
    );
    assert.deepEqual(waits, [1_000, 2_000]);
    assert.equal(lines.length, 2);
    // And the stripe SDK's own error, its cause under detail, is read the same way at a first call.
    const sdk = Object.assign(new Error("An error occurred with our connection to Stripe."), {
      type: "StripeConnectionError",
      detail: Object.assign(new Error("getaddrinfo ENOTFOUND api.stripe.com"), { code: "ENOTFOUND" }),
    });
    assert.equal(unreachable(sdk), "getaddrinfo ENOTFOUND api.stripe.com");
    assert.equal(unreachable(new Error("boom")), undefined);
  });
});
