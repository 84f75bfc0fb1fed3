// test/screenshots.ts: takes the pictures in docs/admin.md of the operator page in real Chromium, over an hour of
// made-up traffic from three providers, some of it failing, forwarded beside the handler to a ledger whose
// breaker has just opened and a CRM paused for a deploy. Rerun it after changing how the page looks:
//   npx tsx test/screenshots.ts        writes docs/admin-overview.png, docs/admin-delivery.png, docs/admin-narrow.png,
//                                      docs/admin-failures.png, docs/admin-destinations.png

import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { createAdmin, listenAdmin } from "../admin.ts";
import { connect, type BreakerPolicy } from "../inbox.ts";
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

const admin = createAdmin({ inbox, audit: () => {} });
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
  const destinations = await browser.newPage({ viewport: { width: 1100, height: 480 } });
  await destinations.goto(`${url}/destinations`);
  await destinations.screenshot({ path: join(ROOT, "docs/admin-destinations.png"), fullPage: true });
} finally {
  await browser.close();
  admin.server.close();
  await inbox.close();
  dir.cleanup();
}
console.log(
  "wrote docs/admin-overview.png, docs/admin-delivery.png, docs/admin-narrow.png, docs/admin-failures.png, docs/admin-destinations.png",
);
