// test/attempt-log.test.ts: a delivery's attempt log, try by try, on both backends: a real destination on a
// free port answers 500, then 429 with Retry-After, then nothing (the forward times out), then 200, and the
// API (listAttempts, as a generated client sees it), `inbox.ts show` (a real process) and the operator page
// (over HTTP, and in Chromium where it is installed) each show all four with their status, latency and body.
// What a destination answers is escaped on the page, and a secret it echoes is redacted everywhere.
//   NODE_COMPILE_CACHE=node_modules/.cache/node-compile npx node --test test/attempt-log.test.ts

import assert from "node:assert/strict";
import { once } from "node:events";
import { join } from "node:path";
import { createServer, type Server } from "node:http";
import { after, before, describe, it } from "node:test";
import createClient from "openapi-fetch";
import { createAdmin, listenAdmin, type Admin } from "../admin.ts";
import { connect } from "../inbox.ts";
import { forward } from "../lib/forwarding/forwarder.ts";
import { loadDestinations } from "../lib/routing/routes.ts";
import type { Attempt, Inbox } from "../lib/store.ts";
import type { paths } from "./generated/api.ts";
import { MIGRATIONS as PG_MIGRATIONS } from "../lib/postgres/schema.ts";
import { MIGRATIONS as SQLITE_MIGRATIONS } from "../lib/sqlite/schema.ts";
import {
  backends,
  chromiumSkip,
  freshSchema,
  launchChromium,
  pastSchema,
  postgresSkip,
  runScript,
  tempDir,
} from "./helpers.ts";

const T0 = 1_700_000_000_000;
const SECRET = `whsec_${Buffer.from("the app's forwarding secret").toString("base64")}`;
// A token the destination echoes back in its 500: the attempt log keeps it redacted, as the error always was.
const BEARER = "tok_live_attempt_log_0123456789";
const TOKEN = "attempt-log-page-token";
const TIMEOUT_S = 0.4;

// destination answers each request by its number: 500 (echoing the bearer, with markup), 429 asking for 30
// s, nothing at all, then 200 with a header of its own.
async function destination(): Promise<{ url: string; got: number; close: () => Promise<void> }> {
  const state = { got: 0 };
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const n = ++state.got;
      if (n === 1) {
        res.writeHead(500, { "content-type": "text/html" });
        res.end(`<b>database down</b> for Bearer ${BEARER}`);
      } else if (n === 2) {
        res.writeHead(429, { "content-type": "text/plain", "retry-after": "30" });
        res.end("slow down");
      } else if (n === 3) {
        // No answer: the forward's own timeout ends the try.
      } else {
        res.writeHead(200, { "content-type": "application/json", "x-request-id": "req_4" });
        res.end('{"received":true}');
      }
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}/hooks`,
    get got() {
      return state.got;
    },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const chromium = chromiumSkip();

for (const backend of await backends("attempt_log")) {
  describe(`the attempt log on ${backend.name}`, { skip: backend.skip }, () => {
    let made: { target: string; cleanup: () => Promise<void> };
    let inbox: Inbox;
    let app: Awaited<ReturnType<typeof destination>>;
    let admin: Admin;
    let url: string;
    let t = T0;
    // The inbox's clock is pinned and moved on by the test; the forward's wall clock runs from it in real
    // time, so each try's latency is what it really took.
    const began = performance.now();
    const wall = () => t + Math.round(performance.now() - began);

    before(async () => {
      made = await backend.make();
      inbox = await connect(made.target, { now: () => t, random: () => 0 });
      app = await destination();
      await inbox.store({ source: "shop", id: "order_1", body: Buffer.from('{"total":5}'), destinations: ["app"] });
      const forwarding = loadDestinations(
        {
          $destinations: {
            app: { url: app.url, secret: SECRET, timeout: TIMEOUT_S, bearer: "env:APP_BEARER" },
          },
        },
        { APP_BEARER: BEARER },
      );
      // Four runs, each moved past the last one's backoff and Retry-After: one try each.
      for (let run = 1; run <= 4; run++) {
        await forward({ inbox, forwarding, once: true, log: () => {}, now: wall });
        assert.equal(app.got, run, `run ${run} tried once`);
        t += 120_000;
      }
      admin = createAdmin({ inbox, token: TOKEN, audit: () => {}, now: () => t });
      url = await listenAdmin(admin, { host: "127.0.0.1", port: 0, token: TOKEN });
    });
    after(async () => {
      if (admin) {
        admin.server.closeAllConnections();
        await new Promise((resolve) => admin.server.close(resolve));
      }
      await app?.close();
      await inbox?.close();
      await made?.cleanup();
    });

    it("keeps all four tries, in order, with their status or error, latency, headers and first bytes", async () => {
      const [d] = await inbox.find("order_1", "shop");
      assert.equal(d!.status, "done");
      const tries = await inbox.attempts(d!);
      assert.deepEqual(
        tries.map((a) => [a.attempt, a.destination, a.status]),
        [
          [1, "app", 500],
          [2, "app", 429],
          [3, "app", null],
          [4, "app", 200],
        ],
      );
      const [e500, e429, timeout, ok] = tries as [Attempt, Attempt, Attempt, Attempt];
      assert.equal(e500.body, "<b>database down</b> for Bearer [redacted: app bearer]");
      assert.match(e500.error!, /^HTTP 500 from app: <b>database down<\/b> for Bearer \[redacted: app bearer\]$/);
      assert.equal(e429.headers!["retry-after"], "30");
      assert.equal(e429.body, "slow down");
      assert.match(timeout.error!, /app did not answer within 400 ms/);
      assert.equal(timeout.headers, null);
      assert.ok(timeout.ms! >= 400, `the timed-out try took its timeout (${timeout.ms} ms)`);
      assert.deepEqual([ok.error, ok.body, ok.headers!["x-request-id"]], [null, '{"received":true}', "req_4"]);
      // Each try started in its own run, two minutes apart on the pinned clock, and took a real time.
      for (const [i, a] of tries.entries()) {
        assert.ok(
          a.startedAt >= T0 + i * 120_000 && a.startedAt < T0 + (i + 1) * 120_000,
          `try ${i + 1} started in its run`,
        );
        assert.ok(a.ms !== null && a.ms >= 0);
      }
      const everything = JSON.stringify(await inbox.query("SELECT * FROM attempts"));
      assert.ok(!everything.includes(BEARER), "the echoed token is kept nowhere in the log");
    });

    it("listAttempts shows all four through the API", async () => {
      const run = await runScript("inbox.ts", [
        "keys",
        "create",
        "--scope",
        "read",
        "--name",
        "log",
        "--json",
        "--db",
        made.target,
      ]);
      assert.equal(run.code, 0, run.stderr);
      const { key } = JSON.parse(run.stdout) as { key: string };
      const api = createClient<paths>({ baseUrl: url, headers: { authorization: `Bearer ${key}` } });
      const res = await api.GET("/api/v1/deliveries/{source}/{id}/attempts", {
        params: { path: { source: "shop", id: "order_1" } },
      });
      assert.equal(res.response.status, 200);
      const attempts = res.data!.attempts;
      assert.deepEqual(
        attempts.map((a) => [a.attempt, a.status, a.error === null]),
        [
          [1, 500, false],
          [2, 429, false],
          [3, null, false],
          [4, 200, true],
        ],
      );
      assert.equal(attempts[1]!.headers!["retry-after"], "30");
      assert.equal(attempts[3]!.body, '{"received":true}');
      assert.ok(attempts.every((a) => typeof a.ms === "number" && typeof a.startedAt === "number"));
      assert.ok(!JSON.stringify(attempts).includes(BEARER));
    });

    it("inbox.ts show prints all four, each with its latency and what came back", async () => {
      const run = await runScript("inbox.ts", ["show", "order_1", "--source", "shop", "--db", made.target]);
      assert.equal(run.code, 0, run.stderr);
      const lines = run.stdout.split("\n");
      const tried = lines.filter((l) => /#\d /.test(l));
      assert.equal(tried.length, 4, run.stdout);
      assert.match(tried[0]!, /#1 .* \d+ ms HTTP 500 from app: <b>database down<\/b>/);
      assert.match(tried[1]!, /#2 .* \d+ ms HTTP 429 from app: slow down/);
      assert.match(tried[2]!, /#3 .* \d+ ms app did not answer within 400 ms/);
      assert.match(tried[3]!, /#4 .* \d+ ms HTTP 200$/);
      assert.match(run.stdout, /headers: .*x-request-id: req_4/);
      assert.match(run.stdout, /body: "\{\\"received\\":true\}"/);
      assert.ok(!run.stdout.includes(BEARER));
      const json = await runScript("inbox.ts", ["show", "order_1", "--source", "shop", "--json", "--db", made.target]);
      const shown = JSON.parse(json.stdout) as { tries: Attempt[] };
      assert.deepEqual(
        shown.tries.map((a) => a.status),
        [500, 429, null, 200],
      );
    });

    // The page's HTML, over plain HTTP: what a browser gets, whatever draws it.
    const pageHtml = async () => {
      const login = await fetch(`${url}/login`, {
        method: "POST",
        body: new URLSearchParams({ token: TOKEN }),
        redirect: "manual",
      });
      const cookie = String(login.headers.get("set-cookie")).split(";")[0]!;
      const res = await fetch(`${url}/delivery?source=shop&id=order_1`, { headers: { cookie } });
      assert.equal(res.status, 200);
      return res.text();
    };

    it("the delivery's page tells its story try by try, everything the destination said escaped", async () => {
      const html = await pageHtml();
      const rows = html.match(/<tr class="try">[\s\S]*?<\/tr>/g) ?? [];
      assert.equal(rows.length, 4, "one row a try");
      assert.match(rows[0]!, /HTTP 500 from app: &#60;b&#62;database down&#60;\/b&#62;/);
      assert.match(rows[0]!, /<pre class="body">&#60;b&#62;database down&#60;\/b&#62;/);
      assert.ok(!html.includes("<b>database down</b>"), "the destination's markup is text, never markup");
      assert.match(rows[1]!, /retry-after: 30/);
      assert.match(rows[2]!, /app did not answer within 400 ms/);
      assert.match(rows[3]!, /HTTP 200/);
      assert.match(rows[3]!, /x-request-id: req_4/);
      for (const row of rows) assert.match(row, /<td class="num">\d+ ms<\/td>/, "each try's latency");
      assert.ok(!html.includes(BEARER));
    });

    it("the control: with redaction off, the echoed token would be kept, so the checks above can fail", async () => {
      const echo = await destination();
      try {
        await inbox.store({ source: "shop", id: "order_2", body: Buffer.from("{}"), destinations: ["echo"] });
        const forwarding = loadDestinations(
          { $destinations: { echo: { url: echo.url, secret: SECRET, bearer: "env:APP_BEARER" } } },
          { APP_BEARER: BEARER },
        );
        await forward({ inbox, forwarding, once: true, log: () => {}, now: wall, redact: false });
        const [d] = await inbox.find("order_2", "shop");
        const [tried] = await inbox.attempts(d!);
        assert.equal(tried!.status, 500);
        assert.ok(tried!.body!.includes(BEARER));
      } finally {
        await echo.close();
      }
    });

    it("in Chromium, the page shows the four tries and opens a try's answer", { skip: chromium }, async () => {
      const browser = await launchChromium();
      try {
        const page = await browser.newPage();
        await page.goto(`${url}/`);
        await page.fill('input[name="token"]', TOKEN);
        await page.click('button:has-text("Log in")');
        await page.waitForSelector("h1:has-text('Overview')");
        await page.goto(`${url}/delivery?source=shop&id=order_1`);
        const rows = page.locator("table.tries tr.try");
        assert.equal(await rows.count(), 4);
        assert.match((await rows.nth(0).textContent()) ?? "", /HTTP 500 from app: <b>database down<\/b>/);
        const answer = rows.nth(3).locator("pre.headers");
        assert.equal(await answer.isVisible(), false, "an answer is folded until asked for");
        await rows.nth(3).locator("summary").click();
        assert.equal(await answer.isVisible(), true);
        assert.match((await answer.textContent()) ?? "", /x-request-id: req_4/);
        assert.equal(await rows.nth(3).locator("pre.body").textContent(), '{"received":true}');
        assert.equal(await page.locator("table.tries b").count(), 0, "no markup of the destination's in the page");
      } finally {
        await browser.close();
      }
    });
  });
}

// beforeLog is the migrations up to the one that made the attempt log.
const beforeLog = (all: readonly string[]) =>
  all.slice(
    0,
    all.findIndex((m) => m.includes("CREATE TABLE attempts")),
  );
const OLD_TRIES = `INSERT INTO attempt_errors (source, id, attempt, error, failed_at, destination)
  VALUES ('shop', 'order_9', 1, 'HTTP 502 from app: bad gateway', ${T0 + 1_000}, 'app'),
         ('shop', 'order_9', 2, 'app did not answer within 30000 ms', ${T0 + 61_000}, 'app')`;

// moved opens the migrated inbox and reads the old tries from its attempt log.
async function moved(target: string): Promise<void> {
  const inbox = await connect(target);
  try {
    assert.deepEqual(await inbox.attempts({ source: "shop", id: "order_9", receivedAt: T0 }), [
      {
        attempt: 1,
        destination: "app",
        startedAt: T0 + 1_000,
        ms: null,
        status: null,
        error: "HTTP 502 from app: bad gateway",
        headers: null,
        body: null,
      },
      {
        attempt: 2,
        destination: "app",
        startedAt: T0 + 61_000,
        ms: null,
        status: null,
        error: "app did not answer within 30000 ms",
        headers: null,
        body: null,
      },
    ]);
  } finally {
    await inbox.close();
  }
}

const pgSkip = await postgresSkip();

describe("a database made before the attempt log", () => {
  it("keeps its failed tries through the migration on SQLite (the old schema had no attempts table)", async () => {
    const dir = tempDir();
    try {
      const path = join(dir.dir, "old.db");
      const list = beforeLog(SQLITE_MIGRATIONS);
      assert.ok(list.length > 0 && list.length < SQLITE_MIGRATIONS.length);
      const past = await pastSchema("sqlite", path, list);
      await past.exec(OLD_TRIES);
      await assert.rejects(past.exec("SELECT * FROM attempts"), /no such table: attempts/);
      await past.close();
      await moved(path);
    } finally {
      dir.cleanup();
    }
  });

  it("keeps its failed tries through the migration on PostgreSQL", { skip: pgSkip }, async () => {
    const fresh = await freshSchema("migrtries");
    try {
      const past = await pastSchema("postgres", fresh.schema, beforeLog(PG_MIGRATIONS));
      try {
        await past.exec(OLD_TRIES);
        await assert.rejects(past.exec("SELECT * FROM attempts"), /relation "attempts" does not exist/);
      } finally {
        await past.close();
      }
      await moved(fresh.url);
    } finally {
      await fresh.drop();
    }
  });
});
