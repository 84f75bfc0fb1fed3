// test/admin-browser.test.ts: the operator page in a real Chromium (Debian's /usr/bin/chromium, driven by
// playwright-core; no browser is ever downloaded), on both backends: retries, bulk retries, the live
// overview, a destination paused and resumed, and scripts a delivery carries never run. Without Chromium
// it skips in one line, unless INBOX_REQUIRE_CHROMIUM=1 (as .ci/run sets it), which makes a missing
// browser a failure.

import assert from "node:assert/strict";
import { after, afterEach, before, beforeEach, describe, it } from "node:test";
import type { Browser, Page } from "playwright-core";
import { createAdmin, listenAdmin, type Admin } from "../admin.ts";
import { connect } from "../inbox.ts";
import type { Inbox } from "../lib/store.ts";
import { randomUUID } from "node:crypto";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { backends, chromiumSkip, launchChromium } from "./helpers.ts";

// Where the screenshots go, to be looked at by a person: the wording test leaves one per backend.
const SHOTS = process.env.INBOX_SHOTS ?? join(process.env.TMPDIR ?? "/tmp", "webhook-inbox-shots");
mkdirSync(SHOTS, { recursive: true });

const TOKEN = "night-shift-token";

// Scripts for the page go as text: tsx would wrap a function's inner names in a helper the page lacks.
const setHidden = (hidden: boolean) =>
  `Object.defineProperty(document, "hidden", { configurable: true, value: ${hidden} }); document.dispatchEvent(new Event("visibilitychange"))`;
const skip = chromiumSkip();

// Both backends need Chromium; where it is missing, that is the one reason given for either.
const BACKENDS = (await backends("admin_browser")).map((b) => ({ ...b, skip: skip || b.skip }));

for (const backend of BACKENDS) {
  describe(`the operator page in Chromium, on ${backend.name}`, { skip: backend.skip }, () => {
    let browser: Browser;
    let page: Page;
    let inbox: Inbox;
    let cleanup: () => Promise<void>;
    let admin: Admin;
    let url: string;
    let problems: string[];

    // fail stores a delivery and fails it for good, as the worker does after its last try.
    const fail = async (source: string, id: string, error: string, eventType = "charge.succeeded") => {
      await inbox.store({
        source,
        id,
        body: Buffer.from(JSON.stringify({ id, customer: "Ann", amount: 5 })),
        eventType,
      });
      const lease = await inbox.claim(60_000);
      assert.equal(lease?.id, id);
      await inbox.fail(lease, error, { permanent: true });
    };
    const statuses = async () =>
      (await inbox.query("SELECT source, id, status FROM deliveries ORDER BY source, id")).map(
        (r) => `${r.source}/${r.id}:${r.status}`,
      );

    before(async () => {
      browser = await launchChromium();
    });
    after(async () => {
      await browser?.close();
    });
    beforeEach(async () => {
      const made = await backend.make();
      cleanup = made.cleanup;
      inbox = await connect(made.target);
      admin = createAdmin({ inbox, token: TOKEN, audit: () => {}, refreshMs: 100, pageSize: 2 });
      url = await listenAdmin(admin, { host: "127.0.0.1", port: 0, token: TOKEN });
      page = await browser.newPage();
      problems = [];
      // A CSP violation or a script error is a failure of the page, whatever the test goes on to check.
      // (The login page's 401 is logged as a failed load: that one is the point, not a problem.)
      page.on(
        "console",
        (m) => void (m.type() === "error" && !/status of 401/.test(m.text()) && problems.push(m.text())),
      );
      page.on("pageerror", (e) => void problems.push(e.message));
    });
    afterEach(async () => {
      await page.close();
      admin.server.closeAllConnections();
      await new Promise((resolve) => admin.server.close(resolve));
      await inbox.close();
      await cleanup();
      assert.deepEqual(problems, [], "no script errors or CSP violations in the page");
    });

    // A locator waits without eval, which the page's CSP forbids (waitForFunction would need it).
    const cardShows = (status: string, n: number) =>
      page.locator(`.card.${status} .n`, { hasText: new RegExp(`^${n}$`) }).waitFor();
    const logIn = async () => {
      await page.goto(`${url}/`);
      await page.fill('input[name="token"]', TOKEN);
      await page.click('button:has-text("Log in")');
      await page.waitForSelector("h1:has-text('Overview')");
    };

    it("finds a failed delivery through the filters, opens it, retries it, and sees it queued", async () => {
      await fail("stripe", "evt_other", "card declined");
      await fail("stripe", "evt_broken", "HTTP 502 from payments");
      await fail("github", "gh_1", "HTTP 502 from payments", "push");
      await logIn();
      assert.equal(await page.textContent(".card.failed .n"), "3");

      await page.click("nav >> text=Deliveries");
      await page.selectOption('select[name="status"]', "failed");
      await page.fill('input[name="source"]', "stripe");
      await page.fill('input[name="error"]', "502");
      await page.click('button:has-text("Filter")');
      await page.waitForURL(/status=failed/);
      assert.match(page.url(), /source=stripe/, "the filters are in the URL, so it can be shared");
      const ids = await page.$$eval("table.list tbody td:first-child a", (links) => links.map((a) => a.textContent));
      assert.deepEqual(ids, ["evt_broken"]);

      await page.click("text=evt_broken");
      await page.waitForSelector("h1.id");
      assert.match((await page.textContent("table.tries td.error"))!, /HTTP 502 from payments/);
      assert.match((await page.textContent("pre.body"))!, /"customer": "Ann"/);
      await page.click('button:has-text("Retry")');
      await page.waitForSelector(".flash");
      assert.equal(await page.textContent(".flash"), "Queued again.");
      assert.equal(await page.textContent("h1.id .badge"), "received");
      assert.deepEqual(await statuses(), [
        "github/gh_1:failed",
        "stripe/evt_broken:received",
        "stripe/evt_other:failed",
      ]);
    });

    it("at 1280 px shows the error column whole beside GitHub's UUID IDs, and offers no bulk action above 'No deliveries match'", async () => {
      for (let i = 0; i < 2; i++) {
        const id = randomUUID();
        await inbox.store({
          source: "github-enterprise",
          id,
          body: Buffer.from("{}"),
          eventType: "pull_request_review_comment",
          destinations: ["deploy-hook-staging"],
        });
        const lease = await inbox.claim(60_000, { destination: "deploy-hook-staging" });
        assert.equal(lease?.id, id);
        await inbox.fail(
          lease,
          `HTTP 404 from deploy-hook-staging: https://deploy.internal/hooks/github/8f14e45fceea167a5a36dedd4bea2543?attempt=1&delivery=${id}`,
          { permanent: true },
        );
      }
      await page.setViewportSize({ width: 1280, height: 800 });
      await logIn();
      await page.goto(`${url}/deliveries?status=failed`);
      // Every error cell ends inside the table's box, and the box has nothing to scroll to.
      const fits = `(() => {
        const box = document.querySelector(".scroll");
        const right = box.getBoundingClientRect().right;
        return box.scrollWidth <= box.clientWidth && [...document.querySelectorAll("td.error")].every((e) => e.getBoundingClientRect().right <= right + 0.5);
      })()`;
      assert.equal(await page.evaluate(fits), true);
      await page.screenshot({ path: join(SHOTS, `deliveries-1280-${backend.name}.png`) });
      // (control) Without letting a long word break, the same rows push the error column out of sight.
      await page.evaluate(
        `document.querySelectorAll("table.list td").forEach((td) => { td.style.overflowWrap = "normal"; })`,
      );
      assert.equal(await page.evaluate(fits), false);

      await page.goto(`${url}/deliveries?status=failed&source=nowhere`);
      await page.waitForSelector("text=No deliveries match.");
      assert.equal(await page.locator("text=Retry all failed…").count(), 0);
      // (control) The same filter that matches offers it.
      await page.goto(`${url}/deliveries?status=failed&source=github-enterprise`);
      assert.equal(await page.locator("text=Retry all failed…").count(), 1);
    });

    it("bulk-retries a filtered group beyond the page on screen, and the database shows exactly those queued", async () => {
      for (const id of ["a1", "a2", "a3"]) await fail("stripe", id, "HTTP 502 from payments");
      await fail("stripe", "z9", "card declined");
      await fail("github", "b1", "HTTP 502 from payments", "push");
      await inbox.store({ source: "stripe", id: "ok1", body: Buffer.from("{}") });
      await logIn();
      await page.goto(`${url}/deliveries?source=stripe&error=502`);
      assert.equal(await page.locator("table.list tbody tr").count(), 2, "a page shows two; three match");
      await page.click("text=Retry all failed…");
      await page.waitForSelector("h1:has-text('Retry 3 failed deliveries?')");
      await page.click('button:has-text("Retry 3")');
      await page.waitForSelector(".flash");
      assert.equal(await page.textContent(".flash"), "Retried 3 deliveries.");
      assert.deepEqual(await statuses(), [
        "github/b1:failed",
        "stripe/a1:received",
        "stripe/a2:received",
        "stripe/a3:received",
        "stripe/ok1:received",
        "stripe/z9:failed",
      ]);
    });

    it("refreshes the overview live, and pauses while the tab is hidden", async () => {
      await logIn();
      assert.equal(await page.textContent(".card.received .n"), "0");
      await inbox.store({ id: "new_1", body: Buffer.from("{}") });
      await cardShows("received", 1);
      // Headless tabs are always visible: hide this one the way a browser would tell the page.
      await page.evaluate(setHidden(true));
      assert.equal(await page.textContent("#live-state"), "paused");
      await inbox.store({ id: "new_2", body: Buffer.from("{}") });
      await page.waitForTimeout(400);
      assert.equal(await page.textContent(".card.received .n"), "1", "no refresh while hidden");
      await page.evaluate(setHidden(false));
      await cardShows("received", 2);
    });

    it("pauses a destination and resumes it from its page, lists its deliveries, and shows a delivery's row per destination", async () => {
      for (const id of ["o1", "o2"]) {
        await inbox.store({
          source: "shop",
          id,
          body: Buffer.from(JSON.stringify({ id })),
          eventType: "order.created",
          destinations: ["handler", "app"],
        });
      }
      const appRow = 'table.destinations tr:has(a:text-is("app"))';
      await logIn();
      await page.click("nav >> text=Destinations");
      await page.waitForSelector("h1:has-text('Destinations')");
      assert.equal(await page.textContent(`${appRow} .badge`), "healthy");
      await page.fill(`${appRow} input[name="reason"]`, "deploying v2");
      await page.click(`${appRow} button:has-text("Pause")`);
      await page.waitForSelector(".flash");
      assert.equal(await page.textContent(".flash"), "app paused: its deliveries wait, none discarded.");
      assert.equal(await page.textContent(`${appRow} .badge`), "paused by an operator");
      assert.equal(await page.textContent(`${appRow} .detail`), "paused, nothing discarded: deploying v2");
      assert.equal(await inbox.claim(60_000, { destination: "app" }), undefined, "held: none is claimed");

      await page.click("nav >> text=Overview");
      assert.match((await page.textContent(".held"))!, /app paused by an operator 2 waiting/);

      await page.click("nav >> text=Destinations");
      await page.click(`${appRow} button:has-text("Resume")`);
      await page.waitForSelector(".flash");
      assert.equal(await page.textContent(".flash"), "app resumed: its deliveries go again.");
      assert.equal(await page.textContent(`${appRow} .badge`), "healthy");

      await page.click(`${appRow} td:nth-child(3) a`);
      await page.waitForURL(/destination=app/);
      assert.match(page.url(), /status=received/);
      assert.deepEqual(await page.$$eval("table.list tbody td.dest", (cells) => cells.map((c) => c.textContent)), [
        "app",
        "app",
      ]);
      await page.click("table.list >> text=o1");
      await page.waitForSelector("table.routes");
      const routes = await page.$$eval("table.routes tbody tr", (rows) =>
        rows.map((r) =>
          [...r.querySelectorAll("td")]
            .slice(0, 2)
            .map((c) => c.textContent)
            .join(" "),
        ),
      );
      assert.deepEqual(routes, ["handler received", "app received"]);
    });

    it("says in words what each destination's state means: failing, paused for N s; failing, still sending; healthy; the breaker's terms beside (a screenshot to look at)", async () => {
      for (const id of ["w1", "w2", "w3"])
        await inbox.store({ source: "shop", id, body: Buffer.from("{}"), destinations: ["handler", "down", "flaky"] });
      const fail = async (name: string, failures: number) => {
        for (let i = 0; i < 3; i++) {
          const lease = await inbox.claim(60_000, { destination: name });
          assert.ok(lease);
          await inbox.fail(lease, "HTTP 503 from app");
          await inbox.tally(
            name,
            { done: 0, failed: 1, error: "HTTP 503 from app" },
            { failures, rate: 0.99, minTries: 100, windowMs: 60_000, coolDownMs: 30_000 },
          );
        }
      };
      await fail("down", 3);
      await fail("flaky", 10);
      await logIn();
      await page.click("nav >> text=Destinations");
      await page.waitForSelector("h1:has-text('Destinations')");
      const said = async (name: string) => {
        const row = `table.destinations tr:has(a:text-is("${name}"))`;
        return `${await page.textContent(`${row} .badge`)} | ${await page.textContent(`${row} .detail`)}`;
      };
      // The page counts down on the real clock from the cool-down's 30 s: a loaded machine takes seconds to get here.
      const down = await said("down");
      const left = /^failing, paused for (\d+) s \| breaker open after 3 failures in a row; probe at /.exec(down);
      assert.ok(left && Number(left[1]) >= 1 && Number(left[1]) <= 30, down);
      assert.equal(
        await said("flaky"),
        "failing, still sending | the last 3 tries failed; breaker closed (3 failures in a row)",
      );
      assert.equal(await said("handler"), "healthy | breaker closed");
      // The colours the words go with, as Chromium computes them: a failing destination is not green.
      const colour = (name: string) =>
        page.$eval(
          `table.destinations tr:has(a:text-is("${name}")) .badge`,
          (b) => getComputedStyle(b).backgroundColor,
        );
      assert.notEqual(await colour("flaky"), await colour("handler"));
      assert.equal(await colour("flaky"), await colour("down"));
      await page.screenshot({ path: join(SHOTS, `destinations-words-${inbox.backend}.png`), fullPage: true });
    });

    it("runs no script a delivery carries: a <script> body and an HTML event type stay text", async () => {
      await inbox.store({
        id: "evil",
        body: Buffer.from("<script>window.pwned = 1</script>"),
        eventType: `<img src=x onerror="window.pwned=2">`,
      });
      await logIn();
      await page.goto(`${url}/deliveries`);
      await page.click("text=evil");
      await page.waitForSelector("pre.body");
      assert.equal(await page.textContent("pre.body"), "<script>window.pwned = 1</script>");
      assert.equal(await page.evaluate("window.pwned"), undefined);
      assert.equal(await page.locator("main script, main img").count(), 0);
    });
  });
}
