// test/admin.test.ts: the operator page over real HTTP on a free port, on both backends: who may look,
// who may act (token, cookie, CSRF, Origin, read-only), what every action audits, that whatever a
// delivery holds is shown as text, and the destinations: their states, pause and resume, the list by
// destination, a delivery's row per destination, and no secret shown. The browser's side is test/admin-browser.test.ts.

import assert from "node:assert/strict";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { afterEach, beforeEach, describe, it } from "node:test";
import { writeFileSync } from "node:fs";
import {
  createAdmin,
  escape,
  isLoopback,
  listenAdmin,
  normaliseError,
  type Admin,
  type AdminOptions,
} from "../admin.ts";
import { connect } from "../inbox.ts";
import { secretsOf } from "../lib/redact.ts";
import { preview } from "../lib/forwarding/preview.ts";
import { loadDestinations } from "../lib/routing/routes.ts";
import type { BreakerPolicy, Inbox } from "../lib/store.ts";
import { backends, runScript, tempDir } from "./helpers.ts";

const T0 = 1_700_000_000_000;
const TOKEN = "correct horse battery staple";

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

/** request speaks plain HTTP, so that Host and Origin are exactly what the test says. */
function request(
  url: string,
  options: { method?: string; headers?: Record<string, string>; form?: Record<string, string> } = {},
): Promise<Answer> {
  const body = options.form ? new URLSearchParams(options.form).toString() : undefined;
  return new Promise((resolve, reject) => {
    const req = httpRequest(
      url,
      {
        method: options.method ?? (body === undefined ? "GET" : "POST"),
        headers: {
          ...(body === undefined ? {} : { "content-type": "application/x-www-form-urlencoded" }),
          ...options.headers,
        },
      },
      (res) => {
        let text = "";
        res
          .setEncoding("utf8")
          .on("data", (d) => (text += d))
          .on("end", () => resolve({ status: res.statusCode!, headers: res.headers, body: text }));
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

const csrfOf = (html: string) => /name="csrf" value="([^"]+)"/.exec(html)?.[1];

const BACKENDS = await backends("admin");

for (const backend of BACKENDS) {
  describe(`the operator page on ${backend.name}`, { skip: backend.skip }, () => {
    let inbox: Inbox;
    let cleanup: () => Promise<void>;
    let servers: Admin[];
    let audit: string[];
    let t: number;

    const start = async (options: Partial<AdminOptions> = { token: TOKEN }) => {
      const admin = createAdmin({ inbox, ...options, audit: (line) => audit.push(line), now: () => t });
      servers.push(admin);
      return listenAdmin(admin, { host: "127.0.0.1", port: 0, token: options.token });
    };
    const login = async (url: string) => {
      const res = await request(`${url}/login`, { form: { token: TOKEN } });
      assert.equal(res.status, 303);
      const cookie = String(res.headers["set-cookie"]).split(";")[0]!;
      const home = await request(`${url}/`, { headers: { cookie } });
      return { cookie, csrf: csrfOf(home.body)! };
    };
    // A delivery that has failed for good, as the worker leaves one after its last try.
    const failOne = async (
      id: string,
      error: string,
      source = "default",
      extra: { eventType?: string; body?: Buffer } = {},
    ) => {
      await inbox.store({
        source,
        id,
        body: extra.body ?? Buffer.from(JSON.stringify({ id })),
        eventType: extra.eventType,
      });
      for (;;) {
        const lease = await inbox.claim(60_000);
        assert.ok(lease, `claimed ${id}`);
        await inbox.fail(lease, lease.id === id ? error : "not this one", { permanent: true });
        if (lease.id === id) return;
      }
    };
    const statusOf = async (id: string, source = "default") => (await inbox.find(id, source))[0]!.status;

    beforeEach(async () => {
      const made = await backend.make();
      cleanup = made.cleanup;
      t = T0;
      inbox = await connect(made.target, { now: () => t, random: () => 0 });
      servers = [];
      audit = [];
    });
    afterEach(async () => {
      for (const admin of servers) {
        admin.server.closeAllConnections();
        await new Promise((resolve) => admin.server.close(resolve));
      }
      await inbox.close();
      await cleanup();
    });

    it("answers 401 to anyone without the token, to pages and actions alike", async () => {
      await failOne("evt_1", "boom");
      const url = await start();
      const page = await request(`${url}/`);
      assert.equal(page.status, 401);
      assert.match(page.body, /name="token"/, "a person gets the login form");
      assert.equal((await request(`${url}/delivery?id=evt_1`)).status, 401);
      assert.equal((await request(`${url}/?fragment=overview`)).status, 401);
      assert.equal((await request(`${url}/retry`, { form: { source: "default", id: "evt_1" } })).status, 401);
      assert.equal((await request(`${url}/`, { headers: { cookie: "inbox_admin=made-up" } })).status, 401);
      const wrong = await request(`${url}/login`, { form: { token: "guess" } });
      assert.equal(wrong.status, 401);
      assert.equal(wrong.headers["set-cookie"], undefined);
      assert.equal(await statusOf("evt_1"), "failed");
    });

    it("exchanges the token for an HttpOnly, SameSite=Strict session cookie that opens the page", async () => {
      const url = await start();
      const res = await request(`${url}/login`, { form: { token: TOKEN } });
      assert.equal(res.status, 303);
      const cookie = String(res.headers["set-cookie"]);
      assert.match(cookie, /HttpOnly/);
      assert.match(cookie, /SameSite=Strict/);
      assert.doesNotMatch(cookie, new RegExp(TOKEN), "the cookie is a session, not the token");
      const home = await request(`${url}/`, { headers: { cookie: cookie.split(";")[0]! } });
      assert.equal(home.status, 200);
      assert.match(home.body, /Overview/);
    });

    it("refuses an action without the CSRF token, or from another origin, with 403; with both it acts and audits", async () => {
      await failOne("evt_1", "boom");
      const url = await start();
      const { cookie, csrf } = await login(url);
      const noCsrf = await request(`${url}/retry`, { headers: { cookie }, form: { source: "default", id: "evt_1" } });
      assert.equal(noCsrf.status, 403);
      const wrongCsrf = await request(`${url}/retry`, {
        headers: { cookie },
        form: { source: "default", id: "evt_1", csrf: "x".repeat(csrf.length) },
      });
      assert.equal(wrongCsrf.status, 403);
      const crossOrigin = await request(`${url}/retry`, {
        headers: { cookie, origin: "https://evil.example" },
        form: { source: "default", id: "evt_1", csrf },
      });
      assert.equal(crossOrigin.status, 403);
      assert.equal(await statusOf("evt_1"), "failed", "the control: nothing was retried by a refused action");

      const ok = await request(`${url}/retry`, {
        headers: { cookie, origin: url },
        form: { source: "default", id: "evt_1", csrf },
      });
      assert.equal(ok.status, 303);
      assert.equal(await statusOf("evt_1"), "received");
      const line = audit.find((l) => l.includes('action=retry delivery="default/evt_1"'));
      assert.ok(line, audit.join("\n"));
      assert.match(line, /who=session:\S+@127\.0\.0\.1/);
      assert.match(line, /count=1/);
    });

    it("shows only the messages it issued itself: once, to the session that acted, never words from a link", async () => {
      await failOne("evt_1", "boom");
      const url = await start();
      const { cookie, csrf } = await login(url);
      const crafted = await request(
        `${url}/failures?flash=${encodeURIComponent("Your token expired: paste it at evil.example")}`,
        { headers: { cookie } },
      );
      assert.equal(crafted.status, 200);
      assert.doesNotMatch(crafted.body, /class="flash"|evil\.example/);
      const ok = await request(`${url}/retry`, {
        headers: { cookie, origin: url },
        form: { source: "default", id: "evt_1", csrf },
      });
      const next = new URL(String(ok.headers.location), url).href;
      const other = await login(url);
      assert.doesNotMatch(
        (await request(next, { headers: { cookie: other.cookie } })).body,
        /class="flash"/,
        "not another session's",
      );
      assert.match(
        (await request(next, { headers: { cookie } })).body,
        /<p class="flash">Queued again\.<\/p>/,
        "the control: its own message shows",
      );
      assert.doesNotMatch((await request(next, { headers: { cookie } })).body, /class="flash"/, "and only once");
    });

    it("in read-only mode shows everything and refuses every action with 403", async () => {
      await failOne("evt_1", "boom");
      const url = await start({ token: TOKEN, readOnly: true });
      const { cookie, csrf } = await login(url);
      for (const path of ["/", "/delivery?source=default&id=evt_1", "/failures"]) {
        const res = await request(`${url}${path}`, { headers: { cookie } });
        assert.equal(res.status, 200, path);
        assert.doesNotMatch(res.body, /<button class="primary">Retry/, `${path} offers no action`);
      }
      const forms: [string, Record<string, string>][] = [
        ["/retry", { source: "default", id: "evt_1" }],
        ["/replay", { source: "default", id: "evt_1" }],
        ["/bulk", { action: "retry", status: "failed" }],
        ["/bulk", { action: "replay" }],
        ["/retry-group", { group: "boom" }],
      ];
      for (const [path, form] of forms) {
        assert.equal(
          (await request(`${url}${path}`, { headers: { cookie }, form: { ...form, csrf } })).status,
          403,
          path,
        );
      }
      assert.equal((await request(`${url}/bulk?action=retry&status=failed`, { headers: { cookie } })).status, 403);
      assert.equal(await statusOf("evt_1"), "failed");
      assert.ok(audit.some((l) => /result=refused \(read-only\)/.test(l)));
    });

    it("shows a body holding <script> and an event type holding HTML as text, never as markup", async () => {
      const hostile = "<script>alert('body')</script>";
      const type = `<img src=x onerror="alert('type')">`;
      await failOne("evt_<b>", `<i>error</i>`, "default", { eventType: type, body: Buffer.from(hostile) });
      const url = await start();
      const { cookie } = await login(url);
      const pages = [
        `/delivery?source=default&id=${encodeURIComponent("evt_<b>")}`,
        `/delivery?source=default&id=${encodeURIComponent("evt_<b>")}&view=text`,
        "/failures",
        "/",
      ];
      for (const path of pages) {
        const res = await request(`${url}${path}`, { headers: { cookie } });
        assert.equal(res.status, 200, path);
        assert.doesNotMatch(res.body, /<script>alert|<img src=x|<i>error|<b>/, path);
      }
      const detail = await request(`${url}${pages[1]}`, { headers: { cookie } });
      assert.ok(detail.body.includes(escape(hostile)), "the body is there, escaped");
      assert.ok(detail.body.includes(escape(type)), "the event type is there, escaped");
    });

    it("shows bytes that are not UTF-8 as base64, and a JSON body pretty-printed", async () => {
      const bytes = Buffer.from([0xff, 0xfe, 0x00, 0x41]);
      await inbox.store({ id: "bin", body: bytes });
      await inbox.store({ id: "json", body: Buffer.from('{"a":{"b":1}}') });
      const url = await start();
      const { cookie } = await login(url);
      const bin = await request(`${url}/delivery?source=default&id=bin`, { headers: { cookie } });
      assert.ok(bin.body.includes(bytes.toString("base64")));
      assert.match(bin.body, /Not UTF-8/);
      const json = await request(`${url}/delivery?source=default&id=json`, { headers: { cookie } });
      assert.ok(json.body.includes(escape('{\n  "a": {\n    "b": 1\n  }\n}')));
    });

    it("says where a delivery came from: a webhook, or fetched from the provider's API by reconcile", async () => {
      await inbox.store({ id: "hooked", body: Buffer.from("{}") });
      await inbox.store({ id: "fetched", body: Buffer.from("{}"), origin: "reconcile" });
      const url = await start();
      const { cookie } = await login(url);
      const hooked = await request(`${url}/delivery?source=default&id=hooked`, { headers: { cookie } });
      const fetched = await request(`${url}/delivery?source=default&id=fetched`, { headers: { cookie } });
      assert.match(hooked.body, /origin<\/[a-z]+>\s*<[a-z]+>webhook</);
      assert.match(
        fetched.body,
        /reconcile: fetched from the provider&#39;s API|reconcile: fetched from the provider's API/,
      );
      assert.doesNotMatch(hooked.body, /fetched from the provider/);
    });

    it("sends a strict Content-Security-Policy, nosniff and no framing with every answer", async () => {
      const url = await start();
      for (const path of ["/", "/login", "/admin.js"]) {
        const res = await request(`${url}${path}`);
        const csp = String(res.headers["content-security-policy"]);
        assert.match(csp, /default-src 'none'/, path);
        assert.match(csp, /script-src 'self'(;|$)/, path);
        assert.match(csp, /frame-ancestors 'none'/, path);
        assert.equal(res.headers["x-content-type-options"], "nosniff", path);
      }
    });

    it("filters by status, source, type, time, ID and body text, pages by cursor, and keeps the filters in its links", async () => {
      for (let i = 0; i < 5; i++) {
        await inbox.store({
          source: "stripe",
          id: `s${i}`,
          body: Buffer.from(JSON.stringify({ customer: i === 3 ? "Zoë" : "Ann" })),
          eventType: "charge.succeeded",
        });
        t += 1_000;
      }
      await inbox.store({ source: "github", id: "g1", body: Buffer.from("{}"), eventType: "push" });
      const admin = createAdmin({ inbox, audit: (line) => audit.push(line), now: () => t, pageSize: 2 });
      servers.push(admin);
      const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
      const ids = (html: string) =>
        [...html.matchAll(/<a href="\/delivery\?source=\w+&#38;id=(\w+)">/g)].map((m) => m[1]);
      const first = await request(`${url}/deliveries?source=stripe&type=charge.succeeded`);
      assert.deepEqual(ids(first.body), ["s4", "s3"], "newest first, a page of two");
      const next = /<a rel="next" href="([^"]+)"/.exec(first.body)![1]!.replaceAll("&#38;", "&");
      assert.match(next, /source=stripe/);
      assert.match(next, /type=charge\.succeeded/);
      const second = await request(`${url}${next}`);
      assert.deepEqual(ids(second.body), ["s2", "s1"]);
      const since = new Date(T0 + 1_000).toISOString().slice(0, 19);
      const until = new Date(T0 + 3_000).toISOString().slice(0, 19);
      assert.deepEqual(ids((await request(`${url}/deliveries?since=${since}&until=${until}`)).body), ["s2", "s1"]);
      // An age, as the CLI and the API take one: since=3s is T0 + 2 s on the page's clock, until=3s before it.
      assert.deepEqual(ids((await request(`${url}/deliveries?since=3s&source=stripe`)).body), ["s4", "s3"]);
      assert.deepEqual(ids((await request(`${url}/deliveries?until=3s`)).body), ["s1", "s0"]);
      assert.equal((await request(`${url}/deliveries?since=3x`)).status, 400);
      assert.deepEqual(ids((await request(`${url}/deliveries?q=${encodeURIComponent("Zoë")}`)).body), ["s3"]);
      assert.deepEqual(ids((await request(`${url}/deliveries?id=g1`)).body), ["g1"]);
      assert.deepEqual(ids((await request(`${url}/deliveries?status=failed`)).body), []);
      assert.equal((await request(`${url}/deliveries?status=lost`)).status, 400);
      assert.equal((await request(`${url}/deliveries?after=garbage`)).status, 400);
    });

    it("bulk-retries everything that matches, not only the page: it counts first, then queues exactly those", async () => {
      for (const [id, source] of [
        ["a1", "stripe"],
        ["a2", "stripe"],
        ["a3", "stripe"],
        ["b1", "github"],
      ] as const) {
        await failOne(id, "HTTP 502 from upstream", source);
      }
      await failOne("a4", "HTTP 502 from upstream", "stripe");
      const admin = createAdmin({
        inbox,
        token: TOKEN,
        audit: (line) => audit.push(line),
        now: () => t,
        pageSize: 1,
        batchSize: 2,
      });
      servers.push(admin);
      const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0, token: TOKEN });
      const { cookie, csrf } = await login(url);
      const confirm = await request(`${url}/bulk?action=retry&source=stripe`, { headers: { cookie } });
      assert.equal(confirm.status, 200);
      assert.match(confirm.body, /Retry 4 failed deliveries\?/);
      const ok = await request(`${url}/bulk`, {
        headers: { cookie },
        form: { csrf, action: "retry", source: "stripe", expected: "4" },
      });
      assert.equal(ok.status, 303);
      const shown = await request(new URL(String(ok.headers.location), url).href, { headers: { cookie } });
      assert.match(shown.body, /<p class="flash">Retried 4 deliveries\.<\/p>/);
      const rows = await inbox.query("SELECT source, id, status FROM deliveries ORDER BY source, id");
      assert.deepEqual(
        rows.map((r) => `${r.source}/${r.id}:${r.status}`),
        ["github/b1:failed", "stripe/a1:received", "stripe/a2:received", "stripe/a3:received", "stripe/a4:received"],
      );
      assert.ok(
        audit.some((l) => /action=retry filter: source="stripe" status="failed" count=4$/.test(l)),
        audit.join("\n"),
      );
      assert.equal((await request(`${url}/bulk?action=retry&status=done`, { headers: { cookie } })).status, 400);
    });

    it("groups failures by their normalised error and retries one group with one click", async () => {
      await failOne("t1", "timeout after 5012 ms");
      await failOne("t2", "timeout after 4990 ms");
      await failOne("r1", "connection refused");
      const url = await start();
      const { cookie, csrf } = await login(url);
      const page = await request(`${url}/failures`, { headers: { cookie } });
      assert.match(page.body, /timeout after &#60;n&#62; ms/);
      assert.match(page.body, />2<\/a><\/td><td><code>timeout/);
      const res = await request(`${url}/retry-group`, {
        headers: { cookie },
        form: { csrf, group: "timeout after <n> ms" },
      });
      assert.equal(res.status, 303);
      assert.deepEqual(
        [await statusOf("t1"), await statusOf("t2"), await statusOf("r1")],
        ["received", "received", "failed"],
      );
      assert.ok(audit.some((l) => /action=retry group="timeout after <n> ms" count=2$/.test(l)));
    });

    it("replays a done delivery from its page", async () => {
      await inbox.store({ id: "d1", body: Buffer.from("{}") });
      await inbox.finish((await inbox.claim(60_000))!);
      const url = await start();
      const { cookie, csrf } = await login(url);
      const page = await request(`${url}/delivery?source=default&id=d1`, { headers: { cookie } });
      assert.match(page.body, />Replay<\/button>/);
      const res = await request(`${url}/replay`, { headers: { cookie }, form: { csrf, source: "default", id: "d1" } });
      assert.equal(res.status, 303);
      assert.equal(await statusOf("d1"), "received");
      assert.ok(audit.some((l) => /action=replay delivery="default\/d1" count=1$/.test(l)));
    });

    // ---- Destinations ----

    const POLICY: BreakerPolicy = { failures: 1, rate: 0.5, minTries: 20, windowMs: 60_000, coolDownMs: 30_000 };
    // routed stores deliveries that go to the handler, app and crm; app's first fails and opens its breaker, crm is paused.
    const routed = async (n: number, appError = "HTTP 503 from app") => {
      for (let i = 0; i < n; i++)
        await inbox.store({
          source: "shop",
          id: `r${i}`,
          body: Buffer.from(`{"n":${i}}`),
          destinations: ["handler", "app", "crm"],
        });
      const lease = await inbox.claim(60_000, { destination: "app" });
      assert.ok(lease);
      await inbox.fail(lease, appError);
      assert.equal((await inbox.tally("app", { done: 0, failed: 1, error: appError }, POLICY))?.change, "opened");
      assert.equal(await inbox.pause("crm", "deploying <b>v2</b>"), true);
    };
    // rowOf is the destinations table's row of one destination, its tags dropped, spaces squeezed.
    const rowOf = (html: string, name: string) => {
      const row = new RegExp(
        `<tr class="\\w+"><td><a href="/deliveries\\?destination=${name}">${name}</a>.*?</tr>`,
        "s",
      ).exec(html)?.[0];
      assert.ok(row, `a row for ${name}`);
      return row
        .replace(/<[^>]+>/g, " ")
        .replace(/\s+/g, " ")
        .trim();
    };

    it("lists each destination's state, waiting count, failure rate and last error, all as text", async () => {
      await routed(3, `<script>alert("x")</script> HTTP 503`);
      const url = await start();
      const { cookie } = await login(url);
      const page = await request(`${url}/destinations`, { headers: { cookie } });
      assert.equal(page.status, 200);
      assert.match(
        rowOf(page.body, "app"),
        /^app failing, paused for 30 s breaker open after 1 failure in a row; probe at \d\d:\d\d:\d\dZ 3 0 0 100% \(1 in a row\) &#60;script&#62;alert\(&#34;x&#34;\)&#60;\/script&#62; HTTP 503 /,
      );
      assert.match(
        rowOf(page.body, "crm"),
        /^crm paused by an operator paused, nothing discarded: deploying &#60;b&#62;v2&#60;\/b&#62; 3 0 0 – /,
      );
      assert.match(rowOf(page.body, "handler"), /^handler healthy breaker closed 3 0 0 – /);
      assert.doesNotMatch(page.body, /<script>alert|<b>v2/);
      assert.match(
        page.body,
        /href="\/deliveries\?destination=crm&#38;status=received">3</,
        "the waiting count links to those deliveries",
      );
      const home = await request(`${url}/`, { headers: { cookie } });
      assert.match(
        home.body,
        /<p class="held">Holding their deliveries: <a href="\/destinations">app<\/a> <span class="badge failing">failing, paused for 30 s<\/span> 3 waiting · <a href="\/destinations">crm<\/a> <span class="badge paused">paused by an operator<\/span> 3 waiting<\/p>/,
      );
    });

    it("says a destination whose tries fail is failing, in words, though its breaker is still closed (the breaker's term in the details)", async () => {
      for (let i = 0; i < 3; i++)
        await inbox.store({ source: "shop", id: `f${i}`, body: Buffer.from("{}"), destinations: ["app"] });
      const lenient = { ...POLICY, failures: 10 };
      for (let i = 0; i < 3; i++) {
        const lease = await inbox.claim(60_000, { destination: "app" });
        assert.ok(lease);
        await inbox.fail(lease, "HTTP 503 from app");
        await inbox.tally("app", { done: 0, failed: 1, error: "HTTP 503 from app" }, lenient);
      }
      assert.equal((await inbox.destinations()).find((d) => d.name === "app")?.state, "closed");
      const url = await start();
      const { cookie } = await login(url);
      const page = await request(`${url}/destinations`, { headers: { cookie } });
      assert.match(
        rowOf(page.body, "app"),
        /^app failing, still sending the last 3 tries failed; breaker closed \(3 failures in a row\) /,
      );
      assert.match(page.body, /<span class="badge failing">failing, still sending<\/span>/);
      assert.doesNotMatch(page.body, /<span class="badge closed">/, "no green 'closed' badge");
    });

    it("control: the overview warns of no destination while every one is closed", async () => {
      await inbox.store({ source: "shop", id: "x", body: Buffer.from("{}"), destinations: ["handler", "app"] });
      const url = await start();
      const { cookie } = await login(url);
      assert.doesNotMatch((await request(`${url}/`, { headers: { cookie } })).body, /class="held"/);
    });

    it("pauses and resumes a destination from its page, with the CSRF token, the same origin and writable mode, and audits each", async () => {
      await routed(2);
      const told: unknown[] = [];
      const url = await start({ token: TOKEN, announce: async (event) => (told.push(event), true) });
      const { cookie, csrf } = await login(url);
      const state = async (name: string) => (await inbox.destinations()).find((d) => d.name === name)?.state;
      assert.equal(
        (await request(`${url}/resume`, { headers: { cookie }, form: { destination: "crm" } })).status,
        403,
        "no CSRF token",
      );
      assert.equal(
        (
          await request(`${url}/resume`, {
            headers: { cookie, origin: "https://evil.example" },
            form: { destination: "crm", csrf },
          })
        ).status,
        403,
      );
      assert.equal(
        (await request(`${url}/pause`, { headers: { cookie }, form: { destination: "nowhere", csrf } })).status,
        404,
        "only a destination it knows",
      );
      assert.equal(
        (await request(`${url}/pause`, { headers: { cookie }, form: { destination: "bad name", csrf } })).status,
        400,
      );
      assert.equal(await state("crm"), "paused", "the control: nothing changed by a refused action");
      assert.equal(
        (await inbox.destinations()).some((d) => d.name === "nowhere"),
        false,
      );

      const resumed = await request(`${url}/resume`, {
        headers: { cookie, origin: url },
        form: { destination: "crm", csrf },
      });
      assert.equal(resumed.status, 303);
      assert.equal(await state("crm"), "closed");
      const shown = await request(new URL(String(resumed.headers.location), url).href, { headers: { cookie } });
      assert.match(
        shown.body,
        /<p class="flash">crm resumed: its deliveries go again\. The operator&#39;s URL was told\.<\/p>/,
      );
      const lease = await inbox.claim(60_000, { destination: "crm" });
      assert.ok(lease, "its deliveries go again");
      await inbox.release(lease);

      const paused = await request(`${url}/pause`, {
        headers: { cookie },
        form: { destination: "crm", reason: "nightly <deploy>", csrf },
      });
      assert.equal(paused.status, 303);
      const after = (await inbox.destinations()).find((d) => d.name === "crm")!;
      assert.deepEqual(
        [after.state, after.pausedReason, after.waiting],
        ["paused", "nightly <deploy>", 2],
        "held, none discarded",
      );
      assert.equal(await inbox.claim(60_000, { destination: "crm" }), undefined, "none is claimed while paused");
      assert.ok(
        audit.some((l) => /action=resume destination="crm" count=1$/.test(l)),
        audit.join("\n"),
      );
      assert.ok(
        audit.some((l) => /action=pause destination="crm" reason="nightly <deploy>" count=1$/.test(l)),
        audit.join("\n"),
      );
      assert.deepEqual(
        told.map((e) => (e as { type: string }).type),
        ["destination.resumed", "destination.paused"],
      );
      assert.equal(
        (await request(`${url}/pause`, { headers: { cookie }, form: { destination: "crm", csrf } })).status,
        303,
        "again: nothing changes",
      );
      assert.equal(told.length, 2, "and nothing is announced");
    });

    it("says so when the operator's URL did not hear of a pause, and pauses anyway", async () => {
      await routed(1);
      const url = await start({ token: TOKEN, announce: async () => "HTTP 500" });
      const { cookie, csrf } = await login(url);
      const res = await request(`${url}/pause`, { headers: { cookie }, form: { destination: "app", csrf } });
      const shown = await request(new URL(String(res.headers.location), url).href, { headers: { cookie } });
      assert.match(
        shown.body,
        /app paused: its deliveries wait, none discarded\. The operator&#39;s URL was not told: HTTP 500\./,
      );
      assert.equal((await inbox.destinations()).find((d) => d.name === "app")!.state, "paused");
    });

    it("in read-only mode shows the destinations with no buttons, and refuses pause and resume", async () => {
      await routed(1);
      const url = await start({ token: TOKEN, readOnly: true });
      const { cookie, csrf } = await login(url);
      const page = await request(`${url}/destinations`, { headers: { cookie } });
      assert.doesNotMatch(page.body, /action="\/(pause|resume)"/);
      assert.equal(
        (await request(`${url}/resume`, { headers: { cookie }, form: { destination: "crm", csrf } })).status,
        403,
      );
      assert.equal(
        (await request(`${url}/pause`, { headers: { cookie }, form: { destination: "app", csrf } })).status,
        403,
      );
      assert.deepEqual(
        (await inbox.destinations()).map((d) => d.state),
        ["open", "paused", "closed"],
      );
    });

    it("lists a destination the sources file names before any delivery went to it, and may pause it ahead", async () => {
      const url = await start({ token: TOKEN, destinations: ["billing"] });
      const { cookie, csrf } = await login(url);
      assert.match(
        rowOf((await request(`${url}/destinations`, { headers: { cookie } })).body, "billing"),
        /^billing healthy breaker closed 0 0 0 – /,
      );
      assert.equal(
        (await request(`${url}/pause`, { headers: { cookie }, form: { destination: "billing", csrf } })).status,
        303,
      );
      assert.equal((await inbox.destinations()).find((d) => d.name === "billing")?.state, "paused");
    });

    it("says on a delivery's page which of its destinations hold it: open or paused", async () => {
      await routed(1);
      const url = await start();
      const { cookie } = await login(url);
      const page = await request(`${url}/delivery?source=shop&id=r0`, { headers: { cookie } });
      const routes = /<table class="routes">.*?<\/table>/s
        .exec(page.body)![0]
        .replace(/<[^>]+>/g, " ")
        .replace(/\s+/g, " ");
      assert.match(
        routes,
        /handler received 0 \d{4}-\d\d-\d\d \S+ none/,
        "the control: a closed one's row shows its due time",
      );
      assert.match(routes, /app received 1 held: app is open none/);
      assert.match(routes, /crm received 0 held: crm is paused none/);
    });

    it("filters the list by destination, and pages through every row of every delivery without skipping one", async () => {
      for (let i = 0; i < 3; i++) {
        await inbox.store({ source: "shop", id: `m${i}`, body: Buffer.from("{}"), destinations: ["handler", "app"] });
        t += 1_000;
      }
      // Pages of three rows: a delivery's two rows straddle the first and the second.
      const admin = createAdmin({ inbox, audit: () => {}, now: () => t, pageSize: 3 });
      servers.push(admin);
      const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
      const rows = (html: string) =>
        [...html.matchAll(/id=(\w+)">\w+<\/a><\/td><td>shop<\/td>\n<td class="dest">(\w+)<\/td>/g)].map(
          (m) => `${m[1]}>${m[2]}`,
        );
      const seen: string[] = [];
      for (let next: string | undefined = "/deliveries", pages = 0; next; pages++) {
        assert.ok(pages < 6, "the pages end");
        const page = await request(`${url}${next}`);
        seen.push(...rows(page.body));
        next = /<a rel="next" href="([^"]+)"/.exec(page.body)?.[1]?.replaceAll("&#38;", "&");
      }
      assert.deepEqual(seen.sort(), ["m0>app", "m0>handler", "m1>app", "m1>handler", "m2>app", "m2>handler"]);
      const app = await request(`${url}/deliveries?destination=app`);
      assert.deepEqual(rows(app.body), ["m2>app", "m1>app", "m0>app"]);
      assert.match(app.body, /name="destination" value="app"/, "the filter stays in the form");
      assert.equal((await request(`${url}/deliveries?destination=${encodeURIComponent("no such!")}`)).status, 400);
    });

    it("shows each destination's status on a delivery's page, and retries or replays one destination's row alone", async () => {
      await inbox.store({ source: "shop", id: "evt_9", body: Buffer.from("{}"), destinations: ["handler", "app"] });
      await inbox.finish((await inbox.claim(60_000, { destination: "handler" }))!);
      await inbox.fail((await inbox.claim(60_000, { destination: "app" }))!, "HTTP 400: <i>bad</i>", {
        permanent: true,
      });
      const url = await start();
      const { cookie, csrf } = await login(url);
      const page = await request(`${url}/delivery?source=shop&id=evt_9`, { headers: { cookie } });
      const routes = /<table class="routes">.*?<\/table>/s
        .exec(page.body)![0]
        .replace(/<[^>]+>/g, " ")
        .replace(/\s+/g, " ");
      assert.match(
        routes,
        /handler done 1 – none \S+ \S+ Replay app failed 1 – none \S+ \S+ HTTP 400: &#60;i&#62;bad&#60;\/i&#62; Retry/,
      );
      assert.match(page.body, /<table class="tries">.*<td>app<\/td>/s, "each failed try says its destination");
      const statuses = async () => (await inbox.find("evt_9", "shop")).map((d) => `${d.destination}:${d.status}`);
      const retried = await request(`${url}/retry`, {
        headers: { cookie },
        form: { source: "shop", id: "evt_9", destination: "app", csrf },
      });
      assert.equal(retried.status, 303);
      assert.deepEqual(await statuses(), ["handler:done", "app:received"]);
      await request(`${url}/replay`, {
        headers: { cookie },
        form: { source: "shop", id: "evt_9", destination: "handler", csrf },
      });
      assert.deepEqual(await statuses(), ["handler:received", "app:received"]);
      assert.ok(
        audit.some((l) => /action=retry delivery="shop\/evt_9" destination="app" count=1$/.test(l)),
        audit.join("\n"),
      );
      assert.ok(
        audit.some((l) => /action=replay delivery="shop\/evt_9" destination="handler" count=1$/.test(l)),
        audit.join("\n"),
      );
    });

    it("never shows a destination's secret or its own headers, even where its answer echoes them", async () => {
      const secret = `whsec_${Buffer.from("a forwarding secret never shown").toString("base64")}`;
      const forwarding = loadDestinations(
        {
          $destinations: {
            app: { url: "http://127.0.0.1:1/", secret, bearer: "env:APP_TOKEN" },
            crm: { url: "http://127.0.0.1:1/", secret, basic: "env:CRM_BASIC" },
          },
          shop: { provider: "plain", routes: ["app", "crm"] },
        },
        { APP_TOKEN: "tok-never-shown-1234", CRM_BASIC: "crm-user:pass-never-shown" },
      );
      const echo = `401: bad credentials Bearer tok-never-shown-1234 (basic crm-user:pass-never-shown, signed with ${secret})`;
      await inbox.store({ source: "shop", id: "evt_s", body: Buffer.from("{}"), destinations: ["app"] });
      await inbox.fail((await inbox.claim(60_000, { destination: "app" }))!, echo, { permanent: true });
      await inbox.tally("app", { done: 0, failed: 1, error: echo }, POLICY);
      const pages = ["/destinations", "/delivery?source=shop&id=evt_s", "/deliveries", "/failures"];
      const leaks = /tok-never-shown|pass-never-shown|a forwarding secret|whsec_/;
      const guarded = await start({ token: TOKEN, hide: secretsOf(forwarding) });
      const one = await login(guarded);
      for (const path of pages) {
        const res = await request(`${guarded}${path}`, { headers: { cookie: one.cookie } });
        assert.equal(res.status, 200, path);
        assert.doesNotMatch(res.body, leaks, path);
        assert.match(res.body, /\[redacted: (app bearer|crm basic|app secret)\]/, path);
      }
      // The control: the same page without the sources file's values shows what the answer said.
      const bare = await start();
      const two = await login(bare);
      assert.match((await request(`${bare}/destinations`, { headers: { cookie: two.cookie } })).body, leaks);
    });

    it("without a token trusts loopback only: a foreign Host header (DNS rebinding) gets 403", async () => {
      const url = await start({});
      assert.equal((await request(`${url}/`)).status, 200);
      assert.equal((await request(`${url}/`, { headers: { host: "evil.example:8001" } })).status, 403);
    });
  });
}

describe("the delivery page's preview", () => {
  it("shows, when asked, the routes its filters choose now and each request, transformed, the destination's own headers not shown", async () => {
    const dir = tempDir();
    const inbox = await connect(join(dir.dir, "inbox.db"));
    try {
      writeFileSync(
        join(dir.dir, "billing.ts"),
        `export default (d: { json: { data: { object: { id: string } } } }) => ({ body: { invoice: d.json.data.object.id }, headers: { "x-billing": "yes" } });`,
      );
      const config = {
        $destinations: {
          billing: { url: "https://billing.internal/hooks", secret: "env:BILLING_SECRET", bearer: "env:BILLING_TOKEN" },
        },
        stripe: {
          provider: "stripe",
          secret: "env:STRIPE_SECRET",
          routes: [
            "handler",
            {
              to: "billing",
              filter: { body: { livemode: true } },
              transform: { module: "./billing.ts", process: true },
            },
          ],
        },
      };
      const body = Buffer.from(
        JSON.stringify({ type: "invoice.paid", livemode: true, data: { object: { id: "in_7" } } }),
      );
      await inbox.store({
        source: "stripe",
        id: "evt_7",
        body,
        contentType: "application/json",
        eventType: "invoice.paid",
        destinations: ["handler", "billing"],
      });
      const admin = createAdmin({ inbox, preview: (rows) => preview(rows, config, { base: dir.dir }) });
      const url = await listenAdmin(admin, { host: "127.0.0.1", port: 0 });
      try {
        const plain = await request(`${url}/delivery?source=stripe&id=evt_7`);
        assert.match(plain.body, /What would be sent now/);
        assert.doesNotMatch(plain.body, /\{&#34;invoice&#34;/, "the transform runs only when asked");
        const page = await request(`${url}/delivery?source=stripe&id=evt_7&preview=1`);
        assert.equal(page.status, 200);
        assert.match(page.body, /billing: chosen/);
        assert.match(page.body, /POST https:\/\/billing\.internal\/hooks/);
        assert.match(page.body, /x-billing: yes/);
        assert.match(page.body, /\{&#34;invoice&#34;:&#34;in_7&#34;\}/);
        assert.match(page.body, /authorization: \(from the sources file; not shown\)/);
      } finally {
        await new Promise((resolve) => admin.server.close(resolve));
      }
    } finally {
      await inbox.close();
      dir.cleanup();
    }
  });
});

describe("the page's listener", () => {
  it("refuses to bind beyond loopback without a token, and binds with one", async () => {
    const dir = tempDir();
    const inbox = await connect(join(dir.dir, "inbox.db"));
    try {
      const admin = createAdmin({ inbox });
      await assert.rejects(listenAdmin(admin, { host: "0.0.0.0", port: 0 }), TypeError);
      assert.equal(admin.server.listening, false);
      const guarded = createAdmin({ inbox, token: TOKEN });
      const url = await listenAdmin(guarded, { host: "0.0.0.0", port: 0, token: TOKEN });
      assert.match(url, /^http:\/\/0\.0\.0\.0:\d+$/);
      await new Promise((resolve) => guarded.server.close(resolve));
    } finally {
      await inbox.close();
      dir.cleanup();
    }
  });

  it("as a script, exits 2 with one line when told to listen on 0.0.0.0 without --admin-token", async () => {
    const dir = tempDir();
    try {
      const run = await runScript("admin.ts", ["--db", join(dir.dir, "inbox.db"), "--host", "0.0.0.0", "--port", "0"]);
      assert.equal(run.code, 2);
      assert.match(run.stderr.trim(), /^admin: refusing to listen on 0\.0\.0\.0 without --admin-token/);
      assert.equal(run.stderr.trim().split("\n").length, 1);
    } finally {
      dir.cleanup();
    }
  });

  it("as a script, exits 2 with one line, no secret in it, when the sources file is wrong or its environment variable unset", async () => {
    const dir = tempDir();
    try {
      const file = join(dir.dir, "sources.json");
      writeFileSync(
        file,
        JSON.stringify({
          $destinations: { app: { url: "http://127.0.0.1:1/", secret: "env:APP_SECRET" } },
          shop: { provider: "plain", routes: ["app"] },
        }),
      );
      const run = await runScript("admin.ts", ["--db", join(dir.dir, "inbox.db"), "--port", "0", "--sources", file], {
        APP_SECRET: "",
      });
      assert.equal(run.code, 2, run.stderr);
      assert.match(run.stderr.trim(), /^admin: .*sources\.json: destination "app": .*APP_SECRET/);
      assert.equal(run.stderr.trim().split("\n").length, 1);
      writeFileSync(file, `{"$destinations": {"app": {"secret": "whsec_c2VjcmV0IG5ldmVyIHNob3du"`);
      const broken = await runScript("admin.ts", ["--db", join(dir.dir, "inbox.db"), "--port", "0", "--sources", file]);
      assert.equal(broken.code, 2);
      assert.doesNotMatch(broken.stderr, /c2VjcmV0/);
    } finally {
      dir.cleanup();
    }
  });

  it("tells loopback from everything else", () => {
    for (const host of ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"])
      assert.equal(isLoopback(host), true, host);
    for (const host of ["0.0.0.0", "::", "10.0.0.1", "example.com", "localhost.evil.example"])
      assert.equal(isLoopback(host), false, host);
  });
});

describe("normaliseError()", () => {
  it("groups messages that differ only in numbers, IDs and quoted values", () => {
    assert.equal(normaliseError("timeout after 5012 ms for evt_81"), normaliseError("timeout after 4990 ms for evt_7"));
    assert.equal(normaliseError(`no customer "ann"`), normaliseError(`no customer "bob"`));
    assert.equal(normaliseError("row 3f2a9c1e-0000-4000-8000-00000000abcd gone"), "row <uuid> gone");
    assert.notEqual(
      normaliseError("connection refused"),
      normaliseError("connection reset"),
      "the control: different errors stay apart",
    );
    assert.equal(normaliseError(null), "(no error recorded)");
  });
});
