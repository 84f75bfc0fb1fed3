// test/screenshots.ts: takes the pictures in docs/admin.md of the operator page in real Chromium, over an hour of
// made-up traffic from three providers, some of it failing, forwarded beside the handler to a ledger whose
// breaker has just opened and a CRM paused for a deploy, under a configuration with three versions (the
// operator's file, then a key's change and a page session's), two secrets and three API keys. Rerun it after
// changing how the page looks:
//   npx tsx test/screenshots.ts        writes docs/admin-overview.png, docs/admin-delivery.png, docs/admin-narrow.png,
//                                      docs/admin-failures.png, docs/admin-destinations.png, docs/admin-config.png,
//                                      docs/admin-config-destination.png, docs/admin-config-route.png,
//                                      docs/admin-config-conflict.png, docs/admin-config-history.png, docs/admin-keys.png

import { createHash } from "node:crypto";
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createAdmin, listenAdmin } from "../admin.ts";
import { connect, type BreakerPolicy } from "../inbox.ts";
import { mintKey } from "../lib/api/keys.ts";
import { hostOf, trustIn } from "../lib/config/config.ts";
import { trustOf } from "../lib/config/trust.ts";
import { preview } from "../lib/forwarding/preview.ts";
import { parseKeyring } from "../lib/secrets.ts";
import type { Delivery, Way } from "../lib/store.ts";
import { ROOT, launchChromium, tempDir } from "./helpers.ts";

const dir = tempDir("inbox-shots-");
const end = Date.now();
let t = end - 60 * 60_000;
const inbox = await connect(join(dir.dir, "inbox.db"), { now: () => t, maxAttempts: 1 });
// The forwarder's own connection: a failed forward is tried again later, not set aside at once.
const forwarder = await connect(join(dir.dir, "inbox.db"), { now: () => t, maxAttempts: 8 });
// A fixed sequence, so the pictures change only when the page does.
let seed = 7;
const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647;

const errors = [
  () => `HTTP 502 from payments-api after ${400 + Math.round(random() * 900)} ms`,
  () => `customer "cus_${Math.round(random() * 1e6)}" not found`,
  () => "invalid amount: expected a positive integer",
];
const kinds = [
  {
    source: "stripe",
    types: ["charge.succeeded", "invoice.paid", "customer.updated"],
    destinations: ["handler", "ledger"],
  },
  { source: "github", types: ["push", "pull_request"], destinations: ["handler"] },
  { source: "shopify", types: ["orders/create"], destinations: ["handler", "crm"] },
];
const policy: BreakerPolicy = { failures: 10, rate: 0.5, minTries: 20, windowMs: 60_000, coolDownMs: 30_000 };
const ledgerDown = "HTTP 503 from ledger.internal: upstream unavailable";
let done = 0;
for (let minute = 0; minute < 60; minute++) {
  const arrivals = 4 + Math.round(6 * random() + 4 * Math.sin(minute / 9));
  for (let i = 0; i < arrivals; i++) {
    t = end - (60 - minute) * 60_000 + Math.round(i * (60_000 / arrivals));
    const kind = kinds[Math.floor(random() * (random() < 0.6 ? 1 : kinds.length))]!;
    const type = kind.types[Math.floor(random() * kind.types.length)]!;
    const id = `evt_${(t % 1e9).toString(36)}${i}`;
    const body = {
      id,
      type,
      created: Math.floor(t / 1000),
      data: {
        object: {
          amount: Math.round(random() * 9000) + 100,
          currency: "eur",
          customer: `cus_${Math.round(random() * 1e5)}`,
        },
      },
    };
    await inbox.store({
      source: kind.source,
      id,
      body: Buffer.from(JSON.stringify(body)),
      eventType: type,
      contentType: "application/json",
      destinations: kind.destinations,
    });
    // Most are handled within seconds; a few fail, more of them in a bad patch twenty minutes ago.
    if (minute > 57 && random() < 0.7) continue;
    t += 800 + Math.round(random() * 3_000);
    const lease = (await inbox.claim(60_000))!;
    const bad = random() < (minute > 35 && minute < 45 ? 0.35 : 0.04);
    if (bad)
      await inbox.fail(lease, errors[Math.floor(random() * (minute > 35 && minute < 45 ? 1 : errors.length))]!());
    else await inbox.finish(lease);
    // The ledger takes stripe's until it slows down two minutes ago (it goes down below); the CRM takes
    // shopify's until its deploy began.
    if (minute < 58) {
      const forward = await forwarder.claim(60_000, { destination: "ledger" });
      if (forward) {
        await forwarder.finish(forward);
        if (++done % 10 === 0) await forwarder.tally("ledger", { done: 10, failed: 0 }, policy);
      }
    }
    if (minute < 50) {
      const crm = await forwarder.claim(60_000, { destination: "crm" });
      if (crm) await forwarder.finish(crm);
    }
  }
  if (minute === 50) await inbox.pause("crm", "deploying crm v2");
}
// Twenty seconds ago the ledger went down: ten forwards failed in a row and its breaker opened; none is
// claimed after that until the probe.
t = end - 25_000;
while ((await forwarder.destinations()).some((d) => d.name === "ledger" && d.state === "closed")) {
  t += 500;
  const forward = (await forwarder.claim(60_000, { destination: "ledger" }))!;
  await forwarder.fail(forward, ledgerDown);
  await forwarder.tally("ledger", { done: 0, failed: 1, error: ledgerDown }, policy);
}
await forwarder.close();
// One delivery that failed three tries in a row, as the one to show: its page lists each try's error.
const retrying = await connect(join(dir.dir, "inbox.db"), { now: () => t, maxAttempts: 3, random: () => 0.5 });
t = end - 9 * 60_000;
await retrying.store({
  source: "stripe",
  id: "evt_3QxK2mLdTz81",
  contentType: "application/json",
  eventType: "invoice.paid",
  destinations: ["handler", "ledger"],
  body: Buffer.from(
    JSON.stringify({
      id: "evt_3QxK2mLdTz81",
      type: "invoice.paid",
      data: { object: { amount_paid: 4900, currency: "eur", customer: "cus_R2d2C3po" } },
    }),
  ),
});
for (const [delay, error] of [
  [500, "HTTP 502 from payments-api after 1204 ms"],
  [3_000, "HTTP 502 from payments-api after 998 ms"],
  [9_000, "HTTP 503 from payments-api after 30001 ms"],
] as const) {
  t += delay;
  const lease = (await retrying.claimBatch(50, 60_000)).find((l) => l.id === "evt_3QxK2mLdTz81")!;
  await retrying.fail(lease, error);
  await retrying.flush();
}
await retrying.close();
t = end;
const failed = { source: "stripe", id: "evt_3QxK2mLdTz81" };

// The configuration, in three versions: the operator's file an hour ago, a deploy key's ledger, and a person's
// filter on the page; each with whose hand wrote each part, as the API and the page record it.
mkdirSync(join(dir.dir, "transforms"));
const crmShape = "export default (d) => ({ body: { order: d.json.id, total: d.json.data.object.amount } });\n";
writeFileSync(join(dir.dir, "transforms/crm.mjs"), crmShape);
const transforms = {
  "./transforms/crm.mjs": { sha256: createHash("sha256").update(crmShape).digest("hex"), code: crmShape },
};
const destinations = {
  crm: {
    url: "https://crm.example.com/webhooks/shopify",
    secret: "env:CRM_SIGNING_SECRET",
    bearer: "env:CRM_TOKEN",
    headers: { "x-team": "growth" },
    transform: "./transforms/crm.mjs",
  },
};
const ledger = {
  url: "https://ledger.example.com/hooks/stripe",
  secret: "secret:ledger_signing",
  headers: { "x-api-key": "secret:ledger_api_key" },
  timeout: 10,
  maxInFlight: 8,
  rate: 50,
  burst: 100,
};
const sources = (ledgerRoute: unknown) => ({
  stripe: {
    provider: "stripe",
    secret: "env:STRIPE_WEBHOOK_SECRET",
    routes: ["handler", ...(ledgerRoute ? [ledgerRoute] : [])],
  },
  github: { provider: "github", secret: "env:GITHUB_WEBHOOK_SECRET" },
  shopify: { provider: "shopify", secret: "env:SHOPIFY_WEBHOOK_SECRET", routes: ["handler", "crm"] },
});
const versions: { actor: string; way: Way; doc: unknown; at: number }[] = [
  {
    actor: "inbox.ts",
    way: "operator",
    doc: { $destinations: destinations, ...sources(undefined) },
    at: end - 58 * 60_000,
  },
  {
    actor: "key:5d1c09a7e3b2",
    way: "api",
    doc: { $destinations: { ...destinations, ledger }, ...sources({ to: "ledger", types: ["invoice.*", "charge.*"] }) },
    at: end - 40 * 60_000,
  },
  {
    actor: "page:session:Qx3vLm@10.0.4.17",
    way: "api",
    doc: {
      $destinations: { ...destinations, ledger },
      ...sources({
        to: "ledger",
        types: ["invoice.*", "charge.*"],
        filter: { body: { data: { object: { currency: "eur" } } } },
      }),
    },
    at: end - 12 * 60_000,
  },
];
let before: { parsed: unknown; trust: Record<string, Way>; way: Way } | undefined;
for (const v of versions) {
  t = v.at;
  const trust = trustOf(v.doc, v.way, before);
  await inbox.applyConfig(`${JSON.stringify(v.doc, null, 2)}\n`, { actor: v.actor, way: v.way, trust, transforms });
  before = { parsed: v.doc, trust: trustIn(v.doc, { trust, way: v.way }), way: v.way };
}
const ring = parseKeyring(Buffer.alloc(32, 3).toString("base64"));
const sealedSigning = `whsec_${Buffer.from("the ledger's made-up secret").toString("base64")}`;
for (const [name, by, at] of [
  ["ledger_signing", "key:5d1c09a7e3b2", end - 41 * 60_000],
  ["ledger_api_key", "page:session:Qx3vLm@10.0.4.17", end - 13 * 60_000],
] as const)
  await inbox.setSecret({ name, sealed: ring.seal(name, sealedSigning), setAt: at, setBy: by });
for (const [scope, name, at, revoked] of [
  ["admin", "platform team", end - 50 * 60_000, null],
  ["write", "deploys", end - 45 * 60_000, null],
  ["read", "grafana", end - 44 * 60_000, null],
  ["write", "old CI runner", end - 59 * 60_000, end - 30 * 60_000],
] as const) {
  const { row } = mintKey({ scope, name, now: at });
  await inbox.addApiKey({ ...row, revokedAt: revoked });
}
t = end;

// The page's host, as admin.ts builds it from the operator's environment: the secrets the operator's parts read,
// and the key of the secret store.
const KEY = Buffer.alloc(32, 3).toString("base64");
const signing = `whsec_${Buffer.from("a made-up secret for the pictures").toString("base64")}`;
const env = {
  CRM_SIGNING_SECRET: signing,
  CRM_TOKEN: "made-up",
  STRIPE_WEBHOOK_SECRET: "whsec_made_up",
  GITHUB_WEBHOOK_SECRET: "made-up",
  SHOPIFY_WEBHOOK_SECRET: "made-up",
  INBOX_SECRETS_KEY: KEY,
  // The operator lets the API's parts read the Stripe source's secret, which the API has changed since.
  INBOX_API_ENV: "STRIPE_WEBHOOK_SECRET",
};
const admin = createAdmin({
  inbox,
  audit: () => {},
  host: hostOf(env, { inbox }),
  base: dir.dir,
  preview: async (rows: readonly Delivery[], options: { to?: string } = {}) =>
    preview(rows, JSON.parse((await inbox.readConfig())!.document), { base: dir.dir, ...options }),
});
const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
const browser = await launchChromium();
mkdirSync(join(ROOT, "docs"), { recursive: true });
try {
  const wide = await browser.newPage({ viewport: { width: 1100, height: 820 } });
  await wide.goto(`${url}/`);
  await wide.screenshot({ path: join(ROOT, "docs/admin-overview.png"), fullPage: true });
  await wide.goto(`${url}/delivery?${new URLSearchParams({ source: failed.source, id: failed.id })}`);
  await wide.screenshot({ path: join(ROOT, "docs/admin-delivery.png"), fullPage: true });
  const narrow = await browser.newPage({ viewport: { width: 420, height: 900 } });
  await narrow.goto(`${url}/deliveries?status=failed`);
  await narrow.screenshot({ path: join(ROOT, "docs/admin-narrow.png") });
  const list = await browser.newPage({ viewport: { width: 1100, height: 700 } });
  await list.goto(`${url}/failures`);
  await list.screenshot({ path: join(ROOT, "docs/admin-failures.png") });
  const states = await browser.newPage({ viewport: { width: 1100, height: 480 } });
  await states.goto(`${url}/destinations`);
  await states.screenshot({ path: join(ROOT, "docs/admin-destinations.png"), fullPage: true });

  // The configuration's pages, at 1280 px, where nothing may be clipped.
  const config = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  await config.goto(`${url}/config`);
  await config.screenshot({ path: join(ROOT, "docs/admin-config.png"), fullPage: true });
  await config.goto(`${url}/config/destination?${new URLSearchParams({ name: "ledger", ...failed })}#preview`);
  await config.screenshot({ path: join(ROOT, "docs/admin-config-destination.png"), fullPage: true });
  await config.goto(`${url}/config/route?source=stripe&route=1`);
  await config.fill('input[name="try_id"]', failed.id);
  await config.click('button:has-text("Test the filter")');
  await config.waitForSelector(".verdict");
  await config.screenshot({ path: join(ROOT, "docs/admin-config-route.png"), fullPage: true });
  await config.goto(`${url}/config/history`);
  await config.screenshot({ path: join(ROOT, "docs/admin-config-history.png"), fullPage: true });
  await config.goto(`${url}/keys`);
  await config.screenshot({ path: join(ROOT, "docs/admin-keys.png"), fullPage: true });
  // Two people editing the ledger at once: the second is told what changed, and keeps its edit.
  const other = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  for (const p of [config, other]) await p.goto(`${url}/config/destination?name=ledger`);
  await config.fill('input[name="timeout"]', "20");
  await config.click('button:has-text("Save")');
  await config.waitForSelector(".flash, .problem");
  if ((await config.locator(".problem").count()) > 0)
    throw new Error(`not saved: ${await config.textContent(".problem")}`);
  await other.fill('input[name="maxInFlight"]', "4");
  await other.click('button:has-text("Save")');
  await other.waitForSelector(".problem");
  if (!/version 4 is in force, not 3/.test((await other.textContent(".problem")) ?? ""))
    throw new Error(`the conflict's picture shows something else: ${await other.textContent(".problem")}`);
  await other.screenshot({ path: join(ROOT, "docs/admin-config-conflict.png") });
} finally {
  await browser.close();
  admin.server.close();
  await inbox.close();
  dir.cleanup();
}
console.log(
  "wrote docs/admin-overview.png, docs/admin-delivery.png, docs/admin-narrow.png, docs/admin-failures.png, docs/admin-destinations.png, docs/admin-config.png, docs/admin-config-destination.png, docs/admin-config-route.png, docs/admin-config-history.png, docs/admin-keys.png, docs/admin-config-conflict.png",
);
